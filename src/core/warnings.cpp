#include "nvio/warnings.hpp"

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
  static auto* s = new WarningState;
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
