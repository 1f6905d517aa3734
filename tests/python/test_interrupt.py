"""Ctrl-C during nvio's waits: a blocking call stops, cancels what has not started, waits for
what the kernel holds and raises KeyboardInterrupt; a wait for a future raises and leaves the
future pending. The signal comes from another thread once the operation is under way (a real
SIGINT, or ``_thread.interrupt_main``) while the main thread waits in nvio without the GIL.

The operations are made long by their shape, not by a test seam: one 4 KiB piece at a time
(queue depth 1, one worker) with O_DIRECT where the directory supports it, thousands of pieces.
Each test retries with a larger transfer when the whole of it finished before the signal landed
(a machine faster than expected), and fails when none could be cut short.
"""

from __future__ import annotations

import _thread
import errno
import os
import signal
import threading
import time

import numpy as np
import pytest

import nvio
from conftest import direct_io_supported

PIECE = 4096
SIZES = (16 << 20, 64 << 20, 256 << 20)  # tried in turn until one is cut short
SENTINEL = 0xA5


def _pattern(n: int) -> np.ndarray:
    """Each 8-byte word holds its own file offset: a byte out of place names where it came from."""
    return (np.arange(n // 8, dtype=np.uint64) * 8).view(np.uint8)


def _buffer(size: int) -> np.ndarray:
    """`size` sentinel bytes at a page-aligned address: each piece goes straight between the
    file and its place, so a cancelled read leaves every piece whole or untouched. (Where the
    address does not suit O_DIRECT the pieces land shifted and move into place one by one, and
    the bytes past the last piece moved are undefined after a cancel.)"""
    raw = np.full(size + 4096, SENTINEL, np.uint8)
    skip = -raw.ctypes.data % 4096
    return raw[skip:skip + size]


def _slow_handle(directory) -> nvio.Handle:
    return nvio.Handle(block_size=PIECE, queue_depth=1, intra_op_parallelism=1,
                       direct="auto" if direct_io_supported(directory) else "off")


def _signal_when_started(h, how: str) -> threading.Thread:
    """A thread that sends the interrupt once `h` has finished its first piece."""
    def run() -> None:
        deadline = time.monotonic() + 30
        while h.stats()["pieces"] == 0 and time.monotonic() < deadline:
            time.sleep(0.0005)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            _thread.interrupt_main()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _pieces(buf: np.ndarray, expected: np.ndarray) -> "tuple[int, int]":
    """(pieces holding the file's bytes, pieces untouched); fails on any other piece."""
    done = untouched = 0
    for at in range(0, len(buf), PIECE):
        got = buf[at:at + PIECE]
        if np.array_equal(got, expected[at:at + PIECE]):
            done += 1
        elif (got == SENTINEL).all():
            untouched += 1
        else:
            pytest.fail(f"piece at {at} is neither the file's bytes nor untouched")
    return done, untouched


def _settled(buf: np.ndarray) -> None:
    """Nothing writes into `buf` any more: the kernel was done before the call raised."""
    before = buf.copy()
    time.sleep(0.05)
    assert np.array_equal(buf, before), "the buffer changed after the call had raised"


@pytest.mark.parametrize("how", ["kill", "interrupt_main"])
def test_ctrl_c_stops_a_blocking_read_after_cancelling_it(tmp_path, how):
    for size in SIZES:
        path = tmp_path / "data"
        expected = _pattern(size)
        expected.tofile(path)
        h = _slow_handle(tmp_path)
        buf = _buffer(size)
        sender = _signal_when_started(h, how)
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            h.read(buf, str(path))
            time.sleep(5)  # finished before the signal: it lands here
        elapsed = time.monotonic() - start
        sender.join(30)
        _settled(buf)
        done, untouched = _pieces(buf, expected)
        if untouched == 0:
            continue  # the read finished before the signal landed: a larger one
        assert done >= 1
        assert h.stats()["errors"] == {errno.ECANCELED: 1}
        assert elapsed < 5
        # The handle goes on: the same read, not interrupted, moves every byte.
        h.read(buf, str(path))
        assert np.array_equal(buf, expected)
        return
    pytest.fail(f"no read of up to {SIZES[-1]} bytes could be cut short")


def test_ctrl_c_stops_a_blocking_write_batch_and_the_rest_of_the_file_is_as_it_was(tmp_path):
    for size in SIZES:
        path = tmp_path / "data"
        np.full(size, 0x11, np.uint8).tofile(path)
        data = _pattern(size)
        half = size // 2
        h = _slow_handle(tmp_path)
        sender = _signal_when_started(h, "interrupt_main")
        with pytest.raises(KeyboardInterrupt):
            h.write_batch([(data[:half], 0), (data[half:], half)], str(path))
            time.sleep(5)
        sender.join(30)
        on_disk = np.fromfile(path, np.uint8)
        assert len(on_disk) == size
        written = 0
        for at in range(0, size, PIECE):
            got = on_disk[at:at + PIECE]
            if np.array_equal(got, data[at:at + PIECE]):
                written += 1
            else:
                assert (got == 0x11).all(), f"piece at {at} is neither written nor as it was"
        if written == size // PIECE:
            continue
        assert written >= 1
        errors = h.stats()["errors"]
        assert list(errors) == [errno.ECANCELED] and errors[errno.ECANCELED] >= 1
        return
    pytest.fail(f"no write of up to {SIZES[-1]} bytes could be cut short")


def test_ctrl_c_during_a_futures_wait_leaves_it_running_to_the_end(tmp_path):
    for size in SIZES:
        path = tmp_path / "data"
        expected = _pattern(size)
        expected.tofile(path)
        h = _slow_handle(tmp_path)
        buf = _buffer(size)
        future = h.read_async(buf, str(path))
        sender = _signal_when_started(h, "interrupt_main")
        with pytest.raises(KeyboardInterrupt):
            future.wait()
            time.sleep(5)
        sender.join(30)
        if future.done() and np.array_equal(buf, expected):
            future.wait()
            continue  # finished before the signal landed
        # Not cancelled: waited for again, it moves every byte.
        assert future.wait() == size
        assert np.array_equal(buf, expected)
        assert h.stats()["errors"] == {}
        return
    pytest.fail(f"no read of up to {SIZES[-1]} bytes was still running when the signal came")


def test_cancel_cuts_a_future_short_and_its_wait_raises_ecanceled(tmp_path):
    for size in SIZES:
        path = tmp_path / "data"
        expected = _pattern(size)
        expected.tofile(path)
        h = _slow_handle(tmp_path)
        buf = _buffer(size)
        future = h.read_async(buf, str(path))
        deadline = time.monotonic() + 60
        while h.stats()["pieces"] == 0:
            assert time.monotonic() < deadline, "the read never started"
            time.sleep(0.0005)
        if not future.cancel():
            future.wait()
            continue  # every piece had started
        with pytest.raises(nvio.IOFailure) as info:
            future.wait()
        assert info.value.errno == errno.ECANCELED
        assert info.value.path == str(path)
        assert info.value.length == size
        _settled(buf)
        done, untouched = _pieces(buf, expected)
        assert done >= 1 and untouched >= 1
        assert not future.cancel()  # finished now
        return
    pytest.fail(f"no read of up to {SIZES[-1]} bytes could be cancelled")


def test_ctrl_c_stops_an_aio_handle_sync_pread_after_cancelling_it(tmp_path):
    for size in SIZES:
        path = tmp_path / "data"
        expected = _pattern(size)
        expected.tofile(path)
        h = nvio.aio_handle(block_size=PIECE, queue_depth=1, single_submit=False,
                            overlap_events=False, intra_op_parallelism=1)
        buf = _buffer(size)
        sender = _signal_when_started(h, "interrupt_main")
        with pytest.raises(KeyboardInterrupt):
            h.sync_pread(buf, str(path))
            time.sleep(5)
        sender.join(30)
        _settled(buf)
        done, untouched = _pieces(buf, expected)
        if untouched == 0:
            continue
        assert h.stats()["errors"] == {errno.ECANCELED: 1}
        return
    pytest.fail(f"no sync_pread of up to {SIZES[-1]} bytes could be cut short")


def test_ctrl_c_during_nvio_save_leaves_no_file_behind(tmp_path):
    torch = pytest.importorskip("torch")
    for size in SIZES:
        handle = _slow_handle(tmp_path)
        state = {"w": torch.arange(size // 8, dtype=torch.int64)}
        target = tmp_path / "ckpt.nvio"
        sender = _signal_when_started(handle, "interrupt_main")
        with pytest.raises(KeyboardInterrupt):
            nvio.save(state, str(target), handle=handle)
            time.sleep(5)
        sender.join(30)
        if errno.ECANCELED not in handle.stats()["errors"]:
            # The signal landed outside nvio's write (in Python code): not what this tests.
            if target.exists():
                target.unlink()
            continue
        assert os.listdir(tmp_path) == [], "the temporary file was left behind"
        return
    pytest.fail(f"no save of up to {SIZES[-1]} bytes could be interrupted")


def test_ctrl_c_stops_a_striped_read_on_every_drive(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    for size in SIZES:
        h = nvio.StripedHandle([str(d) for d in dirs], stripe_size=PIECE, block_size=PIECE,
                               queue_depth=1, intra_op_parallelism=1,
                               direct="auto" if direct_io_supported(tmp_path) else "off")
        expected = _pattern(size)
        h.write(expected, "s")
        buf = _buffer(size)
        pieces_before = h.stats()["pieces"]

        def send() -> None:
            while h.stats()["pieces"] == pieces_before:
                time.sleep(0.0005)
            _thread.interrupt_main()
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        with pytest.raises(KeyboardInterrupt):
            h.read(buf, "s")
            time.sleep(5)
        sender.join(30)
        _settled(buf)
        done, untouched = _pieces(buf, expected)
        if untouched == 0:
            continue
        assert done >= 1
        assert errno.ECANCELED in h.stats()["errors"]
        return
    pytest.fail(f"no striped read of up to {SIZES[-1]} bytes could be cut short")
