"""The temporary files of replacing saves (src/jobs/replace_file.*, through the binding for
nvio.save): named after the process that writes them (host, start time, pid), removed by the next
save or load of their target once their writer is gone, and never while it may run (issue 28 #4).
A SIGKILLed nvio.save is in test_checkpoint.py; here every other case, and the C++ saves
(safetensors.save_file) that use the same mechanism."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import nvio  # noqa: E402
from nvio import _nvio  # noqa: E402


def start_time(pid):
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks after boot."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


HOST = "".join(c if c.isascii() and c.isalnum() else "-" for c in socket.gethostname()[:63])
HOST = HOST or "host"
PACKAGE = os.path.dirname(os.path.dirname(nvio.__file__))


def temporaries(directory):
    return sorted(n for n in os.listdir(directory) if n.endswith(".nvio-tmp"))


def dead_process():
    """(pid, start time) of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = start_time(child.pid)
    finally:
        child.kill()
        child.wait()
    return child.pid, start


def make(directory, name):
    with open(os.path.join(directory, name), "wb") as f:
        f.write(b"x" * 100)
    return name


ENTRIES = ("nvio.save", "nvio.load", "nvio.load(into=)", "safetensors.save_file")


def access(entry, target):
    """A save or load of `target` (a torch checkpoint) by one entry point that replaces or reads
    it; afterwards `target` is a torch checkpoint again."""
    w = torch.arange(5)
    if entry == "nvio.save":
        nvio.save({"w": w}, target)
    elif entry == "nvio.load":
        assert torch.equal(nvio.load(target)["w"], w)
    elif entry == "nvio.load(into=)":
        assert torch.equal(nvio.load(target, into={"w": torch.zeros(5, dtype=w.dtype)})["w"], w)
    else:  # the C++ save (jobs/replace_file's ReplacementFile)
        nvio.safetensors.save_file({"w": w}, str(target))
        assert torch.equal(nvio.safetensors.load_file(str(target))["w"], w)
        torch.save({"w": w}, target)


