// `nvio bench --procs N` / `--device-map DIR:ORDINAL ...`: several processes, each with its own
// handle and file, timed together.
//
// The parent forks the processes before it has created a handle or touched a GPU (CUDA does not
// survive a fork, so each process initialises its own). Each process runs the ordinary bench with
// its own file (--file F: F.<rank>; --dir or a map entry's DIR: a scratch file each), prepares it
// (opens, allocates, writes what a read-only run needs), and then starts every timed loop behind
// a barrier that the parent runs over pipes. It prints its result as JSON on a pipe, with each
// loop's start and end on the monotonic clock that all processes share; the aggregate of a loop is
// the bytes of all processes over the span from the earliest start to the latest end.
//
// A process that fails or dies closes its pipes, which ends the barrier: the parent stops the
// others (SIGTERM, which removes their scratch files) and reports the first failure with the
// process's own message, never waiting on a barrier that cannot complete.
#include "procs.hpp"

#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "nvio/errors.hpp"
#include "nvio/options.hpp"
#include "nvio/system.hpp"
#include "nvio/tune.hpp"

namespace nvio_cli {

namespace {

constexpr char kReady = 'R';
constexpr char kGo = 'G';

[[noreturn]] void throw_errno(const char* what) {
  throw nvio::Error(fmt::format("nvio bench --procs: {}: {}", what, std::strerror(errno)));
}

}  // namespace

void LoopGate::wait() const {
  const char ready = kReady;
  for (;;) {
    const ssize_t n = ::write(ready_fd_, &ready, 1);
    if (n == 1) break;
    if (n < 0 && errno == EINTR) continue;
    throw nvio::Error("the nvio process that started this one is gone (its barrier pipe closed)");
  }
  for (;;) {
    char go = 0;
    const ssize_t n = ::read(go_fd_, &go, 1);
    if (n == 1 && go == kGo) return;
    if (n < 0 && errno == EINTR) continue;
    throw nvio::Error("the nvio process that started this one is gone (its barrier pipe closed)");
  }
}

void add_procs_options(CLI::App& app, BenchArgs& args) {
  app.add_option("--procs", args.procs,
                 "Run N processes at once, each with its own handle and file (--file F: F.0, "
                 "F.1, ...; --dir: a scratch file each), every timed loop starting behind a "
                 "barrier of all of them; prints each process's results and the aggregate (per "
                 "loop: all bytes / (latest end - earliest start))")
      ->type_name("N");
  app.add_option("--device-map", args.device_map,
                 "DIR:ORDINAL, repeatable: one process per entry, with its scratch file in DIR "
                 "and, with --gpu, its buffer on GPU ORDINAL (ds_io's "
                 "--folder_to_device_mapping); instead of --dir, --file and --device")
      ->type_name("DIR:N");
}

bool wants_procs(const BenchArgs& args) {
  return !args.role && (args.procs || !args.device_map.empty());
}

namespace {

struct MapEntry {
  std::string dir;
  unsigned ordinal = 0;
};

// "DIR:ORDINAL", split at the last colon so that a directory may hold one.
MapEntry parse_map_entry(const std::string& text) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw UsageError(
        fmt::format("--device-map: expected DIR:ORDINAL (e.g. /mnt/nvme0:0), got '{}'", text));
  }
  MapEntry e;
  e.dir = text.substr(0, colon);
  const std::string ordinal = text.substr(colon + 1);
  const std::size_t value = nvio::parse_count(ordinal, "--device-map");
  if (value > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw UsageError(
        fmt::format("--device-map: GPU ordinal {} in '{}' is out of range", ordinal, text));
  }
  e.ordinal = static_cast<unsigned>(value);
  return e;
}

