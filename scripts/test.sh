#!/usr/bin/env bash
# One command that installs what is missing (Debian packages, then the project virtual environment
# .venv with the pinned Python packages of requirements.txt, and DeepSpeed's async_io op compiled
# once into it: scripts/deepspeed_ops.sh), builds, installs the package into
# .venv, and runs the whole test suite: the C++ conformance suite against every engine, the CLI
# tests and the Python tests (on .venv's torch 2, plus a short pass on Debian's torch 1.13:
# tests/python/legacy_torch.py), then the C++ and CLI suites again under ASan+UBSan and under TSan (scripts/sanitize.sh), and a 20 s libFuzzer run of
# the safetensors header parser. NVIO_TEST_QUICK=1 skips the sanitizer and fuzzer passes. Extra
# arguments go to ctest (e.g. -R Conformance). The builds are unity builds
# (CMAKE_UNITY_BUILD): about half the compile time on CI's two cores; the usual build of a
# developer (see README) is not, so it still catches a file that misses an include. -g1 (line
# tables, enough for file:line in stacks) compiles faster than full debug information.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's wall time, so that CI's log says where its minutes go.
stage() { echo "nvio: stage '$1' done at ${SECONDS} s"; }

scripts/deps.sh
scripts/venv.sh
stage "packages and .venv"
scripts/deepspeed_ops.sh
stage "DeepSpeed ops"
py=$PWD/.venv/bin/python
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DNVIO_WERROR=ON -DCMAKE_UNITY_BUILD=ON -DPython3_EXECUTABLE="$py" -DNVIO_TEST_PYTHON="$py" >/dev/null
cmake --build build -j"$(nproc)"
stage "build"
# The package into the project environment as a user installs it, packaging what this build
# compiled (setup.py's NVIO_PREBUILT_BUILD_DIR) instead of compiling it again.
NVIO_PREBUILT_BUILD_DIR=$PWD/build "$py" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps . 2>&1 | { grep -v "^WARNING: Location" || true; }
"$py" -c 'import sys, torch, nvio; print(f"nvio: Python suite on torch {torch.__version__}, "
  f"{sys.executable} {sys.version.split()[0]}; torch 1.13 pass (python_torch1) on /usr/bin/python3")'
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
stage "suite"

if [ "${NVIO_TEST_QUICK:-0}" != "1" ]; then
  scripts/sanitize.sh address,undefined "$@"
  stage "ASan+UBSan build and suite"
  scripts/sanitize.sh thread "$@"
  stage "TSan build and suite"
  # The safetensors header parser under libFuzzer for 20 s from the seed corpus (clang; the target
  # compiles only the parser, instrumented: tests/fuzz/README.md).
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DNVIO_BUILD_FUZZERS=ON -DNVIO_BUILD_TESTS=OFF -DNVIO_BUILD_PYTHON=OFF >/dev/null
  cmake --build build-fuzz -j"$(nproc)" --target safetensors_header_fuzz
  ctest --test-dir build-fuzz --output-on-failure
  stage "fuzzer"
fi
