// The handle: the public API, the table of asynchronous tickets, and preparing each request
// (opening the file, checking the target, planning its pieces). The rest lives beside it:
//   handle/plan.*       how a request is cut into direct pieces and buffered edges (pure)
//   handle/operation.*  one request in flight, and the queue the workers take pieces from
//   handle/worker.*     a worker thread: one explicit state machine per slot in flight
//   cuda/device_lane.*  a worker's CUDA streams, events and slab registrations
#include "nvio/handle.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <typeinfo>
#include <vector>

#include "core/fork.hpp"
#include "core/pool.hpp"
#include "core/posix.hpp"
#include "core/retry.hpp"
#include "core/spin.hpp"
#include "cuda/cufile.hpp"
#include "cuda/device_ops.hpp"
#include "engine/engine.hpp"
#include "handle/files.hpp"
#include "handle/opened.hpp"
#include "handle/operation.hpp"
#include "handle/stats.hpp"
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

using detail::Operation;
using detail::OperationPtr;
using engine::Direction;

// What one ticket stands for: one operation, or the operations of a batch in extent order.
// Immutable once made; each operation's outcome is guarded by its own mutex.
struct Job {
  // A single operation's vector holds one element: a pooled block (core/pool.hpp).
  std::vector<OperationPtr, detail::PoolAllocator<OperationPtr>> ops;
  Ticket ticket = 0;                       // 0 for a blocking call's
  std::atomic<std::size_t> unfinished{0};  // operations not finished yet (asynchronous jobs)

  // Waits for every operation: true. An Interruptible wait returns false when the thread's
  // InterruptCheck said to stop (core/interrupt.hpp); the operations go on.
  bool wait(detail::WaitMode mode = detail::WaitMode::Uninterruptible) const {
    for (const OperationPtr& op : ops) {
      // A batch of small extents is many short waits: the check is asked between them too.
      if (detail::interrupt_overdue(mode) || !detail::OperationQueue::wait_finished(*op, mode)) {
        return false;
      }
    }
    return true;
  }
  bool done() const {
    for (const OperationPtr& op : ops) {
      std::lock_guard lock(op->mutex);
      if (!op->finished) return false;
    }
    return true;
  }
  // A job of no operations (an empty batch): when it was registered, which is when it finished.
  std::chrono::steady_clock::time_point empty_finished_at;

  // After wait(): when the last of its operations finished.
  std::chrono::steady_clock::time_point finished_at() const {
    if (ops.empty()) return empty_finished_at;
    std::chrono::steady_clock::time_point last;
    for (const OperationPtr& op : ops) last = std::max(last, op->finished_at);
    return last;
  }
  // After wait(): the first failure in extent order, or null.
  std::exception_ptr error() const {
    for (const OperationPtr& op : ops) {
      if (op->error) return op->error;
    }
    return nullptr;
  }
};
using JobPtr = std::shared_ptr<Job>;

JobPtr make_job() { return std::allocate_shared<Job>(detail::PoolAllocator<Job>{}); }

JobPtr single(OperationPtr op) {
  JobPtr job = make_job();
  job->ops.push_back(std::move(op));
  return job;
}

}  // namespace

struct Handle::Impl final : detail::FinishListener {
  explicit Impl(const Options& opts);
  ~Impl();

