// Error cases, per engine (the same fixture base as the conformance suite), plus the error types
// themselves. Each test asserts the exception type and that the message carries the path and the
// numbers.
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <type_traits>
#include <typeinfo>

#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::DirectIo;
using nvio::EngineKind;
using nvio::Handle;
using nvio::Options;

// Makes a file or directory immutable (FS_IMMUTABLE_FL: even root gets EPERM writing it) and
// clears the flag again on destruction so the temporary directory can be removed.
class Immutable {
 public:
  explicit Immutable(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    int flags = 0;
    if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0) {
      flags |= FS_IMMUTABLE_FL;
      ok_ = ::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
    }
    ::close(fd);
  }
  ~Immutable() {
    if (!ok_) return;
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    int flags = 0;
    if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0) {
      flags &= ~FS_IMMUTABLE_FL;
      ::ioctl(fd, FS_IOC_SETFLAGS, &flags);
    }
    ::close(fd);
  }
  bool ok() const { return ok_; }

 private:
  std::string path_;
  bool ok_ = false;
};

// Runs `fn`, expects it to throw E, and returns a copy of the caught exception's message plus
// the object (through `check`).
template <typename E, typename Fn, typename Check>
void expect_throw(Fn&& fn, Check&& check, const std::string& what_for) {
  try {
    fn();
    ADD_FAILURE() << what_for << ": no exception";
  } catch (const E& e) {
    check(e);
  } catch (const std::exception& e) {
    ADD_FAILURE() << what_for << ": wrong exception type " << typeid(e).name() << ": " << e.what();
  }
}

class Errors : public EngineTest {};

TEST_P(Errors, MissingFile) {
  Handle h(base_options());
  const std::string path = file("missing.bin");
  GuardedBuffer b(4096, BufKind::Aligned);
  auto check = [&](const nvio::FileNotFound& e) {
    EXPECT_TRUE(contains(e.what(), path));
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.error_code(), ENOENT);
    EXPECT_TRUE(contains(e.what(), std::strerror(ENOENT))) << "errno text";
    EXPECT_TRUE(contains(e.what(), "8192")) << "offset";
    EXPECT_TRUE(contains(e.what(), "4096")) << "length";
  };
  expect_throw<nvio::FileNotFound>([&] { h.read(b.data(), 4096, path, 8192); }, check, "read");
  // Open failures of asynchronous operations throw at submit.
  expect_throw<nvio::FileNotFound>([&] { h.submit_read(b.data(), 4096, path, 8192); }, check,
                                   "submit_read");
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(h.wait(), 0u);
  EXPECT_EQ(file_size(path), -1) << "a read must not create the file";

  // A write into a directory that does not exist.
  const std::string nodir = file("no-such-dir/out.bin");
  expect_throw<nvio::FileNotFound>([&] { h.write(b.data(), 4096, nodir, 0); },
                                   [&](const nvio::FileNotFound& e) {
                                     EXPECT_TRUE(contains(e.what(), nodir));
                                     EXPECT_EQ(e.error_code(), ENOENT);
                                   },
                                   "write into a missing directory");
}

TEST_P(Errors, ReadPastEnd) {
  Handle h(base_options());
  const std::string path = file("short.bin");
  write_pattern_file(path, 10000, 5);
  GuardedBuffer b(8192, BufKind::Plus1);
  b.fill_sentinel();
  auto check = [&](std::uint64_t off, std::uint64_t len) {
    return [&, off, len](const nvio::ShortFile& e) {
      EXPECT_EQ(e.file_size(), 10000u);
      EXPECT_EQ(e.path(), path);
      EXPECT_EQ(e.offset(), off);
      EXPECT_EQ(e.length(), len);
      EXPECT_TRUE(contains(e.what(), path));
      EXPECT_TRUE(contains(e.what(), "10000")) << "the message must say how many bytes there are";
      EXPECT_TRUE(contains(e.what(), std::to_string(off)));
      EXPECT_TRUE(contains(e.what(), std::to_string(len)));
    };
  };
  // Straddling the end, from an aligned and an unaligned offset.
  expect_throw<nvio::ShortFile>([&] { h.read(b.data(), 8192, path, 4096); }, check(4096, 8192),
                                "read [4096, 12288)");
  expect_throw<nvio::ShortFile>([&] { h.read(b.data(), 8192, path, 1901); }, check(1901, 8192),
                                "read [1901, 10093)");
  // Wholly past the end.
  expect_throw<nvio::ShortFile>([&] { h.read(b.data(), 10, path, 20000); }, check(20000, 10),
                                "read [20000, 20010)");
  // One byte too many.
  expect_throw<nvio::ShortFile>([&] { h.read(b.data(), 8001, path, 2000); }, check(2000, 8001),
                                "read [2000, 10001)");
  EXPECT_TRUE(b.guards_intact());
  // Exactly to the end is fine.
  ASSERT_NO_THROW(h.read(b.data(), 8000, path, 2000));
  EXPECT_TRUE(buffer_has_pattern(b.data(), 8000, 2000, 5));

  // By fd.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  expect_throw<nvio::ShortFile>([&] { h.read(b.data(), 8192, fd, 4096); },
                                [](const nvio::ShortFile& e) { EXPECT_EQ(e.file_size(), 10000u); },
                                "read by fd");

  // Asynchronously: from the submit or from the wait, but a ShortFile either way.
  bool thrown = false;
  try {
    nvio::Ticket t = h.submit_read(b.data(), 8192, fd, 4096);
    h.wait(t);
  } catch (const nvio::ShortFile& e) {
    thrown = true;
    EXPECT_EQ(e.file_size(), 10000u);
  }
  EXPECT_TRUE(thrown) << "asynchronous read past the end";
  EXPECT_EQ(h.pending(), 0u);
  ::close(fd);

  // Empty file.
  const std::string empty = file("empty.bin");
  write_file(empty, "", 0);
  expect_throw<nvio::ShortFile>([&] { h.read(b.data(), 1, empty, 0); },
                                [&](const nvio::ShortFile& e) {
                                  EXPECT_EQ(e.file_size(), 0u);
                                  EXPECT_TRUE(contains(e.what(), empty));
                                },
                                "read from an empty file");
}

