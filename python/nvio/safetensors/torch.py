"""nvio.safetensors.torch: the reference's ``safetensors.torch`` through nvio — ``save_file``,
``load_file``, ``save``, ``load`` and ``safe_open`` with the same names, arguments and results, so
that switching is an import change::

    from nvio.safetensors.torch import load_file, save_file

``load_file`` on the CPU reads the whole data region with one parallel O_DIRECT call into fresh
memory placed like the file, and every tensor is a view of its bytes there: no copy, and the memory
is freed with the last of the tensors (a tensor kept alone keeps the region alive). On a GPU one
read batch fills tensors allocated on the device. Tensors come in file order, as the reference's.
``save_file`` writes the header and every tensor with one write batch into a temporary file that
replaces ``filename`` atomically (fdatasync, rename, directory fsync).

Every dtype torch has a safetensors name for round-trips, the float8 types, uint16-64, complex64 and
F4 (torch's float4_e2m1fn_x2, two values per byte, its last dimension half the file's) included.
Differences from the reference: non-contiguous tensors are saved as contiguous copies (the reference
refuses them); metadata keys are written sorted (the reference's order varies from run to run).
Tensors that share memory are refused, as the reference does. torch is imported on first use.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

from .. import _args, _buffers, _nvio
from . import _common
from ._common import SafetensorError, safe_open

__all__ = ["load_file", "save_file", "load", "save", "safe_open", "SafetensorError"]


def _prepare(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]]) -> Tuple[list, list]:
    """Checks the tensors as the reference does and returns the core's items (name, dtype, shape,
    address, nbytes) and the tensors that back them (kept alive by the caller)."""
    torch = _common._torch()
    _common.check_names(tensors, "torch tensor")
    _common.check_metadata(metadata)
    by_storage: Dict[Tuple[str, int], List[str]] = {}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise _args.InvalidType(
                f"nvio.safetensors: {name!r} is a {type(t).__name__}, not a torch tensor")
        if t.layout != torch.strided:
            raise _nvio.InvalidArgument(
                f"nvio.safetensors: tensor {name!r} is {t.layout}; only dense tensors can be "
                "saved (call .to_dense())")
        storage = _buffers.untyped_storage(t)
        if storage.nbytes() > 0:
            by_storage.setdefault((str(t.device), storage.data_ptr()), []).append(name)
    shared = [names for names in by_storage.values() if len(names) > 1]
    if shared:
        raise RuntimeError(
            f"nvio.safetensors: some tensors share memory, which safetensors cannot express "
            f"(each would be stored as a copy, and loaded as separate tensors): {shared}. Save "
            "one tensor per storage (e.g. clone() the others) and rebuild the sharing on load.")
    items, owners = [], []
    for name, t in tensors.items():
        dtype = _common.st_dtype_of_torch(t.dtype, name)
        if t.device.type != "cpu":
            t = t.cpu()
        # A lazily conjugated or negated view's memory holds the values before the conj() or
        # negation: resolved, the file holds the values the tensor shows.
        t = t.resolve_conj().resolve_neg().contiguous()
        owners.append(t)
        shape = list(t.shape)
        pack = _common._PACKED.get(dtype)
        if pack:
            if not shape:
                raise _nvio.InvalidArgument(
                    f"nvio.safetensors: tensor {name!r} of {t.dtype} is 0-d; its file shape "
                    "would have no last dimension to hold two values per byte")
            shape[-1] *= pack
        items.append((name, dtype, shape, t.data_ptr(), t.numel() * t.element_size()))
    return items, owners


def save_file(tensors: Dict[str, Any], filename: Any,
              metadata: Optional[Dict[str, str]] = None) -> None:
    """Saves `tensors` at `filename` in the bytes the reference writes, atomically and durably."""
    items, owners = _prepare(tensors, metadata)
    _common.save_items(items, owners, filename, metadata)


def save(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes save_file would write, in memory."""
    items, owners = _prepare(tensors, metadata)
    out = _common.save_bytes(items, metadata)
    del owners
    return out


def load_file(filename: Any, device: Any = "cpu", *, backend: str = "mmap") -> Dict[str, Any]:
    """Every tensor of the file, by name in file order, on `device` (a torch device, its string,
    or an int CUDA index). `backend` ("mmap" or "pread") is accepted as the reference's is; nvio
    reads through its own engine either way."""
    _common.check_backend(backend)
    dev = _common.device_of(device)  # refused before the file is read
    return _common.load_torch(_common.File(filename), dev)


def load(data: bytes) -> Dict[str, Any]:
    """The tensors of safetensors bytes held in memory, by name in file order, as fresh CPU
    tensors."""
    torch = _common._torch()
    data_offset, entries = _common.parse_bytes(data)
    result: Dict[str, Any] = {}
    for name, e in entries.items():
        tdtype, shape = _common.torch_view(e.dtype, e.shape, name)
        t = torch.empty(shape, dtype=tdtype)
        if e.end > e.begin:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # frombuffer warns about read-only bytes
                raw = torch.frombuffer(data, dtype=torch.uint8, count=e.end - e.begin,
                                       offset=data_offset + e.begin)
            t.view(-1).view(torch.uint8).copy_(raw)
        result[name] = t
    return result
