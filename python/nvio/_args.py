"""Checks of the arguments every entry point shares: files (paths and descriptors), offsets and
option values. In one place so that every entry point (``nvio.Handle``, ``aio_handle``,
``nvio.tune``, ``nvio.report``) refuses the same input with the same typed error, naming the
argument, before anything reaches the core.

Paths are handed to the core as bytes, encoded the way ``open()`` encodes them
(``os.fsencode``: a ``str`` from ``os.listdir`` holding surrogate-escaped bytes gets its original
bytes back), so every name ``open()`` accepts works, and a NUL byte, which would silently cut the
name short at the system call, is refused as ``open()`` refuses it.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Union

from . import _nvio


class InvalidType(_nvio.Error, TypeError):
    """An argument of the wrong type (a float offset, a bool file, an object-dtype array...)."""


_FD_MAX = 2**31 - 1  # descriptors are C ints
OFFSET_MAX = 2**63 - 1  # off_t

# The Python type of each handle option, from the core's option table (its one list of options).
_KIND_OF_TYPE = {"boolean": bool, "integer": int, "choice": str}
_OPTION_KINDS = {spec["name"]: _KIND_OF_TYPE[spec["type"]] for spec in _nvio.option_specs()}
OPTION_NAMES = tuple(_OPTION_KINDS)


def _type_name(value: Any) -> str:
    return type(value).__name__


def integer(value: Any, name: str) -> int:
    """An exact integer: ints and numpy/torch integer scalars, never a bool, float or string."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise InvalidType(f"nvio: {name} must be an integer, got a bool ({value!r})")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidType(
            f"nvio: {name} must be an integer, got {_type_name(value)} {value!r}"
        ) from None


def utf8(value: Any, name: str) -> str:
    """A str that UTF-8 encodes (names that go into JSON or C++ strings): not a surrogate-escaped
    str, as os.fsdecode makes of bytes that are not UTF-8."""
    if not isinstance(value, str):
        raise InvalidType(f"nvio: {name} must be a str, got {_type_name(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _nvio.InvalidArgument(
            f"nvio: {name} {value!r} is not UTF-8 text ({e.reason} at position {e.start})"
        ) from None
    return value


def boolean(value: Any, name: str) -> bool:
    """True/False (also numpy's bool and the integers 0 and 1, which DeepSpeed's binding takes);
    never a string: ``'no'`` is truthy and would silently mean True."""
    # numpy's bool is numpy.bool_ before numpy 2 and numpy.bool from 2 on.
    if isinstance(value, bool) or (type(value).__module__ == "numpy"
                                   and type(value).__name__ in ("bool_", "bool")):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InvalidType(f"nvio: {name} must be True or False, got {_type_name(value)} {value!r}")


def option(name: str, value: Any) -> Any:
    """A handle option's value checked against its type; None (not given) stays None."""
    if value is None:
        return None
    kind = _OPTION_KINDS[name]
    if kind is bool:
        return boolean(value, name)
    if kind is int:
        return integer(value, name)
    if not isinstance(value, str):
        raise InvalidType(f"nvio: {name} must be a string, got {_type_name(value)} {value!r}")
    return value


def options(values: "dict[str, Any]", owner: str) -> "dict[str, Any]":
    """Every option of ``values`` checked; an unknown name is a TypeError naming the known ones."""
    unknown = sorted(set(values) - set(_OPTION_KINDS))
    if unknown:
        raise TypeError(f"{owner}: unknown option(s) {unknown}; known: {sorted(_OPTION_KINDS)}")
    return {k: option(k, v) for k, v in values.items()}


def path(value: Any, name: str = "path") -> bytes:
    """A str, bytes or os.PathLike path as the bytes ``open()`` would pass to the system."""
    try:
        raw = os.fsencode(os.fspath(value))
    except TypeError:
        raise InvalidType(
            f"nvio: {name} must be a path (str, bytes or os.PathLike), got {_type_name(value)}"
        ) from None
    if b"\0" in raw:
        raise _nvio.InvalidArgument(f"nvio: {name} {value!r} contains an embedded null byte")
    if not raw:
        raise _nvio.InvalidArgument(f"nvio: {name} is empty")
    return raw


def file_target(value: Any, name: str = "file") -> Union[bytes, int]:
    """A file named by a path (see ``path``) or an open descriptor (an int)."""
    if isinstance(value, bool):
        raise InvalidType(f"nvio: {name} must be a path or a file descriptor, not a bool")
    if not isinstance(value, (str, bytes, os.PathLike)):
        try:
            fd = operator.index(value)  # an int, or a numpy/torch integer scalar
        except TypeError:
            fd = None
        if fd is not None:
            if not 0 <= fd <= _FD_MAX:
                raise _nvio.InvalidArgument(
                    f"nvio: {name} {fd} is not a file descriptor (0 to {_FD_MAX})"
                )
            return fd
    return path(value, name)


def offset(value: Any, name: str = "offset") -> int:
    """A file offset: an integer from 0 to 2**63 - 1."""
    n = integer(value, name)
    if not 0 <= n <= OFFSET_MAX:
        raise _nvio.InvalidArgument(f"nvio: {name} must be between 0 and {OFFSET_MAX}, got {n}")
    return n
