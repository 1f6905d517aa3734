// The configuration file: where it is, its strict format, the save/load round trip, profile
// selection by device, and its place in the precedence default < config < environment < explicit.
#include "nvio/config.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::DirectIo;
using nvio::EngineKind;
using nvio::OptionSource;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

nvio::ConfigProfile sample_profile(const std::string& dir) {
  nvio::ConfigProfile p;
  p.key = nvio::device_key(dir);
  p.directory = dir;
  p.filesystem = "ext4";
  p.saved_at = "2026-11-21T00:00:00Z";
  p.note = "test";
  p.options.engine = EngineKind::Psync;
  p.options.block_size = 256 * 1024;
  p.options.queue_depth = 16;
  p.options.intra_op_parallelism = 3;
  p.options.single_submit = true;
  p.options.overlap_events = false;
  p.options.direct = DirectIo::Off;
  p.options.gpu_direct = nvio::GpuDirect::On;
  return p;
}

::testing::AssertionResult throws_naming(const std::function<void()>& fn,
                                         const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const nvio::InvalidArgument& e) {
    for (const auto& n : needles) {
      if (std::string(e.what()).find(n) == std::string::npos) {
        return ::testing::AssertionFailure() << "\"" << e.what() << "\" does not name " << n;
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "wrong exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted";
}

TEST(Config, PathFromEnvironment) {
  FakeEnv env;
  EXPECT_EQ(nvio::config_path(env.lookup()), "");
  env.vars["HOME"] = "/home/u";
  EXPECT_EQ(nvio::config_path(env.lookup()), "/home/u/.config/nvio/config.json");
  env.vars["XDG_CONFIG_HOME"] = "/xdg";
  EXPECT_EQ(nvio::config_path(env.lookup()), "/xdg/nvio/config.json");
  env.vars["XDG_CONFIG_HOME"] = "relative";  // the XDG spec says to ignore relative paths
  EXPECT_EQ(nvio::config_path(env.lookup()), "/home/u/.config/nvio/config.json");
  env.vars["NVIO_CONFIG"] = "/etc/nvio.json";
  EXPECT_EQ(nvio::config_path(env.lookup()), "/etc/nvio.json");
  env.vars["NVIO_CONFIG"] = "none";
  EXPECT_EQ(nvio::config_path(env.lookup()), "");
  env.vars["NVIO_CONFIG"] = "";
  EXPECT_TRUE(throws_naming([&] { nvio::config_path(env.lookup()); }, {"NVIO_CONFIG"}));
}

TEST(Config, MissingFileAddsNothing) {
  TempDir dir;
  FakeEnv env;
  env.vars["NVIO_CONFIG"] = dir.file("absent.json");
  const auto eff = nvio::resolve_options({}, env.lookup());
  EXPECT_EQ(eff.config_path, dir.file("absent.json"));
  EXPECT_FALSE(eff.config_found);
  EXPECT_EQ(eff.config_profile, "");
  for (const auto& [name, source] : eff.sources) EXPECT_EQ(source, OptionSource::Default) << name;
}

TEST(Config, SaveLoadRoundTrip) {
  TempDir dir;
  const std::string path = dir.file("sub/dir/config.json");  // parents are created
  const nvio::ConfigProfile p = sample_profile(dir.path());
  nvio::save_profile(path, p);
  const auto file = nvio::load_config(path);
  ASSERT_TRUE(file.has_value());
  EXPECT_EQ(file->default_key, p.key);
  ASSERT_EQ(file->profiles.size(), 1u);
  const nvio::ConfigProfile& q = file->profiles[0];
  EXPECT_EQ(q.key, p.key);
  EXPECT_EQ(q.directory, p.directory);
  EXPECT_EQ(q.filesystem, "ext4");
  EXPECT_EQ(q.saved_at, p.saved_at);
  EXPECT_EQ(q.note, "test");
  EXPECT_EQ(q.options.engine, EngineKind::Psync);
  EXPECT_EQ(q.options.block_size, 256u * 1024);
  EXPECT_EQ(q.options.queue_depth, 16u);
  EXPECT_EQ(q.options.intra_op_parallelism, 3u);
  EXPECT_EQ(q.options.single_submit, true);
  EXPECT_EQ(q.options.overlap_events, false);
  EXPECT_EQ(q.options.direct, DirectIo::Off);
  EXPECT_EQ(q.options.gpu_direct, nvio::GpuDirect::On);
  // No temporary file is left beside it; only the lock file that serialises saves.
  std::set<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("sub/dir"))) {
    entries.insert(e.path().filename().string());
  }
  EXPECT_EQ(entries, (std::set<std::string>{"config.json", "config.json.lock"}));
}

