// The tensor swapper (include/nvio/swapper.hpp): placement, the budget's waits, the directory's
// lock and index, snapshots. Memory comes from the SwapPool (swap_pool.hpp); all I/O goes through
// the swapper's own Handle as batches, whose tickets are collected by one thread at a time (the
// "collector", see progress()) so that any thread waiting for any operation makes progress.
#include "nvio/swapper.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/align.hpp"
#include "core/json_excerpt.hpp"
#include "core/posix.hpp"
#include "core/unique_name.hpp"
#include "jobs/replace_file.hpp"
#include "jobs/swap_pool.hpp"
#include "nvio/errors.hpp"
#include "nvio/handle.hpp"
#include "nvio/interrupt.hpp"
#include "nvio/warnings.hpp"

namespace nvio {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kLockName = "nvio-swap.lock";
constexpr const char* kIndexName = "nvio-swap.json";
constexpr const char* kIndexFormat = "nvio-swap";
constexpr const char* kSwapSuffix = ".swap";
constexpr const char* kSnapshotData = "data.swap";
constexpr std::uint64_t kNoFile = ~std::uint64_t{0};
constexpr std::uint64_t kPage = 4096;
// Removed files whose descriptors the handle may still keep (and so their disk space) before
// the swapper asks it to let go of all of them.
constexpr int kCloseFilesAfter = 16;
// Staging buffer sizes a snapshot tries, largest first, until the budget holds two of them; it
// takes up to kStagingSlots of that size where the budget has room at once.
constexpr std::array<std::size_t, 5> kStagingSizes{16u << 20, 4u << 20, 1u << 20, 128u << 10,
                                                   kPage};
constexpr std::size_t kStagingSlots = 4;
// The read-ahead window: at most this many names wait in the prefetch queue for room (the names
// a caller asks for past it are left to swap_in).
constexpr std::size_t kPrefetchQueueLimit = 4096;

// Small tensors pack at 16 bytes; from a page on they start on a page so that their middle goes
// through O_DIRECT without a bounce copy.
std::uint64_t alignment_for(std::uint64_t size) { return size >= kPage ? kPage : 16; }

std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

// A node holding `value` for `map`, with room for it reserved in `map`, made before the operation
// it records is submitted: inserting it afterwards (with its key set) allocates nothing, so the
// record cannot fail once the kernel may be using the operation's memory, where a failure would
// free a buffer that a transfer still fills.
template <class Map, class Value>
typename Map::node_type prepared_node(Map& map, Value value) {
  Map scratch;
  scratch.emplace(typename Map::key_type{}, std::move(value));
  map.reserve(map.size() + 1);
  return scratch.extract(scratch.begin());
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The names of a swapper's own files: "s<pid>-<tid>-<n>-<file number>.swap" (see new_file). Only
// these are ever removed as stale, never another *.swap file the directory may hold.
bool own_file_name(const std::string& name) {
  if (name.size() < 2 || name[0] != 's' || !ends_with(name, kSwapSuffix)) return false;
  const std::string middle = name.substr(1, name.size() - 1 - std::strlen(kSwapSuffix));
  int dashes = 0;
  char previous = '-';
  for (const char c : middle) {
    if (c == '-') {
      if (previous == '-') return false;
      ++dashes;
    } else if (c < '0' || c > '9') {
      return false;
    }
    previous = c;
  }
  return dashes == 3 && previous != '-';
}

std::string strip_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

void make_directories(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_io_error(IoOp::Open, dir, 0, 0, ec.value(), "creating the swap directory");
}

void verify(const std::string& name, const std::string& path, std::uint64_t offset,
            std::uint64_t size, const std::optional<std::uint64_t>& expected, const void* data) {
  if (!expected) return;
  const std::uint64_t actual = XXH3_64bits(data, size);
  if (actual != *expected) throw ChecksumMismatch(name, path, offset, size, *expected, actual);
}

// A lent buffer of no bytes (a swap_in of an empty tensor); holds nothing of any budget.
class EmptyBuffer final : public SwapBuffer {
 public:
  void* data() const noexcept override { return nullptr; }
  std::size_t size() const noexcept override { return 0; }
};

// The text of the lock file: the owner's pid, or empty when the last owner closed cleanly.
long read_pid(int fd) {
  char text[32] = {};
  const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
  if (n <= 0) return 0;
  return std::strtol(text, nullptr, 10);
}

}  // namespace

struct Swapper::Impl {
  // A file holding swapped bytes: one of this swapper's own (removed when nothing in it is live,
  // and at close), or one adopted from the directory's index (never written nor removed).
  struct File {
    std::string path;
    bool owned = false;
    bool pack = false;
    std::uint64_t end = 0;   // where the next packed tensor may go; the extents' end
    std::uint64_t refs = 0;  // entries placed in it
  };
  // Where a name is in the read-ahead. Queued: in `prefetch_queue`, waiting for room (no memory
  // held); Reading: its own read into `prefetched` is in flight (an Op); Ready: `prefetched` holds
  // its verified bytes, listed in `ready_names`, until a swap_in claims them or they are dropped.
  enum class Prefetch { None, Queued, Reading, Ready };
  struct Entry {
    std::uint64_t size = 0;
    std::uint64_t file = kNoFile;  // kNoFile for a tensor of no bytes
    std::uint64_t offset = 0;
    std::optional<std::uint64_t> checksum;
    std::string meta;
    SwapId writing = 0;  // the swap_out in flight
    int readers = 0;     // reads in flight (blocking swap_ins and its prefetch read)
    Prefetch prefetch = Prefetch::None;
    std::shared_ptr<SwapBuffer> prefetched;  // Reading and Ready only
    std::exception_ptr error;                // its write failed: the bytes are not on disk
  };
  // An operation in flight on the handle: one name's swap_out or prefetch read.
  struct Op {
    enum class Kind { Write, Prefetch };
    Kind kind = Kind::Write;
    SwapId id = 0;              // a write's
    std::uint64_t charged = 0;  // a write's write-behind bytes
    std::string name;
  };

  Impl(std::string directory, const SwapperOptions& o, const Options& handle_options)
      : dir(strip_trailing_slashes(std::move(directory))),
        options(o),
        handle(handle_options),
        pool(std::make_shared<detail::SwapPool>(o.budget_bytes, o.lock)) {}

  const std::string dir;
  const SwapperOptions options;
  Handle handle;
  std::shared_ptr<detail::SwapPool> pool;

  mutable std::mutex mutex;
  std::condition_variable changed;  // an operation finished, a read ended, the collector left
  const pid_t owner_pid = detail::current_pid();
  bool closed = false;
  bool collecting = false;  // a thread is in handle.wait_some (see progress())
  detail::FileDescriptor lock_fd;
  std::string session;  // the prefix of this swapper's own file names
  std::uint64_t next_file_number = 0;
  std::map<std::uint64_t, File> files;
  std::uint64_t next_file_id = 0;
  std::uint64_t current_pack = kNoFile;
  int removed_since_close_files = 0;
  std::unordered_map<std::string, Entry> entries;
  std::unordered_set<std::string> ready_names;  // entries in Prefetch::Ready
  std::deque<std::string> prefetch_queue;  // entries in Prefetch::Queued, in the caller's order
  // Threads in reserve(): queued reads are not started while one waits for room, so that the
  // read-ahead never takes the room that work asked for now.
  int room_waiters = 0;
  std::unordered_map<Ticket, Op> ops;         // in flight, by handle ticket
  std::unordered_map<SwapId, Ticket> writes;  // swap_outs in flight
  // Failed swap_outs, until wait(id) throws theirs; `reported` once wait() has thrown it.
  struct Failure {
    std::exception_ptr error;
    bool reported = false;
  };
  std::map<SwapId, Failure> failed;
  SwapId next_id = 1;
  int blocking_readers = 0;
  SwapperStats counters;