def test_the_name_says_who_writes_it(tmp_path):
    target = str(tmp_path / "ckpt.pt")
    path, fd = _nvio.create_temporary(target.encode())
    try:
        name = os.path.basename(path)
        assert os.path.dirname(path) == str(tmp_path)
        assert name.startswith(".ckpt.pt.") and name.endswith(".nvio-tmp")
        assert _nvio.temporary_writer("ckpt.pt", name) == (HOST, start_time(os.getpid()),
                                                          os.getpid())
        assert _nvio.temporary_writer("ckpt", name) is None  # another target's
        assert _nvio.temporary_writer("ckpt.pt.x", name) is None
        os.write(fd, b"written through the descriptor")
    finally:
        os.close(fd)
    assert open(path, "rb").read() == b"written through the descriptor"
    for bad in (".ckpt.pt.0123abcd.nvio-tmp",  # what nvio.save named them before
                f".ckpt.pt.{HOST}.x.1-2-3.nvio-tmp", f".ckpt.pt.{HOST}.5.1-2-3",
                f".ckpt.pt.{HOST}.5.x-2-3.nvio-tmp", f".ckpt.pt.a.b.5.1-2-3.nvio-tmp"):
        assert _nvio.temporary_writer("ckpt.pt", bad) is None, bad


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_dead_writers_temporary_is_removed_by_the_next_save_or_load(tmp_path, entry):
    target = tmp_path / "ckpt.pt"
    nvio.save({"w": torch.arange(5)}, target)
    # A process that made a temporary and ended without removing it (as SIGKILL leaves one).
    made = subprocess.run([sys.executable, "-c", "import sys, nvio; "
                           "print(nvio._nvio.create_temporary(sys.argv[1])[0])", str(target)],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": PACKAGE}).stdout.strip()
    pid, start = dead_process()
    ours = start_time(os.getpid())
    stale = [os.path.basename(made),
             make(tmp_path, f".{target.name}.{HOST}.{start}.{pid}-{pid}-0.nvio-tmp"),
             # this process's pid with another start time: a process before it had the pid
             make(tmp_path, f".{target.name}.{HOST}.{ours - 1}.{os.getpid()}-1-0.nvio-tmp")]
    kept = [make(tmp_path, f".{target.name}.another-host.{start}.{pid}-{pid}-0.nvio-tmp"),
            make(tmp_path, f".{target.name}.{HOST}.{ours}.{os.getpid()}-1-7.nvio-tmp"),
            make(tmp_path, f".{target.name}.1234abcd.nvio-tmp"),  # not a name it makes
            make(tmp_path, f".other.pt.{HOST}.{start}.{pid}-{pid}-0.nvio-tmp")]
    assert set(stale) <= set(temporaries(tmp_path))
    access(entry, target)
    assert temporaries(tmp_path) == sorted(kept)


def test_safetensors_load_file_removes_them_too(tmp_path):
    target = tmp_path / "m.safetensors"
    nvio.safetensors.save_file({"w": torch.arange(5)}, str(target))
    pid, start = dead_process()
    make(tmp_path, f".m.safetensors.{HOST}.{start}.{pid}-{pid}-0.nvio-tmp")
    kept = make(tmp_path, f".m.safetensors.another-host.{start}.{pid}-{pid}-0.nvio-tmp")
    assert torch.equal(nvio.safetensors.load_file(str(target))["w"], torch.arange(5))
    assert temporaries(tmp_path) == [kept]


def test_a_live_writers_temporary_is_never_touched(tmp_path):
    target = tmp_path / "ckpt.pt"
    nvio.save({"w": torch.arange(5)}, target)
    # Another process, running, with its temporary open.
    child = subprocess.Popen([sys.executable, "-c", "import sys, time, nvio; "
                              "print(nvio._nvio.create_temporary(sys.argv[1])[0], flush=True); "
                              "time.sleep(60)", str(target)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": PACKAGE})
    try:
        theirs = os.path.basename(child.stdout.readline().strip())
        mine, fd = _nvio.create_temporary(bytes(target))  # this process's, open
        os.close(fd)
        # A writer /proc does not show (another pid namespace): a dead pid, but it holds the lock.
        pid, start = dead_process()
        hidden = make(tmp_path, f".ckpt.pt.{HOST}.{start}.{pid}-{pid}-0.nvio-tmp")
        lock = os.open(tmp_path / hidden, os.O_RDONLY)
        fcntl.flock(lock, fcntl.LOCK_EX)
        live = sorted([theirs, os.path.basename(mine), hidden])
        for entry in ENTRIES:
            access(entry, target)
            assert temporaries(tmp_path) == live
        os.close(lock)  # its writer let go: stale now
        nvio.load(target)
        assert temporaries(tmp_path) == sorted([theirs, os.path.basename(mine)])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    nvio.save({"w": torch.arange(5)}, target)  # the child is gone: its temporary goes
    assert temporaries(tmp_path) == [os.path.basename(mine)]


def test_a_long_name_stays_within_name_max(tmp_path):
    target = tmp_path / ("n" * 250)
    nvio.save({"w": torch.arange(5)}, target)
    pid, start = dead_process()
    made = subprocess.run([sys.executable, "-c", "import sys, nvio; "
                           "print(nvio._nvio.create_temporary(sys.argv[1])[0])", str(target)],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": PACKAGE}).stdout.strip()
    name = os.path.basename(made)
    assert len(name.encode()) <= 255 and name.startswith(".nnnn") and "~" in name
    assert _nvio.temporary_writer(target.name, name)[0] == HOST
    assert temporaries(tmp_path) == [name]
    assert torch.equal(nvio.load(target)["w"], torch.arange(5))
    assert temporaries(tmp_path) == []
