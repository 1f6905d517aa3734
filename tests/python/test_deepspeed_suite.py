"""An independent DeepSpeed-style suite for the async_io op, modelled on the structure of
DeepSpeed's tests/unit/ops/aio/test_aio.py (same constants, classes and parameters) and written
from scratch against ``nvio.deepspeed.AsyncIOBuilder``. CPU only: the CUDA-pinned variants are
skipped with a reason, as DeepSpeed's own suite does without a CUDA accelerator."""

from __future__ import annotations

import filecmp
import os

import pytest
import torch

from nvio.deepspeed import AsyncIOBuilder

KILO_BYTE = 1024
BLOCK_SIZE = KILO_BYTE
QUEUE_DEPTH = 2
IO_SIZE = 4 * BLOCK_SIZE
IO_PARALLEL = 2

if not AsyncIOBuilder().is_compatible():
    pytest.skip("async_io is not compatible on this machine", allow_module_level=True)

CUDA_PINNED_REASON = "torch pin_memory() needs a CUDA accelerator; this suite runs on the CPU"


def skip_unless_cuda(use_cuda_pinned_tensor: bool) -> None:
    if use_cuda_pinned_tensor and not torch.cuda.is_available():
        pytest.skip(CUDA_PINNED_REASON)


def file_path(tmpdir, prefix: str, index: int = 0) -> str:
    return os.path.join(str(tmpdir), f"{prefix}_0_{index}.pt")


def reference_write(tmpdir, index: int = 0, num_bytes: int = IO_SIZE):
    """A file of random bytes written by plain Python: (path, bytes)."""
    path = file_path(tmpdir, "_py_random", index)
    data = os.urandom(num_bytes)
    with open(path, "wb") as f:
        f.write(data)
    return path, data


def make_handle(single_submit: bool, overlap_events: bool):
    return AsyncIOBuilder().load().aio_handle(BLOCK_SIZE, QUEUE_DEPTH, single_submit,
                                              overlap_events, IO_PARALLEL)


def check_handle(h, single_submit: bool, overlap_events: bool) -> None:
    assert h.get_single_submit() == single_submit
    assert h.get_overlap_events() == overlap_events
    assert h.get_intra_op_parallelism() == IO_PARALLEL
    assert h.get_block_size() == BLOCK_SIZE
    assert h.get_queue_depth() == QUEUE_DEPTH


def read_buffer(h, use_cuda_pinned_tensor: bool, use_unpinned_tensor: bool):
    """(tensor, made_by_handle) for a read of IO_SIZE bytes."""
    if use_unpinned_tensor:
        return torch.empty(IO_SIZE, dtype=torch.uint8, device="cpu"), False
    if use_cuda_pinned_tensor:
        return torch.empty(IO_SIZE, dtype=torch.uint8).pin_memory(), False
    return h.new_cpu_locked_tensor(IO_SIZE, torch.empty(0, dtype=torch.uint8)), True


def write_buffer(h, data: bytes, use_cuda_pinned_tensor: bool, use_unpinned_tensor: bool):
    src = torch.tensor(list(data), dtype=torch.uint8)
    if use_unpinned_tensor:
        return src, False
    if use_cuda_pinned_tensor:
        return src.pin_memory(), False
    t = h.new_cpu_locked_tensor(len(data), src)
    t.data.copy_(src)
    return t, True


def file_list(path: str):
    with open(path, "rb") as f:
        return list(f.read())


@pytest.mark.parametrize("use_cuda_pinned_tensor", [True, False])
@pytest.mark.parametrize("single_submit", [True, False])
@pytest.mark.parametrize("overlap_events", [True, False])
class TestRead:
    @pytest.mark.parametrize("use_unpinned_tensor", [True, False])
    def test_parallel_read(self, tmpdir, use_cuda_pinned_tensor, single_submit, overlap_events,
                           use_unpinned_tensor):
        skip_unless_cuda(use_cuda_pinned_tensor)
        h = make_handle(single_submit, overlap_events)
        buf, owned = read_buffer(h, use_cuda_pinned_tensor, use_unpinned_tensor)
        check_handle(h, single_submit, overlap_events)
        ref_file, _ = reference_write(tmpdir)

        assert h.sync_pread(buf, ref_file, 0) == 1
        assert file_list(ref_file) == buf.tolist()
        if owned:
            assert h.free_cpu_locked_tensor(buf)

    @pytest.mark.parametrize("use_unpinned_tensor", [True, False])
    def test_async_read(self, tmpdir, use_cuda_pinned_tensor, single_submit, overlap_events,
                        use_unpinned_tensor):
        skip_unless_cuda(use_cuda_pinned_tensor)
        h = make_handle(single_submit, overlap_events)
        buf, owned = read_buffer(h, use_cuda_pinned_tensor, use_unpinned_tensor)
        check_handle(h, single_submit, overlap_events)
        ref_file, _ = reference_write(tmpdir)

        assert h.async_pread(buf, ref_file, 0) == 0
        assert h.wait() == 1
        assert file_list(ref_file) == buf.tolist()
        if owned:
            assert h.free_cpu_locked_tensor(buf)


