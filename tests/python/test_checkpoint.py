"""nvio.save / nvio.load (python/nvio/checkpoint.py): the torch.save archive format both ways,
storage sharing, map_location, weights_only, into=, atomicity under SIGKILL, typed errors."""

from __future__ import annotations

import glob
import os
import pickle
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
import zipfile
import zlib

import pytest

torch = pytest.importorskip("torch")
import nvio  # noqa: E402
from nvio import _nvio, _torchzip  # noqa: E402

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
          torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.bool]


def _random(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)


def _raw(t):
    """A tensor's values as bytes (bit patterns: NaNs and -0.0 compare exactly)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(a, b, where="obj"):
    """Deep equality of what torch.save can hold; tensors byte-compared with their layout."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride(), a.storage_offset()) == \
            (b.dtype, b.shape, b.stride(), b.storage_offset()), where
        assert _raw(a) == _raw(b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _every_dtype():
    obj = {}
    for i, dtype in enumerate(DTYPES):
        name = str(dtype).split(".")[1]
        obj[name] = _random((37, 5), dtype, i)
        obj[name + "_scalar"] = _random((), dtype, 100 + i)
        obj[name + "_empty"] = torch.empty((0, 3), dtype=dtype)
        obj[name + "_t"] = _random((6, 9), dtype, 200 + i).t()  # non-contiguous
        obj[name + "_strided"] = _random((64,), dtype, 300 + i)[3::5]
    return obj


def test_crc32_and_combine_match_zlib():
    rng = random.Random(1)
    for la, lb in [(0, 0), (1, 0), (0, 1), (1, 1), (4095, 17), (1 << 20, (1 << 20) + 123)]:
        a = bytes(rng.getrandbits(8) for _ in range(min(la, 4096))) * max(1, la // 4096)
        a = a[:la]
        b = os.urandom(lb)
        assert _nvio.crc32(a + b) == zlib.crc32(a + b)
        assert _nvio.crc32(b, _nvio.crc32(a)) == zlib.crc32(a + b)
        assert _nvio.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    # Any contiguous buffer: a tensor's numpy view, a memoryview slice at an odd start.
    t = torch.arange(1000, dtype=torch.float32)
    assert _nvio.crc32(t.numpy()) == zlib.crc32(t.numpy().tobytes())
    raw = os.urandom(5000)
    assert _nvio.crc32(memoryview(raw)[3:4098]) == zlib.crc32(raw[3:4098])
    with pytest.raises(nvio.InvalidArgument, match="not contiguous"):
        _nvio.crc32(t.numpy()[::2])


def test_records_answer_as_torchs_own_reader(tmp_path):
    """nvio.load hands torch.serialization._load an object standing in for torch's zip reader
    (torch._C.PyTorchFileReader). Every method that reader has in the installed torch must exist
    on it and give the same answers: torch 2 calls has_record, get_record_offset and
    serialization_id, which 1.13 did not, and nvio.load failed on torch 2.11 for want of them."""
    path = tmp_path / "r.pt"
    torch.save({"a": torch.arange(1000), "b": [torch.ones(3, 4, dtype=torch.float64)]}, path)
    ours = _torchzip._Records(_torchzip._Archive(memoryview(path.read_bytes()), str(path)), torch)
    theirs = torch._C.PyTorchFileReader(str(path))
    methods = [m for m in dir(theirs) if not m.startswith("_")]
    missing = [m for m in methods if not hasattr(ours, m)]
    assert not missing, f"torch {torch.__version__}'s reader has {missing}; nvio's records do not"
    names = theirs.get_all_records()
    assert sorted(ours.get_all_records()) == sorted(names)
    for name in names + ["no/such/record"]:
        assert ours.has_record(name) == theirs.has_record(name), name
    for name in names:
        assert ours.get_record(name) == theirs.get_record(name), name
        for m in ("get_record_offset", "get_record_header_offset"):
            if m in methods:
                assert getattr(ours, m)(name) == getattr(theirs, m)(name), (m, name)
    if "serialization_id" in methods:
        assert ours.serialization_id() == theirs.serialization_id()
    with zipfile.ZipFile(path) as z:  # the offsets where the entries are (also on 1.13)
        for info in z.infolist():
            name = info.filename.split("/", 1)[1]
            assert ours.get_record_header_offset(name) == info.header_offset, name
            start = ours.get_record_offset(name)
            assert path.read_bytes()[start:start + info.file_size] == z.read(info), name


def test_every_dtype_round_trip_both_ways(tmp_path):
    obj = _every_dtype()
    mine, theirs = tmp_path / "nvio.pt", tmp_path / "torch.pt"
    size = nvio.save(obj, mine)
    assert size == os.path.getsize(mine)
    torch.save(obj, theirs)
    assert_same(obj, nvio.load(mine))
    assert_same(obj, torch.load(mine))  # torch reads nvio's file
    assert_same(obj, nvio.load(theirs))  # nvio reads torch's file (its prefix is the stem)
    with zipfile.ZipFile(mine) as z:
        assert z.testzip() is None  # every CRC-32 right
        names = z.namelist()
        assert names[0] == "archive/data.pkl" and names[-1] == "archive/version"
        assert z.read("archive/version") == b"3\n"
        for info in z.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            if info.filename.startswith("archive/data/"):  # data 64-byte aligned, as torch's
                with open(mine, "rb") as f:
                    f.seek(info.header_offset + 28)  # the local header's extra field length
                    extra_len = int.from_bytes(f.read(2), "little")
                assert (info.header_offset + 30 + len(info.filename) + extra_len) % 64 == 0


def test_sharing_and_identity_preserved(tmp_path):
    base = torch.arange(1000, dtype=torch.float32)
    obj = {"base": base, "view": base[10:20], "again": base, "reshaped": base.view(10, 100),
           "typed": base.storage(), "other": torch.ones(5)}
    for path, saver in [(tmp_path / "n.pt", nvio.save), (tmp_path / "t.pt", torch.save)]:
        saver(obj, path)
        for loaded in (nvio.load(path), torch.load(path)):
            assert_same(obj["base"], loaded["base"])
            assert loaded["again"] is loaded["base"]
            ptr = loaded["base"].storage().data_ptr()
            assert loaded["view"].storage().data_ptr() == ptr
            assert loaded["reshaped"].storage().data_ptr() == ptr
            assert loaded["typed"].data_ptr() == ptr
            loaded["base"][15] = -1.0  # a write through one is seen through the other
            assert loaded["view"][5] == -1.0
            assert loaded["other"].storage().data_ptr() != ptr
    with zipfile.ZipFile(tmp_path / "n.pt") as z:
        assert sorted(n for n in z.namelist() if "/data/" in n) == \
            ["archive/data/0", "archive/data/1"]  # one record per storage


def test_nested_containers_and_optimizer_state(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(13, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 13)).sum().backward()
    opt.step()
    obj = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3,
           "nested": [1, (2.5, "x", None), {"t": torch.ones(2, 2), 7: b"bytes"}],
           "rng": torch.get_rng_state()}
    nvio.save(obj, tmp_path / "c.pt")
    # torch 1.13's weights-only unpickler knows no floats (opcode BINFLOAT): there a trusted file
    # with them loads with weights_only=False, and the default refuses it, as torch 1.13 would.
    trusted = {} if TORCH2 else {"weights_only": False}
    if not TORCH2:
        with pytest.raises(nvio.UnsafeCheckpointError, match="torch 1"):
            nvio.load(tmp_path / "c.pt")
    assert_same(obj, nvio.load(tmp_path / "c.pt", **trusted))
    assert_same(obj, torch.load(tmp_path / "c.pt"))
    opt2 = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt2.load_state_dict(nvio.load(tmp_path / "c.pt", **trusted)["optim"])


def test_large_record_and_zip64_layout(tmp_path, monkeypatch):
    obj = {"big": _random((1 << 20) + 123, torch.float32, 5), "small": torch.arange(7),
           "empty": torch.empty(0)}
    monkeypatch.setattr(_torchzip, "_ZIP64_LIMIT", 1000)  # every size and offset past it
    nvio.save(obj, tmp_path / "z.pt")
    with open(tmp_path / "z.pt", "rb") as f:
        data = f.read()
    assert b"PK\x06\x06" in data and b"PK\x06\x07" in data  # zip64 end records were written
    with zipfile.ZipFile(tmp_path / "z.pt") as z:
        assert z.testzip() is None
        assert z.getinfo("archive/data/0").file_size == ((1 << 20) + 123) * 4
    # torch's reader (miniz) cannot check this one: it refuses a zip64 header offset that lies
    # past the end of a file smaller than 4 GiB, which only a forced limit produces. The real
    # case is test_over_4_gib.
    assert_same(obj, nvio.load(tmp_path / "z.pt"))


@pytest.mark.skipif(os.environ.get("NVIO_LARGE_TESTS") != "1",
                    reason="writes 4 GiB and needs about 13 GiB of memory: NVIO_LARGE_TESTS=1")
def test_over_4_gib(tmp_path):
    big = torch.empty((4 << 30) + 4096 + 7, dtype=torch.uint8)
    marks = torch.arange(0, big.numel(), 1 << 20)
    big[marks] = (marks // (1 << 20) % 251).to(torch.uint8)
    big[-1] = 77
    obj = {"big": big, "after": torch.arange(1000)}  # its record lies past 4 GiB
    path = tmp_path / "big.pt"
    nvio.save(obj, path)
    with zipfile.ZipFile(path) as z:
        assert z.getinfo("archive/data/1").header_offset > 0xFFFFFFFF
    for loader in (nvio.load, torch.load):
        loaded = loader(path)
        assert torch.equal(loaded["after"], obj["after"])
        assert torch.equal(loaded["big"][marks], big[marks]) and loaded["big"][-1] == 77
        del loaded


def test_map_location(tmp_path):
    obj = {"a": torch.arange(10.0), "b": torch.ones(3, dtype=torch.bfloat16)}
    path = tmp_path / "m.pt"
    nvio.save(obj, path)
    for where in ("cpu", torch.device("cpu"), {"cpu": "cpu"}):
        assert_same(obj, nvio.load(path, map_location=where))
    seen = []

    def relocate(storage, location):
        seen.append(location)
        return storage.clone()  # a copy: the result must not be a view of nvio's buffer

    loaded = nvio.load(path, map_location=relocate)
    assert seen == ["cpu", "cpu"]
    assert_same(obj, loaded)
    # An unknown device is refused with torch.load's own exception: RuntimeError where the file is
    # unpickled in full, pickle.UnpicklingError under weights_only (torch 2.6's default).
    with pytest.raises(Exception) as theirs:
        torch.load(path, map_location="nodevice")
    with pytest.raises(theirs.type, match="nodevice"):
        nvio.load(path, map_location="nodevice")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # a shell command, as an attacker's pickle would run
        return (os.system, (f"mkdir {shlex.quote(self.marker)}",))


def test_weights_only_refuses_code(tmp_path):
    marker = str(tmp_path / "pwned")
    path = tmp_path / "evil.pt"
    nvio.save({"w": torch.ones(3), "x": _Evil(marker)}, path)
    for kwargs in ({}, {"weights_only": True}):  # refused by default, whatever torch runs
        with pytest.raises(nvio.UnsafeCheckpointError) as info:
            nvio.load(path, **kwargs)
        e = info.value
        assert isinstance(e, pickle.UnpicklingError) and isinstance(e, nvio.Error)
        assert e.path == str(path) and str(path) in str(e)
    with pytest.raises(pickle.UnpicklingError):  # as torch.load refuses it
        torch.load(path, weights_only=True)
    assert not os.path.exists(marker)
    nvio.load(path, weights_only=False)  # the file runs code when trusted: the refusal was real
    assert os.path.isdir(marker)
    nvio.save({"w": torch.ones(3), "n": [1, 2]}, tmp_path / "ok.pt")
    assert_same({"w": torch.ones(3), "n": [1, 2]},
                nvio.load(tmp_path / "ok.pt", weights_only=True))


def _load_with_default(weights_only_default):
    """A stand-in for torch.load whose signature has the given weights_only default."""
    def fake_load(f, map_location=None, pickle_module=None, *, weights_only=weights_only_default,
                  **kwargs):
        raise AssertionError("nvio.load must not call torch.load")
    return fake_load


@pytest.mark.parametrize("torch_default, env, refused", [
    (False, {}, True),  # torch before 2.6 loads anything by default; nvio.load does not
    (None, {}, True),  # torch 2.6 on
    (None, {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}, False),  # torch's opt-out, as torch has it
    (False, {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "true"}, True),
])
def test_weights_only_left_out_is_true_whatever_torch(tmp_path, monkeypatch, torch_default, env,
                                                      refused):
    marker = str(tmp_path / "pwned")
    path = tmp_path / "evil.pt"
    nvio.save({"w": torch.ones(3), "x": _Evil(marker)}, path)
    monkeypatch.setattr(torch, "load", _load_with_default(torch_default))
    for name in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if refused:
        with pytest.raises(nvio.UnsafeCheckpointError) as info:
            nvio.load(path)
        assert info.value.path == str(path)
        assert not os.path.exists(marker)
    else:
        with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
            nvio.load(path)
        assert os.path.isdir(marker)


def test_into_fills_in_place(tmp_path):
    src = {"w": _random((300, 7), torch.float32, 1), "b": _random((7,), torch.bfloat16, 2),
           "e": torch.empty(0), "i": torch.arange(5)}
    path = tmp_path / "i.pt"
    nvio.save(src, path)
    target = {k: torch.zeros_like(v) for k, v in src.items()}
    ptrs = {k: v.data_ptr() for k, v in target.items()}
    assert nvio.load(path, into=target) is target
    assert_same(src, target)
    assert {k: v.data_ptr() for k, v in target.items()} == ptrs
    torch.save(src, tmp_path / "t.pt")  # torch's files too
    target = {k: torch.zeros_like(v) for k, v in src.items()}
    nvio.load(tmp_path / "t.pt", into=target)
    assert_same(src, target)


def test_into_runs_no_code_from_the_file(tmp_path):
    marker = str(tmp_path / "pwned")
    path = tmp_path / "evil.pt"
    nvio.save({"w": torch.ones(3), "x": _Evil(marker)}, path)
    with pytest.raises(pickle.UnpicklingError):
        nvio.load(path, into={"w": torch.zeros(3)})
    assert not os.path.exists(marker)


def test_into_errors_name_the_key(tmp_path):
    path = tmp_path / "i.pt"
    nvio.save({"w": torch.ones(4, 4), "b": torch.ones(4)}, path)
    cases = [({"w": torch.zeros(4, 5), "b": torch.zeros(4)}, "'w'"),
             ({"w": torch.zeros(4, 4), "b": torch.zeros(4, dtype=torch.float64)}, "'b'"),
             ({"w": torch.zeros(4, 4)}, "'b'"),
             ({"w": torch.zeros(4, 8)[:, :4], "b": torch.zeros(4)}, "'w'"),
             # A tensor of into that the checkpoint lacks would keep its old values unnoticed.
             ({"w": torch.zeros(4, 4), "b": torch.zeros(4), "x": torch.zeros(2)}, "'x'"),
             ({"w": torch.zeros(4, 4), "b": {"x": torch.zeros(4)}}, "'b'")]
    for target, key in cases:
        with pytest.raises(nvio.InvalidArgument, match=key):
            nvio.load(path, into=target)
        assert not any(t.any() for t in _tensors(target))  # nothing was read into the tensors


def test_into_fills_a_nested_checkpoint_and_sets_its_other_values(tmp_path):
    """A training checkpoint ({"model": ..., "optimizer": ..., "step": n}) is matched level by
    level: its tensors are read in place, its other values are set. (No floats among the values:
    torch 1.13's restricted unpickler, which into= uses, refuses them.)"""
    model = torch.nn.Linear(6, 3)
    moments = {i: {"exp_avg": _random(tuple(p.shape), torch.float32, 10 + i),
                   "step": torch.tensor(3)} for i, p in enumerate(model.parameters())}
    ckpt = {"model": model.state_dict(),
            "optimizer": {"state": moments, "param_groups": [{"params": [0, 1], "name": "g"}]},
            "step": 7}
    path = tmp_path / "n.pt"
    nvio.save(ckpt, path)
    fresh = torch.nn.Linear(6, 3)
    into = {"model": fresh.state_dict(),
            "optimizer": {"state": {i: {k: torch.zeros_like(v) for k, v in m.items()}
                                    for i, m in moments.items()}, "param_groups": []},
            "step": 0}
    ptrs = [t.data_ptr() for t in _tensors(into)]
    assert nvio.load(path, into=into) is into
    assert into["step"] == 7
    assert into["optimizer"]["param_groups"] == ckpt["optimizer"]["param_groups"]
    assert [t.data_ptr() for t in _tensors(into)] == ptrs
    for k, v in ckpt["model"].items():
        assert torch.equal(fresh.state_dict()[k], v), k
    for i, m in moments.items():
        for k, v in m.items():
            assert torch.equal(into["optimizer"]["state"][i][k], v), (i, k)


def test_into_refuses_what_it_cannot_fill_before_reading_anything(tmp_path):
    path = tmp_path / "n.pt"
    nvio.save({"model": {"w": torch.ones(3)}, "list": [torch.ones(2)], "step": 7}, path)
    cases = [({"model": {"w": torch.zeros(3)}, "step": 0}, r"\['list'\].*cannot be read in place"),
             ({"list": [torch.zeros(2)], "step": 0}, r"\['model'\]"),
             ({"model": torch.zeros(3), "list": [], "step": 0}, r"\['model'\]"),
             ]
    for into, match in cases:
        with pytest.raises(nvio.InvalidArgument, match=match):
            nvio.load(path, into=into)
        assert into.get("step") in (0, None) or isinstance(into["step"], torch.Tensor)
        assert not any(t.any() for t in _tensors(into)), "bytes were read before the refusal"
    with pytest.raises(nvio.InvalidType, match="Tensor"):
        nvio.load(path, into=torch.zeros(3))
    # A value where into holds a tensor would replace it.
    nvio.save({"w": torch.ones(3), "step": 7}, path)
    into = {"w": torch.zeros(3), "step": torch.zeros(1)}
    with pytest.raises(nvio.InvalidArgument, match=r"\['step'\]: .* holds a value of type int "
                                                   "there, into tensors"):
        nvio.load(path, into=into)
    assert not into["w"].any() and isinstance(into["step"], torch.Tensor)


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _rewritten(src, dst, change):
    """The archive at `src` written again to `dst` with `change(name, data)` applied to each
    record, the zip's CRCs made to match: a crafted file, not a corrupted one."""
    import zipfile
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, change(info.filename, zin.read(info)))


def test_into_refuses_a_tensor_outside_its_record(tmp_path):
    """A data.pkl (valid CRC) whose tensor starts 4 elements too late would read the next zip
    header's bytes into the target: refused, as torch.load refuses it."""
    s = torch.arange(10, dtype=torch.float32)
    path, bad = tmp_path / "c.pt", tmp_path / "bad.pt"
    nvio.save({"a": s[5:]}, path)

    def later(name, data):
        if not name.endswith("data.pkl"):
            return data
        assert data.count(b"QK\x05") == 1  # the storage offset, 5, before the size (5,)
        return data.replace(b"QK\x05", b"QK\x09")

    _rewritten(path, bad, later)
    target = {"a": torch.zeros(5)}
    with pytest.raises(nvio.CheckpointFormatError, match="spans bytes 36 to 56 of a record of 40"):
        nvio.load(bad, into=target)
    assert not target["a"].any()
    nvio.load(path, into=target)
    assert torch.equal(target["a"], s[5:])


def test_into_checks_the_crc_of_data_pkl_and_types_every_failure(tmp_path):
    """A flipped bit in data.pkl is a CheckpointFormatError naming the record (the CRC), and a
    data.pkl with a valid CRC that is not torch's pickle is one too, never a UnicodeDecodeError or
    KeyError from inside the unpickler."""
    path = tmp_path / "c.pt"
    nvio.save({"a": torch.arange(10, dtype=torch.float32)}, path)
    raw = bytearray(path.read_bytes())
    at = raw.index(b"\x80\x02}")  # data.pkl's first bytes
    raw[at + 5] ^= 0x20
    flipped = tmp_path / "flipped.pt"
    flipped.write_bytes(bytes(raw))
    with pytest.raises(nvio.CheckpointFormatError, match="CRC-32 mismatch in record .*data.pkl"):
        nvio.load(flipped, into={"a": torch.zeros(10)})
    crafted = tmp_path / "crafted.pt"
    _rewritten(path, crafted,
               lambda name, data: data.replace(b"X\x01\x00\x00\x000", b"X\x01\x00\x00\x00\xff")
               if name.endswith("data.pkl") else data)
    with pytest.raises(nvio.CheckpointFormatError, match="does not unpickle") as info:
        nvio.load(crafted, into={"a": torch.zeros(10)})
    assert info.value.path == str(crafted)


def _files(tmp_path):
    return sorted(os.listdir(tmp_path))


def test_save_errors_are_typed_and_leave_old_file(tmp_path):
    obj = {"w": torch.ones(10)}
    with pytest.raises(nvio.FileNotFound, match="missing"):
        nvio.save(obj, tmp_path / "missing" / "x.pt")
    os.mkdir(tmp_path / "adir")
    with pytest.raises(nvio.IsADirectory, match="adir"):
        nvio.save(obj, tmp_path / "adir")
    with pytest.raises(nvio.InvalidArgument):
        nvio.save(obj, str(tmp_path / "a\0b.pt"))
    path = tmp_path / "keep.pt"
    nvio.save(obj, path)
    old = path.read_bytes()
    with pytest.raises(Exception):
        nvio.save({"w": torch.zeros(10), "f": lambda: 0}, path)  # not picklable
    assert path.read_bytes() == old
    assert _files(tmp_path) == ["adir", "keep.pt"]  # no temporary left behind


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_save_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(nvio.PermissionDenied, match="ro"):
            nvio.save({"w": torch.ones(3)}, ro / "x.pt")
    finally:
        ro.chmod(0o755)


def test_load_errors_are_typed(tmp_path):
    path = tmp_path / "c.pt"
    w = _random((1000,), torch.float32, 3)
    nvio.save({"w": w, "x": torch.arange(3)}, path)
    good = path.read_bytes()
    with pytest.raises(nvio.FileNotFound, match="nope"):
        nvio.load(tmp_path / "nope.pt")
    with pytest.raises(nvio.IsADirectory):
        nvio.load(tmp_path)
    for cut in (0, 10, len(good) // 2, len(good) - 10):
        bad = tmp_path / f"short{cut}.pt"
        bad.write_bytes(good[:cut])
        with pytest.raises(nvio.CheckpointFormatError, match=f"short{cut}") as info:
            nvio.load(bad)
        assert info.value.path == str(bad)
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("archive/data/0")
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len = int.from_bytes(f.read(2), "little")
        extra_len = int.from_bytes(f.read(2), "little")
    flip = info.header_offset + 30 + name_len + extra_len + 1234
    assert good[flip - 1234:flip - 1234 + 4000] == _raw(w)
    corrupt = bytearray(good)
    corrupt[flip] ^= 0x10
    path.write_bytes(bytes(corrupt))
    with pytest.raises(nvio.CheckpointFormatError, match="CRC-32 mismatch in record "
                                                          "'archive/data/0'"):
        nvio.load(path)
    # torch 1.13 does not check CRCs: it loads a changed tensor (the flipped byte was its data).
    assert _raw(torch.load(path)["w"]) != good[flip - 1234:flip - 1234 + 4000]


_CHILD = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import nvio
def obj(seed):
    g = torch.Generator().manual_seed(seed)
    return {"seed": seed, "w": torch.randn(4 << 20, generator=g),
            "b": torch.randn(1 << 20, generator=g).bfloat16()}
objs = [obj(1), obj(2)]
print("ready", flush=True)
i = 1
while True:
    nvio.save(objs[i % 2], sys.argv[2])
    i += 1
"""


def _start_time(pid):
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks after boot."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _host():
    return "".join(c if c.isalnum() and c.isascii() else "-"
                   for c in socket.gethostname()[:63]) or "host"


def test_sigkill_leaves_old_or_new_file_and_the_next_save_or_load_removes_its_temporary(
        tmp_path):
    """A save killed by SIGKILL leaves the old file or the new one, and its temporary, whose name
    says which process made it; the next load (even rounds) or save (odd rounds) of the target
    removes it (issue 28 #4: eight kills left four temporaries for ever)."""
    path = str(tmp_path / "ckpt.pt")
    expected = {}
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        expected[seed] = {"seed": seed, "w": torch.randn(4 << 20, generator=g),
                          "b": torch.randn(1 << 20, generator=g).bfloat16()}
    nvio.save(expected[1], path)
    package = os.path.dirname(os.path.dirname(nvio.__file__))
    rng = random.Random(12)
    seen, torn_temps = set(), 0
    for i in range(8):
        child = subprocess.Popen([sys.executable, "-c", _CHILD, package, path],
                                 stdout=subprocess.PIPE, env={**os.environ, "NVIO_CONFIG": "none"})
        assert child.stdout.readline() == b"ready\n"
        start = _start_time(child.pid)
        time.sleep(rng.uniform(0.05, 1.0))
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL
        temps = glob.glob(str(tmp_path / ".ckpt.pt.*.nvio-tmp"))
        assert len(temps) <= 1
        torn_temps += len(temps)  # a kill during a save leaves its temporary (never `path`)
        for t in temps:
            assert _nvio.temporary_writer("ckpt.pt", os.path.basename(t)) == \
                (_host(), start, child.pid)
        if i % 2 == 0:
            loaded = nvio.load(path)
        else:
            loaded = torch.load(path)
            nvio.save(loaded, path)
        assert not glob.glob(str(tmp_path / ".ckpt.pt.*.nvio-tmp")), "the temporary stayed"
        assert_same(expected[loaded["seed"]], loaded)
        assert_same(expected[loaded["seed"]], torch.load(path))
        seen.add(loaded["seed"])
    assert seen == {1, 2}, "the child never replaced the file: the test proved nothing"
    assert torn_temps > 0, "no kill landed inside a save: the test proved nothing"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
