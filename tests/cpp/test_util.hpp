// Shared helpers for the nvio GoogleTest suite.
//
// Everything here checks nvio from the outside with plain POSIX calls (pread, fstat, mincore), so a
// bug in nvio cannot hide itself by being used to verify its own output.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "nvio/nvio.hpp"

namespace nvio_test {

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;
inline constexpr std::size_t GiB = 1024 * MiB;

// Byte used to pre-fill read buffers and guard zones. The pattern never produces a run of these
// long enough to matter: first_mismatch and the guard checks compare every byte.
inline constexpr unsigned char kSentinel = 0xA5;
// Bytes checked on each side of a caller buffer.
inline constexpr std::size_t kGuard = 4096;

// ---- temporary directories ------------------------------------------------------------------

// The root temporary directory of this test process (made by test_main.cpp under $TMPDIR, or
// under the directory holding the test binary, i.e. the build tree; removed at exit).
const std::string& test_root();
// Removes a file or a directory tree; ignores a missing path.
void remove_tree(const std::string& path);

// A fresh directory under test_root(), removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// ---- files through plain POSIX ---------------------------------------------------------------

// Size of `path` by stat(2); -1 when it does not exist.
std::int64_t file_size(const std::string& path);
// The number of descriptors this process has open (/proc/self/fd), for leak checks.
int open_fd_count();
// Whole file by pread(2).
std::vector<unsigned char> read_file(const std::string& path);
// Replaces `path` with exactly `bytes` (O_TRUNC, pwrite, no nvio).
void write_file(const std::string& path, const void* bytes, std::size_t len);
// Replaces `path` with `len` bytes of the pattern for file offsets [0, len) and `seed`.
void write_pattern_file(const std::string& path, std::size_t len, std::uint64_t seed);

// Checks that file bytes [offset, offset + len) hold the pattern for `seed`.
::testing::AssertionResult file_range_has_pattern(const std::vector<unsigned char>& file,
                                                  std::uint64_t offset, std::size_t len,
                                                  std::uint64_t seed);
// Checks that every byte in [begin, end) is `value`.
::testing::AssertionResult file_range_is(const std::vector<unsigned char>& file,
                                         std::uint64_t begin, std::uint64_t end,
                                         unsigned char value);
// Checks a buffer against the pattern, reporting the first bad file offset.
::testing::AssertionResult buffer_has_pattern(const void* buf, std::size_t len,
                                              std::uint64_t file_offset, std::uint64_t seed);

// Number of pages of [offset, offset + len) of `path` that are in the page cache (mincore).
std::size_t resident_pages(const std::string& path, std::uint64_t offset, std::size_t len);
// Drops clean page-cache pages of `path` (fdatasync + POSIX_FADV_DONTNEED).
void drop_cache(const std::string& path);

// ---- caller buffers with guard zones -------------------------------------------------------

enum class BufKind {
  Aligned,   // AlignedBuffer data(), page aligned
  Plus1,     // AlignedBuffer data() + 1
  Plus3,     // AlignedBuffer data() + 3
  Plus4095,  // AlignedBuffer data() + 4095
  Vector,    // a std::vector's storage (malloc alignment)
};
const char* to_string(BufKind kind);
inline constexpr BufKind kAllBufKinds[] = {BufKind::Aligned, BufKind::Plus1, BufKind::Plus3,
                                           BufKind::Plus4095, BufKind::Vector};

// A caller buffer of `len` bytes at the address kind asks for, with kGuard sentinel bytes on each
// side that nvio must never touch.
class GuardedBuffer {
 public:
  GuardedBuffer(std::size_t len, BufKind kind);
  unsigned char* data() const { return data_; }
  std::size_t size() const { return len_; }
  // Fills the caller bytes with the pattern for file offsets starting at `file_offset`.
  void fill_pattern(std::uint64_t file_offset, std::uint64_t seed);
  // Fills the caller bytes with the sentinel.
  void fill_sentinel();
  // The guard bytes on both sides are still the sentinel.
  ::testing::AssertionResult guards_intact() const;

 private:
  nvio::AlignedBuffer aligned_;
  std::vector<unsigned char> vector_;
  unsigned char* base_ = nullptr;  // start of the leading guard
  unsigned char* data_ = nullptr;
  std::size_t len_ = 0;
};

// ---- commands and mounts ----------------------------------------------------------------------

// What a command printed (stdout and stderr together) and how it ended.
struct CommandResult {
  int status = -1;  // exit status; 128 + signal when killed; -1 when it could not be started
  std::string output;
};
// Runs argv[0] (searched in PATH and in /usr/sbin, /sbin) with `argv`, without a shell.
CommandResult run_command(const std::vector<std::string>& argv);

// Which file system a LoopMount makes: ext4 (mkfs.ext4, from e2fsprogs); XFS with reflink
// (mkfs.xfs, from xfsprogs; at least 300 MiB), whose files can share blocks (FICLONERANGE); or XFS
// mounted with largeio,allocsize=4m, whose files report an st_blksize of 4 MiB (the preferred
// I/O size of NFS and striped XFS is as large), above nvio's default block size.
enum class LoopFs { Ext4, XfsReflink, XfsLargeIo };

// A small file system in an image file, mounted through a loop device, for tests of real
// file-system faults (ENOSPC, EROFS) and of block sharing. Needs root, mkfs, mount and a free loop
// device.
// Ownership: the mount, its loop device (detached by the kernel on unmount: mount -o loop sets
// autoclear), the image and the mount point; all released on destruction, also when the test
// failed. Move-only. Not thread-safe: use it from the test's main thread.
class LoopMount {
 public:
  // Makes a `bytes` long image in `parent` and mounts it read-write. ext4: 4 KiB blocks, no blocks
  // reserved for root (the space free to root is the space free to anyone) and no journal (with
  // one, ext4 now and then refuses the last block of the space statvfs reports free, so that a
  // test could not ask for exactly that much to fit). Returns nullopt and sets `why_not` to what
  // failed (for a GTEST_SKIP) when it cannot.
  static std::optional<LoopMount> make(const std::string& parent, std::size_t bytes,
                                       std::string* why_not, LoopFs fs = LoopFs::Ext4);
  LoopMount(LoopMount&& other) noexcept;
  LoopMount& operator=(LoopMount&& other) noexcept;
  LoopMount(const LoopMount&) = delete;
  LoopMount& operator=(const LoopMount&) = delete;
  ~LoopMount();

