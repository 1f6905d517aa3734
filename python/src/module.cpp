// nvio._nvio: the thin pybind11 layer over the C++ core. Buffers arrive here as (address, nbytes)
// pairs resolved by the pure-Python package (nvio/_buffers.py), which also keeps the Python
// objects alive for as long as an operation may touch them. Each area is bound in a file of its
// own (bindings.hpp); the helpers they share (GIL, converters) are in common.hpp.
#include <pybind11/pybind11.h>

#include "bindings.hpp"

PYBIND11_MODULE(_nvio, m) {
  m.doc() = "nvio core bindings (internal: use the nvio package)";
  nvio_py::bind_runtime(m);
  nvio_py::bind_errors(m);
  nvio_py::bind_args(m);
  nvio_py::bind_handle(m);
  nvio_py::bind_safetensors(m);
  nvio_py::bind_replace_file(m);
  nvio_py::bind_checkpoint(m);
  nvio_py::bind_swapper(m);
  nvio_py::bind_striped(m);
  nvio_py::bind_memory(m);
  nvio_py::bind_options(m);
  nvio_py::bind_tune(m);
  nvio_py::bind_system(m);
  nvio_py::bind_gpu(m);
  nvio_py::bind_file(m);
}
