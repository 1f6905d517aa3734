// `nvio ckpt-bench`: checkpoint save and load against PyTorch. It needs PyTorch, so it is the
// Python module nvio.ckpt_bench; this subcommand replaces the process with that module run by
// Python (NVIO_PYTHON, else the Python nvio was built with, else python3), so that exit status,
// signals and the terminal are the module's own. Every argument after `ckpt-bench` is the
// module's, passed on as typed (main() hands them over before its own parser sees them).
#include <fmt/core.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "cli.hpp"

namespace nvio_cli {
namespace {

#ifdef NVIO_DEFAULT_PYTHON
constexpr const char* kDefaultPython = NVIO_DEFAULT_PYTHON;
#else
constexpr const char* kDefaultPython = "python3";
#endif

// The directory to put on PYTHONPATH for the nvio package of this build, or empty: a program in a
// build tree (build/bin/nvio) has the package in build/python, which no Python finds by itself. The
// program an installed package bundles (site-packages/nvio/_bin/nvio) needs nothing: the Python it
// was built with has that site-packages on its path already (and putting all of site-packages
// first on PYTHONPATH would let it shadow the standard library).
std::string build_tree_package_root() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  const std::filesystem::path bin = exe.parent_path();
  if (bin.filename() != "bin") return {};
  const std::filesystem::path root = bin.parent_path() / "python";
  if (!std::filesystem::is_regular_file(root / "nvio" / "ckpt_bench.py", ec)) return {};
  return root.string();
}

}  // namespace

void run_ckpt_bench(const std::vector<std::string>& forwarded) {
  const char* from_env = std::getenv("NVIO_PYTHON");
  const std::string python = from_env != nullptr && *from_env != '\0' ? from_env : kDefaultPython;
  if (const std::string root = build_tree_package_root(); !root.empty()) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = old != nullptr && *old != '\0' ? root + ":" + old : root;
    if (::setenv("PYTHONPATH", path.c_str(), 1) != 0) {
      throw std::system_error(errno, std::generic_category(), "setenv PYTHONPATH");
    }
  }
  std::vector<std::string> argv_text = {python, "-m", "nvio.ckpt_bench"};
  argv_text.insert(argv_text.end(), forwarded.begin(), forwarded.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  throw std::runtime_error(fmt::format(
      "ckpt-bench runs in Python with PyTorch (the module nvio.ckpt_bench): cannot start "
      "'{}': {} (set NVIO_PYTHON to the interpreter that has torch and nvio)",
      python, std::strerror(errno)));
}

}  // namespace nvio_cli
