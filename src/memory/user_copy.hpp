// Copies between the caller's memory and a bounce chunk that never fault on the caller's side.
// The caller's buffer may be memory the process cannot write (a read-only mapping such as a
// np.memmap opened with mode='r') or read (PROT_NONE); a plain memcpy would kill the process with
// SIGSEGV, while a system call given the same memory fails with EFAULT, which the handle reports
// as an IoError like any other.
//
// How: the kernel first touches one byte of every page of the caller's range, through a pipe
// (writev from the caller's memory; readv into it, writing the very bytes the copy then writes);
// when every page is fine memcpy moves the bytes. Copying everything
// with process_vm_writev/readv on the own process checks every page too, but it pins each page
// and was measured at 3.5 GB/s against 6 GB/s for this probe plus memcpy and 10 GB/s for memcpy
// alone (1 MiB chunks, see docs/design.md). So process_vm_writev/readv copy only where the probe
// found a bad page (they then say exactly where the good bytes end) or where no pipe can be made
// (out of descriptors). Where the kernel refuses them too (ENOSYS, or EPERM under seccomp), the
// copy fails with that errno (or the probe's EFAULT) rather than risk the fault.
//
// A buffer whose mapping another thread changes (munmap, mprotect) between the probe and the copy
// can still fault: the caller must leave a buffer mapped as it was while an operation uses it,
// as it must not free it.
//
// Ownership and thread-safety: a UserCopier belongs to one worker thread and owns its pipe (made
// on first use, closed on destruction); it is not thread-safe.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>

namespace nvio::detail {

struct UserCopyResult {
  int error = 0;             // 0, or a positive errno: EFAULT when part of the range is bad
  std::size_t fault_at = 0;  // error: the offset in the range where the bad memory starts
};

class UserCopier {
 public:
  UserCopier() = default;
  ~UserCopier();
  UserCopier(const UserCopier&) = delete;
  UserCopier& operator=(const UserCopier&) = delete;

  // Copies `n` bytes of `chunk` into the caller's memory at `user`.
  UserCopyResult to_user(std::byte* user, const std::byte* chunk, std::size_t n) noexcept;
  // Copies `n` bytes of the caller's memory at `user` into `chunk`.
  UserCopyResult from_user(std::byte* chunk, const std::byte* user, std::size_t n) noexcept;

 private:
  UserCopyResult copy(std::byte* user, std::byte* chunk, std::size_t n, bool to_user) noexcept;
  // Probes the caller's pages of [user, user + n): readable, or writable (writing there the bytes
  // of `chunk` at the same offsets). `error` is 0, EFAULT (`fault_at`: the start of the 1024
  // pages among which the bad one is), or -1 when the pipe cannot be used.
  UserCopyResult probe(std::byte* user, const std::byte* chunk, std::size_t n,
                       bool writable) noexcept;
  bool make_pipe() noexcept;
  void drain(std::size_t bytes) noexcept;

  int pipe_[2] = {-1, -1};  // read end, write end; non-blocking; empty between calls
  std::array<iovec, 1024> user_iov_{};
  std::array<iovec, 1024> chunk_iov_{};
};

// The checking copy without a pipe: process_vm_writev (into the caller's memory, `to_user`) or
// process_vm_readv on the own process. On EFAULT, `fault_at` is exactly where the copy stopped.
UserCopyResult copy_user_by_process_vm(std::byte* user, std::byte* chunk, std::size_t n,
                                       bool to_user) noexcept;

}  // namespace nvio::detail
