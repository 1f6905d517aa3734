// system.hpp: engine probes, directory direct-I/O probe (checked against our own O_DIRECT open),
// system_info against the kernel's own files, version.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/posix.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

std::set<std::string> list_dir(const std::string& d) {
  std::set<std::string> out;
  if (DIR* dir = ::opendir(d.c_str())) {
    while (dirent* e = ::readdir(dir)) out.insert(e->d_name);
    ::closedir(dir);
  }
  return out;
}

bool is_pow2(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Whether O_DIRECT works in `dir`, found without nvio: open a file O_DIRECT and write 4 KiB.
bool direct_works_posix(const std::string& dir) {
  const std::string path = dir + "/posix-direct-probe";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  nvio::AlignedBuffer buf(4096, nvio::LockMode::None);
  bool ok = ::pwrite(fd, buf.data(), 4096, 0) == 4096;
  ::close(fd);
  ::unlink(path.c_str());
  return ok;
}

TEST(System, ProbeDirectoryAgreesWithPosix) {
  TempDir d;
  const auto before = list_dir(d.path());
  const auto info = nvio::probe_directory(d.path());
  EXPECT_EQ(list_dir(d.path()), before) << "probe_directory left files behind";
  EXPECT_FALSE(info.source.empty());
  const bool posix = direct_works_posix(d.path());
  EXPECT_EQ(info.supported, posix) << "source: " << info.source;
  if (info.supported) {
    EXPECT_TRUE(is_pow2(info.mem_align)) << info.mem_align;
    EXPECT_TRUE(is_pow2(info.offset_align)) << info.offset_align;
    EXPECT_LE(info.mem_align, 4096u);
    EXPECT_LE(info.offset_align, 4096u);
    EXPECT_GE(info.offset_align, 1u);
    // The reported alignment really works: an O_DIRECT pwrite at offset_align with a buffer at
    // mem_align.
    const std::string path = d.file("aligned-probe");
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    nvio::AlignedBuffer buf(3 * 4096, nvio::LockMode::None);
    EXPECT_EQ(::pwrite(fd, buf.bytes() + info.mem_align, info.offset_align, info.offset_align),
              static_cast<ssize_t>(info.offset_align))
        << std::strerror(errno);
    ::close(fd);
  }
}

// Probes of one directory from many threads at once each use their own file: all succeed, agree,
// and leave nothing behind.
TEST(System, ConcurrentProbesOfOneDirectory) {
  TempDir d;
  const auto before = list_dir(d.path());
  const nvio::DirectIoInfo expected = nvio::probe_directory(d.path());
  constexpr int kThreads = 8;
  constexpr int kIterations = 20;
  std::atomic<int> ready{0};
  std::atomic<int> failures{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      for (int i = 0; i < kIterations; ++i) {
        try {
          const nvio::DirectIoInfo info = nvio::probe_directory(d.path());
          if (info.supported != expected.supported || info.mem_align != expected.mem_align ||
              info.offset_align != expected.offset_align) {
            ++failures;
            errors[t] = "a different answer: " + info.source;
          }
        } catch (const nvio::Error& e) {
          ++failures;
          errors[t] = e.what();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(list_dir(d.path()), before) << "probe_directory left files behind";
}

TEST(System, ProbeDirectoryMissingThrows) {
  TempDir d;
  EXPECT_THROW(nvio::probe_directory(d.file("does-not-exist")), nvio::IoError);
}

TEST(System, EngineProbesAreCachedAndExplained) {
  for (auto kind : {nvio::EngineKind::IoUring, nvio::EngineKind::Libaio, nvio::EngineKind::Psync}) {
    const auto& a = nvio::probe_engine(kind);
    const auto& b = nvio::probe_engine(kind);
    EXPECT_EQ(&a, &b) << "probed once, cached";
    EXPECT_FALSE(a.reason.empty()) << nvio::to_string(kind);
  }
  EXPECT_TRUE(nvio::probe_engine(nvio::EngineKind::Psync).available);
  EXPECT_EQ(&nvio::auto_engine(), &nvio::auto_engine());
}

TEST(System, SystemInfoMatchesKernel) {
  const auto info = nvio::system_info();
  struct utsname u {};
  ASSERT_EQ(::uname(&u), 0);
  EXPECT_EQ(info.kernel, std::string(u.sysname) + " " + u.release);
  struct rlimit rl {};
  ASSERT_EQ(::getrlimit(RLIMIT_MEMLOCK, &rl), 0);
  if (rl.rlim_cur == RLIM_INFINITY) {
    EXPECT_FALSE(info.memlock_limit.has_value());
  } else {
    ASSERT_TRUE(info.memlock_limit.has_value());
    EXPECT_EQ(*info.memlock_limit, rl.rlim_cur);
  }
  std::ifstream maxnr("/proc/sys/fs/aio-max-nr");
  std::uint64_t v = 0;
  if (maxnr >> v) {
    ASSERT_TRUE(info.aio_max_nr.has_value());
    EXPECT_EQ(*info.aio_max_nr, v);
  }
  EXPECT_EQ(std::ifstream("/proc/sys/fs/aio-nr").good(), info.aio_nr.has_value());
}

TEST(System, Version) {
  const std::string v = nvio::version();
  ASSERT_FALSE(v.empty());
  EXPECT_NE(v.find_first_of("0123456789"), std::string::npos) << v;
  EXPECT_EQ(v.rfind("0.1", 0), 0u) << "project version 0.1.x, got " << v;
}

// The page cache of a file in `dir`: all of it cached after a buffered write, none after evict (on
// a file system with a page cache of its own), a part after a partial read; by cachestat where the
// kernel has it and by mincore, which older kernels use.
void check_page_cache_states(const std::string& dir) {
  struct statfs fs {};
  ASSERT_EQ(::statfs(dir.c_str(), &fs), 0);
  if (fs.f_type == 0x01021994) GTEST_SKIP() << "tmpfs: its pages are the file and stay cached";
  const std::string path = dir + "/cached.bin";
  const std::size_t len = MiB + 123;
  write_pattern_file(path, len, 5);
  for (auto probe : {nvio::detail::CacheProbe::Any, nvio::detail::CacheProbe::Mincore}) {
    SCOPED_TRACE(probe == nvio::detail::CacheProbe::Any ? "any" : "mincore");
    nvio::PageCacheState st = nvio::detail::page_cache_state(path, probe);
    EXPECT_EQ(st.file_bytes, len);
    EXPECT_EQ(st.cached_bytes, len) << st.method;  // just written: every page is cached
    nvio::evict_page_cache(path);
    st = nvio::detail::page_cache_state(path, probe);
    EXPECT_EQ(st.cached_bytes, 0u) << st.method;
    EXPECT_EQ(st.dirty_bytes, 0u);
    // 64 KiB read at 128 KiB: those pages (readahead may add some, never the whole file).
    std::vector<unsigned char> part(64 * KiB);
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);  // no readahead beyond what is read
    ASSERT_EQ(::pread(fd, part.data(), part.size(), 128 * KiB), static_cast<ssize_t>(part.size()));
    ::close(fd);
    st = nvio::detail::page_cache_state(path, probe);
    EXPECT_GE(st.cached_bytes, 64 * KiB) << st.method;
    EXPECT_LT(st.cached_bytes, len) << st.method;
    write_pattern_file(path, len, 5);  // cached again for the other probe
  }
  EXPECT_EQ(nvio::detail::page_cache_state(path, nvio::detail::CacheProbe::Mincore).method,
            "mincore");
}

TEST(PageCache, EvictAndStateOfAFile) {
  const TempDir dir;
  check_page_cache_states(dir.path());
}

// A container's files are on overlayfs, whose pages belong to the file beneath (cachestat of the
// overlay file counts none of them): the same answers there.
TEST(PageCache, EvictAndStateOfAFileOnOverlayfs) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting overlayfs needs root";
  const TempDir dir;
  for (const char* sub : {"lower", "upper", "work", "merged"}) {
    ASSERT_EQ(::mkdir(dir.file(sub).c_str(), 0755), 0) << sub;
  }
  const CommandResult mount =
      run_command({"mount", "-t", "overlay", "overlay", "-o",
                   "lowerdir=" + dir.file("lower") + ",upperdir=" + dir.file("upper") +
                       ",workdir=" + dir.file("work"),
                   dir.file("merged")});
  if (mount.status != 0) GTEST_SKIP() << "mount -t overlay failed: " << mount.output;
  struct Unmount {
    std::string at;
    ~Unmount() { ::umount2(at.c_str(), MNT_DETACH); }
  } unmount{dir.file("merged")};
  check_page_cache_states(dir.file("merged"));
}

TEST(PageCache, EmptyMissingAndNonRegularFiles) {
  const TempDir dir;
  const std::string empty = dir.file("empty");
  write_file(empty, "", 0);
  const nvio::PageCacheState st = nvio::page_cache_state(empty);
  EXPECT_EQ(st.file_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, 0u);
  const std::string missing = dir.file("missing");
  try {
    nvio::page_cache_state(missing);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const nvio::FileNotFound& e) {
    EXPECT_EQ(e.path(), missing);
  }
  EXPECT_THROW(nvio::evict_page_cache(missing), nvio::FileNotFound);
  EXPECT_THROW(nvio::page_cache_state(dir.path()), nvio::IoError);
}

}  // namespace
}  // namespace nvio_test
