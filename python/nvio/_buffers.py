"""Turning Python buffers into (address, nbytes) for the core, without copies.

Accepted: torch tensors of any dtype on the CPU or a CUDA device, numpy arrays, anything with the
buffer protocol (bytearray, memoryview, array.array, bytes for writes), objects with
``__cuda_array_interface__`` (CuPy, Numba, ...), and objects with ``__dlpack__`` in CPU, CUDA,
CUDA-host (pinned) or CUDA-managed memory. Reads need a writable, contiguous buffer: a read-only or
non-contiguous one raises ``nvio.InvalidArgument`` (a ``ValueError``; never a silent copy whose
result would be lost). Memory that holds Python objects (numpy object arrays, buffers of format
``O``) is refused with ``nvio.InvalidType`` (a ``TypeError``): its bytes are pointers, which a write
would store and a read would overwrite.

``BufferRef.device`` tells the core the memory is CUDA device memory (moved through the GPU path);
pinned host memory (kDLCUDAHost) is host memory.
"""

from __future__ import annotations

import re
import sys
from typing import Any, NamedTuple

from . import _nvio
from ._args import InvalidType

_DLPACK_CPU = 1
_DLPACK_CUDA = 2
_DLPACK_CUDA_HOST = 3
_DLPACK_CUDA_MANAGED = 13
_DLPACK_KNOWN = (_DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_HOST, _DLPACK_CUDA_MANAGED)


def untyped_storage(t: Any) -> Any:
    """The tensor's untyped storage: ``Tensor.untyped_storage()`` where torch has it (2.0 on), so
    that torch 2's deprecation warning for TypedStorage is never raised; ``storage().untyped()``
    on the older torch that has no other way (Debian 12's 1.13)."""
    get = getattr(t, "untyped_storage", None)
    return get() if get is not None else t.storage().untyped()


class BufferRef(NamedTuple):
    address: int
    nbytes: int
    # Keeps the memory alive while an operation may touch it: the object itself, or a tuple of it
    # and what holds its memory (a torch tensor's storage, a DLPack capsule); source() gives the
    # object.
    owner: Any
    device: bool = False  # CUDA device (or managed) memory


def source(ref: BufferRef) -> Any:
    """The object the buffer was resolved from."""
    return ref.owner[0] if isinstance(ref.owner, tuple) else ref.owner


def _unsupported_layout(t: Any) -> InvalidType:
    return InvalidType(
        f"nvio: {t.layout} tensors are not supported: they have no plain memory to read or "
        "write; pass t.to_dense()"
    )


def _from_torch(t: Any, writable: bool) -> BufferRef:
    # is_cuda / is_cpu rather than t.device.type: building the device object costs more than
    # the rest of a small read's Python path.
    cuda = t.is_cuda
    if not cuda and not t.is_cpu:
        raise InvalidType(
            f"nvio: {t.device.type} tensors are not supported; use CPU or CUDA tensors"
        )
    try:
        contiguous = t.is_contiguous()
        address = t.data_ptr() if contiguous else 0
    except RuntimeError as e:
        # Sparse, MKL-DNN and other layouts have no one block of memory to transfer (torch
        # refuses their data_ptr or is_contiguous); asked here rather than checking the layout
        # first, which would cost every small read. A strided tensor without storage (a wrapper
        # subclass) is refused the same way, in its own words.
        if str(t.layout) == "torch.strided":
            raise InvalidType(f"nvio: this tensor has no plain memory to read or write ({e})") \
                from None
        raise _unsupported_layout(t) from None
    if not contiguous:
        # torch 2 answers is_contiguous() of a sparse COO tensor with False instead of refusing.
        if str(t.layout) != "torch.strided":
            raise _unsupported_layout(t)
        raise _nvio.InvalidArgument(
            "nvio: the tensor is not contiguous; pass t.contiguous() "
            "(and copy the result back after a read)"
        )
    if t.is_conj() or t.is_neg():
        # Its memory holds the values before a lazy conj() or negation: written as they are, the
        # file would hold other values than the tensor shows (torch's own .numpy() refuses too).
        what, fix = ("conjugated", "resolve_conj") if t.is_conj() else ("negated", "resolve_neg")
        raise _nvio.InvalidArgument(
            f"nvio: the tensor is a lazily {what} view, whose memory holds other values than it "
            f"shows; pass t.{fix}()"
        )
    # The storage as well as the tensor: `t.data = other` or `t.set_()` while an operation runs
    # would otherwise free the memory the kernel or a worker is moving bytes into.
    try:  # untyped_storage(), inlined: the per-operation path of every small read
        storage = t.untyped_storage()
    except AttributeError:  # torch 1.13
        storage = t.storage().untyped()
    return BufferRef(address, t.numel() * t.element_size(), (t, storage), cuda)


