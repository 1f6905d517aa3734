#!/usr/bin/env bash
# Gathers what scripts/gpu_check.sh runs on a GPU machine into one folder: the nvio command, the
# C++ test binary, the Python package with its extension, and the shared libraries they need that
# a stock CUDA image lacks (liburing, libaio, fmt, xxhash...; not the C and C++ runtimes, which the
# image has in newer versions). Build the extension for the GPU machine's Python first, e.g.
# cmake -S . -B build-gpu -DPython3_EXECUTABLE=/path/to/python3.12 && cmake --build build-gpu.
# Usage: scripts/gpu_pack.sh BUILD_DIR DEST
set -euo pipefail
cd "$(dirname "$0")/.."
B=$1
D=$2
rm -rf "$D"
mkdir -p "$D/bin" "$D/lib"
cp "$B/bin/nvio" "$B/tests/nvio_tests" "$D/bin/"
mkdir -p "$D/python"
cp -r "$B/python/nvio" "$D/python/"
for f in "$D/bin/"* "$D"/python/nvio/*.so; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
  while read -r lib; do cp -L "$lib" "$D/lib/"; done
# Debug information would take most of the 64 MiB a GPU machine's call may carry.
strip --strip-debug "$D"/bin/* "$D"/lib/* "$D"/python/nvio/*.so "$D"/python/nvio/_bin/*
du -sh "$D"
ls "$D/lib"
