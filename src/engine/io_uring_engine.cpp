// io_uring back end (liburing): one ring per worker.
#include <liburing.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/retry.hpp"
#include "engine/engine.hpp"
#include "nvio/errors.hpp"

namespace nvio::engine {
namespace {

// Owns one io_uring instance. Move-only; not thread-safe (one worker uses it).
class Ring {
 public:
  explicit Ring(unsigned entries) {
    io_uring_params params{};
    // The ring is only ever used by the worker thread that made it.
    params.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN;
    int rc = io_uring_queue_init_params(entries, &ring_, &params);
    if (rc == -EINVAL) {  // older kernels lack the flags: they are optimisations only
      params = io_uring_params{};
      rc = io_uring_queue_init_params(entries, &ring_, &params);
    }
    if (rc < 0) {
      throw EngineUnavailable(
          fmt::format("io_uring_queue_init({}) failed: {}", entries, std::strerror(-rc)));
    }
  }
  ~Ring() { io_uring_queue_exit(&ring_); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  io_uring* get() noexcept { return &ring_; }

 private:
  io_uring ring_{};
};

class IoUringEngine final : public Engine {
 public:
  explicit IoUringEngine(unsigned queue_depth) : ring_(queue_depth) {}

  int submit(std::span<const Request> requests) override {
    std::size_t queued = 0;
    for (const Request& r : requests) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      if (sqe == nullptr) break;
      if (r.direction == Direction::Read) {
        io_uring_prep_read(sqe, r.fd, r.buf, static_cast<unsigned>(r.length), r.offset);
      } else {
        io_uring_prep_write(sqe, r.fd, r.buf, static_cast<unsigned>(r.length), r.offset);
      }
      io_uring_sqe_set_data64(sqe, r.tag);
      ++queued;
    }
    if (queued == 0) return 0;
    // Prepared SQEs stay in the ring until the kernel takes them and cannot be withdrawn, so they
    // count as accepted even when this submit fails: reap() submits them again before waiting and
    // reports a lasting failure there. Per-request errors arrive as completions.
    submit_pending();
    return static_cast<int>(queued);
  }

  int reap(std::span<Completion> out, std::size_t min_complete) override {
    if (unsubmitted_) {
      const int rc = submit_pending();
      if (rc < 0 && rc != -EAGAIN && rc != -EBUSY) return rc;
    }
    if (min_complete > 0) {
      // A wait moves no data: interruptions (and EAGAIN, which the ring reports while it cannot
      // wait yet) are repeated within the bound for such calls.
      io_uring_cqe* cqe = nullptr;
      detail::RetryCounter interrupted(detail::kInterruptedCallRetries);
      int rc;
      do {
        rc = io_uring_wait_cqe_nr(ring_.get(), &cqe, static_cast<unsigned>(min_complete));
      } while (rc < 0 && interrupted.retry(-rc));
      if (rc < 0) return rc;
    }
    io_uring_cqe* cqes[256];
    const unsigned want = static_cast<unsigned>(std::min<std::size_t>(out.size(), 256));
    const unsigned got = io_uring_peek_batch_cqe(ring_.get(), cqes, want);
    for (unsigned i = 0; i < got; ++i) {
      out[i] = Completion{io_uring_cqe_get_data64(cqes[i]), cqes[i]->res};
    }
    io_uring_cq_advance(ring_.get(), got);
    return static_cast<int>(got);
  }

  int cancel() override { return 0; }
  EngineKind kind() const noexcept override { return EngineKind::IoUring; }

 private:
  int submit_pending() {
    const int rc = detail::retry_interrupted([&] { return io_uring_submit(ring_.get()); });
    unsubmitted_ = rc < 0 || io_uring_sq_ready(ring_.get()) > 0;
    return rc;
  }

  Ring ring_;
  bool unsubmitted_ = false;  // SQEs prepared but not yet taken by the kernel
};

}  // namespace

std::unique_ptr<Engine> make_io_uring_engine(unsigned queue_depth) {
  return std::make_unique<IoUringEngine>(queue_depth);
}

}  // namespace nvio::engine
