// core/posix: file_facts checked against the kernel's own answers (fstat, and an O_DIRECT write at
// the alignment it reports) for each kind of file the handle meets; page-cache eviction checked
// with mincore; the process's CPU time against work done on another thread.
#include "core/posix.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::detail::FileFacts;
using nvio::detail::FileType;

// file_facts of `fd`, failing the test when it fails.
FileFacts facts_of(int fd) {
  FileFacts facts;
  const int rc = nvio::detail::file_facts(fd, facts);
  EXPECT_EQ(rc, 0) << std::strerror(-rc);
  return facts;
}

TEST(Posix, FileFactsOfRegularFile) {
  TempDir d;
  const std::string path = d.file("f");
  std::vector<unsigned char> bytes(4095, 0x5a);
  write_file(path, bytes.data(), bytes.size());
  const nvio::detail::FileDescriptor fd(nvio::detail::open_file(path, O_RDWR));
  ASSERT_TRUE(fd) << path;
  struct stat st {};
  ASSERT_EQ(::fstat(fd.get(), &st), 0);

  FileFacts facts = facts_of(fd.get());
  EXPECT_EQ(facts.type, FileType::Regular);
  EXPECT_EQ(facts.mode, st.st_mode);
  EXPECT_EQ(facts.size, 4095);
  EXPECT_EQ(facts.block_size, static_cast<std::uint32_t>(st.st_blksize));

  // Every call asks the kernel again: a file that grew shows its new size.
  ASSERT_EQ(::ftruncate(fd.get(), (1 << 20) + 123), 0);
  EXPECT_EQ(facts_of(fd.get()).size, (1 << 20) + 123);

  // The reported direct-I/O alignment is one the kernel accepts: an O_DIRECT write of
  // offset_align bytes at offset offset_align from a buffer aligned to mem_align.
  const nvio::DirectIoInfo& dio = facts.direct_io;
  EXPECT_FALSE(dio.source.empty());
  const nvio::detail::FileDescriptor direct(nvio::detail::open_file(path, O_RDWR | O_DIRECT));
  if (!dio.supported || !direct) {
    GTEST_SKIP() << "no O_DIRECT here (" << dio.source << ")";
  }
  ASSERT_GT(dio.offset_align, 0u);
  ASSERT_GT(dio.mem_align, 0u);
  ASSERT_EQ(4096 % dio.mem_align, 0u) << "an AlignedBuffer is page aligned";
  nvio::AlignedBuffer buf(dio.offset_align, nvio::LockMode::None);
  nvio::pattern::fill(buf.data(), buf.size(), dio.offset_align, 7);
  ASSERT_EQ(::pwrite(direct.get(), buf.data(), dio.offset_align, dio.offset_align),
            static_cast<ssize_t>(dio.offset_align))
      << std::strerror(errno) << " (source " << dio.source << ")";
  const std::vector<unsigned char> file = read_file(path);
  EXPECT_TRUE(file_range_has_pattern(file, dio.offset_align, dio.offset_align, 7));
}

TEST(Posix, FileFactsOfDirectory) {
  TempDir d;
  const nvio::detail::FileDescriptor fd(nvio::detail::open_file(d.path(), O_RDONLY | O_DIRECTORY));
  ASSERT_TRUE(fd);
  const FileFacts facts = facts_of(fd.get());
  EXPECT_EQ(facts.type, FileType::Directory);
  EXPECT_TRUE(S_ISDIR(facts.mode)) << std::oct << facts.mode;
}

// What bench and tune judge a run's file by: statvfs's free bytes, and nothing where the file
// system reports no size (ramfs: 0 blocks, 0 free, which refused every tune there).
TEST(Posix, FreeSpaceIsNotToldWhereTheFileSystemHasNoSize) {
  TempDir d;
  const std::optional<std::uint64_t> here = nvio::free_space(d.path());
  ASSERT_TRUE(here.has_value());
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(d.path().c_str(), &vfs), 0);
  EXPECT_NEAR(static_cast<double>(*here), static_cast<double>(vfs.f_bavail) * vfs.f_frsize,
              64.0 * 1024 * 1024);
  EXPECT_FALSE(nvio::free_space(d.file("missing/dir")).has_value());
  if (::geteuid() != 0) GTEST_SKIP() << "mounting ramfs needs root";
  const std::string mnt = d.file("ram");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  if (::mount("ramfs", mnt.c_str(), "ramfs", 0, nullptr) != 0) {
    GTEST_SKIP() << "cannot mount ramfs here: " << std::strerror(errno);
  }
  EXPECT_FALSE(nvio::free_space(mnt).has_value());
  ::umount(mnt.c_str());
}

