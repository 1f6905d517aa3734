// `nvio bench --pattern random`: blocks at uniform random offsets with a fixed number of
// operations in flight, by descriptor through the handle's submit/wait_some, reporting IOPS and
// latency percentiles (as fio's randread/randwrite with norandommap).
#include <fcntl.h>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "bench_impl.hpp"
#include "cli.hpp"
#include "nvio/errors.hpp"
#include "nvio/file.hpp"
#include "nvio/file_descriptor.hpp"
#include "nvio/gpu.hpp"
#include "nvio/handle.hpp"
#include "nvio/memory.hpp"
#include "nvio/options.hpp"
#include "nvio/pattern.hpp"
#include "nvio/stripe.hpp"
#include "nvio/system.hpp"
#include "procs.hpp"

namespace nvio_cli::bench {

namespace {

// ---- random I/O ---------------------------------------------------------------------------------

// Uniform block-aligned offsets below file_size, like fio's randread with norandommap: a
// splitmix64 stream, scaled to the block count by a 128-bit multiply (no modulo bias worth
// naming). Not thread-safe; one per loop.
class BlockPicker {
 public:
  BlockPicker(std::uint64_t seed, std::uint64_t file_size, std::size_t block)
      : state_(seed), blocks_(file_size / block), block_(block) {}
  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    const auto index =
        static_cast<std::uint64_t>((static_cast<unsigned __int128>(z) * blocks_) >> 64);
    return index * block_;
  }

 private:
  std::uint64_t state_;
  std::uint64_t blocks_;
  std::size_t block_;
};

// The submissions in flight, and their completions collected in bulk as they finish. Owns no
// buffers; not thread-safe.
class InFlight {
 public:
  explicit InFlight(std::size_t capacity) : completions_(capacity) {
    entries_.reserve(capacity);
    groups_.reserve(capacity);
  }
  void push(std::size_t group, nvio::Ticket ticket) { entries_.push_back({group, ticket}); }
  bool empty() const { return entries_.empty(); }
  // Waits until at least one submission has completed and returns the groups of all that have,
  // in the order they finished (Handle::wait_some); throws the first failure among them.
  const std::vector<std::size_t>& wait_some(nvio::Handle& handle) {
    groups_.clear();
    const std::size_t n = handle.wait_some(completions_, 1);
    std::exception_ptr first;
    for (std::size_t i = 0; i < n; ++i) {
      const nvio::Completion& c = completions_[i];
      // At most `capacity` entries: a linear search costs less than a hash map's allocations.
      auto it = std::find_if(entries_.begin(), entries_.end(),
                             [&](const Entry& e) { return e.ticket == c.ticket; });
      groups_.push_back(it->group);
      *it = entries_.back();
      entries_.pop_back();
      if (c.error && !first) first = c.error;
    }
    if (first) std::rethrow_exception(first);
    return groups_;
  }

 private:
  struct Entry {
    std::size_t group = 0;
    nvio::Ticket ticket = 0;
  };
  std::vector<Entry> entries_;
  std::vector<nvio::Completion> completions_;
  std::vector<std::size_t> groups_;
};

// Waits for every operation of the handle on every way out of a random loop (an I/O error raised
// by one wait leaves the others in flight), so that none outlives the buffers and the descriptor
// declared before it. Errors here are dropped: the first one is already on its way out.
class DrainOnExit {
 public:
  explicit DrainOnExit(nvio::Handle& handle) : handle_(handle) {}
  ~DrainOnExit() {
    try {
      handle_.wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): see the class comment
    }
  }
  DrainOnExit(const DrainOnExit&) = delete;
  DrainOnExit& operator=(const DrainOnExit&) = delete;

 private:
  nvio::Handle& handle_;
};

