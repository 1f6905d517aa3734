"""Which Python objects are accepted as buffers, and how bad ones are refused."""

from __future__ import annotations

import array
import ctypes

import numpy as np
import pytest
import torch

import nvio
from conftest import as_bytes, read_file, write_file


class DLPackOnly:
    """Exposes a torch tensor through __dlpack__ only (no buffer protocol, no numpy)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._t = tensor

    def __dlpack__(self, stream=None):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


class FakeCuda:
    __cuda_array_interface__ = {"shape": (4,), "typestr": "|u1", "data": (0, False), "version": 3}


def _both_apis(tmp_path, make_src, make_dst, data: bytes):
    """Writes make_src() and reads into make_dst() through nvio.Handle and aio_handle."""
    h = nvio.Handle()
    assert h.write(make_src(), tmp_path / "h.bin", 11) == len(data)
    assert read_file(tmp_path / "h.bin", 11) == data
    dst = make_dst()
    assert h.read(dst, tmp_path / "h.bin", 11) == len(data)
    assert as_bytes(dst) == data

    a = nvio.aio_handle()
    assert a.sync_pwrite(make_src(), str(tmp_path / "a.bin"), 5) == 1
    assert read_file(tmp_path / "a.bin", 5) == data
    dst = make_dst()
    assert a.async_pread(dst, str(tmp_path / "a.bin"), 5) == 0
    assert a.wait() == 1
    assert as_bytes(dst) == data


def test_bytearray(tmp_path, rng_bytes):
    data = rng_bytes(10_007)
    _both_apis(tmp_path, lambda: bytearray(data), lambda: bytearray(len(data)), data)


def test_memoryview(tmp_path, rng_bytes):
    data = rng_bytes(10_007)
    backing = bytearray(len(data) + 10)
    _both_apis(tmp_path, lambda: memoryview(bytearray(data)),
               lambda: memoryview(backing)[3:3 + len(data)], data)
    assert backing[:3] == b"\0\0\0" and backing[3 + len(data):] == b"\0" * 7


def test_array_array(tmp_path, rng_bytes):
    src = array.array("i", np.frombuffer(rng_bytes(4 * 2501), np.int32).tolist())
    data = src.tobytes()
    _both_apis(tmp_path, lambda: array.array("i", src), lambda: array.array("i", [0]) * 2501, data)


def test_numpy_multidim(tmp_path, rng_bytes):
    data = rng_bytes(8 * 3 * 5 * 7)
    src = np.frombuffer(data, np.float64).reshape(3, 5, 7)
    _both_apis(tmp_path, lambda: src.copy(), lambda: np.zeros((3, 5, 7), np.float64), data)


def test_torch_multidim(tmp_path, rng_bytes):
    data = rng_bytes(4 * 6 * 11)
    src = torch.frombuffer(bytearray(data), dtype=torch.int32).reshape(6, 11)
    _both_apis(tmp_path, lambda: src.clone(), lambda: torch.zeros(6, 11, dtype=torch.int32), data)


def test_contiguous_slices_are_fine(tmp_path, rng_bytes):
    data = rng_bytes(1000)
    big_t = torch.zeros(3000, dtype=torch.uint8)
    big_a = np.zeros(3000, np.uint8)
    _both_apis(tmp_path, lambda: bytearray(data), lambda: big_t[1000:2000], data)
    _both_apis(tmp_path, lambda: bytearray(data), lambda: big_a[1000:2000], data)
    assert not big_t[:1000].any() and not big_t[2000:].any()
    assert not big_a[:1000].any() and not big_a[2000:].any()


def test_dlpack_write(tmp_path, rng_bytes):
    data = rng_bytes(5_555)
    src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    h = nvio.Handle()
    assert h.write(DLPackOnly(src), tmp_path / "d.bin") == len(data)
    assert read_file(tmp_path / "d.bin") == data
    a = nvio.aio_handle()
    assert a.sync_pwrite(DLPackOnly(src), str(tmp_path / "d2.bin")) == 1
    assert read_file(tmp_path / "d2.bin") == data


def test_dlpack_read(tmp_path, rng_bytes):
    data = rng_bytes(5_555)
    path = write_file(tmp_path / "d.bin", data)
    dst = torch.zeros(len(data), dtype=torch.uint8)
    assert nvio.Handle().read(DLPackOnly(dst), path) == len(data)
    assert as_bytes(dst) == data


# DLPack's ABI (dlpack.h): the structures behind a "dltensor" capsule.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DLTENSOR_NAME = b"dltensor"  # the capsule keeps a pointer to the name: it must outlive it


class RawDLPack:
    """A DLPack producer over a numpy byte array, for dtypes numpy and torch cannot export (4-bit,
    1-bit). It owns the DLManagedTensor, its shape and strides, and the storage; its capsules have
    no destructor and no deleter, so nothing is freed while it lives."""

    def __init__(self, storage, shape, bits, lanes=1, strides=None, byte_offset=0, code=1):
        self.storage = storage
        self._shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._strides = (ctypes.c_int64 * len(strides))(*strides) if strides else None
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = storage.ctypes.data
        t.device = _DLDevice(1, 0)  # kDLCPU
        t.ndim = len(shape)
        t.dtype = _DLDataType(code, bits, lanes)  # code 1: kDLUInt
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        if self._strides is not None:
            t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = byte_offset

    def __dlpack__(self, stream=None):
        return _PyCapsule_New(ctypes.addressof(self._managed), _DLTENSOR_NAME, None)

    def __dlpack_device__(self):
        return (1, 0)


GUARD = 0xA5


@pytest.mark.parametrize(
    "shape,bits,lanes,nbytes",
    [
        ((7, 5), 4, 1, 18),  # 35 4-bit elements: 140 bits, 17.5 bytes -> 18 (not 35)
        ((13,), 1, 1, 2),  # a 13-bit mask: 2 bytes (not 13)
        ((3,), 4, 3, 5),  # 3 elements of 3 4-bit lanes: 36 bits -> 5 bytes (not 6)
        ((2, 3), 8, 1, 6),  # whole bytes are as before
        ((), 4, 1, 1),  # a 0-d 4-bit scalar: 1 byte
    ],
)
@pytest.mark.parametrize("byte_offset", [0, 3])
def test_dlpack_packed_sub_byte_sizes(tmp_path, rng_bytes, shape, bits, lanes, nbytes,
                                      byte_offset):
    data = rng_bytes(64)
    path = write_file(tmp_path / "packed.bin", data)
    storage = np.full(64, GUARD, dtype=np.uint8)
    fake = RawDLPack(storage, shape, bits, lanes, byte_offset=byte_offset)
    # A read fills exactly the packed bytes, and none after (or before) them.
    assert nvio.Handle().read(fake, path) == nbytes
    assert storage[byte_offset:byte_offset + nbytes].tobytes() == data[:nbytes]
    assert (storage[:byte_offset] == GUARD).all()
    assert (storage[byte_offset + nbytes:] == GUARD).all(), "the read ran past the tensor"
    # A write takes exactly those bytes too.
    assert nvio.Handle().write(fake, tmp_path / "out.bin") == nbytes
    assert read_file(tmp_path / "out.bin") == data[:nbytes]
    a = nvio.aio_handle()
    storage[:] = GUARD
    assert a.sync_pread(fake, path) == 1
    assert (storage[byte_offset + nbytes:] == GUARD).all()


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        # Transposed 4-bit: its bytes are not one packed range.
        (dict(shape=(4, 4), bits=4, strides=(1, 4)), "densely packed"),
        # Every other 4-bit element.
        (dict(shape=(4,), bits=4, strides=(2,)), "densely packed"),
        (dict(shape=(4,), bits=0), "0 bits"),
        (dict(shape=(4,), bits=4, lanes=0), "0 lanes"),
        (dict(shape=(4, -1), bits=8), "negative"),
        (dict(shape=(1 << 62, 1 << 62), bits=8), "too large"),
    ],
)
def test_dlpack_layouts_without_one_byte_range_are_refused(tmp_path, kwargs, needle):
    path = write_file(tmp_path / "f.bin", bytes(64))
    storage = np.full(64, GUARD, dtype=np.uint8)
    fake = RawDLPack(storage, **kwargs)
    with pytest.raises(nvio.InvalidArgument, match=needle):
        nvio.Handle().read(fake, path)
    assert (storage == GUARD).all()


def test_dlpack_compact_strides_and_unit_dimensions_are_accepted(tmp_path, rng_bytes):
    data = rng_bytes(64)
    path = write_file(tmp_path / "f.bin", data)
    storage = np.full(64, GUARD, dtype=np.uint8)
    # Explicit compact strides, and a dimension of one element with any stride: 2 x 6 4-bit
    # elements, 6 bytes.
    fake = RawDLPack(storage, (2, 1, 6), 4, strides=(6, 99, 1))
    assert nvio.Handle().read(fake, path) == 6
    assert storage[:6].tobytes() == data[:6]
    assert (storage[6:] == GUARD).all()


def test_read_only_buffers_refused_for_reads_but_fine_for_writes(tmp_path, rng_bytes):
    data = rng_bytes(4096)
    path = write_file(tmp_path / "ro.bin", data)
    ro = np.zeros(4096, np.uint8)
    ro.flags.writeable = False
    h = nvio.Handle()
    a = nvio.aio_handle()
    for buf in (bytes(4096), ro, memoryview(bytes(4096))):
        with pytest.raises(ValueError, match="read-only"):
            h.read(buf, path)
        with pytest.raises(ValueError, match="read-only"):
            h.read_async(buf, path)
        with pytest.raises(ValueError, match="read-only"):
            a.sync_pread(buf, path)
        with pytest.raises(ValueError, match="read-only"):
            a.async_pread(buf, path)
    assert not ro.any()
    assert a.wait() == 0
    # Writing from read-only memory is fine.
    assert h.write(data, tmp_path / "w1.bin") == 4096
    frozen = np.frombuffer(data, np.uint8)
    assert not frozen.flags.writeable
    assert a.sync_pwrite(frozen, str(tmp_path / "w2.bin")) == 1
    assert read_file(tmp_path / "w1.bin") == data == read_file(tmp_path / "w2.bin")


@pytest.mark.parametrize("kind", ["torch_stride", "torch_transpose", "numpy_stride",
                                  "numpy_fortran", "memoryview_stride"])
@pytest.mark.parametrize("is_read", [True, False], ids=["read", "write"])
def test_non_contiguous_refused(tmp_path, kind, is_read):
    path = write_file(tmp_path / "nc.bin", bytes(range(256)) * 64)
    buf = {
        "torch_stride": lambda: torch.zeros(2000, dtype=torch.uint8)[::2],
        "torch_transpose": lambda: torch.zeros(40, 50, dtype=torch.float32).t(),
        "numpy_stride": lambda: np.zeros(2000, np.uint8)[::2],
        "numpy_fortran": lambda: np.zeros((40, 50), np.float32, order="F"),
        "memoryview_stride": lambda: memoryview(bytearray(2000))[::2],
    }[kind]()
    h = nvio.Handle()
    a = nvio.aio_handle()
    if is_read:
        calls = [lambda: h.read(buf, path), lambda: a.sync_pread(buf, path),
                 lambda: a.async_pread(buf, path)]
    else:
        calls = [lambda: h.write(buf, tmp_path / "o.bin"), lambda: a.sync_pwrite(buf, str(tmp_path / "o.bin")),
                 lambda: a.async_pwrite(buf, str(tmp_path / "o.bin"))]
    for call in calls:
        with pytest.raises(ValueError, match="contiguous"):
            call()
    assert a.wait() == 0
    assert not (tmp_path / "o.bin").exists()


@pytest.mark.parametrize("obj", [object(), [1, 2, 3], "text", 42, None, 1.5],
                         ids=["object", "list", "str", "int", "None", "float"])
def test_unsupported_type_is_type_error(tmp_path, obj):
    path = write_file(tmp_path / "u.bin", b"x" * 100)
    h = nvio.Handle()
    a = nvio.aio_handle()
    with pytest.raises(TypeError):
        h.read(obj, path)
    with pytest.raises(TypeError):
        h.write(obj, tmp_path / "u2.bin")
    with pytest.raises(TypeError):
        a.sync_pread(obj, path)
    with pytest.raises(TypeError):
        a.async_pwrite(obj, str(tmp_path / "u2.bin"))
    assert a.wait() == 0


def test_unusable_buffers_refused_clearly(tmp_path):
    # A CUDA array interface with a null pointer (device buffers themselves: test_gpu.py).
    with pytest.raises(ValueError, match="null"):
        nvio.Handle().write(FakeCuda(), tmp_path / "c.bin")
    meta = torch.empty(16, dtype=torch.uint8, device="meta")
    with pytest.raises(TypeError, match="meta"):
        nvio.Handle().write(meta, tmp_path / "c.bin")
    # Layouts without one block of memory: a typed error naming the layout, not torch's own.
    path = write_file(tmp_path / "s.bin", bytes(64))
    for layout, t in (("sparse_coo", torch.zeros(4).to_sparse()),
                      ("sparse_csr", torch.zeros(2, 2).to_sparse_csr())):
        with pytest.raises(nvio.InvalidType, match=layout):
            nvio.Handle().read(t, path)
        with pytest.raises(nvio.InvalidType, match=layout):
            nvio.Handle().write(t, tmp_path / "c.bin")
    assert read_file(path) == bytes(64)

    class NoMemory(torch.Tensor):  # a strided tensor whose data_ptr torch refuses (a wrapper)
        def data_ptr(self):
            raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")

    wrapper = torch.Tensor._make_subclass(NoMemory, torch.zeros(4))
    with pytest.raises(nvio.InvalidType, match="this tensor has no plain memory .*storage"):
        nvio.Handle().read(wrapper, path)


def test_zero_length_buffers(tmp_path):
    path = write_file(tmp_path / "z.bin", b"abc")
    h = nvio.Handle()
    assert h.read(bytearray(0), path) == 0
    assert h.read(torch.empty(0, dtype=torch.float32), path, 3) == 0
    a = nvio.aio_handle()
    assert a.sync_pread(np.empty(0, np.uint8), path) == 1
    assert read_file(path) == b"abc"


def test_unlocked_large_buffer_goes_through_bounce_pool(tmp_path, rng_bytes):
    """An ordinary (unlocked, unaligned) buffer larger than the block size and the bounce
    buffers, at an odd address and offset."""
    data = rng_bytes(5 * (1 << 20) + 3)
    backing = bytearray(len(data) + 1)
    view = memoryview(backing)[1:]  # odd address
    view[:] = data
    h = nvio.Handle(block_size=1 << 20, intra_op_parallelism=3)
    assert not nvio.is_pinned(view)
    h.write(view, tmp_path / "b.bin", 511)
    assert read_file(tmp_path / "b.bin", 511) == data
    out = bytearray(len(data) + 1)
    h.read(memoryview(out)[1:], tmp_path / "b.bin", 511)
    assert bytes(out[1:]) == data and out[0] == 0