  // Makes the operation for one request: checks the arguments, opens the file (or uses the
  // descriptors `same_file` opened, for an extent of a batch), plans its pieces.
  OperationPtr prepare(Direction dir, std::byte* buf, std::size_t length, const std::string* path,
                       int fd, std::uint64_t offset, const WriteOptions& wopts) {
    return counting_refusal([&] { return prepare_op(dir, buf, length, path, fd, offset, wopts); });
  }
  // prepare() without counting a refusal (an extent of a batch: the batch counts once). With
  // `opened`, the request is on an nvio::File's file (path and fd are not used).
  OperationPtr prepare_op(Direction dir, std::byte* buf, std::size_t length,
                          const std::string* path, int fd, std::uint64_t offset,
                          const WriteOptions& wopts, const Operation* same_file = nullptr,
                          const detail::Opened* opened = nullptr);
  // Runs `make`, which prepares a request; a request refused before anything was submitted (a bad
  // argument, a file that cannot be opened, a read past the end) counts as a failed operation in
  // stats' `errors` (issue 28 #11), under its errno, before the error propagates.
  template <class Make>
  auto counting_refusal(Make make) -> decltype(make()) {
    try {
      return make();
    } catch (...) {
      counters.others().failed(std::current_exception());
      throw;
    }
  }
  // Device memory: finds its device and the transport (bounce or GDS) once the file is open.
  void prepare_device(Operation& op);
  // The operations of a batch of extents, prepared together: the extents of one file share its
  // descriptors, and a write batch's durability is one fdatasync per file after the last extent.
  template <class Extent>
  JobPtr prepare_batch(Direction dir, std::span<const Extent> extents, const WriteOptions& wopts,
                       const detail::Opened* opened = nullptr) {
    return counting_refusal([&] { return prepare_extents(dir, extents, wopts, opened); });
  }
  template <class Extent>
  JobPtr prepare_extents(Direction dir, std::span<const Extent> extents, const WriteOptions& wopts,
                         const detail::Opened* opened);
  void run_blocking(const JobPtr& job);
  Ticket register_async(const JobPtr& job);
  // Queues the job's operations, once all of them are prepared (a batch refused for one extent
  // allocates and extends nothing): a direct write past its file's end first allocates that
  // range, while no operation of the handle is queued on the file (allocate_past_end).
  void queue_job(const Job& job);
  // The operation behind `ticket`; with `collect` a wait takes it: it moves from the table to
  // `collecting` until the wait calls end_collect.
  JobPtr find_ticket(Ticket ticket, bool collect);
  void end_collect(std::span<const JobPtr> jobs);
  // An interrupted wait gives back the jobs it took: they are outstanding again, and listed in
  // `finished` again when they have finished (a wait_some may have taken them from there).
  void uncollect(std::span<const JobPtr> jobs);
  // Cancels the operations of `job` that have pieces not started yet (OperationQueue::cancel),
  // failing them with ECANCELED and `why`. Returns how many were cancelled.
  std::size_t cancel_job(const Job& job, const char* why);
  // A job's last operation finished: its ticket joins `finished` for wait_some.
  bool operation_finished(const detail::Operation& op) noexcept override;
  void wake_collectors() noexcept override;
  // Adds `ticket` to `finished` (pruning collected ones). Called with tickets_mutex held; the
  // caller notifies finished_cv after letting it go.
  void list_finished(Ticket ticket) noexcept;

  Options options;
  EngineKind engine_kind;
  std::string engine_reason;

  detail::HandleCounters counters;  // a shard per worker: set before the workers start
  detail::OperationQueue queue;
  detail::FileCache files{options.direct};

