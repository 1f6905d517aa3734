"""Hostile input (issue 9): object buffers, NUL bytes and odd names in paths, fork, one handle
shared by threads, loosely typed arguments, and the exception types they raise.

Cases that used to kill the interpreter run in a child interpreter, so that a regression shows as
a failed test rather than a dead test run.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import nvio
import nvio.deepspeed
from conftest import random_bytes, start_waiting, wait_child, write_file


def run_child(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter that imports the same nvio as this one."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env)


# --------------------------------------------------------------------------------------------
# Object buffers
# --------------------------------------------------------------------------------------------


def test_object_arrays_are_refused_without_touching_memory(tmp_path):
    path = write_file(tmp_path / "f.bin", random_bytes(800))
    result = run_child(f"""
        import numpy as np, nvio
        path = {path!r}
        objects = np.array([object()] * 100)
        structured = np.zeros(4, dtype=[("a", "i4"), ("b", "O")])
        calls = {{
            "Handle.read": lambda b: nvio.Handle().read(b, path),
            "Handle.write": lambda b: nvio.Handle().write(b, path + ".out"),
            "aio.sync_pread": lambda b: nvio.aio_handle().sync_pread(b, path),
            "aio.async_pwrite": lambda b: nvio.aio_handle().async_pwrite(b, path + ".out"),
        }}
        for buf in (objects, structured, memoryview(objects)):
            for name, call in calls.items():
                try:
                    call(buf)
                except nvio.InvalidType as e:
                    assert isinstance(e, TypeError) and isinstance(e, nvio.Error), name
                    assert "object" in str(e), str(e)
                else:
                    raise SystemExit(f"{{name}} accepted {{buf!r:.40}}")
        import gc; gc.collect()
        print("ok", objects[0] is objects[1])
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["ok", "True"]
    assert not os.path.exists(path + ".out")


def test_plain_structured_arrays_still_work(tmp_path):
    a = np.arange(12, dtype=np.int32).view([("x", "i4"), ("Offset", "i4")])
    path = str(tmp_path / "s.bin")
    nvio.Handle().write(memoryview(a), path)
    b = np.zeros_like(a)
    nvio.Handle().read(b, path)
    assert a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------


def _write_calls(buf):
    h = nvio.Handle()
    a = nvio.aio_handle()

    def aio_async(path):
        a.async_pwrite(buf, path)
        a.wait()

    return {
        "Handle.write": lambda p: h.write(buf, p),
        "Handle.write_async": lambda p: h.write_async(buf, p).wait(),
        "Handle.read": lambda p: h.read(bytearray(4), p),
        "aio.sync_pwrite": lambda p: a.sync_pwrite(buf, p),
        "aio.pwrite": lambda p: a.pwrite(buf, p, False, False),
        "aio.async_pwrite": aio_async,
        "aio_write": lambda p: nvio.aio_write(buf, p, 4096, 4, False, False, False),
    }


@pytest.mark.parametrize("entry", list(_write_calls(b"")))
@pytest.mark.parametrize("form", ["str", "bytes"])
def test_nul_byte_in_path_is_value_error_and_writes_nothing(tmp_path, entry, form):
    path = str(tmp_path / "a") + "\x00b"
    target = path if form == "str" else os.fsencode(path)
    with pytest.raises(ValueError) as info:
        _write_calls(b"payload!")[entry](target)
    assert isinstance(info.value, nvio.InvalidArgument)
    assert "null byte" in str(info.value)
    assert os.listdir(tmp_path) == []


def test_nul_byte_in_directory_arguments(tmp_path):
    bad = str(tmp_path) + "\x00x"
    with pytest.raises(nvio.InvalidArgument):
        nvio.report(bad)
    with pytest.raises(nvio.InvalidArgument):
        nvio.Handle.from_config(bad)
    with pytest.raises(nvio.InvalidArgument):
        nvio.tune(bad, budget=1)


