// nvio._nvio.StripedHandle, the core of nvio.StripedHandle: one handle per directory
// (nvio/stripe.hpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "common.hpp"

namespace nvio_py {
namespace {

py::dict striped_transfer_dict(const nvio::StripedTransfer& t) {
  py::list drives;
  for (const nvio::DriveTransfer& d : t.drives) {
    py::dict one;
    one["directory"] = path_text(d.directory);
    one["bytes"] = d.bytes;
    one["seconds"] = d.seconds;
    drives.append(one);
  }
  py::dict out;
  out["bytes"] = t.bytes;
  out["seconds"] = t.seconds;
  out["drives"] = drives;
  return out;
}

}  // namespace

// nvio.StripedHandle's core: one handle per directory (nvio/stripe.hpp). Names and directories
// arrive as bytes (os.fsencode'd by bind_args.cpp's check_path).
void bind_striped(py::module_& m) {
  py::class_<nvio::StripedHandle>(m, "StripedHandle")
      .def(
          py::init([](const std::vector<std::string>& directories, std::size_t stripe_size,
                      const py::kwargs& kwargs) {
            std::string config_dir;
            const nvio::OptionOverrides o = overrides(kwargs, config_dir);
            if (!config_dir.empty()) {
              throw nvio::InvalidArgument(
                  "StripedHandle takes no config_dir: each drive uses its own directory's profile");
            }
            return unlocked([&] {
              return std::make_unique<nvio::StripedHandle>(
                  nvio::StripeLayout{directories, stripe_size}, o);
            });
          }),
          py::arg("directories"), py::arg("stripe_size"))
      .def(
          "read",
          [](nvio::StripedHandle& h, std::uintptr_t addr, std::size_t nbytes,
             const std::string& name, std::uint64_t offset, bool device) {
            const nvio::ReadOptions r = read_options(device);
            return striped_transfer_dict(unlocked(
                [&] { return h.read(as_ptr(addr), nbytes, name, offset, r); }, Signals::Handle));
          },
          py::arg("address"), py::arg("nbytes"), py::arg("name"), py::arg("offset") = 0,
          py::arg("device") = false)
      .def(
          "write",
          [](nvio::StripedHandle& h, std::uintptr_t addr, std::size_t nbytes,
             const std::string& name, std::uint64_t offset, bool truncate, bool sync, bool device) {
            const nvio::WriteOptions w = write_options(truncate, sync, device);
            return striped_transfer_dict(unlocked(
                [&] { return h.write(as_ptr(addr), nbytes, name, offset, w); }, Signals::Handle));
          },
          py::arg("address"), py::arg("nbytes"), py::arg("name"), py::arg("offset") = 0,
          py::arg("truncate") = false, py::arg("sync") = false, py::arg("device") = false)
      .def("size", [](const nvio::StripedHandle& h,
                      const std::string& name) { return unlocked([&] { return h.size(name); }); })
      .def("remove",
           [](nvio::StripedHandle& h, const std::string& name) {
             return unlocked([&] { return h.remove(name); });
           })
      .def("part_path", [](const nvio::StripedHandle& h, std::size_t drive,
                           const std::string& name) { return path_text(h.part_path(drive, name)); })
      .def("drive_options",
           [](nvio::StripedHandle& h, std::size_t drive) {
             return options_dict(h.drive(drive).options());
           })
      .def("drive_engine",
           [](nvio::StripedHandle& h, std::size_t drive) {
             return nvio::to_string(h.drive(drive).engine());
           })
      .def("stats", [](const nvio::StripedHandle& h) { return stats_dict(h.stats()); })
      .def("drive_stats", [](nvio::StripedHandle& h,
                             std::size_t drive) { return stats_dict(h.drive(drive).stats()); })
      .def_property_readonly("directories",
                             [](const nvio::StripedHandle& h) {
                               py::list out;
                               for (const auto& d : h.layout().directories)
                                 out.append(path_text(d));
                               return out;
                             })
      .def_property_readonly("stripe_size",
                             [](const nvio::StripedHandle& h) { return h.layout().stripe_size; });
}

}  // namespace nvio_py
