// torch's checkpoint format written by the core: the zip archive torch.save writes and torch.load
// reads (also with weights_only=True, on torch 1.13 as on 2.x). nvio.save (python/nvio/
// checkpoint.py) pickles and hands the records here in one call; nvio.dcp's writer lays out its
// data files (one archive per tensor, and byte items) with the same code. Reading stays in Python
// (python/nvio/_torchzip.py), which answers torch's own loader.
//
// The archive: "<dir>/data.pkl" (the pickle), "<dir>/byteorder", "<dir>/data/<key>" (each
// storage's bytes), "<dir>/version", every record stored (uncompressed) with its CRC-32, record
// data 64-byte aligned as torch's writer aligns it, the zip64 extensions past 4 GiB. A record's
// local header pads up to its data with the extra field torch's writer uses ("FB", then 'Z'
// bytes). With Placement::ByAddress a storage's data starts at a file offset congruent to its
// address modulo the page size (where the address is 64-byte aligned), so that the direct middle
// of each write needs no bounce copy.
//
// Writing (ArchiveFile::write): a replacement of the target (nvio/replace_file.hpp) sized to the
// final length first (writes inside a file are not extending writes, which ext4 serialises); the
// storages with one batch of the handle straight from their memory while their CRC-32s are
// computed on threads; then the headers, small records and central directories (which hold the
// CRCs), merged into few extents, with a second batch that syncs the file; then the rename.
//
// Ownership: an ArchiveFile copies the small records and byte items it is given, never a
// storage's bytes: those are read from the caller's memory by pieces() and write(), so they must
// stay valid and unchanged until the last of those calls returns. Thread-safety: none; one thread
// builds an ArchiveFile and writes it (pieces() and write() compute the CRC-32s on threads of
// their own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nvio/export.hpp"
#include "nvio/handle.hpp"

NVIO_API_BEGIN

namespace nvio {

// Sizes and offsets at or above this use the zip64 fields. A parameter so that tests can reach
// the zip64 layout with a small archive; never above its default.
inline constexpr std::uint64_t kZip64Limit = 0xFFFFFFFF;

// One record of an archive. A storage's bytes are not copied: they are written from `data`, which
// must stay valid and unchanged until the write returns. Other records (data.pkl, byteorder,
// version) are copied when added.
struct ArchiveRecord {
  std::string name;  // "archive/data.pkl", "archive/data/0", ...
  const void* data = nullptr;
  std::uint64_t size = 0;
  bool storage = false;
};

enum class Placement {
  Packed,     // each record's data at the first 64-byte aligned offset after its header
  ByAddress,  // storages congruent to their address modulo the page size (see above)
};

// A file of torch archives and byte items, each starting 64-byte aligned after the one before:
// nvio.save's file is one archive; a DCP data file one archive per tensor plus byte items. Items
// are laid out as they are added (their offsets are final at once); the CRC-32s, headers and
// central directories are made when the file is written. Move-only; one thread builds and writes
// it.
class ArchiveFile {
 public:
  struct Span {
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
  };
  // A storage's bytes as they go into the file.
  struct StorageExtent {
    const void* data = nullptr;
    std::uint64_t size = 0;
    std::uint64_t offset = 0;
  };
  // One piece of the file: bytes made here (`bytes`), or a storage's memory (`storage` >= 0, an
  // index into storages()).
  struct Piece {
    std::uint64_t offset = 0;
    std::string bytes;
    std::ptrdiff_t storage = -1;
  };

  // Throws InvalidArgument for a zip64_limit above kZip64Limit.
  explicit ArchiveFile(std::uint64_t zip64_limit = kZip64Limit);

  // Adds a byte item (copied) after the last item, 64-byte aligned.
  Span add_bytes(const void* data, std::size_t size);
  // Adds an archive of `records` in this order after the last item, 64-byte aligned; its storages
  // follow those of earlier archives in storages().
  Span add_archive(std::span<const ArchiveRecord> records, Placement placement);

  std::uint64_t size() const noexcept { return end_; }
  // The storages with bytes (not empty), in the order added.
  const std::vector<StorageExtent>& storages() const noexcept { return storages_; }

  // The file's pieces in file order with every CRC-32 computed: the storages, and the bytes made
  // here merged into runs where less than a page lies between them (zeros between; never across a
  // storage). Thread-safe against nothing: do not add items meanwhile.
  std::vector<Piece> pieces() const;

  // Writes the file in place of `path` (see above) and returns its size. With Durability::Data
  // the data is fdatasync'ed before the rename and the directory fsync'ed after it. On an error
  // the temporary file is removed and `path` is as it was; an IoError names `path` (the temporary
  // file only in its detail).
  std::uint64_t write(Handle& handle, const std::string& path, Durability durability) const;

 private:
  struct Record {
    std::string name;
    std::uint64_t size = 0;
    std::uint64_t header_offset = 0;  // in its archive
    std::uint64_t data_offset = 0;    // in its archive
    std::string bytes;                // a small record's copy
    std::ptrdiff_t storage = -1;      // index into storages_ (a storage with bytes)
  };
  struct Archive {
    std::uint64_t base = 0;
    std::vector<Record> records;
    std::uint64_t directory = 0;  // where its central directory starts, in the archive
  };
  struct Bytes {
    std::uint64_t offset = 0;
    std::string bytes;
  };

  std::uint64_t next_item() const noexcept;
  std::vector<Piece> pieces_with(const std::vector<std::uint32_t>& storage_crcs) const;
  std::string local_header(const Record& r, std::uint32_t crc) const;
  std::string central_directory(const Archive& a, const std::vector<std::uint32_t>& crcs) const;
  std::uint32_t record_crc(const Record& r, const std::vector<std::uint32_t>& storage_crcs) const;

  std::uint64_t zip64_limit_;
  std::uint64_t end_ = 0;
  std::vector<Archive> archives_;
  std::vector<Bytes> items_;
  std::vector<StorageExtent> storages_;
};

}  // namespace nvio
NVIO_API_END
