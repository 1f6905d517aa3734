"""nvio.save / nvio.load against torch.save / torch.load of the installed torch (2.13 in the project
environment), both ways, bytes compared (issue 27 #3): every dtype torch has, shared storages,
views and storage offsets, nested containers, a module's state_dict and an optimizer's (a step
after loading is bit-identical to one on the original); file objects; mmap=True; torch's legacy
format; weights_only on by default, and torch.load(weights_only=True) reading every file nvio.save
writes."""

from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile

import pytest

torch = pytest.importorskip("torch")
import nvio  # noqa: E402

if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 0):
    pytest.skip("parity is tested on torch 2 (the project environment); torch 1.13 runs "
                "test_checkpoint.py", allow_module_level=True)

# What torch.save writes that nvio.save does not: metadata records that torch 2's reader does
# without (a file without them is what torch 1.13 wrote).
TORCH_ONLY_RECORDS = {".data/serialization_id", ".format_version", ".storage_alignment"}


def all_dtypes():
    return sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)


def example(dtype, shape=(6, 4), seed=0):
    """A tensor of `dtype` with varied bit patterns, or None where torch has no way to make one."""
    g = torch.Generator().manual_seed(seed)
    if _quantized(dtype):
        return torch.quantize_per_tensor(torch.randn(shape, generator=g), 0.1, 3, dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    bits = torch.randint(0, 256, (*shape[:-1], shape[-1] * _size(dtype)), generator=g,
                         dtype=torch.uint8)
    try:
        return bits.view(dtype)  # every bit pattern: NaNs, infinities, subnormals
    except (RuntimeError, TypeError):
        return None


def _quantized(dtype):
    return dtype in (torch.qint8, torch.quint8, torch.qint32, getattr(torch, "quint4x2", None),
                     getattr(torch, "quint2x4", None))


def _size(dtype):
    return torch.empty(0, dtype=dtype).element_size()


def storage_bytes(t):
    storage = t.untyped_storage()
    return bytes(torch.empty(0, dtype=torch.uint8).set_(storage).numpy()) if storage.nbytes() \
        else b""


def assert_same(a, b, where="obj"):
    """Deep equality; tensors by dtype, layout, quantization and the bytes of their storage."""
    if isinstance(a, torch.UntypedStorage):  # torch.load gives these back as uint8 TypedStorage
        assert isinstance(b, torch.TypedStorage) and b.dtype == torch.uint8, where
        assert bytes(a) == bytes(b.untyped()), where
        return
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad) == \
            (b.dtype, b.shape, b.stride(), b.storage_offset(), b.requires_grad), where
        if a.is_quantized:
            assert (a.q_scale(), a.q_zero_point()) == (b.q_scale(), b.q_zero_point()), where
        assert storage_bytes(a) == storage_bytes(b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def records(data):
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {i.filename.split("/", 1)[1]: z.read(i) for i in z.infolist()}


def both_ways(obj, tmp_path, name="c"):
    """Saves `obj` with nvio and with torch; checks the archives hold the same records byte for
    byte (torch's own metadata records aside), and every loader on every file gives `obj` back.
    Returns what nvio.load gave for nvio's file."""
    mine, theirs = tmp_path / f"{name}.nvio.pt", tmp_path / f"{name}.torch.pt"
    assert nvio.save(obj, mine) == os.path.getsize(mine)
    torch.save(obj, theirs)
    ours, torchs = records(mine.read_bytes()), records(theirs.read_bytes())
    assert set(torchs) - set(ours) == TORCH_ONLY_RECORDS
    for record, data in ours.items():
        assert torchs.get(record) == data, record  # data.pkl and every storage, byte for byte
    back = nvio.load(mine)
    assert_same(obj, back)
    assert_same(obj, torch.load(mine, weights_only=True))
    assert_same(obj, nvio.load(theirs))
    return back


def test_every_dtype_torch_has(tmp_path):
    saved, refused = [], []
    for i, dtype in enumerate(all_dtypes()):
        t = example(dtype, seed=i)
        if t is None:
            continue
        try:
            torch.save(t, io.BytesIO())
        except Exception as e:  # torch cannot save it (the sub-byte int1..7, uint1..7)
            with pytest.raises(type(e)):
                nvio.save(t, tmp_path / "refused.pt")
            refused.append(dtype)
            continue
        obj = {"t": t, "scalar": t.reshape(-1)[5], "row": t[2], "column": t[:, 1],
               "empty": t[:0]}
        if not _quantized(dtype):
            obj["transposed"] = t.t()
        both_ways(obj, tmp_path, str(dtype).split(".")[1])
        saved.append(dtype)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                 "float8_e8m0fnu", "float4_e2m1fn_x2", "uint16", "uint32", "uint64",
                 "complex32", "complex64", "complex128", "bool", "bfloat16", "qint8", "quint8"):
        if hasattr(torch, name):
            assert getattr(torch, name) in saved, name
    assert len(saved) >= 30, saved