TEST(Config, SavingAnotherDeviceKeepsTheFirstAndBecomesDefault) {
  TempDir dir;
  const std::string path = dir.file("config.json");
  nvio::ConfigProfile a = sample_profile(dir.path());
  nvio::save_profile(path, a);
  nvio::ConfigProfile b = a;
  b.key = "dev:9999:9";
  b.options = {};
  b.options.queue_depth = 7;
  nvio::save_profile(path, b);
  const auto file = nvio::load_config(path);
  ASSERT_TRUE(file.has_value());
  EXPECT_EQ(file->profiles.size(), 2u);
  EXPECT_EQ(file->default_key, "dev:9999:9");
  // The directory's own device profile wins over the default; with no directory, the default.
  const auto own = nvio::select_profile(*file, dir.path());
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->key, a.key);
  const auto dflt = nvio::select_profile(*file, "");
  ASSERT_TRUE(dflt.has_value());
  EXPECT_EQ(dflt->key, "dev:9999:9");
  // Saving the same key again replaces it rather than adding a third.
  a.options.queue_depth = 99;
  nvio::save_profile(path, a);
  const auto again = nvio::load_config(path);
  ASSERT_EQ(again->profiles.size(), 2u);
  EXPECT_EQ(nvio::select_profile(*again, "")->options.queue_depth, 99u);
}

// Threads of one process saving different profiles to one file at the same time: every profile
// is kept (each save reads, modifies and replaces the file under a lock, through a temporary file
// of its own). Several rounds, each on a new file, so that an unguarded save loses one reliably.
TEST(Config, ConcurrentSavesKeepEveryProfile) {
  TempDir dir;
  constexpr int kThreads = 8;
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::string path = dir.file("round" + std::to_string(round) + "/config.json");
    std::atomic<int> ready{0};
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        nvio::ConfigProfile p = sample_profile(dir.path());
        p.key = "dev:100:" + std::to_string(t);
        p.note = "thread " + std::to_string(t);
        ++ready;
        while (ready.load() < kThreads) std::this_thread::yield();  // start together
        try {
          nvio::save_profile(path, p);
        } catch (const nvio::Error& e) {
          errors[t] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    std::optional<nvio::ConfigFile> file;
    try {
      file = nvio::load_config(path);
    } catch (const nvio::Error& e) {
      FAIL() << e.what();
    }
    ASSERT_TRUE(file.has_value());
    std::set<std::string> keys;
    for (const nvio::ConfigProfile& p : file->profiles) keys.insert(p.key);
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_EQ(keys.count("dev:100:" + std::to_string(t)), 1u) << "profile " << t << " was lost";
    }
    std::set<std::string> entries;
    for (const auto& e :
         std::filesystem::directory_iterator(dir.file("round" + std::to_string(round)))) {
      entries.insert(e.path().filename().string());
    }
    EXPECT_EQ(entries, (std::set<std::string>{"config.json", "config.json.lock"}));
  }
}

TEST(Config, Precedence) {
  TempDir dir;
  const std::string path = dir.file("config.json");
  nvio::save_profile(path, sample_profile(dir.path()));
  FakeEnv env;
  env.vars["NVIO_CONFIG"] = path;
  env.vars["NVIO_QUEUE_DEPTH"] = "8";
  nvio::OptionOverrides explicit_values;
  explicit_values.block_size = 4 * 1024 * 1024;
  const auto eff = nvio::resolve_options(explicit_values, env.lookup(), dir.path());
  EXPECT_TRUE(eff.config_found);
  EXPECT_EQ(eff.config_profile, nvio::device_key(dir.path()));
  // config over default
  EXPECT_EQ(eff.values.engine, EngineKind::Psync);
  EXPECT_EQ(eff.sources.at("engine"), OptionSource::Config);
  EXPECT_EQ(eff.values.intra_op_parallelism, 3u);
  EXPECT_EQ(eff.values.direct, DirectIo::Off);
  // environment over config
  EXPECT_EQ(eff.values.queue_depth, 8u);
  EXPECT_EQ(eff.sources.at("queue_depth"), OptionSource::Environment);
  // explicit over config
  EXPECT_EQ(eff.values.block_size, 4u * 1024 * 1024);
  EXPECT_EQ(eff.sources.at("block_size"), OptionSource::Explicit);
  EXPECT_STREQ(nvio::to_string(OptionSource::Config), "config");
}

