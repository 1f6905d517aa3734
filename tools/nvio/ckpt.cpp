// `nvio ckpt-bench`: checkpoint save and load against PyTorch. It needs PyTorch, so it is the
// Python module nvio.ckpt_bench; this subcommand replaces the process with that module run by
// Python (choose_python), so that exit status, signals and the terminal are the module's own. Every
// argument after `ckpt-bench` is the module's, passed on as typed (main() hands them over before
// its own parser sees them).
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
// Where `cmake --install` puts the package, relative to the installed program (python/CMakeLists).
#ifdef NVIO_INSTALLED_PYTHON
constexpr const char* kInstalledPython = NVIO_INSTALLED_PYTHON;
#else
constexpr const char* kInstalledPython = "";
#endif

// Which Python runs the module, and what it needs on PYTHONPATH, by where this program lies:
// - in a build tree (build/bin/nvio): the Python of the build, with build/python, where the
//   package is and no Python looks by itself;
// - bundled in an installed package (…/lib/pythonX.Y/site-packages/nvio/_bin/nvio): the
//   interpreter of that installation (…/bin/pythonX.Y: a venv's own), which has the package on
//   its path already (putting site-packages on PYTHONPATH would put it ahead of the standard
//   library); that interpreter missing, the Python of the build with site-packages on PYTHONPATH;
// - installed by cmake (PREFIX/bin/nvio): the Python of the build, with the package that
//   cmake --install put under PREFIX/lib/pythonX.Y/site-packages (NVIO_INSTALLED_PYTHON, relative
//   to the program) when it is there;
// - anywhere else: the Python of the build, finding the package itself.
// NVIO_PYTHON names the interpreter in every case.
struct PythonChoice {
  std::string interpreter = kDefaultPython;
  std::string path;  // prepended to PYTHONPATH when not empty
};

PythonChoice choose_python() {
  PythonChoice choice;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path dir = exe.parent_path();
    const std::filesystem::path package = dir.parent_path();
    if (dir.filename() == "bin" &&
        std::filesystem::is_regular_file(package / "python" / "nvio" / "ckpt_bench.py", ec)) {
      choice.path = (package / "python").string();
    } else if (dir.filename() == "_bin" && package.filename() == "nvio" &&
               std::filesystem::is_regular_file(package / "ckpt_bench.py", ec)) {
      const std::filesystem::path site = package.parent_path();
      const std::filesystem::path lib = site.parent_path();  // …/lib/pythonX.Y
      const std::filesystem::path own = lib.parent_path().parent_path() / "bin" / lib.filename();
      if (::access(own.c_str(), X_OK) == 0) {
        choice.interpreter = own.string();
      } else {
        choice.path = site.string();
      }
    } else if (*kInstalledPython != '\0' &&
               std::filesystem::is_regular_file(dir / kInstalledPython / "nvio" / "ckpt_bench.py",
                                                ec)) {
      choice.path = (dir / kInstalledPython).lexically_normal().string();
    }
  }
  if (const char* named = std::getenv("NVIO_PYTHON"); named != nullptr && *named != '\0') {
    choice.interpreter = named;
  }
  return choice;
}

}  // namespace

void run_ckpt_bench(const std::vector<std::string>& forwarded) {
  const PythonChoice choice = choose_python();
  const std::string& python = choice.interpreter;
  if (!choice.path.empty()) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = old != nullptr && *old != '\0' ? choice.path + ":" + old : choice.path;
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
