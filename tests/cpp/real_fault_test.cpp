// Real faults on real file systems (issue 10), with no seam or fake engine: the kernel reports each
// fault. ENOSPC on a small loop-mounted ext4, EROFS on a read-only mount, a file truncated by
// another process while an asynchronous read of it is in flight, and a file that the caller (the
// user `nobody`) may not open. Mounting and changing user need root (CI runs as root); the tests
// skip with the reason elsewhere.
#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::DirectIo;
using nvio::Handle;
using nvio::Options;

// Small enough to fill in milliseconds (also under the sanitizers), large enough for several
// pieces of every write. At this size ext4's free space lies in at most 4 runs (checked with
// filefrag: 4 and 8 MiB yes, 5 MiB no), so a file written in order into all of it fits in the
// extents its inode holds and needs no extent index block: exactly the space left fits.
constexpr std::size_t kFsBytes = 4 * MiB;
// The user and group `nobody` (the same number on every Linux distribution).
constexpr uid_t kNobody = 65534;

enum class Mode { Blocking, Async };
const char* to_string(Mode mode) { return mode == Mode::Blocking ? "blocking" : "async"; }

// A write the way `mode` says: the blocking call, or a submit and a wait for its ticket (so that
// an error surfaces from the submit or from the wait, as a caller would see it).
void write_with(Handle& h, Mode mode, const void* buf, std::size_t len, const std::string& path,
                std::uint64_t offset, const nvio::WriteOptions& wo = {}) {
  if (mode == Mode::Blocking) {
    h.write(buf, len, path, offset, wo);
  } else {
    h.wait(h.submit_write(buf, len, path, offset, wo));
  }
}

void read_with(Handle& h, Mode mode, void* buf, std::size_t len, const std::string& path,
               std::uint64_t offset) {
  if (mode == Mode::Blocking) {
    h.read(buf, len, path, offset);
  } else {
    h.wait(h.submit_read(buf, len, path, offset));
  }
}

// Runs `fn` and returns the E it threw; nullopt (and a failure) when it threw nothing or
// something else.
template <typename E, typename Fn>
std::optional<E> thrown_by(Fn&& fn, const std::string& what_for) {
  try {
    fn();
    ADD_FAILURE() << what_for << ": no exception";
  } catch (const E& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what_for << ": expected " << typeid(E).name() << ", got " << typeid(e).name()
                  << ": " << e.what();
  }
  return std::nullopt;
}

// The error of a failed write of [offset, offset + length) of `path` names the path, the errno and
// its text, and a failed piece inside the request.
void expect_names_failure(const nvio::IoError& e, int err, const std::string& path,
                          std::uint64_t offset, std::uint64_t length) {
  EXPECT_EQ(e.error_code(), err) << e.what();
  EXPECT_EQ(e.path(), path);
  EXPECT_TRUE(contains(e.what(), "'" + path + "'"));
  EXPECT_TRUE(contains(e.what(), std::strerror(err)));
  EXPECT_TRUE(contains(e.what(), fmt::format("(errno {})", err)));
  EXPECT_GE(e.offset(), offset) << e.what();
  EXPECT_LE(e.offset() + e.length(), offset + length) << e.what();
  EXPECT_TRUE(contains(e.what(), fmt::format("offset {} length {}", e.offset(), e.length())));
}

// After a failed write of [offset, offset + length) with the pattern for `seed`, every byte of the
// file inside that range is either the byte written or zero (not written: a hole, or past the
// end): a failure may leave part of the data, never wrong bytes such as another file's stale
// blocks. Byte by byte, since a failed piece may end anywhere inside a sector. The file is no
// longer than the request's end.
::testing::AssertionResult only_pattern_or_zeros(const std::string& path, std::uint64_t offset,
                                                 std::uint64_t length, std::uint64_t seed) {
  const std::vector<unsigned char> file = read_file(path);
  if (file.size() > offset + length) {
    return ::testing::AssertionFailure() << path << " grew to " << file.size()
                                         << " bytes, past the request's end " << offset + length;
  }
  std::vector<unsigned char> expected(file.size() > offset ? file.size() - offset : 0);
  nvio::pattern::fill(expected.data(), expected.size(), offset, seed);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const unsigned char got = file[offset + i];
    if (got != expected[i] && got != 0) {
      return ::testing::AssertionFailure() << path << ": the byte at file offset " << offset + i
                                           << " is neither the byte written nor zero";
    }
  }
  return ::testing::AssertionSuccess();
}

