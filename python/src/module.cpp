// nvio._nvio: the thin pybind11 layer over the C++ core. Buffers arrive here as (address, nbytes)
// pairs resolved by the pure-Python package (nvio/_buffers.py), which also keeps the Python
// objects alive for as long as an operation may touch them.
//
// GIL: every call that can block (file opens, I/O, waits, allocation) goes through `unlocked()`,
// the one helper that releases the GIL and afterwards turns queued library warnings into Python
// warnings, so no binding can forget either. Calls that wait for I/O pass Signals::Handle to it:
// on the main thread their waits then run Python's signal handlers (Ctrl-C), see SignalCheck.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "core/fork.hpp"
#include "jobs/replace_file.hpp"
#include "jobs/swap_pool.hpp"
#include "nvio/nvio.hpp"

namespace py = pybind11;

namespace {

// Library warnings may be raised on worker threads that do not hold the GIL; they are queued here
// and delivered by the next binding call on a Python thread.
std::mutex g_warnings_mutex;
std::deque<std::string> g_warnings;
// Set when g_warnings may hold a message, so that a binding call with nothing to deliver (every
// I/O call, thousands a second) does not take the mutex.
std::atomic<bool> g_warnings_queued{false};

// Held across fork() so that a child never inherits it locked by a worker thread of the parent;
// ranked after the core's warning mutex, under which the sink takes it (core/fork.hpp).
[[maybe_unused]] const bool g_warnings_held_across_fork =
    (nvio::detail::hold_across_fork(g_warnings_mutex, nvio::detail::ForkRank::WarningSink), true);

// Text from the core as a Python str. Messages and paths may hold bytes that are not UTF-8 (a
// file name is any bytes): a message keeps them readable as \xNN escapes, and a path decodes as
// os.fsdecode() does, so that it names the same file when handed back to os functions.
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

void set_error(PyObject* type, const std::string& what) {
  PyErr_SetObject(type, message_text(what).ptr());
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

// The thread the interpreter runs signal handlers on (threading.main_thread()): set at import and
// again in a forked child, whose main thread is the one that forked.
std::atomic<unsigned long> g_main_thread{0};

bool on_main_thread() { return PyThread_get_thread_ident() == g_main_thread.load(); }

// Runs Python's signal handlers for a main thread that waits in nvio without the GIL
// (nvio/interrupt.hpp): Python runs them only when the thread they belong to asks, so a Ctrl-C
// during a long read would otherwise be seen only when the read ends. Asked from the call's waits
// every kInterruptPeriod of its time; a handler that raises (KeyboardInterrupt) stops the wait,
// and its exception is kept to be raised once the call has cleaned up (a blocking call has
// cancelled its operations and waited for what the kernel held; a wait for tickets left them
// pending). Only ever installed on the main thread: the only one handlers run on, and the one
// that cannot be blocked here while the interpreter shuts down (taking the GIL then would end the
// thread in the middle of nvio). One per call, on its stack.
class SignalCheck final : public nvio::InterruptCheck {
 public:
  bool interrupted() noexcept override {
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
  // Whether a handler raised during the call.
  bool fired() const noexcept { return fired_; }
  // With the GIL held: raises what the handler raised.
  [[noreturn]] void raise() {
    if (raised_) throw py::error_already_set(*raised_);
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }

 private:
  std::optional<py::error_already_set> raised_;
  bool fired_ = false;
};

// Whether a call's waits run the signal handlers (SignalCheck): the calls that wait for I/O to
// finish. A call that only starts I/O, or that must see its operations to the end (draining in a
// finalizer), keeps them for when it returns.
enum class Signals { Keep, Handle };

// What a handler raised goes up however the call ended: Interrupted (it stopped the call), an
// error of its own, or a call that ran to its end anyway (every piece had started).
template <typename F>
auto unlocked(F&& f, Signals signals = Signals::Keep) -> decltype(f()) {
  SignalCheck check;
  std::optional<nvio::ScopedInterruptCheck> scope;
  try {
    if constexpr (std::is_void_v<decltype(f())>) {
      {
        py::gil_scoped_release release;
        if (signals == Signals::Handle && on_main_thread()) scope.emplace(check);
        f();
        scope.reset();
      }
      if (check.fired()) check.raise();
      deliver_warnings();
    } else {
      decltype(f()) result = [&] {
        py::gil_scoped_release release;
        if (signals == Signals::Handle && on_main_thread()) scope.emplace(check);
        auto r = f();
        scope.reset();
        return r;
      }();
      if (check.fired()) check.raise();
      deliver_warnings();
      return result;
    }
  } catch (const py::error_already_set&) {
    throw;  // raised here (the handler's) or by Python code the call ran
  } catch (...) {
    scope.reset();
    if (check.fired()) check.raise();
    throw;
  }
}

// Python exception types, created at import. Each nvio error type maps to a class that is also the
// matching built-in (FileNotFoundError, PermissionError, ...), so plain `except OSError` works.
struct PyErrors {
  PyObject* error;
  PyObject* invalid_argument;
  PyObject* engine_unavailable;
  PyObject* memory;
  PyObject* io;
  PyObject* not_found;
  PyObject* permission;
  PyObject* read_only;
  PyObject* is_directory;
  PyObject* no_space;
  PyObject* short_file;
  PyObject* gpu;
  PyObject* format;
  PyObject* checksum;
  PyObject* budget;
  PyObject* locked;
};
PyErrors g_errors;

PyObject* make_error(py::module_& m, const char* name, std::initializer_list<PyObject*> bases,
                     const char* doc) {
  py::tuple tuple(bases.size());
  std::size_t i = 0;
  for (PyObject* b : bases) tuple[i++] = py::reinterpret_borrow<py::object>(b);
  const std::string qualified = std::string("nvio.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, tuple.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(type));
  return type;
}

void raise_os_error(PyObject* type, const nvio::IoError& e) {
  py::object exc;
  const py::str path = path_text(e.path());
  if (e.error_code() != 0) {
    exc = py::reinterpret_borrow<py::object>(type)(e.error_code(), message_text(e.what()), path);
  } else {
    // No errno (e.g. a short file): OSError's filename would turn str() into "[Errno None]".
    exc = py::reinterpret_borrow<py::object>(type)(message_text(e.what()));
  }
  exc.attr("path") = path;
  exc.attr("offset") = e.offset();
  exc.attr("length") = e.length();
  exc.attr("operation") = nvio::to_string(e.op());
  if (const auto* sf = dynamic_cast<const nvio::ShortFile*>(&e)) {
    exc.attr("file_size") = sf->file_size();
  }
  PyErr_SetObject(type, exc.ptr());
}

void translate(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const nvio::ShortFile& e) {
    raise_os_error(g_errors.short_file, e);
  } catch (const nvio::FileNotFound& e) {
    raise_os_error(g_errors.not_found, e);
  } catch (const nvio::PermissionDenied& e) {
    raise_os_error(g_errors.permission, e);
  } catch (const nvio::ReadOnlyFileSystem& e) {
    raise_os_error(g_errors.read_only, e);
  } catch (const nvio::IsADirectory& e) {
    raise_os_error(g_errors.is_directory, e);
  } catch (const nvio::NoSpace& e) {
    raise_os_error(g_errors.no_space, e);
  } catch (const nvio::IoError& e) {
    raise_os_error(g_errors.io, e);
  } catch (const nvio::InvalidArgument& e) {
    py::object exc =
        py::reinterpret_borrow<py::object>(g_errors.invalid_argument)(message_text(e.what()));
    exc.attr("option") = e.option().empty() ? py::object(py::none()) : py::str(e.option());
    PyErr_SetObject(g_errors.invalid_argument, exc.ptr());
  } catch (const nvio::EngineUnavailable& e) {
    set_error(g_errors.engine_unavailable, e.what());
  } catch (const nvio::MemoryError& e) {
    set_error(g_errors.memory, e.what());
  } catch (const nvio::GpuError& e) {
    py::object exc = py::reinterpret_borrow<py::object>(g_errors.gpu)(message_text(e.what()));
    exc.attr("api") = e.api();
    exc.attr("code") = e.code();
    exc.attr("code_name") = e.code_name();
    exc.attr("path") = path_text(e.path());
    exc.attr("offset") = e.offset();
    exc.attr("length") = e.length();
    PyErr_SetObject(g_errors.gpu, exc.ptr());
  } catch (const nvio::ChecksumMismatch& e) {
    py::object exc = py::reinterpret_borrow<py::object>(g_errors.checksum)(message_text(e.what()));
    exc.attr("path") = path_text(e.path());
    exc.attr("problem") = message_text(e.problem());
    exc.attr("name") = message_text(e.name());
    exc.attr("offset") = e.offset();
    exc.attr("length") = e.length();
    exc.attr("expected") = e.expected();
    exc.attr("actual") = e.actual();
    PyErr_SetObject(g_errors.checksum, exc.ptr());
  } catch (const nvio::BudgetExceeded& e) {
    py::object exc = py::reinterpret_borrow<py::object>(g_errors.budget)(message_text(e.what()));
    exc.attr("needed") = e.needed();
    exc.attr("budget") = e.budget();
    exc.attr("held") = e.held();
    PyErr_SetObject(g_errors.budget, exc.ptr());
  } catch (const nvio::DirectoryLocked& e) {
    py::object exc = py::reinterpret_borrow<py::object>(g_errors.locked)(message_text(e.what()));
    exc.attr("path") = path_text(e.path());
    exc.attr("owner_pid") = e.owner_pid();
    PyErr_SetObject(g_errors.locked, exc.ptr());
  } catch (const nvio::FormatError& e) {
    py::object exc = py::reinterpret_borrow<py::object>(g_errors.format)(message_text(e.what()));
    exc.attr("path") = path_text(e.path());
    exc.attr("problem") = message_text(e.problem());
    PyErr_SetObject(g_errors.format, exc.ptr());
  } catch (const nvio::Error& e) {
    set_error(g_errors.error, e.what());
  }
}

// The Python exception object `error` becomes when raised (None for none). GIL held.
py::object error_object(const std::exception_ptr& error) {
  if (!error) return py::none();
  try {
    translate(error);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "nvio: an unknown C++ exception");
  }
  const py::error_already_set fetched;  // takes it from the thread's error indicator
  return fetched.value();
}

// The handle options among a call's keyword arguments, by the option table: None means "not
// given" (environment, configuration or default applies). Types were checked by nvio/_args.py; the
// core parses and range-checks each value, naming the option. `config_dir` is taken out first.
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
    if (py::isinstance<py::bool_>(value)) {
      o.set_value(name, value.cast<bool>());
    } else if (py::isinstance<py::int_>(value)) {
      std::int64_t v = 0;
      try {
        v = value.cast<std::int64_t>();
      } catch (const py::cast_error&) {
        // Past 64 bits: the core's text parser refuses it, naming the option.
        o.set_text(name, py::str(value).cast<std::string>());
        continue;
      }
      o.set_value(name, v);
    } else if (py::isinstance<py::str>(value)) {
      o.set_value(name, value.cast<std::string>());
    } else {
      nvio::reject_option_type(spec, py::repr(value).cast<std::string>(), name);
    }
  }
  return o;
}

