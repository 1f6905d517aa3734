#include "fault_engine.hpp"

#include <fcntl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <utility>

namespace nvio_test {

using nvio::engine::Completion;
using nvio::engine::Direction;
using nvio::engine::Engine;
using nvio::engine::Request;

namespace {

// Direct I/O needs aligned lengths: a shortened O_DIRECT request keeps a multiple of this.
constexpr std::size_t kDirectShortUnit = 4096;

bool is_direct(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_DIRECT) != 0;
}

// SplitMix64: well-spread engine seeds from one test seed and a counter.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E37'79B9'7F4A'7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58'476D'1CE4'E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D0'49BB'1331'11EBULL;
  return x ^ (x >> 31);
}

}  // namespace

const char* to_string(Fault fault) {
  switch (fault) {
    case Fault::RequestError: return "RequestError";
    case Fault::ShortTransfer: return "ShortTransfer";
    case Fault::Interrupted: return "Interrupted";
    case Fault::WouldBlock: return "WouldBlock";
    case Fault::PartialSubmit: return "PartialSubmit";
    case Fault::SubmitNoRoom: return "SubmitNoRoom";
    case Fault::SubmitRefused: return "SubmitRefused";
    case Fault::HeldCompletion: return "HeldCompletion";
    case Fault::ReapTransient: return "ReapTransient";
    case Fault::ReapPersistent: return "ReapPersistent";
  }
  return "?";
}

FaultPlan FaultPlan::everything() {
  FaultPlan p;
  p.request_error = 0.02;
  p.short_transfer = 0.1;
  p.interrupted = 0.04;
  p.would_block = 0.04;
  p.partial_submit = 0.2;
  p.submit_no_room = 0.1;
  p.submit_refused = 0.02;
  p.hold_completion = 0.3;
  p.reap_transient = 0.05;
  return p;
}

bool FaultPlan::enables(Fault fault) const {
  switch (fault) {
    case Fault::RequestError: return request_error > 0;
    case Fault::ShortTransfer: return short_transfer > 0;
    case Fault::Interrupted: return interrupted > 0;
    case Fault::WouldBlock: return would_block > 0;
    case Fault::PartialSubmit: return partial_submit > 0;
    case Fault::SubmitNoRoom: return submit_no_room > 0;
    case Fault::SubmitRefused: return submit_refused > 0;
    case Fault::HeldCompletion: return hold_completion > 0 && max_hold_reaps > 0;
    case Fault::ReapTransient: return reap_transient > 0;
    case Fault::ReapPersistent: return reap_persistent_after > 0;
  }
  return false;
}

std::string FaultStats::describe() const {
  std::string s;
  for (std::size_t i = 0; i < kFaultCount; ++i) {
    s += fmt::format("{}{}={}", i == 0 ? "" : " ", to_string(static_cast<Fault>(i)),
                     counts[i].load());
  }
  return s;
}

FaultEngine::FaultEngine(std::unique_ptr<Engine> inner, const FaultPlan& plan, std::uint64_t seed,
                         std::shared_ptr<FaultStats> stats)
    : inner_(std::move(inner)), plan_(plan), rng_(seed), stats_(std::move(stats)) {}

FaultEngine::~FaultEngine() {
  while (inner_outstanding_ > 0) {
    scratch_.resize(inner_outstanding_);
    const int rc = inner_->reap(scratch_, inner_outstanding_);
    if (rc > 0) {
      inner_outstanding_ -= static_cast<std::size_t>(rc);
    } else if (rc == -EAGAIN || rc == -EINTR || rc == 0) {
      std::this_thread::yield();  // io_uring hands refused SQEs to the kernel on a later call
    } else {
      return;  // the inner engine broke for real: nothing left to wait with
    }
  }
}

bool FaultEngine::chance(double p) {
  return p > 0 && std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p;
}

int FaultEngine::submit(std::span<const Request> requests) {
  if (broken_) return -EIO;
  if (requests.empty()) return 0;
  if (chance(plan_.submit_refused)) {
    stats_->add(Fault::SubmitRefused);
    return (rng_() & 1) != 0 ? -EBADF : -EINVAL;
  }
  if (no_room_in_a_row_ < kMaxNoRoomInARow && chance(plan_.submit_no_room)) {
    ++no_room_in_a_row_;
    stats_->add(Fault::SubmitNoRoom);
    constexpr int kAnswers[] = {-EAGAIN, -EBUSY, 0};
    return kAnswers[rng_() % 3];
  }
  no_room_in_a_row_ = 0;
  std::size_t n = requests.size();
  bool partial = false;
  if (n >= 2 && chance(plan_.partial_submit)) {
    n = std::uniform_int_distribution<std::size_t>(1, n - 1)(rng_);
    partial = true;
  }
  // Decide each request's fate; those with an injected completion skip the inner engine. They
  // are accepted only if the inner engine accepts every forwarded request before them.
  struct Decision {
    Fault fault;
    std::int64_t result;  // the injected completion; unused for ShortTransfer
  };
  std::vector<std::pair<std::size_t, Decision>> injected;  // by index in `requests`
  forward_.clear();
  forward_index_.clear();
  std::vector<bool> shortened;
  for (std::size_t i = 0; i < n; ++i) {
    const Request& r = requests[i];
    if (chance(plan_.request_error)) {
      static constexpr int kReadErrors[] = {EIO, EBADF};
      static constexpr int kWriteErrors[] = {EIO, ENOSPC, EROFS, EBADF};
      const int err =
          r.direction == Direction::Read ? kReadErrors[rng_() % 2] : kWriteErrors[rng_() % 4];
      injected.push_back({i, Decision{Fault::RequestError, -err}});
      continue;
    }
    if (chance(plan_.interrupted)) {
      injected.push_back({i, Decision{Fault::Interrupted, -EINTR}});
      continue;
    }
    if (chance(plan_.would_block)) {
      injected.push_back({i, Decision{Fault::WouldBlock, -EAGAIN}});
      continue;
    }
    Request f = r;
    bool shorter = false;
    if (r.length >= 2 && chance(plan_.short_transfer)) {
      if (!is_direct(r.fd)) {
        f.length = std::uniform_int_distribution<std::size_t>(1, r.length - 1)(rng_);
        shorter = true;
      } else if (r.length >= 2 * kDirectShortUnit) {
        const std::size_t units = (r.length - 1) / kDirectShortUnit;
        f.length = kDirectShortUnit * std::uniform_int_distribution<std::size_t>(1, units)(rng_);
        shorter = true;
      }
    }
    forward_.push_back(f);
    forward_index_.push_back(i);
    shortened.push_back(shorter);
  }
  // The caller's requests [0, accepted) are accepted.
  std::size_t accepted = n;
  int inner_rc = 0;
  if (!forward_.empty()) {
    inner_rc = inner_->submit(forward_);
    const std::size_t taken = inner_rc > 0 ? static_cast<std::size_t>(inner_rc) : 0;
    inner_outstanding_ += taken;
    for (std::size_t k = 0; k < taken; ++k) {
      if (shortened[k]) stats_->add(Fault::ShortTransfer);
    }
    if (taken < forward_.size()) accepted = forward_index_[taken];
  }
  for (const auto& [index, decision] : injected) {
    if (index >= accepted) break;
    stats_->add(decision.fault);
    pool_.push_back(Pending{Completion{requests[index].tag, decision.result}, 0});
  }
  if (accepted == 0) return inner_rc;  // the inner engine's answer for the first request
  if (partial) stats_->add(Fault::PartialSubmit);
  return static_cast<int>(accepted);
}

