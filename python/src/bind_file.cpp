// nvio._nvio.File: the core of nvio.File (python/nvio/_file.py), an nvio::File (nvio/file.hpp)
// opened through a core Handle, and nvio.FileBusy. Every call that can block (the open, I/O,
// size) runs without the GIL through unlocked() (common.hpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "common.hpp"
#include "held.hpp"

namespace nvio_py {
namespace {

PyObject* g_file_busy = nullptr;

// Items as nvio/_handle.py's _Batch resolves them: (address, nbytes, offset, file, device); the
// file is the File's and not looked at.
using Items = std::vector<std::tuple<std::uintptr_t, std::size_t, std::uint64_t, py::object, bool>>;

template <class Extent>
std::vector<Extent> extents_of(const Items& items) {
  std::vector<Extent> out;
  out.reserve(items.size());
  for (const auto& [address, nbytes, offset, unused, device] : items) {
    out.push_back({as_ptr(address), nbytes, offset, memory_of(device)});
  }
  return out;
}

void translate_busy(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const nvio::FileBusy& e) {
    py::object exc = py::reinterpret_borrow<py::object>(g_file_busy)(e.what());
    exc.attr("path") = e.path();
    exc.attr("in_flight") = e.in_flight();
    PyErr_SetObject(g_file_busy, exc.ptr());
  }
}

}  // namespace

void bind_file(py::module_& m) {
  py::tuple bases =
      py::make_tuple(m.attr("Error"), py::reinterpret_borrow<py::object>(PyExc_RuntimeError));
  g_file_busy = PyErr_NewExceptionWithDoc(
      "nvio.FileBusy",
      "File.close() refused: operations on the file are in flight (attributes: path, "
      "in_flight). Nothing was closed.",
      bases.ptr(), nullptr);
  if (g_file_busy == nullptr) throw py::error_already_set();
  m.add_object("FileBusy", py::reinterpret_borrow<py::object>(g_file_busy));
  py::register_exception_translator(&translate_busy);

  py::class_<nvio::File>(m, "File")
      .def(py::init([](nvio::Handle& h, const std::string& path, const std::string& mode) {
             return unlocked([&] { return std::make_unique<nvio::File>(h, path, mode); });
           }),
           py::arg("handle"), py::arg("path"), py::arg("mode") = "r", py::keep_alive<1, 2>())
      .def(
          "read",
          [](const nvio::File& f, std::uintptr_t addr, std::size_t nbytes, std::uint64_t off,
             bool device) {
            unlocked([&] { f.read(as_ptr(addr), nbytes, off, read_options(device)); },
                     Signals::Handle);
          },
          py::arg("address"), py::arg("nbytes"), py::arg("offset") = 0, py::arg("device") = false)
      .def(
          "write",
          [](const nvio::File& f, std::uintptr_t addr, std::size_t nbytes, std::uint64_t off,
             bool truncate, bool sync, bool device) {
            unlocked(
                [&] { f.write(as_ptr(addr), nbytes, off, write_options(truncate, sync, device)); },
                Signals::Handle);
          },
          py::arg("address"), py::arg("nbytes"), py::arg("offset") = 0, py::arg("truncate") = false,
          py::arg("sync") = false, py::arg("device") = false)
      .def(
          "submit_read",
          [](const nvio::File& f, py::handle future, std::uintptr_t addr, std::size_t nbytes,
             std::uint64_t off, bool device) {
            unlocked([&] {
              hold(f, future, f.submit_read(as_ptr(addr), nbytes, off, read_options(device)));
            });
          },
          py::arg("future"), py::arg("address"), py::arg("nbytes"), py::arg("offset") = 0,
          py::arg("device") = false)
      .def(
          "submit_write",
          [](const nvio::File& f, py::handle future, std::uintptr_t addr, std::size_t nbytes,
             std::uint64_t off, bool truncate, bool sync, bool device) {
            unlocked([&] {
              hold(
                  f, future,
                  f.submit_write(as_ptr(addr), nbytes, off, write_options(truncate, sync, device)));
            });
          },
          py::arg("future"), py::arg("address"), py::arg("nbytes"), py::arg("offset") = 0,
          py::arg("truncate") = false, py::arg("sync") = false, py::arg("device") = false)
      .def(
          "read_batch",
          [](const nvio::File& f, const Items& items) {
            const auto extents = extents_of<nvio::FileReadExtent>(items);
            unlocked([&] { f.read_batch(extents); }, Signals::Handle);
          },
          py::arg("items"))
      .def(
          "write_batch",
          [](const nvio::File& f, const Items& items, bool sync) {
            const auto extents = extents_of<nvio::FileWriteExtent>(items);
            unlocked([&] { f.write_batch(extents, write_options(false, sync, false)); },
                     Signals::Handle);
          },
          py::arg("items"), py::arg("sync") = false)
      .def(
          "submit_read_batch",
          [](const nvio::File& f, py::handle future, const Items& items) {
            const auto extents = extents_of<nvio::FileReadExtent>(items);
            unlocked([&] { hold(f, future, f.submit_read_batch(extents)); });
          },
          py::arg("future"), py::arg("items"))
      .def(
          "submit_write_batch",
          [](const nvio::File& f, py::handle future, const Items& items, bool sync) {
            const auto extents = extents_of<nvio::FileWriteExtent>(items);
            unlocked([&] {
              hold(f, future, f.submit_write_batch(extents, write_options(false, sync, false)));
            });
          },
          py::arg("future"), py::arg("items"), py::arg("sync") = false)
      .def("close", [](nvio::File& f) { f.close(); })
      .def("is_open", [](const nvio::File& f) { return f.is_open(); })
      .def("in_flight", [](const nvio::File& f) { return f.in_flight(); })
      .def("size", [](const nvio::File& f) { return unlocked([&] { return f.size(); }); })
      .def("direct_alignment", [](const nvio::File& f) { return f.direct_alignment(); })
      .def("path", [](const nvio::File& f) { return f.path(); })
      .def("mode", [](const nvio::File& f) { return std::string(nvio::to_string(f.mode())); });
}

}  // namespace nvio_py
