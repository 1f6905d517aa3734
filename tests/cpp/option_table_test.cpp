// The option table is the one list of options: every route that sets an option (NVIO_* variable,
// configuration file, explicit text or typed value, the file written by save_profile) is derived
// from it, so every option must arrive by every route, and a bad value by any route must raise an
// InvalidArgument whose option() names it.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <variant>

#include "nvio/config.hpp"
#include "nvio/errors.hpp"
#include "nvio/options.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using nlohmann::json;
using nvio::OptionSource;
using nvio::OptionValue;

// Per option: a non-default value as text (NVIO_*, flags) and typed (JSON, Python), and a bad one
// of each. Keyed by name; the first test makes sure every row of the table has one, so a new
// option cannot skip these tests.
struct Sample {
  std::string text;
  OptionValue value;
  std::string bad_text;
  OptionValue bad_value;
};

const std::map<std::string, Sample>& samples() {
  static const std::map<std::string, Sample> s = {
      {"engine", {"psync", std::string("psync"), "fast", std::string("fast")}},
      {"block_size", {"4K", std::int64_t{4096}, "100", std::int64_t{100}}},
      {"queue_depth", {"7", std::int64_t{7}, "0", std::int64_t{0}}},
      {"single_submit", {"yes", true, "2", std::int64_t{1}}},
      {"overlap_events", {"off", false, "maybe", std::string("no")}},
      {"intra_op_parallelism", {"3", std::int64_t{3}, "257", std::int64_t{-1}}},
      {"direct", {"off", std::string("off"), "sometimes", std::string("sometimes")}},
      {"gpu_direct", {"on", std::string("on"), "p2p", true}},
      {"cached_reads", {"off", std::string("off"), "on", std::string("on")}},
  };
  return s;
}

json to_json(const OptionValue& v) {
  return std::visit([](const auto& x) { return json(x); }, v);
}

// Options resolved with one variable set.
nvio::EffectiveOptions resolve_with(const std::string& var, const std::string& value) {
  FakeEnv env;
  env.vars[var] = value;
  return nvio::resolve_options({}, env.lookup());
}

// Options resolved with a configuration file whose default profile sets `options`.
nvio::EffectiveOptions resolve_with_profile(const std::string& path, const json& options) {
  const json doc = {
      {"version", 1}, {"default", "k"}, {"profiles", {{"k", {{"options", options}}}}}};
  std::ofstream(path) << doc.dump();
  return resolve_with("NVIO_CONFIG", path);
}

