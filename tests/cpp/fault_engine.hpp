// A fault-injecting engine for tests: wraps a real engine and, driven by a seed and a FaultPlan,
// makes it behave like a kernel having a bad day, without ever breaking the Engine contract
// (src/engine/engine.hpp): every accepted request completes exactly once through reap(), with its
// tag unchanged and a result never above its length; reap(min_complete) returns once that many
// completions can exist and never waits for one that cannot come.
//
// What it injects (each counted in FaultStats when it happened, so a test can prove it did):
//   per request:    an error completion (EIO, EBADF; writes also ENOSPC, EROFS) without any
//                   transfer; a short transfer (the inner engine gets a shortened request, and
//                   its result is reported); an EINTR or EAGAIN completion without any transfer.
//   per submit():   a prefix of the batch accepted; none accepted (-EAGAIN, -EBUSY or 0: out of
//                   resources for now, at most kMaxNoRoomInARow times in a row); the first
//                   request refused (-EBADF or -EINVAL, nothing accepted).
//   per completion: held back for up to `max_hold_reaps` reap() calls, then released in random
//                   order (sooner whenever a reap needs it to reach min_complete).
//   per reap():     a transient failure (-EAGAIN, no completion consumed: call again), and
//                   optionally, from a given call on, a persistent one (-EIO from every reap
//                   and submit: the outstanding requests are lost to the caller).
//
// Thread-safety: a FaultEngine, like every engine, belongs to one thread. FaultStats is shared
// and atomic. The factory from fault_engine_factory() may be called on any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.hpp"

namespace nvio_test {

enum class Fault : unsigned {
  RequestError,    // an error completion, nothing transferred
  ShortTransfer,   // the inner engine did a shortened request
  Interrupted,     // an EINTR completion, nothing transferred
  WouldBlock,      // an EAGAIN completion, nothing transferred
  PartialSubmit,   // submit() accepted a prefix of the batch
  SubmitNoRoom,    // submit() accepted nothing: -EAGAIN, -EBUSY or 0
  SubmitRefused,   // submit() refused the first request: -EBADF or -EINVAL
  HeldCompletion,  // a completion held back by reap()
  ReapTransient,   // reap() failed with -EAGAIN
  ReapPersistent,  // reap() failed with -EIO for good (counted once per engine)
};
inline constexpr std::size_t kFaultCount = 10;
const char* to_string(Fault fault);

// Which faults, how often: each probability is per request, submit call, completion or reap call
// as its name says (0: never). Keep them small enough for a caller's retry bounds: a request
// meets transient faults `interrupted + would_block` of the time on each try.
struct FaultPlan {
  double request_error = 0;
  double short_transfer = 0;
  double interrupted = 0;
  double would_block = 0;
  double partial_submit = 0;
  double submit_no_room = 0;
  double submit_refused = 0;
  double hold_completion = 0;
  unsigned max_hold_reaps = 4;  // a held completion is released within this many reap() calls
  double reap_transient = 0;
  // 0: never; n: the n-th reap() of an engine and every later reap() and submit() fail with -EIO.
  std::uint64_t reap_persistent_after = 0;

  // Every fault but the persistent reap failure, at rates that leave most requests alone.
  static FaultPlan everything();
  // Whether the plan can inject `fault`.
  bool enables(Fault fault) const;
};

// What the fault engines sharing it injected, by kind. Thread-safe.
struct FaultStats {
  std::array<std::atomic<std::uint64_t>, kFaultCount> counts{};
  void add(Fault fault) { counts[static_cast<std::size_t>(fault)].fetch_add(1); }
  std::uint64_t count(Fault fault) const { return counts[static_cast<std::size_t>(fault)].load(); }
  // "RequestError=3 ShortTransfer=0 ...", for failure messages.
  std::string describe() const;
};

// Submit faults that say "out of resources, offer again" come at most this often in a row, so
// that a caller with nothing in flight to wait for gets through within its retry bound.
inline constexpr unsigned kMaxNoRoomInARow = 3;

class FaultEngine final : public nvio::engine::Engine {
 public:
  FaultEngine(std::unique_ptr<nvio::engine::Engine> inner, const FaultPlan& plan,
              std::uint64_t seed, std::shared_ptr<FaultStats> stats);
  // Waits for the requests the inner engine still holds. The breakage is simulated: below it the
  // kernel works, and a broken engine's requests are real transfers into the caller's memory.
  // Closing waits for them, as closing an aio context does (io_destroy), so that a caller told of
  // the failure after the close (Worker::die) may release that memory.
  ~FaultEngine() override;

  // Restarts the random sequence, so that one engine (costly to make for libaio) can serve many
  // seeds. Only between uses: with nothing outstanding.
  void reseed(std::uint64_t seed) { rng_.seed(seed); }

  int submit(std::span<const nvio::engine::Request> requests) override;
  int reap(std::span<nvio::engine::Completion> out, std::size_t min_complete) override;
  int cancel() override;
  // The inner engine's: requests keep their region when shortened (still inside it).
  int add_region(void* base, std::size_t bytes) noexcept override {
    return inner_->add_region(base, bytes);
  }
  std::string region_refusal() const override { return inner_->region_refusal(); }
  nvio::EngineKind kind() const noexcept override;

 private:
  struct Pending {
    nvio::engine::Completion completion;
    unsigned hold;  // reap() calls still to wait; 0: ready
  };

  bool chance(double p);
  // Reaps the inner engine, waiting for `min_complete` (at most what it holds), into pool_.
  int pull(std::size_t min_complete);
  // Moves pool entries into out[n...] (ready ones only unless `force`), in random order, until
  // out has `limit` entries or none are left. Returns the new n.
  std::size_t release(std::span<nvio::engine::Completion> out, std::size_t n, std::size_t limit,
                      bool force);

  std::unique_ptr<nvio::engine::Engine> inner_;
  FaultPlan plan_;
  std::mt19937_64 rng_;
  std::shared_ptr<FaultStats> stats_;
  std::vector<Pending> pool_;                   // completions not reported yet
  std::size_t inner_outstanding_ = 0;           // accepted by the inner engine, not reaped from it
  std::vector<nvio::engine::Request> forward_;  // scratch: the batch for the inner engine
  std::vector<std::size_t> forward_index_;      // index in the caller's batch of each forward_
  std::vector<nvio::engine::Completion> scratch_;
  std::uint64_t reaps_ = 0;
  unsigned no_room_in_a_row_ = 0;
  bool broken_ = false;
};

// Makes an EngineFactory whose engines are FaultEngines over the back end of the requested kind
// (make_backend_engine), seeded from `seed` and the order they are made in, all counting into
// `stats`. The factory is thread-safe.
nvio::engine::EngineFactory fault_engine_factory(FaultPlan plan, std::uint64_t seed,
                                                 std::shared_ptr<FaultStats> stats);

}  // namespace nvio_test
