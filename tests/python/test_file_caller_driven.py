"""Small blocking reads run by the calling thread (issue 32 item 6, src/handle/caller_lane.hpp):
bytes and counters the same as through the workers (NVIO_CALLER_DRIVEN=off) on every engine,
threads sharing a File, and Ctrl-C during a loop of small reads raising KeyboardInterrupt with
nothing written into the buffer afterwards."""

from __future__ import annotations

import _thread
import threading
import time

import numpy as np
import pytest

import nvio
from conftest import random_bytes, write_file

CASES = ((4096, 0), (1, 3), (4095, 4097), (5000, 1), (65536, 511), (65537, 0))


def _at(n: int, misalign: int) -> np.ndarray:
    """n zero bytes whose address is `misalign` past a 4 KiB boundary: which pieces go direct and
    which bounce depends on it, so it must not be left to where the allocator happens to put it."""
    raw = np.zeros(n + 2 * 4096, dtype=np.uint8)
    start = (-raw.ctypes.data) % 4096 + misalign
    return raw[start:start + n]


def _reads(h: nvio.Handle, path: str, data: bytes) -> None:
    with nvio.File(path, "r", handle=h) as f:
        for n, off in CASES:
            a = _at(n, 0)
            assert f.read(a, off) == n
            assert a.tobytes() == data[off:off + n], (n, off)
            b = _at(n, 1)  # an unaligned buffer
            h.read(b, path, off)
            assert b.tobytes() == data[off:off + n], ("by path", n, off)
        with pytest.raises(nvio.ShortFile):
            f.read(np.zeros(8192, dtype=np.uint8), len(data) - 100)


@pytest.mark.parametrize("setting", ["on", "off"])
def test_small_reads_match_the_file_every_engine(tmp_path, engine, monkeypatch, setting):
    monkeypatch.setenv("NVIO_CALLER_DRIVEN", setting)
    data = random_bytes(256 * 1024 + 5, seed=11)
    path = write_file(tmp_path / "f.bin", data)
    with nvio.Handle(engine=engine) as h:
        _reads(h, path, data)


def test_counters_are_those_of_the_workers(tmp_path, monkeypatch):
    # Which pieces bounce must depend on the lane alone: buffers at fixed alignments (_at; a
    # buffer that fell on a page by chance once made 4096 vs 8192 bounced bytes in CI) and cached
    # reads off (with them on, the plan follows what the page cache holds at that moment).
    monkeypatch.setenv("NVIO_CACHED_READS", "off")
    data = random_bytes(256 * 1024 + 5, seed=12)
    path = write_file(tmp_path / "f.bin", data)
    stats = {}
    for setting in ("on", "off"):
        monkeypatch.setenv("NVIO_CALLER_DRIVEN", setting)
        with nvio.Handle() as h:
            _reads(h, path, data)
            stats[setting] = h.stats()
    for key in ("reads", "bytes_read", "pieces", "errors", "bounced_bytes", "edge_bytes"):
        assert stats["on"][key] == stats["off"][key], key


def test_threads_sharing_a_file_read_their_bytes(tmp_path, engine):
    data = random_bytes(1 << 20, seed=13)
    path = write_file(tmp_path / "t.bin", data)
    bad = []
    with nvio.Handle(engine=engine) as h, nvio.File(path, "r", handle=h) as f:
        def run(t: int) -> None:
            a = np.zeros(9000, dtype=np.uint8)
            for i in range(200):
                n = 1 + (i * 977 + t * 31) % 9000
                off = (i * 40961 + t * 4096) % (len(data) - n)
                f.read(a[:n], off)
                if a[:n].tobytes() != data[off:off + n]:
                    bad.append((t, n, off))

        threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert bad == []


def test_ctrl_c_during_small_reads_raises_and_the_buffer_settles(tmp_path):
    data = random_bytes(1 << 20, seed=14)
    path = write_file(tmp_path / "c.bin", data)
    a = np.zeros(4096, dtype=np.uint8)
    with nvio.Handle() as h, nvio.File(path, "r", handle=h) as f:
        sender = threading.Timer(0.2, _thread.interrupt_main)
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            sender.start()
            i = 0
            while time.monotonic() - start < 30:
                f.read(a, (i * 4096) % len(data))
                i += 1
        assert time.monotonic() - start < 10
        sender.join()
        before = a.copy()
        time.sleep(0.05)
        assert np.array_equal(a, before), "the buffer changed after the call had raised"
        f.read(a, 8192)
        assert a.tobytes() == data[8192:8192 + 4096]
