"""The type stub of the compiled core (nvio/_nvio.pyi) against the module itself.

The stub is read with ``ast`` (never imported) from next to the imported extension, so the copy
checked is the one shipped with it. pybind11 puts each binding's signature in the first line of
its ``__doc__`` (``name(arg: type = default, ...) -> type``); that line is parsed as a ``def`` to
compare parameter names and which have defaults. An argument the binding left unnamed
(``arg0``) cannot be passed by keyword, so the stub must declare it positional-only.
"""

from __future__ import annotations

import ast
import builtins
import os
import pathlib
import re

import pytest

from nvio import _nvio

STUB = pathlib.Path(_nvio.__file__).with_name("_nvio.pyi")
SOURCE_STUB = pathlib.Path(__file__).resolve().parents[2] / "python" / "nvio" / "_nvio.pyi"
# Public module attributes that start with an underscore.
PUBLIC_DUNDERS = ("__version__",)
_UNNAMED = re.compile(r"arg\d+$")


def _public(name: str) -> bool:
    return not name.startswith("_") or name in PUBLIC_DUNDERS


def _stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text(), filename=str(STUB))


def _stub_names() -> "dict[str, ast.AST]":
    """Public top-level names of the stub: classes, functions and annotated values."""
    names: "dict[str, ast.AST]" = {}
    for node in _stub_tree().body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return {k: v for k, v in names.items() if _public(k)}


def _runtime_names() -> "dict[str, object]":
    return {k: getattr(_nvio, k) for k in dir(_nvio) if _public(k)} | {
        k: getattr(_nvio, k) for k in PUBLIC_DUNDERS
    }


def _is_exception(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseException)


def _stub_is_exception(name: str, classes: "dict[str, ast.ClassDef]") -> bool:
    """Whether the stub's class ``name`` derives, through the stub's classes, from an exception."""
    for base in classes[name].bases:
        base_name = ast.unparse(base)
        if base_name in classes:
            if _stub_is_exception(base_name, classes):
                return True
        elif _is_exception(getattr(builtins, base_name, None)):
            return True
    return False


def _decorators(node: ast.FunctionDef) -> "set[str]":
    return {d.id for d in node.decorator_list if isinstance(d, ast.Name)}


def _binding_signature(func: object, name: str) -> ast.arguments:
    """The parameters pybind11 wrote in the first line of ``func.__doc__``."""
    doc = (getattr(func, "__doc__", None) or "").strip()
    first = doc.splitlines()[0] if doc else ""
    assert first.startswith(f"{name}("), (
        f"{name}: no pybind11 signature in its __doc__ (overloaded, or not a binding?): {first!r}"
    )
    tree = ast.parse(f"def {first}: ...")
    return tree.body[0].args  # type: ignore[attr-defined]


