// System calls per small read by path, by descriptor and through nvio::File (issue 32): N reads of
// SIZE bytes at random aligned offsets of FILE, QD at a time (submitted, then waited for with
// Handle::wait()), through one handle. Run under `strace -c -f` to count the calls per read
// (bench/results.md, "Opened files (issue 32)"); it prints reads/s too.
//
//   g++ -O2 -std=c++20 -Iinclude -o /tmp/small_reads bench/small_reads.cpp \
//       -Lbuild/src -lnvio -Wl,-rpath,$PWD/build/src
//   strace -c -f /tmp/small_reads FILE path|fd|file|read [N=10000] [QD=32] [SIZE=4096] [DIRECT]
//       [SKEW=0]
// `read` is the blocking File::read, one at a time (QD is ignored): the call the caller-driven
// path serves (handle/caller_lane.hpp; NVIO_CALLER_DRIVEN=off hands it to a worker as before).
// DIRECT: on or off, or auto (the default: the handle's, NVIO_DIRECT's).
// SKEW > 0 puts each read's memory SKEW bytes past a page, so that direct reads go through the
// workers' bounce buffers (io_uring: registered, READ_FIXED); it prints the bytes bounced per read.
// Not part of the build: a measuring tool.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "nvio/nvio.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s FILE path|fd|file|read [N] [QD] [SIZE] [DIRECT] [SKEW]\n",
                 argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  const std::string form = argv[2];
  const long n = argc > 3 ? std::atol(argv[3]) : 10000;
  const long qd = argc > 4 ? std::atol(argv[4]) : 32;
  const std::size_t size = argc > 5 ? std::strtoul(argv[5], nullptr, 10) : 4096;
  const std::size_t skew = argc > 7 ? std::strtoul(argv[7], nullptr, 10) : 0;
  const std::size_t stride = skew == 0 ? size : (size + skew + 4095) / 4096 * 4096;
  try {
    nvio::Options options = nvio::resolve_options().values;  // NVIO_* environment (NVIO_ENGINE)
    if (argc > 6 && std::string(argv[6]) != "auto") {
      options.direct = std::string(argv[6]) == "on" ? nvio::DirectIo::On : nvio::DirectIo::Off;
    }
    nvio::Handle h(options);
    nvio::File file(h, path, "r");
    const int fd = ::open(path.c_str(), O_RDONLY);
    const std::uint64_t blocks = file.size() / size;
    nvio::AlignedBuffer buf(static_cast<std::size_t>(qd) * stride);
    std::mt19937_64 rng(1);
    const auto start = std::chrono::steady_clock::now();
    for (long done = 0; done < n;) {
      for (long k = 0; k < qd && done < n; ++k, ++done) {
        void* dst =
            static_cast<std::byte*>(buf.data()) + static_cast<std::size_t>(k) * stride + skew;
        const std::uint64_t off = (rng() % blocks) * size;
        if (form == "read") {
          file.read(dst, size, off);
          continue;
        }
        if (form == "path") {
          h.submit_read(dst, size, path, off);
        } else if (form == "fd") {
          h.submit_read(dst, size, fd, off);
        } else {
          file.submit_read(dst, size, off);
        }
      }
      if (form != "read") h.wait();
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: %ld reads of %zu bytes at QD %ld: %.0f reads/s (%.0f bytes bounced a read)\n",
                form.c_str(), n, size, qd, static_cast<double>(n) / s,
                static_cast<double>(h.stats().bounced_bytes) / static_cast<double>(n));
    ::close(fd);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
