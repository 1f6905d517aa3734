// Atomic replacement of a file: the new contents go to a temporary file in the same directory,
// which is renamed over the target once complete. Internal to the library.
//
// Ownership: a ReplacementFile owns its temporary file (and its descriptor) until commit(); if it
// is destroyed before, the temporary file is removed, so a failed save leaves the old file and no
// debris. Move-only; not thread-safe.
#pragma once

#include <string>

#include "nvio/handle.hpp"

namespace nvio::detail {

class ReplacementFile {
 public:
  // Creates "<path>.tmp.<unique suffix>" (O_EXCL, mode 0666 less the umask, as a new file made by
  // open(2) or Python's open() gets). Throws the IoError of the failed open. `writer`, the handle
  // that writes through fd() (if any; it must outlive this object), is told to let go of the
  // temporary file before its descriptor closes: kept by the handle, a discarded temporary file
  // would hold its disk space for up to a second after a failed save (a retry then finds the
  // disk still full).
  explicit ReplacementFile(std::string path, Handle* writer = nullptr);
  ~ReplacementFile();
  ReplacementFile(ReplacementFile&& other) noexcept;
  ReplacementFile& operator=(ReplacementFile&&) = delete;
  ReplacementFile(const ReplacementFile&) = delete;
  ReplacementFile& operator=(const ReplacementFile&) = delete;

  // The temporary file's descriptor (write-only) and name, valid until commit().
  int fd() const noexcept { return fd_; }
  const std::string& temp_path() const noexcept { return temp_; }

  // Closes the temporary file and renames it over the target. With Durability::Data, the caller
  // has already made the file's data durable (fdatasync); commit then syncs the directory, so the
  // rename itself survives a crash. Throws IoError (Rename, Sync) after removing the temporary
  // file.
  void commit(Durability durability);

 private:
  void discard() noexcept;
  void release_from_writer() noexcept;

  std::string path_;
  Handle* writer_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace nvio::detail
