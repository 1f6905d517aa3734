"""One asynchronous read or write (``nvio.Future``) and the futures of one handle still pending.

Both handles use them: ``nvio.Handle`` returns its futures; the DeepSpeed-compatible
``aio_handle`` keeps them to itself and counts them in ``wait()``. A future is bound to the core
handle's ticket and owns what must outlive the operation: the buffer (kept alive until the
operation has been waited for) and an optional check run after it (``aio_handle``'s
``validate=True``). A ticket is waited for once in the core; the future records the outcome, so
any number of waits (by any threads) each return the result or raise the error.

Ctrl-C: a wait on the main thread runs Python's signal handlers while it sleeps (the core asks
every 20 ms). What a handler raises (KeyboardInterrupt) stops the wait, not the operation: the
future stays pending, keeps its buffer, and a later wait waits for it again, as a
``concurrent.futures.Future`` does. (A blocking call is never a future and a wait: it is one core
call, which cancels and waits for what the kernel holds before it raises.)
"""

from __future__ import annotations

import enum
import threading
from typing import Any, Callable, Dict, List, Optional

from . import _fork, _nvio


class Count(enum.Enum):
    """What ``PendingFutures.wait_all`` returns."""

    WAITED = "waited"  # every future it waited for (nvio.Handle.wait_all)
    COLLECTED = "collected"  # those no earlier wait had taken (aio_handle.wait: DeepSpeed's count)


class Interrupt(enum.Enum):
    """What a wait does when a signal handler raises (Ctrl-C) while it waits."""

    LEAVE = "leave"  # raise; the operation goes on and stays pending (a wait for a future)
    NEVER = "never"  # do not run the handlers while waiting (a finalizer's drain)


class _Collectors:
    """One lock for the ``_collector`` field of every future, and the condition a thread waits
    on while another thread collects a future it also waits for. A lock and a condition per
    future cost more than the rest of a small read's Python path; two threads waiting for one
    future are rare, so the condition is notified only when a thread waits on it (any collector
    finishing wakes every such waiter, each rechecks its own future). Reset in a forked child,
    where a parent's thread may have held the lock at the fork."""

    def __init__(self) -> None:
        self._after_fork_in_child()
        _fork.track(self)

    def _after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.waiting = 0  # threads in wait(); guarded by lock

    def wait(self) -> None:
        """Waits (lock held) until some collector finishes."""
        self.waiting += 1
        try:
            self.changed.wait()
        finally:
            self.waiting -= 1


_collectors = _Collectors()
get_ident = threading.get_ident


class Future:
    """One asynchronous read or write. Keeps its buffer alive until it has been waited for.

    Thread-safe: several threads may wait for one future; the first one collects the ticket
    (without holding any lock: a signal handler that runs during its wait may use nvio), the
    others wait for it to record the outcome and then find it. Only the process that submitted
    the operation may wait for it (a forked child's copy of the buffer is never filled).
    """

    __slots__ = ("_core", "_ticket", "_nbytes", "_keep_alive", "_then", "_pending", "_taken",
                 "_finished", "_error", "_collector", "_outcome", "_pid")

    def __init__(self, core: Any, nbytes: int, keep_alive: Any, pending: "PendingFutures",
                 then: Optional[Callable[[], None]] = None) -> None:
        """A future for an operation about to be submitted: the core's submit (``core`` or a
        ``_nvio.File`` of it) is handed this future, stores the ticket in it and adds it to
        ``pending`` before it returns (python/src/held.hpp: no Python code runs between the
        submit and the future holding it, where a Ctrl-C would lose the ticket). ``then`` runs
        after the operation succeeded, and what it raises becomes the future's error."""
        self._core = core
        self._ticket: Optional[int] = None  # set by the submit
        self._nbytes = nbytes
        self._keep_alive = keep_alive
        self._then = then
        self._pending = pending  # the set that holds it, from its submit until it finishes
        self._taken = False  # a wait_all has taken it (guarded by the pending set's lock)
        self._finished = False  # set once, by the collector, before it lets the others look
        self._error: Optional[BaseException] = None
        self._collector: Optional[int] = None  # the thread collecting the ticket now (_collectors)
        # Set by the core (collect_into) when it has collected the ticket: (error or None,).
        self._outcome: Optional[tuple] = None
        self._pid = _fork.pid

    def _check_process(self) -> None:
        # Checked before taking a lock (the lock of _collectors is a fresh one in a child, but
        # the operation is not the child's to wait for). Inlined in _wait, the hot path.
        if _fork.pid != self._pid:
            self._refuse_in_child()

    def _refuse_in_child(self) -> None:
        raise _nvio.Error(
            f"nvio: this operation was submitted by process {self._pid} before a fork; only "
            "that process can wait for it (the child has its own copy of the buffer, which the "
            "operation does not fill)"
        )

    def wait(self) -> int:
        """Blocks (without the GIL) until the operation has finished; returns the bytes moved or
        raises its error. Every later call returns or raises the same again. A Ctrl-C meanwhile
        raises KeyboardInterrupt and leaves the operation running and pending (wait again, or
        ``cancel()``)."""
        return self._wait(Interrupt.LEAVE)

    result = wait

    def cancel(self) -> bool:
        """Stops what has not started of the operation: its pieces that no worker has taken are
        skipped, those in flight finish. Returns True when the operation was cut short (its wait
        then raises ``nvio.IOFailure`` with errno ECANCELED; a read or write cancelled has moved
        part of its bytes), False when it had finished or all its pieces had started. Does not
        wait."""
        self._check_process()
        if self._finished:
            return False
        try:
            return self._core.cancel(self._ticket)
        except _nvio.InvalidArgument:  # collected by a wait that is recording its outcome now
            return False

    def done(self) -> bool:
        """True once the operation has finished (successfully or not); never blocks. While
        another thread is waiting for it, it is done once that wait has recorded the outcome."""
        self._check_process()
        if self._finished:
            return True
        with _collectors.lock:
            if self._finished or self._collector is not None:
                return self._finished  # being collected: the core no longer answers for it
            return self._core.done(self._ticket)

    def _wait(self, interrupt: Interrupt) -> int:
        # The per-operation path of every small read: kept to a few Python calls (a test counts
        # them: tests/python/test_call_budget.py).
        if _fork.pid != self._pid:
            self._refuse_in_child()
        if not self._finished:
            collectors = _collectors
            me = get_ident()
            with collectors.lock:
                while not self._finished and self._collector is not None:
                    if self._collector == me:
                        # A signal handler running inside this thread's own wait for the future.
                        raise _nvio.Error(
                            "nvio: a signal handler waited for an operation that the wait it "
                            "interrupted was waiting for; wait for it after the handler returns")
                    collectors.wait()
                collect = not self._finished
                if collect:
                    self._collector = me
            if collect:
                try:
                    self._collect(interrupt)
                finally:
                    with collectors.lock:
                        self._collector = None
                        if collectors.waiting:
                            collectors.changed.notify_all()
        if self._error is not None:
            raise self._error
        return self._nbytes

    def _collect(self, interrupt: Interrupt) -> None:
        """Waits for the ticket and records the outcome; this thread is the collector."""
        self._outcome = None
        try:
            self._core.collect_into(self._ticket, self, interrupt is not Interrupt.NEVER)
        except BaseException as e:
            if self._outcome is not None:
                # Collected, and a signal handler raised as the wait returned (a Ctrl-C landing
                # just then): the outcome stands, and the handler's exception goes on.
                self._record()
                raise
            if not self._core.is_pending(self._ticket):
                self._finish(e)  # refused: the call's own error (an unknown ticket, say)
                return
            raise  # a signal handler raised: the operation runs on, pending
        self._record()

    def _record(self) -> None:
        """Finishes with the outcome the core recorded, after ``then`` when it succeeded."""
        assert self._outcome is not None
        error = self._outcome[0]
        if error is None and self._then is not None:
            try:
                self._then()
            except BaseException as e:
                error = e
        self._finish(error)

    def _finish(self, error: Optional[BaseException]) -> None:
        self._error = error
        self._finished = True
        self._keep_alive = self._then = None
        pending = self._pending
        if pending is not None:
            with pending._lock:  # off the set here, not by a method of it: the hot path
                pending._futures.pop(self, None)

    def __repr__(self) -> str:
        state = "pending" if not self._finished else "failed" if self._error else "done"
        return f"<nvio.Future {state}, {self._nbytes} bytes>"


