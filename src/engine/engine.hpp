// The engine interface: the few hooks each back end fills in. An engine instance belongs to one
// worker thread (not thread-safe); the handle never branches on which engine it has.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "nvio/errors.hpp"
#include "nvio/options.hpp"

struct io_uring;  // liburing's ring
struct iovec;

namespace nvio::engine {

enum class Direction { Read, Write };

// What an engine that must prepare a file before moving its bytes made of it (cuFile registers
// the descriptor with its driver): opaque above the engine. The handle has it made once per file
// (register_file), keeps it with the file, and hands it back in each request on that file
// (Request::file). Destroyed by the last owner, before the descriptor closes.
class FileRegistration {
 public:
  virtual ~FileRegistration() = default;
};

struct Request {
  int fd;
  Direction direction;
  void* buf;
  std::size_t length;
  std::uint64_t offset;
  std::uint64_t tag;  // returned unchanged in the completion
  // The file's registration with this engine's kind (register_file), or null when it needs none.
  const FileRegistration* file = nullptr;
  // Where `buf` lives: the CUDA device that owns it, or -1 for host memory. Engines that move
  // device memory themselves make that device current; the others never see device memory.
  int device = -1;
  // The region (see Engine::add_region) that [buf, buf + length) lies in, or -1 for none.
  int region = -1;
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
  // (e.g. EBADF, EINVAL); the ones after it were not taken. -EAGAIN, -EBUSY or 0 means the kernel
  // is out of resources for now: offer the requests again after reaping (with nothing in flight
  // to reap, retry within the transfer retry bound, core/retry.hpp, then fail the request). A
  // transfer that fails, with EINTR or EAGAIN too, reports it as its completion: engines never
  // repeat a transfer themselves (the handle applies the retry policy, core/retry.hpp).
  virtual int submit(std::span<const Request> requests) = 0;
  // Waits until at least `min_complete` completions are available (0: do not wait), stores up to
  // out.size() of them, and returns how many, or -errno. Every accepted request is reported
  // exactly once, with its tag unchanged (all 64 bits).
  //
  // It never waits for a completion that cannot come: the wait is clamped to what the kernel
  // holds. Requests accepted but not yet handed to the kernel (io_uring keeps SQEs that
  // io_uring_submit refused with EAGAIN or EBUSY and hands them over on later calls) cannot
  // complete until it takes them, so the call may return fewer than `min_complete`, and returns
  // -EAGAIN when it has none to report and the kernel holds none: nothing was lost, call again
  // (after a pause). With nothing outstanding it returns 0 at once.
  //
  // A failed reap consumed no completion: calling again is safe, and -EAGAIN is transient. After
  // any other error that repeats (a bounded number of tries), the outstanding requests must be
  // taken as lost: the memory they point into must never be reused or freed, as the kernel may
  // still transfer into or out of it.
  virtual int reap(std::span<Completion> out, std::size_t min_complete) = 0;
  // Asks the kernel to stop, as far as it can, every request this engine accepted whose
  // completion has not been reaped (io_uring: an async cancel of all; libaio: io_cancel of each).
  // Cancelled or not, every accepted request still completes through reap() (-ECANCELED, or its
  // real result): the caller keeps reaping until it has them all before it reuses or frees the
  // memory they point into. Returns 0 or -errno; an engine with nothing to cancel returns 0.
  virtual int cancel() = 0;
  // Memory that many requests will point into for as long as the engine lives (a worker's bounce
  // slabs): the engine may prepare it once so that each request costs the kernel less (io_uring:
  // registered buffers, used through READ_FIXED / WRITE_FIXED). Returns the index to put in
  // Request::region of requests inside [base, base + bytes), or -1 when the engine makes no use
  // of it or could not prepare it (RLIMIT_MEMLOCK, say): requests with region -1 work all the
  // same, so a caller never needs to tell why. May be called with requests in flight. The
  // default makes no use of it. An engine that could use regions but was refused says so once per
  // process through the warning sink (nvio/warnings.hpp), and region_refusal() tells why.
  virtual int add_region(void* base, std::size_t bytes) noexcept {
    (void)base;
    (void)bytes;
    return -1;
  }
  // Why the system refused the engine's first add_region() that it refused ("io_uring_register_
  // buffers_sparse: Cannot allocate memory (...)"), for reports (the engine probe's reason); empty
  // while none was refused, and for engines that make no use of regions.
  virtual std::string region_refusal() const { return {}; }
  // Asks reap() to end a wait early once `fd`, an eventfd, becomes readable: another thread has
  // work for this engine's thread (OperationQueue::block_in_engine). The engine reads the eventfd
  // when that happens, and reap() then returns what it has, fewer than min_complete completions
  // or none. While it watches, a wait for several completions may also end after the first.
  // Returns true when the engine watches `fd` from now on, false when it cannot (the default, and
  // engines whose reap() never waits). Called once, before the first submit(); `fd` outlives the
  // engine. An engine that later finds it cannot poll `fd` stops watching silently: its waits
  // then end on completions only.
  virtual bool watch(int fd) noexcept {
    (void)fd;
    return false;
  }
  virtual EngineKind kind() const noexcept = 0;
  // For messages: "io_uring", "libaio", "psync", "cuFile".
  virtual const char* name() const noexcept { return to_string(kind()); }
  // The error of a request of `path` at [offset, offset + length) that completed with `result`
  // (< 0): an IoError with the errno by default; an engine whose results carry other codes
  // (cuFile's) decodes them here, so that the handle never has to. `detail` is added to the
  // message ("O_DIRECT", say).
  virtual std::exception_ptr error(IoOp op, const std::string& path, std::uint64_t offset,
                                   std::uint64_t length, std::int64_t result,
                                   const std::string& detail) const;
};

// The shape of the engines whose requests complete inside submit() (psync, cuFile): each request
// runs once, now, through transfer(), and its result waits for reap(). Nothing is ever in flight,
// so reap() never waits and cancel() has nothing to do.
class SynchronousEngine : public Engine {
 public:
  int submit(std::span<const Request> requests) final;
  int reap(std::span<Completion> out, std::size_t min_complete) final;
  int cancel() final { return 0; }

