#include "core/unique_name.hpp"

#include <fmt/format.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace nvio::detail {

std::string unique_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  const std::uint64_t n = counter.fetch_add(1, std::memory_order_relaxed);
  return fmt::format("{}-{}-{}", ::getpid(), static_cast<long>(::syscall(SYS_gettid)), n);
}

}  // namespace nvio::detail