// An option value as Python holds it (bool, int or str).
py::object to_python(const nvio::OptionValue& value) {
  return std::visit([](const auto& v) { return py::cast(v); }, value);
}

void* as_ptr(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

// The buffer's bytes, refused unless contiguous: C order with no gaps, the strides matching a dense
// row-major layout.
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

// Python always knows where a buffer lives (nvio/_buffers.py), so nothing is left to Auto.
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

// A file is named by a path or an open descriptor.
using Target = std::variant<std::string, int>;

// nvio/_args.py, the one place where files and offsets are checked and refused: the converters
// below take the plain cases (an int, a str or bytes path, as _args accepts them) without calling
// into Python, and hand it everything else, so any value it refuses is refused with its error.
// Imported on first use (nvio._args imports this module). Called with the GIL held.
py::handle args_module() {
  static py::handle module = py::module_::import("nvio._args").release();  // lives to the exit
  return module;
}

// The path as os.fsencode() gives it, when it needs no check beyond "non-empty, no NUL".
std::optional<std::string> plain_path(py::handle value) {
  py::object encoded;
  PyObject* bytes = value.ptr();
  if (PyUnicode_CheckExact(bytes)) {
    encoded = py::reinterpret_steal<py::object>(PyUnicode_EncodeFSDefault(bytes));
    if (!encoded) throw py::error_already_set();
    bytes = encoded.ptr();
  } else if (!PyBytes_CheckExact(bytes)) {
    return std::nullopt;
  }
  const std::string_view raw(PyBytes_AS_STRING(bytes),
                             static_cast<std::size_t>(PyBytes_GET_SIZE(bytes)));
  if (raw.empty() || raw.find('\0') != std::string_view::npos) return std::nullopt;
  return std::string(raw);
}

// A plain Python int within [lo, hi], else nullopt.
std::optional<long long> plain_integer(py::handle value, long long lo, long long hi) {
  if (!PyLong_CheckExact(value.ptr())) return std::nullopt;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0 || v < lo || v > hi) return std::nullopt;
  return v;
}

// `name` is the argument as _args names it in its error ("file", "filename", "offsets[3]"...).
Target to_target(py::handle value, py::handle name) {
  if (auto fd = plain_integer(value, 0, std::numeric_limits<int>::max())) {
    return static_cast<int>(*fd);
  }
  if (auto path = plain_path(value)) return std::move(*path);
  py::object checked = args_module().attr("file_target")(value, name);  // raises for a bad value
  if (PyLong_Check(checked.ptr())) return checked.cast<int>();
  return checked.cast<std::string>();
}

std::uint64_t to_offset(py::handle value, py::handle name) {
  if (auto v = plain_integer(value, 0, std::numeric_limits<long long>::max())) {
    return static_cast<std::uint64_t>(*v);
  }
  return args_module().attr("offset")(value, name).cast<std::uint64_t>();
}

// The file and offset of one of Handle's single calls, converted as given (`file_name` and
// `offset_name` name them in an error), then `call(path or descriptor, offset)` run without the
// GIL (`signals` as unlocked() takes it); returns what it returns.
template <typename Call>
auto on_target(py::handle file, py::handle offset, py::handle file_name, py::handle offset_name,
               Signals signals, Call&& call) {
  const Target target = to_target(file, file_name);
  const std::uint64_t off = to_offset(offset, offset_name);
  return unlocked([&] { return std::visit([&](const auto& t) { return call(t, off); }, target); },
                  signals);
}

py::dict options_dict(const nvio::Options& o) {
  py::dict d;
  for (const nvio::OptionSpec& spec : nvio::option_specs())
    d[spec.name] = to_python(o.get(spec.name));
  return d;
}

// Handle::stats() as a dict: the counters by name (nvio::handle_stats_fields), and "errors", a dict
// of failed operations by errno.
py::dict stats_dict(const nvio::HandleStats& stats) {
  py::dict d;
  for (const nvio::HandleStatsField& f : nvio::handle_stats_fields()) d[f.name] = stats.*f.member;
  py::dict errors;
  for (const auto& [err, count] : stats.errors) errors[py::int_(err)] = count;
  d["errors"] = errors;
  return d;
}

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

