"""nvio.safetensors: round trips of every dtype torch has here, the exact header bytes (the same as
the C++ side's for the same input), malformed files, slices and metadata."""

from __future__ import annotations

import os
import struct

import pytest

torch = pytest.importorskip("torch")

import nvio  # noqa: E402
from nvio import safetensors as st  # noqa: E402

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]


def _bytes(t):
    """The tensor's bytes as stored (its dtype reinterpreted as uint8)."""
    flat = t.contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""


def _pattern(dtype, shape, seed):
    """A tensor whose bytes locate themselves: each byte is a function of its index and the seed."""
    count = 1
    for d in shape:
        count *= d
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    raw = (torch.arange(nbytes, dtype=torch.int64) * 131 + seed * 7 + nbytes) % 251
    if dtype == torch.bool:
        raw = raw % 2
    return raw.to(torch.uint8).view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_every_dtype(tmp_path, dtype):
    size = torch.empty((), dtype=dtype).element_size()
    tensors = {
        "scalar": _pattern(dtype, (), 1),
        "zero": _pattern(dtype, (0, 3), 2),
        "one": _pattern(dtype, (1,), 3),
        "odd": _pattern(dtype, (4095 // size,), 4),
        "big": _pattern(dtype, (3, (1 << 20) // size // 3 + 41), 5),
    }
    path = tmp_path / "t.safetensors"
    st.save_file(tensors, path, metadata={"k": "v"})
    loaded = st.load_file(path)
    with st.safe_open(path) as f:
        assert list(loaded) == f.offset_keys()  # file order, as the reference's load_file
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape, name
        assert _bytes(loaded[name]) == _bytes(t), name
    # The in-memory forms agree with the file.
    assert st.save(tensors, metadata={"k": "v"}) == path.read_bytes()
    for name, t in st.load(path.read_bytes()).items():
        assert _bytes(t) == _bytes(tensors[name]), name
    assert os.listdir(tmp_path) == ["t.safetensors"]


def test_loaded_tensors_are_placed_like_the_file_and_independent(tmp_path):
    path = tmp_path / "a.safetensors"
    st.save_file({"a": _pattern(torch.float32, (1 << 19,), 1),
                  "b": _pattern(torch.float32, (1 << 19,), 2),
                  "c": _pattern(torch.int8, (4097,), 3)}, path)
    f = st.safe_open(path)
    data_offset = f._f.data_offset
    loaded = st.load_file(path)
    # Each tensor's address matches its file offset modulo the page: the one read of the data
    # region went through O_DIRECT without a bounce copy.
    for name, t in loaded.items():
        e = f._f.entries[name]
        assert (t.data_ptr() - (data_offset + e.begin)) % 4096 == 0, name
    assert len({t.storage().data_ptr() for t in loaded.values()}) == 3
    loaded["a"].fill_(0)
    assert _bytes(loaded["b"]) == _bytes(_pattern(torch.float32, (1 << 19,), 2))
    assert _bytes(loaded["c"]) == _bytes(_pattern(torch.int8, (4097,), 3))
    # Loaded tensors can be saved again (no shared storage between them).
    st.save_file(loaded, tmp_path / "again.safetensors")
    again = st.load_file(tmp_path / "again.safetensors")
    assert _bytes(again["a"]) == b"\0" * (2 << 20)


def test_unaligned_tensors_in_a_foreign_file_are_copied_aligned(tmp_path):
    # A writer other than the reference may put an f32 tensor at an odd offset: it still loads,
    # as an aligned copy, with the right bytes.
    header = b'{"odd":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},' \
             b'"x":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}}'
    header += b" " * (-len(header) % 8)
    x = torch.tensor([1.5, -2.25], dtype=torch.float32)
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"abc" + _bytes(x))
    loaded = st.load_file(path)
    assert loaded["x"].data_ptr() % 4 == 0
    assert loaded["x"].tolist() == [1.5, -2.25]
    assert bytes(loaded["odd"].tolist()) == b"abc"


def test_header_bytes_match_the_specification():
    # The same inputs as the C++ test (tests/cpp/safetensors_test.cpp), the same expected bytes:
    # tensors by dtype, widest alignment first, then by name; compact JSON; spaces to 8 bytes.
    six = torch.arange(6, dtype=torch.float32).reshape(1, 2, 3)
    expected = b'{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}'
    assert st.save({"attn.0": six}) == struct.pack("<Q", 64) + expected + _bytes(six)
    assert st.save({}) == b"\x08" + b"\0" * 7 + b"{}      "
    assert st.save({}, metadata={"framework": "pt"}) == (
        b"\x28" + b"\0" * 7 + b'{"__metadata__":{"framework":"pt"}}     ')
    mixed = {"b": torch.zeros(3, dtype=torch.uint8), "a": torch.zeros(2),
             "z": torch.tensor(True), "c": torch.zeros(1), "e": torch.zeros(0, dtype=torch.int64)}
    json = (b'{"e":{"dtype":"I64","shape":[0],"data_offsets":[0,0]},'
            b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            b'"c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},'
            b'"b":{"dtype":"U8","shape":[3],"data_offsets":[12,15]},'
            b'"z":{"dtype":"BOOL","shape":[],"data_offsets":[15,16]}}  ')
    data = st.save(mixed)
    assert data[:8 + len(json)] == struct.pack("<Q", len(json)) + json
    odd = 'q"\\\n\x01\u00e9'
    json = (b'{"__metadata__":{"a":"1","b":"2"},"q\\"\\\\\\n\\u0001\xc3\xa9":'
            b'{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}    ')
    data = st.save({odd: torch.ones(1, dtype=torch.uint8)}, metadata={"b": "2", "a": "1"})
    assert data == struct.pack("<Q", len(json)) + json + b"\x01"


def test_non_contiguous_saved_as_contiguous_copy(tmp_path):
    base = _pattern(torch.int32, (8, 6), 9)
    st.save_file({"t": base.t()}, tmp_path / "t.st")
    assert torch.equal(st.load_file(tmp_path / "t.st")["t"], base.t().contiguous())


def test_shared_storage_refused_like_the_reference(tmp_path):
    base = torch.zeros(10)
    with pytest.raises(RuntimeError, match="share memory"):
        st.save_file({"a": base[:6], "b": base[5:]}, tmp_path / "s.st")
    with pytest.raises(RuntimeError, match="share memory"):
        st.save({"a": base, "b": base})
    assert not os.listdir(tmp_path)
    # Views side by side in one storage share no bytes: saved, as the reference saves them.
    base = torch.arange(10.0)
    st.save_file({"a": base[:5], "b": base[5:]}, tmp_path / "s.st")
    loaded = st.load_file(tmp_path / "s.st")
    assert loaded["a"].tolist() == [0, 1, 2, 3, 4] and loaded["b"].tolist() == [5, 6, 7, 8, 9]


def test_unsupported_dtypes_and_arguments(tmp_path):
    with pytest.raises(TypeError, match="complex128"):
        st.save_file({"c": torch.zeros(2, dtype=torch.complex128)}, tmp_path / "c.st")
    with pytest.raises(TypeError):
        st.save_file({"a": [1, 2]}, tmp_path / "c.st")
    with pytest.raises(TypeError):
        st.save_file({"a": torch.zeros(1)}, tmp_path / "c.st", metadata={"k": 1})
    with pytest.raises(ValueError, match="framework"):
        st.safe_open(tmp_path / "c.st", framework="tf")
    assert not os.listdir(tmp_path)
    # A dtype of the format that this torch lacks (U16 before torch 2.3).
    header = b'{"u":{"dtype":"U16","shape":[1],"data_offsets":[0,2]}}'
    (tmp_path / "u.st").write_bytes(struct.pack("<Q", len(header)) + header + b"ab")
    if not hasattr(torch, "uint16"):
        with pytest.raises(TypeError, match="U16"):
            st.load_file(tmp_path / "u.st")


@pytest.mark.parametrize("device, error, words", [
    ("meta", nvio.InvalidArgument, "not 'meta'"),
    ("no-such-device", nvio.InvalidType, "is not a device"),
    (True, nvio.InvalidType, "is not a device"),
])
def test_devices_other_than_cpu_and_cuda_are_refused(tmp_path, device, error, words):
    path = tmp_path / "d.st"
    st.save_file({"a": torch.ones(5)}, path)
    with pytest.raises(error, match=words):
        st.load_file(path, device=device)
    with pytest.raises(error, match=words):
        st.safe_open(path, framework="pt", device=device)


def _file(tmp_path, json: bytes, data: bytes = b"", name="bad.safetensors"):
    path = tmp_path / name
    path.write_bytes(struct.pack("<Q", len(json)) + json + data)
    return path


@pytest.mark.parametrize("json,data,problem", [
    (b'{"a":', b"", "UTF-8 JSON"),
    (b'{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}', bytes(16), "unknown dtype"),
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
     b'"b":{"dtype":"U16","shape":[2],"data_offsets":[2,6]}}', bytes(6), "overlaps"),
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(8), "cover 4 bytes"),
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(4), "reach past"),
    (b'{"__metadata__":{"k":1}}', b"", "must be a string"),
])
def test_malformed_files_raise_format_error_naming_the_file(tmp_path, json, data, problem):
    path = _file(tmp_path, json, data)
    for call in (lambda: st.load_file(path), lambda: st.safe_open(path)):
        with pytest.raises(nvio.FormatError, match=problem) as info:
            call()
        assert info.value.path == str(path)
        assert str(path) in str(info.value)
        assert isinstance(info.value, ValueError) and isinstance(info.value, nvio.Error)
    with pytest.raises(st.SafetensorError, match=problem):
        st.load(path.read_bytes())