def test_names_that_are_not_utf8_work_like_open(tmp_path):
    raw = os.fsencode(str(tmp_path)) + b"/caf\xe9-\xff.bin"  # Latin-1 bytes, as os.listdir sees
    name = os.fsdecode(raw)  # a str with surrogate escapes
    data = random_bytes(5000, seed=3)
    nvio.Handle().write(data, name)
    assert os.listdir(os.fsencode(str(tmp_path))) == [os.path.basename(raw)]
    with open(raw, "rb") as f:
        assert f.read() == data
    for form in (name, raw):
        buf = bytearray(len(data))
        nvio.Handle().read(buf, form)
        assert bytes(buf) == data
        buf = bytearray(len(data))
        nvio.aio_handle().sync_pread(buf, form)
        assert bytes(buf) == data
    missing = os.fsdecode(os.fsencode(str(tmp_path)) + b"/missing-\xff")
    with pytest.raises(FileNotFoundError) as info:
        nvio.Handle().read(bytearray(4), missing)
    assert info.value.filename == missing  # the same name, usable with os functions
    assert "\\xff" in str(info.value)


def test_pathlike_everywhere(tmp_path):
    import pathlib

    p = pathlib.Path(tmp_path) / "p.bin"
    data = random_bytes(4097)
    nvio.Handle().write(data, p)
    buf = bytearray(len(data))
    nvio.aio_handle().sync_pread(buf, p)
    assert bytes(buf) == data
    assert nvio.report(pathlib.Path(tmp_path))["dir"]["path"] == str(tmp_path)
    nvio.Handle.from_config(pathlib.Path(tmp_path))


# --------------------------------------------------------------------------------------------
# fork
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["Handle", "aio_handle"])
def test_forked_child_uses_its_parents_handle(tmp_path, kind):
    data = random_bytes((1 << 20) + 123, seed=5)
    src = write_file(tmp_path / "src.bin", data)
    h = nvio.Handle() if kind == "Handle" else nvio.aio_handle()
    buf = bytearray(len(data))
    if kind == "Handle":
        h.read(buf, src)
    else:
        h.sync_pread(buf, src)
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            mine = bytearray(len(data))
            out = str(tmp_path / "child.bin")
            if kind == "Handle":
                h.read(mine, src)
                h.write_async(mine, out).wait()
                assert h.wait_all() == 0
            else:
                h.async_pread(mine, src)
                assert h.wait() == 1
                h.sync_pwrite(mine, out)
            with open(out, "rb") as f:
                code = 0 if f.read() == data and bytes(mine) == data else 2
            del h
        except BaseException:
            code = 3
        os._exit(code)
    assert wait_child(pid) == 0
    buf2 = bytearray(len(data))
    if kind == "Handle":
        h.read(buf2, src)
    else:
        h.sync_pread(buf2, src)
    assert bytes(buf2) == data


def test_forked_child_does_not_see_the_parents_pending_operations(tmp_path):
    data = random_bytes(8 << 20, seed=6)
    src = write_file(tmp_path / "src.bin", data)
    h = nvio.Handle(block_size=4096, queue_depth=1, intra_op_parallelism=1)
    a = nvio.aio_handle(block_size=4096, queue_depth=1)
    buf_h, buf_a = bytearray(len(data)), bytearray(len(data))
    fut = h.read_async(buf_h, src)
    a.async_pread(buf_a, src)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            assert a.wait() == 0  # the parent's operation is not the child's
            assert h.wait_all() == 0
            try:
                fut.wait()
                code = 4
            except nvio.Error as e:
                code = 0 if "before a fork" in str(e) else 5
        except BaseException:
            code = 3
        os._exit(code)
    assert wait_child(pid) == 0
    assert fut.wait() == len(data) and a.wait() == 1
    assert bytes(buf_h) == data and bytes(buf_a) == data


class _Chunks(torch.utils.data.Dataset):
    def __init__(self, path: str, chunk: int, count: int) -> None:
        self.path, self.chunk, self.count = path, chunk, count
        self.handle = nvio.Handle()  # made in the parent, used in the forked workers

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        t = torch.empty(self.chunk, dtype=torch.uint8)
        self.handle.read(t, self.path, i * self.chunk)
        return t


