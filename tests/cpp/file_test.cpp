// nvio::File (nvio/file.hpp): a file opened once through a handle. Bytes compared on every
// engine, at odd lengths, unaligned offsets and buffers; batches; sizes seen after growth; shared
// between threads; close() while operations are in flight refuses with FileBusy; calls after
// close and in the wrong mode raise InvalidArgument; no metadata system call per operation.
#include "nvio/file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "engine_override.hpp"
#include "held_engine.hpp"
#include "nvio/errors.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

class FileTest : public EngineTest {};

// Odd lengths at unaligned offsets into unaligned buffers, blocking and asynchronous.
TEST_P(FileTest, ReadsMatchTheFileAtOddSizesAndOffsets) {
  nvio::Handle h(base_options());
  const std::string path = file("f.bin");
  write_pattern_file(path, 3 * MiB + 17, 7);
  nvio::File f(h, path, "r");
  EXPECT_EQ(f.size(), 3 * MiB + 17);
  EXPECT_EQ(f.path(), path);
  if (direct_supported()) {
    EXPECT_GE(f.direct_fd(), 0);
    EXPECT_GT(f.direct_alignment(), 0u);
  }
  struct Case {
    std::size_t length;
    std::uint64_t offset;
  };
  const Case cases[] = {{4 * KiB, 0},      {4 * KiB, 4 * KiB},           {1, 3},
                        {4095, 4097},      {1 * MiB + 3, 511},           {3 * MiB + 17, 0},
                        {0, 3 * MiB + 17}, {12345, 3 * MiB + 17 - 12345}};
  for (BufKind kind : kAllBufKinds) {
    for (const Case& c : cases) {
      GuardedBuffer buf(c.length, kind);
      f.read(buf.data(), c.length, c.offset);
      ASSERT_TRUE(buffer_has_pattern(buf.data(), c.length, c.offset, 7))
          << to_string(kind) << " length " << c.length << " offset " << c.offset;
      ASSERT_TRUE(buf.guards_intact());
      buf.fill_sentinel();
      h.wait(f.submit_read(buf.data(), c.length, c.offset));
      ASSERT_TRUE(buffer_has_pattern(buf.data(), c.length, c.offset, 7))
          << "async " << to_string(kind) << " length " << c.length << " offset " << c.offset;
    }
  }
}

TEST_P(FileTest, WritesLandWhereAskedAndGrowTheSize) {
  nvio::Handle h(base_options());
  const std::string path = file("w.bin");
  nvio::File f(h, path, nvio::FileMode::WriteRead);
  EXPECT_EQ(f.size(), 0u);
  GuardedBuffer a(1 * MiB + 5, BufKind::Plus3);
  a.fill_pattern(0, 3);
  f.write(a.data(), a.size(), 0);
  GuardedBuffer b(4099, BufKind::Plus1);
  b.fill_pattern(2 * MiB + 1, 3);
  h.wait(f.submit_write(b.data(), b.size(), 2 * MiB + 1));
  EXPECT_EQ(f.size(), 2 * MiB + 1 + 4099);
  const auto bytes = read_file(path);
  ASSERT_EQ(bytes.size(), 2 * MiB + 1 + 4099);
  EXPECT_TRUE(file_range_has_pattern(bytes, 0, a.size(), 3));
  EXPECT_TRUE(file_range_is(bytes, a.size(), 2 * MiB + 1, 0));
  EXPECT_TRUE(file_range_has_pattern(bytes, 2 * MiB + 1, b.size(), 3));
  // Read back through the same File, past the size it had when opened (0).
  GuardedBuffer back(4099, BufKind::Vector);
  f.read(back.data(), back.size(), 2 * MiB + 1);
  EXPECT_TRUE(buffer_has_pattern(back.data(), back.size(), 2 * MiB + 1, 3));
  // truncate=AtEnd makes the file end there, and reads past it are refused with its size.
  nvio::WriteOptions cut;
  cut.truncate = nvio::Truncate::AtEnd;
  f.write(a.data(), 100, 0, cut);
  EXPECT_EQ(file_size(path), 100);
  EXPECT_THROW(f.read(back.data(), 1, 100), nvio::ShortFile);
}

