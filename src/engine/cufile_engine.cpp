// cuFile (GPUDirect Storage) as an engine: the psync shape, for device memory moved by cuFile.
// Each request is one synchronous cuFileRead / cuFileWrite on the worker thread during submit(),
// after making the request's device current; its result waits in `done_` for reap(). cuFile's
// own error codes are decoded here (error()), not in the handle.
//
// Ownership and thread-safety: like every engine, one worker thread uses it.
#include <fmt/format.h>

#include <cerrno>

#include "cuda/cufile.hpp"
#include "cuda/device_ops.hpp"
#include "engine/engine.hpp"

namespace nvio::engine {
namespace {

// Results at or below -kDriverError carry a CUresult from making the device current:
// -(kDriverError + code). cuFile's own codes are above CUFILEOP_BASE_ERR (5000) and below this.
constexpr std::int64_t kDriverError = std::int64_t{1} << 32;

class CuFileEngine final : public SynchronousEngine {
 public:
  explicit CuFileEngine(CuFileCalls calls) : calls_(std::move(calls)) {}

  EngineKind kind() const noexcept override { return EngineKind::CuFile; }

  std::int64_t transfer(const Request& r) override {
    // Every time: the worker's bounce pipeline may have made another device current on this
    // thread since the last request.
    const int rc = calls_.make_current(r.device);
    return rc == cuda::kSuccess ? calls_.transfer(r) : -(kDriverError + rc);
  }

  std::exception_ptr error(IoOp op, const std::string& path, std::uint64_t offset,
                           std::uint64_t length, std::int64_t result,
                           const std::string& detail) const override {
    const std::int64_t code = -result;
    try {
      if (code >= kDriverError) {
        const int rc = static_cast<int>(code - kDriverError);
        throw GpuError("cuCtxSetCurrent", rc, calls_.error_name(rc), calls_.error_string(rc), path,
                       offset, length);
      }
      if (code > cuda::abi::kCuFileOpBaseErr) {
        const int err = static_cast<int>(code);
        throw GpuError(op == IoOp::Read ? "cuFileRead" : "cuFileWrite", err,
                       cuda::cufile_error_name(err), cuda::cufile_error_text(err), path, offset,
                       length);
      }
    } catch (...) {
      return std::current_exception();
    }
    return Engine::error(op, path, offset, length, result,
                         detail.empty() ? std::string("cuFile") : "cuFile, " + detail);
  }

 private:
  CuFileCalls calls_;
};

// A descriptor registered with cuFile, as requests carry it (Request::file).
struct CuFileRegistration final : FileRegistration {
  CuFileRegistration(int fd, const std::string& path) : handle(fd, path) {}
  cuda::CuFileHandle handle;
};

}  // namespace

std::shared_ptr<const FileRegistration> register_cufile(int fd, const std::string& path) {
  return std::make_shared<const CuFileRegistration>(fd, path);
}

CuFileCalls real_cufile_calls() {
  std::shared_ptr<cuda::DeviceOps> ops = cuda::device_ops();  // GpuError without CUDA
  CuFileCalls c;
  c.make_current = [ops](int device) { return ops->make_current(device); };
  c.transfer = [](const Request& r) {
    // Requests to this engine carry register_cufile's registration (register_file); one without
    // is a caller's mistake, refused rather than followed.
    if (r.file == nullptr) return std::int64_t{-EINVAL};
    return cuda::gds_transfer(static_cast<const CuFileRegistration*>(r.file)->handle,
                              r.direction == Direction::Read, r.buf, r.length, r.offset);
  };
  c.error_name = [ops](int code) { return ops->error_name(code); };
  c.error_string = [ops](int code) { return ops->error_string(code); };
  return c;
}

std::unique_ptr<Engine> make_cufile_engine(CuFileCalls calls) {
  return std::make_unique<CuFileEngine>(std::move(calls));
}

}  // namespace nvio::engine