class RealFaults : public EngineTest {
 protected:
  // Options of one case: this engine, `direct`, and pieces small enough that every write here is
  // cut into several, some of them in flight together.
  Options options(DirectIo direct) const {
    Options o;
    o.engine = kind();
    o.direct = direct;
    o.block_size = 256 * KiB;
    o.queue_depth = 4;
    o.intra_op_parallelism = 2;
    return o;
  }
};

// Direct I/O on and off, On only where the directory supports O_DIRECT.
std::vector<DirectIo> direct_modes(const std::string& dir) {
  if (nvio::probe_directory(dir).supported) return {DirectIo::On, DirectIo::Off};
  return {DirectIo::Off};
}

// ---- ENOSPC ----------------------------------------------------------------------------------

// A full file system: each write that does not fit fails with NoSpace naming ENOSPC, the path and
// the failed piece; every write reported done reads back exactly; a write of exactly the space
// left fits; overwriting allocated bytes of a full file system works; what a failed write left
// in its file is its own data or zeros. Each engine, direct I/O on and off, blocking and async.
TEST_P(RealFaults, NoSpace) {
  std::string why;
  std::optional<LoopMount> probe = LoopMount::make(dir(), kFsBytes, &why);
  if (!probe) GTEST_SKIP() << "cannot mount a small ext4 file system: " << why;
  const std::vector<DirectIo> directs = direct_modes(probe->path());
  probe.reset();
  for (const Mode mode : {Mode::Blocking, Mode::Async}) {
    for (const DirectIo direct : directs) {
      SCOPED_TRACE(fmt::format("{}, direct {}", to_string(mode), nvio::to_string(direct)));
      std::optional<LoopMount> m = LoopMount::make(dir(), kFsBytes, &why);
      ASSERT_TRUE(m) << why;
      Handle h(options(direct));

      // A write that fits, at an unaligned offset, reads back.
      const std::string small = m->file("small.bin");
      GuardedBuffer sb(MiB + 123, BufKind::Plus3);
      sb.fill_pattern(4113, 1);
      ASSERT_NO_THROW(write_with(h, mode, sb.data(), sb.size(), small, 4113));
      EXPECT_EQ(file_size(small), static_cast<std::int64_t>(4113 + sb.size()));
      EXPECT_TRUE(file_range_has_pattern(read_file(small), 4113, sb.size(), 1));

      // Exactly the space left fits, and fills the file system. Written in order, one piece at a
      // time: ext4 allocates blocks as pieces arrive (delayed allocation is off on a nearly full
      // file system), and pieces written out of order can leave the file in more extents than
      // its inode holds, needing an extent index block that the full file system no longer has
      // (then the last piece fails with ENOSPC, rightly: see kFsBytes).
      // Synced first, so that no block of small.bin is still only reserved (delayed allocation),
      // and let go of by the handle, which would keep it open with ext4's preallocation.
      h.close_files();
      m->sync();
      const std::uint64_t left = m->available_bytes();
      ASSERT_GT(left, 2 * MiB);
      const std::string exact = m->file("exact.bin");
      {
        Options in_order = options(direct);
        in_order.queue_depth = 1;
        in_order.intra_op_parallelism = 1;
        Handle sequential(in_order);
        GuardedBuffer eb(left, BufKind::Aligned);
        eb.fill_pattern(0, 2);
        ASSERT_NO_THROW(write_with(sequential, mode, eb.data(), left, exact, 0))
            << left << " bytes";
      }
      EXPECT_TRUE(file_range_has_pattern(read_file(exact), 0, left, 2));
      ASSERT_EQ(m->available_bytes(), 0u) << "the file system should be full now";

      // One more block does not fit: not in a new file, not past the end of a full one.
      GuardedBuffer one(4096 + 1, BufKind::Plus1);
      one.fill_pattern(0, 3);
      const std::string more = m->file("more.bin");
      if (auto e = thrown_by<nvio::NoSpace>(
              [&] { write_with(h, mode, one.data(), one.size(), more, 0); }, "a new file")) {
        expect_names_failure(*e, ENOSPC, more, 0, one.size());
      }
      EXPECT_TRUE(only_pattern_or_zeros(more, 0, one.size(), 3));
      one.fill_pattern(left, 3);
      if (auto e = thrown_by<nvio::NoSpace>(
              [&] { write_with(h, mode, one.data(), one.size(), exact, left); }, "appending")) {
        expect_names_failure(*e, ENOSPC, exact, left, one.size());
      }
      EXPECT_TRUE(file_range_has_pattern(read_file(exact), 0, left, 2))
          << "a failed append changed the bytes before it";

      // Overwriting allocated bytes needs no space: it works on the full file system.
      GuardedBuffer ob(MiB + 5, BufKind::Plus4095);
      ob.fill_pattern(4096 + 5, 4);
      ASSERT_NO_THROW(write_with(h, mode, ob.data(), ob.size(), exact, 4096 + 5));
      {
        const auto bytes = read_file(exact);
        EXPECT_TRUE(file_range_has_pattern(bytes, 0, 4096 + 5, 2));
        EXPECT_TRUE(file_range_has_pattern(bytes, 4096 + 5, ob.size(), 4));
        EXPECT_TRUE(
            file_range_has_pattern(bytes, 4096 + 5 + ob.size(), left - 4096 - 5 - ob.size(), 2));
      }

      // A large write over more than the space left, from an unaligned offset: NoSpace, and its
      // file holds only its own data or zeros.
      ASSERT_EQ(::unlink(exact.c_str()), 0);
      ASSERT_EQ(::unlink(more.c_str()), 0);
      h.close_files();  // the removed files' space comes back when nothing holds them open
      m->sync();
      const std::uint64_t freed = m->available_bytes();
      ASSERT_GT(freed, 2 * MiB);
      const std::string big = m->file("big.bin");
      const std::size_t big_len = freed + 2 * MiB + 5;
      {
        GuardedBuffer bb(big_len, BufKind::Plus1);
        bb.fill_pattern(1, 5);
        if (auto e = thrown_by<nvio::NoSpace>(
                [&] { write_with(h, mode, bb.data(), big_len, big, 1); }, "a large write")) {
          expect_names_failure(*e, ENOSPC, big, 1, big_len);
        }
        EXPECT_TRUE(bb.guards_intact());
      }
      EXPECT_TRUE(only_pattern_or_zeros(big, 1, big_len, 5));
      EXPECT_LT(m->available_bytes(), MiB) << "the large write should have filled the space";
      EXPECT_TRUE(file_range_has_pattern(read_file(small), 4113, sb.size(), 1))
          << "a failed write changed another file";

      // Several writes over more than the space left, each into its own file, all submitted
      // before any is waited for when async: each is either done, and then reads back exactly,
      // or a NoSpace; some are refused. One after the other, the first is done; async, it need
      // not be: the pieces of several writes are in flight together, the kernel allocates for
      // them in whatever order it runs them (io_uring hands extending direct writes to its
      // worker threads), and the space can go to pieces of later writes (seen in CI).
      ASSERT_EQ(::unlink(big.c_str()), 0);
      h.close_files();
      m->sync();
      const std::uint64_t room = m->available_bytes();
      const std::size_t each = MiB + 7;
      const std::size_t count = room / each + 3;
      std::vector<std::unique_ptr<GuardedBuffer>> bufs;
      std::vector<nvio::Ticket> tickets;
      for (std::size_t i = 0; i < count; ++i) {
        bufs.push_back(std::make_unique<GuardedBuffer>(each, kAllBufKinds[i % 5]));
        bufs.back()->fill_pattern(17, 10 + i);
        if (mode == Mode::Async) {
          tickets.push_back(
              h.submit_write(bufs.back()->data(), each, m->file(fmt::format("f{}.bin", i)), 17));
        }
      }
      std::size_t done = 0;
      std::size_t refused = 0;
      std::optional<std::size_t> a_done;  // which file was written: async, any may be refused
      for (std::size_t i = 0; i < count; ++i) {
        SCOPED_TRACE(fmt::format("write {} of {}", i, count));
        const std::string path = m->file(fmt::format("f{}.bin", i));
        try {
          if (mode == Mode::Async) {
            h.wait(tickets[i]);
          } else {
            h.write(bufs[i]->data(), each, path, 17);
          }
          ++done;
          if (!a_done) a_done = i;
          EXPECT_TRUE(file_range_has_pattern(read_file(path), 17, each, 10 + i))
              << "a write reported done does not read back";
        } catch (const nvio::NoSpace& e) {
          ++refused;
          expect_names_failure(e, ENOSPC, path, 17, each);
          EXPECT_TRUE(only_pattern_or_zeros(path, 17, each, 10 + i));
        } catch (const std::exception& e) {
          ADD_FAILURE() << "write " << i << " failed with " << typeid(e).name() << ": " << e.what();
        }
      }
      if (mode == Mode::Blocking) {
        EXPECT_GT(done, 0u);
      }
      EXPECT_GT(refused, 0u);
      EXPECT_LE(done * each, room) << "more reported written than there was space for";
      EXPECT_EQ(h.pending(), 0u);
      EXPECT_EQ(h.wait(), 0u);

      // The handle still works: a read of a file whose write was done (with async writes, the
      // first file is not always the one that found room; when none did, one written now).
      if (!a_done) {
        // Every write refused: only right when the space ran out (not room for one left).
        EXPECT_LT(m->available_bytes(), each) << "every write was refused with room left";
        for (std::size_t i = 0; i < count; ++i) {
          const std::string path = m->file(fmt::format("f{}.bin", i));
          ASSERT_TRUE(::unlink(path.c_str()) == 0 || errno == ENOENT) << path;
        }
        h.close_files();
        m->sync();
        a_done = 0;
        ASSERT_NO_THROW(write_with(h, mode, bufs[0]->data(), each, m->file("f0.bin"), 17));
      }
      GuardedBuffer rb(each, BufKind::Plus3);
      rb.fill_sentinel();
      ASSERT_NO_THROW(
          read_with(h, mode, rb.data(), each, m->file(fmt::format("f{}.bin", *a_done)), 17));
      EXPECT_TRUE(buffer_has_pattern(rb.data(), each, 17, 10 + *a_done));
      EXPECT_TRUE(rb.guards_intact());
    }
  }
}

