"""Locked memory whose lock was refused: under a small RLIMIT_MEMLOCK, new_cpu_locked_tensor and
nvio.empty_locked fall back to unlocked memory with one RuntimeWarning. That memory must still
move bytes both ways, and DeepSpeed's check on it (``aio_handle.is_pinned``, asserted by its
SwapBufferPool before every swap) must still pass, while ``nvio.is_pinned`` says it is not locked.

root ignores RLIMIT_MEMLOCK (CAP_IPC_LOCK), so as root the check runs in a child process that
lowered the limit and became the user nobody; as another user, in a child that lowered it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile

import pytest

import nvio

LIMIT = 64 * 1024  # bytes: room for a page, not for the 8 MiB buffers below
NOBODY = 65534

_SCRIPT = r"""
import json, os, resource, sys, warnings
import torch
import nvio
from nvio.deepspeed import AsyncIOBuilder, PinMemoryBuilder

directory = sys.argv[1]
out = {"euid": os.geteuid(), "limit": resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]}
n = 2 * 1024 * 1024  # float32 elements: 8 MiB, over the limit
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    h = AsyncIOBuilder().load(verbose=False).aio_handle()
    src = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.float32))
    dst = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.float32))
    raw = nvio.empty_locked(n * 4)
    small = nvio.empty_locked(4096)  # within the limit: locked
    pins = PinMemoryBuilder().load().pin_handle()
    native = pins.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.float32))
out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
out["shape"] = [list(src.shape), str(src.dtype), list(raw.shape)]
out["aligned"] = src.data_ptr() % 4096 == 0 and dst.data_ptr() % 4096 == 0

src.copy_(torch.arange(n, dtype=torch.float32) * 1.5 - 7.0)
raw.copy_(torch.arange(n * 4, dtype=torch.int64).remainder_(253).to(torch.uint8))
path = os.path.join(directory, "swap.bin")
out["pwrite"] = h.async_pwrite(src, path, 0)
out["wait_w"] = h.wait()
with open(path, "rb") as f:
    on_disk = f.read()
out["file_matches"] = on_disk == src.numpy().tobytes()
dst.zero_()
out["pread"] = h.async_pread(dst, path, 0)
out["wait_r"] = h.wait()
out["read_matches"] = dst.numpy().tobytes() == on_disk
raw_path = os.path.join(directory, "raw.bin")
h.sync_pwrite(raw, raw_path)
back = nvio.empty_locked(n * 4)
h.sync_pread(back, raw_path)
with open(raw_path, "rb") as f:
    out["raw_matches"] = f.read() == raw.numpy().tobytes() == back.numpy().tobytes()

out["nvio_is_pinned"] = [nvio.is_pinned(t) for t in (src, dst, raw)]
out["handle_is_pinned"] = [h.is_pinned(t) for t in (src, dst, raw, back)]
out["handle_views"] = [h.is_pinned(src[1000:]), h.is_pinned(src.view(torch.uint8)[3:77]),
                       h.is_pinned(raw[4096:8192])]
out["handle_ordinary"] = [h.is_pinned(torch.empty(n)), h.is_pinned(torch.empty(n)[8:])]
out["small"] = [nvio.is_pinned(small), h.is_pinned(small)]
out["pin_handle"] = [pins.is_pinned(native), pins.is_pinned(src), nvio.is_pinned(native)]
# DeepSpeed's SwapBufferPool(buffers, aio_handle) asserts this before it swaps.
out["swap_pool_check"] = all(h.is_pinned(b) for b in (src, dst))
print(json.dumps(out))
"""


def _run(directory: str):
    import nvio as pkg

    pythonpath = os.path.dirname(os.path.dirname(os.path.abspath(pkg.__file__)))
    as_root = os.geteuid() == 0

    def limit_and_drop():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (LIMIT, LIMIT))
        if as_root:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)

    r = subprocess.run([sys.executable, "-c", _SCRIPT, directory],
                       env={"PYTHONPATH": pythonpath, "PATH": "/usr/bin:/bin",
                            "NVIO_CONFIG": "none"},
                       preexec_fn=limit_and_drop, capture_output=True, text=True, timeout=120)
    if r.returncode != 0 and ("ModuleNotFoundError" in r.stderr or "ImportError" in r.stderr):
        pytest.skip(f"the unprivileged child cannot import nvio or torch from {pythonpath}: "
                    f"{r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_refused_lock_still_moves_bytes_and_counts_as_pinned_for_deepspeed():
    directory = tempfile.mkdtemp(prefix="nvio-memlock-")
    try:
        os.chmod(directory, 0o777)  # the child may be nobody
        out = _run(directory)
    finally:
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)
    assert out["euid"] != 0 and out["limit"] == LIMIT
    refused = [w for w in out["warnings"] if "mlock" in w and "refused" in w]
    if not refused:
        pytest.skip("the unprivileged child could lock 8 MiB over a 64 KiB RLIMIT_MEMLOCK "
                    "(CAP_IPC_LOCK?): nothing was refused")
    assert len(refused) == 1, out["warnings"]  # said once per process, not per allocation
    assert "RLIMIT_MEMLOCK" in refused[0]
    assert out["shape"] == [[2 * 1024 * 1024], "torch.float32", [8 * 1024 * 1024]]
    assert out["aligned"]
    # The bytes, both ways.
    assert (out["pwrite"], out["wait_w"], out["pread"], out["wait_r"]) == (0, 1, 0, 1)
    assert out["file_matches"] and out["read_matches"] and out["raw_matches"]
    # nvio.is_pinned tells the truth: not locked.
    assert out["nvio_is_pinned"] == [False, False, False]
    # DeepSpeed's question: made by the handle's allocator, so pinned for it.
    assert out["handle_is_pinned"] == [True, True, True, True]
    assert out["handle_views"] == [True, True, True]
    assert out["handle_ordinary"] == [False, False]
    assert out["small"] == [True, True]
    assert out["pin_handle"] == [True, True, False]
    assert out["swap_pool_check"]


def test_freed_locked_memory_no_longer_counts():
    """The allocator's registry forgets memory when its last reference goes."""
    import torch

    h = nvio.aio_handle()
    t = h.new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.uint8))
    address = t.data_ptr()
    assert nvio._nvio.in_locked_memory(address, 4096)
    assert not nvio._nvio.in_locked_memory(address, 4096 * 1024 * 1024)
    assert h.free_cpu_locked_tensor(t)
    del t
    assert not nvio._nvio.in_locked_memory(address, 1)
