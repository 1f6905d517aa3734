"""Files striped over several directories, one per drive, moved on all of them at once.

``nvio.StripedHandle(["/mnt/nvme0", "/mnt/nvme1"], stripe_size=1 << 20)`` spreads a file in
``stripe_size`` stripes over the directories (stripe k in directory k % N, RAID-0 over files) and
reads and writes every drive in parallel, each through its own handle with the options
``nvio tune --save`` stored for that drive (keyword options here override them for every drive).
Each read and write returns what each drive moved and when it finished, for per-drive GB/s. The
layout (directories in order, stripe size) must be the same to read a file back; each part records
its place, so another layout raises ``nvio.FormatError`` rather than returning misplaced bytes.
See include/nvio/stripe.hpp for the exact rules.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence, Union

from . import _args, _buffers, _nvio

PathLike = Union[str, bytes, "os.PathLike[str]"]


def _name(value: Any) -> bytes:
    # A plain file name (no "/", ".", ".."): checked by the core, which raises InvalidArgument.
    return _args.path(value, "name")


def _drive(value: Any) -> int:
    n = _args.integer(value, "drive")
    if n < 0:
        raise _nvio.InvalidArgument(f"nvio: drive must be 0 or more, got {n}")
    return n


class StripedHandle:
    """Reads and writes files striped over ``directories`` (see the module's doc).

    Thread-safe. ``read`` / ``write`` release the GIL and return a dict: ``bytes``, ``seconds``
    (until the last drive finished) and ``drives``, a list of ``{"directory", "bytes",
    "seconds"}`` in directory order.
    """

    def __init__(self, directories: Sequence[PathLike], stripe_size: int = 1 << 20,
                 **options: Any) -> None:
        if isinstance(directories, (str, bytes, os.PathLike)):
            raise _args.InvalidType("nvio: directories must be a sequence of paths, not one path")
        dirs = [_args.path(d, "directory") for d in directories]
        size = _args.integer(stripe_size, "stripe_size")
        if size <= 0:
            raise _nvio.InvalidArgument(f"nvio: stripe_size must be positive, got {size}")
        self._core = _nvio.StripedHandle(dirs, size, **_args.options(options, "nvio.StripedHandle"))

    @property
    def directories(self) -> List[str]:
        return self._core.directories

    @property
    def stripe_size(self) -> int:
        return self._core.stripe_size

    def write(self, buf: Any, name: PathLike, offset: int = 0, *, truncate: bool = False,
              sync: bool = False) -> Dict[str, Any]:
        """Writes ``buf`` at logical ``offset`` of the striped file ``name`` (creating its parts).

        ``truncate=True`` makes the file end where the write ends; ``sync=True`` fdatasyncs every
        part before returning.
        """
        ref = _buffers.resolve(buf, writable=False)
        return self._core.write(ref.address, ref.nbytes, _name(name), _args.offset(offset),
                                _args.boolean(truncate, "truncate"), _args.boolean(sync, "sync"),
                                ref.device)

    def read(self, buf: Any, name: PathLike, offset: int = 0) -> Dict[str, Any]:
        """Fills ``buf`` from logical ``offset`` of the striped file ``name``."""
        ref = _buffers.resolve(buf, writable=True)
        return self._core.read(ref.address, ref.nbytes, _name(name), _args.offset(offset),
                               ref.device)

    def size(self, name: PathLike) -> int:
        """The striped file's size in bytes (``FileNotFoundError`` when no part exists,
        ``ShortFile`` when a part is shorter than the size the parts record)."""
        return self._core.size(_name(name))

    def remove(self, name: PathLike) -> int:
        """Removes every part; returns how many existed."""
        return self._core.remove(_name(name))

    def part_path(self, drive: int, name: PathLike) -> str:
        return self._core.part_path(_drive(drive), _name(name))

    def drive_options(self, drive: int) -> Dict[str, Any]:
        """The options drive ``drive``'s handle uses (its saved profile under the overrides)."""
        return self._core.drive_options(_drive(drive))

    def drive_engine(self, drive: int) -> str:
        return self._core.drive_engine(_drive(drive))

    def stats(self) -> Dict[str, Any]:
        """The counters of every drive's handle together (see ``nvio.Handle.stats``)."""
        return self._core.stats()

    def drive_stats(self, drive: int) -> Dict[str, Any]:
        """Drive ``drive``'s handle's counters."""
        return self._core.drive_stats(_drive(drive))