def test_dataloader_workers_forked_with_a_handle(tmp_path):
    chunk, count = 64 * 1024 + 3, 16
    data = random_bytes(chunk * count, seed=7)
    path = write_file(tmp_path / "d.bin", data)
    ds = _Chunks(path, chunk, count)
    ds[0]  # the parent's workers exist before the fork
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork", timeout=60)
    got = b"".join(bytes(t.numpy()) for t in loader)
    assert got == data


# --------------------------------------------------------------------------------------------
# One handle, several threads
# --------------------------------------------------------------------------------------------


def _slow_aio(monkeypatch):
    """A handle slow enough that a second thread's wait overlaps the first's: 4 KiB pieces one at
    a time, and direct (the test has just written its file, and read through the page cache the
    whole read could end before the other thread waits)."""
    monkeypatch.setenv("NVIO_CACHED_READS", "off")
    return nvio.aio_handle(block_size=4096, queue_depth=1, intra_op_parallelism=1)


def test_shared_aio_handle_wait_never_returns_before_the_callers_read(tmp_path, monkeypatch):
    data = random_bytes(16 << 20, seed=8)
    path = write_file(tmp_path / "s.bin", data)
    h = _slow_aio(monkeypatch)
    mine, theirs = bytearray(len(data)), bytearray(len(data))
    h.async_pread(theirs, path)
    h.async_pread(mine, path)
    counts = []
    t = threading.Thread(target=lambda: counts.append(h.wait()))
    t.start()
    while h._pending.not_taken():  # the other thread's wait has taken both reads
        time.sleep(0.0005)
    counts.append(h.wait())
    assert bytes(mine) == data, "wait() returned while this thread's read was in flight"
    t.join()
    assert bytes(theirs) == data
    assert sorted(counts) == [0, 2]  # each operation counted once


def test_shared_aio_handle_wait_raises_a_failure_collected_by_another_thread(tmp_path, monkeypatch):
    data = random_bytes(8 << 20, seed=9)
    path = write_file(tmp_path / "s.bin", data)
    h = _slow_aio(monkeypatch)
    ro = os.open(path, os.O_RDONLY)
    h.async_pread(bytearray(len(data)), path)
    h.async_pwrite(bytearray(len(data)), fd=ro)  # EBADF when it runs
    errors = []

    def other():
        try:
            h.wait()
        except nvio.Error as e:
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    while h._pending.not_taken():
        time.sleep(0.0005)
    with pytest.raises(nvio.IOFailure) as info:
        h.wait()
    t.join()
    os.close(ro)
    assert info.value.errno == errno.EBADF
    assert len(errors) == 1 and errors[0].errno == errno.EBADF


def test_shared_handle_wait_all_waits_for_futures_another_thread_is_waiting_for(tmp_path):
    data = random_bytes(16 << 20, seed=10)
    path = write_file(tmp_path / "s.bin", data)
    # Direct 4 KiB pieces one at a time: read through the page cache, the read could end (and
    # the other thread's wait remove it) before wait_all() looks.
    h = nvio.Handle(block_size=4096, queue_depth=1, intra_op_parallelism=1, cached_reads="off")
    buf = bytearray(len(data))
    fut = h.read_async(buf, path)
    t = start_waiting(fut)
    assert h.wait_all() == 1
    assert bytes(buf) == data, "wait_all() returned while a read was in flight"
    t.join()


