"""Fresh memory for a whole file (or one region of it) to land in, read with one parallel call.

Used by ``nvio.load`` and ``nvio.safetensors.load_file``: the tensors they return are views of this
memory, so it must be new memory that they own, not a reused buffer. Measured on the dev machine
(1 GiB, the virtio disk, bench/results.md "Loads into fresh memory" and "`nvio ckpt-bench`,
huge pages and fresh processes"): per-tensor locked memory (mlock populates it up front, in the
calling thread) took 0.9 s where the read alone takes 0.4 s; one anonymous mapping faulted in by
the read itself is what remains. A second thread populates it ahead of the read (faulting and
zeroing move to another core while the drive works; neutral on the dev VM's two cores).

The memory is not locked: O_DIRECT needs only the alignment, and these tensors are ordinary memory
for the rest of their life (``is_pinned`` is False for them, as for torch.load's).
"""

from __future__ import annotations

import mmap
import threading
import time
from typing import Any, Optional

_PAGE = 4096
# MADV_POPULATE_WRITE (Linux 5.14) is not in Python 3.11's mmap module; its value is fixed by the
# kernel ABI. An older kernel answers EINVAL, and the read then faults the pages in itself.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
_MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)
# Pieces populated at a time: small enough that the populating thread is ahead of the read almost
# from the start, large enough that the call overhead is nothing.
_POPULATE_CHUNK = 32 << 20
# Regions below this are left to the read to fault in: starting and joining a thread costs about
# 50 us here, a safe_open caller may read many tensors of a few MiB one by one, and the thread can
# only help where zeroing takes milliseconds.
_POPULATE_MIN = 32 << 20


# Huge pages populated slower than this (bytes a second) are not worth it: the rest of the mapping
# takes base pages. On the dev VM, populating 2 MiB pages ran at about 11 GB/s where the host
# still backed the memory and at 0.5 GB/s where it did not (it backs a VM's free 2 MiB blocks
# lazily once the guest has reported them free, and huge pages come from exactly those), against
# 3-4 GB/s for 4 KiB pages; a bare-metal kernel compacting memory for them in the fault
# (defrag=madvise) is slow the same way.
_HUGE_PAGES_MIN_RATE = 2e9


def _advise_huge_pages(memory: mmap.mmap) -> None:
    """Advises huge pages for all of `memory`; advisory (a kernel without them says EINVAL)."""
    try:
        memory.madvise(_MADV_HUGEPAGE)
    except OSError:
        pass


def _populate_timed(memory: mmap.mmap, start: int, length: int) -> Optional[float]:
    """Populates [start, start + length) of `memory`; its bytes a second, or None where the kernel
    refused (before Linux 5.14: no MADV_POPULATE_WRITE)."""
    began = time.perf_counter()
    try:
        memory.madvise(_MADV_POPULATE_WRITE, start, length)
    except OSError:
        return None
    return length / max(time.perf_counter() - began, 1e-9)


def _base_pages_from(memory: mmap.mmap, start: int, size: int) -> None:
    """Gives [start, size) of `memory` base pages; advisory (nothing to do without THP)."""
    try:
        memory.madvise(_MADV_NOHUGEPAGE, start, size - start)
    except OSError:
        pass


def _populate(memory: mmap.mmap, size: int, stop: threading.Event) -> None:
    """Faults in and zeroes `memory` front to back, ahead of the read that fills it: in huge pages
    until a chunk shows them to come slowly, then the rest in base pages. Advisory: any failure
    (an old kernel, memory pressure) only leaves the faulting to the read."""
    huge = True
    for start in range(0, size, _POPULATE_CHUNK):
        if stop.is_set():
            return
        length = min(_POPULATE_CHUNK, size - start)
        rate = _populate_timed(memory, start, length)
        if rate is None:
            return
        if huge and start + length < size and rate < _HUGE_PAGES_MIN_RATE:
            huge = False
            _base_pages_from(memory, start + length, size)


def read_region(handle: Any, path: Any, offset: int, length: int, *,
                whole_file: bool = False) -> memoryview:
    """Bytes [offset, offset + length) of `path` in fresh anonymous memory whose addresses match
    the file offsets modulo the page size (so the whole read goes through O_DIRECT without a bounce
    copy). Returns a writable view of exactly `length` bytes; it keeps the mapping alive.
    `handle` is an ``nvio.Handle``; its errors propagate unchanged.

    ``whole_file=True`` (a one-shot load of the file: nothing more will be read of it) lets go of
    the descriptors the handle keeps of `path` afterwards, also after a failure: a loaded file
    removed right after ("delete the old checkpoint, then save") must give its blocks back at
    once, not when the handle's cache lets go of it."""
    try:
        return _read_region(handle, path, offset, length)
    finally:
        if whole_file:
            handle.close_files(path)


def _read_region(handle: Any, path: Any, offset: int, length: int) -> memoryview:
    if length == 0:
        return memoryview(bytearray())
    shift = offset % _PAGE
    size = shift + length
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = memoryview(memory)[shift:]
    # Huge pages (fewer faults and pinned pages for the read, fewer segments per request), unless
    # the populating thread finds them slow to come (_HUGE_PAGES_MIN_RATE). A region below
    # _POPULATE_MIN keeps them: judging them there would cost each of many small regions (a
    # safe_open caller's tensors) a timed huge page of its own, which measured slower than either
    # choice (bench/results.md). A kernel without transparent huge pages refuses the advice,
    # and the pages are small.
    _advise_huge_pages(memory)
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