// The process's pool for locked buffers of 256 KiB to 2 MiB: slots of huge-page slabs, so that
// such a buffer is physically contiguous where the kernel gives huge pages. A buffer of its own
// that size is 4 KiB pages scattered in physical memory, and an O_DIRECT transfer into 1 MiB of
// them is 256 segments, which a virtio disk (254 at most) split into two requests: reads into
// 512 separate 1 MiB buffers ran at 1.33 GB/s against 2.61 into one huge-page buffer. No budget;
// at most 32 MiB of free slabs are kept for reuse (and of unused slots in slabs in use). Leaked
// (buffers may outlive the module) and its mutex held across fork (core/fork.hpp), since a forked
// child may allocate.
nvio::detail::SwapPool& locked_arena() {
  static auto* pool = [] {
    auto* p = new std::shared_ptr<nvio::detail::SwapPool>(std::make_shared<nvio::detail::SwapPool>(
        std::numeric_limits<std::uint64_t>::max(), nvio::LockMode::Try, std::uint64_t{32} << 20));
    (*p)->hold_across_fork();
    return p;
  }();
  return **pool;
}

// Owner of a locked, page-aligned host allocation exported through the buffer protocol, so torch
// and numpy can wrap it without a copy (the tensor or array keeps this object alive): a slot of
// locked_arena() for 256 KiB to 2 MiB, else a mapping of its own. Neither copied nor moved: its
// registration is keyed by the address it owns.
class LockedMemory {
 public:
  explicit LockedMemory(std::size_t nbytes) : nbytes_(nbytes) {
    if (nvio::detail::SwapPool::is_medium(nbytes)) {
      slot_ = unlocked([&] { return locked_arena().try_allocate(nbytes); });
      if (!slot_)
        throw nvio::MemoryError("locked memory: no room for " + std::to_string(nbytes) + " bytes",
                                ENOMEM);
    } else {
      buffer_ = unlocked([&] { return nvio::AlignedBuffer(nbytes, nvio::LockMode::Try); });
    }
    locked_memory_regions()[address()] = nbytes_;
  }
  ~LockedMemory() { locked_memory_regions().erase(address()); }
  LockedMemory(const LockedMemory&) = delete;
  LockedMemory& operator=(const LockedMemory&) = delete;
  void* data() const { return slot_ ? slot_->data() : buffer_.data(); }
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
  std::shared_ptr<nvio::SwapBuffer> slot_;  // a slot of locked_arena(), or
  nvio::AlignedBuffer buffer_;              // a mapping of its own
};

// ---- batches -----------------------------------------------------------------
// One extent of a batch as nvio/_handle.py hands it over: (address, nbytes, file offset, path or
// descriptor), the buffer resolved by the same helper as the single calls' (nvio/_buffers.py).
using BatchItem = std::tuple<std::uintptr_t, std::size_t, long long, Target>;

template <class Extent>
std::vector<Extent> batch_extents(const std::vector<BatchItem>& items) {
  std::vector<Extent> extents;
  extents.reserve(items.size());
  for (const auto& [address, nbytes, offset, target] : items) {
    Extent e;
    e.buf = as_ptr(address);
    e.length = nbytes;
    e.offset = checked_offset(offset);
    if (const auto* path = std::get_if<std::string>(&target)) {
      e.path = *path;
    } else {
      e.fd = std::get<int>(target);
    }
    extents.push_back(std::move(e));
  }
  return extents;
}

// One buffer and many file offsets (nvio/_handle.py's `read_batch(buf, offsets=, size=)`): extent
// i is the `size` bytes at address + i * size, moved at offsets[i] of the one file. _handle.py
// has checked the size and that count x size fits in the buffer; each offset is converted here,
// without a Python object per extent for a list of plain ints (others go through _args, which
// names the item it refuses).
template <class Extent>
std::vector<Extent> span_extents(std::uintptr_t address, const py::list& offsets, std::size_t size,
                                 py::handle file) {
  const Target target = to_target(file, py::str("file"));
  const auto count = static_cast<std::size_t>(PyList_GET_SIZE(offsets.ptr()));
  std::vector<Extent> extents(count);
  for (std::size_t i = 0; i < count; ++i) {
    Extent& e = extents[i];
    const py::handle item = PyList_GET_ITEM(offsets.ptr(), static_cast<Py_ssize_t>(i));
    if (auto v = plain_integer(item, 0, std::numeric_limits<long long>::max())) {
      e.offset = static_cast<std::uint64_t>(*v);
    } else {
      e.offset = to_offset(item, py::str("offsets[" + std::to_string(i) + "]"));
    }
    e.buf = as_ptr(address + i * size);
    e.length = size;
    if (const auto* path = std::get_if<std::string>(&target)) {
      e.path = *path;
    } else {
      e.fd = std::get<int>(target);
    }
  }
  return extents;
}

// Every extent of a batch is moved with one memory kind (`device`): nvio/_handle.py refuses a
// batch that mixes host and device buffers.
void bind_batches(py::class_<nvio::Handle>& cls) {
  cls.def(
      "read_spans",
      [](nvio::Handle& h, std::uintptr_t address, const py::list& offsets, std::size_t size,
         py::handle file, bool device) {
        const auto extents = span_extents<nvio::ReadExtent>(address, offsets, size, file);
        const nvio::ReadOptions r = read_options(device);
        unlocked([&] { h.read_batch(extents, r); }, Signals::Handle);
      },
      py::arg("address"), py::arg("offsets"), py::arg("size"), py::arg("target"),
      py::arg("device") = false);
  cls.def(
      "write_spans",
      [](nvio::Handle& h, std::uintptr_t address, const py::list& offsets, std::size_t size,
         py::handle file, bool sync, bool device) {
        const auto extents = span_extents<nvio::WriteExtent>(address, offsets, size, file);
        const nvio::WriteOptions w = write_options(false, sync, device);
        unlocked([&] { h.write_batch(extents, w); }, Signals::Handle);
      },
      py::arg("address"), py::arg("offsets"), py::arg("size"), py::arg("target"),
      py::arg("sync") = false, py::arg("device") = false);
  cls.def(
      "submit_read_spans",
      [](nvio::Handle& h, std::uintptr_t address, const py::list& offsets, std::size_t size,
         py::handle file, bool device) {
        const auto extents = span_extents<nvio::ReadExtent>(address, offsets, size, file);
        const nvio::ReadOptions r = read_options(device);
        return unlocked([&] { return h.submit_read_batch(extents, r); });
      },
      py::arg("address"), py::arg("offsets"), py::arg("size"), py::arg("target"),
      py::arg("device") = false);
  cls.def(
      "submit_write_spans",
      [](nvio::Handle& h, std::uintptr_t address, const py::list& offsets, std::size_t size,
         py::handle file, bool sync, bool device) {
        const auto extents = span_extents<nvio::WriteExtent>(address, offsets, size, file);
        const nvio::WriteOptions w = write_options(false, sync, device);
        return unlocked([&] { return h.submit_write_batch(extents, w); });
      },
      py::arg("address"), py::arg("offsets"), py::arg("size"), py::arg("target"),
      py::arg("sync") = false, py::arg("device") = false);
  cls.def(
      "read_batch",
      [](nvio::Handle& h, const std::vector<BatchItem>& items, bool device) {
        const auto extents = batch_extents<nvio::ReadExtent>(items);
        const nvio::ReadOptions r = read_options(device);
        unlocked([&] { h.read_batch(extents, r); }, Signals::Handle);
      },
      py::arg("items"), py::arg("device") = false);
  cls.def(
      "write_batch",
      [](nvio::Handle& h, const std::vector<BatchItem>& items, bool sync, bool device) {
        const auto extents = batch_extents<nvio::WriteExtent>(items);
        const nvio::WriteOptions w = write_options(false, sync, device);
        unlocked([&] { h.write_batch(extents, w); }, Signals::Handle);
      },
      py::arg("items"), py::arg("sync") = false, py::arg("device") = false);
  cls.def(
      "submit_read_batch",
      [](nvio::Handle& h, const std::vector<BatchItem>& items, bool device) {
        const auto extents = batch_extents<nvio::ReadExtent>(items);
        const nvio::ReadOptions r = read_options(device);
        return unlocked([&] { return h.submit_read_batch(extents, r); });
      },
      py::arg("items"), py::arg("device") = false);
  cls.def(
      "submit_write_batch",
      [](nvio::Handle& h, const std::vector<BatchItem>& items, bool sync, bool device) {
        const auto extents = batch_extents<nvio::WriteExtent>(items);
        const nvio::WriteOptions w = write_options(false, sync, device);
        return unlocked([&] { return h.submit_write_batch(extents, w); });
      },
      py::arg("items"), py::arg("sync") = false, py::arg("device") = false);
}