TEST_P(FileTest, BatchesReadAndWriteEveryExtent) {
  nvio::Handle h(base_options());
  const std::string path = file("b.bin");
  nvio::File w(h, path, "w");
  constexpr int kExtents = 37;
  std::vector<unsigned char> src(kExtents * 5003);
  std::vector<nvio::FileWriteExtent> wx;
  for (int i = 0; i < kExtents; ++i) {
    const std::uint64_t off = static_cast<std::uint64_t>(i) * 5003;
    for (std::size_t k = 0; k < 5003; ++k) src[off + k] = static_cast<unsigned char>(off + k * 7);
    wx.push_back({src.data() + off, 5003, off});
  }
  nvio::WriteOptions sync;
  sync.durability = nvio::Durability::Data;
  w.write_batch(wx, sync);
  nvio::File r(h, path, "r");
  std::vector<unsigned char> dst(src.size(), 0xEE);
  std::vector<nvio::FileReadExtent> rx;
  for (const auto& e : wx) rx.push_back({dst.data() + e.offset, e.length, e.offset});
  h.wait(r.submit_read_batch(rx));
  EXPECT_EQ(dst, src);
  std::fill(dst.begin(), dst.end(), 0);
  r.read_batch(rx);
  EXPECT_EQ(dst, src);
  // A batch reaching past the end reads nothing and names the size.
  rx.push_back({dst.data(), 10, src.size() - 5});
  try {
    r.read_batch(rx);
    FAIL() << "a read past the end was accepted";
  } catch (const nvio::ShortFile& e) {
    EXPECT_EQ(e.file_size(), src.size());
    EXPECT_TRUE(contains(e.what(), path));
  }
}

TEST_P(FileTest, SeesBytesAnotherWriterAppended) {
  nvio::Handle h(base_options());
  const std::string path = file("grow.bin");
  write_pattern_file(path, 8 * KiB, 4);
  nvio::File f(h, path, "r");
  write_pattern_file(path, 64 * KiB, 4);  // rewritten longer in place (same inode)
  std::vector<unsigned char> buf(8 * KiB);
  f.read(buf.data(), buf.size(), 40 * KiB);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), buf.size(), 40 * KiB, 4));
  EXPECT_THROW(f.read(buf.data(), buf.size(), 60 * KiB), nvio::ShortFile);
}

TEST_P(FileTest, ModeAndStateErrorsAreTyped) {
  nvio::Handle h(base_options());
  const std::string path = file("m.bin");
  write_pattern_file(path, 4 * KiB, 1);
  std::vector<unsigned char> buf(4 * KiB);
  EXPECT_THROW(nvio::File(h, file("missing.bin"), "r"), nvio::FileNotFound);
  EXPECT_THROW(nvio::File(h, dir(), "r"), nvio::IsADirectory);
  EXPECT_THROW(nvio::File(h, path, "rw"), nvio::InvalidArgument);
  nvio::File r(h, path, "r");
  EXPECT_THROW(r.write(buf.data(), buf.size(), 0), nvio::InvalidArgument);
  nvio::File w(h, file("w.bin"), "w");
  EXPECT_THROW(w.read(buf.data(), 1, 0), nvio::InvalidArgument);
  r.close();
  EXPECT_FALSE(r.is_open());
  r.close();  // twice is nothing
  try {
    r.read(buf.data(), buf.size(), 0);
    FAIL() << "read after close";
  } catch (const nvio::InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "closed"));
  }
  nvio::File moved = std::move(w);
  EXPECT_TRUE(moved.is_open());
  EXPECT_FALSE(w.is_open());  // NOLINT(bugprone-use-after-move): moved-from is not open
  EXPECT_THROW(w.write(buf.data(), 1, 0), nvio::InvalidArgument);
}

