"""The checks of the arguments every entry point shares, by the names the package uses: files
(paths and descriptors), offsets, integers, booleans and UTF-8 text are checked by the binding
(python/src/bind_args.cpp), the one place where they are decided, for the binding's own calls and
for these alike, so that every entry point (``nvio.Handle``, ``aio_handle``, ``nvio.tune``,
``nvio.report``) refuses the same input with the same typed error, naming the argument, before
anything reaches the core. Option values are checked by the binding too, by the core's option
table; only the names of options are checked here.

Paths are handed to the core as bytes, encoded the way ``open()`` encodes them
(``os.fsencode``), and a NUL byte, which would silently cut the name short at the system call, is
refused as ``open()`` refuses it (see bind_args.cpp).
"""

from __future__ import annotations

from typing import Any

from . import _nvio
from ._nvio import InvalidType

OFFSET_MAX = _nvio.OFFSET_MAX  # off_t

# Each a function of (value, name) that returns the value converted or raises InvalidType (the
# wrong type) or InvalidArgument (out of range); path, file_target and offset name their argument
# "path", "file" and "offset" when not told.
integer = _nvio.check_integer  # an exact int: numpy/torch integer scalars too; never a bool
boolean = _nvio.check_boolean  # True/False, numpy's bool, 0 and 1; never a string
utf8 = _nvio.check_utf8  # a str that UTF-8 encodes (not a surrogate-escaped str)
path = _nvio.check_path  # str, bytes or os.PathLike -> the bytes open() passes to the system
file_target = _nvio.check_file  # a path (bytes, as above) or a descriptor (an int)
offset = _nvio.check_offset  # 0 to 2**63 - 1

# The handle options, from the core's option table (its one list of options). Their values are
# checked by the binding, by each option's type, when the options reach it (python/src/common.cpp,
# overrides()).
OPTION_NAMES = tuple(spec["name"] for spec in _nvio.option_specs())


def options(values: "dict[str, Any]", owner: str) -> "dict[str, Any]":
    """``values`` when every name is an option's; an unknown name is a TypeError naming the known
    ones, as Python refuses an unexpected keyword argument."""
    unknown = sorted(set(values) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"{owner}: unknown option(s) {unknown}; known: {sorted(OPTION_NAMES)}")
    return values
