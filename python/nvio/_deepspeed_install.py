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

After patching, every route above is checked (``_verify``); when one still reaches DeepSpeed's own
builder, everything is put back and ``install()`` raises ``InstallFailed`` (when DeepSpeed is
imported later, through the finder: a ``RuntimeWarning`` and DeepSpeed left as it is), so a
half-patched DeepSpeed is never left behind. A DeepSpeed version outside ``TESTED_VERSIONS`` is
patched, verified and named in a ``RuntimeWarning``; one whose op DeepSpeed has already loaded
(``OpBuilder._loaded_ops``) gets a ``RuntimeWarning`` that what it made with it stays DeepSpeed's.
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


# The DeepSpeed releases install() was tested against (tests/python/test_deepspeed_real.py, with
# requirements.txt's pin); a stand-in or another release warns (its release part, before any +).
TESTED_VERSIONS = ("0.19.8",)


class NothingToPatch(_nvio.Error, ImportError):
    """``install()`` found no DeepSpeed, or a DeepSpeed without the op builders it replaces."""


class InstallFailed(_nvio.Error, RuntimeError):
    """``install()`` patched DeepSpeed but a route to a builder still reached DeepSpeed's own; it
    put everything back before raising."""


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
        if module.__name__ == "deepspeed":  # the package has run: everything it imported is here
            _warn_untested_version(module)
            problems = _verify()
            if problems:
                uninstall()
                warnings.warn(f"nvio: {_failure_text(problems)}; DeepSpeed left on its own ops",
                              RuntimeWarning, stacklevel=2)
                return
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


def _release(version: str) -> str:
    return version.split("+", 1)[0].strip()


def _warn_untested_version(deepspeed: types.ModuleType) -> None:
    version = str(getattr(deepspeed, "__version__", "unknown"))
    if _release(version) not in TESTED_VERSIONS:
        warnings.warn(f"nvio: DeepSpeed {version} is not a release nvio.deepspeed.install() was "
                      f"tested with ({', '.join(TESTED_VERSIONS)}); it was patched and every route "
                      "to the builders checked", RuntimeWarning, stacklevel=3)


def _warn_ops_loaded_before() -> None:
    """Names the ops DeepSpeed loaded itself before install(): what it made with them stays its."""
    builder = sys.modules.get("deepspeed.ops.op_builder.builder")
    loaded = getattr(getattr(builder, "OpBuilder", None), "_loaded_ops", None)
    if not isinstance(loaded, dict):
        return
    ours = {getattr(cls, "NAME", None) for cls in _nvio_builders().values()}
    early = sorted(name for name in loaded if name in ours)
    if early:
        ops = " and ".join(early) + (" ops" if len(early) > 1 else " op")
        warnings.warn(f"nvio: DeepSpeed had already loaded its own {ops} before "
                      "nvio.deepspeed.install(): the handles, swappers and engines it made with "
                      "them keep using them; builders loaded from now on give nvio's",
                      RuntimeWarning, stacklevel=3)


def _verify() -> List[str]:
    """The routes to a replaced builder that still reach DeepSpeed's: every loaded ``deepspeed``
    module's bindings, and the current accelerator's get_op_builder / create_op_builder."""
    ours = _nvio_builders()
    theirs = {id(cls) for cls in _originals.values()}
    theirs |= {id(previous) for _, _, previous, _ in _records if isinstance(previous, type)}
    problems = []
    for module_name, module in list(sys.modules.items()):
        if not (_is_deepspeed_module(module_name) and isinstance(module, types.ModuleType)):
            continue
        for attribute, value in list(vars(module).items()):
            named = attribute in ours or getattr(value, "__name__", None) in ours
            if named and id(value) in theirs:  # not NotImplementedBuilder under its own name
                problems.append(f"{module_name}.{attribute} is still DeepSpeed's")
    real = sys.modules.get("deepspeed.accelerator.real_accelerator")
    accelerator = getattr(real, "ds_accelerator", None) if real is not None else None
    if accelerator is not None:
        for name, cls in ours.items():
            for method in _WRAPPED_METHODS:
                try:
                    got = getattr(accelerator, method)(name)
                except Exception as e:  # noqa: BLE001 - any failure is a route not patched
                    problems.append(f"accelerator.{method}({name!r}) raised {e!r}")
                    continue
                if got is not cls and not isinstance(got, cls):
                    problems.append(f"accelerator.{method}({name!r}) gave {got!r}")
    return problems


