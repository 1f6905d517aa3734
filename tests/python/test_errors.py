"""Every misuse raises a Python exception (never an abort), of the matching built-in class, rooted
in nvio.Error, naming the path, offset and length."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import torch

import nvio
from conftest import write_file

ALL_ERRORS = ("InvalidArgument", "EngineUnavailable", "LockedMemoryError", "IOFailure",
              "FileNotFound", "PermissionDenied", "IsADirectory", "NoSpace", "ShortFile",
              "ValidationError")


def test_exception_hierarchy():
    for name in ALL_ERRORS:
        cls = getattr(nvio, name)
        assert issubclass(cls, nvio.Error), name
        assert issubclass(cls, Exception), name
    assert issubclass(nvio.FileNotFound, FileNotFoundError)
    assert issubclass(nvio.PermissionDenied, PermissionError)
    assert issubclass(nvio.IsADirectory, IsADirectoryError)
    assert issubclass(nvio.ShortFile, OSError) and issubclass(nvio.ShortFile, EOFError)
    assert issubclass(nvio.IOFailure, OSError)
    assert issubclass(nvio.NoSpace, OSError)
    assert issubclass(nvio.InvalidArgument, ValueError)
    assert issubclass(nvio.ValidationError, ValueError)
    assert issubclass(nvio.LockedMemoryError, MemoryError)


# --------------------------------------------------------------------------------------------
# File errors, through every entry point
# --------------------------------------------------------------------------------------------


def _read_calls(buf, path):
    h = nvio.Handle()
    a = nvio.aio_handle()

    def async_wait():
        a.async_pread(buf, path)
        a.wait()

    def future_wait():
        h.read_async(buf, path).wait()

    return {
        "Handle.read": lambda: h.read(buf, path),
        "Handle.read_async": future_wait,
        "aio.sync_pread": lambda: a.sync_pread(buf, path),
        "aio.async_pread": async_wait,
        "aio.read": lambda: a.read(buf, path, False),
        "aio_read": lambda: nvio.aio_read(buf, path, 4096, 4, False, False, False),
    }


@pytest.mark.parametrize("entry", list(_read_calls(None, None)))
def test_missing_file(tmp_path, entry):
    path = str(tmp_path / "missing.bin")
    with pytest.raises(FileNotFoundError) as info:
        _read_calls(bytearray(10), path)[entry]()
    e = info.value
    assert isinstance(e, nvio.FileNotFound) and isinstance(e, nvio.Error)
    assert e.errno == errno.ENOENT
    assert path in str(e)


@pytest.mark.parametrize("entry", list(_read_calls(None, None)))
def test_directory(tmp_path, entry):
    with pytest.raises(IsADirectoryError) as info:
        _read_calls(bytearray(10), str(tmp_path))[entry]()
    assert isinstance(info.value, nvio.Error)
    assert info.value.errno == errno.EISDIR
    assert str(tmp_path) in str(info.value)


def test_write_to_directory(tmp_path):
    with pytest.raises(IsADirectoryError):
        nvio.Handle().write(b"abc", tmp_path)
    a = nvio.aio_handle()
    with pytest.raises(IsADirectoryError):
        a.async_pwrite(torch.zeros(3, dtype=torch.uint8), str(tmp_path))
        a.wait()
    assert a.wait() == 0


def test_write_into_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        nvio.Handle().write(b"abc", tmp_path / "no" / "such" / "dir.bin")


@pytest.mark.parametrize("entry", list(_read_calls(None, None)))
def test_read_past_end_is_short_file(tmp_path, entry):
    path = write_file(tmp_path / "short.bin", b"s" * 1000)
    buf = bytearray(5000)
    with pytest.raises(nvio.ShortFile) as info:
        _read_calls(buf, path)[entry]()
    e = info.value
    assert isinstance(e, OSError) and isinstance(e, EOFError) and isinstance(e, nvio.Error)
    assert e.file_size == 1000
    assert "1000" in str(e)
    assert path in str(e)
    assert "5000" in str(e)


def test_short_file_at_offset_names_offset_and_length(tmp_path):
    path = write_file(tmp_path / "short.bin", b"s" * 1000)
    with pytest.raises(nvio.ShortFile) as info:
        nvio.Handle().read(bytearray(100), path, 950)
    e = info.value
    assert e.file_size == 1000
    assert e.offset == 950 and e.length == 100
    assert "950" in str(e) and "100" in str(e)
    # Reading exactly up to the end is fine.
    out = bytearray(50)
    assert nvio.Handle().read(out, path, 950) == 50
    assert bytes(out) == b"s" * 50


def test_read_from_empty_file_and_past_end_offset(tmp_path):
    path = write_file(tmp_path / "empty.bin", b"")
    with pytest.raises(nvio.ShortFile) as info:
        nvio.Handle().read(bytearray(1), path)
    assert info.value.file_size == 0
    with pytest.raises(nvio.ShortFile):
        nvio.Handle().read(bytearray(1), write_file(tmp_path / "f", b"abc"), 10)


def test_write_through_read_only_fd_is_ebadf(tmp_path):
    path = write_file(tmp_path / "ro.bin", b"r" * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            nvio.Handle().write(b"abc", fd)
        assert info.value.errno == errno.EBADF
        assert isinstance(info.value, nvio.Error)
        a = nvio.aio_handle()
        with pytest.raises(OSError) as info:
            a.sync_pwrite(torch.zeros(3, dtype=torch.uint8), fd)
        assert info.value.errno == errno.EBADF
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"r" * 100


def test_closed_fd_is_ebadf(tmp_path):
    # The handle exists before the descriptor is closed, so that its own descriptors (an
    # io_uring ring, say) cannot take the closed number.
    h = nvio.Handle()
    path = write_file(tmp_path / "c.bin", b"c" * 100)
    fd = os.open(path, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(OSError) as info:
        h.read(bytearray(10), fd)
    assert info.value.errno == errno.EBADF
    with pytest.raises(nvio.Error):
        h.read(bytearray(10), -1)


_PERMISSION_SCRIPT = textwrap.dedent("""
    import sys, nvio
    path = sys.argv[1]
    try:
        nvio.Handle().read(bytearray(10), path)
    except PermissionError as e:
        assert isinstance(e, nvio.PermissionDenied), type(e)
        assert path in str(e), str(e)
    else:
        sys.exit("read did not raise PermissionError")
    try:
        nvio.aio_handle().sync_pwrite(bytearray(10), path)
    except PermissionError as e:
        assert isinstance(e, nvio.Error)
    else:
        sys.exit("write did not raise PermissionError")
    print("ok")
