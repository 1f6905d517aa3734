"""Hugging Face model folders: ``load_model_folder(path)`` loads every tensor of a folder that
``save_pretrained`` wrote — sharded (``model.safetensors.index.json`` naming the shard of each
tensor) or one ``model.safetensors`` — as one state dict, with every shard's data read by one read
batch (all shards in flight at once).

On the CPU each shard's data region lands in fresh memory placed like the file (so the reads go
through O_DIRECT without a bounce copy), and the tensors are views of it; on a GPU the tensors are
allocated there and the batch holds one extent per tensor.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from typing import Any, Dict, List, Tuple

from .. import _args, _landing
from .._handle import shared_handle
from . import _common

def _format_error(path: str, problem: str) -> Exception:
    err = _common.SafetensorError(f"nvio.safetensors: '{path}': {problem}")
    err.path, err.problem = path, problem
    return err


def _region(offset: int, length: int) -> Tuple[Any, Any, int]:
    """Fresh anonymous memory for bytes [offset, offset + length) of a file, its addresses
    matching the file offsets modulo the page size, with huge pages advised (as _landing's
    read_region places its memory): (the mapping, a writable view of the bytes, its address)."""
    if length == 0:
        return None, memoryview(bytearray()), 0
    shift = offset % _landing._PAGE
    memory = mmap.mmap(-1, shift + length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _landing._advise_huge_pages(memory)
    view = memoryview(memory)[shift:]
    return memory, view, ctypes.addressof(ctypes.c_char.from_buffer(view))


def _populate(memories: List[Any], stop: threading.Event) -> None:
    """_landing's populating, one mapping after the other, ahead of the batch that fills them."""
    for memory in memories:
        if stop.is_set():
            return
        _landing._populate(memory, len(memory), stop)


def _read_regions(handle: Any, files: List[Any]) -> List[Any]:
    """Every file's data region in memory of its own, read by one batch: the views."""
    items, views, large = [], [], []
    for f in files:
        memory, view, address = _region(f.data_offset, f.data_size)
        views.append(view)
        if f.data_size:
            items.append((address, f.data_size, f.data_offset, f.path, False))
        if f.data_size >= _landing._POPULATE_MIN:
            large.append(memory)
    if not items:
        return views
    stop = threading.Event()
    helper = threading.Thread(target=_populate, args=(large, stop), name="nvio-populate",
                              daemon=True)
    if large:
        helper.start()
    try:
        handle.read_batch(items)
    finally:
        stop.set()
        if large:
            helper.join()
    return views


def load_model_folder(path: Any, device: Any = "cpu") -> Dict[str, Any]:
    """Every tensor of the model folder at `path` on `device`, by name (shards in index order,
    each in file order), read with one batch over all shards. The index is read as
    nvio.load_sharded reads it (nvio.sharded.read_index): FileNotFound for a folder with neither
    model.safetensors.index.json nor model.safetensors, FormatError for an index that is not
    one or names a file outside the folder. Also FormatError for a tensor the index places in a
    shard that lacks it, or a name in two shards."""
    from ..sharded import read_index  # the one reader of indexes (nvio.load_sharded's)

    folder = os.fsdecode(_args.path(path, "path"))
    dev = _common.device_of(device)
    weight_map = read_index(folder)
    paths = list(dict.fromkeys(weight_map.values()))
    files = [_common.File(p) for p in paths]
    owner: Dict[str, str] = {}
    for p, f in zip(paths, files):
        for tensor in f.entries:
            if tensor in owner:
                raise _format_error(folder, f"tensor {tensor!r} is in both {owner[tensor]!r} "
                                            f"and {p!r}")
            owner[tensor] = p
    for tensor, p in weight_map.items():
        if owner.get(tensor) != p:
            raise _format_error(p, f"the index places tensor {tensor!r} in this shard, which "
                                   "does not hold it")
    handle = shared_handle()._core
    torch = _common._torch()
    result: Dict[str, Any] = {}
    items = []
    if dev.type == "cpu":
        for f, region in zip(files, _read_regions(handle, files)):
            for name, e in f.entries.items():
                result[name] = _common.torch_from_region(region, f.data_offset, e)
        return result
    for f in files:
        for name, e in f.entries.items():
            dtype, shape = _common.torch_view(e.dtype, e.shape, name)
            t = torch.empty(shape, dtype=dtype, device=dev)
            result[name] = t
            if e.end > e.begin:
                items.append((t.data_ptr(), e.end - e.begin, f.data_offset + e.begin, f.path,
                              dev.type == "cuda"))
    if items:
        handle.read_batch(items)
    return result
