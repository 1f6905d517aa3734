"""nvio.aio_handle: DeepSpeed's names, argument names, defaults and return values."""

from __future__ import annotations

import inspect
import os
import time

import numpy as np
import pytest
import torch

import nvio
from conftest import ENGINES, ODD_OFFSETS, as_bytes, read_file, require_engine, write_file

ODD = (1 << 20) + 123


def tensor_of(data: bytes, locked: bool, h=None) -> torch.Tensor:
    src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if not locked:
        return src.clone()
    if h is None:
        t = nvio.empty_locked(len(data))
    else:
        t = h.new_cpu_locked_tensor(len(data), torch.empty(0, dtype=torch.uint8))
    t.copy_(src)
    return t


def empty_tensor(n: int, locked: bool, h=None) -> torch.Tensor:
    if not locked:
        return torch.zeros(n, dtype=torch.uint8)
    t = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8)) if h else nvio.empty_locked(n)
    t.zero_()
    return t


def wait_until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.0005)


# --------------------------------------------------------------------------------------------
# Construction and getters
# --------------------------------------------------------------------------------------------


def test_defaults_match_deepspeed():
    h = nvio.aio_handle()
    assert h.get_block_size() == 1048576
    assert h.get_queue_depth() == 128
    assert h.get_single_submit() is False
    assert h.get_overlap_events() is False
    assert h.get_intra_op_parallelism() == 1
    assert isinstance(h.get_alignment(), int) and h.get_alignment() > 0


def test_constructor_signature_names_and_defaults():
    params = inspect.signature(nvio.aio_handle).parameters
    assert list(params) == ["block_size", "queue_depth", "single_submit", "overlap_events",
                            "intra_op_parallelism"]
    assert [p.default for p in params.values()] == [1048576, 128, False, False, 1]


def test_constructor_positional_and_keyword():
    a = nvio.aio_handle(4096, 8, True, True, 3)
    b = nvio.aio_handle(block_size=4096, queue_depth=8, single_submit=True, overlap_events=True,
                        intra_op_parallelism=3)
    for h in (a, b):
        assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(),
                h.get_overlap_events(), h.get_intra_op_parallelism()) == (4096, 8, True, True, 3)


# --------------------------------------------------------------------------------------------
# single_submit x overlap_events x intra_op_parallelism, locked and unlocked
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("locked", [False, True], ids=["unlocked", "locked"])
@pytest.mark.parametrize("iop", [1, 2, 3])
@pytest.mark.parametrize("overlap_events", [False, True])
@pytest.mark.parametrize("single_submit", [False, True])
def test_option_matrix_roundtrip(tmp_path, monkeypatch, engine, single_submit, overlap_events,
                                 iop, locked, rng_bytes):
    # aio_handle has no engine argument (DeepSpeed has none): NVIO_ENGINE picks it.
    monkeypatch.setenv("NVIO_ENGINE", engine)
    assert nvio.Handle().engine == engine
    h = nvio.aio_handle(block_size=64 * 1024, queue_depth=4, single_submit=single_submit,
                        overlap_events=overlap_events, intra_op_parallelism=iop)
    assert h.get_single_submit() is single_submit
    assert h.get_overlap_events() is overlap_events
    assert h.get_intra_op_parallelism() == iop

    data = rng_bytes(ODD)
    path = str(tmp_path / "m.bin")
    src = tensor_of(data, locked, h)
    offset = 4096 + 17
    assert h.sync_pwrite(src, path, offset) == 1
    assert read_file(path, offset) == data

    dst = empty_tensor(ODD, locked, h)
    assert h.sync_pread(dst, path, offset) == 1
    assert as_bytes(dst) == data

    # The same through the asynchronous calls, into a second file and buffer.
    path2 = str(tmp_path / "m2.bin")
    assert h.async_pwrite(src, path2) == 0
    assert h.wait() == 1
    assert read_file(path2) == data
    dst2 = empty_tensor(ODD, locked, h)
    assert h.async_pread(dst2, path2) == 0
    assert h.wait() == 1
    assert as_bytes(dst2) == data

    # And through read/write with validation.
    dst3 = empty_tensor(ODD, locked, h)
    assert h.write(src, str(tmp_path / "m3.bin"), True) == 1
    assert h.read(dst3, str(tmp_path / "m3.bin"), True) == 1
    assert as_bytes(dst3) == data
    if locked:
        assert h.is_pinned(src) and h.is_pinned(dst)
        for t in (src, dst, dst2, dst3):
            assert h.free_cpu_locked_tensor(t) is True


