"""The short pass of the Python suite on Debian's interpreter and its torch 1.13 (ctest's
python_torch1): the DeepNVMe handle, Handle, and torch checkpoints, the paths whose users may still
run an old torch. The whole suite runs on the project environment's torch 2 (tests/CMakeLists.txt).

Usage: python3 legacy_torch.py TESTS_DIR. Exits 77 (ctest's skip) when this interpreter has no
torch or no pytest, saying so."""

import sys

FILES = ("test_aio_handle.py", "test_handle.py", "test_checkpoint.py")

try:
    import pytest
    import torch
except ImportError as e:
    print(f"python_torch1: skipped: {sys.executable} cannot import {e.name}", flush=True)
    sys.exit(77)

print(f"python_torch1: torch {torch.__version__} on {sys.executable} {sys.version.split()[0]}",
      flush=True)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *(f"{sys.argv[1]}/{f}" for f in FILES)]))
