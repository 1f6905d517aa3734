// The temporaries of replacing saves (jobs/replace_file.*): their names say who writes them, a
// replacing save removes those whose writer is gone and never a running writer's, and an error
// about the temporary reaches the caller as an error about the target (issue 28 #4, #10).
#include "nvio/replace_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace {

using nvio::ReplacementFile;
using nvio::temporary_writer;
using nvio_test::TempDir;

std::vector<std::string> temporaries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 9 && name.ends_with(".nvio-tmp")) out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

void touch(const std::string& path) { std::ofstream(path) << "left by a killed save"; }

// A pid that no process has: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

TEST(ReplaceFile, TemporaryNameSaysWhoWritesIt) {
  TempDir dir;
  const nvio::TemporaryFile t = nvio::create_temporary(dir.file("ckpt.pt"));
  ASSERT_GE(t.fd, 0);
  ::close(t.fd);
  const std::string name = t.path.substr(dir.path().size() + 1);
  EXPECT_TRUE(name.starts_with(".ckpt.pt.")) << name;
  const auto w = temporary_writer("ckpt.pt", name);
  ASSERT_TRUE(w.has_value()) << name;
  EXPECT_EQ(w->pid, ::getpid());
  EXPECT_GT(w->start, 0u);
  EXPECT_FALSE(w->host.empty());
  EXPECT_EQ(w->host.find('.'), std::string::npos);
  EXPECT_FALSE(temporary_writer("ckpt", name).has_value());
  EXPECT_FALSE(temporary_writer("ckpt.pt", ".ckpt.pt.0123abcd.nvio-tmp").has_value());
}

TEST(ReplaceFile, ASaveRemovesTemporariesOfGoneWritersOnly) {
  TempDir dir;
  const std::string target = dir.file("state.json");
  // This process's own temporary: its writer runs.
  const nvio::TemporaryFile mine = nvio::create_temporary(target);
  ::close(mine.fd);
  const std::string mine_name = mine.path.substr(dir.path().size() + 1);
  const auto w = temporary_writer("state.json", mine_name);
  ASSERT_TRUE(w.has_value());
  const std::string stem = ".state.json." + w->host + ".";
  const pid_t gone = dead_pid();
  const std::string dead =
      stem + std::to_string(w->start) + "." + std::to_string(gone) + "-1-0.nvio-tmp";
  // This pid with another start time: a process before this one had the pid.
  const std::string reused =
      stem + std::to_string(w->start - 1) + "." + std::to_string(::getpid()) + "-1-0.nvio-tmp";
  const std::string other_host = ".state.json.elsewhere." + std::to_string(w->start) + "." +
                                 std::to_string(gone) + "-1-0.nvio-tmp";
  const std::string locked = stem + "1." + std::to_string(gone) + "-1-1.nvio-tmp";
  for (const std::string& n : {dead, reused, other_host, locked}) touch(dir.file(n));
  const int lock = ::open(dir.file(locked).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_EX), 0);  // a writer in another pid namespace holds it

  {
    ReplacementFile file(target);  // what every replacing save does first
    ASSERT_EQ(::write(file.fd(), "{}", 2), 2);
    file.commit(nvio::Durability::None);
  }
  std::vector<std::string> kept{mine_name, other_host, locked};
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(temporaries(dir.path()), kept);

  ::close(lock);  // its writer let go
  EXPECT_EQ(nvio::remove_stale_temporaries(target), 1u);
  kept.erase(std::find(kept.begin(), kept.end(), locked));
  EXPECT_EQ(temporaries(dir.path()), kept);
}

TEST(ReplaceFile, AnErrorAboutTheTemporaryNamesTheTarget) {
  TempDir dir;
  const std::string target = dir.file("model.safetensors");
  ReplacementFile file(target);
  try {
    file.writing([&] {
      nvio::throw_io_error(nvio::IoOp::Write, "fd 7 (" + file.temp_path() + ")", 4096, 100, ENOSPC);
    });
    FAIL() << "no error";
  } catch (const nvio::NoSpace& e) {
    EXPECT_EQ(e.path(), target);
    EXPECT_EQ(e.offset(), 4096u);
    EXPECT_EQ(e.length(), 100u);
    EXPECT_NE(std::string(e.what()).find("temporary file '" + file.temp_path() + "'"),
              std::string::npos)
        << e.what();
  }
  // An error about another file passes as it is.
  EXPECT_THROW(file.writing([] { nvio::throw_io_error(nvio::IoOp::Read, "/other", 0, 1, EIO); }),
               nvio::IoError);
  try {
    file.writing([] { nvio::throw_io_error(nvio::IoOp::Read, "/other", 0, 1, EIO); });
  } catch (const nvio::IoError& e) {
    EXPECT_EQ(e.path(), "/other");
  }
}

}  // namespace
