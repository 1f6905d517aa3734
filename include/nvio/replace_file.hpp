// Atomic replacement of a file: the new contents go to a temporary file in the same directory,
// which is renamed over the target once complete. Every replacing save of nvio goes through
// ReplacementFile (the safetensors save, nvio.save and nvio.dcp's data files through
// nvio/checkpoint.hpp, the swapper's index, save_profile, and through the Python binding
// nvio.dcp's metadata and nvio.sharded's index), so there is one naming scheme and one clean-up
// for all; a program that writes files beside nvio's may use it too.
//
// Temporary names. A temporary of target "<dir>/<base>" is
//   "<dir>/.<base>.<host>.<start>.<pid>-<tid>-<n>.nvio-tmp"
// <host> is this machine's host name (characters other than letters, digits and '-' made '-'),
// <start> the writing process's start time (clock ticks after boot, /proc/<pid>/stat field 22),
// <pid>-<tid>-<n> unique_suffix(). A base so long that the name would pass NAME_MAX is shortened
// to its first 64 bytes, '~' and a hash of the whole base (the same for every save of it). The
// writer also holds an exclusive flock on its temporary while it has it open.
//
// Stale temporaries. A save killed before its rename (SIGKILL, a crash) leaves its temporary. The
// next save of the target (create_temporary, so every ReplacementFile) and the next nvio.load of it
// remove the target's temporaries whose writer is gone: made on this host, by a process that no
// longer runs (no /proc/<pid>, or one whose start time differs: the pid was reused), and not
// flocked by anyone (a writer in another pid namespace on this kernel). A temporary of another
// host, of a running writer, or whose name does not parse is never touched.
//
// Ownership: a ReplacementFile owns its temporary file (and its descriptor) until commit(); if it
// is destroyed before, the temporary file is removed, so a failed save leaves the old file and no
// debris. Move-only; one object is not thread-safe. The free functions may be called from any
// thread (two saves of one target at once each get a temporary of their own).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "nvio/errors.hpp"
#include "nvio/export.hpp"
#include "nvio/handle.hpp"

NVIO_API_BEGIN

namespace nvio {

struct TemporaryFile {
  std::string path;
  int fd = -1;  // write-only, close-on-exec, flocked; the caller closes it
};

// Removes the target's stale temporaries (above), then creates a new temporary (O_EXCL, mode 0666
// less the umask, as a new file made by open(2) or Python's open() gets). Throws the IoError of a
// failed creation, naming `target` (and the temporary in its detail).
TemporaryFile create_temporary(const std::string& target);

// Removes the target's temporaries whose writer is gone; returns how many it removed. Best
// effort: a directory it cannot list or a file it cannot remove is left as it is.
std::size_t remove_stale_temporaries(const std::string& target) noexcept;

// Who made temporary `name` (a file name in the target's directory) of a target whose file name
// is `base`; nothing when `name` is not one of its temporaries.
struct TemporaryWriter {
  std::string host;
  unsigned long long start = 0;
  long pid = 0;
};
std::optional<TemporaryWriter> temporary_writer(const std::string& base, const std::string& name);

class ReplacementFile {
 public:
  // Creates the target's temporary with create_temporary(). `writer`, the handle that writes
  // through fd() (if any; it must outlive this object), is told to let go of the temporary file
  // before its descriptor closes: kept by the handle, a discarded temporary file would hold its
  // disk space for up to a second after a failed save (a retry then finds the disk still full).
  explicit ReplacementFile(std::string path, Handle* writer = nullptr);
  ~ReplacementFile();
  ReplacementFile(ReplacementFile&& other) noexcept;
  ReplacementFile& operator=(ReplacementFile&&) = delete;
  ReplacementFile(const ReplacementFile&) = delete;
  ReplacementFile& operator=(const ReplacementFile&) = delete;

  // The temporary file's descriptor (write-only) and name, valid until commit().
  int fd() const noexcept { return fd_; }
  const std::string& temp_path() const noexcept { return temp_; }

  // Runs `write` (what writes the temporary) and returns its result; an IoError it throws about
  // the temporary file is thrown again as the same error about the target the caller gave, with
  // the temporary named in its detail: the user sees the file they asked to save.
  template <class Write>
  auto writing(Write&& write) -> decltype(write()) {
    try {
      return std::forward<Write>(write)();
    } catch (const IoError& e) {
      rethrow_for_target(e);
    }
  }

  // Closes the temporary file and renames it over the target. With Durability::Data, the caller
  // has already made the file's data durable (fdatasync); commit then syncs the directory, so the
  // rename itself survives a crash. A large replaced file is freed on a thread of its own after
  // the rename (its blocks took ~0.5 s per GiB to free inside rename(2) on ext4). Throws IoError
  // (Rename, Sync) after removing the temporary file.
  void commit(Durability durability);

 private:
  void discard() noexcept;
  void release_from_writer() noexcept;
  // Throws `e` again naming the target when it names the temporary file; else rethrows it as is.
  [[noreturn]] void rethrow_for_target(const IoError& e) const;

  std::string path_;
  Handle* writer_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace nvio
NVIO_API_END
