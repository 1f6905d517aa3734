"""The Pythonic API: ``nvio.Handle`` (its futures: _future.py)."""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from . import _args, _buffers, _nvio
from ._future import Count, Future, PendingFutures

PathOrFd = Union[str, bytes, "os.PathLike[str]", int]
# One extent of a batch: (buffer, file offset), or (buffer, file offset, file).
BatchItem = Union[Tuple[Any, int], Tuple[Any, int, PathOrFd]]


class _Batch:
    """The items of a batch checked and resolved for the core: every buffer through the single
    calls' helper (``_buffers.resolve``), every offset and file through ``_args``, before anything
    is submitted. ``owners`` keep the buffers alive for an asynchronous batch's future."""

    __slots__ = ("items", "owners", "nbytes")

    def __init__(
        self, items: Iterable[BatchItem], file: Optional[PathOrFd], writable: bool
    ) -> None:
        if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
            raise _args.InvalidType(
                f"nvio: items must be a sequence of (buffer, offset) or (buffer, offset, file) "
                f"tuples, got {type(items).__name__}"
            )
        default = _args.file_target(file) if file is not None else None
        # (address, nbytes, offset, file, device): each item carries its memory kind, so a
        # batch may mix host and CUDA device buffers (the core moves each by its own transport).
        self.items: List[Tuple[int, int, int, Union[bytes, int], bool]] = []
        self.owners: List[Any] = []
        self.nbytes = 0
        # Per item: no text is formatted unless it is refused (a batch may hold thousands).
        for i, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
                raise _args.InvalidType(
                    f"nvio: items[{i}] must be a (buffer, offset) or (buffer, offset, file) "
                    f"tuple, got {type(item).__name__} {_short(item)}"
                )
            if len(item) == 3:
                target = _args.file_target(item[2], f"items[{i}] file")
            elif default is not None:
                target = default
            else:
                raise _args.InvalidType(
                    f"nvio: items[{i}] names no file: give it as (buffer, offset, file) or pass "
                    "file="
                )
            offset = item[1]
            if type(offset) is not int or not 0 <= offset <= _args.OFFSET_MAX:
                offset = _args.offset(offset, f"items[{i}] offset")
            try:
                ref = _buffers.resolve(item[0], writable=writable)
            except (_nvio.InvalidArgument, _args.InvalidType) as e:
                raise type(e)(f"nvio: items[{i}]: {str(e).removeprefix('nvio: ')}") from e
            self.items.append((ref.address, ref.nbytes, offset, target, ref.device))
            self.owners.append(ref.owner)
            self.nbytes += ref.nbytes


