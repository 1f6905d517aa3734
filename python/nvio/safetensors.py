"""nvio.safetensors: the safetensors format through nvio, with the names and behaviour of the
reference library's torch module (``safetensors.torch`` and ``safetensors.safe_open``), so that code
switches with an import change::

    from nvio.safetensors import load_file, save_file, safe_open

The header is parsed and validated once, by the C++ core (include/nvio/safetensors.hpp): a
malformed file raises ``nvio.FormatError`` (also a ``ValueError``; ``SafetensorError`` here) naming
the file and the problem. ``load_file`` reads every tensor straight into its own memory with one
read batch (no mmap, no page faults on the file): on the CPU, tensors of 1 MiB or more get locked,
page-aligned memory placed so that O_DIRECT reaches it without a bounce copy. ``save_file`` writes
the header and every tensor with one write batch into a temporary file that replaces ``filename``
atomically (fdatasync, rename, directory fsync): a crash leaves the old file or the new one.

Differences from the reference: non-contiguous tensors are saved as contiguous copies (the reference
refuses them); metadata keys are written sorted (the reference's order varies from run to run).
Tensors that share memory are refused by ``save_file``/``save``, as the reference does.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Dict, List, Optional, Tuple

from . import _args, _nvio
from ._handle import shared_handle

SafetensorError = _nvio.FormatError

__all__ = ["load_file", "save_file", "load", "save", "safe_open", "SafetensorError"]

# Tensors this large or larger get locked memory aligned for O_DIRECT; smaller ones plain memory.
_LOCKED_MIN = 1 << 20
_PAGE = 4096


def _torch():
    import torch

    return torch


@functools.lru_cache(maxsize=None)  # built once: every tensor of every file asks
def _dtype_tables() -> Tuple[Dict[str, Any], Dict[Any, str]]:
    torch = _torch()
    names = {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
        "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
        "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
    }
    # Dtypes of newer torch releases, where this one has them.
    for st_name, attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
                          ("F8_E5M2", "float8_e5m2"), ("F8_E4M3", "float8_e4m3fn")):
        if hasattr(torch, attr):
            names[st_name] = getattr(torch, attr)
    return names, {v: k for k, v in names.items()}


def _to_torch_dtype(name: str, tensor: str) -> Any:
    to_torch, _ = _dtype_tables()
    if name not in to_torch:
        raise _args.InvalidType(
            f"nvio.safetensors: tensor {tensor!r} has dtype {name}, which this torch "
            f"({_torch().__version__}) has no dtype for"
        )
    return to_torch[name]


def _to_st_dtype(dtype: Any, name: str) -> str:
    _, from_torch = _dtype_tables()
    if dtype not in from_torch:
        raise _args.InvalidType(
            f"nvio.safetensors: tensor {name!r} has dtype {dtype}, which safetensors cannot "
            f"store (its dtypes: {', '.join(sorted(from_torch.values()))})"
        )
    return from_torch[dtype]


def _device(device: Any) -> Any:
    torch = _torch()
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


class _Entry:
    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name: str, dtype: str, shape: Tuple[int, ...], begin: int, end: int):
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end


class _File:
    """A parsed header of a file on disk: where each tensor's bytes lie."""

    def __init__(self, filename: Any) -> None:
        self.path = _args.path(filename, "filename")
        self.handle = shared_handle()._core
        self.data_offset, self.data_size, self.meta, entries = _nvio.safetensors_read_header(
            self.handle, self.path)
        self.entries: Dict[str, _Entry] = {e[0]: _Entry(*e) for e in entries}
        self.order = [e[0] for e in entries]

    def entry(self, name: str) -> _Entry:
        try:
            return self.entries[name]
        except KeyError:
            err = SafetensorError(f"nvio.safetensors: '{os.fsdecode(self.path)}' does not contain "
                                  f"tensor {name!r}")
            err.path, err.problem = os.fsdecode(self.path), f"no tensor {name!r}"
            raise err from None

    def empty(self, e: _Entry, device: Any, shape: Optional[Tuple[int, ...]] = None,
              file_offset: Optional[int] = None) -> Any:
        """Uninitialised memory for `shape` (default: the entry's) of the entry's dtype. On the
        CPU, large tensors get locked memory whose address matches `file_offset` modulo the page
        size, so the direct middle of the read needs no bounce copy."""
        torch = _torch()
        dtype = _to_torch_dtype(e.dtype, e.name)
        shape = e.shape if shape is None else shape
        count = 1
        for d in shape:
            count *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = count * itemsize
        if device.type != "cpu" or nbytes < _LOCKED_MIN:
            return torch.empty(shape, dtype=dtype, device=device)
        shift = (self.data_offset + e.begin if file_offset is None else file_offset) % _PAGE
        if shift % itemsize:
            shift = 0
        memory = _nvio.LockedMemory(nbytes + shift)
        return torch.frombuffer(memory, dtype=dtype, count=count, offset=shift).view(shape)

    def read(self, pieces: List[Tuple[Any, int, int]], device: Any) -> None:
        """One read batch: (tensor, file offset, nbytes) each."""
        items = [(t.data_ptr(), n, off, self.path) for t, off, n in pieces if n > 0]
        if items:
            self.handle.read_batch(items, device=device.type == "cuda")