// The arguments of each process: the user's, with its own file or directory and device.
std::vector<BenchArgs> process_args(const BenchArgs& args) {
  if (args.h2d_only) throw UsageError("--procs and --device-map need file I/O (not --h2d-only)");
  if (args.dirs.size() > 1) {
    throw UsageError("--procs and --device-map take one --dir (each process its own file there)");
  }
  std::vector<MapEntry> map;
  for (const std::string& text : args.device_map) map.push_back(parse_map_entry(text));
  std::size_t count = map.size();
  if (args.procs) {
    const std::size_t procs = nvio::parse_count(*args.procs, "--procs");
    if (procs == 0 || procs > kMaxProcs) {
      throw UsageError(
          fmt::format("--procs: expected 1 to {} processes, got {}", kMaxProcs, *args.procs));
    }
    if (!map.empty() && procs != map.size()) {
      throw UsageError(fmt::format(
          "--procs {} disagrees with --device-map, which gives {} processes (one per entry)", procs,
          map.size()));
    }
    count = procs;
  }
  if (!map.empty()) {
    if (!args.dirs.empty() || args.file) {
      throw UsageError("--device-map gives each process its directory: not with --dir or --file");
    }
    if (args.device != "0") {
      throw UsageError("--device-map gives each process its GPU: not with --device");
    }
    if (!args.gpu) {
      std::fprintf(stderr,
                   "nvio: note: --device-map without --gpu moves host memory: each process uses "
                   "its DIR, and the GPU ordinals are not used\n");
    }
  }
  std::vector<BenchArgs> out;
  for (std::size_t rank = 0; rank < count; ++rank) {
    BenchArgs a = args;
    a.procs.reset();
    a.device_map.clear();
    if (!map.empty()) {
      a.dirs = {map[rank].dir};
      a.device = std::to_string(map[rank].ordinal);
    }
    if (a.file) *a.file += "." + std::to_string(rank);
    a.json = true;
    a.role = BenchArgs::ProcRole{static_cast<unsigned>(rank), -1, -1};
    out.push_back(std::move(a));
  }
  return out;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Takes a descriptor out of its owner, which will then not close it.
int take(int& fd) {
  const int out = fd;
  fd = -1;
  return out;
}

// A pipe whose ends are closed on destruction unless taken.
struct Pipe {
  int read = -1;
  int write = -1;
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("pipe");
    read = fds[0];
    write = fds[1];
  }
  ~Pipe() {
    close_fd(read);
    close_fd(write);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
};

// The parent's view of one process: its pid and the parent's ends of its pipes.
struct Process {
  unsigned rank = 0;
  pid_t pid = -1;
  std::string where;  // its file or directory, for messages
  int ctl = -1;       // "ready" bytes from the process
  int go = -1;        // "go" bytes to it
  int out = -1;       // its stdout: the result as JSON
  int err = -1;       // its stderr: warnings and its error line
  std::string out_text;
  std::string err_text;
  // The scratch file it writes, which it cannot remove itself if it is killed (SIGKILL).
  std::optional<std::string> scratch;
  unsigned waiting = 0;  // "ready" bytes not yet answered
  bool reaped = false;
  int status = 0;

  bool succeeded() const { return reaped && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  void close_all() {
    close_fd(ctl);
    close_fd(go);
    close_fd(out);
    close_fd(err);
  }
};

// Owns the processes: on every way out, stops (SIGTERM) and reaps those still running, so that
// none outlives the run and no zombie is left.
class Processes {
 public:
  Processes() = default;
  Processes(const Processes&) = delete;
  Processes& operator=(const Processes&) = delete;
  ~Processes() {
    for (Process& p : list) {
      if (!p.reaped && p.pid > 0) {
        ::kill(p.pid, SIGTERM);
        reap(p);
      }
      p.close_all();
    }
  }
  static void reap(Process& p) {
    while (::waitpid(p.pid, &p.status, 0) < 0 && errno == EINTR) {
    }
    p.reaped = true;
    if (WIFSIGNALED(p.status) && p.scratch) ::unlink(p.scratch->c_str());
  }
  void stop_others(const Process& failed) {
    for (Process& p : list) {
      if (&p != &failed && !p.reaped) ::kill(p.pid, SIGTERM);
    }
  }
  std::vector<Process> list;
};

// In the forked process: keep only its own pipe ends, on fds 1 and 2 and in its role, and run
// the ordinary bench. Never returns.
[[noreturn]] void run_process(BenchArgs& args, Pipe& ctl, Pipe& go, Pipe& out, Pipe& err,
                              Processes& earlier) {
  for (Process& p : earlier.list) p.close_all();
  close_fd(ctl.read);
  close_fd(go.write);
  close_fd(out.read);
  close_fd(err.read);
  if (::dup2(out.write, STDOUT_FILENO) < 0 || ::dup2(err.write, STDERR_FILENO) < 0) ::_exit(1);
  close_fd(out.write);
  close_fd(err.write);
  args.role->ready_fd = take(ctl.write);
  args.role->go_fd = take(go.read);
  int code = kExitFailure;
  try {
    code = run_bench(args);
  } catch (...) {
    code = report_current_exception();
  }
  std::fflush(nullptr);
  ::_exit(code);
}

void start(std::vector<BenchArgs>& args, Processes& procs) {
  std::fflush(nullptr);  // or the children would print the parent's buffered output again
  for (BenchArgs& a : args) {
    Pipe ctl, go, out, err;
    // A --file F.<rank> missing now is the process's own, to remove if it is killed; one that
    // exists is the user's and stays.
    const bool new_file = a.file && !a.keep && ::access(a.file->c_str(), F_OK) != 0;
    const pid_t pid = ::fork();
    if (pid < 0) throw_errno("fork");
    if (pid == 0) run_process(a, ctl, go, out, err, procs);
    Process p;
    p.rank = a.role->rank;
    p.pid = pid;
    p.where = a.file ? *a.file : "--dir " + (a.dirs.empty() ? std::string("?") : a.dirs.front());
    if (!a.file && !a.dirs.empty() && !a.keep) p.scratch = scratch_path(a.dirs.front(), pid);
    if (new_file) p.scratch = *a.file;
    p.ctl = take(ctl.read);
    p.go = take(go.write);
    p.out = take(out.read);
    p.err = take(err.read);
    for (int fd : {p.ctl, p.out, p.err}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    procs.list.push_back(std::move(p));
  }
}

// Reads what is there; returns false at end-of-file.
bool drain(int fd, std::string& into) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    if (errno == EAGAIN) return true;
    return false;  // a broken pipe is an end too; the exit status says what happened
  }
}

// The first failure seen, and how the barrier broke, if it did.
struct Failure {
  const Process* process = nullptr;
  std::string note;  // set when the failure is the parent's finding, not the process's exit
};

void release_barrier(Processes& procs) {
  for (const Process& p : procs.list) {
    if (p.ctl < 0 || p.waiting == 0) return;
  }
  for (Process& p : procs.list) {
    --p.waiting;
    const char go = kGo;
    // A process that died since it said ready is found by its end-of-file; nothing to do here.
    while (::write(p.go, &go, 1) < 0 && errno == EINTR) {
    }
  }
}

// Runs the barriers until every process has ended; returns the first failure.
std::optional<Failure> supervise(Processes& procs) {
  std::optional<Failure> failure;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Process*, int*>> owners;
    for (Process& p : procs.list) {
      for (int* fd : {&p.ctl, &p.out, &p.err}) {
        if (*fd < 0) continue;
        fds.push_back({*fd, POLLIN, 0});
        owners.emplace_back(&p, fd);
      }
    }
    if (fds.empty()) break;
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw_errno("poll");
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [p, fd] = owners[i];
      if (fd == &p->ctl) {
        std::string bytes;
        const bool open = drain(p->ctl, bytes);
        p->waiting += static_cast<unsigned>(std::count(bytes.begin(), bytes.end(), kReady));
        if (!open) close_fd(p->ctl);
      } else if (!drain(*fd, fd == &p->out ? p->out_text : p->err_text)) {
        close_fd(*fd);
      }
    }
    for (Process& p : procs.list) {
      // Its end of the barrier pipe is closed only by its exit.
      if (p.ctl >= 0 || p.reaped) continue;
      Processes::reap(p);
      if (failure) continue;
      if (!p.succeeded()) {
        failure = Failure{&p, {}};
      } else {
        for (const Process& q : procs.list) {
          if (q.waiting > 0) {
            failure = Failure{&q, fmt::format("waits at a loop barrier that process {} "
                                              "finished without reaching",
                                              p.rank)};
          }
        }
      }
      if (failure) procs.stop_others(*failure->process);
    }
    if (!failure) release_barrier(procs);
  }
  for (Process& p : procs.list) {
    if (!p.reaped) Processes::reap(p);
  }
  return failure;
}

