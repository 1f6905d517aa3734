#include "test_util.hpp"

#include <dirent.h>
#include <ftw.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace nvio_test {

namespace {

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  ::remove(path);
  return 0;
}

std::string hex_byte(unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", v & 0xffu);
  return buf;
}

}  // namespace

// ---- temporary directories ------------------------------------------------------------------

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  std::string tmpl = test_root() + "/t" + std::to_string(counter++) + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error(errno_text("mkdtemp", tmpl));
  path_ = buf.data();
}

TempDir::~TempDir() { remove_tree(path_); }

// ---- files -----------------------------------------------------------------------------------

int open_fd_count() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n - 1;  // less the one opendir holds
}

std::int64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return st.st_size;
}

std::vector<unsigned char> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(errno_text("open", path));
  struct stat st {};
  ::fstat(fd, &st);
  std::vector<unsigned char> out(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error(errno_text("pread", path));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return out;
}

void write_file(const std::string& path, const void* bytes, std::size_t len) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(errno_text("open", path));
  const auto* p = static_cast<const unsigned char*>(bytes);
  std::size_t done = 0;
  while (done < len) {
    ssize_t n = ::pwrite(fd, p + done, len - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error(errno_text("pwrite", path));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

void write_pattern_file(const std::string& path, std::size_t len, std::uint64_t seed) {
  std::vector<unsigned char> bytes(len);
  nvio::pattern::fill(bytes.data(), len, 0, seed);
  write_file(path, bytes.data(), len);
}

::testing::AssertionResult file_range_has_pattern(const std::vector<unsigned char>& file,
                                                  std::uint64_t offset, std::size_t len,
                                                  std::uint64_t seed) {
  if (offset + len > file.size()) {
    return ::testing::AssertionFailure()
           << "file holds " << file.size() << " bytes, expected at least " << offset + len;
  }
  auto bad = nvio::pattern::first_mismatch(file.data() + offset, len, offset, seed);
  if (bad) {
    return ::testing::AssertionFailure()
           << "file byte at offset " << *bad << " is " << hex_byte(file[*bad])
           << ", not the pattern (seed " << seed << ") for range [" << offset << ", "
           << offset + len << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult file_range_is(const std::vector<unsigned char>& file,
                                         std::uint64_t begin, std::uint64_t end,
                                         unsigned char value) {
  if (end > file.size()) {
    return ::testing::AssertionFailure()
           << "file holds " << file.size() << " bytes, expected at least " << end;
  }
  for (std::uint64_t i = begin; i < end; ++i) {
    if (file[i] != value) {
      return ::testing::AssertionFailure() << "file byte at offset " << i << " is "
                                           << hex_byte(file[i]) << ", expected " << hex_byte(value);
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult buffer_has_pattern(const void* buf, std::size_t len,
                                              std::uint64_t file_offset, std::uint64_t seed) {
  auto bad = nvio::pattern::first_mismatch(buf, len, file_offset, seed);
  if (bad) {
    auto idx = *bad - file_offset;
    return ::testing::AssertionFailure()
           << "buffer byte " << idx << " (file offset " << *bad << ") is "
           << hex_byte(static_cast<const unsigned char*>(buf)[idx]) << ", not the pattern (seed "
           << seed << ")";
  }
  return ::testing::AssertionSuccess();
}

std::size_t resident_pages(const std::string& path, std::uint64_t offset, std::size_t len) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(errno_text("open", path));
  std::uint64_t first = offset / page * page;
  std::size_t span = static_cast<std::size_t>(offset + len - first);
  void* map = ::mmap(nullptr, span, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(first));
  ::close(fd);
  if (map == MAP_FAILED) throw std::runtime_error(errno_text("mmap", path));
  std::vector<unsigned char> vec((span + page - 1) / page);
  int rc = ::mincore(map, span, vec.data());
  ::munmap(map, span);
  if (rc != 0) throw std::runtime_error(errno_text("mincore", path));
  return static_cast<std::size_t>(
      std::count_if(vec.begin(), vec.end(), [](unsigned char v) { return (v & 1) != 0; }));
}

void drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(errno_text("open", path));
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// ---- guarded buffers -------------------------------------------------------------------------

const char* to_string(BufKind kind) {
  switch (kind) {
    case BufKind::Aligned: return "aligned";
    case BufKind::Plus1: return "aligned+1";
    case BufKind::Plus3: return "aligned+3";
    case BufKind::Plus4095: return "aligned+4095";
    case BufKind::Vector: return "std::vector";
  }
  return "?";
}

GuardedBuffer::GuardedBuffer(std::size_t len, BufKind kind) : len_(len) {
  std::size_t shift = 0;
  switch (kind) {
    case BufKind::Aligned: shift = 0; break;
    case BufKind::Plus1: shift = 1; break;
    case BufKind::Plus3: shift = 3; break;
    case BufKind::Plus4095: shift = 4095; break;
    case BufKind::Vector: break;
  }
  if (kind == BufKind::Vector) {
    vector_.resize(len + 2 * kGuard);
    base_ = vector_.data();
    data_ = base_ + kGuard;
  } else {
    // [base, base + kGuard + shift) guard, then the caller bytes, then kGuard guard bytes.
    aligned_ = nvio::AlignedBuffer(kGuard + shift + len + kGuard, nvio::LockMode::None);
    base_ = reinterpret_cast<unsigned char*>(aligned_.data());
    data_ = base_ + kGuard + shift;
  }
  std::memset(base_, kSentinel, static_cast<std::size_t>(data_ - base_));
  std::memset(data_ + len_, kSentinel, kGuard);
}

void GuardedBuffer::fill_pattern(std::uint64_t file_offset, std::uint64_t seed) {
  nvio::pattern::fill(data_, len_, file_offset, seed);
}

void GuardedBuffer::fill_sentinel() { std::memset(data_, kSentinel, len_); }

::testing::AssertionResult GuardedBuffer::guards_intact() const {
  for (unsigned char* p = base_; p < data_; ++p) {
    if (*p != kSentinel) {
      return ::testing::AssertionFailure()
             << "guard byte " << (data_ - p) << " bytes before the buffer was changed to "
             << hex_byte(*p);
    }
  }
  for (std::size_t i = 0; i < kGuard; ++i) {
    if (data_[len_ + i] != kSentinel) {
      return ::testing::AssertionFailure()
             << "guard byte " << i << " bytes after the buffer end was changed to "
             << hex_byte(data_[len_ + i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- engines ---------------------------------------------------------------------------------

const char* engine_name(nvio::EngineKind kind) {
  switch (kind) {
    case nvio::EngineKind::Auto: return "Auto";
    case nvio::EngineKind::IoUring: return "IoUring";
    case nvio::EngineKind::Libaio: return "Libaio";
    case nvio::EngineKind::Psync: return "Psync";
    case nvio::EngineKind::CuFile: return "CuFile";
  }
  return "Unknown";
}

std::string EngineParamName::operator()(
    const ::testing::TestParamInfo<nvio::EngineKind>& info) const {
  return engine_name(info.param);
}

void EngineTest::SetUp() {
  if (kind() != nvio::EngineKind::Auto) {
    const nvio::EngineProbe& probe = nvio::probe_engine(kind());
    if (!probe.available) {
      GTEST_SKIP() << "engine " << nvio::to_string(kind())
                   << " is not available on this machine: " << probe.reason;
    }
  }
  dir_.emplace();
  direct_ = nvio::probe_directory(dir_->path());
}

void EngineTest::TearDown() { dir_.reset(); }

nvio::Options EngineTest::base_options() const {
  nvio::Options o;
  o.engine = kind();
  o.direct = direct_.supported ? nvio::DirectIo::On : nvio::DirectIo::Off;
  return o;
}

// ---- commands and mounts ----------------------------------------------------------------------

namespace {

// argv[0] as given when it holds a '/', else the first executable of that name in PATH or in the
// system directories that root's tools (mkfs.ext4) live in; empty when there is none.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* env = std::getenv("PATH");
  std::string dirs = std::string(env != nullptr ? env : "") + ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(start, end - start);
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return dir + "/" + name;
    start = end + 1;
  }
  return {};
}

}  // namespace

CommandResult run_command(const std::vector<std::string>& argv) {
  CommandResult result;
  const std::string program = argv.empty() ? std::string() : find_program(argv[0]);
  if (program.empty()) {
    result.output = (argv.empty() ? std::string("(no command)") : argv[0]) + ": not found";
    return result;
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    result.output = std::string("pipe2: ") + std::strerror(errno);
    return result;
  }
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    result.output = program + ": " + std::strerror(rc);
    return result;
  }
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::optional<LoopMount> LoopMount::make(const std::string& parent, std::size_t bytes,
                                         std::string* why_not, LoopFs fs) {
  if (::geteuid() != 0) {
    *why_not = "mounting a loop device needs root";
    return std::nullopt;
  }
  static std::atomic<int> counter{0};
  // The pid too: test processes run side by side (ctest -j), each counting from 0.
  const std::string name =
      parent + "/loopfs" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const std::string image = name + ".img";
  const int fd = ::open(image.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    *why_not = errno_text("cannot make the image", image);
    if (fd >= 0) ::close(fd);
    return std::nullopt;
  }
  ::close(fd);
  const bool xfs = fs != LoopFs::Ext4;
  const std::vector<std::string> mkfs_argv =
      xfs ? std::vector<std::string>{"mkfs.xfs", "-q", "-f", "-m", "reflink=1", image}
          : std::vector<std::string>{"mkfs.ext4", "-q", "-F", "-b",           "4096",
                                     "-m",        "0",  "-O", "^has_journal", image};
  const CommandResult mkfs = run_command(mkfs_argv);
  if (mkfs.status != 0) {
    ::unlink(image.c_str());
    *why_not =
        mkfs_argv[0] + " failed (status " + std::to_string(mkfs.status) + "): " + mkfs.output;
    return std::nullopt;
  }
  if (::mkdir(name.c_str(), 0755) != 0) {
    *why_not = errno_text("mkdir", name);
    ::unlink(image.c_str());
    return std::nullopt;
  }
  LoopMount m(image, name);
  const std::string options = fs == LoopFs::XfsLargeIo ? "loop,largeio,allocsize=4m" : "loop";
  const CommandResult mount =
      run_command({"mount", "-t", xfs ? "xfs" : "ext4", "-o", options, image, name});
  if (mount.status != 0) {
    *why_not = "mount -o " + options + " failed (status " + std::to_string(mount.status) +
               "): " + mount.output;
    return std::nullopt;  // m's destructor removes the image and the mount point
  }
  m.mounted_ = true;
  return m;
}

LoopMount::LoopMount(std::string image, std::string mount_point)
    : image_(std::move(image)), mount_point_(std::move(mount_point)) {}

LoopMount::LoopMount(LoopMount&& other) noexcept
    : image_(std::move(other.image_)),
      mount_point_(std::move(other.mount_point_)),
      mounted_(other.mounted_) {
  other.image_.clear();
  other.mount_point_.clear();
  other.mounted_ = false;
}

LoopMount& LoopMount::operator=(LoopMount&& other) noexcept {
  if (this != &other) {
    release();
    image_ = std::move(other.image_);
    mount_point_ = std::move(other.mount_point_);
    mounted_ = other.mounted_;
    other.image_.clear();
    other.mount_point_.clear();
    other.mounted_ = false;
  }
  return *this;
}

LoopMount::~LoopMount() { release(); }

void LoopMount::release() noexcept {
  // A file a failed test left open keeps the mount busy: detach it lazily then, so that it goes
  // away when that descriptor is closed (at the latest when the process exits).
  if (mounted_ && ::umount2(mount_point_.c_str(), 0) != 0) {
    ::umount2(mount_point_.c_str(), MNT_DETACH);
  }
  mounted_ = false;
  if (!mount_point_.empty()) ::rmdir(mount_point_.c_str());
  if (!image_.empty()) ::unlink(image_.c_str());
}

std::string LoopMount::remount_read_only() {
  if (::mount("none", mount_point_.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
    return errno_text("remount read-only", mount_point_);
  }
  return {};
}

std::uint64_t LoopMount::available_bytes() const {
  struct statvfs st {};
  if (::statvfs(mount_point_.c_str(), &st) != 0) {
    throw std::runtime_error(errno_text("statvfs", mount_point_));
  }
  return std::uint64_t{st.f_bavail} * st.f_frsize;
}

void LoopMount::sync() const {
  const int fd = ::open(mount_point_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::syncfs(fd) != 0) {
    const std::string what = errno_text("syncfs", mount_point_);
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(what);
  }
  ::close(fd);
}

// ---- misc --------------------------------------------------------------------------------------

::testing::AssertionResult contains(const std::string& what, const std::string& needle) {
  if (what.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "message \"" << what << "\" does not contain \"" << needle << "\"";
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (const char* old = std::getenv(name)) old_ = old;
  if (value) {
    ::setenv(name, value, 1);
  } else {
    ::unsetenv(name);
  }
}

ScopedEnv::~ScopedEnv() {
  if (old_) {
    ::setenv(name_.c_str(), old_->c_str(), 1);
  } else {
    ::unsetenv(name_.c_str());
  }
}

}  // namespace nvio_test

namespace nvio_test {

namespace {

// A file of /proc as text, or why it could not be read. read_file() does not serve: these files
// report a size of 0.
std::string read_proc_text(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return "(" + std::string(std::strerror(errno)) + ")";
  std::string text(8192, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace

void report_stuck_process(pid_t pid) {
  std::ostringstream out;
  out << "process " << pid << " hung; its threads:\n";
  const std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* dir = ::opendir(task_dir.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      const std::string t = task_dir + "/" + entry->d_name;
      out << "  thread " << entry->d_name << " (" << read_proc_text(t + "/comm") << "): wchan "
          << read_proc_text(t + "/wchan") << ", syscall " << read_proc_text(t + "/syscall") << "\n"
          << read_proc_text(t + "/stack") << "\n";
    }
    ::closedir(dir);
  }
  const CommandResult gdb = run_command(
      {"timeout", "60", "gdb", "-p", std::to_string(pid), "-batch", "-ex", "thread apply all bt"});
  out << "gdb: " << gdb.output << "\n";
  std::fputs(out.str().c_str(), stderr);
}

}  // namespace nvio_test