def test_shared_storages_views_and_offsets(tmp_path):
    base = torch.arange(100, dtype=torch.float32)
    other = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    obj = {"base": base, "tail": base[37:], "window": base[10:30].view(4, 5),
           "strided": base[1::7], "again": base, "t": other.t(), "row": other[1],
           "storage": torch.arange(9, dtype=torch.uint8).untyped_storage(),
           "list": [base[50:60], other]}
    back = both_ways(obj, tmp_path)
    assert back["again"] is back["base"]  # one object in, one object out
    ptr = back["base"].untyped_storage().data_ptr()
    for key in ("tail", "window", "strided"):
        assert back[key].untyped_storage().data_ptr() == ptr, key
    assert back["t"].untyped_storage().data_ptr() == back["row"].untyped_storage().data_ptr()
    back["window"][0, 0] = -1.0  # a view of the same memory, as in the original
    assert back["base"][10] == -1.0
    with zipfile.ZipFile(tmp_path / "c.nvio.pt") as z:  # one record per storage
        assert sum(1 for n in z.namelist() if "/data/" in n) == 3


def test_nested_containers(tmp_path):
    obj = collections.OrderedDict(
        step=7, lr=1e-3, name="run", flags=[True, False, None], shape=torch.Size([2, 3]),
        dtype=torch.bfloat16, device=torch.device("cpu"), pair=(1, (2.5, "three")),
        nested={"a": {"b": [torch.ones(2), {"c": torch.zeros(3, dtype=torch.int8)}]}},
        big=2**70, neg=-5, c=complex(1, -2), raw=b"\x00\xff", empty=[{}, (), []])
    both_ways(obj, tmp_path)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 8).to(torch.bfloat16))


def _run(model, x):
    h = model[3](model[2](model[1](model[0](x)).mean(1)))
    return model[5](model[4](h).to(torch.bfloat16))


def test_module_state_dict(tmp_path):
    model = _model()
    model.train()
    x = torch.randint(0, 50, (4, 5))
    _run(model, x)  # BatchNorm's running stats and num_batches_tracked move
    sd = model.state_dict()
    back = both_ways(sd, tmp_path)
    assert type(back) is collections.OrderedDict and back._metadata == sd._metadata
    fresh = torch.nn.Sequential(*(type(m)(*args) for m, args in zip(
        _model(), [(50, 16), (16,), (16, 32), (32,), (), (32, 8)])))
    fresh[5].to(torch.bfloat16)
    fresh.load_state_dict(back)
    model.eval()
    fresh.eval()
    assert storage_bytes(_run(model, x)) == storage_bytes(_run(fresh, x))


