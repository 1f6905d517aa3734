#include "nvio/warnings.hpp"

#include <pthread.h>

#include <mutex>
#include <set>

namespace nvio {
namespace {

struct WarningState {
  std::mutex mutex;
  WarningSink sink;
  std::set<std::string> fired;
};

WarningState& state() {
  // Leaked on purpose: warnings may be raised from static destructors of other objects.
  static auto* s = [] {
    auto* created = new WarningState;
    // Held across fork(): a child must not inherit the mutex locked by a thread it lacks.
    ::pthread_atfork([] { state().mutex.lock(); }, [] { state().mutex.unlock(); },
                     [] { state().mutex.unlock(); });
    return created;
  }();
  return *s;
}

}  // namespace

WarningSink set_warning_sink(WarningSink sink) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  WarningSink previous = std::move(s.sink);
  s.sink = std::move(sink);
  return previous;
}

void warn(const std::string& message, const std::string& once_key) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  if (!once_key.empty() && !s.fired.insert(once_key).second) {
    return;
  }
  if (s.sink) {
    s.sink(message);
  }
}

}  // namespace nvio
