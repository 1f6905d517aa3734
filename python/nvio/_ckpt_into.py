"""``nvio.load(path, into=state_dict)``: the checkpoint's tensors read straight into existing
tensors (checkpoint.py's load calls ``load_into``)."""

from __future__ import annotations

import os
import pickle
from typing import Any, List, Tuple

from . import _args, _buffers, _nvio
from ._handle import shared_handle
from ._torchzip import _Archive, _FileView, _MetaRecords, _typed

def load_into(torch: Any, unpickle: Any, raw: bytes, text: str, into: Any, handle: Any) -> Any:
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
    through memory nvio owns); each tensor must lie inside its record. ``unpickle`` is
    checkpoint._unpickle."""
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
            loaded = unpickle(torch, records, lambda storage, location: storage, True)
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