@pytest.mark.parametrize("use_cuda_pinned_tensor", [True, False])
@pytest.mark.parametrize("single_submit", [True, False])
@pytest.mark.parametrize("overlap_events", [True, False])
class TestWrite:
    @pytest.mark.parametrize("use_unpinned_tensor", [True, False])
    def test_parallel_write(self, tmpdir, use_cuda_pinned_tensor, single_submit, overlap_events,
                            use_unpinned_tensor):
        skip_unless_cuda(use_cuda_pinned_tensor)
        ref_file, ref_data = reference_write(tmpdir)
        h = make_handle(single_submit, overlap_events)
        aio_file = file_path(tmpdir, "_aio_write_random")
        buf, owned = write_buffer(h, ref_data, use_cuda_pinned_tensor, use_unpinned_tensor)
        check_handle(h, single_submit, overlap_events)

        assert h.sync_pwrite(buf, aio_file, 0) == 1
        if owned:
            assert h.free_cpu_locked_tensor(buf)
        assert os.path.isfile(aio_file)
        filecmp.clear_cache()
        assert filecmp.cmp(ref_file, aio_file, shallow=False)

    @pytest.mark.parametrize("use_unpinned_tensor", [True, False])
    def test_async_write(self, tmpdir, use_cuda_pinned_tensor, single_submit, overlap_events,
                         use_unpinned_tensor):
        skip_unless_cuda(use_cuda_pinned_tensor)
        ref_file, ref_data = reference_write(tmpdir)
        h = make_handle(single_submit, overlap_events)
        aio_file = file_path(tmpdir, "_aio_write_random")
        buf, owned = write_buffer(h, ref_data, use_cuda_pinned_tensor, use_unpinned_tensor)
        check_handle(h, single_submit, overlap_events)

        assert h.async_pwrite(buf, aio_file, 0) == 0
        assert h.wait() == 1
        if owned:
            assert h.free_cpu_locked_tensor(buf)
        assert os.path.isfile(aio_file)
        filecmp.clear_cache()
        assert filecmp.cmp(ref_file, aio_file, shallow=False)


@pytest.mark.parametrize("use_cuda_pinned_tensor", [True, False])
@pytest.mark.parametrize("use_unpinned_tensor", [True, False])
class TestAsyncQueue:
    @pytest.mark.parametrize("async_queue", [2, 3])
    def test_read(self, tmpdir, async_queue, use_cuda_pinned_tensor, use_unpinned_tensor):
        skip_unless_cuda(use_cuda_pinned_tensor)
        ref_files = [reference_write(tmpdir, i)[0] for i in range(async_queue)]
        single_submit, overlap_events = True, True
        h = make_handle(single_submit, overlap_events)
        bufs = [read_buffer(h, use_cuda_pinned_tensor, use_unpinned_tensor) for _ in range(async_queue)]
        check_handle(h, single_submit, overlap_events)

        for (buf, _), ref_file in zip(bufs, ref_files):
            assert h.async_pread(buf, ref_file, 0) == 0
        assert h.wait() == async_queue
        for (buf, _), ref_file in zip(bufs, ref_files):
            assert file_list(ref_file) == buf.tolist()
        for buf, owned in bufs:
            if owned:
                assert h.free_cpu_locked_tensor(buf)

    @pytest.mark.parametrize("async_queue", [2, 3])
    def test_write(self, tmpdir, async_queue, use_cuda_pinned_tensor, use_unpinned_tensor):
        skip_unless_cuda(use_cuda_pinned_tensor)
        refs = [reference_write(tmpdir, i) for i in range(async_queue)]
        single_submit, overlap_events = True, True
        h = make_handle(single_submit, overlap_events)
        aio_files = [file_path(tmpdir, "_aio_write_random", i) for i in range(async_queue)]
        bufs = [write_buffer(h, data, use_cuda_pinned_tensor, use_unpinned_tensor)
                for _, data in refs]
        check_handle(h, single_submit, overlap_events)

        for (buf, _), aio_file in zip(bufs, aio_files):
            assert h.async_pwrite(buf, aio_file, 0) == 0
        assert h.wait() == async_queue
        for buf, owned in bufs:
            if owned:
                assert h.free_cpu_locked_tensor(buf)
        for (ref_file, _), aio_file in zip(refs, aio_files):
            assert os.path.isfile(aio_file)
            filecmp.clear_cache()
            assert filecmp.cmp(ref_file, aio_file, shallow=False)