int FaultEngine::pull(std::size_t min_complete) {
  if (inner_outstanding_ == 0) return 0;
  scratch_.resize(std::max<std::size_t>(inner_outstanding_, 1));
  const int rc = inner_->reap(scratch_, std::min(min_complete, inner_outstanding_));
  if (rc <= 0) return rc;
  inner_outstanding_ -= static_cast<std::size_t>(rc);
  for (int i = 0; i < rc; ++i) {
    unsigned hold = 0;
    if (plan_.max_hold_reaps > 0 && chance(plan_.hold_completion)) {
      hold = std::uniform_int_distribution<unsigned>(1, plan_.max_hold_reaps)(rng_);
      stats_->add(Fault::HeldCompletion);
    }
    pool_.push_back(Pending{scratch_[static_cast<std::size_t>(i)], hold});
  }
  return rc;
}

std::size_t FaultEngine::release(std::span<Completion> out, std::size_t n, std::size_t limit,
                                 bool force) {
  std::vector<std::size_t> candidates;
  for (std::size_t i = 0; i < pool_.size(); ++i) {
    if (force || pool_[i].hold == 0) candidates.push_back(i);
  }
  std::shuffle(candidates.begin(), candidates.end(), rng_);
  std::vector<bool> taken(pool_.size(), false);
  for (const std::size_t i : candidates) {
    if (n >= limit) break;
    out[n++] = pool_[i].completion;
    taken[i] = true;
  }
  std::size_t keep = 0;
  for (std::size_t i = 0; i < pool_.size(); ++i) {
    if (!taken[i]) pool_[keep++] = pool_[i];
  }
  pool_.resize(keep);
  return n;
}

int FaultEngine::reap(std::span<Completion> out, std::size_t min_complete) {
  ++reaps_;
  if (broken_ || (plan_.reap_persistent_after > 0 && reaps_ >= plan_.reap_persistent_after)) {
    if (!broken_) stats_->add(Fault::ReapPersistent);
    broken_ = true;
    return -EIO;
  }
  if (chance(plan_.reap_transient)) {
    stats_->add(Fault::ReapTransient);
    return -EAGAIN;  // nothing consumed
  }
  if (out.empty()) return 0;
  const int polled = pull(0);
  if (polled < 0 && polled != -EAGAIN) return polled;
  // Never wait for more than can come: what is pooled plus what the inner engine holds.
  const std::size_t want = std::min({min_complete, out.size(), pool_.size() + inner_outstanding_});
  std::size_t n = release(out, 0, out.size(), /*force=*/false);
  int error = 0;
  while (n < want) {
    if (!pool_.empty()) {
      n = release(out, n, want, /*force=*/true);  // held ones are released early when needed
      continue;
    }
    const int rc = pull(want - n);
    if (rc <= 0) {  // the inner engine cannot deliver now (e.g. -EAGAIN): report what is here
      error = rc;
      break;
    }
  }
  for (Pending& p : pool_) {
    if (p.hold > 0) --p.hold;
  }
  if (n == 0 && error < 0) return error;
  return static_cast<int>(n);
}

int FaultEngine::cancel() { return broken_ ? -EIO : inner_->cancel(); }

nvio::EngineKind FaultEngine::kind() const noexcept { return inner_->kind(); }

nvio::engine::EngineFactory fault_engine_factory(FaultPlan plan, std::uint64_t seed,
                                                 std::shared_ptr<FaultStats> stats) {
  auto made = std::make_shared<std::atomic<std::uint64_t>>(0);
  return [plan, seed, stats = std::move(stats), made](nvio::EngineKind kind, unsigned queue_depth) {
    const std::uint64_t engine_seed = mix(seed ^ mix(made->fetch_add(1)));
    return std::unique_ptr<Engine>(std::make_unique<FaultEngine>(
        nvio::engine::make_backend_engine(kind, queue_depth), plan, engine_seed, stats));
  };
}

}  // namespace nvio_test
