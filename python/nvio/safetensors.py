"""nvio.safetensors: the safetensors format through nvio, with the names and behaviour of the
reference library's torch module (``safetensors.torch`` and ``safetensors.safe_open``), so that code
switches with an import change::

    from nvio.safetensors import load_file, save_file, safe_open

The header is parsed and validated once, by the C++ core (include/nvio/safetensors.hpp): a
malformed file raises ``nvio.FormatError`` (also a ``ValueError``; ``SafetensorError`` here) naming
the file and the problem. ``load_file`` on the CPU reads the whole data region with one parallel
O_DIRECT call (no mmap of the file, no page faults on it) into fresh memory placed like the file,
and every tensor is a view of its bytes there: no copy, and the memory is freed with the last of
the tensors (unlike the reference, whose tensors each own a copy; a tensor kept alone keeps the
region alive). On a GPU one read batch fills tensors allocated on the device. ``save_file`` writes
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

from . import _args, _buffers, _landing, _nvio
from ._handle import shared_handle

SafetensorError = _nvio.FormatError

__all__ = ["load_file", "save_file", "load", "save", "safe_open", "SafetensorError"]

# A tensor read on its own (safe_open) this large or larger lands in fresh memory placed for
# O_DIRECT (_landing); smaller ones in a plain tensor, whose edges go through the page cache.
_REGION_MIN = 1 << 20


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


@functools.lru_cache(maxsize=None)  # asked for every tensor a load places
def _itemsize(dtype: Any) -> int:
    return _torch().empty((), dtype=dtype).element_size()


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
    """The torch device tensors are loaded on: the CPU or a CUDA device (an int is a CUDA index,
    as in the reference); any other is refused here, before a file is read."""
    torch = _torch()
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise _args.InvalidType(f"nvio.safetensors: device {device!r} is not a device ({e})") \
            from None
    if dev.type not in ("cpu", "cuda"):
        raise _nvio.InvalidArgument(f"nvio.safetensors: tensors load on the CPU or a CUDA device, "
                                    f"not {dev.type!r}")
    return dev


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

    def tensor(self, e: _Entry, device: Any, shape: Optional[Tuple[int, ...]] = None,
               file_offset: Optional[int] = None) -> Any:
        """The entry's bytes from `file_offset` on (default: its start) as a tensor of `shape`
        (default: the entry's) and its dtype on `device`, read with one call. On the CPU, tensors
        of _REGION_MIN bytes or more land in fresh memory placed like the file (see _landing), so
        the read needs no bounce copy; others are plain tensors the read fills."""
        torch = _torch()
        dtype = _to_torch_dtype(e.dtype, e.name)
        shape = e.shape if shape is None else shape
        offset = self.data_offset + e.begin if file_offset is None else file_offset
        itemsize = _itemsize(dtype)
        count = 1
        for d in shape:
            count *= d
        nbytes = count * itemsize
        if device.type == "cpu" and nbytes >= _REGION_MIN and offset % itemsize == 0:
            region = _landing.read_region(shared_handle(), self.path, offset, nbytes)
            return torch.frombuffer(region, dtype=dtype, count=count).view(shape)
        t = torch.empty(shape, dtype=dtype, device=device)
        if nbytes:
            self.handle.read_batch([(t.data_ptr(), nbytes, offset, self.path)],
                                   device=device.type == "cuda")
        return t

    def views(self) -> Dict[str, Any]:
        """Every tensor on the CPU, by name (sorted): the whole data region is read with one call
        into fresh memory placed like the file, and each tensor is a view of its bytes there (no
        copy). A tensor whose bytes are not aligned to its element size in the file (possible only
        in a file the reference did not write) gets a copy, so every tensor is aligned."""
        torch = _torch()
        region = _landing.read_region(shared_handle(), self.path, self.data_offset,
                                      self.data_size, whole_file=True)
        out: Dict[str, Any] = {}
        for name in sorted(self.entries):
            e = self.entries[name]
            dtype = _to_torch_dtype(e.dtype, e.name)
            itemsize = _itemsize(dtype)
            nbytes = e.end - e.begin
            if nbytes == 0:
                out[name] = torch.empty(e.shape, dtype=dtype)
                continue
            count = nbytes // itemsize
            if (self.data_offset + e.begin) % itemsize == 0:
                t = torch.frombuffer(region, dtype=dtype, count=count, offset=e.begin)
            else:
                t = torch.empty(count, dtype=dtype)
                t.view(torch.uint8).copy_(
                    torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=e.begin))
            out[name] = t.view(e.shape)
        return out


def load_file(filename: Any, device: Any = "cpu") -> Dict[str, Any]:
    """Every tensor of the file, by name (sorted, as the reference's keys()), on `device`.

    On the CPU the file's data region is read with one parallel call into fresh memory and the
    tensors are views of it: the memory is freed when the last of them is. Elsewhere each tensor is
    allocated on the device and one read batch fills them all."""
    f = _File(filename)
    dev = _device(device)
    if dev.type == "cpu":
        return f.views()
    result: Dict[str, Any] = {}
    items = []
    for name in sorted(f.entries):
        e = f.entries[name]
        t = _torch().empty(e.shape, dtype=_to_torch_dtype(e.dtype, e.name), device=dev)
        result[name] = t
        if e.end > e.begin:
            items.append((t.data_ptr(), e.end - e.begin, f.data_offset + e.begin, f.path))
    if items:
        f.handle.read_batch(items, device=dev.type == "cuda")
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
        return f.tensor(e, self._device, shape, f.data_offset + e.begin + lo * row)


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
        return self._f.tensor(self._f.entry(name), self._device)

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
        for k, v in metadata.items():
            _args.utf8(k, "a metadata key")
            _args.utf8(v, f"metadata {k!r}")
    by_storage: Dict[Tuple[str, int], List[str]] = {}
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise _args.InvalidType(f"nvio.safetensors: tensor names must be str, got {name!r}")
        _args.utf8(name, "a tensor name")
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
        dtype = _to_st_dtype(t.dtype, name)
        if t.device.type != "cpu":
            t = t.cpu()
        # A lazily conjugated or negated view's memory holds the values before the conj() or
        # negation: resolved, the file holds the values the tensor shows.
        t = t.resolve_conj().resolve_neg().contiguous()
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
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _args.InvalidType(f"nvio.safetensors.load: data must be bytes, got "
                                f"{type(data).__name__} (load_file reads a file)")
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
