// The handle: splits requests into pieces, runs them on worker threads, checks every completion.
//
// Structure:
//   Operation   one read or write request: its file descriptors, its piece plan, its progress and
//               its outcome. Shared between the submitting thread and the workers.
//   Worker      one thread with its own engine and bounce pool; takes pieces from the handle's
//               queue of operations and keeps up to queue_depth of them in flight.
//   DeviceLane  a worker's CUDA state (stream per device, an event per slot, registrations of
//               its bounce slabs), made when the worker first meets device memory.
//
// Device memory (bounce transport): every piece goes through a bounce chunk. A read goes disk ->
// chunk, then an asynchronous host-to-device copy on the worker's stream and an event; the slot
// and its chunk are released when the event completes. A write starts with a device-to-host copy
// into the chunk; when its event completes the disk write is submitted. Disk I/O of some pieces
// and PCIe copies of others are in flight at the same time within one request. With the GDS
// transport, pieces run through cuFile (synchronous) on the workers instead.
//   Handle      owns the queue, the workers and the table of asynchronous tickets.
#include "nvio/handle.hpp"

#include <cxxabi.h>
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
#include "core/retry.hpp"
#include "cuda/cufile.hpp"
#include "cuda/device_ops.hpp"
#include "engine/engine.hpp"
#include "handle/file.hpp"
#include "handle/worker_threads.hpp"
#include "memory/bounce_pool.hpp"
#include "memory/user_copy.hpp"
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

using engine::Direction;

std::uint64_t round_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }
std::uint64_t round_down(std::uint64_t n, std::uint64_t a) { return n / a * a; }

std::exception_ptr io_error_ptr(IoOp op, const std::string& path, std::uint64_t offset,
                                std::uint64_t length, int err, const std::string& detail = {}) {
  try {
    throw_io_error(op, path, offset, length, err, detail);
  } catch (...) {
    return std::current_exception();
  }
}

// One contiguous piece of an operation, as planned (before any short-transfer resumption).
struct Piece {
  std::uint64_t file_offset;
  std::size_t length;
  bool direct;  // through the O_DIRECT descriptor (aligned offset and length)
};

// One read or write request. The submitting thread fills in everything above `next_piece` before
// the operation is queued; afterwards those fields are read-only. `next_piece` is guarded by the
// handle's queue mutex; the outcome fields by `mutex`.
struct Operation {
  Direction direction = Direction::Read;
  std::string path;  // for messages: the file name, or "fd N (name)"
  detail::FileDescriptor owned_direct;
  detail::FileDescriptor owned_buffered;
  int direct_fd = -1;  // -1: no direct I/O for this operation
  int buffered_fd = -1;
  std::byte* buf = nullptr;
  std::uint64_t offset = 0;
  std::size_t length = 0;
  WriteOptions write_options;
  MemoryKind memory = MemoryKind::Host;  // resolved: never Auto
  int device = -1;                       // device memory: its CUDA device ordinal
  cuda::Transport transport = cuda::Transport::Bounce;
  std::shared_ptr<cuda::DeviceOps> device_ops;  // device memory: the operations to use
  cuda::CuFileHandle cufile;                    // GDS: direct_fd registered with cuFile
  std::uint32_t mem_align = 1;                  // direct I/O: buffer address alignment
  std::uint32_t offset_align = 1;               // direct I/O: file offset and length alignment
  // Plan: [offset, head_end) and [tail_begin, end) are unaligned edges done through the buffered
  // descriptor; [head_end, tail_begin) is cut into pieces of `piece_size`, direct when direct_fd
  // is set. Without direct I/O, head_end == offset and tail_begin == end.
  std::uint64_t head_end = 0;
  std::uint64_t tail_begin = 0;
  std::size_t piece_size = 0;
  std::size_t piece_count = 0;

  std::size_t next_piece = 0;

  std::atomic<std::size_t> remaining{0};  // pieces not yet finished (or skipped)
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::condition_variable finished_cv;
  bool finished = false;
  std::exception_ptr error;

  std::uint64_t end() const { return offset + length; }
  std::size_t middle_pieces() const {
    return tail_begin > head_end ? (tail_begin - head_end + piece_size - 1) / piece_size : 0;
  }
  bool has_head() const { return head_end > offset; }

  Piece piece(std::size_t index) const {
    if (has_head()) {
      if (index == 0) return Piece{offset, static_cast<std::size_t>(head_end - offset), false};
      --index;
    }
    const std::size_t middle = middle_pieces();
    if (index < middle) {
      const std::uint64_t start = head_end + index * piece_size;
      const std::size_t len =
          static_cast<std::size_t>(std::min<std::uint64_t>(piece_size, tail_begin - start));
      return Piece{start, len, direct_fd >= 0};
    }
    return Piece{tail_begin, static_cast<std::size_t>(end() - tail_begin), false};
  }

  bool needs_bounce(const Piece& p) const {
    if (memory == MemoryKind::Device) return transport == cuda::Transport::Bounce;
    const auto addr = reinterpret_cast<std::uintptr_t>(buf + (p.file_offset - offset));
    return p.direct && addr % mem_align != 0;
  }

  void record_error(std::exception_ptr e) {
    std::lock_guard lock(mutex);
    if (!error) error = std::move(e);
    failed.store(true, std::memory_order_release);
  }
};

using OperationPtr = std::shared_ptr<Operation>;

// Where a slot of device memory stands: on the disk, or in a copy between the bounce chunk and
// the device that its slot event will report.
enum class Phase { Disk, ToHost, ToDevice };

// A piece in flight on a worker: where it stands after partial completions.
struct Slot {
  Phase phase = Phase::Disk;
  OperationPtr op;
  std::uint64_t file_offset = 0;
  std::size_t length = 0;
  std::size_t done = 0;
  int fd = -1;
  bool direct = false;
  bool on_disk = false;         // handed to the engine and its completion not reaped yet
  std::byte* user = nullptr;    // the piece's bytes in the caller's buffer
  std::byte* bounce = nullptr;  // the aligned copy used for I/O, or null for zero-copy
  detail::RetryCounter retries{detail::kTransferRetries};  // EINTR / EAGAIN completions in a row
};

}  // namespace

struct Handle::Impl {
  explicit Impl(const Options& opts);
  ~Impl();

  OperationPtr prepare(Direction dir, std::byte* buf, std::size_t length, const std::string* path,
                       int fd, std::uint64_t offset, const WriteOptions& wopts);
  // Device memory: finds its device and the transport (bounce or GDS) once the file is open.
  void prepare_device(Operation& op);
  void enqueue(const OperationPtr& op);
  // After a worker died (worker_main): records `error` as the handle's, so that no operation is
  // started from now on, and fails every queued operation with it.
  void worker_died(const std::exception_ptr& error);
  // The error of a dead worker, or null while all are alive.
  std::exception_ptr worker_failure();
  void wait_finished(Operation& op);
  void finish_piece(Operation& op, std::size_t count);
  // Fails `op` with `error`: its pieces nobody has taken yet are skipped, and `held` pieces the
  // caller has taken are counted as finished.
  void fail(Operation& op, std::exception_ptr error, std::size_t held = 1);
  // Takes the next piece of the operation at the head of the queue. Returns false when there is
  // none, or when the next one needs a bounce chunk and `bounce_ok` is false.
  bool take_piece(OperationPtr& op, Piece& piece, bool bounce_ok, bool wait_for_work,
                  std::size_t per_op_limit, std::size_t taken_from_op);
  void worker_main(unsigned index, std::promise<void> ready);
  void run_blocking(const OperationPtr& op);
  Ticket register_async(const OperationPtr& op);
  // The operation behind `ticket`; with `collect` a wait takes it: it moves from the table to
  // `collecting` until the wait calls end_collect.
  OperationPtr find_ticket(Ticket ticket, bool collect);
  void end_collect(const std::vector<OperationPtr>& ops);