@pytest.mark.parametrize("iop", [1, 2, 3, 7])
def test_size_not_divisible_by_parallelism(tmp_path, iop, rng_bytes):
    """DeepSpeed asserts when the size is not divisible; nvio just does it."""
    h = nvio.aio_handle(block_size=1024, queue_depth=2, intra_op_parallelism=iop)
    for n in (1, 5, 1023, 10_001):
        data = rng_bytes(n, n)
        assert h.sync_pwrite(torch.frombuffer(bytearray(data), dtype=torch.uint8), str(tmp_path / "d"), 0) == 1
        out = torch.zeros(n, dtype=torch.uint8)
        assert h.sync_pread(out, str(tmp_path / "d"), 0) == 1
        assert as_bytes(out) == data


# --------------------------------------------------------------------------------------------
# Call forms: positional, keyword, async keyword, fd
# --------------------------------------------------------------------------------------------


def test_read_write_positional_and_keyword(tmp_path, rng_bytes):
    data = rng_bytes(10_000)
    path = str(tmp_path / "rw.bin")
    h = nvio.aio_handle()
    src = tensor_of(data, False)
    assert h.write(src, path, False) == 1
    assert h.write(buffer=src, filename=path, validate=False, file_offset=5) == 1
    assert read_file(path) == data[:5] + data
    out = torch.zeros(len(data), dtype=torch.uint8)
    assert h.read(out, path, False, 5) == 1
    assert as_bytes(out) == data
    out.zero_()
    assert h.read(buffer=out, filename=path, validate=True, file_offset=5) == 1
    assert as_bytes(out) == data


def test_pread_pwrite_blocking_and_async(tmp_path, rng_bytes):
    data = rng_bytes(70_001)
    path = str(tmp_path / "p.bin")
    h = nvio.aio_handle(block_size=4096, queue_depth=4)
    src = tensor_of(data, False)
    assert h.pwrite(src, path, False, False) == 1
    assert read_file(path) == data
    assert h.pwrite(src, path, False, True, 100) == 0
    assert h.wait() == 1
    assert read_file(path) == data[:100] + data
    assert h.pwrite(buffer=src, filename=path, validate=True, file_offset=3, **{"async": True}) == 0
    assert h.wait() == 1
    assert read_file(path, 3, len(data)) == data

    out = torch.zeros(len(data), dtype=torch.uint8)
    assert h.pread(out, path, False, False, 3) == 1
    assert as_bytes(out) == data
    out.zero_()
    assert h.pread(buffer=out, filename=path, validate=False, file_offset=3, **{"async": True}) == 0
    assert h.wait() == 1
    assert as_bytes(out) == data
    out.zero_()
    assert h.pread(out, path, True, **{"async": False, "file_offset": 3}) == 1
    assert as_bytes(out) == data


def test_sync_and_async_keyword_forms(tmp_path, rng_bytes):
    data = rng_bytes(33_333)
    path = str(tmp_path / "k.bin")
    h = nvio.aio_handle()
    src = tensor_of(data, False)
    assert h.sync_pwrite(buffer=src, filename=path) == 1
    assert h.async_pwrite(buffer=src, filename=path, file_offset=len(data)) == 0
    assert h.wait() == 1
    assert read_file(path) == data + data
    out = torch.zeros(len(data), dtype=torch.uint8)
    assert h.sync_pread(buffer=out, filename=path, file_offset=len(data)) == 1
    assert as_bytes(out) == data
    out.zero_()
    assert h.async_pread(out, filename=path, file_offset=0) == 0
    assert h.wait() == 1
    assert as_bytes(out) == data


def test_bad_call_forms_raise_type_error(tmp_path):
    h = nvio.aio_handle()
    buf = torch.zeros(4, dtype=torch.uint8)
    with pytest.raises(TypeError):
        h.sync_pread(buf)  # missing filename
    with pytest.raises(TypeError):
        h.sync_pread(buf, str(tmp_path / "x"), bogus=1)
    with pytest.raises(TypeError):
        h.async_pwrite(buf, str(tmp_path / "x"), fd=3)  # both a filename and an fd
    with pytest.raises(TypeError):
        h.pread(buf, str(tmp_path / "x"), False)  # async is required
    with pytest.raises(TypeError):
        h.sync_pwrite(buf, True)  # a bool is not a file descriptor
    assert h.wait() == 0


