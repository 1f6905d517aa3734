// Options: defaults, NVIO_* environment overrides through a fake EnvLookup, explicit overrides,
// recorded sources, and strict parsing.
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::DirectIo;
using nvio::EngineKind;
using nvio::OptionOverrides;
using nvio::OptionSource;
using nvio::resolve_options;

const std::vector<std::string> kOptionNames = {
    "engine",        "block_size",     "queue_depth",
    "single_submit", "overlap_events", "intra_op_parallelism",
    "direct",        "gpu_direct",     "cached_reads"};

template <typename Fn>
::testing::AssertionResult rejects_naming(Fn&& fn, const std::string& name) {
  try {
    fn();
  } catch (const nvio::InvalidArgument& e) {
    if (std::string(e.what()).find(name) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "InvalidArgument \"" << e.what() << "\" does not name " << name;
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "wrong exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted; expected InvalidArgument naming " << name;
}

TEST(Options, DocumentedDefaults) {
  nvio::Options o;
  EXPECT_EQ(o.engine, EngineKind::Auto);
  EXPECT_EQ(o.block_size, MiB);
  EXPECT_EQ(o.queue_depth, 128u);
  EXPECT_FALSE(o.single_submit);
  EXPECT_TRUE(o.overlap_events);
  EXPECT_EQ(o.intra_op_parallelism, 1u);
  EXPECT_EQ(o.direct, DirectIo::Auto);
  EXPECT_NO_THROW(o.validate());
}

TEST(Options, EnvironmentNames) {
  const auto& names = nvio::EffectiveOptions::environment_names();
  const std::map<std::string, std::string> expected = {
      {"engine", "NVIO_ENGINE"},
      {"block_size", "NVIO_BLOCK_SIZE"},
      {"queue_depth", "NVIO_QUEUE_DEPTH"},
      {"single_submit", "NVIO_SINGLE_SUBMIT"},
      {"overlap_events", "NVIO_OVERLAP_EVENTS"},
      {"intra_op_parallelism", "NVIO_INTRA_OP_PARALLELISM"},
      {"direct", "NVIO_DIRECT"},
      {"gpu_direct", "NVIO_GPU_DIRECT"},
      {"cached_reads", "NVIO_CACHED_READS"}};
  EXPECT_EQ(names, expected);
}

TEST(Options, ResolveDefaultsOnly) {
  FakeEnv env;
  auto eff = resolve_options({}, env.lookup());
  const nvio::Options d;
  EXPECT_EQ(eff.values.engine, d.engine);
  EXPECT_EQ(eff.values.block_size, d.block_size);
  EXPECT_EQ(eff.values.queue_depth, d.queue_depth);
  EXPECT_EQ(eff.values.single_submit, d.single_submit);
  EXPECT_EQ(eff.values.overlap_events, d.overlap_events);
  EXPECT_EQ(eff.values.intra_op_parallelism, d.intra_op_parallelism);
  EXPECT_EQ(eff.values.direct, d.direct);
  ASSERT_EQ(eff.sources.size(), kOptionNames.size());
  for (const auto& n : kOptionNames) {
    ASSERT_EQ(eff.sources.count(n), 1u) << n;
    EXPECT_EQ(eff.sources.at(n), OptionSource::Default) << n;
  }
  // It looked up exactly the documented variables: the options' and the configuration file's.
  std::set<std::string> expected = {"NVIO_CONFIG", "XDG_CONFIG_HOME", "HOME"};
  for (const auto& [opt, var] : nvio::EffectiveOptions::environment_names()) expected.insert(var);
  EXPECT_EQ(env.asked, expected);
}

TEST(Options, EnvironmentOverridesDefaults) {
  FakeEnv env;
  env.vars = {{"NVIO_ENGINE", "psync"},       {"NVIO_BLOCK_SIZE", "64K"},
              {"NVIO_QUEUE_DEPTH", "32"},     {"NVIO_SINGLE_SUBMIT", "true"},
              {"NVIO_OVERLAP_EVENTS", "off"}, {"NVIO_INTRA_OP_PARALLELISM", "4"},
              {"NVIO_DIRECT", "on"},          {"NVIO_GPU_DIRECT", "off"},
              {"NVIO_CACHED_READS", "off"}};
  auto eff = resolve_options({}, env.lookup());
  EXPECT_EQ(eff.values.gpu_direct, nvio::GpuDirect::Off);
  EXPECT_EQ(eff.values.cached_reads, nvio::CachedReads::Off);
  EXPECT_EQ(eff.values.engine, EngineKind::Psync);
  EXPECT_EQ(eff.values.block_size, 64 * KiB);
  EXPECT_EQ(eff.values.queue_depth, 32u);
  EXPECT_TRUE(eff.values.single_submit);
  EXPECT_FALSE(eff.values.overlap_events);
  EXPECT_EQ(eff.values.intra_op_parallelism, 4u);
  EXPECT_EQ(eff.values.direct, DirectIo::On);
  for (const auto& n : kOptionNames) {
    EXPECT_EQ(eff.sources.at(n), OptionSource::Environment) << n;
  }
}

TEST(Options, ExplicitOverridesEnvironment) {
  FakeEnv env;
  env.vars = {{"NVIO_ENGINE", "psync"},
              {"NVIO_BLOCK_SIZE", "64K"},
              {"NVIO_QUEUE_DEPTH", "32"},
              {"NVIO_INTRA_OP_PARALLELISM", "4"}};
  OptionOverrides ov;
  ov.block_size = 8 * KiB;
  ov.queue_depth = 2;
  ov.direct = DirectIo::Off;
  ov.single_submit = false;  // explicit, equal to the default: still Explicit
  auto eff = resolve_options(ov, env.lookup());
  EXPECT_EQ(eff.values.engine, EngineKind::Psync);
  EXPECT_EQ(eff.values.block_size, 8 * KiB);
  EXPECT_EQ(eff.values.queue_depth, 2u);
  EXPECT_EQ(eff.values.intra_op_parallelism, 4u);
  EXPECT_EQ(eff.values.direct, DirectIo::Off);
  EXPECT_FALSE(eff.values.single_submit);
  EXPECT_TRUE(eff.values.overlap_events);
  EXPECT_EQ(eff.sources.at("engine"), OptionSource::Environment);
  EXPECT_EQ(eff.sources.at("block_size"), OptionSource::Explicit);
  EXPECT_EQ(eff.sources.at("queue_depth"), OptionSource::Explicit);
  EXPECT_EQ(eff.sources.at("intra_op_parallelism"), OptionSource::Environment);
  EXPECT_EQ(eff.sources.at("direct"), OptionSource::Explicit);
  EXPECT_EQ(eff.sources.at("single_submit"), OptionSource::Explicit);
  EXPECT_EQ(eff.sources.at("overlap_events"), OptionSource::Default);
}

TEST(Options, ExplicitOverridesDefaultsWithoutEnvironment) {
  FakeEnv env;
  OptionOverrides ov;
  ov.engine = EngineKind::Libaio;
  ov.overlap_events = false;
  ov.intra_op_parallelism = 3;
  auto eff = resolve_options(ov, env.lookup());
  EXPECT_EQ(eff.values.engine, EngineKind::Libaio);
  EXPECT_FALSE(eff.values.overlap_events);
  EXPECT_EQ(eff.values.intra_op_parallelism, 3u);
  EXPECT_EQ(eff.values.block_size, MiB);
  EXPECT_EQ(eff.sources.at("engine"), OptionSource::Explicit);
  EXPECT_EQ(eff.sources.at("overlap_events"), OptionSource::Explicit);
  EXPECT_EQ(eff.sources.at("block_size"), OptionSource::Default);
}

TEST(Options, ExplicitOverridesAGoodEnvironmentValue) {
  FakeEnv env;
  env.vars = {{"NVIO_QUEUE_DEPTH", "64"}};
  OptionOverrides ov;
  ov.queue_depth = 3;
  EXPECT_EQ(resolve_options(ov, env.lookup()).values.queue_depth, 3u);
}

TEST(Options, SizeSuffixes) {
  const std::pair<const char*, std::size_t> good[] = {
      {"512", 512},     {"4096", 4096}, {"4K", 4 * KiB},  {"4KiB", 4 * KiB},
      {"4KB", 4 * KiB}, {"1M", MiB},    {"1MiB", MiB},    {"2M", 2 * MiB},
      {"1G", GiB},      {"1GiB", GiB},  {"1048576", MiB}, {"3M", 3 * MiB}};
  for (const auto& [text, value] : good) {
    SCOPED_TRACE(text);
    FakeEnv env;
    env.vars = {{"NVIO_BLOCK_SIZE", text}};
    auto eff = resolve_options({}, env.lookup());
    EXPECT_EQ(eff.values.block_size, value);
    EXPECT_EQ(eff.sources.at("block_size"), OptionSource::Environment);
    EXPECT_EQ(nvio::parse_size(text, "size"), value);
  }
  EXPECT_EQ(nvio::parse_size("2T", "size"), std::size_t{2} << 40);
}

TEST(Options, BooleanSpellings) {
  const std::pair<const char*, bool> good[] = {{"true", true}, {"false", false}, {"1", true},
                                               {"0", false},   {"yes", true},    {"no", false},
                                               {"on", true},   {"off", false}};
  for (const auto& [text, value] : good) {
    SCOPED_TRACE(text);
    FakeEnv env;
    env.vars = {{"NVIO_SINGLE_SUBMIT", text}, {"NVIO_OVERLAP_EVENTS", text}};
    auto eff = resolve_options({}, env.lookup());
    EXPECT_EQ(eff.values.single_submit, value);
    EXPECT_EQ(eff.values.overlap_events, value);
    EXPECT_EQ(nvio::parse_bool(text, "flag"), value);
  }
}

TEST(Options, EngineAndDirectSpellings) {
  const std::pair<const char*, EngineKind> engines[] = {{"auto", EngineKind::Auto},
                                                        {"io_uring", EngineKind::IoUring},
                                                        {"libaio", EngineKind::Libaio},
                                                        {"psync", EngineKind::Psync}};
  for (const auto& [text, kind] : engines) {
    SCOPED_TRACE(text);
    FakeEnv env;
    env.vars = {{"NVIO_ENGINE", text}};
    EXPECT_EQ(resolve_options({}, env.lookup()).values.engine, kind);
    EXPECT_EQ(nvio::parse_engine(text), kind);
    EXPECT_STREQ(nvio::to_string(kind), text) << "to_string and parse_engine round-trip";
  }
  const std::pair<const char*, DirectIo> directs[] = {
      {"auto", DirectIo::Auto}, {"on", DirectIo::On}, {"off", DirectIo::Off}};
  for (const auto& [text, mode] : directs) {
    SCOPED_TRACE(text);
    FakeEnv env;
    env.vars = {{"NVIO_DIRECT", text}};
    EXPECT_EQ(resolve_options({}, env.lookup()).values.direct, mode);
    EXPECT_EQ(nvio::parse_direct(text), mode);
    EXPECT_STREQ(nvio::to_string(mode), text);
  }
  EXPECT_TRUE(rejects_naming([] { nvio::parse_engine("io-uring-x", "--engine"); }, "--engine"));
  EXPECT_TRUE(rejects_naming([] { nvio::parse_engine("", "--engine"); }, "--engine"));
  EXPECT_TRUE(rejects_naming([] { nvio::parse_direct("maybe", "--direct"); }, "--direct"));
  EXPECT_EQ(nvio::parse_gpu_direct("AUTO"), nvio::GpuDirect::Auto);
  EXPECT_EQ(nvio::parse_gpu_direct("on"), nvio::GpuDirect::On);
  EXPECT_EQ(nvio::parse_gpu_direct("0"), nvio::GpuDirect::Off);
  EXPECT_TRUE(
      rejects_naming([] { nvio::parse_gpu_direct("p2p", "NVIO_GPU_DIRECT"); }, "NVIO_GPU_DIRECT"));
}

TEST(Options, StrictParsingNamesTheVariable) {
  const char* numeric_vars[] = {"NVIO_BLOCK_SIZE", "NVIO_QUEUE_DEPTH", "NVIO_INTRA_OP_PARALLELISM"};
  const char* bad_numbers[] = {
      "12Q", "",   "-1", "1.5", "yes please", " 4", "4 ", "0x10", "99999999999999999999999",
      "K",   "4KK"};
  for (const char* var : numeric_vars) {
    for (const char* text : bad_numbers) {
      SCOPED_TRACE(std::string(var) + "=\"" + text + "\"");
      FakeEnv env;
      env.vars = {{var, text}};
      EXPECT_TRUE(rejects_naming([&] { resolve_options({}, env.lookup()); }, var));
    }
  }
  const char* bool_vars[] = {"NVIO_SINGLE_SUBMIT", "NVIO_OVERLAP_EVENTS"};
  for (const char* var : bool_vars) {
    for (const char* text : {"12Q", "", "-1", "1.5", "yes please", "2", "truee"}) {
      SCOPED_TRACE(std::string(var) + "=\"" + text + "\"");
      FakeEnv env;
      env.vars = {{var, text}};
      EXPECT_TRUE(rejects_naming([&] { resolve_options({}, env.lookup()); }, var));
    }
  }
  for (const char* text : {"", "io-uring-x", "yes please", "-1", "IO_URING "}) {
    SCOPED_TRACE(std::string("NVIO_ENGINE=\"") + text + "\"");
    FakeEnv env;
    env.vars = {{"NVIO_ENGINE", text}};
    EXPECT_TRUE(rejects_naming([&] { resolve_options({}, env.lookup()); }, "NVIO_ENGINE"));
  }
  for (const char* text : {"", "yes please", "1.5", "direct"}) {
    SCOPED_TRACE(std::string("NVIO_DIRECT=\"") + text + "\"");
    FakeEnv env;
    env.vars = {{"NVIO_DIRECT", text}};
    EXPECT_TRUE(rejects_naming([&] { resolve_options({}, env.lookup()); }, "NVIO_DIRECT"));
  }
}

TEST(Options, OutOfRangeEnvironmentNamesTheVariable) {
  const std::pair<const char*, const char*> bad[] = {{"NVIO_BLOCK_SIZE", "0"},
                                                     {"NVIO_BLOCK_SIZE", "100"},
                                                     {"NVIO_BLOCK_SIZE", "2G"},
                                                     {"NVIO_QUEUE_DEPTH", "0"},
                                                     {"NVIO_QUEUE_DEPTH", "100000"},
                                                     {"NVIO_QUEUE_DEPTH", "4097"},
                                                     {"NVIO_INTRA_OP_PARALLELISM", "0"},
                                                     {"NVIO_INTRA_OP_PARALLELISM", "1000"},
                                                     {"NVIO_INTRA_OP_PARALLELISM", "257"}};
  for (const auto& [var, text] : bad) {
    SCOPED_TRACE(std::string(var) + "=" + text);
    FakeEnv env;
    env.vars = {{var, text}};
    EXPECT_TRUE(rejects_naming([&] { resolve_options({}, env.lookup()); }, var));
  }
  // The limits themselves are accepted.
  FakeEnv env;
  env.vars = {{"NVIO_BLOCK_SIZE", "512"},
              {"NVIO_QUEUE_DEPTH", "4096"},
              {"NVIO_INTRA_OP_PARALLELISM", "256"}};
  auto eff = resolve_options({}, env.lookup());
  EXPECT_EQ(eff.values.block_size, 512u);
  EXPECT_EQ(eff.values.queue_depth, 4096u);
  EXPECT_EQ(eff.values.intra_op_parallelism, 256u);
  env.vars = {{"NVIO_BLOCK_SIZE", "1G"}};
  EXPECT_EQ(resolve_options({}, env.lookup()).values.block_size, GiB);
}

// A set NVIO_* variable is parsed and range-checked whatever the caller passes explicitly: for
// nothing, for other options, or for the very option the variable sets.
TEST(Options, BadEnvironmentIsAnErrorWhateverTheCallerSets) {
  struct Case {
    const char* var;
    const char* text;
    const char* range;  // part of the message that states the valid range
    std::function<void(OptionOverrides&)> set_same;
    std::function<void(OptionOverrides&)> set_other;
  };
  auto set_block = [](OptionOverrides& o) { o.block_size = 4 * KiB; };
  auto set_depth = [](OptionOverrides& o) { o.queue_depth = 8; };
  auto set_par = [](OptionOverrides& o) { o.intra_op_parallelism = 2; };
  const Case cases[] = {
      {"NVIO_BLOCK_SIZE", "16G", "between 512 and 1073741824", set_block, set_depth},
      {"NVIO_BLOCK_SIZE", "100", "between 512 and 1073741824", set_block, set_par},
      {"NVIO_BLOCK_SIZE", "0", "between 512 and 1073741824", set_block, set_depth},
      {"NVIO_QUEUE_DEPTH", "0", "between 1 and 4096", set_depth, set_block},
      {"NVIO_QUEUE_DEPTH", "4097", "between 1 and 4096", set_depth, set_par},
      {"NVIO_INTRA_OP_PARALLELISM", "0", "between 1 and 256", set_par, set_depth},
      {"NVIO_INTRA_OP_PARALLELISM", "257", "between 1 and 256", set_par, set_block},
      {"NVIO_QUEUE_DEPTH", "garbage", "non-negative integer", set_depth, set_block},
      {"NVIO_BLOCK_SIZE", "1Q", "K, M, G or T", set_block, set_depth},
      {"NVIO_ENGINE", "fast", "io_uring", [](OptionOverrides& o) { o.engine = EngineKind::Psync; },
       set_depth},
      {"NVIO_DIRECT", "maybe", "auto, on or off",
       [](OptionOverrides& o) { o.direct = DirectIo::Off; }, set_depth},
      {"NVIO_GPU_DIRECT", "p2p", "auto, on or off",
       [](OptionOverrides& o) { o.gpu_direct = nvio::GpuDirect::Off; }, set_depth},
      {"NVIO_SINGLE_SUBMIT", "2", "true/false", [](OptionOverrides& o) { o.single_submit = true; },
       set_depth},
      {"NVIO_OVERLAP_EVENTS", "2", "true/false",
       [](OptionOverrides& o) { o.overlap_events = true; }, set_depth},
  };
  for (const Case& c : cases) {
    FakeEnv env;
    env.vars = {{c.var, c.text}};
    OptionOverrides none, same, other;
    c.set_same(same);
    c.set_other(other);
    for (const auto& [label, ov] : {std::pair<const char*, const OptionOverrides&>{"none", none},
                                    {"same option", same},
                                    {"other option", other}}) {
      SCOPED_TRACE(std::string(c.var) + "=" + c.text + ", explicit: " + label);
      try {
        resolve_options(ov, env.lookup());
        ADD_FAILURE() << "accepted";
      } catch (const nvio::InvalidArgument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(c.var), std::string::npos) << what;
        EXPECT_NE(what.find(std::string("'") + c.text + "'"), std::string::npos) << what;
        EXPECT_NE(what.find(c.range), std::string::npos) << what;
      }
    }
  }
}

TEST(Options, ExplicitOutOfRangeNamesTheOption) {
  FakeEnv env;
  {
    OptionOverrides ov;
    ov.block_size = 100;
    EXPECT_TRUE(rejects_naming([&] { resolve_options(ov, env.lookup()); }, "block_size"));
  }
  {
    OptionOverrides ov;
    ov.queue_depth = 0;
    EXPECT_TRUE(rejects_naming([&] { resolve_options(ov, env.lookup()); }, "queue_depth"));
  }
  {
    OptionOverrides ov;
    ov.intra_op_parallelism = 1000;
    EXPECT_TRUE(rejects_naming([&] { resolve_options(ov, env.lookup()); }, "intra_op_parallelism"));
  }
}

TEST(Options, ParseHelpersNameWhat) {
  EXPECT_TRUE(rejects_naming([] { nvio::parse_size("12Q", "--size"); }, "--size"));
  EXPECT_TRUE(rejects_naming([] { nvio::parse_size("", "--size"); }, "--size"));
  EXPECT_TRUE(rejects_naming([] { nvio::parse_size("-1", "--size"); }, "--size"));
  EXPECT_TRUE(rejects_naming([] { nvio::parse_size("1.5", "--size"); }, "--size"));
  EXPECT_TRUE(rejects_naming([] { nvio::parse_size("yes please", "--size"); }, "--size"));
  EXPECT_TRUE(rejects_naming([] { nvio::parse_size("16777216T", "--size"); }, "--size"))
      << "overflow";
  EXPECT_TRUE(rejects_naming([] { nvio::parse_count("-3", "--loops"); }, "--loops"));
  EXPECT_TRUE(rejects_naming([] { nvio::parse_count("", "--loops"); }, "--loops"));
  EXPECT_TRUE(rejects_naming([] { nvio::parse_bool("maybe", "--flag"); }, "--flag"));
  EXPECT_TRUE(rejects_naming([] { nvio::parse_count("1.5", "--loops"); }, "--loops"));
  EXPECT_EQ(nvio::parse_count("17", "--loops"), 17u);
}

TEST(Options, SourceNames) {
  std::set<std::string> names = {nvio::to_string(OptionSource::Default),
                                 nvio::to_string(OptionSource::Environment),
                                 nvio::to_string(OptionSource::Explicit)};
  EXPECT_EQ(names.size(), 3u);
}

// Without a lookup, resolve_options() and Handle() read the real environment.
TEST(Options, RealEnvironment) {
  ScopedEnv qd("NVIO_QUEUE_DEPTH", "7");
  ScopedEnv bs("NVIO_BLOCK_SIZE", "64K");
  ScopedEnv en("NVIO_ENGINE", "psync");
  auto eff = resolve_options();
  EXPECT_EQ(eff.values.queue_depth, 7u);
  EXPECT_EQ(eff.values.block_size, 64 * KiB);
  EXPECT_EQ(eff.sources.at("queue_depth"), OptionSource::Environment);
  nvio::Handle h;
  EXPECT_EQ(h.options().queue_depth, 7u);
  EXPECT_EQ(h.options().block_size, 64 * KiB);
  EXPECT_EQ(h.engine(), EngineKind::Psync);
  // A fake lookup hides the real environment.
  FakeEnv env;
  EXPECT_EQ(resolve_options({}, env.lookup()).values.queue_depth, 128u);
  {
    ScopedEnv bad("NVIO_INTRA_OP_PARALLELISM", "lots");
    EXPECT_TRUE(rejects_naming([] { nvio::Handle h2; }, "NVIO_INTRA_OP_PARALLELISM"));
  }
}

}  // namespace
}  // namespace nvio_test
