// Names for temporary files that no other thread or process picks at the same time. Internal to
// the library.
//
// Thread-safety: unique_suffix() may be called from any thread.
#pragma once

#include <string>

namespace nvio::detail {

// "<pid>-<tid>-<n>": the process id, the calling thread's id and a process-wide counter, so that
// two calls never return the same suffix within a process (threads included), nor in two
// processes running at the same time on one host. A name made from it can still exist on disk (a
// file left by a process that crashed with the same pid, or a process in another pid namespace):
// callers create it with O_EXCL and take another suffix on EEXIST.
std::string unique_suffix();

// How many suffixes a caller tries before giving up on EEXIST.
inline constexpr int kUniqueNameAttempts = 100;

}  // namespace nvio::detail
