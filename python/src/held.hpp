// An asynchronous submit's ticket handed to its nvio.Future before the call returns to Python
// (held.cpp). CPython runs signal handlers right after a call into C returns: a Ctrl-C landing
// there, were the ticket returned to Python to be wrapped, would lose it before the future that
// keeps the buffer alive existed, and the operation would run on into memory nobody holds. So the
// binding of every asynchronous submit takes the future (made beforehand by nvio/_future.py, not
// yet holding anything) and, from its callable that runs without the GIL, calls hold() with the
// ticket the core returned: the future then holds the ticket and its handle's pending set holds
// the future (waited for by wait_all and close) before any Python code runs. Should that fail (a
// signal handler raising while the pending set's lock is contended, no memory), the operation is
// cancelled and waited for, without the GIL, before the error goes up: whatever is raised, the
// operation is either held or over.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>

#include "nvio/nvio.hpp"

namespace nvio_py {

// With the GIL held: future._ticket = ticket (a slot: no Python code runs), then the future is
// added to future._pending (nvio/_future.py's PendingFutures: its `_futures` under its `_lock`).
// Raises what that raised; the future is then in no set.
void store_ticket(pybind11::handle future, std::uint64_t ticket);

// What stops an operation whose future could not hold it, and waits for it (without the GIL).
void abandon(nvio::Handle& core, nvio::Ticket ticket) noexcept;
void abandon(const nvio::File& core, nvio::Ticket ticket) noexcept;
void abandon(nvio::Swapper& core, std::uint64_t ticket) noexcept;

// Called without the GIL right after `core` submitted `ticket`: `future` holds it on return; on an
// error, the operation has been abandoned (cancelled and waited for) and the error is rethrown.
template <class Core>
void hold(Core& core, pybind11::handle future, std::uint64_t ticket) {
  std::exception_ptr failed;
  {
    pybind11::gil_scoped_acquire gil;
    try {
      store_ticket(future, ticket);
      return;
    } catch (...) {
      failed = std::current_exception();
    }
  }
  abandon(core, ticket);
  std::rethrow_exception(failed);
}

}  // namespace nvio_py
