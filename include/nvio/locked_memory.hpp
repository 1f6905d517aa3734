// Locked host memory for many separate buffers: a program that hands out one buffer per object
// (nvio.empty_locked, a tensor each) rather than one large buffer (AlignedBuffer, nvio/memory.hpp).
//
// A buffer of 256 KiB to 2 MiB is a slot of a slab of whole 2 MiB huge pages that the process's
// pool shares among buffers of similar size. A mapping of its own that size would be 4 KiB pages
// scattered in physical memory: an O_DIRECT transfer into 1 MiB of them is 256 segments, which a
// virtio disk (254 at most) splits into two requests (reads into 512 separate 1 MiB buffers ran
// at 1.33 GB/s against 2.61 into one huge-page buffer). Other sizes get a mapping of their own
// (from 2 MiB on, huge pages already). Memory is locked where RLIMIT_MEMLOCK allows it
// (LockMode::Try: refused, the buffer is unlocked and one warning goes to the warning sink);
// is_locked_by_nvio tells which. The pool has no budget and keeps at most 32 MiB of free or
// unused slab memory for reuse.
//
// Ownership: the shared_ptr owns the buffer; the last copy to go returns its memory, also after
// the objects that made it are gone. Thread-safety: allocate_locked may be called from any thread,
// and in a child forked while another thread allocated (the pool's mutex is held across fork,
// nvio/fork.hpp); a LockedBuffer's members are const.
#pragma once

#include <cstddef>
#include <memory>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

class LockedBuffer {
 public:
  virtual ~LockedBuffer() = default;
  virtual void* data() const noexcept = 0;  // page-aligned
  virtual std::size_t size() const noexcept = 0;
};

// A buffer of `size` bytes (see above). Throws InvalidArgument for size 0, MemoryError when the
// mapping fails.
std::shared_ptr<LockedBuffer> allocate_locked(std::size_t size);

}  // namespace nvio
NVIO_API_END
