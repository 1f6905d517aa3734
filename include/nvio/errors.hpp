// Typed errors raised by nvio. Every failure the library can report is one of these; the library
// never aborts, exits, prints or returns a bare -1.
//
// Hierarchy:
//   Error                     root of everything nvio throws
//   ├── InvalidArgument       a bad option or argument (caught before any I/O is issued)
//   ├── EngineUnavailable     an explicitly requested engine cannot be used on this machine
//   ├── MemoryError           allocation or locking of buffers failed where it was required
//   ├── GpuError              a CUDA driver or cuFile call failed, or no usable GPU for device
//   │                         memory; carries the API, its error code and name, path and range
//   ├── FormatError           a file's contents break its format (a malformed safetensors
//   │   │                     header); carries the path and the problem
//   │   └── ChecksumMismatch  stored bytes whose checksum does not match (a swapped tensor);
//   │                         carries the tensor's name, the path, offset, length and checksums
//   ├── BudgetExceeded        a memory budget cannot make room for a request (the swapper);
//   │                         carries the bytes needed, the budget and the bytes held
//   ├── DirectoryLocked       a directory is in use by another owner (the swapper's lock file);
//   │                         carries the path and the owner's pid
//   ├── Interrupted           a wait stopped because the thread's InterruptCheck asked it to
//   │                         (nvio/interrupt.hpp: Ctrl-C in Python)
//   └── IoError               a system call on a file failed; carries op, path, offset, length,
//   errno
//       ├── FileNotFound      ENOENT
//       ├── PermissionDenied  EACCES, EPERM
//       ├── ReadOnlyFileSystem EROFS (a write to a read-only mount: not a permission the caller
//       │                     could be granted)
//       ├── IsADirectory      EISDIR (also raised when a directory is given as a file)
//       ├── NoSpace           ENOSPC, EDQUOT
//       └── ShortFile         a read asked for bytes past the end of the file, or the file ended
//                             while it was being read
//
// Thread-safety: error objects are immutable after construction.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// `option` names the handle option the error is about ("queue_depth", as in the option table of
// options.hpp) when a value of one did not parse or is out of range, whichever route it came by
// (explicit value, NVIO_* variable, configuration file, binding, command line); it is empty when
// the error is not about an option. Callers find the option here, never by reading the message.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& what, std::string option = {})
      : Error(what), option_(std::move(option)) {}
  const std::string& option() const noexcept { return option_; }

 private:
  std::string option_;
};

class EngineUnavailable : public Error {
 public:
  using Error::Error;
};

class MemoryError : public Error {
 public:
  MemoryError(const std::string& what, int err) : Error(what), errno_(err) {}
  int error_code() const noexcept { return errno_; }

 private:
  int errno_;
};

// A CUDA driver or cuFile failure (or CUDA missing where device memory was given). `api` is the
// function that failed ("cuMemcpyHtoDAsync", "cuFileRead", "dlopen"), `code` its CUresult or
// CUfileOpError value (0 when there is none, e.g. the driver could not be loaded), `code_name`
// its symbolic name ("CUDA_ERROR_INVALID_VALUE", "CU_FILE_IO_NOT_SUPPORTED"). `path`, `offset`
// and `length` locate the I/O it was part of (empty / 0 when it was not part of one).
class GpuError : public Error {
 public:
  GpuError(std::string api, int code, std::string code_name, const std::string& detail,
           std::string path = {}, std::uint64_t offset = 0, std::uint64_t length = 0);

  const std::string& api() const noexcept { return api_; }
  int code() const noexcept { return code_; }
  const std::string& code_name() const noexcept { return code_name_; }
  const std::string& path() const noexcept { return path_; }
  std::uint64_t offset() const noexcept { return offset_; }
  std::uint64_t length() const noexcept { return length_; }

 private:
  std::string api_;
  int code_;
  std::string code_name_;
  std::string path_;
  std::uint64_t offset_;
  std::uint64_t length_;
};

// A file whose contents do not follow its format: `path` names it ("<bytes>" or similar for
// data held in memory), `problem` says what is wrong in words; what() holds both.
class FormatError : public Error {
 public:
  FormatError(std::string path, std::string problem);
  const std::string& path() const noexcept { return path_; }
  const std::string& problem() const noexcept { return problem_; }

 private:
  std::string path_;
  std::string problem_;
};

// The bytes of tensor `name` read from [offset, offset + length) of `path` hash to `actual` where
// `expected` was recorded when they were written.
class ChecksumMismatch : public FormatError {
 public:
  ChecksumMismatch(std::string name, std::string path, std::uint64_t offset, std::uint64_t length,
                   std::uint64_t expected, std::uint64_t actual);
  const std::string& name() const noexcept { return name_; }
  std::uint64_t offset() const noexcept { return offset_; }
  std::uint64_t length() const noexcept { return length_; }
  std::uint64_t expected() const noexcept { return expected_; }
  std::uint64_t actual() const noexcept { return actual_; }

