"""Sharded checkpoints over torch.distributed: every rank writes its own safetensors shard in
parallel, and an index like the one published models carry (``model.safetensors.index.json``:
``{"metadata": {"total_size": N}, "weight_map": {tensor name: shard file}}``) says where each
tensor is. A checkpoint written by N ranks loads on any number of ranks (or none): a loader
reads the index and, from each shard, the tensors it asks for.

Which rank writes what: the ranks' key lists (with shapes and dtypes) are gathered through the
process group; a tensor held by several ranks (a replicated bias, say) is written once, by the
lowest rank holding it, and must have the same shape and dtype everywhere.

Atomic as a whole: shard files carry a save id that rank 0 draws and broadcasts
(``model-00001-of-00004.<id>.safetensors``), each is written atomically by
``nvio.safetensors.save_file``, and only once every rank has written its shard does rank 0
replace the index (a temporary file, fdatasync, rename, directory fsync) and then remove the
shards the new index no longer names. A crash at any moment leaves the old index with its old
shards, or the new index with its new shards.

Errors: a failure on any rank, a bad argument included, raises on every rank (``nvio.Error``
naming the failing ranks and their errors), so that no rank waits for ever for a peer that gave
up: each rank checks its arguments before the first collective but raises only after it, with
the others. A failed save removes the shards it wrote (the old index and shards stay). Rank 0
holds an exclusive flock of the directory from before any shard is written until the old shards
are removed, so two saves into one directory never remove each other's shards.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import json
import os
import re
import secrets
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from . import _args, _nvio
from .checkpoint import _typed

__all__ = ["save_sharded", "load_sharded", "INDEX_SUFFIX"]

INDEX_SUFFIX = ".safetensors.index.json"


def _dist():
    import torch.distributed as dist

    return dist


def _rank_and_size(group: Any) -> tuple:
    dist = _dist()
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    if group is not None:
        raise _nvio.InvalidArgument("nvio.save_sharded: group= given but torch.distributed is "
                                    "not initialized")
    return 0, 1


def _all_gather(obj: Any, group: Any, world: int) -> List[Any]:
    if world == 1:
        return [obj]
    out: List[Any] = [None] * world
    _dist().all_gather_object(out, obj, group=group)
    return out


def _broadcast(obj: Any, group: Any, world: int) -> Any:
    if world == 1:
        return obj
    dist = _dist()
    box = [obj]
    # The source is rank 0 of the group, given as a global rank.
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def _failure_text(error: Optional[BaseException]) -> Optional[str]:
    return None if error is None else f"{type(error).__name__}: {error}"


def _raise_failures(what: str, texts: Sequence[Optional[str]], error: Optional[BaseException],
                    directory: str) -> None:
    """Raises when any rank's text (gathered by rank) names a failure: this rank's own error
    where it is the only rank, else the nvio.Error naming every failing rank."""
    failed = [(r, e) for r, e in enumerate(texts) if e is not None]
    if not failed:
        return
    if error is not None and len(texts) == 1:
        raise error
    detail = "; ".join(f"rank {r}: {e}" for r, e in failed)
    raise _nvio.Error(f"nvio.{what}({directory!r}) failed on {len(failed)} of {len(texts)} "
                      f"ranks: {detail}") from error


def _raise_if_any_failed(what: str, error: Optional[BaseException], group: Any, world: int,
                         directory: str) -> None:
    """Every rank learns whether any rank failed; all raise together (none waits for ever)."""
    _raise_failures(what, _all_gather(_failure_text(error), group, world), error, directory)


def _write_index(path: str, index: Dict[str, Any]) -> None:
    """Replaces the index file atomically and durably (the core's replace-a-file mechanism)."""
    from ._handle import replace_file

    data = (json.dumps(index, indent=2, sort_keys=False) + "\n").encode()
    replace_file(None, path, [(data, 0)], sync=True)


def _remove_unlisted_shards(directory: str, prefix: str, keep: Iterable[str]) -> None:
    """Removes the shard files of earlier saves with this prefix that the index no longer names
    (and temporary files they left). Best effort: a file that cannot be removed stays."""
    keep = set(keep)
    pattern = re.compile(re.escape(prefix) + r"-\d{5}-of-\d{5}(\.[0-9a-f]{16})?\.safetensors$")
    for name in os.listdir(directory):
        if name not in keep and pattern.match(name):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _check_save(state_dict: Any, directory: Any, prefix: Any) -> tuple:
    """The directory as text and this rank's key facts (shape, dtype, bytes), or the typed error
    of a bad argument."""
    import torch

    text = os.fsdecode(_args.path(directory, "directory"))
    _args.utf8(prefix, "prefix")
    if not prefix or "/" in prefix or "\0" in prefix:
        raise _nvio.InvalidArgument(f"nvio.save_sharded: prefix {prefix!r} is not a file name "
                                    "prefix (empty, or holding '/' or NUL)")
    if not isinstance(state_dict, dict):
        raise _args.InvalidType(f"nvio.save_sharded: state_dict must be a dict of tensors, not "
                                f"{type(state_dict).__name__}")
    for key, value in state_dict.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise _args.InvalidType(f"nvio.save_sharded: every item must be str -> Tensor; "
                                    f"{key!r} -> {type(value).__name__}")
    mine = {k: (tuple(v.shape), str(v.dtype), v.numel() * v.element_size())
            for k, v in state_dict.items()}
    return text, mine


def _make_directory(text: str) -> None:
    try:
        os.makedirs(text, exist_ok=True)
    except OSError as e:
        if os.path.exists(text) and not os.path.isdir(text):
            e = NotADirectoryError(_errno.ENOTDIR, os.strerror(_errno.ENOTDIR))
        raise _typed(e, "save_sharded: creating the directory", text) from None


def _lock_directory(text: str) -> int:
    """An exclusive flock of the checkpoint directory (its descriptor, to close), held by rank 0
    from before any shard is written until its old shards are removed: a second save into the
    directory (another job, another thread) waits, instead of removing this one's new shards as
    unlisted or having its own removed. The directory itself is locked, so no lock file is left
    beside the checkpoint."""
    try:
        fd = os.open(text, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise _typed(e, "save_sharded: opening the directory", text) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError):
            raise _typed(e, "save_sharded: locking the directory", text) from None
        raise
    return fd


def _index_names(index_path: str, shard_names: Sequence[str]) -> bool:
    """Whether the index on disk names these shards (rank 0 failed after replacing it)."""
    try:
        with open(index_path, "rb") as f:
            weight_map = json.loads(f.read()).get("weight_map", {})
        return bool(weight_map) and set(weight_map.values()) <= set(shard_names)
    except (OSError, ValueError, AttributeError):
        return False


def save_sharded(state_dict: Dict[str, Any], directory: Any, group: Any = None, *,
                 prefix: str = "model", metadata: Optional[Dict[str, str]] = None) -> str:
    """Collective: every rank of ``group`` (default: the whole world; no process group: this
    process alone) calls it with the tensors it holds. Writes this rank's shard of ``directory``
    in parallel with the others, then rank 0 writes ``<prefix>.safetensors.index.json``.
    Returns the index's path (on every rank).

    Any failure on any rank, a bad argument included, raises on every rank (the ``nvio.Error``
    naming the failing ranks; alone, the rank's own error); the shards a failed save wrote are
    removed. Saves into one directory wait for each other (rank 0 locks it)."""
    rank, world = _rank_and_size(group)
    # Every check and local step before the first exchange only records its failure: a rank that
    # raised there would leave its peers waiting in the collective (gloo's timeout is 30 minutes
    # by default).
    error: Optional[BaseException] = None
    text = repr(directory)
    mine: Dict[str, Any] = {}
    lock = -1
    try:
        text, mine = _check_save(state_dict, directory, prefix)
        _make_directory(text)
        if rank == 0:
            lock = _lock_directory(text)
    except BaseException as e:  # every rank must hear of it (KeyboardInterrupt included)
        error = e
    try:
        gathered = _all_gather((_failure_text(error), mine,
                                secrets.token_hex(8) if rank == 0 else None), group, world)
        _raise_failures("save_sharded", [g[0] for g in gathered], error, text)
        return _save_shards(state_dict, text, group, rank, world, prefix, metadata,
                            save_id=gathered[0][2], everyone=[g[1] for g in gathered])
    finally:
        if lock >= 0:
            os.close(lock)


def _save_shards(state_dict: Dict[str, Any], text: str, group: Any, rank: int, world: int,
                 prefix: str, metadata: Optional[Dict[str, str]], save_id: str,
                 everyone: List[Dict[str, Any]]) -> str:
    """save_sharded once every rank's arguments are known good: the shards, then the index."""
    from . import safetensors

    owner: Dict[str, int] = {}
    error: Optional[BaseException] = None
    for r, held in enumerate(everyone):
        for key, facts in held.items():
            first = owner.setdefault(key, r)
            if first != r and everyone[first][key][:2] != facts[:2]:
                error = _nvio.InvalidArgument(
                    f"nvio.save_sharded: tensor {key!r} is {facts[0]} {facts[1]} on rank {r} "
                    f"but {everyone[first][key][0]} {everyone[first][key][1]} on rank {first}")
                break
    _raise_if_any_failed("save_sharded", error, group, world, text)

    shard_names = [f"{prefix}-{r + 1:05d}-of-{world:05d}.{save_id}.safetensors"
                   for r in range(world)]
    mine = os.path.join(text, shard_names[rank])
    try:
        own = {k: v for k, v in state_dict.items() if owner[k] == rank}
        safetensors.save_file(own, mine, metadata=metadata)
    except BaseException as e:
        error = e
    index_path = os.path.join(text, prefix + INDEX_SUFFIX)
    texts = _all_gather(_failure_text(error), group, world)
    published = False
    if not any(texts) and rank == 0:
        try:
            index = {
                "metadata": dict(metadata or {}, total_size=sum(
                    everyone[owner[k]][k][2] for k in owner)),
                "weight_map": {k: shard_names[owner[k]] for k in sorted(owner)},
            }
            _write_index(index_path, index)
            published = True
            _remove_unlisted_shards(text, prefix, shard_names)
        except BaseException as e:
            error = e
            published = _index_names(index_path, shard_names)
    if not any(texts):  # the index phase: rank 0 says whether the new index is in place
        gathered = _all_gather((_failure_text(error), published), group, world)
        texts, published = [g[0] for g in gathered], gathered[0][1]
    if any(texts) and not published:
        # Failed: the old index (and its shards) stays; the new shards would only take space.
        try:
            os.unlink(mine)
        except OSError:
            pass
    _raise_failures("save_sharded", texts, error, text)
    return index_path


def read_index(directory: Any, prefix: str = "model") -> Dict[str, str]:
    """The weight map of a sharded checkpoint: tensor name -> shard file (a path inside
    ``directory``). A directory holding a single ``<prefix>.safetensors`` and no index is a
    checkpoint of one shard."""
    from . import safetensors

    text = os.fsdecode(_args.path(directory, "directory"))
    index_path = os.path.join(text, prefix + INDEX_SUFFIX)
    try:
        with open(index_path, "rb") as f:
            index = json.loads(f.read())
    except FileNotFoundError:
        single = os.path.join(text, prefix + ".safetensors")
        if not os.path.exists(single):
            raise _nvio.FileNotFound(f"nvio.load_sharded: no {prefix + INDEX_SUFFIX} and no "
                                 f"{prefix}.safetensors in {text!r}") from None
        with safetensors.safe_open(single) as f:
            return {k: single for k in f.keys()}
    except (ValueError, OSError) as e:
        raise _nvio.FormatError(f"nvio.load_sharded: cannot read the index {index_path!r}: "
                                f"{e}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise _nvio.FormatError(f"nvio.load_sharded: {index_path!r} has no weight_map of "
                                "tensor name -> file")
    out = {}
    for key, name in weight_map.items():
        if os.path.isabs(name) or ".." in name.split("/"):
            raise _nvio.FormatError(f"nvio.load_sharded: {index_path!r} names {name!r} for "
                                    f"{key!r}, outside the checkpoint's directory")
        out[key] = os.path.join(text, name)
    return out


# Bytes per element of the safetensors dtypes (for dividing the work, so 1 for any other).
_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "C64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2,
                "BF16": 2, "I16": 2, "U16": 2}