  using Lock = std::unique_lock<std::mutex>;

  // A forked child has a copy of the state but none of the threads, tickets or files behind it
  // (and a mutex a parent thread held at the fork may stay locked in it): checked first, before
  // the mutex.
  void check_process() const {
    if (detail::current_pid() != owner_pid) {
      throw InvalidArgument(fmt::format(
          "swapper: the swapper of '{}' belongs to process {}; a forked child cannot use it "
          "(open a swapper of its own, on another directory)",
          dir, owner_pid));
    }
  }

  void check_open() const {
    if (closed) throw InvalidArgument(fmt::format("swapper: the swapper of '{}' is closed", dir));
  }

  // ---- the directory ----------------------------------------------------------------------

  void open_directory() {
    if (options.budget_bytes == 0) {
      throw InvalidArgument("swapper: budget_bytes must be at least 1", "budget_bytes");
    }
    if (options.pack_file_size == 0) {
      throw InvalidArgument("swapper: pack_file_size must be at least 1", "pack_file_size");
    }
    make_directories(dir);
    const std::string lock_path = join(dir, kLockName);
    int fd = -1;
    // A clean close removes the lock file while holding it: a lock taken on a file that has just
    // been removed (or replaced) would be nobody's, so the file locked must still be the one named.
    for (;;) {
      fd = detail::open_file(lock_path, O_RDWR | O_CREAT);
      if (fd < 0) throw_io_error(IoOp::Open, lock_path, 0, 0, -fd);
      lock_fd = detail::FileDescriptor(fd);
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err != EWOULDBLOCK) throw_io_error(IoOp::Open, lock_path, 0, 0, err, "flock");
        const long owner = read_pid(fd);
        throw DirectoryLocked(
            fmt::format("swapper: '{}' is in use by another swapper (process {}{}); close it, or "
                        "give each swapper its own directory",
                        dir, owner, owner == ::getpid() ? ", this process" : ""),
            dir, owner);
      }
      detail::FileFacts held;
      detail::FileFacts named;
      if (detail::file_facts(fd, held) == 0 && detail::path_facts(lock_path, named) == 0 &&
          held.same_file(named)) {
        break;
      }
    }
    const long previous_owner = read_pid(fd);
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
      throw_io_error(IoOp::Write, lock_path, 0, pid.size(), errno);
    }
    const std::unordered_set<std::string> indexed = load_index();
    remove_stale(indexed, previous_owner);
    session = "s" + detail::unique_suffix() + "-";
  }

  // Adopts the tensors of the directory's index; returns the file names it lists.
  std::unordered_set<std::string> load_index() {
    std::unordered_set<std::string> names;
    const std::string path = join(dir, kIndexName);
    detail::FileFacts facts;
    const int rc = detail::path_facts(path, facts);
    if (rc == -ENOENT) return names;
    if (rc < 0) throw_io_error(IoOp::Stat, path, 0, 0, -rc);
    std::string text(static_cast<std::size_t>(facts.size), '\0');
    if (!text.empty())
      handle.read(text.data(), text.size(), path, 0, ReadOptions{MemoryKind::Host});
    json doc;
    try {
      doc = json::parse(text);
      if (doc.at("format").get<std::string>() != kIndexFormat || doc.at("version") != 1) {
        throw FormatError(path, "not a version 1 nvio swap index");
      }
      std::map<std::string, std::uint64_t> file_ids;
      for (const json& e : doc.at("entries")) {
        Entry entry;
        const std::string name = e.at("name").get<std::string>();
        // nlohmann converts -5 to 2^64 - 5 without a word: each count must be one already.
        const auto count = [&](const char* key) {
          const json& v = e.at(key);
          if (!v.is_number_unsigned()) {
            throw FormatError(path, fmt::format("tensor '{}': entry {} {} is not a byte count",
                                                name, key, detail::json_excerpt(v)));
          }
          return v.get<std::uint64_t>();
        };
        entry.size = count("size");
        entry.offset = count("offset");
        // Checked before any rounding of the size (to pages, to slots) could wrap it to nothing.
        constexpr auto kMaxOffset = static_cast<std::uint64_t>(std::numeric_limits<off_t>::max());
        if (entry.size > kMaxOffset || entry.offset > kMaxOffset - entry.size) {
          throw FormatError(path, fmt::format("tensor '{}': entry offset {} + size {} overflows "
                                              "the largest file offset {}",
                                              name, entry.offset, entry.size, kMaxOffset));
        }
        entry.meta = e.at("meta").get<std::string>();
        if (!e.at("checksum").is_null()) entry.checksum = count("checksum");
        const std::string file = e.at("file").get<std::string>();
        if (entry.size > 0) {
          if (file.empty() || file.find('/') != std::string::npos) {
            throw FormatError(path, fmt::format("entry file '{}' is not a file name", file));
          }
          auto [it, fresh] = file_ids.emplace(file, next_file_id);
          if (fresh) files[next_file_id++] = File{join(dir, file), false, false, 0, 0};
          File& f = files[it->second];
          f.end = std::max(f.end, entry.offset + entry.size);
          ++f.refs;
          entry.file = it->second;
          names.insert(file);
        }
        if (!entries.emplace(name, std::move(entry)).second) {
          throw FormatError(path, fmt::format("tensor '{}' is listed twice", name));
        }
      }
    } catch (const json::exception& e) {
      throw FormatError(path, fmt::format("malformed swap index: {}", e.what()));
    }
    return names;
  }

  // Removes the swap files nobody owns: those of a swapper that ended without closing.
  void remove_stale(const std::unordered_set<std::string>& indexed, long previous_owner) {
    std::vector<std::string> removed;
    std::uint64_t bytes = 0;
    std::error_code ec;
    for (const auto& item : fs::directory_iterator(dir, ec)) {
      const std::string name = item.path().filename().string();
      const bool swap_file = own_file_name(name) && !indexed.contains(name);
      // The directory is this swapper's (its lock): any temporary of its index is debris.
      const bool index_temp = detail::temporary_writer(kIndexName, name).has_value();
      if (!swap_file && !index_temp) continue;
      const std::string path = join(dir, name);
      detail::FileFacts facts;
      if (detail::path_facts(path, facts) == 0) bytes += static_cast<std::uint64_t>(facts.size);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        throw_io_error(IoOp::Open, path, 0, 0, errno, "removing a stale swap file");
      }
      removed.push_back(name);
    }
    if (ec) throw_io_error(IoOp::Open, dir, 0, 0, ec.value(), "listing the swap directory");
    if (removed.empty()) return;
    std::sort(removed.begin(), removed.end());
    const std::string who =
        previous_owner > 0
            ? fmt::format("process {}, which ended without closing its swapper", previous_owner)
            : std::string("a swapper that did not remove them");
    const std::size_t shown = std::min<std::size_t>(removed.size(), 5);
    std::string list;
    for (std::size_t i = 0; i < shown; ++i) list += (i ? ", " : "") + removed[i];
    if (shown < removed.size()) list += fmt::format(", ... ({} more)", removed.size() - shown);
    warn(fmt::format("swapper: removed {} stale swap file{} ({} bytes) from '{}' left by {}: {}",
                     removed.size(), removed.size() == 1 ? "" : "s", bytes, dir, who, list));
  }

  json index_document(const std::vector<std::pair<std::string, const Entry*>>& list,
                      const std::function<std::string(const Entry&)>& file_name) const {
    json doc = {{"format", kIndexFormat}, {"version", 1}, {"entries", json::array()}};
    for (const auto& [name, e] : list) {
      json item = {
          {"name", name},        {"size", e->size},
          {"offset", e->offset}, {"file", e->size > 0 ? file_name(*e) : std::string()},
          {"meta", e->meta},     {"checksum", e->checksum ? json(*e->checksum) : json(nullptr)}};
      doc["entries"].push_back(std::move(item));
    }
    return doc;
  }

  // Writes `doc` as the index of `directory`, durably and atomically.
  void write_index(const std::string& directory, const json& doc) {
    std::string text;
    try {
      text = doc.dump(1);
    } catch (const json::exception& e) {
      throw InvalidArgument(fmt::format(
          "swapper: a tensor's name or description is not UTF-8 and cannot go into the index of "
          "'{}': {}",
          directory, e.what()));
    }
    detail::ReplacementFile file(join(directory, kIndexName), &handle);
    file.writing([&] {
      handle.write(text.data(), text.size(), file.fd(), 0,
                   WriteOptions{Truncate::No, Durability::Data, MemoryKind::Host});
    });
    file.commit(Durability::Data);
  }

  // ---- files and placement ----------------------------------------------------------------

  std::uint64_t new_file(bool pack) {
    const std::uint64_t id = next_file_id++;
    files[id] = File{join(dir, session + std::to_string(next_file_number++) + kSwapSuffix), true,
                     pack, 0, 0};
    return id;
  }

  void place(Entry& e, std::uint64_t size) {
    if (size >= options.pack_threshold) {
      e.file = new_file(false);
      e.offset = 0;
      File& f = files[e.file];
      f.end = size;
      f.refs = 1;
      return;
    }
    if (current_pack != kNoFile) {
      File& f = files[current_pack];
      const std::uint64_t offset = detail::round_up(f.end, alignment_for(size));
      if (f.end == 0 || offset + size <= options.pack_file_size) {
        e.file = current_pack;
        e.offset = offset;
        f.end = offset + size;
        ++f.refs;
        return;
      }
    }
    current_pack = new_file(true);  // the full one is removed once nothing in it is live
    e.file = current_pack;
    e.offset = 0;
    File& f = files[current_pack];
    f.end = size;
    f.refs = 1;
  }

  void free_extent(Entry& e) {
    if (e.file == kNoFile) return;
    const std::uint64_t id = e.file;
    e.file = kNoFile;
    File& f = files.at(id);
    if (--f.refs > 0) return;
    if (!f.owned) {
      files.erase(id);  // adopted: the file stays for the snapshot it belongs to
      return;
    }
    if (id == current_pack) {
      f.end = 0;  // the pack is empty: fill it again from the start
      return;
    }
    const std::string path = f.path;
    files.erase(id);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      throw_io_error(IoOp::Open, path, 0, 0, errno, "removing a swap file");
    }
    if (++removed_since_close_files >= kCloseFilesAfter) {
      handle.close_files();
      removed_since_close_files = 0;
    }
  }

  // Takes `name` out of the read-ahead: out of the queue, or its unclaimed data dropped. A read
  // in flight stays (its Op still writes into the buffer); callers that must not see it wait for
  // the entry's readers first.
  void drop_prefetched(const std::string& name, Entry& e) {
    switch (e.prefetch) {
      case Prefetch::None:
      case Prefetch::Reading: return;
      case Prefetch::Queued:
        prefetch_queue.erase(std::find(prefetch_queue.begin(), prefetch_queue.end(), name));
        break;
      case Prefetch::Ready:
        ready_names.erase(name);
        e.prefetched.reset();
        break;
    }
    e.prefetch = Prefetch::None;
  }

  // Takes `name` out of the queue, when it is there.
  void unqueue(const std::string& name, Entry& e) {
    if (e.prefetch == Prefetch::Queued) drop_prefetched(name, e);
  }

  // Empties the queue and drops unclaimed data (reads in flight stay until finished).
  void clear_read_ahead() {
    while (!prefetch_queue.empty()) {
      const std::string name = prefetch_queue.front();
      drop_prefetched(name, entries.at(name));
    }
    while (!ready_names.empty()) {
      const std::string name = *ready_names.begin();
      drop_prefetched(name, entries.at(name));
    }
  }

  // The prefetched bytes of `name` (Ready), now the caller's; the entry leaves the read-ahead.
  std::shared_ptr<SwapBuffer> claim_prefetched(const std::string& name, Entry& e) {
    ready_names.erase(name);
    e.prefetch = Prefetch::None;
    return std::move(e.prefetched);
  }

  // Whether prefetch() reads `e` ahead: not while its write is in flight (the caller's buffer
  // still holds the bytes), not when it is in the read-ahead already, and not when it could never
  // fit in the budget.
  bool prefetchable(const Entry& e) const {
    return e.writing == 0 && !e.error && e.size > 0 && e.prefetch == Prefetch::None &&
           detail::SwapPool::footprint(static_cast<std::size_t>(e.size)) <= options.budget_bytes;
  }

  // Starts the read of `name` into a pool buffer, as an Op of its own, when the budget has room
  // for it without waiting (free pool memory may be dropped, prefetched data never is). Returns
  // false when it has no room. Throws the pool's MemoryError or the handle's submit error.
  bool start_prefetch(const std::string& name, Entry& e) {
    std::shared_ptr<SwapBuffer> buffer = pool->try_allocate(static_cast<std::size_t>(e.size));
    if (!buffer) return false;
    const ReadExtent extent{buffer->data(), buffer->size(), e.offset, files.at(e.file).path, -1};
    auto record = prepared_node(ops, Op{Op::Kind::Prefetch, 0, 0, name});
    const Ticket ticket = handle.submit_read_batch({&extent, 1}, ReadOptions{MemoryKind::Host});
    record.key() = ticket;
    ops.insert(std::move(record));
    e.prefetched = std::move(buffer);
    e.prefetch = Prefetch::Reading;
    ++e.readers;
    return true;
  }

  // Starts the queued reads, in order, for as long as the budget has room for the next one.
  // Called whenever memory may have been freed: a write or read finished, a swap_in consumed
  // prefetched data, unclaimed data was evicted, or (seen at the caller's next call) a lent buffer
  // was destroyed. Never waits and never drops prefetched data; a name whose read cannot be
  // started (mapping or submit failure) leaves the queue, and its swap_in reports its own error.
  void start_queued() noexcept {
    if (closed || room_waiters > 0) return;
    while (!prefetch_queue.empty()) {
      const std::string& name = prefetch_queue.front();
      Entry& e = entries.at(name);
      try {
        if (!start_prefetch(name, e)) return;
      } catch (...) {
        e.prefetch = Prefetch::None;
      }
      prefetch_queue.pop_front();
    }
  }

  // ---- waiting ------------------------------------------------------------------------------

  // Collects finished operations: at least one when `block`. One thread at a time collects (the
  // handle's tickets are each collected once); the others wait for it to announce what finished.
  // Called with the lock held and something in flight.
  void progress(Lock& lock, bool block = true) {
    if (collecting) {
      if (block) changed.wait(lock);
      return;
    }
    collecting = true;
    lock.unlock();
    std::array<Completion, 64> done;
    std::size_t n = 0;
    std::exception_ptr failure;
    try {
      n = handle.wait_some(done, block ? 1 : 0);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    collecting = false;
    for (std::size_t i = 0; i < n; ++i) finish(done[i]);
    if (n > 0) start_queued();
    changed.notify_all();
    if (failure) std::rethrow_exception(failure);
  }

  void finish(const Completion& c) {
    auto it = ops.find(c.ticket);
    if (it == ops.end()) return;
    Op op = std::move(it->second);
    ops.erase(it);
    if (op.kind == Op::Kind::Write) {
      pool->uncharge(op.charged);
      writes.erase(op.id);
      auto e = entries.find(op.name);
      if (e != entries.end() && e->second.writing == op.id) {
        e->second.writing = 0;
        if (c.error) {
          e->second.error = c.error;
        } else {
          counters.bytes_written += e->second.size;
        }
      }
      if (c.error) failed[op.id] = Failure{c.error, false};
      return;
    }
    // A prefetch that failed (its read, or its checksum) is dropped: the swap_in that wanted it
    // reads again and reports the failure with its own, precise error. (The entry is in Reading:
    // evict and swap_out wait for its readers.)
    auto it_entry = entries.find(op.name);
    if (it_entry == entries.end()) return;
    Entry& entry = it_entry->second;
    --entry.readers;
    bool good = !c.error;
    if (good && entry.checksum) {
      good = XXH3_64bits(entry.prefetched->data(), entry.size) == *entry.checksum;
    }
    if (good) {
      entry.prefetch = Prefetch::Ready;
      ready_names.insert(op.name);
      counters.bytes_read += entry.size;
    } else {
      entry.prefetch = Prefetch::None;
      entry.prefetched.reset();
    }
  }

  template <class Pred>
  void wait_until(Lock& lock, Pred pred) {
    while (!pred()) {
      if (!ops.empty()) {
        progress(lock);
      } else {
        changed.wait(lock);  // a blocking read of another thread
      }
    }
  }

  // Whether `name` has no write and no prefetch read in flight (or is unknown): what a swap_in
  // waits for.
  bool at_rest(const std::string& name) const {
    auto it = entries.find(name);
    return it == entries.end() ||
           (it->second.writing == 0 && it->second.prefetch != Prefetch::Reading);
  }

  // Waits until `name` is at rest; returns its entry, with the lock held. Throws InvalidArgument
  // for an unknown name and the error of a failed write.
  Entry& settled(Lock& lock, const std::string& name) {
    wait_until(lock, [&] { return at_rest(name); });
    check_open();  // closed by another thread while this one waited
    auto it = entries.find(name);
    if (it == entries.end()) {
      throw InvalidArgument(fmt::format("swapper: no tensor named '{}' in '{}'", name, dir));
    }
    if (it->second.error) std::rethrow_exception(it->second.error);
    return it->second;
  }

  // Makes room in the budget for `what` (`needed` bytes at most) through `attempt`, which returns
  // something true once it fits: drops free pool memory (inside attempt), then, when `drop`,
  // prefetched data nobody claimed, then waits for I/O in flight. Throws BudgetExceeded when none
  // of that can help.
  template <class Attempt>
  auto reserve(Lock& lock, Attempt attempt, std::uint64_t needed, const std::string& what,
               bool drop) -> decltype(attempt()) {
    const std::uint64_t budget = options.budget_bytes;
    if (needed > budget) {
      throw BudgetExceeded(fmt::format("swapper: {} needs {} bytes, more than the whole budget "
                                       "of {} bytes of '{}'",
                                       what, needed, budget, dir),
                           needed, budget, pool->held());
    }
    // Counted while in here: the read-ahead waits (see start_queued).
    struct RoomWaiter {
      int& waiters;
      explicit RoomWaiter(int& w) : waiters(w) { ++waiters; }
      ~RoomWaiter() { --waiters; }
      RoomWaiter(const RoomWaiter&) = delete;
      RoomWaiter& operator=(const RoomWaiter&) = delete;
    } waiter(room_waiters);
    bool waited = false;
    for (;;) {
      if (auto r = attempt()) return r;
      if (drop && !ready_names.empty()) {
        const std::string name = *ready_names.begin();
        drop_prefetched(name, entries.at(name));
        continue;
      }
      if (!ops.empty()) {
        if (!waited) ++counters.budget_waits;
        waited = true;
        progress(lock);
        continue;
      }
      const std::uint64_t held = pool->held();
      throw BudgetExceeded(
          fmt::format("swapper: {} needs {} bytes, but {} of the budget of {} bytes of '{}' are "
                      "held ({} by pool buffers in use: lent by swap_in and still alive, or "
                      "being read into; {} by write-behind) and no I/O in flight can free them",
                      what, needed, held, budget, dir, pool->mapped() - pool->free_bytes(),
                      pool->charged()),
          needed, budget, held);
    }
  }

  void end_read(const std::string& name) {
    --blocking_readers;
    if (auto it = entries.find(name); it != entries.end()) --it->second.readers;
    changed.notify_all();
  }

  // Reads `name`'s bytes into `buf` without the lock (the entry cannot move while it has a
  // reader); verifies them when they land in host memory.
  void read_unlocked(Lock& lock, const std::string& name, Entry& e, void* buf, MemoryKind memory) {
    ++e.readers;
    ++blocking_readers;
    const std::string path = files.at(e.file).path;
    const std::uint64_t offset = e.offset;
    const std::uint64_t size = e.size;
    const std::optional<std::uint64_t> checksum = e.checksum;
    lock.unlock();
    try {
      const ReadExtent extent{buf, static_cast<std::size_t>(size), offset, path, -1};
      handle.read_batch({&extent, 1}, ReadOptions{memory});
      if (memory == MemoryKind::Host) verify(name, path, offset, size, checksum, buf);
    } catch (...) {
      lock.lock();
      end_read(name);
      throw;
    }
    lock.lock();
    end_read(name);
    counters.bytes_read += size;
  }

  // swap_in(name): the bytes of `name` in a buffer lent from the pool (its prefetched data when
  // Ready, after waiting for its prefetch read when Reading).
  std::shared_ptr<SwapBuffer> lend(Lock& lock, const std::string& name, std::string* meta) {
    std::shared_ptr<SwapBuffer> buffer;
    for (;;) {
      Entry& e = settled(lock, name);
      if (meta != nullptr) *meta = e.meta;
      if (e.prefetch == Prefetch::Ready) {
        ++counters.swap_ins;
        ++counters.prefetch_hits;
        return claim_prefetched(name, e);
      }
      drop_prefetched(name, e);  // still queued: read now, into the buffer lent
      if (e.size == 0) {
        ++counters.swap_ins;
        return std::make_shared<EmptyBuffer>();
      }
      if (buffer && buffer->size() == e.size) {
        read_unlocked(lock, name, e, buffer->data(), MemoryKind::Host);
        ++counters.swap_ins;
        return buffer;
      }
      // (Again) a buffer of its size: the wait for room may have let another thread replace it.
      buffer.reset();
      const std::size_t size = e.size;
      buffer = reserve(
          lock, [&] { return pool->try_allocate(size); }, detail::SwapPool::footprint(size),
          fmt::format("the swap_in of tensor '{}' ({} bytes)", name, size), true);
    }
  }

  void drain(Lock& lock) {
    wait_until(lock, [&] { return ops.empty() && blocking_readers == 0 && !collecting; });
  }

  // The first failure no wait() has thrown yet (marked thrown); wait(id) still throws its own.
  std::exception_ptr take_failures() {
    for (auto& [id, f] : failed) {
      if (!f.reported) {
        f.reported = true;
        return f.error;
      }
    }
    return nullptr;
  }
};