  mutable std::mutex tickets_mutex;
  std::map<Ticket, JobPtr, std::less<>, detail::PoolAllocator<std::pair<const Ticket, JobPtr>>>
      tickets;
  // Operations a wait has taken from `tickets` and is waiting for: a concurrent wait() must still
  // wait for them (see the rule in handle.hpp). Guarded by tickets_mutex.
  std::map<const Job*, JobPtr, std::less<>,
           detail::PoolAllocator<std::pair<const Job* const, JobPtr>>>
      collecting;
  Ticket next_ticket = 1;
  // Tickets whose job finished, in the order they did, for wait_some; entries that another wait
  // collected meanwhile are skipped (and pruned). Guarded by tickets_mutex; finished_cv is
  // notified when one is added.
  std::vector<Ticket> finished;
  std::condition_variable finished_cv;
  std::atomic<std::uint64_t> finished_count{0};  // jobs finished so far: wait_some polls it

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
  reason = "requested explicitly";
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
  counters.set_workers(count);
  queue.prepare_wakeups(count);
  for (unsigned i = 0; i < count && !first; ++i) {
    try {
      auto ready = std::make_shared<std::promise<void>>();
      std::future<void> f = ready->get_future();
      detail::WorkerSettings settings;
      settings.index = i;
      settings.queue_depth = options.queue_depth;
      settings.intra_op_parallelism = count;
      settings.block_size = options.block_size;
      settings.overlap_events = options.overlap_events;
      settings.single_submit = options.single_submit;
      settings.engine = engine_kind;
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

namespace {

void plan(Operation& op, std::size_t block_size, DirectIo direct, CachedReads cached_reads) {
  if (detail::plan_cached_whole(op, direct, cached_reads)) op.direct_fd = -1;
  if (op.direct_fd < 0) {
    op.plan = detail::plan_whole(op.offset, op.length, block_size, false);
    op.piece_count = op.plan.piece_count();
    return;
  }
  // The facts check_target had for the same file (through the buffered or the caller's
  // descriptor): the direct-I/O alignment belongs to the inode, not to the descriptor.
  const detail::FileFacts& facts = op.file->facts;
  const DirectIoInfo& dio = facts.direct_io;
  bool use_direct = dio.supported;
  std::size_t shift = 0;
  if (use_direct) {
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t align = detail::split_alignment(dio.offset_align, page, facts.block_size);
    op.dio_offset_align = std::max<std::uint32_t>(dio.offset_align, 1);
    op.mem_align = std::max<std::uint32_t>(dio.mem_align, 1);
    op.plan = detail::plan_split(op.offset, op.length, block_size, align);
    const auto middle = reinterpret_cast<std::uintptr_t>(op.user(op.plan.head_end));
    // A host read whose middle is not aligned for the kernel lands shifted in the caller's
    // memory when it has pieces enough (plan_shifted); other such middles, and device memory
    // (edges included), go through bounce chunks. Host edges never do.
    if (op.is_read() && op.memory == MemoryKind::Host) {
      shift = detail::plan_shifted(op.plan, middle, op.mem_align, page, align);
    }
    const bool bounced = op.memory == MemoryKind::Device ||
                         (op.plan.middle_pieces() > 0 && middle % op.mem_align != 0 && shift == 0);
    // A bounce chunk holds block_size bytes (whole pages). Where the split granularity is larger
    // (a file system with an st_blksize above block_size: NFS, XFS mounted with largeio), the
    // middle's pieces are as long as a chunk when they bounce: inside the middle a piece needs
    // only the kernel's alignment, and its ends stay at the split alignment, away from the
    // edges. A device-memory edge (up to the split alignment long) cannot be cut so: such an
    // operation goes through the page cache instead, where pieces are block_size long. A
    // shifted read needs no chunk: its pieces land in the caller's memory, its tail in a buffer
    // of its own.
    const std::size_t chunk = detail::bounce_chunk_size(block_size);
    if (bounced && align > chunk) {
      if (op.memory == MemoryKind::Host &&
          chunk % std::max<std::uint64_t>(op.dio_offset_align, op.mem_align) == 0) {
        op.plan.piece_size = chunk;
      } else if (direct == DirectIo::On) {
        throw InvalidArgument(fmt::format(
            "{}: its file system splits direct I/O at {} bytes, more than the block size {} "
            "that bounce buffers hold, and direct=on forbids buffered I/O for this unaligned "
            "or device-memory transfer: raise block_size to at least {}",
            op.path, align, block_size, align));
      } else {
        warn(fmt::format("{}: its file system splits direct I/O at {} bytes, more than the "
                         "block size {} that bounce buffers hold; this unaligned or "
                         "device-memory transfer uses buffered I/O (raise block_size to at least "
                         "{} for direct I/O)",
                         op.path, align, block_size, align),
             "bounce-split");
        use_direct = false;
      }
    }
    if (use_direct && (op.plan.has_head() || (op.plan.has_tail() && !op.plan.tail_direct)) &&
        op.buffered_fd < 0) {
      throw InvalidArgument(fmt::format(
          "{}: offset {} and length {} are not aligned to {} bytes, and no buffered descriptor "
          "could be opened for the unaligned edges (is /proc mounted?)",
          op.path, op.offset, op.length, align));
    }
    if (use_direct && shift > 0) {
      op.shifted = std::make_unique<detail::ShiftedRead>(
          shift, op.plan.middle_pieces() + 1,
          static_cast<std::size_t>(op.plan.end - op.plan.tail_begin),
          std::max<std::size_t>(op.mem_align, page));
    }
  }
  if (!use_direct) {
    op.direct_fd = -1;
    op.plan = detail::plan_whole(op.offset, op.length, block_size, false);
  }
  detail::mark_cached_pieces(op);
  op.piece_count = op.plan.piece_count();
}

}  // namespace

OperationPtr Handle::Impl::prepare_op(Direction dir, std::byte* buf, std::size_t length,
                                      const std::string* path, int fd, std::uint64_t offset,
                                      const WriteOptions& wopts, const Operation* same_file,
                                      const detail::Opened* opened) {
  // A handle whose worker died runs nothing more (see Worker::die in worker.cpp).
  if (std::exception_ptr dead = queue.worker_failure()) std::rethrow_exception(dead);
  auto op = std::allocate_shared<Operation>(detail::PoolAllocator<Operation>{});
  op->direction = dir;
  // A caller's descriptor is named for messages from /proc, which costs a readlink: only when a
  // message needs it, or when FileCache sees the descriptor for the first time.
  std::string fd_label;  // a caller's descriptor named for a message, until its file names it
  if (path != nullptr) op->path = detail::NameRef(*path);
  auto name = [&]() -> const std::string& {
    if (op->path.empty_name()) {
      fd_label = detail::fd_name(fd);
      op->path = detail::NameRef(fd_label);
    }
    return op->path;
  };
  op->buf = buf;
  op->offset = offset;
  op->length = length;
  op->write_options = wopts;
  if (buf == nullptr && length > 0) {
    throw InvalidArgument(fmt::format("{}: buffer is null but length is {}", name(), length));
  }
  if (offset > std::numeric_limits<std::uint64_t>::max() - length ||
      offset + length > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
    throw InvalidArgument(fmt::format("{}: offset {} + length {} is past the largest file offset",
                                      name(), offset, length));
  }
  op->memory = wopts.memory;
  if (op->memory == MemoryKind::Auto) op->memory = length > 0 ? memory_kind(buf) : MemoryKind::Host;
  if (op->memory == MemoryKind::Device && length > 0) {
    op->device_ops = cuda::device_ops();  // GpuError when CUDA cannot be used
    const std::optional<int> device = op->device_ops->device_of(buf);
    if (!device) {
      throw InvalidArgument(fmt::format(
          "{}: the buffer at {} was given as device memory, but CUDA does not know it as device "
          "memory",
          name(), static_cast<const void*>(buf)));
    }
    op->device = *device;
  } else {
    op->memory = MemoryKind::Host;
  }
  if (opened != nullptr) {
    detail::use_opened(*op, *opened);  // an nvio::File's: no system call
  } else if (path != nullptr) {
    if (path->empty()) throw InvalidArgument("file path is empty");
    if (const std::size_t nul = path->find('\0'); nul != std::string::npos) {
      // open() would stop at the NUL and use a different, shorter name.
      throw InvalidArgument(
          fmt::format("file path '{}' holds a NUL byte at position {}", path->substr(0, nul), nul));
    }
    if (same_file != nullptr) {
      detail::share_file(*op, *same_file);
    } else {
      files.open_path(*op);
    }
  } else {
    if (fd < 0) throw InvalidArgument(fmt::format("file descriptor {} is negative", fd));
    if (same_file != nullptr) {
      detail::share_file(*op, *same_file);
    } else {
      files.adopt_fd(*op, fd);
    }
  }
  plan(*op, options.block_size, options.direct, options.cached_reads);
  if (op->memory == MemoryKind::Device) prepare_device(*op);
  op->remaining.store(op->piece_count);
  return op;
}

namespace {

// cuFile's registration for `op`'s direct descriptor: the file's, made once and kept with it, when
// the file owns that descriptor; else one of the operation's own, since a caller's descriptor may
// be closed, and its number reused for another file, while the handle keeps the file.
std::shared_ptr<const cuda::CuFileHandle> gds_handle(const Operation& op) {
  const auto make = [&] {
    return std::make_shared<const cuda::CuFileHandle>(op.direct_fd, op.path);
  };
  if (op.file->direct && op.file->direct.get() == op.direct_fd) {
    return op.file->gds_registration(make);
  }
  return make();
}

}  // namespace

void Handle::Impl::prepare_device(Operation& op) {
  // A test's fake device memory is host memory: cuFile must never see it.
  if (options.gpu_direct == GpuDirect::Off || cuda::device_ops_override()) return;
  const GpuInfo& info = gpu_info();
  cuda::TransportChoice choice =
      cuda::choose_transport(options.gpu_direct, info.gds_mode, info.gds_reason);
  if (choice.transport == cuda::Transport::Gds && op.direct_fd < 0) {
    choice = {cuda::Transport::Bounce, options.gpu_direct == GpuDirect::On,
              fmt::format("gpu_direct=on but '{}' cannot be opened with O_DIRECT, which cuFile "
                          "needs; device memory moves through the host bounce path",
                          op.path)};
  }
  if (choice.transport == cuda::Transport::Gds) {
    try {
      op.cufile = gds_handle(op);
    } catch (const GpuError& e) {
      choice = {cuda::Transport::Bounce, options.gpu_direct == GpuDirect::On,
                std::string(e.what()) + "; device memory moves through the host bounce path"};
    }
  }
  if (choice.warn) warn(choice.reason, "gds-fallback");
  op.transport = choice.transport;
  if (op.transport == cuda::Transport::Gds) {
    // cuFile takes any offset and length itself: the whole request is cut into block_size
    // pieces on the O_DIRECT descriptor, with no buffered edges.
    op.plan = detail::plan_whole(op.offset, op.length, options.block_size, true);
    op.piece_count = op.plan.piece_count();
  }
}

template <class Extent>
JobPtr Handle::Impl::prepare_extents(Direction dir, std::span<const Extent> extents,
                                     const WriteOptions& wopts, const detail::Opened* opened) {
  if (wopts.truncate == Truncate::AtEnd) {
    throw InvalidArgument(
        "truncate=at_end does not apply to a batch (its extents end in different places): "
        "truncate with a single write, or with ftruncate after the batch");
  }
  JobPtr job = make_job();
  job->ops.reserve(extents.size());
  std::shared_ptr<detail::BatchFinish> finish;
  WriteOptions per_extent = wopts;
  if (dir == Direction::Write) {
    finish = std::make_shared<detail::BatchFinish>();
    finish->durability = wopts.durability;
    finish->left.store(extents.size());
    per_extent.durability = Durability::None;  // once per file, by the batch's last extent
  }
  std::map<std::string, const Operation*> by_path;
  std::map<int, const Operation*> by_fd;
  for (const Extent& e : extents) {
    const bool by_name = !e.path.empty();
    const Operation* same = nullptr;
    if (by_name) {
      if (auto it = by_path.find(e.path); it != by_path.end()) same = it->second;
    } else if (auto it = by_fd.find(e.fd); it != by_fd.end()) {
      same = it->second;
    }
    auto* bytes = static_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(e.buf)));
    OperationPtr op = prepare_op(dir, bytes, e.length, by_name ? &e.path : nullptr, e.fd, e.offset,
                                 per_extent, same, opened);
    if (same == nullptr) {
      if (by_name) {
        by_path.emplace(e.path, op.get());
      } else {
        by_fd.emplace(e.fd, op.get());
      }
      if (finish) {
        finish->files.push_back(op->file);
      }
    }
    op->batch = finish;
    job->ops.push_back(std::move(op));
  }
  return job;
}

void Handle::Impl::queue_job(const Job& job) {
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
      op->file->queued_ops.fetch_add(1, std::memory_order_relaxed);
      op->counted_in_file = true;
    }
    queue.push(op, counters.others());
  }
}