// The process's own account of its failure: its last "nvio: error:" line, or its last line.
std::string message_of(const Process& p) {
  std::vector<std::string> lines;
  std::size_t at = 0;
  while (at < p.err_text.size()) {
    std::size_t end = p.err_text.find('\n', at);
    if (end == std::string::npos) end = p.err_text.size();
    if (end > at) lines.push_back(p.err_text.substr(at, end - at));
    at = end + 1;
  }
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (it->rfind("nvio: error: ", 0) == 0) return it->substr(13);
  }
  if (lines.empty()) return "no message";
  const std::string& last = lines.back();
  return last.rfind("nvio: ", 0) == 0 ? last.substr(6) : last;
}

[[noreturn]] void raise_failure(const Failure& f, std::size_t count) {
  const Process& p = *f.process;
  std::string how;
  if (!f.note.empty()) {
    how = f.note;
  } else if (WIFSIGNALED(p.status)) {
    const int sig = WTERMSIG(p.status);
    how = fmt::format("was killed by signal {} ({})", sig, ::strsignal(sig));
  } else {
    how = fmt::format("failed with exit code {}: {}", WEXITSTATUS(p.status), message_of(p));
  }
  const std::string text =
      fmt::format("process {} of {} (pid {}, {}) {}", p.rank, count, p.pid, p.where, how);
  if (f.note.empty() && WIFEXITED(p.status) && WEXITSTATUS(p.status) == kExitUsage) {
    throw UsageError(text);
  }
  throw nvio::Error(text);
}