// The file opened once for a random run as an nvio::File: its descriptors (O_DIRECT where the
// options allow and the file system supports it) and facts are taken once, so that an operation
// makes no metadata system call, as fio's do not (by path or descriptor, each would cost a statx,
// and an fcntl for a descriptor). Read-only for a read-only run of an existing file (which may not
// be writable); otherwise made when missing, never truncated.
nvio::File open_for_random(nvio::Handle& handle, const Plan& plan) {
  const bool read_only = plan.existing_size && plan.op == Op::Read;
  if (!read_only) {
    const int fd = nvio::open_file(plan.path, O_RDWR | O_CREAT);
    if (fd < 0) nvio::throw_io_error(nvio::IoOp::Open, plan.path, 0, 0, -fd);
    const nvio::FileDescriptor made(fd);  // closed here: the File opens its own
  }
  return nvio::File(handle, plan.path,
                    read_only ? nvio::FileMode::Read : nvio::FileMode::ReadWrite);
}

// Untimed chunks of the pattern: written over, or read back and checked against, [0, end).
constexpr std::size_t kLayoutChunk = std::size_t{8} << 20;

void lay_out(const nvio::File& file, const Plan& plan) {
  nvio::AlignedBuffer chunk(std::min<std::uint64_t>(kLayoutChunk, plan.end()));
  for (std::uint64_t at = 0; at < plan.end(); at += chunk.size()) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), plan.end() - at));
    nvio::pattern::fill(chunk.data(), n, at, plan.seed);
    file.write(chunk.data(), n, at, {.memory = nvio::MemoryKind::Host});
  }
}

void check_file(const nvio::File& file, const Plan& plan, OpResult& result) {
  nvio::AlignedBuffer chunk(std::min<std::uint64_t>(kLayoutChunk, plan.end()));
  for (std::uint64_t at = 0; at < plan.end(); at += chunk.size()) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), plan.end() - at));
    file.read(chunk.data(), n, at, {.memory = nvio::MemoryKind::Host});
    result.bad_offset = nvio::pattern::first_mismatch(chunk.data(), n, at, plan.seed);
    if (result.bad_offset) break;
  }
  result.verified = !result.bad_offset;
}

// The p-quantile (nearest rank) of `v`, in microseconds; reorders v.
double percentile_us(std::vector<std::uint64_t>& v, std::size_t n, double p) {
  if (n == 0) return 0;
  auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(n)));
  rank = std::clamp<std::size_t>(rank, 1, n) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(rank),
                   v.begin() + static_cast<std::ptrdiff_t>(n));
  return static_cast<double>(v[rank]) / 1e3;
}

// A random run keeps one --size buffer per operation in flight: --outstanding 8192 of 4 MiB is
// 32 GiB. The messages about that memory name the flags that make it.
std::string random_memory_text(const Plan& plan) {
  const RandomPlan& r = plan.random;
  return fmt::format(
      "--pattern random keeps one --size buffer per operation in flight: --outstanding {}{} x "
      "--size {} = {:.1f} GiB",
      r.outstanding, r.outstanding_given ? "" : " (default: queue_depth x parallelism)",
      human_bytes(plan.size),
      static_cast<double>(r.outstanding) * static_cast<double>(plan.size) / (1ULL << 30));
}

// The buffer slots; a refused allocation (the check above passed: overcommit, a limit it does not
// read) is still reported with the flags that asked for it.
nvio::AlignedBuffer random_slots(const Plan& plan) {
  try {
    return nvio::AlignedBuffer(std::size_t{plan.random.outstanding} * plan.size);
  } catch (const nvio::MemoryError& e) {
    throw nvio::MemoryError(fmt::format("{}: {}", random_memory_text(plan), e.what()),
                            e.error_code());
  }
}

// Everything a random loop uses, allocated before the timed part: one buffer slot of --size bytes
// per operation in flight, the extents of each group (a group is the `batch` operations submitted
// together), the offsets in flight (for --verify) and one latency per operation.
struct RandomState {
  explicit RandomState(const Plan& plan)
      : slots(random_slots(plan)),
        groups(plan.random.outstanding / plan.random.batch),
        reads(plan.random.outstanding),
        writes(plan.random.outstanding),
        offsets(plan.random.outstanding),
        latency_ns(plan.random.capacity),
        inflight(plan.random.outstanding / plan.random.batch) {
    for (unsigned i = 0; i < plan.random.outstanding; ++i) {
      reads[i].buf = slot(i, plan);
      reads[i].length = plan.size;
      writes[i].buf = slot(i, plan);
      writes[i].length = plan.size;
    }
    // Without --verify a write stores what its slot holds: the pattern of offset 0 from here.
    for (unsigned i = 0; i < plan.random.outstanding; ++i) {
      nvio::pattern::fill(slot(i, plan), plan.size, 0, plan.seed);
    }
  }
  std::byte* slot(std::size_t i, const Plan& plan) const { return slots.bytes() + i * plan.size; }

