"""Turning Python buffers into (address, nbytes) for the core, without copies.

Accepted: CPU torch tensors of any dtype, numpy arrays, anything with the buffer protocol
(bytearray, memoryview, array.array, bytes for writes), and objects with ``__dlpack__`` on the CPU.
Reads need a writable, contiguous buffer: a read-only or non-contiguous one raises ``ValueError``
(never a silent copy whose result would be lost). Device (CUDA) buffers raise ``TypeError`` until
GPU support lands.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _nvio

_DLPACK_CPU = 1


class BufferRef(NamedTuple):
    address: int
    nbytes: int
    owner: Any  # keeps the memory alive while an operation may touch it


def _torch():
    import sys

    return sys.modules.get("torch")  # only consult torch if the caller already imported it


def _from_torch(t: Any, writable: bool) -> BufferRef:
    if t.device.type != "cpu":
        raise TypeError(
            f"nvio: {t.device.type} tensors are not supported by this build yet; "
            "copy the tensor to the CPU first"
        )
    if not t.is_contiguous():
        raise ValueError(
            "nvio: the tensor is not contiguous; pass t.contiguous() "
            "(and copy the result back after a read)"
        )
    return BufferRef(t.data_ptr(), t.numel() * t.element_size(), t)


def _from_numpy(a: Any, writable: bool) -> BufferRef:
    if not a.flags.c_contiguous:
        raise ValueError(
            "nvio: the array is not C-contiguous; pass numpy.ascontiguousarray(a) "
            "(and copy the result back after a read)"
        )
    if writable and not a.flags.writeable:
        raise ValueError("nvio: the array is read-only and cannot be read into")
    return BufferRef(a.__array_interface__["data"][0], a.nbytes, a)


def resolve(obj: Any, writable: bool) -> BufferRef:
    """Returns the address and size of `obj`'s memory; `writable` for reads into it."""
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(obj, writable)
    if type(obj).__module__ == "numpy" and hasattr(obj, "__array_interface__"):
        return _from_numpy(obj, writable)
    if hasattr(obj, "__cuda_array_interface__"):
        raise TypeError("nvio: device (CUDA) buffers are not supported by this build yet")
    try:
        view = memoryview(obj)
    except TypeError:
        view = None
    if view is not None:
        if writable and view.readonly:
            raise ValueError(f"nvio: the {type(obj).__name__} is read-only and cannot be read into")
        address, nbytes = _nvio.buffer_address(view, writable)
        return BufferRef(address, nbytes, view)
    if hasattr(obj, "__dlpack__"):
        device_type = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else 1
        if device_type != _DLPACK_CPU:
            raise TypeError("nvio: device (non-CPU) DLPack buffers are not supported by this build yet")
        capsule = obj.__dlpack__()
        address, nbytes = _nvio.dlpack_address(capsule)
        # The capsule stays unconsumed, so the producer's memory lives as long as it does.
        return BufferRef(address, nbytes, (obj, capsule))
    raise TypeError(
        f"nvio: cannot use a {type(obj).__name__} as a buffer: expected a CPU torch tensor, a "
        "numpy array, an object with the buffer protocol, or one with __dlpack__"
    )