def _failure_text(problems: List[str]) -> str:
    shown = "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5
                                       else "")
    return f"nvio.deepspeed.install() could not route every way to the builders: {shown}"


def installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _installed


def install() -> None:
    """Makes DeepSpeed's ``AsyncIOBuilder``, ``GDSBuilder``, ``UtilsBuilder`` and
    ``PinMemoryBuilder`` resolve to nvio's, whether DeepSpeed is imported already or later.

    Idempotent: a second call changes nothing, and one ``uninstall()`` undoes both. Raises
    ``NothingToPatch`` (an ``nvio.Error`` and ``ImportError``) when DeepSpeed is neither imported
    nor importable, or is imported without any of those builders, and ``InstallFailed`` when a
    route to a builder still reaches DeepSpeed's after patching; nothing is left installed then.
    Warns (``RuntimeWarning``) for a DeepSpeed release outside ``TESTED_VERSIONS`` and when
    DeepSpeed had already loaded one of those ops itself (what it made with it stays its own)."""
    global _installed
    with _lock:
        if "deepspeed" not in sys.modules and importlib.util.find_spec("deepspeed") is None:
            raise NothingToPatch("nvio.deepspeed.install(): DeepSpeed is not installed here (no "
                                 "module 'deepspeed' on sys.path): nothing to patch")
        if _installed:
            return  # the finder has patched every deepspeed module imported since
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
        problems = _verify()
        if problems:
            uninstall()
            raise InstallFailed(_failure_text(problems))
        _warn_untested_version(sys.modules["deepspeed"])
        _warn_ops_loaded_before()


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
        replaced = [prev for _, _, prev, _ in _records if isinstance(prev, type)]
        _records.clear()
        _restore_unrecorded(replaced)
        _originals.clear()


def _restore_unrecorded(replaced: List[type]) -> None:
    """Modules imported while installed bound nvio's classes without a record (they imported them
    from a module already patched): each gets what DeepSpeed's own code would have bound there. A
    package gets the one class of that name defined inside it (deepspeed.ops.op_builder.cpu: its
    async_io module's); what is still nvio's after that, what the accelerator now gives."""
    ours = _nvio_builders()
    by_identity = {id(cls): name for name, cls in ours.items()}
    modules = sorted(((name, module) for name, module in list(sys.modules.items())
                      if _is_deepspeed_module(name) and isinstance(module, types.ModuleType)),
                     key=lambda item: -item[0].count("."))  # the deepest first
    for by_package in (True, False):
        for module_name, module in modules:
            for attribute, value in list(vars(module).items()):
                builder = by_identity.get(id(value))
                if builder is None:
                    continue
                if by_package:
                    inside = {id(c): c for c in replaced if c.__name__ == builder
                              and c.__module__.startswith(module_name + ".")}
                    original = next(iter(inside.values())) if len(inside) == 1 else None
                else:
                    original = _deepspeed_builder(builder, ours[builder])
                if original is not None:
                    setattr(module, attribute, original)


def _deepspeed_builder(name: str, ours: type) -> Optional[type]:
    """DeepSpeed's class for a builder name with nvio's patch undone: what the current accelerator
    gives (as deepspeed.ops.op_builder binds it at import), else the first class replaced."""
    real = sys.modules.get("deepspeed.accelerator.real_accelerator")
    accelerator = getattr(real, "ds_accelerator", None) if real is not None else None
    if accelerator is not None:
        try:
            found = accelerator.get_op_builder(name)
        except Exception:  # noqa: BLE001 - then the recorded original will do
            found = None
        if isinstance(found, type) and found is not ours:
            return found
    return _originals.get(name)


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
