"""nvio.dcp's ``FileSystemReader``: DCP's load plan, read with nvio.

``read_data`` works on the plan's items grouped by stored item (file, offset, length: for a
tensor, the zip archive ``torch.save`` writes):

1. Every file's size is checked against the items in it (an item past the end is a
   ``DCPFormatError`` naming the file and tensor, before anything is read).
2. One ``read_batch`` fetches, of each tensor's archive, its first and last ``_PROBE`` bytes (a
   small archive, and every byte item, whole): the local headers, the pickle and the central
   directory. The pickle is unpickled with storages on the ``meta`` device (torch's restricted
   unpickler, as ``weights_only=True``) for the tensor's shape, stride, dtype and record.
3. One ``read_batch`` then fetches, for each item of the plan, only the bytes of the stored tensor
   that the item asks for: straight into the target tensor when the two lay the region out alike
   (a whole tensor, or rows of one), else the span holding it into a scratch buffer, copied into
   the target afterwards. Items already in memory from step 2 are copied from there.
4. A tensor read whole has its record's CRC-32 checked (on a thread pool); a region of one cannot
   be (partial reads skip the check).

Items with DCP's stream transforms (extensions) go through torch's own reader.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from typing import Any, Dict, List, Optional, Tuple

from . import _buffers, _nvio
from ._torchzip import (CheckpointFormatError, _Archive, _crc_results, _crc_tasks, _MetaRecords,
                        _pool, _typed)
from .checkpoint import _unpickle
from .dcp import DCPFormatError, ShapeMismatch, _fs, _handle

_PROBE = 4096  # bytes read at each end of a tensor's archive for its structure
_EOCD_WINDOW = 22 + 0xFFFF  # how far from its end _Archive looks for the end record


class _Blob:
    """One stored item's bytes as _Archive reads them: served from what step 2 read (its head and
    tail, or all of it), anything else with a pread (counted in ``preads``)."""

    def __init__(self, path: str, offset: int, length: int) -> None:
        self.path, self.offset, self.length = path, offset, length
        whole = length <= 2 * _PROBE
        self.head = bytearray(length if whole else _PROBE)
        self.tail = self.head if whole else bytearray(_PROBE)
        self.preads = 0

    @property
    def whole(self) -> bool:
        return self.tail is self.head

    def reads(self) -> List[Tuple[Any, int, str]]:
        if self.whole:
            return [(self.head, self.offset, self.path)] if self.length else []
        return [(self.head, self.offset, self.path),
                (self.tail, self.offset + self.length - _PROBE, self.path)]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, s: slice) -> bytes:
        start, stop, _ = s.indices(self.length)
        if stop <= start:
            return b""
        if stop <= len(self.head):
            return bytes(self.head[start:stop])
        tail_start = self.length - len(self.tail)
        if start >= tail_start:
            return bytes(self.tail[start - tail_start:stop - tail_start])
        if stop == self.length and start == max(0, self.length - _EOCD_WINDOW):
            # _Archive's search for the end record, which torch's writer (no zip comment) puts
            # in the last 22 bytes: the bytes before the tail read as zeros (no signature).
            return bytes(stop - start - len(self.tail)) + bytes(self.tail)
        self.preads += 1
        with open(self.path, "rb", buffering=0) as f:
            return os.pread(f.fileno(), stop - start, self.offset + start)


class _Stored:
    """A stored tensor: its meta tensor (shape, stride, dtype, storage offset) and where its
    record's bytes lie in the file; ``crc`` the record's CRC-32."""

    def __init__(self, blob: _Blob, fqn: str) -> None:
        import torch

        where = f"{blob.path} (bytes {blob.offset} to {blob.offset + blob.length}, {fqn!r})"
        try:
            archive = _Archive(blob, where)
            records = _MetaRecords(archive, torch)
            meta = _unpickle(torch, records, lambda storage, location: storage, True)
        except CheckpointFormatError as e:
            raise DCPFormatError(f"nvio.dcp: tensor {fqn!r} in {blob.path!r}: {e}", blob.path,
                                 fqn) from None
        except Exception as e:  # a pickle with a valid CRC that is not a tensor's
            raise DCPFormatError(f"nvio.dcp: tensor {fqn!r} in {blob.path!r} (bytes "
                                 f"{blob.offset} to {blob.offset + blob.length}) does not "
                                 f"unpickle as a tensor ({type(e).__name__}: {e})", blob.path,
                                 fqn) from None
        if not isinstance(meta, torch.Tensor):
            raise DCPFormatError(f"nvio.dcp: {blob.path!r} holds a {type(meta).__name__} for "
                                 f"tensor {fqn!r}", blob.path, fqn)
        self.meta = meta
        self.start, self.size = records.offsets[_buffers.untyped_storage(meta)._cdata]
        self.crc = next(e[2] for e in archive.entries.values()
                        if e[0] == self.start and e[1] == self.size)
        self.blob = blob


def _fqn(req: Any) -> str:
    return req.storage_index.fqn


def _check_stored(stored: _Stored, req: Any, metadata: Any) -> None:
    """The stored tensor is the chunk .metadata says, and lies inside its record."""
    meta, path, fqn = stored.meta, stored.blob.path, _fqn(req)
    md = metadata.state_dict_metadata.get(fqn) if metadata is not None else None
    chunks = getattr(md, "chunks", None) or []
    offsets = tuple(req.storage_index.offset or ())
    chunk = next((c for c in chunks if tuple(c.offsets) == offsets), None)
    if chunk is not None and tuple(chunk.sizes) != tuple(meta.shape):
        raise DCPFormatError(f"nvio.dcp: {path!r} holds tensor {fqn!r} (chunk at {offsets}) as "
                             f"{tuple(meta.shape)}, .metadata says {tuple(chunk.sizes)}", path, fqn)
    if md is not None and meta.dtype != md.properties.dtype:
        raise DCPFormatError(f"nvio.dcp: {path!r} holds tensor {fqn!r} as {meta.dtype}, "
                             f".metadata says {md.properties.dtype}", path, fqn)
    if meta.numel() and any(s < 0 for s in meta.stride()):
        raise DCPFormatError(f"nvio.dcp: {path!r}: tensor {fqn!r} has negative strides", path, fqn)
    last = meta.storage_offset() + sum((n - 1) * s for n, s in zip(meta.shape, meta.stride()))
    if meta.numel() and (last + 1) * meta.element_size() > stored.size:
        raise DCPFormatError(f"nvio.dcp: {path!r}: tensor {fqn!r} needs {last + 1} elements of "
                             f"its record of {stored.size} bytes", path, fqn)


class _Plan:
    """Step 3: the reads of the plan's tensor items and what to do once they are in memory."""

    def __init__(self) -> None:
        self.reads: List[Tuple[Any, int, str]] = []
        self.copies: List[Tuple[Any, Any]] = []  # (target, source) after the reads
        self.checks: List[Tuple[Any, _Stored, str]] = []  # (bytes, stored, fqn): CRC after
        self.commits: List[Tuple[Any, Any]] = []  # (req, target)

    def add(self, torch, req: Any, target: Any, stored: _Stored) -> None:
        meta, blob = stored.meta, stored.blob
        lengths = list(req.lengths)
        if list(target.shape) != lengths:
            raise DCPFormatError(f"nvio.dcp: the load plan asks for {lengths} of tensor "
                                 f"{_fqn(req)!r} into a tensor of {list(target.shape)}",
                                 blob.path, _fqn(req))
        self.commits.append((req, target))
        if target.numel() == 0:
            return
        es = meta.element_size()
        first = meta.storage_offset() + sum(o * s for o, s in
                                            zip(req.storage_offsets, meta.stride()))
        last = first + sum((n - 1) * s for n, s in zip(lengths, meta.stride()))
        span = (last + 1 - first) * es
        begin = stored.start + first * es  # in the blob
        region = torch.empty(0, dtype=meta.dtype, device="meta").as_strided(
            lengths, meta.stride(), 0)
        whole = span == stored.size
        if blob.whole:  # already in memory
            raw = torch.frombuffer(blob.head, dtype=torch.uint8)[begin:begin + span]
            if whole:
                self.checks.append((raw, stored, _fqn(req)))
            if begin % es:  # a record not aligned for its dtype in memory
                raw = raw.clone()
            flat = raw.view(meta.dtype)
            source = flat.as_strided(lengths, meta.stride(), flat.storage_offset())
            self.copies.append((target, source))
            return
        direct = (target.device.type == "cpu" and target.dtype == meta.dtype
                  and target.is_contiguous() and region.is_contiguous()
                  and span == target.numel() * es)
        if direct:
            self.reads.append((target, blob.offset + begin, blob.path))
            if whole:
                self.checks.append((target, stored, _fqn(req)))
            return
        scratch = torch.empty(span, dtype=torch.uint8)
        self.reads.append((scratch, blob.offset + begin, blob.path))
        if whole:
            self.checks.append((scratch, stored, _fqn(req)))
        self.copies.append((target, scratch.view(meta.dtype).as_strided(lengths, meta.stride(), 0)))

    def verify(self, torch) -> None:
        if not self.checks:
            return
        views = []
        for data, _, _ in self.checks:
            flat = data.reshape(-1) if data.is_contiguous() else data
            views.append(flat.view(torch.uint8).numpy())
        with _pool(os.cpu_count() or 1) as pool:
            crcs = _crc_results(_crc_tasks(pool, views))
        for (_, stored, fqn), crc in zip(self.checks, crcs):
            if crc != stored.crc:
                path = stored.blob.path
                raise DCPFormatError(f"nvio.dcp: tensor {fqn!r} in {path!r} (bytes "
                                     f"{stored.blob.offset} to "
                                     f"{stored.blob.offset + stored.blob.length}): CRC-32 "
                                     f"mismatch (stored {stored.crc:#010x}, computed "
                                     f"{crc:#010x}): the file is damaged", path, fqn)


