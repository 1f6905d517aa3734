// Page-aligned, optionally locked, huge-page-backed host buffers.
//
// Buffers are anonymous mmap regions rounded up to 2 MiB and advised MADV_HUGEPAGE: the block layer
// can then keep 1 MiB requests whole (one physically contiguous segment), which measured up to
// twice as fast as 4 KiB-page buffers on reads. Locking (mlock) keeps them resident for DMA; when
// RLIMIT_MEMLOCK refuses, LockMode::Try falls back to unlocked memory and emits one warning per
// process through the warning sink (see warnings.hpp), never a crash.
#pragma once

#include <cstddef>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

enum class LockMode {
  None,     // do not mlock
  Try,      // mlock; on refusal keep the memory unlocked and warn once
  Require,  // mlock; on refusal throw MemoryError
};

// Move-only owner of one mapped region. Thread-safety: none; share the pointer, not the object.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Throws InvalidArgument for size 0, MemoryError when the mapping (or a required lock) fails.
  explicit AlignedBuffer(std::size_t size, LockMode lock = LockMode::Try);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() const noexcept { return data_; }
  std::byte* bytes() const noexcept { return static_cast<std::byte*>(data_); }
  std::size_t size() const noexcept { return size_; }
  bool locked() const noexcept { return locked_; }
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  std::size_t size_ = 0;    // what the caller asked for
  std::size_t mapped_ = 0;  // what was mapped (rounded up)
  bool locked_ = false;
};

// True when [ptr, ptr + len) lies inside memory that is currently mlocked by this process through
// nvio (AlignedBuffer with a successful lock). Used by bindings to answer "is this pinned?".
bool is_locked_by_nvio(const void* ptr, std::size_t len) noexcept;

}  // namespace nvio
NVIO_API_END