TEST(Config, PartialProfileLeavesDefaults) {
  TempDir dir;
  const std::string path = dir.file("config.json");
  write_text(path, R"({"version": 1, "default": "k",
                       "profiles": {"k": {"options": {"queue_depth": 4, "block_size": "2M"}}}})");
  FakeEnv env;
  env.vars["NVIO_CONFIG"] = path;
  const auto eff = nvio::resolve_options({}, env.lookup());
  EXPECT_EQ(eff.values.queue_depth, 4u);
  EXPECT_EQ(eff.values.block_size, 2u << 20);
  EXPECT_EQ(eff.sources.at("engine"), OptionSource::Default);
  EXPECT_EQ(eff.sources.at("queue_depth"), OptionSource::Config);
}

TEST(Config, MalformedFilesAreErrorsNamingTheFileAndKey) {
  TempDir dir;
  const std::string path = dir.file("config.json");
  FakeEnv env;
  env.vars["NVIO_CONFIG"] = path;
  auto resolve = [&] { nvio::resolve_options({}, env.lookup()); };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "not valid JSON"},
      {"[1]", "top level"},
      {R"({"profiles": {}})", "version"},
      {R"({"version": 2})", "version"},
      {R"({"version": 1, "default": "x", "profiles": {}})", "'x'"},
      {R"({"version": 1, "profiles": {"k": {}}})", "profiles.k has no \"options\""},
      {R"({"version": 1, "profiles": {"k": {"options": {"queue_depht": 4}}}})", "queue_depht"},
      {R"({"version": 1, "profiles": {"k": {"options": {"queue_depth": -4}}}})",
       "profiles.k.options.queue_depth"},
      {R"({"version": 1, "profiles": {"k": {"options": {"queue_depth": "4"}}}})",
       "profiles.k.options.queue_depth"},
      {R"({"version": 1, "profiles": {"k": {"options": {"engine": "fast"}}}})",
       "profiles.k.options.engine"},
      {R"({"version": 1, "profiles": {"k": {"options": {"single_submit": 1}}}})",
       "profiles.k.options.single_submit"},
      {R"({"version": 1, "profiles": {"k": {"options": {"direct": "maybe"}}}})",
       "profiles.k.options.direct"},
      {R"({"version": 1, "profiles": {"k": {"options": {"block_size": "1Q"}}}})",
       "profiles.k.options.block_size"},
      {R"({"version": 1, "profiles": {"k": {"options": {"gpu_direct": "always"}}}})",
       "profiles.k.options.gpu_direct"},
  };
  for (const auto& [text, needle] : cases) {
    write_text(path, text);
    EXPECT_TRUE(throws_naming(resolve, {path, needle})) << text;
  }
  // In range per type but not for the handle: the message names the file and the key path.
  write_text(path, R"({"version": 1, "default": "k",
                       "profiles": {"k": {"options": {"queue_depth": 0}}}})");
  EXPECT_TRUE(throws_naming(resolve, {path, "profiles.k.options.queue_depth", "between 1 and"}));
  // Still an error when an explicit value would replace it: the file itself is wrong.
  nvio::OptionOverrides o;
  o.queue_depth = 2;
  EXPECT_TRUE(throws_naming([&] { nvio::resolve_options(o, env.lookup()); },
                            {path, "profiles.k.options.queue_depth"}));
  // And in a profile that does not apply here (another drive's): the whole file is checked.
  write_text(path, R"({"version": 1, "default": "k", "profiles": {
                         "k": {"options": {}},
                         "dev:9999:9": {"options": {"block_size": "16G"}}}})");
  EXPECT_TRUE(throws_naming(resolve, {path, "profiles.dev:9999:9.options.block_size", "between"}));
  // save_profile refuses to overwrite a file it cannot read, rather than losing other profiles.
  write_text(path, "{broken");
  EXPECT_TRUE(throws_naming([&] { nvio::save_profile(path, sample_profile(dir.path())); }, {path}));
}