Swapper::Swapper(std::string directory, const SwapperOptions& options,
                 const Options& handle_options)
    : impl_(std::make_unique<Impl>(std::move(directory), options, handle_options)) {
  impl_->open_directory();
}

Swapper::~Swapper() {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  if (detail::current_pid() != impl_->owner_pid) {
    // A forked child: its copy of the state is left to the child's exit, as Handle does (a mutex
    // or a pool buffer's release could wait for a parent thread that does not exist here).
    close(true);
    (void)impl_.release();
    return;
  }
  try {
    close(true);
  } catch (...) {  // a destructor cannot throw; close() explicitly to see errors
  }
}

const std::string& Swapper::directory() const noexcept { return impl_->dir; }

Swapper::SwapId Swapper::swap_out(const std::string& name, const void* buf, std::size_t length,
                                  MemoryKind memory, const std::string& meta) {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  Impl& s = *impl_;
  if (length > 0 && buf == nullptr) {
    throw InvalidArgument(
        fmt::format("swapper: swap_out of '{}': a null buffer of {} bytes", name, length));
  }
  if (memory == MemoryKind::Auto) memory = memory_kind(buf);
  std::optional<std::uint64_t> checksum;
  if (s.options.checksums && memory == MemoryKind::Host) checksum = XXH3_64bits(buf, length);
  s.check_process();
  Impl::Lock lock(s.mutex);
  s.check_open();
  // A pool buffer lent by swap_in is already counted: its write pins nothing more.
  const bool lent = memory == MemoryKind::Host && length > 0 && s.pool->owns(buf, length);
  const std::uint64_t charge = lent ? 0 : length;
  if (charge > 0) {
    s.reserve(
        lock, [&] { return s.pool->try_charge(charge); }, charge,
        fmt::format("the write-behind of tensor '{}'", name), true);
  }
  // A queued read of the old bytes is not started now, only to be waited for below.
  if (auto it = s.entries.find(name); it != s.entries.end()) s.unqueue(name, it->second);
  try {
    // The name's earlier write must land first, and no read may see its extent rewritten.
    s.wait_until(lock, [&] {
      auto it = s.entries.find(name);
      return it == s.entries.end() || (it->second.writing == 0 && it->second.readers == 0);
    });
    s.check_open();  // closed by another thread while this one waited
  } catch (...) {
    s.pool->uncharge(charge);
    throw;
  }
  Impl::Entry& e = s.entries[name];
  s.drop_prefetched(name, e);
  const bool in_place = e.file != kNoFile && s.files.at(e.file).owned && e.size == length;
  try {
    if (!in_place) {
      s.free_extent(e);
      if (length > 0) s.place(e, length);
    }
  } catch (...) {
    s.pool->uncharge(charge);
    s.entries.erase(name);
    throw;
  }
  e.size = length;
  e.checksum = checksum;
  e.meta = meta;
  e.error = nullptr;
  const SwapId id = s.next_id++;
  ++s.counters.swap_outs;
  if (length == 0) return id;
  const WriteExtent extent{buf, length, e.offset, s.files.at(e.file).path, -1};
  Ticket ticket = 0;
  decltype(s.ops)::node_type op_record;
  decltype(s.writes)::node_type write_record;
  try {
    op_record = prepared_node(s.ops, Impl::Op{Impl::Op::Kind::Write, id, charge, name});
    write_record = prepared_node(s.writes, Ticket{0});
    ticket = s.handle.submit_write_batch({&extent, 1},
                                         WriteOptions{Truncate::No, Durability::None, memory});
  } catch (...) {
    s.pool->uncharge(charge);
    s.free_extent(e);
    s.entries.erase(name);
    throw;
  }
  e.writing = id;
  op_record.key() = ticket;
  s.ops.insert(std::move(op_record));
  write_record.key() = id;
  write_record.mapped() = ticket;
  s.writes.insert(std::move(write_record));
  s.start_queued();  // room the read-ahead left alone while this call waited for it
  return id;
}