// ---- EROFS -----------------------------------------------------------------------------------

// On a read-only mount every write (to an existing file, to a new one, truncating or not,
// blocking or async) raises ReadOnlyFileSystem naming EROFS and the path, and changes nothing;
// reads still work.
TEST_P(RealFaults, ReadOnlyMount) {
  std::string why;
  std::optional<LoopMount> m = LoopMount::make(dir(), kFsBytes, &why);
  if (!m) GTEST_SKIP() << "cannot mount a small ext4 file system: " << why;
  const std::vector<DirectIo> directs = direct_modes(m->path());
  const std::string data = m->file("data.bin");
  const std::size_t data_len = 2 * MiB + 123;
  write_pattern_file(data, data_len, 1);
  const std::string fresh = m->file("new.bin");
  ASSERT_EQ(m->remount_read_only(), "");
  // The fault is real: the kernel refuses a plain open for writing.
  ASSERT_LT(::open(data.c_str(), O_WRONLY | O_CLOEXEC), 0);
  ASSERT_EQ(errno, EROFS);

  GuardedBuffer wb(MiB + 5, BufKind::Plus1);
  wb.fill_pattern(4113, 2);
  for (const DirectIo direct : directs) {
    Handle h(options(direct));
    for (const Mode mode : {Mode::Blocking, Mode::Async}) {
      SCOPED_TRACE(fmt::format("{}, direct {}", to_string(mode), nvio::to_string(direct)));
      for (const std::string& path : {data, fresh}) {
        for (const nvio::Truncate truncate : {nvio::Truncate::No, nvio::Truncate::AtEnd}) {
          SCOPED_TRACE(path + (truncate == nvio::Truncate::AtEnd ? ", truncate at end" : ""));
          nvio::WriteOptions wo;
          wo.truncate = truncate;
          if (auto e = thrown_by<nvio::ReadOnlyFileSystem>(
                  [&] { write_with(h, mode, wb.data(), wb.size(), path, 4113, wo); }, "write")) {
            expect_names_failure(*e, EROFS, path, 4113, wb.size());
          }
        }
      }
      EXPECT_EQ(h.pending(), 0u);
      EXPECT_EQ(h.wait(), 0u);

      GuardedBuffer rb(data_len - 4113, BufKind::Plus3);
      rb.fill_sentinel();
      ASSERT_NO_THROW(read_with(h, mode, rb.data(), rb.size(), data, 4113));
      EXPECT_TRUE(buffer_has_pattern(rb.data(), rb.size(), 4113, 1));
      EXPECT_TRUE(rb.guards_intact());
    }
  }
  EXPECT_EQ(file_size(fresh), -1) << "a refused write created the file";
  const auto bytes = read_file(data);
  EXPECT_EQ(bytes.size(), data_len);
  EXPECT_TRUE(file_range_has_pattern(bytes, 0, data_len, 1)) << "a refused write changed bytes";
}

