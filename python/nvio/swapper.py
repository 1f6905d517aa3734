"""``nvio.TensorSwapper``: tensors swapped out to NVMe files and back under a memory budget.

The core (``nvio::Swapper``, include/nvio/swapper.hpp) works on bytes; this layer turns tensors
into (address, nbytes, device) and back, and keeps each tensor's dtype and shape with its name
(also in snapshots), so that ``swap_in(name)`` can return a tensor of the right kind.

The budget counts the caller's memory pinned by write-behind (each ``swap_out``'s tensor until its
write has finished) plus the locked pool memory the swapper maps: tensors lent by ``swap_in``
without ``out=`` (until the caller drops them), prefetched data not yet claimed, snapshot staging
and free pool memory kept for reuse. It never exceeds ``budget_bytes``: new work waits for I/O to
free memory, or raises ``nvio.BudgetExceeded`` with the sizes when it can never fit.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Iterable, List, Optional, Union

from . import _args, _buffers, _nvio
from ._future import Count, Future, PendingFutures

__all__ = ["TensorSwapper"]

PathLike = Union[str, bytes, "os.PathLike[str]"]


def _describe(obj: Any) -> str:
    """What swap_in needs to rebuild `obj` from its bytes: the kind, dtype and shape (JSON)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return json.dumps({"kind": "torch", "dtype": str(obj.dtype).removeprefix("torch."),
                           "shape": list(obj.shape)})
    if type(obj).__module__ == "numpy" and hasattr(obj, "__array_interface__"):
        return json.dumps({"kind": "numpy", "dtype": obj.dtype.str, "shape": list(obj.shape)})
    return json.dumps({"kind": "bytes"})


def _rebuild(buf: Any, nbytes: int, meta: str, name: str) -> Any:
    """A tensor (or array, or memoryview) over `buf`, a lent buffer of `nbytes` bytes. A
    description that does not fit the bytes (an index edited or damaged: the index's checksums
    cover the data, not the descriptions) raises nvio.FormatError naming the tensor."""
    try:
        desc = json.loads(meta) if meta else {"kind": "bytes"}
    except ValueError:
        desc = {"kind": "bytes"}
    if not isinstance(desc, dict):
        desc = {"kind": "bytes"}
    kind = desc.get("kind")
    if kind not in ("torch", "numpy"):
        return memoryview(buf) if nbytes else memoryview(b"")

    def bad(what: str) -> _nvio.FormatError:
        return _nvio.FormatError(f"nvio.TensorSwapper: the index describes {name!r} as {meta}: "
                                 f"{what}")

    shape = desc.get("shape")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise bad("its shape is not a list of sizes")
    if kind == "torch":
        import torch

        dtype = getattr(torch, desc.get("dtype"), None) if isinstance(desc.get("dtype"), str) \
            else None
        if not isinstance(dtype, torch.dtype):
            raise bad("not a torch dtype")
        itemsize = torch.empty((), dtype=dtype).element_size()
    else:
        import numpy

        if desc.get("dtype") is None:  # numpy.dtype(None) is float64
            raise bad("not a numpy dtype")
        try:
            dtype = numpy.dtype(desc.get("dtype"))
        except (TypeError, ValueError):
            raise bad("not a numpy dtype") from None
        if dtype.hasobject:
            raise bad("a dtype of Python objects")
        itemsize = dtype.itemsize
    count = 1
    for d in shape:
        count *= d
    if count * itemsize != nbytes:
        raise bad(f"{count} elements of {itemsize} bytes, where {nbytes} bytes were swapped out")
    if kind == "torch":
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(shape)
    if nbytes == 0:
        return numpy.empty(shape, dtype=dtype)
    return numpy.frombuffer(buf, dtype=dtype).reshape(shape)


