// The handle: the public API, its workers' start and stop, and a forked child's fresh state. The
// rest lives beside it:
//   handle/prepare.*    preparing each request (checking it, opening the file, planning it)
//   handle/plan.*       how a request is cut into direct pieces and buffered edges (pure)
//   handle/tickets.*    the table of asynchronous tickets and the waits that collect them
//   handle/operation.*  one request in flight, and the queue the workers take pieces from
//   handle/worker.*     a worker thread: one explicit state machine per slot in flight
//   cuda/device_lane.*  a worker's CUDA streams, events and slab registrations
#include "nvio/handle.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <exception>
#include <future>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "core/fork.hpp"
#include "cuda/device_ops.hpp"
#include "cuda/transport.hpp"
#include "engine/engine.hpp"
#include "handle/caller_lane.hpp"
#include "handle/files.hpp"
#include "handle/operation.hpp"
#include "handle/prepare.hpp"
#include "handle/stats.hpp"
#include "handle/tickets.hpp"
#include "handle/worker.hpp"
#include "handle/worker_threads.hpp"
#include "nvio/errors.hpp"
#include "nvio/system.hpp"
#include "nvio/warnings.hpp"

namespace nvio {
namespace detail {
namespace {

std::mutex g_starter_mutex;
ThreadStarter g_starter;  // guarded by g_starter_mutex; empty: std::thread
// Whether g_starter is set. Without a test's starter the mutex is never taken, so a child forked
// while another thread held it can still start the workers of its renewed handles.
std::atomic<bool> g_starter_set{false};

}  // namespace

std::thread start_worker_thread(std::function<void()> body) {
  if (!g_starter_set.load(std::memory_order_acquire)) return std::thread(std::move(body));
  ThreadStarter starter;
  {
    std::lock_guard lock(g_starter_mutex);
    starter = g_starter;
  }
  if (starter) return starter(std::move(body));
  return std::thread(std::move(body));
}

ThreadStarter set_thread_starter_for_testing(ThreadStarter starter) {
  std::lock_guard lock(g_starter_mutex);
  std::swap(g_starter, starter);
  g_starter_set.store(static_cast<bool>(g_starter), std::memory_order_release);
  return starter;
}

}  // namespace detail

namespace {

using detail::JobPtr;
using detail::Operation;
using detail::OperationPtr;
using detail::single;
using engine::Direction;

}  // namespace

struct Handle::Impl {
  explicit Impl(const Options& opts);
  ~Impl();

  // Runs `make`, which prepares a request; a request refused before anything was submitted (a bad
  // argument, a file that cannot be opened, a read past the end) counts as a failed operation in
  // stats' `errors`, under its errno, before the error propagates (a batch counts once).
  template <class Make>
  auto counting_refusal(Make make) -> decltype(make()) {
    try {
      return make();
    } catch (...) {
      counters.others().failed(std::current_exception());
      throw;
    }
  }
  // One request, prepared (counted when refused).
  JobPtr one(Direction dir, const void* buf, std::size_t length, const FileRef& file,
             std::uint64_t offset, const WriteOptions& wopts) {
    auto* bytes = static_cast<std::byte*>(const_cast<void*>(buf));
    return single(counting_refusal(
        [&] { return prepare.operation(dir, bytes, length, file, offset, wopts); }));
  }
  // A batch, prepared (counted once when refused).
  template <class Extent>
  JobPtr batch(Direction dir, std::span<const Extent> extents, const WriteOptions& wopts,
               const FileRef* all_on = nullptr) {
    return counting_refusal([&] { return prepare.batch(dir, extents, wopts, all_on); });
  }
  void run_blocking(const JobPtr& job);
  Ticket register_async(const JobPtr& job);
  // Queues the job's operations, once all of them are prepared (a batch refused for one extent
  // allocates and extends nothing): a direct write past its file's end first allocates that
  // range, while no operation of the handle is queued on the file (allocate_past_end).
  void queue_job(const detail::Job& job, detail::OperationQueue& into);
  // Cancels the operations of `job` that have pieces not started yet (OperationQueue::cancel),
  // failing them with ECANCELED and `why`. Returns how many were cancelled.
  std::size_t cancel_job(const detail::Job& job, const char* why);

