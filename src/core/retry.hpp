// The one retry policy for EINTR and EAGAIN. Internal to the library.
//
// Two kinds of call are retried, each with its own bound, and nothing else loops on these errors:
//
//   Transfers (a read or write of one piece: pread/pwrite, an io_uring or libaio request, cuFile).
//   Engines never repeat a transfer themselves: they report -EINTR / -EAGAIN as the request's
//   completion, and the handle submits the piece again, at most kTransferRetries times in a row
//   without a byte moving. A transfer that keeps failing so (a FUSE or network file system that
//   keeps answering EINTR, a device that keeps answering EAGAIN) then fails its operation with an
//   IoError carrying that errno, instead of spinning for ever.
//
//   Calls that move no data (waiting for completions, handing requests to the kernel, open).
//   These are interrupted whenever a signal arrives while they block, and that is normal: Python
//   installs its handlers without SA_RESTART, so SIGCHLD, SIGINT or a profiler's timer interrupt
//   healthy waits, possibly many times during one slow request. Such a call is repeated at most
//   kInterruptedCallRetries times in a row (the count starts again whenever the call gets
//   through). The bound only has to stop a kernel or file system that answers EINTR without ever
//   blocking, which spins through it in about a second, while a wait interrupted by even a 10 kHz
//   timer signal would need more than a minute without one completion to reach it.
//
// Thread-safety: the constants are immutable; a RetryCounter belongs to whoever retries (one
// worker thread) and is not shared.
#pragma once

#include <cerrno>
#include <type_traits>

namespace nvio::detail {

// Retries of one piece after -EINTR / -EAGAIN completions, in a row without progress.
inline constexpr unsigned kTransferRetries = 16;
// Repeats of a call that moves no data after EINTR, in a row.
inline constexpr unsigned kInterruptedCallRetries = 1u << 20;

// Whether a positive errno value means "nothing happened, the same call may succeed if repeated".
constexpr bool is_transient(int err) noexcept { return err == EINTR || err == EAGAIN; }

// Counts the transient failures of one thing in a row against a limit.
class RetryCounter {
 public:
  explicit constexpr RetryCounter(unsigned limit) noexcept : limit_(limit) {}
  // After a failure with `err` (a positive errno value): true when it is transient and the limit
  // is not reached yet, so the caller repeats the call; false when the caller reports `err`.
  constexpr bool retry(int err) noexcept {
    if (!is_transient(err) || used_ >= limit_) return false;
    ++used_;
    return true;
  }
  // Something moved: the count starts again.
  constexpr void progress() noexcept { used_ = 0; }

 private:
  unsigned limit_;
  unsigned used_ = 0;
};

// Makes a call that moves no data (`call()` returns a value >= 0 or -errno) and repeats it while
// it returns -EINTR, within kInterruptedCallRetries. Returns the last result.
template <class Call>
auto retry_interrupted(Call&& call) -> std::invoke_result_t<Call&> {
  RetryCounter counter(kInterruptedCallRetries);
  for (;;) {
    auto rc = call();
    if (rc != -EINTR || !counter.retry(EINTR)) return rc;
  }
}

}  // namespace nvio::detail
