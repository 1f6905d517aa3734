"""``nvio.save`` / ``nvio.load``: torch checkpoints at the speed of the drive.

The file is the zip archive ``torch.save`` writes (``torch.load`` reads it, and ``nvio.load``
reads what ``torch.save`` writes): ``<dir>/data.pkl`` (the object, pickled with torch's scheme of
persistent ids: each storage is a tuple ``('storage', type, key, location, numel)``),
``<dir>/data/<key>`` (each storage's bytes) and ``<dir>/version``, every entry stored
(uncompressed) with its CRC-32, record data 64-byte aligned as torch's writer aligns it.

``save`` lays the archive out itself, so it knows where every storage's bytes go, and writes all of
them straight from the tensors' memory with one ``write_batch`` of an nvio handle. Each storage's
data starts at a file offset congruent to its address modulo the page size, so the direct middle of
each extent needs no bounce copy. The CRC-32s are computed on a thread pool (``_nvio.crc32``,
ISA-L without the GIL) while the batch is being written; the small records, the local headers (which
hold the CRCs) and the central directory follow, then fdatasync, rename over ``path`` and fsync of
the directory.

``load`` reads the whole file with one parallel (O_DIRECT) read into page-aligned memory, checks every
record's CRC-32 and unpickles with storages that are views of that memory (no second copy of the
tensor bytes); ``map_location`` and ``weights_only`` go through torch's own loader code, so they
behave as in ``torch.load``. ``into=`` reads the tensor bytes straight into an existing state
dict's tensors instead.
"""

from __future__ import annotations

import concurrent.futures
import errno as _errno
import io
import os
import pickle
import secrets
import struct
import threading
from typing import Any, Dict, List, Optional, Tuple

from . import _args, _buffers, _landing, _nvio
from ._handle import shared_handle

__all__ = ["save", "load", "CheckpointFormatError"]


class CheckpointFormatError(_nvio.Error, ValueError):
    """A file that is not a valid torch zip archive: truncated, a broken zip structure, a
    compressed entry, a missing record, or a record whose CRC-32 does not match. ``.path`` names
    the file."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


# Sizes and offsets at or above this need the zip64 extensions. A module attribute so that the
# tests can exercise the zip64 layout with a small archive.
_ZIP64_LIMIT = 0xFFFFFFFF
_RECORD_ALIGN = 64  # torch's writer aligns record data to 64 bytes (kFieldAlignment)
_PAGE = 4096  # a storage's data starts at its address modulo this: the direct middle is aligned
_CRC_CHUNK = 32 << 20  # pieces of a record checksummed by one task
_ARCHIVE_DIR = "archive"
_FORMAT_VERSION = b"3\n"  # what torch 1.13's writer stores in <dir>/version

_LOCAL_SIG = 0x04034B50
_CENTRAL_SIG = 0x02014B50
_EOCD_SIG = 0x06054B50
_EOCD64_SIG = 0x06064B50
_EOCD64_LOCATOR_SIG = 0x07064B50
_UTF8_FLAG = 0x0800
_ZIP64_TAG = 0x0001
_PAD_TAG = b"FB"  # the padding extra field torch's writer uses ("FB", then 'Z' bytes)

# ---- CRC-32 --------------------------------------------------------------------------------
# _nvio.crc32 is zlib.crc32 computed with ISA-L (15-20 GB/s a core against zlib's 2), without the
# GIL; records are cut into pieces checksummed on a pool's threads and joined with crc32_combine.

def _crc_tasks(pool, buffers: List[Any]) -> List[List[Tuple[Any, int]]]:
    """Submits the CRC-32 of each buffer's pieces; per buffer, the (future, length) of each."""
    tasks = []
    for buf in buffers:
        view = memoryview(buf).cast("B")
        pieces = []
        for start in range(0, len(view), _CRC_CHUNK):
            piece = view[start:start + _CRC_CHUNK]
            pieces.append((pool.submit(_nvio.crc32, piece), len(piece)))
        tasks.append(pieces)
    return tasks


