#include "memory/user_copy.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace nvio::detail {
namespace {

// Granularity of the probe: every page of the caller's range is touched once. 4 KiB is the
// smallest page Linux uses on the machines nvio supports; larger pages are probed more than once.
constexpr std::uintptr_t kProbeStride = 4096;

}  // namespace

UserCopier::~UserCopier() {
  for (int fd : pipe_) {
    if (fd >= 0) ::close(fd);
  }
}

bool UserCopier::make_pipe() noexcept {
  if (pipe_[0] >= 0) return true;
  return ::pipe2(pipe_, O_NONBLOCK | O_CLOEXEC) == 0;
}

void UserCopier::drain(std::size_t bytes) noexcept {
  char sink[1024];
  while (bytes > 0) {
    const ssize_t n = ::read(pipe_[0], sink, std::min(bytes, sizeof(sink)));
    if (n <= 0) break;  // empty already (non-blocking): nothing is left to drain
    bytes -= static_cast<std::size_t>(n);
  }
}

UserCopyResult UserCopier::probe(std::byte* user, const std::byte* chunk, std::size_t n,
                                 bool writable) noexcept {
  const auto base = reinterpret_cast<std::uintptr_t>(user);
  std::size_t off = 0;
  while (off < n) {
    // One byte at the start of the range and of every later page, up to 1024 pages per round.
    const std::size_t round_start = off;
    std::size_t count = 0;
    for (; off < n && count < user_iov_.size(); ++count) {
      user_iov_[count] = iovec{user + off, 1};
      chunk_iov_[count] = iovec{const_cast<std::byte*>(chunk) + off, 1};
      off = static_cast<std::size_t>((base + off) / kProbeStride * kProbeStride + kProbeStride -
                                     base);
    }
    const int iov_count = static_cast<int>(count);
    const auto want = static_cast<ssize_t>(count);
    ssize_t got;
    if (writable) {
      // Our own bytes into the (empty) pipe, then out of it into the caller's pages.
      if (::writev(pipe_[1], chunk_iov_.data(), iov_count) != want) {
        drain(count);
        return UserCopyResult{-1, 0};
      }
      got = ::readv(pipe_[0], user_iov_.data(), iov_count);
      drain(count - static_cast<std::size_t>(std::max<ssize_t>(got, 0)));
    } else {
      got = ::writev(pipe_[1], user_iov_.data(), iov_count);
      drain(static_cast<std::size_t>(std::max<ssize_t>(got, 0)));
    }
    if (got < 0 && errno != EFAULT) return UserCopyResult{-1, 0};
    // A pipe drops the whole page-sized buffer a fault interrupts, so the count does not locate
    // the bad page: only its round is known.
    if (got != want) return UserCopyResult{EFAULT, round_start};
  }
  return UserCopyResult{};
}

UserCopyResult UserCopier::copy(std::byte* user, std::byte* chunk, std::size_t n,
                                bool to_user) noexcept {
  const UserCopyResult probed =
      make_pipe() ? probe(user, chunk, n, to_user) : UserCopyResult{-1, 0};
  if (probed.error == 0) {
    if (to_user) {
      std::memcpy(user, chunk, n);
    } else {
      std::memcpy(chunk, user, n);
    }
    return probed;
  }
  // Bad memory somewhere, or no pipe: copy with the calls that check every page and stop exactly
  // at the first bad one. Where the kernel refuses those, the probe's finding stands.
  const UserCopyResult r = copy_user_by_process_vm(user, chunk, n, to_user);
  if (probed.error == EFAULT && r.error != 0 && r.error != EFAULT) return probed;
  return r;
}

UserCopyResult UserCopier::to_user(std::byte* user, const std::byte* chunk,
                                   std::size_t n) noexcept {
  // Only read: the chunk is the source.
  return copy(user, const_cast<std::byte*>(chunk), n, /*to_user=*/true);
}

UserCopyResult UserCopier::from_user(std::byte* chunk, const std::byte* user,
                                     std::size_t n) noexcept {
  // Only read: the caller's memory is the source, and the probe writes nothing there.
  return copy(const_cast<std::byte*>(user), chunk, n, /*to_user=*/false);
}

UserCopyResult copy_user_by_process_vm(std::byte* user, std::byte* chunk, std::size_t n,
                                       bool to_user) noexcept {
  const pid_t self = ::getpid();
  std::size_t done = 0;
  while (done < n) {
    const iovec local{chunk + done, n - done};
    const iovec remote{user + done, n - done};
    const ssize_t rc = to_user ? ::process_vm_writev(self, &local, 1, &remote, 1, 0)
                               : ::process_vm_readv(self, &local, 1, &remote, 1, 0);
    if (rc < 0) return UserCopyResult{errno, done};
    // A short count stops at the first page it could not access; none at all means that page.
    if (rc == 0) return UserCopyResult{EFAULT, done};
    done += static_cast<std::size_t>(rc);
  }
  return UserCopyResult{};
}

}  // namespace nvio::detail
