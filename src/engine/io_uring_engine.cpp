// io_uring back end (liburing): one ring per worker.
#include <fmt/format.h>
#include <liburing.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "core/retry.hpp"
#include "engine/engine.hpp"
#include "nvio/errors.hpp"
#include "nvio/warnings.hpp"

namespace nvio::engine {
namespace {

// Owns one io_uring instance. Move-only; not thread-safe (one worker uses it).
class Ring {
 public:
  explicit Ring(unsigned entries) {
    io_uring_params params{};
    // The ring is only ever used by the worker thread that made it. TASKRUN_FLAG lets a reap that
    // does not wait see completions whose deferred work still has to run (liburing then enters the
    // kernel to run it).
    params.flags =
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
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

// The user_data of the engine's own cancel requests. Requests carry their slot index (below
// queue_depth), never the caller's tag, so no tag can be mistaken for it.
constexpr std::uint64_t kCancelData = ~std::uint64_t{0};
// The user_data of the poll of the watched eventfd (Engine::watch).
constexpr std::uint64_t kWatchData = kCancelData - 1;

// Cancels every request of the ring in one SQE (Linux 5.19); older kernels answer -EINVAL, and the
// engine then cancels each request by its user_data.
constexpr int kCancelAllFlags = IORING_ASYNC_CANCEL_ALL | IORING_ASYNC_CANCEL_ANY;

// Entries of the ring's table of registered buffers, made sparse on the first add_region() and
// filled one region at a time. A worker's bounce pool grows in slabs of doubling size, so it has
// a few dozen at the very most; regions beyond the table go without registration.
constexpr unsigned kMaxRegions = 64;

class IoUringEngine final : public Engine {
 public:
  // Two SQEs more than queue_depth: a cancel and the watch's poll always find room behind a full
  // queue of requests.
  IoUringEngine(unsigned queue_depth, IoUringCalls calls)
      : ring_(queue_depth + 2),
        calls_(calls),
        tags_(queue_depth),
        state_(queue_depth, SlotState::Free) {
    free_.reserve(queue_depth);
    for (unsigned i = queue_depth; i-- > 0;) free_.push_back(i);
  }

  int submit(std::span<const Request> requests) override {
    arm_watch();  // goes to the kernel with the requests: no system call of its own
    std::size_t queued = 0;
    for (const Request& r : requests) {
      if (free_.empty()) break;
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      if (sqe == nullptr) break;
      const unsigned slot = free_.back();
      free_.pop_back();
      const auto length = static_cast<unsigned>(r.length);
      if (r.region >= 0) {  // only ever an index add_region() returned
        if (r.direction == Direction::Read) {
          io_uring_prep_read_fixed(sqe, r.fd, r.buf, length, r.offset, r.region);
        } else {
          io_uring_prep_write_fixed(sqe, r.fd, r.buf, length, r.offset, r.region);
        }
      } else if (r.direction == Direction::Read) {
        io_uring_prep_read(sqe, r.fd, r.buf, length, r.offset);
      } else {
        io_uring_prep_write(sqe, r.fd, r.buf, length, r.offset);
      }
      io_uring_sqe_set_data64(sqe, slot);
      tags_[slot] = r.tag;
      state_[slot] = SlotState::Queued;
      unsent_.push_back(slot);
      ++queued;
    }
    if (queued == 0) return 0;
    // Prepared SQEs stay in the ring until the kernel takes them and cannot be withdrawn, so they
    // count as accepted even when this submit fails: reap() submits them again before waiting and
    // reports a lasting failure there. Per-request errors arrive as completions.
    send();
    return static_cast<int>(queued);
  }

  int reap(std::span<Completion> out, std::size_t min_complete) override {
    int sent = 0;
    if (!unsent_.empty()) {
      sent = send();
      if (sent < 0 && sent != -EAGAIN && sent != -EBUSY) return sent;
    }
    woken_ = false;
    std::size_t n = drain(out);
    // -EBUSY: the kernel had too many completions waiting; draining them may have made room.
    if (sent < 0 && n > 0 && !unsent_.empty()) send();
    // Wait only for completions the kernel owes: the requests still in the ring, refused by
    // io_uring_submit, complete only once it takes them (defect 4: waiting for them hung).
    const std::size_t want = std::min({min_complete, out.size(), n + in_kernel_});
    if (n == 0 && want == 0 && min_complete > 0 && !out.empty() && outstanding() > 0) {
      return -EAGAIN;  // all of them are still in the ring: nothing can be waited for now
    }
    if (n < want && !woken_ && arm_watch()) send();
    while (n < want && !woken_) {
      // A wait moves no data: interruptions (and EAGAIN, which the ring reports while it cannot
      // wait yet) are repeated within the bound for such calls. The engine's own cancel CQEs
      // count for the kernel but are not reported, hence the loop; it never waits for more than
      // in_kernel_, which each completion stored lowers by one.
      io_uring_cqe* cqe = nullptr;
      detail::RetryCounter interrupted(detail::kInterruptedCallRetries);
      int rc;
      // With the watch's poll pending, one CQE at a time: it may be the one that ends the wait.
      const auto nr = watch_armed_ ? 1U : static_cast<unsigned>(want - n);
      do {
        rc = io_uring_wait_cqe_nr(ring_.get(), &cqe, nr);
      } while (rc < 0 && interrupted.retry(-rc));
      if (rc < 0) return n > 0 ? static_cast<int>(n) : rc;
      n += drain(out.subspan(n));
    }
    return static_cast<int>(n);
  }

  int cancel() override {
    if (outstanding() == 0) return 0;
    if (cancel_all_) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      if (sqe == nullptr) return -EAGAIN;
      io_uring_prep_cancel64(sqe, 0, kCancelAllFlags);
      io_uring_sqe_set_data64(sqe, kCancelData);
      unsent_.push_back(kCancelData);
    } else {
      // Behind the requests still waiting in the ring, so those are cancelled too once the
      // kernel takes them. A slot reused before its cancel runs may cancel the newer request:
      // harmless, as a cancelled request still completes.
      for (unsigned slot = 0; slot < state_.size(); ++slot) {
        if (state_[slot] == SlotState::Free) continue;
        io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
        if (sqe == nullptr) break;
        io_uring_prep_cancel64(sqe, slot, 0);
        io_uring_sqe_set_data64(sqe, kCancelData);
        unsent_.push_back(kCancelData);
      }
    }
    const int rc = send();
    return rc < 0 && rc != -EAGAIN && rc != -EBUSY ? rc : 0;
  }

  // Registers [base, base + bytes) as one fixed buffer of the ring. The kernel pins its pages
  // (they count against RLIMIT_MEMLOCK without CAP_IPC_LOCK) and keeps them until the ring is
  // closed, so the memory may even be freed before the engine. Any refusal leaves the region
  // unregistered, and a refused table (kernels before 5.19) every later one too; the first is
  // reported (region_refusal(), and once per process as a warning).
  int add_region(void* base, std::size_t bytes) noexcept override {
    if (!regions_usable_ || next_region_ >= kMaxRegions) return -1;
    if (!regions_made_) {
      const int rc = calls_.register_buffers_sparse(ring_.get(), kMaxRegions);
      if (rc < 0) {
        regions_usable_ = false;
        refused("io_uring_register_buffers_sparse", rc);
        return -1;
      }
      regions_made_ = true;
    }
    const iovec region{base, bytes};
    const unsigned long long tag = 0;  // no notification when the kernel lets the region go
    const int rc = calls_.register_buffers_update_tag(ring_.get(), next_region_, &region, &tag, 1);
    if (rc != 1) {
      refused("io_uring_register_buffers_update_tag", rc < 0 ? rc : -EIO);
      return -1;
    }
    return static_cast<int>(next_region_++);
  }

  std::string region_refusal() const override { return refusal_; }

  bool watch(int fd) noexcept override {
    watch_fd_ = fd;
    return true;
  }

  EngineKind kind() const noexcept override { return EngineKind::IoUring; }

 private:
  enum class SlotState : unsigned char {
    Free,
    Queued,    // an SQE in the ring that the kernel has not taken yet
    InKernel,  // taken by the kernel; its CQE is still to come
  };

  // Prepares the watched eventfd's poll unless it is pending already. Returns true when it
  // prepared one (it still has to be sent).
  bool arm_watch() {
    if (watch_fd_ < 0 || watch_armed_) return false;
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    if (sqe == nullptr) return false;
    io_uring_prep_poll_add(sqe, watch_fd_, POLLIN);
    io_uring_sqe_set_data64(sqe, kWatchData);
    unsent_.push_back(kWatchData);
    watch_armed_ = true;
    return true;
  }

  // The watch's poll completed: the eventfd was written (or the poll was cancelled or failed).
  void watch_fired(std::int32_t res) {
    watch_armed_ = false;
    // Cancelled by cancel()'s cancel-all: no wake, and nothing to read. Ending the wait here would
    // return an empty reap that the worker takes for a working engine.
    if (res == -ECANCELED) return;
    woken_ = true;
    if (res < 0) {
      watch_fd_ = -1;  // a kernel that cannot poll it: waits end on completions only, as before
      return;
    }
    std::uint64_t count = 0;
    // Resets the counter; EAGAIN (another poll of ours saw it first) needs nothing.
    [[maybe_unused]] const ssize_t rc = ::read(watch_fd_, &count, sizeof count);
  }

  // Keeps why `call` refused a region (-errno `rc`), the first time; warns once per process when
  // the memlock limit refused it.
  void refused(const char* call, int rc) noexcept {
    if (!refusal_.empty()) return;
    try {
      std::string hint;
      if (rc == -ENOMEM) {
        rlimit limit{};
        const bool known = ::getrlimit(RLIMIT_MEMLOCK, &limit) == 0;
        hint = !known || limit.rlim_cur == RLIM_INFINITY
                   ? std::string(" (registered buffers are pinned memory)")
                   : fmt::format(
                         " (registered buffers are pinned memory, limited by "
                         "RLIMIT_MEMLOCK to {} KiB without CAP_IPC_LOCK)",
                         limit.rlim_cur / 1024);
      } else if (rc == -EINVAL) {
        hint = " (sparse buffer tables need Linux 5.19)";
      }
      refusal_ = fmt::format("{}: {}{}", call, std::strerror(-rc), hint);
      // Warned only when the user can change it (the memlock limit); an old kernel's refusal is
      // kept for reports (region_refusal(), the probe's reason) without a warning in every process.
      if (rc != -ENOMEM) return;
      warn(fmt::format("io_uring refused to register nvio's locked buffers ({}): requests into "
                       "them use plain reads and writes instead of fixed-buffer ones",
                       refusal_),
           "io_uring-registered-buffers");
    } catch (...) {  // out of memory for the message: the fallback works all the same
    }
  }

  // Requests accepted and not reaped yet, in the ring or in the kernel.
  std::size_t outstanding() const noexcept { return tags_.size() - free_.size(); }

  // Hands the prepared SQEs to the kernel. Returns what io_uring_submit returned.
  int send() {
    io_uring* ring = ring_.get();
    const unsigned before = io_uring_sq_ready(ring);
    const int rc = detail::retry_interrupted([&] { return calls_.submit(ring); });
    // The kernel takes SQEs in order: those it took are the first of `unsent_`.
    const unsigned taken = before - io_uring_sq_ready(ring);
    for (unsigned i = 0; i < taken; ++i) {
      const std::uint64_t data = unsent_.front();
      unsent_.pop_front();
      if (data != kCancelData && data != kWatchData) {
        state_[data] = SlotState::InKernel;
        ++in_kernel_;
      }
    }
    return rc;
  }

  // Moves the CQEs available now into `out` (the engine's own cancel and watch CQEs are consumed
  // but not reported). Returns how many it stored.
  std::size_t drain(std::span<Completion> out) {
    std::size_t n = 0;
    io_uring_cqe* cqe = nullptr;
    while (n < out.size() && io_uring_peek_cqe(ring_.get(), &cqe) == 0) {
      const std::uint64_t data = io_uring_cqe_get_data64(cqe);
      const std::int32_t res = cqe->res;
      io_uring_cqe_seen(ring_.get(), cqe);
      if (data == kCancelData) {
        if (res == -EINVAL && cancel_all_) {  // the kernel predates IORING_ASYNC_CANCEL_ALL/ANY
          cancel_all_ = false;
          recancel_ = true;
        }
        continue;
      }
      if (data == kWatchData) {
        watch_fired(res);
        continue;
      }
      out[n++] = Completion{tags_[data], res};
      state_[data] = SlotState::Free;
      --in_kernel_;
      free_.push_back(static_cast<unsigned>(data));
    }
    if (recancel_) {
      recancel_ = false;
      cancel();
    }
    return n;
  }

  Ring ring_;
  IoUringCalls calls_;
  std::vector<std::uint64_t> tags_;  // the caller's tag of each slot
  std::vector<SlotState> state_;
  std::vector<unsigned> free_;        // free slots
  std::size_t in_kernel_ = 0;         // requests the kernel took whose CQE is not reaped yet
  std::deque<std::uint64_t> unsent_;  // user_data of the SQEs not taken by the kernel, in order
  bool cancel_all_ = true;            // false: the kernel cancels one request per SQE only
  bool recancel_ = false;             // a cancel-all was refused: cancel each request instead
  bool regions_made_ = false;         // the sparse table of registered buffers exists
  bool regions_usable_ = true;        // false: the kernel refused the table
  unsigned next_region_ = 0;          // the table's next free entry
  std::string refusal_;               // why the first refused region was (region_refusal())
  int watch_fd_ = -1;                 // the eventfd that ends a wait (Engine::watch), or -1
  bool watch_armed_ = false;          // its poll is in the ring or in the kernel
  bool woken_ = false;                // its poll completed during this reap()
};

}  // namespace

IoUringCalls real_io_uring_calls() noexcept {
  return IoUringCalls{::io_uring_submit, ::io_uring_register_buffers_sparse,
                      ::io_uring_register_buffers_update_tag};
}

std::unique_ptr<Engine> make_io_uring_engine(unsigned queue_depth, IoUringCalls calls) {
  return std::make_unique<IoUringEngine>(queue_depth, calls);
}

}  // namespace nvio::engine
