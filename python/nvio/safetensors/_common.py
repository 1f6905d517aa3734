"""What nvio.safetensors' framework modules share: the dtype tables, a parsed file (where each
tensor's bytes lie), reading tensors as torch tensors or numpy arrays, and ``safe_open``.

The header is parsed and validated once, by the C++ core (include/nvio/safetensors.hpp), which
knows every dtype of the reference (safetensors 0.8.0). A dtype the framework has no type for (F6_*
in torch; BF16, F8_* and F4 in numpy) does not stop a file from opening: only reading that tensor
raises ``nvio.InvalidType`` naming it.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any, Dict, List, Optional, Tuple

from .. import _args, _landing, _nvio
from .._handle import shared_handle

SafetensorError = _nvio.FormatError

# A tensor read on its own (safe_open) this large or larger lands in fresh memory placed for
# O_DIRECT (_landing); smaller ones in a plain tensor, whose edges go through the page cache.
_REGION_MIN = 1 << 20

# F4 holds two values per byte; torch's float4_e2m1fn_x2 is one byte per element, so its shape is
# the file's with the last dimension halved (the reference does the same).
_PACKED = {"F4": 2}


def _torch():
    import torch

    return torch


def _numpy():
    import numpy

    return numpy


@functools.lru_cache(maxsize=None)  # built once: every tensor of every file asks
def torch_tables() -> Tuple[Dict[str, Any], Dict[Any, str]]:
    """safetensors dtype name -> torch dtype, and back, for the dtypes this torch has."""
    torch = _torch()
    names = {}
    for st_name, attr in (
            ("F64", "float64"), ("F32", "float32"), ("F16", "float16"), ("BF16", "bfloat16"),
            ("I64", "int64"), ("I32", "int32"), ("I16", "int16"), ("I8", "int8"),
            ("U8", "uint8"), ("BOOL", "bool"), ("C64", "complex64"),
            # Newer torch releases' dtypes, where this one has them.
            ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
            ("F8_E5M2", "float8_e5m2"), ("F8_E4M3", "float8_e4m3fn"),
            ("F8_E5M2FNUZ", "float8_e5m2fnuz"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
            ("F8_E8M0", "float8_e8m0fnu"), ("F4", "float4_e2m1fn_x2")):
        if hasattr(torch, attr):
            names[st_name] = getattr(torch, attr)
    return names, {v: k for k, v in names.items()}


@functools.lru_cache(maxsize=None)
def numpy_tables() -> Tuple[Dict[str, Any], Dict[Any, str]]:
    """safetensors dtype name -> numpy dtype, and back (the reference's numpy module's list)."""
    np = _numpy()
    names = {
        "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
        "U64": np.uint64, "I32": np.int32, "U32": np.uint32, "I16": np.int16, "U16": np.uint16,
        "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_, "C64": np.complex64,
    }
    names = {k: np.dtype(v) for k, v in names.items()}
    return names, {v: k for k, v in names.items()}


@functools.lru_cache(maxsize=None)  # asked for every tensor a load places
def _itemsize(dtype: Any) -> int:
    return _torch().empty((), dtype=dtype).element_size()


def unmapped(dtype: str, tensor: str, framework: str) -> Exception:
    return _args.InvalidType(
        f"nvio.safetensors: tensor {tensor!r} has dtype {dtype}, which {framework} has no dtype "
        f"for; the file's other tensors can still be read")


def torch_view(dtype: str, shape: Tuple[int, ...], tensor: str) -> Tuple[Any, Tuple[int, ...]]:
    """The torch dtype and shape of a tensor stored as `dtype` and `shape`; InvalidType naming
    the tensor when this torch cannot represent it."""
    to_torch, _ = torch_tables()
    if dtype not in to_torch:
        raise unmapped(dtype, tensor, f"this torch ({_torch().__version__})")
    pack = _PACKED.get(dtype)
    if pack:
        if not shape or shape[-1] % pack:
            raise _args.InvalidType(
                f"nvio.safetensors: tensor {tensor!r} of {dtype} has shape {list(shape)}, whose "
                f"last dimension is not a multiple of {pack}: torch holds {pack} values per byte")
        shape = tuple(shape[:-1]) + (shape[-1] // pack,)
    return to_torch[dtype], shape


def st_dtype_of_torch(dtype: Any, name: str) -> str:
    _, from_torch = torch_tables()
    if dtype not in from_torch:
        raise _args.InvalidType(
            f"nvio.safetensors: tensor {name!r} has dtype {dtype}, which safetensors cannot "
            f"store (its dtypes: {', '.join(sorted(from_torch.values()))})")
    return from_torch[dtype]


def device_of(device: Any) -> Any:
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


class Entry:
    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name: str, dtype: str, shape: Tuple[int, ...], begin: int, end: int):
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end


def entries_of(raw: List[tuple]) -> Dict[str, Entry]:
    """The core's header entries by name, in file (header) order."""
    return {e[0]: Entry(*e) for e in raw}