TEST(Config, UnknownKeysAtEveryLevelAreErrorsNamingTheKeyPath) {
  TempDir dir;
  const std::string path = dir.file("config.json");
  FakeEnv env;
  env.vars["NVIO_CONFIG"] = path;
  auto resolve = [&] { nvio::resolve_options({}, env.lookup()); };
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"version": 1, "defualt": "k", "profiles": {"k": {"options": {}}}})",
       {"'defualt'", "did you mean 'default'"}},
      {R"({"version": 1, "profiles": {"dev:8:0": {"optoins": {}, "options": {}}}})",
       {"'profiles.dev:8:0.optoins'", "did you mean 'options'"}},
      {R"({"version": 1, "profiles": {"k": {"options": {}, "nots": "x"}}})",
       {"'profiles.k.nots'", "did you mean 'note'"}},
      {R"({"version": 1, "profiles": {"k": {"options": {"queue_depht": 4}}}})",
       {"'profiles.k.options.queue_depht'", "did you mean 'queue_depth'"}},
  };
  for (const auto& [text, needles] : cases) {
    write_text(path, text);
    std::vector<std::string> all = needles;
    all.push_back(path);
    EXPECT_TRUE(throws_naming(resolve, all)) << text;
  }
  // A key that is nothing like a known one gets the list of known keys, not a wild guess.
  write_text(path, R"({"version": 1, "colour": "red"})");
  try {
    resolve();
    ADD_FAILURE() << "accepted an unknown top-level key";
  } catch (const nvio::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'colour'"), std::string::npos) << what;
    EXPECT_NE(what.find("profiles"), std::string::npos) << what;
    EXPECT_EQ(what.find("did you mean"), std::string::npos) << what;
  }
}

TEST(Config, NonRegularAndOversizedFilesAreRefused) {
  TempDir dir;
  // A character device that never ends: refused at once, not read until memory runs out.
  EXPECT_TRUE(
      throws_naming([] { nvio::load_config("/dev/zero"); }, {"/dev/zero", "character device"}));
  // A directory.
  try {
    nvio::load_config(dir.path());
    ADD_FAILURE() << "a directory was accepted";
  } catch (const nvio::IsADirectory& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path()), std::string::npos) << e.what();
    EXPECT_EQ(e.error_code(), EISDIR);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception: " << e.what();
  }
  // A sparse file over the cap: its size and the cap are named, and it is not read.
  const std::string big = dir.file("big.json");
  {
    const int fd = ::open(big.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 2 << 20), 0);
    ::close(fd);
  }
  EXPECT_TRUE(throws_naming([&] { nvio::load_config(big); }, {big, "2097152", "1048576"}));
}

TEST(Config, FifoWithNoWriterIsRefusedWithoutHanging) {
  TempDir dir;
  const std::string fifo = dir.file("config.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  auto loading = std::async(std::launch::async, [&]() -> std::string {
    try {
      nvio::load_config(fifo);
    } catch (const nvio::InvalidArgument& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("wrong exception: ") + e.what();
    }
    return "accepted";
  });
  if (loading.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "load_config blocked opening a FIFO with no writer";
    // Become the writer so that the blocked open returns and the test can end.
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) ::close(fd);
  }
  const std::string what = loading.get();
  EXPECT_NE(what.find(fifo), std::string::npos) << what;
  EXPECT_NE(what.find("FIFO"), std::string::npos) << what;
}

TEST(Config, UnwritableLocationIsAnIoError) {
  TempDir dir;
  write_text(dir.file("file"), "x");
  // A path under a regular file cannot be created.
  EXPECT_THROW(nvio::save_profile(dir.file("file/config.json"), sample_profile(dir.path())),
               nvio::IoError);
  EXPECT_THROW(nvio::save_profile("", sample_profile(dir.path())), nvio::InvalidArgument);
  EXPECT_THROW(nvio::device_key(dir.file("missing")), nvio::FileNotFound);
}

TEST(Config, DefaultHandleUsesTheSavedProfile) {
  TempDir dir;
  const std::string path = dir.file("config.json");
  nvio::ConfigProfile p = sample_profile(dir.path());
  p.options.intra_op_parallelism = 2;
  nvio::save_profile(path, p);
  ScopedEnv config("NVIO_CONFIG", path.c_str());
  nvio::Handle h;
  EXPECT_EQ(h.options().engine, EngineKind::Psync);
  EXPECT_EQ(h.options().queue_depth, 16u);
  EXPECT_EQ(h.options().intra_op_parallelism, 2u);
  EXPECT_EQ(h.engine(), EngineKind::Psync);
}

}  // namespace
}  // namespace nvio_test
