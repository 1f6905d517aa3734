"""``torch.distributed.checkpoint`` (DCP) on nvio: a storage writer and reader for ``dcp.save``,
``dcp.load`` and ``dcp.async_save`` that keep DCP's own file-system layout.

DCP plans which rank writes which tensor (or shard of one) and reshards on load from any number of
ranks to any other; it leaves the bytes to a ``StorageWriter`` / ``StorageReader``. These are
nvio's, drop-in for torch's ``FileSystemWriter`` / ``FileSystemReader``:

- The files are those torch's writer makes: one ``.distcp`` file per rank holding, for each item,
  the bytes ``torch.save`` would write for it (a zip archive; byte items as DCP serialises them),
  and ``.metadata``, DCP's pickled ``Metadata`` naming the file, offset and length of every item.
  A checkpoint written here loads with torch's ``FileSystemReader``, and one torch's writer wrote
  loads with ``FileSystemReader`` of this module.
- Writing (``FileSystemWriter.write_data``): each rank lays its one file out (the core's
  ``ArchiveFile``, src/jobs/checkpoint.*: every tensor's data at a file offset congruent to its
  address modulo the page size, so that the direct middle needs no bounce copy) and the core
  writes it into a temporary file (jobs/replace_file, the library's one atomic-replace
  mechanism): all tensors' data with one batch straight from their memory while the archives'
  CRC-32s are computed on threads, then the headers, pickles and central directories (which hold
  the CRCs) with a second batch that fdatasyncs the file; then the rename. ``finish`` (the
  coordinator, once every
  rank has written) replaces ``.metadata`` the same way, last (rename, directory fsync); then it
  removes the data files of earlier saves into the same directory that the new ``.metadata`` no
  longer names, and data files' temporaries whose writer is gone (a rank killed mid-save).
- Every save draws a new tag for its file names (``__<rank>_<tag>_0.distcp``): the files of the
  checkpoint already in the directory are never overwritten, so a save that fails on any rank, or a
  crash at any moment, leaves the previous checkpoint loadable (its ``.metadata`` and files are
  untouched). DCP itself makes every rank raise ``CheckpointException`` naming the failed ranks.
- Reading: see ``nvio._dcp_read``: only the byte ranges the load plan asks for are read, straight
  into the target tensors where their layout allows, all in one ``read_batch``.

``save``/``load`` here are ``dcp.save``/``dcp.load`` with these and, for ``load``, a planner that
refuses a checkpoint of another model shape with ``ShapeMismatch`` naming the tensor and the file.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import re
import secrets
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _buffers, _nvio, _torchzip
from ._handle import replace_file as _replace_file
from ._torchzip import _ARCHIVE_DIR, _FORMAT_VERSION, _storage_record, _typed
from .checkpoint import _StoragePickler, _storage_bytes

__all__ = ["FileSystemWriter", "FileSystemReader", "DCPFormatError", "ShapeMismatch", "save",
           "load", "async_save"]

# Data files of a checkpoint in this layout: torch's (__0_0.distcp) and this module's
# (__0_<tag>_0.distcp). finish() removes those the new .metadata does not name.
_DATA_FILE = re.compile(r"__\d+_(?:[0-9a-f]{16}_)?\d+\.distcp$")
_DATA_TEMP = re.compile(r"\.(__\d+_[0-9a-f]{16}_\d+\.distcp)\..*\.nvio-tmp$")  # its target


class DCPFormatError(_nvio.FormatError):
    """A DCP checkpoint whose files do not hold what its ``.metadata`` says: a truncated or
    damaged ``.distcp`` file, an item past a file's end, a tensor of another shape or dtype than
    its entry, an unreadable ``.metadata``. ``.path`` names the file, ``.tensor`` the item (its
    fully qualified name, or None)."""

    def __init__(self, message: str, path: str, tensor: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path
        self.tensor = tensor


class ShapeMismatch(_nvio.InvalidArgument):
    """``load`` into a state dict whose tensor has another shape than the checkpoint's.
    ``.path`` names the checkpoint's ``.metadata``, ``.tensor`` the tensor."""

    def __init__(self, message: str, path: str, tensor: str) -> None:
        super().__init__(message)
        self.path = path
        self.tensor = tensor


def _fs():
    from torch.distributed.checkpoint import filesystem

    return filesystem