def _file_sizes(reader: Any, groups: Dict[Tuple[str, int, int], List[Any]]) -> None:
    """Step 1: every item lies inside its file."""
    sizes: Dict[str, int] = {}
    for (path, offset, length), reqs in groups.items():
        if path not in sizes:
            try:
                sizes[path] = os.stat(path).st_size
            except OSError as e:
                raise _typed(e, f"dcp load: tensor {_fqn(reqs[0])!r}", path) from None
        if offset + length > sizes[path]:
            raise DCPFormatError(f"nvio.dcp: .metadata puts {_fqn(reqs[0])!r} at bytes {offset} "
                                 f"to {offset + length} of {path!r}, which has {sizes[path]} "
                                 "bytes (truncated?)", path, _fqn(reqs[0]))


def _read(reader: Any, plan: Any, planner: Any) -> None:
    import torch
    from torch.distributed.checkpoint.planner import LoadItemType

    directory = os.fspath(reader.path)
    groups: Dict[Tuple[str, int, int], List[Any]] = {}
    for req in plan.items:
        info = reader.storage_data[req.storage_index]
        if os.path.isabs(info.relative_path) or ".." in info.relative_path.split("/"):
            raise DCPFormatError(f"nvio.dcp: .metadata names {info.relative_path!r} for "
                                 f"{_fqn(req)!r}, outside the checkpoint's directory",
                                 directory, _fqn(req))
        key = (os.path.join(directory, info.relative_path), info.offset, info.length)
        groups.setdefault(key, []).append(req)
    _file_sizes(reader, groups)
    handle = _handle(reader._nvio_handle)
    blobs = {key: _Blob(*key) for key in groups}
    for key, reqs in groups.items():  # byte items are read whole
        if any(r.type == LoadItemType.BYTE_IO for r in reqs) and not blobs[key].whole:
            blobs[key].head = blobs[key].tail = bytearray(key[2])
    first = [r for b in blobs.values() for r in b.reads()]
    if first:
        handle.read_batch(first)
    work = _Plan()
    stored: Dict[Tuple[str, int, int], _Stored] = {}
    for key, reqs in groups.items():
        for req in reqs:
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(bytes(blobs[key].head)))
                continue
            if key not in stored:
                stored[key] = _Stored(blobs[key], _fqn(req))
            _check_stored(stored[key], req, reader._nvio_metadata)
            work.add(torch, req, planner.resolve_tensor(req).detach(), stored[key])
    if work.reads:
        handle.read_batch(work.reads)
    for target, source in work.copies:
        target.copy_(source)
    if reader.verify:
        work.verify(torch)
    for req, target in work.commits:
        planner.commit_tensor(req, target)


