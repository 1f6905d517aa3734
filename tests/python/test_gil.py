"""Blocking calls release the GIL: another Python thread keeps running during a large read.

A second thread counts in a loop. Its rate is first measured while the main thread sleeps (which
releases the GIL): that is what "keeps running" looks like on this machine. During a 256 MiB read
the counter must reach a good fraction of that rate. Were the GIL held, the counter would get at
most a switch interval (5 ms) before the call, a few percent of a read of this size.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import nvio

SIZE = 256 * 1024**2
MIN_RATIO = 0.2


class Counter:
    def __init__(self) -> None:
        self.count = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop:
            self.count += 1

    def __enter__(self) -> "Counter":
        self._thread.start()
        while self.count == 0:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join(10)


def _measure(counter: Counter, action) -> "tuple[int, float]":
    c0, t0 = counter.count, time.perf_counter()
    action()
    return counter.count - c0, time.perf_counter() - t0


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gil") / "big.bin"
    data = np.arange(SIZE // 8, dtype=np.uint64)
    nvio.Handle().write(data, path)
    return path, data


@pytest.mark.parametrize("api", ["Handle.read", "aio_handle.sync_pread", "File.read"])
def test_large_read_releases_gil(big_file, api):
    path, expected = big_file
    buf = np.zeros(SIZE // 8, dtype=np.uint64)
    if api == "Handle.read":
        h = nvio.Handle()
        action = lambda: h.read(buf, path)  # noqa: E731
    elif api == "File.read":
        f = nvio.File(path, "r", handle=nvio.Handle())
        action = lambda: f.read(buf, 0)  # noqa: E731
    else:
        a = nvio.aio_handle()
        action = lambda: a.sync_pread(buf, str(path))  # noqa: E731
    action()  # warm the page cache and the bounce pool
    buf[:] = 0

    with Counter() as counter:
        best = 0.0
        for _ in range(3):  # the best of three, so that a noisy neighbour cannot fail the test
            slept, t_sleep = _measure(counter, lambda: time.sleep(0.2))
            rate = slept / t_sleep
            counted, t_read = _measure(counter, action)
            best = max(best, counted / (rate * t_read))
            if best >= MIN_RATIO:
                break
    assert np.array_equal(buf, expected)
    assert best >= MIN_RATIO, (
        f"the counting thread reached only {best:.0%} of its free-running rate during a "
        f"{SIZE >> 20} MiB read of {t_read * 1e3:.0f} ms: the read holds the GIL")


def test_async_wait_releases_gil(big_file):
    path, expected = big_file
    buf = np.zeros(SIZE // 8, dtype=np.uint64)
    a = nvio.aio_handle()
    with Counter() as counter:
        slept, t_sleep = _measure(counter, lambda: time.sleep(0.2))
        rate = slept / t_sleep

        def action():
            assert a.async_pread(buf, str(path)) == 0
            assert a.wait() == 1

        counted, t_read = _measure(counter, action)
    assert np.array_equal(buf, expected)
    assert counted >= MIN_RATIO * rate * t_read * 0.5


def test_large_write_releases_gil(tmp_path, big_file):
    _, data = big_file
    h = nvio.Handle()
    with Counter() as counter:
        slept, t_sleep = _measure(counter, lambda: time.sleep(0.2))
        rate = slept / t_sleep
        counted, t_write = _measure(counter, lambda: h.write(data, tmp_path / "w.bin"))
    assert counted >= MIN_RATIO * rate * t_write * 0.5
    out = np.zeros_like(data)
    h.read(out, tmp_path / "w.bin")
    assert np.array_equal(out, data)


def test_gil_check_detects_a_gil_holding_call():
    """The measurement itself can fail: a C call that holds the GIL throughout (sorted() of a
    list of floats runs no bytecode, so it never reaches a switch point) scores low."""
    values = np.random.default_rng(0).random(1_500_000).tolist()
    with Counter() as counter:
        slept, t_sleep = _measure(counter, lambda: time.sleep(0.2))
        rate = slept / t_sleep
        counted, t_busy = _measure(counter, lambda: sorted(values))
    if t_busy < 0.1:
        pytest.skip(f"the GIL-holding reference call took only {t_busy * 1e3:.0f} ms")
    assert counted / (rate * t_busy) < MIN_RATIO
