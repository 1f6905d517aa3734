"""h.stats(): the handle's counters after known reads and writes, on nvio.Handle and aio_handle,
per engine (the counting itself is tested in depth by tests/cpp/stats_test.cpp)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import nvio
from conftest import direct_io_supported, read_file, wait_child

KEYS = {
    "reads", "writes", "bytes_read", "bytes_written", "pieces", "retries", "short_transfers",
    "bounced_bytes", "edge_bytes", "gds_bytes", "device_bounce_bytes", "shifted_bytes", "cached_bytes",
    "errors",
}
BLOCK = 256 << 10
SIZE = (1 << 20) + 123
OFFSET = 4096 + 17


def zeros() -> dict:
    return {key: 0 for key in KEYS} | {"errors": {}}


def test_fresh_handle_counts_nothing(engine):
    assert nvio.Handle(engine=engine).stats() == zeros()


def test_buffered_write_and_read(tmp_path, engine):
    # Without direct I/O: block pieces only, whatever the offset and the buffer.
    h = nvio.Handle(engine=engine, direct="off", block_size=BLOCK)
    data = np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8)
    path = str(tmp_path / "f.bin")
    assert h.write(data, path, OFFSET) == SIZE
    back = np.zeros(SIZE, dtype=np.uint8)
    assert h.read(back, path, OFFSET) == SIZE
    assert bytes(back) == bytes(data) == read_file(path, OFFSET)
    pieces = -(-SIZE // BLOCK)
    assert h.stats() == zeros() | {
        "reads": 1, "writes": 1, "bytes_read": SIZE, "bytes_written": SIZE, "pieces": 2 * pieces,
    }


def test_direct_write_counts_edges_and_bounces(tmp_path, engine):
    if not direct_io_supported(tmp_path):
        pytest.skip("no O_DIRECT here: no edges")
    # A page-aligned buffer at an offset 17 bytes past a page: the middle's memory starts 4079
    # bytes into the buffer, not aligned for O_DIRECT, so it bounces.
    h = nvio.Handle(engine=engine, direct="on", block_size=BLOCK)
    buf = nvio.empty_locked(SIZE, np.uint8)
    buf[:] = np.random.default_rng(2).integers(0, 256, SIZE, dtype=np.uint8)
    path = str(tmp_path / "d.bin")
    h.write(buf, path, OFFSET)
    assert read_file(path, OFFSET) == bytes(buf)
    align = max(nvio.report(str(tmp_path))["dir"]["offset_align"], os.sysconf("SC_PAGE_SIZE"),
                os.stat(path).st_blksize)
    head_end, tail_begin = -(-OFFSET // align) * align, (OFFSET + SIZE) // align * align
    middle = tail_begin - head_end
    s = h.stats()
    assert s["writes"] == 1 and s["bytes_written"] == SIZE
    assert s["edge_bytes"] == SIZE - middle
    assert s["pieces"] == -(-middle // max(align, BLOCK)) + 2
    mem_align = nvio.report(str(tmp_path))["dir"]["mem_align"]
    assert s["bounced_bytes"] == (middle if mem_align > 1 else 0)
    assert s["retries"] == s["short_transfers"] == s["reads"] == 0 and s["errors"] == {}


def test_cached_reads_count_what_came_from_the_page_cache(tmp_path, engine):
    if not direct_io_supported(tmp_path):
        pytest.skip("no O_DIRECT here: every read goes through the page cache anyway")
    # Written through the page cache, so cached: cached_reads=auto reads it from there, off direct.
    data = np.random.default_rng(3).integers(0, 256, 4 * SIZE, dtype=np.uint8)
    path = str(tmp_path / "c.bin")
    data.tofile(path)
    for mode, cached in (("auto", len(data) - OFFSET), ("off", 0)):
        h = nvio.Handle(engine=engine, direct="auto", cached_reads=mode)
        back = np.zeros(len(data) - OFFSET, dtype=np.uint8)
        assert h.read(back, path, OFFSET) == len(back)
        assert bytes(back) == bytes(data[OFFSET:]), mode
        assert h.stats()["cached_bytes"] == cached, mode


@pytest.mark.parametrize("env", [None, "auto", "off"])
def test_nvio_cached_reads_in_the_environment_reaches_aio_handle(tmp_path, monkeypatch, env):
    """aio_handle takes no cached_reads argument (DeepSpeed has none): the default (auto) or
    NVIO_CACHED_READS decides, as for nvio.Handle."""
    if not direct_io_supported(tmp_path):
        pytest.skip("no O_DIRECT here: every read goes through the page cache anyway")
    data = np.random.default_rng(4).integers(0, 256, 4 * SIZE, dtype=np.uint8)
    path = str(tmp_path / "e.bin")
    data.tofile(path)  # through the page cache: cached
    if env is None:
        monkeypatch.delenv("NVIO_CACHED_READS", raising=False)
    else:
        monkeypatch.setenv("NVIO_CACHED_READS", env)
    h = nvio.aio_handle(block_size=BLOCK, queue_depth=8)
    back = np.zeros(len(data), dtype=np.uint8)
    assert h.sync_pread(back, path) == 1
    assert bytes(back) == bytes(data)
    assert h.stats()["cached_bytes"] == (0 if env == "off" else len(data))


def test_aio_handle_stats(tmp_path):
    h = nvio.aio_handle(block_size=BLOCK, queue_depth=8)
    data = np.arange(SIZE, dtype=np.uint8)
    path = str(tmp_path / "a.bin")
    h.sync_pwrite(data, path)
    back = np.zeros(SIZE, dtype=np.uint8)
    h.async_pread(back, path)
    assert h.wait() == 1
    assert bytes(back) == bytes(data)
    s = h.stats()
    assert set(s) == KEYS
    assert (s["reads"], s["writes"], s["bytes_read"], s["bytes_written"]) == (1, 1, SIZE, SIZE)
    assert s["errors"] == {} and s["gds_bytes"] == 0


def test_snapshots_subtract_to_a_phase(tmp_path):
    h = nvio.Handle(direct="off", block_size=BLOCK)
    path = str(tmp_path / "p.bin")
    h.write(np.ones(BLOCK, dtype=np.uint8), path)
    before = h.stats()
    for _ in range(3):
        h.read(np.zeros(BLOCK, dtype=np.uint8), path)
    after = h.stats()
    phase = {k: after[k] - before[k] for k in KEYS - {"errors"}}
    assert phase == {k: 0 for k in KEYS - {"errors"}} | {
        "reads": 3, "bytes_read": 3 * BLOCK, "pieces": 3,
    }


def test_forked_child_starts_at_zero(tmp_path):
    h = nvio.Handle(direct="off")
    path = str(tmp_path / "fork.bin")
    h.write(np.ones(4096, dtype=np.uint8), path)
    parent = h.stats()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            if h.stats() == zeros():
                h.read(np.zeros(4096, dtype=np.uint8), path)
                s = h.stats()
                code = 0 if (s["reads"], s["bytes_read"], s["writes"]) == (1, 4096, 0) else 2
        finally:
            os._exit(code)
    assert wait_child(pid) == 0
    assert h.stats() == parent


def test_refused_calls_count_in_errors(tmp_path):
    """issue 28 #11: a call the handle refuses before submitting anything (a missing file, a read
    past the end) counts in ``errors``; one the binding refuses for its Python type does not."""
    import errno
    small = tmp_path / "small"
    small.write_bytes(b"four")
    h = nvio.Handle()
    buf = np.zeros(8192, np.uint8)
    with pytest.raises(nvio.FileNotFound):
        h.read(buf, tmp_path / "missing")
    with pytest.raises(nvio.ShortFile):
        h.read(buf, small)
    with pytest.raises(nvio.ShortFile):
        h.read_async(buf, small)
    with pytest.raises(TypeError):
        h.read(buf, small, offset=1.5)
    assert h.stats()["errors"] == {errno.ENOENT: 1, 0: 2}