void Swapper::wait(SwapId id) {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  Impl& s = *impl_;
  s.check_process();
  Impl::Lock lock(s.mutex);
  if (id == 0 || id >= s.next_id) {
    throw InvalidArgument(fmt::format("swapper: {} is not a swap_out of this swapper", id));
  }
  s.wait_until(lock, [&] { return !s.writes.contains(id); });
  if (auto it = s.failed.find(id); it != s.failed.end()) {
    const std::exception_ptr error = it->second.error;
    s.failed.erase(it);
    std::rethrow_exception(error);
  }
}

bool Swapper::done(SwapId id) {
  Impl& s = *impl_;
  s.check_process();
  Impl::Lock lock(s.mutex);
  if (s.writes.contains(id)) s.progress(lock, false);
  return !s.writes.contains(id);
}

void Swapper::wait() {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  Impl& s = *impl_;
  s.check_process();
  Impl::Lock lock(s.mutex);
  s.wait_until(lock, [&] { return s.ops.empty(); });
  if (const std::exception_ptr first = s.take_failures()) std::rethrow_exception(first);
}

std::shared_ptr<SwapBuffer> Swapper::swap_in(const std::string& name, std::string* meta) {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  Impl& s = *impl_;
  s.check_process();
  Impl::Lock lock(s.mutex);
  s.check_open();
  std::shared_ptr<SwapBuffer> buffer = s.lend(lock, name, meta);
  // Lent buffers the caller destroyed since the last call may have left room.
  s.start_queued();
  return buffer;
}

