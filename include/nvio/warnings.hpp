// The library never prints. Conditions worth telling a user about (mlock refused, O_DIRECT not
// supported and buffered I/O used instead) go to a process-wide warning sink. The CLI installs a
// sink that writes to stderr; the Python package one that calls warnings.warn. The default sink
// discards the message (it is still counted and kept as the last warning, for tests and reports).
//
// Thread-safety: set_warning_sink and warn may be called from any thread; the sink is called with
// an internal mutex held, so it must not call back into set_warning_sink.
#pragma once

#include <functional>
#include <string>

#include "nvio/export.hpp"

NVIO_API_BEGIN

namespace nvio {

using WarningSink = std::function<void(const std::string& message)>;

// Installs `sink` (an empty function restores the default) and returns the previous one.
WarningSink set_warning_sink(WarningSink sink);

// Delivers a warning. `once_key`, when non-empty, makes the warning fire at most once per process.
void warn(const std::string& message, const std::string& once_key = {});

}  // namespace nvio
NVIO_API_END
