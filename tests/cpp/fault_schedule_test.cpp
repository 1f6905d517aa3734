// Properties of the handle over thousands of seeded fault schedules: every engine, host and
// (fake) device memory, blocking and asynchronous calls, each fault of the fault engine alone and
// all of them together, and an engine that breaks for good. For every operation:
//   * success is reported only when every byte is right (offset-encoding pattern);
//   * a failure is a typed nvio error; an IoError names the path, an offset inside the request,
//     a length and an errno;
//   * nothing hangs (each schedule runs under a time limit);
//   * no descriptor leaks (the process's descriptors are counted before and after each handle);
//   * nothing is freed while in use (the suite runs under ASan in scripts/test.sh).
// The counts printed at the end are those of the fault table in docs/design.md.
#include <dirent.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "engine_override.hpp"
#include "fake_device.hpp"
#include "fault_engine.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using namespace std::chrono_literals;

enum class Memory { Host, Device };
enum class Mode { Blocking, Async };

struct Outcome {
  std::size_t schedules = 0;
  std::size_t succeeded = 0;  // and every byte checked
  std::size_t failed = 0;     // with a typed error, checked
};

// One fault (or all, or the persistent failure) by name.
struct PlanCase {
  const char* name;
  FaultPlan plan;
  std::vector<Fault> expected;  // faults that must have been injected over the schedules
};

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> cases;
  auto one = [&](const char* name, Fault f, auto set) {
    FaultPlan p;
    set(p);
    cases.push_back({name, p, {f}});
  };
  one("request error", Fault::RequestError, [](FaultPlan& p) { p.request_error = 0.05; });
  one("short transfer", Fault::ShortTransfer, [](FaultPlan& p) { p.short_transfer = 0.3; });
  one("EINTR", Fault::Interrupted, [](FaultPlan& p) { p.interrupted = 0.2; });
  one("EAGAIN", Fault::WouldBlock, [](FaultPlan& p) { p.would_block = 0.2; });
  one("partial submit", Fault::PartialSubmit, [](FaultPlan& p) { p.partial_submit = 0.5; });
  one("submit no room", Fault::SubmitNoRoom, [](FaultPlan& p) { p.submit_no_room = 0.3; });
  one("submit refused", Fault::SubmitRefused, [](FaultPlan& p) { p.submit_refused = 0.05; });
  one("late, reordered completions", Fault::HeldCompletion,
      [](FaultPlan& p) { p.hold_completion = 0.5; });
  one("reap transient", Fault::ReapTransient, [](FaultPlan& p) { p.reap_transient = 0.2; });
  cases.push_back({"everything",
                   FaultPlan::everything(),
                   {Fault::ShortTransfer, Fault::PartialSubmit, Fault::HeldCompletion}});
  FaultPlan broken = FaultPlan::everything();
  broken.reap_persistent_after = 3;
  cases.push_back({"engine breaks for good", broken, {Fault::ReapPersistent}});
  return cases;
}

struct Param {
  nvio::EngineKind engine;
  Memory memory;
  Mode mode;
};

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(engine_name(info.param.engine)) +
         (info.param.memory == Memory::Host ? "_Host" : "_Device") +
         (info.param.mode == Mode::Blocking ? "_Blocking" : "_Async");
}

class FaultSchedules : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const nvio::EngineProbe& probe = nvio::probe_engine(GetParam().engine);
    if (!probe.available) GTEST_SKIP() << probe.reason;
    dir_.emplace();
    direct_ = nvio::probe_directory(dir_->path());
  }
  std::optional<TempDir> dir_;
  nvio::DirectIoInfo direct_;
};

// Half under the sanitizers (kSanitizerBuild in test_util.hpp).
constexpr std::size_t kSchedulesPerPlan = kSanitizerBuild ? 12 : 24;
constexpr std::size_t kFileSize = 2 * MiB;