def torch_from_region(region: Any, data_offset: int, e: Entry) -> Any:
    """Tensor `e` as a view of `region` (the data region's bytes): no copy, unless its bytes are
    not aligned to its element size in the file (possible only in a file the reference did not
    write), which gets a copy so that every tensor is aligned."""
    torch = _torch()
    dtype, shape = torch_view(e.dtype, e.shape, e.name)
    nbytes = e.end - e.begin
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    itemsize = _itemsize(dtype)
    count = nbytes // itemsize
    if (data_offset + e.begin) % itemsize == 0:
        t = torch.frombuffer(region, dtype=dtype, count=count, offset=e.begin)
    else:
        t = torch.empty(count, dtype=dtype)
        t.view(torch.uint8).copy_(
            torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=e.begin))
    return t.view(shape)


def numpy_from_region(region: Any, e: Entry) -> Any:
    """Array `e` as a view of `region` (numpy accepts any alignment)."""
    np = _numpy()
    to_np, _ = numpy_tables()
    if e.dtype not in to_np:
        raise unmapped(e.dtype, e.name, "numpy")
    dtype = to_np[e.dtype]
    count = (e.end - e.begin) // dtype.itemsize
    return np.frombuffer(region, dtype=dtype, count=count, offset=e.begin).reshape(e.shape)


class File:
    """A parsed header of a file on disk: where each tensor's bytes lie."""

    def __init__(self, filename: Any) -> None:
        self.path = _args.path(filename, "filename")
        self.handle = shared_handle()._core
        self.data_offset, self.data_size, self.meta, raw = _nvio.safetensors_read_header(
            self.handle, self.path)
        self.entries = entries_of(raw)
        # The temporaries killed saves of this file left (jobs/replace_file), as nvio.load does.
        _nvio.remove_stale_temporaries(self.path)

    def entry(self, name: str) -> Entry:
        try:
            return self.entries[name]
        except KeyError:
            err = SafetensorError(f"nvio.safetensors: '{os.fsdecode(self.path)}' does not contain "
                                  f"tensor {name!r}")
            err.path, err.problem = os.fsdecode(self.path), f"no tensor {name!r}"
            raise err from None

    def region(self) -> Any:
        """The whole data region, read with one parallel call into fresh memory placed like the
        file (see _landing)."""
        return _landing.read_region(shared_handle(), self.path, self.data_offset, self.data_size,
                                    whole_file=True)

    def tensor(self, e: Entry, device: Any, shape: Optional[Tuple[int, ...]] = None,
               file_offset: Optional[int] = None) -> Any:
        """The entry's bytes from `file_offset` on (default: its start) as a tensor of `shape`
        (default: the entry's) and its dtype on `device`, read with one call. On the CPU, tensors
        of _REGION_MIN bytes or more land in fresh memory placed like the file (see _landing), so
        the read needs no bounce copy; others are plain tensors the read fills."""
        torch = _torch()
        dtype, full = torch_view(e.dtype, e.shape, e.name)
        shape = full if shape is None else shape
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
            self.handle.read_batch([(t.data_ptr(), nbytes, offset, self.path,
                                    device.type == "cuda")])
        return t

    def array(self, e: Entry, lo: int = 0, hi: Optional[int] = None) -> Any:
        """Rows [lo, hi) of dimension 0 of the entry as a fresh numpy array (all of it by
        default), one read."""
        np = _numpy()
        to_np, _ = numpy_tables()
        if e.dtype not in to_np:
            raise unmapped(e.dtype, e.name, "numpy")
        shape = tuple(e.shape)
        row = (e.end - e.begin) // shape[0] if shape and shape[0] else 0
        if shape:
            hi = shape[0] if hi is None else hi
            shape = (hi - lo,) + shape[1:]
        out = np.empty(shape, dtype=to_np[e.dtype])
        if out.nbytes:
            self.handle.read_batch([(out.ctypes.data, out.nbytes,
                                     self.data_offset + e.begin + lo * row, self.path, False)])
        return out

    def views(self, framework: str = "pt") -> Dict[str, Any]:
        """Every tensor on the CPU, by name in file order: the whole data region is read with one
        call into fresh memory, and each tensor is a view of its bytes there (no copy)."""
        region = self.region()
        if framework == "np":
            return {name: numpy_from_region(region, e) for name, e in self.entries.items()}
        return {name: torch_from_region(region, self.data_offset, e)
                for name, e in self.entries.items()}