def load_file(filename: Any, device: Any = "cpu") -> Dict[str, Any]:
    """Every tensor of the file, by name (sorted, as the reference's keys()), on `device`, read
    with one batch straight into the tensors' memory."""
    f = _File(filename)
    dev = _device(device)
    result: Dict[str, Any] = {}
    pieces = []
    for name in sorted(f.entries):
        e = f.entries[name]
        t = f.empty(e, dev)
        result[name] = t
        pieces.append((t, f.data_offset + e.begin, e.end - e.begin))
    f.read(pieces, dev)
    return result


class _Slice:
    """A tensor of an open file, read only where indexed (``safe_open(...).get_slice(name)``)."""

    def __init__(self, f: _File, e: _Entry, device: Any) -> None:
        self._f, self._e, self._device = f, e, device

    def get_shape(self) -> List[int]:
        return list(self._e.shape)

    def get_dtype(self) -> str:
        return self._e.dtype

    def __len__(self) -> int:
        if not self._e.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._e.shape[0]

    def __getitem__(self, index: Any) -> Any:
        """The same tensor as indexing the whole tensor, reading only the rows of the first
        dimension that the index touches (all of them for indexes other than an int or a slice
        with a positive step in first place)."""
        shape = self._e.shape
        parts = index if isinstance(index, tuple) else (index,)
        lo, hi, first = 0, (shape[0] if shape else 0), None
        if shape and parts and isinstance(parts[0], int) and not isinstance(parts[0], bool):
            i = parts[0] + shape[0] if parts[0] < 0 else parts[0]
            if not 0 <= i < shape[0]:
                raise IndexError(f"index {parts[0]} is out of bounds for dimension 0 with size "
                                 f"{shape[0]}")
            lo, hi, first = i, i + 1, 0
        elif shape and parts and isinstance(parts[0], slice):
            start, stop, step = parts[0].indices(shape[0])
            if step > 0:
                lo, hi = start, max(start, stop)
                first = slice(0, hi - lo, step)
        if not shape:
            rows = self._read(0, 0, ())
            return rows[index].clone()
        rows = self._read(lo, hi, (hi - lo,) + tuple(shape[1:]))
        view = rows[(first,) + tuple(parts[1:])] if first is not None else rows[index]
        return view.clone() if view.numel() < rows.numel() or not view.is_contiguous() else view

    def _read(self, lo: int, hi: int, shape: Tuple[int, ...]) -> Any:
        """Rows [lo, hi) of dimension 0 (the whole scalar for a 0-d tensor), one read."""
        f, e = self._f, self._e
        row = (e.end - e.begin) // e.shape[0] if e.shape and e.shape[0] else 0
        offset = f.data_offset + e.begin + lo * row
        t = f.empty(e, self._device, shape, offset)
        f.read([(t, offset, (hi - lo) * row if e.shape else e.end - e.begin)], self._device)
        return t