class _Spans:
    """``read_batch(buf, offsets=..., size=...)``: one buffer cut into ``len(offsets)`` slices of
    ``size`` bytes, slice i moved at ``offsets[i]`` of one file. The buffer is resolved once, the
    offsets handed to the core as one list (converted there: python/src/bind_handle.cpp)."""

    __slots__ = ("ref", "offsets", "size", "file", "nbytes")

    def __init__(self, buf: Any, file: Optional[PathOrFd], offsets: Any, size: Any,
                 writable: bool) -> None:
        if offsets is None or size is None:
            raise _args.InvalidType("nvio: a batch of offsets into one buffer needs both offsets= "
                                    "and size=")
        if file is None:
            raise _args.InvalidType("nvio: a batch of offsets into one buffer needs file=")
        self.size = _args.integer(size, "size")
        if self.size <= 0:
            raise _nvio.InvalidArgument(f"nvio: size must be positive, got {self.size}")
        if isinstance(offsets, (str, bytes)) or not hasattr(offsets, "__iter__"):
            raise _args.InvalidType(
                f"nvio: offsets must be a sequence of integers, got {type(offsets).__name__}"
            )
        # numpy arrays and torch tensors give plain ints (a float array gives floats: refused).
        self.offsets = offsets.tolist() if hasattr(offsets, "tolist") else list(offsets)
        if not isinstance(self.offsets, list):  # a 0-d array or tensor: one number, not a list
            raise _args.InvalidType(
                f"nvio: offsets must be a sequence of integers, got a 0-d "
                f"{type(offsets).__name__} ({self.offsets!r}); pass [offset]")
        self.ref = _buffers.resolve(buf, writable=writable)
        self.nbytes = len(self.offsets) * self.size
        if self.nbytes > self.ref.nbytes:
            raise _nvio.InvalidArgument(
                f"nvio: {len(self.offsets)} offsets x size {self.size} = {self.nbytes} bytes do "
                f"not fit in the buffer of {self.ref.nbytes} bytes"
            )
        self.file = file


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Handle:
    """Reads and writes buffers from and to files.

    Every option left as ``None`` comes from its ``NVIO_*`` environment variable, else the
    settings saved by ``nvio tune --save`` / ``nvio.tune(save=True)``, else its default (see
    ``nvio.report()["options"]`` for each value's source). CUDA tensors (and
    ``__cuda_array_interface__`` / CUDA ``__dlpack__`` buffers) are moved by the best path here:
    GPUDirect Storage when it is real peer-to-peer, else the pipelined host bounce path
    (``gpu_direct``: auto, on, off). Usable from several threads at once, and as a
    context manager that waits for outstanding operations on exit. ``read_batch`` /
    ``write_batch`` (and their ``_async`` forms) move many buffers at their offsets, of one file
    or several, as one operation. ``wait_all()`` returns only
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
        self._core.read(ref.address, ref.nbytes, file, offset, ref.device)
        return ref.nbytes

    def write(
        self, buf: Any, file: PathOrFd, offset: int = 0, *, truncate: bool = False, sync: bool = False
    ) -> int:
        """Writes `buf` to `file` at `offset` (creating the file); returns the bytes written.

        Bytes of a longer existing file outside the written range are kept; ``truncate=True``
        makes the file end where the write ends. ``sync=True`` fdatasyncs before returning.
        """
        ref = _buffers.resolve(buf, writable=False)
        self._core.write(ref.address, ref.nbytes, file, offset, _args.boolean(truncate, "truncate"),
                         _args.boolean(sync, "sync"), ref.device)
        return ref.nbytes

    def read_async(self, buf: Any, file: PathOrFd, offset: int = 0) -> Future:
        ref = _buffers.resolve(buf, writable=True)
        future = Future(self._core, ref.nbytes, ref.owner, self._pending)
        self._core.submit_read(future, ref.address, ref.nbytes, file, offset, ref.device)
        return future

    def write_async(
        self, buf: Any, file: PathOrFd, offset: int = 0, *, truncate: bool = False, sync: bool = False
    ) -> Future:
        ref = _buffers.resolve(buf, writable=False)
        future = Future(self._core, ref.nbytes, ref.owner, self._pending)
        self._core.submit_write(
            future, ref.address, ref.nbytes, file, offset, _args.boolean(truncate, "truncate"),
            _args.boolean(sync, "sync"), ref.device
        )
        return future

    # ---- batches: many (buffer, offset[, file]) extents as one operation ----------------------

    def read_batch(self, items: Any, file: Optional[PathOrFd] = None, *, offsets: Any = None,
                   size: Optional[int] = None) -> int:
        """Fills each buffer of ``items`` from its file at its offset, as one operation; returns
        the bytes read.

        Each item is ``(buffer, offset)``, reading from ``file``, or ``(buffer, offset, file)``.
        Or, with ``offsets=`` and ``size=``, ``items`` is one buffer: ``size`` bytes are read at
        each of ``offsets`` (a sequence of ints, a numpy array or a tensor) of ``file`` into
        consecutive slices of the buffer (``offsets[i]`` into bytes ``i * size`` to
        ``(i + 1) * size``); the buffer may be longer than ``len(offsets) * size``.
        Every item is checked, and every file opened and its size checked, before anything is
        read: a bad item, a missing file or a file too short raises and reads nothing. The items
        of one file share its descriptors. After a failure, every extent has still finished; the
        first failure in item order is raised.
        """
        if offsets is not None or size is not None:
            spans = _Spans(items, file, offsets, size, writable=True)
            self._core.read_spans(spans.ref.address, spans.offsets, spans.size, spans.file,
                                  spans.ref.device)
            return spans.nbytes
        batch = _Batch(items, file, writable=True)
        self._core.read_batch(batch.items)
        return batch.nbytes

    def write_batch(self, items: Any, file: Optional[PathOrFd] = None, *, offsets: Any = None,
                    size: Optional[int] = None, sync: bool = False) -> int:
        """Writes each buffer of ``items`` to its file at its offset (creating the files), as one
        operation; returns the bytes written.

        Items as for ``read_batch``, also the one buffer with ``offsets=`` and ``size=`` (slice i
        is written at ``offsets[i]``); every item is checked and every file opened before
        anything is written. ``sync=True`` fdatasyncs each file once, after its last extent.
        There is no ``truncate``: the extents end in different places (truncate with a single
        write, or ``os.truncate`` afterwards). Overlapping extents land in no defined order.
        """
        sync = _args.boolean(sync, "sync")
        if offsets is not None or size is not None:
            spans = _Spans(items, file, offsets, size, writable=False)
            self._core.write_spans(spans.ref.address, spans.offsets, spans.size, spans.file, sync,
                                   spans.ref.device)
            return spans.nbytes
        batch = _Batch(items, file, writable=False)
        self._core.write_batch(batch.items, sync)
        return batch.nbytes

    def read_batch_async(self, items: Any, file: Optional[PathOrFd] = None, *,
                         offsets: Any = None, size: Optional[int] = None) -> Future:
        """``read_batch`` as one ``Future`` that keeps every buffer alive until it has finished.
        Argument errors, missing and short files raise here; I/O errors from its ``wait()``."""
        if offsets is not None or size is not None:
            spans = _Spans(items, file, offsets, size, writable=True)
            future = Future(self._core, spans.nbytes, spans.ref.owner, self._pending)
            self._core.submit_read_spans(future, spans.ref.address, spans.offsets, spans.size,
                                         spans.file, spans.ref.device)
            return future
        batch = _Batch(items, file, writable=True)
        future = Future(self._core, batch.nbytes, batch.owners, self._pending)
        self._core.submit_read_batch(future, batch.items)
        return future

    def write_batch_async(self, items: Any, file: Optional[PathOrFd] = None, *,
                          offsets: Any = None, size: Optional[int] = None,
                          sync: bool = False) -> Future:
        """``write_batch`` as one ``Future`` that keeps every buffer alive until it has finished.
        Argument errors and files that cannot be opened raise here; I/O errors from ``wait()``."""
        sync = _args.boolean(sync, "sync")
        if offsets is not None or size is not None:
            spans = _Spans(items, file, offsets, size, writable=False)
            future = Future(self._core, spans.nbytes, spans.ref.owner, self._pending)
            self._core.submit_write_spans(future, spans.ref.address, spans.offsets, spans.size,
                                          spans.file, sync, spans.ref.device)
            return future
        batch = _Batch(items, file, writable=False)
        future = Future(self._core, batch.nbytes, batch.owners, self._pending)
        self._core.submit_write_batch(future, batch.items, sync)
        return future

    def wait_all(self) -> int:
        """Waits for every asynchronous operation submitted before this call, by any thread,
        including those another thread is waiting for right now; returns how many it waited for.

        All are waited for even when some fail; the first failure is then raised.
        """
        return self._pending.wait_all(Count.WAITED)

    def close_files(self, file: Optional[PathOrFd] = None) -> None:
        """Closes the files this handle keeps open between operations (operations in flight keep
        theirs until they finish); with ``file`` (a path or an open descriptor), only what it
        keeps of that file.

        A handle keeps the files it opened, so that the next operation on the same name costs one
        ``statx`` instead of two opens; a removed file it holds keeps its disk space. It lets go
        of a removed or unused file within about a second by itself, of removed files before it
        opens a file to write, and (every handle of the process) when a write runs out of space,
        which is then tried once more; call this to free the space of removed files at once
        (before checking free space, say)."""
        if file is None:
            self._core.close_files()
        else:
            self._core.close_file(file)

    def open_files(self) -> int:
        """How many files the handle keeps open now (see close_files)."""
        return self._core.open_files()

    def stats(self) -> "dict[str, Any]":
        """What this handle has done since it was made: a dict of counters (``reads``,
        ``bytes_read``, ``pieces``, ``retries``, ``bounced_bytes``, ...) and ``errors``, failed
        operations by errno; see docs/python.md, "Counters". Subtract two snapshots to measure
        a phase. Read while operations run, the counters are not one atomic snapshot."""
        return self._core.stats()

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
            # (after a Ctrl-C, what has not started yet is cancelled rather than waited for)
            self._pending.drain(cancel=issubclass(exc_type, KeyboardInterrupt))


def _options_signature() -> inspect.Signature:
    """``Handle(engine=None, block_size=None, ...)``: one keyword argument per row of the option
    table, each None (not given) by default, for help() and editors."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
               for name in _args.OPTION_NAMES]
    return inspect.Signature(params, return_annotation=None)


Handle.__init__.__signature__ = _options_signature()  # type: ignore[attr-defined]


_shared_lock = threading.Lock()
_shared: Optional[Handle] = None


def shared_handle() -> Handle:
    """The one handle that nvio's jobs (nvio.save/load, nvio.safetensors, sharded checkpoints) use
    when the caller gives none: options from the environment and the configuration, made on first
    use. Handles are thread-safe and survive fork()."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Handle()
        return _shared


def replace_file(handle: Optional[Handle], path: str, pieces: Sequence[Tuple[Any, int]],
                 sync: bool) -> None:
    """Writes ``pieces`` ((buffer, file offset) pairs) as a new file in place of ``path`` with one
    write_batch, atomically (and durably with ``sync``), through the core's ReplacementFile: the
    one replace-a-file mechanism (temporary named after its writer, rename, directory sync).
    ``handle`` None: the shared handle."""
    h = handle if handle is not None else shared_handle()
    file = _nvio.ReplacementFile(h._core, path)
    try:
        if pieces:
            h.write_batch(pieces, file.fd, sync=sync)
        file.commit(sync)
    except BaseException:
        file.discard()
        raise