def test_huge_header_length_and_short_file(tmp_path):
    path = tmp_path / "huge.st"
    path.write_bytes(struct.pack("<Q", 100_000_001) + b"{}")
    with pytest.raises(nvio.FormatError, match="exceeds the limit"):
        st.load_file(path)
    path.write_bytes(b"\x01\x02")
    with pytest.raises(nvio.FormatError, match="fewer than the 8-byte"):
        st.load_file(path)
    with pytest.raises(FileNotFoundError):
        st.load_file(tmp_path / "missing.st")


def test_safe_open_keys_metadata_tensors(tmp_path):
    tensors = {"w": _pattern(torch.float16, (5, 7), 1), "a": _pattern(torch.int64, (3,), 2)}
    path = tmp_path / "m.st"
    st.save_file(tensors, path, metadata={"format": "pt", "x": "é"})
    with st.safe_open(path, framework="pt", device="cpu") as f:
        assert f.keys() == ["a", "w"]
        assert f.offset_keys() == ["a", "w"]  # I64 is written before F16
        assert f.metadata() == {"format": "pt", "x": "é"}
        for name, t in tensors.items():
            assert torch.equal(f.get_tensor(name), t)
        with pytest.raises(st.SafetensorError, match="does not contain"):
            f.get_tensor("nope")
    st.save_file(tensors, path)
    with st.safe_open(path) as f:
        assert f.metadata() is None


