// The saved configuration: handle settings found by `nvio tune --save`, used by default.
//
// Where it lives: $NVIO_CONFIG when set (the value "none" turns the file off), else
// $XDG_CONFIG_HOME/nvio/config.json, else $HOME/.config/nvio/config.json. A missing file is not
// an error: it simply adds nothing. A file that exists but does not parse, holds an unknown key at
// any level (reported with its key path and the closest known key) or a value that does not parse
// or is out of range (in any profile, whichever applies), is an InvalidArgument naming the file and
// the key. It must be a regular file of at most 1 MiB: a FIFO, device or socket, or a larger file,
// is an InvalidArgument; a directory is an IsADirectory. A FIFO without a writer does not block.
//
// Format (JSON):
//   { "version": 1,
//     "default": "dev:259:1",
//     "profiles": {
//       "dev:259:1": { "directory": "/mnt/nvme", "filesystem": "ext4",
//                      "saved_at": "2026-11-21T10:00:00Z", "note": "nvio tune, mixed winner",
//                      "options": { "engine": "io_uring", "block_size": 1048576,
//                                   "queue_depth": 32, "intra_op_parallelism": 2,
//                                   "single_submit": false, "overlap_events": true,
//                                   "direct": "on", "gpu_direct": "auto" } } } }
//
// Profiles are keyed by the device that holds the tuned directory ("dev:MAJOR:MINOR"), so one file
// serves several drives. resolve_options() applies the profile of the directory it is given, else
// the "default" profile (the one saved last); a profile need not set every option.
//
// Thread-safety: the functions here are safe to call from several threads; save_profile replaces
// the file atomically (write to a temporary file, then rename), so readers never see half a file.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nvio/export.hpp"
#include "nvio/options.hpp"

NVIO_API_BEGIN

namespace nvio {

struct ConfigProfile {
  std::string key;  // "dev:MAJOR:MINOR"
  std::string directory;
  std::string filesystem;
  std::string saved_at;
  std::string note;
  OptionOverrides options;  // the options this profile sets
};

struct ConfigFile {
  std::string default_key;
  std::vector<ConfigProfile> profiles;
};

// The configuration file path as the environment says ("" when NVIO_CONFIG=none).
std::string config_path(const EnvLookup& getenv = {});

// The profile key of the device holding `path`. Throws IoError when `path` cannot be stat'ed.
std::string device_key(const std::string& path);

// Reads the whole file; nullopt when it does not exist. Throws InvalidArgument when malformed, not
// a regular file or over 1 MiB, and IoError (with the real errno) when it cannot be read.
std::optional<ConfigFile> load_config(const std::string& path);

// The profile that applies to `directory` (its device's profile, else the default one; with an
// empty `directory`, the default one), or nullopt when the file is missing or none applies.
std::optional<ConfigProfile> select_profile(const ConfigFile& file, const std::string& directory);

// Adds `profile` (replacing one with the same key), makes it the default, and writes the file,
// creating its directory. Throws IoError (with the path) when it cannot be written, and
// InvalidArgument when an existing file is malformed (it is not overwritten then).
void save_profile(const std::string& path, const ConfigProfile& profile);

}  // namespace nvio
NVIO_API_END