  Options options;
  EngineKind engine_kind;
  std::string engine_reason;

  detail::HandleCounters counters;  // a shard per worker: set before the workers start
  // The listener of the asynchronous operations: it outlives them (~Impl stops the queue, which
  // waits for every live operation, before any member goes).
  detail::TicketTable tickets;
  detail::OperationQueue queue;
  detail::FileCache files{options.direct};
  const detail::Preparer prepare{options, files, queue};
  // The caller-driven path of small blocking calls (handle/caller_lane.hpp): after the counters
  // and the queue, so that it goes before them.
  std::unique_ptr<detail::CallerLanes> lanes;

  std::vector<std::thread> workers;
};

namespace {

EngineKind choose_engine(EngineKind requested, std::string& reason) {
  if (requested == EngineKind::Auto) {
    const AutoChoice& choice = auto_engine();
    reason = "auto: " + choice.reason;
    return choice.engine;
  }
  const EngineProbe& probe = probe_engine(requested);
  if (!probe.available) {
    throw EngineUnavailable(
        fmt::format("engine {} is not available here: {}", to_string(requested), probe.reason));
  }
  reason = "requested explicitly (" + probe.reason + ")";
  return requested;
}

// The error for worker thread `index` (from 0) of `count` that could not be started, made from
// the exception in flight (what std::thread's constructor throws).
std::exception_ptr thread_start_error(unsigned index, unsigned count) {
  int err = ENOMEM;
  std::string reason = "out of memory";
  try {
    throw;
  } catch (const std::system_error& e) {
    err = e.code().value();
    reason = e.what();
  } catch (const std::bad_alloc&) {
  } catch (...) {
    reason = "an unexpected exception";
  }
  const char* name = err == EAGAIN ? "EAGAIN" : err == ENOMEM ? "ENOMEM" : "";
  return std::make_exception_ptr(MemoryError(
      fmt::format("cannot start worker thread {} of {} (intra_op_parallelism = {}): {} (errno {}"
                  "{}{}); the system limits threads (RLIMIT_NPROC, kernel.threads-max, a cgroup's "
                  "pids.max) and memory: lower intra_op_parallelism or raise the limit",
                  index + 1, count, count, reason, err, *name != '\0' ? " " : "", name),
      err));
}

}  // namespace

Handle::Impl::Impl(const Options& opts) : options(opts) {
  options.validate();
  // Kept files are closed by an idle worker, so that an idle handle holds no file for long.
  queue.set_idle_hook([this] { return files.release_unused(); }, detail::FileCache::kIdle);
  engine_kind = choose_engine(options.engine, engine_reason);
  if (options.gpu_direct == GpuDirect::On && !cuda::device_ops_override()) {
    // Asked for explicitly: say at once (and once per process) when it cannot be honoured.
    const GpuInfo& info = gpu_info();
    const cuda::TransportChoice choice =
        cuda::choose_transport(options.gpu_direct, info.gds_mode, info.gds_reason);
    if (choice.warn) warn(choice.reason, "gds-fallback");
  }
  // Workers make their engines on their own threads (an io_uring ring is then used only by the
  // thread that created it); the first failure is reported here. When the system refuses a
  // thread, the workers already started are stopped and joined before the error is thrown: a
  // joinable std::thread destroyed un-joined would end the process.
  const unsigned count = options.intra_op_parallelism;
  std::vector<std::future<void>> started;
  started.reserve(count);
  workers.reserve(count);
  std::exception_ptr first;
  counters.set_workers(count + detail::CallerLanes::kMaxLanes);  // the lanes' shards after
  queue.prepare_wakeups(count);
  // What every worker and every caller's lane is set up with; each worker adds its index and shard.
  detail::WorkerSettings common;
  common.queue_depth = options.queue_depth;
  common.intra_op_parallelism = count;
  common.block_size = options.block_size;
  common.overlap_events = options.overlap_events;
  common.single_submit = options.single_submit;
  common.engine = engine_kind;
  lanes = std::make_unique<detail::CallerLanes>(common, &counters.worker(count),
                                                detail::caller_driven_enabled());
  for (unsigned i = 0; i < count && !first; ++i) {
    try {
      auto ready = std::make_shared<std::promise<void>>();
      std::future<void> f = ready->get_future();
      detail::WorkerSettings settings = common;
      settings.index = i;
      settings.stats = &counters.worker(i);
      workers.push_back(detail::start_worker_thread(
          [this, settings, ready] { detail::run_worker(settings, queue, std::move(*ready)); }));
      started.push_back(std::move(f));  // within the reserved capacity: does not throw
    } catch (...) {
      try {
        first = thread_start_error(i, count);
      } catch (...) {  // no memory left to describe it: report the bare std::bad_alloc
        first = std::current_exception();
      }
    }
  }
  for (auto& f : started) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) {
    queue.stop();
    for (auto& t : workers) t.join();
    std::rethrow_exception(first);
  }
}