def _params(args: ast.arguments) -> "list[tuple[str, bool, bool]]":
    """(name, positional-only, has a default) for each parameter but ``self``."""
    positional = [(a, True) for a in args.posonlyargs] + [(a, False) for a in args.args]
    defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
    out = [(a.arg, only, d) for (a, only), d in zip(positional, defaults)]
    out += [(a.arg, False, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return [p for p in out if p[0] != "self"]


def _signature_problems(where: str, binding: ast.arguments, stub: ast.arguments) -> "list[str]":
    want, have = _params(binding), _params(stub)
    if len(want) != len(have):
        return [f"{where}: the binding takes {[p[0] for p in want]}, the stub "
                f"{[p[0] for p in have]}"]
    problems = []
    for (b_name, _, b_default), (s_name, s_only, s_default) in zip(want, have):
        if _UNNAMED.match(b_name):
            if not s_only:
                problems.append(f"{where}: the binding's argument {s_name!r} is unnamed "
                                f"({b_name}): the stub must make it positional-only")
        elif b_name != s_name:
            problems.append(f"{where}: the binding's argument {b_name!r} is {s_name!r} in the stub")
        if b_default != s_default:
            problems.append(f"{where}: argument {b_name!r} has a default in "
                            f"{'the binding' if b_default else 'the stub'} only")
    return problems


def test_the_installed_stub_is_the_source_stub():
    if not SOURCE_STUB.exists():
        pytest.skip("not run from a source checkout")
    assert STUB.read_text() == SOURCE_STUB.read_text(), (
        f"{STUB} differs from {SOURCE_STUB}: rebuild (cmake --build build --target "
        "nvio_python_sources)"
    )


def test_every_public_name_is_in_the_stub_and_the_module():
    stub, runtime = set(_stub_names()), set(_runtime_names())
    assert sorted(runtime - stub) == [], "in the module, missing from the stub"
    assert sorted(stub - runtime) == [], "in the stub, missing from the module"


def test_annotated_values_have_their_types():
    for name, node in _stub_names().items():
        if isinstance(node, ast.AnnAssign):
            annotation = ast.unparse(node.annotation)
            expected = getattr(builtins, annotation)
            assert isinstance(getattr(_nvio, name), expected), f"{name}: {annotation}"


def test_exception_classes_and_their_bases():
    stub = {n: node for n, node in _stub_names().items() if isinstance(node, ast.ClassDef)}
    for name, obj in _runtime_names().items():
        if not _is_exception(obj):
            continue
        assert name in stub, name
        assert [ast.unparse(b) for b in stub[name].bases] == [b.__name__ for b in obj.__bases__], (
            f"{name}: bases differ"
        )
    for name, node in stub.items():
        assert _stub_is_exception(name, stub) == _is_exception(getattr(_nvio, name, None)), name


def test_classes_have_the_same_methods_and_properties():
    problems = []
    for name, node in _stub_names().items():
        cls = getattr(_nvio, name, None)
        if not isinstance(node, ast.ClassDef) or cls is None or _is_exception(cls):
            continue
        stub_members = {
            f.name: ("property" if "property" in _decorators(f) else "method")
            for f in node.body
            if isinstance(f, ast.FunctionDef) and _public(f.name)
        }
        runtime_members = {
            k: ("property" if isinstance(v, property) else "method")
            for k, v in vars(cls).items()
            if _public(k) and (isinstance(v, property) or callable(v))
        }
        if stub_members != runtime_members:
            problems.append(f"{name}: the module has {sorted(runtime_members.items())}, the stub "
                            f"{sorted(stub_members.items())}")
    assert problems == []


def _functions() -> "list[tuple[str, object, ast.FunctionDef]]":
    """(qualified name, binding, stub def) of every module function, method and __init__."""
    out = []
    for name, node in _stub_names().items():
        obj = getattr(_nvio, name, None)
        if isinstance(node, ast.FunctionDef) and callable(obj):
            out.append((name, obj, node))
        elif isinstance(node, ast.ClassDef) and isinstance(obj, type) and not _is_exception(obj):
            for f in node.body:
                if not isinstance(f, ast.FunctionDef) or "property" in _decorators(f):
                    continue
                member = vars(obj).get(f.name)
                if member is not None and (_public(f.name) or f.name == "__init__"):
                    out.append((f"{name}.{f.name}", member, f))
    return out


def test_function_parameters_match_the_bindings():
    functions = _functions()
    assert len(functions) > 20, "the stub's functions were not found"
    problems = []
    for qualified, binding, stub in functions:
        problems += _signature_problems(
            qualified, _binding_signature(binding, qualified.rsplit(".", 1)[-1]), stub.args
        )
    assert problems == []


def test_the_checker_sees_a_wrong_parameter():
    """The comparison itself can fail: a renamed, a missing and a keyword-able unnamed one."""
    binding = ast.parse("def f(self, address: int, arg0: int, nbytes: int = 0): ...").body[0]
    good = ast.parse("def f(self, address, n, /, nbytes=...): ...").body[0]
    assert _signature_problems("f", binding.args, good.args) == []
    for bad in ("def f(self, addr, n, /, nbytes=...): ...",
                "def f(self, address, n, nbytes=...): ...",
                "def f(self, address, n, /, nbytes): ...",
                "def f(self, address, n, /): ..."):
        assert _signature_problems("f", binding.args, ast.parse(bad).body[0].args), bad


def _read_error(path: pathlib.Path, expected: type) -> BaseException:
    buf = bytearray(10)
    address, nbytes = _nvio.buffer_address(buf, True)
    with pytest.raises(expected) as info:
        _nvio.Handle().read(address, nbytes, os.fspath(path))
    return info.value


def _io_failure(tmp_path) -> BaseException:
    return _read_error(tmp_path / "missing", _nvio.FileNotFound)


def _short_file(tmp_path) -> BaseException:
    (tmp_path / "short").write_bytes(b"x")
    return _read_error(tmp_path / "short", _nvio.ShortFile)


@pytest.mark.parametrize("make", [_io_failure, _short_file])
def test_exception_attributes_in_the_stub_are_set(tmp_path, make):
    error = make(tmp_path)
    stub = {n: node for n, node in _stub_names().items() if isinstance(node, ast.ClassDef)}
    names = [c.__name__ for c in type(error).__mro__ if c.__name__ in stub]
    assert names, type(error)
    for name in names:
        for item in stub[name].body:
            if isinstance(item, ast.AnnAssign):
                attribute = item.target.id  # type: ignore[attr-defined]
                expected = getattr(builtins, ast.unparse(item.annotation))
                assert isinstance(getattr(error, attribute), expected), f"{name}.{attribute}"



def _conforms(value: object, annotation: ast.expr) -> bool:
    """Whether ``value`` has the stub's type ``annotation`` (the forms the stub uses)."""
    if isinstance(annotation, ast.Name):
        if annotation.id == "Any":
            return True
        expected = getattr(builtins, annotation.id, None)
        assert isinstance(expected, type), f"cannot check the type {annotation.id}"
        return isinstance(value, expected)
    if isinstance(annotation, ast.Constant) and annotation.value is None:
        return value is None
    assert isinstance(annotation, ast.Subscript), ast.unparse(annotation)
    kind = ast.unparse(annotation.value)
    args = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    if kind == "Optional":
        return value is None or _conforms(value, args[0])
    if kind == "Union":
        return any(_conforms(value, a) for a in args)
    if kind == "Tuple":
        return (isinstance(value, tuple) and len(value) == len(args)
                and all(_conforms(v, a) for v, a in zip(value, args)))
    if kind == "Dict":
        return isinstance(value, dict) and all(
            _conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items())
    if kind == "List":
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    raise AssertionError(f"cannot check the type {ast.unparse(annotation)}")


# Functions that take no argument, change nothing and never raise: called to check their results.
CALLABLE_WITHOUT_ARGUMENTS = ("resolve_options", "probe_engines", "auto_engine", "system_info",
                              "gpu_info", "config_path")


@pytest.mark.parametrize("name", CALLABLE_WITHOUT_ARGUMENTS)
def test_results_have_the_stubs_return_types(name):
    stub = _stub_names()[name]
    assert isinstance(stub, ast.FunctionDef) and stub.returns is not None, name
    value = getattr(_nvio, name)()
    assert _conforms(value, stub.returns), f"{name}() returned {value!r}"


def test_the_return_type_checker_sees_a_wrong_arity():
    annotation = ast.parse("Tuple[Dict[str, Any], Optional[str]]", mode="eval").body
    assert _conforms(({"a": 1}, None), annotation)
    assert not _conforms(({"a": 1}, None, 3), annotation)
    assert not _conforms(({1: 1}, "x"), annotation)
