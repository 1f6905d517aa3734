// nvio._nvio.Swapper, the core of nvio/swapper.py's TensorSwapper over nvio::Swapper: buffers
// arrive as (address, nbytes, device) resolved by nvio/_buffers.py, which keeps them alive through
// the Future of each swap_out.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "common.hpp"
#include "held.hpp"

namespace nvio_py {
namespace {

// A pool buffer lent by swap_in, exported through the buffer protocol (torch.frombuffer and
// numpy.frombuffer keep this object, and so the buffer and its share of the budget, alive).
class LentBuffer {
 public:
  explicit LentBuffer(std::shared_ptr<nvio::SwapBuffer> buffer) : buffer_(std::move(buffer)) {}
  std::uintptr_t address() const { return reinterpret_cast<std::uintptr_t>(buffer_->data()); }
  std::size_t nbytes() const { return buffer_->size(); }
  py::buffer_info info() {
    return py::buffer_info(buffer_->data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(buffer_->size())}, {1});
  }

 private:
  std::shared_ptr<nvio::SwapBuffer> buffer_;
};

py::dict swapper_stats_dict(const nvio::SwapperStats& s) {
  py::dict d;
  d["budget_bytes"] = s.budget_bytes;
  d["held_bytes"] = s.held_bytes;
  d["writing_bytes"] = s.writing_bytes;
  d["pool_bytes"] = s.pool_bytes;
  d["prefetched_bytes"] = s.prefetched_bytes;
  d["prefetch_queued"] = s.prefetch_queued;
  d["free_pool_bytes"] = s.free_pool_bytes;
  d["tensors"] = s.tensors;
  d["stored_bytes"] = s.stored_bytes;
  d["files"] = s.files;
  d["file_bytes"] = s.file_bytes;
  d["writes_in_flight"] = s.writes_in_flight;
  d["reads_in_flight"] = s.reads_in_flight;
  d["swap_outs"] = s.swap_outs;
  d["swap_ins"] = s.swap_ins;
  d["prefetch_hits"] = s.prefetch_hits;
  d["bytes_written"] = s.bytes_written;
  d["bytes_read"] = s.bytes_read;
  d["budget_waits"] = s.budget_waits;
  d["bytes_cloned"] = s.bytes_cloned;
  return d;
}

void def_swap_out(py::class_<nvio::Swapper>& cls) {
  cls.def(
         "swap_out",
         [](nvio::Swapper& s, py::handle future, const std::string& name, std::uintptr_t address,
            std::size_t nbytes, bool device, const std::string& meta) {
           unlocked([&] {
             hold(s, future, s.swap_out(name, as_ptr(address), nbytes, memory_of(device), meta));
           });
         },
         py::arg("future"), py::arg("name"), py::arg("address"), py::arg("nbytes"),
         py::arg("device"), py::arg("meta"))
      // collect_into, done, is_pending, cancel: what nvio.Future calls, so that a swap_out is a
      // plain Future. The swapper's waits do not run signal handlers (`signals` is accepted and
      // left alone: a swap_out's write is short, and the swapper's own waits are not built to stop
      // halfway), so a wait that raises has its outcome and the write is never pending after it;
      // a write cannot be cancelled.
      .def(
          "collect_into",
          [](nvio::Swapper& s, std::uint64_t id, const py::object& future, bool /*signals*/) {
            unlocked([&] {
              std::exception_ptr error;
              try {
                s.wait(id);
              } catch (...) {
                error = std::current_exception();
              }
              py::gil_scoped_acquire gil;
              future.attr("_outcome") = py::make_tuple(error_object(error));
            });
          },
          py::arg("ticket"), py::arg("future"), py::arg("signals") = true)
      .def("is_pending", [](const nvio::Swapper&, std::uint64_t) { return false; })
      .def("cancel", [](nvio::Swapper&, std::uint64_t) { return false; })
      .def("done",
           [](nvio::Swapper& s, std::uint64_t id) { return unlocked([&] { return s.done(id); }); })
      .def("wait_all", [](nvio::Swapper& s) { unlocked([&] { s.wait(); }); });
}

void def_swap_in(py::class_<nvio::Swapper>& cls) {
  cls.def(
         "swap_in",
         [](nvio::Swapper& s, const std::string& name) {
           std::string meta;
           LentBuffer buffer(unlocked([&] { return s.swap_in(name, &meta); }));
           return py::make_tuple(std::move(buffer), message_text(meta));
         },
         py::arg("name"))
      .def(
          "swap_in_into",
          [](nvio::Swapper& s, const std::string& name, std::uintptr_t address, std::size_t nbytes,
             bool device) {
            unlocked([&] { s.swap_in(name, as_ptr(address), nbytes, memory_of(device)); });
          },
          py::arg("name"), py::arg("address"), py::arg("nbytes"), py::arg("device"))
      .def(
          "swap_in_batch",
          [](nvio::Swapper& s,
             const std::vector<std::tuple<std::string, std::uintptr_t, std::size_t, bool>>& items) {
            std::vector<nvio::Swapper::Target> targets;
            targets.reserve(items.size());
            for (const auto& [name, address, nbytes, device] : items) {
              targets.push_back({name, as_ptr(address), nbytes, memory_of(device)});
            }
            unlocked([&] { s.swap_in(targets); });
          },
          py::arg("items"))
      .def(
          "prefetch",
          [](nvio::Swapper& s, const std::vector<std::string>& names) {
            return unlocked([&] { return s.prefetch(names); });
          },
          py::arg("names"))
      .def(
          "evict",
          [](nvio::Swapper& s, const std::string& name) {
            return unlocked([&] { return s.evict(name); });
          },
          py::arg("name"));
}

void def_queries(py::class_<nvio::Swapper>& cls) {
  cls
      // The swapper's mutex may be held through I/O (a snapshot holds it for its whole copy): even
      // the queries wait for it without the GIL.
      .def(
          "contains",
          [](const nvio::Swapper& s, const std::string& name) {
            return unlocked([&] { return s.contains(name); });
          },
          py::arg("name"))
      .def(
          "info",
          [](const nvio::Swapper& s, const std::string& name) -> py::object {
            const auto info = unlocked([&] { return s.info(name); });
            if (!info) return py::none();
            py::dict d;
            d["size"] = info->size;
            d["meta"] = info->meta;
            d["path"] = path_text(info->path);
            d["offset"] = info->offset;
            d["checksum"] = info->checksum ? py::cast(*info->checksum) : py::none();
            return d;
          },
          py::arg("name"))
      .def("names", [](const nvio::Swapper& s) { return unlocked([&] { return s.names(); }); })
      .def("stats",
           [](const nvio::Swapper& s) {
             return swapper_stats_dict(unlocked([&] { return s.stats(); }));
           })
      .def_property_readonly("directory",
                             [](const nvio::Swapper& s) { return path_text(s.directory()); })
      .def(
          "snapshot",
          [](nvio::Swapper& s, const std::string& dst) { unlocked([&] { s.snapshot(dst); }); },
          py::arg("dst_dir"))
      .def(
          "close",
          [](nvio::Swapper& s, bool delete_files) { unlocked([&] { s.close(delete_files); }); },
          py::arg("delete_files") = true);
}

}  // namespace