TEST_P(Errors, DirectoryAsFile) {
  Handle h(base_options());
  const std::string d = file("subdir");
  ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  GuardedBuffer b(4096, BufKind::Aligned);
  b.fill_pattern(0, 1);
  auto check = [&](const nvio::IsADirectory& e) {
    EXPECT_TRUE(contains(e.what(), d));
    EXPECT_EQ(e.path(), d);
    EXPECT_EQ(e.error_code(), EISDIR);
    EXPECT_TRUE(contains(e.what(), "12288")) << "offset";
    EXPECT_TRUE(contains(e.what(), "4000")) << "length";
  };
  expect_throw<nvio::IsADirectory>([&] { h.read(b.data(), 4000, d, 12288); }, check, "read");
  expect_throw<nvio::IsADirectory>([&] { h.write(b.data(), 4000, d, 12288); }, check, "write");
  expect_throw<nvio::IsADirectory>([&] { h.submit_read(b.data(), 4000, d, 12288); }, check,
                                   "submit_read");
  expect_throw<nvio::IsADirectory>([&] { h.submit_write(b.data(), 4000, d, 12288); }, check,
                                   "submit_write");
  // By an fd that refers to a directory.
  int dfd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dfd, 0);
  expect_throw<nvio::IsADirectory>(
      [&] { h.read(b.data(), 4000, dfd, 12288); },
      [](const nvio::IsADirectory& e) { EXPECT_EQ(e.error_code(), EISDIR); }, "read by fd");
  ::close(dfd);
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(h.wait(), 0u);
}

// Writing through a descriptor opened read-only fails with EBADF and changes nothing.
TEST_P(Errors, ReadOnlyFd) {
  Handle h(base_options());
  const std::string path = file("ro.bin");
  write_pattern_file(path, 64 * KiB, 1);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  GuardedBuffer b(MiB + 123, BufKind::Plus3);
  b.fill_pattern(4113, 2);
  expect_throw<nvio::IoError>([&] { h.write(b.data(), b.size(), fd, 4113); },
                              [&](const nvio::IoError& e) {
                                EXPECT_EQ(e.error_code(), EBADF) << e.what();
                                EXPECT_TRUE(contains(e.what(), std::strerror(EBADF)));
                              },
                              "write to an O_RDONLY fd");
  // Asynchronously: the error comes from the submit or the wait.
  bool thrown = false;
  try {
    nvio::Ticket t = h.submit_write(b.data(), b.size(), fd, 4113);
    EXPECT_NE(t, 0u);
    h.wait();
  } catch (const nvio::IoError& e) {
    thrown = true;
    EXPECT_EQ(e.error_code(), EBADF) << e.what();
  }
  EXPECT_TRUE(thrown) << "asynchronous write to an O_RDONLY fd";
  EXPECT_EQ(h.pending(), 0u);
  ::close(fd);
  auto bytes = read_file(path);
  ASSERT_EQ(bytes.size(), 64 * KiB) << "the failed write changed the file size";
  EXPECT_TRUE(file_range_has_pattern(bytes, 0, 64 * KiB, 1)) << "the failed write changed bytes";
}

// A read-only target by path: an immutable file (refused even to root), or mode 0444 when the
// flag cannot be set and we are not root.
TEST_P(Errors, ReadOnlyPath) {
  Handle h(base_options());
  const std::string path = file("immutable.bin");
  write_pattern_file(path, 8192, 1);
  Immutable imm(path);
  if (!imm.ok()) {
    if (::geteuid() == 0) {
      GTEST_SKIP() << "cannot set FS_IMMUTABLE_FL on " << path
                   << " and running as root bypasses file modes";
    }
    ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  }
  GuardedBuffer b(4096, BufKind::Aligned);
  b.fill_pattern(0, 2);
  auto check = [&](const nvio::PermissionDenied& e) {
    EXPECT_TRUE(contains(e.what(), path));
    EXPECT_TRUE(contains(e.what(), "4096")) << "length";
    EXPECT_TRUE(e.error_code() == EPERM || e.error_code() == EACCES) << e.error_code();
  };
  expect_throw<nvio::PermissionDenied>([&] { h.write(b.data(), 4096, path, 0); }, check, "write");
  expect_throw<nvio::PermissionDenied>([&] { h.submit_write(b.data(), 4096, path, 0); }, check,
                                       "submit_write");
  EXPECT_EQ(h.pending(), 0u);
  // Reading it is still fine.
  b.fill_sentinel();
  ASSERT_NO_THROW(h.read(b.data(), 4096, path, 4096));
  EXPECT_TRUE(buffer_has_pattern(b.data(), 4096, 4096, 1));
  EXPECT_TRUE(file_range_has_pattern(read_file(path), 0, 8192, 1));

  // A new file in an immutable directory.
  const std::string d = file("rodir");
  ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  Immutable dimm(d);
  if (dimm.ok()) {
    const std::string inside = d + "/new.bin";
    expect_throw<nvio::PermissionDenied>(
        [&] { h.write(b.data(), 4096, inside, 0); },
        [&](const nvio::PermissionDenied& e) { EXPECT_TRUE(contains(e.what(), inside)); },
        "write into an immutable directory");
    EXPECT_EQ(file_size(inside), -1);
  }
}

