"""nvio.StripedHandle: tensors striped over several directories, bytes checked part by part."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

import nvio

STRIPE = 64 * 1024


def pattern(n: int, start: int = 0) -> np.ndarray:
    """Each 8-byte word holds its own logical offset, so a misplaced stripe names where it went."""
    first = start // 8
    words = np.arange(first, first + (n + 15) // 8 + 1, dtype=np.uint64) * 8
    raw = words.view(np.uint8)
    skip = start - first * 8
    return raw[skip:skip + n].copy()


@pytest.fixture
def dirs(tmp_path):
    out = []
    for i in range(3):
        d = tmp_path / f"drive{i}"
        d.mkdir()
        out.append(str(d))
    return out


@pytest.mark.parametrize("ndirs", [1, 2, 3])
@pytest.mark.parametrize("size", [1, 4095, 3 * STRIPE + 123, (1 << 20) + 123])
def test_round_trip_and_parts(dirs, ndirs, size):
    h = nvio.StripedHandle(dirs[:ndirs], stripe_size=STRIPE, block_size=16384)
    data = pattern(size)
    w = h.write(data, "t.bin", truncate=True)
    assert w["bytes"] == size
    assert [d["directory"] for d in w["drives"]] == dirs[:ndirs]
    assert sum(d["bytes"] for d in w["drives"]) == size
    assert all(0 <= d["seconds"] <= w["seconds"] for d in w["drives"])
    assert h.size("t.bin") == size
    # Part i, stripe j holds logical stripe j * n + i: checked from the files, not through nvio.
    for i in range(ndirs):
        path = h.part_path(i, "t.bin")
        part = np.fromfile(path, dtype=np.uint8) if os.path.exists(path) else np.empty(0, np.uint8)
        for j, at in enumerate(range(0, len(part), STRIPE)):
            chunk = part[at:at + STRIPE]
            logical = (j * ndirs + i) * STRIPE
            assert np.array_equal(chunk, data[logical:logical + len(chunk)]), (i, j)
    back = np.zeros(size, np.uint8)
    r = h.read(back, "t.bin")
    assert r["bytes"] == size
    assert np.array_equal(back, data)
    if size > STRIPE + 200:
        off = STRIPE - 77
        sub = np.zeros(size - off - 100, np.uint8)
        h.read(sub, "t.bin", off)
        assert np.array_equal(sub, data[off:off + len(sub)])
    assert h.remove("t.bin") >= 1
    with pytest.raises(FileNotFoundError):
        h.size("t.bin")


def test_torch_tensor_and_threads(dirs):
    torch = pytest.importorskip("torch")
    h = nvio.StripedHandle(dirs, stripe_size=STRIPE)
    tensors = [torch.arange(i * 100000, (i + 1) * 100000, dtype=torch.float32) for i in range(4)]
    errors = []

    def one(i):
        try:
            h.write(tensors[i], f"t{i}")
            out = torch.empty_like(tensors[i])
            h.read(out, f"t{i}")
            assert torch.equal(out, tensors[i])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_options_reach_every_drive(dirs):
    h = nvio.StripedHandle(dirs[:2], stripe_size=STRIPE, engine="psync", queue_depth=3)
    for i in range(2):
        assert h.drive_engine(i) == "psync"
        assert h.drive_options(i)["queue_depth"] == 3
    assert h.directories == dirs[:2]
    assert h.stripe_size == STRIPE


def test_each_drive_uses_its_saved_profile(dirs, tmp_path, monkeypatch):
    st = os.stat(dirs[0])
    key = f"dev:{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "version": 1,
        "default": "dev:0:999",
        "profiles": {
            key: {"directory": dirs[0], "options": {"queue_depth": 7}},
            "dev:0:999": {"directory": "/elsewhere", "options": {"queue_depth": 5}},
        },
    }))
    monkeypatch.setenv("NVIO_CONFIG", str(config))
    h = nvio.StripedHandle(dirs[:2], stripe_size=STRIPE)
    assert [h.drive_options(i)["queue_depth"] for i in range(2)] == [7, 7]
    # Keyword options still win over the profile.
    h = nvio.StripedHandle(dirs[:2], stripe_size=STRIPE, queue_depth=3)
    assert h.drive_options(1)["queue_depth"] == 3


def test_errors(dirs, tmp_path):
    with pytest.raises(FileNotFoundError):
        nvio.StripedHandle([dirs[0], str(tmp_path / "missing")])
    with pytest.raises(nvio.InvalidArgument):
        nvio.StripedHandle([dirs[0], dirs[0]])
    with pytest.raises(nvio.InvalidArgument):
        nvio.StripedHandle(dirs, stripe_size=4096 + 1)
    with pytest.raises(nvio.InvalidArgument):
        nvio.StripedHandle(dirs, stripe_size=0)
    with pytest.raises(TypeError):
        nvio.StripedHandle(dirs[0])
    with pytest.raises(nvio.InvalidArgument):
        nvio.StripedHandle(dirs, queue_depth=0)
    h = nvio.StripedHandle(dirs[:2], stripe_size=STRIPE)
    buf = pattern(4 * STRIPE)
    for bad in ["", "a/b", "..", "a\0b"]:
        with pytest.raises(nvio.InvalidArgument):
            h.write(buf, bad)
    with pytest.raises(ValueError):
        h.read(bytes(10), "x")  # read-only buffer
    h.write(buf, "f")
    with pytest.raises(nvio.ShortFile) as e:
        h.read(np.zeros(len(buf) + 1, np.uint8), "f")
    assert "striped over" in str(e.value)
    with pytest.raises(nvio.FormatError):
        nvio.StripedHandle([dirs[1], dirs[0]], stripe_size=STRIPE).read(np.zeros(10, np.uint8), "f")
    with pytest.raises(nvio.InvalidArgument):
        h.part_path(-1, "f")
    with pytest.raises(nvio.InvalidArgument):
        h.part_path(2, "f")


def test_a_part_truncated_at_a_stripe_boundary_makes_size_short(dirs):
    """issue 28 #7: part 0 cut back by one stripe leaves sizes that fit a smaller striped file:
    size() returned that size while a read of the written bytes raised ShortFile. Both raise
    ShortFile now, naming the size written and the size the parts hold."""
    h = nvio.StripedHandle(dirs[:2], stripe_size=STRIPE)
    buf = pattern(3 * STRIPE)
    h.write(buf, "f", truncate=True)
    assert h.size("f") == 3 * STRIPE
    os.truncate(h.part_path(0, "f"), STRIPE)
    with pytest.raises(nvio.ShortFile, match=f"holds only {2 * STRIPE} bytes.*{3 * STRIPE}"):
        h.size("f")
    with pytest.raises(nvio.ShortFile):
        h.read(np.zeros(len(buf), np.uint8), "f")
    # Written again, the record follows: growing, and shrinking with truncate=True.
    h.write(buf, "f", truncate=True)
    assert h.size("f") == 3 * STRIPE
    h.write(buf[:STRIPE + 5], "f", truncate=True)
    assert h.size("f") == STRIPE + 5
    h.write(buf, "f", offset=STRIPE)
    assert h.size("f") == 4 * STRIPE
    out = np.zeros(4 * STRIPE, np.uint8)
    h.read(out, "f")
    assert np.array_equal(out[STRIPE:], buf)


def test_stats_count_each_drives_share(dirs):
    h = nvio.StripedHandle(dirs[:2], stripe_size=STRIPE)
    size = 5 * STRIPE + 7
    h.write(pattern(size), "s")
    back = np.zeros(size, np.uint8)
    h.read(back, "s")
    total = h.stats()
    assert total["bytes_written"] == size and total["bytes_read"] == size
    shares = [3 * STRIPE, 2 * STRIPE + 7]  # stripes 0, 2, 4 and 1, 3, 5 (its 7 bytes)
    for i in range(2):
        d = h.drive_stats(i)
        assert d["bytes_written"] == shares[i] and d["bytes_read"] == shares[i]
        assert d["writes"] >= 1 and d["reads"] >= 1
    assert total["writes"] == h.drive_stats(0)["writes"] + h.drive_stats(1)["writes"]
    assert total["errors"] == {}
