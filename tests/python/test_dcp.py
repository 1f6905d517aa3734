"""nvio.dcp in one process: torch.distributed.checkpoint files written by nvio load with torch's
FileSystemReader and those torch's FileSystemWriter wrote load through nvio's reader (bytes
compared); what is read; replacing a checkpoint; damaged and hostile checkpoints raise typed errors
naming the file and the tensor. Across ranks: test_dcp_ranks.py."""

import os
import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import nvio  # noqa: E402
import nvio.dcp  # noqa: E402
from nvio.dcp import DCPFormatError, ShapeMismatch  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state():
    g = torch.Generator().manual_seed(7)
    return {
        "small": torch.arange(12.0).reshape(3, 4),
        "big": torch.randn(300, 257, generator=g),  # > the probe: head and tail reads
        "transposed": torch.randn(96, 80, generator=g).t(),  # torch's writer keeps the strides
        "half": torch.randn(5000, generator=g).to(torch.bfloat16),
        "ints": torch.randint(-(1 << 40), 1 << 40, (33,), generator=g),
        "mask": torch.rand(50, generator=g) > 0.5,
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
        "nested": {"a": torch.randn(4, 4, generator=g), "step": 17},
        "name": "run-1",
    }


def blank(sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out[k] = blank(v)
        elif isinstance(v, torch.Tensor):
            out[k] = torch.full_like(v.contiguous(), 0) if v.dtype != torch.bool \
                else torch.zeros_like(v.contiguous())
        else:
            out[k] = None
    return out


def assert_same(got, want):
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        if isinstance(v, dict):
            assert_same(got[k], v)
        elif isinstance(v, torch.Tensor):
            g = got[k]
            assert g.shape == v.shape and g.dtype == v.dtype, k
            assert torch.equal(g.contiguous().view(torch.uint8), v.contiguous().view(torch.uint8)) \
                if v.dim() else torch.equal(g, v), k
        else:
            assert got[k] == v, k


def stock_save(sd, path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(path), **kw))


def nvio_load(sd, path, **kw):
    dcp.load(sd, storage_reader=nvio.dcp.FileSystemReader(str(path), **kw))


def failure(excinfo):
    """The exception a rank raised inside DCP's CheckpointException."""
    (exc, _), = excinfo.value.failures.values()
    return exc


def test_nvio_written_loads_with_torchs_reader(tmp_path):
    sd = state()
    nvio.dcp.save(sd, tmp_path / "c")
    got = blank(sd)
    dcp.load(got, storage_reader=dcp.FileSystemReader(str(tmp_path / "c")))
    assert_same(got, sd)
    names = sorted(os.listdir(tmp_path / "c"))
    assert names[0] == ".metadata" and len(names) == 2 and names[1].endswith(".distcp")


@pytest.mark.parametrize("options", [{}, {"thread_count": 3},
                                     {"single_file_per_rank": False}])
def test_torch_written_loads_with_nvios_reader(tmp_path, options):
    sd = state()
    stock_save(sd, tmp_path / "c", **options)
    got = blank(sd)
    nvio.dcp.load(got, tmp_path / "c")
    assert_same(got, sd)


def test_nvio_round_trip_reads_only_what_it_needs(tmp_path):
    sd = state()
    nvio.dcp.save(sd, tmp_path / "c")
    h = nvio.Handle()
    got = blank(sd)
    nvio_load(got, tmp_path / "c", handle=h)
    assert_same(got, sd)
    tensor_bytes = sum(v.numel() * v.element_size() for v in [*sd.values(), sd["nested"]["a"]]
                       if isinstance(v, torch.Tensor))
    stats = h.stats()
    # The archives' ends (4 KiB each; small archives whole), then the data of the large ones.
    assert stats["bytes_read"] < tensor_bytes + 12 * 8192, stats


def test_a_new_save_replaces_the_checkpoint_and_removes_its_files(tmp_path):
    c = tmp_path / "c"
    stock_save({"x": torch.ones(3)}, c)
    nvio.dcp.save(state(), c)
    first = sorted(p.name for p in c.glob("*.distcp"))
    nvio.dcp.save({"x": torch.arange(5.0)}, c)
    second = sorted(p.name for p in c.glob("*.distcp"))
    assert len(first) == len(second) == 1 and first != second
    got = {"x": torch.zeros(5)}
    dcp.load(got, storage_reader=dcp.FileSystemReader(str(c)))
    assert torch.equal(got["x"], torch.arange(5.0))
    assert not [p for p in c.iterdir() if p.name.endswith(".nvio-tmp")]