class TensorSwapper:
    """Swaps named tensors between memory and files in ``dir`` under a memory budget in bytes.

    ``swap_out(name, tensor)`` starts writing the tensor and returns an ``nvio.Future``: the
    tensor must stay unchanged until it has finished (its memory can then be released).
    ``swap_in(name, out=None)`` returns the bytes in ``out`` (a tensor of any memory kind, CPU or
    CUDA, of the same size) or in a tensor over a pooled locked buffer, with the dtype and shape
    it was swapped out with. ``prefetch(names)`` reads names ahead, each on its own, as far as the
    budget allows (the rest queued until it frees up); ``evict(name)`` forgets one; ``wait()``
    waits for all I/O in flight; ``snapshot(dst_dir)`` copies the swapped state into a directory
    another ``TensorSwapper`` can open.

    Any size and dtype; small tensors share pack files, large ones (``pack_threshold`` bytes and
    more) get files of their own at 4 KiB-aligned offsets. ``checksums=True`` keeps an XXH3-64 of
    each CPU tensor, verified on every read back into host memory (``nvio.ChecksumMismatch`` names
    the tensor, file and offset). The directory is locked while the swapper lives (a second one
    raises ``nvio.DirectoryLocked``); the files left by a process that died holding it are removed
    by the next open, with a ``RuntimeWarning`` saying what was removed. The keyword ``options``
    are ``nvio.Handle``'s. Thread-safe; a context manager that closes on exit.
    """

    def __init__(self, dir: PathLike, budget_bytes: int, *, checksums: bool = False,
                 pack_threshold: int = 1 << 20, pack_file_size: int = 64 << 20,
                 **options: Any) -> None:
        budget = _args.integer(budget_bytes, "budget_bytes")
        threshold = _args.integer(pack_threshold, "pack_threshold")
        pack_size = _args.integer(pack_file_size, "pack_file_size")
        for value, name in ((budget, "budget_bytes"), (threshold, "pack_threshold"),
                            (pack_size, "pack_file_size")):
            if value < 0:
                raise _nvio.InvalidArgument(f"nvio: {name} must not be negative, got {value}")
        self._core = _nvio.Swapper(_args.path(dir, "dir"), budget, threshold, pack_size,
                                   _args.boolean(checksums, "checksums"),
                                   **_args.options(options, "nvio.TensorSwapper"))
        self._checksums = bool(checksums)
        self._pending = PendingFutures()

    @property
    def directory(self) -> str:
        return self._core.directory

    def swap_out(self, name: str, tensor: Any) -> Future:
        """Starts writing `tensor` as `name` (replacing what the name held); returns its Future.

        Blocks while write-behind fills the budget; raises ``nvio.BudgetExceeded`` when the
        tensor is larger than the whole budget. Write errors come from the Future's ``wait()``,
        ``wait()`` and ``swap_in(name)``."""
        ref = _buffers.resolve(tensor, writable=False)
        future = Future(self._core, ref.nbytes, ref.owner, self._pending)
        self._core.swap_out(future, _name(name), ref.address, ref.nbytes, ref.device,
                            _describe(tensor))
        return future

    def swap_in(self, name: str, out: Any = None) -> Any:
        """The tensor swapped out as `name`: read into `out` (returned), or into a tensor over a
        pooled locked buffer that counts against the budget until it is dropped. Prefetched data
        is used when there is some; a write still in flight is waited for first."""
        key = _name(name)
        if out is None:
            buf, meta = self._core.swap_in(key)
            return _rebuild(buf, buf.nbytes, meta, key)
        ref = _buffers.resolve(out, writable=True)
        if ref.device and self._checksums:
            info = self._core.info(key)
            if info is not None and info["checksum"] is not None:
                # Verified in host memory, then copied to the device.
                out.copy_(self.swap_in(key))
                return out
        self._core.swap_in_into(key, ref.address, ref.nbytes, ref.device)
        return out

    def swap_in_batch(self, pairs: Any) -> List[Any]:
        """``swap_in(name, out)`` for each ``(name, out)`` pair (or each item of a dict name ->
        out), with the reads in flight together as one batch: many small tensors come in at the
        drive's speed instead of one read at a time. Returns the ``out`` tensors in order. Every
        pair is checked before any is read."""
        items = list(pairs.items()) if isinstance(pairs, dict) else list(pairs)
        batch, keep, singles = [], [], []
        for item in items:
            try:
                name, out = item
            except (TypeError, ValueError):
                raise _args.InvalidType(
                    f"nvio: swap_in_batch takes (name, out) pairs, got {type(item).__name__}"
                ) from None
            key = _name(name)
            ref = _buffers.resolve(out, writable=True)
            if ref.device and self._checksums:
                singles.append((key, out))  # verified in host memory: see swap_in
                continue
            batch.append((key, ref.address, ref.nbytes, ref.device))
            keep.append(ref)
        if batch:
            self._core.swap_in_batch(batch)
        for key, out in singles:
            self.swap_in(key, out)
        return [out for _, out in items]

    def prefetch(self, names: Iterable[str]) -> int:
        """Reads `names` ahead into pooled buffers for the swap_ins to come, without waiting:
        each name is a read of its own (a ``swap_in`` waits for its own bytes only). Names are
        queued in order behind earlier prefetches and started as far as the budget has room; the
        rest start, in order, as memory frees up (a write or read finishes, a ``swap_in`` consumes
        prefetched data, ``evict``, or a lent tensor dropped, seen at the next call). Queued reads
        never start while other work waits for room, and prefetched data is never dropped for
        more. A ``swap_in`` of a queued name reads it directly (into ``out=`` when given);
        ``swap_out``, ``evict`` and ``close`` take queued names out. Returns how many names this
        call started or queued: names whose write is in flight, already queued or prefetched,
        empty, larger than the budget, or past 4096 queued names are skipped.
        ``stats()["prefetch_queued"]`` counts the names waiting."""
        if isinstance(names, (str, bytes)):
            names = [names]
        return self._core.prefetch([_name(n) for n in names])

    def evict(self, name: str) -> bool:
        """Forgets `name` and frees its file space (after its I/O in flight); False if unknown."""
        return self._core.evict(_name(name))

    def wait(self) -> None:
        """Waits for every write and prefetch in flight; raises the first write failure."""
        self._core.wait_all()

    def stats(self) -> Dict[str, int]:
        """Counters: the budget and what holds it (held_bytes = writing_bytes + pool_bytes),
        tensors and bytes stored, files, I/O in flight, names queued for prefetch
        (prefetch_queued), totals since open."""
        return self._core.stats()

    def info(self, name: str) -> Optional[Dict[str, Any]]:
        """Size, description, file, offset and checksum of `name`, or None."""
        return self._core.info(_name(name))

    def names(self) -> List[str]:
        return self._core.names()

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._core.contains(name)

    def __len__(self) -> int:
        return len(self._core.names())

    def snapshot(self, dst_dir: PathLike) -> None:
        """Copies every tensor (after the writes in flight) into `dst_dir`, which must hold no
        swap data yet: one data file and an index, synced, that ``TensorSwapper(dst_dir, ...)``
        swaps in from. Checksums are verified on the way. Staging memory comes from the budget."""
        self._core.snapshot(_args.path(dst_dir, "dst_dir"))

    def close(self, delete_files: bool = True) -> None:
        """Waits for all I/O, removes the swap files (or, with ``delete_files=False``, keeps them
        with an index so that the directory opens again) and releases the directory."""
        try:
            self._pending.wait_all(Count.WAITED)
        except BaseException:
            pass  # each Future keeps its error; close() raises the swapper's first below
        self._core.close(_args.boolean(delete_files, "delete_files"))

    def __enter__(self) -> "TensorSwapper":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self._core.stats()
        return (f"<nvio.TensorSwapper {self.directory!r}: {s['tensors']} tensors, "
                f"{s['held_bytes']}/{s['budget_bytes']} budget bytes held>")


def _name(name: Any) -> str:
    return _args.utf8(name, "a tensor's name")
