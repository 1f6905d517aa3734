// Interrupting a thread's waits: how Ctrl-C reaches a Python caller blocked in nvio.
//
// A blocking call of a Handle (read, write, read_batch, write_batch) and a wait for tickets
// (wait, wait_completion, wait_some) sleep until the kernel is done, which for a large transfer
// from a slow drive can be minutes. A caller that must react meanwhile (the Python binding, whose
// signal handlers run only when the waiting thread asks) installs an InterruptCheck on the
// waiting thread for the length of the call. The thread's waits then ask the check every
// kInterruptPeriod of the call's time (a call of many short waits too); once it answers true the
// wait stops:
//   * a blocking call cancels its operations (the pieces not handed to the kernel yet are never
//     started), waits for the pieces the kernel holds (so that the buffer is the caller's again
//     when it returns) and throws Interrupted; when every piece had started already, nothing is
//     cut short and the call returns (or throws) as it would have;
//   * a wait for tickets throws Interrupted and leaves the tickets outstanding: they can be waited
//     for again, or cancelled (Handle::cancel), and their buffers stay in use until then.
// A check is asked only from a wait: a call busy elsewhere (opening files) sees it at its next
// wait. StripedHandle's calls behave as a blocking call on every drive; the Swapper ignores
// checks (swapper.hpp).
//
// The check runs inside the wait, on the waiting thread: what it runs (Python's signal handlers)
// must not wait for what this wait is waiting for.
//
// Thread-safety: the check installed is the calling thread's own; it is called on that thread
// only, and never while the handle holds a lock.
#pragma once

#include <chrono>
#include <cstddef>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

// How often a waiting call asks the thread's check: about the longest a Ctrl-C waits to be seen.
inline constexpr std::chrono::milliseconds kInterruptPeriod{20};

class InterruptCheck {
 public:
  // True when the waiting thread should stop waiting. Must not throw; may block briefly (the
  // Python binding takes the GIL to run the signal handlers).
  virtual bool interrupted() noexcept = 0;

 protected:
  ~InterruptCheck() = default;
};

// Installs `check` for the calling thread while the object lives, and restores the one installed
// before (scopes nest). Neither copyable nor movable: it belongs to the scope that made it.
class ScopedInterruptCheck {
 public:
  explicit ScopedInterruptCheck(InterruptCheck& check) noexcept;
  // No check while it lives: the waits in its scope run to their end. For code that cleans up
  // after an Interrupted and must see the kernel done with its buffers before it throws on.
  explicit ScopedInterruptCheck(std::nullptr_t) noexcept;
  ~ScopedInterruptCheck();
  ScopedInterruptCheck(const ScopedInterruptCheck&) = delete;
  ScopedInterruptCheck& operator=(const ScopedInterruptCheck&) = delete;

 private:
  InterruptCheck* previous_;
};

}  // namespace nvio
NVIO_API_END