 private:
  std::string name_;
  std::uint64_t offset_;
  std::uint64_t length_;
  std::uint64_t expected_;
  std::uint64_t actual_;
};

// A request for `needed` bytes of a memory budget of `budget` bytes, of which `held` are in use
// and cannot be freed by waiting (what() says by what); needed > budget when it can never fit.
class BudgetExceeded : public Error {
 public:
  BudgetExceeded(const std::string& what, std::uint64_t needed, std::uint64_t budget,
                 std::uint64_t held)
      : Error(what), needed_(needed), budget_(budget), held_(held) {}
  std::uint64_t needed() const noexcept { return needed_; }
  std::uint64_t budget() const noexcept { return budget_; }
  std::uint64_t held() const noexcept { return held_; }

 private:
  std::uint64_t needed_;
  std::uint64_t budget_;
  std::uint64_t held_;
};

// `path` (a directory) is held by another owner: process `owner_pid` (this process's own pid when
// another object of it holds the directory; 0 when unknown).
class DirectoryLocked : public Error {
 public:
  DirectoryLocked(const std::string& what, std::string path, long owner_pid)
      : Error(what), path_(std::move(path)), owner_pid_(owner_pid) {}
  const std::string& path() const noexcept { return path_; }
  long owner_pid() const noexcept { return owner_pid_; }

 private:
  std::string path_;
  long owner_pid_;
};

// A wait stopped because the waiting thread's InterruptCheck said so (nvio/interrupt.hpp). A
// blocking call that throws it has cancelled its operations and waited for the pieces the kernel
// held: its buffer is the caller's again, and the bytes it should have moved are partly moved (a
// write left the file partly written). A wait for tickets leaves them outstanding.
class Interrupted : public Error {
 public:
  using Error::Error;
};

// What the failed system call was doing, in the words used in messages.
enum class IoOp { Open, Read, Write, Stat, Sync, Truncate, Submit, Wait, Rename, Remove };
const char* to_string(IoOp op) noexcept;

class IoError : public Error {
 public:
  // `err` is a positive errno value (0 when the failure is not an errno, e.g. a short file).
  IoError(IoOp op, std::string path, std::uint64_t offset, std::uint64_t length, int err,
          const std::string& detail = {});

  IoOp op() const noexcept { return op_; }
  const std::string& path() const noexcept { return path_; }
  std::uint64_t offset() const noexcept { return offset_; }
  std::uint64_t length() const noexcept { return length_; }
  int error_code() const noexcept { return errno_; }

 private:
  IoOp op_;
  std::string path_;
  std::uint64_t offset_;
  std::uint64_t length_;
  int errno_;
};

class FileNotFound : public IoError {
 public:
  using IoError::IoError;
};
class PermissionDenied : public IoError {
 public:
  using IoError::IoError;
};
class ReadOnlyFileSystem : public IoError {
 public:
  using IoError::IoError;
};
class IsADirectory : public IoError {
 public:
  using IoError::IoError;
};
class NoSpace : public IoError {
 public:
  using IoError::IoError;
};

// A read of [offset, offset + length) from a file that holds only `file_size` bytes (found before
// any I/O), or that ended inside the request while it was being read (ended_during_read).
class ShortFile : public IoError {
 public:
  ShortFile(IoOp op, std::string path, std::uint64_t offset, std::uint64_t length,
            std::uint64_t file_size);
  // The read got end of file at byte `ended_at` of the file, inside the request, and the file's
  // size is `file_size` now: it was truncated while being read, or (its size still covering the
  // request) the file system reported end of file early.
  static ShortFile ended_during_read(std::string path, std::uint64_t offset, std::uint64_t length,
                                     std::uint64_t ended_at, std::uint64_t file_size);
  std::uint64_t file_size() const noexcept { return file_size_; }

 private:
  ShortFile(IoOp op, std::string path, std::uint64_t offset, std::uint64_t length,
            std::uint64_t file_size, const std::string& detail);

  std::uint64_t file_size_;
};

// File::close() (file.hpp) refused: operations on the file are still in flight (blocking calls
// running in other threads, or asynchronous ones not finished yet). Nothing was closed; close
// again once they have finished (a wait collected them).
class FileBusy : public Error {
 public:
  FileBusy(const std::string& what, std::string path, std::size_t in_flight)
      : Error(what), path_(std::move(path)), in_flight_(in_flight) {}
  const std::string& path() const noexcept { return path_; }
  std::size_t in_flight() const noexcept { return in_flight_; }

 private:
  std::string path_;
  std::size_t in_flight_;
};

// Builds and throws the IoError subclass that matches `err` (a positive errno value).
[[noreturn]] void throw_io_error(IoOp op, const std::string& path, std::uint64_t offset,
                                 std::uint64_t length, int err, const std::string& detail = {});

}  // namespace nvio
NVIO_API_END
