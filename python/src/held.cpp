// hold()'s parts that do not depend on the core (held.hpp).
#include "held.hpp"

#include <Python.h>

#include "common.hpp"

namespace nvio_py {

void store_ticket(py::handle future, std::uint64_t ticket) {
  future.attr("_ticket") = py::int_(ticket);
  const py::object pending = future.attr("_pending");
  const py::object lock = pending.attr("_lock");
  // Blocks (without the GIL) only while another thread holds the lock; a signal handler run then
  // may raise.
  lock.attr("acquire")();
  try {
    const py::object futures = pending.attr("_futures");  // under the lock: a fork replaces it
    if (PyDict_SetItem(futures.ptr(), future.ptr(), Py_None) != 0) throw py::error_already_set();
  } catch (...) {
    lock.attr("release")();
    throw;
  }
  lock.attr("release")();
}

void abandon(nvio::Handle& core, nvio::Ticket ticket) noexcept {
  try {
    core.cancel(ticket);
  } catch (...) {  // the wait below is what matters
  }
  try {
    core.wait_completion(ticket);
  } catch (...) {  // waited for: its outcome goes nowhere
  }
}

void abandon(const nvio::File& core, nvio::Ticket ticket) noexcept {
  abandon(core.handle(), ticket);
}

void abandon(nvio::Swapper& core, std::uint64_t ticket) noexcept {
  try {
    core.wait(ticket);  // a swap_out cannot be cancelled
  } catch (...) {       // waited for: its outcome goes nowhere
  }
}

}  // namespace nvio_py
