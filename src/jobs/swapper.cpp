// The tensor swapper (include/nvio/swapper.hpp): the directory's lock, placement, the budget's
// waits and the public calls. Its state, and the map of its other files, are in swapper_impl.hpp.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/align.hpp"
#include "core/unique_name.hpp"
#include "jobs/swapper_impl.hpp"
#include "nvio/replace_file.hpp"
#include "nvio/warnings.hpp"

namespace nvio {

namespace {

namespace fs = std::filesystem;

constexpr const char* kLockName = "nvio-swap.lock";
// Removed files whose descriptors the handle may still keep (and so their disk space) before
// the swapper asks it to let go of all of them.
constexpr int kCloseFilesAfter = 16;

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

// ---- shared helpers -----------------------------------------------------------------------------

std::string Swapper::Impl::strip_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

void Swapper::Impl::make_directories(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_io_error(IoOp::Open, dir, 0, 0, ec.value(), "creating the swap directory");
}

void Swapper::Impl::verify(const std::string& name, const std::string& path, std::uint64_t offset,
                           std::uint64_t size, const std::optional<std::uint64_t>& expected,
                           const void* data) {
  if (!expected) return;
  const std::uint64_t actual = XXH3_64bits(data, size);
  if (actual != *expected) throw ChecksumMismatch(name, path, offset, size, *expected, actual);
}

bool Swapper::Impl::own_file_name(const std::string& name) {
  if (name.size() < 2 || name[0] != 's' || !name.ends_with(kSwapSuffix)) return false;
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

// ---- the directory ------------------------------------------------------------------------------

void Swapper::Impl::open_directory() {
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

void Swapper::Impl::remove_stale(const std::unordered_set<std::string>& indexed,
                                 long previous_owner) {
  std::vector<std::string> removed;
  std::uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    const std::string name = item.path().filename().string();
    const bool swap_file = own_file_name(name) && !indexed.contains(name);
    // The directory is this swapper's (its lock): any temporary of its index is debris.
    const bool index_temp = temporary_writer(kIndexName, name).has_value();
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

// ---- files and placement ------------------------------------------------------------------------

std::uint64_t Swapper::Impl::new_file(bool pack) {
  const std::uint64_t id = next_file_id++;
  files[id] =
      File{join(dir, session + std::to_string(next_file_number++) + kSwapSuffix), true, pack, 0, 0};
  return id;
}

void Swapper::Impl::place(Entry& e, std::uint64_t size) {
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

void Swapper::Impl::free_extent(Entry& e) {
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

// ---- waiting ------------------------------------------------------------------------------------

void Swapper::Impl::progress(Lock& lock, bool block) {
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

void Swapper::Impl::finish(const Completion& c) {
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

bool Swapper::Impl::at_rest(const std::string& name) const {
  auto it = entries.find(name);
  return it == entries.end() ||
         (it->second.writing == 0 && it->second.prefetch != Prefetch::Reading);
}

Swapper::Impl::Entry& Swapper::Impl::settled(Lock& lock, const std::string& name) {
  wait_until(lock, [&] { return at_rest(name); });
  check_open();  // closed by another thread while this one waited
  auto it = entries.find(name);
  if (it == entries.end()) {
    throw InvalidArgument(fmt::format("swapper: no tensor named '{}' in '{}'", name, dir));
  }
  if (it->second.error) std::rethrow_exception(it->second.error);
  return it->second;
}

void Swapper::Impl::check_fits(std::uint64_t needed, const std::string& what) const {
  const std::uint64_t budget = options.budget_bytes;
  if (needed > budget) {
    throw BudgetExceeded(fmt::format("swapper: {} needs {} bytes, more than the whole budget "
                                     "of {} bytes of '{}'",
                                     what, needed, budget, dir),
                         needed, budget, pool->held());
  }
}

void Swapper::Impl::make_room(Lock& lock, std::uint64_t needed, const std::string& what, bool drop,
                              bool& waited) {
  if (drop && !ready_names.empty()) {
    const std::string name = *ready_names.begin();
    drop_prefetched(name, entries.at(name));
    return;
  }
  if (!ops.empty()) {
    if (!waited) ++counters.budget_waits;
    waited = true;
    progress(lock);
    return;
  }
  const std::uint64_t budget = options.budget_bytes;
  const std::uint64_t held = pool->held();
  throw BudgetExceeded(
      fmt::format("swapper: {} needs {} bytes, but {} of the budget of {} bytes of '{}' are "
                  "held ({} by pool buffers in use: lent by swap_in and still alive, or "
                  "being read into; {} by write-behind) and no I/O in flight can free them",
                  what, needed, held, budget, dir, pool->mapped() - pool->free_bytes(),
                  pool->charged()),
      needed, budget, held);
}

void Swapper::Impl::end_read(const std::string& name) {
  --blocking_readers;
  if (auto it = entries.find(name); it != entries.end()) --it->second.readers;
  changed.notify_all();
}

void Swapper::Impl::read_unlocked(Lock& lock, const std::string& name, Entry& e, void* buf,
                                  MemoryKind memory) {
  ++e.readers;
  ++blocking_readers;
  const std::string path = files.at(e.file).path;
  const std::uint64_t offset = e.offset;
  const std::uint64_t size = e.size;
  const std::optional<std::uint64_t> checksum = e.checksum;
  lock.unlock();
  try {
    const ReadExtent extent{buf, static_cast<std::size_t>(size), offset, path};
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

std::shared_ptr<SwapBuffer> Swapper::Impl::lend(Lock& lock, const std::string& name,
                                                std::string* meta) {
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

void Swapper::Impl::drain(Lock& lock) {
  wait_until(lock, [&] { return ops.empty() && blocking_readers == 0 && !collecting; });
}

std::exception_ptr Swapper::Impl::take_failures() {
  for (auto& [id, f] : failed) {
    if (!f.reported) {
      f.reported = true;
      return f.error;
    }
  }
  return nullptr;
}

// ---- the public calls ---------------------------------------------------------------------------

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
  Impl& s = *impl_;
  if (length > 0 && buf == nullptr) {
    throw InvalidArgument(
        fmt::format("swapper: swap_out of '{}': a null buffer of {} bytes", name, length));
  }
  if (memory == MemoryKind::Auto) memory = memory_kind(buf);
  std::optional<std::uint64_t> checksum;
  if (s.options.checksums && memory == MemoryKind::Host) checksum = XXH3_64bits(buf, length);
  Impl::Call call(s, Impl::Need::Open);
  // A pool buffer lent by swap_in is already counted: its write pins nothing more.
  const bool lent = memory == MemoryKind::Host && length > 0 && s.pool->owns(buf, length);
  const std::uint64_t charge = lent ? 0 : length;
  if (charge > 0) {
    s.reserve(
        call.lock, [&] { return s.pool->try_charge(charge); }, charge,
        fmt::format("the write-behind of tensor '{}'", name), true);
  }
  // A queued read of the old bytes is not started now, only to be waited for below.
  if (auto it = s.entries.find(name); it != s.entries.end()) s.unqueue(name, it->second);
  try {
    // The name's earlier write must land first, and no read may see its extent rewritten.
    s.wait_until(call.lock, [&] {
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
  const bool in_place = e.file != Impl::kNoFile && s.files.at(e.file).owned && e.size == length;
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
  const WriteExtent extent{buf, length, e.offset, s.files.at(e.file).path};
  Ticket ticket = 0;
  decltype(s.ops)::node_type op_record;
  decltype(s.writes)::node_type write_record;
  try {
    op_record = Impl::prepared_node(s.ops, Impl::Op{Impl::Op::Kind::Write, id, charge, name});
    write_record = Impl::prepared_node(s.writes, Ticket{0});
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
  Impl& s = *impl_;
  Impl::Call call(s, Impl::Need::Any);
  if (id == 0 || id >= s.next_id) {
    throw InvalidArgument(fmt::format("swapper: {} is not a swap_out of this swapper", id));
  }
  s.wait_until(call.lock, [&] { return !s.writes.contains(id); });
  if (auto it = s.failed.find(id); it != s.failed.end()) {
    const std::exception_ptr error = it->second.error;
    s.failed.erase(it);
    std::rethrow_exception(error);
  }
}

bool Swapper::done(SwapId id) {
  Impl& s = *impl_;
  Impl::Call call(s, Impl::Need::Any);
  if (s.writes.contains(id)) s.progress(call.lock, false);
  return !s.writes.contains(id);
}

void Swapper::wait() {
  Impl& s = *impl_;
  Impl::Call call(s, Impl::Need::Any);
  s.wait_until(call.lock, [&] { return s.ops.empty(); });
  if (const std::exception_ptr first = s.take_failures()) std::rethrow_exception(first);
}

std::shared_ptr<SwapBuffer> Swapper::swap_in(const std::string& name, std::string* meta) {
  Impl& s = *impl_;
  Impl::Call call(s, Impl::Need::Open);
  std::shared_ptr<SwapBuffer> buffer = s.lend(call.lock, name, meta);
  // Lent buffers the caller destroyed since the last call may have left room.
  s.start_queued();
  return buffer;
}

void Swapper::swap_in(const std::string& name, void* buf, std::size_t length, MemoryKind memory) {
  const Target target{name, buf, length, memory};
  swap_in(std::span<const Target>(&target, 1));
}

void Swapper::swap_in(std::span<const Target> targets) {
  Impl& s = *impl_;
  Impl::Call call(s, Impl::Need::Open);
  Impl::Lock& lock = call.lock;
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
    // One batch, host and device targets together: each extent carries its memory kind.
    std::vector<ReadExtent> extents;
    extents.reserve(reads.size());
    for (const Read& r : reads) {
      const Target& t = *r.target;
      extents.push_back({t.buf, t.length, r.offset, r.path,
                         kinds[static_cast<std::size_t>(&t - targets.data())]});
    }
    if (!extents.empty()) s.handle.read_batch(extents);
    for (const Read& r : reads) {
      const Target& t = *r.target;
      if (kinds[static_cast<std::size_t>(&t - targets.data())] == MemoryKind::Host) {
        Impl::verify(t.name, r.path, r.offset, t.length, r.checksum, t.buf);
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

bool Swapper::evict(const std::string& name) {
  Impl& s = *impl_;
  Impl::Call call(s, Impl::Need::Open);
  // A queued read is not started now, only to be waited for below.
  if (auto it = s.entries.find(name); it != s.entries.end()) s.unqueue(name, it->second);
  s.wait_until(call.lock, [&] {
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
  const Impl::Call call(*impl_, Impl::Need::Any);
  return impl_->entries.contains(name);
}

std::optional<SwapEntryInfo> Swapper::info(const std::string& name) const {
  const Impl& s = *impl_;
  const Impl::Call call(s, Impl::Need::Any);
  auto it = s.entries.find(name);
  if (it == s.entries.end()) return std::nullopt;
  const Impl::Entry& e = it->second;
  SwapEntryInfo out;
  out.size = e.size;
  out.meta = e.meta;
  out.path = e.file == Impl::kNoFile ? std::string() : s.files.at(e.file).path;
  out.offset = e.offset;
  out.checksum = e.checksum;
  return out;
}

std::vector<std::string> Swapper::names() const {
  const Impl& s = *impl_;
  const Impl::Call call(s, Impl::Need::Any);
  std::vector<std::string> out;
  out.reserve(s.entries.size());
  for (const auto& [name, e] : s.entries) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

SwapperStats Swapper::stats() const {
  const Impl& s = *impl_;
  const Impl::Call call(s, Impl::Need::Any);
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
  const std::string lock_path = Impl::join(s.dir, kLockName);
  if (::unlink(lock_path.c_str()) != 0 && errno != ENOENT && !first) {
    first = std::make_exception_ptr(
        IoError(IoOp::Open, lock_path, 0, 0, errno, "removing the lock file"));
  }
  s.lock_fd = detail::FileDescriptor();  // closing it releases the flock
  if (first) std::rethrow_exception(first);
}

}  // namespace nvio
