"""Batches of offsets into one buffer: ``Handle.read_batch(buf, offsets=..., size=..., file=...)``
and ``write_batch`` (and their ``_async`` forms): slice i of the buffer (``size`` bytes at
``i * size``) moves at ``offsets[i]`` of the file.

Data is the core's locating pattern (each 8-byte word holds its own file offset), so a slice
moved to or from the wrong offset is found and named. Offsets are unaligned, out of order and
with gaps; the file's bytes outside every extent hold a filler that must survive each write, and
the buffer's bytes past ``len(offsets) * size`` a sentinel that must survive each read.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

import nvio
from conftest import read_file, write_file
from nvio import _buffers, _nvio
from test_batch import FILLER, _check_file, _fill, _mismatch

SENTINEL = 0x5A
SIZES = (1, 4095, 4096, (1 << 20) + 123)


def _offsets(count: int, size: int) -> "list[int]":
    """`count` unaligned offsets of `size`-byte extents with odd gaps, not in file order."""
    gaps = (1, 17, 4096 + 3, 511, 0)
    out, offset = [], 7
    for i in range(count):
        out.append(offset)
        offset += size + gaps[i % len(gaps)]
    return out[1::2] + out[::2]  # slice i of the buffer is not at the i-th offset in file order


def _file_for(tmp_path, offsets, size: int) -> "tuple[str, int]":
    end = max(offsets) + size + 4096 + 5
    return write_file(tmp_path / "spans.bin", bytes([FILLER]) * end), end


def _buffer(count: int, size: int) -> torch.Tensor:
    """count * size bytes for the slices and 9 sentinel bytes after them."""
    return torch.full((count * size + 9,), SENTINEL, dtype=torch.uint8)


def _patterned(offsets, size: int) -> torch.Tensor:
    """A _buffer whose slice i holds the pattern of the file bytes at offsets[i]."""
    out = _buffer(len(offsets), size)
    for i, offset in enumerate(offsets):
        _fill(out[i * size:(i + 1) * size], offset)
    return out


def _check_slices(buf: torch.Tensor, offsets, size: int) -> None:
    for i, offset in enumerate(offsets):
        where = _mismatch(buf[i * size:(i + 1) * size], offset)
        assert where is None, f"slice {i} (file offset {offset}) wrong from file offset {where}"
    tail = buf[len(offsets) * size:].numpy()
    assert (tail == SENTINEL).all(), "a byte past the last slice was written"


@pytest.mark.parametrize("size", SIZES)
def test_round_trip_of_offsets_into_one_tensor(tmp_path, engine, size):
    count = 3 if size > 65536 else 17
    offsets = _offsets(count, size)
    path, end = _file_for(tmp_path, offsets, size)
    out = _patterned(offsets, size)
    h = nvio.Handle(engine=engine)
    assert h.write_batch(out, offsets=offsets, size=size, file=path) == count * size
    _check_file(path, sorted((o, size) for o in offsets), end)

    back = _buffer(count, size)
    assert h.read_batch(back, offsets=offsets, size=size, file=path) == count * size
    _check_slices(back, offsets, size)


@pytest.mark.parametrize("form", ["list", "tuple", "numpy", "torch", "numpy scalars"])
def test_offsets_may_be_any_sequence_of_integers(tmp_path, form):
    size, offsets = 4095, _offsets(9, 4095)
    path = write_file(tmp_path / "p.bin", b"")
    out = _patterned(offsets, size)
    h = nvio.Handle()
    h.write_batch(out, offsets=offsets, size=size, file=path)
    given = {"list": offsets, "tuple": tuple(offsets), "numpy": np.array(offsets, np.int64),
             "torch": torch.tensor(offsets, dtype=torch.int64),
             "numpy scalars": [np.int32(o) for o in offsets]}[form]
    back = _buffer(len(offsets), size)
    assert h.read_batch(back, offsets=given, size=size, file=path) == len(offsets) * size
    _check_slices(back, offsets, size)


def test_async_forms_and_a_descriptor(tmp_path):
    size, offsets = 4096, _offsets(33, 4096)
    path = write_file(tmp_path / "a.bin", b"")
    out = _patterned(offsets, size)
    h = nvio.Handle()
    assert h.write_batch_async(out, offsets=offsets, size=size, file=pathlib.Path(path)).wait() \
        == len(offsets) * size
    back = _buffer(len(offsets), size)
    with open(path, "rb") as f:
        future = h.read_batch_async(back, offsets=offsets, size=size, file=f.fileno())
        assert future.wait() == len(offsets) * size
    _check_slices(back, offsets, size)


def test_an_empty_offset_list_moves_nothing(tmp_path):
    path = write_file(tmp_path / "e.bin", b"x" * 10)
    buf = _buffer(0, 1)
    assert nvio.Handle().read_batch(buf, offsets=[], size=1, file=path) == 0
    assert (buf.numpy() == SENTINEL).all()


# --------------------------------------------------------------------------------------------
# Errors: typed, naming the numbers, before anything moves
# --------------------------------------------------------------------------------------------


def _untouched(buf) -> bool:
    return bool((np.asarray(buf) == SENTINEL).all())


@pytest.mark.parametrize("bad, words", [(-5, "offsets[2]"), (2**63, "offsets[2]")])
def test_an_offset_out_of_range_is_refused_naming_it(tmp_path, bad, words):
    path = write_file(tmp_path / "n.bin", b"z" * 65536)
    buf = _buffer(4, 4096)
    with pytest.raises(nvio.InvalidArgument, match=r"offsets\[2\].*" + str(bad)):
        nvio.Handle().read_batch(buf, offsets=[0, 4096, bad, 8192], size=4096, file=path)
    assert _untouched(buf), "a read ran although an offset was refused"


@pytest.mark.parametrize("bad, kind", [(1.5, "float"), (True, "bool"), ("8", "str")])
def test_an_offset_of_the_wrong_type_is_refused_naming_it(tmp_path, bad, kind):
    path = write_file(tmp_path / "t.bin", b"z" * 65536)
    buf = _buffer(3, 4096)
    with pytest.raises(nvio.InvalidType, match=r"offsets\[1\].*" + kind):
        nvio.Handle().read_batch(buf, offsets=[0, bad, 4096], size=4096, file=path)
    assert _untouched(buf)


def test_more_slices_than_the_tensor_holds_are_refused_naming_the_numbers(tmp_path):
    path = write_file(tmp_path / "s.bin", b"z" * 65536)
    buf = torch.full((3 * 4096 + 1,), SENTINEL, dtype=torch.uint8)
    with pytest.raises(nvio.InvalidArgument, match=r"4 offsets x size 4096 = 16384 bytes .* 12289"):
        nvio.Handle().read_batch(buf, offsets=[0, 1, 2, 3], size=4096, file=path)
    assert _untouched(buf)
    with pytest.raises(nvio.InvalidArgument, match="16384 bytes .* 12289"):
        nvio.Handle().write_batch(buf, offsets=[0, 1, 2, 3], size=4096, file=path)
    assert read_file(path) == b"z" * 65536


def test_a_read_only_buffer_is_refused_for_reads_and_accepted_for_writes(tmp_path):
    path = write_file(tmp_path / "r.bin", b"z" * 8192)
    frozen = np.full(8192, SENTINEL, np.uint8)
    frozen.flags.writeable = False
    h = nvio.Handle()
    with pytest.raises(nvio.InvalidArgument, match="read-only"):
        h.read_batch(frozen, offsets=[0, 4096], size=4096, file=path)
    with pytest.raises(nvio.InvalidArgument, match="read-only"):
        h.read_batch_async(frozen, offsets=[0, 4096], size=4096, file=path)
    assert h.write_batch(frozen, offsets=[4096, 0], size=4096, file=path) == 8192
    assert read_file(path) == bytes([SENTINEL]) * 8192


def test_a_non_contiguous_tensor_is_refused(tmp_path):
    path = write_file(tmp_path / "c.bin", b"z" * 8192)
    strided = torch.zeros(8192, dtype=torch.uint8)[::2]
    with pytest.raises(nvio.InvalidArgument, match="not contiguous"):
        nvio.Handle().read_batch(strided, offsets=[0], size=16, file=path)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"offsets": [0]}, nvio.InvalidType, "offsets= and size="),
    ({"size": 16}, nvio.InvalidType, "offsets= and size="),
    ({"offsets": [0], "size": 16, "file": None}, nvio.InvalidType, "file="),
    ({"offsets": [0], "size": 0}, nvio.InvalidArgument, "size must be positive, got 0"),
    ({"offsets": [0], "size": -3}, nvio.InvalidArgument, "got -3"),
    ({"offsets": [0], "size": 2.0}, nvio.InvalidType, "size must be an integer"),
    ({"offsets": 4096, "size": 16}, nvio.InvalidType, "offsets must be a sequence"),
    ({"offsets": "0", "size": 16}, nvio.InvalidType, "offsets must be a sequence"),
    ({"offsets": torch.tensor(5), "size": 16}, nvio.InvalidType, "got a 0-d Tensor"),
    ({"offsets": np.int64(5), "size": 16}, nvio.InvalidType, "offsets must be a sequence"),
    ({"offsets": np.array(5), "size": 16}, nvio.InvalidType, "got a 0-d ndarray"),
])
def test_spans_arguments_are_checked(tmp_path, kwargs, error, words):
    path = write_file(tmp_path / "k.bin", b"z" * 8192)
    kwargs = {"file": path, **kwargs}
    buf = _buffer(1, 16)
    with pytest.raises(error, match=words):
        nvio.Handle().read_batch(buf, **kwargs)
    assert _untouched(buf)


def test_a_short_file_raises_before_anything_is_read(tmp_path):
    path = write_file(tmp_path / "short.bin", b"z" * 10000)
    buf = _buffer(2, 4096)
    with pytest.raises(nvio.ShortFile):
        nvio.Handle().read_batch(buf, offsets=[0, 8192], size=4096, file=path)
    assert _untouched(buf)


# --------------------------------------------------------------------------------------------
# The single calls' files and offsets, converted in C++ for plain values: every other form
# still goes through nvio/_args.py and behaves as before
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["str", "bytes", "Path", "fd", "numpy fd"])
def test_every_file_form_reads_the_same_bytes(tmp_path, form):
    size, offset = 4095, 4096 + 17
    src = np.zeros(offset + size, np.uint8)
    _nvio.pattern_fill(_buffers.resolve(src, writable=True).address, src.nbytes, 0, 0x5EED)
    path = write_file(tmp_path / "f.bin", src.tobytes())
    with open(path, "rb") as f:
        target = {"str": path, "bytes": path.encode(), "Path": pathlib.Path(path),
                  "fd": f.fileno(), "numpy fd": np.int32(f.fileno())}[form]
        buf = torch.zeros(size, dtype=torch.uint8)
        assert nvio.Handle().read_async(buf, target, np.int64(offset)).wait() == size
    assert _mismatch(buf, offset) is None


@pytest.mark.parametrize("offset, error, words", [
    (-1, nvio.InvalidArgument, "offset must be between 0 and"),
    (2**63, nvio.InvalidArgument, "offset must be between 0 and"),
    (True, nvio.InvalidType, "offset must be an integer, got a bool"),
    (1.0, nvio.InvalidType, "offset must be an integer, got float"),
])
def test_single_call_offsets_are_refused_as_before(tmp_path, offset, error, words):
    path = write_file(tmp_path / "o.bin", b"z" * 8192)
    with pytest.raises(error, match=words):
        nvio.Handle().read_async(torch.zeros(16, dtype=torch.uint8), path, offset)


@pytest.mark.parametrize("file, error, words", [
    ("", nvio.InvalidArgument, "file is empty"),
    ("a\0b", nvio.InvalidArgument, "embedded null byte"),
    (-1, nvio.InvalidArgument, "not a file descriptor"),
    (2**31, nvio.InvalidArgument, "not a file descriptor"),
    (False, nvio.InvalidType, "not a bool"),
    (3.0, nvio.InvalidType, "must be a path"),
])
def test_single_call_files_are_refused_as_before(file, error, words):
    with pytest.raises(error, match=words):
        nvio.Handle().read(torch.zeros(16, dtype=torch.uint8), file, 0)


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("call", ["async_pread", "sync_pread", "async_pwrite"])
def test_aio_handle_names_its_own_arguments_in_errors(tmp_path, call, validate):
    path = write_file(tmp_path / "aio.bin", b"z" * 8192)
    h = nvio.aio_handle()
    buf = torch.zeros(16, dtype=torch.uint8)
    full = getattr(h, "pread" if "read" in call else "pwrite")  # (buf, file, validate, async, off)
    method = getattr(h, call) if not validate else (
        lambda b, f, off: full(b, f, True, True, off))
    with pytest.raises(nvio.InvalidArgument, match="file_offset must be between 0 and .* got -1"):
        method(buf, path, -1)
    with pytest.raises(nvio.InvalidType, match="file_offset must be an integer, got float"):
        method(buf, path, 1.0)
    with pytest.raises(nvio.InvalidArgument, match="filename is empty"):
        method(buf, "", 0)
    with pytest.raises(nvio.InvalidArgument, match="filename -3 is not a file descriptor"):
        method(buf, -3, 0)
    assert h.wait() == 0  # nothing was queued
