// An opened file: a file opened once through a Handle, then read and written at any offset
// without a metadata system call per operation.
//
// A Handle's calls by path cost one statx per operation (is the name still the file kept open,
// and how large is it?), and by descriptor an fcntl and a statx (which file, which access, what
// size). A File asks once, when it is opened: it holds the direct (O_DIRECT) and buffered
// descriptors of the file and its statx facts (type, size, direct-I/O alignment), and each
// operation on it goes straight to the handle's workers. Its operations are the handle's: they
// count in its stats(), a ticket is waited for with the handle's wait(ticket) or wait(), and
// everything handle.hpp says of reads and writes (any length, offset and address; unaligned
// edges buffered; device memory) holds.
//
// Size: a read is checked against the size the File knows (from opening, grown by its own
// writes); a read past it asks the file once more (one fstat), so that bytes another writer
// appended since are readable, and raises ShortFile when they are still missing. size() asks the
// file (one statx). A file truncated by someone else under an open File fails the read that
// meets its new end with ShortFile, as a path read would.
//
// Modes: Read ("r": the file must exist), ReadWrite ("r+": must exist), Write ("w": created,
// truncated to 0 bytes), WriteRead ("w+": as "w", and readable). Writing through a Read file or
// reading through a Write file raises InvalidArgument.
//
// Lifetime and threads: move-only; the Handle must outlive the File. Every member function may be
// called from several threads at once. close() refuses, with FileBusy, while an operation on the
// file is in flight (a blocking call running in another thread, or an asynchronous one not
// finished yet): it never closes a descriptor an operation uses. Calls after close() raise
// InvalidArgument. The destructor (and a move-assignment over an open File) does not refuse: it
// lets go of the file, and the descriptors close when the last operation using them finishes
// (each operation holds them), so nothing in flight is ever cut off.
//
// The io_uring registered-file slot (IOSQE_FIXED_FILE) is not used: each worker owns its own
// ring, and registering a File's descriptors in every ring would need a call into each worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "nvio/export.hpp"
#include "nvio/handle.hpp"

NVIO_API_BEGIN

namespace nvio {

enum class FileMode { Read, ReadWrite, Write, WriteRead };

// "r", "r+", "w", "w+" (a "b" anywhere is ignored, as in Python's open). InvalidArgument otherwise.
FileMode parse_file_mode(std::string_view mode);
const char* to_string(FileMode mode) noexcept;

// One extent of a File's batch: `length` bytes of `buf` at `offset` of the file, its buffer's
// `memory` as for a Handle's batch (ReadExtent: Auto takes the batch's).
struct FileReadExtent {
  void* buf = nullptr;
  std::size_t length = 0;
  std::uint64_t offset = 0;
  MemoryKind memory = MemoryKind::Auto;
};
struct FileWriteExtent {
  const void* buf = nullptr;
  std::size_t length = 0;
  std::uint64_t offset = 0;
  MemoryKind memory = MemoryKind::Auto;
};

class File {
 public:
  File() noexcept;  // not open
  // Opens `path` for `mode` through `handle` (its direct-I/O option decides whether an O_DIRECT
  // descriptor is opened). Throws FileNotFound, PermissionDenied, IsADirectory, IoError;
  // InvalidArgument for a file that is neither regular nor a block device.
  File(Handle& handle, const std::string& path, FileMode mode = FileMode::Read);
  File(Handle& handle, const std::string& path, std::string_view mode);
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // As Handle's calls of the same names, on this file.
  void read(void* buf, std::size_t length, std::uint64_t offset = 0,
            const ReadOptions& read_options = {}) const;
  void write(const void* buf, std::size_t length, std::uint64_t offset = 0,
             const WriteOptions& write_options = {}) const;
  Ticket submit_read(void* buf, std::size_t length, std::uint64_t offset = 0,
                     const ReadOptions& read_options = {}) const;
  Ticket submit_write(const void* buf, std::size_t length, std::uint64_t offset = 0,
                      const WriteOptions& write_options = {}) const;
  void read_batch(std::span<const FileReadExtent> extents,
                  const ReadOptions& read_options = {}) const;
  void write_batch(std::span<const FileWriteExtent> extents,
                   const WriteOptions& write_options = {}) const;
  Ticket submit_read_batch(std::span<const FileReadExtent> extents,
                           const ReadOptions& read_options = {}) const;
  Ticket submit_write_batch(std::span<const FileWriteExtent> extents,
                            const WriteOptions& write_options = {}) const;

  // Closes the descriptors. FileBusy (nothing closed) while operations on the file are in flight;
  // nothing when already closed.
  void close();
  bool is_open() const noexcept;
  // Operations on the file in flight now (blocking calls running, asynchronous ones unfinished).
  std::size_t in_flight() const;

  // The file's size now (one statx; a block device's from its ioctl).
  std::uint64_t size() const;
  // The direct-I/O offset alignment of the file (statx's, else st_blksize); 0 when the file is
  // not open for direct I/O (direct=off, or refused by its file system).
  std::uint32_t direct_alignment() const;
  const std::string& path() const;
  FileMode mode() const;
  Handle& handle() const;
  // The descriptors, for callers that mix in their own system calls; -1 when none. Owned by the
  // File: do not close them.
  int direct_fd() const;
  int buffered_fd() const;

 private:
  struct NVIO_LOCAL State;
  NVIO_LOCAL State& state() const;  // InvalidArgument when default-made or moved from
  std::shared_ptr<State> state_;
};

}  // namespace nvio
NVIO_API_END
