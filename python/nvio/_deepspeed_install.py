"""Makes an installed DeepSpeed's op builders resolve to nvio (``nvio.deepspeed.install()``).

DeepSpeed reaches its builders three ways: ``from deepspeed.ops.op_builder import AsyncIOBuilder``
(names its op_builder package sets at import from the accelerator), the accelerator's
``get_op_builder(name)`` / ``create_op_builder(name)``, and modules that bound a builder class when
they were imported. So, for the builders in ``BUILDERS``:

* in every loaded ``deepspeed`` module, a class bound under one of their names is replaced by
  nvio's (strings, such as ``builder_names``' constants, are left alone);
* the class of DeepSpeed's current accelerator (``get_accelerator()``) gets ``get_op_builder`` /
  ``create_op_builder`` wrapped so that asking for one of those names gives nvio's;
* a finder at the front of ``sys.meta_path`` does both to every ``deepspeed`` module imported
  later, right after it has run, so installing before ``import deepspeed`` works too.

Everything replaced is recorded and ``uninstall()`` puts it back. Handles made while installed
stay nvio's.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import threading
import types
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _nvio

_BUILDER_NAMES = ("AsyncIOBuilder", "GDSBuilder", "UtilsBuilder", "PinMemoryBuilder")
_WRAPPED_METHODS = ("get_op_builder", "create_op_builder")
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


class NothingToPatch(_nvio.Error, ImportError):
    """``install()`` found no DeepSpeed, or a DeepSpeed without the op builders it replaces."""


_lock = threading.RLock()
_installed = False
# (owner, attribute, previous value, whether the owner had the attribute itself), in patch order.
_records: List[Tuple[Any, str, Any, bool]] = []
# The original class for each builder name: what deepspeed.ops.op_builder held, else the first seen.
_originals: Dict[str, Any] = {}


def _nvio_builders() -> Dict[str, type]:
    from . import deepspeed as ours

    return {name: getattr(ours, name) for name in _BUILDER_NAMES}


def _is_deepspeed_module(name: str) -> bool:
    return name == "deepspeed" or name.startswith("deepspeed.")


def _set(owner: Any, attribute: str, value: Any) -> None:
    had = attribute in vars(owner)
    _records.append((owner, attribute, vars(owner).get(attribute), had))
    setattr(owner, attribute, value)


def _builder_override(class_name: Any) -> Optional[type]:
    if not _installed or not isinstance(class_name, str):
        return None
    return _nvio_builders().get(class_name)


def _wrap(method: str, original: Callable) -> Callable:
    if method == "get_op_builder":
        def get_op_builder(self, class_name, *args, **kwargs):
            ours = _builder_override(class_name)
            return ours if ours is not None else original(self, class_name, *args, **kwargs)

        wrapper = get_op_builder
    else:
        def create_op_builder(self, class_name, *args, **kwargs):
            ours = _builder_override(class_name)
            return ours() if ours is not None else original(self, class_name, *args, **kwargs)

        wrapper = create_op_builder
    wrapper.__doc__ = original.__doc__
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.__nvio_wrapper__ = True  # type: ignore[attr-defined]
    return wrapper


def _patch_accelerator_class(cls: type) -> bool:
    patched = False
    for method in _WRAPPED_METHODS:
        current = getattr(cls, method, None)
        if (current is None or getattr(current, "__nvio_wrapper__", False)
                or getattr(current, "__isabstractmethod__", False)):
            continue  # absent, wrapped already, or the abstract base's declaration
        _set(cls, method, _wrap(method, current))
        patched = True
    return patched


def _patch_module(module: types.ModuleType) -> int:
    """Replaces the builder classes bound in `module`; returns how many it replaced."""
    ours = _nvio_builders()
    mine = set(map(id, ours.values()))
    replaced = 0
    for attribute, value in list(vars(module).items()):
        if not isinstance(value, type) or id(value) in mine:
            continue
        name = attribute if attribute in ours else getattr(value, "__name__", None)
        if name in ours:
            if module.__name__ == "deepspeed.ops.op_builder" or name not in _originals:
                _originals[name] = value
            _set(module, attribute, ours[name])
            replaced += 1
    return replaced


def _patch_current_accelerator() -> None:
    real = sys.modules.get("deepspeed.accelerator.real_accelerator")
    accelerator = getattr(real, "ds_accelerator", None) if real is not None else None
    if accelerator is not None:
        _patch_accelerator_class(type(accelerator))


def _after_import(module: types.ModuleType) -> None:
    with _lock:
        if not _installed:
            return
        _patch_module(module)
        _patch_current_accelerator()
        if module.__name__ == "deepspeed.ops.op_builder":
            if not any(isinstance(getattr(module, n, None), type) for n in _BUILDER_NAMES):
                warnings.warn(
                    f"nvio: deepspeed.ops.op_builder has none of {', '.join(_BUILDER_NAMES)}: "
                    "nvio.deepspeed.install() has nothing to replace in this DeepSpeed",
                    RuntimeWarning,
                    stacklevel=2,
                )


class _PatchingLoader(importlib.abc.Loader):
    """The real loader, with nvio's patch applied to the module right after it has run."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Optional[types.ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        _after_import(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, is_package...
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``deepspeed`` modules with the other finders and wraps their loaders."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not _is_deepspeed_module(fullname):
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchingLoader(spec.loader)
            return spec
        return None


