"""The Pythonic API: ``nvio.Handle`` and its futures."""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any, Optional, Union

from . import _args, _buffers, _fork, _nvio

PathOrFd = Union[str, bytes, "os.PathLike[str]", int]


class Future:
    """One asynchronous read or write. Keeps its buffer alive until it has been waited for."""

    __slots__ = ("_handle", "_ticket", "_nbytes", "_owner", "_outcome", "_lock", "_pid")

    def __init__(self, handle: "Handle", ticket: int, nbytes: int, owner: Any) -> None:
        self._handle = handle
        self._ticket = ticket
        self._nbytes = nbytes
        self._owner = owner
        self._outcome: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _check_process(self) -> None:
        # Checked before taking the lock, which a thread of the parent may have held at the fork.
        if os.getpid() != self._pid:
            raise _nvio.Error(
                f"nvio: this operation was submitted by process {self._pid} before a fork; only "
                "that process can wait for it (the child has its own copy of the buffer, which the "
                "operation does not fill)"
            )

    def wait(self) -> int:
        """Blocks until the operation finishes; returns the bytes moved or raises its error.

        Several threads may wait for one future: each returns (or raises) once it has finished.
        """
        self._check_process()
        with self._lock:
            if self._ticket is not None:
                ticket, self._ticket = self._ticket, None
                try:
                    self._handle._collect(ticket)
                except BaseException as e:  # kept so that result() can raise it again
                    self._outcome = e
                finally:
                    self._owner = None
            if self._outcome is not None:
                raise self._outcome
            return self._nbytes

    result = wait

    def done(self) -> bool:
        """True once the operation has finished (successfully or not)."""
        self._check_process()
        with self._lock:
            return self._ticket is None or self._handle._core.done(self._ticket)


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
        self._futures_lock = threading.Lock()
        # Futures not yet finished and collected: wait_all() waits for each of them.
        self._futures: "dict[int, Future]" = {}
        _fork.track(self)

    def _after_fork_in_child(self) -> None:
        self._futures_lock = threading.Lock()
        self._futures = {}  # the parent's operations; their futures refuse to wait in the child

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
        return self._track(Future(self, ticket, ref.nbytes, ref.owner))

    def write_async(
        self, buf: Any, file: PathOrFd, offset: int = 0, *, truncate: bool = False, sync: bool = False
    ) -> Future:
        ref = _buffers.resolve(buf, writable=False)
        ticket = self._core.submit_write(
            ref.address, ref.nbytes, _args.file_target(file), _args.offset(offset),
            _args.boolean(truncate, "truncate"), _args.boolean(sync, "sync"), ref.device
        )
        return self._track(Future(self, ticket, ref.nbytes, ref.owner))

    def wait_all(self) -> int:
        """Waits for every asynchronous operation submitted before this call, by any thread,
        including those another thread is waiting for right now; returns how many it waited for.

        All are waited for even when some fail; the first failure is then raised.
        """
        with self._futures_lock:
            futures = list(self._futures.values())
        first: Optional[BaseException] = None
        for f in futures:
            try:
                f.wait()
            except BaseException as e:
                first = first or e
        if first is not None:
            raise first
        return len(futures)

    def _track(self, future: Future) -> Future:
        with self._futures_lock:
            self._futures[future._ticket] = future
        return future

    def _collect(self, ticket: int) -> None:
        # The future leaves the table only once finished, so that a concurrent wait_all() still
        # sees it (and waits on its lock) while this thread waits for it.
        try:
            self._core.wait_ticket(ticket)
        finally:
            with self._futures_lock:
                self._futures.pop(ticket, None)

    def __del__(self) -> None:
        # Finalizers run before a reference cycle is torn down (PEP 442), so this waits for I/O
        # still in flight before the buffers its futures keep alive can be freed.
        core = getattr(self, "_core", None)
        if core is not None and getattr(self, "_futures", None) and core.pending():
            try:
                core.wait_all()
            except BaseException:
                pass

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.wait_all()
        else:  # do not hide the original exception; still never leave I/O running on freed memory
            try:
                self.wait_all()
            except BaseException:
                pass


def _options_signature() -> inspect.Signature:
    """``Handle(engine=None, block_size=None, ...)``: one keyword argument per row of the option
    table, each None (not given) by default, for help() and editors."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
               for name in _args.OPTION_NAMES]
    return inspect.Signature(params, return_annotation=None)


Handle.__init__.__signature__ = _options_signature()  # type: ignore[attr-defined]
