// AlignedBuffer (alignment, size, moves, locking, huge-page advice), is_locked_by_nvio, and the
// warning sink, including the once-only warning when mlock is refused.
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/posix.hpp"
#include "memory/user_copy.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::AlignedBuffer;
using nvio::LockMode;

// AddressSanitizer and ThreadSanitizer intercept mlock and make it a no-op, so locking cannot be
// observed there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kMlockIntercepted = true;
#else
constexpr bool kMlockIntercepted = false;
#endif
#define SKIP_IF_MLOCK_INTERCEPTED() \
  if (kMlockIntercepted) GTEST_SKIP() << "the sanitizer replaces mlock with a no-op"

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// VmLck of this process in bytes (from /proc/self/status).
std::uint64_t vm_locked_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmLck:", 0) == 0) {
      std::istringstream s(line.substr(6));
      std::uint64_t kb = 0;
      s >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

// The smaps entry (header range, VmFlags) of the mapping that contains `p`.
struct Mapping {
  std::uintptr_t begin = 0, end = 0;
  std::string vmflags;
};
std::optional<Mapping> mapping_of(const void* p) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  std::optional<Mapping> cur;
  while (std::getline(in, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(':') > line.find(' ')) {
      if (cur && addr(p) >= cur->begin && addr(p) < cur->end) return cur;
      Mapping m;
      m.begin = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
      m.end = std::stoull(line.substr(line.find('-') + 1, line.find(' ')), nullptr, 16);
      cur = m;
    } else if (cur && line.rfind("VmFlags:", 0) == 0) {
      cur->vmflags = line.substr(8);
    }
  }
  if (cur && addr(p) >= cur->begin && addr(p) < cur->end) return cur;
  return std::nullopt;
}

bool has_word(const std::string& words, const std::string& w) {
  std::istringstream s(words);
  std::string x;
  while (s >> x) {
    if (x == w) return true;
  }
  return false;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

TEST(AlignedBuffer, DefaultIsEmpty) {
  AlignedBuffer b;
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.bytes(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_FALSE(b.locked());
  EXPECT_FALSE(static_cast<bool>(b));
}

TEST(AlignedBuffer, AlignmentAndSize) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t n :
       {std::size_t{1}, std::size_t{4095}, std::size_t{4097}, 3 * MiB + 5, std::size_t{2 * MiB}}) {
    SCOPED_TRACE("size " + std::to_string(n));
    AlignedBuffer b(n, LockMode::None);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_TRUE(static_cast<bool>(b));
    EXPECT_EQ(b.size(), n);
    EXPECT_EQ(static_cast<void*>(b.bytes()), b.data());
    EXPECT_EQ(addr(b.data()) % page, 0u);
    EXPECT_EQ(addr(b.data()) % 4096, 0u);
    EXPECT_FALSE(b.locked());
    // Every byte is usable, and the memory starts zeroed (anonymous mapping).
    EXPECT_EQ(std::count(b.bytes(), b.bytes() + n, std::byte{0}), static_cast<long>(n));
    nvio::pattern::fill(b.data(), n, 0, 77);
    EXPECT_TRUE(buffer_has_pattern(b.data(), n, 0, 77));
  }
}

// Sizes within a page of 2^64 once rounded up to a tiny mapping (a segfault when it was filled).
TEST(AlignedBuffer, SizesNoProcessCanAddressAreRefused) {
  for (const std::size_t size :
       {SIZE_MAX, SIZE_MAX - 4095, SIZE_MAX - (std::size_t{2} << 20) + 1, SIZE_MAX / 2 + 1}) {
    try {
      AlignedBuffer b(size);
      ADD_FAILURE() << "mapped " << b.size() << " bytes for " << size;
    } catch (const nvio::MemoryError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(size)), std::string::npos) << e.what();
    }
  }
}

TEST(AlignedBuffer, ZeroSizeRejected) {
  EXPECT_THROW(AlignedBuffer(0), nvio::InvalidArgument);
  EXPECT_THROW(AlignedBuffer(0, LockMode::None), nvio::InvalidArgument);
}

