"""Fresh memory for a whole file (or one region of it) to land in, read with one parallel call.

Used by ``nvio.load`` and ``nvio.safetensors.load_file``: the tensors they return are views of this
memory, so it must be new memory that they own, not a reused buffer. Measured on the dev machine
(1 GiB, the virtio disk, docs/performance.md "Loads into fresh memory"): per-tensor locked memory
(mlock populates it up front, in the calling thread) took 0.9 s where the read alone takes 0.4 s;
one anonymous mapping advised MADV_HUGEPAGE and faulted in by the read itself took 0.43 s; with a
second thread populating it ahead of the read, 0.39 s (faulting and zeroing move to an idle core
while the drive works).

The memory is not locked: O_DIRECT needs only the alignment, and these tensors are ordinary memory
for the rest of their life (``is_pinned`` is False for them, as for torch.load's).
"""

from __future__ import annotations

import mmap
import threading
from typing import Any

_PAGE = 4096
# MADV_POPULATE_WRITE (Linux 5.14) is not in Python 3.11's mmap module; its value is fixed by the
# kernel ABI. An older kernel answers EINVAL, and the read then faults the pages in itself.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
# Pieces populated at a time: small enough that the populating thread is ahead of the read almost
# from the start, large enough that the call overhead is nothing.
_POPULATE_CHUNK = 32 << 20
# Regions below this are left to the read to fault in: starting and joining a thread costs about
# 50 us here, a safe_open caller may read many tensors of a few MiB one by one, and the thread can
# only help where zeroing takes milliseconds.
_POPULATE_MIN = 32 << 20


def _populate(memory: mmap.mmap, size: int, stop: threading.Event) -> None:
    """Faults in and zeroes `memory` front to back, ahead of the read that fills it. Advisory:
    any failure (an old kernel, memory pressure) only leaves the faulting to the read."""
    for start in range(0, size, _POPULATE_CHUNK):
        if stop.is_set():
            return
        try:
            memory.madvise(_MADV_POPULATE_WRITE, start, min(_POPULATE_CHUNK, size - start))
        except OSError:
            return


def read_region(handle: Any, path: Any, offset: int, length: int) -> memoryview:
    """Bytes [offset, offset + length) of `path` in fresh anonymous memory whose addresses match
    the file offsets modulo the page size (so the whole read goes through O_DIRECT without a bounce
    copy). Returns a writable view of exactly `length` bytes; it keeps the mapping alive.
    `handle` is an ``nvio.Handle``; its errors propagate unchanged."""
    if length == 0:
        return memoryview(bytearray())
    shift = offset % _PAGE
    size = shift + length
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        memory.madvise(mmap.MADV_HUGEPAGE)
    view = memoryview(memory)[shift:]
    if size < _POPULATE_MIN:
        handle.read(view, path, offset)
        return view
    stop = threading.Event()
    helper = threading.Thread(target=_populate, args=(memory, size, stop),
                              name="nvio-populate", daemon=True)
    helper.start()
    try:
        handle.read(view, path, offset)
    finally:
        stop.set()
        helper.join()
    return view
