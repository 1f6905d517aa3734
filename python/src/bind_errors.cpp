// The exception types of nvio._nvio and the translator of the core's errors into them: each nvio
// error type maps to a class that is also the matching built-in (FileNotFoundError,
// PermissionError, ...), so plain `except OSError` works.
#include <pybind11/pybind11.h>

#include <initializer_list>
#include <string>

#include "bindings.hpp"
#include "common.hpp"

namespace nvio_py {
namespace {

// Python exception types, created at import (bind_errors).
struct PyErrors {
  PyObject* error;
  PyObject* invalid_argument;
  PyObject* invalid_type;
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

void set_error(PyObject* type, const std::string& what) {
  PyErr_SetObject(type, message_text(what).ptr());
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

}  // namespace

void translate(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const InvalidType& e) {
    set_error(g_errors.invalid_type, e.what());
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

void bind_errors(py::module_& m) {
  g_errors.error = make_error(m, "Error", {PyExc_Exception}, "Root of every nvio error.");
  g_errors.invalid_argument = make_error(m, "InvalidArgument", {g_errors.error, PyExc_ValueError},
                                         "A bad option or argument; its `option` attribute names "
                                         "the handle option at fault (None when none is).");
  // Raised from Python code too: every instance has the attribute.
  py::reinterpret_borrow<py::object>(g_errors.invalid_argument).attr("option") = py::none();
  g_errors.invalid_type = make_error(m, "InvalidType", {g_errors.error, PyExc_TypeError},
                                     "An argument of the wrong type (a float offset, a bool file, "
                                     "an object-dtype array...).");
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
}

}  // namespace nvio_py
