// libFuzzer target for the safetensors header parser: any input is a whole file, which must either
// parse or raise nvio::FormatError (anything else thrown, a crash, or a sanitizer report is a
// finding). Built with -DNVIO_BUILD_FUZZERS=ON under clang; see tests/fuzz/README.md.
#include <cstddef>
#include <cstdint>
#include <span>

#include "nvio/errors.hpp"
#include "nvio/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const nvio::safetensors::Header header =
        nvio::safetensors::parse_safetensors_header({data, size}, size, "<fuzz>");
    // A header that parses must describe the file exactly.
    std::uint64_t covered = 0;
    for (const auto& t : header.tensors) covered += t.byte_size();
    if (header.data_offset() + header.data_size != size || covered != header.data_size) {
      __builtin_trap();
    }
  } catch (const nvio::FormatError&) {
  }
  return 0;
}
