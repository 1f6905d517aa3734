"""nvio.Future and the pending futures of a handle (python/nvio/_future.py), shared by
``nvio.Handle`` and the DeepSpeed-compatible ``aio_handle``.

The order, counting and outcome rules are tested against a scripted core (which records what was
waited for and when); what needs real I/O (buffers kept alive, a handle dropped with I/O in
flight, fork) against the real one.
"""

from __future__ import annotations

import errno
import gc
import os
import threading
import time
import weakref

import numpy as np
import pytest

import nvio
from conftest import random_bytes, start_waiting, wait_child, write_file
from nvio._future import Count, Future, PendingFutures


class ScriptedCore:
    """Stands in for the core handle: tickets in ``failing`` fail; a ticket in ``blocking``
    blocks its wait until ``release`` is set. Like the core, ``done()`` refuses a ticket being
    collected or already collected, and a ticket can be waited for once."""

    def __init__(self, failing=(), blocking=(), interrupting=(), late=()) -> None:
        self.failing = {t: nvio.InvalidArgument(f"ticket {t} failed") for t in failing}
        self.blocking = set(blocking)
        # Tickets whose next wait with signals on is interrupted (KeyboardInterrupt, the ticket
        # left pending), as a Ctrl-C during the core's wait does.
        self.interrupting = set(interrupting)
        # Tickets collected, and then a KeyboardInterrupt as the call returns (a Ctrl-C landing
        # just as the wait ends).
        self.late = set(late)
        self.release = threading.Event()
        self.collecting = threading.Event()
        self.waited: "list[int]" = []
        self.calls: "list[tuple]" = []  # (what, ticket[, signals]) in order

    def collect_into(self, ticket: int, future, signals: bool = True) -> None:
        self.calls.append(("wait", ticket, signals))
        if ticket in self.waited:
            raise nvio.InvalidArgument(f"ticket {ticket} is unknown or was already waited for")
        if signals and ticket in self.interrupting:
            self.interrupting.discard(ticket)
            raise KeyboardInterrupt
        self.waited.append(ticket)
        if ticket in self.blocking:
            self.collecting.set()
            assert self.release.wait(30), "the test never released the ticket"
        future._outcome = (self.failing.get(ticket),)
        if ticket in self.late:
            raise KeyboardInterrupt

    def done(self, ticket: int) -> bool:
        if ticket in self.waited:
            raise nvio.InvalidArgument(f"ticket {ticket} is unknown or was already waited for")
        return False

    def is_pending(self, ticket: int) -> bool:
        return ticket not in self.waited

    def cancel(self, ticket: int) -> bool:
        self.calls.append(("cancel", ticket))
        return ticket not in self.waited


class Owner:
    """A buffer owner that a weak reference can watch."""


def _submitted(core: ScriptedCore, ticket: int, nbytes: int, owner, pending=None, then=None):
    """A future as a core's submit leaves it (python/src/held.cpp): holding ``ticket``, in its
    pending set (a set of its own unless ``pending`` is given)."""
    future = Future(core, nbytes, owner, PendingFutures() if pending is None else pending, then)
    future._ticket = ticket
    with future._pending._lock:
        future._pending._futures[future] = None
    return future


def _futures(core: ScriptedCore, tickets, pending: PendingFutures) -> "list[Future]":
    return [_submitted(core, t, 100 + t, Owner(), pending) for t in tickets]


# --------------------------------------------------------------------------------------------
# Scripted core: order, counts, outcomes
# --------------------------------------------------------------------------------------------


def test_wait_all_waits_for_all_in_submission_order_and_raises_the_first_failure():
    core = ScriptedCore(failing=(3, 1))
    pending = PendingFutures()
    futures = _futures(core, [5, 3, 9, 1], pending)
    with pytest.raises(nvio.InvalidArgument) as info:
        pending.wait_all(Count.WAITED)
    assert info.value is core.failing[3]  # the first failure in submission order
    assert core.waited == [5, 3, 9, 1]  # every one, also after the failure
    assert len(pending) == 0
    assert futures[0].result() == 105 and futures[2].result() == 109
    for f, t in ((futures[1], 3), (futures[3], 1)):
        with pytest.raises(nvio.InvalidArgument) as info:
            f.wait()
        assert info.value is core.failing[t]
    assert core.waited == [5, 3, 9, 1]  # the outcomes were recorded, not waited for again