@pytest.mark.parametrize("kind", ["Adam", "SGD"])
def test_optimizer_state_dict_steps_bit_identically(tmp_path, kind):
    def setup():
        model = _model()[:3]
        opt = getattr(torch.optim, kind)(model.parameters(), lr=1e-2,
                                         **({"momentum": 0.9} if kind == "SGD" else {}))
        return model, opt

    def step(model, opt, seed):
        g = torch.Generator().manual_seed(seed)
        opt.zero_grad()
        model(torch.randint(0, 50, (4, 5), generator=g)).square().mean().backward()
        opt.step()

    model, opt = setup()
    for seed in range(3):
        step(model, opt, seed)
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    back = both_ways(ckpt, tmp_path)
    loads = (back, torch.load(tmp_path / "c.nvio.pt", weights_only=True),
             nvio.load(tmp_path / "c.torch.pt"))
    step(model, opt, 99)  # the original, one step on
    for loaded in loads:
        model2, opt2 = setup()
        model2.load_state_dict(loaded["model"])
        opt2.load_state_dict(loaded["optimizer"])
        step(model2, opt2, 99)
        for a, b in zip(model.parameters(), model2.parameters()):
            assert storage_bytes(a.detach()) == storage_bytes(b.detach())
        assert len(opt.state) == len(opt2.state) > 0
        for a, b in zip(opt.state.values(), opt2.state.values()):
            assert list(a) == list(b)
            for k in a:
                assert storage_bytes(torch.as_tensor(a[k])) == storage_bytes(torch.as_tensor(b[k]))


def test_file_objects_both_ways(tmp_path):
    obj = {"w": example(torch.float32, (300, 7)), "b": example(torch.bfloat16, (9,), 1),
           "n": [1, "x"]}
    for prefix in (b"", b"leading bytes"):  # an archive starts where the stream stands
        buf = io.BytesIO(prefix)
        buf.seek(len(prefix))
        size = nvio.save(obj, buf)
        assert buf.tell() == len(prefix) + size
        buf.seek(len(prefix))
        assert_same(obj, torch.load(buf, weights_only=True))
        buf.seek(len(prefix))
        assert_same(obj, nvio.load(buf))
        theirs = io.BytesIO(prefix)
        theirs.seek(len(prefix))
        torch.save(obj, theirs)
        theirs.seek(len(prefix))
        assert_same(obj, nvio.load(theirs))
    path = tmp_path / "f.pt"
    with open(path, "wb") as f:  # an open binary file; positional and keyword f
        nvio.save(obj, f=f)
    assert_same(obj, torch.load(path, weights_only=True))
    with open(path, "rb") as f:
        assert_same(obj, nvio.load(f))
        assert f.read() == b""  # left at the end of the archive
    with open(path, "rb", buffering=0) as f:
        assert_same(obj, nvio.load(f, map_location="cpu"))
    with open(tmp_path / "after.bin", "wb") as f:  # an archive after other bytes
        f.write(b"header")
        nvio.save(obj, f)
    for load in (nvio.load, lambda f: torch.load(f, weights_only=True)):
        with open(tmp_path / "after.bin", "rb") as f:
            assert f.read(6) == b"header"
            assert_same(obj, load(f))  # read from where the file stands
    nvio.save(obj, path=path)  # the older keyword still works
    assert_same(obj, nvio.load(path=path))
    with pytest.raises(TypeError):
        nvio.save(obj, path, path=path)
    with pytest.raises(nvio.InvalidArgument, match="file path.*mmap"):
        nvio.load(io.BytesIO(path.read_bytes()), mmap=True)
    with pytest.raises(nvio.InvalidArgument, match="into"):
        nvio.load(io.BytesIO(path.read_bytes()), into={"w": torch.zeros(300, 7)})
    with open(path, "r") as f, pytest.raises(TypeError, match="binary"):
        nvio.load(f)