// Runs `f`, which must throw InvalidArgument about option `name` whose message holds `needle`.
template <typename F>
::testing::AssertionResult rejects(F&& f, const std::string& name, const std::string& needle) {
  try {
    f();
  } catch (const nvio::InvalidArgument& e) {
    if (e.option() != name) {
      return ::testing::AssertionFailure()
             << "option() is '" << e.option() << "', not '" << name << "': " << e.what();
    }
    if (std::string(e.what()).find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "\"" << e.what() << "\" does not name " << needle;
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "wrong exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted";
}

TEST(OptionTable, SamplesCoverEveryRowAndDifferFromTheDefaults) {
  std::set<std::string> names;
  const nvio::Options defaults;
  for (const nvio::OptionSpec& spec : nvio::option_specs()) {
    names.insert(spec.name);
    ASSERT_EQ(samples().count(spec.name), 1u) << spec.name << " has no sample";
    EXPECT_NE(defaults.get(spec.name), samples().at(spec.name).value) << spec.name;
    EXPECT_EQ(nvio::find_option(spec.name), &spec);
    EXPECT_EQ(nvio::EffectiveOptions::environment_names().at(spec.name), spec.environment);
  }
  EXPECT_EQ(names.size(), samples().size());
  EXPECT_EQ(nvio::find_option("queue_dept"), nullptr);
  EXPECT_THROW(nvio::Options{}.get("queue_dept"), nvio::InvalidArgument);
}

TEST(OptionTable, EveryOptionArrivesByEveryRoute) {
  TempDir dir;
  const std::string path = dir.file("config.json");
  for (const nvio::OptionSpec& spec : nvio::option_specs()) {
    SCOPED_TRACE(spec.name);
    const Sample& s = samples().at(spec.name);
    // NVIO_* variable.
    nvio::EffectiveOptions eff = resolve_with(spec.environment, s.text);
    EXPECT_EQ(eff.values.get(spec.name), s.value);
    EXPECT_EQ(eff.sources.at(spec.name), OptionSource::Environment);
    // Configuration file (JSON, typed).
    eff = resolve_with_profile(path, {{spec.name, to_json(s.value)}});
    EXPECT_EQ(eff.values.get(spec.name), s.value);
    EXPECT_EQ(eff.sources.at(spec.name), OptionSource::Config);
    // Explicit, as text and typed; every other option stays at its default.
    for (int typed = 0; typed < 2; ++typed) {
      nvio::OptionOverrides o;
      if (typed) {
        o.set_value(spec.name, s.value);
      } else {
        o.set_text(spec.name, s.text);
      }
      EXPECT_EQ(o.get(spec.name), s.value);
      eff = nvio::resolve_options(o, FakeEnv{}.lookup());
      EXPECT_EQ(eff.values.get(spec.name), s.value);
      EXPECT_EQ(eff.sources.at(spec.name), OptionSource::Explicit);
      for (const nvio::OptionSpec& other : nvio::option_specs()) {
        if (&other == &spec) continue;
        EXPECT_EQ(eff.values.get(other.name), nvio::Options{}.get(other.name)) << other.name;
        EXPECT_FALSE(o.get(other.name).has_value()) << other.name;
      }
    }
    // The file save_profile writes, read back.
    nvio::ConfigProfile profile;
    profile.key = "k";
    profile.options.set_value(spec.name, s.value);
    const std::string saved = dir.file(std::string(spec.name) + ".json");
    nvio::save_profile(saved, profile);
    const auto file = nvio::load_config(saved);
    ASSERT_TRUE(file.has_value());
    EXPECT_EQ(nvio::select_profile(*file, "")->options.get(spec.name), s.value);
  }
}

TEST(OptionTable, BadValueByEveryRouteNamesTheOption) {
  TempDir dir;
  const std::string path = dir.file("config.json");
  for (const nvio::OptionSpec& spec : nvio::option_specs()) {
    SCOPED_TRACE(spec.name);
    const Sample& s = samples().at(spec.name);
    EXPECT_TRUE(
        rejects([&] { resolve_with(spec.environment, s.bad_text); }, spec.name, spec.environment));
    EXPECT_TRUE(rejects(
        [&] {
          resolve_with_profile(path, {{spec.name, to_json(s.bad_value)}});
        },
        spec.name, "profiles.k.options." + std::string(spec.name)));
    nvio::OptionOverrides o;
    EXPECT_TRUE(rejects([&] { o.set_text(spec.name, s.bad_text, "--flag"); }, spec.name, "--flag"));
    EXPECT_TRUE(rejects([&] { o.set_value(spec.name, s.bad_value); }, spec.name, spec.name));
    EXPECT_FALSE(o.get(spec.name).has_value());
  }
  // An explicit value set in the struct directly is range-checked when options are resolved.
  nvio::OptionOverrides o;
  o.queue_depth = 0;
  EXPECT_TRUE(rejects([&] { nvio::resolve_options(o, FakeEnv{}.lookup()); }, "queue_depth",
                      "between 1 and 4096"));
  // Errors that are not about an option name none.
  try {
    nvio::parse_size("12Q", "--size");
    ADD_FAILURE() << "accepted";
  } catch (const nvio::InvalidArgument& e) {
    EXPECT_EQ(e.option(), "");
  }
}

}  // namespace
}  // namespace nvio_test
