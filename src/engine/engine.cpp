#include "engine/engine.hpp"

#include <fmt/format.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/fork.hpp"
#include "nvio/errors.hpp"
#include "nvio/system.hpp"

namespace nvio {
namespace engine {

namespace {

std::mutex g_factory_mutex;
EngineFactory g_factory;  // guarded by g_factory_mutex; empty: the back ends

std::mutex& factory_mutex() { return g_factory_mutex; }
// A leaf, registered at load time.
[[maybe_unused]] const bool g_factory_held_across_fork =
    (detail::hold_across_fork(g_factory_mutex), true);

}  // namespace

std::exception_ptr Engine::error(IoOp op, const std::string& path, std::uint64_t offset,
                                 std::uint64_t length, std::int64_t result,
                                 const std::string& detail) const {
  try {
    throw_io_error(op, path, offset, length, static_cast<int>(-result), detail);
  } catch (...) {
    return std::current_exception();
  }
}

int SynchronousEngine::submit(std::span<const Request> requests) {
  for (const Request& r : requests) done_.push_back(Completion{r.tag, transfer(r)});
  return static_cast<int>(requests.size());
}

int SynchronousEngine::reap(std::span<Completion> out, std::size_t /*min_complete*/) {
  std::size_t n = 0;
  while (n < out.size() && !done_.empty()) {
    out[n++] = done_.front();
    done_.pop_front();
  }
  return static_cast<int>(n);
}

EngineFactory set_engine_factory_for_testing(EngineFactory factory) {
  std::lock_guard lock(factory_mutex());
  std::swap(g_factory, factory);
  return factory;
}

std::unique_ptr<Engine> make_engine(EngineKind kind, unsigned queue_depth) {
  EngineFactory factory;
  {
    std::lock_guard lock(factory_mutex());
    factory = g_factory;
  }
  if (factory && kind != EngineKind::Auto) {
    std::unique_ptr<Engine> e = factory(kind, queue_depth);
    if (!e) {
      throw EngineUnavailable(
          fmt::format("the test engine factory made no {} engine", to_string(kind)));
    }
    return e;
  }
  return make_backend_engine(kind, queue_depth);
}

std::unique_ptr<Engine> make_backend_engine(EngineKind kind, unsigned queue_depth) {
  switch (kind) {
    case EngineKind::IoUring: return make_io_uring_engine(queue_depth);
    case EngineKind::Libaio: return make_libaio_engine(queue_depth);
    case EngineKind::Psync: return make_psync_engine(queue_depth);
    case EngineKind::CuFile: return make_cufile_engine(real_cufile_calls());
    case EngineKind::Auto: break;
  }
  throw InvalidArgument("make_engine needs a concrete engine, not auto");
}

std::shared_ptr<const FileRegistration> register_file(EngineKind kind, int fd,
                                                      const std::string& path) {
  if (kind == EngineKind::CuFile) return register_cufile(fd, path);
  return nullptr;  // the kernel engines take the descriptor as it is
}

}  // namespace engine

namespace {

// Whether `engine` registers memory that requests reuse (Engine::add_region), tried on one page.
std::string registered_buffers(engine::Engine& engine) {
  std::vector<std::byte> page(4096);
  if (engine.add_region(page.data(), page.size()) >= 0) return "registered buffers usable";
  const std::string why = engine.region_refusal();
  return why.empty() ? "registered buffers not used"
                     : "registered buffers refused (" + why + "): plain reads and writes";
}

EngineProbe run_probe(EngineKind kind) {
  // Creating a small instance is the probe: it fails exactly where real use would (ENOSYS on old
  // kernels, EPERM under seccomp or io_uring_disabled, EAGAIN when fs.aio-max-nr is exhausted).
  std::unique_ptr<engine::Engine> probe;
  try {
    probe = engine::make_backend_engine(kind, 4);
  } catch (const EngineUnavailable& e) {
    return EngineProbe{false, e.what()};
  }
  switch (kind) {
    case EngineKind::IoUring:
      return EngineProbe{true, "io_uring ring created; " + registered_buffers(*probe)};
    case EngineKind::Libaio: return EngineProbe{true, "aio context created"};
    default: return EngineProbe{true, "pread/pwrite are always available"};
  }
}

}  // namespace

const EngineProbe& probe_engine(EngineKind kind) {
  static std::once_flag once;
  static EngineProbe probes[3];
  std::call_once(once, [] {
    probes[0] = run_probe(EngineKind::IoUring);
    probes[1] = run_probe(EngineKind::Libaio);
    probes[2] = run_probe(EngineKind::Psync);
  });
  switch (kind) {
    case EngineKind::IoUring: return probes[0];
    case EngineKind::Libaio: return probes[1];
    case EngineKind::Psync: return probes[2];
    case EngineKind::CuFile:  // gpu_info() says whether cuFile can be used
    case EngineKind::Auto: break;
  }
  throw InvalidArgument("probe_engine needs a concrete kernel engine, not auto or cuFile");
}

const AutoChoice& auto_engine() {
  static const AutoChoice choice = [] {
    const EngineProbe& uring = probe_engine(EngineKind::IoUring);
    if (uring.available) {
      return AutoChoice{EngineKind::IoUring, "io_uring is available (" + uring.reason + ")"};
    }
    const EngineProbe& aio = probe_engine(EngineKind::Libaio);
    if (aio.available) {
      return AutoChoice{EngineKind::Libaio, "io_uring unavailable (" + uring.reason + ")"};
    }
    return AutoChoice{EngineKind::Psync, "io_uring unavailable (" + uring.reason +
                                             "); libaio unavailable (" + aio.reason + ")"};
  }();
  return choice;
}

}  // namespace nvio