Handle::Impl::~Impl() {
  queue.stop();
  for (auto& t : workers) t.join();
}

void Handle::Impl::queue_job(const detail::Job& job, detail::OperationQueue& into) {
  // Every allocation before any piece of the job is queued: none then waits for the job's own
  // direct I/O (the extents of a batch share their file, and its count is still the one before).
  for (const OperationPtr& op : job.ops) {
    if (op->is_read() || op->direct_fd < 0 || op->file == nullptr) continue;
    detail::OpenFile& file = *op->file;
    if (file.queued_ops.load(std::memory_order_relaxed) > 0 ||
        file.no_fallocate.load(std::memory_order_relaxed)) {
      continue;
    }
    if (detail::allocate_past_end(op->direct_fd, file.facts.type, op->checked_size, op->offset,
                                  op->end()) == detail::Allocated::Unsupported) {
      file.no_fallocate.store(true, std::memory_order_relaxed);
    }
  }
  for (const OperationPtr& op : job.ops) {
    if (op->file != nullptr) {
      op->file->queued_ops.fetch_add(1, std::memory_order_relaxed);  // until it is Finishing
    }
    into.push(op, counters.others());
  }
}

void Handle::Impl::run_blocking(const JobPtr& job) {
  if (const detail::CallerLanes::Lease lane = lanes->lease(*job, queue)) {
    // Small, with the workers idle: the calling thread runs it (handle/caller_lane.hpp), and the
    // wait below finds it finished.
    queue_job(*job, lane.queue());
    lane.drive();
    queue.arm_idle_hook();  // the kept files are let go of once the handle is idle, as after a push
  } else {
    queue_job(*job, queue);
  }
  if (!job->wait(detail::WaitMode::Interruptible)) {
    // The caller is going away from its buffer: nothing may be left in the kernel when it does.
    const std::size_t cancelled = cancel_job(*job, "the blocking call was interrupted");
    job->wait();
    // Every piece had started: the call ran to its end, and its outcome is the one to report
    // (the caller's check has said what it said; the caller learns it from its check).
    if (cancelled == 0) {
      if (std::exception_ptr e = job->error()) std::rethrow_exception(e);
      return;
    }
    throw Interrupted(fmt::format(
        "interrupted: a blocking call of {} operation(s), {} bytes, stopped; {} of them were "
        "cancelled before they finished (the pieces the kernel held were waited for)",
        job->ops.size(), job->bytes(), cancelled));
  }
  if (std::exception_ptr e = job->error()) std::rethrow_exception(e);
}

std::size_t Handle::Impl::cancel_job(const detail::Job& job, const char* why) {
  std::size_t cancelled = 0;
  for (const OperationPtr& op : job.ops) {
    const Operation& o = *op;
    if (queue.cancel(*op,
                     detail::io_error_ptr(o.is_read() ? IoOp::Read : IoOp::Write, o.path, o.offset,
                                          o.length, ECANCELED, why),
                     counters.others())) {
      ++cancelled;
    }
  }
  return cancelled;
}

