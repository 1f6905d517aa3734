#include "nvio/warnings.hpp"

#include <mutex>
#include <set>

#include "core/fork.hpp"

namespace nvio {
namespace {

struct WarningState {
  std::mutex mutex;
  WarningSink sink;
  std::set<std::string> fired;
};

WarningState& state();
std::mutex& state_mutex() { return state().mutex; }

WarningState& state() {
  // Leaked on purpose: warnings may be raised from static destructors of other objects.
  static auto* s = [] {
    auto* created = new WarningState;
    // Sinks are called under this mutex and may take their own (the Python binding's), which
    // they register before the first use of this one: see core/fork.hpp on order.
    detail::hold_across_fork<state_mutex>();
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
