// nvio._nvio.ReplacementFile and the temporaries of replacing saves: nvio/replace_file.hpp, the
// library's one mechanism for replacing a file atomically, for nvio/dcp.py, nvio.save and
// nvio.load.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "common.hpp"
#include "nvio/replace_file.hpp"

namespace nvio_py {
namespace {

// nvio/replace_file.hpp's ReplacementFile, the library's one mechanism for replacing a file
// atomically: Python writes through `fd` (with a handle's batches) and then commits, or discards.
// Held in an optional so that discard() removes the temporary file at once, not when Python
// collects the object.
struct Replacement {
  std::optional<nvio::ReplacementFile> file;

  nvio::ReplacementFile& get() {
    if (!file) throw nvio::InvalidArgument("nvio: this ReplacementFile was committed or discarded");
    return *file;
  }
};

}  // namespace

void bind_replace_file(py::module_& m) {
  py::class_<Replacement>(m, "ReplacementFile")
      .def(py::init([](nvio::Handle& h, const std::string& path) {
             auto r = std::make_unique<Replacement>();
             unlocked([&] { r->file.emplace(path, &h); });
             return r;
           }),
           py::arg("handle"), py::arg("path"), py::keep_alive<1, 2>())
      .def_property_readonly("fd", [](Replacement& r) { return r.get().fd(); })
      .def_property_readonly("temp_path",
                             [](Replacement& r) { return message_text(r.get().temp_path()); })
      .def(
          "commit",
          [](Replacement& r, bool sync) {
            nvio::ReplacementFile& f = r.get();
            const auto durability = sync ? nvio::Durability::Data : nvio::Durability::None;
            // A failed commit has removed the temporary file: the object is spent either way.
            struct Spent {
              Replacement& r;
              ~Spent() { r.file.reset(); }
            } spent{r};
            unlocked([&] { f.commit(durability); });
          },
          py::arg("sync") = true)
      .def("discard", [](Replacement& r) { unlocked([&] { r.file.reset(); }); });

  // The temporaries of replacing saves (nvio/replace_file.hpp), for nvio.save / nvio.load.
  m.def(
      "create_temporary",
      [](const std::string& target) {
        const nvio::TemporaryFile t = unlocked([&] { return nvio::create_temporary(target); });
        return py::make_tuple(path_text(t.path), t.fd);
      },
      py::arg("target"),
      "Removes the target's stale temporaries, then creates a new one beside it (O_EXCL, "
      "flocked): (its path, its write-only descriptor, which the caller closes).");
  m.def(
      "remove_stale_temporaries",
      [](const std::string& target) {
        return unlocked([&] { return nvio::remove_stale_temporaries(target); });
      },
      py::arg("target"), "Removes the target's temporaries whose writer is gone; how many.");
  m.def(
      "temporary_writer",
      [](const std::string& base, const std::string& name) -> py::object {
        const auto w = nvio::temporary_writer(base, name);
        if (!w.has_value()) return py::none();
        return py::make_tuple(w->host, w->start, w->pid);
      },
      py::arg("base"), py::arg("name"),
      "(host, start time, pid) of the writer of temporary file `name` of a target named `base`, "
      "or None when it is not one of its temporaries.");
}

}  // namespace nvio_py