class safe_open:
    """``with safe_open(path, framework="pt", device="cpu") as f:`` — the reference's reader:
    ``keys()`` (sorted), ``offset_keys()`` (file order), ``get_tensor(name)``, ``get_slice(name)``,
    ``metadata()``. Only the torch framework ("pt") is offered."""

    def __init__(self, filename: Any, framework: str = "pt", device: Any = "cpu") -> None:
        if framework not in ("pt", "torch", "pytorch"):
            raise _nvio.InvalidArgument(
                f"nvio.safetensors: framework {framework!r} is not supported; use 'pt'")
        self._device = _device(device)
        self._f = _File(filename)

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def keys(self) -> List[str]:
        return sorted(self._f.entries)

    def offset_keys(self) -> List[str]:
        return sorted(self._f.entries, key=lambda n: (self._f.entries[n].begin,
                                                      self._f.entries[n].end))

    def metadata(self) -> Optional[Dict[str, str]]:
        return None if self._f.meta is None else dict(self._f.meta)

    def get_tensor(self, name: str) -> Any:
        e = self._f.entry(name)
        t = self._f.empty(e, self._device)
        self._f.read([(t, self._f.data_offset + e.begin, e.end - e.begin)], self._device)
        return t

    def get_slice(self, name: str) -> _Slice:
        return _Slice(self._f, self._f.entry(name), self._device)


def _prepare(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]]) -> Tuple[list, list]:
    """Checks the tensors as the reference does and returns the core's items (name, dtype, shape,
    address, nbytes) and the tensors that back them (kept alive by the caller)."""
    torch = _torch()
    if not isinstance(tensors, dict):
        raise _args.InvalidType(
            f"nvio.safetensors: tensors must be a dict of name -> tensor, got "
            f"{type(tensors).__name__}")
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise _args.InvalidType("nvio.safetensors: metadata must be a dict of str -> str")
    by_storage: Dict[Tuple[str, int], List[str]] = {}
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise _args.InvalidType(f"nvio.safetensors: tensor names must be str, got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise _args.InvalidType(
                f"nvio.safetensors: {name!r} is a {type(t).__name__}, not a torch tensor")
        if t.layout != torch.strided:
            raise _nvio.InvalidArgument(
                f"nvio.safetensors: tensor {name!r} is {t.layout}; only dense tensors can be "
                "saved (call .to_dense())")
        storage = t.storage()
        if storage.size() > 0:
            by_storage.setdefault((str(t.device), storage.data_ptr()), []).append(name)
    shared = [names for names in by_storage.values() if len(names) > 1]
    if shared:
        raise RuntimeError(
            f"nvio.safetensors: some tensors share memory, which safetensors cannot express "
            f"(each would be stored as a copy, and loaded as separate tensors): {shared}. Save "
            "one tensor per storage (e.g. clone() the others) and rebuild the sharing on load.")
    items, owners = [], []
    for name, t in tensors.items():
        dtype = _to_st_dtype(t.dtype, name)
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        owners.append(t)
        items.append((name, dtype, list(t.shape), t.data_ptr(), t.numel() * t.element_size()))
    return items, owners


def save_file(tensors: Dict[str, Any], filename: Any,
              metadata: Optional[Dict[str, str]] = None) -> None:
    """Saves `tensors` at `filename` in the bytes the reference writes, atomically and durably."""
    items, owners = _prepare(tensors, metadata)
    path = _args.path(filename, "filename")
    _nvio.safetensors_save(shared_handle()._core, path, items, metadata, sync=True)
    del owners


def save(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes save_file would write, in memory."""
    torch = _torch()
    items, owners = _prepare(tensors, metadata)
    header, order, begins = _nvio.safetensors_header(items, metadata)
    total = len(header) + sum(item[4] for item in items)
    out = torch.empty(total, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # frombuffer warns about read-only bytes
        out[:len(header)] = torch.frombuffer(header, dtype=torch.uint8)
    for index, begin in zip(order, begins):
        t = owners[index]
        n = items[index][4]
        if n:
            start = len(header) + begin
            out[start:start + n] = t.reshape(-1).view(torch.uint8)
    return bytes(out.numpy())


def load(data: bytes) -> Dict[str, Any]:
    """The tensors of safetensors bytes held in memory, by name (sorted), as fresh CPU tensors."""
    torch = _torch()
    data_offset, _, _, entries = _nvio.safetensors_parse(data, "<bytes>")
    result: Dict[str, Any] = {}
    for name, dtype, shape, begin, end in sorted(entries):
        tdtype = _to_torch_dtype(dtype, name)
        if end == begin:
            result[name] = torch.empty(shape, dtype=tdtype)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            raw = torch.frombuffer(data, dtype=torch.uint8, count=end - begin,
                                   offset=data_offset + begin)
        result[name] = raw.clone().view(tdtype).reshape(shape)
    return result
