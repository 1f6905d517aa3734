"""nvio.safetensors.numpy: the reference's ``safetensors.numpy`` through nvio — ``save_file``,
``load_file``, ``save`` and ``load`` for numpy arrays, with the same names, arguments and results::

    from nvio.safetensors.numpy import load_file, save_file

The dtypes are the reference's numpy ones (BOOL, U8-U64, I8-I64, F16, F32, F64, C64); a file
holding others (BF16, F8_*, F4, F6_*) still opens, and only reading such a tensor raises
``nvio.InvalidType`` naming it. ``load_file`` reads the data region with one call and returns views
of it in file order; arrays of another byte order are saved little-endian, as the reference does.
numpy is imported on first use.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .. import _args
from . import _common
from ._common import SafetensorError, safe_open

__all__ = ["load_file", "save_file", "load", "save", "safe_open", "SafetensorError"]


def _prepare(tensor_dict: Dict[str, Any],
             metadata: Optional[Dict[str, str]]) -> Tuple[list, list]:
    np = _common._numpy()
    _common.check_names(tensor_dict, "numpy array")
    _common.check_metadata(metadata)
    _, from_np = _common.numpy_tables()
    items, owners = [], []
    for name, a in tensor_dict.items():
        if not isinstance(a, np.ndarray):
            raise _args.InvalidType(
                f"nvio.safetensors: {name!r} is a {type(a).__name__}, not a numpy array")
        little = a.dtype.newbyteorder("<")  # the file's byte order
        if little not in from_np:
            raise _args.InvalidType(
                f"nvio.safetensors: array {name!r} has dtype {a.dtype}, which safetensors' numpy "
                f"module cannot store (its dtypes: {', '.join(sorted(from_np.values()))})")
        a = np.ascontiguousarray(a, dtype=little)
        owners.append(a)
        items.append((name, from_np[little], list(a.shape), a.ctypes.data, a.nbytes))
    return items, owners


def save_file(tensor_dict: Dict[str, Any], filename: Any,
              metadata: Optional[Dict[str, str]] = None) -> None:
    """Saves `tensor_dict` at `filename` in the bytes the reference writes, atomically and
    durably."""
    items, owners = _prepare(tensor_dict, metadata)
    _common.save_items(items, owners, filename, metadata)


def save(tensor_dict: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes save_file would write, in memory."""
    items, owners = _prepare(tensor_dict, metadata)
    out = _common.save_bytes(items, metadata)
    del owners
    return out


def load_file(filename: Any, *, backend: str = "mmap") -> Dict[str, Any]:
    """Every array of the file, by name in file order: views of its data region, read with one
    call. `backend` is accepted as the reference's is (see nvio.safetensors.torch.load_file)."""
    _common.check_backend(backend)
    return _common.File(filename).views("np")


def load(data: bytes) -> Dict[str, Any]:
    """The arrays of safetensors bytes held in memory, by name in file order (fresh copies)."""
    data_offset, entries = _common.parse_bytes(data)
    region = bytearray(memoryview(data)[data_offset:])
    return {name: _common.numpy_from_region(region, e) for name, e in entries.items()}
