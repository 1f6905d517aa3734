"""Shared fixtures for the nvio Python tests.

The package is imported from PYTHONPATH (ctest sets it to the build tree's ``python`` folder);
when it is not importable from there, the first ``build*/python`` folder of the checkout that
holds a built extension is tried, so ``python3 -m pytest tests/python`` works after a plain build.

Every test runs with the ``NVIO_*`` environment variables removed and ``NVIO_CONFIG=none`` so
that a developer's settings and saved configuration cannot change the outcome. Data is random (seeded per test) so that a misplaced byte, a piece
written twice or a missed piece shows up as a mismatch.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import time

import pytest

for _name in [k for k in os.environ if k.startswith("NVIO_")]:
    del os.environ[_name]
# Nor may a configuration file saved by `nvio tune --save`; tests of it point NVIO_CONFIG at their
# own file.
os.environ["NVIO_CONFIG"] = "none"

try:
    import nvio

    _built = getattr(nvio, "__file__", None) is not None  # not an empty (namespace) folder
except ImportError:
    _built = False
if not _built:
    for _mod in [m for m in sys.modules if m == "nvio" or m.startswith("nvio.")]:
        del sys.modules[_mod]
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for _candidate in sorted(glob.glob(os.path.join(_root, "build*", "python"))):
        if glob.glob(os.path.join(_candidate, "nvio", "_nvio*.so")):
            sys.path.insert(0, _candidate)
            break
    import nvio  # noqa: F401

import numpy as np


def pytest_report_header(config):
    """Which interpreter, torch and nvio the suite ran on (the suite's first lines)."""
    try:
        import torch

        torch_text = f"torch {torch.__version__}"
    except ImportError:
        torch_text = "no torch"
    return (f"nvio {nvio.__version__} from {os.path.dirname(nvio.__file__)}; {torch_text}; "
            f"numpy {np.__version__}; {sys.executable} {sys.version.split()[0]}")


ENGINES = ("psync", "libaio", "io_uring")

# Sizes that are not multiples of any block size, page or sector, and offsets likewise.
ODD_SIZES = (1, 4095, (1 << 20) + 123)
ODD_OFFSETS = (0, 1, 4096 + 17)


def random_bytes(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8).tobytes()


def write_file(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def read_file(path, offset: int = 0, n: int = -1) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def as_bytes(buf) -> bytes:
    """The bytes of a torch tensor, numpy array or buffer-protocol object (for comparisons)."""
    if hasattr(buf, "numpy") and hasattr(buf, "dtype") and type(buf).__module__.startswith("torch"):
        import torch

        flat = buf.reshape(-1)
        if flat.dtype == torch.bfloat16:  # numpy has no bfloat16
            flat = flat.view(torch.int16)
        return flat.numpy().tobytes()
    if isinstance(buf, np.ndarray):
        return buf.tobytes()
    return bytes(memoryview(buf).cast("B"))


_REPORT = None


def nvio_report() -> dict:
    global _REPORT
    if _REPORT is None:
        _REPORT = nvio.report()
    return _REPORT


def require_engine(name: str) -> None:
    """Skips the calling test, with nvio's own reason, when engine `name` cannot be used here."""
    info = nvio_report()["engines"][name]
    if not info["available"]:
        pytest.skip(f"engine {name} unavailable: {info['reason']}")


def direct_io_supported(directory) -> bool:
    return bool(nvio.report(str(directory))["dir"]["direct_io"])


@pytest.fixture
def rng_bytes(request):
    """random_bytes with a seed derived from the test's name (stable across runs)."""
    import zlib

    base = zlib.crc32(request.node.nodeid.encode())

    def make(n: int, salt: int = 0) -> bytes:
        return random_bytes(n, (base + salt) & 0xFFFFFFFF)

    return make


@pytest.fixture(params=ENGINES)
def engine(request):
    require_engine(request.param)
    return request.param


def wait_child(pid: int, timeout: float = 60) -> int:
    """The exit code of forked child `pid`; kills it and fails the test if it hangs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung for {timeout} s")


def start_waiting(future) -> threading.Thread:
    """A thread that is inside ``future.wait()`` (collecting the future's ticket) once this
    returns."""
    thread = threading.Thread(target=future.wait)
    thread.start()
    while future._collector is None and not future._finished:
        time.sleep(0.0005)
    return thread