_finder = _Finder()


def installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _installed


def install() -> None:
    """Makes DeepSpeed's ``AsyncIOBuilder``, ``GDSBuilder``, ``UtilsBuilder`` and
    ``PinMemoryBuilder`` resolve to nvio's, whether DeepSpeed is imported already or later.

    Idempotent. Raises ``NothingToPatch`` (an ``nvio.Error`` and ``ImportError``) when DeepSpeed
    is neither imported nor importable, or is imported without any of those builders; nothing is
    left installed then."""
    global _installed
    with _lock:
        if "deepspeed" not in sys.modules and importlib.util.find_spec("deepspeed") is None:
            raise NothingToPatch("nvio.deepspeed.install(): DeepSpeed is not installed here (no "
                                 "module 'deepspeed' on sys.path): nothing to patch")
        _installed = True
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        if "deepspeed" not in sys.modules:
            return  # the finder patches it as it is imported
        try:
            op_builder = importlib.import_module("deepspeed.ops.op_builder")
        except ImportError as e:
            uninstall()
            raise NothingToPatch(f"nvio.deepspeed.install(): deepspeed.ops.op_builder cannot be "
                                 f"imported ({e}): nothing to patch") from e
        for name, module in list(sys.modules.items()):
            if _is_deepspeed_module(name) and isinstance(module, types.ModuleType):
                _patch_module(module)
        _patch_current_accelerator()
        ours = _nvio_builders()
        if not any(getattr(op_builder, n, None) is ours[n] for n in _BUILDER_NAMES):
            uninstall()
            raise NothingToPatch(f"nvio.deepspeed.install(): deepspeed.ops.op_builder has none "
                                 f"of {', '.join(_BUILDER_NAMES)}: nothing to patch")


def uninstall() -> None:
    """Undoes ``install()``: the finder goes and every replaced binding and wrapped method gets its
    DeepSpeed value back, also in modules imported while installed. A no-op when not installed."""
    global _installed
    with _lock:
        _installed = False
        while _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        for owner, attribute, previous, had in reversed(_records):
            if had:
                setattr(owner, attribute, previous)
            elif attribute in vars(owner):
                delattr(owner, attribute)
        _records.clear()
        # Modules imported while installed bound nvio's classes without a record.
        by_identity = {id(cls): name for name, cls in _nvio_builders().items()}
        for name, module in list(sys.modules.items()):
            if not (_is_deepspeed_module(name) and isinstance(module, types.ModuleType)):
                continue
            for attribute, value in list(vars(module).items()):
                builder = by_identity.get(id(value))
                if builder is not None and builder in _originals:
                    setattr(module, attribute, _originals[builder])
        _originals.clear()


def install_from_environment() -> bool:
    """``install()`` when ``NVIO_DEEPSPEED`` is 1/true/yes/on (the ``.pth`` hook calls this at
    interpreter start). Never raises: a DeepSpeed that cannot be patched, or a value that is
    neither on nor off, is a ``RuntimeWarning``. Returns whether it installed."""
    value = os.environ.get("NVIO_DEEPSPEED", "").strip().lower()
    if value in _OFF:
        return False
    if value not in _ON:
        warnings.warn(f"nvio: NVIO_DEEPSPEED={value!r} is neither on (1, true, yes, on) nor off "
                      "(0, false, no, off): DeepSpeed left alone", RuntimeWarning, stacklevel=2)
        return False
    try:
        install()
    except NothingToPatch as e:
        warnings.warn(f"nvio: NVIO_DEEPSPEED is set but {e}", RuntimeWarning, stacklevel=2)
        return False
    return True