def _reader_base():
    return _fs().FileSystemReader


class FileSystemReader(_reader_base()):  # type: ignore[misc]
    """``torch.distributed.checkpoint.FileSystemReader`` on nvio (see the module's text).

    ``path``: the checkpoint's directory, written by nvio's or torch's writer. ``verify``: check
    the CRC-32 of each tensor read whole (default). ``handle``: the ``nvio.Handle`` to read with
    (default: the shared one)."""

    def __init__(self, path: Any, *, verify: bool = True, handle: Any = None) -> None:
        super().__init__(path)
        self.verify = verify
        self._nvio_handle = handle
        self._nvio_metadata: Any = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = os.fspath(self._get_metadata_path(kwargs.get("rank")))
        try:
            return super().read_metadata(*args, **kwargs)
        except OSError as e:
            raise _typed(e, "dcp load: reading the checkpoint's metadata", path) from None
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError,
                TypeError, ValueError) as e:
            raise DCPFormatError(f"nvio.dcp: {path!r} is not a DCP .metadata file "
                                 f"({type(e).__name__}: {e})", path) from None

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._nvio_metadata = metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        from torch.futures import Future

        transformed = [r for r in plan.items
                       if getattr(self.storage_data[r.storage_index], "transform_descriptors",
                                  None)]
        if transformed:  # DCP's stream extensions: torch's reader knows them
            super().read_data(dataclasses.replace(plan, items=transformed), planner).wait()
            plan = dataclasses.replace(plan, items=[r for r in plan.items
                                                    if r not in transformed])
        _read(self, plan, planner)
        fut: Any = Future()
        fut.set_result(None)
        return fut


def _planner(checkpoint: str) -> Any:
    """A DefaultLoadPlanner that refuses a state dict tensor of another shape than the
    checkpoint's with ShapeMismatch (torch's raises ValueError naming only the tensor)."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    class _Planner(DefaultLoadPlanner):
        def create_local_plan(self) -> Any:
            path = os.path.join(checkpoint, ".metadata")
            for fqn, obj in self.state_dict.items():
                md = self.metadata.state_dict_metadata.get(fqn) if self.metadata else None
                if not isinstance(md, TensorStorageMetadata) or not hasattr(obj, "size"):
                    continue
                have = tuple(obj.size())
                if have != tuple(md.size):
                    raise ShapeMismatch(f"nvio.dcp: tensor {fqn!r} is {have} in the state dict "
                                        f"but {tuple(md.size)} in the checkpoint {path!r}",
                                        path, fqn)
            return super().create_local_plan()

    return _Planner()