TEST(AlignedBuffer, MoveSemantics) {
  AlignedBuffer a(10000, LockMode::None);
  nvio::pattern::fill(a.data(), a.size(), 0, 1);
  void* p = a.data();

  AlignedBuffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 10000u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is defined
  EXPECT_EQ(a.size(), 0u);
  EXPECT_FALSE(static_cast<bool>(a));
  EXPECT_TRUE(buffer_has_pattern(b.data(), b.size(), 0, 1));

  AlignedBuffer c(500, LockMode::None);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), 10000u);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.size(), 0u);
  EXPECT_TRUE(buffer_has_pattern(c.data(), c.size(), 0, 1));

  // Self move-assignment keeps the buffer (no double unmap).
  AlignedBuffer& alias = c;
  c = std::move(alias);
  EXPECT_EQ(c.data(), p);
  EXPECT_TRUE(buffer_has_pattern(c.data(), c.size(), 0, 1));

  // Moving a locked buffer moves the lock state.
  AlignedBuffer l(MiB, LockMode::Try);
  const bool was_locked = l.locked();
  void* lp = l.data();
  AlignedBuffer m(std::move(l));
  EXPECT_EQ(m.locked(), was_locked);
  EXPECT_FALSE(l.locked());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(nvio::is_locked_by_nvio(lp, MiB), was_locked);
}

TEST(AlignedBuffer, HugePageAdvice) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!thp) GTEST_SKIP() << "kernel without transparent huge pages";
  AlignedBuffer b(3 * MiB, LockMode::None);
  auto m = mapping_of(b.data());
  ASSERT_TRUE(m.has_value()) << "no smaps entry for the buffer";
  EXPECT_TRUE(has_word(m->vmflags, "hg"))
      << "buffer not advised MADV_HUGEPAGE; VmFlags:" << m->vmflags;
  EXPECT_GE(m->end - addr(b.data()), 4 * MiB) << "mapping not rounded up to 2 MiB";
}

TEST(AlignedBuffer, LockedStateMatchesKernel) {
  SKIP_IF_MLOCK_INTERCEPTED();
  struct rlimit rl {};
  ::getrlimit(RLIMIT_MEMLOCK, &rl);
  const bool can_lock = ::geteuid() == 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= 64 * MiB;
  const std::uint64_t before = vm_locked_bytes();
  AlignedBuffer b(3 * MiB, LockMode::Try);
  if (!b.locked()) {
    ASSERT_FALSE(can_lock) << "mlock of 3 MiB should succeed here (root or a large limit)";
    GTEST_SKIP() << "RLIMIT_MEMLOCK (" << rl.rlim_cur << " bytes) too small to lock 3 MiB";
  }
  EXPECT_GE(vm_locked_bytes() - before, 3 * MiB) << "locked() but VmLck did not grow";
  EXPECT_TRUE(nvio::is_locked_by_nvio(b.data(), b.size()));
  EXPECT_TRUE(nvio::is_locked_by_nvio(b.bytes() + 4097, 1000));
  EXPECT_TRUE(nvio::is_locked_by_nvio(b.bytes() + b.size() - 1, 1));

  AlignedBuffer r(MiB, LockMode::Require);
  EXPECT_TRUE(r.locked());
  EXPECT_TRUE(nvio::is_locked_by_nvio(r.data(), r.size()));

  AlignedBuffer n(MiB, LockMode::None);
  EXPECT_FALSE(n.locked());
  EXPECT_FALSE(nvio::is_locked_by_nvio(n.data(), n.size()));
  int on_stack = 0;
  EXPECT_FALSE(nvio::is_locked_by_nvio(&on_stack, sizeof on_stack));
  std::vector<char> heap(100);
  EXPECT_FALSE(nvio::is_locked_by_nvio(heap.data(), heap.size()));
  // A range that starts inside but runs far past the locked buffer.
  EXPECT_FALSE(nvio::is_locked_by_nvio(b.data(), 1 * GiB));

  const void* p = b.data();
  { AlignedBuffer gone(std::move(b)); }
  EXPECT_FALSE(nvio::is_locked_by_nvio(p, 4096)) << "still reported locked after release";
  EXPECT_LE(vm_locked_bytes(), before + 4 * MiB) << "munmap/munlock did not release the lock";
}

// Drops CAP_IPC_LOCK from this (child) process so RLIMIT_MEMLOCK applies even to root.
bool drop_ipc_lock() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &hdr, data) != 0) return false;
  const unsigned bit = CAP_IPC_LOCK;
  data[bit / 32].effective &= ~(1u << (bit % 32));
  data[bit / 32].permitted &= ~(1u << (bit % 32));
  data[bit / 32].inheritable &= ~(1u << (bit % 32));
  return ::syscall(SYS_capset, &hdr, data) == 0;
}

