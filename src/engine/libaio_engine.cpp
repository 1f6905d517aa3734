// libaio back end: io_submit / io_getevents on one aio context per worker.
#include <fmt/format.h>
#include <libaio.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "core/retry.hpp"
#include "engine/engine.hpp"
#include "nvio/errors.hpp"

namespace nvio::engine {
namespace {

// Owns one kernel aio context. Move-only; not thread-safe (one worker uses it).
class AioContext {
 public:
  explicit AioContext(unsigned max_events) {
    const int rc = io_setup(static_cast<int>(max_events), &ctx_);
    if (rc < 0) {
      std::string hint;
      if (rc == -EAGAIN) {
        hint =
            " (the system-wide limit fs.aio-max-nr is exhausted; raise it with sysctl or use a "
            "smaller queue_depth)";
      }
      throw EngineUnavailable(
          fmt::format("io_setup({}) failed: {}{}", max_events, std::strerror(-rc), hint));
    }
  }
  ~AioContext() { io_destroy(ctx_); }
  AioContext(const AioContext&) = delete;
  AioContext& operator=(const AioContext&) = delete;

  io_context_t get() const noexcept { return ctx_; }

 private:
  io_context_t ctx_ = nullptr;
};

class LibaioEngine final : public Engine {
 public:
  // One event more than queue_depth: the watch's poll (Engine::watch).
  explicit LibaioEngine(unsigned queue_depth)
      : ctx_(queue_depth + 1), iocbs_(queue_depth), free_(queue_depth), events_(queue_depth + 1) {
    for (unsigned i = 0; i < queue_depth; ++i) free_[i] = &iocbs_[i];
  }

  ~LibaioEngine() override {
    // io_destroy waits for every request; it cancels a pending poll too, but a readable eventfd
    // ends the poll on any kernel.
    if (watch_armed_) {
      const std::uint64_t one = 1;
      [[maybe_unused]] const ssize_t rc = ::write(watch_fd_, &one, sizeof one);
    }
  }
  LibaioEngine(const LibaioEngine&) = delete;
  LibaioEngine& operator=(const LibaioEngine&) = delete;

  int submit(std::span<const Request> requests) override {
    std::vector<iocb*>& batch = batch_;
    batch.clear();
    for (const Request& r : requests) {
      if (free_.empty()) break;
      iocb* cb = free_.back();
      free_.pop_back();
      if (r.direction == Direction::Read) {
        io_prep_pread(cb, r.fd, r.buf, r.length, static_cast<long long>(r.offset));
      } else {
        io_prep_pwrite(cb, r.fd, r.buf, r.length, static_cast<long long>(r.offset));
      }
      cb->data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(r.tag));
      batch.push_back(cb);
    }
    // io_submit may take only part of the batch: it stops at the first iocb it refuses and
    // reports that iocb's error only when it took none before it.
    std::size_t done = 0;
    int error = 0;
    while (done < batch.size()) {
      const int rc = detail::retry_interrupted([&] {
        return io_submit(ctx_.get(), static_cast<long>(batch.size() - done), &batch[done]);
      });
      if (rc <= 0) {
        error = rc;
        break;
      }
      done += static_cast<std::size_t>(rc);
    }
    for (std::size_t i = done; i < batch.size(); ++i) free_.push_back(batch[i]);
    return done > 0 ? static_cast<int>(done) : error;
  }

  int reap(std::span<Completion> out, std::size_t min_complete) override {
    std::size_t n = 0;
    while (n < out.size() && !cancelled_.empty()) {
      out[n++] = complete(cancelled_.front());
      cancelled_.pop_front();
    }
    const std::size_t room = std::min(out.size() - n, events_.size());
    if (room == 0) return static_cast<int>(n);
    // Never wait for more than the kernel holds: it would wait for ever.
    const std::size_t in_kernel = iocbs_.size() - free_.size() - cancelled_.size();
    std::size_t wait_for = std::min({min_complete > n ? min_complete - n : 0, in_kernel, room});
    // With the watch's poll pending, wait for one event: it may be the one that ends the wait.
    if (wait_for > 0 && arm_watch()) wait_for = 1;
    const int rc = detail::retry_interrupted([&] {
      return io_getevents(ctx_.get(), static_cast<long>(wait_for), static_cast<long>(room),
                          events_.data(), nullptr);
    });
    if (rc < 0) return n > 0 ? static_cast<int>(n) : rc;
    for (int i = 0; i < rc; ++i) {
      const io_event& e = events_[static_cast<std::size_t>(i)];
      if (e.obj == &watch_cb_) {
        watch_fired(static_cast<long>(e.res));
      } else {
        out[n++] = complete(e);
      }
    }
    return static_cast<int>(n);
  }