 protected:
  // One request's transfer: the bytes moved, or a negative code (-errno for the kernel's).
  virtual std::int64_t transfer(const Request& request) = 0;

 private:
  std::deque<Completion> done_;
};

// The engine kind that moves device memory to and from files itself, with no host copy
// (GPUDirect Storage): the one a device-memory operation on the direct transport goes to.
inline constexpr EngineKind kDeviceDirectEngine = EngineKind::CuFile;

// What engines of `kind` need prepared for the open descriptor `fd` (`path` for messages) before
// moving its bytes, or null when they need nothing (the kernel engines). May be a driver call:
// made once per file. Throws what the back end refuses with (GpuError from cuFile).
// Thread-safe.
std::shared_ptr<const FileRegistration> register_file(EngineKind kind, int fd,
                                                      const std::string& path);

// Creates an engine of a concrete kind able to keep `queue_depth` requests in flight: the test
// factory's when one is installed, else the back end's. Throws EngineUnavailable when the kernel
// refuses (with the reason), GpuError when cuFile cannot be used; never returns null.
std::unique_ptr<Engine> make_engine(EngineKind kind, unsigned queue_depth);
// The back end's own engine, whatever factory is installed (the availability probes use it).
std::unique_ptr<Engine> make_backend_engine(EngineKind kind, unsigned queue_depth);

// Makes the engine for a concrete kind and queue depth. Called on worker threads: it must be
// thread-safe.
using EngineFactory = std::function<std::unique_ptr<Engine>(EngineKind kind, unsigned queue_depth)>;
// Tests: installs `factory` for the engines made from now on (an empty one restores the back
// ends) and returns the previous one. Workers keep the engine they made until their handle goes.
EngineFactory set_engine_factory_for_testing(EngineFactory factory);

// The system calls of the psync engine, replaceable in tests (e.g. a pread that fails with EINTR).
// Each returns what the system call does: a count, or -1 with errno set.
struct PsyncCalls {
  ssize_t (*pread)(int fd, void* buf, std::size_t count, off_t offset);
  ssize_t (*pwrite)(int fd, const void* buf, std::size_t count, off_t offset);
};
PsyncCalls real_psync_calls() noexcept;

// The calls of the io_uring engine, replaceable in tests (start from real_io_uring_calls()).
//   submit: hands prepared SQEs to the kernel (e.g. a kernel that refuses with -EAGAIN or -EBUSY).
//     Returns what io_uring_submit does: how many SQEs the kernel took, or -errno. A replacement
//     that takes SQEs must do so through io_uring_submit: the engine learns what the kernel took
//     from the ring itself.
//   register_buffers_sparse, register_buffers_update_tag: liburing's, for add_region() (e.g. a
//     kernel that refuses with -ENOMEM under RLIMIT_MEMLOCK). Return what liburing's do.
struct IoUringCalls {
  int (*submit)(io_uring* ring);
  int (*register_buffers_sparse)(io_uring* ring, unsigned count);
  int (*register_buffers_update_tag)(io_uring* ring, unsigned offset, const iovec* iovecs,
                                     const unsigned long long* tags, unsigned count);
};
IoUringCalls real_io_uring_calls() noexcept;

// cuFile (GPUDirect Storage) in the psync shape: each request is one synchronous cuFileRead or
// cuFileWrite during submit(), its result handed back by reap(). Requests carry their file's
// registration and device (Request::file from register_file(EngineKind::CuFile, ...),
// Request::device). The calls are replaceable in tests; `make_current` returns a CUresult,
// `transfer` what cuda::gds_transfer does (bytes, -errno or -CUfileOpError).
struct CuFileCalls {
  std::function<int(int device)> make_current;
  std::function<std::int64_t(const Request& request)> transfer;
  // The CUDA driver's name and text for a CUresult, for messages.
  std::function<std::string(int code)> error_name;
  std::function<std::string(int code)> error_string;
};
// The real calls: the process's device operations and cuFile. Throws GpuError when CUDA cannot
// be used.
CuFileCalls real_cufile_calls();
std::unique_ptr<Engine> make_cufile_engine(CuFileCalls calls);
// cuFile's registration of `fd` (cuFileHandleRegister). Throws GpuError when refused.
std::shared_ptr<const FileRegistration> register_cufile(int fd, const std::string& path);

// Back ends, defined in their own files.
std::unique_ptr<Engine> make_io_uring_engine(unsigned queue_depth,
                                             IoUringCalls calls = real_io_uring_calls());
std::unique_ptr<Engine> make_libaio_engine(unsigned queue_depth);
std::unique_ptr<Engine> make_psync_engine(unsigned queue_depth,
                                          PsyncCalls calls = real_psync_calls());

}  // namespace nvio::engine
