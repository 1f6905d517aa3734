// An engine for tests that holds back chosen completions until a gate opens: a drive that is slow
// for some requests, so that an operation is reliably in flight (a prefetch read behind which
// another must not wait, a transfer to cancel halfway). Every accepted request still completes
// exactly once through reap(); a reap that finds only held completions to wait for waits a moment
// for the gate and then returns what it has, so that the worker goes round (and takes more
// pieces) instead of blocking in it.
//
// Thread-safety: a gate is shared by the engines of every worker and by the test's thread (its
// state is guarded by its mutex or atomic); each engine belongs to one worker.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "engine/engine.hpp"

namespace nvio_test {

// What a HeldCompletions engine holds back while the gate is closed: holds() says which
// requests; open() lets everything held go and holds nothing more until close().
class CompletionGate {
 public:
  virtual ~CompletionGate() = default;
  // Whether the completion of `request` is held while the gate is closed. Called by the engines'
  // workers as they submit.
  virtual bool holds(const nvio::engine::Request& request) = 0;

  bool is_open() {
    std::lock_guard lock(mutex_);
    return open_;
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }
  void close() {
    std::lock_guard lock(mutex_);
    open_ = false;
  }
  void wait_open(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    opened_.wait_for(lock, limit, [&] { return open_; });
  }

  std::atomic<std::uint64_t> held{0};  // requests accepted that holds() chose, closed or not
  // Each submit() first sleeps this long per request (every request): a slow drive.
  std::atomic<unsigned> delay_us{0};

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;  // a new gate is closed
};

class HeldCompletions final : public nvio::engine::Engine {
 public:
  HeldCompletions(std::unique_ptr<nvio::engine::Engine> inner, std::shared_ptr<CompletionGate> gate)
      : inner_(std::move(inner)), gate_(std::move(gate)) {}

  int submit(std::span<const nvio::engine::Request> requests) override {
    if (const unsigned us = gate_->delay_us.load(); us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(us) * requests.size());
    }
    const int rc = inner_->submit(requests);
    for (int i = 0; i < rc; ++i) {
      const nvio::engine::Request& r = requests[static_cast<std::size_t>(i)];
      if (gate_->holds(r)) {
        held_tags_.insert(r.tag);
        ++gate_->held;
      }
    }
    if (rc > 0) outstanding_ += static_cast<std::size_t>(rc);
    return rc;
  }

  int reap(std::span<nvio::engine::Completion> out, std::size_t min_complete) override {
    std::size_t n = 0;
    for (;;) {
      if (gate_->is_open()) {
        ready_.insert(ready_.end(), held_.begin(), held_.end());
        held_.clear();
      }
      while (n < out.size() && !ready_.empty()) {
        out[n++] = ready_.front();
        ready_.pop_front();
      }
      const bool enough = n >= min_complete || n == out.size();
      if (outstanding_ > 0) {
        scratch_.resize(out.size());
        const int got = inner_->reap(scratch_, enough ? 0 : 1);
        if (got < 0) return n > 0 ? static_cast<int>(n) : got;
        outstanding_ -= static_cast<std::size_t>(got);
        for (int k = 0; k < got; ++k) {
          const nvio::engine::Completion& c = scratch_[static_cast<std::size_t>(k)];
          if (held_tags_.erase(c.tag) > 0 && !gate_->is_open()) {
            held_.push_back(c);
          } else {
            ready_.push_back(c);
          }
        }
        if (got > 0) continue;
      }
      if (enough || held_.empty()) return static_cast<int>(n);
      gate_->wait_open(std::chrono::milliseconds(5));
      if (!gate_->is_open()) return static_cast<int>(n);
    }
  }

  int cancel() override { return inner_->cancel(); }
  nvio::EngineKind kind() const noexcept override { return inner_->kind(); }

 private:
  std::unique_ptr<nvio::engine::Engine> inner_;
  std::shared_ptr<CompletionGate> gate_;
  std::set<std::uint64_t> held_tags_;  // accepted requests holds() chose, not reaped from inner_
  std::size_t outstanding_ = 0;        // accepted by inner_, not reaped from it
  std::deque<nvio::engine::Completion> ready_;
  std::vector<nvio::engine::Completion> held_;
  std::vector<nvio::engine::Completion> scratch_;
};

// An engine factory whose engines are HeldCompletions over the back ends, all behind `gate`.
inline nvio::engine::EngineFactory held_engine_factory(std::shared_ptr<CompletionGate> gate) {
  return [gate = std::move(gate)](nvio::EngineKind kind, unsigned queue_depth) {
    return std::unique_ptr<nvio::engine::Engine>(
        new HeldCompletions(nvio::engine::make_backend_engine(kind, queue_depth), gate));
  };
}

}  // namespace nvio_test
