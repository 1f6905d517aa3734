// `nvio`: command-line front end of the nvio library.
//
// Exit codes: 0 success, 1 failure (I/O error, failed verification), 2 bad arguments. Every error
// is one line on stderr starting "nvio: error:"; no exception escapes main, so nothing aborts.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cli.hpp"
#include "nvio/errors.hpp"
#include "nvio/system.hpp"
#include "nvio/warnings.hpp"

namespace {

// Errors must stay on one line so scripts can grep them; CLI11 and nested messages may not.
std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

void print_error(const std::string& message) {
  std::fprintf(stderr, "nvio: error: %s\n", one_line(message).c_str());
}

// The library never prints; its warnings (mlock refused, O_DIRECT unsupported) come here.
void install_warning_sink() {
  nvio::set_warning_sink([](const std::string& message) {
    std::fprintf(stderr, "nvio: warning: %s\n", one_line(message).c_str());
  });
}

int run(int argc, char** argv) {
  // Everything after `ckpt-bench` is the Python module's, as typed (`--`, --help and all).
  if (argc >= 2 && std::string(argv[1]) == "ckpt-bench") {
    nvio_cli::run_ckpt_bench(std::vector<std::string>(argv + 2, argv + argc));
  }
  CLI::App app{"nvio: move buffers between memory and files on NVMe at device speed", "nvio"};
  app.set_version_flag("--version", std::string("nvio ") + nvio::version());
  // At most one; "none" is checked after parsing so that `nvio --bogus` names --bogus.
  app.require_subcommand(0, 1);

  nvio_cli::BenchArgs bench_args;
  CLI::App* bench = app.add_subcommand("bench", "Write and/or read a scratch file and report GB/s");
  nvio_cli::add_bench_options(*bench, bench_args);

  nvio_cli::ReportArgs report_args;
  CLI::App* report =
      app.add_subcommand("report", "Show engines, direct-I/O support, limits and options");
  nvio_cli::add_report_options(*report, report_args);

  nvio_cli::TuneArgs tune_args;
  CLI::App* tune = app.add_subcommand(
      "tune", "Search for the fastest options for a directory's drive; --save makes them default");
  nvio_cli::add_tune_options(*tune, tune_args);

  nvio_cli::DsIoArgs ds_io_args;
  CLI::App* ds_io = app.add_subcommand(
      "ds-io", "DeepSpeed's ds_io flags, run as nvio bench (see docs/deepnvme.md)");
  nvio_cli::add_ds_io_options(*ds_io, ds_io_args);

  nvio_cli::DsTuneArgs ds_tune_args;
  CLI::App* ds_tune = app.add_subcommand(
      "ds-nvme-tune",
      "DeepSpeed's ds_nvme_tune flags, run as nvio tune; prints the \"aio\" config block");
  nvio_cli::add_ds_nvme_tune_options(*ds_tune, ds_tune_args);

  nvio_cli::EvictArgs evict_args;
  CLI::App* evict = app.add_subcommand(
      "evict", "Write back and drop files from the page cache, so the next read is the drive's");
  nvio_cli::add_evict_options(*evict, evict_args);

  // Listed in --help only: run() hands `nvio ckpt-bench ARGS` to Python before parsing.
  app.add_subcommand(
      "ckpt-bench",
      "Save and load a synthetic training checkpoint with nvio and with PyTorch (runs the Python "
      "module nvio.ckpt_bench; --help there)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(e.what());
    return nvio_cli::kExitUsage;
  }
  if (bench->parsed()) return nvio_cli::run_bench(bench_args);
  if (report->parsed()) return nvio_cli::run_report(report_args);
  if (tune->parsed()) return nvio_cli::run_tune(tune_args);
  if (evict->parsed()) return nvio_cli::run_evict(evict_args);
  if (ds_io->parsed()) return nvio_cli::run_ds_io(ds_io_args);
  if (ds_tune->parsed()) return nvio_cli::run_ds_nvme_tune(ds_tune_args);
  throw nvio_cli::UsageError(
      "a subcommand is required: bench, tune, report, evict, ds-io, ds-nvme-tune or ckpt-bench "
      "(see nvio --help)");
}

}  // namespace

int nvio_cli::report_current_exception() {
  try {
    throw;
  } catch (const nvio::Interrupted& e) {
    const int sig = nvio_cli::stop_signal();
    if (sig == 0) {
      print_error(e.what());
      return nvio_cli::kExitFailure;
    }
    print_error(fmt::format("stopped by {} before the end; its scratch files are removed",
                            ::sigabbrev_np(sig) != nullptr
                                ? std::string("SIG") + ::sigabbrev_np(sig)
                                : fmt::format("signal {}", sig)));
    nvio_cli::end_by_signal(sig);
    return 128 + sig;  // only if the signal is blocked
  } catch (const nvio_cli::UsageError& e) {
    print_error(e.what());
    return nvio_cli::kExitUsage;
  } catch (const nvio::InvalidArgument& e) {
    print_error(e.what());
    return nvio_cli::kExitUsage;
  } catch (const std::exception& e) {  // nvio::Error (I/O, engine, memory), filesystem, bad_alloc
    print_error(e.what());
    return nvio_cli::kExitFailure;
  } catch (...) {
    print_error("unexpected internal error");
    return nvio_cli::kExitFailure;
  }
}

// The results went to stdout through stdio's buffer: a full disk or a closed pipe under it shows
// only at the flush. A run whose output was lost has failed, whatever it measured.
int check_output(int code) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && std::ferror(stdout) == 0) return code;
  // An earlier write may have failed with the flush succeeding: its errno is gone by now.
  print_error(fmt::format("writing the output failed: {}",
                          !flushed && err != 0 ? std::strerror(err) : "a write to stdout failed"));
  return code == nvio_cli::kExitOk ? nvio_cli::kExitFailure : code;
}

int main(int argc, char** argv) {
  install_warning_sink();
  int code = nvio_cli::kExitOk;
  try {
    code = run(argc, argv);
  } catch (...) {
    code = nvio_cli::report_current_exception();
  }
  return check_output(code);
}
