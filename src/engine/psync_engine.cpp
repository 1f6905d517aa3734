// psync back end: pread/pwrite on the worker thread itself. For file systems or sandboxes where
// io_uring and libaio are unavailable; parallelism comes from intra_op_parallelism workers.
#include <unistd.h>

#include <cerrno>
#include <deque>

#include "engine/engine.hpp"

namespace nvio::engine {
namespace {

class PsyncEngine final : public Engine {
 public:
  explicit PsyncEngine(PsyncCalls calls) : calls_(calls) {}

  int submit(std::span<const Request> requests) override {
    // Each request runs once, now; its result (EINTR included: the handle decides about retries)
    // waits in `done_` for reap().
    for (const Request& r : requests) {
      const ssize_t rc = r.direction == Direction::Read
                             ? calls_.pread(r.fd, r.buf, r.length, static_cast<off_t>(r.offset))
                             : calls_.pwrite(r.fd, r.buf, r.length, static_cast<off_t>(r.offset));
      done_.push_back(Completion{r.tag, rc < 0 ? -static_cast<std::int64_t>(errno) : rc});
    }
    return static_cast<int>(requests.size());
  }

  int reap(std::span<Completion> out, std::size_t /*min_complete*/) override {
    std::size_t n = 0;
    while (n < out.size() && !done_.empty()) {
      out[n++] = done_.front();
      done_.pop_front();
    }
    return static_cast<int>(n);
  }

  // Every request completed inside submit(): there is never anything to cancel.
  int cancel() override { return 0; }
  EngineKind kind() const noexcept override { return EngineKind::Psync; }

 private:
  PsyncCalls calls_;
  std::deque<Completion> done_;
};

}  // namespace

PsyncCalls real_psync_calls() noexcept { return PsyncCalls{::pread, ::pwrite}; }

std::unique_ptr<Engine> make_psync_engine(unsigned /*queue_depth*/, PsyncCalls calls) {
  return std::make_unique<PsyncEngine>(calls);
}

}  // namespace nvio::engine
