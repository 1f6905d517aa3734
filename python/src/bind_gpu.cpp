// The GPU functions of nvio._nvio (nvio/gpu.hpp): what CUDA and cuFile offer here, and the
// registration of device buffers with cuFile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>

#include "bindings.hpp"
#include "common.hpp"

namespace nvio_py {

void bind_gpu(py::module_& m) {
  m.def("gpu_info", [] {
    // The first call probes (dlopen, cuInit, cuFileDriverOpen): without the GIL.
    const nvio::GpuInfo& g = *unlocked([] { return &nvio::gpu_info(); });
    py::list devices;
    for (const auto& dev : g.devices) {
      py::dict d;
      d["ordinal"] = dev.ordinal;
      d["name"] = dev.name;
      d["memory"] = dev.total_memory;
      d["pci_bus_id"] = dev.pci_bus_id;
      devices.append(d);
    }
    py::dict d;
    d["driver_loaded"] = g.driver_loaded;
    d["driver_path"] = g.driver_path;
    d["driver_reason"] = g.driver_reason;
    d["driver_version"] = g.driver_version;
    d["runtime_version"] = g.runtime_version ? py::cast(*g.runtime_version) : py::none();
    d["runtime_path"] = g.runtime_path;
    d["devices"] = devices;
    d["cufile_loaded"] = g.cufile_loaded;
    d["cufile_path"] = g.cufile_path;
    d["cufile_reason"] = g.cufile_reason;
    d["gds_mode"] = nvio::to_string(g.gds_mode);
    d["gds_reason"] = g.gds_reason;
    return d;
  });
  m.def(
      "gds_register",
      [](std::uintptr_t addr, std::size_t nbytes) {
        return unlocked([&] { return nvio::gds_register_buffer(as_ptr(addr), nbytes); });
      },
      py::arg("address"), py::arg("nbytes"));
  m.def(
      "gds_deregister",
      [](std::uintptr_t addr) {
        return unlocked([&] { return nvio::gds_deregister_buffer(as_ptr(addr)); });
      },
      py::arg("address"));
}

}  // namespace nvio_py
