// Swapper::Impl, the state behind nvio::Swapper (include/nvio/swapper.hpp), private to the
// swapper's files: swapper.cpp (the directory's lock, placement, the budget's waits, the public
// calls), swapper_read_ahead.cpp (prefetch), swapper_index.cpp (the directory's index on disk:
// write, read, validate) and swapper_snapshot.cpp (snapshots). Memory comes from the SwapPool
// (swap_pool.hpp); all I/O goes through the swapper's own Handle as batches, whose tickets are
// collected by one thread at a time (the "collector", see progress()) so that any thread waiting
// for any operation makes progress.
//
// Thread-safety: the mutable state is guarded by `mutex` (taken by Call, the prologue of every
// public call; progress() and the blocking reads let it go while they wait). `dir`, `options`,
// the constants and the static helpers need no lock; `handle` and `pool` are thread-safe.
#pragma once

#include <fmt/format.h>
#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/posix.hpp"
#include "jobs/swap_pool.hpp"
#include "nvio/errors.hpp"
#include "nvio/handle.hpp"
#include "nvio/interrupt.hpp"
#include "nvio/swapper.hpp"

namespace nvio {

struct Swapper::Impl {
  // ---- names, sizes and helpers shared by the swapper's files --------------------------------

  static constexpr const char* kIndexName = "nvio-swap.json";
  static constexpr const char* kSwapSuffix = ".swap";
  static constexpr std::uint64_t kNoFile = ~std::uint64_t{0};
  static constexpr std::uint64_t kPage = 4096;

  // Small tensors pack at 16 bytes; from a page on they start on a page so that their middle goes
  // through O_DIRECT without a bounce copy.
  static std::uint64_t alignment_for(std::uint64_t size) { return size >= kPage ? kPage : 16; }
  static std::string join(const std::string& dir, const std::string& name) {
    return dir + "/" + name;
  }
  static std::string strip_trailing_slashes(std::string dir);
  // Creates `dir` and its parents; throws IoError.
  static void make_directories(const std::string& dir);
  // Throws ChecksumMismatch when `expected` is set and the `size` bytes at `data` do not hash to
  // it.
  static void verify(const std::string& name, const std::string& path, std::uint64_t offset,
                     std::uint64_t size, const std::optional<std::uint64_t>& expected,
                     const void* data);

  // A node holding `value` for `map`, with room for it reserved in `map`, made before the operation
  // it records is submitted: inserting it afterwards (with its key set) allocates nothing, so the
  // record cannot fail once the kernel may be using the operation's memory, where a failure would
  // free a buffer that a transfer still fills.
  template <class Map, class Value>
  static typename Map::node_type prepared_node(Map& map, Value value) {
    Map scratch;
    scratch.emplace(typename Map::key_type{}, std::move(value));
    map.reserve(map.size() + 1);
    return scratch.extract(scratch.begin());
  }

  // ---- state ---------------------------------------------------------------------------------

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

  // The prologue of a public call, in this order: no interrupt checks (see swapper.hpp,
  // "Interrupt checks"), the process checked (before the mutex, see check_process), the mutex
  // taken, and then, for a call that needs it (Need::Open), the swapper checked open. Lives for
  // the call, on its thread; `lock` is the call's hold of the mutex, passed to the waits.
  class Call {
   public:
    enum class Need { Any, Open };
    Call(const Impl& s, Need need) : lock(checked(s)) {
      if (need == Need::Open) s.check_open();
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    static Lock checked(const Impl& s) {
      s.check_process();
      return Lock(s.mutex);
    }
    const ScopedInterruptCheck no_check_{nullptr};  // first: installed before anything else

   public:
    Lock lock;
  };
  using Need = Call::Need;
  struct Snapshot;  // the steps of one snapshot (swapper_snapshot.cpp)

  // ---- the directory ----------------------------------------------------------------------

  // Takes the directory's lock, adopts its index and removes what a crashed swapper left: the
  // constructor's work.
  void open_directory();
  // The names of a swapper's own files: "s<pid>-<tid>-<n>-<file number>.swap" (see new_file). Only
  // these are ever removed as stale, never another *.swap file the directory may hold.
  static bool own_file_name(const std::string& name);
  // Removes the swap files nobody owns: those of a swapper that ended without closing.
  void remove_stale(const std::unordered_set<std::string>& indexed, long previous_owner);

  // ---- the index (swapper_index.cpp) ------------------------------------------------------------

  // Adopts the tensors of the directory's index; returns the file names it lists.
  std::unordered_set<std::string> load_index();
  // The index listing `list` (in its order), each entry's file named by `file_name`.
  nlohmann::json index_document(const std::vector<std::pair<std::string, const Entry*>>& list,
                                const std::function<std::string(const Entry&)>& file_name) const;
  // Writes `doc` as the index of `directory`, durably and atomically.
  void write_index(const std::string& directory, const nlohmann::json& doc);

