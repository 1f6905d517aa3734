"""The installed DeepSpeed (requirements.txt's pin) for the tests that use the real package, and the
one place that says where its compiled ops live.

DeepSpeed compiles its async_io, pin_memory and shared-memory comm ops on first use (torch's JIT
extension loader; async_io against libaio-dev), which takes minutes on two cores.
``python tests/python/_ds_real.py --build`` (run by scripts/deepspeed_ops.sh, which scripts/test.sh
runs before ctest) compiles them once into ``<environment>/torch_extensions`` and leaves a stamp
naming the DeepSpeed and torch versions; the tests use that directory and skip, with the reason,
when DeepSpeed is absent or its ops are not built for these versions (they never compile inside a
test's time limit).

DeepSpeed runs on its CPU accelerator here (``DS_ACCELERATOR=cpu``; gloo for collectives).
"""

from __future__ import annotations

import os
import sys
import time

EXTENSIONS_DIR = os.path.join(sys.prefix, "torch_extensions")
STAMP = os.path.join(sys.prefix, ".nvio-deepspeed-ops")
# The ops the tests make DeepSpeed load: its swappers' (AsyncIOBuilder.load() loads
# PinMemoryBuilder first) and the CPU accelerator's shared-memory collectives (deepspeed.comm).
OPS = ("PinMemoryBuilder", "AsyncIOBuilder", "ShareMemCommBuilder")


def configure_environment() -> None:
    """DeepSpeed's CPU accelerator and the prebuilt ops, for this process and its children."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", EXTENSIONS_DIR)


def stamp_text() -> str:
    import deepspeed
    import torch

    return f"deepspeed {deepspeed.__version__} torch {torch.__version__}\n"


def missing_reason() -> "str | None":
    """Why the real-DeepSpeed tests cannot run here, or None when they can."""
    configure_environment()
    try:
        import deepspeed  # noqa: F401
    except ImportError as e:
        return (f"DeepSpeed is not installed in {sys.prefix} ({e}); scripts/venv.sh installs "
                "requirements.txt's pin")
    if os.environ["TORCH_EXTENSIONS_DIR"] != EXTENSIONS_DIR:
        return (f"TORCH_EXTENSIONS_DIR is {os.environ['TORCH_EXTENSIONS_DIR']}; the tests use "
                f"DeepSpeed's ops as scripts/deepspeed_ops.sh builds them, in {EXTENSIONS_DIR}")
    if not _built():
        return (f"DeepSpeed's async_io op is not built for {stamp_text().strip()} in "
                f"{EXTENSIONS_DIR}; scripts/deepspeed_ops.sh builds it (minutes, once)")
    return None


def require():
    """The deepspeed module, or a pytest skip naming what is missing."""
    import pytest

    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)
    import deepspeed

    return deepspeed


def _built() -> bool:
    try:
        with open(STAMP) as f:
            return f.read() == stamp_text()
    except OSError:
        return False


def build() -> None:
    """Compiles DeepSpeed's OPS and writes the stamp, unless the stamp says they are built for
    this DeepSpeed and torch; without DeepSpeed, says so and does nothing."""
    configure_environment()
    os.environ["TORCH_EXTENSIONS_DIR"] = EXTENSIONS_DIR
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError as e:
        print(f"nvio: no DeepSpeed in {sys.prefix} ({e}): its ops are not built", file=sys.stderr)
        return
    if _built():
        return
    print(f"nvio: building DeepSpeed's {', '.join(OPS)} ops in {EXTENSIONS_DIR} "
          f"({stamp_text().strip()}; minutes, once)", file=sys.stderr)
    os.makedirs(EXTENSIONS_DIR, exist_ok=True)
    start = time.monotonic()
    for name in OPS:
        get_accelerator().create_op_builder(name).load(verbose=False)
    with open(STAMP, "w") as f:
        f.write(stamp_text())
    print(f"nvio: DeepSpeed's ops built in {time.monotonic() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:] != ["--build"]:
        sys.exit(f"usage: {sys.argv[0]} --build")
    build()