// ---- atomic replacement (nvio/dcp.py) ---------------------------------------------------------
// jobs/replace_file.hpp's ReplacementFile, the library's one mechanism for replacing a file
// atomically: Python writes through `fd` (with a handle's batches) and then commits, or discards.
// Held in an optional so that discard() removes the temporary file at once, not when Python
// collects the object.
struct Replacement {
  std::optional<nvio::detail::ReplacementFile> file;

  nvio::detail::ReplacementFile& get() {
    if (!file) throw nvio::InvalidArgument("nvio: this ReplacementFile was committed or discarded");
    return *file;
  }
};

void bind_replacement(py::module_& m) {
  py::class_<Replacement>(m, "ReplacementFile")
      .def(py::init([](nvio::Handle& h, const std::string& path) {
             auto r = std::make_unique<Replacement>();
             unlocked([&] { r->file.emplace(path, &h); });
             return r;
           }),
           py::arg("handle"), py::arg("path"), py::keep_alive<1, 2>())
      .def_property_readonly("fd", [](Replacement& r) { return r.get().fd(); })
      .def_property_readonly("temp_path",
                             [](Replacement& r) { return message_text(r.get().temp_path()); })
      .def(
          "commit",
          [](Replacement& r, bool sync) {
            nvio::detail::ReplacementFile& f = r.get();
            const auto durability = sync ? nvio::Durability::Data : nvio::Durability::None;
            // A failed commit has removed the temporary file: the object is spent either way.
            struct Spent {
              Replacement& r;
              ~Spent() { r.file.reset(); }
            } spent{r};
            unlocked([&] { f.commit(durability); });
          },
          py::arg("sync") = true)
      .def("discard", [](Replacement& r) { unlocked([&] { r.file.reset(); }); });
}

// ---- safetensors (nvio/safetensors.py) --------------------------------------------------------

namespace st = nvio::safetensors;

// A header as Python takes it: (data_offset, data_size, metadata or None,
// [(name, dtype, shape, begin, end), ...] in header order). Called with the GIL held.
py::tuple header_tuple(const st::Header& h) {
  py::list tensors;
  for (const st::TensorInfo& t : h.tensors) {
    py::tuple shape(t.shape.size());
    for (std::size_t i = 0; i < t.shape.size(); ++i) shape[i] = py::int_(t.shape[i]);
    tensors.append(
        py::make_tuple(message_text(t.name), st::to_string(t.dtype), shape, t.begin, t.end));
  }
  py::object metadata = py::none();
  if (h.metadata) {
    py::dict d;
    for (const auto& [k, v] : *h.metadata) d[message_text(k)] = message_text(v);
    metadata = d;
  }
  return py::make_tuple(h.data_offset(), h.data_size, metadata, tensors);
}

st::Dtype dtype_of(const std::string& name) {
  const std::optional<st::Dtype> d = st::parse_dtype(name);
  if (!d) throw nvio::InvalidArgument("safetensors: unknown dtype '" + name + "'");
  return *d;
}

// (name, dtype, shape, address, nbytes) from nvio/safetensors.py, names already UTF-8 bytes.
using SaveItem =
    std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::uintptr_t, std::size_t>;

std::vector<st::TensorData> tensor_data(const std::vector<SaveItem>& items) {
  std::vector<st::TensorData> out;
  out.reserve(items.size());
  for (const auto& [name, dtype, shape, address, nbytes] : items) {
    out.push_back({name, dtype_of(dtype), shape, as_ptr(address), nbytes});
  }
  return out;
}

using MetadataArg = std::optional<std::map<std::string, std::string>>;

void bind_safetensors(py::module_& m) {
  m.def(
      "safetensors_read_header",
      [](nvio::Handle& h, const std::string& path) {
        const st::Header header = unlocked([&] { return st::read_safetensors_header(h, path); });
        return header_tuple(header);
      },
      py::arg("handle"), py::arg("path"));
  m.def(
      "safetensors_parse",
      [](const py::buffer& buffer, const std::string& name) {
        const py::buffer_info info = buffer.request();
        const std::span<const unsigned char> bytes(
            static_cast<const unsigned char*>(info.ptr),
            static_cast<std::size_t>(info.size * info.itemsize));
        const st::Header header =
            unlocked([&] { return st::parse_safetensors_header(bytes, bytes.size(), name); });
        return header_tuple(header);
      },
      py::arg("buffer"), py::arg("name"));
  // The header save would write, for nvio.safetensors.save(): (bytes, order, begins).
  m.def(
      "safetensors_header",
      [](const std::vector<SaveItem>& items, const MetadataArg& metadata) {
        const st::SerializedHeader h =
            st::serialize_safetensors_header(tensor_data(items), metadata);
        return py::make_tuple(
            py::bytes(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size()), h.order,
            h.begins);
      },
      py::arg("items"), py::arg("metadata"));
  m.def(
      "safetensors_save",
      [](nvio::Handle& h, const std::string& path, const std::vector<SaveItem>& items,
         const MetadataArg& metadata, bool sync, bool device) {
        const std::vector<st::TensorData> tensors = tensor_data(items);
        nvio::WriteOptions w = write_options(false, sync, device);
        // Its writes are blocking calls: interrupted, they drain, and the temporary file goes.
        unlocked([&] { st::save_safetensors(h, path, tensors, metadata, w); }, Signals::Handle);
      },
      py::arg("handle"), py::arg("path"), py::arg("items"), py::arg("metadata"),
      py::arg("sync") = true, py::arg("device") = false);
}

// ---- the tensor swapper ----------------------------------------------------------
// nvio/swapper.py's TensorSwapper over nvio::Swapper: buffers arrive as (address, nbytes, device)
// resolved by nvio/_buffers.py, which keeps them alive through the Future of each swap_out.

// A pool buffer lent by swap_in, exported through the buffer protocol (torch.frombuffer and
// numpy.frombuffer keep this object, and so the buffer and its share of the budget, alive).
class LentBuffer {
 public:
  explicit LentBuffer(std::shared_ptr<nvio::SwapBuffer> buffer) : buffer_(std::move(buffer)) {}
  std::uintptr_t address() const { return reinterpret_cast<std::uintptr_t>(buffer_->data()); }
  std::size_t nbytes() const { return buffer_->size(); }
  py::buffer_info info() {
    return py::buffer_info(buffer_->data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(buffer_->size())}, {1});
  }

 private:
  std::shared_ptr<nvio::SwapBuffer> buffer_;
};

py::dict stats_dict(const nvio::SwapperStats& s) {
  py::dict d;
  d["budget_bytes"] = s.budget_bytes;
  d["held_bytes"] = s.held_bytes;
  d["writing_bytes"] = s.writing_bytes;
  d["pool_bytes"] = s.pool_bytes;
  d["prefetched_bytes"] = s.prefetched_bytes;
  d["prefetch_queued"] = s.prefetch_queued;
  d["free_pool_bytes"] = s.free_pool_bytes;
  d["tensors"] = s.tensors;
  d["stored_bytes"] = s.stored_bytes;
  d["files"] = s.files;
  d["file_bytes"] = s.file_bytes;
  d["writes_in_flight"] = s.writes_in_flight;
  d["reads_in_flight"] = s.reads_in_flight;
  d["swap_outs"] = s.swap_outs;
  d["swap_ins"] = s.swap_ins;
  d["prefetch_hits"] = s.prefetch_hits;
  d["bytes_written"] = s.bytes_written;
  d["bytes_read"] = s.bytes_read;
  d["budget_waits"] = s.budget_waits;
  d["bytes_cloned"] = s.bytes_cloned;
  return d;
}