// An fd number that is closed underneath nvio: EBADF, no hang.
TEST_P(Errors, ClosedFd) {
  Handle h(base_options());
  const std::string path = file("closed.bin");
  write_pattern_file(path, 64 * KiB, 1);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  // A high number that nothing else will be given while the test runs (below RLIMIT_NOFILE).
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  const int closed = static_cast<int>(std::min<rlim_t>(1000, lim.rlim_cur - 1));
  ASSERT_EQ(::dup2(fd, closed), closed);
  ::close(fd);
  ASSERT_EQ(::close(closed), 0);

  GuardedBuffer b(8192, BufKind::Aligned);
  b.fill_sentinel();
  auto check = [&](const nvio::IoError& e) { EXPECT_EQ(e.error_code(), EBADF) << e.what(); };
  expect_throw<nvio::IoError>([&] { h.read(b.data(), 8192, closed, 4096); }, check, "read");
  expect_throw<nvio::IoError>([&] { h.write(b.data(), 8192, closed, 4096); }, check, "write");
  for (bool write : {false, true}) {
    SCOPED_TRACE(write ? "submit_write" : "submit_read");
    bool thrown = false;
    try {
      if (write) {
        h.submit_write(b.data(), 8192, closed, 4096);
      } else {
        h.submit_read(b.data(), 8192, closed, 4096);
      }
      h.wait();
    } catch (const nvio::IoError& e) {
      thrown = true;
      EXPECT_EQ(e.error_code(), EBADF) << e.what();
    }
    EXPECT_TRUE(thrown);
    EXPECT_EQ(h.pending(), 0u);
    EXPECT_EQ(h.wait(), 0u);
  }
  EXPECT_TRUE(b.guards_intact());
}