def test_a_save_removes_temporaries_of_dead_writers(tmp_path):
    """A rank killed mid-save leaves its data file's temporary; the next save removes it (the
    core's check: its writer is gone), never one of a running writer."""
    import subprocess
    import sys

    from nvio import _nvio

    c = tmp_path / "c"
    nvio.dcp.save({"x": torch.ones(3)}, c)
    target = str(c / "__0_0123456789abcdef_0.distcp")
    code = (f"from nvio import _nvio; import os; p, fd = _nvio.create_temporary({target!r}); "
            "print(p)")
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()
    alive, fd = _nvio.create_temporary(str(c / "__1_0123456789abcdef_0.distcp"))
    try:
        assert os.path.exists(dead) and os.path.exists(alive)
        nvio.dcp.save({"x": torch.ones(3)}, c)
        assert not os.path.exists(dead) and os.path.exists(alive)
    finally:
        os.close(fd)
        os.unlink(alive)


def test_async_save(tmp_path):
    sd = state()
    nvio.dcp.async_save(sd, tmp_path / "c").result()
    got = blank(sd)
    nvio_load(got, tmp_path / "c")
    assert_same(got, sd)


def test_overwrite_false_refuses(tmp_path):
    nvio.dcp.save({"x": torch.ones(2)}, tmp_path / "c")
    with pytest.raises(dcp.api.CheckpointException) as e:
        dcp.save({"x": torch.ones(2)},
                 storage_writer=nvio.dcp.FileSystemWriter(tmp_path / "c", overwrite=False))
    assert isinstance(failure(e), nvio.InvalidArgument)


# ---- damaged and hostile checkpoints -----------------------------------------------------------

def saved(tmp_path, writer="nvio"):
    sd = {"a": torch.randn(64, 64), "b": torch.arange(3000, dtype=torch.int64)}
    (nvio.dcp.save if writer == "nvio" else stock_save)(sd, tmp_path / "c")
    md = dcp.FileSystemReader(str(tmp_path / "c")).read_metadata()
    info = {k.fqn: v for k, v in md.storage_data.items()}
    return sd, md, info


def load_error(tmp_path, sd):
    with pytest.raises(dcp.api.CheckpointException) as e:
        nvio_load(blank(sd), tmp_path / "c")
    return failure(e)


@pytest.mark.parametrize("writer", ["nvio", "stock"])
def test_truncated_file(tmp_path, writer):
    sd, _, info = saved(tmp_path, writer)
    path = tmp_path / "c" / info["b"].relative_path
    last = max(info.values(), key=lambda s: s.offset)
    os.truncate(path, last.offset + last.length - 100)
    err = load_error(tmp_path, sd)
    assert isinstance(err, DCPFormatError) and err.path == str(path)
    assert err.tensor == [k for k, v in info.items() if v is last][0]
    assert "truncated" in str(err) and repr(err.tensor) in str(err)


@pytest.mark.parametrize("writer", ["nvio", "stock"])
@pytest.mark.parametrize("where", ["data", "pickle", "directory"])
def test_damaged_file(tmp_path, writer, where):
    sd, _, info = saved(tmp_path, writer)
    s = info["a"]
    path = tmp_path / "c" / s.relative_path
    blob = bytearray(path.read_bytes()[s.offset:s.offset + s.length])
    if where == "data":  # a flipped bit in the tensor's bytes: its CRC-32 no longer matches
        at = blob.find(sd["a"].numpy().tobytes()[:64]) + 1000
    elif where == "pickle":
        at = blob.find(b"rebuild_tensor")
    else:  # the archive's end of central directory record
        at = blob.rfind(b"PK\x05\x06")
    assert at > 0
    with open(path, "r+b") as f:
        f.seek(s.offset + at)
        f.write(bytes([blob[at] ^ 0x10]))
    err = load_error(tmp_path, sd)
    assert isinstance(err, DCPFormatError) and err.path == str(path) and err.tensor == "a"
    assert "'a'" in str(err) and str(path) in str(err)


def rewrite_metadata(tmp_path, md):
    with open(tmp_path / "c" / ".metadata", "wb") as f:
        pickle.dump(md, f)


