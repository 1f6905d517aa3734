// io_uring calls for tests (engine::IoUringCalls) that count what an engine hands the kernel, by
// opcode, and refuse buffer registration on demand, for the engine-level tests of regions
// (engine_region_test.cpp) and the handle-level tests of the bounce slabs (bounce_test.cpp).
//
// Thread-safety: one process-wide spy of atomics; the calls run on worker threads. A test resets
// it (reset()) before it starts.
#pragma once

#include <atomic>

#include "engine/engine.hpp"

namespace nvio_test {

struct RingSpy {
  std::atomic<int> fixed{0};          // READ_FIXED / WRITE_FIXED SQEs handed to the kernel
  std::atomic<int> plain{0};          // READ / WRITE SQEs
  std::atomic<int> sparse{0};         // register_buffers_sparse calls
  std::atomic<int> updates{0};        // register_buffers_update_tag calls
  std::atomic<int> registered{0};     // regions the kernel registered
  std::atomic<int> refuse_sparse{0};  // -errno to answer register_buffers_sparse with, or 0
  std::atomic<int> refuse_update{0};  // -errno to answer each update with, or 0

  // Zero counts, nothing refused.
  void reset();
};

// The one spy of the process.
RingSpy& ring_spy();

// The real io_uring calls, seen (and refused as asked) by ring_spy().
nvio::engine::IoUringCalls spying_io_uring_calls();

}  // namespace nvio_test