def _handle(handle: Any) -> Any:
    if handle is not None:
        return handle
    from ._handle import shared_handle

    return shared_handle()


def replace_file(handle: Any, path: str, pieces: Sequence[Tuple[Any, int]], sync: bool) -> None:
    """The core's atomic replacement of ``path`` by ``pieces`` (nvio._handle.replace_file)."""
    _replace_file(_handle(handle), path, pieces, sync)


# ---- writing -----------------------------------------------------------------------------------

class _Layout:
    """One data file as laid out by the core (``_nvio.ArchiveFile``: byte items and one archive
    per tensor, each 64-byte aligned) and the tensors' storages it writes from their memory
    (uint8 tensors at file offsets), kept alive here until the file is written."""

    def __init__(self) -> None:
        self.file = _nvio.ArchiveFile(_torchzip._ZIP64_LIMIT)
        self.storages: List[Tuple[Any, int]] = []

    def add_bytes(self, data: bytes) -> Tuple[int, int]:
        return self.file.add_bytes(data)

    def add_tensor(self, torch, tensor: Any) -> Tuple[int, int]:
        """Lays out the archive torch.save(tensor) would write; returns (offset, length)."""
        buf = io.BytesIO()
        pickler = _StoragePickler(buf, 2)
        pickler.dump(tensor)
        keys = sorted(pickler.storages)
        stored = [_storage_bytes(torch, pickler.storages[k]) for k in keys]
        records = [(f"{_ARCHIVE_DIR}/data.pkl", buf.getvalue(), 0, 0)]
        records += [_storage_record(f"{_ARCHIVE_DIR}/data/{k}", t) for k, t in zip(keys, stored)]
        records.append((f"{_ARCHIVE_DIR}/version", _FORMAT_VERSION, 0, 0))
        base, size, offsets = self.file.add_archive(records)
        self.storages += zip([t for t in stored if t.numel()], offsets)
        return base, size


def write_data_file(handle: Any, path: str, layout: _Layout, sync: bool) -> None:
    """Writes a laid-out data file as a new file in place of ``path``, atomically, in one call
    into the core (``ArchiveFile.write``, see the module's text)."""
    layout.file.write(_handle(handle)._core, path, sync)


def _plain(torch, value: Any) -> Any:
    """A CPU tensor holding exactly its own, contiguous storage (what is written)."""
    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def _write_file(path: str, name: str, items: Sequence[Any], planner: Any, handle: Any,
                sync: bool) -> List[Any]:
    import torch
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult

    layout = _Layout()
    results = []
    owners = []
    for item in items:
        data = planner.resolve_data(item)
        if item.type == WriteItemType.BYTE_IO:
            payload = bytes(data.getbuffer())
            offset, length = layout.add_bytes(payload)
        else:
            tensor = _plain(torch, data)
            owners.append(tensor)
            offset, length = layout.add_tensor(torch, tensor)
        results.append(WriteResult(index=item.index, size_in_bytes=length,
                                   storage_data=_fs()._StorageInfo(name, offset, length)))
    write_data_file(handle, path, layout, sync)
    del owners
    return results