def test_a_ctrl_c_during_a_wait_leaves_the_future_pending_with_its_buffer():
    core = ScriptedCore(interrupting=(1,))
    pending = PendingFutures()
    owner = Owner()
    future = _submitted(core, 1, 101, owner, pending)
    with pytest.raises(KeyboardInterrupt):
        future.wait()
    assert not future.done()
    assert future._keep_alive is owner  # the kernel may still write into it
    assert len(pending) == 1
    assert future.wait() == 101  # waited for again, to the end
    assert future._keep_alive is None and len(pending) == 0
    assert core.calls == [("wait", 1, True), ("wait", 1, True)]


def test_a_ctrl_c_stops_wait_all_at_once_and_leaves_the_rest_pending():
    core = ScriptedCore(interrupting=(2,))
    pending = PendingFutures()
    futures = _futures(core, [1, 2, 3], pending)
    with pytest.raises(KeyboardInterrupt):
        pending.wait_all(Count.WAITED)
    assert core.waited == [1]  # not 3: the wait stopped at the interrupted one
    assert futures[0].done() and not futures[1].done() and not futures[2].done()
    assert pending.wait_all(Count.WAITED) == 2  # the first finished and left the set
    assert core.waited == [1, 2, 3]


def test_a_ctrl_c_as_the_wait_ends_leaves_the_outcome_and_goes_on():
    core = ScriptedCore(late=(4,))
    owner = Owner()
    future = _submitted(core, 4, 104, owner)
    with pytest.raises(KeyboardInterrupt):
        future.wait()
    assert future.done() and future._keep_alive is None
    assert future.wait() == 104  # the operation's outcome, not the interrupt
    assert core.calls == [("wait", 4, True)]


def test_a_handler_waiting_for_the_future_its_wait_interrupted_gets_an_error():
    core = ScriptedCore()
    future = _submitted(core, 6, 106, Owner())
    seen = []

    def handler_inside_the_wait(ticket, fut, signals):
        # What a signal handler run by the core during this wait would do: wait for the same
        # future. It must fail at once rather than wait for the lock its own thread holds.
        with pytest.raises(nvio.Error, match="signal handler"):
            fut.wait()
        seen.append(True)
        return ScriptedCore.collect_into(core, ticket, fut, signals)

    core.collect_into = handler_inside_the_wait
    assert future.wait() == 106
    assert seen == [True]


def test_an_aio_wait_interrupted_leaves_its_count_to_the_next_wait():
    core = ScriptedCore(interrupting=(2,))
    pending = PendingFutures()
    _futures(core, [1, 2, 3], pending)
    with pytest.raises(KeyboardInterrupt):
        pending.wait_all(Count.COLLECTED)
    assert pending.wait_all(Count.COLLECTED) == 3  # 1 finished in the interrupted wait, 2 and 3 now
    assert pending.wait_all(Count.COLLECTED) == 0


def test_drain_never_runs_the_handlers_and_cancels_on_request():
    core = ScriptedCore(interrupting=(1, 2))
    pending = PendingFutures()
    _futures(core, [1, 2], pending)
    pending.drain(cancel=True)
    assert core.calls == [("cancel", 1), ("cancel", 2), ("wait", 1, False), ("wait", 2, False)]
    assert len(pending) == 0


def test_counts_waited_and_collected():
    core = ScriptedCore()
    pending = PendingFutures()
    first = _futures(core, [1, 2, 3], pending)
    first[1].wait()  # waited for by itself: no wait_all counts it
    assert pending.not_taken() == 2
    assert pending.wait_all(Count.COLLECTED) == 2
    assert pending.wait_all(Count.COLLECTED) == 0
    _futures(core, [4, 5], pending)
    assert pending.wait_all(Count.WAITED) == 2
    assert pending.wait_all(Count.WAITED) == 0
    assert core.waited == [2, 1, 3, 4, 5]