void Swapper::swap_in(const std::string& name, void* buf, std::size_t length, MemoryKind memory) {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  const Target target{name, buf, length, memory};
  swap_in(std::span<const Target>(&target, 1));
}

void Swapper::swap_in(std::span<const Target> targets) {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  Impl& s = *impl_;
  s.check_process();
  Impl::Lock lock(s.mutex);
  s.check_open();
  // All settled under one hold of the lock: waiting for one name may let another change.
  s.wait_until(lock, [&] {
    return std::all_of(targets.begin(), targets.end(),
                       [&](const Target& t) { return s.at_rest(t.name); });
  });
  s.check_open();
  std::vector<MemoryKind> kinds;
  kinds.reserve(targets.size());
  for (const Target& t : targets) {  // every target checked before any state changes
    auto it = s.entries.find(t.name);
    if (it == s.entries.end()) {
      throw InvalidArgument(fmt::format("swapper: no tensor named '{}' in '{}'", t.name, s.dir));
    }
    const Impl::Entry& e = it->second;
    if (e.error) std::rethrow_exception(e.error);
    if (t.length != e.size) {
      throw InvalidArgument(
          fmt::format("swapper: tensor '{}' holds {} bytes, the buffer given to swap_in has {}",
                      t.name, e.size, t.length));
    }
    if (t.length > 0 && t.buf == nullptr) {
      throw InvalidArgument(fmt::format("swapper: swap_in of '{}' into a null buffer", t.name));
    }
    const MemoryKind memory = t.memory == MemoryKind::Auto ? memory_kind(t.buf) : t.memory;
    if (memory == MemoryKind::Device && e.checksum && e.size > 0) {
      throw InvalidArgument(fmt::format(
          "swapper: tensor '{}' has a checksum, which is verified in host memory: swap it in to "
          "a host buffer (or a lent one) and copy it to the device",
          t.name));
    }
    kinds.push_back(memory);
  }
  // What each target needs: a copy of prefetched data, or a read straight into it (also for a name
  // still queued for prefetch: it leaves the queue). The entry keeps a reader, so it cannot move
  // while the lock is let go.
  struct Read {
    const Target* target;
    std::string path;
    std::uint64_t offset;
    std::optional<std::uint64_t> checksum;
  };
  std::vector<std::pair<const Target*, std::shared_ptr<SwapBuffer>>> copies;
  std::vector<Read> reads;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const Target& t = targets[i];
    Impl::Entry& e = s.entries.at(t.name);
    ++s.counters.swap_ins;
    if (e.prefetch == Impl::Prefetch::Ready) {
      std::shared_ptr<SwapBuffer> data = s.claim_prefetched(t.name, e);
      if (kinds[i] == MemoryKind::Host) {
        ++s.counters.prefetch_hits;
        copies.emplace_back(&t, std::move(data));
        continue;
      }
    }
    s.drop_prefetched(t.name, e);
    if (t.length == 0) continue;
    ++e.readers;
    ++s.blocking_readers;
    reads.push_back({&t, s.files.at(e.file).path, e.offset, e.checksum});
  }
  lock.unlock();
  std::exception_ptr failure;
  try {
    for (const auto& [t, data] : copies) std::memcpy(t->buf, data->data(), t->length);
    copies.clear();  // back to the pool, for the queued reads started below
    for (const MemoryKind memory : {MemoryKind::Host, MemoryKind::Device}) {
      std::vector<ReadExtent> extents;
      for (std::size_t i = 0; i < reads.size(); ++i) {
        const Target& t = *reads[i].target;
        if (kinds[static_cast<std::size_t>(&t - targets.data())] != memory) continue;
        extents.push_back({t.buf, t.length, reads[i].offset, reads[i].path, -1});
      }
      if (!extents.empty()) s.handle.read_batch(extents, ReadOptions{memory});
    }
    for (const Read& r : reads) {
      const Target& t = *r.target;
      if (kinds[static_cast<std::size_t>(&t - targets.data())] == MemoryKind::Host) {
        verify(t.name, r.path, r.offset, t.length, r.checksum, t.buf);
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  lock.lock();
  for (const Read& r : reads) {
    s.end_read(r.target->name);
    if (!failure) s.counters.bytes_read += r.target->length;
  }
  s.start_queued();
  if (failure) std::rethrow_exception(failure);
}

std::size_t Swapper::prefetch(std::span<const std::string> names) {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  Impl& s = *impl_;
  s.check_process();
  Impl::Lock lock(s.mutex);
  s.check_open();
  for (const std::string& name : names) {
    if (!s.entries.contains(name)) {
      throw InvalidArgument(
          fmt::format("swapper: prefetch of '{}': no tensor of that name in '{}'", name, s.dir));
    }
  }
  // In the caller's order, behind what earlier calls queued; started as far as the budget has
  // room now, the rest as it frees up (see start_queued).
  std::size_t accepted = 0;
  for (const std::string& name : names) {
    if (s.prefetch_queue.size() >= kPrefetchQueueLimit) break;
    Impl::Entry& e = s.entries.at(name);
    if (!s.prefetchable(e)) continue;
    s.prefetch_queue.push_back(name);  // first: the state never names a queue it is not in
    e.prefetch = Impl::Prefetch::Queued;
    ++accepted;
  }
  s.start_queued();
  return accepted;
}

bool Swapper::evict(const std::string& name) {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  Impl& s = *impl_;
  s.check_process();
  Impl::Lock lock(s.mutex);
  s.check_open();
  // A queued read is not started now, only to be waited for below.
  if (auto it = s.entries.find(name); it != s.entries.end()) s.unqueue(name, it->second);
  s.wait_until(lock, [&] {
    auto it = s.entries.find(name);
    return it == s.entries.end() || (it->second.writing == 0 && it->second.readers == 0);
  });
  s.check_open();
  auto it = s.entries.find(name);
  if (it == s.entries.end()) return false;
  s.drop_prefetched(name, it->second);
  Impl::Entry entry = std::move(it->second);
  s.entries.erase(it);
  s.free_extent(entry);
  s.start_queued();  // its unclaimed data may have left room
  return true;
}

bool Swapper::contains(const std::string& name) const {
  impl_->check_process();
  std::lock_guard lock(impl_->mutex);
  return impl_->entries.contains(name);
}

std::optional<SwapEntryInfo> Swapper::info(const std::string& name) const {
  const Impl& s = *impl_;
  s.check_process();
  std::lock_guard lock(s.mutex);
  auto it = s.entries.find(name);
  if (it == s.entries.end()) return std::nullopt;
  const Impl::Entry& e = it->second;
  SwapEntryInfo out;
  out.size = e.size;
  out.meta = e.meta;
  out.path = e.file == kNoFile ? std::string() : s.files.at(e.file).path;
  out.offset = e.offset;
  out.checksum = e.checksum;
  return out;
}

std::vector<std::string> Swapper::names() const {
  const Impl& s = *impl_;
  s.check_process();
  std::lock_guard lock(s.mutex);
  std::vector<std::string> out;
  out.reserve(s.entries.size());
  for (const auto& [name, e] : s.entries) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

SwapperStats Swapper::stats() const {
  const Impl& s = *impl_;
  s.check_process();
  std::lock_guard lock(s.mutex);
  SwapperStats out = s.counters;
  out.budget_bytes = s.options.budget_bytes;
  out.writing_bytes = s.pool->charged();
  out.pool_bytes = s.pool->mapped();
  out.held_bytes = out.writing_bytes + out.pool_bytes;
  out.free_pool_bytes = s.pool->free_bytes();
  out.tensors = s.entries.size();
  for (const auto& [name, e] : s.entries) {
    out.stored_bytes += e.size;
    out.reads_in_flight += static_cast<std::uint64_t>(e.readers);
  }
  for (const std::string& name : s.ready_names) out.prefetched_bytes += s.entries.at(name).size;
  out.prefetch_queued = s.prefetch_queue.size();
  out.files = s.files.size();
  for (const auto& [id, f] : s.files) out.file_bytes += f.end;
  out.writes_in_flight = s.writes.size();
  return out;
}

void Swapper::snapshot(const std::string& dst_dir) {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  Impl& s = *impl_;
  s.check_process();
  Impl::Lock lock(s.mutex);
  s.check_open();
  const std::string dst = strip_trailing_slashes(dst_dir);
  make_directories(dst);
  std::error_code ec;
  if (fs::equivalent(dst, s.dir, ec)) {
    throw InvalidArgument(fmt::format(
        "swapper: snapshot into '{}', the swapper's own directory: give another directory "
        "(close(delete_files=false) keeps the files in place)",
        dst));
  }
  for (const auto& item : fs::directory_iterator(dst, ec)) {
    const std::string name = item.path().filename().string();
    if (name == kIndexName || ends_with(name, kSwapSuffix)) {
      throw InvalidArgument(
          fmt::format("swapper: snapshot into '{}', which already holds swap "
                      "data ('{}'): give an empty directory",
                      dst, name));
    }
  }
  if (ec) throw_io_error(IoOp::Open, dst, 0, 0, ec.value(), "listing the snapshot directory");
  // Every byte on disk first: the copy reads the files, not the caller's buffers.
  s.drain(lock);
  if (const std::exception_ptr first = s.take_failures()) std::rethrow_exception(first);

  // The layout: sources in file order (sequential reads), packed into one data file.
  struct Item {
    std::string name;
    const Impl::Entry* entry;
    std::string source;
    std::uint64_t offset;  // in the snapshot's data file
    std::uint64_t cloned;  // its first bytes shared with the source's blocks, not copied
  };
  std::vector<Item> items;
  items.reserve(s.entries.size());
  for (const auto& [name, e] : s.entries) {
    if (e.error) std::rethrow_exception(e.error);
    items.push_back({name, &e, e.file == kNoFile ? std::string() : s.files.at(e.file).path, 0, 0});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return std::tie(a.source, a.entry->offset) < std::tie(b.source, b.entry->offset);
  });
  std::uint64_t total = 0;
  for (Item& item : items) {
    if (item.entry->size == 0) continue;
    item.offset = detail::round_up(total, alignment_for(item.entry->size));
    total = item.offset + item.entry->size;
  }

  const std::string data_path = join(dst, kSnapshotData);
  if (total > 0) {
    // Staging slots from the budget: two at least (a chunk written while the next is read), and
    // up to kStagingSlots when the budget has room for them at once, so that several chunks'
    // reads and writes are in flight together.
    std::vector<std::shared_ptr<SwapBuffer>> staging;
    for (std::size_t size : kStagingSizes) {
      try {
        for (int i = 0; i < 2; ++i) {
          staging.push_back(s.reserve(
              lock, [&] { return s.pool->try_allocate(size); }, 2 * size, "a snapshot's staging",
              true));
        }
        while (staging.size() < kStagingSlots) {
          std::shared_ptr<SwapBuffer> more = s.pool->try_allocate(size);
          if (!more) break;
          staging.push_back(std::move(more));
        }
        break;
      } catch (const BudgetExceeded&) {
        staging.clear();
        if (size == kStagingSizes.back()) throw;
      }
    }
    const std::size_t chunk = staging.front()->size();
    const int fd = detail::open_file(data_path, O_WRONLY | O_CREAT | O_TRUNC);
    if (fd < 0) throw_io_error(IoOp::Open, data_path, 0, 0, -fd);
    detail::FileDescriptor data(fd);
    // The final size first: direct writes inside the file are not extending writes, which file
    // systems (ext4) serialise. The writes go by path, so that the handle opens the file for
    // O_DIRECT: this descriptor is a buffered one, through which the whole snapshot went into the
    // page cache (a second copy, and all of it written back by the final fdatasync).
    if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
      throw_io_error(IoOp::Truncate, data_path, 0, total, errno);
    }
    // Whole blocks are cloned where the file system can share them (XFS with reflink, btrfs): they
    // then cost no reads, no writes and no space until one of the two files is rewritten. What
    // cannot be (sub-block tails, small packed tensors, everything on ext4) is copied below.
    // Cloned bytes are not read, so not verified here; a checksum is checked whenever the bytes
    // are read back from the snapshot.
    detail::FileFacts facts;
    if (detail::file_facts(fd, facts) == 0 && facts.block_size > 0) {
      const std::uint64_t block = facts.block_size;
      std::unordered_map<std::string, detail::FileDescriptor> sources;
      for (Item& it : items) {
        const std::uint64_t length = it.entry->size / block * block;
        if (length == 0 || it.entry->offset % block != 0 || it.offset % block != 0) continue;
        auto [source, added] = sources.try_emplace(it.source);
        if (added) {
          const int src = detail::open_file(it.source, O_RDONLY);
          if (src < 0) break;  // the copy reports it, with its context
          source->second = detail::FileDescriptor(src);
        }
        // The first refusal ends cloning (a file system without it refuses every clone); the copy
        // then moves the rest, and reports any real fault itself.
        if (detail::clone_range(source->second.get(), it.entry->offset, length, fd, it.offset) != 0)
          break;
        it.cloned = length;
        s.counters.bytes_cloned += length;
      }
    }
    // A slot's life: Free -> Reading (its chunk's reads in flight) -> Writing (verified; its
    // writes in flight) -> Free. Slots in flight are waited for oldest first, so chunks are
    // verified in data-file order, which the hash of an item split over chunks needs.
    enum class SlotState { Free, Reading, Writing };
    struct Piece {
      std::size_t item;
      std::byte* data;
      std::uint64_t length;
      bool last;  // the item's last piece
    };
    struct Slot {
      std::byte* base = nullptr;
      SlotState state = SlotState::Free;
      Ticket ticket = 0;
      std::uint64_t bytes = 0;
      std::vector<WriteExtent> writes;
      std::vector<Piece> pieces;
    };
    std::vector<Slot> slots(staging.size());
    std::vector<Slot*> free_slots;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      slots[i].base = static_cast<std::byte*>(staging[i]->data());
      free_slots.push_back(&slots[i]);
    }
    std::deque<Slot*> in_flight;  // oldest first
    try {
      std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash(XXH3_createState(),
                                                                    &XXH3_freeState);
      if (!hash) throw MemoryError("swapper: XXH3_createState failed", ENOMEM);
      XXH3_64bits_reset(hash.get());
      std::size_t item = 0;
      std::uint64_t done_in_item = 0;  // bytes of items[item] already staged
      for (;;) {
        // Every free slot gets the next chunk's reads.
        while (!free_slots.empty() && item < items.size()) {
          Slot& slot = *free_slots.back();
          std::vector<ReadExtent> reads;
          slot.writes.clear();
          slot.pieces.clear();
          slot.bytes = 0;
          std::size_t used = 0;
          while (item < items.size() && used < chunk) {
            const Item& it = items[item];
            const std::uint64_t size = it.entry->size;
            done_in_item = std::max(done_in_item, it.cloned);
            if (done_in_item == size) {  // no bytes, or all of them cloned
              ++item;
              done_in_item = 0;
              continue;
            }
            // Staged at the data file offset's residue modulo a page: the write's middle is then
            // aligned in memory as on disk and goes through O_DIRECT without a bounce.
            const std::uint64_t target = it.offset + done_in_item;
            std::size_t at = used;
            if (size - done_in_item >= kPage) {
              at = static_cast<std::size_t>(detail::round_up(used, kPage) + target % kPage);
              if (at >= chunk) at = used;
            }
            const std::uint64_t length = std::min<std::uint64_t>(size - done_in_item, chunk - at);
            reads.push_back({slot.base + at, static_cast<std::size_t>(length),
                             it.entry->offset + done_in_item, it.source, -1});
            slot.writes.push_back(
                {slot.base + at, static_cast<std::size_t>(length), target, data_path, -1});
            done_in_item += length;
            const bool last = done_in_item == size;
            slot.pieces.push_back({item, slot.base + at, length, last});
            slot.bytes += length;
            used = at + static_cast<std::size_t>(length);
            if (last) {
              ++item;
              done_in_item = 0;
            }
          }
          if (reads.empty()) break;  // only items of no bytes (or cloned ones) were left
          slot.ticket = s.handle.submit_read_batch(reads, ReadOptions{MemoryKind::Host});
          slot.state = SlotState::Reading;
          free_slots.pop_back();
          in_flight.push_back(&slot);
        }
        if (in_flight.empty()) break;
        Slot& slot = *in_flight.front();
        in_flight.pop_front();
        s.handle.wait(std::exchange(slot.ticket, 0));
        if (slot.state == SlotState::Writing) {
          slot.state = SlotState::Free;
          free_slots.push_back(&slot);
          continue;
        }
        s.counters.bytes_read += slot.bytes;
        for (const Piece& p : slot.pieces) {
          const Item& it = items[p.item];
          // A partly cloned item's checksum covers bytes this copy did not read.
          if (!it.entry->checksum || it.cloned > 0) continue;
          if (p.length == it.entry->size) {
            verify(it.name, it.source, it.entry->offset, p.length, it.entry->checksum, p.data);
            continue;
          }
          // An item split over chunks is hashed piece by piece, in order.
          if (XXH3_64bits_update(hash.get(), p.data, p.length) != XXH_OK) {
            throw MemoryError("swapper: XXH3_64bits_update failed", EINVAL);
          }
          if (p.last) {
            const std::uint64_t actual = XXH3_64bits_digest(hash.get());
            XXH3_64bits_reset(hash.get());
            if (actual != *it.entry->checksum) {
              throw ChecksumMismatch(it.name, it.source, it.entry->offset, it.entry->size,
                                     *it.entry->checksum, actual);
            }
          }
        }
        slot.ticket = s.handle.submit_write_batch(
            slot.writes, WriteOptions{Truncate::No, Durability::None, MemoryKind::Host});
        slot.state = SlotState::Writing;
        in_flight.push_back(&slot);
      }
      if (::fdatasync(fd) != 0) throw_io_error(IoOp::Sync, data_path, 0, total, errno);
    } catch (...) {
      // Nothing may stay in flight into the staging memory or the file about to be removed: every
      // slot holding a ticket is waited for (also one whose push into in_flight failed).
      for (Slot& slot : slots) {
        if (slot.ticket == 0) continue;
        try {
          s.handle.wait(std::exchange(slot.ticket, 0));
        } catch (...) {  // the first failure is the one being thrown
        }
      }
      ::unlink(data_path.c_str());
      throw;
    }
  }
  std::vector<std::pair<std::string, const Impl::Entry*>> list;
  std::unordered_map<const Impl::Entry*, std::uint64_t> offsets;
  for (const Item& item : items) {
    list.emplace_back(item.name, item.entry);
    offsets[item.entry] = item.offset;
  }
  std::sort(list.begin(), list.end());
  json doc = s.index_document(list, [](const Impl::Entry&) { return std::string(kSnapshotData); });
  for (std::size_t i = 0; i < list.size(); ++i)
    doc["entries"][i]["offset"] = offsets[list[i].second];
  try {
    s.write_index(dst, doc);
  } catch (...) {
    ::unlink(data_path.c_str());
    throw;
  }
}

