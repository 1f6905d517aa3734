// How a handle starts its worker threads, replaceable in tests. Internal to the library.
//
// Thread-safety: the starter may be replaced from any thread (it is guarded by a mutex); a handle
// copies it once per constructor and calls the copy on the constructing thread.
#pragma once

#include <functional>
#include <thread>

namespace nvio::detail {

// Starts a thread that runs `body` and returns it. Throws what std::thread's constructor throws
// when the system refuses a thread: std::system_error (EAGAIN under RLIMIT_NPROC,
// kernel.threads-max or a cgroup's pids.max), or std::bad_alloc.
using ThreadStarter = std::function<std::thread(std::function<void()> body)>;

// Starts a worker thread through the installed starter (std::thread when none is).
std::thread start_worker_thread(std::function<void()> body);

// Tests: installs `starter` for the worker threads started from now on (an empty one restores
// std::thread) and returns the previous one.
ThreadStarter set_thread_starter_for_testing(ThreadStarter starter);

}  // namespace nvio::detail
