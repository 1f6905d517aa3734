"""DeepSpeed shims: switch from DeepNVMe with a one-line import change.

    from nvio.deepspeed import AsyncIOBuilder      # was: from deepspeed.ops.op_builder import ...
    h = AsyncIOBuilder().load().aio_handle()
    from nvio.deepspeed import GDSBuilder
    g = GDSBuilder().load().gds_handle()

and ``aio_handle_from_config(ds_config)`` for a DeepSpeed config's ``aio`` section.

``install()`` makes an installed DeepSpeed's own ``AsyncIOBuilder``, ``GDSBuilder``,
``UtilsBuilder`` and ``PinMemoryBuilder`` resolve to these, so ZeRO-Infinity, ZeRO-Inference and
FastPersist run on nvio unchanged (``NVIO_DEEPSPEED=1`` does it at interpreter start through the
``nvio-deepspeed.pth`` file the package installs).
"""

from __future__ import annotations

import difflib
import threading
import types
import warnings
from typing import Any, Mapping

from . import _aio, _nvio
from ._args import InvalidType

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
# The handle option's range, from the core's option table.
_PARALLELISM_RANGE = next((s["min"], s["max"]) for s in _nvio.option_specs()
                          if s["name"] == "intra_op_parallelism")
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


class _OpBuilder:
    """What DeepSpeed's code asks of an op builder: ``NAME``, ``name``, ``absolute_name()``,
    ``is_compatible(verbose)``, ``load(verbose)`` and ``jit_load(verbose)``. Nothing is compiled:
    ``load`` returns a module of nvio's implementations, the same object every time."""

    NAME = ""
    _module: "types.ModuleType | None" = None

    def __init__(self) -> None:
        self.name = self.NAME

    def absolute_name(self) -> str:
        return f"nvio.deepspeed.{self.NAME}_op"

    def is_compatible(self, verbose: bool = False) -> bool:
        return True

    def _build(self) -> types.ModuleType:
        raise NotImplementedError

    def load(self, verbose: bool = True) -> types.ModuleType:
        cls = type(self)
        if cls.__dict__.get("_module") is None:
            cls._module = self._build()
        return cls._module

    def jit_load(self, verbose: bool = True) -> types.ModuleType:
        return self.load(verbose)


class AsyncIOBuilder(_OpBuilder):
    """Stands in for ``deepspeed.ops.op_builder.AsyncIOBuilder``."""

    NAME = "async_io"

    def is_compatible(self, verbose: bool = False) -> bool:
        """True: at least the psync engine works everywhere."""
        return any(ok for ok, _ in _nvio.probe_engines().values())

    def _build(self) -> types.ModuleType:
        """The op module: ``aio_handle``, ``aio_read``, ``aio_write``, ``deepspeed_memcpy``."""
        module = types.ModuleType("async_io", "nvio's implementation of DeepSpeed's async_io op")
        module.aio_handle = _aio.aio_handle
        module.aio_read = _aio.aio_read
        module.aio_write = _aio.aio_write
        module.deepspeed_memcpy = _deepspeed_memcpy
        return module


class GDSBuilder(_OpBuilder):
    """Stands in for ``deepspeed.ops.op_builder.GDSBuilder``: ``GDSBuilder().load().gds_handle()``.

    Works on every machine: without a GPU or cuFile the handle still moves host tensors, and CUDA
    tensors through the host bounce path (said once)."""

    NAME = "gds"

    def is_compatible(self, verbose: bool = False) -> bool:
        """True: gds_handle always works, through cuFile when it can and the bounce path else."""
        return True

    def _build(self) -> types.ModuleType:
        """The op module: ``gds_handle`` plus the ``async_io`` names DeepSpeed's gds op has."""
        module = types.ModuleType("gds", "nvio's implementation of DeepSpeed's gds op")
        module.gds_handle = _aio.gds_handle
        module.aio_handle = _aio.aio_handle
        module.aio_read = _aio.aio_read
        module.aio_write = _aio.aio_write
        module.deepspeed_memcpy = _deepspeed_memcpy
        return module