  const std::string& path() const { return mount_point_; }
  std::string file(const std::string& name) const { return mount_point_ + "/" + name; }
  // Remounts it read-only; returns what failed, empty on success.
  std::string remount_read_only();
  // Bytes a new write can still allocate (statvfs f_bavail * f_frsize).
  std::uint64_t available_bytes() const;
  // syncfs(2): allocates the blocks of delayed allocations, so that available_bytes() is exact.
  void sync() const;

 private:
  LoopMount(std::string image, std::string mount_point);
  void release() noexcept;

  std::string image_;
  std::string mount_point_;
  bool mounted_ = false;
};

// ---- engines ---------------------------------------------------------------------------------

const char* engine_name(nvio::EngineKind kind);
// Name generator for INSTANTIATE_TEST_SUITE_P over EngineKind.
struct EngineParamName {
  std::string operator()(const ::testing::TestParamInfo<nvio::EngineKind>& info) const;
};
#define NVIO_ALL_ENGINES                                                     \
  ::testing::Values(::nvio::EngineKind::IoUring, ::nvio::EngineKind::Libaio, \
                    ::nvio::EngineKind::Psync, ::nvio::EngineKind::Auto)

// Base fixture of the per-engine suites: skips an engine the machine lacks (with the probe's
// reason), makes a temporary directory, and knows whether O_DIRECT works in it.
class EngineTest : public ::testing::TestWithParam<nvio::EngineKind> {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Options for this engine: direct On where the directory supports O_DIRECT, else Off.
  nvio::Options base_options() const;
  std::string file(const std::string& name) const { return dir_->file(name); }
  const std::string& dir() const { return dir_->path(); }
  bool direct_supported() const { return direct_.supported; }
  const nvio::DirectIoInfo& direct_info() const { return direct_; }
  nvio::EngineKind kind() const { return GetParam(); }

  std::optional<TempDir> dir_;
  nvio::DirectIoInfo direct_;
};

// ---- warnings --------------------------------------------------------------------------------

// Every warning delivered since the process started (test_main installs a recording sink).
std::vector<std::string> recorded_warnings();
// The sink test_main installs; tests that replace the sink restore this one.
nvio::WarningSink recording_sink();

// ---- misc --------------------------------------------------------------------------------------

// Expects `what` to contain `needle`, with a readable failure.
::testing::AssertionResult contains(const std::string& what, const std::string& needle);

// A fake environment: the only variables resolve_options() sees; records what it asked for.
struct FakeEnv {
  std::map<std::string, std::string> vars;
  std::set<std::string> asked;
  nvio::EnvLookup lookup() {
    return [this](const char* name) -> const char* {
      asked.insert(name);
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

// An RAII setenv/unsetenv for tests of the real environment.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// True in a sanitizer build (scripts/sanitize.sh). The heaviest property suites test a smaller
// sample there, said at each use: the sanitizers look for memory and thread errors in the code
// paths, which the sample reaches as the full set does, and the CI runs the whole suite three
// times on two cores within its time budget. The plain build runs the full sets.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

#if defined(__SANITIZE_THREAD__)
#define NVIO_SKIP_FORK_UNDER_TSAN() \
  GTEST_SKIP() << "ThreadSanitizer does not support fork() in a multi-threaded process"
#else
#define NVIO_SKIP_FORK_UNDER_TSAN() (void)0
#endif

// Runs fn(i) for i in [0, n) on n threads and joins them. An exception thrown in a thread becomes
// a test failure naming the thread; let escape, it would terminate the whole test binary.
template <typename F>
void run_threads(unsigned n, F fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (unsigned i = 0; i < n; ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "thread " << i << " threw: " << e.what();
    } catch (...) {
      ADD_FAILURE() << "thread " << i << " threw a non-standard exception";
    }
  }
}

// Writes to stderr where each thread of a hung process is: its threads' names, wait channels and
// system calls from /proc, and their stacks from gdb where it is installed. A hang that happens
// once in many CI runs is then diagnosable from the log.
void report_stuck_process(pid_t pid);

// Runs `child` in a forked child and returns its exit code; 128 + signal when it was killed, -1
// when it did not end within `limit` (it is then described on stderr and killed), -2 when fork
// failed.
template <typename F>
int run_in_child(F child, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = child();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  if (pid < 0) return -2;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > deadline) {
      report_stuck_process(pid);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace nvio_test