  Options options;
  EngineKind engine_kind;
  std::string engine_reason;

  std::mutex queue_mutex;
  std::condition_variable queue_cv;
  std::deque<OperationPtr> queue;
  bool stopping = false;
  // Set once, when a worker thread stops on an exception that escaped its loop: every operation
  // from then on fails with it. Guarded by queue_mutex.
  std::exception_ptr worker_error;

  mutable std::mutex tickets_mutex;
  std::map<Ticket, OperationPtr> tickets;
  // Operations a wait has taken from `tickets` and is waiting for: a concurrent wait() must still
  // wait for them (see the rule in handle.hpp). Guarded by tickets_mutex.
  std::map<const Operation*, OperationPtr> collecting;
  Ticket next_ticket = 1;

  std::mutex live_mutex;
  std::condition_variable live_cv;
  std::size_t live_ops = 0;  // queued or running, blocking or not: the destructor waits for them

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
  for (unsigned i = 0; i < count && !first; ++i) {
    try {
      auto ready = std::make_shared<std::promise<void>>();
      std::future<void> f = ready->get_future();
      workers.push_back(
          detail::start_worker_thread([this, i, ready] { worker_main(i, std::move(*ready)); }));
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
    {
      std::lock_guard lock(queue_mutex);
      stopping = true;
    }
    queue_cv.notify_all();
    for (auto& t : workers) t.join();
    std::rethrow_exception(first);
  }
}

Handle::Impl::~Impl() {
  {
    std::unique_lock lock(live_mutex);
    live_cv.wait(lock, [&] { return live_ops == 0; });
  }
  {
    std::lock_guard lock(queue_mutex);
    stopping = true;
  }
  queue_cv.notify_all();
  for (auto& t : workers) t.join();
}

namespace {

// Access mode without O_DIRECT for a descriptor we open ourselves.
int open_flags(Direction dir) { return dir == Direction::Read ? O_RDONLY : O_WRONLY | O_CREAT; }

std::string fd_name(int fd) {
  char target[512];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return fmt::format("fd {}", fd);
  return fmt::format("fd {} ({})", fd, std::string_view(target, static_cast<std::size_t>(n)));
}

// Checks what the descriptor refers to: directories are refused, and reads past the end of a
// regular file or a block device are refused up front with its size.
void check_target(const Operation& op, int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw_io_error(IoOp::Stat, op.path, op.offset, op.length, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    throw IsADirectory(op.direction == Direction::Read ? IoOp::Read : IoOp::Write, op.path,
                       op.offset, op.length, EISDIR, "the path is a directory, not a file");
  }
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
    // Pipes, sockets, character devices and anonymous inodes (an io_uring ring, an eventfd) have
    // no file offsets; a read from some of them would never complete.
    throw InvalidArgument(fmt::format("{}: not a regular file or block device (mode {:o})", op.path,
                                      st.st_mode & S_IFMT));
  }
  if (op.direction == Direction::Read) {
    const std::int64_t size = detail::file_size(fd, st);
    if (size < 0) {
      throw_io_error(IoOp::Stat, op.path, op.offset, op.length, static_cast<int>(-size),
                     "the size of the block device (BLKGETSIZE64)");
    }
    if (op.end() > static_cast<std::uint64_t>(size)) {
      throw ShortFile(IoOp::Read, op.path, op.offset, op.length, static_cast<std::uint64_t>(size));
    }
  }
}

// The error of a read of `op` that got end of file at byte `at` of the file: the file ended
// inside the request while it was being read. `fd` is a descriptor of the file.
std::exception_ptr ended_during_read(const Operation& op, int fd, std::uint64_t at) {
  const std::int64_t size = detail::file_size(fd);
  try {
    throw ShortFile::ended_during_read(op.path, op.offset, op.length, at,
                                       size >= 0 ? static_cast<std::uint64_t>(size) : at);
  } catch (...) {
    return std::current_exception();
  }
}

// Opens `path` for `op` as the options ask: an O_DIRECT descriptor where allowed and supported,
// and a buffered one for the unaligned edges (or for everything without direct I/O).
void open_path(Operation& op, const std::string& path, DirectIo direct) {
  const int flags = open_flags(op.direction);
  bool direct_refused = false;
  if (direct != DirectIo::Off) {
    const int fd = detail::open_file(path, flags | O_DIRECT);
    if (fd >= 0) {
      op.owned_direct = detail::FileDescriptor(fd);
    } else if (fd == -EINVAL) {
      direct_refused = true;
    } else {
      throw_io_error(IoOp::Open, path, op.offset, op.length, -fd);
    }
  }
  const int fd = detail::open_file(path, flags);
  if (fd < 0) throw_io_error(IoOp::Open, path, op.offset, op.length, -fd);
  op.owned_buffered = detail::FileDescriptor(fd);
  op.buffered_fd = fd;
  check_target(op, fd);
  if (direct_refused) {
    if (direct == DirectIo::On) {
      throw IoError(IoOp::Open, path, op.offset, op.length, EINVAL,
                    "the file system refuses O_DIRECT and direct=on was requested");
    }
    warn(fmt::format("O_DIRECT is not supported for '{}'; using buffered I/O", path), "no-direct");
  }
  if (op.owned_direct) op.direct_fd = op.owned_direct.get();
}

// For a caller's descriptor: use it as it is, and open a second descriptor to the same file
// through /proc/self/fd for whichever of direct / buffered access the caller's one lacks.
void adopt_fd(Operation& op, int fd, DirectIo direct) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) {
    throw_io_error(IoOp::Stat, op.path, op.offset, op.length, errno,
                   "the file descriptor is not open");
  }
  check_target(op, fd);
  if ((fl & O_APPEND) != 0 && op.direction == Direction::Write) {
    // pwrite on an O_APPEND descriptor ignores the offset and appends: refuse rather than write
    // the data somewhere other than where it was asked to go.
    throw InvalidArgument(fmt::format(
        "{}: the descriptor was opened with O_APPEND, which ignores write offsets; open it "
        "without O_APPEND",
        op.path));
  }
  const int access = fl & O_ACCMODE;
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  if ((fl & O_DIRECT) != 0) {
    op.direct_fd = fd;
    const int other = detail::open_file(proc, access);
    if (other >= 0) {
      op.owned_buffered = detail::FileDescriptor(other);
      op.buffered_fd = other;
    }
    return;
  }
  op.buffered_fd = fd;
  if (direct == DirectIo::Off) return;
  const int other = detail::open_file(proc, access | O_DIRECT);
  if (other >= 0) {
    op.owned_direct = detail::FileDescriptor(other);
    op.direct_fd = other;
  } else if (direct == DirectIo::On) {
    throw_io_error(IoOp::Open, op.path, op.offset, op.length, -other,
                   "could not reopen the descriptor with O_DIRECT and direct=on was requested");
  }
}

