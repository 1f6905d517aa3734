// An nvio::File's open file, as the handle's operations take it (Handle::run_opened). Internal.
#pragma once

#include <cstdint>
#include <memory>

#include "handle/operation.hpp"

namespace nvio::detail {

struct Opened {
  std::shared_ptr<OpenFile> file;  // the File's descriptors and statx facts, shared by operations
  std::int64_t size = 0;           // the size the operation is checked against (File's cache)
};

// Sets `op`'s descriptors and name from `opened` and checks a read's size against opened.size:
// no system call (FileCache::open_path's statx, adopt_fd's fcntl and statx are what it saves).
void use_opened(Operation& op, const Opened& opened);

}  // namespace nvio::detail
