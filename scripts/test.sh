#!/usr/bin/env bash
# One command that installs what is missing, builds, and runs the whole test suite (C++ and CLI).
# Extra arguments go to ctest (e.g. -R conformance).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNVIO_WERROR=ON >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
