// A tensor swapper: named byte buffers (tensors, as far as nvio knows: raw pointers and sizes)
// moved out to files in one directory and back, under a memory budget in bytes. The job behind
// Python's nvio.TensorSwapper, and the replacement for DeepSpeed's swap_tensor buffer pools.
//
// Placement. A tensor smaller than pack_threshold shares a pack file with others (at a 16-byte
// aligned offset, 4 KiB aligned once it is at least 4 KiB); a larger one gets a file of its own,
// at offset 0. Any size (0 included) and any address is accepted: there is no padding rule. A
// name swapped out again with the same size is rewritten in place; otherwise its old extent is
// freed (a pack file is removed once nothing in it is live). All I/O goes through the swapper's
// own Handle as write and read batches (each prefetched name is a read of its own).
//
// The budget (SwapperOptions::budget_bytes) bounds the memory the swapper holds or pins:
//   held = bytes of the caller's buffers that in-flight swap_out writes are reading from
//        + bytes mapped by the swapper's pool of locked buffers: buffers lent by swap_in(name),
//          prefetched data not yet claimed, snapshot staging, and free pool memory kept for reuse
//          (buffers of at most 2 KiB share 64 KiB slabs; of 256 KiB to 2 MiB, slabs of whole
//          2 MiB huge pages, in size classes at most 1/8 above the size, when the budget has room
//          for a slab twice over and the unused slots of slabs in use stay within 1/8 of it; any
//          other buffer of n bytes maps n rounded up to 4 KiB, or to 2 MiB from 2 MiB on).
// held never exceeds budget_bytes. When new work does not fit, the swapper first drops as much
// free pool memory as it needs, then prefetched data nobody has claimed, then waits for in-flight
// I/O to finish; when none of that can make room (the request is larger than the whole budget, or
// the rest is held by buffers the caller keeps) it throws BudgetExceeded with the sizes. A buffer
// lent by swap_in counts until the caller destroys it; swapping such a buffer out again does not
// count it twice. Threads sharing a swapper share its budget: buffers one thread keeps are not
// waited for by another's request, which throws instead (the swapper cannot tell a buffer about
// to be dropped from one kept for good), so size the budget for every thread's lent buffers.
// Reads into the caller's own memory (swap_in with a buffer) are not counted: that memory is the
// caller's.
//
// Checksums (SwapperOptions::checksums): XXH3-64 of each tensor taken from host memory when it is
// swapped out, verified whenever its bytes are read back into host memory (swap_in, prefetch,
// snapshot); a mismatch throws ChecksumMismatch naming the tensor, file and offset. A tensor
// swapped out from device memory has no checksum; one with a checksum cannot be swapped in
// straight to device memory (InvalidArgument: swap it in to a lent host buffer and copy).
//
// The directory. A lock file (nvio-swap.lock) is held with flock(LOCK_EX) for the swapper's life
// and holds the owner's pid: a second swapper on the directory, in this process or another, throws
// DirectoryLocked. close() removes the lock file (while still holding it), so one found unheld was
// left by a process that ended without closing its swapper: the next open removes the swap files
// nobody owns (*.swap not listed in the directory's index, and index temporaries) and reports what
// it removed, and whose they were, through nvio::warn. close() removes the swapper's own files;
// with delete_files = false it keeps them and writes the index (nvio-swap.json), as snapshot()
// does for a copy in another directory. Opening a directory with an index adopts its tensors
// read-only: their files are never written or removed by this swapper (a name swapped out again
// goes to a new file of its own), so a snapshot survives any number of opens.
//
// Thread-safety: every member function may be called from several threads at once. One mutex
// guards the swapper's state; I/O is waited for outside it. A swap_in (or prefetch) of a name whose
// swap_out is in flight waits for that write first, so it never reads stale bytes; a swap_out or
// evict of a name being read waits for the read. snapshot() holds the state for its whole copy
// (other calls wait for it). Buffers lent by swap_in may outlive the swapper; they may be
// destroyed on any thread. fork(): a swapper belongs to the process that opened it; in a forked
// child every call throws InvalidArgument, and close() or the destructor there removes nothing
// (the files, the lock and the I/O in flight are the parent's).
//
// Interrupt checks (nvio/interrupt.hpp): none. Every member function runs its waits to their end
// whatever check the calling thread has installed, since the swapper's shared collection of
// completions and its cleanups are not built to stop halfway (a wait left early would free
// staging memory the kernel still writes into).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "nvio/export.hpp"
#include "nvio/gpu.hpp"
#include "nvio/memory.hpp"
#include "nvio/options.hpp"