def test_threads_submitting_and_waiting_on_one_aio_handle(tmp_path, monkeypatch):
    data = random_bytes((1 << 20) + 123, seed=11)
    path = write_file(tmp_path / "m.bin", data)
    h = _slow_aio(monkeypatch)
    bad = []

    def body():
        buf = bytearray(len(data))
        for _ in range(10):
            buf[:] = bytes(len(data))
            h.async_pread(buf, path)
            h.wait()
            if bytes(buf) != data:
                bad.append(1)

    threads = [threading.Thread(target=body) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


# --------------------------------------------------------------------------------------------
# Argument types and values
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, name", [
    ({"single_submit": "no"}, "single_submit"),
    ({"overlap_events": "false"}, "overlap_events"),
    ({"single_submit": 2}, "single_submit"),
    ({"queue_depth": True}, "queue_depth"),
    ({"block_size": 1.5e6}, "block_size"),
    ({"intra_op_parallelism": "2"}, "intra_op_parallelism"),
])
def test_aio_handle_arguments_are_type_checked(kwargs, name):
    with pytest.raises(TypeError) as info:
        nvio.aio_handle(**kwargs)
    assert isinstance(info.value, nvio.InvalidType) and name in str(info.value)
    with pytest.raises(TypeError) as info:
        nvio.Handle(**kwargs)
    assert name in str(info.value)


def test_aio_handle_accepts_what_deepspeeds_binding_accepts():
    h = nvio.aio_handle(np.int64(4096), np.int32(8), np.bool_(True), 0, np.int64(2))
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(),
            h.get_overlap_events(), h.get_intra_op_parallelism()) == (4096, 8, True, False, 2)


def test_engine_and_direct_must_be_strings():
    with pytest.raises(nvio.InvalidType):
        nvio.Handle(engine=1)
    with pytest.raises(nvio.InvalidType):
        nvio.Handle(direct=True)


@pytest.mark.parametrize("config, bad", [
    ({"blok_size": 4096, "queue_dept": 8}, "blok_size"),
    ({"aio": {"blok_size": 4096}}, "blok_size"),
    ({"block_size": 4096, "overlap_event": True}, "overlap_event"),
    ({"train_batch_size": 8, "block_size": 4096}, "block_size"),
    ({"train_batch_size": 8, "aoi": {"block_size": 4096}}, "aoi"),
])
def test_aio_config_unknown_keys_are_errors_in_both_forms(config, bad):
    with pytest.raises(nvio.InvalidArgument) as info:
        nvio.deepspeed.aio_handle_from_config(config)
    assert bad in str(info.value)


def test_aio_config_suggests_the_key_meant():
    with pytest.raises(nvio.InvalidArgument, match="did you mean 'block_size'"):
        nvio.deepspeed.aio_handle_from_config({"blok_size": 4096})


def test_aio_config_whole_config_without_aio_gets_defaults():
    h = nvio.deepspeed.aio_handle_from_config({"train_batch_size": 8, "zero_optimization": {}})
    assert h.get_block_size() == 1048576 and h.get_queue_depth() == 8  # DeepSpeed's default
    h = nvio.deepspeed.aio_handle_from_config({"aio": {"single_submit": "true"}})
    assert h.get_single_submit() is True  # DeepSpeed's string booleans in configs stay accepted


@pytest.mark.parametrize("shape", ["10", b"10", 10.0, True, ["1", "2"], [2.0, 3], None])
def test_empty_locked_refuses_non_integer_shapes(shape):
    with pytest.raises(TypeError) as info:
        nvio.empty_locked(shape)
    assert isinstance(info.value, nvio.InvalidType)


def test_empty_locked_refuses_object_dtypes_and_impossible_sizes():
    with pytest.raises(nvio.InvalidType, match="Python objects"):
        nvio.empty_locked(4, dtype=object)
    with pytest.raises(nvio.InvalidType, match="neither a torch nor a numpy dtype"):
        nvio.empty_locked(4, dtype="no such dtype")
    with pytest.raises(nvio.InvalidArgument, match="more than a process can address"):
        nvio.empty_locked(2**62, dtype=torch.float32)
    with pytest.raises(nvio.InvalidArgument, match="more than a process can address"):
        nvio.empty_locked((2**40, 2**40), dtype=np.uint8)


