// Swapper::snapshot: a copy of every tensor into another directory, as one data file and an
// index (swapper_impl.hpp has the swapper's state and the map of its files).
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "core/align.hpp"
#include "jobs/swapper_impl.hpp"

namespace nvio {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

}  // namespace

// One Swapper::snapshot: every tensor's bytes in one data file of `dst`, packed in the order of
// their sources, then an index naming that file. Its steps run in the order declared below, on
// the calling thread, with the swapper's mutex held throughout (`lock`): the entries the items
// point to cannot change or move meanwhile.
struct Swapper::Impl::Snapshot {
  // Staging buffer sizes a snapshot tries, largest first, until the budget holds two of them; it
  // takes up to kStagingSlots of that size where the budget has room at once.
  static constexpr std::array<std::size_t, 5> kStagingSizes{16u << 20, 4u << 20, 1u << 20,
                                                            128u << 10, kPage};
  static constexpr std::size_t kStagingSlots = 4;
  static constexpr const char* kData = "data.swap";  // the data file's name

  // A tensor's place in the copy.
  struct Item {
    std::string name;
    const Entry* entry;
    std::string source;
    std::uint64_t offset;  // in the snapshot's data file
    std::uint64_t cloned;  // its first bytes shared with the source's blocks, not copied
  };
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

  Snapshot(Impl& swapper, Lock& held, const std::string& dst_dir)
      : s(swapper), lock(held), dst(strip_trailing_slashes(dst_dir)), data_path(join(dst, kData)) {}

  // Creates `dst`; throws InvalidArgument when it is the swapper's own directory or already
  // holds swap data.
  void check_destination();
  // The items, sources in file order (sequential reads), and the data file's size.
  void lay_out();
  // Fills the data file (when total > 0) and makes it durable: staging, cloning, copying.
  void write_data();
  // Writes the index, last: a snapshot is whole once it has one. Removes the data file when
  // that fails.
  void write_index();

  std::vector<std::shared_ptr<SwapBuffer>> take_staging();
  void clone_blocks(int fd);
  // Copies what clone_blocks left, through the staging slots; on any failure waits for every
  // operation in flight, removes the data file and throws.
  void copy_chunks(int fd, const std::vector<std::shared_ptr<SwapBuffer>>& staging);
  // Plans the next chunk into `slot` (its writes and pieces) and returns its reads: none once
  // only items of no bytes (or cloned ones) were left.
  std::vector<ReadExtent> stage(Slot& slot, std::size_t chunk);
  // Verifies the checksums of the items whose bytes `slot` holds (read, not yet written).
  void check_chunk(const Slot& slot, XXH3_state_t* hash) const;

  Impl& s;
  Lock& lock;
  const std::string dst;
  const std::string data_path;
  std::vector<Item> items;
  std::uint64_t total = 0;
  // The copy's position: the item being staged, and its bytes already staged.
  std::size_t item = 0;
  std::uint64_t done_in_item = 0;
};

void Swapper::Impl::Snapshot::check_destination() {
  make_directories(dst);
  std::error_code ec;
  if (fs::equivalent(dst, s.dir, ec)) {
    throw InvalidArgument(fmt::format(
        "swapper: snapshot into '{}', the swapper's own directory: give another directory "
        "(close(delete_files=false) keeps the files in place)",
        dst));
  }
  for (const auto& entry : fs::directory_iterator(dst, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == kIndexName || name.ends_with(kSwapSuffix)) {
      throw InvalidArgument(
          fmt::format("swapper: snapshot into '{}', which already holds swap "
                      "data ('{}'): give an empty directory",
                      dst, name));
    }
  }
  if (ec) throw_io_error(IoOp::Open, dst, 0, 0, ec.value(), "listing the snapshot directory");
}

void Swapper::Impl::Snapshot::lay_out() {
  items.reserve(s.entries.size());
  for (const auto& [name, e] : s.entries) {
    if (e.error) std::rethrow_exception(e.error);
    items.push_back({name, &e, e.file == kNoFile ? std::string() : s.files.at(e.file).path, 0, 0});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return std::tie(a.source, a.entry->offset) < std::tie(b.source, b.entry->offset);
  });
  for (Item& it : items) {
    if (it.entry->size == 0) continue;
    it.offset = detail::round_up(total, alignment_for(it.entry->size));
    total = it.offset + it.entry->size;
  }
}

void Swapper::Impl::Snapshot::write_data() {
  const std::vector<std::shared_ptr<SwapBuffer>> staging = take_staging();
  const int fd = detail::open_file(data_path, O_WRONLY | O_CREAT | O_TRUNC);
  if (fd < 0) throw_io_error(IoOp::Open, data_path, 0, 0, -fd);
  const detail::FileDescriptor data(fd);
  // The final size first: direct writes inside the file are not extending writes, which file
  // systems (ext4) serialise. The writes go by path, so that the handle opens the file for
  // O_DIRECT: this descriptor is a buffered one, through which the whole snapshot went into the
  // page cache (a second copy, and all of it written back by the final fdatasync).
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    throw_io_error(IoOp::Truncate, data_path, 0, total, errno);
  }
  clone_blocks(fd);
  copy_chunks(fd, staging);
}