def test_a_future_taken_by_another_wait_is_waited_for_but_counted_there():
    core = ScriptedCore(blocking=(1,))
    pending = PendingFutures()
    _futures(core, [1, 2], pending)
    counts = []
    other = threading.Thread(target=lambda: counts.append(pending.wait_all(Count.COLLECTED)))
    other.start()
    assert core.collecting.wait(30)
    assert pending.not_taken() == 0
    mine = threading.Thread(target=lambda: counts.append(pending.wait_all(Count.COLLECTED)))
    mine.start()
    mine.join(0.2)
    assert mine.is_alive(), "a wait returned while an operation it must wait for was in flight"
    core.release.set()
    other.join(30)
    mine.join(30)
    assert sorted(counts) == [0, 2]
    assert core.waited == [1, 2]


def test_wait_twice_gives_the_same_result_or_the_same_error():
    core = ScriptedCore(failing=(2,))
    ok, bad = _submitted(core, 1, 11, Owner()), _submitted(core, 2, 22, Owner())
    assert ok.wait() == 11 and ok.wait() == 11 and ok.result() == 11
    errors = []
    for _ in range(3):
        with pytest.raises(nvio.InvalidArgument) as info:
            bad.result()
        errors.append(info.value)
    assert all(e is core.failing[2] for e in errors)
    assert core.waited == [1, 2]  # one core wait each
    assert ok.done() and bad.done()


def test_several_threads_waiting_for_one_future_all_see_its_error():
    core = ScriptedCore(failing=(7,), blocking=(7,))
    fut = _submitted(core, 7, 1, Owner())
    seen = []

    def wait():  # a thread that does not see the error adds nothing to `seen`
        with pytest.raises(nvio.InvalidArgument) as info:
            fut.wait()
        seen.append(info.value)

    threads = [threading.Thread(target=wait) for _ in range(4)]
    for t in threads:
        t.start()
    assert core.collecting.wait(30)
    core.release.set()
    for t in threads:
        t.join(30)
    assert len(seen) == 4 and all(e is core.failing[7] for e in seen)
    assert core.waited == [7]


def test_then_runs_after_success_only_and_its_error_is_the_outcome():
    calls = []

    def check():
        calls.append(1)
        raise nvio.ValidationError("differs")

    core = ScriptedCore(failing=(2,))
    with pytest.raises(nvio.ValidationError):
        _submitted(core, 1, 1, Owner(), then=check).wait()
    with pytest.raises(nvio.InvalidArgument):
        _submitted(core, 2, 1, Owner(), then=check).wait()
    assert calls == [1]


def test_done_never_blocks_while_another_thread_collects_the_ticket():
    core = ScriptedCore(blocking=(1,))
    fut = _submitted(core, 1, 1, Owner())
    assert not fut.done()  # asks the core
    waiter = threading.Thread(target=fut.wait)
    waiter.start()
    assert core.collecting.wait(30)
    answers = []
    asker = threading.Thread(target=lambda: answers.append(fut.done()))
    asker.start()
    asker.join(5)
    assert not asker.is_alive(), "done() blocked on another thread's wait"
    assert answers == [False]
    core.release.set()
    waiter.join(30)
    assert fut.done()


def test_the_keep_alive_is_released_once_the_future_has_finished():
    core = ScriptedCore()
    pending = PendingFutures()
    owner = Owner()
    watch = weakref.ref(owner)
    fut = _submitted(core, 1, 1, owner, pending)
    del owner
    gc.collect()
    assert watch() is not None, "the future let its buffer go while the operation was pending"
    pending.wait_all(Count.WAITED)
    gc.collect()
    assert watch() is None and fut.done()


# --------------------------------------------------------------------------------------------
# Real core
# --------------------------------------------------------------------------------------------


def _slow_handle() -> nvio.Handle:
    return nvio.Handle(block_size=4096, queue_depth=1, intra_op_parallelism=1)


def test_handle_futures_keep_a_dropped_array_alive_and_release_it(tmp_path):
    data = random_bytes((4 << 20) + 123, seed=21)
    path = write_file(tmp_path / "k.bin", data)
    h = _slow_handle()
    base = np.zeros(len(data) + 2, np.uint8)
    view = base[1:-1]  # an array object of its own, which only the future will hold
    watch = weakref.ref(view)
    fut = h.read_async(view, path)
    del view
    gc.collect()
    assert watch() is not None, "the array was freed while the read was in flight"
    assert fut.wait() == len(data)
    gc.collect()
    assert watch() is None, "the future kept its buffer after it had finished"
    assert base[1:-1].tobytes() == data and base[0] == 0 and base[-1] == 0


