// Preparing requests: from a call's arguments to operations ready to queue. Checks the arguments,
// opens the file (handle/files.hpp) or uses a batch's or an nvio::File's, plans the pieces
// (handle/plan.hpp) and, for device memory, picks the transport. Internal to the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/engine.hpp"
#include "handle/files.hpp"
#include "handle/operation.hpp"
#include "handle/tickets.hpp"
#include "nvio/handle.hpp"

namespace nvio::detail {

// Prepares the requests of one handle. Thread-safe (what it uses is: the FileCache, the queue's
// record of a dead worker; the options are fixed).
class Preparer {
 public:
  Preparer(const Options& options, FileCache& files, OperationQueue& queue) noexcept
      : options_(options), files_(files), queue_(queue) {}

  // The operation for one request on `file`. With `same_file`, an earlier extent of the same
  // batch on the same file, its descriptors and size check are shared (no system call). Throws
  // InvalidArgument (arguments), the errors of opening the file, ShortFile, GpuError.
  OperationPtr operation(engine::Direction dir, std::byte* buf, std::size_t length,
                         const FileRef& file, std::uint64_t offset, const WriteOptions& wopts,
                         const Operation* same_file = nullptr) const;
  // The operations of a batch of extents, prepared together: the extents of one file share its
  // descriptors, and a write batch's durability is one fdatasync per file after the last extent.
  // With `all_on`, every extent is on that file (an nvio::File's batch) whatever it names.
  template <class Extent>
  JobPtr batch(engine::Direction dir, std::span<const Extent> extents, const WriteOptions& wopts,
               const FileRef* all_on = nullptr) const;

 private:
  // Device memory: finds the transport (bounce or GDS) once the file is open.
  void prepare_device(Operation& op) const;

  const Options& options_;
  FileCache& files_;
  OperationQueue& queue_;
};

extern template JobPtr Preparer::batch<ReadExtent>(engine::Direction, std::span<const ReadExtent>,
                                                   const WriteOptions&, const FileRef*) const;
extern template JobPtr Preparer::batch<WriteExtent>(engine::Direction, std::span<const WriteExtent>,
                                                    const WriteOptions&, const FileRef*) const;

}  // namespace nvio::detail