void bind_swapper(py::module_& m) {
  py::class_<LentBuffer>(m, "LentBuffer", py::buffer_protocol())
      .def_property_readonly("address", &LentBuffer::address)
      .def_property_readonly("nbytes", &LentBuffer::nbytes)
      .def_buffer(&LentBuffer::info);

  py::class_<nvio::Swapper>(m, "Swapper")
      .def(py::init([](const std::string& directory, std::uint64_t budget_bytes,
                       std::uint64_t pack_threshold, std::uint64_t pack_file_size, bool checksums,
                       const py::kwargs& kwargs) {
             std::string config_dir;
             const nvio::OptionOverrides o = overrides(kwargs, config_dir);
             nvio::SwapperOptions so;
             so.budget_bytes = budget_bytes;
             so.pack_threshold = pack_threshold;
             so.pack_file_size = pack_file_size;
             so.checksums = checksums;
             return unlocked([&] {
               const nvio::Options options = nvio::resolve_options(o, {}, config_dir).values;
               return std::make_unique<nvio::Swapper>(directory, so, options);
             });
           }),
           py::arg("directory"), py::arg("budget_bytes"), py::arg("pack_threshold"),
           py::arg("pack_file_size"), py::arg("checksums"))
      .def(
          "swap_out",
          [](nvio::Swapper& s, const std::string& name, std::uintptr_t address, std::size_t nbytes,
             bool device, const std::string& meta) {
            return unlocked(
                [&] { return s.swap_out(name, as_ptr(address), nbytes, memory_of(device), meta); });
          },
          py::arg("name"), py::arg("address"), py::arg("nbytes"), py::arg("device"),
          py::arg("meta"))
      // collect_into, done, is_pending, cancel: what nvio.Future calls, so that a swap_out is a
      // plain Future. The swapper's waits do not run signal handlers (`signals` is accepted and
      // left alone: a swap_out's write is short, and the swapper's own waits are not built to stop
      // halfway), so a wait that raises has its outcome and the write is never pending after it;
      // a write cannot be cancelled.
      .def(
          "collect_into",
          [](nvio::Swapper& s, std::uint64_t id, const py::object& future, bool /*signals*/) {
            unlocked([&] {
              std::exception_ptr error;
              try {
                s.wait(id);
              } catch (...) {
                error = std::current_exception();
              }
              py::gil_scoped_acquire gil;
              future.attr("_outcome") = py::make_tuple(error_object(error));
            });
          },
          py::arg("ticket"), py::arg("future"), py::arg("signals") = true)
      .def("is_pending", [](const nvio::Swapper&, std::uint64_t) { return false; })
      .def("cancel", [](nvio::Swapper&, std::uint64_t) { return false; })
      .def("done",
           [](nvio::Swapper& s, std::uint64_t id) { return unlocked([&] { return s.done(id); }); })
      .def("wait_all", [](nvio::Swapper& s) { unlocked([&] { s.wait(); }); })
      .def(
          "swap_in",
          [](nvio::Swapper& s, const std::string& name) {
            std::string meta;
            LentBuffer buffer(unlocked([&] { return s.swap_in(name, &meta); }));
            return py::make_tuple(std::move(buffer), message_text(meta));
          },
          py::arg("name"))
      .def(
          "swap_in_into",
          [](nvio::Swapper& s, const std::string& name, std::uintptr_t address, std::size_t nbytes,
             bool device) {
            unlocked([&] { s.swap_in(name, as_ptr(address), nbytes, memory_of(device)); });
          },
          py::arg("name"), py::arg("address"), py::arg("nbytes"), py::arg("device"))
      .def(
          "swap_in_batch",
          [](nvio::Swapper& s,
             const std::vector<std::tuple<std::string, std::uintptr_t, std::size_t, bool>>& items) {
            std::vector<nvio::Swapper::Target> targets;
            targets.reserve(items.size());
            for (const auto& [name, address, nbytes, device] : items) {
              targets.push_back({name, as_ptr(address), nbytes, memory_of(device)});
            }
            unlocked([&] { s.swap_in(targets); });
          },
          py::arg("items"))
      .def(
          "prefetch",
          [](nvio::Swapper& s, const std::vector<std::string>& names) {
            return unlocked([&] { return s.prefetch(names); });
          },
          py::arg("names"))
      .def(
          "evict",
          [](nvio::Swapper& s, const std::string& name) {
            return unlocked([&] { return s.evict(name); });
          },
          py::arg("name"))
      // The swapper's mutex may be held through I/O (a snapshot holds it for its whole copy): even
      // the queries wait for it without the GIL.
      .def(
          "contains",
          [](const nvio::Swapper& s, const std::string& name) {
            return unlocked([&] { return s.contains(name); });
          },
          py::arg("name"))
      .def(
          "info",
          [](const nvio::Swapper& s, const std::string& name) -> py::object {
            const auto info = unlocked([&] { return s.info(name); });
            if (!info) return py::none();
            py::dict d;
            d["size"] = info->size;
            d["meta"] = info->meta;
            d["path"] = path_text(info->path);
            d["offset"] = info->offset;
            d["checksum"] = info->checksum ? py::cast(*info->checksum) : py::none();
            return d;
          },
          py::arg("name"))
      .def("names", [](const nvio::Swapper& s) { return unlocked([&] { return s.names(); }); })
      .def("stats",
           [](const nvio::Swapper& s) { return stats_dict(unlocked([&] { return s.stats(); })); })
      .def_property_readonly("directory",
                             [](const nvio::Swapper& s) { return path_text(s.directory()); })
      .def(
          "snapshot",
          [](nvio::Swapper& s, const std::string& dst) { unlocked([&] { s.snapshot(dst); }); },
          py::arg("dst_dir"))
      .def(
          "close",
          [](nvio::Swapper& s, bool delete_files) { unlocked([&] { s.close(delete_files); }); },
          py::arg("delete_files") = true);
}

py::dict striped_transfer_dict(const nvio::StripedTransfer& t) {
  py::list drives;
  for (const nvio::DriveTransfer& d : t.drives) {
    py::dict one;
    one["directory"] = path_text(d.directory);
    one["bytes"] = d.bytes;
    one["seconds"] = d.seconds;
    drives.append(one);
  }
  py::dict out;
  out["bytes"] = t.bytes;
  out["seconds"] = t.seconds;
  out["drives"] = drives;
  return out;
}

