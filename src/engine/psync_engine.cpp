// psync back end: pread/pwrite on the worker thread itself. For file systems or sandboxes where
// io_uring and libaio are unavailable; parallelism comes from intra_op_parallelism workers.
#include <unistd.h>

#include <cerrno>

#include "engine/engine.hpp"

namespace nvio::engine {
namespace {

class PsyncEngine final : public SynchronousEngine {
 public:
  explicit PsyncEngine(PsyncCalls calls) : calls_(calls) {}
  EngineKind kind() const noexcept override { return EngineKind::Psync; }

 protected:
  // Each request runs once, now; its result (EINTR included: the handle decides about retries)
  // is its completion.
  std::int64_t transfer(const Request& r) override {
    const ssize_t rc = r.direction == Direction::Read
                           ? calls_.pread(r.fd, r.buf, r.length, static_cast<off_t>(r.offset))
                           : calls_.pwrite(r.fd, r.buf, r.length, static_cast<off_t>(r.offset));
    return rc < 0 ? -static_cast<std::int64_t>(errno) : rc;
  }

 private:
  PsyncCalls calls_;
};

}  // namespace

PsyncCalls real_psync_calls() noexcept { return PsyncCalls{::pread, ::pwrite}; }

std::unique_ptr<Engine> make_psync_engine(unsigned /*queue_depth*/, PsyncCalls calls) {
  return std::make_unique<PsyncEngine>(calls);
}

}  // namespace nvio::engine