  struct Group {
    std::size_t count = 0;  // operations in it this time (the last may be short of --batch)
    Clock::time_point submitted;
  };
  nvio::AlignedBuffer slots;
  std::vector<Group> groups;
  std::vector<nvio::FileReadExtent> reads;
  std::vector<nvio::FileWriteExtent> writes;
  std::vector<std::uint64_t> offsets;
  // 64 bits: 32 saturated at 4.29 s, which a deep queue on a slow drive exceeds (and the
  // percentiles then printed 4294967.3 us as if measured).
  std::vector<std::uint64_t> latency_ns;
  InFlight inflight;
};

// One timed loop of random reads or writes (Op::Read or Op::Write); `loop` varies the offsets.
Sample random_loop(nvio::Handle& handle, const nvio::File& file, RandomState& st, const Plan& plan,
                   Op op, unsigned loop, OpResult& result) {
  const RandomPlan& rp = plan.random;
  const bool read = op == Op::Read;
  BlockPicker picker(
      plan.seed ^ (std::uint64_t{loop} << 1 | (read ? 1 : 0)) * 0x2545f4914f6cdd1dULL, rp.file_size,
      plan.size);
  const nvio::ReadOptions read_options{.memory = nvio::MemoryKind::Host};
  const nvio::WriteOptions write_options{.memory = nvio::MemoryKind::Host};
  std::uint64_t submitted = 0;
  std::uint64_t done = 0;
  Clock::time_point deadline = Clock::time_point::max();

  // Submits group g's next operations, unless the loop is over; returns whether it did.
  auto submit = [&](std::size_t g, Clock::time_point now) {
    if (submitted >= rp.capacity || now >= deadline) return false;
    const std::size_t first = g * rp.batch;
    const auto count =
        static_cast<std::size_t>(std::min<std::uint64_t>(rp.batch, rp.capacity - submitted));
    for (std::size_t k = first; k < first + count; ++k) {
      const std::uint64_t offset = picker.next();
      st.offsets[k] = offset;
      st.reads[k].offset = offset;
      st.writes[k].offset = offset;
      if (!plan.verify) continue;
      if (read) {
        std::memset(st.slot(k, plan), 0xA5, plan.size);  // a read that moved nothing must fail
      } else {
        nvio::pattern::fill(st.slot(k, plan), plan.size, offset, plan.seed);
      }
    }
    st.groups[g] = {count, Clock::now()};
    nvio::Ticket ticket = 0;
    if (rp.batch == 1) {
      ticket =
          read ? file.submit_read(st.reads[first].buf, plan.size, st.offsets[first], read_options)
               : file.submit_write(st.writes[first].buf, plan.size, st.offsets[first],
                                   write_options);
    } else if (read) {
      ticket = file.submit_read_batch(std::span(st.reads).subspan(first, count), read_options);
    } else {
      ticket = file.submit_write_batch(std::span(st.writes).subspan(first, count), write_options);
    }
    st.inflight.push(g, ticket);
    submitted += count;
    return true;
  };

  Sample sample;
  const double cpu0 = nvio::process_cpu_seconds();
  const Clock::time_point t0 = Clock::now();
  if (rp.duration) {
    deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(*rp.duration));
  }
  Clock::time_point now = t0;
  std::size_t started = 0;
  while (started < st.groups.size() && submit(started, t0)) ++started;
  while (!st.inflight.empty()) {
    const std::vector<std::size_t>& finished = st.inflight.wait_some(handle);
    now = Clock::now();
    for (const std::size_t g : finished) {
      const RandomState::Group& group = st.groups[g];
      const auto ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - group.submitted).count();
      const auto latency = static_cast<std::uint64_t>(std::max<std::int64_t>(ns, 0));
      const std::size_t first = g * rp.batch;
      for (std::size_t k = first; k < first + group.count; ++k) {
        st.latency_ns[done++] = latency;
        if (plan.verify && read && result.verified != false) {
          result.bad_offset =
              nvio::pattern::first_mismatch(st.slot(k, plan), plan.size, st.offsets[k], plan.seed);
          if (result.bad_offset) result.verified = false;
        }
      }
      submit(g, now);
    }
  }
  sample.seconds = std::chrono::duration<double>(now - t0).count();
  sample.start = t0;
  sample.end = now;
  sample.cpu_seconds = nvio::process_cpu_seconds() - cpu0;
  sample.ops = done;
  sample.p50_us = percentile_us(st.latency_ns, done, 0.50);
  sample.p99_us = percentile_us(st.latency_ns, done, 0.99);
  sample.p999_us = percentile_us(st.latency_ns, done, 0.999);
  return sample;
}

