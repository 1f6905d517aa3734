// The checks of the arguments every entry point shares: files (paths and descriptors), offsets,
// integers, booleans, UTF-8 text and option values (by the option table's types, through
// common.cpp's overrides()). The one place they are decided: the binding's own calls take
// their files and offsets through to_target/to_offset (common.hpp), and the Python package's
// entry points (nvio.Handle, aio_handle, nvio.tune, nvio.safetensors, ...) through the functions
// bound here, which nvio/_args.py names. Each refuses a value with a typed error naming the
// argument: nvio.InvalidType (also a TypeError) for a value of the wrong type, nvio.InvalidArgument
// (also a ValueError) for one out of range, before anything reaches the core.
//
// Paths are handed to the core as bytes, encoded the way open() encodes them (os.fsencode: a str
// from os.listdir holding surrogate-escaped bytes gets its original bytes back), so every name
// open() accepts works, and a NUL byte, which would silently cut the name short at the system
// call, is refused as open() refuses it.
#include <pybind11/pybind11.h>

#include <climits>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "bindings.hpp"
#include "common.hpp"

namespace nvio_py {
namespace {

constexpr long long kFdMax = INT_MAX;                                    // descriptors are C ints
constexpr long long kOffsetMax = std::numeric_limits<long long>::max();  // off_t

std::string text(py::handle name) { return py::str(name).cast<std::string>(); }
std::string type_name(py::handle value) {
  return py::type::handle_of(value).attr("__name__").cast<std::string>();
}
std::string repr_of(py::handle value) { return py::repr(value).cast<std::string>(); }

// operator.index(value): the int, or nothing when the value has no __index__ (a TypeError);
// another error of its __index__ goes up as it is.
std::optional<py::object> index_of(py::handle value) {
  PyObject* i = PyNumber_Index(value.ptr());
  if (i != nullptr) return py::reinterpret_steal<py::object>(i);
  if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw py::error_already_set();
  PyErr_Clear();
  return std::nullopt;
}

// A Python int as a long long within [lo, hi], else nothing.
std::optional<long long> in_range(py::handle i, long long lo, long long hi) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
  if (overflow != 0 || v < lo || v > hi) return std::nullopt;
  return v;
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

// isinstance(value, (str, bytes, os.PathLike)): os.PathLike is any type with __fspath__.
bool path_like(py::handle value) {
  return PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr()) ||
         PyObject_HasAttrString(reinterpret_cast<PyObject*>(Py_TYPE(value.ptr())), "__fspath__");
}

}  // namespace

std::optional<long long> plain_integer(py::handle value, long long lo, long long hi) {
  if (!PyLong_CheckExact(value.ptr())) return std::nullopt;
  return in_range(value, lo, hi);
}

py::object checked_integer(py::handle value, py::handle name) {
  if (PyLong_CheckExact(value.ptr())) return py::reinterpret_borrow<py::object>(value);
  if (PyBool_Check(value.ptr()) || type_name(value) == "bool_") {
    throw InvalidType("nvio: " + text(name) + " must be an integer, got a bool (" + repr_of(value) +
                      ")");
  }
  if (auto i = index_of(value)) return std::move(*i);
  throw InvalidType("nvio: " + text(name) + " must be an integer, got " + type_name(value) + " " +
                    repr_of(value));
}

bool checked_boolean(py::handle value, py::handle name) {
  if (PyBool_Check(value.ptr())) return value.ptr() == Py_True;
  // numpy's bool is numpy.bool_ before numpy 2 and numpy.bool from 2 on.
  if (text(py::type::handle_of(value).attr("__module__")) == "numpy") {
    const std::string type = type_name(value);
    if (type == "bool_" || type == "bool") return PyObject_IsTrue(value.ptr()) == 1;
  }
  if (PyLong_Check(value.ptr())) {
    if (auto v = in_range(value, 0, 1)) return *v == 1;
  }
  throw InvalidType("nvio: " + text(name) + " must be True or False, got " + type_name(value) +
                    " " + repr_of(value));
}

py::str checked_utf8(py::handle value, py::handle name) {
  if (!PyUnicode_Check(value.ptr())) {
    throw InvalidType("nvio: " + text(name) + " must be a str, got " + type_name(value));
  }
  PyObject* encoded = PyUnicode_AsUTF8String(value.ptr());
  if (encoded == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) throw py::error_already_set();
    const py::error_already_set e;
    throw nvio::InvalidArgument("nvio: " + text(name) + " " + repr_of(value) +
                                " is not UTF-8 text (" + text(e.value().attr("reason")) +
                                " at position " + text(e.value().attr("start")) + ")");
  }
  Py_DECREF(encoded);
  return py::reinterpret_borrow<py::str>(value);
}

