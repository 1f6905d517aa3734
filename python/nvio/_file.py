"""nvio.File: a file opened once through a handle, then read and written at any offset without a
metadata system call per operation (nvio/file.hpp). Thread-safe: one File may be shared by many
threads; every call that can block releases the GIL."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from . import _args, _buffers, _nvio
from ._future import Future
from ._handle import Handle, _Batch


class File:
    """``with nvio.File(path, "r", handle=h) as f: f.read(tensor, offset)``.

    Modes: ``"r"`` (must exist), ``"r+"`` (must exist, also written), ``"w"`` (created,
    truncated to 0 bytes), ``"w+"`` (as ``"w"``, also read); a ``"b"`` is ignored. Without
    ``handle`` a new ``nvio.Handle()`` (options from the environment) is made for the File.

    The file is opened once (its O_DIRECT and buffered descriptors, its size and direct-I/O
    alignment); each operation then goes straight to the handle's workers. A path or descriptor
    call on a Handle costs a ``statx`` per operation (a descriptor also an ``fcntl``): prefer a
    File for many small operations on one file (docs/performance.md, "Opened files").

    Reads are checked against the size the File knows (from opening, grown by its own writes); a
    read past it asks the file once more, so bytes another writer appended are readable.
    Asynchronous calls return the handle's ``Future``s (``handle.wait_all()`` waits for them too).

    ``close()`` raises ``nvio.FileBusy`` (nothing closed) while an operation on the file is in
    flight: a blocking call in another thread, or a future not finished; wait for them first.
    Leaving a ``with`` block closes the File the same way (when the block raised, a busy File is
    left open instead, so the block's exception is not hidden; it is released when collected, its
    operations finishing first). Calls after ``close()`` raise ``nvio.InvalidArgument``.
    """

    __slots__ = ("_core", "_handle", "__weakref__")

    def __init__(self, path: Any, mode: str = "r", *, handle: Optional[Handle] = None) -> None:
        if handle is None:
            handle = Handle()
        elif not isinstance(handle, Handle):
            raise _args.InvalidType(
                f"nvio: handle must be an nvio.Handle, got {type(handle).__name__}"
            )
        if not isinstance(mode, str):
            raise _args.InvalidType(f"nvio: mode must be a str, got {type(mode).__name__}")
        self._handle = handle
        self._core = _nvio.File(handle._core, _args.path(path), mode)

    # ---- single operations ----------------------------------------------------------------

    def read(self, buf: Any, offset: int = 0) -> int:
        """Fills ``buf`` from the file at ``offset``; returns the number of bytes read."""
        ref = _buffers.resolve(buf, writable=True)
        self._core.read(ref.address, ref.nbytes, offset, ref.device)
        return ref.nbytes

    def write(
        self, buf: Any, offset: int = 0, *, truncate: bool = False, sync: bool = False
    ) -> int:
        """Writes ``buf`` at ``offset``; returns the bytes written. ``truncate=True`` makes the
        file end where the write ends; ``sync=True`` fdatasyncs before returning."""
        ref = _buffers.resolve(buf, writable=False)
        self._core.write(ref.address, ref.nbytes, offset, _args.boolean(truncate, "truncate"),
                         _args.boolean(sync, "sync"), ref.device)
        return ref.nbytes

    def read_async(self, buf: Any, offset: int = 0) -> Future:
        ref = _buffers.resolve(buf, writable=True)
        h = self._handle
        future = Future(h._core, ref.nbytes, ref.owner, h._pending)
        self._core.submit_read(future, ref.address, ref.nbytes, offset, ref.device)
        return future

    def write_async(self, buf: Any, offset: int = 0, *, truncate: bool = False,
                    sync: bool = False) -> Future:
        ref = _buffers.resolve(buf, writable=False)
        h = self._handle
        future = Future(h._core, ref.nbytes, ref.owner, h._pending)
        self._core.submit_write(future, ref.address, ref.nbytes, offset,
                                _args.boolean(truncate, "truncate"), _args.boolean(sync, "sync"),
                                ref.device)
        return future

    # ---- batches: (buffer, offset) items as one operation ------------------------------------

    def read_batch(self, items: Iterable[Any]) -> int:
        """Fills each buffer of ``items``, ``(buffer, offset)`` pairs, from the file, as one
        operation; returns the bytes read. Every item is checked (and the size) before anything
        is read."""
        batch = self._batch(items, writable=True)
        self._core.read_batch(batch.items)
        return batch.nbytes

    def write_batch(self, items: Iterable[Any], *, sync: bool = False) -> int:
        """Writes each ``(buffer, offset)`` of ``items`` as one operation; ``sync=True``
        fdatasyncs the file once, after the last extent."""
        batch = self._batch(items, writable=False)
        self._core.write_batch(batch.items, _args.boolean(sync, "sync"))
        return batch.nbytes

    def read_batch_async(self, items: Iterable[Any]) -> Future:
        batch = self._batch(items, writable=True)
        h = self._handle
        future = Future(h._core, batch.nbytes, batch.owners, h._pending)
        self._core.submit_read_batch(future, batch.items)
        return future

    def write_batch_async(self, items: Iterable[Any], *, sync: bool = False) -> Future:
        batch = self._batch(items, writable=False)
        h = self._handle
        future = Future(h._core, batch.nbytes, batch.owners, h._pending)
        self._core.submit_write_batch(future, batch.items, _args.boolean(sync, "sync"))
        return future

    def _batch(self, items: Iterable[Any], writable: bool) -> _Batch:
        items = list(items) if not isinstance(items, (list, tuple)) else items
        for i, item in enumerate(items):
            if isinstance(item, (tuple, list)) and len(item) != 2:
                raise _args.InvalidType(
                    f"nvio: items[{i}] of a File's batch must be a (buffer, offset) pair"
                )
        return _Batch(items, 0, writable)  # the file (0) is not looked at: the File's is used

    # ---- the file -------------------------------------------------------------------------

    def size(self) -> int:
        """The file's size now (one statx)."""
        return self._core.size()

    @property
    def path(self) -> str:
        return self._core.path()

    @property
    def mode(self) -> str:
        return self._core.mode()

    @property
    def handle(self) -> Handle:
        return self._handle

    @property
    def closed(self) -> bool:
        return not self._core.is_open()

    @property
    def direct_alignment(self) -> int:
        """The file's direct-I/O offset alignment; 0 when it is not open for direct I/O."""
        return self._core.direct_alignment()

    def in_flight(self) -> int:
        """Operations on the file in flight now."""
        return self._core.in_flight()

    def close(self) -> None:
        """Closes the descriptors; ``nvio.FileBusy`` while operations are in flight."""
        self._core.close()

    def __enter__(self) -> "File":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except _nvio.FileBusy:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<nvio.File {self.path!r} mode {self.mode!r} {state}>"
