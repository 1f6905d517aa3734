#include <fmt/format.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>

#include "core/align.hpp"
#include "core/fork.hpp"
#include "nvio/errors.hpp"
#include "nvio/memory.hpp"
#include "nvio/warnings.hpp"

namespace nvio {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::size_t round_up(std::size_t n, std::size_t a) {
  return static_cast<std::size_t>(detail::round_up(n, a));
}

// Regions this process locked through AlignedBuffer, keyed by start address.
struct LockedRegions {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> regions;
};

LockedRegions& locked_regions() {
  static auto* r = [] {
    auto* created = new LockedRegions;         // leaked: buffers may outlive static destruction
    detail::hold_across_fork(created->mutex);  // a leaf: nothing is taken under it
    return created;
  }();
  return *r;
}
// Made when the library is loaded, before any of its threads exist: a worker making it (which
// allocates) while another thread forks would leave the child its initialisation guard taken, and
// the child's first bounce buffer would wait for ever (seen:
// Sharing.ForkWithOperationsInFlight...).
[[maybe_unused]] const LockedRegions& g_locked_regions_at_load = locked_regions();

// Maps `size` bytes (a multiple of 2 MiB) at a 2 MiB-aligned address so that transparent huge
// pages can back all of it: over-map by one huge page and trim both ends.
void* map_huge_aligned(std::size_t size) {
  const std::size_t span = size + kHugePage;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return nullptr;
  }
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up(start, kHugePage);
  if (aligned > start) ::munmap(raw, aligned - start);
  const std::uintptr_t end = aligned + size;
  const std::uintptr_t raw_end = start + span;
  if (raw_end > end) ::munmap(reinterpret_cast<void*>(end), raw_end - end);
  return reinterpret_cast<void*>(aligned);
}

}  // namespace

AlignedBuffer::AlignedBuffer(std::size_t size, LockMode lock) {
  if (size == 0) {
    throw InvalidArgument("AlignedBuffer size must be at least 1 byte, got 0");
  }
  // No address space holds more than half of it; and rounding a size within 2 MiB of 2^64 up to
  // whole pages would wrap to a tiny mapping that the caller then fills with `size` bytes.
  if (size > std::numeric_limits<std::size_t>::max() / 2) {
    throw MemoryError(fmt::format("cannot map {} bytes: more than a process can address", size),
                      ENOMEM);
  }
  // Small buffers are page-rounded; large ones use whole huge pages (see memory.hpp for why).
  const bool huge = size >= kHugePage;
  mapped_ = huge ? round_up(size, kHugePage) : round_up(size, 4096);
  void* p =
      huge ? map_huge_aligned(mapped_)
           : ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == nullptr || p == MAP_FAILED) {
    const int err = errno;
    throw MemoryError(fmt::format("mmap of {} bytes failed: {}", mapped_, std::strerror(err)), err);
  }
  data_ = p;
  size_ = size;
  if (huge) {
    ::madvise(data_, mapped_, MADV_HUGEPAGE);  // advisory: failure only costs speed
  }
  if (lock == LockMode::None) return;
  if (::mlock(data_, mapped_) == 0) {
    locked_ = true;
    auto& reg = locked_regions();
    std::lock_guard guard(reg.mutex);
    reg.regions[reinterpret_cast<std::uintptr_t>(data_)] = mapped_;
    return;
  }
  const int err = errno;
  const std::string why =
      fmt::format("mlock of {} bytes refused: {} (RLIMIT_MEMLOCK; raise it with ulimit -l)",
                  mapped_, std::strerror(err));
  if (lock == LockMode::Require) {
    release();
    throw MemoryError(why, err);
  }
  warn(why + "; using unlocked memory", "mlock-refused");
}

AlignedBuffer::~AlignedBuffer() { release(); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_), mapped_(other.mapped_), locked_(other.locked_) {
  other.data_ = nullptr;
  other.size_ = other.mapped_ = 0;
  other.locked_ = false;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    mapped_ = other.mapped_;
    locked_ = other.locked_;
    other.data_ = nullptr;
    other.size_ = other.mapped_ = 0;
    other.locked_ = false;
  }
  return *this;
}

void AlignedBuffer::release() noexcept {
  if (data_ == nullptr) return;
  if (locked_) {
    auto& reg = locked_regions();
    std::lock_guard guard(reg.mutex);
    reg.regions.erase(reinterpret_cast<std::uintptr_t>(data_));
  }
  ::munmap(data_, mapped_);  // unmapping also unlocks
  data_ = nullptr;
  size_ = mapped_ = 0;
  locked_ = false;
}

bool is_locked_by_nvio(const void* ptr, std::size_t len) noexcept {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto& reg = locked_regions();
  std::lock_guard guard(reg.mutex);
  auto it = reg.regions.upper_bound(p);
  if (it == reg.regions.begin()) return false;
  --it;
  return p >= it->first && p + len <= it->first + it->second;
}

}  // namespace nvio
