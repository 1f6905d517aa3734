// What nvio._nvio tells of the machine and of files: engines, direct I/O, kernel limits, the page
// cache, and the library's version; with the checksums and test patterns of buffers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "bindings.hpp"
#include "common.hpp"

namespace nvio_py {

void bind_system(py::module_& m) {
  m.def("probe_engines", [] {
    return unlocked([] {
      std::map<std::string, std::pair<bool, std::string>> out;
      for (auto k :
           {nvio::EngineKind::IoUring, nvio::EngineKind::Libaio, nvio::EngineKind::Psync}) {
        const auto& p = nvio::probe_engine(k);
        out[nvio::to_string(k)] = {p.available, p.reason};
      }
      return out;
    });
  });
  m.def("auto_engine", [] {
    return unlocked([] {
      const auto& c = nvio::auto_engine();
      return std::make_pair(std::string(nvio::to_string(c.engine)), c.reason);
    });
  });
  m.def("probe_directory", [](const std::string& dir) {
    const nvio::DirectIoInfo info = unlocked([&] { return nvio::probe_directory(dir); });
    py::dict d;
    d["path"] = path_text(dir);
    d["direct_io"] = info.supported;
    d["mem_align"] = info.mem_align;
    d["offset_align"] = info.offset_align;
    d["source"] = info.source;
    return d;
  });
  m.def("system_info", [] {
    const nvio::SystemInfo s = nvio::system_info();
    py::dict d;
    d["kernel"] = s.kernel;
    d["memlock_limit"] = s.memlock_limit ? py::cast(*s.memlock_limit) : py::none();
    d["memlock_capability"] = s.memlock_capability ? py::cast(*s.memlock_capability) : py::none();
    d["aio_max_nr"] = s.aio_max_nr ? py::cast(*s.aio_max_nr) : py::none();
    d["aio_nr"] = s.aio_nr ? py::cast(*s.aio_nr) : py::none();
    return d;
  });
  m.def(
      "evict_page_cache",
      [](const std::string& path) { unlocked([&] { nvio::evict_page_cache(path); }); },
      py::arg("path"));
  m.def(
      "page_cache_state",
      [](const std::string& path) {
        const nvio::PageCacheState s = unlocked([&] { return nvio::page_cache_state(path); });
        py::dict d;
        d["file_bytes"] = s.file_bytes;
        d["cached_bytes"] = s.cached_bytes;
        d["dirty_bytes"] = s.dirty_bytes;
        d["method"] = s.method;
        return d;
      },
      py::arg("path"));
  m.def("pattern_fill",
        [](std::uintptr_t addr, std::size_t n, std::uint64_t off, std::uint64_t seed) {
          nvio::pattern::fill(as_ptr(addr), n, off, seed);
        });
  m.def("pattern_first_mismatch",
        [](std::uintptr_t addr, std::size_t n, std::uint64_t off, std::uint64_t seed) {
          return nvio::pattern::first_mismatch(as_ptr(addr), n, off, seed);
        });
  m.def(
      "crc32",
      [](py::buffer obj, std::uint32_t value) {
        const py::buffer_info info = contiguous_buffer(obj);
        const auto size = static_cast<std::size_t>(info.size * info.itemsize);
        return unlocked([&] { return nvio::crc32(info.ptr, size, value); });
      },
      py::arg("data"), py::arg("value") = 0,
      "zlib.crc32 of a contiguous buffer (ISA-L, without the GIL).");
  m.def("crc32_combine", &nvio::crc32_combine, py::arg("crc_a"), py::arg("crc_b"),
        py::arg("size_b"), "The CRC-32 of A followed by B, from both CRCs and B's length.");

  m.attr("__version__") = nvio::version();
  m.attr("MIN_BLOCK_SIZE") = nvio::kMinBlockSize;
}

}  // namespace nvio_py