NVIO_API_BEGIN

namespace nvio {

struct SwapperOptions {
  std::uint64_t budget_bytes = 0;            // required: at least 1
  std::uint64_t pack_threshold = 1u << 20;   // smaller tensors share pack files
  std::uint64_t pack_file_size = 64u << 20;  // a pack file is not extended past this
  bool checksums = false;                    // XXH3-64 of host tensors, verified on reads
  LockMode lock = LockMode::Try;             // mlock of the pool's buffers
};

// A snapshot of the counters; bytes unless named otherwise.
struct SwapperStats {
  std::uint64_t budget_bytes = 0;
  std::uint64_t held_bytes = 0;        // writing_bytes + pool_bytes (never above the budget)
  std::uint64_t writing_bytes = 0;     // caller memory pinned by in-flight swap_out writes
  std::uint64_t pool_bytes = 0;        // mapped by the pool (lent + prefetched + staging + free)
  std::uint64_t prefetched_bytes = 0;  // pool memory holding prefetched data not yet claimed
  std::uint64_t prefetch_queued = 0;   // names prefetch() queued that wait for room to be read
  std::uint64_t free_pool_bytes = 0;   // pool memory kept for reuse, dropped when room is needed
  std::uint64_t tensors = 0;           // names known
  std::uint64_t stored_bytes = 0;      // sum of their sizes
  std::uint64_t files = 0;             // swap files in use (own and adopted)
  std::uint64_t file_bytes = 0;  // their extents' ends: disk space used, fragmentation included
  std::uint64_t writes_in_flight = 0;
  std::uint64_t reads_in_flight = 0;
  std::uint64_t swap_outs = 0;  // totals since open
  std::uint64_t swap_ins = 0;
  std::uint64_t prefetch_hits = 0;  // swap_ins served from prefetched data
  std::uint64_t bytes_written = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t budget_waits = 0;  // times new work waited for I/O to free memory
  // Bytes snapshots shared with the swap files' blocks instead of copying them (FICLONERANGE, on
  // XFS with reflink and btrfs); not counted in bytes_read.
  std::uint64_t bytes_cloned = 0;
};

// What the swapper knows of one name.
struct SwapEntryInfo {
  std::uint64_t size = 0;
  std::string meta;  // the caller's description (Python: dtype and shape)
  std::string path;  // the file holding its bytes
  std::uint64_t offset = 0;
  std::optional<std::uint64_t> checksum;  // XXH3-64, when taken
};

// A pool buffer lent by Swapper::swap_in: locked host memory holding a tensor's bytes. Its memory
// counts against the budget of the swapper that lent it until it is destroyed (on any thread,
// before or after the swapper). Not copyable; data() is writable and stays valid for its life.
class SwapBuffer {
 public:
  virtual ~SwapBuffer() = default;
  virtual void* data() const noexcept = 0;
  virtual std::size_t size() const noexcept = 0;
};

class Swapper {
 public:
  // Opens (creating it and its parents if needed) `directory`: takes its lock, adopts the tensors
  // of its index, removes what a crashed owner left (see above). Throws DirectoryLocked,
  // InvalidArgument (a budget of 0, a malformed option), FormatError (a malformed index) or the
  // IoError of a failed file operation.
  Swapper(std::string directory, const SwapperOptions& options, const Options& handle_options);
  // close(true), errors dropped.
  ~Swapper();
  Swapper(const Swapper&) = delete;
  Swapper& operator=(const Swapper&) = delete;

  // Identifies one swap_out for wait/done. 0 is never one.
  using SwapId = std::uint64_t;