// ---- a file truncated by another process during an asynchronous read ---------------------------

// A child process that truncates `path` to `size` bytes each time it is asked, and says when it
// has. Ownership: the process and both pipes; the destructor ends the process (closing its
// command pipe) and reaps it. The child only makes async-signal-safe calls (the parent has
// threads). Not thread-safe.
class Truncator {
 public:
  Truncator(const std::string& path, off_t size) {
    int cmd[2];
    int ack[2];
    if (::pipe2(cmd, O_CLOEXEC) != 0) return;
    if (::pipe2(ack, O_CLOEXEC) != 0) {
      ::close(cmd[0]);
      ::close(cmd[1]);
      return;
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(cmd[1]);
      ::close(ack[0]);
      char c = 0;
      while (::read(cmd[0], &c, 1) == 1) {
        const char result = ::truncate(path.c_str(), size) == 0 ? 'y' : 'n';
        if (::write(ack[1], &result, 1) != 1) ::_exit(2);
      }
      ::_exit(0);
    }
    ::close(cmd[0]);
    ::close(ack[1]);
    command_ = cmd[1];
    ack_ = ack[0];
    if (pid_ < 0) stop();
  }
  ~Truncator() { stop(); }
  Truncator(const Truncator&) = delete;
  Truncator& operator=(const Truncator&) = delete;

