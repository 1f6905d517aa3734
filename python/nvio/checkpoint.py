"""``nvio.save`` / ``nvio.load``: torch checkpoints at the speed of the drive.

The file is the zip archive ``torch.save`` writes (``torch.load`` reads it, also with
``weights_only=True``, and ``nvio.load`` reads what ``torch.save`` writes); the core lays it out
and writes it (src/jobs/checkpoint.*), _torchzip.py parses it. ``f`` is a path or a file object,
as torch takes them.

``save`` pickles here and hands the records to the core in one call (``_nvio.save_checkpoint``,
src/jobs/checkpoint.*): it lays the archive out (every storage's bytes at a file offset congruent
to its address modulo the page size), writes the storages straight from the tensors' memory with
one batch of an nvio handle into a temporary file beside the target (jobs/replace_file: named after
its writer, cleaned up when its writer is gone) while their CRC-32s are computed on threads, then
the headers, small records and central directory, fdatasyncs, renames over the target and fsyncs
the directory. To a file object, the core lays the same archive out packed and Python writes its
pieces in order.

``load`` reads the whole file with one parallel (O_DIRECT) read into page-aligned memory (or maps
it copy-on-write with ``mmap=True``), checks the records' CRC-32s and unpickles with storages that
are views of that memory (no second copy of the tensor bytes); ``map_location`` goes through
torch's own loader code, so it behaves as in ``torch.load``. ``weights_only`` is True unless the
caller says otherwise, whatever torch is installed. torch's legacy (non-zip) format is handed to
``torch.load``. ``into=`` reads the tensor bytes straight into an existing state dict's tensors
instead (_ckpt_into.py).
"""

from __future__ import annotations

import errno as _errno
import io
import mmap as _mmap
import os
import pickle
import stat
import sys
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _args, _landing, _nvio, _torchzip
from ._ckpt_into import load_into
from ._handle import shared_handle
from ._torchzip import (_ARCHIVE_DIR, _FORMAT_VERSION, CheckpointFormatError, _Archive, _Records,
                        _storage_record, _typed)

__all__ = ["save", "load", "CheckpointFormatError", "UnsafeCheckpointError"]