// The size of a worker's bounce chunks: one piece of block_size each.
std::size_t bounce_chunk_size(std::size_t block_size) { return round_up(block_size, 4096); }

void plan(Operation& op, std::size_t block_size, DirectIo direct) {
  op.head_end = op.offset;
  op.tail_begin = op.end();
  op.piece_size = block_size;
  if (op.direct_fd >= 0) {
    const DirectIoInfo dio = detail::direct_io_info(op.direct_fd);
    if (!dio.supported) {
      op.direct_fd = -1;
    } else {
      // Edges go through the page cache, so they must not share a page or a file-system block
      // with the direct middle: a buffered write of a partial page reads, modifies and later
      // writes back the whole page (or block), which would clobber direct-written bytes beside
      // it. So the split is at the largest of the direct-I/O alignment, the page and st_blksize.
      struct stat st {};
      const std::uint64_t blksize = ::fstat(op.direct_fd, &st) == 0 && st.st_blksize > 0
                                        ? static_cast<std::uint64_t>(st.st_blksize)
                                        : 0;
      const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
      const std::uint64_t a = std::max({std::uint64_t{dio.offset_align}, page, blksize});
      op.mem_align = std::max<std::uint32_t>(dio.mem_align, 1);
      op.offset_align = static_cast<std::uint32_t>(a);
      op.head_end = std::min(round_up(op.offset, a), op.end());
      op.tail_begin = std::max(round_down(op.end(), a), op.head_end);
      op.piece_size =
          static_cast<std::size_t>(std::max<std::uint64_t>(a, round_down(block_size, a)));
      // A bounce chunk holds block_size bytes. Where the split granularity is larger (a file
      // system with an st_blksize above block_size, e.g. NFS or a striped XFS), a direct piece or
      // a device-memory edge could be longer than its chunk; such an operation, if any of it is
      // bounced, goes through the page cache instead, where pieces are block_size long.
      const auto middle = reinterpret_cast<std::uintptr_t>(op.buf + (op.head_end - op.offset));
      const bool bounced = op.memory == MemoryKind::Device || middle % op.mem_align != 0;
      if (bounced && a > bounce_chunk_size(block_size)) {
        if (direct == DirectIo::On) {
          throw InvalidArgument(fmt::format(
              "{}: its file system splits direct I/O at {} bytes, more than the block size {} "
              "that bounce buffers hold, and direct=on forbids buffered I/O for this unaligned "
              "or device-memory transfer: raise block_size to at least {}",
              op.path, a, block_size, a));
        }
        warn(fmt::format("{}: its file system splits direct I/O at {} bytes, more than the block "
                         "size {} that bounce buffers hold; this unaligned or device-memory "
                         "transfer uses buffered I/O (raise block_size to at least {} for direct "
                         "I/O)",
                         op.path, a, block_size, a),
             "bounce-split");
        op.direct_fd = -1;
      }
      if ((op.has_head() || op.tail_begin < op.end()) && op.buffered_fd < 0) {
        throw InvalidArgument(fmt::format(
            "{}: offset {} and length {} are not aligned to {} bytes, and no buffered descriptor "
            "could be opened for the unaligned edges (is /proc mounted?)",
            op.path, op.offset, op.length, a));
      }
    }
  }
  if (op.direct_fd < 0) {  // everything buffered: no edges
    op.head_end = op.offset;
    op.tail_begin = op.end();
  }
  op.piece_count =
      (op.has_head() ? 1 : 0) + op.middle_pieces() + (op.tail_begin < op.end() ? 1 : 0);
}

}  // namespace

OperationPtr Handle::Impl::prepare(Direction dir, std::byte* buf, std::size_t length,
                                   const std::string* path, int fd, std::uint64_t offset,
                                   const WriteOptions& wopts) {
  // A handle whose worker died runs nothing more (see worker_main).
  if (std::exception_ptr dead = worker_failure()) std::rethrow_exception(dead);
  auto op = std::make_shared<Operation>();
  op->direction = dir;
  op->path = path != nullptr ? *path : fd_name(fd);
  op->buf = buf;
  op->offset = offset;
  op->length = length;
  op->write_options = wopts;
  if (buf == nullptr && length > 0) {
    throw InvalidArgument(fmt::format("{}: buffer is null but length is {}", op->path, length));
  }
  if (offset > std::numeric_limits<std::uint64_t>::max() - length ||
      offset + length > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
    throw InvalidArgument(fmt::format("{}: offset {} + length {} is past the largest file offset",
                                      op->path, offset, length));
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
          op->path, static_cast<const void*>(buf)));
    }
    op->device = *device;
  } else {
    op->memory = MemoryKind::Host;
  }
  if (path != nullptr) {
    if (path->empty()) throw InvalidArgument("file path is empty");
    if (const std::size_t nul = path->find('\0'); nul != std::string::npos) {
      // open() would stop at the NUL and use a different, shorter name.
      throw InvalidArgument(fmt::format("file path '{}' holds a NUL byte at position {}",
                                        path->substr(0, nul), nul));
    }
    open_path(*op, *path, options.direct);
  } else {
    if (fd < 0) throw InvalidArgument(fmt::format("file descriptor {} is negative", fd));
    adopt_fd(*op, fd, options.direct);
  }
  plan(*op, options.block_size, options.direct);
  if (op->memory == MemoryKind::Device) prepare_device(*op);
  op->remaining.store(op->piece_count);
  return op;
}

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
      op.cufile = cuda::CuFileHandle(op.direct_fd, op.path);
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
    op.head_end = op.offset;
    op.tail_begin = op.end();
    op.piece_size = options.block_size;
    op.piece_count = op.middle_pieces();
  }
}

void Handle::Impl::enqueue(const OperationPtr& op) {
  {
    std::lock_guard lock(live_mutex);
    ++live_ops;
  }
  if (op->piece_count == 0) {  // zero-length: only the write's finishing steps remain
    finish_piece(*op, 0);
    return;
  }
  std::exception_ptr refused;  // why the operation is not queued
  {
    std::lock_guard lock(queue_mutex);
    refused = worker_error;
    if (!refused) {
      try {
        queue.push_back(op);
      } catch (...) {  // std::bad_alloc
        refused = std::current_exception();
        try {
          refused = std::make_exception_ptr(
              MemoryError(fmt::format("{}: no memory to queue the operation", op->path), ENOMEM));
        } catch (...) {  // not even for the message: the std::bad_alloc is reported
        }
      }
    }
  }
  if (refused) {
    // A worker died after the operation was prepared, or it could not be queued: it never
    // starts, and finishing it here keeps the destructor from waiting for it.
    op->record_error(refused);
    finish_piece(*op, op->piece_count);
    return;
  }
  queue_cv.notify_all();
}