@pytest.mark.parametrize("o_direct", [False, True], ids=["buffered", "O_DIRECT"])
def test_fd_forms(tmp_path, o_direct, rng_bytes):
    data = rng_bytes(3 * 4096)  # page multiple, so O_DIRECT from a locked buffer is legal
    path = str(tmp_path / "fd.bin")
    flags = os.O_RDWR | os.O_CREAT | (os.O_DIRECT if o_direct else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        pytest.skip(f"cannot open with O_DIRECT in {tmp_path}: {e}")
    h = nvio.aio_handle(block_size=4096, queue_depth=2, single_submit=True, overlap_events=True,
                        intra_op_parallelism=2)
    src = tensor_of(data, True, h)
    try:
        assert h.async_pwrite(src, fd, 0) == 0
        assert h.wait() == 1
        assert h.async_pwrite(buffer=src, fd=fd, file_offset=len(data)) == 0
        assert h.wait() == 1
        assert h.sync_pwrite(src, fd, 2 * len(data)) == 1
        assert h.pwrite(src, fd, False, True, 3 * len(data)) == 0
        assert h.wait() == 1
        assert h.write(src, fd, not o_direct, 4 * len(data)) == 1
        for i in range(5):
            assert read_file(path, i * len(data), len(data)) == data

        out = empty_tensor(len(data), True, h)
        assert h.sync_pread(out, fd, 4096) == 1
        assert as_bytes(out) == data[4096:] + data[:4096]
        out.zero_()
        assert h.async_pread(buffer=out, fd=fd, file_offset=len(data)) == 0
        assert h.wait() == 1
        assert as_bytes(out) == data
        out.zero_()
        assert h.pread(out, fd, not o_direct, False, 2 * len(data)) == 1
        assert as_bytes(out) == data
        out.zero_()
        assert h.read(out, fd, False, 0) == 1
        assert as_bytes(out) == data
        # An unaligned size and offset through an O_DIRECT descriptor must still work.
        odd = torch.zeros(4095, dtype=torch.uint8)
        assert h.sync_pread(odd, fd, 17) == 1
        assert as_bytes(odd) == (data * 2)[17:17 + 4095]
    finally:
        os.close(fd)


@pytest.mark.parametrize("is_read", [False, True], ids=["write", "read"])
def test_validate_with_o_direct_fd(tmp_path, is_read, rng_bytes):
    data = rng_bytes(2 * 4096)
    path = write_file(tmp_path / "vd.bin", data)
    try:
        fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    except OSError as e:
        pytest.skip(f"cannot open with O_DIRECT in {tmp_path}: {e}")
    h = nvio.aio_handle()
    try:
        if is_read:
            out = empty_tensor(len(data), True)
            assert h.read(out, fd, True) == 1
            assert as_bytes(out) == data
        else:
            assert h.write(tensor_of(data, True), fd, True, 4096) == 1
            assert read_file(path, 4096) == data
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# wait()
# --------------------------------------------------------------------------------------------


def test_wait_with_nothing_pending_returns_zero():
    h = nvio.aio_handle()
    assert h.wait() == 0
    assert h.wait() == 0


def test_several_async_then_one_wait(tmp_path, rng_bytes):
    h = nvio.aio_handle(block_size=8192, queue_depth=8, intra_op_parallelism=2)
    blobs = [rng_bytes(50_000 + 111 * i, i) for i in range(5)]
    srcs = [tensor_of(b, i % 2 == 0, h) for i, b in enumerate(blobs)]
    for i, s in enumerate(srcs):
        assert h.async_pwrite(s, str(tmp_path / f"a{i}.bin")) == 0
    assert h.wait() == 5
    assert h.wait() == 0
    for i, b in enumerate(blobs):
        assert read_file(tmp_path / f"a{i}.bin") == b

    outs = [empty_tensor(len(b), i % 2 == 1, h) for i, b in enumerate(blobs)]
    for i, o in enumerate(outs):
        assert h.async_pread(o, str(tmp_path / f"a{i}.bin")) == 0
    extra = tensor_of(blobs[0], False)
    assert h.pwrite(extra, str(tmp_path / "extra.bin"), False, True) == 0
    assert h.wait() == 6
    assert [as_bytes(o) for o in outs] == blobs
    assert read_file(tmp_path / "extra.bin") == blobs[0]
    assert h.wait() == 0


def test_blocking_calls_do_not_count_towards_wait(tmp_path, rng_bytes):
    h = nvio.aio_handle()
    data = rng_bytes(1000)
    src = tensor_of(data, False)
    assert h.async_pwrite(src, str(tmp_path / "a")) == 0
    assert h.sync_pwrite(src, str(tmp_path / "b")) == 1
    assert h.wait() == 1


def test_failed_async_op_is_raised_and_handle_stays_usable(tmp_path, rng_bytes):
    data = rng_bytes(4096)
    write_file(tmp_path / "ok.bin", data)
    h = nvio.aio_handle()
    with pytest.raises(FileNotFoundError):
        h.async_pread(torch.zeros(10, dtype=torch.uint8), str(tmp_path / "missing"))
        h.wait()
    assert h.wait() == 0
    out = torch.zeros(4096, dtype=torch.uint8)
    assert h.async_pread(out, str(tmp_path / "ok.bin")) == 0
    assert h.wait() == 1
    assert as_bytes(out) == data


def test_destroying_handle_with_pending_io_waits(tmp_path, rng_bytes):
    data = rng_bytes(4 << 20)
    h = nvio.aio_handle(block_size=64 * 1024, queue_depth=2)
    assert h.async_pwrite(tensor_of(data, False), str(tmp_path / "del.bin")) == 0
    del h
    import gc

    gc.collect()
    assert read_file(tmp_path / "del.bin") == data


# --------------------------------------------------------------------------------------------
# Locked tensors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.bfloat16, torch.float32,
                                   torch.int64, torch.bool])
