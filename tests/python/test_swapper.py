"""nvio.TensorSwapper: random sequences of swap_out / swap_in / prefetch / evict over thousands of
tensors of random sizes and dtypes under a tight budget, every byte compared against a pattern
that locates errors; the budget's typed error; checksum mismatches; the directory's lock; the
clean-up after a crashed owner (a SIGKILLed child); close; snapshots."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nvio
from nvio import _nvio

torch = pytest.importorskip("torch")

MiB = 1 << 20
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool, torch.complex64)


def patterned(numel: int, dtype, seed: int):
    """A tensor of `numel` elements whose bytes are the pattern for `seed` (offsets from 0)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.empty(numel * itemsize, dtype=torch.uint8)
    if raw.numel():
        _nvio.pattern_fill(raw.data_ptr(), raw.numel(), 0, seed)
    return raw.view(dtype)


def check(t, seed: int, name: str) -> None:
    raw = t.contiguous().reshape(-1).view(torch.uint8)
    if raw.numel():
        bad = _nvio.pattern_first_mismatch(raw.data_ptr(), raw.numel(), 0, seed)
        assert bad is None, (f"tensor {name!r} ({raw.numel()} bytes, seed {seed}): first wrong "
                             f"byte at {bad}")


def random_numel(rng: random.Random, itemsize: int) -> int:
    pick = rng.random()
    if pick < 0.6:
        nbytes = rng.randint(1, 5000)
    elif pick < 0.95:
        nbytes = rng.randint(5000, 300 << 10)
    else:
        nbytes = rng.randint(300 << 10, 3 * MiB)
    return max(1, nbytes // itemsize)


def test_random_sequences_under_a_tight_budget_keep_every_byte(tmp_path):
    rng = random.Random(13)
    budget = 8 * MiB
    model = {}  # name -> (seed, dtype, shape)
    in_flight = []  # (future, tensor): the tensor lives until its write is done
    seed = 0
    with nvio.TensorSwapper(tmp_path / "swap", budget, checksums=True,
                            pack_threshold=256 << 10, pack_file_size=MiB) as sw:
        for step in range(3000):
            name = f"t{rng.randrange(1500)}"
            kind = rng.random()
            if kind < 0.4 or name not in model:
                dtype = rng.choice(DTYPES)
                itemsize = torch.empty((), dtype=dtype).element_size()
                numel = random_numel(rng, itemsize)
                seed += 1
                t = patterned(numel, dtype, seed)
                if numel % 2 == 0 and rng.random() < 0.5:
                    t = t.view(2, numel // 2)
                in_flight.append((sw.swap_out(name, t), t))
                model[name] = (seed, dtype, tuple(t.shape))
            elif kind < 0.6:
                s, dtype, shape = model[name]
                got = sw.swap_in(name)
                assert got.dtype == dtype and tuple(got.shape) == shape
                check(got, s, name)
            elif kind < 0.75:
                s, dtype, shape = model[name]
                out = torch.empty(shape, dtype=dtype)
                assert sw.swap_in(name, out=out) is out
                check(out, s, name)
            elif kind < 0.88:
                wanted = (f"t{rng.randrange(1500)}" for _ in range(8))
                sw.prefetch([n for n in wanted if n in model])
            elif kind < 0.95:
                assert sw.evict(name)
                del model[name]
                assert name not in sw
            else:
                sw.wait()
            in_flight = [(f, t) for f, t in in_flight if not f.done()]
            stats = sw.stats()
            assert stats["held_bytes"] <= budget
        for f, _ in in_flight:
            f.wait()
        for name, (s, dtype, shape) in model.items():
            check(sw.swap_in(name), s, name)
        stats = sw.stats()
        assert stats["prefetch_hits"] > 0
        assert stats["tensors"] == len(model)


def test_numpy_arrays_and_plain_buffers_round_trip(tmp_path):
    with nvio.TensorSwapper(tmp_path, 4 * MiB) as sw:
        a = np.arange(12345, dtype=np.float64).reshape(3, -1, 5)
        sw.swap_out("a", a).wait()
        got = sw.swap_in("a")
        assert isinstance(got, np.ndarray) and got.dtype == a.dtype and got.shape == a.shape
        assert np.array_equal(got, a)
        sw.swap_out("b", bytearray(b"xyz" * 1001)).wait()
        assert bytes(sw.swap_in("b")) == b"xyz" * 1001
        sw.swap_out("empty", torch.empty(0, 7, dtype=torch.float16)).wait()
        e = sw.swap_in("empty")
        assert e.shape == (0, 7) and e.dtype == torch.float16


def test_a_tensor_larger_than_the_budget_raises_budget_exceeded(tmp_path):
    with nvio.TensorSwapper(tmp_path, MiB) as sw:
        with pytest.raises(nvio.BudgetExceeded) as info:
            sw.swap_out("big", torch.zeros(MiB + 1, dtype=torch.uint8))
        assert info.value.needed == MiB + 1
        assert info.value.budget == MiB
        assert "'big'" in str(info.value) and str(MiB + 1) in str(info.value)
        assert isinstance(info.value, nvio.Error)
        assert "big" not in sw


def test_tensors_the_caller_keeps_raise_instead_of_waiting_forever(tmp_path):
    with nvio.TensorSwapper(tmp_path, 4 * MiB) as sw:
        for i in range(3):
            sw.swap_out(f"t{i}", patterned(1536 << 10, torch.uint8, i + 1))
        sw.wait()
        kept = [sw.swap_in("t0"), sw.swap_in("t1")]
        with pytest.raises(nvio.BudgetExceeded):
            sw.swap_in("t2")
        kept.pop()  # dropped: its memory goes back to the pool
        check(sw.swap_in("t2"), 3, "t2")


def corrupt(sw, name: str, at: int) -> None:
    info = sw.info(name)
    with open(info["path"], "r+b") as f:
        f.seek(info["offset"] + at)
        byte = f.read(1)
        f.seek(info["offset"] + at)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize("nbytes", [777, 3 * MiB + 3])
def test_a_corrupt_swap_file_raises_checksum_mismatch(tmp_path, nbytes):
    with nvio.TensorSwapper(tmp_path, 16 * MiB, checksums=True) as sw:
        sw.swap_out("w", patterned(nbytes, torch.uint8, 5)).wait()
        check(sw.swap_in("w"), 5, "w")
        corrupt(sw, "w", nbytes // 2)
        info = sw.info("w")
        for prefetch in (False, True):
            if prefetch:
                sw.prefetch(["w"])
            with pytest.raises(nvio.ChecksumMismatch) as e:
                sw.swap_in("w")
            assert e.value.name == "w"
            assert e.value.path == info["path"]
            assert e.value.offset == info["offset"]
            assert e.value.length == nbytes
            assert isinstance(e.value, nvio.FormatError)
        with pytest.raises(nvio.ChecksumMismatch):
            sw.swap_in("w", out=torch.empty(nbytes, dtype=torch.uint8))


@pytest.mark.parametrize("checksums", [False, True])
def test_swap_in_batch_reads_many_tensors_at_once(tmp_path, checksums):
    rng = random.Random(11)
    with nvio.TensorSwapper(tmp_path, 64 * MiB, checksums=checksums) as sw:
        sizes = {}
        for i in range(300):
            dtype = DTYPES[i % len(DTYPES)]
            t = patterned(random_numel(rng, torch.empty((), dtype=dtype).element_size()), dtype,
                          100 + i)
            sizes[f"t{i}"] = (t.numel(), dtype)
            sw.swap_out(f"t{i}", t)
        sw.swap_out("empty", torch.empty(0))
        sw.wait()  # a name whose write is in flight is not prefetched
        # Some served from prefetched data.
        assert sw.prefetch([f"t{i}" for i in range(0, 300, 7)]) == len(range(0, 300, 7))
        before = sw.stats()
        names = [f"t{i}" for i in range(300)]
        outs = [torch.empty(sizes[n][0], dtype=sizes[n][1]) for n in names]
        got = sw.swap_in_batch(list(zip(names, outs)) + [("empty", torch.empty(0))])
        assert all(a is b for a, b in zip(got, outs))
        for i, t in enumerate(outs):
            check(t, 100 + i, f"t{i}")
        after = sw.stats()
        assert after["swap_ins"] - before["swap_ins"] == 301
        assert after["prefetch_hits"] - before["prefetch_hits"] == len(range(0, 300, 7))
        # A dict works too; every pair is checked before any is read.
        out = torch.full((sizes["t1"][0],), 0, dtype=sizes["t1"][1])
        sw.swap_in_batch({"t1": out})
        check(out, 101, "t1")
        sentinel = torch.zeros(sizes["t2"][0], dtype=sizes["t2"][1])
        with pytest.raises(nvio.InvalidArgument, match="no tensor named 'nope'"):
            sw.swap_in_batch([("t2", sentinel), ("nope", torch.empty(4))])
        with pytest.raises(nvio.InvalidArgument, match="holds"):
            sw.swap_in_batch([("t2", sentinel), ("t3", torch.empty(1, dtype=torch.uint8))])
        assert not sentinel.view(torch.uint8).any()  # nothing was read
        with pytest.raises(nvio.InvalidType):
            sw.swap_in_batch(["t1"])


def test_a_prefetch_of_more_than_the_budget_holds_reads_ahead_as_swap_ins_free_room(tmp_path):
    # About 7 fit in the budget, 30 are asked for: the rest queue and start as swap_ins consume.
    sizes = [(300 << 10) + 4099 * i for i in range(30)]
    with nvio.TensorSwapper(tmp_path, (2 * MiB) + (256 << 10), pack_threshold=256 << 10) as sw:
        for i, n in enumerate(sizes):
            sw.swap_out(f"q{i}", patterned(n, torch.uint8, 700 + i)).wait()
        before = sw.stats()
        names = [f"q{i}" for i in range(len(sizes))]
        assert sw.prefetch(names) == len(names)  # started or queued
        queued = sw.stats()
        assert queued["prefetch_queued"] > 10
        assert queued["prefetch_queued"] + queued["reads_in_flight"] == len(names)
        assert sw.prefetch(names) == 0  # all in the read-ahead already
        for i, n in enumerate(sizes):
            if i % 3 == 2:  # a lent tensor, dropped before the next swap_in
                check(sw.swap_in(f"q{i}"), 700 + i, f"q{i}")
            else:
                out = torch.empty(n, dtype=torch.uint8)
                sw.swap_in(f"q{i}", out=out)
                check(out, 700 + i, f"q{i}")
            assert sw.stats()["held_bytes"] <= sw.stats()["budget_bytes"]
        after = sw.stats()
        # Every one came from prefetched data, those past the first budget's worth too: each
        # swap_in started the next queued reads in the room it left (a lent tensor's room is
        # seen at the next call; the budget holds more than two), and each byte was read once.
        assert after["prefetch_hits"] - before["prefetch_hits"] == len(names)
        assert after["bytes_read"] - before["bytes_read"] == sum(sizes)
        assert after["prefetch_queued"] == 0 and after["reads_in_flight"] == 0


def test_queued_names_leave_the_queue_on_evict_swap_out_swap_in_and_close(tmp_path):
    # Room for one at a time: while one is kept lent, every prefetch queues.
    sizes = [(700 << 10) + 4099 * i for i in range(6)]
    sw = nvio.TensorSwapper(tmp_path, MiB, pack_threshold=256 << 10)
    for i, n in enumerate(sizes):
        sw.swap_out(f"q{i}", patterned(n, torch.uint8, 800 + i)).wait()
    kept = sw.swap_in("q0")
    assert sw.prefetch([f"q{i}" for i in range(1, 6)]) == 5
    assert sw.stats()["prefetch_queued"] == 5 and sw.stats()["reads_in_flight"] == 0
    assert sw.evict("q2")
    assert sw.stats()["prefetch_queued"] == 4
    sw.swap_out("q3", patterned(5000, torch.uint8, 77)).wait()
    assert sw.stats()["prefetch_queued"] == 3
    out = torch.empty(sizes[4], dtype=torch.uint8)
    sw.swap_in("q4", out=out)  # read straight into out
    check(out, 804, "q4")
    assert sw.stats()["prefetch_queued"] == 2 and sw.stats()["prefetch_hits"] == 0
    check(kept, 800, "q0")
    del kept
    lent = sw.swap_in("q1")  # queued: read directly into the lent buffer
    check(lent, 801, "q1")
    assert sw.stats()["prefetch_queued"] == 1 and sw.stats()["prefetch_hits"] == 0
    del lent
    check(sw.swap_in("q3"), 77, "q3")  # the room the dropped tensor left starts q5's read
    assert sw.stats()["prefetch_queued"] == 0 and sw.stats()["reads_in_flight"] == 1
    out = torch.empty(sizes[5], dtype=torch.uint8)
    sw.swap_in("q5", out=out)
    check(out, 805, "q5")
    assert sw.stats()["prefetch_hits"] == 1
    assert "q2" not in sw
    kept = sw.swap_in("q0")
    assert sw.prefetch(["q1", "q4", "q5"]) == 3
    assert sw.stats()["prefetch_queued"] == 3
    sw.close()
    assert os.listdir(tmp_path) == []
    check(kept, 800, "q0")  # outlives the swapper


def test_two_live_swappers_on_one_directory_raise_directory_locked(tmp_path):
    first = nvio.TensorSwapper(tmp_path, MiB)
    with pytest.raises(nvio.DirectoryLocked) as e:
        nvio.TensorSwapper(tmp_path, MiB)
    assert e.value.owner_pid == os.getpid()
    first.close()
    nvio.TensorSwapper(tmp_path, MiB).close()


def test_close_leaves_no_files(tmp_path):
    sw = nvio.TensorSwapper(tmp_path, 8 * MiB, pack_threshold=64 << 10)
    tensors = [patterned(100 + i if i % 10 else 600 << 10, torch.uint8, i) for i in range(50)]
    for i, t in enumerate(tensors):
        sw.swap_out(f"n{i}", t)
    sw.wait()
    assert os.listdir(tmp_path)
    sw.close(delete_files=True)
    assert os.listdir(tmp_path) == []
    with pytest.raises(nvio.InvalidArgument):
        sw.swap_in("n1")


CHILD = textwrap.dedent("""
    import os, signal, sys
    import torch, nvio
    sw = nvio.TensorSwapper(sys.argv[1], 8 << 20, pack_threshold=64 << 10)
    keep = [torch.full((1000 + i * 40000,), i, dtype=torch.uint8) for i in range(6)]
    for i, t in enumerate(keep):
        sw.swap_out(f"n{i}", t)
    sw.wait()
    print(len(os.listdir(sys.argv[1])), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_directory_left_by_a_killed_process_is_cleaned_with_a_warning(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    files = int(child.stdout.strip())
    assert files > 1 and len(os.listdir(tmp_path)) == files  # the lock file and the swap files
    with pytest.warns(RuntimeWarning, match=rf"removed {files - 1} stale swap files .* ended "
                                            r"without closing"):
        sw = nvio.TensorSwapper(tmp_path, MiB)
    assert sw.names() == []
    assert os.listdir(tmp_path) == ["nvio-swap.lock"]
    sw.close()
    assert os.listdir(tmp_path) == []


def test_snapshot_round_trip(tmp_path):
    rng = random.Random(3)
    model = {}
    # A 3 MiB budget: the snapshot stages 1 MiB chunks, so the 2.5 MiB tensor spans several.
    with nvio.TensorSwapper(tmp_path / "live", 3 * MiB, checksums=True) as sw:
        for i in range(150):
            dtype = rng.choice(DTYPES)
            itemsize = torch.empty((), dtype=dtype).element_size()
            numel = (5 * MiB // 2 + 1) // itemsize if i == 0 else random_numel(rng, itemsize) // 4
            t = patterned(numel, dtype, 100 + i)
            sw.swap_out(f"p{i}", t).wait()
            model[f"p{i}"] = (100 + i, dtype, tuple(t.shape))
        sw.snapshot(tmp_path / "snap")
        with pytest.raises(nvio.InvalidArgument):
            sw.snapshot(tmp_path / "snap")  # never over an existing snapshot
    assert not os.path.exists(tmp_path / "live") or os.listdir(tmp_path / "live") == []
    for _ in range(2):
        with nvio.TensorSwapper(tmp_path / "snap", 8 * MiB) as restored:
            assert sorted(restored.names()) == sorted(model)
            for name, (s, dtype, shape) in model.items():
                got = restored.swap_in(name)
                assert got.dtype == dtype and tuple(got.shape) == shape
                check(got, s, name)
            restored.swap_out("p3", torch.ones(5000))  # a new file; close removes only it
        assert sorted(os.listdir(tmp_path / "snap")) == ["data.swap", "nvio-swap.json"]


def test_close_keeping_files_opens_again(tmp_path):
    with nvio.TensorSwapper(tmp_path, 4 * MiB) as sw:
        for i in range(20):
            sw.swap_out(f"k{i}", patterned(1 + i * 9000, torch.int8, 40 + i)).wait()
        sw.close(delete_files=False)
    with nvio.TensorSwapper(tmp_path, 4 * MiB) as sw:
        for i in range(20):
            check(sw.swap_in(f"k{i}"), 40 + i, f"k{i}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors(tmp_path):
    with nvio.TensorSwapper(tmp_path, 64 * MiB, checksums=True) as sw:
        host = patterned(3 * MiB + 5, torch.uint8, 77)
        dev = host.cuda()
        sw.swap_out("d", dev).wait()
        out = torch.empty_like(dev)
        sw.swap_in("d", out=out)
        check(out.cpu(), 77, "d")
        sw.swap_out("h", host).wait()  # checksummed: verified in host memory, then copied
        out2 = torch.empty_like(dev)
        sw.swap_in("h", out=out2)
        check(out2.cpu(), 77, "h")


@pytest.mark.parametrize("field, value, words", [
    ("meta", {"kind": "torch", "dtype": "float32", "shape": [3]}, "3 elements of 4 bytes"),
    ("meta", {"kind": "torch", "dtype": "load", "shape": [10]}, "not a torch dtype"),
    ("meta", {"kind": "torch", "shape": [10]}, "not a torch dtype"),
    ("meta", {"kind": "torch", "dtype": "float32", "shape": [-10]}, "not a list of sizes"),
    ("meta", {"kind": "numpy", "dtype": "zz", "shape": [10]}, "not a numpy dtype"),
    ("meta", {"kind": "numpy", "dtype": "O", "shape": [10]}, "Python objects"),
    ("meta", {"kind": "numpy", "shape": [5]}, "not a numpy dtype"),  # dtype(None): float64
    ("offset", -5, "entry offset -5 is not a byte count"),
    ("size", 4.5, "entry size 4.5 is not a byte count"),
    ("offset", 2**64 - 8, "overflows"),
    # issue 28 #8: rounded up to pages, 2^64 - 1 wrapped to an empty buffer
    ("size", 2**64 - 1, "tensor 'a': entry offset 0 \\+ size 18446744073709551615 overflows"),
    ("size", 2**63, "tensor 'a'.*overflows the largest file offset"),
])
def test_an_edited_index_is_a_format_error_naming_the_tensor(tmp_path, field, value, words):
    """The index's checksums cover the data, not the descriptions: an index edited or damaged
    describes bytes that are not there. Each such entry is a FormatError, never a RuntimeError,
    TypeError or KeyError, nor an offset read as 2^64 - 5."""
    with nvio.TensorSwapper(tmp_path, 4 * MiB) as sw:
        sw.swap_out("a", torch.arange(10, dtype=torch.float32)).wait()
        sw.close(delete_files=False)
    index = tmp_path / "nvio-swap.json"
    doc = json.loads(index.read_text())
    (entry,) = doc["entries"]
    entry[field] = json.dumps(value) if field == "meta" else value
    index.write_text(json.dumps(doc))
    with pytest.raises(nvio.FormatError, match=words):
        with nvio.TensorSwapper(tmp_path, 4 * MiB) as sw:
            sw.swap_in("a")