TEST_P(FaultSchedules, EveryOutcomeIsCorrectBytesOrATypedError) {
  const Param param = GetParam();
  std::optional<ScopedFakeDevice> fake;
  if (param.memory == Memory::Device) fake.emplace(1, 7);
  const std::string src = dir_->file("src");
  write_pattern_file(src, kFileSize, 77);
  std::string table;
  for (const PlanCase& pc : plan_cases()) {
    auto stats = std::make_shared<FaultStats>();
    Outcome out;
    const bool breaks = pc.plan.reap_persistent_after > 0;
    const int fds_before = open_fd_count();
    {
      ScopedEngineFactory factory(fault_engine_factory(
          pc.plan, 1000 + static_cast<std::uint64_t>(param.engine) * 7, stats));
      std::mt19937_64 rng(static_cast<std::uint64_t>(param.engine) * 131 +
                          static_cast<std::uint64_t>(param.memory) * 17 +
                          static_cast<std::uint64_t>(param.mode));
      nvio::Options o;
      o.engine = param.engine;
      o.direct = direct_.supported ? nvio::DirectIo::Auto : nvio::DirectIo::Off;
      o.block_size = 16 * KiB;
      o.queue_depth = 4;
      o.intra_op_parallelism = 2;
      o.gpu_direct = nvio::GpuDirect::Off;
      std::unique_ptr<nvio::Handle> h;
      // Injection is random per submit and the number of submits depends on timing: go on past
      // kSchedulesPerPlan (up to 4 times as many) until each expected fault has been injected.
      const auto all_injected = [&] {
        return std::all_of(pc.expected.begin(), pc.expected.end(),
                           [&](Fault f) { return stats->count(f) > 0; });
      };
      for (std::size_t i = 0;
           i < kSchedulesPerPlan || (!all_injected() && i < 4 * kSchedulesPerPlan); ++i) {
        // A handle whose engine broke for good stops: a fresh one per schedule then.
        if (!h || breaks) h = std::make_unique<nvio::Handle>(o);
        const bool read = rng() % 2 == 0;
        const std::size_t len = 1 + rng() % (300 * KiB);
        const std::uint64_t off = rng() % (kFileSize - len);
        const std::uint64_t seed = read ? 77 : 5000 + i;
        const std::string path = read ? src : dir_->file("w" + std::to_string(i));
        GuardedBuffer host(len, kAllBufKinds[rng() % 5]);
        unsigned char* buf = host.data();
        if (fake) buf = (*fake)->alloc(len);
        if (read) {
          std::memset(buf, kSentinel, len);
        } else {
          nvio::pattern::fill(buf, len, off, seed);
        }
        nvio::ReadOptions ro;
        nvio::WriteOptions wo;
        ro.memory = wo.memory = fake ? nvio::MemoryKind::Device : nvio::MemoryKind::Host;
        bool ok = false;
        SCOPED_TRACE(std::string(pc.name) + ", schedule " + std::to_string(i) +
                     (read ? ", read " : ", write ") + std::to_string(len) + " bytes at " +
                     std::to_string(off));
        try {
          run_within(60s, "a schedule", [&] {
            if (param.mode == Mode::Blocking) {
              if (read) {
                h->read(buf, len, path, off, ro);
              } else {
                h->write(buf, len, path, off, wo);
              }
            } else {
              const nvio::Ticket t = read ? h->submit_read(buf, len, path, off, ro)
                                          : h->submit_write(buf, len, path, off, wo);
              h->wait(t);
            }
          });
          ok = true;
        } catch (const nvio::IoError& e) {
          EXPECT_EQ(e.path(), path);
          EXPECT_GT(e.error_code(), 0);
          EXPECT_GE(e.offset(), off);
          EXPECT_LE(e.offset() + e.length(), off + len);
          ++out.failed;
        } catch (const nvio::Error& e) {
          // A stopped worker (the engine broke) names itself; nothing else is expected here.
          EXPECT_TRUE(breaks) << e.what();
          ++out.failed;
        }
        ++out.schedules;
        if (ok) {
          ++out.succeeded;
          if (read) {
            EXPECT_TRUE(buffer_has_pattern(buf, len, off, seed)) << "success with wrong bytes";
          } else {
            EXPECT_TRUE(file_range_has_pattern(read_file(path), off, len, seed))
                << "success with wrong bytes";
          }
        }
        EXPECT_TRUE(host.guards_intact());
      }
    }
    EXPECT_EQ(open_fd_count(), fds_before) << pc.name << ": descriptors leaked";
    for (const Fault f : pc.expected) {
      EXPECT_GT(stats->count(f), 0u)
          << pc.name << ": " << to_string(f) << " never injected: " << stats->describe();
    }
    if (!breaks) {
      EXPECT_GT(out.succeeded, 0u) << pc.name << ": nothing succeeded";
    }
    table += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", engine_name(param.engine),
                         param.memory == Memory::Host ? "host" : "device",
                         param.mode == Mode::Blocking ? "blocking" : "async", pc.name,
                         out.schedules, out.succeeded, out.failed);
  }
  std::printf("%s", table.c_str());
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (nvio::EngineKind e :
       {nvio::EngineKind::IoUring, nvio::EngineKind::Libaio, nvio::EngineKind::Psync}) {
    for (Memory m : {Memory::Host, Memory::Device}) {
      for (Mode mode : {Mode::Blocking, Mode::Async}) out.push_back({e, m, mode});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Engines, FaultSchedules, ::testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace nvio_test
