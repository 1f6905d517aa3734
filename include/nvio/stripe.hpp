// Files striped over several directories, one per drive, read and written on all of them at once.
//
// Layout (RAID-0 over files): the logical file `name` is cut into stripes of `stripe_size` bytes;
// stripe k lives in directory k % N (N directories), in the part file <directory>/<name>, at
// offset (k / N) * stripe_size. Part i of a file of L bytes thus holds part_size(i, L) bytes, and
// the file's size is the sum of its parts' sizes (parts that would hold nothing may be missing).
// The same directories, in the same order, and the same stripe size read the file back. Each part
// records its place (part i of N, the stripe size) in the extended attribute user.nvio.stripe, so
// that another layout (directories swapped, another stripe size) is a FormatError instead of
// bytes read from the wrong places, even where the parts' sizes fit both; so are parts whose sizes
// do not add up to one striped file of the layout. Each part also records the file's logical size
// (user.nvio.stripe.length, set whenever a write resizes the parts), so that a part truncated at a
// stripe boundary, which leaves sizes that fit a smaller striped file, is a ShortFile for size()
// as for a read. A part without the record (a copy that dropped
// it, a file system without extended attributes) is checked by its size only. A write with
// Truncate::AtEnd at offset 0 replaces the file and may change its layout. stripe_size is a
// multiple of 4096, so every stripe starts at an offset of its part file that is aligned for
// O_DIRECT and the planner sends whole stripes down the direct path.
//
// Each directory has its own Handle (its own workers, queue depth and engine instances), made with
// the options that apply to that directory: the configuration profile `nvio tune --save` stored
// for its drive, under the caller's overrides. A read or write submits one batch per drive and
// waits for all of them, so the drives work in parallel; the result says how many bytes each drive
// moved and when it finished, for per-drive throughput.
//
// Errors are those of Handle, naming the part file that failed; a read past the logical end is a
// ShortFile naming the striped file and its size. When one drive fails the others' batches are
// still waited for (no buffer is given back while the kernel may use it), then the first failure
// in directory order is thrown.
//
// Thread-safety: every member function may be called from several threads at once. Writes size the
// parts under a lock of the handle and only ever grow them (Truncate::AtEnd shrinks after its data
// is in), so threads writing different ranges of one file never undo each other's growth, and a
// read or size() never sees the parts half resized. Another process or StripedHandle resizing the
// same file at the same time is not serialised with this one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvio/export.hpp"
#include "nvio/handle.hpp"
#include "nvio/options.hpp"

NVIO_API_BEGIN

namespace nvio {

struct StripeLayout {
  std::vector<std::string> directories;  // at least one; each an existing directory
  std::size_t stripe_size = std::size_t{1} << 20;

  // Throws InvalidArgument naming the problem: no directory, one given twice, an empty or NUL-
  // holding path, a stripe size that is 0 or not a multiple of 4096.
  void validate() const;
  // The bytes part `drive` holds of a striped file of `size` bytes.
  std::uint64_t part_size(std::size_t drive, std::uint64_t size) const;
  // The path of part `drive` of the striped file `name`: <directory>/<name>. InvalidArgument for a
  // drive past the last directory.
  std::string part_path(std::size_t drive, const std::string& name) const;
};

// What one drive did in a striped read or write.
struct DriveTransfer {
  std::string directory;
  std::uint64_t bytes = 0;
  double seconds = 0;  // from the start of the call until this drive's last byte (0: no bytes)
};

struct StripedTransfer {
  std::uint64_t bytes = 0;
  double seconds = 0;                 // from the start of the call until the last drive finished
  std::vector<DriveTransfer> drives;  // in directory order
};

class StripedHandle {
 public:
  // Validates `layout` and checks that each directory exists (FileNotFound, or InvalidArgument for
  // a path that is not a directory), then makes one Handle per directory with
  // resolve_options(overrides, {}, directory).
  explicit StripedHandle(StripeLayout layout, const OptionOverrides& overrides = {});
  // Drive i's handle uses per_drive[i] as given (e.g. what `nvio tune` picked for each drive);
  // InvalidArgument unless there is one Options per directory.
  StripedHandle(StripeLayout layout, const std::vector<Options>& per_drive);
  ~StripedHandle();
  StripedHandle(const StripedHandle&) = delete;
  StripedHandle& operator=(const StripedHandle&) = delete;

  // Blocking: return when every byte has moved, or throw. `name` is a file name (no '/', not "."
  // or "..", no NUL). A write creates missing parts and leaves the file's size at least
  // offset + length (exactly that with Truncate::AtEnd), its parts sized to match, so that a gap
  // before `offset` reads as zeros as in a regular file. With Durability::Data every part written
  // is synced before the call returns.
  StripedTransfer write(const void* buf, std::size_t length, const std::string& name,
                        std::uint64_t offset = 0, const WriteOptions& write_options = {});
  StripedTransfer read(void* buf, std::size_t length, const std::string& name,
                       std::uint64_t offset = 0, const ReadOptions& read_options = {});

  // The logical size of `name`. Throws FileNotFound when no part exists, FormatError when the
  // parts' sizes do not form one striped file of this layout, ShortFile when they form a smaller
  // one than the size the parts record (a part cut short at a stripe boundary).
  std::uint64_t size(const std::string& name) const;
  // Removes every part of `name`; returns how many existed. Throws IoError for a part that exists
  // and cannot be removed.
  std::size_t remove(const std::string& name);
  // The path of part `drive` of `name`.
  std::string part_path(std::size_t drive, const std::string& name) const;

  // The counters of all the drives' handles together (see HandleStats); drive(i).stats() has
  // one drive's.
  HandleStats stats() const;

  const StripeLayout& layout() const noexcept;
  // The handle of directory `drive` (its options, engine, stats; I/O through it bypasses the
  // striping).
  Handle& drive(std::size_t drive);

 private:
  struct NVIO_LOCAL Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nvio
NVIO_API_END
