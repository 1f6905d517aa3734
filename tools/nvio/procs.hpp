// The barrier between the processes of `nvio bench --procs N` (procs.cpp), as bench.cpp sees it.
#pragma once

namespace nvio_cli {

// One process's side of the loop barrier: two pipes to the parent. wait() writes one byte saying
// "ready" and blocks until the parent writes one byte back, which it does only once every process
// is ready, so that all processes start each timed loop together. A pipe (not a shared-memory
// barrier) so that a dead party is seen at once: the parent gets end-of-file when a process dies,
// and a process gets end-of-file (or EPIPE) when the parent dies, instead of waiting for ever.
class LoopGate {
 public:
  LoopGate(int ready_fd, int go_fd) : ready_fd_(ready_fd), go_fd_(go_fd) {}
  // Throws nvio::Error when the parent is gone.
  void wait() const;

 private:
  int ready_fd_;
  int go_fd_;
};

}  // namespace nvio_cli