// The warnings and notes of the processes, each line naming its process.
void forward_messages(const Processes& procs) {
  for (const Process& p : procs.list) {
    std::size_t at = 0;
    while (at < p.err_text.size()) {
      std::size_t end = p.err_text.find('\n', at);
      if (end == std::string::npos) end = p.err_text.size();
      std::string line = p.err_text.substr(at, end - at);
      at = end + 1;
      if (line.empty()) continue;
      if (line.rfind("nvio: ", 0) == 0) line = line.substr(6);
      std::fprintf(stderr, "nvio: process %u: %s\n", p.rank, line.c_str());
    }
  }
}

// ---- the aggregate ------------------------------------------------------------------------------

using nvio::median;

// The bytes a process moved in loop i of a result: the buffer, or a random loop's blocks.
double loop_bytes(const nlohmann::json& r, std::size_t i) {
  if (r.contains("ops_all")) {
    return r["ops_all"][i].get<double>() * r["block_bytes"].get<double>();
  }
  return r["bytes"].get<double>();
}

// Per operation (write, read): per loop, every process's bytes over the span from the earliest
// start to the latest end; medians over loops.
nlohmann::json aggregate(const std::vector<nlohmann::json>& docs) {
  nlohmann::json out = nlohmann::json::array();
  const nlohmann::json& first = docs.front()["results"];
  for (std::size_t k = 0; k < first.size(); ++k) {
    const std::size_t loops = first[k]["start_ns_all"].size();
    std::vector<double> seconds, gbps, skew, bytes;
    std::optional<bool> verified;
    for (const nlohmann::json& d : docs) {
      const nlohmann::json& r = d["results"];
      if (r.size() != first.size() || r[k]["op"] != first[k]["op"] ||
          r[k]["start_ns_all"].size() != loops) {
        throw nvio::Error("nvio bench --procs: the processes' results do not line up");
      }
      if (!r[k]["verified"].is_null()) {
        verified = verified.value_or(true) && r[k]["verified"].get<bool>();
      }
    }
    for (std::size_t i = 0; i < loops; ++i) {
      std::int64_t start = std::numeric_limits<std::int64_t>::max();
      std::int64_t last_start = std::numeric_limits<std::int64_t>::min();
      std::int64_t end = std::numeric_limits<std::int64_t>::min();
      double total = 0;
      for (const nlohmann::json& d : docs) {
        const nlohmann::json& r = d["results"][k];
        const auto s = r["start_ns_all"][i].get<std::int64_t>();
        start = std::min(start, s);
        last_start = std::max(last_start, s);
        end = std::max(end, r["end_ns_all"][i].get<std::int64_t>());
        total += loop_bytes(r, i);
      }
      const double span = static_cast<double>(end - start) / 1e9;
      seconds.push_back(span);
      gbps.push_back(span > 0 ? total / span / 1e9 : 0.0);
      skew.push_back(static_cast<double>(last_start - start) / 1e9);
      bytes.push_back(total);
    }
    const double s = median(seconds);
    const double b = median(bytes);
    // From the row's own bytes and seconds, so that the figures printed agree (the median of the
    // loops' rates is not the rate of the median loop when their count is even).
    const double rate = s > 0 ? b / s : 0.0;
    out.push_back({{"op", first[k]["op"]},
                   {"processes", docs.size()},
                   {"bytes", static_cast<std::uint64_t>(b)},
                   {"seconds", s},
                   {"gb_per_s", rate / 1e9},
                   {"gib_per_s", rate / (1024.0 * 1024 * 1024)},
                   {"loops", loops},
                   {"seconds_all", seconds},
                   {"gb_per_s_all", gbps},
                   {"start_skew_s_all", skew},
                   {"verified", verified ? nlohmann::json(*verified) : nlohmann::json(nullptr)}});
  }
  return out;
}

