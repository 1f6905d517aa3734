// LD_PRELOAD shim for A/B runs of io_uring's registered buffers (bench/fixed_buffers_ab.py): the
// "kernel" refuses the table of registered buffers, as one before Linux 5.19 or without the
// feature would, so nvio's io_uring engine falls back to plain reads and writes.
//   gcc -O2 -shared -fPIC -o /tmp/nvio_no_fixed_buffers.so bench/no_fixed_buffers.c
#include <errno.h>

struct io_uring;

int io_uring_register_buffers_sparse(struct io_uring* ring, unsigned nr) {
  (void)ring;
  (void)nr;
  return -EOPNOTSUPP;
}