def _split(keys: Sequence[str], sizes: Dict[str, int], rank: int, world: int) -> List[str]:
    """This rank's part of `keys`: the largest first, each to the rank with the fewest bytes so
    far (ties to the lowest rank), so that the ranks read about the same amount."""
    loads = [0] * world
    mine = []
    for key in sorted(keys, key=lambda k: (-sizes[k], k)):
        r = min(range(world), key=lambda i: (loads[i], i))
        loads[r] += sizes[key]
        if r == rank:
            mine.append(key)
    return sorted(mine)


def load_sharded(directory: Any, group: Any = None, *,
                 keys: Union[None, str, Iterable[str], Callable[[str], bool]] = None,
                 device: Any = "cpu", prefix: str = "model") -> Dict[str, Any]:
    """Loads tensors of a checkpoint written by ``save_sharded`` (on any number of ranks) or a
    published model's shards.

    ``keys``: ``None`` for every tensor; an iterable of names; a predicate on the name; or
    ``"split"``: the tensors are divided among the ranks of ``group`` (about the same bytes
    each; every tensor on exactly one rank), for a loader that scatters them itself. Each shard
    this rank needs is read once, its tensors straight into their memory."""
    from . import safetensors

    weight_map = read_index(directory, prefix)
    if keys is None:
        wanted = sorted(weight_map)
    elif isinstance(keys, str):
        if keys != "split":
            raise _nvio.InvalidArgument(f"nvio.load_sharded: keys={keys!r}: give a list of "
                                        "names, a predicate, None or 'split'")
        rank, world = _rank_and_size(group)
        sizes = {}
        for path in sorted(set(weight_map.values())):
            with safetensors.safe_open(path) as f:
                for k in f.keys():
                    if weight_map.get(k) == path:
                        sl = f.get_slice(k)
                        n = _DTYPE_BYTES.get(sl.get_dtype(), 1)
                        for d in sl.get_shape():
                            n *= d
                        sizes[k] = n
        for k in sorted(weight_map):
            if k not in sizes:
                raise _nvio.FormatError(f"nvio.load_sharded: the index names {weight_map[k]!r} "
                                        f"for {k!r}, which that file does not hold")
        wanted = _split(sorted(weight_map), sizes, rank, world)
    elif callable(keys):
        wanted = sorted(k for k in weight_map if keys(k))
    else:
        wanted = list(dict.fromkeys(keys))  # each name once, in the caller's order
        missing = [k for k in wanted if k not in weight_map]
        if missing:
            raise _nvio.InvalidArgument(f"nvio.load_sharded: {len(missing)} tensors are not in "
                                        f"the checkpoint: {missing[:5]}")
    by_file: Dict[str, List[str]] = {}
    for key in wanted:
        by_file.setdefault(weight_map[key], []).append(key)
    out: Dict[str, Any] = {}
    for path, names in sorted(by_file.items()):
        with safetensors.safe_open(path, device=device) as f:
            present = set(f.keys())
            for name in names:
                if name not in present:
                    raise _nvio.FormatError(f"nvio.load_sharded: the index names {path!r} for "
                                            f"{name!r}, which that file does not hold")
            if len(names) < len(present):
                out.update({name: f.get_tensor(name) for name in names})
        if len(names) == len(present):  # the whole shard: one read batch
            out.update(safetensors.load_file(path, device=device))
    return out
