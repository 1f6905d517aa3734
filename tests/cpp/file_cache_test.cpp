// The files a handle keeps open between operations (handle/files.hpp): a name that now refers to
// another file is opened afresh, a read sees the file's size now, a caller's descriptor number
// reused for another file is not confused with the first, the cache is bounded, and a removed
// file's descriptors are let go of (its space comes back) while busy and when idle.
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "handle/files.hpp"
#include "handle/operation.hpp"
#include "nvio/errors.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using namespace std::chrono_literals;

// How many of this process's descriptors refer to a removed file ("... (deleted)").
int deleted_fds() {
  int count = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[4096];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n > 0 && std::string_view(target, static_cast<std::size_t>(n)).ends_with(" (deleted)")) {
      ++count;
    }
  }
  ::closedir(d);
  return count;
}

class FileCache : public EngineTest {};

// Lowers RLIMIT_NOFILE until exactly `n` more descriptors can be opened (counted by opening them).
bool leave_free_descriptors(int n) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
  lim.rlim_cur = static_cast<rlim_t>(open_fd_count() + n);
  for (int attempt = 0; attempt < 64; ++attempt) {
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
    std::vector<int> fds;
    for (int fd; fds.size() <= static_cast<std::size_t>(n) && (fd = ::dup(0)) >= 0;) {
      fds.push_back(fd);
    }
    for (int fd : fds) ::close(fd);
    const auto opened = static_cast<int>(fds.size());
    if (opened == n) return true;
    lim.rlim_cur = lim.rlim_cur + static_cast<rlim_t>(n) - static_cast<rlim_t>(opened);
  }
  return false;
}

// A file replaced under its name (written elsewhere, renamed over it) is read afresh: the kept
// descriptor of the old file is not used.
TEST_P(FileCache, ReplacedFileIsOpenedAfresh) {
  nvio::Handle h(base_options());
  const std::string f = file("f.bin");
  write_pattern_file(f, 64 * KiB, 1);
  GuardedBuffer buf(64 * KiB, BufKind::Aligned);
  h.read(buf.data(), buf.size(), f, 0);
  ASSERT_TRUE(buffer_has_pattern(buf.data(), buf.size(), 0, 1));
  EXPECT_EQ(h.open_files(), 1u);
  write_pattern_file(file("new.bin"), 64 * KiB, 2);
  ASSERT_EQ(::rename(file("new.bin").c_str(), f.c_str()), 0);
  h.read(buf.data(), buf.size(), f, 0);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), buf.size(), 0, 2)) << "read the replaced file";
  EXPECT_EQ(h.open_files(), 1u) << "the old entry is replaced, not added to";
}

// A file removed after a write is created again by the next write by name (not written into the
// removed inode through the kept descriptor).
TEST_P(FileCache, RemovedFileIsCreatedAgainByTheNextWrite) {
  nvio::Handle h(base_options());
  const std::string f = file("w.bin");
  GuardedBuffer buf(MiB + 123, BufKind::Plus3);
  buf.fill_pattern(4096 + 7, 3);
  h.write(buf.data(), buf.size(), f, 4096 + 7);
  ASSERT_EQ(::unlink(f.c_str()), 0);
  buf.fill_pattern(5, 4);
  h.write(buf.data(), buf.size(), f, 5);
  ASSERT_EQ(file_size(f), static_cast<std::int64_t>(5 + buf.size()));
  EXPECT_TRUE(file_range_has_pattern(read_file(f), 5, buf.size(), 4));
}

// A read checks the size the file has now, not the size it had when it was first opened.
TEST_P(FileCache, ReadSeesTheFileGrowAndShrink) {
  nvio::Handle h(base_options());
  const std::string f = file("g.bin");
  write_pattern_file(f, 8 * KiB, 5);
  GuardedBuffer buf(8 * KiB, BufKind::Plus1);
  h.read(buf.data(), 4 * KiB, f, 0);
  write_pattern_file(f + ".tmp", 64 * KiB + 3, 5);
  // Grown in place (same inode): appended through another descriptor.
  {
    const auto grown = read_file(f + ".tmp");
    const int fd = ::open(f.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, grown.data() + 8 * KiB, grown.size() - 8 * KiB, 8 * KiB),
              static_cast<ssize_t>(grown.size() - 8 * KiB));
    ::close(fd);
  }
  h.read(buf.data(), 8 * KiB, f, 56 * KiB + 3);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), 8 * KiB, 56 * KiB + 3, 5));
  ASSERT_EQ(::truncate(f.c_str(), 4 * KiB), 0);
  EXPECT_THROW(h.read(buf.data(), 8 * KiB, f, 0), nvio::ShortFile);
  // In a batch, every extent of the shrunk file is checked against its size now.
  std::vector<nvio::ReadExtent> extents = {{buf.data(), 4 * KiB, 0, f},
                                           {buf.data() + 4 * KiB, 1, 4 * KiB, f}};
  EXPECT_THROW(h.read_batch(extents), nvio::ShortFile);
}

