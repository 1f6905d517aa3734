// What every binding file of nvio._nvio shares (common.cpp): text from the core as Python str,
// the GIL helper `unlocked()`, the converters of buffers, files, offsets and options, and the
// dicts the core's statistics and options become. Private to the extension.
//
// GIL: every call that can block (file opens, I/O, waits, allocation) goes through `unlocked()`,
// the one helper that releases the GIL and afterwards turns queued library warnings into Python
// warnings, so no binding can forget either. Calls that wait for I/O pass Signals::Handle to it:
// on the main thread their waits then run Python's signal handlers (Ctrl-C), see SignalCheck.
// Everything here other than unlocked()'s callable is called with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "nvio/nvio.hpp"

namespace nvio_py {

namespace py = pybind11;

// ---- text ----------------------------------------------------------------------------------
// Text from the core as a Python str. Messages and paths may hold bytes that are not UTF-8 (a
// file name is any bytes): a message keeps them readable as \xNN escapes, and a path decodes as
// os.fsdecode() does, so that it names the same file when handed back to os functions.
py::str message_text(const std::string& s);
py::str path_text(const std::string& s);

// ---- the GIL ---------------------------------------------------------------------------------
// Turns the library warnings queued since the last call (raised on any thread) into Python
// RuntimeWarnings. GIL held.
void deliver_warnings();

// Whether the calling thread is the one the interpreter runs signal handlers on.
bool on_main_thread();

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
  bool interrupted() noexcept override;
  // Whether a handler raised during the call.
  bool fired() const noexcept { return fired_; }
  // With the GIL held: raises what the handler raised.
  [[noreturn]] void raise();

 private:
  std::optional<py::error_already_set> raised_;
  bool fired_ = false;
};

// Whether a call's waits run the signal handlers (SignalCheck): the calls that wait for I/O to
// finish. A call that only starts I/O, or that must see its operations to the end (draining in a
// finalizer), keeps them for when it returns.
enum class Signals { Keep, Handle };

// Runs `f` without the GIL and returns what it returns. What a handler raised goes up however the
// call ended: Interrupted (it stopped the call), an error of its own, or a call that ran to its
// end anyway (every piece had started).
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

// ---- errors (bind_errors.cpp) ------------------------------------------------------------------
// Sets the Python error `p` becomes: the nvio.Error subclass of each nvio error, with its fields.
void translate(std::exception_ptr p);
// The Python exception object `error` becomes when raised (None for none). GIL held.
py::object error_object(const std::exception_ptr& error);

// ---- buffers and memory ------------------------------------------------------------------------
inline void* as_ptr(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

// The buffer's bytes, refused unless contiguous: C order with no gaps, the strides matching a dense
// row-major layout.
py::buffer_info contiguous_buffer(const py::buffer& obj);

// Python always knows where a buffer lives (nvio/_buffers.py), so nothing is left to Auto.
nvio::MemoryKind memory_of(bool device);
nvio::ReadOptions read_options(bool device);
nvio::WriteOptions write_options(bool truncate, bool sync, bool device);

// ---- files and offsets -------------------------------------------------------------------------
// A file is named by a path or an open descriptor.
using Target = std::variant<std::string, int>;

std::uint64_t checked_offset(long long offset);

// A plain Python int within [lo, hi], else nullopt: the fast path of a check that names nothing
// (bind_args.cpp).
std::optional<long long> plain_integer(py::handle value, long long lo, long long hi);

// The checks of the arguments every entry point shares (bind_args.cpp, the one place they are
// decided; nvio/_args.py names the same functions for the Python package). `name` is the argument
// as the error names it ("file", "filename", "offsets[3]"...). A plain value (an int, a str or
// bytes path) takes no Python call.
//
// nvio.InvalidType, also a TypeError: an argument of the wrong type (a float offset, a bool
// file, an object-dtype array...).
class InvalidType : public nvio::Error {
 public:
  using nvio::Error::Error;
};
Target to_target(py::handle value, py::handle name);         // a path (fs-encoded) or a descriptor
std::uint64_t to_offset(py::handle value, py::handle name);  // 0 to 2**63 - 1
std::string checked_path(py::handle value, py::handle name);
py::object checked_integer(py::handle value, py::handle name);  // a Python int
bool checked_boolean(py::handle value, py::handle name);
py::str checked_utf8(py::handle value, py::handle name);
std::string checked_choice(py::handle value, py::handle name);  // a str (an option's choice)

// ---- options and statistics --------------------------------------------------------------------
// The handle options among a call's keyword arguments, by the option table: None means "not
// given" (environment, configuration or default applies). Each value's type is checked here by its
// row's type (checked_boolean, checked_integer, checked_choice: InvalidType naming the option);
// the core parses and range-checks each value, naming the option. `config_dir` is taken out first.
nvio::OptionOverrides overrides(const py::kwargs& kwargs, std::string& config_dir);

// An option value as Python holds it (bool, int or str).
py::object to_python(const nvio::OptionValue& value);

// Every option by name.
py::dict options_dict(const nvio::Options& o);

// Handle::stats() as a dict: the counters by name (nvio::handle_stats_fields), and "errors", a dict
// of failed operations by errno.
py::dict stats_dict(const nvio::HandleStats& stats);

}  // namespace nvio_py