class PendingFutures:
    """The futures of one handle that have not finished, in submission order. Thread-safe.

    Reset in a forked child (the parent's operations are not the child's: its waits do not count
    them, and the futures themselves refuse to be waited for there).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Insertion-ordered; added by the core's submit (python/src/held.cpp, under _lock),
        # removed when finished.
        self._futures: Dict[Future, None] = {}
        # Futures a Count.COLLECTED wait took and saw finish before a Ctrl-C stopped it: counted
        # by the next such wait (DeepSpeed's wait() counts every operation once).
        self._uncounted = 0
        _fork.track(self)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._futures = {}
        self._uncounted = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._futures)

    def not_taken(self) -> int:
        """How many no wait_all has taken yet."""
        with self._lock:
            return sum(1 for f in self._futures if not f._taken)

    def wait_all(self, count: Count, interrupt: Interrupt = Interrupt.LEAVE) -> int:
        """Waits for every future added before this call, in submission order, including those
        other threads are waiting for; then raises the first failure among them, or returns
        their number (``Count.WAITED``) or the number this call took first (``Count.COLLECTED``:
        each future is counted by exactly one wait_all). A Ctrl-C (``Interrupt.LEAVE``) raises at
        once, leaving the futures not finished yet pending and, for the next wait_all, the count
        of those this one took."""
        with self._lock:
            futures: List[Future] = list(self._futures)
            taken = [f for f in futures if not f._taken]
            for f in taken:
                f._taken = True
        first: Optional[BaseException] = None
        for f in futures:
            try:
                f._wait(interrupt)
            except BaseException as e:
                if not f._finished:  # interrupted: the rest stay pending
                    with self._lock:
                        for g in taken:
                            if g._finished:
                                self._uncounted += 1
                            else:
                                g._taken = False
                    raise
                if first is None:
                    first = e
        if count is Count.COLLECTED:
            with self._lock:
                collected = len(taken) + self._uncounted
                self._uncounted = 0
        if first is not None:
            raise first
        return len(futures) if count is Count.WAITED else collected

    def drain(self, cancel: bool = False) -> None:
        """Waits for every future; their errors stay with them (for their own wait() to raise).
        For finalizers and exits by an exception: I/O must never run on into buffers about to be
        freed. The waits do not run signal handlers, and what a handler raises between them (a
        second Ctrl-C) is dropped and the drain goes on; it stops early only when waits keep
        failing without any future finishing. ``cancel`` first cancels what has not started (an
        exit by Ctrl-C)."""
        if cancel:
            with self._lock:
                futures = list(self._futures)
            for f in futures:
                try:
                    f.cancel()
                except BaseException:
                    pass
        stalled = 0
        while stalled < 3:
            before = len(self)
            try:
                self.wait_all(Count.WAITED, Interrupt.NEVER)
            except BaseException:
                pass
            left = len(self)
            if left == 0:
                return
            stalled = stalled + 1 if left >= before else 0