Ticket Handle::Impl::register_async(const JobPtr& job) {
  const Ticket t = tickets.add(job);
  queue_job(*job, queue);
  return t;
}

namespace {

// Guards the swap of a handle's state in a forked child. A leaf: nothing else is taken under it
// (the fresh state, whose workers take other mutexes, is made outside it). Held across fork() so
// that a child never inherits it locked by a thread that does not exist there.
std::mutex g_fork_mutex;
[[maybe_unused]] const bool g_fork_mutex_held = (detail::hold_across_fork(g_fork_mutex), true);

}  // namespace

Handle::Impl& Handle::impl() const {
  if (owner_pid_.load(std::memory_order_acquire) == detail::current_pid()) return *impl_;
  return renew_after_fork();
}

Handle::Impl& Handle::renew_after_fork() const {
  const pid_t pid = detail::current_pid();
  Options options;
  {
    std::lock_guard lock(g_fork_mutex);
    if (owner_pid_.load(std::memory_order_relaxed) == pid) return *impl_;
    options = impl_->options;  // fixed when the handle was made
  }
  auto fresh = std::make_unique<Impl>(options);
  std::unique_ptr<Impl> spare;  // another thread of this child renewed first: this one goes
  {
    std::lock_guard lock(g_fork_mutex);
    if (owner_pid_.load(std::memory_order_relaxed) != pid) {
      // The parent's state stays as the fork left it: its worker threads do not exist here, its
      // mutexes may be held, and destroying it would wait for them forever. It is left to exit.
      (void)impl_.release();
      impl_ = std::move(fresh);
      owner_pid_.store(pid, std::memory_order_release);
    } else {
      spare = std::move(fresh);
    }
  }
  return *impl_;  // no longer replaced in this process
}

Handle::Handle() : Handle(resolve_options().values) {}
Handle::Handle(const Options& options)
    : impl_(std::make_unique<Impl>(options)), owner_pid_(detail::current_pid()) {}

Handle::~Handle() {
  // In a forked child that never used the handle, the state is the parent's (see impl()).
  if (owner_pid_.load(std::memory_order_acquire) != detail::current_pid()) (void)impl_.release();
}

namespace {

// Reads carry no write options; the memory kind travels in the same struct inside the handle.
WriteOptions as_write_options(const ReadOptions& r) {
  WriteOptions w;
  w.memory = r.memory;
  return w;
}

}  // namespace

// Every call by path borrows the caller's string (FileRef::borrow): the operation names its file
// through it until the file's own name replaces it (FileCache), with no copy per operation.
void Handle::read(void* buf, std::size_t length, const std::string& path, std::uint64_t offset,
                  const ReadOptions& read_options) {
  Impl& s = impl();
  s.run_blocking(s.one(Direction::Read, buf, length, FileRef::borrow(path), offset,
                       as_write_options(read_options)));
}

void Handle::write(const void* buf, std::size_t length, const std::string& path,
                   std::uint64_t offset, const WriteOptions& write_options) {
  Impl& s = impl();
  s.run_blocking(
      s.one(Direction::Write, buf, length, FileRef::borrow(path), offset, write_options));
}

void Handle::read(void* buf, std::size_t length, int fd, std::uint64_t offset,
                  const ReadOptions& read_options) {
  Impl& s = impl();
  s.run_blocking(s.one(Direction::Read, buf, length, fd, offset, as_write_options(read_options)));
}

void Handle::write(const void* buf, std::size_t length, int fd, std::uint64_t offset,
                   const WriteOptions& write_options) {
  Impl& s = impl();
  s.run_blocking(s.one(Direction::Write, buf, length, fd, offset, write_options));
}

Ticket Handle::submit_read(void* buf, std::size_t length, const std::string& path,
                           std::uint64_t offset, const ReadOptions& read_options) {
  Impl& s = impl();
  return s.register_async(s.one(Direction::Read, buf, length, FileRef::borrow(path), offset,
                                as_write_options(read_options)));
}