// Staging slots from the budget: two at least (a chunk written while the next is read), and up to
// kStagingSlots when the budget has room for them at once, so that several chunks' reads and
// writes are in flight together.
std::vector<std::shared_ptr<SwapBuffer>> Swapper::Impl::Snapshot::take_staging() {
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
  return staging;
}

// Whole blocks are cloned where the file system can share them (XFS with reflink, btrfs): they
// then cost no reads, no writes and no space until one of the two files is rewritten. What
// cannot be (sub-block tails, small packed tensors, everything on ext4) is copied afterwards.
// Cloned bytes are not read, so not verified here; a checksum is checked whenever the bytes are
// read back from the snapshot.
void Swapper::Impl::Snapshot::clone_blocks(int fd) {
  detail::FileFacts facts;
  if (detail::file_facts(fd, facts) != 0 || facts.block_size == 0) return;
  const std::uint64_t block = facts.block_size;
  std::unordered_map<std::string, detail::FileDescriptor> sources;
  for (Item& it : items) {
    const std::uint64_t length = it.entry->size / block * block;
    if (length == 0 || it.entry->offset % block != 0 || it.offset % block != 0) continue;
    auto [source, added] = sources.try_emplace(it.source);
    if (added) {
      const int src = detail::open_file(it.source, O_RDONLY);
      if (src < 0) return;  // the copy reports it, with its context
      source->second = detail::FileDescriptor(src);
    }
    // The first refusal ends cloning (a file system without it refuses every clone); the copy
    // then moves the rest, and reports any real fault itself.
    if (detail::clone_range(source->second.get(), it.entry->offset, length, fd, it.offset) != 0)
      return;
    it.cloned = length;
    s.counters.bytes_cloned += length;
  }
}

void Swapper::Impl::Snapshot::copy_chunks(int fd,
                                          const std::vector<std::shared_ptr<SwapBuffer>>& staging) {
  const std::size_t chunk = staging.front()->size();
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
    for (;;) {
      // Every free slot gets the next chunk's reads.
      while (!free_slots.empty() && item < items.size()) {
        Slot& slot = *free_slots.back();
        const std::vector<ReadExtent> reads = stage(slot, chunk);
        if (reads.empty()) break;
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
      check_chunk(slot, hash.get());
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

std::vector<ReadExtent> Swapper::Impl::Snapshot::stage(Slot& slot, std::size_t chunk) {
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
                     it.entry->offset + done_in_item, it.source});
    slot.writes.push_back({slot.base + at, static_cast<std::size_t>(length), target, data_path});
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
  return reads;
}

void Swapper::Impl::Snapshot::check_chunk(const Slot& slot, XXH3_state_t* hash) const {
  for (const Piece& p : slot.pieces) {
    const Item& it = items[p.item];
    // A partly cloned item's checksum covers bytes this copy did not read.
    if (!it.entry->checksum || it.cloned > 0) continue;
    if (p.length == it.entry->size) {
      verify(it.name, it.source, it.entry->offset, p.length, it.entry->checksum, p.data);
      continue;
    }
    // An item split over chunks is hashed piece by piece, in order.
    if (XXH3_64bits_update(hash, p.data, p.length) != XXH_OK) {
      throw MemoryError("swapper: XXH3_64bits_update failed", EINVAL);
    }
    if (p.last) {
      const std::uint64_t actual = XXH3_64bits_digest(hash);
      XXH3_64bits_reset(hash);
      if (actual != *it.entry->checksum) {
        throw ChecksumMismatch(it.name, it.source, it.entry->offset, it.entry->size,
                               *it.entry->checksum, actual);
      }
    }
  }
}

void Swapper::Impl::Snapshot::write_index() {
  std::vector<std::pair<std::string, const Entry*>> list;
  std::unordered_map<const Entry*, std::uint64_t> offsets;
  for (const Item& it : items) {
    list.emplace_back(it.name, it.entry);
    offsets[it.entry] = it.offset;
  }
  std::sort(list.begin(), list.end());
  json doc = s.index_document(list, [](const Entry&) { return std::string(kData); });
  for (std::size_t i = 0; i < list.size(); ++i)
    doc["entries"][i]["offset"] = offsets[list[i].second];
  try {
    s.write_index(dst, doc);
  } catch (...) {
    ::unlink(data_path.c_str());
    throw;
  }
}

void Swapper::snapshot(const std::string& dst_dir) {
  Impl& s = *impl_;
  Impl::Call call(s, Impl::Need::Open);
  Impl::Snapshot snapshot(s, call.lock, dst_dir);
  snapshot.check_destination();
  // Every byte on disk first: the copy reads the files, not the caller's buffers.
  s.drain(call.lock);
  if (const std::exception_ptr first = s.take_failures()) std::rethrow_exception(first);
  snapshot.lay_out();
  if (snapshot.total > 0) snapshot.write_data();
  snapshot.write_index();
}

}  // namespace nvio
