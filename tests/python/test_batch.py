"""Batches from Python: ``nvio.Handle.read_batch`` / ``write_batch`` and their ``_async`` forms.

Data is the core's locating pattern (``nvio._nvio.pattern_fill``): each 8-byte word holds its own
file offset (and a seed), so a byte that lands at the wrong offset, in the wrong file or not at
all is found and named. Extents have odd sizes (1, 4095, 1 MiB + 123, ...) at unaligned offsets
with gaps between them; the gaps hold a filler byte that must survive every write. Error tests
check that the failure happened where the test put it and that nothing was read or written.
"""

from __future__ import annotations

import errno
import gc
import os
import weakref

import numpy as np
import pytest
import torch

import nvio
from conftest import ODD_SIZES, read_file, write_file
from nvio import _buffers, _nvio

SEED = 0x5EED
FILLER = 0xEE  # the bytes of a file outside every extent


def _fill(buf, offset: int, seed: int = SEED) -> None:
    """Fills `buf` with the pattern of the file bytes it will be written to, at `offset`."""
    ref = _buffers.resolve(buf, writable=True)
    _nvio.pattern_fill(ref.address, ref.nbytes, offset, seed)


def _mismatch(buf, offset: int, seed: int = SEED):
    """The file offset of the first byte of `buf` that is not the pattern at `offset`, or None."""
    ref = _buffers.resolve(buf, writable=False)
    return _nvio.pattern_first_mismatch(ref.address, ref.nbytes, offset, seed)


def _layout(count: int, start: int = 1) -> "list[tuple[int, int]]":
    """(offset, size) of `count` extents of odd sizes at unaligned offsets, with odd gaps."""
    sizes = ODD_SIZES + (7, 65536, 4096 + 17, 3 * 4096, 513)
    gaps = (0, 1, 17, 4096 + 3, 511)
    out, offset = [], start
    for i in range(count):
        size = sizes[i % len(sizes)]
        out.append((offset, size))
        offset += size + gaps[i % len(gaps)]
    return out


