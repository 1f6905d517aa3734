// Host memory and buffers for nvio._nvio: LockedMemory (locked, page-aligned allocations exported
// through the buffer protocol), the address and size of a buffer-protocol object or of a DLPack
// tensor, and whether memory is locked by nvio.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "bindings.hpp"
#include "common.hpp"
#include "nvio/locked_memory.hpp"
#include "nvio/memory.hpp"

namespace nvio_py {
namespace {

// Every live LockedMemory by start address, with its size: locked or not (mlock refused under
// RLIMIT_MEMLOCK). DeepSpeed's handles answer is_pinned for memory their own allocator made, and
// nvio's aio_handle does the same for this memory, which it moves without a bounce copy either
// way. Touched only with the GIL held (construction after the allocation, destruction, queries),
// which is what guards it.
std::map<std::uintptr_t, std::size_t>& locked_memory_regions() {
  static auto* regions = new std::map<std::uintptr_t, std::size_t>;  // leaked: see LockedRegions
  return *regions;
}

bool in_locked_memory(std::uintptr_t addr, std::size_t nbytes) {
  const auto& regions = locked_memory_regions();
  auto it = regions.upper_bound(addr);
  if (it == regions.begin()) return false;
  --it;
  return addr >= it->first && nbytes <= it->second && addr - it->first <= it->second - nbytes;
}

// Owner of a locked, page-aligned host allocation exported through the buffer protocol, so torch
// and numpy can wrap it without a copy (the tensor or array keeps this object alive): the core's
// allocate_locked (nvio/locked_memory.hpp), which puts 256 KiB to 2 MiB in huge-page slabs.
// Neither copied nor moved: its registration is keyed by the address it owns.
class LockedMemory {
 public:
  explicit LockedMemory(std::size_t nbytes)
      : nbytes_(nbytes), memory_(unlocked([&] { return nvio::allocate_locked(nbytes); })) {
    locked_memory_regions()[address()] = nbytes_;
  }
  ~LockedMemory() { locked_memory_regions().erase(address()); }
  LockedMemory(const LockedMemory&) = delete;
  LockedMemory& operator=(const LockedMemory&) = delete;
  void* data() const { return memory_->data(); }
  std::uintptr_t address() const { return reinterpret_cast<std::uintptr_t>(data()); }
  std::size_t nbytes() const { return nbytes_; }
  // Whether mlock took (RLIMIT_MEMLOCK may refuse it): the slab's or the buffer's.
  bool locked() const { return nvio::is_locked_by_nvio(data(), nbytes_); }
  py::buffer_info info() {
    return py::buffer_info(data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(nbytes_)}, {1});
  }