  bool watch(int fd) noexcept override {
    watch_fd_ = fd;
    return true;
  }

  int cancel() override {
    // The kernel cancels aio only where a driver supports it (USB gadget, FunctionFS); for files
    // and block devices io_cancel answers -EINVAL (or -EAGAIN), and the request completes as
    // usual. Since Linux 3.11 a cancelled request answers -EINPROGRESS and its event arrives
    // through the ring like any other; older kernels answered 0 and wrote the event into the
    // `result` argument instead of the ring, so such an event is kept for reap() to report.
    std::vector<bool> idle(iocbs_.size(), false);  // free, or its event already held here
    for (const iocb* cb : free_) idle[index(cb)] = true;
    for (const io_event& e : cancelled_) idle[index(e.obj)] = true;
    int error = 0;
    for (iocb& cb : iocbs_) {
      if (idle[index(&cb)]) continue;
      io_event event{};
      const int rc = io_cancel(ctx_.get(), &cb, &event);
      if (rc == 0) {
        cancelled_.push_back(event);
      } else if (rc != -EINPROGRESS && rc != -EINVAL && rc != -EAGAIN && error == 0) {
        error = rc;
      }
    }
    return error;
  }

  EngineKind kind() const noexcept override { return EngineKind::Libaio; }

 private:
  // Turns an event into the caller's completion and frees its iocb.
  Completion complete(const io_event& event) {
    iocb* cb = event.obj;
    free_.push_back(cb);
    // res is unsigned long in the ABI; negative errno values arrive as their two's complement.
    return Completion{static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(cb->data)),
                      static_cast<std::int64_t>(static_cast<long>(event.res))};
  }

  std::size_t index(const iocb* cb) const { return static_cast<std::size_t>(cb - iocbs_.data()); }

  // Makes sure the watched eventfd's poll (IOCB_CMD_POLL, Linux 4.18) is in the kernel before a
  // wait. Returns true when it is.
  bool arm_watch() {
    if (watch_fd_ < 0) return false;
    if (watch_armed_) return true;
    io_prep_poll(&watch_cb_, watch_fd_, POLLIN);
    iocb* cb = &watch_cb_;
    const int rc = detail::retry_interrupted([&] { return io_submit(ctx_.get(), 1, &cb); });
    if (rc == 1) {
      watch_armed_ = true;
    } else if (rc == -EINVAL) {
      watch_fd_ = -1;  // a kernel without aio poll: waits end on completions only, as before
    }
    return watch_armed_;
  }

  // The watch's poll completed: the eventfd was written (or the poll failed).
  void watch_fired(long res) {
    watch_armed_ = false;
    if (res < 0) {
      watch_fd_ = -1;
      return;
    }
    std::uint64_t count = 0;
    [[maybe_unused]] const ssize_t rc = ::read(watch_fd_, &count, sizeof count);
  }

  AioContext ctx_;
  std::vector<iocb> iocbs_;
  std::vector<iocb*> free_;
  std::vector<io_event> events_;
  std::vector<iocb*> batch_;
  std::deque<io_event> cancelled_;  // events io_cancel returned itself (kernels before 3.11)
  iocb watch_cb_{};                 // the poll of the watched eventfd (Engine::watch)
  int watch_fd_ = -1;               // that eventfd, or -1
  bool watch_armed_ = false;        // its poll is in the kernel
};

}  // namespace

std::unique_ptr<Engine> make_libaio_engine(unsigned queue_depth) {
  return std::make_unique<LibaioEngine>(queue_depth);
}

}  // namespace nvio::engine
