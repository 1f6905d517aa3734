// The engine interface: the few hooks each back end fills in. An engine instance belongs to one
// worker thread (not thread-safe); the handle never branches on which engine it has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "nvio/options.hpp"

namespace nvio::engine {

enum class Direction { Read, Write };

struct Request {
  int fd;
  Direction direction;
  void* buf;
  std::size_t length;
  std::uint64_t offset;
  std::uint64_t tag;  // returned unchanged in the completion
};

struct Completion {
  std::uint64_t tag;
  std::int64_t result;  // bytes transferred, or -errno
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Submits `requests` (never more than queue_depth in flight in total). Returns how many were
  // accepted, in order. A negative value is -errno for the FIRST request, which the kernel refused
  // (e.g. EBADF, EINVAL); the ones after it were not taken. -EAGAIN (or 0) means the kernel is out
  // of resources for now: offer the requests again after reaping.
  virtual int submit(std::span<const Request> requests) = 0;
  // Waits until at least `min_complete` completions are available (0: do not wait), stores up to
  // out.size() of them, and returns how many, or -errno.
  virtual int reap(std::span<Completion> out, std::size_t min_complete) = 0;
  virtual EngineKind kind() const noexcept = 0;
};

// Creates an engine of a concrete kind able to keep `queue_depth` requests in flight. Throws
// EngineUnavailable when the kernel refuses (with the reason), never returns null.
std::unique_ptr<Engine> make_engine(EngineKind kind, unsigned queue_depth);

// Back ends, defined in their own files.
std::unique_ptr<Engine> make_io_uring_engine(unsigned queue_depth);
std::unique_ptr<Engine> make_libaio_engine(unsigned queue_depth);
std::unique_ptr<Engine> make_psync_engine(unsigned queue_depth);

}  // namespace nvio::engine
