// The configuration file's text as save_profile writes it: the one writer of the format that
// config.cpp parses, kept beside the parser. Internal to the library; save_profile itself (the
// locked read-modify-replace of the file) is in tune/save_profile.cpp, above the replace-a-file
// mechanism of src/jobs.
#pragma once

#include <string>

#include "nvio/config.hpp"

namespace nvio::detail {

// `file`'s profiles with `profile` added (or replacing the one of its key) and made the default,
// as the JSON text of a configuration file. Thread-safe (no state).
std::string config_text_with(const ConfigFile& file, const ConfigProfile& profile);

}  // namespace nvio::detail