def _byte_view(tensor: Any) -> Any:
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise InvalidType(f"cast_to_byte_tensor: expected a torch tensor, got "
                          f"{type(tensor).__name__}")
    if not tensor.is_contiguous():
        # DeepSpeed's op wraps data_ptr() .. + nbytes, which is not this tensor's bytes.
        raise _nvio.InvalidArgument("cast_to_byte_tensor: the tensor is not contiguous; pass "
                                    "t.contiguous()")
    flat = tensor.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def cast_to_byte_tensor(src: Any) -> Any:
    """A ``torch.uint8`` view of a tensor's bytes (no copy: writes through either show in the
    other), or a list of them for a list of tensors: DeepSpeed's ``UtilsBuilder`` op."""
    if isinstance(src, (list, tuple)):
        return [_byte_view(t) for t in src]
    return _byte_view(src)


def _flatten(tensors: Any) -> Any:
    from torch._utils import _flatten_dense_tensors

    return _flatten_dense_tensors(tensors)


def _unflatten(flat: Any, tensors: Any) -> Any:
    from torch._utils import _unflatten_dense_tensors

    return _unflatten_dense_tensors(flat, tensors)


class UtilsBuilder(_OpBuilder):
    """Stands in for DeepSpeed's ``UtilsBuilder``: ``flatten``, ``unflatten`` (torch's dense
    flatten, which DeepSpeed's op calls) and ``cast_to_byte_tensor`` (FastPersist's)."""

    NAME = "utils"

    def _build(self) -> types.ModuleType:
        module = types.ModuleType("utils", "nvio's implementation of DeepSpeed's utils op")
        module.flatten = _flatten
        module.unflatten = _unflatten
        module.cast_to_byte_tensor = cast_to_byte_tensor
        return module


class pin_handle:  # noqa: N801 - DeepSpeed's name
    """DeepSpeed's native pinned-memory handle (``PinMemoryBuilder().load().pin_handle()``), on
    nvio's locked memory. The handle keeps each allocation's memory, not its tensor object, until
    ``free_cpu_locked_tensor`` (so DeepSpeed's finalizers on the tensor still run); the memory is
    unmapped when the handle and every tensor on it have let go, never under a live view."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owned: "dict[int, Any]" = {}

    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: Any) -> Any:
        """A page-aligned, locked (when RLIMIT_MEMLOCK allows) CPU tensor of ``num_elem``
        elements of the example's dtype."""
        from . import _args, _empty_locked_owned

        tensor, memory = _empty_locked_owned(_args.integer(num_elem, "num_elem"),
                                             example_tensor.dtype)
        if memory is not None:
            with self._lock:
                self._owned[tensor.data_ptr()] = memory
        return tensor

    def free_cpu_locked_tensor(self, locked_tensor: Any) -> bool:
        """Lets go of a tensor this handle made; False for any other."""
        return self.free_cpu_locked_tensor_by_ptr(locked_tensor.data_ptr())

    def free_cpu_locked_tensor_by_ptr(self, address: int) -> bool:
        """Lets go of the allocation starting at ``address``; False when this handle has none."""
        with self._lock:
            return self._owned.pop(int(address), None) is not None

    def is_pinned(self, buffer: Any) -> bool:
        """DeepSpeed's question, as ``aio_handle.is_pinned`` answers it."""
        return _aio.deepspeed_is_pinned(buffer)


class PinMemoryBuilder(_OpBuilder):
    """Stands in for DeepSpeed's ``PinMemoryBuilder`` (``DS_PIN_MEMORY_BACKEND=native``)."""

    NAME = "pin_memory"

    def _build(self) -> types.ModuleType:
        module = types.ModuleType("pin_memory", "nvio's implementation of DeepSpeed's pin_memory")
        module.pin_handle = pin_handle
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


def _parallelism(key: str, value: Any) -> int:
    """An intra_op_parallelism (or a deprecated alias of it) in the range of the handle option."""
    value = _as_int(key, value)
    low, high = _PARALLELISM_RANGE
    if not low <= value <= high:
        raise _nvio.InvalidArgument(
            f"aio config: {key} must be between {low} and {high}, got {value}")
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
            if "intra_op_parallelism" in section:
                # Overridden, but still a value the user wrote: refused as the key it stands for
                # would refuse it, never silently dropped.
                _parallelism(alias, value)
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
        intra_op_parallelism=_parallelism("intra_op_parallelism", merged["intra_op_parallelism"]),
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


# ---- DeepSpeed on nvio without rebuilding it -----------------------------------------
from ._deepspeed_install import (  # noqa: E402,F401  (the public names of this module)
    TESTED_VERSIONS,
    InstallFailed,
    NothingToPatch,
    install,
    install_from_environment,
    installed,
    uninstall,
)
