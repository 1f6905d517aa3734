#include "cuda/library.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

namespace nvio::cuda {

Library::~Library() {
  if (handle_ != nullptr) ::dlclose(handle_);
}

Library::Library(Library&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      path_(std::move(other.path_)),
      error_(std::move(other.error_)) {}

Library& Library::operator=(Library&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) ::dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    path_ = std::move(other.path_);
    error_ = std::move(other.error_);
  }
  return *this;
}

void* Library::symbol(const char* name) const noexcept {
  return handle_ != nullptr ? ::dlsym(handle_, name) : nullptr;
}

Library Library::load(const char* env_var, const std::vector<std::string>& candidates,
                      const std::function<const char*(const char*)>& getenv) {
  Library lib;
  const char* override_path = getenv ? getenv(env_var) : std::getenv(env_var);
  std::vector<std::string> names = candidates;
  if (override_path != nullptr) names = {override_path};
  for (const std::string& name : names) {
    lib.path_ = name;
    ::dlerror();
    // RTLD_LOCAL: the symbols are only reached through dlsym and must not clash with a CUDA
    // runtime the application itself links.
    lib.handle_ = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle_ != nullptr) {
      lib.error_.clear();
      return lib;
    }
    const char* err = ::dlerror();
    lib.error_ = err != nullptr ? err : name + ": dlopen failed";
  }
  if (names.empty()) lib.error_ = "no library name to try";
  if (override_path != nullptr) lib.error_ += std::string(" (from ") + env_var + ")";
  return lib;
}

bool Library::is_loaded(const std::string& name) noexcept {
  void* h = ::dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  ::dlclose(h);
  return true;
}

}  // namespace nvio::cuda