std::string checked_choice(py::handle value, py::handle name) {
  if (!PyUnicode_Check(value.ptr())) {
    throw InvalidType("nvio: " + text(name) + " must be a string, got " + type_name(value) + " " +
                      repr_of(value));
  }
  return value.cast<std::string>();
}

std::string checked_path(py::handle value, py::handle name) {
  if (auto plain = plain_path(value)) return std::move(*plain);
  PyObject* fspath = PyOS_FSPath(value.ptr());
  if (fspath == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw py::error_already_set();
    PyErr_Clear();
    throw InvalidType("nvio: " + text(name) + " must be a path (str, bytes or os.PathLike), got " +
                      type_name(value));
  }
  py::object raw = py::reinterpret_steal<py::object>(fspath);
  if (PyUnicode_Check(fspath)) {
    raw = py::reinterpret_steal<py::object>(PyUnicode_EncodeFSDefault(fspath));
    if (!raw) throw py::error_already_set();
  }
  const std::string bytes(PyBytes_AS_STRING(raw.ptr()),
                          static_cast<std::size_t>(PyBytes_GET_SIZE(raw.ptr())));
  if (bytes.find('\0') != std::string::npos) {
    throw nvio::InvalidArgument("nvio: " + text(name) + " " + repr_of(value) +
                                " contains an embedded null byte");
  }
  if (bytes.empty()) throw nvio::InvalidArgument("nvio: " + text(name) + " is empty");
  return bytes;
}

Target to_target(py::handle value, py::handle name) {
  if (PyLong_CheckExact(value.ptr())) {
    if (auto fd = in_range(value, 0, kFdMax)) return static_cast<int>(*fd);
  } else if (auto path = plain_path(value)) {
    return std::move(*path);
  }
  if (PyBool_Check(value.ptr())) {
    throw InvalidType("nvio: " + text(name) + " must be a path or a file descriptor, not a bool");
  }
  if (!path_like(value)) {
    if (auto fd = index_of(value)) {  // an int, or a numpy/torch integer scalar
      if (auto v = in_range(*fd, 0, kFdMax)) return static_cast<int>(*v);
      throw nvio::InvalidArgument("nvio: " + text(name) + " " + text(*fd) +
                                  " is not a file descriptor (0 to " + std::to_string(kFdMax) +
                                  ")");
    }
  }
  return checked_path(value, name);
}

std::uint64_t to_offset(py::handle value, py::handle name) {
  const py::object n = checked_integer(value, name);
  if (auto v = in_range(n, 0, kOffsetMax)) return static_cast<std::uint64_t>(*v);
  throw nvio::InvalidArgument("nvio: " + text(name) + " must be between 0 and " +
                              std::to_string(kOffsetMax) + ", got " + text(n));
}

void bind_args(py::module_& m) {
  m.attr("OFFSET_MAX") = kOffsetMax;
  m.def("check_integer", &checked_integer, py::arg("value"), py::arg("name"),
        "An exact integer: ints and numpy/torch integer scalars, never a bool, float or string.");
  m.def("check_boolean", &checked_boolean, py::arg("value"), py::arg("name"),
        "True/False (also numpy's bool and the integers 0 and 1, which DeepSpeed's binding "
        "takes); never a string: 'no' is truthy and would silently mean True.");
  m.def("check_utf8", &checked_utf8, py::arg("value"), py::arg("name"),
        "A str that UTF-8 encodes (names that go into JSON or C++ strings): not a "
        "surrogate-escaped str, as os.fsdecode makes of bytes that are not UTF-8.");
  m.def(
      "check_path",
      [](py::handle value, py::handle name) { return py::bytes(checked_path(value, name)); },
      py::arg("value"), py::arg("name") = "path",
      "A str, bytes or os.PathLike path as the bytes open() would pass to the system.");
  m.def(
      "check_file",
      [](py::handle value, py::handle name) -> py::object {
        const Target t = to_target(value, name);
        if (const int* fd = std::get_if<int>(&t)) return py::int_(*fd);
        return py::bytes(std::get<std::string>(t));
      },
      py::arg("value"), py::arg("name") = "file",
      "A file named by a path (see check_path) or an open descriptor (an int).");
  m.def(
      "check_offset", [](py::handle value, py::handle name) { return to_offset(value, name); },
      py::arg("value"), py::arg("name") = "offset",
      "A file offset: an integer from 0 to 2**63 - 1.");
}

}  // namespace nvio_py
