"""nvio.Handle, the Pythonic API: round trips over dtypes, sizes, offsets and engines; futures;
write options; file descriptors; empty_locked; sharing a handle between threads; nvio.report()."""

from __future__ import annotations

import os
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import nvio
from conftest import ENGINES, ODD_OFFSETS, ODD_SIZES, as_bytes, read_file, require_engine, write_file

TORCH_DTYPES = {
    "uint8": torch.uint8,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "int64": torch.int64,
    "bool": torch.bool,
}
NUMPY_DTYPES = {
    "uint8": np.uint8,
    "float16": np.float16,
    "float32": np.float32,
    "int64": np.int64,
    "bool": np.bool_,
}


def torch_random(n: int, dtype, seed: int) -> torch.Tensor:
    """n elements of `dtype` with random bit patterns (0/1 for bool, which has only two)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = np.random.default_rng(seed).integers(0, 256, size=n * itemsize, dtype=np.uint8)
    if dtype == torch.bool:
        raw &= 1
    return torch.frombuffer(bytearray(raw.tobytes()), dtype=dtype) if n else torch.empty(0, dtype=dtype)


def numpy_random(n: int, dtype, seed: int) -> np.ndarray:
    dt = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, size=n * dt.itemsize, dtype=np.uint8)
    if dt == np.bool_:
        raw &= 1
    return raw.view(dt).copy()


# --------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", ODD_OFFSETS)
@pytest.mark.parametrize("n", ODD_SIZES)
@pytest.mark.parametrize("dtype_name", list(TORCH_DTYPES))
def test_torch_roundtrip(tmp_path, dtype_name, n, offset):
    dtype = TORCH_DTYPES[dtype_name]
    src = torch_random(n, dtype, seed=n + offset)
    path = tmp_path / "t.bin"
    h = nvio.Handle()
    assert h.write(src, path, offset) == src.numel() * src.element_size()
    assert os.path.getsize(path) == offset + len(as_bytes(src))
    assert read_file(path, offset) == as_bytes(src)
    assert read_file(path, 0, offset) == b"\0" * offset  # the gap before the offset is a hole

    dst = torch.zeros(n, dtype=dtype)
    assert h.read(dst, path, offset) == dst.numel() * dst.element_size()
    assert dst.dtype == dtype
    assert as_bytes(dst) == as_bytes(src)


@pytest.mark.parametrize("offset", ODD_OFFSETS)
@pytest.mark.parametrize("n", ODD_SIZES)
@pytest.mark.parametrize("dtype_name", list(NUMPY_DTYPES))
def test_numpy_roundtrip(tmp_path, dtype_name, n, offset):
    src = numpy_random(n, NUMPY_DTYPES[dtype_name], seed=3 * n + offset)
    path = tmp_path / "a.bin"
    h = nvio.Handle()
    assert h.write(src, str(path), offset=offset) == src.nbytes
    assert read_file(path, offset) == src.tobytes()
    dst = np.zeros_like(src)
    assert h.read(dst, str(path), offset=offset) == src.nbytes
    assert dst.tobytes() == src.tobytes()


@pytest.mark.parametrize("direct", ["auto", "off"])
@pytest.mark.parametrize("offset", ODD_OFFSETS)
@pytest.mark.parametrize("n", ODD_SIZES)
def test_engine_roundtrip(tmp_path, engine, n, offset, direct, rng_bytes):
    data = rng_bytes(n)
    path = tmp_path / "e.bin"
    # Small blocks and a shallow queue so that the 1 MiB case is split into many pieces.
    with nvio.Handle(engine=engine, block_size=64 * 1024, queue_depth=4, direct=direct) as h:
        assert h.engine == engine
        assert h.write(np.frombuffer(data, np.uint8), path, offset) == n
        assert read_file(path, offset) == data
        dst = bytearray(n)
        assert h.read(dst, path, offset) == n
        assert bytes(dst) == data


@pytest.mark.parametrize("engine_name", ENGINES)
def test_engine_locked_buffer_roundtrip(tmp_path, engine_name, rng_bytes):
    require_engine(engine_name)
    n = 3 * (1 << 20) + 4096  # page-multiple: the O_DIRECT path straight from locked memory
    data = rng_bytes(n)
    buf = nvio.empty_locked(n)
    buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    path = tmp_path / "l.bin"
    h = nvio.Handle(engine=engine_name, block_size=1 << 20, intra_op_parallelism=2)
    h.write(buf, path)
    assert read_file(path) == data
    out = nvio.empty_locked(n)
    out.zero_()
    h.read(out, path)
    assert as_bytes(out) == data


def test_engine_unavailable_skip_reason_is_reported():
    rep = nvio.report()
    for name in ENGINES:
        info = rep["engines"][name]
        assert isinstance(info["available"], bool)
        assert isinstance(info["reason"], str) and info["reason"]
    assert rep["engines"]["psync"]["available"]


def test_pathlike_and_str_paths(tmp_path, rng_bytes):
    data = rng_bytes(5000)
    h = nvio.Handle()
    h.write(bytearray(data), tmp_path / "p.bin")
    out = bytearray(5000)
    h.read(out, str(tmp_path / "p.bin"))
    assert bytes(out) == data


# --------------------------------------------------------------------------------------------
# Write options
# --------------------------------------------------------------------------------------------


def test_write_over_longer_file_keeps_the_rest(tmp_path, rng_bytes):
    old = rng_bytes(100_000, 1)
    new = rng_bytes(10_000, 2)
    path = write_file(tmp_path / "k.bin", old)
    nvio.Handle().write(bytearray(new), path, 5_001)
    expected = old[:5_001] + new + old[15_001:]
    assert read_file(path) == expected


def test_truncate_ends_file_at_write_end(tmp_path, rng_bytes):
    old = rng_bytes(100_000, 1)
    new = rng_bytes(10_000, 2)
    path = write_file(tmp_path / "t.bin", old)
    nvio.Handle().write(bytearray(new), path, 5_001, truncate=True)
    assert read_file(path) == old[:5_001] + new
    assert os.path.getsize(path) == 15_001


def test_truncate_async(tmp_path, rng_bytes):
    path = write_file(tmp_path / "t.bin", rng_bytes(50_000, 1))
    new = rng_bytes(777, 2)
    with nvio.Handle() as h:
        fut = h.write_async(bytearray(new), path, truncate=True)
        assert fut.wait() == 777
    assert read_file(path) == new


def test_sync_write(tmp_path, rng_bytes):
    data = rng_bytes(300_000)
    h = nvio.Handle()
    assert h.write(bytearray(data), tmp_path / "s.bin", sync=True) == len(data)
    assert read_file(tmp_path / "s.bin") == data
    fut = h.write_async(bytearray(data), tmp_path / "s2.bin", 3, sync=True)
    assert fut.result() == len(data)
    assert read_file(tmp_path / "s2.bin", 3) == data


# --------------------------------------------------------------------------------------------
# Futures
# --------------------------------------------------------------------------------------------


def test_future_wait_done_result(tmp_path, rng_bytes):
    data = rng_bytes((1 << 20) + 123)
    path = tmp_path / "f.bin"
    h = nvio.Handle(block_size=64 * 1024)
    wf = h.write_async(np.frombuffer(data, np.uint8), path, 17)
    assert isinstance(wf, nvio.Future)
    assert wf.wait() == len(data)
    assert wf.done()
    assert wf.result() == len(data)  # result() after wait() gives the same value again
    assert read_file(path, 17) == data

    dst = np.zeros(len(data), np.uint8)
    rf = h.read_async(dst, path, 17)
    deadline = time.monotonic() + 30
    while not rf.done():
        assert time.monotonic() < deadline, "future never became done"
        time.sleep(0.001)
    assert rf.result() == len(data)
    assert dst.tobytes() == data


def test_future_error_is_raised_at_submit_or_by_wait(tmp_path):
    """A short file may be detected when the read is queued or when it is waited for; either
    way the error reaches the caller (and result() raises it again)."""
    write_file(tmp_path / "short.bin", b"x" * 10)
    h = nvio.Handle()
    with pytest.raises(nvio.ShortFile):
        fut = h.read_async(bytearray(100), tmp_path / "short.bin")
        try:
            fut.wait()
        finally:
            assert fut.done()
            with pytest.raises(nvio.ShortFile):
                fut.result()
    assert h.wait_all() == 0


def test_wait_all_counts_and_completes(tmp_path, rng_bytes):
    h = nvio.Handle()
    blobs = [rng_bytes(10_000 + 997 * i, i) for i in range(6)]
    futs = [h.write_async(bytearray(b), tmp_path / f"w{i}.bin", i) for i, b in enumerate(blobs)]
    assert len(futs) == 6
    assert h.wait_all() == 6
    assert all(f.done() for f in futs)
    assert h.wait_all() == 0  # nothing outstanding
    for i, b in enumerate(blobs):
        assert read_file(tmp_path / f"w{i}.bin", i) == b

    outs = [bytearray(len(b)) for b in blobs]
    futs = [h.read_async(o, tmp_path / f"w{i}.bin", i) for i, o in enumerate(outs)]
    futs[0].wait()  # one waited for individually is not counted again
    assert h.wait_all() == 5
    assert [bytes(o) for o in outs] == blobs


def test_context_manager_waits_on_exit(tmp_path, rng_bytes):
    blobs = [rng_bytes(200_000, i) for i in range(4)]
    with nvio.Handle() as h:
        assert isinstance(h, nvio.Handle)
        for i, b in enumerate(blobs):
            h.write_async(bytearray(b), tmp_path / f"c{i}.bin")
    for i, b in enumerate(blobs):
        assert read_file(tmp_path / f"c{i}.bin") == b


def test_context_manager_keeps_original_exception(tmp_path):
    with pytest.raises(KeyError):
        with nvio.Handle() as h:
            h.write_async(bytearray(b"abc"), tmp_path / "x.bin")
            raise KeyError("original")
    assert read_file(tmp_path / "x.bin") == b"abc"


def test_future_keeps_buffer_alive(tmp_path, rng_bytes):
    """The caller drops its reference to the buffer; the future must keep the memory valid."""
    data = rng_bytes(2 << 20)
    h = nvio.Handle(block_size=64 * 1024, queue_depth=2)
    fut = h.write_async(bytearray(data), tmp_path / "alive.bin")
    import gc

    gc.collect()
    fut.wait()
    assert read_file(tmp_path / "alive.bin") == data


# --------------------------------------------------------------------------------------------
# File descriptors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("o_direct", [False, True], ids=["buffered", "O_DIRECT"])
@pytest.mark.parametrize("offset", ODD_OFFSETS)
def test_fd_roundtrip(tmp_path, o_direct, offset, rng_bytes):
    data = rng_bytes(100_000 + 3)
    path = str(tmp_path / "fd.bin")
    flags = os.O_RDWR | os.O_CREAT | (os.O_DIRECT if o_direct else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        pytest.skip(f"cannot open with O_DIRECT in {tmp_path}: {e}")
    try:
        h = nvio.Handle()
        assert h.write(bytearray(data), fd, offset) == len(data)
        out = bytearray(len(data))
        assert h.read(out, fd, offset) == len(data)
        assert bytes(out) == data
        fut = h.read_async(np.zeros(len(data), np.uint8), fd, offset)
        assert fut.wait() == len(data)
    finally:
        os.close(fd)
    assert read_file(path, offset) == data


# --------------------------------------------------------------------------------------------
# empty_locked
# --------------------------------------------------------------------------------------------


def test_empty_locked_torch_and_numpy():
    t = nvio.empty_locked(4096 * 3)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.numel() == 4096 * 3
    assert t.data_ptr() % 4096 == 0
    assert nvio.is_pinned(t)

    t2 = nvio.empty_locked((3, 5), dtype=torch.float32)
    assert t2.shape == (3, 5) and t2.dtype == torch.float32 and t2.is_contiguous()
    assert nvio.is_pinned(t2)

    a = nvio.empty_locked((2, 7), dtype=np.int64)
    assert isinstance(a, np.ndarray) and a.shape == (2, 7) and a.dtype == np.int64
    assert a.flags.c_contiguous and a.flags.writeable
    assert a.__array_interface__["data"][0] % 4096 == 0
    assert nvio.is_pinned(a)

    a2 = nvio.empty_locked(10, dtype="float16")
    assert a2.dtype == np.float16 and a2.shape == (10,)

    assert nvio.empty_locked(0).numel() == 0
    with pytest.raises(ValueError):
        nvio.empty_locked((2, -1))


def _may_lock(nbytes):
    """Whether this process may lock `nbytes` (CAP_IPC_LOCK, root's, lifts RLIMIT_MEMLOCK)."""
    import resource
    with open("/proc/self/status") as status:
        capeff = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    return bool(capeff >> 14 & 1) or limit == resource.RLIM_INFINITY or limit >= nbytes


@pytest.mark.parametrize("size", [256 << 10, (1 << 20) + 1, (7 << 20) // 4, (2 << 20) - 4096])
def test_empty_locked_medium_buffers_share_huge_page_slabs(size):
    """256 KiB to 2 MiB come from slabs of whole 2 MiB huge pages, so that they are physically
    contiguous where the kernel gives huge pages (a buffer of its own is scattered 4 KiB pages,
    and a 1 MiB O_DIRECT transfer into it split in two on a virtio disk). Each buffer keeps its
    own bytes, pages are aligned, and it is pinned; 1.75 MiB is one slot to a slab, so its
    buffers start on a huge page."""
    # Six slabs at most; under a smaller RLIMIT_MEMLOCK (the default 8 MiB of a user) the later
    # ones fall back to unlocked memory, which test_memlock.py covers.
    pinned = _may_lock(6 * (2 << 20) + (4 << 20))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if not pinned else "default")
        bufs = [nvio.empty_locked(size) for _ in range(6)]
    for i, t in enumerate(bufs):
        assert t.numel() == size and t.data_ptr() % 4096 == 0
        assert nvio.is_pinned(t) or not pinned
        t.fill_(i + 1)
    for i, t in enumerate(bufs):
        assert int(t[0]) == i + 1 and int(t[-1]) == i + 1, "two buffers overlap"
    spans = sorted((t.data_ptr(), t.data_ptr() + size) for t in bufs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    if size == (7 << 20) // 4:
        assert all(t.data_ptr() % (2 << 20) == 0 for t in bufs)
    views = bufs[0][size // 2:]
    assert nvio.is_pinned(views) or not pinned


def test_is_pinned_views_and_ordinary():
    t = nvio.empty_locked(1 << 16)
    assert nvio.is_pinned(t[100:200])
    assert nvio.is_pinned(t.view(torch.int32)[5:])
    assert nvio.is_pinned(t.numpy()[1:])
    assert not nvio.is_pinned(torch.empty(1 << 16, dtype=torch.uint8))
    assert not nvio.is_pinned(np.empty(1 << 16, np.uint8))
    assert not nvio.is_pinned(bytearray(100))
    assert not nvio.is_pinned(object())


def test_locked_view_roundtrip(tmp_path, rng_bytes):
    data = rng_bytes(50_001)
    base = nvio.empty_locked(200_000)
    base.fill_(0xAB)
    view = base[1234:1234 + len(data)]
    view.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    h = nvio.Handle()
    h.write(view, tmp_path / "v.bin", 99)
    assert read_file(tmp_path / "v.bin", 99) == data
    base.fill_(0)
    h.read(view, tmp_path / "v.bin", 99)
    assert as_bytes(view) == data
    assert as_bytes(base[:1234]) == b"\0" * 1234  # nothing outside the view was touched
    assert as_bytes(base[1234 + len(data):]) == b"\0" * (200_000 - 1234 - len(data))


# --------------------------------------------------------------------------------------------
# Threads, options, report
# --------------------------------------------------------------------------------------------


def test_handle_shared_between_threads(tmp_path, rng_bytes):
    h = nvio.Handle(block_size=32 * 1024, intra_op_parallelism=2)
    blobs = [rng_bytes(300_000 + i, i) for i in range(6)]
    errors = []

    def work(i):
        try:
            for rep in range(3):
                path = tmp_path / f"th{i}.bin"
                h.write(bytearray(blobs[i]), path, rep)
                out = bytearray(len(blobs[i]))
                if rep % 2:
                    h.read_async(out, path, rep).wait()
                else:
                    h.read(out, path, rep)
                assert bytes(out) == blobs[i]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(blobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_handle_options_reflect_arguments():
    h = nvio.Handle(engine="psync", block_size=8192, queue_depth=7, intra_op_parallelism=3,
                    direct="off")
    o = h.options
    assert o["engine"] == "psync"
    assert o["block_size"] == 8192
    assert o["queue_depth"] == 7
    assert o["intra_op_parallelism"] == 3
    assert o["direct"] == "off"
    assert h.engine == "psync"
    assert isinstance(h.engine_reason, str)


def test_auto_engine_is_concrete():
    h = nvio.Handle(engine="auto")
    assert h.engine in ENGINES
    assert h.engine == nvio.report()["auto_engine"]


def test_report_where_the_directory_cannot_be_probed(monkeypatch):
    # The probe creates a file; sysfs refuses that even to root.
    monkeypatch.chdir("/sys")
    d = nvio.report()["dir"]
    assert d["path"] == "/sys" and "probing the directory" in d["error"]
    assert d["direct_io"] is None and d["mem_align"] is None and d["offset_align"] is None
    with pytest.raises(nvio.IOFailure, match="probing the directory"):
        nvio.report("/sys")


def test_report_keys(tmp_path):
    rep = nvio.report(str(tmp_path))
    for key in ("engines", "auto_engine", "dir", "memlock_limit", "options", "version"):
        assert key in rep, key
    assert set(rep["engines"]) == set(ENGINES)
    assert rep["auto_engine"] in ENGINES
    for key in ("direct_io", "mem_align", "offset_align"):
        assert key in rep["dir"], key
    assert isinstance(rep["dir"]["direct_io"], bool) and rep["dir"]["error"] is None
    if rep["dir"]["direct_io"]:
        assert rep["dir"]["mem_align"] > 0 and rep["dir"]["offset_align"] > 0
    assert rep["memlock_limit"] is None or isinstance(rep["memlock_limit"], int)
    assert rep["version"] == nvio.__version__
    for name in ("engine", "block_size", "queue_depth", "single_submit", "overlap_events",
                 "intra_op_parallelism", "direct", "gpu_direct", "cached_reads"):
        assert set(rep["options"][name]) == {"value", "source"}
    assert rep["options"]["block_size"]["value"] == 1048576
    assert rep["options"]["block_size"]["source"] == "default"


def test_report_matches_the_cli(tmp_path):
    """nvio.report() and `nvio report --json` give the same sections (gpu and the memlock
    capability included), where the CLI was built beside the package (build/bin/nvio)."""
    import json
    import os
    import subprocess
    from pathlib import Path

    cli = Path(nvio.__file__).resolve().parents[2] / "bin" / "nvio"
    if not cli.exists():
        pytest.skip(f"no nvio CLI beside the package ({cli})")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIO_")}
    env["NVIO_CONFIG"] = "none"
    out = subprocess.run([str(cli), "report", "--json", "--dir", str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True).stdout
    theirs = json.loads(out)
    mine = nvio.report(str(tmp_path))
    for key in ("gpu", "memlock_limit", "memlock_capability", "kernel", "auto_engine"):
        assert mine[key] == theirs[key], key
    with open("/proc/self/status") as status:
        capeff = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    assert mine["memlock_capability"] == bool(capeff >> 14 & 1)


def test_report_sees_environment(monkeypatch):
    monkeypatch.setenv("NVIO_QUEUE_DEPTH", "17")
    rep = nvio.report()
    assert rep["options"]["queue_depth"]["value"] == 17
    assert rep["options"]["queue_depth"]["source"] != "default"
    assert nvio.Handle().options["queue_depth"] == 17
    assert nvio.Handle(queue_depth=5).options["queue_depth"] == 5  # an argument beats the env


def _deleted_fds() -> int:
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").endswith(" (deleted)"):
                count += 1
        except OSError:
            pass
    return count


def test_close_files_lets_go_of_a_removed_file(tmp_path):
    """The handle keeps what it opened; close_files() closes it, so that a removed file's space
    comes back at once (the handle would let go of it by itself within about a second)."""
    h = nvio.Handle()
    path = tmp_path / "kept.bin"
    data = torch.arange(1 << 16, dtype=torch.uint8)
    h.write(data, str(path))
    back = torch.empty_like(data)
    h.read(back, str(path))
    assert torch.equal(back, data)
    assert h.open_files() == 2  # the name for writing and for reading
    before = _deleted_fds()
    os.unlink(path)
    assert _deleted_fds() > before, "the handle should hold the removed file open"
    h.close_files()
    assert h.open_files() == 0
    assert _deleted_fds() == before