class UnsafeCheckpointError(_nvio.Error, pickle.UnpicklingError):
    """``nvio.load`` with ``weights_only=True`` (the default) refused a checkpoint whose pickle
    holds something other than tensors and plain data (a class, a function call: what a
    ``__reduce__`` that runs ``os.system`` puts there). Pass ``weights_only=False`` only for a
    file you trust. ``.path`` names the file."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def _torch():
    import torch
    import torch.serialization

    return torch


def _source(f: Any, path: Any, func: str, method: str) -> Union[Tuple[bytes, str], Any]:
    """What ``f`` (or the older keyword ``path``) names: (raw path, its text) for a path, or the
    file object itself (anything with ``method``, 'read' or 'write', that is not a path)."""
    if path is not None:
        if f is not None:
            raise _args.InvalidType(f"nvio.{func}: pass f or path, not both")
        f = path
    if f is None:
        raise _args.InvalidType(f"nvio.{func}() missing its file: f (a path or a file object)")
    if not isinstance(f, (str, bytes, os.PathLike)) and hasattr(f, method):
        return f
    raw = _args.path(f, "f")
    return raw, os.fsdecode(raw)


def _stream_name(f: Any) -> str:
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else f"<{type(f).__name__}>"


# ---- save -----------------------------------------------------------------------------------


class _StoragePickler(pickle.Pickler):
    """torch's pickling scheme (torch.serialization._save): storages become persistent ids and
    are collected, keyed in order of first appearance; a storage shared by several tensors is
    one record."""

    def __init__(self, file, protocol: int) -> None:
        super().__init__(file, protocol=protocol)
        self.torch = _torch()
        self.keys: Dict[int, str] = {}
        self.storages: Dict[str, Any] = {}
        self.dtypes: Dict[int, Any] = {}

    def persistent_id(self, obj: Any) -> Optional[tuple]:
        torch = self.torch
        if isinstance(obj, torch.storage.TypedStorage):
            # torch 2 names these _untyped_storage, _pickle_storage_type() and _size() (the public
            # ones warn that TypedStorage is going away); 1.13 has only _storage and the public.
            if hasattr(obj, "_untyped_storage"):
                storage, type_name, numel = (obj._untyped_storage, obj._pickle_storage_type(),
                                             obj._size())
            else:
                storage, type_name, numel = obj._storage, obj.pickle_storage_type(), obj.size()
            dtype = obj.dtype
            storage_type = getattr(torch, type_name)
        elif torch.is_storage(obj):
            storage = obj
            dtype = torch.uint8
            storage_type = torch.serialization.normalize_storage_type(type(obj))
            numel = storage.nbytes()
        else:
            return None
        if storage.data_ptr() != 0:  # torch refuses one memory saved as two dtypes
            seen = self.dtypes.setdefault(storage.data_ptr(), dtype)
            if seen != dtype:
                raise RuntimeError("Cannot save multiple tensors or storages that view the same "
                                   "data as different types")
        key = self.keys.setdefault(storage._cdata, str(len(self.keys)))
        self.storages[key] = storage
        return ("storage", storage_type, key, torch.serialization.location_tag(storage), numel)




def _storage_bytes(torch, storage) -> Any:
    """A uint8 tensor over a CPU storage's bytes (no copy); device storages are copied to the
    host first, as torch.save does."""
    if storage.device.type != "cpu":
        storage = storage.cpu()
    return torch.empty(0, dtype=torch.uint8).set_(storage)



def _archive_records(obj: Any, pickle_protocol: int) -> Tuple[List[tuple], Dict[int, Any]]:
    """The archive's records for the core (``(name, bytes or None, address, nbytes)``): data.pkl,
    byteorder, each storage's bytes (ordered by key as a string, as torch's writer orders them),
    version; and, by record index, the uint8 tensors over the storages' bytes, which must live
    until they are written."""
    torch = _torch()
    buf = io.BytesIO()
    pickler = _StoragePickler(buf, pickle_protocol)
    pickler.dump(obj)
    byteorder = sys.byteorder.encode()  # torch 2 writes it; torch 1.13 reads around it
    records = [(f"{_ARCHIVE_DIR}/data.pkl", buf.getvalue(), 0, 0),
               (f"{_ARCHIVE_DIR}/byteorder", byteorder, 0, 0)]
    tensors = {}
    for key in sorted(pickler.storages):
        tensors[len(records)] = t = _storage_bytes(torch, pickler.storages[key])
        records.append(_storage_record(f"{_ARCHIVE_DIR}/data/{key}", t))
    records.append((f"{_ARCHIVE_DIR}/version", _FORMAT_VERSION, 0, 0))
    return records, tensors


def save(obj: Any, f: Any = None, *, pickle_protocol: int = 2, handle: Any = None,
         path: Any = None) -> int:
    """Saves ``obj`` to ``f`` as ``torch.save`` would; returns the bytes written.

    ``f`` is a path (str, bytes, os.PathLike; ``path=`` is the older name of the argument) or a
    file object with ``write`` (``io.BytesIO``, a file opened ``"wb"``), which gets the archive
    written in order from its current position, as ``torch.save`` writes it.

    A path is written durably and atomically: the archive goes to a new temporary file in the same
    directory (``.<name>.<host>.<start>.<pid>-...nvio-tmp``, naming the process that writes it;
    temporaries a killed save left are removed by the next save or load of the path), is
    fdatasync'ed, renamed over the path, and the directory fsync'ed: at any moment, also after a
    crash or a kill, the path holds the old file or the new one, never a mix. On an error the
    temporary file is removed, the path is untouched, and nvio's typed exception names the path
    (the temporary file only as detail). ``handle`` is the ``nvio.Handle`` to write with
    (default: one shared handle).
    """
    target = _source(f, path, "save", "write")
    if isinstance(target, tuple) and os.path.isdir(target[0]):
        raise _typed(IsADirectoryError(_errno.EISDIR, "is a directory"), "save", target[1])
    records, tensors = _archive_records(obj, pickle_protocol)
    if not isinstance(target, tuple):
        return _save_stream(target, records, tensors)
    h = handle if handle is not None else shared_handle()
    return _nvio.save_checkpoint(h._core, target[0], records, True, _torchzip._ZIP64_LIMIT)


def _write_all(f: Any, data: Any) -> int:
    """Writes all of `data` to file object `f` (a raw file may take less than asked)."""
    view = memoryview(data).cast("B")
    total = len(view)
    while len(view):
        n = f.write(view)
        if n is None or n >= len(view):  # None: a writer that does not count (torch ignores it)
            break
        if n <= 0:
            raise _typed(OSError(_errno.EIO, "wrote nothing"), "save", _stream_name(f))
        view = view[n:]
    return total


def _save_stream(f: Any, records: List[tuple], tensors: Dict[int, Any]) -> int:
    """Writes the archive to file object `f` in order, as the core lays it out packed (data
    64-byte aligned from where `f` stood, as torch's writer aligns it): its bytes, and each
    storage's from the tensor's memory."""
    written = 0
    for piece in _nvio.checkpoint_pieces(records, _torchzip._ZIP64_LIMIT):
        written += _write_all(f, piece if isinstance(piece, bytes) else tensors[piece].numpy())
    flush = getattr(f, "flush", None)
    if flush is not None:
        flush()
    return written


# ---- load -----------------------------------------------------------------------------------


def load(f: Any = None, map_location: Any = None, weights_only: Optional[bool] = None,
         into: Any = None, *, mmap: Optional[bool] = None, handle: Any = None,
         path: Any = None) -> Any:
    """Loads what ``torch.save`` or ``nvio.save`` wrote to ``f``: a path (``path=`` is the older
    name of the argument) or a file object with ``read`` (read from its current position).

    The file is read with one parallel O_DIRECT read into page-aligned memory, every record's
    CRC-32 is checked (``nvio.CheckpointFormatError`` on a mismatch or a malformed file), and the
    tensors are views of that memory: no second copy. ``map_location`` behaves as in ``torch.load``
    (torch's own code applies it).

    ``weights_only`` left out is True, whatever torch is installed: a pickle that would build
    anything but tensors and plain data (and so could run code, e.g. a ``__reduce__`` calling
    ``os.system``) is refused with ``nvio.UnsafeCheckpointError`` (a ``pickle.UnpicklingError``)
    before any of it runs. Pass ``weights_only=False`` only for a file you trust. As with torch
    2.6 on, ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` forces it on, and
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns it off where the caller did not pass it.

    ``mmap=True`` (as in ``torch.load``; left out, torch's ``torch.utils.serialization.config``
    decides, False by default) maps the file copy-on-write instead of reading it: the tensors are
    views of the mapping, pages are read when touched, writes to the tensors never reach the file.
    It takes a path, not a file object; the storages' CRC-32s are not checked then (that would read
    the whole file), those of the other records are. The file must not be truncated while mapped.

    A file in torch's legacy (non-zip) format (``torch.save(..., _use_new_zipfile_serialization=
    False)``) is loaded by ``torch.load`` with the same ``map_location`` and ``weights_only``.

    With ``into=`` (a dict of tensors, e.g. a model's ``state_dict()``), the checkpoint's tensors
    are read straight into those tensors' memory and ``into`` is returned (a path only); see
    _ckpt_into.load_into. Loading a path also removes the temporaries that killed saves of it
    left (see ``save``).
    """
    source = _source(f, path, "load", "read")
    weights_only = _weights_only(weights_only)
    if mmap is None:
        mmap = _torch_mmap_default()
    if isinstance(source, tuple):
        raw, text = source
        _nvio.remove_stale_temporaries(raw)
        if into is not None:
            return load_into(_torch(), _unpickle, raw, text, into, handle)
        data = _map_whole(raw, text) if mmap else _read_whole(raw, text, handle)
    else:
        text = _stream_name(source)
        if into is not None:
            raise _nvio.InvalidArgument("nvio.load(into=) reads from a path, not a file object")
        if mmap:
            raise _nvio.InvalidArgument("nvio.load: f must be a file path in order to use the "
                                        f"mmap argument, got {text}")
        data = _read_stream(source, text)
    torch = _torch()
    if _is_legacy(data):
        return _load_legacy(torch, data, text, map_location, weights_only, mmap)
    archive = _Archive(data, text)
    archive.verify(storages=not mmap)
    return _unpickle(torch, _Records(archive, torch), map_location, weights_only)


def _read_whole(path: bytes, text: str, handle: Any) -> memoryview:
    """The whole file in fresh page-aligned memory, read with one parallel call (see _landing:
    not locked memory, whose up-front population cost more than the read). The tensors loaded are
    views of this memory, so it stays ordinary (unlocked) memory for their life."""
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise _typed(e, "load", text) from e
    if os.path.isdir(path):
        raise _typed(IsADirectoryError(_errno.EISDIR, "is a directory"), "load", text)
    return _landing.read_region(handle if handle is not None else shared_handle(), path, 0, size,
                                whole_file=True)


def _map_whole(path: bytes, text: str) -> memoryview:
    """The whole file mapped private (copy-on-write) and writable, as torch.load(mmap=True) maps
    it (MAP_PRIVATE): the storages are views of it; the mapping lives as long as they do."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise _typed(e, "load", text) from e
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(_errno.EISDIR, "is a directory")
        if st.st_size == 0:
            return memoryview(bytearray())
        memory = _mmap.mmap(fd, st.st_size, flags=_mmap.MAP_PRIVATE,
                            prot=_mmap.PROT_READ | _mmap.PROT_WRITE)
    except OSError as e:
        raise _typed(e, "load", text) from e
    finally:
        os.close(fd)
    return memoryview(memory)


def _read_stream(f: Any, text: str) -> memoryview:
    """The rest of file object `f`, from its position, in writable memory (torch.frombuffer warns
    on read-only memory). A regular file is read with preads of its descriptor into memory
    allocated once; `f` is left at its end, as after read()."""
    if isinstance(f, io.TextIOBase):
        raise _args.InvalidType(f"nvio.load: {text} is open in text mode: open the file in "
                                "binary mode ('rb')")
    try:
        fd = f.fileno()
        regular = stat.S_ISREG(os.fstat(fd).st_mode) and f.seekable()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        regular = False
    if not regular:
        data = f.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise _args.InvalidType(f"nvio.load: {text}.read() returned {type(data).__name__}, "
                                    "not bytes: open the file in binary mode ('rb')")
        return memoryview(bytearray(data))
    try:
        start = f.tell()
        size = max(0, os.fstat(fd).st_size - start)
        view = memoryview(bytearray(size))
        done = 0
        while done < size:
            n = os.preadv(fd, [view[done:]], start + done)
            if n == 0:
                break  # the file shrank while being read: the archive's checks say what is wrong
            done += n
        f.seek(start + done)
    except OSError as e:
        raise _typed(e, "load", text) from e
    return view[:done]


def _is_legacy(data: memoryview) -> bool:
    """Whether `data` is torch's legacy format rather than a zip archive (which starts with a
    local header): a pickle (torch 0.4 to 1.5's default, protocol 2 and up) or a tar archive
    (before 0.4)."""
    if len(data) < 4 or bytes(data[:4]) == b"PK\x03\x04":
        return False
    return data[0] == 0x80 or bytes(data[257:262]) == b"ustar"


def _load_legacy(torch, data: memoryview, text: str, map_location: Any, weights_only: bool,
                 mmap: bool) -> Any:
    """A checkpoint in torch's legacy format, loaded by torch.load with the caller's arguments."""
    if mmap:
        raise CheckpointFormatError(
            f"nvio: {text!r} is in torch's legacy (non-zip) format, which mmap=True cannot map "
            "(torch.save writes the zip format unless told _use_new_zipfile_serialization=False); "
            "load it without mmap", text)
    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=weights_only)
    except pickle.UnpicklingError as e:
        if not weights_only or isinstance(e, _nvio.Error):
            raise
        raise UnsafeCheckpointError(f"nvio.load(weights_only=True) refused {text!r}, a checkpoint "
                                    f"in torch's legacy (non-zip) format: {e}", text) from None


_TRUE_WORDS = ("1", "y", "yes", "true")


def _weights_only(weights_only: Optional[bool]) -> bool:
    """True unless the caller passed False, whatever torch is installed; torch 2's variables
    apply as torch.load applies them: TORCH_FORCE_WEIGHTS_ONLY_LOAD forces True, and
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD makes a left-out weights_only False."""
    force = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE_WORDS
    force_no = os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE_WORDS
    if force and force_no:
        raise _nvio.InvalidArgument("nvio.load: only one of TORCH_FORCE_WEIGHTS_ONLY_LOAD and "
                                    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD may be set")
    if force:
        return True
    if weights_only is None:
        if force_no:
            warnings.warn("nvio.load: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set and weights_only "
                          "was not passed: loading with weights_only=False", UserWarning,
                          stacklevel=3)
            return False
        return True
    return bool(weights_only)


def _torch_mmap_default() -> bool:
    """torch.load's mmap when not passed: torch.utils.serialization.config (torch 2.5 on)."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return False
    return bool(getattr(getattr(config, "load", None), "mmap", False))


def _torch_major(torch) -> int:
    try:
        return int(str(torch.__version__).split(".")[0])
    except ValueError:
        return 2


def _raised_in(e: BaseException, module: Any) -> bool:
    """Whether `e` was raised by code of `module` (the innermost frame of its traceback)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename == getattr(module, "__file__", None)


def _unpickle(torch, records: Any, map_location: Any, weights_only: bool) -> Any:
    """torch.serialization._load over our records: the same unpickler, storage handling,
    map_location and weights_only checks as torch.load."""
    from torch import serialization

    if weights_only:
        from torch import _weights_only_unpickler

        # The restricted unpickler's refusal: UnpicklingError on torch 2; on 1.13 a RuntimeError
        # raised in its module (torch.load 1.13 also turned a bad map_location into its refusal;
        # that one stays torch's RuntimeError here, as on torch 2). Anything else passes through.
        legacy = _torch_major(torch) < 2
        text = records.archive.path
        try:
            return serialization._load(records, map_location, _weights_only_unpickler,
                                       encoding="utf-8")
        except _nvio.Error:
            raise
        except (pickle.UnpicklingError, RuntimeError) as e:
            restricted = not isinstance(e, RuntimeError) or \
                (legacy and _raised_in(e, _weights_only_unpickler))
            if not restricted:
                raise
            raise UnsafeCheckpointError(
                f"nvio.load(weights_only=True) refused {text!r} (torch {torch.__version__}'s "
                f"weights-only unpickler): {e}. weights_only=False loads it, running what its "
                "pickle says: only for a file you trust", text) from None
    return serialization._load(records, map_location, pickle, encoding="utf-8")