// nvio.StripedHandle's core: one handle per directory (nvio/stripe.hpp). Names and directories
// arrive as bytes (os.fsencode'd by nvio/_args.py).
void bind_striped(py::module_& m) {
  py::class_<nvio::StripedHandle>(m, "StripedHandle")
      .def(
          py::init([](const std::vector<std::string>& directories, std::size_t stripe_size,
                      const py::kwargs& kwargs) {
            std::string config_dir;
            const nvio::OptionOverrides o = overrides(kwargs, config_dir);
            if (!config_dir.empty()) {
              throw nvio::InvalidArgument(
                  "StripedHandle takes no config_dir: each drive uses its own directory's profile");
            }
            return unlocked([&] {
              return std::make_unique<nvio::StripedHandle>(
                  nvio::StripeLayout{directories, stripe_size}, o);
            });
          }),
          py::arg("directories"), py::arg("stripe_size"))
      .def(
          "read",
          [](nvio::StripedHandle& h, std::uintptr_t addr, std::size_t nbytes,
             const std::string& name, std::uint64_t offset, bool device) {
            const nvio::ReadOptions r = read_options(device);
            return striped_transfer_dict(unlocked(
                [&] { return h.read(as_ptr(addr), nbytes, name, offset, r); }, Signals::Handle));
          },
          py::arg("address"), py::arg("nbytes"), py::arg("name"), py::arg("offset") = 0,
          py::arg("device") = false)
      .def(
          "write",
          [](nvio::StripedHandle& h, std::uintptr_t addr, std::size_t nbytes,
             const std::string& name, std::uint64_t offset, bool truncate, bool sync, bool device) {
            const nvio::WriteOptions w = write_options(truncate, sync, device);
            return striped_transfer_dict(unlocked(
                [&] { return h.write(as_ptr(addr), nbytes, name, offset, w); }, Signals::Handle));
          },
          py::arg("address"), py::arg("nbytes"), py::arg("name"), py::arg("offset") = 0,
          py::arg("truncate") = false, py::arg("sync") = false, py::arg("device") = false)
      .def("size", [](const nvio::StripedHandle& h,
                      const std::string& name) { return unlocked([&] { return h.size(name); }); })
      .def("remove",
           [](nvio::StripedHandle& h, const std::string& name) {
             return unlocked([&] { return h.remove(name); });
           })
      .def("part_path", [](const nvio::StripedHandle& h, std::size_t drive,
                           const std::string& name) { return path_text(h.part_path(drive, name)); })
      .def("drive_options",
           [](nvio::StripedHandle& h, std::size_t drive) {
             return options_dict(h.drive(drive).options());
           })
      .def("drive_engine",
           [](nvio::StripedHandle& h, std::size_t drive) {
             return nvio::to_string(h.drive(drive).engine());
           })
      .def("stats", [](const nvio::StripedHandle& h) { return stats_dict(h.stats()); })
      .def("drive_stats", [](nvio::StripedHandle& h,
                             std::size_t drive) { return stats_dict(h.drive(drive).stats()); })
      .def_property_readonly("directories",
                             [](const nvio::StripedHandle& h) {
                               py::list out;
                               for (const auto& d : h.layout().directories)
                                 out.append(path_text(d));
                               return out;
                             })
      .def_property_readonly("stripe_size",
                             [](const nvio::StripedHandle& h) { return h.layout().stripe_size; });
}

}  // namespace

namespace nvio_py {
// For the bindings in other files (file.cpp): unlocked() without its template.
void run_unlocked(const std::function<void()>& f, bool signals) {
  unlocked(f, signals ? Signals::Handle : Signals::Keep);
}
void bind_file(py::module_& m);  // file.cpp
void bind_checkpoint(py::module_& m);
}  // namespace nvio_py