void Handle::Impl::wait_finished(Operation& op) {
  std::unique_lock lock(op.mutex);
  op.finished_cv.wait(lock, [&] { return op.finished; });
}

void Handle::Impl::fail(Operation& op, std::exception_ptr error, std::size_t held) {
  op.record_error(std::move(error));
  // Pieces nobody has taken yet will not run: count them as finished now.
  std::size_t skipped = 0;
  {
    std::lock_guard lock(queue_mutex);
    skipped = op.piece_count - op.next_piece;
    op.next_piece = op.piece_count;
  }
  if (skipped + held > 0) finish_piece(op, skipped + held);
}

void Handle::Impl::worker_died(const std::exception_ptr& error) {
  // One operation at a time, so that nothing is allocated here (the worker may be out of memory).
  // Pieces of these operations that other workers have taken finish there as usual; the rest are
  // skipped. An operation whose pieces are all taken already is left to its workers.
  for (bool first = true;; first = false) {
    OperationPtr op;
    bool untaken = false;
    {
      std::lock_guard lock(queue_mutex);
      if (first && !worker_error) worker_error = error;
      if (queue.empty()) return;
      op = std::move(queue.front());
      queue.pop_front();
      untaken = op->next_piece < op->piece_count;
    }
    if (untaken) fail(*op, error, 0);
  }
}

std::exception_ptr Handle::Impl::worker_failure() {
  std::lock_guard lock(queue_mutex);
  return worker_error;
}

void Handle::Impl::finish_piece(Operation& op, std::size_t count) {
  if (count > 0 && op.remaining.fetch_sub(count, std::memory_order_acq_rel) != count) return;
  // Last piece: the write's finishing steps, then release the descriptors and wake the waiter.
  if (!op.failed.load(std::memory_order_acquire) && op.direction == Direction::Write) {
    const int fd = op.buffered_fd >= 0 ? op.buffered_fd : op.direct_fd;
    if (op.write_options.truncate == Truncate::AtEnd &&
        ::ftruncate(fd, static_cast<off_t>(op.end())) != 0) {
      op.record_error(io_error_ptr(IoOp::Truncate, op.path, op.end(), 0, errno));
    } else if (op.write_options.durability == Durability::Data && ::fdatasync(fd) != 0) {
      op.record_error(io_error_ptr(IoOp::Sync, op.path, op.offset, op.length, errno));
    }
  }
  {
    std::lock_guard lock(op.mutex);
    op.cufile = cuda::CuFileHandle();  // deregistered before its descriptor closes
    op.owned_direct = detail::FileDescriptor();
    op.owned_buffered = detail::FileDescriptor();
    op.finished = true;
  }
  op.finished_cv.notify_all();
  {
    std::lock_guard lock(live_mutex);
    --live_ops;
  }
  live_cv.notify_all();
}

bool Handle::Impl::take_piece(OperationPtr& op, Piece& piece, bool bounce_ok, bool wait_for_work,
                              std::size_t per_op_limit, std::size_t taken_from_op) {
  std::unique_lock lock(queue_mutex);
  for (;;) {
    while (!queue.empty() && queue.front()->next_piece >= queue.front()->piece_count) {
      queue.pop_front();
    }
    if (!queue.empty() || stopping || !wait_for_work) break;
    queue_cv.wait(lock);
  }
  if (queue.empty()) return false;
  Operation& head = *queue.front();
  // Leave a share of a multi-piece operation to the other workers.
  if (op.get() == &head && taken_from_op >= per_op_limit) return false;
  const Piece p = head.piece(head.next_piece);
  if (!bounce_ok && head.needs_bounce(p)) return false;
  ++head.next_piece;
  op = queue.front();
  piece = p;
  return true;
}

namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

// Whether the rest of a partly transferred direct piece can still go through O_DIRECT.
bool still_aligned(const Operation& op, const Slot& s) {
  const std::byte* base = s.bounce != nullptr ? s.bounce : s.user;
  const auto addr = reinterpret_cast<std::uintptr_t>(base + s.done);
  return (s.file_offset + s.done) % op.offset_align == 0 &&
         (s.length - s.done) % op.offset_align == 0 && addr % op.mem_align == 0;
}

}  // namespace

namespace {

// A worker's CUDA state, made when it first meets device memory. Owned by the worker thread;
// nothing here is shared. Declared after the worker's bounce pool so that it is destroyed first:
// the registrations of the pool's slabs must go before the slabs do.
class DeviceLane {
 public:
  DeviceLane(std::shared_ptr<cuda::DeviceOps> ops, unsigned slots, detail::BouncePool& pool)
      : ops_(std::move(ops)), events_(slots), event_device_(slots, -1) {
    pool.on_slab([this](std::byte* slab, std::size_t bytes) {
      int rc = cuda::kSuccess;
      cuda::Registration reg(*ops_, slab, bytes, rc);
      if (rc == cuda::kSuccess) {
        registrations_.push_back(std::move(reg));
      } else {
        // Copies from pageable memory still work (the driver stages them), only slower.
        warn(fmt::format("cuMemHostRegister of a {}-byte bounce slab failed ({}: {}); device "
                         "copies use pageable memory and are slower",
                         bytes, ops_->error_name(rc), ops_->error_string(rc)),
             "host-register");
      }
    });
  }
  ~DeviceLane() {
    // Nothing is in flight when a worker exits, but a stream must be idle before the memory its
    // copies touched is unregistered.
    for (auto& e : events_) {
      if (e.get() != nullptr) ops_->event_synchronize(e.get());
    }
  }
  DeviceLane(const DeviceLane&) = delete;
  DeviceLane& operator=(const DeviceLane&) = delete;

  cuda::DeviceOps& ops() { return *ops_; }
  bool serves(const std::shared_ptr<cuda::DeviceOps>& ops) const { return ops == ops_; }

  // Makes `device` current on this thread and returns its stream. Throws GpuError.
  void* stream_for(int device) {
    if (device != current_) {
      const int rc = ops_->make_current(device);
      if (rc != cuda::kSuccess) cuda::throw_gpu_error(*ops_, "cuCtxSetCurrent", rc);
      current_ = device;
    }
    auto it = streams_.find(device);
    if (it == streams_.end()) it = streams_.emplace(device, cuda::Stream(*ops_)).first;
    return it->second.get();
  }
  // The event of slot `tag`, created in `device`'s context (current). Throws GpuError.
  void* event_for(unsigned tag, int device) {
    if (event_device_[tag] != device) {
      events_[tag] = cuda::Event(*ops_);
      event_device_[tag] = device;
    }
    return events_[tag].get();
  }
  void* event(unsigned tag) const { return events_[tag].get(); }