""")


def test_permission_denied():
    """Needs a file the test's user cannot open: as root (which bypasses permission bits), the
    check runs in a child process that has dropped to user 'nobody'."""
    directory = tempfile.mkdtemp(prefix="nvio-perm-")
    try:
        os.chmod(directory, 0o755)
        path = write_file(os.path.join(directory, "secret.bin"), b"x" * 100)
        os.chmod(path, 0o000)
        if os.geteuid() != 0:
            with pytest.raises(PermissionError) as info:
                nvio.Handle().read(bytearray(10), path)
            assert isinstance(info.value, nvio.PermissionDenied)
            return
        import nvio as pkg

        pythonpath = os.path.dirname(os.path.dirname(os.path.abspath(pkg.__file__)))

        def drop():
            os.setgid(65534)
            os.setuid(65534)

        r = subprocess.run([sys.executable, "-c", _PERMISSION_SCRIPT, path],
                           env={"PYTHONPATH": pythonpath, "PATH": "/usr/bin:/bin"},
                           preexec_fn=drop, capture_output=True, text=True, timeout=60)
        if r.returncode != 0 and ("ModuleNotFoundError" in r.stderr or "ImportError" in r.stderr):
            pytest.skip(f"user nobody cannot import nvio from {pythonpath}: {r.stderr[-300:]}")
        assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    finally:
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


# --------------------------------------------------------------------------------------------
# Bad arguments
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,name", [
    ({"queue_depth": 0}, "queue_depth"),
    ({"queue_depth": -3}, "queue_depth"),
    ({"block_size": -1}, "block_size"),
    ({"block_size": 0}, "block_size"),
    ({"intra_op_parallelism": 0}, "intra_op_parallelism"),
    ({"intra_op_parallelism": -1}, "intra_op_parallelism"),
])
def test_bad_options_name_the_option(kwargs, name):
    for make in (nvio.Handle, nvio.aio_handle):
        with pytest.raises(ValueError, match=name) as info:
            make(**kwargs)
        assert isinstance(info.value, nvio.Error)


def test_bad_engine_and_direct():
    with pytest.raises(ValueError, match="engine") as info:
        nvio.Handle(engine="nope")
    assert isinstance(info.value, nvio.InvalidArgument)
    assert "nope" in str(info.value)
    with pytest.raises(ValueError, match="direct"):
        nvio.Handle(direct="sometimes")


def test_bad_environment_variable_names_it(monkeypatch):
    monkeypatch.setenv("NVIO_QUEUE_DEPTH", "lots")
    with pytest.raises(ValueError, match="NVIO_QUEUE_DEPTH|queue_depth"):
        nvio.Handle()


@pytest.mark.parametrize(
    "var, value", [("NVIO_BLOCK_SIZE", "16G"), ("NVIO_INTRA_OP_PARALLELISM", "0")]
)
@pytest.mark.parametrize(
    "kwargs", [{}, {"queue_depth": 8}, {"block_size": 4096, "intra_op_parallelism": 2}]
)
def test_out_of_range_environment_raises_whatever_the_arguments(monkeypatch, var, value, kwargs):
    # Explicit arguments, for other options or for the same one, do not hide a bad variable.
    monkeypatch.setenv(var, value)
    with pytest.raises(nvio.InvalidArgument, match=f"{var}.*'{value}'|'{value}'.*{var}"):
        nvio.Handle(**kwargs)


def test_negative_offset(tmp_path):
    path = write_file(tmp_path / "n.bin", b"n" * 100)
    h = nvio.Handle()
    a = nvio.aio_handle()
    calls = [
        lambda: h.read(bytearray(10), path, -1),
        lambda: h.write(b"abc", path, -5),
        lambda: h.read_async(bytearray(10), path, -1),
        lambda: h.write_async(b"abc", path, -1),
        lambda: a.sync_pread(bytearray(10), path, -1),
        lambda: a.async_pwrite(bytearray(10), path, file_offset=-4096),
        lambda: a.pread(bytearray(10), path, False, True, -1),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="offset") as info:
            call()
        assert isinstance(info.value, nvio.Error)
    assert a.wait() == 0
    assert h.wait_all() == 0
    with open(path, "rb") as f:
        assert f.read() == b"n" * 100


def test_bad_file_argument_types(tmp_path):
    h = nvio.Handle()
    for bad in (None, 3.5, [str(tmp_path / "x")], True):
        with pytest.raises(TypeError):
            h.read(bytearray(10), bad)
        with pytest.raises(TypeError):
            nvio.aio_handle().sync_pread(bytearray(10), bad)


def test_empty_locked_too_big_raises_not_aborts():
    with pytest.raises((MemoryError, ValueError, OSError)) as info:
        nvio.empty_locked(1 << 62)
    assert isinstance(info.value, nvio.Error)


def test_no_abort_on_many_misuses(tmp_path):
    """A scatter of misuses in a child interpreter: it must exit normally, not abort."""
    script = textwrap.dedent(f"""
        import nvio, torch, gc
        d = {str(tmp_path)!r}
        a = nvio.aio_handle()
        for f in (a.wait, lambda: a.sync_pread(bytearray(4), d + '/nope'),
                  lambda: a.async_pread(bytearray(4), d),
                  lambda: a.free_cpu_locked_tensor(torch.zeros(1)),
                  lambda: a.new_cpu_locked_tensor(-1, torch.zeros(1)),
                  lambda: nvio.Handle(queue_depth=10**12),
                  lambda: nvio.Handle(block_size=2**70),
                  lambda: nvio.Handle().read(bytearray(4), 10**6),
                  lambda: nvio.Handle().read(bytearray(4), d + '/nope', 2**70)):
            try:
                f()
            except Exception:
                pass
        h = nvio.aio_handle()
        h.async_pwrite(bytearray(1 << 20), d + '/pending.bin')
        del h
        gc.collect()
        print("survived")
    """)
    import nvio as pkg

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(pkg.__file__))))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert "survived" in r.stdout
    assert os.path.getsize(tmp_path / "pending.bin") == 1 << 20


def test_every_public_exception_is_exported():
    for name in ALL_ERRORS:
        assert name in nvio.__all__, name


def test_error_during_numpy_read_leaves_no_pending_state(tmp_path):
    h = nvio.Handle()
    with pytest.raises(FileNotFoundError):
        h.read(np.zeros(10, np.uint8), tmp_path / "nope")
    assert h.wait_all() == 0


_READ_ONLY_MEMMAP_SCRIPT = textwrap.dedent("""
    import errno, sys, warnings
    import numpy as np, torch, nvio
    src, ro = sys.argv[1], sys.argv[2]
    warnings.simplefilter("ignore")  # torch warns that the array is not writable
    dst = torch.from_numpy(np.memmap(ro, mode="r"))[1:1 << 19]  # unaligned, read-only
    for name, call in (("read", lambda: nvio.Handle().read(dst, src)),
                       ("read_async", lambda: nvio.Handle().read_async(dst, src).wait()),
                       ("aio", lambda: nvio.aio_handle().sync_pread(dst, src))):
        try:
            call()
            print(name, "no exception")
        except OSError as e:
            ok = isinstance(e, nvio.IOFailure) and e.errno == errno.EFAULT and src in str(e)
            print(name, "EFAULT" if ok else f"wrong: {type(e).__name__} {e.errno} {e}")
    src_bytes = open(src, "rb").read(1 << 20)
    assert bytes(np.memmap(ro, mode="r")[:1 << 20]) != src_bytes, "read-only memory was written"
