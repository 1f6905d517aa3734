#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to nvio's main job: installs what is missing,
# builds, and runs a write-then-read benchmark on a scratch file, printing GB/s.
#   NVIO_BENCH_DIR   scratch folder (default /tmp/nvio-bench); the file is removed afterwards
#   NVIO_BENCH_SIZE  file size (default 1G)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
build/bin/nvio bench --dir "${NVIO_BENCH_DIR:-/tmp/nvio-bench}" --size "${NVIO_BENCH_SIZE:-1G}" --verify "$@"
