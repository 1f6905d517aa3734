#!/usr/bin/env bash
# Installs the build tree into a fresh prefix, runs the installed CLI without LD_LIBRARY_PATH (its
# run path must find libnvio), then configures, builds and runs tests/downstream against the
# prefix with find_package(nvio).   Usage: check.sh BUILD_DIR WORK_DIR
set -euo pipefail
build="$1"
work="$2"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
env -u LD_LIBRARY_PATH "$work/prefix/bin/nvio" --version
# With the Python package built, the installed `nvio ckpt-bench` runs the package installed beside
# it (it said "No module named 'nvio'"): its --help imports nvio and its extension from the prefix.
if grep -q '^NVIO_BUILD_PYTHON:BOOL=ON' "$build/CMakeCache.txt"; then
  env -u LD_LIBRARY_PATH -u PYTHONPATH "$work/prefix/bin/nvio" ckpt-bench --help | grep -q -- --dir
fi
cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
env -u LD_LIBRARY_PATH "$work/build/downstream" "$work/file.bin"
rm -rf "$work"