void Handle::Impl::run_blocking(const JobPtr& job) {
  queue_job(*job);
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
    std::uint64_t bytes = 0;
    for (const OperationPtr& op : job->ops) bytes += op->length;
    throw Interrupted(fmt::format(
        "interrupted: a blocking call of {} operation(s), {} bytes, stopped; {} of them were "
        "cancelled before they finished (the pieces the kernel held were waited for)",
        job->ops.size(), bytes, cancelled));
  }
  if (std::exception_ptr e = job->error()) std::rethrow_exception(e);
}

std::size_t Handle::Impl::cancel_job(const Job& job, const char* why) {
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
  Ticket t;
  job->unfinished.store(job->ops.size(), std::memory_order_relaxed);
  if (job->ops.empty()) job->empty_finished_at = std::chrono::steady_clock::now();
  for (const OperationPtr& op : job->ops) {
    op->listener = this;
    op->job = job.get();
  }
  {
    std::lock_guard lock(tickets_mutex);
    t = next_ticket++;
    job->ticket = t;
    tickets.emplace(t, job);
    // Room for every ticket to finish without `finished` growing in operation_finished, which
    // must not throw: below 2 * tickets + 64 entries it is not pruned, then it holds at most the
    // live tickets.
    const std::size_t room = 2 * tickets.size() + 65;
    if (finished.capacity() < room) finished.reserve(std::max(room, 2 * finished.capacity()));
    // A job of no operations (an empty batch) has finished already: no operation will say so.
    if (job->ops.empty()) list_finished(t);
  }
  if (job->ops.empty()) finished_cv.notify_all();
  queue_job(*job);
  return t;
}

