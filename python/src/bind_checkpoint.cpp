// nvio._nvio's torch checkpoint writing (nvio/checkpoint.hpp): save_checkpoint, nvio.save's one
// call into the core after pickling (layout, CRC-32s, the batch write, sync and rename);
// checkpoint_pieces, the same archive in order for a file object; ArchiveFile, nvio.dcp's data
// files. The writes and the checksums run without the GIL through common.hpp's unlocked(); errors
// go up through the module's one translation.
//
// Records come from Python as (name, bytes or None, address, nbytes): bytes for a small record
// (copied here), None for a storage, whose `nbytes` at `address` the caller keeps alive and
// unchanged until the write returns.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "common.hpp"
#include "nvio/checkpoint.hpp"
#include "nvio/handle.hpp"

namespace py = pybind11;

namespace nvio_py {

namespace checkpoint_binding {

using nvio::ArchiveFile;
using nvio::ArchiveRecord;
using nvio::Placement;

using PyRecord = std::tuple<std::string, py::object, std::uintptr_t, std::uint64_t>;

// The records as the core takes them; a small record's bytes are those of the Python object, which
// the caller's list keeps alive while they are copied (add_archive, with the GIL held).
std::vector<ArchiveRecord> records_of(const std::vector<PyRecord>& in) {
  std::vector<ArchiveRecord> out;
  out.reserve(in.size());
  for (const auto& [name, small, address, nbytes] : in) {
    ArchiveRecord r;
    r.name = name;
    if (small.is_none()) {
      r.data = reinterpret_cast<const void*>(address);
      r.size = nbytes;
      r.storage = true;
    } else {
      char* data = nullptr;
      Py_ssize_t size = 0;
      if (PyBytes_AsStringAndSize(small.ptr(), &data, &size) != 0) throw py::error_already_set();
      r.data = data;
      r.size = static_cast<std::uint64_t>(size);
    }
    out.push_back(std::move(r));
  }
  return out;
}

nvio::Durability durability(bool sync) {
  return sync ? nvio::Durability::Data : nvio::Durability::None;
}

}  // namespace checkpoint_binding

void bind_checkpoint(py::module_& m) {
  using namespace checkpoint_binding;
  constexpr std::uint64_t kLimit = nvio::kZip64Limit;
  m.def(
      "save_checkpoint",
      [](nvio::Handle& h, const std::string& path, const std::vector<PyRecord>& records, bool sync,
         std::uint64_t zip64_limit) {
        ArchiveFile file(zip64_limit);
        file.add_archive(records_of(records), Placement::ByAddress);
        std::uint64_t size = 0;
        // Blocking writes: interrupted, they drain, and the temporary file goes.
        unlocked([&] { size = file.write(h, path, durability(sync)); }, Signals::Handle);
        return size;
      },
      py::arg("handle"), py::arg("path"), py::arg("records"), py::arg("sync") = true,
      py::arg("zip64_limit") = kLimit);
  // The archive in file order for a file object: bytes, or the index in `records` of a storage
  // whose bytes come next.
  m.def(
      "checkpoint_pieces",
      [](const std::vector<PyRecord>& records, std::uint64_t zip64_limit) {
        ArchiveFile file(zip64_limit);
        const std::vector<ArchiveRecord> in = records_of(records);
        file.add_archive(in, Placement::Packed);
        std::vector<std::size_t> record_of;  // storage index -> record index
        for (std::size_t i = 0; i < in.size(); ++i) {
          if (in[i].storage && in[i].size > 0) record_of.push_back(i);
        }
        std::vector<ArchiveFile::Piece> pieces;
        unlocked([&] { pieces = file.pieces(); });
        py::list out;
        for (const ArchiveFile::Piece& p : pieces) {
          if (p.storage >= 0) {
            out.append(record_of[static_cast<std::size_t>(p.storage)]);
          } else {
            out.append(py::bytes(p.bytes));
          }
        }
        return out;
      },
      py::arg("records"), py::arg("zip64_limit") = kLimit);
  py::class_<ArchiveFile>(m, "ArchiveFile")
      .def(py::init<std::uint64_t>(), py::arg("zip64_limit") = kLimit)
      .def_property_readonly("size", &ArchiveFile::size)
      .def(
          "add_bytes",
          [](ArchiveFile& f, const py::bytes& data) {
            const std::string bytes = data;
            const ArchiveFile::Span s = f.add_bytes(bytes.data(), bytes.size());
            return std::make_tuple(s.offset, s.length);
          },
          py::arg("data"))
      // (offset, length, the file offset of each storage with bytes, in order).
      .def(
          "add_archive",
          [](ArchiveFile& f, const std::vector<PyRecord>& records) {
            const std::size_t before = f.storages().size();
            const ArchiveFile::Span s = f.add_archive(records_of(records), Placement::ByAddress);
            std::vector<std::uint64_t> offsets;
            for (std::size_t i = before; i < f.storages().size(); ++i) {
              offsets.push_back(f.storages()[i].offset);
            }
            return std::make_tuple(s.offset, s.length, offsets);
          },
          py::arg("records"))
      .def(
          "write",
          [](const ArchiveFile& f, nvio::Handle& h, const std::string& path, bool sync) {
            std::uint64_t size = 0;
            unlocked([&] { size = f.write(h, path, durability(sync)); }, Signals::Handle);
            return size;
          },
          py::arg("handle"), py::arg("path"), py::arg("sync") = true);
}

}  // namespace nvio_py
