// The helpers every binding file shares (common.hpp): text, the GIL and signals, library warnings,
// and the converters of buffers, files, offsets and options.
#include "common.hpp"

#include <pybind11/stl.h>

#include <atomic>
#include <deque>
#include <limits>
#include <mutex>

#include "bindings.hpp"
#include "nvio/fork.hpp"

namespace nvio_py {
namespace {

// Library warnings may be raised on worker threads that do not hold the GIL; they are queued here
// and delivered by the next binding call on a Python thread.
std::mutex g_warnings_mutex;
std::deque<std::string> g_warnings;
// Set when g_warnings may hold a message, so that a binding call with nothing to deliver (every
// I/O call, thousands a second) does not take the mutex.
std::atomic<bool> g_warnings_queued{false};

// Held across fork() so that a child never inherits it locked by a worker thread of the parent;
// ranked after the core's warning mutex, under which the sink takes it (nvio/fork.hpp).
[[maybe_unused]] const bool g_warnings_held_across_fork =
    (nvio::hold_across_fork(g_warnings_mutex, nvio::ForkRank::WarningSink), true);

// The thread the interpreter runs signal handlers on (threading.main_thread()): set at import and
// again in a forked child, whose main thread is the one that forked.
std::atomic<unsigned long> g_main_thread{0};

}  // namespace

py::str message_text(const std::string& s) {
  PyObject* o =
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "backslashreplace");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::str path_text(const std::string& s) {
  PyObject* o = PyUnicode_DecodeFSDefaultAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

void deliver_warnings() {
  if (!g_warnings_queued.load(std::memory_order_acquire)) return;
  std::deque<std::string> pending;
  {
    std::lock_guard lock(g_warnings_mutex);
    pending.swap(g_warnings);
    g_warnings_queued.store(false, std::memory_order_relaxed);
  }
  for (const auto& msg : pending) {
    if (PyErr_WarnEx(PyExc_RuntimeWarning, ("nvio: " + msg).c_str(), 2) != 0) {
      throw py::error_already_set();
    }
  }
}

bool on_main_thread() { return PyThread_get_thread_ident() == g_main_thread.load(); }

bool SignalCheck::interrupted() noexcept {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return false;
  fired_ = true;
  try {
    raised_.emplace();  // takes the handler's exception from the thread's error indicator
  } catch (...) {       // out of memory: the call still stops, with KeyboardInterrupt
    PyErr_Clear();
  }
  return true;
}

void SignalCheck::raise() {
  if (raised_) throw py::error_already_set(*raised_);
  PyErr_SetNone(PyExc_KeyboardInterrupt);
  throw py::error_already_set();
}

void bind_runtime(py::module_& /*m*/) {
  g_main_thread =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  // A child forked by a thread other than the main one runs its handlers on that thread.
  py::module_::import("os").attr("register_at_fork")(
      py::arg("after_in_child") =
          py::cpp_function([] { g_main_thread = PyThread_get_thread_ident(); }));
  nvio::set_warning_sink([](const std::string& msg) {
    std::lock_guard lock(g_warnings_mutex);
    g_warnings.push_back(msg);
    g_warnings_queued.store(true, std::memory_order_release);
  });
}

py::buffer_info contiguous_buffer(const py::buffer& obj) {
  py::buffer_info info = obj.request();
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected) {
      throw nvio::InvalidArgument(
          "the buffer is not contiguous; pass a contiguous copy (e.g. .contiguous() or "
          "numpy.ascontiguousarray) and copy back after reading");
    }
    expected *= info.shape[d];
  }
  return info;
}

std::uint64_t checked_offset(long long offset) {
  if (offset < 0) {
    throw nvio::InvalidArgument("file_offset must not be negative, got " + std::to_string(offset));
  }
  return static_cast<std::uint64_t>(offset);
}

nvio::MemoryKind memory_of(bool device) {
  return device ? nvio::MemoryKind::Device : nvio::MemoryKind::Host;
}

nvio::ReadOptions read_options(bool device) {
  nvio::ReadOptions r;
  r.memory = memory_of(device);
  return r;
}

nvio::WriteOptions write_options(bool truncate, bool sync, bool device) {
  nvio::WriteOptions w;
  w.memory = memory_of(device);
  w.truncate = truncate ? nvio::Truncate::AtEnd : nvio::Truncate::No;
  w.durability = sync ? nvio::Durability::Data : nvio::Durability::None;
  return w;
}

py::object to_python(const nvio::OptionValue& value) {
  return std::visit([](const auto& v) { return py::cast(v); }, value);
}

py::dict options_dict(const nvio::Options& o) {
  py::dict d;
  for (const nvio::OptionSpec& spec : nvio::option_specs())
    d[spec.name] = to_python(o.get(spec.name));
  return d;
}

py::dict stats_dict(const nvio::HandleStats& stats) {
  py::dict d;
  for (const nvio::HandleStatsField& f : nvio::handle_stats_fields()) d[f.name] = stats.*f.member;
  py::dict errors;
  for (const auto& [err, count] : stats.errors) errors[py::int_(err)] = count;
  d["errors"] = errors;
  return d;
}

nvio::OptionOverrides overrides(const py::kwargs& kwargs, std::string& config_dir) {
  nvio::OptionOverrides o;
  for (const auto& [key, value] : kwargs) {
    const std::string name = py::cast<std::string>(key);
    if (name == "config_dir") {
      config_dir = py::cast<std::string>(value);
      continue;
    }
    const nvio::OptionSpec& spec = nvio::option_spec(name);
    if (value.is_none()) continue;
    switch (spec.type) {
      case nvio::OptionType::Boolean: o.set_value(name, checked_boolean(value, key)); break;
      case nvio::OptionType::Integer: {
        const py::object n = checked_integer(value, key);
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(n.ptr(), &overflow);
        if (overflow != 0) {
          // Past 64 bits: the core's text parser refuses it, naming the option.
          o.set_text(name, py::str(n).cast<std::string>());
        } else {
          o.set_value(name, static_cast<std::int64_t>(v));
        }
        break;
      }
      case nvio::OptionType::Choice: o.set_value(name, checked_choice(value, key)); break;
    }
  }
  return o;
}

}  // namespace nvio_py
