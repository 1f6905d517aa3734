#include "core/replace_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <utility>

#include "core/posix.hpp"
#include "core/unique_name.hpp"
#include "nvio/errors.hpp"

namespace nvio::detail {

ReplacementFile::ReplacementFile(std::string path, Handle* writer)
    : path_(std::move(path)), writer_(writer) {
  int fd = -EEXIST;
  for (int attempt = 0; attempt < kUniqueNameAttempts && fd == -EEXIST; ++attempt) {
    temp_ = path_ + ".tmp." + unique_suffix();
    fd = open_file(temp_, O_WRONLY | O_CREAT | O_EXCL, 0666);
  }
  if (fd < 0) throw_io_error(IoOp::Open, temp_, 0, 0, -fd, "cannot create the temporary file");
  fd_ = fd;
}

ReplacementFile::ReplacementFile(ReplacementFile&& other) noexcept
    : path_(std::move(other.path_)),
      writer_(other.writer_),
      temp_(std::move(other.temp_)),
      fd_(std::exchange(other.fd_, -1)),
      committed_(std::exchange(other.committed_, true)) {}

ReplacementFile::~ReplacementFile() { discard(); }

void ReplacementFile::release_from_writer() noexcept {
  if (writer_ == nullptr || fd_ < 0) return;
  try {
    writer_->close_file(fd_);
  } catch (...) {  // an optimisation only: the handle lets go of the file within a second anyway
  }
}

void ReplacementFile::discard() noexcept {
  release_from_writer();
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!committed_) {
    ::unlink(temp_.c_str());
    committed_ = true;
  }
}

void ReplacementFile::commit(Durability durability) {
  release_from_writer();
  // close(2) may report a write-back error of a network file system: a failed close is a failed
  // save.
  if (::close(std::exchange(fd_, -1)) != 0 && errno != EINTR) {
    const int err = errno;
    discard();
    throw_io_error(IoOp::Write, temp_, 0, 0, err, "closing the temporary file failed");
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    discard();
    throw_io_error(IoOp::Rename, path_, 0, 0, err, "cannot rename '" + temp_ + "' over it");
  }
  committed_ = true;
  if (durability != Durability::Data) return;
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = open_file(dir, O_RDONLY | O_DIRECTORY);
  if (dfd < 0) throw_io_error(IoOp::Open, dir, 0, 0, -dfd, "opening the directory to sync it");
  const FileDescriptor owner(dfd);
  if (::fsync(dfd) != 0) {
    throw_io_error(IoOp::Sync, dir, 0, 0, errno, "syncing the directory after the rename");
  }
}

}  // namespace nvio::detail
