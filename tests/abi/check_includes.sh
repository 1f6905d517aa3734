#!/usr/bin/env bash
# The Python binding (python/src) and the CLI (tools) use the library's public API only: each
# quoted include names a header of include/nvio ("nvio/...") or one beside the including file
# (python/src/common.hpp, tools/nvio/cli.hpp); never one of src/, whose internals libnvio.so does
# not export (tests/abi/check_exports.sh) and may change without notice. Angle-bracket includes
# (the standard library, pybind11, fmt, CLI11, nlohmann, system headers) are the compiler's to find.
# Their CMake targets leave src/ off the include path as well; this also catches a relative path
# ("../../src/core/x.hpp") and says why.
# Usage: check_includes.sh SOURCE_DIR
set -euo pipefail
root=$1
status=0
checked=0
while IFS= read -r -d '' file; do
  checked=$((checked + 1))
  dir=$(dirname "$file")
  while IFS= read -r line; do
    number=${line%%:*}
    header=$(sed -E 's/^[^"]*"([^"]*)".*$/\1/' <<<"${line#*:}")
    if [[ $header == nvio/* && $header != */../* && -f $root/include/$header ]]; then continue; fi
    if [[ $header != */* && -f $dir/$header ]]; then continue; fi
    echo "FAIL: ${file#"$root"/}:$number includes \"$header\", neither a header of include/nvio" \
      "nor one beside it"
    status=1
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" || true)
done < <(find "$root/python/src" "$root/tools" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \) -print0)

if [[ $checked -eq 0 ]]; then
  echo "FAIL: no sources found under $root/python/src and $root/tools"
  exit 1
fi
[[ $status -eq 0 ]] && echo "ok: $checked files of python/src and tools include only include/nvio and their own headers"
exit $status