  bool running() const { return pid_ > 0; }
  // Asks for a truncation and returns at once.
  bool ask() const {
    const char c = 't';
    return ::write(command_, &c, 1) == 1;
  }
  // Waits until the truncation asked for is done; false when it failed.
  bool done() const {
    char c = 0;
    return ::read(ack_, &c, 1) == 1 && c == 'y';
  }

 private:
  void stop() {
    if (command_ >= 0) ::close(command_);
    if (ack_ >= 0) ::close(ack_);
    command_ = ack_ = -1;
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  pid_t pid_ = -1;
  int command_ = -1;
  int ack_ = -1;
};

// Another process truncates the file while a large asynchronous read of it is in flight. The read
// either finished first, and then holds exactly the file's bytes (the pattern of this round: no
// stale bytes of an earlier round, no zeros), or it raises ShortFile saying the file was truncated
// and how long it is now. The truncation is asked for as soon as the read is submitted. Even
// rounds read from the device (the page cache dropped), slow enough for the truncation to land
// inside the read; odd rounds from the page cache, where the read mostly finishes first. The
// rounds go on until ShortFile has been seen; the test fails if it never was, so it cannot pass
// without exercising that path.
TEST_P(RealFaults, TruncatedDuringAsyncRead) {
  NVIO_SKIP_FORK_UNDER_TSAN();
  const std::string path = file("shrinking.bin");
  constexpr std::size_t kLength = 4 * MiB + 123;
  constexpr off_t kShrinkTo = MiB;  // page aligned: the kernel zeroes no partial page
  constexpr int kMinRounds = 8;
  constexpr int kMaxRounds = 40;
  Truncator truncator(path, kShrinkTo);
  ASSERT_TRUE(truncator.running()) << "fork: " << std::strerror(errno);
  struct Config {
    const char* name;
    unsigned queue_depth;
    unsigned parallelism;
  };
  for (const Config& c : {Config{"one piece at a time", 1, 1}, Config{"parallel", 8, 2}}) {
    for (const DirectIo direct : direct_modes(dir())) {
      SCOPED_TRACE(fmt::format("{}, direct {}", c.name, nvio::to_string(direct)));
      Options o = options(direct);
      o.block_size = 16 * KiB;
      o.queue_depth = c.queue_depth;
      o.intra_op_parallelism = c.parallelism;
      Handle h(o);
      GuardedBuffer buf(kLength, BufKind::Aligned);
      int completed = 0;
      int short_files = 0;
      for (int round = 0; round < kMaxRounds && (round < kMinRounds || short_files == 0); ++round) {
        const std::uint64_t seed = 100 + static_cast<std::uint64_t>(round);
        write_pattern_file(path, kLength, seed);
        if (round % 2 == 0) drop_cache(path);
        buf.fill_sentinel();
        const nvio::Ticket t = h.submit_read(buf.data(), kLength, path, 0);
        ASSERT_TRUE(truncator.ask());
        try {
          h.wait(t);
          ++completed;
          EXPECT_TRUE(buffer_has_pattern(buf.data(), kLength, 0, seed))
              << "round " << round << ": a read reported done holds wrong bytes";
        } catch (const nvio::ShortFile& e) {
          ++short_files;
          EXPECT_EQ(e.path(), path);
          EXPECT_EQ(e.offset(), 0u);
          EXPECT_EQ(e.length(), kLength);
          EXPECT_EQ(e.file_size(), static_cast<std::uint64_t>(kShrinkTo)) << e.what();
          EXPECT_TRUE(contains(e.what(), "size is now " + std::to_string(kShrinkTo)));
          EXPECT_TRUE(contains(e.what(), "truncated"));
        } catch (const std::exception& e) {
          ADD_FAILURE() << "round " << round << ": " << typeid(e).name() << ": " << e.what();
        }
        ASSERT_TRUE(truncator.done()) << "the other process could not truncate " << path;
        ASSERT_EQ(file_size(path), static_cast<std::int64_t>(kShrinkTo));
        EXPECT_TRUE(buf.guards_intact());
      }
      RecordProperty(fmt::format("{}_direct_{}", c.name, nvio::to_string(direct)),
                     fmt::format("{} completed, {} ShortFile", completed, short_files));
      EXPECT_GE(short_files, 1) << "the truncation never landed during a read (" << completed
                                << " reads finished first): the ShortFile path was not tested";
      EXPECT_EQ(h.pending(), 0u);
    }
  }
}

// ---- permission denied -----------------------------------------------------------------------

// As `nobody`, a file readable only by root cannot be read or written, a root-owned file not
// written, and no file created in a root-owned directory: PermissionDenied naming EACCES and the
// path, through the blocking and the async calls, with no crash. A root-owned file readable by
// all still reads (the denial is the file's mode, not the way to it). The checks run in a child
// process that became `nobody`; it reports what failed through a pipe and its exit status.
TEST_P(RealFaults, PermissionDeniedAsNobody) {
  if (::geteuid() != 0) GTEST_SKIP() << "becoming the user nobody needs root";
  NVIO_SKIP_FORK_UNDER_TSAN();
  constexpr std::size_t kLen = 64 * KiB + 5;
  write_pattern_file(file("secret.bin"), kLen, 1);
  write_pattern_file(file("public.bin"), kLen, 2);
  ASSERT_EQ(::chmod(file("secret.bin").c_str(), 0600), 0);
  ASSERT_EQ(::chmod(file("public.bin").c_str(), 0644), 0);
  ASSERT_EQ(::chmod(dir().c_str(), 0755), 0);  // searchable by all, writable by root only
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  const Options o = options(direct_supported() ? DirectIo::On : DirectIo::Off);

  const int status = run_in_child([&]() -> int {
    ::close(report[0]);
    std::string failures;
    auto fail = [&](const std::string& what) { failures += what + "\n"; };
    // Relative paths from the test directory: the directories above it need not be searchable
    // by nobody.
    if (::chdir(dir().c_str()) != 0 || ::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 ||
        ::setuid(kNobody) != 0 || ::geteuid() != kNobody) {
      fail(std::string("cannot become nobody: ") + std::strerror(errno));
    } else if (::open("secret.bin", O_RDONLY | O_CLOEXEC) >= 0 || errno != EACCES) {
      fail("the kernel did not refuse nobody to open secret.bin");
    } else {
      Handle h(o);
      std::vector<unsigned char> buf(kLen);
      auto expect_denied = [&](const std::string& what, const std::string& path,
                               const std::function<void()>& call) {
        try {
          call();
          fail(what + ": no exception");
        } catch (const nvio::PermissionDenied& e) {
          const std::string msg = e.what();
          if (e.error_code() != EACCES || e.path() != path ||
              msg.find("'" + path + "'") == std::string::npos ||
              msg.find(std::strerror(EACCES)) == std::string::npos) {
            fail(what + ": " + msg);
          }
        } catch (const std::exception& e) {
          fail(what + ": " + typeid(e).name() + ": " + e.what());
        }
      };
      for (const Mode mode : {Mode::Blocking, Mode::Async}) {
        const std::string m = to_string(mode);
        expect_denied(m + " read of secret.bin", "secret.bin",
                      [&] { read_with(h, mode, buf.data(), kLen, "secret.bin", 0); });
        expect_denied(m + " write of secret.bin", "secret.bin",
                      [&] { write_with(h, mode, buf.data(), kLen, "secret.bin", 0); });
        expect_denied(m + " write of public.bin", "public.bin",
                      [&] { write_with(h, mode, buf.data(), kLen, "public.bin", 4096); });
        expect_denied(m + " write of a new file", "new.bin",
                      [&] { write_with(h, mode, buf.data(), kLen, "new.bin", 0); });
        try {
          read_with(h, mode, buf.data(), kLen, "public.bin", 0);
          if (nvio::pattern::first_mismatch(buf.data(), kLen, 0, 2)) {
            fail(m + " read of public.bin: wrong bytes");
          }
        } catch (const std::exception& e) {
          fail(m + " read of public.bin: " + e.what());
        }
      }
      if (h.pending() != 0) fail("operations left pending");
    }
    const std::size_t n = std::min<std::size_t>(failures.size(), 16 * KiB);  // within a pipe
    if (n > 0 && ::write(report[1], failures.data(), n) < 0) return 3;
    return failures.empty() ? 0 : 1;
  });
  ::close(report[1]);
  std::string failures;
  char chunk[4096];
  ssize_t n = 0;
  while ((n = ::read(report[0], chunk, sizeof chunk)) > 0) {
    failures.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(report[0]);
  EXPECT_EQ(status, 0) << "as nobody:\n" << failures;
  EXPECT_TRUE(file_range_has_pattern(read_file(file("secret.bin")), 0, kLen, 1));
  EXPECT_TRUE(file_range_has_pattern(read_file(file("public.bin")), 0, kLen, 2));
  EXPECT_EQ(file_size(file("new.bin")), -1);
}

INSTANTIATE_TEST_SUITE_P(Engines, RealFaults, NVIO_ALL_ENGINES, EngineParamName());

}  // namespace
}  // namespace nvio_test
