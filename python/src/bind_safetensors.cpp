// The safetensors functions of nvio._nvio (nvio/safetensors.py over nvio/safetensors.hpp): header
// reading, parsing and serializing, and whole-file saves.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "common.hpp"

namespace nvio_py {
namespace {

namespace st = nvio::safetensors;

// A header as Python takes it: (data_offset, data_size, metadata or None,
// [(name, dtype, shape, begin, end), ...] in header order). Called with the GIL held.
py::tuple header_tuple(const st::Header& h) {
  py::list tensors;
  for (const st::TensorInfo& t : h.tensors) {
    py::tuple shape(t.shape.size());
    for (std::size_t i = 0; i < t.shape.size(); ++i) shape[i] = py::int_(t.shape[i]);
    tensors.append(
        py::make_tuple(message_text(t.name), st::to_string(t.dtype), shape, t.begin, t.end));
  }
  py::object metadata = py::none();
  if (h.metadata) {
    py::dict d;
    for (const auto& [k, v] : *h.metadata) d[message_text(k)] = message_text(v);
    metadata = d;
  }
  return py::make_tuple(h.data_offset(), h.data_size, metadata, tensors);
}

st::Dtype dtype_of(const std::string& name) {
  const std::optional<st::Dtype> d = st::parse_dtype(name);
  if (!d) throw nvio::InvalidArgument("safetensors: unknown dtype '" + name + "'");
  return *d;
}

// (name, dtype, shape, address, nbytes) from nvio/safetensors.py, names already UTF-8 bytes.
using SaveItem =
    std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::uintptr_t, std::size_t>;

std::vector<st::TensorData> tensor_data(const std::vector<SaveItem>& items) {
  std::vector<st::TensorData> out;
  out.reserve(items.size());
  for (const auto& [name, dtype, shape, address, nbytes] : items) {
    out.push_back({name, dtype_of(dtype), shape, as_ptr(address), nbytes});
  }
  return out;
}

using MetadataArg = std::optional<std::map<std::string, std::string>>;

}  // namespace

void bind_safetensors(py::module_& m) {
  m.def(
      "safetensors_read_header",
      [](nvio::Handle& h, const std::string& path) {
        const st::Header header = unlocked([&] { return st::read_safetensors_header(h, path); });
        return header_tuple(header);
      },
      py::arg("handle"), py::arg("path"));
  m.def(
      "safetensors_parse",
      [](const py::buffer& buffer, const std::string& name) {
        const py::buffer_info info = buffer.request();
        const std::span<const unsigned char> bytes(
            static_cast<const unsigned char*>(info.ptr),
            static_cast<std::size_t>(info.size * info.itemsize));
        const st::Header header =
            unlocked([&] { return st::parse_safetensors_header(bytes, bytes.size(), name); });
        return header_tuple(header);
      },
      py::arg("buffer"), py::arg("name"));
  // The header save would write, for nvio.safetensors.save(): (bytes, order, begins).
  m.def(
      "safetensors_header",
      [](const std::vector<SaveItem>& items, const MetadataArg& metadata) {
        const st::SerializedHeader h =
            st::serialize_safetensors_header(tensor_data(items), metadata);
        return py::make_tuple(
            py::bytes(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size()), h.order,
            h.begins);
      },
      py::arg("items"), py::arg("metadata"));
  m.def(
      "safetensors_save",
      [](nvio::Handle& h, const std::string& path, const std::vector<SaveItem>& items,
         const MetadataArg& metadata, bool sync, bool device) {
        const std::vector<st::TensorData> tensors = tensor_data(items);
        nvio::WriteOptions w = write_options(false, sync, device);
        // Its writes are blocking calls: interrupted, they drain, and the temporary file goes.
        unlocked([&] { st::save_safetensors(h, path, tensors, metadata, w); }, Signals::Handle);
      },
      py::arg("handle"), py::arg("path"), py::arg("items"), py::arg("metadata"),
      py::arg("sync") = true, py::arg("device") = false);
}

}  // namespace nvio_py
