#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to nvio's main job: installs what is missing (Debian
# packages, the project virtual environment .venv of requirements.txt), builds the command-line
# tool, runs a write-then-read benchmark on a scratch file printing GB/s, and then builds the
# Python package and installs it into .venv (after the benchmark, so that the first figures come
# early).
#   NVIO_BENCH_DIR   scratch folder (default /tmp/nvio-bench); the file is removed afterwards
#   NVIO_BENCH_SIZE  file size (default 1G)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
scripts/venv.sh
py=$PWD/.venv/bin/python
# Built as scripts/test.sh builds for CI: a unity build (CMAKE_UNITY_BUILD), in about half the
# compile time of one compiler run per file, with line tables for debug information (-g1) rather
# than full -g. The first build is only the command the benchmark runs (nvio_cli and libnvio);
# the Python package's comes after the figures.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_UNITY_BUILD=ON \
  -DPython3_EXECUTABLE="$py" -DNVIO_TEST_PYTHON="$py" >/dev/null
cmake --build build -j"$(nproc)" --target nvio_cli
build/bin/nvio bench --dir "${NVIO_BENCH_DIR:-/tmp/nvio-bench}" --size "${NVIO_BENCH_SIZE:-1G}" --verify "$@"
cmake --build build -j"$(nproc)" --target _nvio nvio_bundled_cli
NVIO_PREBUILT_BUILD_DIR=$PWD/build "$py" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps . 2>&1 | { grep -v "^WARNING: Location" || true; }
echo "nvio: the Python package is installed in .venv: .venv/bin/python -c 'import nvio'" >&2
