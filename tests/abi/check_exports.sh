#!/usr/bin/env bash
# libnvio.so exports its public API and nothing else (nvio/export.hpp, src/libnvio.map):
#   1. every dynamic symbol it defines is a name of namespace nvio (or the typeinfo, vtable or VTT
#      of one), and none names the internals: nvio::detail, nvio::cuda, nvio::engine, a class's
#      Impl or State, in its own name or in a parameter's type;
#   2. the API is there: the Handle, the typeinfo of nvio::Error (catching it outside the library),
#      and what the CLI and the Python binding use beyond it (fork safety, locked memory, the
#      replacement of a file, torch's archive), which they take from include/nvio alone
#      (tests/abi/check_includes.sh); no header-only helper (json_excerpt) and no type of the
#      third-party code the library is built with (nlohmann, fmt) is in it;
#   3. every public header declares its API between NVIO_API_BEGIN and NVIO_API_END, without which
#      what it declares would be compiled hidden and silently missing from the library.
# Usage: check_exports.sh LIBNVIO_SO INCLUDE_NVIO_DIR
set -euo pipefail
lib=$1
include=$2
status=0

symbols=$(nm -D --defined-only -C "$lib" | cut -d' ' -f3-)
count=$(printf '%s\n' "$symbols" | grep -c .)

outside=$(printf '%s\n' "$symbols" |
  grep -Ev '^((typeinfo|typeinfo name|vtable|VTT) for )?nvio::' || true)
if [[ -n $outside ]]; then
  echo "FAIL: $lib exports symbols outside namespace nvio:"
  printf '%s\n' "$outside" | sed -n 1,20p
  status=1
fi
internal=$(printf '%s\n' "$symbols" |
  grep -E 'nvio::(detail|cuda|engine)::|::(Impl|State)(::|\b)|json_excerpt|nlohmann|fmt::' || true)
if [[ -n $internal ]]; then
  echo "FAIL: $lib exports internal names:"
  printf '%s\n' "$internal" | sed -n 1,20p
  status=1
fi
for wanted in 'nvio::Handle::Handle(nvio::Options const&)' 'typeinfo for nvio::Error' \
  'nvio::hold_across_fork(std::mutex&, nvio::ForkRank)' 'nvio::allocate_locked(unsigned long)' \
  'nvio::ReplacementFile::commit(nvio::Durability)' 'nvio::ArchiveFile::add_archive(std::span<nvio::ArchiveRecord const, 18446744073709551615ul>, nvio::Placement)'; do
  if ! printf '%s\n' "$symbols" | grep -qxF "$wanted"; then
    echo "FAIL: $lib does not export $wanted"
    status=1
  fi
done

for header in "$include"/*.hpp; do
  case $(basename "$header") in export.hpp | nvio.hpp) continue ;; esac
  if ! grep -qx 'NVIO_API_BEGIN' "$header" || ! grep -qx 'NVIO_API_END' "$header"; then
    echo "FAIL: $header does not declare its API between NVIO_API_BEGIN and NVIO_API_END"
    status=1
  fi
done

[[ $status -eq 0 ]] && echo "ok: $lib exports $count symbols, all of namespace nvio's public API"
exit $status
