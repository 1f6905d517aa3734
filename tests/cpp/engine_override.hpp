// Test seams of the engine layer: an RAII guard that installs an engine factory for the handles
// made while it lives, and a bound on how long a call may take, for tests of code that used to
// spin or hang.
//
// Thread-safety: install and restore factories from the test's main thread only; the factory
// itself is called on worker threads.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <utility>

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