Ticket Handle::submit_write(const void* buf, std::size_t length, const std::string& path,
                            std::uint64_t offset, const WriteOptions& write_options) {
  Impl& s = impl();
  return s.register_async(
      s.one(Direction::Write, buf, length, FileRef::borrow(path), offset, write_options));
}

Ticket Handle::submit_read(void* buf, std::size_t length, int fd, std::uint64_t offset,
                           const ReadOptions& read_options) {
  Impl& s = impl();
  return s.register_async(
      s.one(Direction::Read, buf, length, fd, offset, as_write_options(read_options)));
}

Ticket Handle::submit_write(const void* buf, std::size_t length, int fd, std::uint64_t offset,
                            const WriteOptions& write_options) {
  Impl& s = impl();
  return s.register_async(s.one(Direction::Write, buf, length, fd, offset, write_options));
}

void Handle::read_batch(std::span<const ReadExtent> extents, const ReadOptions& read_options) {
  Impl& s = impl();
  s.run_blocking(s.batch(Direction::Read, extents, as_write_options(read_options)));
}

void Handle::write_batch(std::span<const WriteExtent> extents, const WriteOptions& write_options) {
  Impl& s = impl();
  s.run_blocking(s.batch(Direction::Write, extents, write_options));
}

Ticket Handle::submit_read_batch(std::span<const ReadExtent> extents,
                                 const ReadOptions& read_options) {
  Impl& s = impl();
  return s.register_async(s.batch(Direction::Read, extents, as_write_options(read_options)));
}

Ticket Handle::submit_write_batch(std::span<const WriteExtent> extents,
                                  const WriteOptions& write_options) {
  Impl& s = impl();
  return s.register_async(s.batch(Direction::Write, extents, write_options));
}

Ticket Handle::run_opened(bool write, std::span<const WriteExtent> extents, bool batch,
                          const detail::Opened& opened, const WriteOptions& options, bool async) {
  Impl& s = impl();
  const Direction dir = write ? Direction::Write : Direction::Read;
  const FileRef file = FileRef::of(opened);
  JobPtr job;
  if (batch) {
    job = s.batch(dir, extents, options, &file);
  } else {
    const WriteExtent& e = extents.front();
    job = s.one(dir, e.buf, e.length, file, e.offset, options);
  }
  if (async) return s.register_async(job);
  s.run_blocking(job);
  return 0;
}

void Handle::wait(Ticket ticket) {
  if (std::exception_ptr e = wait_completion(ticket).error) std::rethrow_exception(e);
}

Completion Handle::wait_completion(Ticket ticket) { return impl().tickets.wait(ticket); }

std::size_t Handle::wait_some(std::span<Completion> out, std::size_t min_count) {
  return impl().tickets.wait_some(out, min_count);
}

bool Handle::done(Ticket ticket) const { return impl().tickets.done(ticket); }

bool Handle::is_pending(Ticket ticket) const { return impl().tickets.is_pending(ticket); }

bool Handle::cancel(Ticket ticket) {
  Impl& s = impl();
  const JobPtr job = s.tickets.find_cancellable(ticket);
  return s.cancel_job(*job, "cancelled (Handle::cancel)") > 0;
}

std::size_t Handle::wait() { return impl().tickets.wait_all(); }

std::size_t Handle::pending() const { return impl().tickets.pending(); }

void Handle::close_files() { impl().files.clear(); }

void Handle::close_file(int fd) { impl().files.clear_file(fd); }

void Handle::close_file(const std::string& path) { impl().files.clear_file(path); }

std::size_t Handle::open_files() const { return impl().files.size(); }

HandleStats Handle::stats() const { return impl().counters.snapshot(); }

// These facts are fixed when the handle is made and are the same in a forked child, so they are
// read from whichever state is current without making a new one.
const Options& Handle::options() const noexcept { return impl_->options; }
EngineKind Handle::engine() const noexcept { return impl_->engine_kind; }
const std::string& Handle::engine_reason() const noexcept { return impl_->engine_reason; }

}  // namespace nvio