  // Starts writing [buf, buf + length) as `name` (replacing what the name held) and returns at
  // once: the buffer must stay valid and unchanged until the write has finished (wait(id), done).
  // `meta` is kept with the name (and in snapshots). Blocks while the budget has no room for
  // `length` bytes of write-behind; throws BudgetExceeded when it never will. Errors of the write
  // itself are thrown by wait(id) / wait(), and by a swap_in of the name.
  SwapId swap_out(const std::string& name, const void* buf, std::size_t length, MemoryKind memory,
                  const std::string& meta = {});
  // Waits for one swap_out; throws its error (also when wait() has thrown it already).
  void wait(SwapId id);
  // True once that swap_out has finished; never blocks.
  bool done(SwapId id);
  // Waits for every write and prefetch in flight; throws the first write failure that no wait()
  // has thrown yet.
  void wait();

  // The bytes of `name` in a lent pool buffer (prefetched data when there is some), and, when
  // `meta` is given, the description it was swapped out with (read with the bytes, so the two
  // match even while other threads swap the name out again). Throws InvalidArgument for an
  // unknown name, BudgetExceeded, ChecksumMismatch or an IoError.
  std::shared_ptr<SwapBuffer> swap_in(const std::string& name, std::string* meta = nullptr);
  // The bytes of `name` into the caller's buffer of exactly its size, host or device memory.
  void swap_in(const std::string& name, void* buf, std::size_t length, MemoryKind memory);
  // Several of those at once: the reads are one batch (each extent with its memory kind), in flight
  // together (one swap_in at a time keeps only one tensor's read in flight, which small tensors
  // feel); prefetched data is copied. Every target is checked before any is read; on a failure the
  // buffers of the others may hold their tensors or not. Thread-safety and waits as for swap_in.
  struct Target {
    std::string name;
    void* buf = nullptr;
    std::size_t length = 0;
    MemoryKind memory = MemoryKind::Auto;
  };
  void swap_in(std::span<const Target> targets);
  // Reads the named tensors ahead into pool buffers, for later swap_ins; never waits. Each name
  // is a read of its own, so that a swap_in waits only for its own bytes. Names are taken in
  // order into a read-ahead queue (behind what earlier calls queued) and started as far as the
  // budget has room now; the rest start, still in order, as memory frees up: when a write or
  // read finishes, a swap_in consumes prefetched data, or evict drops it, and (seen at the next
  // call) when the caller destroys a buffer lent by swap_in. Queued reads never start while a
  // call waits for room, and prefetched data is never dropped to make room for more. A swap_in of
  // a queued name takes it out of the queue and reads it directly (into the caller's buffer when
  // it gives one); swap_out, evict and close take queued names out. Skipped: names whose write is
  // in flight, already queued, read or being read, of size 0, larger than the whole budget, and
  // those past a window of 4096 queued names. A prefetch read that fails is dropped: the swap_in
  // reads again and reports its own error. Returns how many names this call started or queued
  // (stats(): prefetch_queued, reads_in_flight). Unknown names: InvalidArgument.
  std::size_t prefetch(std::span<const std::string> names);
  // Forgets `name` and frees its file space (after its I/O in flight). False when unknown.
  bool evict(const std::string& name);

  bool contains(const std::string& name) const;
  std::optional<SwapEntryInfo> info(const std::string& name) const;
  std::vector<std::string> names() const;
  SwapperStats stats() const;
  const std::string& directory() const noexcept;

  // Copies every tensor's bytes (after the writes in flight) into `dst_dir` (created if needed;
  // it must hold no index or swap files yet): one data file and an index, synced, that a new
  // Swapper opening `dst_dir` swaps in from. Staging memory comes from the budget. Whole blocks
  // are cloned (FICLONERANGE) where the file system can share them, not copied; checksums are
  // verified for the bytes copied, and for cloned ones when they are read back.
  void snapshot(const std::string& dst_dir);

  // Waits for all I/O, then removes the swapper's own files (delete_files) or writes the index so
  // that the directory can be opened again, and releases the lock. Throws the first failure not
  // yet thrown, after finishing. Every call after close throws InvalidArgument; close again is a
  // no-op.
  void close(bool delete_files = true);

 private:
  struct NVIO_LOCAL Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nvio
NVIO_API_END