void bind_swapper(py::module_& m) {
  py::class_<LentBuffer>(m, "LentBuffer", py::buffer_protocol())
      .def_property_readonly("address", &LentBuffer::address)
      .def_property_readonly("nbytes", &LentBuffer::nbytes)
      .def_buffer(&LentBuffer::info);

  py::class_<nvio::Swapper> cls(m, "Swapper");
  cls.def(py::init([](const std::string& directory, std::uint64_t budget_bytes,
                      std::uint64_t pack_threshold, std::uint64_t pack_file_size, bool checksums,
                      const py::kwargs& kwargs) {
            std::string config_dir;
            const nvio::OptionOverrides o = overrides(kwargs, config_dir);
            nvio::SwapperOptions so;
            so.budget_bytes = budget_bytes;
            so.pack_threshold = pack_threshold;
            so.pack_file_size = pack_file_size;
            so.checksums = checksums;
            return unlocked([&] {
              const nvio::Options options = nvio::resolve_options(o, {}, config_dir).values;
              return std::make_unique<nvio::Swapper>(directory, so, options);
            });
          }),
          py::arg("directory"), py::arg("budget_bytes"), py::arg("pack_threshold"),
          py::arg("pack_file_size"), py::arg("checksums"));
  def_swap_out(cls);
  def_swap_in(cls);
  def_queries(cls);
}

}  // namespace nvio_py
