// The caller-driven path: see handle/caller_lane.hpp.
#include "handle/caller_lane.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace nvio::detail {

namespace {

// A thread's identity for its lanes: alive until the thread ends. Lanes hold the flag, so its
// address is never that of another thread's while a lane refers to it.
struct ThreadMark {
  std::shared_ptr<std::atomic<bool>> alive = std::make_shared<std::atomic<bool>>(true);
  ~ThreadMark() { alive->store(false, std::memory_order_release); }
};

const std::shared_ptr<std::atomic<bool>>& this_thread_mark() {
  thread_local ThreadMark mark;
  return mark.alive;
}

// A lane's queue depth: enough for a small operation's pieces (an unaligned direct read has up to
// three: two buffered edges and the direct middle).
constexpr unsigned kLaneDepth = 4;

}  // namespace

struct CallerLanes::Lane {
  std::shared_ptr<std::atomic<bool>> owner;  // the thread that made it, the only one to drive it
  OperationQueue queue;
  std::unique_ptr<DrivenWorker> worker;  // null: no lane for this thread (could not be made)
  bool busy = false;                     // a call of the owner drives it now
};

bool caller_driven_enabled() noexcept {
  const char* v = std::getenv("NVIO_CALLER_DRIVEN");
  return v == nullptr || (std::strcmp(v, "off") != 0 && std::strcmp(v, "0") != 0);
}

CallerLanes::CallerLanes(const WorkerSettings& base, StatsShard* shards, bool enabled)
    : base_(base), shards_(shards), enabled_(enabled) {}

CallerLanes::~CallerLanes() = default;

CallerLanes::Lease::~Lease() {
  if (lane_ != nullptr) lane_->busy = false;  // only its owner reads or writes it
}

OperationQueue& CallerLanes::Lease::queue() const { return lane_->queue; }

void CallerLanes::Lease::drive() const noexcept { lane_->worker->drive(); }

CallerLanes::Lease CallerLanes::lease(const Job& job, OperationQueue& handle_queue) {
  if (!enabled_ || job.ops.size() != 1) return {};
  const Operation& op = *job.ops.front();
  if (op.memory != MemoryKind::Host || op.length > kMaxBytes || op.piece_count == 0) return {};
  // A handle whose workers died refuses every call: the workers' queue says so.
  if (!handle_queue.idle() || handle_queue.worker_failure() != nullptr) return {};
  Lane* lane = lane_of_this_thread();
  // A lane whose worker stopped (queue.worker_died()) is never driven again: the workers serve
  // the thread from then on.
  if (lane == nullptr || lane->worker == nullptr || lane->busy ||
      lane->queue.worker_failure() != nullptr) {
    return {};
  }
  lane->busy = true;
  return Lease(lane);
}

CallerLanes::Lane* CallerLanes::lane_of_this_thread() {
  const std::shared_ptr<std::atomic<bool>>& me = this_thread_mark();
  std::lock_guard lock(mutex_);
  for (const auto& lane : lanes_) {
    if (lane != nullptr && lane->owner == me) return lane.get();
  }
  // A new lane, in a free place or one whose thread has ended (an ended thread's lane is idle:
  // only its owner drove it).
  auto place = std::find_if(lanes_.begin(), lanes_.end(), [](const std::unique_ptr<Lane>& l) {
    return l == nullptr || !l->owner->load(std::memory_order_acquire);
  });
  if (place == lanes_.end()) return nullptr;
  const auto k = static_cast<unsigned>(place - lanes_.begin());
  place->reset();
  auto lane = std::make_unique<Lane>();
  lane->owner = me;
  WorkerSettings settings = base_;
  settings.index = base_.intra_op_parallelism + k;
  settings.queue_depth = std::min(base_.queue_depth, kLaneDepth);
  settings.intra_op_parallelism = 1;
  settings.stats = &shards_[k];
  settings.caller_driven = true;
  try {
    lane->worker = std::make_unique<DrivenWorker>(settings, lane->queue);
  } catch (...) {
    // No engine or memory for it now (a ring refused under RLIMIT_MEMLOCK, say): the thread
    // keeps using the workers, without asking again on every call.
    lane->worker.reset();
  }
  *place = std::move(lane);
  return place->get();
}

}  // namespace nvio::detail
