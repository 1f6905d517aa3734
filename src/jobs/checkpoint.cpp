// torch's checkpoint format, written (nvio/checkpoint.hpp): the layout, the zip structures, the
// CRC-32s on threads and the write through a handle into a replaced file.
#include "nvio/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <system_error>
#include <thread>
#include <utility>

#include "jobs/checkpoint.hpp"
#include "nvio/checksum.hpp"
#include "nvio/errors.hpp"
#include "nvio/replace_file.hpp"

namespace nvio {
namespace {

constexpr std::uint64_t kRecordAlign = 64;  // torch's writer aligns record data (kFieldAlignment)
constexpr std::uint64_t kArchivePage =
    4096;                                  // ByAddress: data congruent to its address modulo this
constexpr std::uint64_t kMergeGap = 4096;  // small pieces closer than this are one extent
constexpr std::uint64_t kCrcChunk = std::uint64_t{32} << 20;  // checksummed by one task

constexpr std::uint32_t kLocalSig = 0x04034B50;
constexpr std::uint32_t kCentralSig = 0x02014B50;
constexpr std::uint32_t kEndSig = 0x06054B50;
constexpr std::uint32_t kEnd64Sig = 0x06064B50;
constexpr std::uint32_t kEnd64LocatorSig = 0x07064B50;
constexpr std::uint16_t kUtf8Flag = 0x0800;
constexpr std::uint16_t kZip64Tag = 0x0001;
constexpr std::uint16_t kDosDate = 0x21;  // 1980-01-01, the date torch's writer stores
constexpr std::uint32_t kMax32 = 0xFFFFFFFF;
constexpr std::uint16_t kMax16 = 0xFFFF;

std::uint64_t align_up(std::uint64_t at, std::uint64_t to) { return (at + to - 1) / to * to; }

// Little-endian fields appended to a zip structure.
void put16(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 2; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put32(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// The CRC-32s of buffers, computed in pieces of kCrcChunk: on helper threads started at
// construction, while the calling thread does something else (writes the buffers), then also on
// the calling thread in results(). The helpers read the buffers: the destructor waits for them.
// One thread's object.
class Crc32Job {
 public:
  explicit Crc32Job(std::span<const std::pair<const void*, std::uint64_t>> buffers)
      : buffers_(buffers) {
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      for (std::uint64_t at = 0; at < buffers[i].second; at += kCrcChunk) {
        tasks_.push_back({i, at, std::min(kCrcChunk, buffers[i].second - at)});
      }
      total += buffers[i].second;
    }
    piece_crcs_.resize(tasks_.size());
    // Small together: a thread would cost more than it saves; results() does it all.
    if (total <= kCrcChunk) return;
    const std::size_t helpers =
        std::min<std::size_t>(tasks_.size(), std::max(1U, std::thread::hardware_concurrency()));
    threads_.reserve(helpers);
    for (std::size_t i = 0; i < helpers; ++i) {
      try {
        threads_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {  // no thread to be had: results() does the rest
        break;
      }
    }
  }
  ~Crc32Job() { join(); }
  Crc32Job(const Crc32Job&) = delete;
  Crc32Job& operator=(const Crc32Job&) = delete;

  std::vector<std::uint32_t> results() {
    work();
    join();
    std::vector<std::uint32_t> out(buffers_.size(), 0);
    for (std::size_t k = 0; k < tasks_.size(); ++k) {
      std::uint32_t& crc = out[tasks_[k].buffer];
      crc = tasks_[k].offset == 0 ? piece_crcs_[k]
                                  : crc32_combine(crc, piece_crcs_[k], tasks_[k].length);
    }
    return out;
  }

 private:
  struct Task {
    std::size_t buffer;
    std::uint64_t offset;
    std::uint64_t length;
  };

  void work() noexcept {
    for (std::size_t k = next_.fetch_add(1); k < tasks_.size(); k = next_.fetch_add(1)) {
      const auto* base = static_cast<const unsigned char*>(buffers_[tasks_[k].buffer].first);
      piece_crcs_[k] = crc32(base + tasks_[k].offset, static_cast<std::size_t>(tasks_[k].length));
    }
  }
  void join() noexcept {
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  std::span<const std::pair<const void*, std::uint64_t>> buffers_;
  std::vector<Task> tasks_;
  std::vector<std::uint32_t> piece_crcs_;
  std::atomic<std::size_t> next_{0};
  std::vector<std::thread> threads_;
};

}  // namespace

namespace detail {

std::vector<std::uint32_t> parallel_crc32(
    std::span<const std::pair<const void*, std::uint64_t>> buffers) {
  return Crc32Job(buffers).results();
}

}  // namespace detail

ArchiveFile::ArchiveFile(std::uint64_t zip64_limit) : zip64_limit_(zip64_limit) {
  if (zip64_limit == 0 || zip64_limit > kZip64Limit) {
    throw InvalidArgument("checkpoint: the zip64 limit must be in [1, 0xFFFFFFFF]");
  }
}

std::uint64_t ArchiveFile::next_item() const noexcept { return align_up(end_, kRecordAlign); }

ArchiveFile::Span ArchiveFile::add_bytes(const void* data, std::size_t size) {
  const std::uint64_t at = next_item();
  items_.push_back({at, std::string(static_cast<const char*>(data), size)});
  end_ = at + size;
  return {at, size};
}

ArchiveFile::Span ArchiveFile::add_archive(std::span<const ArchiveRecord> records,
                                           Placement placement) {
  Archive a;
  a.base = next_item();
  std::uint64_t at = 0;  // in the archive
  for (const ArchiveRecord& in : records) {
    Record r;
    r.name = in.name;
    r.size = in.size;
    r.header_offset = at;
    const std::uint64_t fixed = at + 30 + r.name.size() + (r.size >= zip64_limit_ ? 20 : 0);
    // The address relative to the archive's start, which is 64-byte aligned: alignment modulo 64
    // and the page are kept in the file (unsigned arithmetic wraps as Python's modulo does).
    const auto address = reinterpret_cast<std::uintptr_t>(in.data) - a.base;
    const bool by_address =
        in.storage && placement == Placement::ByAddress && address % kRecordAlign == 0;
    std::uint64_t data = by_address ? fixed + ((address % kArchivePage - fixed) % kArchivePage)
                                    : align_up(fixed, kRecordAlign);
    if (data - fixed < 4)
      data += by_address ? kArchivePage : kRecordAlign;  // room for the pad field
    r.data_offset = data;
    at = data + r.size;
    if (!in.storage) {
      r.bytes.assign(static_cast<const char*>(in.data), static_cast<std::size_t>(in.size));
    } else if (in.size > 0) {
      r.storage = static_cast<std::ptrdiff_t>(storages_.size());
      storages_.push_back({in.data, in.size, a.base + data});
    }
    a.records.push_back(std::move(r));
  }
  a.directory = at;
  const std::vector<std::uint32_t> no_crcs(a.records.size(), 0);  // CRCs do not change the size
  const std::uint64_t length = at + central_directory(a, no_crcs).size();
  end_ = a.base + length;
  const std::uint64_t base = a.base;
  archives_.push_back(std::move(a));
  return {base, length};
}

std::string ArchiveFile::local_header(const Record& r, std::uint32_t crc) const {
  const bool zip64 = r.size >= zip64_limit_;
  const std::uint64_t size32 = zip64 ? kMax32 : r.size;
  const std::uint64_t pad = r.data_offset - r.header_offset - 30 - r.name.size() - (zip64 ? 20 : 0);
  std::string extra;
  if (zip64) {
    put16(extra, kZip64Tag);
    put16(extra, 16);
    put64(extra, r.size);
    put64(extra, r.size);
  }
  extra += "FB";  // torch's padding field: its tag, its length, 'Z's
  put16(extra, pad - 4);
  extra.append(static_cast<std::size_t>(pad - 4), 'Z');
  std::string out;
  put32(out, kLocalSig);
  put16(out, zip64 ? 45 : 20);
  put16(out, kUtf8Flag);
  put16(out, 0);  // stored
  put16(out, 0);  // time
  put16(out, kDosDate);
  put32(out, crc);
  put32(out, size32);
  put32(out, size32);
  put16(out, r.name.size());
  put16(out, extra.size());
  return out + r.name + extra;
}

std::string ArchiveFile::central_directory(const Archive& a,
                                           const std::vector<std::uint32_t>& crcs) const {
  std::string out;
  for (std::size_t i = 0; i < a.records.size(); ++i) {
    const Record& r = a.records[i];
    std::vector<std::uint64_t> values;
    std::uint64_t size32 = r.size;
    std::uint64_t offset32 = r.header_offset;
    if (r.size >= zip64_limit_) {
      values.insert(values.end(), {r.size, r.size});
      size32 = kMax32;
    }
    if (r.header_offset >= zip64_limit_) {
      values.push_back(r.header_offset);
      offset32 = kMax32;
    }
    const int version = values.empty() ? 20 : 45;
    put32(out, kCentralSig);
    put16(out, version);
    put16(out, version);
    put16(out, kUtf8Flag);
    put16(out, 0);  // stored
    put16(out, 0);  // time
    put16(out, kDosDate);
    put32(out, crcs[i]);
    put32(out, size32);
    put32(out, size32);
    put16(out, r.name.size());
    put16(out, values.empty() ? 0 : 4 + 8 * values.size());
    for (int field = 0; field < 3; ++field) put16(out, 0);  // comment, disk, internal attributes
    put32(out, 0);                                          // external attributes
    put32(out, offset32);
    out += r.name;
    if (!values.empty()) {
      put16(out, kZip64Tag);
      put16(out, 8 * values.size());
      for (std::uint64_t v : values) put64(out, v);
    }
  }
  const std::uint64_t size = out.size();
  const std::uint64_t count = a.records.size();
  const std::uint64_t start = a.directory;
  const bool zip64 = count >= kMax16 || size >= zip64_limit_ || start >= zip64_limit_;
  if (zip64) {
    put32(out, kEnd64Sig);
    put64(out, 44);
    put16(out, 45);
    put16(out, 45);
    put32(out, 0);
    put32(out, 0);
    put64(out, count);
    put64(out, count);
    put64(out, size);
    put64(out, start);
    put32(out, kEnd64LocatorSig);
    put32(out, 0);
    put64(out, start + size);
    put32(out, 1);
  }
  put32(out, kEndSig);
  put16(out, 0);
  put16(out, 0);
  put16(out, std::min<std::uint64_t>(count, kMax16));
  put16(out, std::min<std::uint64_t>(count, kMax16));
  put32(out, std::min<std::uint64_t>(size, kMax32));
  put32(out, std::min<std::uint64_t>(start, kMax32));
  put16(out, 0);
  return out;
}

std::uint32_t ArchiveFile::record_crc(const Record& r,
                                      const std::vector<std::uint32_t>& storage_crcs) const {
  if (r.storage >= 0) return storage_crcs[static_cast<std::size_t>(r.storage)];
  return crc32(r.bytes.data(), r.bytes.size());  // a small record, or an empty storage (0)
}

std::vector<ArchiveFile::Piece> ArchiveFile::pieces_with(
    const std::vector<std::uint32_t>& storage_crcs) const {
  std::vector<Piece> small;
  for (const Bytes& item : items_) small.push_back({item.offset, item.bytes, -1});
  for (const Archive& a : archives_) {
    std::vector<std::uint32_t> crcs;
    crcs.reserve(a.records.size());
    for (const Record& r : a.records) {
      crcs.push_back(record_crc(r, storage_crcs));
      small.push_back({a.base + r.header_offset, local_header(r, crcs.back()), -1});
      if (!r.bytes.empty()) small.push_back({a.base + r.data_offset, r.bytes, -1});
    }
    small.push_back({a.base + a.directory, central_directory(a, crcs), -1});
  }
  for (std::size_t i = 0; i < storages_.size(); ++i) {
    small.push_back({storages_[i].offset, {}, static_cast<std::ptrdiff_t>(i)});
  }
  std::stable_sort(small.begin(), small.end(),
                   [](const Piece& x, const Piece& y) { return x.offset < y.offset; });
  // Runs of bytes made here, zeros between them; a storage ends a run.
  std::vector<Piece> merged;
  bool in_run = false;
  for (Piece& p : small) {
    if (p.storage >= 0) {
      merged.push_back(std::move(p));
      in_run = false;
      continue;
    }
    if (in_run) {
      Piece& run = merged.back();
      const std::uint64_t gap = p.offset - (run.offset + run.bytes.size());
      if (gap < kMergeGap) {
        run.bytes.append(static_cast<std::size_t>(gap), '\0');
        run.bytes += p.bytes;
        continue;
      }
    }
    merged.push_back(std::move(p));
    in_run = true;
  }
  return merged;
}

std::vector<ArchiveFile::Piece> ArchiveFile::pieces() const {
  std::vector<std::pair<const void*, std::uint64_t>> buffers;
  buffers.reserve(storages_.size());
  for (const StorageExtent& s : storages_) buffers.emplace_back(s.data, s.size);
  return pieces_with(detail::parallel_crc32(buffers));
}

std::uint64_t ArchiveFile::write(Handle& handle, const std::string& path,
                                 Durability durability) const {
  ReplacementFile file(path, &handle);
  const int fd = file.fd();
  file.writing([&] {
    // The final size first: the direct writes inside the file are then not extending writes.
    if (end_ > 0 && ::ftruncate(fd, static_cast<off_t>(end_)) != 0) {
      throw_io_error(IoOp::Truncate, file.temp_path(), 0, end_, errno);
    }
    const WriteOptions plain{Truncate::No, Durability::None, MemoryKind::Host};
    std::vector<WriteExtent> data;
    std::vector<std::pair<const void*, std::uint64_t>> buffers;
    data.reserve(storages_.size());
    buffers.reserve(storages_.size());
    for (const StorageExtent& s : storages_) {
      data.push_back({s.data, static_cast<std::size_t>(s.size), s.offset, fd});
      buffers.emplace_back(s.data, s.size);
    }
    // The storages go out while their CRC-32s are computed; the headers need those. A blocking
    // call: interrupted, it cancels what has not started and drains the rest before it throws.
    Crc32Job crc_job(buffers);
    if (!data.empty()) handle.write_batch(data, plain);
    const std::vector<std::uint32_t> crcs = crc_job.results();
    const std::vector<Piece> pieces = pieces_with(crcs);
    std::vector<WriteExtent> small;
    for (const Piece& p : pieces) {
      if (p.storage < 0) small.push_back({p.bytes.data(), p.bytes.size(), p.offset, fd});
    }
    // (Every archive has headers; a file of nothing has nothing to sync.)
    if (!small.empty()) {
      handle.write_batch(small, WriteOptions{Truncate::No, durability, MemoryKind::Host});
    }
  });
  file.commit(durability);
  return end_;
}

}  // namespace nvio
