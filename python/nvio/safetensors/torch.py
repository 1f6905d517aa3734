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
``save_model`` / ``load_model`` store tensors that share memory (tied weights) once, as the
reference's do. Differences from the reference: non-contiguous tensors are saved as contiguous
copies (the reference refuses them); metadata keys are written sorted (the reference's order varies
from run to run). Tensors whose bytes overlap are refused by save_file and save, as the reference
does (views side by side in one storage are not). torch is imported on first use.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

from .. import _args, _buffers, _nvio
from . import _common
from ._common import SafetensorError, safe_open

__all__ = ["load_file", "save_file", "load", "save", "safe_open", "save_model", "load_model",
           "SafetensorError"]


def _span(t: Any) -> Tuple[int, int]:
    """The bytes [start, end) of its storage that tensor `t` reaches."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _shared_groups(tensors: Dict[str, Any]) -> List[List[str]]:
    """Names of tensors whose bytes overlap, in groups of two or more, as the reference finds
    them: tensors of one storage that do not overlap (slices side by side) are not shared."""
    by_storage: Dict[Tuple[str, int], List[str]] = {}
    for name, t in tensors.items():
        if t.device.type == "meta" or t.numel() == 0:
            continue
        storage = _buffers.untyped_storage(t)
        if storage.nbytes() > 0:
            by_storage.setdefault((str(t.device), storage.data_ptr()), []).append(name)
    groups = []
    for names in by_storage.values():
        if len(names) < 2:
            continue
        areas = sorted((_span(tensors[n]), n) for n in names)
        current, stop = [areas[0][1]], areas[0][0][1]
        for (start, end), name in areas[1:]:
            if start < stop:
                current.append(name)
                stop = max(stop, end)
            else:
                groups.append(current)
                current, stop = [name], end
        groups.append(current)
    return [sorted(g) for g in groups if len(g) > 1]


def _is_complete(t: Any) -> bool:
    storage = _buffers.untyped_storage(t)
    return t.data_ptr() == storage.data_ptr() and t.numel() * t.element_size() == storage.nbytes()


def _duplicates(state_dict: Dict[str, Any], preferred: Any = ()) -> Dict[str, str]:
    """For each group of tensors sharing memory: every name but the one kept -> the kept name.
    The kept one covers its whole storage (the first such name, sorted; one of `preferred` where
    there is one); a group where none does is refused."""
    preferred = set(preferred)
    removed: Dict[str, str] = {}
    for group in _shared_groups(state_dict):
        complete = [n for n in group if _is_complete(state_dict[n])]
        if not complete:
            raise RuntimeError(
                f"nvio.safetensors: tensors {group} share memory and none of them covers all of "
                "it: saving one of them would lose the others' bytes or store more than needed")
        keep = ([n for n in complete if n in preferred] or complete)[0]
        for name in group:
            if name != keep:
                removed[name] = keep
    return removed


def _prepare(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]]) -> Tuple[list, list]:
    """Checks the tensors as the reference does and returns the core's items (name, dtype, shape,
    address, nbytes) and the tensors that back them (kept alive by the caller)."""
    torch = _common._torch()
    _common.check_names(tensors, "torch tensor")
    _common.check_metadata(metadata)
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise _args.InvalidType(
                f"nvio.safetensors: {name!r} is a {type(t).__name__}, not a torch tensor")
        if t.layout != torch.strided:
            raise _nvio.InvalidArgument(
                f"nvio.safetensors: tensor {name!r} is {t.layout}; only dense tensors can be "
                "saved (call .to_dense())")
    shared = _shared_groups(tensors)
    if shared:
        raise RuntimeError(
            f"nvio.safetensors: some tensors share memory, which safetensors cannot express "
            f"(each would be stored as a copy, and loaded as separate tensors): {shared}. Save "
            "one tensor per storage (e.g. clone() the others, or use save_model) and rebuild the "
            "sharing on load.")
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


def save_model(model: Any, filename: Any, metadata: Optional[Dict[str, str]] = None,
               force_contiguous: bool = True) -> None:
    """Saves `model.state_dict()` with tensors that share memory (tied weights) stored once: of
    each group the name covering the whole storage is kept, and every other name is recorded in
    the metadata as ``{removed: kept}`` (unless the caller's metadata has that key)."""
    state_dict = dict(model.state_dict())
    for name, keep in _duplicates(state_dict).items():
        metadata = {} if metadata is None else metadata
        metadata.setdefault(name, keep)
        del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    save_file(state_dict, filename, metadata=metadata)


def load_model(model: Any, filename: Any, strict: bool = True, device: Any = "cpu", *,
               backend: str = "mmap") -> Tuple[Any, List[str]]:
    """Loads the file into `model` (its tensors that share memory restored through the one that
    was saved). Returns (missing, unexpected): names of the model the file did not set, names of
    the file the model has no place for; with `strict` either raises RuntimeError."""
    state_dict = load_file(filename, device=device, backend=backend)
    removed = _duplicates(model.state_dict(), preferred=state_dict.keys())
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for name in removed:
        if name in missing:
            missing.remove(name)
        else:
            unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected
