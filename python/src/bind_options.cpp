// The option functions of nvio._nvio: the option table and the options a call would resolve to
// (nvio/options.hpp, nvio/config.hpp), for nvio/_args.py and nvio.resolve_options.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings.hpp"
#include "common.hpp"

namespace nvio_py {

void bind_options(py::module_& m) {
  m.def("resolve_options", [](const py::kwargs& kwargs) {
    std::string config_dir;
    const nvio::OptionOverrides o = overrides(kwargs, config_dir);
    const nvio::EffectiveOptions eff = nvio::resolve_options(o, {}, config_dir);
    py::dict sources;
    for (const auto& [name, src] : eff.sources) sources[py::str(name)] = nvio::to_string(src);
    py::dict config;
    config["path"] = eff.config_path.empty() ? py::object(py::none()) : py::str(eff.config_path);
    config["found"] = eff.config_found;
    config["profile"] =
        eff.config_profile.empty() ? py::object(py::none()) : py::str(eff.config_profile);
    return py::make_tuple(options_dict(eff.values), sources, config);
  });
  // The option table: one dict per option, in its order (nvio/_args.py derives the keyword
  // arguments of every entry point from it).
  m.def("option_specs", [] {
    const nvio::Options defaults;
    py::list out;
    for (const nvio::OptionSpec& spec : nvio::option_specs()) {
      py::dict d;
      d["name"] = spec.name;
      d["environment"] = spec.environment;
      d["type"] = nvio::to_string(spec.type);
      d["default"] = to_python(defaults.get(spec.name));
      d["min"] = spec.type == nvio::OptionType::Integer ? py::cast(spec.min) : py::none();
      d["max"] = spec.type == nvio::OptionType::Integer ? py::cast(spec.max) : py::none();
      d["unit"] = spec.unit;
      d["accepted"] = spec.accepted;
      d["description"] = spec.description;
      out.append(d);
    }
    return out;
  });
  m.def("config_path", [] { return nvio::config_path(); });
  m.def("parse_size", [](const std::string& text, const std::string& what) {
    return nvio::parse_size(text, what);
  });
}

}  // namespace nvio_py