 private:
  std::shared_ptr<cuda::DeviceOps> ops_;
  int current_ = -1;
  std::map<int, cuda::Stream> streams_;
  std::vector<cuda::Event> events_;
  std::vector<int> event_device_;
  std::vector<cuda::Registration> registrations_;
};

const char* copy_api(Phase phase) {
  return phase == Phase::ToDevice ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync";
}

// Moves one GDS piece with cuFile on this thread; short transfers are resumed. Returns the error
// of the piece, or null.
std::exception_ptr run_gds_piece(Operation& op, const Piece& p) {
  const bool is_read = op.direction == Direction::Read;
  const IoOp io_op = is_read ? IoOp::Read : IoOp::Write;
  std::byte* user = op.buf + (p.file_offset - op.offset);
  std::size_t done = 0;
  detail::RetryCounter retries(detail::kTransferRetries);
  try {
    const int rc = op.device_ops->make_current(op.device);
    if (rc != cuda::kSuccess) cuda::throw_gpu_error(*op.device_ops, "cuCtxSetCurrent", rc);
    while (done < p.length) {
      const std::uint64_t at = p.file_offset + done;
      const std::int64_t n =
          cuda::gds_transfer(op.cufile, is_read, user + done, p.length - done, at);
      if (n < 0) {
        const int err = static_cast<int>(-n);
        if (retries.retry(err)) continue;
        if (err > cuda::abi::kCuFileOpBaseErr) {
          throw GpuError(is_read ? "cuFileRead" : "cuFileWrite", err, cuda::cufile_error_name(err),
                         cuda::cufile_error_text(err), op.path, at, p.length - done);
        }
        throw_io_error(io_op, op.path, at, p.length - done, err, "cuFile");
      }
      if (n == 0) {
        if (is_read) std::rethrow_exception(ended_during_read(op, op.direct_fd, at));
        throw_io_error(io_op, op.path, at, p.length - done, EIO, "cuFileWrite transferred 0 bytes");
      }
      done += static_cast<std::size_t>(n);
      retries.progress();
    }
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// What the kernel or a device copy may use while a worker runs: its engine (an io_uring ring or
// aio context with requests in flight), the bounce chunks those requests and copies point into,
// and the CUDA state of those copies. Owned by its worker thread; kept on the heap so that a
// worker that stops on an exception it cannot prove harmless can abandon it (see abandon()).
struct WorkerMemory {
  WorkerMemory(std::unique_ptr<engine::Engine> e, std::size_t chunk, std::size_t count)
      : engine(std::move(e)), pool(chunk, count) {}
  std::unique_ptr<engine::Engine> engine;
  detail::BouncePool pool;
  std::unique_ptr<DeviceLane> lane;  // after `pool`: destroyed before it
};

// Keeps `memory` for the rest of the process, never freeing it: the kernel or a device may still
// write into it (see worker_main). The list keeps it reachable, so leak checkers stay quiet.
// Thread-safe.
void abandon(std::unique_ptr<WorkerMemory> memory) noexcept {
  static std::mutex mutex;
  try {
    std::lock_guard lock(mutex);
    static auto* kept = new std::vector<std::unique_ptr<WorkerMemory>>();
    kept->push_back(std::move(memory));  // on a throw, `memory` is left as it was
  } catch (...) {
    (void)memory.release();  // no memory to list it: leaked all the same
  }
}

// The error a worker reports when `cause` escaped its loop: MemoryError for std::bad_alloc, an
// nvio::Error naming the exception otherwise. `fallback` when there is no memory to say more.
std::exception_ptr worker_death_error(unsigned index, const std::exception_ptr& cause,
                                      const std::exception_ptr& fallback) noexcept {
  try {
    std::string what = "an exception of unknown type";
    bool oom = false;
    try {
      std::rethrow_exception(cause);
    } catch (const std::bad_alloc& e) {
      what = fmt::format("out of memory ({})", e.what());
      oom = true;
    } catch (const std::exception& e) {
      int status = 0;
      char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
      what =
          fmt::format("{}: {}", status == 0 && name != nullptr ? name : typeid(e).name(), e.what());
      std::free(name);
    } catch (...) {
    }
    const std::string message = fmt::format(
        "worker thread {} of this handle stopped on an unexpected exception, {}; the operations "
        "it held failed and the handle runs no more operations: make a new one",
        index + 1, what);
    if (oom) return std::make_exception_ptr(MemoryError(message, ENOMEM));
    return std::make_exception_ptr(Error(message));
  } catch (...) {
    return fallback;
  }
}

}  // namespace

void Handle::Impl::worker_main(unsigned index, std::promise<void> ready) {
  const unsigned qd = options.queue_depth;
  std::unique_ptr<WorkerMemory> memory;
  std::vector<Slot> slots;
  std::vector<unsigned> free_slots;
  std::vector<engine::Request> batch;
  std::vector<engine::Completion> completions;
  std::exception_ptr no_memory_error;  // made up front: an exception's message needs memory
  // Everything the loop needs is made before the handle's constructor returns, so that a failure
  // here (no engine, no memory) is that constructor's error.
  try {
    // Bounce chunks cover one piece each; 64 MiB of them per worker keeps the disk busy without
    // pinning queue_depth x block_size of memory.
    const std::size_t chunk = bounce_chunk_size(options.block_size);
    const std::size_t bounce_count =
        std::min<std::size_t>(qd, std::max<std::size_t>(2, (std::size_t{64} << 20) / chunk));
    memory =
        std::make_unique<WorkerMemory>(engine::make_engine(engine_kind, qd), chunk, bounce_count);
    slots.resize(qd);
    free_slots.reserve(qd);  // never more than qd in it: release_slot does not allocate
    for (unsigned i = qd; i > 0; --i) free_slots.push_back(i - 1);
    batch.reserve(qd);  // never more than qd requests wait: pushing to it does not allocate
    completions.resize(qd);
    no_memory_error = std::make_exception_ptr(MemoryError(
        fmt::format("worker thread {} of this handle stopped: out of memory (std::bad_alloc); "
                    "the operations it held failed and the handle runs no more operations: "
                    "make a new one",
                    index + 1),
        ENOMEM));
  } catch (const std::bad_alloc&) {
    try {
      ready.set_exception(std::make_exception_ptr(
          MemoryError("no memory for a worker thread's queue and bounce buffers", ENOMEM)));
    } catch (...) {  // not even for the message: the std::bad_alloc is reported
      ready.set_exception(std::current_exception());
    }
    return;
  } catch (...) {
    ready.set_exception(std::current_exception());
    return;
  }
  ready.set_value();

  std::unique_ptr<engine::Engine>& eng = memory->engine;
  detail::BouncePool& pool = memory->pool;
  std::unique_ptr<DeviceLane>& lane = memory->lane;
  detail::UserCopier copier;  // bounce copies to and from the caller's memory
  std::size_t inflight = 0;
  std::deque<unsigned> copying;  // slots waiting for a copy's event, oldest first
  bool in_engine = false;        // inside a call of `eng` (a throw leaves the engine in doubt)

  auto request_for = [](const Slot& s, unsigned tag) {
    std::byte* base = s.bounce != nullptr ? s.bounce : s.user;
    return engine::Request{
        s.fd, s.op->direction, base + s.done, s.length - s.done, s.file_offset + s.done, tag};
  };
  auto release_slot = [&](unsigned tag) {
    Slot& s = slots[tag];
    if (s.phase != Phase::Disk) {
      // A copy may still be using the chunk: it must finish before the chunk is reused.
      lane->ops().event_synchronize(lane->event(tag));
      copying.erase(std::find(copying.begin(), copying.end(), tag));
    }
    if (s.bounce != nullptr) pool.release(s.bounce);
    s = Slot{};
    free_slots.push_back(tag);
    --inflight;
  };
  // Copies slot `tag`'s bytes between its chunk and the caller's host memory (out of the chunk
  // after a read, into it before a write). Memory the caller cannot access fails the operation
  // with EFAULT, as the kernel does with such a buffer: the slot is released and false returned.
  auto copy_host = [&](unsigned tag) {
    Slot& s = slots[tag];
    const bool read = s.op->direction == Direction::Read;
    const detail::UserCopyResult r = read ? copier.to_user(s.user, s.bounce, s.length)
                                          : copier.from_user(s.bounce, s.user, s.length);
    if (r.error == 0) return true;
    OperationPtr op = s.op;
    const std::uint64_t at = s.file_offset + r.fault_at;
    const std::size_t left = s.length - r.fault_at;
    const void* where = s.user + r.fault_at;
    // Made before the slot is released: if it throws, the slot still holds the operation.
    std::exception_ptr error = io_error_ptr(
        read ? IoOp::Read : IoOp::Write, op->path, at, left, r.error,
        fmt::format("copying {} the caller's buffer at {} ({})", read ? "into" : "out of", where,
                    read ? "is it writable?" : "is it readable?"));
    release_slot(tag);
    fail(*op, std::move(error));
    return false;
  };
  // Starts the copy of slot `tag` between its chunk and the device (ToHost before a write,
  // ToDevice after a read) and records its event. Throws GpuError.
  auto start_copy = [&](unsigned tag, Phase phase) {
    Slot& s = slots[tag];
    Operation& op = *s.op;
    void* stream = lane->stream_for(op.device);
    void* event = lane->event_for(tag, op.device);
    cuda::DeviceOps& ops = lane->ops();
    const int rc = phase == Phase::ToDevice
                       ? ops.copy_to_device_async(s.user, s.bounce, s.length, stream)
                       : ops.copy_to_host_async(s.bounce, s.user, s.length, stream);
    if (rc != cuda::kSuccess) {
      cuda::throw_gpu_error(ops, copy_api(phase), rc, op.path, s.file_offset, s.length);
    }
    const int rec = ops.event_record(event, stream);
    if (rec != cuda::kSuccess) {
      cuda::throw_gpu_error(ops, "cuEventRecord", rec, op.path, s.file_offset, s.length);
    }
    s.phase = phase;
    copying.push_back(tag);
  };
  // Hands `batch` to the engine as the options say. A request the kernel refuses fails its own
  // operation only; when the kernel is out of resources the rest wait in `batch` for a reap.
  auto submit_batch = [&]() {
    std::size_t pos = 0;
    while (pos < batch.size()) {
      const std::size_t n = options.single_submit ? 1 : batch.size() - pos;
      in_engine = true;
      const int rc = eng->submit(std::span(batch).subspan(pos, n));
      in_engine = false;
      if (rc > 0) {
        for (std::size_t i = pos; i < pos + static_cast<std::size_t>(rc); ++i) {
          slots[static_cast<unsigned>(batch[i].tag)].on_disk = true;
        }
        pos += static_cast<std::size_t>(rc);
        continue;
      }
      const std::size_t submitted = inflight - copying.size() - (batch.size() - pos);
      if ((rc == 0 || rc == -EAGAIN) && submitted > 0) break;
      const int err = rc < 0 ? -rc : EAGAIN;
      const auto tag = static_cast<unsigned>(batch[pos].tag);
      OperationPtr op = slots[tag].op;
      const std::uint64_t at = batch[pos].offset;
      const std::size_t len = batch[pos].length;
      std::exception_ptr error = io_error_ptr(IoOp::Submit, op->path, at, len, err,
                                              fmt::format("{} engine", to_string(engine_kind)));
      release_slot(tag);
      fail(*op, std::move(error));
      ++pos;
    }
    batch.erase(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(pos));
  };
  // Processes one completion: resumes short transfers, copies bounce data out, reports errors.
  auto complete = [&](const engine::Completion& c) {
    const auto tag = static_cast<unsigned>(c.tag);
    Slot& s = slots[tag];
    // After an engine failure every slot was released; a late completion for one is dropped.
    if (!s.op) return;
    s.on_disk = false;
    OperationPtr op = s.op;
    const IoOp io_op = op->direction == Direction::Read ? IoOp::Read : IoOp::Write;
    if (c.result < 0) {
      const int err = static_cast<int>(-c.result);
      if (s.retries.retry(err)) {
        batch.push_back(request_for(s, tag));
        return;
      }
      // The error is made while the slot still holds the piece (its `direct` flag is read here,
      // and a throw leaves the piece held).
      std::exception_ptr error =
          io_error_ptr(io_op, op->path, s.file_offset + s.done, s.length - s.done, err,
                       s.direct ? "O_DIRECT" : std::string{});
      release_slot(tag);
      fail(*op, std::move(error));
      return;
    }
    if (c.result == 0) {
      const std::uint64_t at = s.file_offset + s.done;
      std::exception_ptr error =
          io_op == IoOp::Read
              ? ended_during_read(*op, op->buffered_fd >= 0 ? op->buffered_fd : op->direct_fd, at)
              : io_error_ptr(io_op, op->path, at, s.length - s.done, EIO,
                             "write transferred 0 bytes");
      release_slot(tag);
      fail(*op, std::move(error));
      return;
    }
    s.done += static_cast<std::size_t>(c.result);
    s.retries.progress();
    if (s.done < s.length) {
      // Short transfer: resume the rest. If what is left is no longer aligned for O_DIRECT, it
      // goes through the buffered descriptor (reading into / writing from the same memory).
      if (s.direct && op->buffered_fd >= 0 && !still_aligned(*op, s)) {
        s.fd = op->buffered_fd;
        s.direct = false;
      }
      batch.push_back(request_for(s, tag));
      return;
    }
    if (s.bounce != nullptr && io_op == IoOp::Read) {
      if (op->memory == MemoryKind::Device) {
        // The slot stays in flight until the copy to the device reports done.
        try {
          start_copy(tag, Phase::ToDevice);
        } catch (...) {
          release_slot(tag);
          fail(*op, std::current_exception());
        }
        return;
      }
      if (!copy_host(tag)) return;
    }
    release_slot(tag);
    finish_piece(*op, 1);
  };
  // Checks the copies in flight, oldest first; returns how many finished (or failed).
  auto poll_copies = [&](bool block_on_oldest) {
    std::size_t progressed = 0;
    for (std::size_t i = 0; i < copying.size();) {
      const unsigned tag = copying[i];
      Slot& s = slots[tag];
      const bool first = progressed == 0 && i == 0;
      const int rc = block_on_oldest && first ? lane->ops().event_synchronize(lane->event(tag))
                                              : lane->ops().event_query(lane->event(tag));
      if (rc == cuda::kNotReady) {
        ++i;
        continue;
      }
      ++progressed;
      copying.erase(copying.begin() + static_cast<std::ptrdiff_t>(i));
      const Phase phase = s.phase;
      s.phase = Phase::Disk;
      OperationPtr op = s.op;
      if (rc != cuda::kSuccess) {
        const std::uint64_t at = s.file_offset;
        const std::size_t len = s.length;
        release_slot(tag);
        try {
          cuda::throw_gpu_error(lane->ops(), copy_api(phase), rc, op->path, at, len);
        } catch (...) {
          fail(*op, std::current_exception());
        }
        continue;
      }
      if (phase == Phase::ToHost) {
        batch.push_back(request_for(s, tag));  // the chunk holds the data: write it
      } else {
        release_slot(tag);
        finish_piece(*op, 1);
      }
    }
    return progressed;
  };

  try {
    for (;;) {
      // Fill: take pieces while there is room (without overlap_events, only once the previous
      // batch has fully completed).
      if (options.overlap_events || inflight == 0) {
        OperationPtr last_op;
        std::size_t taken_from_op = 0;
        while (!free_slots.empty()) {
          OperationPtr op = last_op;
          Piece piece{};
          const bool idle = inflight == 0 && batch.empty();
          const std::size_t limit =
              op ? std::max<std::size_t>(1, ceil_div(op->piece_count, options.intra_op_parallelism))
                 : qd;
          if (!take_piece(op, piece, pool.available(), idle, limit, taken_from_op)) break;
          taken_from_op = (op == last_op) ? taken_from_op + 1 : 1;
          last_op = op;
          if (op->failed.load(std::memory_order_acquire)) {
            finish_piece(*op, 1);
            continue;
          }
          if (op->transport == cuda::Transport::Gds) {
            if (std::exception_ptr e = run_gds_piece(*op, piece)) {
              fail(*op, e);
            } else {
              finish_piece(*op, 1);
            }
            continue;
          }
          const bool device = op->memory == MemoryKind::Device;
          if (device && (!lane || !lane->serves(op->device_ops))) {
            try {
              lane.reset();
              pool.on_slab({});
              lane = std::make_unique<DeviceLane>(op->device_ops, qd, pool);
            } catch (...) {
              lane.reset();
              fail(*op, std::current_exception());
              continue;
            }
          }
          const unsigned tag = free_slots.back();
          free_slots.pop_back();
          ++inflight;
          Slot& s = slots[tag];
          s.op = op;
          s.file_offset = piece.file_offset;
          s.length = piece.length;
          s.direct = piece.direct;
          s.fd = piece.direct ? op->direct_fd : op->buffered_fd;
          s.user = op->buf + (piece.file_offset - op->offset);
          if (op->needs_bounce(piece)) {
            try {
              s.bounce = pool.acquire();
            } catch (...) {
              release_slot(tag);
              fail(*op, std::current_exception());
              continue;
            }
            if (device && op->direction == Direction::Write) {
              try {
                start_copy(tag, Phase::ToHost);  // submitted to the disk once the copy is done
              } catch (...) {
                release_slot(tag);
                fail(*op, std::current_exception());
              }
              continue;
            }
            if (op->direction == Direction::Write && !copy_host(tag)) continue;
          }
          batch.push_back(request_for(s, tag));
        }
        if (!batch.empty()) submit_batch();
      }
      std::size_t copies_done = copying.empty() ? 0 : poll_copies(false);
      if (!batch.empty()) submit_batch();
      if (inflight == 0) {
        std::lock_guard lock(queue_mutex);
        if (stopping && queue.empty()) return;
        continue;
      }
      // Requests still waiting in `batch` (kernel out of resources) are not in flight yet.
      const std::size_t on_disk = inflight - copying.size() - batch.size();
      int got = 0;
      if (!copying.empty()) {
        // Copies and disk I/O are both pending: never block in the engine while a copy may finish
        // (its slot would wait needlessly); block on the oldest copy only when nothing moved.
        in_engine = on_disk > 0;
        got = on_disk > 0 ? eng->reap(completions, 0) : 0;
        in_engine = false;
        if (got == 0 && copies_done == 0) poll_copies(true);
      } else {
        // Reap: at least one completion (overlap_events), or the whole batch.
        in_engine = true;
        got = eng->reap(completions, options.overlap_events ? 1 : on_disk);
        in_engine = false;
      }
      if (got < 0) {
        // The engine itself failed: every piece in flight on it is lost.
        batch.clear();
        for (unsigned tag = 0; tag < qd; ++tag) {
          if (!slots[tag].op) continue;
          OperationPtr op = slots[tag].op;
          const std::uint64_t at = slots[tag].file_offset;
          const std::size_t len = slots[tag].length;
          std::exception_ptr error = io_error_ptr(IoOp::Wait, op->path, at, len, -got,
                                                  fmt::format("{} engine", to_string(engine_kind)));
          release_slot(tag);
          fail(*op, std::move(error));
        }
        continue;
      }
      for (int i = 0; i < got; ++i) complete(completions[static_cast<std::size_t>(i)]);
      if (!batch.empty()) submit_batch();  // resumed short transfers and retries
    }
  } catch (...) {
    // An exception escaped the loop (std::bad_alloc while queueing a request, say). Ending the
    // thread with it would end the process, so the worker stops here instead: the handle takes
    // no more operations, the queued ones fail, and every operation this worker holds fails
    // once nothing of its pieces is in use any more. Nothing below throws or waits for ever.
    const std::exception_ptr error =
        worker_death_error(index, std::current_exception(), no_memory_error);
    worker_died(error);
    // The kernel may still be transferring pieces handed to the engine (into or out of the
    // caller's memory or a bounce chunk), and a device copy may still use a chunk: wait for them,
    // so that neither the caller's buffers nor the chunks are released while in use. An engine
    // that threw is in an unknown state (it may have taken requests or consumed completions it
    // did not report) and is not called again: waiting on it could hang, so then the memory is
    // abandoned, never freed. In that case only, the kernel may still write into the caller's
    // buffer of a piece after its operation reports the failure: that cannot be waited for
    // without a working engine, and a waiter must not hang.
    bool idle = !in_engine;
    try {
      for (const unsigned tag : copying) {
        if (!lane || lane->ops().event_synchronize(lane->event(tag)) != cuda::kSuccess) {
          idle = false;
        }
      }
      std::size_t on_disk = 0;
      for (const Slot& s : slots) on_disk += s.on_disk ? 1 : 0;
      while (idle && on_disk > 0) {
        const int got = detail::retry_interrupted([&] { return eng->reap(completions, 1); });
        if (got < 0) {
          idle = false;
          break;
        }
        for (int i = 0; i < got; ++i) {
          const std::uint64_t tag = completions[static_cast<std::size_t>(i)].tag;
          if (tag < slots.size() && slots[tag].on_disk) {
            slots[tag].on_disk = false;
            --on_disk;
          }
        }
      }
    } catch (...) {
      idle = false;
    }
    for (Slot& s : slots) {
      if (!s.op) continue;
      const OperationPtr op = std::move(s.op);
      fail(*op, error);
    }
    if (!idle) abandon(std::move(memory));
  }
}

void Handle::Impl::run_blocking(const OperationPtr& op) {
  enqueue(op);
  wait_finished(*op);
  if (op->error) std::rethrow_exception(op->error);
}

Ticket Handle::Impl::register_async(const OperationPtr& op) {
  Ticket t;
  {
    std::lock_guard lock(tickets_mutex);
    t = next_ticket++;
    tickets.emplace(t, op);
  }
  enqueue(op);
  return t;
}

OperationPtr Handle::Impl::find_ticket(Ticket ticket, bool collect) {
  std::lock_guard lock(tickets_mutex);
  auto it = tickets.find(ticket);
  if (it == tickets.end()) {
    throw InvalidArgument(fmt::format("ticket {} is unknown or was already waited for", ticket));
  }
  OperationPtr op = it->second;
  if (collect) {
    tickets.erase(it);
    collecting.emplace(op.get(), op);
  }
  return op;
}

void Handle::Impl::end_collect(const std::vector<OperationPtr>& ops) {
  std::lock_guard lock(tickets_mutex);
  for (const OperationPtr& op : ops) collecting.erase(op.get());
}

namespace {

// Guards the swap of a handle's state in a forked child. A leaf: nothing else is taken under it
// (the fresh state, whose workers take other mutexes, is made outside it). Held across fork() so
// that a child never inherits it locked by a thread that does not exist there.
std::mutex g_fork_mutex;
std::mutex& fork_mutex() { return g_fork_mutex; }

void install_fork_handlers() {
  static const bool installed = (detail::hold_across_fork<fork_mutex>(), true);
  (void)installed;
}

}  // namespace

Handle::Impl& Handle::impl() const {
  if (owner_pid_.load(std::memory_order_acquire) == ::getpid()) return *impl_;
  return renew_after_fork();
}

Handle::Impl& Handle::renew_after_fork() const {
  const pid_t pid = ::getpid();
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
    : impl_(std::make_unique<Impl>(options)), owner_pid_(::getpid()) {
  install_fork_handlers();
}

Handle::~Handle() {
  // In a forked child that never used the handle, the state is the parent's (see impl()).
  if (owner_pid_.load(std::memory_order_acquire) != ::getpid()) (void)impl_.release();
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
  s.run_blocking(s.prepare(Direction::Read, static_cast<std::byte*>(buf), length, &path, -1, offset,
                           as_write_options(read_options)));
}

void Handle::write(const void* buf, std::size_t length, const std::string& path,
                   std::uint64_t offset, const WriteOptions& write_options) {
  // The engines take a non-const pointer for both directions; writes never modify the buffer.
  auto* bytes = static_cast<std::byte*>(const_cast<void*>(buf));
  Impl& s = impl();
  s.run_blocking(s.prepare(Direction::Write, bytes, length, &path, -1, offset, write_options));
}

void Handle::read(void* buf, std::size_t length, int fd, std::uint64_t offset,
                  const ReadOptions& read_options) {
  Impl& s = impl();
  s.run_blocking(s.prepare(Direction::Read, static_cast<std::byte*>(buf), length, nullptr, fd,
                           offset, as_write_options(read_options)));
}

void Handle::write(const void* buf, std::size_t length, int fd, std::uint64_t offset,
                   const WriteOptions& write_options) {
  auto* bytes = static_cast<std::byte*>(const_cast<void*>(buf));
  Impl& s = impl();
  s.run_blocking(s.prepare(Direction::Write, bytes, length, nullptr, fd, offset, write_options));
}

Ticket Handle::submit_read(void* buf, std::size_t length, const std::string& path,
                           std::uint64_t offset, const ReadOptions& read_options) {
  Impl& s = impl();
  return s.register_async(s.prepare(Direction::Read, static_cast<std::byte*>(buf), length, &path,
                                    -1, offset, as_write_options(read_options)));
}

Ticket Handle::submit_write(const void* buf, std::size_t length, const std::string& path,
                            std::uint64_t offset, const WriteOptions& write_options) {
  auto* bytes = static_cast<std::byte*>(const_cast<void*>(buf));
  Impl& s = impl();
  return s.register_async(
      s.prepare(Direction::Write, bytes, length, &path, -1, offset, write_options));
}

Ticket Handle::submit_read(void* buf, std::size_t length, int fd, std::uint64_t offset,
                           const ReadOptions& read_options) {
  Impl& s = impl();
  return s.register_async(s.prepare(Direction::Read, static_cast<std::byte*>(buf), length, nullptr,
                                    fd, offset, as_write_options(read_options)));
}

Ticket Handle::submit_write(const void* buf, std::size_t length, int fd, std::uint64_t offset,
                            const WriteOptions& write_options) {
  auto* bytes = static_cast<std::byte*>(const_cast<void*>(buf));
  Impl& s = impl();
  return s.register_async(
      s.prepare(Direction::Write, bytes, length, nullptr, fd, offset, write_options));
}

void Handle::wait(Ticket ticket) {
  Impl& s = impl();
  OperationPtr op = s.find_ticket(ticket, /*collect=*/true);
  s.wait_finished(*op);
  s.end_collect({op});
  if (op->error) std::rethrow_exception(op->error);
}

bool Handle::done(Ticket ticket) const {
  OperationPtr op = impl().find_ticket(ticket, /*collect=*/false);
  std::lock_guard lock(op->mutex);
  return op->finished;
}

std::size_t Handle::wait() {
  Impl& s = impl();
  std::vector<OperationPtr> mine;    // collected by this wait: counted here
  std::vector<OperationPtr> others;  // being collected by another thread's wait right now
  {
    std::lock_guard lock(s.tickets_mutex);
    for (const auto& [op, ptr] : s.collecting) others.push_back(ptr);
    for (auto& [ticket, op] : s.tickets) {
      s.collecting.emplace(op.get(), op);
      mine.push_back(std::move(op));
    }
    s.tickets.clear();
  }
  for (const OperationPtr& op : mine) s.wait_finished(*op);
  for (const OperationPtr& op : others) s.wait_finished(*op);
  s.end_collect(mine);
  // Every operation has been waited for; the first failure is the one reported, this wait's own
  // operations first.
  for (const auto* list : {&mine, &others}) {
    for (const OperationPtr& op : *list) {
      if (op->error) std::rethrow_exception(op->error);
    }
  }
  return mine.size();
}

std::size_t Handle::pending() const {
  Impl& s = impl();
  std::lock_guard lock(s.tickets_mutex);
  return s.tickets.size();
}

// These facts are fixed when the handle is made and are the same in a forked child, so they are
// read from whichever state is current without making a new one.
const Options& Handle::options() const noexcept { return impl_->options; }
EngineKind Handle::engine() const noexcept { return impl_->engine_kind; }
const std::string& Handle::engine_reason() const noexcept { return impl_->engine_reason; }

}  // namespace nvio