@pytest.mark.parametrize("index", [
    0, -1, 3, slice(None), slice(1, 4), slice(2, None, 2), slice(4, 1), slice(-3, None),
    (slice(1, 3), 2), (1, slice(0, 5, 3)), (Ellipsis, 1), (slice(None), None, 2), Ellipsis,
])
def test_get_slice_equals_slicing_the_full_tensor(tmp_path, index):
    t = _pattern(torch.int32, (5, 7), 3)
    path = tmp_path / "s.st"
    st.save_file({"t": t, "s": torch.tensor(2.5)}, path)
    with st.safe_open(path) as f:
        sl = f.get_slice("t")
        assert sl.get_shape() == [5, 7] and sl.get_dtype() == "I32"
        got = sl[index]
        assert torch.equal(got, t[index])
        assert torch.equal(f.get_slice("s")[...], torch.tensor(2.5))


def test_get_slice_out_of_range(tmp_path):
    path = tmp_path / "s.st"
    st.save_file({"t": torch.zeros(3, 2)}, path)
    with st.safe_open(path) as f:
        with pytest.raises(IndexError):
            f.get_slice("t")[3]


def test_metadata_round_trip(tmp_path):
    meta = {"format": "pt", "empty": "", "unicode": "\u00e9\u4e2d", "quote": 'a"b\\c\n'}
    path = tmp_path / "meta.st"
    st.save_file({"a": torch.ones(2)}, path, metadata=meta)
    with st.safe_open(path) as f:
        assert f.metadata() == meta
    st.save_file({"a": torch.ones(2)}, path, metadata={})
    with st.safe_open(path) as f:
        assert f.metadata() == {}


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: device= loads go through the handle's GPU path")
def test_load_to_cuda(tmp_path):
    st.save_file({"a": torch.ones(3)}, tmp_path / "g.st")
    t = st.load_file(tmp_path / "g.st", device="cuda:0")["a"]
    assert t.is_cuda and torch.equal(t.cpu(), torch.ones(3))


def _newer_dtypes():
    names = ["complex64", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
             "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda:0", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: the GPU path of the same loads")),
])
def test_newer_dtypes_and_model_folder_on_device(tmp_path, device):
    """Every dtype of newer torch releases through load_file, safe_open and load_model_folder (two
    shards and an index written here) onto `device`, bytes compared with what was saved."""
    import json as _json

    tensors = {f"t{i}": _pattern(dtype, (4, 6), i) for i, dtype in enumerate(_newer_dtypes())}
    tensors["f32"] = _pattern(torch.float32, (3, 5), 99)
    names = sorted(tensors)
    shards = {"model-1.safetensors": names[: len(names) // 2],
              "model-2.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        st.save_file({k: tensors[k] for k in keys}, tmp_path / shard)
    index = {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(_json.dumps(index))

    loaded = st.load_file(tmp_path / "model-1.safetensors", device=device)
    for k in shards["model-1.safetensors"]:
        assert loaded[k].device == torch.device(device) and loaded[k].dtype == tensors[k].dtype
        assert _bytes(loaded[k].cpu()) == _bytes(tensors[k]), k
    with st.safe_open(tmp_path / "model-2.safetensors", device=device) as f:
        for k in shards["model-2.safetensors"]:
            assert _bytes(f.get_tensor(k).cpu()) == _bytes(tensors[k]), k
            assert _bytes(f.get_slice(k)[1:3].cpu()) == _bytes(tensors[k][1:3]), k
    folder = st.load_model_folder(tmp_path, device=device)
    assert sorted(folder) == names
    for k in names:
        assert folder[k].device == torch.device(device), k
        assert _bytes(folder[k].cpu()) == _bytes(tensors[k]), k
