#!/usr/bin/env bash
# One command that installs what is missing, builds, and runs the whole test suite: the C++
# conformance suite against every engine, the CLI tests and the Python tests, then the C++ and CLI
# suites again under ASan+UBSan and under TSan (scripts/sanitize.sh), and a 20 s libFuzzer run of
# the safetensors header parser. NVIO_TEST_QUICK=1 skips the sanitizer and fuzzer passes. Extra
# arguments go to ctest (e.g. -R Conformance). The builds are unity builds
# (CMAKE_UNITY_BUILD): about half the compile time on CI's two cores; the usual build of a
# developer (see README) is not, so it still catches a file that misses an include. -g1 (line
# tables, enough for file:line in stacks) compiles faster than full debug information.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DNVIO_WERROR=ON -DCMAKE_UNITY_BUILD=ON >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"

if [ "${NVIO_TEST_QUICK:-0}" != "1" ]; then
  scripts/sanitize.sh address,undefined "$@"
  scripts/sanitize.sh thread "$@"
  # The safetensors header parser under libFuzzer for 20 s from the seed corpus (clang; the target
  # compiles only the parser, instrumented: tests/fuzz/README.md).
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DNVIO_BUILD_FUZZERS=ON -DNVIO_BUILD_TESTS=OFF -DNVIO_BUILD_PYTHON=OFF >/dev/null
  cmake --build build-fuzz -j"$(nproc)" --target safetensors_header_fuzz
  ctest --test-dir build-fuzz --output-on-failure
fi
