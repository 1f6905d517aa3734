"""The zip layer of ``nvio.save`` / ``nvio.load`` (checkpoint.py): torch's archive parsed, and the
records torch's loader asks for. Writing is the core's (src/jobs/checkpoint.*, through
``_nvio.save_checkpoint``, ``checkpoint_pieces`` and ``ArchiveFile``).

The file is the zip archive ``torch.save`` writes: ``<dir>/data.pkl`` (the object, pickled with
torch's scheme of persistent ids), ``<dir>/data/<key>`` (each storage's bytes) and
``<dir>/version``, every entry stored (uncompressed) with its CRC-32. ``_Archive`` parses an
archive held in memory (or read through ``_FileView``), ``_Records`` and ``_MetaRecords`` answer
what ``torch.serialization._load`` asks of torch's own zip reader.
"""

from __future__ import annotations

import concurrent.futures
import errno as _errno
import os
import struct
from typing import Any, Dict, List, Optional, Tuple

from . import _buffers, _nvio

class CheckpointFormatError(_nvio.Error, ValueError):
    """A file that is not a valid torch zip archive: truncated, a broken zip structure, a
    compressed entry, a missing record, or a record whose CRC-32 does not match. ``.path`` names
    the file."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


# Sizes and offsets at or above this get the zip64 fields in what the core writes (its
# zip64_limit). A module attribute so that the tests can exercise the zip64 layout with a small
# archive.
_ZIP64_LIMIT = 0xFFFFFFFF
_CRC_CHUNK = 32 << 20  # pieces of a record checksummed by one task
_ARCHIVE_DIR = "archive"
_FORMAT_VERSION = b"3\n"  # what torch 1.13's writer stores in <dir>/version

_LOCAL_SIG = 0x04034B50
_CENTRAL_SIG = 0x02014B50
_EOCD_SIG = 0x06054B50
_EOCD64_SIG = 0x06064B50
_EOCD64_LOCATOR_SIG = 0x07064B50
_ZIP64_TAG = 0x0001

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


def _crcs(buffers: List[Any]) -> List[int]:
    """The CRC-32 of each buffer: on a pool's threads, or here where they are too small together
    to pay for starting threads (a mapped load checks only data.pkl and the small records)."""
    if sum(memoryview(b).nbytes for b in buffers) <= _CRC_CHUNK:
        return [_nvio.crc32(b) for b in buffers]
    with _pool(os.cpu_count() or 1) as pool:
        return _crc_results(_crc_tasks(pool, buffers))


def _pool(workers: int):
    return concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers),
                                                 thread_name_prefix="nvio-crc")


# ---- errors ---------------------------------------------------------------------------------

def _typed(e: OSError, what: str, path: str, temporary: Optional[str] = None) -> BaseException:
    """An OSError as nvio's typed exception naming the operation and `path`, the file the caller
    gave. One of nvio's own errors is kept as it is unless it names `temporary` (the file a save
    wrote to be renamed over `path`): it is then the same error about `path`, with the temporary
    file, offset and length as detail: the user asked to save `path` and never saw the temporary's
    name."""
    if isinstance(e, _nvio.Error):
        if temporary is None or e.errno is None or temporary not in str(getattr(e, "path", "")):
            return e
        detail = (f" (writing its temporary file {temporary!r} at offset {e.offset} length "
                  f"{e.length})")
        offset, length = e.offset, e.length
    else:
        detail = f" (its temporary file {temporary!r})" if temporary is not None else ""
        offset, length = 0, 0
    code = e.errno or _errno.EIO
    kind = type(e) if isinstance(e, _nvio.Error) else _nvio.error_type(code)
    exc = kind(code, f"nvio: {what} {path!r}: {os.strerror(code)}{detail}", path)
    exc.path = path
    exc.offset = offset
    exc.length = length
    exc.operation = what
    return exc


# ---- records for the core's writer --------------------------------------------------------

def _storage_record(name: str, t: Any) -> Tuple[str, None, int, int]:
    """The record of a storage's bytes (a uint8 CPU tensor over them) as the core's writer takes
    it: written from the tensor's memory, which the caller keeps alive until the write returns."""
    return (name, None, t.data_ptr(), t.numel())



# ---- reading --------------------------------------------------------------------------------

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

    def verify(self, storages: bool = True) -> None:
        """Checks every record's CRC-32 (see _crcs); without `storages`, only those of the records
        that are not a storage's bytes (<dir>/data/<key>)."""
        names = [n for n in self.entries
                 if storages or not n.startswith(self.prefix + "data/")]
        crcs = _crcs([self.data[s:s + n] for s, n, _ in (self.entries[name] for name in names)])
        for name, crc in zip(names, crcs):
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