@pytest.mark.parametrize("use_cuda_pinned_tensor", [True, False])
@pytest.mark.parametrize("file_partitions", [[1, 1, 1], [1, 1, 2], [1, 2, 1], [2, 1, 1]])
class TestAsyncFileOffset:
    @staticmethod
    def offsets(file_partitions):
        out, nxt = [], 0
        for p in file_partitions:
            out.append(nxt)
            nxt += p * BLOCK_SIZE
        return out

    @pytest.mark.parametrize("use_fd", [False, True])
    def test_offset_write(self, tmpdir, file_partitions, use_cuda_pinned_tensor, use_fd):
        skip_unless_cuda(use_cuda_pinned_tensor)
        ref_file = file_path(tmpdir, "_py_random")
        aio_file = file_path(tmpdir, "_aio_random")
        file_size = sum(file_partitions) * BLOCK_SIZE
        h = AsyncIOBuilder().load().aio_handle(BLOCK_SIZE, QUEUE_DEPTH, True, True, IO_PARALLEL)
        data = h.new_cpu_locked_tensor(file_size, torch.empty(0, dtype=torch.uint8))
        data.copy_(torch.tensor(list(os.urandom(file_size)), dtype=torch.uint8))
        offsets = self.offsets(file_partitions)

        with open(ref_file, "wb") as ref:
            for i, part in enumerate(file_partitions):
                src = torch.narrow(data, 0, offsets[i], part * BLOCK_SIZE)
                ref.write(src.numpy().tobytes())
                ref.flush()
                if use_fd:
                    try:
                        fd = os.open(aio_file, flags=os.O_DIRECT | os.O_CREAT | os.O_WRONLY)
                    except OSError as e:
                        pytest.skip(f"O_DIRECT not supported under {tmpdir}: {e}")
                    status = h.async_pwrite(buffer=src, fd=fd, file_offset=offsets[i])
                else:
                    status = h.async_pwrite(buffer=src, filename=aio_file, file_offset=offsets[i])
                assert status == 0
                assert h.wait() == 1
                if use_fd:
                    os.close(fd)
                filecmp.clear_cache()
                assert filecmp.cmp(ref_file, aio_file, shallow=False)
        assert os.path.getsize(aio_file) == file_size
        assert h.free_cpu_locked_tensor(data)

    def test_offset_read(self, tmpdir, file_partitions, use_cuda_pinned_tensor):
        skip_unless_cuda(use_cuda_pinned_tensor)
        file_size = sum(file_partitions) * BLOCK_SIZE
        ref_file, _ = reference_write(tmpdir, 0, file_size)
        h = AsyncIOBuilder().load().aio_handle(BLOCK_SIZE, QUEUE_DEPTH, True, True, IO_PARALLEL)
        data = h.new_cpu_locked_tensor(file_size, torch.empty(0, dtype=torch.uint8))
        offsets = self.offsets(file_partitions)

        with open(ref_file, "rb") as ref:
            for i, part in enumerate(file_partitions):
                ref.seek(offsets[i])
                nbytes = part * BLOCK_SIZE
                expected = list(ref.read(nbytes))
                dst = torch.narrow(data, 0, 0, nbytes)
                dst.fill_(0)
                assert h.sync_pread(dst, ref_file, offsets[i]) == 1
                assert dst.tolist() == expected
        assert h.free_cpu_locked_tensor(data)
