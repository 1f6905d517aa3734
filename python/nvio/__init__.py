"""nvio: tensors between memory and NVMe files at the speed of the device.

Two APIs over one core:

* ``nvio.Handle``: ``read`` / ``write`` / ``read_async`` / ``write_async`` of any CPU torch tensor,
  numpy array or buffer, by path or file descriptor, at any offset and size.
  ``read_batch`` / ``write_batch`` (and ``_async``) move many buffers at their offsets as one
  operation with one future.
* ``nvio.save(obj, path)`` / ``nvio.load(path)``: torch checkpoints (the ``torch.save`` format),
  written atomically and durably, read with one parallel read (checkpoint.py).
* ``nvio.dcp``: storage writer and reader for ``torch.distributed.checkpoint`` (DCP's own files,
  sharded and resharded over ranks; ``import nvio.dcp``).
* ``nvio.tune(dir)``: finds the fastest options for a drive within a time budget; with
  ``save=True`` they become the default of every handle (``nvio.Handle()``).
* ``nvio.TensorSwapper(dir, budget_bytes)``: named tensors swapped out to NVMe and back under a
  memory budget in bytes (write-behind futures, prefetch batches, checksums, snapshots).
* ``nvio.StripedHandle(dirs)``: files striped over several drives, read and written on all of them
  at once, with per-drive throughput.
* ``nvio.aio_handle``: a drop-in for DeepSpeed's DeepNVMe ``aio_handle`` (and
  ``nvio.deepspeed.AsyncIOBuilder`` for a one-line import change).

Every blocking call releases the GIL. Errors are Python exceptions that are also the matching
built-in (``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError``, ``OSError`` with errno,
``ValueError`` / ``TypeError`` for bad arguments), all rooted in ``nvio.Error``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from . import _nvio
from ._args import InvalidType
from ._aio import ValidationError, aio_handle, aio_read, aio_write
from ._future import Future
from ._handle import Handle
from ._tune import TuneResult, tune
from .checkpoint import CheckpointFormatError, UnsafeCheckpointError, load, save
from ._nvio import (
    EngineUnavailable,
    Error,
    FileNotFound,
    FormatError,
    InvalidArgument,
    IOFailure,
    IsADirectory,
    LockedMemoryError,
    NoSpace,
    PermissionDenied,
    ReadOnlyFileSystem,
    ShortFile,
)

__version__ = _nvio.__version__

# ---- GPU ----------------------------------------------------------------------------
from ._aio import gds_handle  # noqa: E402
from ._nvio import GpuError  # noqa: E402


def gpu_info() -> "dict[str, Any]":
    """What this machine offers for CUDA memory: the driver (loaded, path, reason, version), the
    runtime version, the devices, cuFile, and the GPUDirect Storage mode ("p2p", "compatibility"
    or "unavailable") with its reason. Probed once per process; never raises."""
    return _nvio.gpu_info()


# ---- end GPU --------------------------------------------------------------------------------

__all__ = [
    "Handle", "Future", "aio_handle", "aio_read", "aio_write", "empty_locked", "is_pinned",
    "report", "tune", "TuneResult", "Error", "InvalidArgument", "InvalidType", "EngineUnavailable",
    "LockedMemoryError", "IOFailure", "FileNotFound", "PermissionDenied", "ReadOnlyFileSystem",
    "IsADirectory", "NoSpace", "ShortFile", "ValidationError", "save", "load",
    "CheckpointFormatError", "UnsafeCheckpointError", "evict", "page_cache",
    "__version__",
]
__all__ += ["gds_handle", "gpu_info", "GpuError"]

# ---- safetensors: nvio.safetensors.load_file / save_file / safe_open ---------------
from . import safetensors  # noqa: E402  (imports torch only when used)

__all__ += ["FormatError", "safetensors"]

# ---- sharded checkpoints over torch.distributed --------------------------------------
from .sharded import load_sharded, save_sharded  # noqa: E402  (imports torch only when used)

__all__ += ["save_sharded", "load_sharded"]

# ---- tensor swapper ------------------------------------------------------------------
from ._nvio import BudgetExceeded, ChecksumMismatch, DirectoryLocked  # noqa: E402
from .swapper import TensorSwapper  # noqa: E402  (imports torch only when used)

__all__ += ["TensorSwapper", "BudgetExceeded", "ChecksumMismatch", "DirectoryLocked"]

# ---- several drives -----------------------------------------------------------------
from .stripe import StripedHandle  # noqa: E402

__all__ += ["StripedHandle"]

# An opened file: many small operations on one file without a statx each.
from ._file import File  # noqa: E402
from ._nvio import FileBusy  # noqa: E402

__all__ += ["File", "FileBusy"]


def _is_torch_dtype(dtype: Any) -> bool:
    return type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype"


def empty_locked(shape: Union[int, Sequence[int]], dtype: Any = None):
    """An uninitialised, page-aligned, locked (when RLIMIT_MEMLOCK allows) CPU buffer.

    ``shape`` is an element count or a shape (a sequence of counts), each an integer: a string,
    a float or a bool is refused (``nvio.InvalidType``), never reinterpreted. A torch dtype gives a
    torch tensor, anything numpy understands gives a numpy array; ``None`` means ``torch.uint8``
    when torch is importable, else ``numpy.uint8``. Views of it count as pinned for ``is_pinned``.
    """
    return _empty_locked_owned(shape, dtype)[0]


def _empty_locked_owned(shape: Any, dtype: Any) -> "tuple[Any, Optional[Any]]":
    """``empty_locked`` and the ``LockedMemory`` that owns its memory (None for no elements), for
    callers that keep the memory alive without keeping the tensor object (nvio.deepspeed)."""
    from . import _args

    if isinstance(shape, (str, bytes)):
        raise InvalidType(f"empty_locked: shape must be an integer or a sequence of integers, "
                          f"got {type(shape).__name__} {shape!r}")
    try:
        dims = (_args.integer(shape, "shape"),)
    except InvalidType:
        try:
            items = tuple(shape)
        except TypeError:
            raise InvalidType(f"empty_locked: shape must be an integer or a sequence of "
                              f"integers, got {type(shape).__name__}") from None
        dims = tuple(_args.integer(d, "shape") for d in items)
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"empty_locked: negative dimension in shape {dims}")
    count = 1
    for d in dims:
        count *= d
    if dtype is None:
        try:
            import torch

            dtype = torch.uint8
        except ImportError:
            import numpy

            dtype = numpy.uint8
    if _is_torch_dtype(dtype):
        import torch

        itemsize = torch.empty((), dtype=dtype).element_size()
        if count == 0:
            return torch.empty(dims, dtype=dtype), None
        memory = _nvio.LockedMemory(_locked_bytes(dims, count, itemsize, dtype))
        return torch.frombuffer(memory, dtype=dtype, count=count).view(dims), memory
    import numpy

    try:
        dt = numpy.dtype(dtype)
    except TypeError as e:
        raise InvalidType(f"empty_locked: {dtype!r} is neither a torch nor a numpy dtype "
                          f"({e})") from None
    if dt.hasobject:
        raise InvalidType(f"empty_locked: dtype {dt} holds Python objects, not plain data")
    if count == 0:
        return numpy.empty(dims, dtype=dt), None
    memory = _nvio.LockedMemory(_locked_bytes(dims, count, dt.itemsize, dt))
    return numpy.frombuffer(memory, dtype=dt, count=count).reshape(dims), memory


def _locked_bytes(dims: tuple, count: int, itemsize: int, dtype: Any) -> int:
    nbytes = count * itemsize
    if nbytes >= 1 << 63:
        raise InvalidArgument(f"empty_locked: shape {dims} of {dtype} is {nbytes} bytes, more "
                              "than a process can address")
    return nbytes


def is_pinned(buf: Any) -> bool:
    """True when the buffer's memory is locked: made by nvio (views included) or pinned by torch.

    Memory from ``empty_locked`` whose mlock RLIMIT_MEMLOCK refused is not locked: False here
    (``aio_handle.is_pinned``, DeepSpeed's question, says True for it)."""
    from . import _buffers

    try:
        ref = _buffers.resolve(buf, writable=False)
    except (TypeError, ValueError):
        return False
    if ref.nbytes > 0 and _nvio.is_locked(ref.address, ref.nbytes):
        return True
    pinned = getattr(buf, "is_pinned", None)
    if pinned is not None:
        try:
            return bool(pinned())
        except RuntimeError:  # CPU-only torch builds cannot answer
            return False
    return False


def evict(path: Any) -> None:
    """Writes back ``path``'s dirty pages and drops the file from the page cache, so that the next
    read of it comes from the drive (no root needed; a tmpfs file stays, being its own cache).
    Raises ``FileNotFound``, ``PermissionDenied``, ... naming the path."""
    from . import _args

    _nvio.evict_page_cache(_args.path(path))


def page_cache(path: Any) -> "dict[str, Any]":
    """How much of ``path`` is in the page cache: ``file_bytes``, ``cached_bytes``,
    ``dirty_bytes`` and the ``method`` that told (cachestat on Linux 6.5 and later, else mincore,
    which reports no dirty bytes). The same as ``nvio report --cached PATH``."""
    from . import _args

    return _nvio.page_cache_state(_args.path(path))


def _cuda_version(v: Optional[int]) -> Optional[str]:
    return f"{v // 1000}.{(v % 1000) // 10}" if v and v > 0 else None


def _gpu_section(g: "dict[str, Any]") -> "dict[str, Any]":
    """gpu_info() in the shape of ``nvio report --json``'s "gpu" (tools/nvio/report.cpp)."""
    return {
        "driver": {"loaded": g["driver_loaded"], "path": g["driver_path"],
                   "reason": g["driver_reason"], "version": _cuda_version(g["driver_version"])},
        "runtime": {"path": g["runtime_path"], "version": _cuda_version(g["runtime_version"])},
        "devices": g["devices"],
        "cufile": {"loaded": g["cufile_loaded"], "path": g["cufile_path"],
                   "reason": g["cufile_reason"]},
        "gds": {"mode": g["gds_mode"], "reason": g["gds_reason"]},
    }


def report(dir: Optional[str] = None) -> "dict[str, Any]":
    """The same data as ``nvio report --json``: engines, the auto choice, O_DIRECT support and
    alignment of ``dir`` (default: the current directory), limits (and whether CAP_IPC_LOCK lifts
    RLIMIT_MEMLOCK), the GPU section, and the effective options with where each came from.

    The probe creates a file in the directory. When it cannot in the current directory (not
    writable, say), "dir" says why in its "error" (its other values None) and the rest is
    reported; a ``dir`` named by the caller raises the error instead."""
    import os

    from . import _args

    engines = {name: {"available": ok, "reason": why}
               for name, (ok, why) in _nvio.probe_engines().items()}
    auto, auto_reason = _nvio.auto_engine()
    target = os.path.abspath(_args.path(dir, "dir") if dir is not None else b".")
    values, sources, config = _nvio.resolve_options(config_dir=target)
    info = _nvio.system_info()
    try:
        probe = dict(_nvio.probe_directory(target), error=None)
    except IOFailure as e:
        if dir is not None:
            raise
        probe = {"path": os.fsdecode(target), "direct_io": None, "mem_align": None,
                 "offset_align": None, "source": None, "error": str(e)}
    return {
        "version": __version__,
        "kernel": info["kernel"],
        "engines": engines,
        "auto_engine": auto,
        "auto_reason": auto_reason,
        "dir": probe,
        "memlock_limit": info["memlock_limit"],
        "memlock_capability": info["memlock_capability"],
        "aio_max_nr": info["aio_max_nr"],
        "aio_nr": info["aio_nr"],
        "gpu": _gpu_section(gpu_info()),
        "options": {k: {"value": values[k], "source": sources[k]} for k in values},
        "config": config,
    }