@pytest.mark.parametrize("count", [2.7, "3", True, None])
def test_new_cpu_locked_tensor_takes_an_integer_count_only(count):
    h = nvio.aio_handle()
    with pytest.raises(nvio.InvalidType, match="num_elem"):
        h.new_cpu_locked_tensor(count, torch.empty(0, dtype=torch.float16))
    assert h.new_cpu_locked_tensor(np.int64(3), torch.empty(0)).numel() == 3


def test_empty_locked_takes_integer_shapes():
    assert tuple(nvio.empty_locked(np.int64(10)).shape) == (10,)
    assert tuple(nvio.empty_locked(torch.Size([2, 3])).shape) == (2, 3)
    assert tuple(nvio.empty_locked((np.int32(4), 5), dtype=np.float32).shape) == (4, 5)


def test_float_offsets_and_huge_descriptors_name_the_argument(tmp_path):
    path = write_file(tmp_path / "o.bin", random_bytes(8192))
    h, a = nvio.Handle(), nvio.aio_handle()
    with pytest.raises(TypeError, match="offset"):
        h.read(bytearray(4), path, 1.5)
    with pytest.raises(TypeError, match="file_offset"):
        a.sync_pread(bytearray(4), path, 1.0)
    with pytest.raises(ValueError, match="offset"):
        h.read(bytearray(4), path, 2**63)
    for fd in (2**63, 2**31, -1):
        with pytest.raises(ValueError, match="file descriptor") as info:
            h.read(bytearray(4), fd)
        assert isinstance(info.value, nvio.InvalidArgument)
        with pytest.raises(ValueError, match="file descriptor"):
            a.sync_pread(bytearray(4), fd=fd)
    with pytest.raises(TypeError, match="validate"):
        a.read(bytearray(4), path, "yes")


# --------------------------------------------------------------------------------------------
# Exception types
# --------------------------------------------------------------------------------------------


def test_buffer_misuse_raises_nvio_errors_that_are_value_errors(tmp_path):
    path = write_file(tmp_path / "b.bin", random_bytes(4096))
    cases = {
        "non-contiguous tensor": (torch.zeros(64, 64)[:, ::2], True),
        "non-contiguous array": (np.zeros((64, 64))[:, ::2], False),
        "read-only array": (np.frombuffer(bytes(4096), dtype=np.uint8), True),
        "read-only memoryview": (memoryview(bytes(4096)), True),
    }
    for what, (buf, is_read) in cases.items():
        h = nvio.Handle()
        call = (lambda: h.read(buf, path)) if is_read else (lambda: h.write(buf, path))
        with pytest.raises(ValueError) as info:
            call()
        assert isinstance(info.value, nvio.InvalidArgument), what


@pytest.mark.parametrize("view", ["conj", "neg"])
def test_lazily_conjugated_or_negated_tensors_are_refused_where_bytes_would_lose_the_view(
        tmp_path, view):
    """A conj() or negated view's memory holds the values before the view: written as they are,
    the file would hold other values than the tensor shows, and a read into one would show the
    file's values conjugated or negated."""
    base = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64) if view == "conj" \
        else torch.tensor([1.0, 2.0])
    lazy = base.conj() if view == "conj" else torch._neg_view(base)
    assert lazy.is_conj() or lazy.is_neg()
    path = tmp_path / "v.bin"
    h = nvio.Handle()
    with pytest.raises(nvio.InvalidArgument, match=f"resolve_{view}"):
        h.write(lazy, str(path))
    assert not path.exists()
    h.write(lazy.resolve_conj().resolve_neg(), str(path))
    with pytest.raises(nvio.InvalidArgument, match=f"resolve_{view}"):
        h.read(lazy, str(path))
    with pytest.raises(nvio.InvalidArgument, match=f"resolve_{view}"):
        h.write_async(lazy, str(path))
    with nvio.TensorSwapper(str(tmp_path / "swap"), budget_bytes=1 << 20) as swapper:
        with pytest.raises(nvio.InvalidArgument, match=f"resolve_{view}"):
            swapper.swap_out("t", lazy)
    if view == "conj":
        return  # safetensors has no complex dtypes
    # safetensors resolves it: the file holds what the tensor shows, as torch prints it.
    nvio.safetensors.save_file({"t": lazy}, str(tmp_path / "v.safetensors"))
    back = nvio.safetensors.load_file(str(tmp_path / "v.safetensors"))["t"]
    assert torch.equal(back, lazy.resolve_conj().resolve_neg())
    assert not back.is_conj() and not back.is_neg()


