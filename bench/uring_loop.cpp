// The ceiling of one thread on io_uring for small random reads: a bare liburing loop, no nvio, to
// set beside fio and `nvio bench --pattern random` on the same file (bench/small_ops_table.py,
// bench/results.md, "Where queue depth 32 still loses to fio"). It keeps QD reads of SIZE bytes
// (default 4096, a multiple of 4096) in flight for SECONDS (default 2) and prints reads/s and the
// reads and seconds it counted.
//
//   g++ -O2 -std=c++20 -o /tmp/uring_loop bench/uring_loop.cpp -luring
//   /tmp/uring_loop FILE QD MODE [SIZE] [SECONDS]
//
// URING_LOOP_HUGE=1 puts the buffers in 2 MiB-aligned memory advised for transparent huge pages
// (MADV_HUGEPAGE), as nvio's buffers of 2 MiB and more are, instead of posix_memalign's pages.
// MODE says how the ring is set up and driven:
//   split   nvio's ring flags (SINGLE_ISSUER | COOP_TASKRUN | TASKRUN_FLAG); wait for a completion,
//           then submit the replacements in a second system call (what nvio's engine does)
//   joined  the same flags; submit the replacements and wait in one io_uring_enter
//   plain   no setup flags; submit and wait in one call
//   defer   SINGLE_ISSUER | DEFER_TASKRUN (Linux 6.1); submit and wait in one call
// Not part of the build: a measuring tool, with no error handling beyond stopping.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

int main(int argc, char** argv) {
  if (argc < 4 || argc > 6) {
    std::fprintf(stderr, "usage: %s FILE QD split|joined|plain|defer [SIZE] [SECONDS]\n", argv[0]);
    return 2;
  }
  const unsigned qd = static_cast<unsigned>(std::atoi(argv[2]));
  const std::string mode = argv[3];
  const std::size_t size = argc > 4 ? std::strtoul(argv[4], nullptr, 10) : 4096;
  const double limit = argc > 5 ? std::atof(argv[5]) : 2.0;
  const int fd = ::open(argv[1], O_RDONLY | O_DIRECT);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || size == 0 || size % 4096 != 0 ||
      static_cast<std::size_t>(st.st_size) < size || qd == 0 || !(limit > 0)) {
    std::perror(argv[1]);
    return 1;
  }
  const std::uint64_t blocks = static_cast<std::uint64_t>(st.st_size) / size;
  io_uring ring{};
  io_uring_params params{};
  if (mode == "split" || mode == "joined") {
    params.flags =
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
  } else if (mode == "defer") {
    params.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
  } else if (mode != "plain") {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  if (const int rc = io_uring_queue_init_params(qd, &ring, &params); rc < 0) {
    std::fprintf(stderr, "io_uring_queue_init: %s\n", std::strerror(-rc));
    return 1;
  }
  void* memory = nullptr;
  const bool huge = std::getenv("URING_LOOP_HUGE") != nullptr;
  const std::size_t two_mib = std::size_t{2} << 20;
  const std::size_t mapped = (size * qd + two_mib - 1) / two_mib * two_mib + two_mib;
  if (huge) {
    void* m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    const auto at = (reinterpret_cast<std::uintptr_t>(m) + two_mib - 1) / two_mib * two_mib;
    memory = reinterpret_cast<void*>(at);
    ::madvise(memory, mapped - two_mib, MADV_HUGEPAGE);
    std::memset(memory, 0, mapped - two_mib);
  } else if (::posix_memalign(&memory, 4096, size * qd) != 0) {
    return 1;
  }
  auto* slots = static_cast<char*>(memory);
  std::mt19937_64 rng(1);
  auto prepare = [&](unsigned slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read(sqe, fd, slots + size * slot, static_cast<unsigned>(size),
                       (rng() % blocks) * size);
    io_uring_sqe_set_data64(sqe, slot);
  };
  for (unsigned i = 0; i < qd; ++i) prepare(i);
  io_uring_submit(&ring);
  const bool split = mode == "split";
  std::uint64_t reads = 0;
  const auto start = std::chrono::steady_clock::now();
  double seconds = 0;
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    if (split && io_uring_wait_cqe(&ring, &cqe) < 0) return 1;
    unsigned seen = 0;
    unsigned head = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      if (cqe->res != static_cast<int>(size)) {
        std::fprintf(stderr, "a read returned %d\n", cqe->res);
        return 1;
      }
      prepare(static_cast<unsigned>(io_uring_cqe_get_data64(cqe)));
      ++seen;
    }
    io_uring_cq_advance(&ring, seen);
    reads += seen;
    if ((reads & 1023) < seen) {
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (seconds > limit) break;
    }
    if (split) {
      io_uring_submit(&ring);
    } else {
      io_uring_submit_and_wait(&ring, 1);
    }
  }
  std::printf("%s qd %u size %zu: %.0f reads/s (%llu reads in %.3f s)\n", mode.c_str(), qd, size,
              static_cast<double>(reads) / seconds, static_cast<unsigned long long>(reads),
              seconds);
  io_uring_queue_exit(&ring);
  if (!huge) std::free(memory);  // the huge mapping goes with the process
  return 0;
}
