#!/usr/bin/env bash
# Builds with a sanitizer and runs the C++ and CLI suites under it.
#   scripts/sanitize.sh address,undefined     (ASan + UBSan)
#   scripts/sanitize.sh thread                (TSan)
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:?usage: scripts/sanitize.sh address,undefined|thread}"
dir="build-san-${kind//,/-}"
# -O1, as the sanitizers' documentation advises: the tests run 1.5-3x faster than at -O0
# (TSan and ASan passes, 2 cores) with the same reports; asserts stay on (Debug, no NDEBUG). -g1: line
# tables only (file:line in every report and stack) compile faster than full debug information.
scripts/deps.sh
# The C++ suite runs as NVIO_TEST_SHARDS gtest shards (default 6; 0: one process per test, where
# `-R` names single tests), several per core: the shards overlap the tests' waits.
shards=${NVIO_TEST_SHARDS:-6}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g1 -O1" -DNVIO_SANITIZE="$kind" -DNVIO_BUILD_PYTHON=OFF -DNVIO_WERROR=ON -DCMAKE_UNITY_BUILD=ON -DNVIO_TEST_SHARDS="$shards" >/dev/null
cmake --build "$dir" -j"$(nproc)"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp"
jobs=$(nproc)
[ "$shards" -gt 0 ] && jobs=$((shards + 1))
ctest --test-dir "$dir" --output-on-failure -j"$jobs" "${@:2}"