def _mappings_of(path):
    """The address ranges of /proc/self/maps that map `path`."""
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == str(path):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def test_mmap_maps_the_file_copy_on_write(tmp_path):
    obj = {"w": example(torch.float32, (1000, 33)), "i": example(torch.int64, (77,), 2)}
    for name, saver in (("nvio", nvio.save), ("torch", torch.save)):
        path = tmp_path / f"{name}.pt"
        saver(obj, path)
        before = path.read_bytes()
        back = nvio.load(path, mmap=True)
        assert_same(obj, back)
        ranges = _mappings_of(path)
        for key, t in back.items():  # zero-copy: the tensors are the file's mapped pages
            assert any(s <= t.data_ptr() < e for s, e in ranges), key
        back["w"][0, 0] = 12345.0  # copy-on-write: the file does not change
        assert back["w"][0, 0] == 12345.0
        assert path.read_bytes() == before
        theirs = torch.load(path, mmap=True, weights_only=True)
        back = nvio.load(path, mmap=True)
        assert_same(theirs, back)


def data_offset(data, name):
    """Where entry `name`'s data starts in zip archive `data` (after its local header)."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        at = z.getinfo(name).header_offset
    name_len, extra_len = (int.from_bytes(data[at + k:at + k + 2], "little") for k in (26, 28))
    return at + 30 + name_len + extra_len


def test_mmap_checks_data_pkl_but_not_the_storages(tmp_path):
    path = tmp_path / "c.pt"
    nvio.save({"w": torch.arange(1000, dtype=torch.float32)}, path)
    data = bytearray(path.read_bytes())
    data[data_offset(data, "archive/data/0") + 8] ^= 1  # a bit of w[2]
    path.write_bytes(bytes(data))
    with pytest.raises(nvio.CheckpointFormatError, match="CRC-32"):
        nvio.load(path)
    assert nvio.load(path, mmap=True)["w"][2] != 2.0  # the pages as they are, unread until used
    data[data_offset(data, "archive/data.pkl") + 20] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(nvio.CheckpointFormatError, match="CRC-32 mismatch in record "
                                                          "'archive/data.pkl'"):
        nvio.load(path, mmap=True)


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_legacy_format(tmp_path):
    obj = {"w": example(torch.float32, (50, 3)), "view": None, "n": [1, 2.5]}
    obj["view"] = obj["w"][10:20]
    path = tmp_path / "legacy.pt"
    torch.save(obj, path, _use_new_zipfile_serialization=False)
    assert not path.read_bytes().startswith(b"PK")
    for back in (nvio.load(path), nvio.load(io.BytesIO(path.read_bytes())),
                 nvio.load(path, map_location="cpu", weights_only=False)):
        assert_same(obj, back)
        assert back["view"].untyped_storage().data_ptr() == \
            back["w"].untyped_storage().data_ptr()
    with pytest.raises(nvio.CheckpointFormatError, match="legacy \\(non-zip\\) format"):
        nvio.load(path, mmap=True)
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "x": RunsCode(marker)}, evil,
               _use_new_zipfile_serialization=False)
    with pytest.raises(nvio.UnsafeCheckpointError, match="legacy") as info:
        nvio.load(evil)
    assert isinstance(info.value, pickle.UnpicklingError) and info.value.path == str(evil)
    assert not marker.exists()
    nvio.load(evil, weights_only=False)
    assert marker.exists()


def test_code_running_pickle_refused_by_default(tmp_path):
    marker = tmp_path / "ran"
    obj = {"w": torch.ones(3), "x": RunsCode(marker)}
    for name, saver in (("nvio", nvio.save), ("torch", torch.save)):
        path = tmp_path / f"{name}.pt"
        saver(obj, path)
        for source in (path, io.BytesIO(path.read_bytes())):
            with pytest.raises(nvio.UnsafeCheckpointError) as info:
                nvio.load(source)
            assert isinstance(info.value, pickle.UnpicklingError)
            assert isinstance(info.value, nvio.Error)
        with pytest.raises(nvio.UnsafeCheckpointError):
            nvio.load(path, mmap=True)
        assert not marker.exists()
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path, weights_only=True)
        assert nvio.load(path, weights_only=False)["x"] == 0  # os.system's exit status
        assert marker.exists()
        marker.unlink()