 private:
  std::size_t nbytes_;
  std::shared_ptr<nvio::LockedBuffer> memory_;
};

// (address, nbytes, DLPack device type) of the bytes of a "dltensor" capsule.
py::tuple dlpack_range(const py::capsule& capsule) {
  // DLPack's ABI (dlpack.h, stable since v0.2): a "dltensor" capsule holds a
  // DLManagedTensor whose first member is the DLTensor. Only the fields needed to find the
  // bytes are read; the capsule is not consumed, so its destructor still frees it.
  struct DLTensorView {
    void* data;
    std::int32_t device_type;
    std::int32_t device_id;
    std::int32_t ndim;
    std::uint8_t code;
    std::uint8_t bits;
    std::uint16_t lanes;
    std::int64_t* shape;
    std::int64_t* strides;
    std::uint64_t byte_offset;
  };
  if (std::string(capsule.name() ? capsule.name() : "") != "dltensor") {
    throw nvio::InvalidArgument("__dlpack__ did not return an unconsumed 'dltensor' capsule");
  }
  const auto* t = static_cast<const DLTensorView*>(capsule.get_pointer());
  // kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3 (pinned host memory), kDLCUDAManaged 13.
  if (t->device_type != 1 && t->device_type != 2 && t->device_type != 3 && t->device_type != 13) {
    throw nvio::InvalidArgument("the DLPack tensor is on device type " +
                                std::to_string(t->device_type) + ", neither CPU nor CUDA memory");
  }
  // The size is ceil(elements x bits x lanes / 8): a sub-byte type (int4, fp4, a bitmask:
  // bits x lanes not a multiple of 8) is packed, as DLPack assumes for a tensor without
  // the versioned capsule's IS_SUBBYTE_TYPE_PADDED flag, so rounding each element up to a
  // byte would overstate it (twice, for 4 bits) and a read would run past its end. Strides
  // count elements, and byte_offset bytes; the only layout whose bytes form one range is the
  // compact row-major one (dimensions of one element excepted), so any other is refused.
  const std::uint64_t element_bits = std::uint64_t{t->bits} * t->lanes;
  if (element_bits == 0) {
    throw nvio::InvalidArgument("the DLPack tensor's dtype has " + std::to_string(t->bits) +
                                " bits and " + std::to_string(t->lanes) +
                                " lanes: it holds no bytes");
  }
  if (t->ndim < 0 || (t->ndim > 0 && t->shape == nullptr)) {
    throw nvio::InvalidArgument("the DLPack tensor has " + std::to_string(t->ndim) +
                                " dimensions but no shape");
  }
  constexpr std::uint64_t kMaxBits = std::numeric_limits<std::uint64_t>::max() / 2;
  std::uint64_t count = 1;
  for (std::int32_t d = 0; d < t->ndim; ++d) {
    if (t->shape[d] < 0) {
      throw nvio::InvalidArgument("the DLPack tensor's dimension " + std::to_string(d) +
                                  " is negative (" + std::to_string(t->shape[d]) + ")");
    }
    const auto extent = static_cast<std::uint64_t>(t->shape[d]);
    if (extent != 0 && count > kMaxBits / element_bits / extent) {
      throw nvio::InvalidArgument("the DLPack tensor's shape is too large to address");
    }
    count *= extent;
  }
  std::uint64_t expected = 1;  // the compact stride of dimension d, in elements
  for (std::int32_t d = t->ndim - 1; count > 0 && d >= 0; --d) {
    if (t->strides != nullptr && t->shape[d] > 1 &&
        t->strides[d] != static_cast<std::int64_t>(expected)) {
      throw nvio::InvalidArgument(
          element_bits % 8 != 0
              ? "the DLPack tensor of a " + std::to_string(element_bits) +
                    "-bit packed dtype is not densely packed (its strides are not the "
                    "compact row-major ones), so its bytes are not one range"
              : std::string("the DLPack tensor is not contiguous"));
    }
    expected *= static_cast<std::uint64_t>(t->shape[d]);
  }
  const std::uint64_t nbytes = (count * element_bits + 7) / 8;
  const auto base = reinterpret_cast<std::uintptr_t>(t->data) + t->byte_offset;
  return py::make_tuple(base, static_cast<std::size_t>(nbytes), t->device_type);
}

}  // namespace

void bind_memory(py::module_& m) {
  py::class_<LockedMemory>(m, "LockedMemory", py::buffer_protocol())
      .def(py::init<std::size_t>(), py::arg("nbytes"))
      .def_property_readonly("address", &LockedMemory::address)
      .def_property_readonly("nbytes", &LockedMemory::nbytes)
      .def_property_readonly("locked", &LockedMemory::locked)
      .def_buffer(&LockedMemory::info);

  m.def(
      "buffer_address",
      [](py::buffer obj, bool writable) {
        const py::buffer_info info = contiguous_buffer(obj);
        if (writable && info.readonly) {
          throw nvio::InvalidArgument("the buffer is read-only and cannot be read into");
        }
        return py::make_tuple(reinterpret_cast<std::uintptr_t>(info.ptr),
                              info.size * info.itemsize);
      },
      py::arg("obj"), py::arg("writable"));
  m.def("dlpack_address", &dlpack_range, py::arg("capsule"));
  m.def("is_locked", [](std::uintptr_t addr, std::size_t nbytes) {
    return nvio::is_locked_by_nvio(as_ptr(addr), nbytes);
  });
  m.def("in_locked_memory", &in_locked_memory);
}

}  // namespace nvio_py