// A caller's descriptor: the reopened descriptor for the access it lacks is made once and kept;
// the same number later open on another file reads that file.
TEST_P(FileCache, CallerDescriptorNumberReusedForAnotherFile) {
  nvio::Handle h(base_options());
  write_pattern_file(file("a.bin"), 64 * KiB, 6);
  write_pattern_file(file("b.bin"), 64 * KiB, 7);
  GuardedBuffer buf(64 * KiB, BufKind::Aligned);
  int fd = ::open(file("a.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  h.read(buf.data(), buf.size(), fd, 0);
  ASSERT_TRUE(buffer_has_pattern(buf.data(), buf.size(), 0, 6));
  const int fds = open_fd_count();
  for (int i = 0; i < 20; ++i) h.read(buf.data(), buf.size(), fd, 0);
  EXPECT_EQ(open_fd_count(), fds) << "the descriptor was reopened again";
  ::close(fd);
  const int again = ::open(file("b.bin").c_str(), O_RDONLY);
  ASSERT_EQ(again, fd) << "the test needs the same descriptor number";
  h.read(buf.data(), buf.size(), again, 0);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), buf.size(), 0, 7)) << "read the first file";
  ::close(again);
}

// At most capacity() names per access mode are kept (kCapacity where descriptors are plenty); the
// least recently used go first.
TEST_P(FileCache, Bounded) {
  nvio::Handle h(base_options());
  const std::size_t most = nvio::detail::FileCache::capacity();
  const std::size_t n = most + 10;
  GuardedBuffer buf(4096, BufKind::Aligned);
  buf.fill_pattern(0, 8);
  for (std::size_t i = 0; i < n; ++i) h.write(buf.data(), buf.size(), file(std::to_string(i)), 0);
  EXPECT_EQ(h.open_files(), most);
  h.close_files();
  EXPECT_EQ(h.open_files(), 0u);
}

