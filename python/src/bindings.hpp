// The parts of nvio._nvio, one function per area, each in its own file (bind_<area>.cpp), called
// in order by the module's init (module.cpp). Private to the extension; the helpers they share are
// in common.hpp.
#pragma once

#include <pybind11/pybind11.h>

namespace nvio_py {

// The interpreter's main thread (for signal handling) and the library's warning sink (common.cpp).
void bind_runtime(pybind11::module_& m);
// The exception types and their translator, first: later translators (FileBusy's) go before it.
void bind_errors(pybind11::module_& m);
// The argument checks and nvio.InvalidType's users (after bind_errors, which makes the type).
void bind_args(pybind11::module_& m);
void bind_handle(pybind11::module_& m);
void bind_safetensors(pybind11::module_& m);
void bind_replace_file(pybind11::module_& m);
void bind_checkpoint(pybind11::module_& m);
void bind_swapper(pybind11::module_& m);
void bind_striped(pybind11::module_& m);
void bind_memory(pybind11::module_& m);
void bind_options(pybind11::module_& m);
void bind_tune(pybind11::module_& m);
void bind_system(pybind11::module_& m);
void bind_gpu(pybind11::module_& m);
// After Handle (its argument type) and bind_errors (FileBusy derives from Error).
void bind_file(pybind11::module_& m);

}  // namespace nvio_py