// In a forked child with a tiny RLIMIT_MEMLOCK: Require throws MemoryError; Try falls back to
// unlocked memory and warns once per process.
TEST(AlignedBuffer, LockRefusal) {
  SKIP_IF_MLOCK_INTERCEPTED();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::size_t prior_lock_warnings = [] {
    std::size_t n = 0;
    for (const auto& w : recorded_warnings()) n += lower(w).find("lock") != std::string::npos;
    return n;
  }();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    int code = 0;
    auto fail = [&](const std::string& s) {
      out += s + "\n";
      code = 1;
    };
    drop_ipc_lock();
    struct rlimit rl {
      64 * KiB, 64 * KiB
    };
    ::setrlimit(RLIMIT_MEMLOCK, &rl);
    void* probe = ::mmap(nullptr, MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (probe != MAP_FAILED && ::mlock(probe, MiB) == 0) {
      out = "cannot make mlock fail in a child (CAP_IPC_LOCK could not be dropped)";
      code = 77;
    } else {
      try {
        AlignedBuffer r(MiB, LockMode::Require);
        fail("LockMode::Require did not throw when mlock was refused (locked()=" +
             std::to_string(r.locked()) + ")");
      } catch (const nvio::MemoryError& e) {
        if (e.error_code() == 0) fail(std::string("MemoryError without errno: ") + e.what());
      } catch (const std::exception& e) {
        fail(std::string("Require threw the wrong type: ") + e.what());
      }
      std::vector<std::string> captured;
      nvio::set_warning_sink([&](const std::string& m) { captured.push_back(m); });
      for (int i = 0; i < 2; ++i) {
        try {
          AlignedBuffer t(MiB, LockMode::Try);
          if (t.locked()) fail("Try reported locked() although mlock is refused");
          if (nvio::is_locked_by_nvio(t.data(), t.size())) fail("is_locked_by_nvio true");
          if (t.size() != MiB || t.data() == nullptr) fail("Try fallback buffer unusable");
          nvio::pattern::fill(t.data(), t.size(), 0, 5);
          if (nvio::pattern::first_mismatch(t.data(), t.size(), 0, 5)) fail("bad memory");
        } catch (const std::exception& e) {
          fail(std::string("Try threw: ") + e.what());
        }
      }
      const std::size_t want = prior_lock_warnings == 0 ? 1 : 0;
      if (captured.size() != want) {
        std::string all;
        for (const auto& c : captured) all += " [" + c + "]";
        fail("expected " + std::to_string(want) + " warning(s) for two refused locks, got " +
             std::to_string(captured.size()) + ":" + all);
      } else if (want == 1 && lower(captured[0]).find("lock") == std::string::npos) {
        fail("the warning does not mention locking: " + captured[0]);
      }
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(code);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child crashed (signal " << WTERMSIG(status) << ")";
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << msg;
  EXPECT_EQ(WEXITSTATUS(status), 0) << msg;
}

// ---- warnings ----------------------------------------------------------------------------------

class Warnings : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = nvio::set_warning_sink([this](const std::string& m) { got_.push_back(m); });
  }
  void TearDown() override { nvio::set_warning_sink(recording_sink()); }
  std::vector<std::string> got_;
  nvio::WarningSink previous_;
};

TEST_F(Warnings, SinkReceivesMessages) {
  nvio::warn("first message");
  nvio::warn("first message");
  EXPECT_EQ(got_, (std::vector<std::string>{"first message", "first message"}));
}

TEST_F(Warnings, OnceKeyFiresOnce) {
  nvio::warn("only once A", "nvio-test-once-A");
  nvio::warn("only once A again", "nvio-test-once-A");
  nvio::warn("only once B", "nvio-test-once-B");
  nvio::warn("only once B", "nvio-test-once-B");
  EXPECT_EQ(got_, (std::vector<std::string>{"only once A", "only once B"}));
}

TEST_F(Warnings, SetReturnsPreviousAndEmptyRestoresDefault) {
  // The previous sink was test_main's recorder.
  ASSERT_TRUE(static_cast<bool>(previous_));
  const auto before = recorded_warnings().size();
  previous_("via previous");
  EXPECT_EQ(recorded_warnings().size(), before + 1);
  EXPECT_EQ(recorded_warnings().back(), "via previous");

  // Replacing returns the sink installed in SetUp, which still captures.
  auto mine = nvio::set_warning_sink({});
  ASSERT_TRUE(static_cast<bool>(mine));
  mine("direct call");
  EXPECT_EQ(got_, (std::vector<std::string>{"direct call"}));
  // The default sink discards: nothing reaches ours or the recorder.
  nvio::warn("to the default sink");
  EXPECT_EQ(got_.size(), 1u);
  EXPECT_EQ(recorded_warnings().size(), before + 1);
}

// ---- checked copies between the caller's memory and bounce chunks -----------------------------