void Handle::Impl::list_finished(Ticket ticket) noexcept {
  if (finished.size() >= 2 * tickets.size() + 64) {
    // Mostly tickets that wait() or wait(ticket) collected: drop those.
    std::erase_if(finished, [&](Ticket t) { return !tickets.contains(t); });
  }
  finished.push_back(ticket);  // within the capacity register_async reserved
  finished_count.fetch_add(1, std::memory_order_release);
}

bool Handle::Impl::operation_finished(const detail::Operation& op) noexcept {
  auto* job = static_cast<Job*>(op.job);
  if (job->unfinished.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
  std::lock_guard lock(tickets_mutex);
  list_finished(job->ticket);
  return true;
}

void Handle::Impl::wake_collectors() noexcept { finished_cv.notify_all(); }

JobPtr Handle::Impl::find_ticket(Ticket ticket, bool collect) {
  std::lock_guard lock(tickets_mutex);
  auto it = tickets.find(ticket);
  if (it == tickets.end()) {
    throw InvalidArgument(fmt::format("ticket {} is unknown or was already waited for", ticket));
  }
  JobPtr job = it->second;
  if (collect) {
    tickets.erase(it);
    collecting.emplace(job.get(), job);
  }
  return job;
}

void Handle::Impl::end_collect(std::span<const JobPtr> jobs) {
  std::lock_guard lock(tickets_mutex);
  for (const JobPtr& job : jobs) collecting.erase(job.get());
}

void Handle::Impl::uncollect(std::span<const JobPtr> jobs) {
  bool listed = false;
  {
    std::lock_guard lock(tickets_mutex);
    for (const JobPtr& job : jobs) {
      collecting.erase(job.get());
      tickets.emplace(job->ticket, job);
      // Kept within what register_async reserves, for operation_finished's list_finished.
      const std::size_t room = 2 * tickets.size() + 65;
      if (finished.capacity() < room) finished.reserve(std::max(room, 2 * finished.capacity()));
      // A job still unfinished is listed by its last operation. One that has finished is
      // listed again unless its entry is still there (a wait_some takes entries out): listed
      // twice, it would be collected once all the same, but every interrupted wait would add a
      // copy beyond the room reserved above.
      if (job->unfinished.load(std::memory_order_acquire) == 0 &&
          std::find(finished.begin(), finished.end(), job->ticket) == finished.end()) {
        list_finished(job->ticket);
        listed = true;
      }
    }
  }
  if (listed) finished_cv.notify_all();
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

void Handle::read(void* buf, std::size_t length, const std::string& path, std::uint64_t offset,
                  const ReadOptions& read_options) {
  Impl& s = impl();
  s.run_blocking(single(s.prepare(Direction::Read, static_cast<std::byte*>(buf), length, &path, -1,
                                  offset, as_write_options(read_options))));
}

void Handle::write(const void* buf, std::size_t length, const std::string& path,
                   std::uint64_t offset, const WriteOptions& write_options) {
  // The engines take a non-const pointer for both directions; writes never modify the buffer.
  auto* bytes = static_cast<std::byte*>(const_cast<void*>(buf));
  Impl& s = impl();
  s.run_blocking(
      single(s.prepare(Direction::Write, bytes, length, &path, -1, offset, write_options)));
}

void Handle::read(void* buf, std::size_t length, int fd, std::uint64_t offset,
                  const ReadOptions& read_options) {
  Impl& s = impl();
  s.run_blocking(single(s.prepare(Direction::Read, static_cast<std::byte*>(buf), length, nullptr,
                                  fd, offset, as_write_options(read_options))));
}

void Handle::write(const void* buf, std::size_t length, int fd, std::uint64_t offset,
                   const WriteOptions& write_options) {
  auto* bytes = static_cast<std::byte*>(const_cast<void*>(buf));
  Impl& s = impl();
  s.run_blocking(
      single(s.prepare(Direction::Write, bytes, length, nullptr, fd, offset, write_options)));
}

Ticket Handle::submit_read(void* buf, std::size_t length, const std::string& path,
                           std::uint64_t offset, const ReadOptions& read_options) {
  Impl& s = impl();
  return s.register_async(single(s.prepare(Direction::Read, static_cast<std::byte*>(buf), length,
                                           &path, -1, offset, as_write_options(read_options))));
}

Ticket Handle::submit_write(const void* buf, std::size_t length, const std::string& path,
                            std::uint64_t offset, const WriteOptions& write_options) {
  auto* bytes = static_cast<std::byte*>(const_cast<void*>(buf));
  Impl& s = impl();
  return s.register_async(
      single(s.prepare(Direction::Write, bytes, length, &path, -1, offset, write_options)));
}

Ticket Handle::submit_read(void* buf, std::size_t length, int fd, std::uint64_t offset,
                           const ReadOptions& read_options) {
  Impl& s = impl();
  return s.register_async(single(s.prepare(Direction::Read, static_cast<std::byte*>(buf), length,
                                           nullptr, fd, offset, as_write_options(read_options))));
}

Ticket Handle::submit_write(const void* buf, std::size_t length, int fd, std::uint64_t offset,
                            const WriteOptions& write_options) {
  auto* bytes = static_cast<std::byte*>(const_cast<void*>(buf));
  Impl& s = impl();
  return s.register_async(
      single(s.prepare(Direction::Write, bytes, length, nullptr, fd, offset, write_options)));
}

void Handle::read_batch(std::span<const ReadExtent> extents, const ReadOptions& read_options) {
  Impl& s = impl();
  s.run_blocking(s.prepare_batch(Direction::Read, extents, as_write_options(read_options)));
}

void Handle::write_batch(std::span<const WriteExtent> extents, const WriteOptions& write_options) {
  Impl& s = impl();
  s.run_blocking(s.prepare_batch(Direction::Write, extents, write_options));
}

Ticket Handle::submit_read_batch(std::span<const ReadExtent> extents,
                                 const ReadOptions& read_options) {
  Impl& s = impl();
  return s.register_async(
      s.prepare_batch(Direction::Read, extents, as_write_options(read_options)));
}

Ticket Handle::submit_write_batch(std::span<const WriteExtent> extents,
                                  const WriteOptions& write_options) {
  Impl& s = impl();
  return s.register_async(s.prepare_batch(Direction::Write, extents, write_options));
}

Ticket Handle::run_opened(bool write, std::span<const WriteExtent> extents, bool batch,
                          const detail::Opened& opened, const WriteOptions& options, bool async) {
  Impl& s = impl();
  const Direction dir = write ? Direction::Write : Direction::Read;
  JobPtr job;
  if (batch) {
    job = s.prepare_batch(dir, extents, options, &opened);
  } else {
    const WriteExtent& e = extents.front();
    auto* bytes = static_cast<std::byte*>(const_cast<void*>(e.buf));
    job = single(s.counting_refusal([&] {
      return s.prepare_op(dir, bytes, e.length, nullptr, -1, e.offset, options, nullptr, &opened);
    }));
  }
  if (async) return s.register_async(job);
  s.run_blocking(job);
  return 0;
}

void Handle::wait(Ticket ticket) {
  if (std::exception_ptr e = wait_completion(ticket).error) std::rethrow_exception(e);
}

Completion Handle::wait_completion(Ticket ticket) {
  Impl& s = impl();
  JobPtr job = s.find_ticket(ticket, /*collect=*/true);
  if (!job->wait(detail::WaitMode::Interruptible)) {
    s.uncollect(std::span(&job, 1));
    throw Interrupted(fmt::format(
        "interrupted: the wait for ticket {} stopped; the ticket is still outstanding", ticket));
  }
  s.end_collect(std::span(&job, 1));
  return Completion{ticket, job->error(), job->finished_at()};
}

namespace {

// wait_some polls before sleeping only while at most this many operations are outstanding.
constexpr std::size_t kPollOutstanding = 2;

}  // namespace

std::size_t Handle::wait_some(std::span<Completion> out, std::size_t min_count) {
  Impl& s = impl();
  std::vector<JobPtr> mine;
  {
    std::unique_lock lock(s.tickets_mutex);
    for (;;) {
      // The entries looked at are removed before the lock is let go (operation_finished prunes
      // the list, which would move them).
      std::size_t next = 0;
      for (; next < s.finished.size() && mine.size() < out.size(); ++next) {
        auto it = s.tickets.find(s.finished[next]);
        if (it == s.tickets.end()) continue;  // collected by another wait
        s.collecting.emplace(it->second.get(), it->second);
        mine.push_back(std::move(it->second));
        s.tickets.erase(it);
      }
      s.finished.erase(s.finished.begin(), s.finished.begin() + static_cast<std::ptrdiff_t>(next));
      // Fewer than asked for can only come when no more are outstanding.
      const std::size_t want = std::min({min_count, out.size(), mine.size() + s.tickets.size()});
      if (mine.size() >= want) break;
      // With one or two operations outstanding the caller waits for each in turn: poll before
      // sleeping (core/spin.hpp), as a small one finishes within microseconds. With more, one
      // finishes soon anyway, and polling would take a CPU from the kernel's side of the I/O.
      if (s.tickets.size() <= kPollOutstanding) {
        std::uint64_t bytes = 0;  // of the one or two jobs outstanding (the table needs the lock)
        for (const auto& [ticket, job] : s.tickets) {
          for (const OperationPtr& op : job->ops) bytes += op->length;
        }
        const std::uint64_t seen = s.finished_count.load(std::memory_order_acquire);
        lock.unlock();
        const bool more = detail::spin_until(detail::completion_spin_limit(bytes), [&] {
          return s.finished_count.load(std::memory_order_acquire) != seen;
        });
        lock.lock();
        if (more || s.finished_count.load(std::memory_order_acquire) != seen) continue;
      }
      const std::uint64_t seen = s.finished_count.load(std::memory_order_acquire);
      if (!detail::wait_ready(
              s.finished_cv, lock,
              [&] { return s.finished_count.load(std::memory_order_acquire) != seen; },
              detail::WaitMode::Interruptible)) {
        lock.unlock();
        s.uncollect(mine);
        throw Interrupted(
            "interrupted: wait_some stopped; every ticket it had not returned is still "
            "outstanding");
      }
    }
  }
  // Their last operation is finishing (its listener ran): wait() covers the last few steps.
  for (std::size_t i = 0; i < mine.size(); ++i) {
    mine[i]->wait();
    out[i] = Completion{mine[i]->ticket, mine[i]->error(), mine[i]->finished_at()};
  }
  s.end_collect(mine);
  return mine.size();
}

bool Handle::done(Ticket ticket) const { return impl().find_ticket(ticket, false)->done(); }

bool Handle::is_pending(Ticket ticket) const {
  Impl& s = impl();
  std::lock_guard lock(s.tickets_mutex);
  return s.tickets.contains(ticket);
}

bool Handle::cancel(Ticket ticket) {
  Impl& s = impl();
  JobPtr job;
  {
    std::lock_guard lock(s.tickets_mutex);
    if (auto it = s.tickets.find(ticket); it != s.tickets.end()) {
      job = it->second;
    } else {
      // A ticket another thread is waiting for can be cancelled too: that wait then returns.
      for (const auto& [key, ptr] : s.collecting) {
        if (ptr->ticket == ticket) job = ptr;
      }
    }
  }
  if (!job) {
    throw InvalidArgument(
        fmt::format("cancel: ticket {} is unknown or was already waited for", ticket));
  }
  return s.cancel_job(*job, "cancelled (Handle::cancel)") > 0;
}

std::size_t Handle::wait() {
  Impl& s = impl();
  std::vector<JobPtr> mine;    // collected by this wait: counted here
  std::vector<JobPtr> others;  // being collected by another thread's wait right now
  {
    std::lock_guard lock(s.tickets_mutex);
    for (const auto& [job, ptr] : s.collecting) others.push_back(ptr);
    for (auto& [ticket, job] : s.tickets) {
      s.collecting.emplace(job.get(), job);
      mine.push_back(std::move(job));
    }
    s.tickets.clear();
  }
  const auto all_finished = [](const std::vector<JobPtr>& jobs) {
    for (const JobPtr& job : jobs) {
      if (!job->wait(detail::WaitMode::Interruptible)) return false;
    }
    return true;
  };
  if (!all_finished(mine) || !all_finished(others)) {
    s.uncollect(mine);
    throw Interrupted(
        "interrupted: wait() stopped; the tickets it had not returned are still outstanding");
  }
  s.end_collect(mine);
  // Every operation has been waited for; the first failure is the one reported, this wait's own
  // operations first.
  for (const auto* list : {&mine, &others}) {
    for (const JobPtr& job : *list) {
      if (std::exception_ptr e = job->error()) std::rethrow_exception(e);
    }
  }
  return mine.size();
}

std::size_t Handle::pending() const {
  Impl& s = impl();
  std::lock_guard lock(s.tickets_mutex);
  return s.tickets.size();
}

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