std::string verified_text(const nlohmann::json& v) {
  return v.is_null() ? "-" : (v.get<bool>() ? "yes" : "NO");
}

void print_table(const nlohmann::json& doc) {
  const nlohmann::json& procs = doc["processes"];
  const nlohmann::json& p0 = procs.front();
  std::string options;
  for (const auto& [name, value] : p0["options"].items()) {
    options += fmt::format("{}{} {}", options.empty() ? "" : ", ", name,
                           value.is_string() ? value.get<std::string>() : value.dump());
  }
  fmt::print(
      "nvio bench: {} processes, {} ({} bytes) {} each, {} loop(s); every timed loop starts "
      "behind a barrier of all processes\n",
      procs.size(), human_bytes(p0["size"].get<unsigned long long>()),
      p0["size"].get<unsigned long long>(), p0["pattern"].get<std::string>(),
      p0["results"].front()["loops"].get<std::size_t>());
  fmt::print("options (process 0): {}\n", options);
  fmt::print(
      "GB/s = 1e9 bytes/s, GiB/s = 2^30 bytes/s; a process's seconds are medians over loops; "
      "\"all\": per loop, every process's bytes / (latest end - earliest start), medians over "
      "loops\n\n");
  fmt::print("{:<5} {:>8} {:<6} {:<9} {:>14} {:>10} {:>9} {:>9} {:>9}  {}\n", "proc", "pid", "op",
             "engine", "bytes", "seconds", "GB/s", "GiB/s", "verified", "file");
  for (const nlohmann::json& p : procs) {
    for (const nlohmann::json& r : p["results"]) {
      fmt::print("{:<5} {:>8} {:<6} {:<9} {:>14} {:>10.4f} {:>9.3f} {:>9.3f} {:>9}  {}\n",
                 p["rank"].get<unsigned>(), p["pid"].get<long>(), r["op"].get<std::string>(),
                 r["engine"].get<std::string>(), r["bytes"].get<std::uint64_t>(),
                 r["seconds"].get<double>(), r["gb_per_s"].get<double>(),
                 r["gib_per_s"].get<double>(), verified_text(r["verified"]),
                 p["file"].get<std::string>());
    }
  }
  for (const nlohmann::json& a : doc["aggregate"]) {
    fmt::print(
        "{:<5} {:>8} {:<6} {:<9} {:>14} {:>10.4f} {:>9.3f} {:>9.3f} {:>9}  start skew "
        "{:.3f} ms (median)\n",
        "all", "", a["op"].get<std::string>(), "", a["bytes"].get<std::uint64_t>(),
        a["seconds"].get<double>(), a["gb_per_s"].get<double>(), a["gib_per_s"].get<double>(),
        verified_text(a["verified"]),
        median(a["start_skew_s_all"].get<std::vector<double>>()) * 1e3);
  }
}

}  // namespace

int run_bench_procs(const BenchArgs& args) {
  std::vector<BenchArgs> each = process_args(args);
  // A process that dies must not take the parent with it when the parent writes its "go" byte.
  struct IgnoreSigpipe {
    IgnoreSigpipe() : old(std::signal(SIGPIPE, SIG_IGN)) {}
    ~IgnoreSigpipe() { std::signal(SIGPIPE, old); }
    IgnoreSigpipe(const IgnoreSigpipe&) = delete;
    IgnoreSigpipe& operator=(const IgnoreSigpipe&) = delete;
    void (*old)(int);
  } ignore_sigpipe;
  Processes procs;
  start(each, procs);
  const std::optional<Failure> failure = supervise(procs);
  if (failure) raise_failure(*failure, procs.list.size());

  std::vector<nlohmann::json> docs;
  for (const Process& p : procs.list) {
    nlohmann::json d = nlohmann::json::parse(p.out_text, nullptr, false);
    if (d.is_discarded() || !d.is_object() || !d.contains("results")) {
      throw nvio::Error(fmt::format(
          "process {} (pid {}) exited 0 but printed no result: nvio bench --procs needs the "
          "same nvio build in every process",
          p.rank, p.pid));
    }
    d["rank"] = p.rank;
    d["pid"] = p.pid;
    docs.push_back(std::move(d));
  }
  forward_messages(procs);
  nlohmann::json doc = {{"procs", docs.size()},
                        {"processes", docs},
                        {"aggregate", aggregate(docs)},
                        {"version", nvio::version()}};
  if (args.json) {
    fmt::print("{}\n", doc.dump(2));
  } else {
    print_table(doc);
  }
  return kExitOk;
}

}  // namespace nvio_cli