void Swapper::close(bool delete_files) {
  const ScopedInterruptCheck no_check(nullptr);  // see swapper.hpp, "Interrupt checks"
  Impl& s = *impl_;
  if (detail::current_pid() != s.owner_pid) {
    // A forked child: the files, the lock and the I/O are its parent's. It lets go of its copy of
    // the lock's descriptor (the parent's keeps the lock) and touches nothing else.
    s.lock_fd = detail::FileDescriptor();
    return;
  }
  Impl::Lock lock(s.mutex);
  if (s.closed) return;
  s.clear_read_ahead();  // nothing queued is started while draining
  s.drain(lock);
  s.closed = true;
  s.clear_read_ahead();  // what other threads queued while this one drained
  std::exception_ptr first = s.take_failures();
  try {
    if (delete_files) {
      for (const auto& [id, f] : s.files) {
        if (f.owned && ::unlink(f.path.c_str()) != 0 && errno != ENOENT) {
          throw_io_error(IoOp::Open, f.path, 0, 0, errno, "removing a swap file");
        }
      }
    } else {
      std::vector<std::pair<std::string, const Impl::Entry*>> list;
      for (const auto& [name, e] : s.entries) {
        if (!e.error) list.emplace_back(name, &e);
      }
      std::sort(list.begin(), list.end());
      s.write_index(s.dir, s.index_document(list, [&](const Impl::Entry& e) {
        return fs::path(s.files.at(e.file).path).filename().string();
      }));
    }
    s.handle.close_files();
  } catch (...) {
    if (!first) first = std::current_exception();
  }
  // A clean end: the lock file goes, while still held (one left behind, naming its pid, tells
  // the next open that its owner crashed).
  const std::string lock_path = join(s.dir, kLockName);
  if (::unlink(lock_path.c_str()) != 0 && errno != ENOENT && !first) {
    first = std::make_exception_ptr(
        IoError(IoOp::Open, lock_path, 0, 0, errno, "removing the lock file"));
  }
  s.lock_fd = detail::FileDescriptor();  // closing it releases the flock
  if (first) std::rethrow_exception(first);
}

}  // namespace nvio