def _remove_unnamed(directory: str, keep: set) -> None:
    """Removes the data files of earlier saves that the new .metadata does not name, and the
    temporaries of data files whose writer is gone (a rank killed mid-save; the core's
    remove_stale_temporaries decides, as for every replacing save). Best effort: a file that
    cannot be removed stays."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name not in keep and _DATA_FILE.match(name):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
        elif name.startswith(".__") and name.endswith(".nvio-tmp"):
            base = _DATA_TEMP.match(name)
            if base:
                _nvio.remove_stale_temporaries(os.path.join(directory, base.group(1)))


def _writer_base():
    return _fs().FileSystemWriter


class FileSystemWriter(_writer_base()):  # type: ignore[misc]
    """``torch.distributed.checkpoint.FileSystemWriter`` on nvio (see the module's text).

    ``path``: the checkpoint's directory (made if missing). ``sync_files``: data and metadata
    fdatasync'ed before they are renamed into place (default; without it a crash may leave a
    checkpoint whose files are not all on the drive). ``overwrite=False`` refuses a directory that
    holds a checkpoint. ``handle``: the ``nvio.Handle`` to write with (default: the shared one).
    Options after ``path`` are keywords. One file per rank; torch's ``thread_count`` and
    ``single_file_per_rank`` have no counterpart (the handle's workers write in parallel), nor
    its experimental ``_extensions`` and ``serialization_format`` (the files are always
    ``torch.save``'s format)."""

    def __init__(self, path: Any, *, sync_files: bool = True, overwrite: bool = True,
                 cache_staged_state_dict: bool = False, handle: Any = None) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=sync_files,
                         thread_count=1, cache_staged_state_dict=cache_staged_state_dict,
                         overwrite=overwrite)
        self._nvio_handle = handle

    def prepare_local_plan(self, plan: Any) -> Any:
        directory = os.fspath(self.path)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise _typed(e, "dcp save: creating the directory", directory) from None
        # A save here never touches the files of the checkpoint already there (their names are
        # the old save's), so it needs no warning; overwrite=False still refuses.
        if not self.overwrite and self._metadata_exists():
            raise _nvio.InvalidArgument(f"nvio.dcp: {directory!r} already holds a checkpoint "
                                        "and overwrite=False")
        if self.rank is not None and not self.use_collectives:
            tag = secrets.token_hex(8)
            plan = dataclasses.replace(plan,
                                       storage_data=_fs()._StoragePrefix(f"__{self.rank}_{tag}_"))
        return plan

    def prepare_global_plan(self, plans: List[Any]) -> List[Any]:
        tag = secrets.token_hex(8)  # one per save, sent to every rank with its plan
        prefix = _fs()._StoragePrefix
        return [dataclasses.replace(p, storage_data=prefix(f"__{i}_{tag}_"))
                if p.storage_data is None else p for i, p in enumerate(plans)]

    def write_data(self, plan: Any, planner: Any) -> Any:
        from torch.futures import Future

        name = f"{plan.storage_data.prefix}0{_fs().DEFAULT_SUFFIX}"
        path = os.path.join(os.fspath(self.path), name)
        results = _write_file(path, name, plan.items, planner, self._nvio_handle,
                              self.sync_files)
        fut: Any = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Any, results: List[List[Any]]) -> None:
        metadata.version = _fs().CURRENT_DCP_VERSION
        storage: Dict[Any, Any] = {}
        for per_rank in results:
            storage.update({r.index: r.storage_data for r in per_rank})
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        per_rank = not self.use_collectives and self.rank is not None
        path = os.fspath(self._get_metadata_path(self.rank if per_rank else None))
        replace_file(self._nvio_handle, path, [(pickle.dumps(metadata), 0)], self.sync_files)
        if not per_rank:
            _remove_unnamed(os.fspath(self.path), {s.relative_path for s in storage.values()})


from ._dcp_read import FileSystemReader, _planner  # noqa: E402  (needs the classes above)


def save(state_dict: Dict[str, Any], checkpoint_id: Any, **kwargs: Any) -> Any:
    """``dcp.save`` with nvio's ``FileSystemWriter(checkpoint_id)``; ``kwargs`` go to
    ``dcp.save`` (``process_group``, ``planner``, ...)."""
    import torch.distributed.checkpoint as dcp

    return dcp.save(state_dict, storage_writer=FileSystemWriter(checkpoint_id),
                    checkpoint_id=checkpoint_id, **kwargs)


def async_save(state_dict: Dict[str, Any], checkpoint_id: Any, **kwargs: Any) -> Any:
    """``dcp.async_save`` with nvio's ``FileSystemWriter(checkpoint_id)``; returns its future."""
    import torch.distributed.checkpoint as dcp

    return dcp.async_save(state_dict, storage_writer=FileSystemWriter(checkpoint_id),
                          checkpoint_id=checkpoint_id, **kwargs)


def load(state_dict: Dict[str, Any], checkpoint_id: Any, **kwargs: Any) -> None:
    """``dcp.load`` in place with nvio's ``FileSystemReader(checkpoint_id)`` and a default load
    planner that raises ``ShapeMismatch`` (naming tensor and file) for a tensor whose shape is not
    the checkpoint's; ``kwargs`` go to ``dcp.load``."""
    import torch.distributed.checkpoint as dcp

    kwargs.setdefault("planner", _planner(os.fspath(checkpoint_id)))
    dcp.load(state_dict, storage_reader=FileSystemReader(checkpoint_id),
             checkpoint_id=checkpoint_id, **kwargs)