// 8 pages: the first 3 readable and writable, the rest `prot`.
class PartlyProtected {
 public:
  explicit PartlyProtected(int prot) {
    void* p = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    base_ = static_cast<std::byte*>(p);
    std::memset(base_, 0x11, kSize);
    EXPECT_EQ(::mprotect(base_ + kGood, kSize - kGood, prot), 0);
  }
  ~PartlyProtected() { ::munmap(base_, kSize); }
  std::byte* data() const { return base_; }
  static constexpr std::size_t kSize = 8 * 4096;
  static constexpr std::size_t kGood = 3 * 4096;

 private:
  std::byte* base_ = nullptr;
};

TEST(UserCopy, CopiesGoodMemoryAndStopsAtBadPages) {
  std::vector<std::byte> chunk(PartlyProtected::kSize);
  for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<std::byte>(i * 7);
  nvio::detail::UserCopier copier;
  {
    // Into good memory, from an unaligned address: every byte, none beside it.
    PartlyProtected m(PROT_READ | PROT_WRITE);
    const auto r = copier.to_user(m.data() + 5, chunk.data(), 5 * 4096);
    EXPECT_EQ(r.error, 0);
    EXPECT_EQ(std::memcmp(m.data() + 5, chunk.data(), 5 * 4096), 0);
    EXPECT_EQ(m.data()[4], std::byte{0x11});
    EXPECT_EQ(m.data()[5 + 5 * 4096], std::byte{0x11});
    std::vector<std::byte> back(5 * 4096);
    EXPECT_EQ(copier.from_user(back.data(), m.data() + 5, back.size()).error, 0);
    EXPECT_EQ(std::memcmp(back.data(), chunk.data(), back.size()), 0);
  }
  {
    // Into memory that turns read-only: EFAULT exactly where it does.
    PartlyProtected m(PROT_READ);
    const auto r = copier.to_user(m.data() + 1, chunk.data(), 6 * 4096);
    EXPECT_EQ(r.error, EFAULT);
    EXPECT_EQ(r.fault_at, PartlyProtected::kGood - 1);
    EXPECT_EQ(m.data()[PartlyProtected::kGood], std::byte{0x11}) << "read-only memory changed";
    const auto v = nvio::detail::copy_user_by_process_vm(m.data() + 1, chunk.data(), 6 * 4096,
                                                         /*to_user=*/true);
    EXPECT_EQ(v.error, EFAULT);
    EXPECT_EQ(v.fault_at, PartlyProtected::kGood - 1);
  }
  {
    // Out of memory that turns unreadable.
    PartlyProtected m(PROT_NONE);
    std::vector<std::byte> out(6 * 4096);
    const auto r = copier.from_user(out.data(), m.data() + 1, out.size());
    EXPECT_EQ(r.error, EFAULT);
    EXPECT_EQ(r.fault_at, PartlyProtected::kGood - 1);
    const auto all_bad = copier.from_user(out.data(), m.data() + PartlyProtected::kGood, 4096);
    EXPECT_EQ(all_bad.error, EFAULT);
    EXPECT_EQ(all_bad.fault_at, 0u);
  }
  {
    // A shared file mapping past the end of its file: access there raises SIGBUS, not SIGSEGV.
    TempDir dir;
    const std::string path = dir.file("short");
    nvio::detail::FileDescriptor fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_GE(fd.get(), 0);
    ASSERT_EQ(::ftruncate(fd.get(), 2 * 4096), 0);
    void* p = ::mmap(nullptr, 4 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    ASSERT_NE(p, MAP_FAILED);
    auto* mapped = static_cast<std::byte*>(p);
    const auto in = copier.to_user(mapped + 1, chunk.data(), 3 * 4096);
    EXPECT_EQ(in.error, EFAULT);
    EXPECT_EQ(in.fault_at, 2 * 4096 - 1);
    EXPECT_EQ(std::memcmp(mapped + 1, chunk.data(), 2 * 4096 - 1), 0);
    std::vector<std::byte> out(3 * 4096);
    const auto from = copier.from_user(out.data(), mapped + 1, out.size());
    EXPECT_EQ(from.error, EFAULT);
    EXPECT_EQ(from.fault_at, 2 * 4096 - 1);
    ::munmap(p, 4 * 4096);
  }
  // The copier still works after failures (its pipe was left empty).
  std::vector<std::byte> a(3 * 4096 + 9), b(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::byte>(i);
  EXPECT_EQ(copier.to_user(b.data() + 1, a.data(), a.size() - 1).error, 0);
  EXPECT_EQ(std::memcmp(b.data() + 1, a.data(), a.size() - 1), 0);
}

}  // namespace
}  // namespace nvio_test
