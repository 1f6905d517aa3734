"""DeepSpeed shims: switch from DeepNVMe with a one-line import change.

    from nvio.deepspeed import AsyncIOBuilder      # was: from deepspeed.ops.op_builder import ...
    h = AsyncIOBuilder().load().aio_handle()
    from nvio.deepspeed import GDSBuilder
    g = GDSBuilder().load().gds_handle()

and ``aio_handle_from_config(ds_config)`` for a DeepSpeed config's ``aio`` section.
"""

from __future__ import annotations

import difflib
import types
import warnings
from typing import Any, Mapping

from . import _aio, _nvio

# DeepSpeed's defaults for a missing key of the aio section (deepspeed/runtime/swap_tensor/
# constants.py). They differ from the aio_handle constructor's defaults (queue_depth 128,
# overlap_events False): a config that leaves a key out gets what DeepSpeed would give it.
_AIO_DEFAULTS = {
    "block_size": 1048576,
    "queue_depth": 8,
    "intra_op_parallelism": 1,
    "single_submit": False,
    "overlap_events": True,
    "use_gds": False,
}
# Older DeepSpeed configs and ds_nvme_tune output name the parallelism differently.
_PARALLELISM_ALIASES = ("thread_count", "num_threads")
_SECTION_KEYS = frozenset(_AIO_DEFAULTS) | frozenset(_PARALLELISM_ALIASES)
# Top-level keys of a whole DeepSpeed config: a mapping with one of these and no "aio" section is
# a DeepSpeed config that leaves aio at its defaults. Without one, the mapping must be an aio
# section, so that {'blok_size': 4096} is an error rather than silently all defaults.
_DEEPSPEED_TOP_LEVEL = frozenset((
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "optimizer", "scheduler", "fp16", "bf16", "amp", "zero_optimization", "gradient_clipping",
    "steps_per_print", "wall_clock_breakdown", "activation_checkpointing", "flops_profiler",
    "tensorboard", "wandb", "csv_monitor", "comms_logger", "prescale_gradients",
    "gradient_predivide_factor", "communication_data_type", "data_types", "checkpoint",
    "elasticity", "pipeline", "compression_training", "autotuning", "sparse_attention",
    "data_efficiency", "curriculum_learning", "memory_breakdown", "dump_state",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "nebula", "hybrid_engine",
    "weight_quantization", "torch_autocast", "compile", "sequence_parallel_size",
    "disable_allgather", "dataloader_drop_last", "use_data_before_expert_parallel_",
))


def _closest(key: Any, known) -> "str | None":
    """The known key `key` most likely misspells: transposed letters ('aoi') or a close match."""
    if not isinstance(key, str):
        return None
    for k in sorted(known):
        if sorted(k) == sorted(key):
            return k
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return close[0] if close else None


def _suggest(key: Any, known) -> str:
    close = _closest(key, known)
    return f"'{key}' (did you mean '{close}'?)" if close else f"'{key}'"


def _unknown_keys_error(where: str, keys, known) -> "_nvio.InvalidArgument":
    listed = ", ".join(_suggest(k, known) for k in sorted(keys))
    return _nvio.InvalidArgument(f"aio config: unknown {where} {listed}; known: {sorted(known)}")


def _deepspeed_memcpy(dest: Any, src: Any) -> int:
    dest.copy_(src)
    return 0


class AsyncIOBuilder:
    """Stands in for ``deepspeed.ops.op_builder.AsyncIOBuilder``."""

    NAME = "async_io"

    def is_compatible(self, verbose: bool = False) -> bool:
        """True: at least the psync engine works everywhere."""
        return any(ok for ok, _ in _nvio.probe_engines().values())

    def load(self, verbose: bool = True) -> types.ModuleType:
        """The op module: ``aio_handle``, ``aio_read``, ``aio_write``, ``deepspeed_memcpy``."""
        module = types.ModuleType("async_io", "nvio's implementation of DeepSpeed's async_io op")
        module.aio_handle = _aio.aio_handle
        module.aio_read = _aio.aio_read
        module.aio_write = _aio.aio_write
        module.deepspeed_memcpy = _deepspeed_memcpy
        return module