  // ---- files and placement ----------------------------------------------------------------

  std::uint64_t new_file(bool pack);
  void place(Entry& e, std::uint64_t size);
  void free_extent(Entry& e);

  // ---- the read-ahead (swapper_read_ahead.cpp) --------------------------------------------------

  // Takes `name` out of the read-ahead: out of the queue, or its unclaimed data dropped. A read
  // in flight stays (its Op still writes into the buffer); callers that must not see it wait for
  // the entry's readers first.
  void drop_prefetched(const std::string& name, Entry& e);
  // Takes `name` out of the queue, when it is there.
  void unqueue(const std::string& name, Entry& e);
  // Empties the queue and drops unclaimed data (reads in flight stay until finished).
  void clear_read_ahead();
  // The prefetched bytes of `name` (Ready), now the caller's; the entry leaves the read-ahead.
  std::shared_ptr<SwapBuffer> claim_prefetched(const std::string& name, Entry& e);
  // Whether prefetch() reads `e` ahead: not while its write is in flight (the caller's buffer
  // still holds the bytes), not when it is in the read-ahead already, and not when it could never
  // fit in the budget.
  bool prefetchable(const Entry& e) const;
  // Starts the read of `name` into a pool buffer, as an Op of its own, when the budget has room
  // for it without waiting (free pool memory may be dropped, prefetched data never is). Returns
  // false when it has no room. Throws the pool's MemoryError or the handle's submit error.
  bool start_prefetch(const std::string& name, Entry& e);
  // Starts the queued reads, in order, for as long as the budget has room for the next one.
  // Called whenever memory may have been freed: a write or read finished, a swap_in consumed
  // prefetched data, unclaimed data was evicted, or (seen at the caller's next call) a lent buffer
  // was destroyed. Never waits and never drops prefetched data; a name whose read cannot be
  // started (mapping or submit failure) leaves the queue, and its swap_in reports its own error.
  void start_queued() noexcept;

  // ---- waiting ------------------------------------------------------------------------------

  // Collects finished operations: at least one when `block`. One thread at a time collects (the
  // handle's tickets are each collected once); the others wait for it to announce what finished.
  // Called with the lock held and something in flight.
  void progress(Lock& lock, bool block = true);
  void finish(const Completion& c);
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
  bool at_rest(const std::string& name) const;
  // Waits until `name` is at rest; returns its entry, with the lock held. Throws InvalidArgument
  // for an unknown name and the error of a failed write.
  Entry& settled(Lock& lock, const std::string& name);
  // Makes room in the budget for `what` (`needed` bytes at most) through `attempt`, which returns
  // something true once it fits: drops free pool memory (inside attempt), then, when `drop`,
  // prefetched data nobody claimed, then waits for I/O in flight. Throws BudgetExceeded when none
  // of that can help.
  template <class Attempt>
  auto reserve(Lock& lock, Attempt attempt, std::uint64_t needed, const std::string& what,
               bool drop) -> decltype(attempt()) {
    check_fits(needed, what);
    const RoomWaiter waiter(room_waiters);
    bool waited = false;
    for (;;) {
      if (auto r = attempt()) return r;
      make_room(lock, needed, what, drop, waited);
    }
  }
  // Throws BudgetExceeded when `needed` bytes exceed the whole budget.
  void check_fits(std::uint64_t needed, const std::string& what) const;
  // One step of reserve() when `attempt` found no room: drops one prefetched buffer nobody
  // claimed (when `drop`), or else waits for I/O in flight (counting the first wait of the call,
  // `waited`), or else throws BudgetExceeded.
  void make_room(Lock& lock, std::uint64_t needed, const std::string& what, bool drop,
                 bool& waited);
  // Counted while a thread is in reserve(): the read-ahead waits (see start_queued).
  struct RoomWaiter {
    int& waiters;
    explicit RoomWaiter(int& w) : waiters(w) { ++waiters; }
    ~RoomWaiter() { --waiters; }
    RoomWaiter(const RoomWaiter&) = delete;
    RoomWaiter& operator=(const RoomWaiter&) = delete;
  };
  void end_read(const std::string& name);
  // Reads `name`'s bytes into `buf` without the lock (the entry cannot move while it has a
  // reader); verifies them when they land in host memory.
  void read_unlocked(Lock& lock, const std::string& name, Entry& e, void* buf, MemoryKind memory);
  // swap_in(name): the bytes of `name` in a buffer lent from the pool (its prefetched data when
  // Ready, after waiting for its prefetch read when Reading).
  std::shared_ptr<SwapBuffer> lend(Lock& lock, const std::string& name, std::string* meta);
  void drain(Lock& lock);
  // The first failure no wait() has thrown yet (marked thrown); wait(id) still throws its own.
  std::exception_ptr take_failures();
};

}  // namespace nvio