def _typestr_itemsize(typestr: str) -> int:
    digits = "".join(c for c in typestr if c.isdigit())
    if not digits:
        raise _nvio.InvalidArgument(f"nvio: cannot read the item size of typestr {typestr!r}")
    return int(digits)


def _from_cuda_array_interface(obj: Any, writable: bool) -> BufferRef:
    """Version 2/3 of the CUDA Array Interface: data=(ptr, read_only), shape, typestr, strides."""
    cai = obj.__cuda_array_interface__
    ptr, read_only = cai["data"]
    if writable and read_only:
        raise _nvio.InvalidArgument(
            f"nvio: the {type(obj).__name__} is read-only and cannot be read into"
        )
    if "O" in cai["typestr"]:
        raise InvalidType("nvio: the CUDA array holds Python objects, not plain data")
    itemsize = _typestr_itemsize(cai["typestr"])
    shape = tuple(int(d) for d in cai["shape"])
    if any(d < 0 for d in shape):
        raise _nvio.InvalidArgument(f"nvio: the CUDA array's shape {shape} has a negative size")
    strides = cai.get("strides")
    count = 1
    for d in shape:
        count *= d
    if strides is not None:
        expected = itemsize
        for dim, stride in zip(reversed(shape), reversed(tuple(strides))):
            if dim > 1 and stride != expected:
                raise _nvio.InvalidArgument(
                    "nvio: the CUDA array is not C-contiguous; pass a contiguous copy"
                )
            expected *= dim
    if count > 0 and not ptr:
        raise _nvio.InvalidArgument("nvio: the CUDA array has a null data pointer")
    return BufferRef(int(ptr), count * itemsize, obj, True)


def _from_numpy(a: Any, writable: bool) -> BufferRef:
    if a.dtype.hasobject:
        raise InvalidType(
            f"nvio: the array's dtype {a.dtype} holds Python objects, not plain data; "
            "convert it to a numeric dtype"
        )
    if not a.flags.c_contiguous:
        raise _nvio.InvalidArgument(
            "nvio: the array is not C-contiguous; pass numpy.ascontiguousarray(a) "
            "(and copy the result back after a read)"
        )
    if writable and not a.flags.writeable:
        raise _nvio.InvalidArgument("nvio: the array is read-only and cannot be read into")
    return BufferRef(a.__array_interface__["data"][0], a.nbytes, a)


def resolve(obj: Any, writable: bool) -> BufferRef:
    """Returns the address and size of `obj`'s memory; `writable` for reads into it."""
    torch = sys.modules.get("torch")  # only consult torch if the caller already imported it
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(obj, writable)
    if type(obj).__module__ == "numpy" and hasattr(obj, "__array_interface__"):
        return _from_numpy(obj, writable)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cuda_array_interface(obj, writable)
    try:
        view = memoryview(obj)
    except TypeError:
        view = None
    if view is not None:
        if "O" in re.sub(r":[^:]*:", "", view.format):  # struct field names dropped
            raise InvalidType(
                f"nvio: the {type(obj).__name__}'s items (format {view.format!r}) are Python "
                "objects, not plain data"
            )
        if writable and view.readonly:
            raise _nvio.InvalidArgument(
                f"nvio: the {type(obj).__name__} is read-only and cannot be read into"
            )
        address, nbytes = _nvio.buffer_address(view, writable)
        return BufferRef(address, nbytes, view)
    if hasattr(obj, "__dlpack__"):
        device_type = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else 1
        if int(device_type) not in _DLPACK_KNOWN:
            raise InvalidType(
                f"nvio: DLPack device type {int(device_type)} is neither CPU nor CUDA memory"
            )
        capsule = obj.__dlpack__()
        if type(capsule).__name__ != "PyCapsule":
            raise InvalidType(f"nvio: the {type(obj).__name__}'s __dlpack__() returned a "
                              f"{type(capsule).__name__}, not a DLPack capsule")
        address, nbytes, kind = _nvio.dlpack_address(capsule)
        device = kind in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED)
        # The capsule stays unconsumed, so the producer's memory lives as long as it does.
        return BufferRef(address, nbytes, (obj, capsule), device)
    raise InvalidType(
        f"nvio: cannot use a {type(obj).__name__} as a buffer: expected a torch tensor, a numpy "
        "array, an object with the buffer protocol, __cuda_array_interface__ or __dlpack__"
    )