class GDSBuilder:
    """Stands in for ``deepspeed.ops.op_builder.GDSBuilder``: ``GDSBuilder().load().gds_handle()``.

    Works on every machine: without a GPU or cuFile the handle still moves host tensors, and CUDA
    tensors through the host bounce path (said once)."""

    NAME = "gds"

    def is_compatible(self, verbose: bool = False) -> bool:
        """True: gds_handle always works, through cuFile when it can and the bounce path else."""
        return True

    def load(self, verbose: bool = True) -> types.ModuleType:
        """The op module: ``gds_handle`` plus the ``async_io`` names DeepSpeed's gds op has."""
        module = types.ModuleType("gds", "nvio's implementation of DeepSpeed's gds op")
        module.gds_handle = _aio.gds_handle
        module.aio_handle = _aio.aio_handle
        module.aio_read = _aio.aio_read
        module.aio_write = _aio.aio_write
        module.deepspeed_memcpy = _deepspeed_memcpy
        return module


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"  # ds_nvme_tune prints "true"/"false" strings
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _nvio.InvalidArgument(f"aio config: {key} must be a boolean, got {value!r}")


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _nvio.InvalidArgument(f"aio config: {key} must be an integer, got {value!r}")
    return value


def _gds_usable() -> "tuple[bool, str]":
    """Whether cuFile can move CUDA tensors here (peer-to-peer or compatibility mode), and why not."""
    info = _nvio.gpu_info()
    return info["gds_mode"] != "unavailable", info["gds_reason"]


def aio_handle_from_config(config: Mapping[str, Any]) -> _aio.aio_handle:
    """An ``aio_handle`` from a DeepSpeed config (the whole config or just its ``aio`` section).

    Keys left out take DeepSpeed's defaults for the section (queue_depth 8, overlap_events true,
    single_submit false, intra_op_parallelism 1, block_size 1 MiB, use_gds false), not the
    constructor's. ``use_gds: true`` gives a ``gds_handle``; where cuFile is unusable that handle
    moves CUDA tensors through the host bounce path, which a ``RuntimeWarning`` says here.

    Unknown keys are an error in both forms (a typo must not silently fall back to a default):
    a mapping with an ``aio`` key is a whole config; one with other DeepSpeed top-level keys
    (``train_batch_size``, ``zero_optimization``, ...) is a whole config without an aio section
    (DeepSpeed's defaults, as DeepSpeed does), in which an aio setting or a near miss of one at
    the top level is an error; anything else is an aio section, checked key by key. ``thread_count`` and ``num_threads`` are
    accepted for ``intra_op_parallelism`` with a DeprecationWarning.
    """
    if not isinstance(config, Mapping):
        raise _nvio.InvalidArgument(
            f"aio config: expected a mapping (a DeepSpeed config or its aio section), got "
            f"{type(config).__name__}"
        )
    if "aio" in config and config["aio"] is None:
        section = {}  # DeepSpeed reads "aio": null as its defaults
    elif "aio" in config:
        if not isinstance(config["aio"], Mapping):
            raise _nvio.InvalidArgument(
                f"aio config: 'aio' must be a mapping, got {type(config['aio']).__name__}"
            )
        section = dict(config["aio"])
    elif set(config) & _DEEPSPEED_TOP_LEVEL:
        # A whole DeepSpeed config without an aio section: DeepSpeed's defaults. Its other keys
        # may be ones newer than this list, but not aio settings or near misses of them.
        aio_like = _SECTION_KEYS | {"aio"}
        misplaced = {k for k in set(config) - _DEEPSPEED_TOP_LEVEL if _closest(k, aio_like)}
        if misplaced:
            listed = ", ".join(_suggest(k, aio_like) for k in sorted(misplaced))
            raise _nvio.InvalidArgument(
                f"aio config: top-level key(s) {listed} of a DeepSpeed config look like aio "
                "settings, which belong in its 'aio' section"
            )
        section = {}
    else:
        section = dict(config)  # the aio section itself
    for alias in _PARALLELISM_ALIASES:
        if alias in section:
            warnings.warn(
                f"nvio: aio config key '{alias}' is deprecated; use 'intra_op_parallelism'",
                DeprecationWarning,
                stacklevel=2,
            )
            value = section.pop(alias)
            section.setdefault("intra_op_parallelism", value)
    unknown = set(section) - set(_AIO_DEFAULTS)
    if unknown:
        raise _unknown_keys_error("keys", unknown, _AIO_DEFAULTS)
    merged = {**_AIO_DEFAULTS, **section}
    settings = dict(
        block_size=_as_int("block_size", merged["block_size"]),
        queue_depth=_as_int("queue_depth", merged["queue_depth"]),
        single_submit=_as_bool("single_submit", merged["single_submit"]),
        overlap_events=_as_bool("overlap_events", merged["overlap_events"]),
        intra_op_parallelism=_as_int("intra_op_parallelism", merged["intra_op_parallelism"]),
    )
    if not _as_bool("use_gds", merged["use_gds"]):
        return _aio.aio_handle(**settings)
    usable, why = _gds_usable()
    if not usable:
        warnings.warn(
            f"nvio: aio config use_gds is true but cuFile is not usable here ({why}); the "
            "gds_handle moves CUDA tensors through the host bounce path",
            RuntimeWarning,
            stacklevel=2,
        )
    return _aio.gds_handle(**settings)