def test_metadata_pointing_past_the_end(tmp_path):
    sd, md, info = saved(tmp_path)
    key = next(k for k in md.storage_data if k.fqn == "b")
    size = os.path.getsize(tmp_path / "c" / info["b"].relative_path)
    md.storage_data[key].offset = size - 10
    rewrite_metadata(tmp_path, md)
    err = load_error(tmp_path, sd)
    assert isinstance(err, DCPFormatError) and err.tensor == "b"
    assert f"which has {size} bytes" in str(err)


def test_metadata_pointing_at_another_tensor(tmp_path):
    sd, md, info = saved(tmp_path)
    ka = next(k for k in md.storage_data if k.fqn == "a")
    kb = next(k for k in md.storage_data if k.fqn == "b")
    md.storage_data[ka], md.storage_data[kb] = md.storage_data[kb], md.storage_data[ka]
    rewrite_metadata(tmp_path, md)
    err = load_error(tmp_path, sd)
    assert isinstance(err, DCPFormatError) and err.tensor in ("a", "b")
    assert ".metadata says" in str(err)


def test_metadata_naming_a_file_outside(tmp_path):
    sd, md, _ = saved(tmp_path)
    for v in md.storage_data.values():
        v.relative_path = "../elsewhere.distcp"
    rewrite_metadata(tmp_path, md)
    err = load_error(tmp_path, sd)
    assert isinstance(err, DCPFormatError) and "outside" in str(err)


def test_missing_data_file(tmp_path):
    sd, _, info = saved(tmp_path)
    path = tmp_path / "c" / info["a"].relative_path
    path.unlink()
    err = load_error(tmp_path, sd)
    assert isinstance(err, nvio.FileNotFound) and str(path) in str(err)


def test_damaged_metadata(tmp_path):
    sd, _, _ = saved(tmp_path)
    path = tmp_path / "c" / ".metadata"
    path.write_bytes(b"\x80\x04not a pickle")
    reader = nvio.dcp.FileSystemReader(str(tmp_path / "c"))
    with pytest.raises(DCPFormatError) as e:
        reader.read_metadata()
    assert e.value.path == str(path)
    # dcp.load turns the reader's error into an AssertionError of its own, keeping its text.
    with pytest.raises(dcp.api.CheckpointException, match="is not a DCP .metadata file"):
        nvio_load(blank(sd), tmp_path / "c")


def test_missing_checkpoint(tmp_path):
    with pytest.raises(nvio.FileNotFound):
        nvio.dcp.FileSystemReader(str(tmp_path / "none")).read_metadata()


def test_a_checkpoint_of_another_model_shape(tmp_path):
    sd, _, _ = saved(tmp_path)
    other = {"a": torch.zeros(64, 65), "b": torch.zeros(3000, dtype=torch.int64)}
    with pytest.raises(dcp.api.CheckpointException) as e:
        nvio.dcp.load(other, tmp_path / "c")
    err = failure(e)
    assert isinstance(err, ShapeMismatch) and err.tensor == "a"
    assert err.path == os.path.join(str(tmp_path / "c"), ".metadata")
    assert "(64, 65)" in str(err) and "(64, 64)" in str(err)
    assert torch.count_nonzero(other["b"]) == 0  # nothing was loaded


def test_replacement_file_commits_or_leaves_nothing(tmp_path):
    """_nvio.ReplacementFile, the binding nvio.dcp writes every file through."""
    from nvio import _nvio

    target = tmp_path / "f"
    target.write_bytes(b"old")
    h = nvio.Handle()
    f = _nvio.ReplacementFile(h._core, str(target))
    temp = f.temp_path
    h.write_batch([(b"new contents", 0)], f.fd, sync=True)
    assert target.read_bytes() == b"old" and os.path.exists(temp)
    f.commit(True)
    assert target.read_bytes() == b"new contents" and not os.path.exists(temp)
    with pytest.raises(nvio.InvalidArgument):
        f.commit(True)
    g = _nvio.ReplacementFile(h._core, str(target))
    h.write_batch([(b"discarded", 0)], g.fd)
    temp = g.temp_path
    g.discard()
    assert target.read_bytes() == b"new contents" and not os.path.exists(temp)
    with pytest.raises(nvio.FileNotFound):
        _nvio.ReplacementFile(h._core, str(tmp_path / "missing" / "f"))