// close_file lets go of one file only: by the caller's descriptor it was written through (kept
// as that descriptor's O_DIRECT reopening) or by its name (also after the name was removed);
// the other files stay kept, and a file never seen is no error.
TEST_P(FileCache, CloseFileLetsGoOfOneFile) {
  nvio::Handle h(base_options());
  GuardedBuffer buf(64 * KiB, BufKind::Aligned);
  buf.fill_pattern(0, 11);
  const int before = deleted_fds();
  h.write(buf.data(), buf.size(), file("kept.bin"), 0);
  h.write(buf.data(), buf.size(), file("by_name.bin"), 0);
  const int fd = ::open(file("by_fd.bin").c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  h.write(buf.data(), buf.size(), fd, 0);
  const std::size_t kept = h.open_files();
  ASSERT_EQ(::unlink(file("by_name.bin").c_str()), 0);
  ASSERT_EQ(::unlink(file("by_fd.bin").c_str()), 0);
  h.close_file(fd);
  ::close(fd);
  h.close_file(file("by_name.bin"));
  EXPECT_EQ(deleted_fds(), before) << "a removed file is still held";
  EXPECT_EQ(h.open_files(), 1u) << "kept before: " << kept;
  h.close_file(file("never.bin"));
  h.close_file(12345);
  h.read(buf.data(), buf.size(), file("kept.bin"), 0);
  EXPECT_TRUE(buffer_has_pattern(buf.data(), buf.size(), 0, 11));
}

// A removed file's descriptors are let go of: while the handle is busy with other files (within
// about kIdle), and when it is idle (an idle worker closes what was unused for kIdle).
TEST_P(FileCache, RemovedFileIsLetGoOf) {
  nvio::Handle h(base_options());
  GuardedBuffer buf(64 * KiB, BufKind::Aligned);
  buf.fill_pattern(0, 9);
  const int before = deleted_fds();
  h.write(buf.data(), buf.size(), file("gone.bin"), 0);
  ASSERT_EQ(::unlink(file("gone.bin").c_str()), 0);
  EXPECT_GT(deleted_fds(), before) << "the handle should keep the written file open";
  // Busy: operations on another file, more often than kIdle.
  const auto until = std::chrono::steady_clock::now() + 3 * nvio::detail::FileCache::kIdle;
  bool let_go = false;
  while (!let_go && std::chrono::steady_clock::now() < until) {
    h.write(buf.data(), buf.size(), file("busy.bin"), 0);
    std::this_thread::sleep_for(20ms);
    let_go = deleted_fds() == before;
  }
  EXPECT_TRUE(let_go) << "a busy handle kept a removed file open";
  EXPECT_EQ(h.open_files(), 1u) << "busy.bin stays";
  // Idle: nothing runs, and the kept file is closed after kIdle.
  const auto idle_until = std::chrono::steady_clock::now() + 4 * nvio::detail::FileCache::kIdle;
  while (h.open_files() > 0 && std::chrono::steady_clock::now() < idle_until) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(h.open_files(), 0u) << "an idle handle kept its files";
}

// issue 28 #3: a removed file the handle keeps (its blocks held) is let go of before the handle
// opens a file to write, which may need those blocks ("delete the old checkpoint, then save").
TEST_P(FileCache, RemovedFileIsLetGoOfBeforeAFileIsOpenedToWrite) {
  nvio::Handle h(base_options());
  GuardedBuffer buf(64 * KiB, BufKind::Aligned);
  buf.fill_pattern(0, 9);
  const int before = deleted_fds();
  h.write(buf.data(), buf.size(), file("old.bin"), 0);
  h.read(buf.data(), buf.size(), file("old.bin"), 0);
  ASSERT_EQ(::unlink(file("old.bin").c_str()), 0);
  EXPECT_GT(deleted_fds(), before) << "the handle should keep the removed file open";
  h.write(buf.data(), buf.size(), file("new.bin"), 0);
  EXPECT_EQ(deleted_fds(), before) << "opening a file to write kept a removed one";
  EXPECT_EQ(h.open_files(), 1u) << "new.bin stays";
}

// A write that runs out of space lets go of the removed files of every handle in the process
// (release_removed_files); files with a name stay kept.
TEST_P(FileCache, ReleaseRemovedFilesLetsGoInEveryHandle) {
  nvio::Handle a(base_options());
  nvio::Handle b(base_options());
  GuardedBuffer buf(64 * KiB, BufKind::Aligned);
  buf.fill_pattern(0, 3);
  const int before = deleted_fds();
  a.write(buf.data(), buf.size(), file("gone.bin"), 0);
  a.write(buf.data(), buf.size(), file("kept.bin"), 0);
  b.read(buf.data(), buf.size(), file("gone.bin"), 0);
  ASSERT_EQ(::unlink(file("gone.bin").c_str()), 0);
  EXPECT_EQ(a.open_files(), 2u);
  EXPECT_EQ(b.open_files(), 1u);
  const std::uint64_t before_release = nvio::detail::removed_files_released();
  EXPECT_EQ(nvio::detail::release_removed_files(), before_release + 1);
  EXPECT_EQ(nvio::detail::release_removed_files(), before_release + 1) << "nothing left to drop";
  EXPECT_EQ(deleted_fds(), before);
  EXPECT_EQ(a.open_files(), 1u) << "kept.bin stays";
  EXPECT_EQ(b.open_files(), 0u);
}

// A process with few descriptors to spare (RLIMIT_NOFILE): the handle keeps fewer files (an
// eighth of the limit's descriptors at most), and where even those leave too few it lets go of
// the files it keeps instead of failing with EMFILE: every read and write succeeds, bytes
// compared, and the test's own opens find descriptors. In a child process, whose limit can be
// lowered without touching the test runner's.
TEST_P(FileCache, FewDescriptorsLetGoOfKeptFilesInsteadOfFailing) {
  NVIO_SKIP_FORK_UNDER_TSAN();  // the limit is lowered in a forked child
  constexpr int kFiles = 100;
  std::vector<std::string> paths;
  for (int i = 0; i < kFiles; ++i) {
    paths.push_back(file("few" + std::to_string(i)));
    write_pattern_file(paths.back(), 8192 + static_cast<std::size_t>(i), 40 + i);
  }
  const nvio::Options o = base_options();
  const int code = run_in_child([&] {
    // Room for the handle's engine, wakeup and pipe descriptors and a dozen kept files.
    rlimit lim{};
    if (!leave_free_descriptors(40) || ::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 2;
    if (nvio::detail::FileCache::capacity() != std::max<rlim_t>(lim.rlim_cur / 48, 1)) return 6;
    try {
      nvio::Handle h(o);
      GuardedBuffer buf(8192 + kFiles, BufKind::Aligned);
      for (int round = 0; round < 2; ++round) {
        for (int i = 0; i < kFiles; ++i) {
          const std::size_t len = 8192 + static_cast<std::size_t>(i);
          h.read(buf.data(), len, paths[static_cast<std::size_t>(i)], 0);
          if (!buffer_has_pattern(buf.data(), len, 0, 40 + static_cast<std::uint64_t>(i))) {
            return 3;
          }
          h.write(buf.data(), len, paths[static_cast<std::size_t>(i)] + ".copy", 0);
        }
      }
      for (int i = 0; i < kFiles; ++i) {
        const auto copy = read_file(paths[static_cast<std::size_t>(i)] + ".copy");
        if (!file_range_has_pattern(copy, 0, copy.size(), 40 + static_cast<std::uint64_t>(i))) {
          return 4;
        }
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      return 5;
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: no rlimit; 3, 4: wrong bytes; 5: an operation failed (stderr); 6: "
                        "capacity() does not follow the limit";
}

// Out of descriptors with files kept: the limit lowered under a handle that keeps 20 files, to
// one descriptor more than are open. Opening the next file needs two: the handle lets go of the
// files it keeps and opens it, instead of failing with EMFILE.
TEST_P(FileCache, OutOfDescriptorsLetsGoOfKeptFiles) {
  NVIO_SKIP_FORK_UNDER_TSAN();  // the limit is lowered in a forked child
  constexpr std::size_t kKept = 20;
  constexpr std::size_t kLen = 12345;
  for (std::size_t i = 0; i <= kKept; ++i) {
    write_pattern_file(file("kept" + std::to_string(i)), kLen, 60 + i);
  }
  const nvio::Options o = base_options();
  const int code = run_in_child([&] {
    try {
      nvio::Handle h(o);
      GuardedBuffer buf(kLen, BufKind::Aligned);
      for (std::size_t i = 0; i < kKept; ++i)
        h.read(buf.data(), kLen, file("kept" + std::to_string(i)), 0);
      // Fewer where RLIMIT_NOFILE is small (capacity()); one is enough to let go of.
      if (h.open_files() != std::min(kKept, nvio::detail::FileCache::capacity())) return 2;
      if (!leave_free_descriptors(1)) return 2;
      h.read(buf.data(), kLen, file("kept" + std::to_string(kKept)), 0);
      if (!buffer_has_pattern(buf.data(), kLen, 0, 60 + kKept)) return 3;
      if (h.open_files() > 1) return 4;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      return 5;
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: setup; 3: wrong bytes; 4: files still kept; 5: the read failed";
}

INSTANTIATE_TEST_SUITE_P(Engines, FileCache, NVIO_ALL_ENGINES, EngineParamName());

// A kept file's device-direct engine registration (cuFile's) is made once, by whichever of several
// threads asks first, and shared; a refusal is made once too and thrown again, the same error,
// without asking again (the real registration needs a GPU: here `make` stands in for it).
TEST(OpenFileGds, RegistrationAndRefusalAreMadeOncePerFile) {
  nvio::detail::OpenFile registered;
  std::atomic<int> made{0};
  const auto make = [&] {
    ++made;
    std::this_thread::sleep_for(5ms);  // the others ask meanwhile
    return std::make_shared<const nvio::engine::FileRegistration>();
  };
  std::vector<std::shared_ptr<const nvio::engine::FileRegistration>> got(4);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = registered.registration(make); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(made.load(), 1);
  for (const auto& g : got) EXPECT_EQ(g, got[0]);
  EXPECT_NE(got[0], nullptr);

  nvio::detail::OpenFile refused;
  int asked = 0;
  const auto refuse = [&]() -> std::shared_ptr<const nvio::engine::FileRegistration> {
    ++asked;
    throw nvio::GpuError("cuFileHandleRegister", 5030, "CU_FILE_INTERNAL_ERROR", "refused",
                         "/data/x.bin");
  };
  const nvio::GpuError* first = nullptr;
  for (int i = 0; i < 3; ++i) {
    try {
      (void)refused.registration(refuse);
      ADD_FAILURE() << "a refused registration returned";
    } catch (const nvio::GpuError& e) {
      if (first == nullptr) first = &e;
      EXPECT_EQ(&e, first) << "the kept error, not a new one";
      EXPECT_NE(std::string(e.what()).find("/data/x.bin"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(asked, 1) << "cuFile was asked again after refusing";
}

}  // namespace
}  // namespace nvio_test
