// Writes a patterned file with an installed nvio and reads it back; exit 0 when every byte matches.
#include <cstdio>
#include <string>
#include <vector>

#include "nvio/nvio.hpp"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string path = argv[1];
  const std::size_t len = (1 << 20) + 123;
  std::vector<unsigned char> out(len), in(len, 0);
  nvio::pattern::fill(out.data(), len, 0, 42);
  try {
    nvio::Handle h;
    h.write(out.data(), len, path, 0);
    h.read(in.data(), len, path, 0);
  } catch (const nvio::Error& e) {
    std::fprintf(stderr, "downstream: %s\n", e.what());
    return 1;
  }
  if (const auto bad = nvio::pattern::first_mismatch(in.data(), len, 0, 42)) {
    std::fprintf(stderr, "downstream: wrong byte at %llu\n", static_cast<unsigned long long>(*bad));
    return 1;
  }
  std::printf("downstream: nvio %s, %zu bytes round-tripped\n", nvio::version(), len);
  return 0;
}