def _crc_results(tasks: List[List[Tuple[Any, int]]]) -> List[int]:
    out = []
    for pieces in tasks:
        crc = 0
        for future, length in pieces:
            crc = _nvio.crc32_combine(crc, future.result(), length)
        out.append(crc)
    return out


def _pool(workers: int):
    return concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers),
                                                 thread_name_prefix="nvio-crc")


# ---- errors ---------------------------------------------------------------------------------

_ERRNO_TYPES = {
    _errno.ENOENT: _nvio.FileNotFound,
    _errno.ENOTDIR: _nvio.FileNotFound,
    _errno.EACCES: _nvio.PermissionDenied,
    _errno.EPERM: _nvio.PermissionDenied,
    _errno.EROFS: _nvio.ReadOnlyFileSystem,
    _errno.EISDIR: _nvio.IsADirectory,
    _errno.ENOSPC: _nvio.NoSpace,
    _errno.EDQUOT: _nvio.NoSpace,
}


def _typed(e: OSError, what: str, path: str) -> BaseException:
    """An OSError from the os module as nvio's typed exception, naming the operation and path."""
    if isinstance(e, _nvio.Error):
        return e
    code = e.errno or _errno.EIO
    kind = _ERRNO_TYPES.get(code, _nvio.IOFailure)
    exc = kind(code, f"nvio: {what} {path!r}: {os.strerror(code)}", path)
    exc.path = path
    exc.offset = 0
    exc.length = 0
    exc.operation = what
    return exc


# ---- save -----------------------------------------------------------------------------------


def _torch():
    import torch
    import torch.serialization

    return torch


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


class _Entry:
    """One zip entry as laid out: its name, size, where its local header and data go, its CRC."""

    __slots__ = ("name", "size", "header_offset", "data_offset", "crc", "payload")

    def __init__(self, name: str, size: int, payload: Any) -> None:
        self.name = name.encode()
        self.size = size
        self.payload = payload  # bytes (small records) or a uint8 tensor (storages)
        self.header_offset = 0
        self.data_offset = 0
        self.crc = 0


def _local_fixed(entry: _Entry) -> int:
    """Bytes of the local header before the padding: fixed part, name, zip64 sizes if needed."""
    return 30 + len(entry.name) + (20 if entry.size >= _ZIP64_LIMIT else 0)