def test_new_cpu_locked_tensor(dtype):
    h = nvio.aio_handle()
    t = h.new_cpu_locked_tensor(1000, torch.empty(0, dtype=dtype))
    assert t.dtype == dtype and t.numel() == 1000 and t.device.type == "cpu"
    assert t.is_contiguous()
    assert t.data_ptr() % 4096 == 0
    assert h.is_pinned(t)
    assert h.free_cpu_locked_tensor(t) is True
    assert h.free_cpu_locked_tensor(t) is False


def test_new_cpu_locked_tensor_keywords():
    h = nvio.aio_handle()
    ex = torch.empty(3, dtype=torch.float32)
    a = h.new_cpu_locked_tensor(num_elem=10, example_tensor=ex)
    b = h.new_cpu_locked_tensor(10, example_tenosr=ex)  # DeepSpeed's misspelling
    c = h.new_cpu_locked_tensor(num_elem=10, example_tenosr=ex)
    for t in (a, b, c):
        assert t.dtype == torch.float32 and t.numel() == 10 and h.is_pinned(t)
        assert h.free_cpu_locked_tensor(t)


def test_free_cpu_locked_tensor_foreign():
    h = nvio.aio_handle()
    other = nvio.aio_handle()
    t = other.new_cpu_locked_tensor(64, torch.empty(0, dtype=torch.uint8))
    assert h.free_cpu_locked_tensor(torch.zeros(64, dtype=torch.uint8)) is False
    assert h.free_cpu_locked_tensor(t) is False
    assert other.free_cpu_locked_tensor(t) is True


def test_is_pinned_views():
    h = nvio.aio_handle()
    t = h.new_cpu_locked_tensor(8192, torch.empty(0, dtype=torch.uint8))
    assert h.is_pinned(t)
    assert h.is_pinned(t[1:])
    assert h.is_pinned(torch.narrow(t, 0, 4096, 100))
    assert h.is_pinned(t.view(torch.int64)[3:9])
    assert not h.is_pinned(torch.zeros(8192, dtype=torch.uint8))
    assert not h.is_pinned(torch.zeros(8192, dtype=torch.uint8)[1:])


# --------------------------------------------------------------------------------------------
# validate
# --------------------------------------------------------------------------------------------


def test_validation_error_class():
    assert issubclass(nvio.ValidationError, ValueError)
    assert issubclass(nvio.ValidationError, nvio.Error)


@pytest.mark.parametrize("offset", ODD_OFFSETS)
def test_validate_passes_on_good_data(tmp_path, offset, rng_bytes):
    data = rng_bytes(100_003)
    h = nvio.aio_handle(block_size=4096, intra_op_parallelism=3)
    src = tensor_of(data, False)
    assert h.write(src, str(tmp_path / "v"), True, offset) == 1
    assert h.pwrite(src, str(tmp_path / "v2"), True, True, offset) == 0
    assert h.wait() == 1
    out = torch.zeros(len(data), dtype=torch.uint8)
    assert h.read(out, str(tmp_path / "v"), True, offset) == 1
    assert as_bytes(out) == data
    assert h.pread(out, str(tmp_path / "v2"), True, True, offset) == 0
    assert h.wait() == 1
    assert read_file(tmp_path / "v2", offset) == data