""")


def test_read_into_read_only_memmap_is_efault(tmp_path):
    """Reading into a read-only mapping through the unaligned (bounce) path is an IOFailure with
    EFAULT, as it is for an aligned one, not a SIGSEGV. Run in a child, so that a crash fails this
    test instead of ending pytest."""
    src = write_file(tmp_path / "src.bin", os.urandom(1 << 20))
    ro = write_file(tmp_path / "ro.bin", bytes(1 << 20))
    import nvio as pkg

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(pkg.__file__))))
    r = subprocess.run([sys.executable, "-c", _READ_ONLY_MEMMAP_SCRIPT, src, ro],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, f"exit status {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.split("\n")[:3] == ["read EFAULT", "read_async EFAULT", "aio EFAULT"], r.stdout


def test_python_code_types_an_errno_as_the_core_does():
    # One errno table (the core's throw_io_error): an OSError that Python code turns into nvio's
    # typed error gets the type a failing core call would raise (issue 29: the checkpoint module's
    # own table said FileNotFound for ENOTDIR, the core IOFailure).
    import errno as errno_module
    from nvio import _nvio
    from nvio.checkpoint import _typed

    expected = {errno_module.ENOENT: nvio.FileNotFound, errno_module.ENOTDIR: nvio.IOFailure,
                errno_module.EACCES: nvio.PermissionDenied, errno_module.EPERM: nvio.PermissionDenied,
                errno_module.EROFS: nvio.ReadOnlyFileSystem, errno_module.EISDIR: nvio.IsADirectory,
                errno_module.ENOSPC: nvio.NoSpace, errno_module.EDQUOT: nvio.NoSpace,
                errno_module.EIO: nvio.IOFailure}
    for code, kind in expected.items():
        assert _nvio.error_type(code) is kind, errno_module.errorcode[code]
        e = _typed(OSError(code, "x"), "load", "/some/file")
        assert type(e) is kind and e.errno == code and e.path == "/some/file"
    with pytest.raises(nvio.IOFailure) as info:  # the core itself, for comparison
        nvio.load(os.path.join(__file__, "not-a-directory", "x.pt"))
    assert type(info.value) is nvio.IOFailure and info.value.errno == errno_module.ENOTDIR
