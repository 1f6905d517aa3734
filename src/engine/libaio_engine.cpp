// libaio back end: io_submit / io_getevents on one aio context per worker.
#include <libaio.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

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
        hint = " (the system-wide limit fs.aio-max-nr is exhausted; raise it with sysctl or use a "
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
  explicit LibaioEngine(unsigned queue_depth)
      : ctx_(queue_depth), iocbs_(queue_depth), free_(queue_depth), events_(queue_depth) {
    for (unsigned i = 0; i < queue_depth; ++i) free_[i] = &iocbs_[i];
  }

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
    const long want = static_cast<long>(std::min(out.size(), events_.size()));
    const int rc = detail::retry_interrupted([&] {
      return io_getevents(ctx_.get(), static_cast<long>(min_complete), want, events_.data(),
                          nullptr);
    });
    if (rc < 0) return rc;
    for (int i = 0; i < rc; ++i) {
      iocb* cb = events_[i].obj;
      // res is unsigned long in the ABI; negative errno values arrive as their two's complement.
      const auto res = static_cast<std::int64_t>(static_cast<long>(events_[i].res));
      out[i] = Completion{static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(cb->data)),
                          res};
      free_.push_back(cb);
    }
    return rc;
  }

  int cancel() override { return 0; }
  EngineKind kind() const noexcept override { return EngineKind::Libaio; }

 private:
  AioContext ctx_;
  std::vector<iocb> iocbs_;
  std::vector<iocb*> free_;
  std::vector<io_event> events_;
  std::vector<iocb*> batch_;
};

}  // namespace

std::unique_ptr<Engine> make_libaio_engine(unsigned queue_depth) {
  return std::make_unique<LibaioEngine>(queue_depth);
}

}  // namespace nvio::engine
