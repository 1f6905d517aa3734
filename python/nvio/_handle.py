"""The Pythonic API: ``nvio.Handle`` (its futures: _future.py)."""

from __future__ import annotations

import inspect
import os
from typing import Any, Optional, Union

from . import _args, _buffers, _nvio
from ._future import Count, Future, PendingFutures

PathOrFd = Union[str, bytes, "os.PathLike[str]", int]


class Handle:
    """Reads and writes buffers from and to files.

    Every option left as ``None`` comes from its ``NVIO_*`` environment variable, else the
    settings saved by ``nvio tune --save`` / ``nvio.tune(save=True)``, else its default (see
    ``nvio.report()["options"]`` for each value's source). CUDA tensors (and
    ``__cuda_array_interface__`` / CUDA ``__dlpack__`` buffers) are moved by the best path here:
    GPUDirect Storage when it is real peer-to-peer, else the pipelined host bounce path
    (``gpu_direct``: auto, on, off). Usable from several threads at once, and as a
    context manager that waits for outstanding operations on exit. ``wait_all()`` returns only
    once every operation submitted before it (by any thread) has finished. A forked child may use
    its parent's handle: it gets its own workers (see docs/python.md, "Threads, fork and shared
    handles").
    """

    def __init__(self, **options: Any) -> None:
        # The keyword arguments are the core's option table (see __signature__ below).
        self._init(options, "")

    def _init(self, options: "dict[str, Any]", config_dir: bytes) -> None:
        self._core = _nvio.Handle(**_args.options(options, "nvio.Handle"), config_dir=config_dir)
        self._pending = PendingFutures()  # what wait_all() waits for

    @classmethod
    def from_config(cls, directory: Union[str, "os.PathLike[str]", None] = None, **options: Any) -> "Handle":
        """A handle with the settings ``nvio tune --save`` stored for the drive holding
        ``directory`` (default: the profile saved last), under ``NVIO_*`` variables and the
        keyword ``options`` given here, which still win.

        A plain ``Handle()`` already uses the profile saved last; use this to pick the profile of
        another drive. The file is ``$NVIO_CONFIG``, else ``$XDG_CONFIG_HOME/nvio/config.json``,
        else ``~/.config/nvio/config.json``.
        """
        self = cls.__new__(cls)
        self._init(options, _args.path(directory, "directory") if directory is not None else b"")
        return self

    @property
    def engine(self) -> str:
        """The engine in use (never "auto")."""
        return self._core.engine

    @property
    def engine_reason(self) -> str:
        return self._core.engine_reason

    @property
    def options(self) -> "dict[str, Any]":
        return self._core.options()

    def read(self, buf: Any, file: PathOrFd, offset: int = 0) -> int:
        """Fills `buf` from `file` at `offset`; returns the number of bytes read."""
        ref = _buffers.resolve(buf, writable=True)
        self._core.read(ref.address, ref.nbytes, _args.file_target(file), _args.offset(offset),
                        ref.device)
        return ref.nbytes

    def write(
        self, buf: Any, file: PathOrFd, offset: int = 0, *, truncate: bool = False, sync: bool = False
    ) -> int:
        """Writes `buf` to `file` at `offset` (creating the file); returns the bytes written.

        Bytes of a longer existing file outside the written range are kept; ``truncate=True``
        makes the file end where the write ends. ``sync=True`` fdatasyncs before returning.
        """
        ref = _buffers.resolve(buf, writable=False)
        self._core.write(ref.address, ref.nbytes, _args.file_target(file), _args.offset(offset),
                         _args.boolean(truncate, "truncate"), _args.boolean(sync, "sync"),
                         ref.device)
        return ref.nbytes

    def read_async(self, buf: Any, file: PathOrFd, offset: int = 0) -> Future:
        ref = _buffers.resolve(buf, writable=True)
        ticket = self._core.submit_read(ref.address, ref.nbytes, _args.file_target(file),
                                        _args.offset(offset), ref.device)
        return self._pending.add(Future(self._core, ticket, ref.nbytes, ref.owner))

    def write_async(
        self, buf: Any, file: PathOrFd, offset: int = 0, *, truncate: bool = False, sync: bool = False
    ) -> Future:
        ref = _buffers.resolve(buf, writable=False)
        ticket = self._core.submit_write(
            ref.address, ref.nbytes, _args.file_target(file), _args.offset(offset),
            _args.boolean(truncate, "truncate"), _args.boolean(sync, "sync"), ref.device
        )
        return self._pending.add(Future(self._core, ticket, ref.nbytes, ref.owner))

    def wait_all(self) -> int:
        """Waits for every asynchronous operation submitted before this call, by any thread,
        including those another thread is waiting for right now; returns how many it waited for.

        All are waited for even when some fail; the first failure is then raised.
        """
        return self._pending.wait_all(Count.WAITED)

    def __del__(self) -> None:
        # The pending futures (and so the buffers they keep alive) go with this handle unless the
        # caller holds them: wait for their I/O first. Finalizers run before a reference cycle is
        # torn down (PEP 442), so this holds for a handle in a cycle too.
        pending = getattr(self, "_pending", None)
        if pending:
            pending.drain()

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.wait_all()
        else:  # do not hide the original exception; still never leave I/O running on freed memory
            self._pending.drain()


def _options_signature() -> inspect.Signature:
    """``Handle(engine=None, block_size=None, ...)``: one keyword argument per row of the option
    table, each None (not given) by default, for help() and editors."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
               for name in _args.OPTION_NAMES]
    return inspect.Signature(params, return_annotation=None)


Handle.__init__.__signature__ = _options_signature()  # type: ignore[attr-defined]
