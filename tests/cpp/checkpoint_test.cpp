// The core's writer of torch's checkpoint format (jobs/checkpoint.*): a tiny archive's bytes are
// those of a known-good layout (what nvio.save's Python writer produced, which torch.load reads),
// each record's CRC-32 is right, a storage is placed by its address, and a write that fails part
// way leaves the old file and no temporary.
#include "jobs/checkpoint.hpp"

#include <dirent.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "nvio/checkpoint.hpp"
#include "nvio/checksum.hpp"
#include "nvio/pattern.hpp"
#include "test_util.hpp"

namespace {

using nvio::ArchiveFile;
using nvio::ArchiveRecord;
using nvio::Placement;
using nvio_test::MiB;
using nvio_test::TempDir;

// nvio.save's layout of data.pkl "PICKLE", byteorder "little", one storage "123456789" and
// version "3\n", packed, as its Python writer laid it out (zipfile's testzip accepts both).
const char* const kKnownLayout =
    "504b03041400000800000000210088b3bb47060000000600000010001200617263686976652f646174612e706b6c46"
    "42"
    "0e005a5a5a5a5a5a5a5a5a5a5a5a5a5a5049434b4c45504b030414000008000000002100853de31906000000060000"
    "00"
    "11000b00617263686976652f627974656f72646572464207005a5a5a5a5a5a5a6c6974746c65504b03041400000800"
    "00"
    "000021002639f4cb09000000090000000e000e00617263686976652f646174612f3046420a005a5a5a5a5a5a5a5a5a"
    "5a"
    "313233343536373839504b030414000008000000002100d19e675502000000020000000f000a00617263686976652f"
    "76"
    "657273696f6e464206005a5a5a5a5a5a330a504b010214001400000800000000210088b3bb47060000000600000010"
    "00"
    "00000000000000000000000000000000617263686976652f646174612e706b6c504b01021400140000080000000021"
    "00"
    "853de3190600000006000000110000000000000000000000000046000000617263686976652f627974656f72646572"
    "50"
    "4b01021400140000080000000021002639f4cb09000000090000000e00000000000000000000000000860000006172"
    "63"
    "686976652f646174612f30504b0102140014000008000000002100d19e675502000000020000000f00000000000000"
    "00"
    "0000000000c9000000617263686976652f76657273696f6e504b05060000000004000400f6000000020100000000";
// The same with a zip64 limit of 8: the storage's size and the central directory's end in the
// zip64 fields.
const char* const kKnownZip64Layout =
    "504b03041400000800000000210088b3bb47060000000600000010001200617263686976652f646174612e706b6c46"
    "42"
    "0e005a5a5a5a5a5a5a5a5a5a5a5a5a5a5049434b4c45504b030414000008000000002100853de31906000000060000"
    "00"
    "11000b00617263686976652f627974656f72646572464207005a5a5a5a5a5a5a6c6974746c65504b03042d00000800"
    "00"
    "000021002639f4cbffffffffffffffff0e004e00617263686976652f646174612f3001001000090000000000000009"
    "00"
    "000000000000464236005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a313233343536373839504b030414000008000000002100d19e675502000000"
    "02"
    "0000000f000a00617263686976652f76657273696f6e464206005a5a5a5a5a5a330a504b0102140014000008000000"
    "00"
    "210088b3bb470600000006000000100000000000000000000000000000000000617263686976652f646174612e706b"
    "6c"
    "504b01022d002d000008000000002100853de319060000000600000011000c0000000000000000000000ffffffff61"
    "72"
    "63686976652f627974656f72646572010008004600000000000000504b01022d002d0000080000000021002639f4cb"
    "ff"
    "ffffffffffffff0e001c0000000000000000000000ffffffff617263686976652f646174612f300100180009000000"
    "00"
    "00000009000000000000008600000000000000504b01022d002d000008000000002100d19e67550200000002000000"
    "0f"
    "000c0000000000000000000000ffffffff617263686976652f76657273696f6e010008000901000000000000504b06"
    "06"
    "2c000000000000002d002d000000000000000000040000000000000004000000000000002a01000000000000420100"
    "00"
    "00000000504b0607000000006c0200000000000001000000504b050600000000040004002a010000420100000000";

std::vector<unsigned char> from_hex(const std::string& hex) {
  std::vector<unsigned char> out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<unsigned char>(std::stoul(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

const std::string kPickle = "PICKLE";
const std::string kByteorder = "little";
const std::string kStorage = "123456789";
const std::string kVersion = "3\n";

std::vector<ArchiveRecord> tiny_records() {
  return {{"archive/data.pkl", kPickle.data(), kPickle.size(), false},
          {"archive/byteorder", kByteorder.data(), kByteorder.size(), false},
          {"archive/data/0", kStorage.data(), kStorage.size(), true},
          {"archive/version", kVersion.data(), kVersion.size(), false}};
}

std::vector<unsigned char> joined(const std::vector<ArchiveFile::Piece>& pieces,
                                  const ArchiveFile& file) {
  std::vector<unsigned char> out;
  for (const ArchiveFile::Piece& p : pieces) {
    EXPECT_EQ(p.offset, out.size()) << "a packed archive has no gaps";
    if (p.storage >= 0) {
      const auto& s = file.storages().at(static_cast<std::size_t>(p.storage));
      const auto* data = static_cast<const unsigned char*>(s.data);
      out.insert(out.end(), data, data + s.size);
    } else {
      out.insert(out.end(), p.bytes.begin(), p.bytes.end());
    }
  }
  return out;
}

std::uint32_t le32(const std::vector<unsigned char>& b, std::size_t at) {
  return b.at(at) | (b.at(at + 1) << 8) | (b.at(at + 2) << 16) |
         (static_cast<std::uint32_t>(b.at(at + 3)) << 24);
}
std::uint16_t le16(const std::vector<unsigned char>& b, std::size_t at) {
  return static_cast<std::uint16_t>(b.at(at) | (b.at(at + 1) << 8));
}

std::vector<std::string> dir_names(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  while (const dirent* e = d != nullptr ? ::readdir(d) : nullptr) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  if (d != nullptr) ::closedir(d);
  return out;
}

TEST(Checkpoint, TinyArchiveIsTheKnownLayout) {
  for (const auto& [limit, hex] : {std::pair{nvio::kZip64Limit, kKnownLayout},
                                   std::pair{std::uint64_t{8}, kKnownZip64Layout}}) {
    SCOPED_TRACE(limit);
    ArchiveFile file(limit);
    const std::vector<ArchiveRecord> records = tiny_records();
    const ArchiveFile::Span span = file.add_archive(records, Placement::Packed);
    const std::vector<unsigned char> expected = from_hex(hex);
    EXPECT_EQ(span.offset, 0u);
    EXPECT_EQ(span.length, expected.size());
    EXPECT_EQ(joined(file.pieces(), file), expected);
    TempDir dir;
    nvio::Handle handle;
    const std::string path = dir.file("tiny.pt");
    EXPECT_EQ(file.write(handle, path, nvio::Durability::Data), expected.size());
    EXPECT_EQ(nvio_test::read_file(path), expected);
  }
}

// Every local header holds the CRC-32 of the data that follows it (zlib's check value for
// "123456789" for the storage).
TEST(Checkpoint, EveryLocalHeaderHoldsItsRecordsCrc) {
  ArchiveFile file;
  file.add_archive(tiny_records(), Placement::Packed);
  const std::vector<unsigned char> bytes = joined(file.pieces(), file);
  std::size_t at = 0;
  std::vector<std::string> names;
  while (le32(bytes, at) == 0x04034B50) {
    const std::uint32_t crc = le32(bytes, at + 14);
    const std::uint32_t size = le32(bytes, at + 18);
    const std::size_t data = at + 30 + le16(bytes, at + 26) + le16(bytes, at + 28);
    names.emplace_back(reinterpret_cast<const char*>(&bytes[at + 30]), le16(bytes, at + 26));
    EXPECT_EQ(crc, nvio::crc32(&bytes.at(data), size)) << names.back();
    if (names.back() == "archive/data/0") {
      EXPECT_EQ(crc, 0xCBF43926u);
    }
    at = data + size;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"archive/data.pkl", "archive/byteorder",
                                             "archive/data/0", "archive/version"}));
}

// Placed by address, a storage's data starts at a file offset congruent to its address modulo
// the page size (a 64-byte aligned address), in an archive that starts after a byte item; its
// CRC-32, computed on several threads when large, is that of the whole buffer.
TEST(Checkpoint, StoragesArePlacedByAddressAndChecksummedInPieces) {
  std::vector<unsigned char> big(40 * MiB + 4096 + 7);
  nvio::pattern::fill(big.data(), big.size(), 0, 5);
  auto* aligned = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(big.data()) + 4095) / 4096 * 4096 + 192);
  const std::uint64_t size = 40 * MiB + 7;
  ArchiveFile file;
  const ArchiveFile::Span item = file.add_bytes("header", 6);
  const std::vector<ArchiveRecord> records = {
      {"archive/data.pkl", kPickle.data(), kPickle.size(), false},
      {"archive/data/0", aligned, size, true}};
  const ArchiveFile::Span archive = file.add_archive(records, Placement::ByAddress);
  EXPECT_EQ(item.offset, 0u);
  EXPECT_EQ(archive.offset, 64u);
  ASSERT_EQ(file.storages().size(), 1u);
  EXPECT_EQ(file.storages()[0].offset % 4096, 192u);
  EXPECT_EQ(file.size(), archive.offset + archive.length);
  const std::pair<const void*, std::uint64_t> buffer{aligned, size};
  EXPECT_EQ(nvio::detail::parallel_crc32({&buffer, 1}).at(0), nvio::crc32(aligned, size));
}

