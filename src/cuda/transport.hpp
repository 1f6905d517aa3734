// How one operation on device memory moves its bytes: through host bounce chunks, or directly
// between the device and the file (GPUDirect Storage, by the engine::kDeviceDirectEngine). A pure
// decision from the gpu_direct option and what the machine offers (gpu_info()); the handle asks
// it without knowing which library moves the bytes. Defined in cufile.cpp.
#pragma once

#include <string>

#include "nvio/gpu.hpp"
#include "nvio/options.hpp"

namespace nvio::cuda {

enum class Transport { Bounce, Gds };
struct TransportChoice {
  Transport transport = Transport::Bounce;
  bool warn = false;  // gpu_direct=on could not be honoured: say so (once)
  std::string reason;
};
// Thread-safe (pure). For tests and the handle.
TransportChoice choose_transport(GpuDirect option, GdsMode mode, const std::string& gds_reason);

}  // namespace nvio::cuda