TEST(Posix, FileFactsOfCharacterDevice) {
  const nvio::detail::FileDescriptor fd(nvio::detail::open_file("/dev/null", O_RDONLY));
  ASSERT_TRUE(fd);
  const FileFacts facts = facts_of(fd.get());
  EXPECT_EQ(facts.type, FileType::Other);
  EXPECT_TRUE(S_ISCHR(facts.mode)) << std::oct << facts.mode;
  EXPECT_EQ(facts.size, 0);
}

TEST(Posix, FileFactsOfPipe) {
  int ends[2];
  ASSERT_EQ(::pipe2(ends, O_CLOEXEC), 0);
  const nvio::detail::FileDescriptor read_end(ends[0]);
  const nvio::detail::FileDescriptor write_end(ends[1]);
  ASSERT_EQ(::write(write_end.get(), "abc", 3), 3);
  const FileFacts facts = facts_of(read_end.get());
  EXPECT_EQ(facts.type, FileType::Other);
  EXPECT_TRUE(S_ISFIFO(facts.mode)) << std::oct << facts.mode;
}

TEST(Posix, FileFactsOfClosedDescriptorIsEbadf) {
  int fd = -1;
  {
    const nvio::detail::FileDescriptor owned(nvio::detail::open_file("/dev/null", O_RDONLY));
    ASSERT_TRUE(owned);
    fd = owned.get();
  }  // closed here
  FileFacts facts;
  EXPECT_EQ(nvio::detail::file_facts(fd, facts), -EBADF);
  EXPECT_EQ(nvio::detail::file_facts(-1, facts), -EBADF);
}

TEST(Posix, OpenFileReturnsMinusErrno) {
  TempDir d;
  EXPECT_EQ(nvio::detail::open_file(d.file("missing"), O_RDONLY), -ENOENT);
  const int fd = nvio::detail::open_file(d.file("new"), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  const nvio::detail::FileDescriptor owned(fd);
  EXPECT_EQ(::fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

// Dirty pages of a file that was just written are written back and dropped, the range only: the
// pages outside it stay resident. The range is 2 MiB aligned, so that no large folio of the page
// cache straddles its edge (a folio is dropped whole or not at all).
TEST(Posix, EvictPageCacheDropsTheRange) {
  TempDir d;
  const std::string path = d.file("cached");
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t half = 4 * MiB;
  const std::size_t len = 2 * half + 123;
  write_pattern_file(path, len, 3);  // dirty, in the page cache
  ASSERT_GT(resident_pages(path, 0, len), 0u);
  ASSERT_EQ(nvio::detail::evict_page_cache(path, 0, half), 0);
  struct statfs fs {};
  ASSERT_EQ(::statfs(d.path().c_str(), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC) {
    GTEST_SKIP() << d.path() << " is in memory: its pages cannot be evicted";
  }
  const std::size_t kept = resident_pages(path, half, len - half);
  EXPECT_EQ(resident_pages(path, 0, half), 0u) << "the range was not evicted";
  EXPECT_EQ(kept, (len - half + page - 1) / page) << "pages outside the range were dropped too";
  ASSERT_EQ(nvio::detail::evict_page_cache(path), 0);
  EXPECT_EQ(resident_pages(path, 0, len), 0u);
  // The data survived its write-back.
  EXPECT_TRUE(file_range_has_pattern(read_file(path), 0, len, 3));
  EXPECT_EQ(nvio::detail::evict_page_cache(d.file("missing")), -ENOENT);
}

// CPU time spent on another thread counts: it is the process's, as for the handle's workers.
TEST(Posix, ProcessCpuSecondsCountsOtherThreads) {
  const double before = nvio::process_cpu_seconds();
  std::atomic<std::uint64_t> sink{0};
  std::thread spinner([&] {
    // Until this thread has had 200 ms of CPU: on a loaded machine that takes longer than 200 ms.
    std::uint64_t x = 1;
    timespec used{};
    do {
      for (int i = 0; i < 100000; ++i) x = x * 6364136223846793005ULL + 1;
      ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &used);
    } while (used.tv_sec == 0 && used.tv_nsec < 200'000'000);
    sink.store(x);
  });
  spinner.join();
  const double spent = nvio::process_cpu_seconds() - before;
  EXPECT_GE(spent, 0.19) << "another thread used 200 ms of CPU";
  EXPECT_LT(spent, 10.0);
}

}  // namespace
}  // namespace nvio_test
