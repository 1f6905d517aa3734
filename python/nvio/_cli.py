"""The ``nvio`` command and its DeepSpeed-style aliases as console scripts (pyproject.toml).

The command is the C++ program that ``pip install`` builds and ships inside this package
(nvio/_bin/nvio, with the core compiled in, so no build tree, libnvio.so or LD_LIBRARY_PATH is
needed). The entry points replace the Python process with it (os.execv): its signals, exit
status and terminal are then the program's own, with no Python process in between.

    nvio ARGS               -> nvio ARGS   (also python -m nvio ARGS)
    nvio ckpt-bench ARGS    -> nvio.ckpt_bench in this interpreter (it needs PyTorch; the
                               program hands ckpt-bench to the same module when run directly)
    nvio-ds-io ARGS         -> nvio ds-io ARGS
    nvio-ds-nvme-tune ARGS  -> nvio ds-nvme-tune ARGS
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn, Sequence

BUNDLED = Path(__file__).resolve().parent / "_bin" / "nvio"


class BundledCommandMissing(FileNotFoundError):
    """The package has no bundled command: it was not installed by pip (e.g. a source tree)."""


def bundled_command() -> Path:
    """The bundled ``nvio`` program; raises BundledCommandMissing naming where it looked."""
    path = BUNDLED
    if not os.access(path, os.X_OK):
        raise BundledCommandMissing(
            f"the nvio command is not bundled with this package: no executable {path} "
            "(`pip install .` builds it; from a source tree run build/bin/nvio, or "
            "build/python/nvio/_bin/nvio with PYTHONPATH=build/python)")
    return path


def run(args: Sequence[str]) -> NoReturn:
    """Replaces this process with ``nvio ARGS``; exits with status 1 and one line on stderr when
    the program is missing or cannot be run."""
    try:
        program = bundled_command()
    except BundledCommandMissing as e:
        sys.exit(f"nvio: error: {e}")
    # argv[0] "nvio": what the user knows the command as, whichever script ran.
    try:
        os.execv(program, ["nvio", *args])
    except OSError as e:  # a damaged or foreign file there (exec format error), a directory
        sys.exit(f"nvio: error: cannot run {program}: {e.strerror or e}")


def main() -> NoReturn:
    args = sys.argv[1:]
    if args[:1] == ["ckpt-bench"]:
        from . import ckpt_bench

        sys.exit(ckpt_bench.main(args[1:]))
    run(args)


def ds_io() -> NoReturn:
    run(["ds-io", *sys.argv[1:]])


def ds_nvme_tune() -> NoReturn:
    run(["ds-nvme-tune", *sys.argv[1:]])