TEST(Checkpoint, AFailureMidWriteLeavesTheOldFileAndNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("ckpt.pt");
  {
    ArchiveFile old;
    old.add_archive(tiny_records(), Placement::Packed);
    nvio::Handle handle;
    old.write(handle, path, nvio::Durability::Data);
  }
  const std::vector<unsigned char> before = nvio_test::read_file(path);

  nvio_test::ScopedEngineFactory factory([](nvio::EngineKind k, unsigned qd) {
    return std::unique_ptr<nvio::engine::Engine>(
        new nvio_test::FailingRangeEngine(nvio::engine::make_backend_engine(k, qd), MiB, 1 << 30));
  });
  // Every piece touching 1 MiB or later fails: the storage goes in pieces, some before.
  nvio::Options options;
  options.block_size = 256 * 1024;
  nvio::Handle handle(options);
  std::vector<unsigned char> big(4 * MiB);
  nvio::pattern::fill(big.data(), big.size(), 0, 9);
  const std::vector<ArchiveRecord> records = {
      {"archive/data.pkl", kPickle.data(), kPickle.size(), false},
      {"archive/data/0", big.data(), big.size(), true},
      {"archive/version", kVersion.data(), kVersion.size(), false}};
  ArchiveFile file;
  file.add_archive(records, Placement::ByAddress);
  try {
    file.write(handle, path, nvio::Durability::Data);
    FAIL() << "the write succeeded";
  } catch (const nvio::IoError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.error_code(), EIO);
    EXPECT_NE(std::string(e.what()).find("temporary file"), std::string::npos) << e.what();
  }
  EXPECT_EQ(nvio_test::read_file(path), before);
  EXPECT_EQ(dir_names(dir.path()), std::vector<std::string>{"ckpt.pt"});
}

TEST(Checkpoint, ZipLimitAboveFourGibIsRefused) {
  EXPECT_THROW(ArchiveFile(nvio::kZip64Limit + 1), nvio::InvalidArgument);
  EXPECT_THROW(ArchiveFile(0), nvio::InvalidArgument);
}

}  // namespace
