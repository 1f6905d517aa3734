"""nvio._landing.read_region, the fresh memory nvio.load and safetensors.load_file read into: the
bytes land placed like the file, and the populating thread keeps huge pages only while they come
fast (the mapping's VmFlags in /proc/self/smaps show which way it went)."""

import ctypes
import mmap
import os
import threading

import numpy as np
import pytest

import nvio
from nvio import _landing

MiB = 1 << 20


def pattern_file(path, nbytes):
    words = np.arange(nbytes // 8, dtype=np.uint64) * 8  # each word holds its own file offset
    path.write_bytes(words.tobytes() + bytes(nbytes % 8))
    return path


def address_of(view):
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def vma_flags(start, end):
    """(first, last, VmFlags) of each mapping of this process that overlaps [start, end)."""
    out, current = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                current = (lo, hi) if lo < end and hi > start else None
            elif current and line.startswith("VmFlags:"):
                out.append((*current, set(line.split()[1:])))
    return sorted(out)


@pytest.mark.parametrize("offset", [0, 4096 + 7])
def test_the_region_lands_placed_like_the_file(tmp_path, offset):
    size = 72 * MiB + 123  # above _POPULATE_MIN: the populating thread runs
    path = pattern_file(tmp_path / "f.bin", size + offset)
    view = _landing.read_region(nvio.Handle(), path, offset, size)
    assert len(view) == size
    assert address_of(view) % 4096 == offset % 4096  # no bounce copy was needed
    assert bytes(view) == path.read_bytes()[offset:offset + size]


def thp_or_skip():
    """Skips where the kernel cannot show the choice: no transparent huge pages, or no
    MADV_POPULATE_WRITE (Linux 5.14), without which the populating thread does nothing."""
    if not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        pytest.skip("this kernel has no transparent huge pages")
    probe = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        probe.madvise(_landing._MADV_POPULATE_WRITE, 0, 4096)
    except OSError as e:
        pytest.skip(f"MADV_POPULATE_WRITE refused here ({e}): the populating thread is idle")
    finally:
        probe.close()


@pytest.mark.parametrize("rate, huge_after_first_chunk", [(0.0, True), (float("inf"), False)])
def test_huge_pages_are_kept_only_while_they_come_fast(monkeypatch, rate, huge_after_first_chunk):
    # _populate itself, run to its end in this thread (in read_region it races the read, which
    # may end first and stop it).
    thp_or_skip()
    monkeypatch.setattr(_landing, "_HUGE_PAGES_MIN_RATE", rate)
    size = 3 * _landing._POPULATE_CHUNK
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory.madvise(_landing._MADV_HUGEPAGE)
    _landing._populate(memory, size, threading.Event())
    start = address_of(memoryview(memory))
    flags = vma_flags(start, start + size)
    assert flags[0][0] <= start and flags[-1][1] >= start + size
    first_chunk_end = start + _landing._POPULATE_CHUNK
    for lo, hi, vm in flags:
        if hi <= first_chunk_end or huge_after_first_chunk:
            assert "hg" in vm and "nh" not in vm, (hex(lo), vm)
        else:
            assert "nh" in vm and "hg" not in vm, (hex(lo), vm)
    assert len(flags) == (1 if huge_after_first_chunk else 2)
    rss = [int(line.split()[1]) for line in open("/proc/self/smaps_rollup")
           if line.startswith("Rss:")][0]
    assert rss * 1024 >= size  # populated, all of it


def test_read_region_goes_on_after_the_huge_page_choice(tmp_path, monkeypatch):
    monkeypatch.setattr(_landing, "_HUGE_PAGES_MIN_RATE", float("inf"))
    size = 96 * MiB + 5
    path = pattern_file(tmp_path / "f.bin", size)
    view = _landing.read_region(nvio.Handle(), path, 0, size)
    assert bytes(view) == path.read_bytes()


def test_small_regions_keep_huge_pages(tmp_path):
    # Below _POPULATE_MIN there is no populating thread to judge them: advised, and kept.
    path = pattern_file(tmp_path / "f.bin", 4 * MiB)
    view = _landing.read_region(nvio.Handle(), path, 0, 4 * MiB)
    start = address_of(view)
    if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        for _, _, vm in vma_flags(start, start + 4 * MiB):
            assert "hg" in vm and "nh" not in vm
    assert bytes(view) == path.read_bytes()


def test_a_kernel_that_refuses_huge_page_advice_still_loads(tmp_path, monkeypatch):
    # A kernel built without transparent huge pages answers MADV_HUGEPAGE / MADV_NOHUGEPAGE with
    # EINVAL: the advice is dropped, the bytes still land, and the populating thread goes on.
    real = _landing.mmap.mmap
    populated = []

    class NoThp(real):
        def madvise(self, option, *args):
            if option in (_landing._MADV_HUGEPAGE, _landing._MADV_NOHUGEPAGE):
                raise OSError(22, "Invalid argument")
            if option == _landing._MADV_POPULATE_WRITE:
                populated.append(args)
            return super().madvise(option, *args)

    monkeypatch.setattr(_landing.mmap, "mmap", NoThp)
    monkeypatch.setattr(_landing, "_HUGE_PAGES_MIN_RATE", float("inf"))
    path = pattern_file(tmp_path / "f.bin", 40 * MiB + 5)
    view = _landing.read_region(nvio.Handle(), path, 0, 40 * MiB + 5)
    assert bytes(view) == path.read_bytes()
    # Past the refused MADV_NOHUGEPAGE after the first (slow) chunk: run here to its end.
    populated.clear()
    size = 2 * _landing._POPULATE_CHUNK
    _landing._populate(NoThp(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), size,
                       threading.Event())
    assert len(populated) == 2, populated