def test_validate_write_mismatch_raises(tmp_path, rng_bytes):
    """The write lands; the file is then changed before wait() validates: a mismatch."""
    data = rng_bytes(64 * 1024)
    path = str(tmp_path / "vw.bin")
    h = nvio.aio_handle()
    assert h.pwrite(tensor_of(data, False), path, True, True) == 0
    wait_until(lambda: os.path.exists(path) and read_file(path) == data)
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(bytes([data[1000] ^ 0xFF]))
    with pytest.raises(nvio.ValidationError) as info:
        h.wait()
    assert "1000" in str(info.value)
    assert h.wait() == 0


def test_validate_read_mismatch_raises(tmp_path, rng_bytes):
    data = rng_bytes(64 * 1024)
    path = write_file(tmp_path / "vr.bin", data)
    out = torch.zeros(len(data), dtype=torch.uint8)
    h = nvio.aio_handle()
    assert h.pread(out, path, True, True) == 0
    wait_until(lambda: as_bytes(out) == data)
    with open(path, "r+b") as f:
        f.seek(7)
        f.write(bytes([data[7] ^ 0x01]))
    with pytest.raises(ValueError) as info:
        h.wait()
    assert isinstance(info.value, nvio.ValidationError)
    assert "7" in str(info.value)


def test_no_validate_no_error(tmp_path, rng_bytes):
    """Same race without validate: no error (the check is what raises, not the I/O)."""
    data = rng_bytes(64 * 1024)
    path = str(tmp_path / "nv.bin")
    h = nvio.aio_handle()
    assert h.pwrite(tensor_of(data, False), path, False, True) == 0
    wait_until(lambda: os.path.exists(path) and read_file(path) == data)
    with open(path, "r+b") as f:
        f.write(b"\0")
    assert h.wait() == 1


# --------------------------------------------------------------------------------------------
# Module-level aio_read / aio_write
# --------------------------------------------------------------------------------------------


def test_module_level_aio_read_write(tmp_path, rng_bytes):
    data = rng_bytes(12_345)
    path = str(tmp_path / "mod.bin")
    src = tensor_of(data, False)
    assert nvio.aio_write(src, path, 4096, 4, False, False, True) == 0
    assert read_file(path) == data
    out = torch.zeros(len(data), dtype=torch.uint8)
    assert nvio.aio_read(out, path, 4096, 4, True, True, True) == 0
    assert as_bytes(out) == data
    params = list(inspect.signature(nvio.aio_read).parameters)
    assert params == ["buffer", "filename", "block_size", "queue_depth", "single_submit",
                      "overlap_events", "validate"]
    assert list(inspect.signature(nvio.aio_write).parameters) == params


def test_numpy_buffers_through_aio_handle(tmp_path, rng_bytes):
    data = rng_bytes(9_999)
    h = nvio.aio_handle()
    assert h.sync_pwrite(np.frombuffer(data, np.uint8), str(tmp_path / "n")) == 1
    out = np.zeros(len(data), np.uint8)
    assert h.sync_pread(out, str(tmp_path / "n")) == 1
    assert out.tobytes() == data


@pytest.mark.parametrize("engine_name", ["psync", "libaio", "io_uring"])
def test_read_from_non_file_descriptor_raises(engine_name):
    require_engine(engine_name)
    require_engine("io_uring")  # the descriptor read from is an io_uring ring's
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import os, nvio
        ring = nvio.Handle(engine="io_uring")
        fds = [int(x) for x in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{{x}}")
               and "io_uring" in os.readlink(f"/proc/self/fd/{{x}}")]
        if not fds:
            raise SystemExit("no io_uring descriptor")
        try:
            nvio.Handle(engine="{engine_name}").read(bytearray(2), fds[0])
        except ValueError as e:  # not a regular file or block device: refused before any I/O
            assert isinstance(e, nvio.InvalidArgument)
            print("raised", e)
    """)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(nvio.__file__)))
    try:
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=8, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{engine_name}: the read never returned")
    assert r.returncode == 0 and "raised" in r.stdout, r.stderr


def test_validate_of_device_memory_reads_the_tensor_it_came_from():
    """Device memory is compared through torch (.cpu()): the buffer's owner became (tensor,
    storage), and validate=True of a CUDA tensor then said it needed a torch tensor. Without a GPU
    the same path runs on a CPU tensor marked as device memory."""
    import torch
    from nvio import _aio, _buffers

    t = torch.arange(100, dtype=torch.int32)
    ref = _buffers.resolve(t, writable=False)._replace(device=True)
    assert _aio._buffer_bytes(ref) == t.numpy().tobytes()