// Many threads share one File: each reads its own ranges, blocking and asynchronous.
TEST_P(FileTest, SharedBetweenThreads) {
  nvio::Handle h(base_options());
  const std::string path = file("s.bin");
  write_pattern_file(path, 2 * MiB, 9);
  const nvio::File f(h, path, "r");
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::vector<unsigned char> buf(4 * KiB + 3);
      for (int i = 0; i < 200; ++i) {
        const std::uint64_t off =
            (static_cast<std::uint64_t>(t * 200 + i) * 1531) % (2 * MiB - buf.size());
        if (i % 2 == 0) {
          f.read(buf.data(), buf.size(), off);
        } else {
          h.wait(f.submit_read(buf.data(), buf.size(), off));
        }
        if (!buffer_has_pattern(buf.data(), buf.size(), off, 9)) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(f.in_flight(), 0u);
}

// The file's descriptors are the File's: operations on it open nothing and close nothing, and
// the handle's own cache is not used (nothing kept there).
TEST_P(FileTest, OperationsOpenNoDescriptor) {
  nvio::Handle h(base_options());
  const std::string path = file("d.bin");
  write_pattern_file(path, 1 * MiB, 2);
  nvio::File f(h, path, "r");
  std::vector<unsigned char> buf(4 * KiB);
  f.read(buf.data(), buf.size(), 0);
  const int fds = open_fd_count();
  for (int i = 0; i < 100; ++i)
    f.read(buf.data(), buf.size(), static_cast<std::uint64_t>(i) * 4096);
  EXPECT_EQ(open_fd_count(), fds);
  EXPECT_EQ(h.open_files(), 0u);
  const nvio::HandleStats st = h.stats();
  EXPECT_EQ(st.reads, 101u);
  const int own = f.direct_fd() >= 0 ? 2 : 1;
  f.close();
  EXPECT_EQ(open_fd_count(), fds - own) << "close() let go of the descriptors";
}

// A File's requests count in the handle's stats as the path form's do: reads and bytes, and a read
// refused before submission (past the end) as a failed operation.
TEST_P(FileTest, CountsInTheHandlesStats) {
  nvio::Handle h(base_options());
  const std::string path = file("st.bin");
  write_pattern_file(path, 64 * KiB, 6);
  nvio::File f(h, path, "r");
  std::vector<unsigned char> buf(10 * KiB);
  const nvio::HandleStats before = h.stats();
  f.read(buf.data(), buf.size(), 3);
  const std::vector<nvio::FileReadExtent> two = {{buf.data(), 100, 0}, {buf.data() + 100, 5, 9}};
  f.read_batch(two);
  EXPECT_THROW(f.read(buf.data(), 10, 64 * KiB - 5), nvio::ShortFile);
  const nvio::HandleStats d = h.stats() - before;
  EXPECT_EQ(d.reads, 3u);
  EXPECT_EQ(d.bytes_read, 10 * KiB + 105);
  std::uint64_t failed = 0;
  for (const auto& [err, count] : d.errors) failed += count;
  EXPECT_EQ(failed, 1u);
}

INSTANTIATE_TEST_SUITE_P(Engines, FileTest, NVIO_ALL_ENGINES, EngineParamName());

// A gate that holds every read of the file until opened.
class AllReads final : public CompletionGate {
 public:
  bool holds(const nvio::engine::Request& r) override {
    return r.direction == nvio::engine::Direction::Read;
  }
};

// close() while an operation is in flight refuses (FileBusy naming the count), and the operation
// still completes with the right bytes; once it has, close() succeeds. The destructor of a File
// with an operation in flight does not cut it off either.
TEST(FileClose, RefusesWhileOperationsAreInFlight) {
  const auto gate = std::make_shared<AllReads>();
  ScopedEngineFactory factory(held_engine_factory(gate));
  TempDir dir;
  const std::string path = dir.file("c.bin");
  write_pattern_file(path, 256 * KiB, 5);
  nvio::Options o;
  o.engine = nvio::EngineKind::Psync;
  o.direct = nvio::DirectIo::Off;
  nvio::Handle h(o);
  nvio::File f(h, path, "r");
  std::vector<unsigned char> buf(256 * KiB);
  const nvio::Ticket t = f.submit_read(buf.data(), buf.size(), 0);
  try {
    f.close();
    FAIL() << "close() with a read in flight succeeded";
  } catch (const nvio::FileBusy& e) {
    EXPECT_EQ(e.in_flight(), 1u);
    EXPECT_EQ(e.path(), path);
    EXPECT_TRUE(contains(e.what(), "in flight"));
  }
  EXPECT_TRUE(f.is_open());
  // A blocking read in another thread counts as in flight too.
  std::vector<unsigned char> buf2(4 * KiB);
  std::thread reader([&] { f.read(buf2.data(), buf2.size(), 4 * KiB); });
  while (f.in_flight() < 2) std::this_thread::yield();
  EXPECT_THROW(f.close(), nvio::FileBusy);
  gate->open();
  reader.join();
  h.wait(t);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), buf.size(), 0, 5));
  EXPECT_TRUE(buffer_has_pattern(buf2.data(), buf2.size(), 4 * KiB, 5));
  f.close();
  EXPECT_FALSE(f.is_open());

  // Destroyed with a read in flight: the read keeps the descriptors and finishes.
  gate->close();
  std::fill(buf.begin(), buf.end(), 0);
  nvio::Ticket t2 = 0;
  {
    nvio::File g(h, path, "r");
    t2 = g.submit_read(buf.data(), buf.size(), 0);
  }
  gate->open();
  h.wait(t2);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), buf.size(), 0, 5));
}

}  // namespace
}  // namespace nvio_test