OpResult random_op(nvio::Handle& handle, const nvio::File& file, RandomState& st, const Plan& plan,
                   Op op, Progress& progress) {
  const bool read = op == Op::Read;
  OpResult result(read ? "read" : "write", plan.size);
  const nvio::HandleStats before = handle.stats();
  for (unsigned i = 0; i < plan.loops; ++i) {
    progress.set(fmt::format("random {} loop {}/{}", result.op, i + 1, plan.loops));
    // So that buffered reads (direct off) really read the device; best effort, as for sequential.
    if (read) evict_best_effort(plan.path);
    if (plan.gate) plan.gate->wait();
    result.samples.push_back(random_loop(handle, file, st, plan, op, i, result));
  }
  result.stats = handle.stats() - before;
  if (plan.verify && read && result.verified != false) result.verified = true;
  return result;
}

}  // namespace

// More than the memory there is is refused before anything is written, with how many operations
// fit, rather than as a bare failed mmap (or a run that swaps).
void check_random_memory(const Plan& plan) {
  const RandomPlan& r = plan.random;
  const std::optional<MemoryRoom> room = memory_room();
  if (!room || plan.size <= room->bytes / r.outstanding) return;
  // Whole batches: --outstanding must stay a multiple of --batch.
  const std::uint64_t fit = room->bytes / plan.size / r.batch * r.batch;
  const std::string advice =
      fit == 0 ? fmt::format("not even {} operation{} of this --size fit{}; lower --size", r.batch,
                             r.batch == 1 ? "" : "s", r.batch == 1 ? "s" : "")
               : fmt::format(
                     "at most {} operations of this --size fit; lower --outstanding or "
                     "--size",
                     fit);
  throw nvio::MemoryError(
      fmt::format("{}, more than the {:.1f} GiB that fit ({}): {}", random_memory_text(plan),
                  static_cast<double>(room->bytes) / (1ULL << 30), room->source, advice),
      ENOMEM);
}

// The random counterpart of run_ops: the file is opened once and laid out with the pattern when it
// is shorter than --file-size (and, for --verify of writes, always, so that every block read back
// holds the pattern); a write-only --verify reads the whole file back afterwards (untimed).
std::vector<OpResult> run_random(nvio::Handle& handle, const Plan& plan) {
  const nvio::File file = open_for_random(handle, plan);
  RandomState state(plan);
  const DrainOnExit drain(handle);
  Progress progress(::isatty(STDERR_FILENO) == 1);
  const auto size = file_size(plan.path);
  if (!size || *size < plan.end() || (plan.verify && plan.op != Op::Read)) {
    progress.set("laying out the file");
    lay_out(file, plan);
  }
  std::vector<OpResult> results;
  if (plan.op != Op::Read) {
    results.push_back(random_op(handle, file, state, plan, Op::Write, progress));
  }
  if (plan.op != Op::Write) {
    results.push_back(random_op(handle, file, state, plan, Op::Read, progress));
  }
  if (!plan.verify) return results;
  if (plan.op == Op::Write) {
    check_file(file, plan, results[0]);
  } else if (plan.op == Op::Both) {
    results[0].verified = results[1].verified;  // the reads checked what the writes stored
  }
  return results;
}

}  // namespace nvio_cli::bench