def _failing_write(h: nvio.Handle, read_only_fd: int, n: int) -> nvio.Future:
    """A write that is queued and then fails (EBADF) when it runs."""
    return h.write_async(bytearray(n), read_only_fd)


def test_dropping_a_handle_waits_for_its_futures_which_keep_their_outcome(tmp_path):
    data = random_bytes(8 << 20, seed=22)
    path = write_file(tmp_path / "d.bin", data)
    fd = os.open(path, os.O_RDONLY)
    try:
        h = _slow_handle()
        buf = bytearray(len(data))
        fut = h.read_async(buf, path)
        bad = _failing_write(h, fd, 4095)
        del h
        gc.collect()
        assert fut.done() and bad.done()  # the handle's finalizer waited for both
        assert fut.result() == len(data) and bytes(buf) == data
        with pytest.raises(nvio.IOFailure) as info:
            bad.wait()
        assert info.value.errno == errno.EBADF
    finally:
        os.close(fd)


def test_a_failure_raised_by_wait_all_is_raised_again_by_its_future(tmp_path):
    data = random_bytes(100_003, seed=26)
    path = write_file(tmp_path / "s.bin", data)
    fd = os.open(path, os.O_RDONLY)
    try:
        h = nvio.Handle()
        good = h.read_async(bytearray(len(data)), path)
        bad = _failing_write(h, fd, 1)
        with pytest.raises(nvio.IOFailure) as info:
            h.wait_all()
        assert info.value.errno == errno.EBADF
        with pytest.raises(nvio.IOFailure) as again:
            bad.result()
        assert again.value is info.value
        assert good.result() == len(data)
        assert h.wait_all() == 0
    finally:
        os.close(fd)


def test_aio_validate_failure_is_the_outcome_of_the_wait(tmp_path):
    """validate=True compares buffer and file when wait() collects the read: a file changed after
    the read finished makes that wait raise, naming the first differing byte."""
    data = random_bytes(100_003, seed=23)
    path = write_file(tmp_path / "v.bin", data)
    a = nvio.aio_handle()
    good, checked = bytearray(len(data)), bytearray(len(data))
    assert a.async_pread(good, path) == 0
    assert a.pread(checked, path, True, True, 0) == 0  # validate, async
    futures = list(a._pending._futures)
    assert len(futures) == 2
    deadline = time.monotonic() + 30
    while not all(f.done() for f in futures):
        assert time.monotonic() < deadline, "the reads never finished"
        time.sleep(0.001)
    with open(path, "r+b") as f:
        f.seek(4096 + 17)
        f.write(bytes([data[4096 + 17] ^ 0xFF]))
    with pytest.raises(nvio.ValidationError) as info:
        a.wait()
    assert "differ first at byte 4113" in str(info.value)
    assert bytes(good) == data and bytes(checked) == data
    assert a.wait() == 0  # both were collected by the wait that raised


def test_forked_child_refuses_a_parent_future_a_parent_thread_is_waiting_for(tmp_path):
    data = random_bytes(16 << 20, seed=24)
    path = write_file(tmp_path / "f.bin", data)
    small = random_bytes(4095, seed=25)
    small_path = write_file(tmp_path / "small.bin", small)
    h = _slow_handle()
    buf = bytearray(len(data))
    fut = h.read_async(buf, path)
    waiter = start_waiting(fut)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for call in (fut.done, fut.wait, fut.result):
                try:
                    call()
                    code = 4
                    break
                except nvio.Error as e:
                    if "before a fork" not in str(e):
                        code = 5
                        break
            else:
                assert h.wait_all() == 0  # the parent's future is not the child's
                mine = bytearray(len(small))
                child_fut = h.read_async(mine, small_path)
                assert h.wait_all() == 1 and child_fut.result() == len(small)
                code = 0 if bytes(mine) == small else 6
        except BaseException:
            code = 3
        os._exit(code)
    assert wait_child(pid) == 0
    waiter.join(60)
    assert fut.result() == len(data) and bytes(buf) == data
    assert h.wait_all() == 0
