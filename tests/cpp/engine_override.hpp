// Test seams of the engine layer: an RAII guard that installs an engine factory for the handles
// made while it lives, an engine that fails a range of file offsets, and a bound on how long a
// call may take, for tests of code that used to spin or hang.
//
// Thread-safety: install and restore factories from the test's main thread only; the factory
// itself is called on worker threads.
#pragma once

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/engine.hpp"

namespace nvio_test {

// Installs `factory` for its lifetime and restores the previous one.
class ScopedEngineFactory {
 public:
  explicit ScopedEngineFactory(nvio::engine::EngineFactory factory)
      : previous_(nvio::engine::set_engine_factory_for_testing(std::move(factory))) {}
  ~ScopedEngineFactory() { nvio::engine::set_engine_factory_for_testing(std::move(previous_)); }
  ScopedEngineFactory(const ScopedEngineFactory&) = delete;
  ScopedEngineFactory& operator=(const ScopedEngineFactory&) = delete;

 private:
  nvio::engine::EngineFactory previous_;
};

// An engine that fails every request touching file offsets [begin, end) with EIO, and passes the
// rest to `inner`. One thread's, as every engine.
class FailingRangeEngine final : public nvio::engine::Engine {
 public:
  FailingRangeEngine(std::unique_ptr<nvio::engine::Engine> inner, std::uint64_t begin,
                     std::uint64_t end)
      : inner_(std::move(inner)), begin_(begin), end_(end) {}
  int submit(std::span<const nvio::engine::Request> requests) override {
    for (const auto& r : requests) {
      if (r.offset < end_ && r.offset + r.length > begin_) {
        failed_.push_back({r.tag, -EIO});
        continue;
      }
      const int rc = inner_->submit(std::span(&r, 1));
      if (rc != 1) failed_.push_back({r.tag, rc < 0 ? rc : -EAGAIN});
      if (rc == 1) ++inner_count_;
    }
    return static_cast<int>(requests.size());
  }
  int reap(std::span<nvio::engine::Completion> out, std::size_t min_complete) override {
    std::size_t n = 0;
    while (n < out.size() && !failed_.empty()) {
      out[n++] = failed_.back();
      failed_.pop_back();
    }
    if (inner_count_ > 0 && n < out.size()) {
      const int got = inner_->reap(out.subspan(n), n >= min_complete ? 0 : min_complete - n);
      if (got < 0) return got;
      inner_count_ -= static_cast<std::size_t>(got);
      n += static_cast<std::size_t>(got);
    }
    return static_cast<int>(n);
  }
  int cancel() override { return inner_->cancel(); }
  nvio::EngineKind kind() const noexcept override { return inner_->kind(); }

 private:
  std::unique_ptr<nvio::engine::Engine> inner_;
  std::uint64_t begin_;
  std::uint64_t end_;
  std::vector<nvio::engine::Completion> failed_;
  std::size_t inner_count_ = 0;
};

// Runs `fn` on a thread and waits up to `limit` for it. A call that does not return in time is a
// failure, and the test process ends at once (exit status 1): the stuck thread cannot be stopped,
// and the test must fail rather than hang.
template <class Fn>
void run_within(std::chrono::seconds limit, const std::string& what, Fn&& fn) {
  std::packaged_task<void()> task(std::forward<Fn>(fn));
  std::future<void> done = task.get_future();
  std::thread t(std::move(task));
  if (done.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << what << " did not return within " << limit.count() << " s";
    std::fflush(nullptr);
    std::_Exit(1);
  }
  t.join();
  done.get();  // rethrows what `fn` threw
}

}  // namespace nvio_test