// A failure among several asynchronous operations: wait() waits for all of them, throws the
// failure, and the handle stays usable.
TEST_P(Errors, ErrorSurfacesFromWait) {
  Handle h(base_options());
  // The failing operation: a write through a descriptor opened read-only. Its arguments are fine,
  // so it fails in the I/O itself (EBADF) and the error must come out of wait(). (A library that
  // checks the access mode up front may throw at the submit instead; both are accepted.)
  const std::string rof = file("readonly.bin");
  write_pattern_file(rof, 64 * KiB, 1);
  int rofd = ::open(rof.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(rofd, 0);
  const std::size_t len = 2 * MiB + 3;
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  std::size_t submitted = 0;
  bool failed_at_submit = false;
  GuardedBuffer badbuf(8192 + 5, BufKind::Plus1);
  badbuf.fill_pattern(4093, 2);
  for (int i = 0; i < 4; ++i) {
    bufs.push_back(std::make_unique<GuardedBuffer>(len, kAllBufKinds[i]));
    bufs.back()->fill_pattern(1, 40 + i);
    h.submit_write(bufs.back()->data(), len, file("good" + std::to_string(i) + ".bin"), 1);
    ++submitted;
    if (i == 1) {
      try {
        h.submit_write(badbuf.data(), badbuf.size(), rofd, 4093);
        ++submitted;
      } catch (const nvio::IoError& e) {
        failed_at_submit = true;
        EXPECT_EQ(e.error_code(), EBADF) << e.what();
      }
    }
  }
  EXPECT_EQ(h.pending(), submitted);
  RecordProperty("failed_at", failed_at_submit ? "submit" : "wait");
  if (failed_at_submit) {
    EXPECT_EQ(h.wait(), 4u);
  } else {
    expect_throw<nvio::IoError>([&] { h.wait(); },
                                [&](const nvio::IoError& e) {
                                  EXPECT_EQ(e.error_code(), EBADF) << e.what();
                                  EXPECT_TRUE(contains(e.what(), std::strerror(EBADF)));
                                },
                                "wait() with a failed operation");
  }
  EXPECT_EQ(h.pending(), 0u) << "wait() must collect every operation, failed or not";
  EXPECT_EQ(h.wait(), 0u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(file_range_has_pattern(read_file(file("good" + std::to_string(i) + ".bin")), 1, len,
                                       40 + i))
        << "operation " << i;
  }
  EXPECT_TRUE(file_range_has_pattern(read_file(rof), 0, 64 * KiB, 1))
      << "the failed write changed the read-only file";

  // wait(ticket) on the failed one throws; the good one beside it is still fine.
  GuardedBuffer g(4096, BufKind::Plus1);
  g.fill_pattern(0, 50);
  nvio::Ticket good = h.submit_write(g.data(), 4096, file("good-single.bin"), 0);
  nvio::Ticket bad = 0;
  try {
    bad = h.submit_write(badbuf.data(), badbuf.size(), rofd, 4093);
  } catch (const nvio::IoError& e) {
    EXPECT_EQ(e.error_code(), EBADF) << e.what();
  }
  if (bad != 0) {
    expect_throw<nvio::IoError>(
        [&] { h.wait(bad); },
        [&](const nvio::IoError& e) { EXPECT_EQ(e.error_code(), EBADF) << e.what(); },
        "wait(ticket) of the failed operation");
    EXPECT_THROW(h.wait(bad), nvio::InvalidArgument) << "a failed ticket is collected too";
  }
  EXPECT_NO_THROW(h.wait(good));
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_TRUE(file_range_has_pattern(read_file(file("good-single.bin")), 0, 4096, 50));

  // A ShortFile among asynchronous reads: from the submit or the wait, never lost.
  const std::string shortf = file("short.bin");
  write_pattern_file(shortf, 10000, 1);
  GuardedBuffer r(8192, BufKind::Vector);
  bool short_seen = false;
  try {
    h.submit_read(r.data(), 8192, shortf, 4096);
    h.wait();
  } catch (const nvio::ShortFile& e) {
    short_seen = true;
    EXPECT_EQ(e.file_size(), 10000u);
  }
  EXPECT_TRUE(short_seen);
  EXPECT_EQ(h.pending(), 0u);
  ::close(rofd);

  // Still usable afterwards.
  GuardedBuffer again(4096, BufKind::Aligned);
  again.fill_sentinel();
  h.read(again.data(), 4096, file("good-single.bin"), 0);
  EXPECT_TRUE(buffer_has_pattern(again.data(), 4096, 0, 50));
}

// One operation's failure must not fail others submitted beside it (e.g. in the same engine
// batch): each good ticket completes, its wait(ticket) does not throw, and its bytes are written.
TEST_P(Errors, FailureDoesNotSpillToOtherOperations) {
  Handle h(base_options());
  const std::string rof = file("readonly.bin");
  write_pattern_file(rof, 64 * KiB, 1);
  int rofd = ::open(rof.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(rofd, 0);
  GuardedBuffer bad(4096, BufKind::Aligned);
  bad.fill_pattern(0, 2);
  const std::size_t len = 256 * KiB + 7;
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  for (int i = 0; i < 3; ++i) {
    bufs.push_back(std::make_unique<GuardedBuffer>(len, kAllBufKinds[i]));
  }
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    nvio::Ticket tbad = 0;
    try {
      tbad = h.submit_write(bad.data(), 4096, rofd, 0);
    } catch (const nvio::IoError&) {
    }
    std::vector<nvio::Ticket> good;
    for (int i = 0; i < 3; ++i) {
      bufs[std::size_t(i)]->fill_pattern(0, std::uint64_t(100 * round + i));
      good.push_back(h.submit_write(bufs[std::size_t(i)]->data(), len,
                                    file("spill" + std::to_string(i) + ".bin"), 0));
    }
    if (tbad != 0) {
      EXPECT_THROW(h.wait(tbad), nvio::IoError);
    }
    for (int i = 0; i < 3; ++i) {
      try {
        h.wait(good[std::size_t(i)]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "good operation " << i << " failed: " << e.what();
      }
      EXPECT_TRUE(file_range_has_pattern(read_file(file("spill" + std::to_string(i) + ".bin")), 0,
                                         len, std::uint64_t(100 * round + i)))
          << "good operation " << i;
    }
    if (HasFailure()) break;
  }
  ::close(rofd);
}

// Destroying a handle with operations in flight waits for them (the files are complete after)
// and neither hangs nor crashes, also when one of them fails.
TEST_P(Errors, DestructorWaitsForInFlight) {
  const std::size_t len = 4 * MiB + 3;
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  const std::string shortf = file("short.bin");
  write_pattern_file(shortf, 10000, 1);
  GuardedBuffer sink(8192, BufKind::Aligned);
  int rofd = ::open(shortf.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(rofd, 0);
  {
    Options o = base_options();
    o.intra_op_parallelism = 2;
    o.queue_depth = 2;
    o.block_size = 64 * KiB;
    auto h = std::make_unique<Handle>(o);
    for (int i = 0; i < 16; ++i) {
      bufs.push_back(std::make_unique<GuardedBuffer>(len, kAllBufKinds[i % 5]));
      bufs.back()->fill_pattern(std::uint64_t(i / 2) * len, 60 + i % 2);
      h->submit_write(bufs.back()->data(), len, file("inflight" + std::to_string(i % 2) + ".bin"),
                      std::uint64_t(i / 2) * len);
    }
    try {
      h->submit_read(sink.data(), 8192, shortf, 4096);
    } catch (const nvio::ShortFile&) {
    }
    // A write that fails in the I/O (EBADF), still in flight at destruction.
    try {
      h->submit_write(sink.data(), 8192, rofd, 4096);
    } catch (const nvio::IoError&) {
    }
    EXPECT_GE(h->pending(), 16u);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_NO_THROW(h.reset());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  }
  ::close(rofd);
  EXPECT_TRUE(file_range_has_pattern(read_file(shortf), 0, 10000, 1));
  for (int f = 0; f < 2; ++f) {
    auto bytes = read_file(file("inflight" + std::to_string(f) + ".bin"));
    EXPECT_EQ(bytes.size(), 8 * len);
    EXPECT_TRUE(file_range_has_pattern(bytes, 0, 8 * len, 60 + f))
        << "the destructor returned before the writes finished";
  }
}

// Anonymous memory of whole pages with the given protection, unmapped on destruction.
class Mapping {
 public:
  Mapping(std::size_t bytes, int prot) : size_(bytes) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    base_ = static_cast<unsigned char*>(p);
    std::memset(base_, 0x5A, size_);  // faulted in: the kernel sees it present, still protected
    if (::mprotect(base_, size_, prot) != 0) {
      ::munmap(base_, size_);
      base_ = nullptr;
    }
  }
  ~Mapping() {
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  unsigned char* data() const { return base_; }

 private:
  std::size_t size_;
  unsigned char* base_ = nullptr;
};

// Where a transfer through memory the process may not access: the aligned middle bounced (an
// unaligned address), zero-copy (an aligned address), only buffered edges (a short range), and
// the same again without direct I/O.
struct BadMemoryCase {
  std::size_t address_offset;  // from the start of the mapping
  std::uint64_t file_offset;
  std::size_t length;
};
constexpr BadMemoryCase kBadMemoryCases[] = {
    {1, 0, 2 * MiB},             // unaligned buffer, aligned file range: every piece bounced
    {4095, 4096 + 17, MiB + 5},  // unaligned both: edges buffered, middle bounced
    {0, 0, MiB},                 // aligned: zero-copy direct I/O
    {3, 100, 1000},              // one buffered piece
};

template <typename Fn>
void expect_efault(Fn&& fn, const std::string& path, std::uint64_t off, std::size_t len,
                   const std::string& what) {
  SCOPED_TRACE(what);
  try {
    fn();
    ADD_FAILURE() << "no exception";
  } catch (const nvio::IoError& e) {
    EXPECT_EQ(e.error_code(), EFAULT) << e.what();
    EXPECT_EQ(e.path(), path);
    EXPECT_TRUE(contains(e.what(), path));
    EXPECT_GE(e.offset(), off);
    EXPECT_LE(e.offset() + e.length(), off + len);
    EXPECT_TRUE(contains(e.what(), "offset " + std::to_string(e.offset())));
    EXPECT_TRUE(contains(e.what(), "length " + std::to_string(e.length())));
  }
}

// A read into read-only memory (e.g. a np.memmap opened with mode='r') is an IoError with EFAULT
// through every path, bounced or not, never a SIGSEGV; the memory is left as it was.
TEST_P(Errors, ReadIntoReadOnlyMemory) {
  const std::string path = file("src.bin");
  write_pattern_file(path, 4 * MiB, 70);
  for (DirectIo direct : {DirectIo::Auto, DirectIo::Off}) {
    Options o = base_options();
    if (direct == DirectIo::Off) o.direct = direct;
    o.block_size = 256 * KiB;
    Handle h(o);
    for (const BadMemoryCase& c : kBadMemoryCases) {
      Mapping m(c.address_offset + c.length + 4096, PROT_READ);
      ASSERT_NE(m.data(), nullptr);
      const std::string what =
          fmt::format("read of {} bytes at {} into mapping + {}, direct {}", c.length,
                      c.file_offset, c.address_offset, nvio::to_string(o.direct));
      expect_efault([&] { h.read(m.data() + c.address_offset, c.length, path, c.file_offset); },
                    path, c.file_offset, c.length, what);
      expect_efault(
          [&] {
            h.wait(h.submit_read(m.data() + c.address_offset, c.length, path, c.file_offset));
          },
          path, c.file_offset, c.length, "async " + what);
      for (std::size_t i = 0; i < c.address_offset + c.length; i += 4096) {
        ASSERT_EQ(m.data()[i], 0x5A) << "read-only memory changed";
      }
    }
    // Writable up to a point, read-only after it: the error names where the bad memory starts.
    Mapping half(4 * MiB, PROT_READ | PROT_WRITE);
    ASSERT_NE(half.data(), nullptr);
    ASSERT_EQ(::mprotect(half.data() + 2 * MiB, 2 * MiB, PROT_READ), 0);
    try {
      h.read(half.data() + 1, 3 * MiB, path, 0);
      ADD_FAILURE() << "no exception";
    } catch (const nvio::IoError& e) {
      EXPECT_EQ(e.error_code(), EFAULT) << e.what();
      EXPECT_GE(e.offset(), MiB) << e.what();
      EXPECT_LT(e.offset(), 3 * MiB) << e.what();
    }
    // The handle is still usable.
    GuardedBuffer b(MiB + 5, BufKind::Plus3);
    ASSERT_NO_THROW(h.read(b.data(), MiB + 5, path, 4096 + 17));
    EXPECT_TRUE(buffer_has_pattern(b.data(), MiB + 5, 4096 + 17, 70));
  }
}

// A write from memory the process may not read (PROT_NONE) is an IoError with EFAULT, never a
// SIGSEGV.
TEST_P(Errors, WriteFromUnreadableMemory) {
  const std::string path = file("dst.bin");
  for (DirectIo direct : {DirectIo::Auto, DirectIo::Off}) {
    Options o = base_options();
    if (direct == DirectIo::Off) o.direct = direct;
    o.block_size = 256 * KiB;
    Handle h(o);
    for (const BadMemoryCase& c : kBadMemoryCases) {
      Mapping m(c.address_offset + c.length + 4096, PROT_NONE);
      ASSERT_NE(m.data(), nullptr);
      const std::string what =
          fmt::format("write of {} bytes at {} from mapping + {}, direct {}", c.length,
                      c.file_offset, c.address_offset, nvio::to_string(o.direct));
      expect_efault([&] { h.write(m.data() + c.address_offset, c.length, path, c.file_offset); },
                    path, c.file_offset, c.length, what);
      expect_efault(
          [&] {
            h.wait(h.submit_write(m.data() + c.address_offset, c.length, path, c.file_offset));
          },
          path, c.file_offset, c.length, "async " + what);
    }
    GuardedBuffer b(MiB + 5, BufKind::Plus3);
    b.fill_pattern(4096 + 17, 71);
    ASSERT_NO_THROW(h.write(b.data(), MiB + 5, path, 4096 + 17));
    EXPECT_TRUE(file_range_has_pattern(read_file(path), 4096 + 17, MiB + 5, 71));
  }
}

// A block device reports its real size (BLKGETSIZE64; its st_size is 0): a read past its end is
// refused up front with that size, and a read up to the end works.
TEST_P(Errors, BlockDeviceSize) {
  if (::geteuid() != 0) GTEST_SKIP() << "attaching a loop device needs root";
  if (::access("/usr/sbin/losetup", X_OK) != 0 && ::access("/sbin/losetup", X_OK) != 0) {
    GTEST_SKIP() << "losetup is not installed";
  }
  const std::string image = file("disk.img");
  constexpr std::size_t kSize = MiB + 8192;
  write_pattern_file(image, kSize, 80);
  const std::string cmd = "losetup -f --show " + image + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[256] = {};
  const bool got = std::fgets(line, sizeof(line), p) != nullptr;
  const int status = ::pclose(p);
  if (!got || status != 0) GTEST_SKIP() << "losetup could not attach a loop device here";
  std::string dev(line);
  while (!dev.empty() && (dev.back() == '\n' || dev.back() == ' ')) dev.pop_back();
  struct Detach {
    std::string dev;
    ~Detach() { (void)std::system(("losetup -d " + dev).c_str()); }
  } detach{dev};

  Handle h(base_options());
  GuardedBuffer b(3 * 4096, BufKind::Plus1);
  b.fill_sentinel();
  for (const std::uint64_t off : {std::uint64_t{kSize - 4096}, std::uint64_t{kSize + 4096}}) {
    expect_throw<nvio::ShortFile>(
        [&] { h.read(b.data(), 3 * 4096, dev, off); },
        [&](const nvio::ShortFile& e) {
          EXPECT_EQ(e.file_size(), kSize);
          EXPECT_TRUE(contains(e.what(), dev));
          EXPECT_TRUE(contains(e.what(), "holds only " + std::to_string(kSize) + " bytes"));
          EXPECT_TRUE(contains(e.what(), "up to " + std::to_string(off + 3 * 4096)));
        },
        "read past the end of " + dev);
  }
  ASSERT_NO_THROW(h.read(b.data(), 3 * 4096, dev, kSize - 3 * 4096));
  EXPECT_TRUE(buffer_has_pattern(b.data(), 3 * 4096, kSize - 3 * 4096, 80));
  EXPECT_TRUE(b.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(Engines, Errors, NVIO_ALL_ENGINES, EngineParamName());

// ---- invalid options -------------------------------------------------------------------------

struct BadOption {
  const char* option;
  void (*apply)(Options&);
  const char* value;
};

TEST(InvalidOptions, RejectedWithTheOptionNamed) {
  const BadOption bad[] = {
      {"block_size", [](Options& o) { o.block_size = 0; }, "0"},
      {"block_size", [](Options& o) { o.block_size = 100; }, "100"},
      {"block_size", [](Options& o) { o.block_size = 511; }, "511"},
      {"block_size", [](Options& o) { o.block_size = 2 * GiB; }, "2147483648"},
      {"queue_depth", [](Options& o) { o.queue_depth = 0; }, "0"},
      {"queue_depth", [](Options& o) { o.queue_depth = 100000; }, "100000"},
      {"queue_depth", [](Options& o) { o.queue_depth = nvio::kMaxQueueDepth + 1; }, "4097"},
      {"intra_op_parallelism", [](Options& o) { o.intra_op_parallelism = 0; }, "0"},
      {"intra_op_parallelism", [](Options& o) { o.intra_op_parallelism = 1000; }, "1000"},
      {"intra_op_parallelism",
       [](Options& o) { o.intra_op_parallelism = nvio::kMaxParallelism + 1; }, "257"},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(std::string(b.option) + " = " + b.value);
    Options o;
    o.engine = EngineKind::Psync;
    b.apply(o);
    expect_throw<nvio::InvalidArgument>([&] { o.validate(); },
                                        [&](const nvio::InvalidArgument& e) {
                                          EXPECT_TRUE(contains(e.what(), b.option));
                                          EXPECT_TRUE(contains(e.what(), b.value));
                                        },
                                        "validate()");
    expect_throw<nvio::InvalidArgument>(
        [&] { Handle h(o); },
        [&](const nvio::InvalidArgument& e) { EXPECT_TRUE(contains(e.what(), b.option)); },
        "Handle(options)");
  }
}

TEST(InvalidOptions, LimitsAreInclusive) {
  Options o;
  o.block_size = nvio::kMinBlockSize;
  EXPECT_NO_THROW(o.validate());
  o.block_size = nvio::kMaxBlockSize;
  EXPECT_NO_THROW(o.validate());
  o.queue_depth = 1;
  EXPECT_NO_THROW(o.validate());
  o.queue_depth = nvio::kMaxQueueDepth;
  EXPECT_NO_THROW(o.validate());
  o.intra_op_parallelism = 1;
  EXPECT_NO_THROW(o.validate());
  o.intra_op_parallelism = nvio::kMaxParallelism;
  EXPECT_NO_THROW(o.validate());
  EXPECT_EQ(nvio::kMinBlockSize, 512u);
  EXPECT_EQ(nvio::kMaxBlockSize, GiB);
  EXPECT_EQ(nvio::kMaxQueueDepth, 4096u);
  EXPECT_EQ(nvio::kMaxParallelism, 256u);
  // A handle at the small end works.
  Options small;
  small.engine = EngineKind::Psync;
  small.block_size = 512;
  small.queue_depth = 1;
  TempDir d;
  Handle h(small);
  GuardedBuffer b(3000, BufKind::Plus1);
  b.fill_pattern(7, 3);
  h.write(b.data(), 3000, d.file("small.bin"), 7);
  EXPECT_TRUE(file_range_has_pattern(read_file(d.file("small.bin")), 7, 3000, 3));
}

TEST(EngineSelection, UnavailableEngineThrows) {
  int unavailable = 0;
  for (auto kind : {EngineKind::IoUring, EngineKind::Libaio, EngineKind::Psync}) {
    const auto& probe = nvio::probe_engine(kind);
    EXPECT_FALSE(probe.reason.empty()) << nvio::to_string(kind);
    if (probe.available) continue;
    ++unavailable;
    Options o;
    o.engine = kind;
    expect_throw<nvio::EngineUnavailable>([&] { Handle h(o); },
                                          [&](const nvio::EngineUnavailable& e) {
                                            EXPECT_TRUE(contains(e.what(), nvio::to_string(kind)));
                                          },
                                          nvio::to_string(kind));
  }
  EXPECT_TRUE(nvio::probe_engine(EngineKind::Psync).available) << "psync works everywhere";
  const auto& choice = nvio::auto_engine();
  EXPECT_NE(choice.engine, EngineKind::Auto);
  EXPECT_TRUE(nvio::probe_engine(choice.engine).available);
  EXPECT_FALSE(choice.reason.empty());
  // auto prefers io_uring, then libaio, then psync.
  if (nvio::probe_engine(EngineKind::IoUring).available) {
    EXPECT_EQ(choice.engine, EngineKind::IoUring);
  } else if (nvio::probe_engine(EngineKind::Libaio).available) {
    EXPECT_EQ(choice.engine, EngineKind::Libaio);
  } else {
    EXPECT_EQ(choice.engine, EngineKind::Psync);
  }
  RecordProperty("unavailable_engines", unavailable);
}

// ---- the error types ---------------------------------------------------------------------------

template <typename Expected>
void expect_mapped(int err) {
  SCOPED_TRACE(std::string("errno ") + std::to_string(err) + " " + std::strerror(err));
  try {
    nvio::throw_io_error(nvio::IoOp::Write, "/some/where/file.bin", 123456789, 4242, err,
                         "extra detail");
  } catch (const Expected& e) {
    EXPECT_EQ(typeid(e), typeid(Expected));
    EXPECT_EQ(e.op(), nvio::IoOp::Write);
    EXPECT_EQ(e.path(), "/some/where/file.bin");
    EXPECT_EQ(e.offset(), 123456789u);
    EXPECT_EQ(e.length(), 4242u);
    EXPECT_EQ(e.error_code(), err);
    EXPECT_TRUE(contains(e.what(), "/some/where/file.bin"));
    EXPECT_TRUE(contains(e.what(), "123456789"));
    EXPECT_TRUE(contains(e.what(), "4242"));
    EXPECT_TRUE(contains(e.what(), std::strerror(err)));
    EXPECT_TRUE(contains(e.what(), nvio::to_string(nvio::IoOp::Write)));
    EXPECT_TRUE(contains(e.what(), "extra detail"));
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong type " << typeid(e).name() << ": " << e.what();
    return;
  }
}

TEST(ErrorTypes, ThrowIoErrorMapsErrno) {
  expect_mapped<nvio::FileNotFound>(ENOENT);
  expect_mapped<nvio::PermissionDenied>(EACCES);
  expect_mapped<nvio::PermissionDenied>(EPERM);
  expect_mapped<nvio::ReadOnlyFileSystem>(EROFS);
  expect_mapped<nvio::IsADirectory>(EISDIR);
  expect_mapped<nvio::NoSpace>(ENOSPC);
  expect_mapped<nvio::NoSpace>(EDQUOT);
  expect_mapped<nvio::IoError>(EIO);
  expect_mapped<nvio::IoError>(EBADF);
  expect_mapped<nvio::IoError>(EINVAL);
}

TEST(ErrorTypes, Hierarchy) {
  static_assert(std::is_base_of_v<std::runtime_error, nvio::Error>);
  static_assert(std::is_base_of_v<nvio::Error, nvio::InvalidArgument>);
  static_assert(std::is_base_of_v<nvio::Error, nvio::EngineUnavailable>);
  static_assert(std::is_base_of_v<nvio::Error, nvio::MemoryError>);
  static_assert(std::is_base_of_v<nvio::Error, nvio::IoError>);
  static_assert(std::is_base_of_v<nvio::IoError, nvio::FileNotFound>);
  static_assert(std::is_base_of_v<nvio::IoError, nvio::PermissionDenied>);
  static_assert(std::is_base_of_v<nvio::IoError, nvio::ReadOnlyFileSystem>);
  static_assert(!std::is_base_of_v<nvio::PermissionDenied, nvio::ReadOnlyFileSystem>);
  static_assert(std::is_base_of_v<nvio::IoError, nvio::IsADirectory>);
  static_assert(std::is_base_of_v<nvio::IoError, nvio::NoSpace>);
  static_assert(std::is_base_of_v<nvio::IoError, nvio::ShortFile>);
  nvio::MemoryError m("mlock failed", ENOMEM);
  EXPECT_EQ(m.error_code(), ENOMEM);
  EXPECT_STREQ(m.what(), "mlock failed");
  nvio::InvalidArgument ia("queue_depth must be 1..4096");
  EXPECT_STREQ(ia.what(), "queue_depth must be 1..4096");
}

TEST(ErrorTypes, ShortFileMessage) {
  nvio::ShortFile e(nvio::IoOp::Read, "/data/x.bin", 4096, 8192, 10000);
  EXPECT_TRUE(contains(e.what(), "holds only 10000 bytes, the request needs bytes up to 12288"));
  EXPECT_EQ(e.file_size(), 10000u);
  EXPECT_EQ(e.error_code(), 0) << "a short file is not an errno";
  EXPECT_EQ(e.offset(), 4096u);
  EXPECT_EQ(e.length(), 8192u);
  EXPECT_EQ(e.op(), nvio::IoOp::Read);
  EXPECT_TRUE(contains(e.what(), "/data/x.bin"));
  EXPECT_TRUE(contains(e.what(), "10000"));
  EXPECT_TRUE(contains(e.what(), "4096"));
  EXPECT_TRUE(contains(e.what(), "8192"));
}

// The file ended while a read ran: the message says where, and what the size is now.
TEST(ErrorTypes, ShortFileDuringReadMessage) {
  const auto truncated = nvio::ShortFile::ended_during_read("/data/x.bin", 0, 8388608, 4096, 4096);
  EXPECT_EQ(truncated.file_size(), 4096u);
  EXPECT_EQ(truncated.error_code(), 0);
  EXPECT_EQ(truncated.op(), nvio::IoOp::Read);
  EXPECT_EQ(truncated.offset(), 0u);
  EXPECT_EQ(truncated.length(), 8388608u);
  EXPECT_TRUE(contains(truncated.what(), "/data/x.bin"));
  EXPECT_TRUE(contains(truncated.what(), "ended at byte 4096"));
  EXPECT_TRUE(contains(truncated.what(), "size is now 4096"));
  EXPECT_TRUE(contains(truncated.what(), "truncated"));
  const auto early = nvio::ShortFile::ended_during_read("/data/x.bin", 0, 8388608, 4096, 8388608);
  EXPECT_TRUE(contains(early.what(), "the file ended at byte 4096 while its size says 8388608"));
  EXPECT_FALSE(contains(early.what(), "holds only"));
}

TEST(ErrorTypes, OpNamesDistinct) {
  const nvio::IoOp ops[] = {nvio::IoOp::Open,   nvio::IoOp::Read, nvio::IoOp::Write,
                            nvio::IoOp::Stat,   nvio::IoOp::Sync, nvio::IoOp::Truncate,
                            nvio::IoOp::Submit, nvio::IoOp::Wait, nvio::IoOp::Rename};
  std::set<std::string> names;
  for (auto op : ops) {
    const char* n = nvio::to_string(op);
    ASSERT_NE(n, nullptr);
    EXPECT_GT(std::strlen(n), 0u);
    names.insert(n);
  }
  EXPECT_EQ(names.size(), std::size(ops));
}

}  // namespace
}  // namespace nvio_test
