// nvio._nvio.Handle, the core of nvio.Handle and aio_handle (nvio/_handle.py): nvio::Handle's
// single calls, tickets and batches.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "bindings.hpp"
#include "common.hpp"
#include "held.hpp"

namespace nvio_py {
namespace {

// The file and offset of one of Handle's single calls, converted as given (`file_name` and
// `offset_name` name them in an error), then `call(path or descriptor, offset)` run without the
// GIL (`signals` as unlocked() takes it); returns what it returns.
template <typename Call>
auto on_target(py::handle file, py::handle offset, py::handle file_name, py::handle offset_name,
               Signals signals, Call&& call) {
  const Target target = to_target(file, file_name);
  const std::uint64_t off = to_offset(offset, offset_name);
  return unlocked([&] { return std::visit([&](const auto& t) { return call(t, off); }, target); },
                  signals);
}

// ---- batches -----------------------------------------------------------------
// One extent of a batch as nvio/_handle.py hands it over: (address, nbytes, file offset, path or
// descriptor, device), the buffer resolved by the same helper as the single calls'
// (nvio/_buffers.py); each item moved as its own memory kind.
using BatchItem = std::tuple<std::uintptr_t, std::size_t, long long, Target, bool>;

template <class Extent>
std::vector<Extent> batch_extents(const std::vector<BatchItem>& items) {
  std::vector<Extent> extents;
  extents.reserve(items.size());
  for (const auto& [address, nbytes, offset, target, device] : items) {
    Extent e;
    e.buf = as_ptr(address);
    e.length = nbytes;
    e.offset = checked_offset(offset);
    e.memory = memory_of(device);
    if (const auto* path = std::get_if<std::string>(&target)) {
      e.file = *path;
    } else {
      e.file = std::get<int>(target);
    }
    extents.push_back(std::move(e));
  }
  return extents;
}

// One buffer and many file offsets (nvio/_handle.py's `read_batch(buf, offsets=, size=)`): extent
// i is the `size` bytes at address + i * size, moved at offsets[i] of the one file. _handle.py
// has checked the size and that count x size fits in the buffer; each offset is converted here,
// without a Python object per extent for a list of plain ints (others go through to_offset, which
// names the item it refuses).
template <class Extent>
std::vector<Extent> span_extents(std::uintptr_t address, const py::list& offsets, std::size_t size,
                                 py::handle file) {
  const Target target = to_target(file, py::str("file"));
  const auto count = static_cast<std::size_t>(PyList_GET_SIZE(offsets.ptr()));
  std::vector<Extent> extents(count);
  for (std::size_t i = 0; i < count; ++i) {
    Extent& e = extents[i];
    const py::handle item = PyList_GET_ITEM(offsets.ptr(), static_cast<Py_ssize_t>(i));
    if (auto v = plain_integer(item, 0, std::numeric_limits<long long>::max())) {
      e.offset = static_cast<std::uint64_t>(*v);
    } else {
      e.offset = to_offset(item, py::str("offsets[" + std::to_string(i) + "]"));
    }
    e.buf = as_ptr(address + i * size);
    e.length = size;
    if (const auto* path = std::get_if<std::string>(&target)) {
      e.file = *path;
    } else {
      e.file = std::get<int>(target);
    }
  }
  return extents;
}

// The batches: the spans' extents share their one buffer's memory kind (`device`); the items of
// read_batch / write_batch each carry their own.
void def_batches(py::class_<nvio::Handle>& cls) {
  cls.def(
      "read_spans",
      [](nvio::Handle& h, std::uintptr_t address, const py::list& offsets, std::size_t size,
         py::handle file, bool device) {
        const auto extents = span_extents<nvio::ReadExtent>(address, offsets, size, file);
        const nvio::ReadOptions r = read_options(device);
        unlocked([&] { h.read_batch(extents, r); }, Signals::Handle);
      },
      py::arg("address"), py::arg("offsets"), py::arg("size"), py::arg("target"),
      py::arg("device") = false);
  cls.def(
      "write_spans",
      [](nvio::Handle& h, std::uintptr_t address, const py::list& offsets, std::size_t size,
         py::handle file, bool sync, bool device) {
        const auto extents = span_extents<nvio::WriteExtent>(address, offsets, size, file);
        const nvio::WriteOptions w = write_options(false, sync, device);
        unlocked([&] { h.write_batch(extents, w); }, Signals::Handle);
      },
      py::arg("address"), py::arg("offsets"), py::arg("size"), py::arg("target"),
      py::arg("sync") = false, py::arg("device") = false);
  cls.def(
      "submit_read_spans",
      [](nvio::Handle& h, py::handle future, std::uintptr_t address, const py::list& offsets,
         std::size_t size, py::handle file, bool device) {
        const auto extents = span_extents<nvio::ReadExtent>(address, offsets, size, file);
        const nvio::ReadOptions r = read_options(device);
        unlocked([&] { hold(h, future, h.submit_read_batch(extents, r)); });
      },
      py::arg("future"), py::arg("address"), py::arg("offsets"), py::arg("size"), py::arg("target"),
      py::arg("device") = false);
  cls.def(
      "submit_write_spans",
      [](nvio::Handle& h, py::handle future, std::uintptr_t address, const py::list& offsets,
         std::size_t size, py::handle file, bool sync, bool device) {
        const auto extents = span_extents<nvio::WriteExtent>(address, offsets, size, file);
        const nvio::WriteOptions w = write_options(false, sync, device);
        unlocked([&] { hold(h, future, h.submit_write_batch(extents, w)); });
      },
      py::arg("future"), py::arg("address"), py::arg("offsets"), py::arg("size"), py::arg("target"),
      py::arg("sync") = false, py::arg("device") = false);
  cls.def(
      "read_batch",
      [](nvio::Handle& h, const std::vector<BatchItem>& items) {
        const auto extents = batch_extents<nvio::ReadExtent>(items);
        unlocked([&] { h.read_batch(extents); }, Signals::Handle);
      },
      py::arg("items"));
  cls.def(
      "write_batch",
      [](nvio::Handle& h, const std::vector<BatchItem>& items, bool sync) {
        const auto extents = batch_extents<nvio::WriteExtent>(items);
        const nvio::WriteOptions w = write_options(false, sync, false);
        unlocked([&] { h.write_batch(extents, w); }, Signals::Handle);
      },
      py::arg("items"), py::arg("sync") = false);
  cls.def(
      "submit_read_batch",
      [](nvio::Handle& h, py::handle future, const std::vector<BatchItem>& items) {
        const auto extents = batch_extents<nvio::ReadExtent>(items);
        unlocked([&] { hold(h, future, h.submit_read_batch(extents)); });
      },
      py::arg("future"), py::arg("items"));
  cls.def(
      "submit_write_batch",
      [](nvio::Handle& h, py::handle future, const std::vector<BatchItem>& items, bool sync) {
        const auto extents = batch_extents<nvio::WriteExtent>(items);
        const nvio::WriteOptions w = write_options(false, sync, false);
        unlocked([&] { hold(h, future, h.submit_write_batch(extents, w)); });
      },
      py::arg("future"), py::arg("items"), py::arg("sync") = false);
}

// The single calls take the file and offset as given (converted by to_target/to_offset);
// file_name and offset_name name them in an error (aio_handle: "filename", "file_offset"). Every
// submit (here and in the batches) takes the nvio.Future that is to hold its ticket (held.hpp).
void def_single_calls(py::class_<nvio::Handle>& cls) {
  cls.def(
         "read",
         [](nvio::Handle& h, std::uintptr_t addr, std::size_t nbytes, py::handle file,
            py::handle offset, bool device, py::handle file_name, py::handle offset_name) {
           const nvio::ReadOptions r = read_options(device);
           on_target(
               file, offset, file_name, offset_name, Signals::Handle,
               [&](const auto& t, std::uint64_t off) { h.read(as_ptr(addr), nbytes, t, off, r); });
         },
         py::arg("address"), py::arg("nbytes"), py::arg("target"), py::arg("offset") = 0,
         py::arg("device") = false, py::arg("file_name") = "file",
         py::arg("offset_name") = "offset")
      .def(
          "write",
          [](nvio::Handle& h, std::uintptr_t addr, std::size_t nbytes, py::handle file,
             py::handle offset, bool truncate, bool sync, bool device, py::handle file_name,
             py::handle offset_name) {
            const nvio::WriteOptions w = write_options(truncate, sync, device);
            on_target(file, offset, file_name, offset_name, Signals::Handle,
                      [&](const auto& t, std::uint64_t off) {
                        h.write(as_ptr(addr), nbytes, t, off, w);
                      });
          },
          py::arg("address"), py::arg("nbytes"), py::arg("target"), py::arg("offset") = 0,
          py::arg("truncate") = false, py::arg("sync") = false, py::arg("device") = false,
          py::arg("file_name") = "file", py::arg("offset_name") = "offset")
      .def(
          "submit_read",
          [](nvio::Handle& h, py::handle future, std::uintptr_t addr, std::size_t nbytes,
             py::handle file, py::handle offset, bool device, py::handle file_name,
             py::handle offset_name) {
            const nvio::ReadOptions r = read_options(device);
            on_target(file, offset, file_name, offset_name, Signals::Keep,
                      [&](const auto& t, std::uint64_t off) {
                        hold(h, future, h.submit_read(as_ptr(addr), nbytes, t, off, r));
                      });
          },
          py::arg("future"), py::arg("address"), py::arg("nbytes"), py::arg("target"),
          py::arg("offset") = 0, py::arg("device") = false, py::arg("file_name") = "file",
          py::arg("offset_name") = "offset")
      .def(
          "submit_write",
          [](nvio::Handle& h, py::handle future, std::uintptr_t addr, std::size_t nbytes,
             py::handle file, py::handle offset, bool truncate, bool sync, bool device,
             py::handle file_name, py::handle offset_name) {
            const nvio::WriteOptions w = write_options(truncate, sync, device);
            on_target(file, offset, file_name, offset_name, Signals::Keep,
                      [&](const auto& t, std::uint64_t off) {
                        hold(h, future, h.submit_write(as_ptr(addr), nbytes, t, off, w));
                      });
          },
          py::arg("future"), py::arg("address"), py::arg("nbytes"), py::arg("target"),
          py::arg("offset") = 0, py::arg("truncate") = false, py::arg("sync") = false,
          py::arg("device") = false, py::arg("file_name") = "file",
          py::arg("offset_name") = "offset");
}

void def_tickets(py::class_<nvio::Handle>& cls) {
  cls
      // Waits for `ticket` and records its outcome on `future` (nvio/_future.py) as
      // future._outcome = (error or None,), with the GIL taken before the wait returns: a handler
      // raising as the call returns (a Ctrl-C landing just then) cannot hide a collected outcome.
      // A Ctrl-C during the wait (`signals`) leaves the ticket pending and sets nothing.
      .def(
          "collect_into",
          [](nvio::Handle& h, nvio::Ticket t, const py::object& future, bool signals) {
            unlocked(
                [&] {
                  const nvio::Completion c = h.wait_completion(t);
                  py::gil_scoped_acquire gil;
                  future.attr("_outcome") = py::make_tuple(error_object(c.error));
                },
                signals ? Signals::Handle : Signals::Keep);
          },
          py::arg("ticket"), py::arg("future"), py::arg("signals") = true)
      .def("wait_all", [](nvio::Handle& h) { return unlocked([&] { return h.wait(); }); })
      .def("done", [](const nvio::Handle& h, nvio::Ticket t) { return h.done(t); })
      .def("is_pending", [](const nvio::Handle& h, nvio::Ticket t) { return h.is_pending(t); })
      .def("cancel", [](nvio::Handle& h, nvio::Ticket t) { return h.cancel(t); })
      .def("pending", &nvio::Handle::pending);
}

}  // namespace

void bind_handle(py::module_& m) {
  py::class_<nvio::Handle> cls(m, "Handle");
  cls.def(py::init([](const py::kwargs& kwargs) {
    std::string config_dir;
    const nvio::OptionOverrides o = overrides(kwargs, config_dir);
    return unlocked([&] {
      return std::make_unique<nvio::Handle>(nvio::resolve_options(o, {}, config_dir).values);
    });
  }));
  def_single_calls(cls);
  def_tickets(cls);
  // Closing a descriptor can block (a network file system flushes on close).
  cls.def("close_files", [](nvio::Handle& h) { unlocked([&] { h.close_files(); }); })
      .def(
          "close_file",
          [](nvio::Handle& h, py::handle file) {
            const Target target = to_target(file, py::str("file"));
            unlocked([&] { std::visit([&](const auto& f) { h.close_file(f); }, target); });
          },
          py::arg("file"))
      .def("open_files", &nvio::Handle::open_files)
      .def("stats", [](const nvio::Handle& h) { return stats_dict(h.stats()); })
      .def("options", [](const nvio::Handle& h) { return options_dict(h.options()); })
      .def_property_readonly("engine",
                             [](const nvio::Handle& h) { return nvio::to_string(h.engine()); })
      .def_property_readonly("engine_reason", &nvio::Handle::engine_reason);
  def_batches(cls);
}

}  // namespace nvio_py
