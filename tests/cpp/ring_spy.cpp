#include "ring_spy.hpp"

#include <liburing.h>

namespace nvio_test {
namespace {

// Counts the SQEs the engine prepared, by opcode, before the kernel takes them.
int spying_submit(io_uring* ring) {
  RingSpy& spy = ring_spy();
  for (unsigned k = ring->sq.sqe_head; k != ring->sq.sqe_tail; ++k) {
    const io_uring_sqe& sqe = ring->sq.sqes[k & ring->sq.ring_mask];
    if (sqe.opcode == IORING_OP_READ_FIXED || sqe.opcode == IORING_OP_WRITE_FIXED) ++spy.fixed;
    if (sqe.opcode == IORING_OP_READ || sqe.opcode == IORING_OP_WRITE) ++spy.plain;
  }
  return nvio::engine::real_io_uring_calls().submit(ring);
}

int spying_sparse(io_uring* ring, unsigned count) {
  RingSpy& spy = ring_spy();
  ++spy.sparse;
  if (const int rc = spy.refuse_sparse.load()) return rc;
  return nvio::engine::real_io_uring_calls().register_buffers_sparse(ring, count);
}

int spying_update(io_uring* ring, unsigned offset, const iovec* iovecs,
                  const unsigned long long* tags, unsigned count) {
  RingSpy& spy = ring_spy();
  ++spy.updates;
  if (const int rc = spy.refuse_update.load()) return rc;
  const int rc = nvio::engine::real_io_uring_calls().register_buffers_update_tag(
      ring, offset, iovecs, tags, count);
  if (rc > 0) spy.registered += rc;
  return rc;
}

}  // namespace

void RingSpy::reset() {
  fixed = plain = sparse = updates = registered = 0;
  refuse_sparse = refuse_update = 0;
}

RingSpy& ring_spy() {
  static RingSpy spy;
  return spy;
}

nvio::engine::IoUringCalls spying_io_uring_calls() {
  nvio::engine::IoUringCalls calls = nvio::engine::real_io_uring_calls();
  calls.submit = spying_submit;
  calls.register_buffers_sparse = spying_sparse;
  calls.register_buffers_update_tag = spying_update;
  return calls;
}

}  // namespace nvio_test
