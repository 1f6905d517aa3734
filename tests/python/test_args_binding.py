"""The checks of files, offsets and option values are decided in the binding alone
(python/src/bind_args.cpp): loaded by itself, with no module of the nvio package importable, the
compiled core converts a pathlib.Path, a numpy-style integer and a bad value exactly as nvio does,
and raises its own typed errors. Before, it imported nvio._args for every value that was not a
plain int or str (a Python -> C++ -> Python cycle), so a Path or a bad offset failed here with
ModuleNotFoundError."""

import os
import subprocess
import sys

from nvio import _nvio

ALONE = r"""
import importlib.abc, importlib.util, pathlib, sys


class NoNvio(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "nvio" or name.startswith("nvio."):
            raise ImportError(f"the binding imported {name}")


sys.meta_path.insert(0, NoNvio())
spec = importlib.util.spec_from_file_location("_nvio", sys.argv[1])
core = importlib.util.module_from_spec(spec)
spec.loader.exec_module(core)

data = pathlib.Path(sys.argv[2])
data.write_bytes(bytes(range(256)) * 32)


class Index:  # an integer as numpy and torch scalars are: through __index__
    def __index__(self):
        return 256


h = core.Handle(queue_depth=Index(), direct="off")
assert h.options()["queue_depth"] == 256
mem = core.LockedMemory(4096)
h.read(mem.address, 4096, data, Index())  # a Path and an __index__ offset, as nvio.Handle passes
assert bytes(memoryview(mem)) == (bytes(range(256)) * 32)[256:4352]
assert core.check_file(data) == bytes(data)
assert core.check_offset(Index(), "file_offset") == 256
for value, name, error, words in [
    (-1, "file_offset", core.InvalidArgument, "file_offset must be between 0 and"),
    (1.5, "file_offset", core.InvalidType, "file_offset must be an integer, got float"),
]:
    try:
        core.check_offset(value, name)
    except error as e:
        assert words in str(e), e
    else:
        raise AssertionError(value)
for value, error, words in [
    (data / "nothing\0here", core.InvalidArgument, "embedded null byte"),
    (True, core.InvalidType, "not a bool"),
    (2**31, core.InvalidArgument, "is not a file descriptor"),
]:
    try:
        core.check_file(value, "filename")
    except error as e:
        assert words in str(e) and isinstance(e, core.Error), e
    else:
        raise AssertionError(value)
try:
    core.Handle(single_submit="yes")
except core.InvalidType as e:
    assert "single_submit must be True or False" in str(e), e
else:
    raise AssertionError("a str for a boolean option")
assert not [m for m in sys.modules if m == "nvio" or m.startswith("nvio.")]
print("ok")
"""


def test_the_binding_checks_arguments_without_the_package(tmp_path):
    env = dict(os.environ, PYTHONPATH="")
    r = subprocess.run([sys.executable, "-c", ALONE, _nvio.__file__, str(tmp_path / "data")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_package_names_the_bindings_checks():
    from nvio import _args

    assert _args.offset is _nvio.check_offset and _args.file_target is _nvio.check_file
    assert _args.InvalidType is _nvio.InvalidType