PYBIND11_MODULE(_nvio, m) {
  m.doc() = "nvio core bindings (internal: use the nvio package)";

  g_main_thread =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  // A child forked by a thread other than the main one runs its handlers on that thread.
  py::module_::import("os").attr("register_at_fork")(
      py::arg("after_in_child") =
          py::cpp_function([] { g_main_thread = PyThread_get_thread_ident(); }));

  g_errors.error = make_error(m, "Error", {PyExc_Exception}, "Root of every nvio error.");
  g_errors.invalid_argument = make_error(m, "InvalidArgument", {g_errors.error, PyExc_ValueError},
                                         "A bad option or argument; its `option` attribute names "
                                         "the handle option at fault (None when none is).");
  // Raised from Python code too (nvio/_args.py): every instance has the attribute.
  py::reinterpret_borrow<py::object>(g_errors.invalid_argument).attr("option") = py::none();
  g_errors.engine_unavailable =
      make_error(m, "EngineUnavailable", {g_errors.error, PyExc_RuntimeError},
                 "The requested engine cannot be used on this machine.");
  g_errors.memory = make_error(m, "LockedMemoryError", {g_errors.error, PyExc_MemoryError},
                               "Allocating or locking memory failed.");
  g_errors.io = make_error(m, "IOFailure", {g_errors.error, PyExc_OSError},
                           "A system call on a file failed.");
  g_errors.not_found = make_error(m, "FileNotFound", {g_errors.io, PyExc_FileNotFoundError},
                                  "The file does not exist.");
  g_errors.permission = make_error(m, "PermissionDenied", {g_errors.io, PyExc_PermissionError},
                                   "Access to the file was refused.");
  g_errors.read_only = make_error(m, "ReadOnlyFileSystem", {g_errors.io},
                                  "A write to a file on a read-only file system (errno EROFS).");
  g_errors.is_directory = make_error(m, "IsADirectory", {g_errors.io, PyExc_IsADirectoryError},
                                     "A directory was given where a file was expected.");
  g_errors.no_space = make_error(m, "NoSpace", {g_errors.io}, "The device is full.");
  g_errors.short_file = make_error(m, "ShortFile", {g_errors.io, PyExc_EOFError},
                                   "A read asked for bytes past the end of the file.");
  g_errors.gpu = make_error(m, "GpuError", {g_errors.error, PyExc_RuntimeError},
                            "A CUDA driver or cuFile call failed, or CUDA is unusable for device "
                            "memory (attributes: api, code, code_name, path, offset, length).");
  g_errors.format = make_error(m, "FormatError", {g_errors.error, PyExc_ValueError},
                               "A file's contents break its format, e.g. a malformed safetensors "
                               "header (attributes: path, problem).");
  g_errors.checksum =
      make_error(m, "ChecksumMismatch", {g_errors.format},
                 "Stored bytes whose checksum does not match, e.g. a corrupt swap file "
                 "(attributes: name, path, offset, length, expected, actual, problem).");
  g_errors.budget = make_error(m, "BudgetExceeded", {g_errors.error, PyExc_RuntimeError},
                               "A memory budget cannot make room for a request (attributes: "
                               "needed, budget, held).");
  g_errors.locked = make_error(m, "DirectoryLocked", {g_errors.error, PyExc_RuntimeError},
                               "A directory is in use by another owner (attributes: path, "
                               "owner_pid).");
  py::register_exception_translator(&translate);

  nvio::set_warning_sink([](const std::string& msg) {
    std::lock_guard lock(g_warnings_mutex);
    g_warnings.push_back(msg);
    g_warnings_queued.store(true, std::memory_order_release);
  });

  py::class_<nvio::Handle> handle(m, "Handle");
  handle
      .def(py::init([](const py::kwargs& kwargs) {
        std::string config_dir;
        const nvio::OptionOverrides o = overrides(kwargs, config_dir);
        return unlocked([&] {
          return std::make_unique<nvio::Handle>(nvio::resolve_options(o, {}, config_dir).values);
        });
      }))
      // The single calls take the file and offset as given (converted by to_target/to_offset);
      // file_name and offset_name name them in an error (aio_handle: "filename", "file_offset").
      .def(
          "read",
          [](nvio::Handle& h, std::uintptr_t addr, std::size_t nbytes, py::handle file,
             py::handle offset, bool device, py::handle file_name, py::handle offset_name) {
            const nvio::ReadOptions r = read_options(device);
            on_target(
                file, offset, file_name, offset_name, Signals::Handle,
                [&](const auto& t, std::uint64_t off) { h.read(as_ptr(addr), nbytes, t, off, r); });
          },
          py::arg("address"), py::arg("nbytes"), py::arg("target"), py::arg("offset") = 0,
          py::arg("device") = false, py::arg("file_name") = "file",
          py::arg("offset_name") = "offset")
      .def(
          "write",
          [](nvio::Handle& h, std::uintptr_t addr, std::size_t nbytes, py::handle file,
             py::handle offset, bool truncate, bool sync, bool device, py::handle file_name,
             py::handle offset_name) {
            const nvio::WriteOptions w = write_options(truncate, sync, device);
            on_target(file, offset, file_name, offset_name, Signals::Handle,
                      [&](const auto& t, std::uint64_t off) {
                        h.write(as_ptr(addr), nbytes, t, off, w);
                      });
          },
          py::arg("address"), py::arg("nbytes"), py::arg("target"), py::arg("offset") = 0,
          py::arg("truncate") = false, py::arg("sync") = false, py::arg("device") = false,
          py::arg("file_name") = "file", py::arg("offset_name") = "offset")
      .def(
          "submit_read",
          [](nvio::Handle& h, std::uintptr_t addr, std::size_t nbytes, py::handle file,
             py::handle offset, bool device, py::handle file_name, py::handle offset_name) {
            const nvio::ReadOptions r = read_options(device);
            return on_target(file, offset, file_name, offset_name, Signals::Keep,
                             [&](const auto& t, std::uint64_t off) {
                               return h.submit_read(as_ptr(addr), nbytes, t, off, r);
                             });
          },
          py::arg("address"), py::arg("nbytes"), py::arg("target"), py::arg("offset") = 0,
          py::arg("device") = false, py::arg("file_name") = "file",
          py::arg("offset_name") = "offset")
      .def(
          "submit_write",
          [](nvio::Handle& h, std::uintptr_t addr, std::size_t nbytes, py::handle file,
             py::handle offset, bool truncate, bool sync, bool device, py::handle file_name,
             py::handle offset_name) {
            const nvio::WriteOptions w = write_options(truncate, sync, device);
            return on_target(file, offset, file_name, offset_name, Signals::Keep,
                             [&](const auto& t, std::uint64_t off) {
                               return h.submit_write(as_ptr(addr), nbytes, t, off, w);
                             });
          },
          py::arg("address"), py::arg("nbytes"), py::arg("target"), py::arg("offset") = 0,
          py::arg("truncate") = false, py::arg("sync") = false, py::arg("device") = false,
          py::arg("file_name") = "file", py::arg("offset_name") = "offset")
      // Waits for `ticket` and records its outcome on `future` (nvio/_future.py) as
      // future._outcome = (error or None,), with the GIL taken before the wait returns: a handler
      // raising as the call returns (a Ctrl-C landing just then) cannot hide a collected outcome.
      // A Ctrl-C during the wait (`signals`) leaves the ticket pending and sets nothing.
      .def(
          "collect_into",
          [](nvio::Handle& h, nvio::Ticket t, const py::object& future, bool signals) {
            unlocked(
                [&] {
                  const nvio::Completion c = h.wait_completion(t);
                  py::gil_scoped_acquire gil;
                  future.attr("_outcome") = py::make_tuple(error_object(c.error));
                },
                signals ? Signals::Handle : Signals::Keep);
          },
          py::arg("ticket"), py::arg("future"), py::arg("signals") = true)
      .def("wait_all", [](nvio::Handle& h) { return unlocked([&] { return h.wait(); }); })
      .def("done", [](const nvio::Handle& h, nvio::Ticket t) { return h.done(t); })
      .def("is_pending", [](const nvio::Handle& h, nvio::Ticket t) { return h.is_pending(t); })
      .def("cancel", [](nvio::Handle& h, nvio::Ticket t) { return h.cancel(t); })
      .def("pending", &nvio::Handle::pending)
      // Closing a descriptor can block (a network file system flushes on close).
      .def("close_files", [](nvio::Handle& h) { unlocked([&] { h.close_files(); }); })
      .def(
          "close_file",
          [](nvio::Handle& h, py::handle file) {
            const Target target = to_target(file, py::str("file"));
            unlocked([&] { std::visit([&](const auto& f) { h.close_file(f); }, target); });
          },
          py::arg("file"))
      .def("open_files", &nvio::Handle::open_files)
      .def("stats", [](const nvio::Handle& h) { return stats_dict(h.stats()); })
      .def("options", [](const nvio::Handle& h) { return options_dict(h.options()); })
      .def_property_readonly("engine",
                             [](const nvio::Handle& h) { return nvio::to_string(h.engine()); })
      .def_property_readonly("engine_reason", &nvio::Handle::engine_reason);
  bind_batches(handle);
  bind_safetensors(m);
  bind_replacement(m);
  bind_swapper(m);
  bind_striped(m);

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
  m.def(
      "crc32",
      [](py::buffer obj, std::uint32_t value) {
        const py::buffer_info info = contiguous_buffer(obj);
        const auto size = static_cast<std::size_t>(info.size * info.itemsize);
        return unlocked([&] { return nvio::crc32(info.ptr, size, value); });
      },
      py::arg("data"), py::arg("value") = 0,
      "zlib.crc32 of a contiguous buffer (ISA-L, without the GIL).");
  m.def("crc32_combine", &nvio::crc32_combine, py::arg("crc_a"), py::arg("crc_b"),
        py::arg("size_b"), "The CRC-32 of A followed by B, from both CRCs and B's length.");

  // The temporaries of replacing saves (jobs/replace_file.hpp), for nvio.save / nvio.load.
  m.def(
      "create_temporary",
      [](const std::string& target) {
        const nvio::detail::TemporaryFile t =
            unlocked([&] { return nvio::detail::create_temporary(target); });
        return py::make_tuple(path_text(t.path), t.fd);
      },
      py::arg("target"),
      "Removes the target's stale temporaries, then creates a new one beside it (O_EXCL, "
      "flocked): (its path, its write-only descriptor, which the caller closes).");
  m.def(
      "remove_stale_temporaries",
      [](const std::string& target) {
        return unlocked([&] { return nvio::detail::remove_stale_temporaries(target); });
      },
      py::arg("target"), "Removes the target's temporaries whose writer is gone; how many.");
  m.def(
      "temporary_writer",
      [](const std::string& base, const std::string& name) -> py::object {
        const auto w = nvio::detail::temporary_writer(base, name);
        if (!w.has_value()) return py::none();
        return py::make_tuple(w->host, w->start, w->pid);
      },
      py::arg("base"), py::arg("name"),
      "(host, start time, pid) of the writer of temporary file `name` of a target named `base`, "
      "or None when it is not one of its temporaries.");

  m.def(
      "error_type",
      [](int err) -> py::object {
        // The exception type the core raises for errno `err`: its one errno table
        // (throw_io_error), translated as every error of the binding is, so that Python code
        // typing an OSError of its own keeps no table of its own.
        try {
          nvio::throw_io_error(nvio::IoOp::Open, std::string(), 0, 0, err);
        } catch (...) {
          translate(std::current_exception());
        }
        PyObject* type = nullptr;
        PyObject* value = nullptr;
        PyObject* trace = nullptr;
        PyErr_Fetch(&type, &value, &trace);
        Py_XDECREF(value);
        Py_XDECREF(trace);
        return py::reinterpret_steal<py::object>(type);
      },
      py::arg("errno"), "The nvio.Error subclass the core raises for this errno value.");

  m.def(
      "dlpack_address",
      [](py::capsule capsule) {
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
        if (t->device_type != 1 && t->device_type != 2 && t->device_type != 3 &&
            t->device_type != 13) {
          throw nvio::InvalidArgument("the DLPack tensor is on device type " +
                                      std::to_string(t->device_type) +
                                      ", neither CPU nor CUDA memory");
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
      },
      py::arg("capsule"));

  m.def("is_locked", [](std::uintptr_t addr, std::size_t nbytes) {
    return nvio::is_locked_by_nvio(as_ptr(addr), nbytes);
  });
  m.def("in_locked_memory", &in_locked_memory);

  m.def("resolve_options", [](const py::kwargs& kwargs) {
    std::string config_dir;
    const nvio::OptionOverrides o = overrides(kwargs, config_dir);
    const nvio::EffectiveOptions eff = nvio::resolve_options(o, {}, config_dir);
    py::dict sources;
    for (const auto& [name, src] : eff.sources) sources[py::str(name)] = nvio::to_string(src);
    py::dict config;
    config["path"] = eff.config_path.empty() ? py::object(py::none()) : py::str(eff.config_path);
    config["found"] = eff.config_found;
    config["profile"] =
        eff.config_profile.empty() ? py::object(py::none()) : py::str(eff.config_profile);
    return py::make_tuple(options_dict(eff.values), sources, config);
  });
  // The option table: one dict per option, in its order (nvio/_args.py derives the keyword
  // arguments of every entry point from it).
  m.def("option_specs", [] {
    const nvio::Options defaults;
    py::list out;
    for (const nvio::OptionSpec& spec : nvio::option_specs()) {
      py::dict d;
      d["name"] = spec.name;
      d["environment"] = spec.environment;
      d["type"] = nvio::to_string(spec.type);
      d["default"] = to_python(defaults.get(spec.name));
      d["min"] = spec.type == nvio::OptionType::Integer ? py::cast(spec.min) : py::none();
      d["max"] = spec.type == nvio::OptionType::Integer ? py::cast(spec.max) : py::none();
      d["unit"] = spec.unit;
      d["accepted"] = spec.accepted;
      d["description"] = spec.description;
      out.append(d);
    }
    return out;
  });

  // ---- tuning -----------------------------------------------------------------------------
  // Runs nvio::tune_directory without the GIL and returns its JSON document (the same format as
  // `nvio tune --json`); with save=True also writes the recommended options to the
  // configuration file and returns its path.
  m.def(
      "tune",
      [](const std::string& directory, std::uint64_t size, double budget,
         const std::vector<std::string>& modes, std::optional<std::vector<std::string>> engines,
         std::uint64_t trial_bytes, bool grid, bool save, bool keep) {
        nvio::TuneRequest req;
        req.directory = directory;
        req.file_size = size;
        req.trial_bytes = trial_bytes;
        req.keep_file = keep;
        req.settings.budget_s = budget;
        req.settings.strategy = grid ? nvio::TuneStrategy::Grid : nvio::TuneStrategy::Search;
        req.settings.modes.clear();
        for (const std::string& mode : modes) {
          if (mode == "read") {
            req.settings.modes.push_back(nvio::TuneMode::Read);
          } else if (mode == "write") {
            req.settings.modes.push_back(nvio::TuneMode::Write);
          } else {
            throw nvio::InvalidArgument("modes: expected 'read' and/or 'write', got '" + mode +
                                        "'");
          }
        }
        if (engines) {
          req.space.engines.clear();
          for (const std::string& e : *engines) {
            req.space.engines.push_back(nvio::parse_engine(e, "engines"));
          }
        }
        const std::string config = save ? nvio::config_path() : std::string();
        if (save && config.empty()) {
          throw nvio::InvalidArgument(
              "save: no configuration file: NVIO_CONFIG is 'none', or HOME is not set");
        }
        return unlocked([&] {
          if (save) nvio::load_config(config);  // a malformed file is reported before tuning
          const nvio::TuneResult result = nvio::tune_directory(req);
          if (save) nvio::save_profile(config, nvio::to_profile(result));
          return std::make_pair(nvio::to_json(result, -1), config);
        });
      },
      py::arg("directory"), py::arg("size"), py::arg("budget"), py::arg("modes"),
      py::arg("engines") = py::none(), py::arg("trial_bytes") = 0, py::arg("grid") = false,
      py::arg("save") = false, py::arg("keep") = false);
  m.def("config_path", [] { return nvio::config_path(); });
  m.def("parse_size", [](const std::string& text, const std::string& what) {
    return nvio::parse_size(text, what);
  });

  m.def("probe_engines", [] {
    return unlocked([] {
      std::map<std::string, std::pair<bool, std::string>> out;
      for (auto k :
           {nvio::EngineKind::IoUring, nvio::EngineKind::Libaio, nvio::EngineKind::Psync}) {
        const auto& p = nvio::probe_engine(k);
        out[nvio::to_string(k)] = {p.available, p.reason};
      }
      return out;
    });
  });
  m.def("auto_engine", [] {
    return unlocked([] {
      const auto& c = nvio::auto_engine();
      return std::make_pair(std::string(nvio::to_string(c.engine)), c.reason);
    });
  });
  m.def("probe_directory", [](const std::string& dir) {
    const nvio::DirectIoInfo info = unlocked([&] { return nvio::probe_directory(dir); });
    py::dict d;
    d["path"] = path_text(dir);
    d["direct_io"] = info.supported;
    d["mem_align"] = info.mem_align;
    d["offset_align"] = info.offset_align;
    d["source"] = info.source;
    return d;
  });
  m.def("system_info", [] {
    const nvio::SystemInfo s = nvio::system_info();
    py::dict d;
    d["kernel"] = s.kernel;
    d["memlock_limit"] = s.memlock_limit ? py::cast(*s.memlock_limit) : py::none();
    d["memlock_capability"] = s.memlock_capability ? py::cast(*s.memlock_capability) : py::none();
    d["aio_max_nr"] = s.aio_max_nr ? py::cast(*s.aio_max_nr) : py::none();
    d["aio_nr"] = s.aio_nr ? py::cast(*s.aio_nr) : py::none();
    return d;
  });
  m.def(
      "evict_page_cache",
      [](const std::string& path) { unlocked([&] { nvio::evict_page_cache(path); }); },
      py::arg("path"));
  m.def(
      "page_cache_state",
      [](const std::string& path) {
        const nvio::PageCacheState s = unlocked([&] { return nvio::page_cache_state(path); });
        py::dict d;
        d["file_bytes"] = s.file_bytes;
        d["cached_bytes"] = s.cached_bytes;
        d["dirty_bytes"] = s.dirty_bytes;
        d["method"] = s.method;
        return d;
      },
      py::arg("path"));
  m.def("pattern_fill",
        [](std::uintptr_t addr, std::size_t n, std::uint64_t off, std::uint64_t seed) {
          nvio::pattern::fill(as_ptr(addr), n, off, seed);
        });
  m.def("pattern_first_mismatch",
        [](std::uintptr_t addr, std::size_t n, std::uint64_t off, std::uint64_t seed) {
          return nvio::pattern::first_mismatch(as_ptr(addr), n, off, seed);
        });
  // ---- GPU ---------------------------------------------------------------------------
  m.def("gpu_info", [] {
    // The first call probes (dlopen, cuInit, cuFileDriverOpen): without the GIL.
    const nvio::GpuInfo& g = *unlocked([] { return &nvio::gpu_info(); });
    py::list devices;
    for (const auto& dev : g.devices) {
      py::dict d;
      d["ordinal"] = dev.ordinal;
      d["name"] = dev.name;
      d["memory"] = dev.total_memory;
      d["pci_bus_id"] = dev.pci_bus_id;
      devices.append(d);
    }
    py::dict d;
    d["driver_loaded"] = g.driver_loaded;
    d["driver_path"] = g.driver_path;
    d["driver_reason"] = g.driver_reason;
    d["driver_version"] = g.driver_version;
    d["runtime_version"] = g.runtime_version ? py::cast(*g.runtime_version) : py::none();
    d["runtime_path"] = g.runtime_path;
    d["devices"] = devices;
    d["cufile_loaded"] = g.cufile_loaded;
    d["cufile_path"] = g.cufile_path;
    d["cufile_reason"] = g.cufile_reason;
    d["gds_mode"] = nvio::to_string(g.gds_mode);
    d["gds_reason"] = g.gds_reason;
    return d;
  });
  m.def(
      "gds_register",
      [](std::uintptr_t addr, std::size_t nbytes) {
        return unlocked([&] { return nvio::gds_register_buffer(as_ptr(addr), nbytes); });
      },
      py::arg("address"), py::arg("nbytes"));
  m.def(
      "gds_deregister",
      [](std::uintptr_t addr) {
        return unlocked([&] { return nvio::gds_deregister_buffer(as_ptr(addr)); });
      },
      py::arg("address"));

  m.attr("__version__") = nvio::version();
  m.attr("MIN_BLOCK_SIZE") = nvio::kMinBlockSize;
  // After Handle (its argument type) and `translate` (its translator for FileBusy goes first).
  nvio_py::bind_file(m);
  nvio_py::bind_checkpoint(m);
}
