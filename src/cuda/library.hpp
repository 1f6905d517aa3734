// Run-time loading of optional shared libraries (the CUDA driver, the CUDA runtime, cuFile).
//
// Ownership: a Library owns one dlopen reference and drops it on destruction. The CUDA driver and
// cuFile are never unloaded while the process runs (their own teardown at exit does not survive
// being unmapped early), so the loaders keep their Library in a process-lifetime object.
// Thread-safety: a Library is immutable after construction; dlopen/dlsym are thread-safe.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace nvio::cuda {

class Library {
 public:
  Library() = default;
  ~Library();
  Library(Library&& other) noexcept;
  Library& operator=(Library&& other) noexcept;
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  explicit operator bool() const noexcept { return handle_ != nullptr; }
  // The path or soname that was loaded (or, after a failure, the last one tried).
  const std::string& path() const noexcept { return path_; }
  // Why loading failed ("libcufile.so.0: cannot open shared object file: ..."), empty on success.
  const std::string& error() const noexcept { return error_; }
  // The address of `name`, or null when the library lacks it.
  void* symbol(const char* name) const noexcept;

  // Loads the library named by environment variable `env_var` when it is set (only that path is
  // tried, so a missing file reports as such), else the first of `candidates` that loads.
  static Library load(const char* env_var, const std::vector<std::string>& candidates,
                      const std::function<const char*(const char*)>& getenv = {});
  // True when `name` is already loaded in this process (dlopen RTLD_NOLOAD); loads nothing.
  static bool is_loaded(const std::string& name) noexcept;

 private:
  void* handle_ = nullptr;
  std::string path_;
  std::string error_;
};

// Sets `fn` to the address of `name` in `lib` (null when missing) and records the first missing
// name in `missing`, so that a loader can resolve a table of functions and report one reason.
template <typename Fn>
bool resolve(const Library& lib, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(lib.symbol(name));
  if (fn == nullptr && missing.empty()) missing = name;
  return fn != nullptr;
}

}  // namespace nvio::cuda