def _buffers_for(layout, kind: str) -> list:
    """One buffer per extent: torch tensors or numpy arrays (uint8 for odd sizes, wider dtypes
    where the size allows, so the batch sees more than one element size)."""
    out = []
    for i, (_, size) in enumerate(layout):
        wide = size % 8 == 0 and i % 2 == 0
        if kind == "torch":
            out.append(torch.zeros(size // 8, dtype=torch.float64) if wide
                       else torch.zeros(size, dtype=torch.uint8))
        else:
            out.append(np.zeros(size // 8, np.int64) if wide else np.zeros(size, np.uint8))
    return out


def _filler_file(path, size: int) -> str:
    return write_file(path, bytes([FILLER]) * size)


def _check_file(path, extents, size: int) -> None:
    """Every extent of `path` holds its pattern and every other byte is still the filler."""
    data = np.frombuffer(read_file(path), np.uint8)
    assert data.nbytes == size, f"{path}: {data.nbytes} bytes, expected {size}"
    outside = np.ones(size, bool)
    for offset, length in extents:
        region = data[offset:offset + length]
        assert _mismatch(region, offset) is None, (
            f"{path}: extent at {offset} ({length} bytes) wrong from {_mismatch(region, offset)}")
        outside[offset:offset + length] = False
    wrong = np.flatnonzero(outside & (data != FILLER))
    assert wrong.size == 0, f"{path}: byte {wrong[0]} outside every extent was written"


def _end(layout) -> int:
    return layout[-1][0] + layout[-1][1]


# --------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_round_trip_of_many_odd_extents_in_one_file(tmp_path, engine, kind):
    layout = _layout(24)
    size = _end(layout) + 4096 + 5
    path = _filler_file(tmp_path / "one.bin", size)
    bufs = _buffers_for(layout, kind)
    for buf, (offset, _) in zip(bufs, layout):
        _fill(buf, offset)
    h = nvio.Handle(engine=engine)
    total = sum(n for _, n in layout)
    assert h.write_batch([(b, off) for b, (off, _) in zip(bufs, layout)], path) == total
    _check_file(path, layout, size)

    back = _buffers_for(layout, kind)
    assert h.read_batch([(b, off) for b, (off, _) in zip(back, layout)], path) == total
    for buf, (offset, _) in zip(back, layout):
        assert _mismatch(buf, offset) is None, f"extent at {offset} read back wrong"


def test_extents_of_several_files_and_a_descriptor_in_one_batch(tmp_path):
    """Per-item files (paths of several kinds and an open descriptor), interleaved, with a
    default ``file`` for the items that name none; each file gets exactly its own extents."""
    layout = _layout(18)
    size = _end(layout) + 100
    paths = [_filler_file(tmp_path / f"f{i}.bin", size) for i in range(3)]
    fd = os.open(_filler_file(tmp_path / "by_fd.bin", size), os.O_RDWR)
    try:
        files = [paths[0], os.fsencode(paths[1]), tmp_path / "f2.bin", fd, None]
        owner = [files[i % len(files)] for i in range(len(layout))]
        bufs = _buffers_for(layout, "numpy")
        for i, (buf, (offset, _)) in enumerate(zip(bufs, layout)):
            _fill(buf, offset)
        items = [(b, off) if f is None else (b, off, f)
                 for b, (off, _), f in zip(bufs, layout, owner)]
        h = nvio.Handle()
        h.write_batch(items, file=paths[0], sync=True)
        expected = {p: [] for p in paths + [str(tmp_path / "by_fd.bin")]}
        for f, extent in zip(owner, layout):
            name = (paths[0] if f is None else os.fsdecode(f) if not isinstance(f, int)
                    else str(tmp_path / "by_fd.bin"))
            expected[str(name)].append(extent)
        assert all(expected.values())
        for name, extents in expected.items():
            _check_file(name, extents, size)

        back = _buffers_for(layout, "torch")
        items = [(b, off) if f is None else (b, off, f)
                 for b, (off, _), f in zip(back, layout, owner)]
        h.read_batch(items, paths[0])
        for buf, (offset, _) in zip(back, layout):
            assert _mismatch(buf, offset) is None, f"extent at {offset} read back wrong"
    finally:
        os.close(fd)


def test_async_batches_return_one_future_that_keeps_every_buffer_alive(tmp_path):
    layout = _layout(10)
    size = _end(layout)
    path = _filler_file(tmp_path / "a.bin", size)
    h = nvio.Handle(block_size=4096, queue_depth=1, intra_op_parallelism=1)
    bufs = _buffers_for(layout, "numpy")
    for buf, (offset, _) in zip(bufs, layout):
        _fill(buf, offset)
    watches = [weakref.ref(b) for b in bufs]
    fut = h.write_batch_async([(b, off) for b, (off, _) in zip(bufs, layout)], path)
    del bufs, buf
    gc.collect()
    assert all(w() is not None for w in watches), "a buffer was freed while the batch was pending"
    total = sum(n for _, n in layout)
    assert fut.wait() == total and fut.done()
    gc.collect()
    assert all(w() is None for w in watches), "the future kept its buffers after it finished"
    _check_file(path, layout, size)

    back = _buffers_for(layout, "torch")
    fut = h.read_batch_async([(b, off, path) for b, (off, _) in zip(back, layout)])
    assert h.wait_all() == 1 and fut.result() == total
    for buf, (offset, _) in zip(back, layout):
        assert _mismatch(buf, offset) is None, f"extent at {offset} read back wrong"


def test_an_empty_batch_moves_nothing(tmp_path):
    h = nvio.Handle()
    path = tmp_path / "never.bin"
    assert h.write_batch([], path) == 0
    assert h.read_batch(iter(()), path) == 0
    assert h.write_batch_async([], path).wait() == 0
    assert not path.exists()


# --------------------------------------------------------------------------------------------
# Errors: raised before anything moves, typed, naming what failed
# --------------------------------------------------------------------------------------------


def _good_read(tmp_path):
    """A file with the pattern and a zeroed buffer for its first 4095 bytes."""
    path = tmp_path / "good.bin"
    data = np.empty(8192, np.uint8)
    _fill(data, 0)
    write_file(path, data.tobytes())
    return np.zeros(4095, np.uint8), str(path)


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
def test_a_short_file_raises_before_anything_is_read(tmp_path, blocking):
    buf, good = _good_read(tmp_path)
    short = write_file(tmp_path / "short.bin", b"s" * 100)
    h = nvio.Handle()
    call = h.read_batch if blocking else h.read_batch_async
    with pytest.raises(nvio.ShortFile) as info:
        call([(buf, 0, good), (bytearray(10), 95, short)])
    assert info.value.file_size == 100 and info.value.path == short
    assert not buf.any(), "the batch's first extent was read although a later one was refused"
    assert h.wait_all() == 0


def test_a_missing_file_raises_before_anything_is_read(tmp_path):
    buf, good = _good_read(tmp_path)
    missing = str(tmp_path / "missing.bin")
    with pytest.raises(nvio.FileNotFound) as info:
        nvio.Handle().read_batch([(buf, 0, good), (bytearray(1), 0, missing)])
    assert info.value.errno == errno.ENOENT and info.value.path == missing
    assert not buf.any()


def test_a_file_that_cannot_be_opened_raises_before_anything_is_written(tmp_path):
    dest = _filler_file(tmp_path / "dest.bin", 8192)
    data = np.empty(4095, np.uint8)
    _fill(data, 1)
    unreachable = str(tmp_path / "no-such-dir" / "x.bin")
    with pytest.raises(nvio.FileNotFound) as info:
        nvio.Handle().write_batch([(data, 1, dest), (data, 0, unreachable)])
    assert info.value.path == unreachable
    _check_file(dest, [], 8192)


def test_a_read_only_buffer_is_refused_for_a_read_naming_its_item(tmp_path):
    buf, good = _good_read(tmp_path)
    frozen = np.zeros(10, np.uint8)
    frozen.flags.writeable = False
    h = nvio.Handle()
    for bad in (frozen, b"0123456789", memoryview(bytearray(10)).toreadonly()):
        with pytest.raises(nvio.InvalidArgument, match=r"items\[1\].*read-only"):
            h.read_batch([(buf, 0), (bad, 10)], good)
    assert not buf.any()
    assert h.write_batch([(frozen, 0)], tmp_path / "w.bin") == 10  # fine for a write


def test_a_path_with_nul_raises_before_anything_is_written(tmp_path):
    dest = _filler_file(tmp_path / "dest.bin", 8192)
    data = np.empty(4095, np.uint8)
    _fill(data, 3)
    h = nvio.Handle()
    for bad in ("a\0b", b"a\0b"):
        with pytest.raises(nvio.InvalidArgument, match=r"items\[1\] file.*null byte"):
            h.write_batch([(data, 3, dest), (data, 0, bad)])
        with pytest.raises(nvio.InvalidArgument, match="null byte"):
            h.write_batch_async([(data, 3)], bad)
    _check_file(dest, [], 8192)
    assert h.wait_all() == 0


@pytest.mark.parametrize("item, error, words", [
    ((np.zeros(2, object), 0), nvio.InvalidType, r"items\[1\].*Python objects"),
    ((bytearray(1), -1), nvio.InvalidArgument, r"items\[1\] offset"),
    ((bytearray(1), 1.5), nvio.InvalidType, r"items\[1\] offset"),
    ((bytearray(1), 0, True), nvio.InvalidType, r"items\[1\] file"),
    ((bytearray(1),), nvio.InvalidType, r"items\[1\] must be"),
    ("ab", nvio.InvalidType, r"items\[1\] must be"),
], ids=["object-dtype", "negative-offset", "float-offset", "bool-file", "one-element", "str"])
def test_bad_items_are_refused_by_type_naming_the_item(tmp_path, item, error, words):
    dest = _filler_file(tmp_path / "dest.bin", 100)
    with pytest.raises(error, match=words):
        nvio.Handle().write_batch([(bytearray(b"x"), 0), item], dest)
    _check_file(dest, [], 100)


def test_batch_arguments_are_checked(tmp_path):
    h = nvio.Handle()
    with pytest.raises(nvio.InvalidType, match="names no file"):
        h.write_batch([(bytearray(1), 0)])
    with pytest.raises(nvio.InvalidType, match="items must be"):
        h.write_batch(b"ab", tmp_path / "x")
    with pytest.raises(nvio.InvalidType, match=r"items\[0\] must be"):
        h.write_batch(bytearray(1), tmp_path / "x")
    with pytest.raises(nvio.InvalidType, match="sync"):
        h.write_batch([(bytearray(1), 0)], tmp_path / "x", sync="no")
    with pytest.raises(TypeError):
        h.write_batch([(bytearray(1), 0)], tmp_path / "x", truncate=True)  # refused by the core too
    assert not (tmp_path / "x").exists()


def test_a_failed_extent_of_an_async_batch_raises_from_wait_after_the_others_finished(tmp_path):
    """Extents written through a read-only descriptor fail with EBADF when they run; the first
    failure in item order (not file order) is raised, every wait raises it, and the good extents
    around it were still written."""
    layout = _layout(6)
    size = _end(layout)
    path = _filler_file(tmp_path / "good.bin", size)
    ro_path = _filler_file(tmp_path / "ro.bin", 8192)
    fd = os.open(ro_path, os.O_RDONLY)
    try:
        bufs = _buffers_for(layout, "numpy")
        for buf, (offset, _) in zip(bufs, layout):
            _fill(buf, offset)
        items = [(b, off, path) for b, (off, _) in zip(bufs, layout)]
        items.insert(2, (bytearray(100), 1000, fd))
        items.insert(4, (bytearray(100), 5, fd))
        h = nvio.Handle()
        fut = h.write_batch_async(items)
        with pytest.raises(nvio.IOFailure) as info:
            fut.wait()
        assert info.value.errno == errno.EBADF
        assert 1000 <= info.value.offset < 1100, "not the first failing extent in item order"
        with pytest.raises(nvio.IOFailure) as again:
            fut.result()
        assert again.value is info.value
    finally:
        os.close(fd)
    _check_file(path, layout, size)
    _check_file(ro_path, [], 8192)