def load_torch(f: File, device: Any) -> Dict[str, Any]:
    """Every tensor of `f` on `device`, in file order: views of one region on the CPU, else
    tensors allocated on the device that one read batch fills."""
    dev = device_of(device)
    if dev.type == "cpu":
        return f.views("pt")
    result: Dict[str, Any] = {}
    items = []
    for name, e in f.entries.items():
        dtype, shape = torch_view(e.dtype, e.shape, e.name)
        t = _torch().empty(shape, dtype=dtype, device=dev)
        result[name] = t
        if e.end > e.begin:
            items.append((t.data_ptr(), e.end - e.begin, f.data_offset + e.begin, f.path,
                          dev.type == "cuda"))
    if items:
        f.handle.read_batch(items)
    return result


def first_rows(index: Any, shape: Tuple[int, ...]) -> Tuple[int, int, Any, tuple]:
    """For `index` into a tensor of `shape`: the rows [lo, hi) of dimension 0 it touches, the
    index into those rows that replaces its first part (None: use `index` on all rows), and the
    index's parts."""
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
    return lo, hi, first, parts


class _Slice:
    """A tensor of an open file, read only where indexed (``safe_open(...).get_slice(name)``)."""

    def __init__(self, f: File, e: Entry, device: Any, framework: str) -> None:
        self._f, self._e, self._device, self._framework = f, e, device, framework

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
        with a positive step in first place, and for packed F4)."""
        shape = tuple(self._e.shape)
        if self._e.dtype in _PACKED or not shape:
            whole = self._read(0, shape[0] if shape else 0)
            view = whole[index]
            return view.copy() if self._framework == "np" else view.clone()
        lo, hi, first, parts = first_rows(index, shape)
        rows = self._read(lo, hi)
        view = rows[(first,) + tuple(parts[1:])] if first is not None else rows[index]
        if self._framework == "np":
            return view.copy() if view.base is not None and view.size < rows.size else view
        return view.clone() if view.numel() < rows.numel() or not view.is_contiguous() else view

    def _read(self, lo: int, hi: int) -> Any:
        """Rows [lo, hi) of dimension 0 (the whole tensor for a 0-d one or packed F4), one read."""
        f, e = self._f, self._e
        if self._framework == "np":
            return f.array(e, lo, hi)
        if e.dtype in _PACKED or not e.shape:
            return f.tensor(e, self._device)
        row = (e.end - e.begin) // e.shape[0] if e.shape[0] else 0
        shape = (hi - lo,) + tuple(e.shape[1:])
        return f.tensor(e, self._device, shape, f.data_offset + e.begin + lo * row)


def check_backend(backend: Any) -> None:
    """The reference's `backend` argument ("mmap" or "pread"), accepted for compatibility: nvio
    reads through its own engine either way."""
    if backend not in ("mmap", "pread"):
        raise _nvio.InvalidArgument(
            f"nvio.safetensors: backend {backend!r} is not one of 'mmap', 'pread'")


_FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "np", "numpy": "np"}


class safe_open:
    """``with safe_open(path, framework="pt", device="cpu") as f:`` — the reference's reader:
    ``keys()`` (sorted), ``offset_keys()`` (file order), ``get_tensor(name)``, ``get_tensors()``
    (file order), ``get_slice(name)`` (Python indexing, reading only the rows it needs),
    ``metadata()``. Frameworks "pt" (torch tensors, on `device`) and "np" (numpy arrays, CPU)."""

    def __init__(self, filename: Any, framework: str = "pt", device: Any = "cpu", *,
                 backend: str = "mmap") -> None:
        check_backend(backend)
        if framework not in _FRAMEWORKS:
            raise _nvio.InvalidArgument(
                f"nvio.safetensors: framework {framework!r} is not supported; use 'pt' or 'np'")
        self._framework = _FRAMEWORKS[framework]
        if self._framework == "np":
            if device not in ("cpu", None):
                raise _nvio.InvalidArgument(
                    f"nvio.safetensors: numpy arrays live on the CPU, not {device!r}")
            self._device = None
        else:
            self._device = device_of(device)
        self._f = File(filename)

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
        if self._framework == "np":
            return self._f.array(e)
        return self._f.tensor(e, self._device)

    def get_tensors(self) -> Dict[str, Any]:
        if self._framework == "np":
            return self._f.views("np")
        return load_torch(self._f, self._device)

    def get_slice(self, name: str) -> _Slice:
        return _Slice(self._f, self._f.entry(name), self._device, self._framework)


def check_metadata(metadata: Optional[Dict[str, str]]) -> None:
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise _args.InvalidType("nvio.safetensors: metadata must be a dict of str -> str")
        for k, v in metadata.items():
            _args.utf8(k, "a metadata key")
            _args.utf8(v, f"metadata {k!r}")


def check_names(tensors: Any, kind: str) -> None:
    if not isinstance(tensors, dict):
        raise _args.InvalidType(
            f"nvio.safetensors: tensors must be a dict of name -> {kind}, got "
            f"{type(tensors).__name__}")
    for name in tensors:
        if not isinstance(name, str):
            raise _args.InvalidType(f"nvio.safetensors: tensor names must be str, got {name!r}")
        _args.utf8(name, "a tensor name")


def save_items(items: list, owners: list, filename: Any,
               metadata: Optional[Dict[str, str]]) -> None:
    """Writes the core's items (name, dtype, shape, address, nbytes) at `filename`, atomically
    and durably; `owners` keep their memory alive until then."""
    path = _args.path(filename, "filename")
    _nvio.safetensors_save(shared_handle()._core, path, items, metadata, sync=True)
    del owners


def save_bytes(items: list, metadata: Optional[Dict[str, str]]) -> bytes:
    """The bytes save_items would write, in memory (the caller keeps the items' memory alive)."""
    header, order, begins = _nvio.safetensors_header(items, metadata)
    out = bytearray(len(header) + sum(item[4] for item in items))
    out[:len(header)] = header
    for index, begin in zip(order, begins):
        n = items[index][4]
        if n:
            start = len(header) + begin
            out[start:start + n] = ctypes.string_at(items[index][3], n)
    return bytes(out)


def parse_bytes(data: Any) -> Tuple[int, Dict[str, Entry]]:
    """The data offset and entries (file order) of safetensors bytes held in memory."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _args.InvalidType(f"nvio.safetensors.load: data must be bytes, got "
                                f"{type(data).__name__} (load_file reads a file)")
    data_offset, _, _, raw = _nvio.safetensors_parse(data, "<bytes>")
    return data_offset, entries_of(raw)