def test_a_future_keeps_the_tensors_memory_when_the_tensor_is_repointed(tmp_path):
    """`t.data = other` (a ZeRO idiom to free a parameter) while a read into t runs: the future
    holds t's storage, not only t, so the read ends in memory that is still there (before: EFAULT,
    or a worker's copy into freed memory crashed the process)."""
    n = 32 << 20
    path = tmp_path / "big.bin"
    np.ones(n, np.uint8).tofile(path)
    nvio.evict(str(path))
    # Page-aligned, so that each 4 KiB piece goes straight into it (no worker copy to crash in):
    # a piece into freed, unmapped memory fails with EFAULT.
    # A torch view would keep its base (and the memory) alive through autograd's view tracking:
    # the tensor is made from numpy memory, which its storage alone holds.
    raw = np.empty(n + 4096, np.uint8)
    skip = -raw.ctypes.data % 4096
    t = torch.from_numpy(raw[skip:skip + n])
    del raw
    assert t._base is None
    h = nvio.Handle(engine="psync", queue_depth=1, intra_op_parallelism=1, block_size=4096)
    future = h.read_async(t, str(path))
    t.data = torch.empty(0, dtype=torch.uint8)  # frees the storage unless something holds it
    assert not future.done(), "the read ended before the tensor was repointed: nothing tested"
    assert future.wait() == n


def test_names_that_are_not_utf8_and_odd_buffer_objects_raise_nvio_errors(tmp_path):
    """Each of these reached pybind11's argument conversion, whose TypeError lists the overloads
    and prints raw object addresses."""
    bad = "w\udcff"  # what os.fsdecode makes of a byte that is not UTF-8
    with nvio.TensorSwapper(str(tmp_path / "swap"), budget_bytes=1 << 20) as swapper:
        with pytest.raises(nvio.InvalidArgument, match="is not UTF-8 text"):
            swapper.swap_out(bad, torch.ones(3))
    for tensors, metadata in (({bad: torch.ones(3)}, None), ({"w": torch.ones(3)}, {bad: "x"}),
                              ({"w": torch.ones(3)}, {"k": bad})):
        with pytest.raises(nvio.InvalidArgument, match="is not UTF-8 text"):
            nvio.safetensors.save_file(tensors, str(tmp_path / "s.st"), metadata=metadata)
    assert not (tmp_path / "s.st").exists()
    with pytest.raises(nvio.InvalidType, match="data must be bytes"):
        nvio.safetensors.load("abc")

    class NotACapsule:
        def __dlpack__(self, stream=None):
            return 42

        def __dlpack_device__(self):
            return (1, 0)

    class NegativeShape:
        __cuda_array_interface__ = {"data": (4096, False), "shape": (-4,), "typestr": "<f4",
                                    "version": 3}

    with pytest.raises(nvio.InvalidType, match="not a DLPack capsule"):
        nvio.Handle().write(NotACapsule(), str(tmp_path / "d.bin"))
    with pytest.raises(nvio.InvalidArgument, match="negative size"):
        nvio.Handle().write(NegativeShape(), str(tmp_path / "d.bin"))


def test_read_only_file_system_is_its_own_error(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        with pytest.raises(nvio.ReadOnlyFileSystem) as info:
            nvio.Handle().write(b"x" * 10, str(mnt / "f.bin"))
        e = info.value
        assert isinstance(e, OSError) and not isinstance(e, PermissionError)
        assert e.errno == errno.EROFS and str(mnt) in str(e)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
