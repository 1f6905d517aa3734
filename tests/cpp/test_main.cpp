// main() of nvio_tests: a per-process temporary root directory (under $TMPDIR, else next to the
// test binary in the build tree), a recording warning sink, a watchdog that turns a hung test into
// a failure with its name instead of a silent ctest timeout, and a line about each engine.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace nvio_test {

namespace {

std::string g_root;
std::mutex g_warn_mu;
std::vector<std::string> g_warnings;

std::string make_root() {
  std::string base;
  if (const char* t = std::getenv("TMPDIR"); t && *t) {
    base = t;
  } else {
    char exe[4096];
    ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = '\0';
      base = exe;
      base = base.substr(0, base.rfind('/'));
    } else {
      base = "/tmp";
    }
  }
  std::string tmpl = base + "/nvio-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    std::perror(("mkdtemp " + tmpl).c_str());
    std::exit(2);
  }
  return buf.data();
}

// Fails the process (with the test's name) if one test runs longer than the limit: a hang in
// wait() or in the destructor must be a failure, not a stuck CI job.
class Watchdog : public ::testing::EmptyTestEventListener {
 public:
  explicit Watchdog(std::chrono::seconds limit) : limit_(limit) {
    thread_ = std::thread([this] { run(); });
  }
  ~Watchdog() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void OnTestStart(const ::testing::TestInfo& info) override {
    std::lock_guard<std::mutex> lk(mu_);
    name_ = std::string(info.test_suite_name()) + "." + info.name();
    started_ = std::chrono::steady_clock::now();
    running_ = true;
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lk(mu_);
    running_ = false;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::seconds(1));
      if (running_ && std::chrono::steady_clock::now() - started_ > limit_) {
        std::fprintf(stderr, "\nWATCHDOG: test %s ran for more than %lld s (hung?); aborting run\n",
                     name_.c_str(), static_cast<long long>(limit_.count()));
        std::fflush(stderr);
        remove_tree(g_root);
        std::_Exit(3);
      }
    }
  }
  std::chrono::seconds limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool running_ = false;
  std::string name_;
  std::chrono::steady_clock::time_point started_;
  std::thread thread_;
};

class RootEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { remove_tree(g_root); }
};

}  // namespace

const std::string& test_root() { return g_root; }

std::vector<std::string> recorded_warnings() {
  std::lock_guard<std::mutex> lk(g_warn_mu);
  return g_warnings;
}

nvio::WarningSink recording_sink() {
  return [](const std::string& message) {
    std::lock_guard<std::mutex> lk(g_warn_mu);
    g_warnings.push_back(message);
  };
}

}  // namespace nvio_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);

  // The suite sets the options it tests explicitly; an NVIO_* variable left in the caller's
  // environment must not change what the tests of defaults see.
  for (const auto& [option, variable] : nvio::EffectiveOptions::environment_names()) {
    ::unsetenv(variable.c_str());
  }

  nvio_test::g_root = nvio_test::make_root();
  nvio::set_warning_sink(nvio_test::recording_sink());
  ::testing::AddGlobalTestEnvironment(new nvio_test::RootEnvironment);

  long limit = 120;
  if (const char* s = std::getenv("NVIO_TEST_WATCHDOG_S")) limit = std::atol(s);
  ::testing::UnitTest::GetInstance()->listeners().Append(
      new nvio_test::Watchdog(std::chrono::seconds(limit)));

  if (!::testing::GTEST_FLAG(list_tests)) {
    for (auto kind :
         {nvio::EngineKind::IoUring, nvio::EngineKind::Libaio, nvio::EngineKind::Psync}) {
      const auto& probe = nvio::probe_engine(kind);
      std::printf("[ nvio     ] engine %-8s %s (%s)\n", nvio::to_string(kind),
                  probe.available ? "available" : "UNAVAILABLE", probe.reason.c_str());
    }
    std::printf("[ nvio     ] temporary directory %s\n", nvio_test::g_root.c_str());
  }
  int rc = RUN_ALL_TESTS();
  nvio_test::remove_tree(nvio_test::g_root);
  return rc;
}
