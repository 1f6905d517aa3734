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
  int submit(std::span<const Request> requests) override {
    // Each request runs to completion now; its result waits in `done_` for reap().
    for (const Request& r : requests) {
      ssize_t rc;
      do {
        rc = r.direction == Direction::Read
                 ? ::pread(r.fd, r.buf, r.length, static_cast<off_t>(r.offset))
                 : ::pwrite(r.fd, r.buf, r.length, static_cast<off_t>(r.offset));
      } while (rc < 0 && errno == EINTR);
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

  EngineKind kind() const noexcept override { return EngineKind::Psync; }

 private:
  std::deque<Completion> done_;
};

}  // namespace

std::unique_ptr<Engine> make_psync_engine(unsigned /*queue_depth*/) {
  return std::make_unique<PsyncEngine>();
}

}  // namespace nvio::engine
