"""nvio.File (issue 32): a file opened once through a handle. Bytes compared on every engine at
odd sizes and offsets; batches; futures; the context manager; sharing between threads; close()
while operations are in flight raises nvio.FileBusy; mode and closed-file errors are typed."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import nvio
from conftest import ODD_OFFSETS, ODD_SIZES, random_bytes, read_file, write_file


@pytest.mark.parametrize("n", ODD_SIZES)
@pytest.mark.parametrize("offset", ODD_OFFSETS)
def test_read_matches_file_every_engine(tmp_path, engine, n, offset):
    data = random_bytes(offset + n + 333, seed=n + offset)
    path = write_file(tmp_path / "f.bin", data)
    with nvio.Handle(engine=engine, block_size=64 * 1024) as h:
        with nvio.File(path, "r", handle=h) as f:
            assert f.size() == len(data)
            t = torch.empty(n, dtype=torch.uint8)
            assert f.read(t, offset) == n
            assert t.numpy().tobytes() == data[offset:offset + n]
            a = np.zeros(n, dtype=np.uint8)
            fut = f.read_async(a, offset)
            assert fut.wait() == n
            assert a.tobytes() == data[offset:offset + n]
        assert f.closed


def test_write_then_read_back_every_engine(tmp_path, engine):
    path = str(tmp_path / "w.bin")
    data = random_bytes(3 * 4096 + 77, seed=5)
    with nvio.Handle(engine=engine) as h, nvio.File(path, "w+", handle=h) as f:
        src = np.frombuffer(data, dtype=np.uint8)
        assert f.write(src[:5000], 1) == 5000
        f.write_async(src[5000:], 5001).wait()
        assert f.size() == len(data) + 1
        back = np.empty(len(data), dtype=np.uint8)
        f.read(back, 1)
        assert back.tobytes() == data
    assert read_file(path) == b"\0" + data


def test_batches(tmp_path):
    path = str(tmp_path / "b.bin")
    sizes = [1, 4095, 4096, 70001, 3]
    data = random_bytes(sum(sizes), seed=9)
    offsets = np.cumsum([0] + sizes[:-1]).tolist()
    with nvio.Handle() as h:
        with nvio.File(path, "w", handle=h) as w:
            items = [(np.frombuffer(data[o:o + s], dtype=np.uint8), o)
                     for o, s in zip(offsets, sizes)]
            assert w.write_batch(items, sync=True) == len(data)
        with nvio.File(path, "r", handle=h) as r:
            outs = [np.zeros(s, dtype=np.uint8) for s in sizes]
            assert r.read_batch(list(zip(outs, offsets))) == len(data)
            assert b"".join(o.tobytes() for o in outs) == data
            outs2 = [torch.zeros(s, dtype=torch.uint8) for s in sizes]
            r.read_batch_async(list(zip(outs2, offsets))).wait()
            assert b"".join(o.numpy().tobytes() for o in outs2) == data
            with pytest.raises(nvio.ShortFile, match="b.bin"):
                r.read_batch([(np.zeros(10, dtype=np.uint8), len(data) - 5)])
            with pytest.raises(nvio.InvalidType):
                r.read_batch([(np.zeros(10, dtype=np.uint8), 0, path)])


def test_errors_are_typed(tmp_path):
    path = write_file(tmp_path / "e.bin", random_bytes(8192))
    buf = np.zeros(4096, dtype=np.uint8)
    h = nvio.Handle()
    with pytest.raises(nvio.FileNotFound):
        nvio.File(tmp_path / "missing", "r", handle=h)
    with pytest.raises(nvio.IsADirectory):
        nvio.File(tmp_path, "r", handle=h)
    with pytest.raises(nvio.InvalidArgument, match="mode"):
        nvio.File(path, "a", handle=h)
    f = nvio.File(path, "r", handle=h)
    with pytest.raises(nvio.InvalidArgument, match="does not write"):
        f.write(buf, 0)
    with pytest.raises(nvio.ShortFile):
        f.read(buf, 8192 - 100)
    f.close()
    f.close()
    with pytest.raises(nvio.InvalidArgument, match="closed"):
        f.read(buf, 0)
    assert "closed" in repr(f)
    # Without handle= a File makes its own.
    with nvio.File(path) as g:
        g.read(buf, 4096)
        assert buf.tobytes() == read_file(path, 4096, 4096)


def test_shared_between_threads(tmp_path):
    data = random_bytes(4 << 20, seed=3)
    path = write_file(tmp_path / "s.bin", data)
    errors = []
    with nvio.Handle(intra_op_parallelism=2) as h, nvio.File(path, "r", handle=h) as f:
        def work(t: int) -> None:
            buf = np.empty(4096 + 7, dtype=np.uint8)
            try:
                for i in range(200):
                    off = ((t * 200 + i) * 7919) % (len(data) - buf.size)
                    if i % 2:
                        f.read_async(buf, off).wait()
                    else:
                        f.read(buf, off)
                    if buf.tobytes() != data[off:off + buf.size]:
                        errors.append((t, i, off))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert f.in_flight() == 0
    assert errors == []


def test_close_while_in_flight_raises_file_busy(tmp_path):
    """A read in flight keeps close() from closing (FileBusy, nothing closed); once waited for,
    close() succeeds. Big reads make the window wide; an attempt whose read finished before
    close() is retried."""
    n = 64 << 20
    path = str(tmp_path / "big.bin")
    with open(path, "wb") as out:
        out.truncate(n)
    h = nvio.Handle(engine="psync", direct="off", intra_op_parallelism=1)
    buf = np.ones(n, dtype=np.uint8)
    for _ in range(20):
        f = nvio.File(path, "r", handle=h)
        q = n // 4
        futures = [f.read_async(buf[i * q:(i + 1) * q], i * q) for i in range(4)]
        try:
            f.close()
        except nvio.FileBusy as e:
            assert isinstance(e, nvio.Error) and isinstance(e, RuntimeError)
            assert e.path == path and e.in_flight >= 1
            assert "in flight" in str(e)
            assert not f.closed
            for fut in futures:
                fut.wait()
            f.close()
            assert f.closed
            assert not buf.any()
            return
        for fut in futures:
            fut.wait()  # closed under them: the reads still finish, with their descriptors
    pytest.fail("no close() found its reads in flight in 20 attempts")


def test_exit_with_exception_and_pending_does_not_hide_it(tmp_path):
    path = write_file(tmp_path / "x.bin", random_bytes(1 << 20))
    h = nvio.Handle()
    buf = np.empty(1 << 20, dtype=np.uint8)
    with pytest.raises(KeyError):
        with nvio.File(path, handle=h) as f:
            fut = f.read_async(buf, 0)
            raise KeyError("inside")
    fut.wait()
    assert buf.tobytes() == read_file(path)
