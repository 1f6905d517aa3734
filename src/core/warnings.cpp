#include "nvio/warnings.hpp"

#include <mutex>
#include <set>

#include "nvio/fork.hpp"

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
    // Sinks are called under this mutex and may take their own (the Python binding's, ranked
    // after this one): see nvio/fork.hpp on order.
    hold_across_fork(created->mutex, ForkRank::WarningState);
    return created;
  }();
  return *s;
}
// Made when the library is loaded, for the reason given at locked_regions() in aligned_buffer.cpp.
[[maybe_unused]] const WarningState& g_state_at_load = state();

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