def _layout(entries: List[_Entry], addresses: List[Optional[int]]) -> int:
    """Places every entry: header at the current end, data at the first offset after it (with room
    for a padding field of at least 4 bytes) that is 64-byte aligned and, for a storage whose
    address is 64-byte aligned, congruent to its address modulo the page size. Returns where the
    central directory starts."""
    at = 0
    for entry, address in zip(entries, addresses):
        entry.header_offset = at
        fixed = at + _local_fixed(entry)
        if address is not None and address % _RECORD_ALIGN == 0:
            target = address % _PAGE
            data = fixed + ((target - fixed) % _PAGE)
        else:
            data = -(-fixed // _RECORD_ALIGN) * _RECORD_ALIGN
        if data - fixed < 4:
            data += _PAGE if address is not None and address % _RECORD_ALIGN == 0 \
                else _RECORD_ALIGN
        entry.data_offset = data
        at = data + entry.size
    return at


def _local_header(entry: _Entry) -> bytes:
    zip64 = entry.size >= _ZIP64_LIMIT
    size32 = 0xFFFFFFFF if zip64 else entry.size
    pad = entry.data_offset - entry.header_offset - _local_fixed(entry)
    extra = b""
    if zip64:
        extra += struct.pack("<HHQQ", _ZIP64_TAG, 16, entry.size, entry.size)
    extra += _PAD_TAG + struct.pack("<H", pad - 4) + b"Z" * (pad - 4)
    return struct.pack("<IHHHHHIIIHH", _LOCAL_SIG, 45 if zip64 else 20, _UTF8_FLAG, 0, 0, 0x21,
                       entry.crc, size32, size32, len(entry.name), len(extra)) + entry.name + extra


def _central_directory(entries: List[_Entry], start: int) -> bytes:
    out = io.BytesIO()
    for e in entries:
        values = []
        size32 = e.size
        offset32 = e.header_offset
        if e.size >= _ZIP64_LIMIT:
            values += [e.size, e.size]
            size32 = 0xFFFFFFFF
        if e.header_offset >= _ZIP64_LIMIT:
            values.append(e.header_offset)
            offset32 = 0xFFFFFFFF
        extra = struct.pack(f"<HH{len(values)}Q", _ZIP64_TAG, 8 * len(values), *values) \
            if values else b""
        version = 45 if values else 20
        out.write(struct.pack("<IHHHHHHIIIHHHHHII", _CENTRAL_SIG, version, version, _UTF8_FLAG,
                              0, 0, 0x21, e.crc, size32, size32, len(e.name), len(extra), 0, 0,
                              0, 0, offset32))
        out.write(e.name)
        out.write(extra)
    size = out.tell()
    count = len(entries)
    end = start + size
    if count >= 0xFFFF or size >= _ZIP64_LIMIT or start >= _ZIP64_LIMIT:
        out.write(struct.pack("<IQHHIIQQQQ", _EOCD64_SIG, 44, 45, 45, 0, 0, count, count, size,
                              start))
        out.write(struct.pack("<IIQI", _EOCD64_LOCATOR_SIG, 0, end, 1))
        out.write(struct.pack("<IHHHHIIH", _EOCD_SIG, 0, 0, min(count, 0xFFFF),
                              min(count, 0xFFFF), min(size, 0xFFFFFFFF),
                              min(start, 0xFFFFFFFF), 0))
    else:
        out.write(struct.pack("<IHHHHIIH", _EOCD_SIG, 0, 0, count, count, size, start, 0))
    return out.getvalue()


def _storage_bytes(torch, storage) -> Any:
    """A uint8 tensor over a CPU storage's bytes (no copy); device storages are copied to the
    host first, as torch.save does."""
    if storage.device.type != "cpu":
        storage = storage.cpu()
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _temporary(directory: str, base: str) -> Tuple[str, int]:
    """A new file beside the target, created with O_EXCL under a random name."""
    while True:
        name = os.path.join(directory, f".{base}.{secrets.token_hex(8)}.nvio-tmp")
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            return name, fd
        except FileExistsError:
            continue


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hold(path: bytes) -> int:
    """A descriptor of the file about to be replaced (-1 if none): while it is open, the rename
    does not free the old file's blocks (freeing a GiB took ~0.5 s inside rename on ext4)."""
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return -1


def _release_later(fd: int) -> None:
    """Closes `fd` on a daemon thread: the replaced file's blocks are freed there, after save has
    returned (its name is already gone; a process exit closes it too)."""
    if fd >= 0:
        threading.Thread(target=os.close, args=(fd,), name="nvio-free-old", daemon=True).start()


def _let_go(h: Any, fd: int) -> None:
    """Has the handle let go of the temporary file open as `fd`: kept, a removed temporary file
    (a failed save's) would hold its disk space for up to a second, so that a retry after freeing
    space would still find the disk full."""
    try:
        h.close_files(fd)
    except Exception:  # an optimisation only: the handle lets go by itself within a second
        pass


def save(obj: Any, path: Any, *, pickle_protocol: int = 2, handle: Any = None) -> int:
    """Saves ``obj`` to ``path`` as ``torch.save`` would, durably and atomically; returns the file
    size.

    The archive is written to a new temporary file in the same directory (created with O_EXCL),
    fdatasync'ed, renamed over ``path``, and the directory fsync'ed: at any moment, also after a
    crash or a kill, ``path`` holds the old file or the new one, never a mix. On an error the
    temporary file is removed, ``path`` is untouched, and nvio's typed exception names the path.
    ``handle`` is the ``nvio.Handle`` to write with (default: one shared handle).
    """
    raw = _args.path(path)
    text = os.fsdecode(raw)
    if os.path.isdir(raw):
        raise _typed(IsADirectoryError(_errno.EISDIR, "is a directory"), "save", text)
    torch = _torch()
    directory, base = os.path.split(text)
    directory = directory or "."

    buf = io.BytesIO()
    pickler = _StoragePickler(buf, pickle_protocol)
    pickler.dump(obj)
    keys = sorted(pickler.storages)  # torch's writer orders the records by key as a string
    tensors = [_storage_bytes(torch, pickler.storages[k]) for k in keys]

    entries = [_Entry(f"{_ARCHIVE_DIR}/data.pkl", buf.tell(), buf.getvalue())]
    entries += [_Entry(f"{_ARCHIVE_DIR}/data/{k}", t.numel(), t) for k, t in zip(keys, tensors)]
    entries.append(_Entry(f"{_ARCHIVE_DIR}/version", len(_FORMAT_VERSION), _FORMAT_VERSION))
    addresses = [None] + [t.data_ptr() for t in tensors] + [None]
    directory_offset = _layout(entries, addresses)
    central_size = len(_central_directory(entries, directory_offset))  # CRCs do not change it

    h = handle if handle is not None else shared_handle()
    tmp, fd = None, -1
    try:
        tmp, fd = _temporary(directory, base)
        # The final size first: direct writes inside the file are not extending writes, which
        # file systems (ext4) serialise.
        os.ftruncate(fd, directory_offset + central_size)
        buffers = [t.numpy() for t in tensors if t.numel() > 0]
        with _pool(os.cpu_count() or 1) as pool:
            crc_tasks = _crc_tasks(pool, buffers)
            items = [(t, e.data_offset) for t, e in zip(tensors, entries[1:]) if t.numel() > 0]
            # The data first, while the CRCs are computed; the headers need them.
            if items:
                h.write_batch(items, fd)
            crcs = iter(_crc_results(crc_tasks))
        for e in entries:
            if isinstance(e.payload, bytes):
                e.crc = _nvio.crc32(e.payload)
                os.pwrite(fd, e.payload, e.data_offset)
            elif e.size > 0:
                e.crc = next(crcs)
            os.pwrite(fd, _local_header(e), e.header_offset)
        os.pwrite(fd, _central_directory(entries, directory_offset), directory_offset)
        os.fdatasync(fd)
        size = os.fstat(fd).st_size
        _let_go(h, fd)
        os.close(fd)
        fd = -1
        old = _hold(raw)
        try:
            os.rename(tmp, raw)
        finally:
            _release_later(old)
        tmp = None
        _fsync_directory(directory)
        return size
    except OSError as e:
        raise _typed(e, "save", text) from (None if isinstance(e, _nvio.Error) else e)
    finally:
        if fd >= 0:
            _let_go(h, fd)
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


# ---- load -----------------------------------------------------------------------------------


class _Archive:
    """The entries of a stored zip archive in memory: name -> (data offset, size, crc), and each
    entry's local header offset in ``headers``."""

    def __init__(self, data: memoryview, path: str) -> None:
        self.data = data
        self.path = path
        self.entries: Dict[str, Tuple[int, int, int]] = {}
        self.headers: Dict[str, int] = {}
        self._parse()

    def _bad(self, what: str) -> CheckpointFormatError:
        return CheckpointFormatError(f"nvio: {self.path!r} is not a valid torch checkpoint: "
                                     f"{what}", self.path)

    def _unpack(self, fmt: str, offset: int) -> tuple:
        if offset < 0 or offset + struct.calcsize(fmt) > len(self.data):
            raise self._bad(f"a structure at offset {offset} runs past the end of the file "
                            f"({len(self.data)} bytes): truncated?")
        return struct.unpack(fmt, bytes(self.data[offset:offset + struct.calcsize(fmt)]))

    def _parse(self) -> None:
        data = self.data
        tail_start = max(0, len(data) - (22 + 0xFFFF))
        eocd = bytes(data[tail_start:]).rfind(struct.pack("<I", _EOCD_SIG))
        if eocd < 0:
            raise self._bad("no end of central directory record (truncated, or not a zip file)")
        eocd += tail_start
        _, _, _, _, count, cd_size, cd_start, _ = self._unpack("<IHHHHIIH", eocd)
        if (count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_start == 0xFFFFFFFF) and eocd >= 20:
            sig, _, eocd64, _ = self._unpack("<IIQI", eocd - 20)
            if sig == _EOCD64_LOCATOR_SIG:
                sig, _, _, _, _, _, _, count, cd_size, cd_start = self._unpack("<IQHHIIQQQQ",
                                                                              eocd64)
                if sig != _EOCD64_SIG:
                    raise self._bad("a broken zip64 end of central directory")
        at = cd_start
        for _ in range(count):
            fields = self._unpack("<IHHHHHHIIIHHHHHII", at)
            if fields[0] != _CENTRAL_SIG:
                raise self._bad(f"no central directory entry at offset {at}")
            method, crc, csize, usize = fields[4], fields[7], fields[8], fields[9]
            name_len, extra_len, comment_len, offset = fields[10], fields[11], fields[12], \
                fields[16]
            name = bytes(data[at + 46:at + 46 + name_len]).decode("utf-8", "replace")
            extra = bytes(data[at + 46 + name_len:at + 46 + name_len + extra_len])
            usize, csize, offset = self._zip64(extra, usize, csize, offset)
            if method != 0 or csize != usize:
                raise self._bad(f"entry {name!r} is compressed (method {method})")
            sig, *_, lname, lextra = self._unpack("<IHHHHHIIIHH", offset)
            if sig != _LOCAL_SIG:
                raise self._bad(f"no local header for {name!r} at offset {offset}")
            start = offset + 30 + lname + lextra
            if start + usize > len(data):
                raise self._bad(f"entry {name!r} ({usize} bytes at offset {start}) runs past the "
                                f"end of the file ({len(data)} bytes): truncated?")
            self.entries[name] = (start, usize, crc)
            self.headers[name] = offset
            at += 46 + name_len + extra_len + comment_len
        pickles = [n for n in self.entries if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise self._bad("no single <dir>/data.pkl record")
        self.prefix = pickles[0][:-len("data.pkl")]

    @staticmethod
    def _zip64(extra: bytes, usize: int, csize: int, offset: int) -> Tuple[int, int, int]:
        at = 0
        while at + 4 <= len(extra):
            tag, size = struct.unpack_from("<HH", extra, at)
            if tag == _ZIP64_TAG:
                values = list(struct.unpack_from(f"<{size // 8}Q", extra, at + 4))
                if usize == 0xFFFFFFFF and values:
                    usize = values.pop(0)
                if csize == 0xFFFFFFFF and values:
                    csize = values.pop(0)
                if offset == 0xFFFFFFFF and values:
                    offset = values.pop(0)
            at += 4 + size
        return usize, csize, offset

    def record(self, name: str) -> Tuple[int, int, int]:
        try:
            return self.entries[self.prefix + name]
        except KeyError:
            raise self._bad(f"no record {self.prefix + name!r}") from None

    def verify(self, pool) -> None:
        """Checks every record's CRC-32 (on the pool's threads)."""
        names = list(self.entries)
        tasks = _crc_tasks(pool, [self.data[s:s + n] for s, n, _ in self.entries.values()])
        for name, crc in zip(names, _crc_results(tasks)):
            if crc != self.entries[name][2]:
                raise self._bad(f"CRC-32 mismatch in record {name!r} (stored "
                                f"{self.entries[name][2]:#010x}, computed {crc:#010x})")


class _Records:
    """What torch.serialization._load asks of a zip reader, over the loaded memory: storages are
    views of it (torch.frombuffer keeps the memory alive)."""

    def __init__(self, archive: _Archive, torch) -> None:
        self.archive = archive
        self.torch = torch

    def get_record(self, name: str) -> bytes:
        start, size, _ = self.archive.record(name)
        return bytes(self.archive.data[start:start + size])

    # The rest of torch's PyTorchFileReader that torch 2's _load calls (1.13 calls none of them;
    # on torch 2.11, nvio.load failed for want of has_record): record lookups and offsets in the
    # file, which the archive's central directory gives.
    def has_record(self, name: str) -> bool:
        return self.archive.prefix + name in self.archive.entries

    def get_record_offset(self, name: str) -> int:
        return self.archive.record(name)[0]

    def get_record_size(self, name: str) -> int:  # torch 2.13's reader has it
        return self.archive.record(name)[1]

    def get_record_header_offset(self, name: str) -> int:
        self.archive.record(name)  # a missing record raises CheckpointFormatError
        return self.archive.headers[self.archive.prefix + name]

    def get_record_offset_no_read(self, header_offset: int, name: str, size: int,
                                  alignment: int) -> int:
        # torch's reader works out where the data starts from the local header it expects at
        # header_offset; the central directory has that already.
        return self.get_record_offset(name)

    def serialization_id(self) -> str:
        key = ".data/serialization_id"
        return self.get_record(key).decode("ascii", "replace") if self.has_record(key) else ""

    def get_all_records(self) -> List[str]:
        n = len(self.archive.prefix)
        return [k[n:] for k in self.archive.entries]

    def get_storage_from_record(self, name: str, numel: int, kind: Any):
        start, size, _ = self.archive.record(name)
        if size != numel:
            raise self.archive._bad(f"record {name!r} holds {size} bytes, its tensor {numel}")
        if numel == 0:
            return self.torch.empty(0, dtype=self.torch.uint8)
        return self.torch.frombuffer(self.archive.data[start:start + size],
                                     dtype=self.torch.uint8)


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


def load(path: Any, map_location: Any = None, weights_only: Optional[bool] = None,
         into: Any = None, *, handle: Any = None) -> Any:
    """Loads what ``torch.save`` or ``nvio.save`` wrote to ``path``.

    The file is read with one parallel O_DIRECT read into page-aligned memory, every record's CRC-32 is
    checked (``nvio.CheckpointFormatError`` on a mismatch or a malformed file), and the tensors
    are views of that memory: no second copy. ``map_location`` and ``weights_only`` behave as in
    ``torch.load`` (torch's own code applies them); ``weights_only`` left out takes the installed
    torch's default, as ``torch.load`` does (False before torch 2.6, True from it, and the
    ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` / ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` variables that
    torch reads). With ``into=`` (a dict of tensors, e.g. a
    model's ``state_dict()``), the checkpoint's tensors are read straight into those tensors'
    memory and ``into`` is returned; see ``_load_into``.
    """
    raw = _args.path(path)
    text = os.fsdecode(raw)
    if into is not None:
        return _load_into(raw, text, into, handle)
    torch = _torch()
    if weights_only is None:
        weights_only = _torch_weights_only_default(torch)
    archive = _Archive(_read_whole(raw, text, handle), text)
    with _pool(os.cpu_count() or 1) as pool:
        archive.verify(pool)
    return _unpickle(torch, _Records(archive, torch), map_location, weights_only)


_TRUE_WORDS = ("1", "y", "yes", "true")


def _torch_weights_only_default(torch) -> bool:
    """What ``torch.load`` does when weights_only is not given, in the installed torch: its
    signature's default where that is a boolean (False before torch 2.6); where it is None (torch
    2.6 on), torch's rule: TORCH_FORCE_WEIGHTS_ONLY_LOAD, then TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD,
    else True (no pickle_module is given)."""
    import inspect

    try:
        default = inspect.signature(torch.load).parameters["weights_only"].default
    except (KeyError, TypeError, ValueError):  # a torch without the argument: no restriction
        return False
    if default is not None and default is not inspect.Parameter.empty:
        return bool(default)
    if os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE_WORDS:
        return True
    if os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE_WORDS:
        return False
    return True


def _torch_major(torch) -> int:
    try:
        return int(str(torch.__version__).split(".")[0])
    except ValueError:
        return 2


def _unpickle(torch, records: Any, map_location: Any, weights_only: bool) -> Any:
    """torch.serialization._load over our records: the same unpickler, storage handling,
    map_location and weights_only checks as torch.load."""
    from torch import serialization

    if weights_only:
        from torch import _weights_only_unpickler

        # The exception that torch.load itself turns into its "weights only" refusal: the
        # restricted unpickler raises UnpicklingError on torch 2, RuntimeError on 1.13 (where
        # torch.load also wraps a bad map_location that way). Anything else passes through, as
        # in torch.load.
        refused = (pickle.UnpicklingError,) if _torch_major(torch) >= 2 else (RuntimeError,)
        try:
            return serialization._load(records, map_location, _weights_only_unpickler,
                                       encoding="utf-8")
        except refused as e:
            raise pickle.UnpicklingError("nvio.load(weights_only=True) refused the file: "
                                         + str(e)) from None
    return serialization._load(records, map_location, pickle, encoding="utf-8")


# ---- load into existing tensors ---------------------------------------------------------------


def _load_into(raw: bytes, text: str, into: Any, handle: Any) -> Any:
    """Reads the checkpoint's tensors straight into the tensors of ``into`` (matched by key).

    The metadata (central directory, data.pkl, with their CRC-32s checked) is read with plain
    preads; the pickle is loaded with storages on the ``meta`` device to learn each tensor's
    record, offset, shape, stride and dtype; then one ``read_batch`` moves each tensor's bytes from
    the file into the target's memory. The checkpoint and ``into`` must hold the same tensors: the
    same keys (nested dicts, such as {"model": ..., "optimizer": ...}, matched level by level),
    shapes and dtypes, else ``nvio.InvalidArgument`` naming the key, before anything is read.
    Targets must be contiguous CPU tensors, as must the saved tensors' layout. The checkpoint's
    other values (a step count, an optimizer's param_groups) are set into ``into`` once the
    tensors are read. The pickle is unpickled as with ``weights_only=True`` (no code from the
    file runs). The tensor records' CRCs are not checked on this path (their bytes never pass
    through memory nvio owns); each tensor must lie inside its record."""
    torch = _torch()
    if not isinstance(into, dict):
        raise _args.InvalidType(f"nvio.load(into=): into must be a dict of tensors (a "
                                f"state_dict), got {type(into).__name__}")
    try:
        fd = os.open(raw, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise _typed(e, "load", text) from e
    try:
        archive = _Archive(_FileView(fd, os.fstat(fd).st_size), text)
        records = _MetaRecords(archive, torch)
        # Only tensors are taken from the file, so nothing else may run while unpickling: torch's
        # restricted unpickler, as with weights_only=True.
        try:
            loaded = _unpickle(torch, records, lambda storage, location: storage, True)
        except (_nvio.Error, pickle.UnpicklingError, OSError):
            raise
        except Exception as e:  # a data.pkl with a valid CRC that is not torch's pickle
            raise archive._bad(f"its data.pkl does not unpickle as a checkpoint "
                               f"({type(e).__name__}: {e})") from None
    except OSError as e:
        raise _typed(e, "load", text) from e
    finally:
        os.close(fd)
    if not isinstance(loaded, dict):
        raise _nvio.InvalidArgument(f"nvio.load(into=): {text!r} holds a "
                                    f"{type(loaded).__name__}, not a dict of tensors")
    plan = _IntoPlan(torch, records, text)
    plan.match(loaded, into, ())
    if plan.items:
        (handle if handle is not None else shared_handle()).read_batch(plan.items, raw)
    for target, key, value in plan.values:
        target[key] = value
    return into


class _IntoPlan:
    """What load(into=) does, worked out before any byte is read: the (target tensor, file
    offset) reads, and the checkpoint's other values to set into the dicts."""

    def __init__(self, torch, records: "_MetaRecords", text: str) -> None:
        self.torch = torch
        self.records = records
        self.text = text
        self.items: List[Tuple[Any, int]] = []
        self.values: List[Tuple[dict, Any, Any]] = []

    @staticmethod
    def _key(where: tuple) -> str:
        return "".join(f"[{k!r}]" for k in where)

    def _refuse(self, where: tuple, what: str) -> _nvio.InvalidArgument:
        return _nvio.InvalidArgument(f"nvio.load(into=): key {self._key(where)}: {what}")

    def _holds_tensor(self, value: Any) -> bool:
        if isinstance(value, self.torch.Tensor):
            return True
        if isinstance(value, dict):
            return any(self._holds_tensor(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return any(self._holds_tensor(v) for v in value)
        return False

    def match(self, loaded: dict, into: dict, where: tuple) -> None:
        torch = self.torch
        for key, value in loaded.items():
            at = where + (key,)
            if isinstance(value, torch.Tensor):
                self._tensor(value, into.get(key) if key in into else None, key in into, at)
            elif isinstance(value, dict) and self._holds_tensor(value):
                target = into.get(key)
                if not isinstance(target, dict):
                    have = "nothing" if key not in into else f"a {type(target).__name__}"
                    raise self._refuse(at, f"{self.text!r} holds a dict of tensors there, into "
                                           f"holds {have}")
                self.match(value, target, at)
            elif self._holds_tensor(value):
                raise self._refuse(at, f"{self.text!r} holds a {type(value).__name__} of "
                                       "tensors, which cannot be read in place (only dicts are "
                                       "matched); load it with nvio.load(path)")
            elif key in into and self._holds_tensor(into[key]):
                raise self._refuse(at, f"{self.text!r} holds a value of type "
                                       f"{type(value).__name__} there, into tensors")
            else:
                self.values.append((into, key, value))
        missing = [k for k, v in into.items() if k not in loaded and self._holds_tensor(v)]
        if missing:
            raise self._refuse(where + (missing[0],), f"{self.text!r} has no such tensor "
                               f"({len(missing)} of into's keys are missing from it: "
                               f"{missing[:5]}); pass a dict of the keys to load")

    def _tensor(self, meta: Any, target: Any, present: bool, at: tuple) -> None:
        torch = self.torch
        if not present:
            raise self._refuse(at, f"{self.text!r} holds a tensor there that into does not have")
        if not isinstance(target, torch.Tensor) or target.shape != meta.shape \
                or target.dtype != meta.dtype:
            have = (f"{tuple(target.shape)} {target.dtype}" if isinstance(target, torch.Tensor)
                    else type(target).__name__)
            raise self._refuse(at, f"the checkpoint {self.text!r} holds {tuple(meta.shape)} "
                                   f"{meta.dtype}, into holds {have}")
        if target.device.type != "cpu" or not target.is_contiguous():
            raise self._refuse(at, "the target must be a contiguous CPU tensor")
        if not meta.is_contiguous():
            raise self._refuse(at, "the saved tensor is not contiguous in its storage")
        if meta.numel() == 0:
            return
        start, size = self.records.offsets[_buffers.untyped_storage(meta)._cdata]
        begin = meta.storage_offset() * meta.element_size()
        end = begin + meta.numel() * meta.element_size()
        if end > size:
            raise self.records.archive._bad(
                f"the tensor at key {self._key(at)} spans bytes {begin} to "
                f"{end} of a record of {size}")
        self.items.append((target, start + begin))


class _FileView:
    """Enough of a memoryview of a file for _Archive's parsing: len, slices and struct reads,
    served by pread."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, s: slice) -> bytes:
        start, stop, _ = s.indices(self.size)
        return os.pread(self.fd, max(0, stop - start), start)


class _MetaRecords(_Records):
    """Records whose storages live on the ``meta`` device (no memory); remembers each storage's
    file offset."""

    def __init__(self, archive: _Archive, torch) -> None:
        super().__init__(archive, torch)
        self.offsets: Dict[int, Tuple[int, int]] = {}  # storage -> (record start, size)

    def get_storage_from_record(self, name: str, numel: int, kind: Any):
        start, size, _ = self.archive.record(name)
        if size != numel:
            raise self.archive._bad(f"record {name!r} holds {size} bytes, its tensor {numel}")
        t = self.torch.empty(numel, dtype=self.torch.uint8, device="meta")
        self.offsets[_buffers.untyped_storage(t)._cdata] = (start, size)
        return t

    def get_record(self, name: str) -> bytes:
        """The record's bytes (data.pkl, version, ...), their CRC-32 checked: this path reads only
        these, and a flipped bit in data.pkl must not become a wrong offset or shape."""
        data = super().get_record(name)
        stored = self.archive.record(name)[2]
        computed = _nvio.crc32(data)
        if computed != stored:
            raise self.archive._bad(f"CRC-32 mismatch in record {self.archive.prefix + name!r} "
                                    f"(stored {stored:#010x}, computed {computed:#010x})")
        return data
