// nvio._nvio.tune: the directory tuner (nvio/tune.hpp) for nvio.tune().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "common.hpp"

namespace nvio_py {

void bind_tune(py::module_& m) {
  // Runs nvio::tune_directory without the GIL and returns its JSON document (the same format as
  // `nvio tune --json`); with save=True also writes the recommended options to the
  // configuration file and returns its path.
  m.def(
      "tune",
      [](const std::string& directory, std::uint64_t size, double budget,
         const std::vector<std::string>& modes, std::optional<std::vector<std::string>> engines,
         std::uint64_t trial_bytes, bool grid, bool save, bool keep) {
        nvio::TuneRequest req;
        req.directory = directory;
        req.file_size = size;
        req.trial_bytes = trial_bytes;
        req.keep_file = keep;
        req.settings.budget_s = budget;
        req.settings.strategy = grid ? nvio::TuneStrategy::Grid : nvio::TuneStrategy::Search;
        req.settings.modes.clear();
        for (const std::string& mode : modes) {
          if (mode == "read") {
            req.settings.modes.push_back(nvio::TuneMode::Read);
          } else if (mode == "write") {
            req.settings.modes.push_back(nvio::TuneMode::Write);
          } else {
            throw nvio::InvalidArgument("modes: expected 'read' and/or 'write', got '" + mode +
                                        "'");
          }
        }
        if (engines) {
          req.space.engines.clear();
          for (const std::string& e : *engines) {
            req.space.engines.push_back(nvio::parse_engine(e, "engines"));
          }
        }
        const std::string config = save ? nvio::config_path() : std::string();
        if (save && config.empty()) {
          throw nvio::InvalidArgument(
              "save: no configuration file: NVIO_CONFIG is 'none', or HOME is not set");
        }
        return unlocked([&] {
          if (save) nvio::load_config(config);  // a malformed file is reported before tuning
          const nvio::TuneResult result = nvio::tune_directory(req);
          if (save) nvio::save_profile(config, nvio::to_profile(result));
          return std::make_pair(nvio::to_json(result, -1), config);
        });
      },
      py::arg("directory"), py::arg("size"), py::arg("budget"), py::arg("modes"),
      py::arg("engines") = py::none(), py::arg("trial_bytes") = 0, py::arg("grid") = false,
      py::arg("save") = false, py::arg("keep") = false);
}

}  // namespace nvio_py
