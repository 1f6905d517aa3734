"""nvio.deepspeed.install(): an installed DeepSpeed's builders resolve to nvio, tested against the
stand-in DeepSpeed in standin_deepspeed/, whose own builders cannot build anything: its swapper,
pinned-memory and FastPersist code works only through nvio (test_deepspeed_real.py does the same
against the real DeepSpeed, whose own ops work too). Installing before and after
`import deepspeed`, idempotence, uninstall, nothing to patch, the NVIO_DEEPSPEED switch and the
.pth file that reads it."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
import warnings

import pytest
import torch

import nvio
import nvio._deepspeed_install as inst
import nvio.deepspeed as nds
from conftest import as_bytes, random_bytes, read_file

# The stand-in is not a DeepSpeed release: install() says so each time (test_deepspeed_real.py
# checks that warning); here it is expected.
pytestmark = pytest.mark.filterwarnings("ignore:.*0.0.standin is not a release:RuntimeWarning")

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "standin_deepspeed")
ROOT = os.path.dirname(os.path.dirname(HERE))
PTH = os.path.join(ROOT, "python", "nvio-deepspeed.pth")
NAMES = ("AsyncIOBuilder", "GDSBuilder", "UtilsBuilder", "PinMemoryBuilder")
AIO_CONFIG = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
              "single_submit": False, "overlap_events": True, "use_gds": False}


def _purge() -> None:
    for name in [n for n in sys.modules if n == "deepspeed" or n.startswith("deepspeed.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def standin():
    nds.uninstall()
    _purge()
    sys.path.insert(0, STANDIN)
    try:
        yield
    finally:
        nds.uninstall()
        _purge()
        sys.path.remove(STANDIN)


@pytest.fixture(params=["install-before-import", "install-after-import"])
def patched(request, standin):
    """The stand-in DeepSpeed with nvio installed, before or after it was imported."""
    if request.param == "install-before-import":
        nds.install()
        import deepspeed
    else:
        import deepspeed

        nds.install()
    return deepspeed


def _random_tensor(numel: int, dtype, seed: int) -> torch.Tensor:
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer(bytearray(random_bytes(nbytes, seed)), dtype=dtype)


def test_the_standin_alone_cannot_swap():
    """Without nvio the stand-in's builders fail: the tests below can only pass through nvio."""
    sys.path.insert(0, STANDIN)
    try:
        nds.uninstall()
        _purge()
        import deepspeed
        from deepspeed.ops.op_builder import AsyncIOBuilder

        with pytest.raises(RuntimeError, match="cannot be built"):
            AsyncIOBuilder().load(verbose=False)
        assert not deepspeed.get_accelerator().create_op_builder("AsyncIOBuilder").is_compatible()
    finally:
        _purge()
        sys.path.remove(STANDIN)


def test_every_way_to_a_builder_resolves_to_nvio(patched):
    deepspeed = patched
    from deepspeed.ops import op_builder
    from deepspeed.ops.op_builder import builder_names
    from deepspeed.runtime.swap_tensor import partitioned_param_swapper

    accelerator = deepspeed.get_accelerator()
    for name in NAMES:
        ours = getattr(nds, name)
        assert getattr(op_builder, name) is ours, name
        assert accelerator.get_op_builder(name) is ours, name
        assert type(accelerator.create_op_builder(name)) is ours, name
        assert getattr(builder_names, name) == name  # the names stay strings
    # Bound when the swapper was imported, before or after install().
    assert partitioned_param_swapper.AsyncIOBuilder is nds.AsyncIOBuilder
    assert partitioned_param_swapper.GDSBuilder is nds.GDSBuilder
    # The modules defining DeepSpeed's classes, for code that imports from them.
    from deepspeed.ops.op_builder import async_io, gds, utils

    assert async_io.AsyncIOBuilder is nds.AsyncIOBuilder and gds.GDSBuilder is nds.GDSBuilder
    assert utils.UtilsBuilder is nds.UtilsBuilder
    # Other builders are DeepSpeed's own.
    assert accelerator.get_op_builder("CPUAdamBuilder").__name__ == "NotImplementedBuilder"
    assert nds.installed()


def test_zero_param_swapper_round_trip(patched, tmp_path):
    """ZeRO-Infinity / ZeRO-Inference's parameter swapper: async_pwrite / wait, then async_pread
    / wait, through the handles its AsyncIOBuilder import gives it."""
    from deepspeed.runtime.swap_tensor.partitioned_param_swapper import (
        AsyncPartitionedParameterSwapper)

    numel = 256 * 1024 + 3
    swapper = AsyncPartitionedParameterSwapper(AIO_CONFIG, numel, 3, torch.float16)
    assert type(swapper.aio_write_handle) is nvio.aio_handle
    assert swapper.aio_write_handle.get_queue_depth() == 8
    for i in range(3):
        swapper.buffer(i).copy_(_random_tensor(numel, torch.float16, seed=i))
    expected = [as_bytes(swapper.buffer(i)) for i in range(3)]
    paths = [str(tmp_path / f"param{i}.swp") for i in range(3)]
    swapper.swap_out([0, 1, 2], paths)
    swapper.synchronize_writes()
    assert [read_file(p) for p in paths] == expected
    swapper.buffers.zero_()
    swapper.swap_in([2, 0, 1], [paths[2], paths[0], paths[1]])
    swapper.synchronize_reads()
    assert [as_bytes(swapper.buffer(i)) for i in range(3)] == expected


def test_zero_param_swapper_with_use_gds(patched, tmp_path):
    from deepspeed.runtime.swap_tensor.partitioned_param_swapper import (
        AsyncPartitionedParameterSwapper)

    swapper = AsyncPartitionedParameterSwapper({**AIO_CONFIG, "use_gds": True}, 4099, 1,
                                               torch.float32)
    assert type(swapper.aio_write_handle) is nvio.gds_handle
    data = _random_tensor(4099, torch.float32, seed=7)
    swapper.buffer(0).copy_(data)
    swapper.swap_out([0], [str(tmp_path / "g.swp")])
    swapper.synchronize_writes()
    assert read_file(str(tmp_path / "g.swp")) == as_bytes(data)
    swapper.buffers.zero_()
    swapper.swap_in([0], [str(tmp_path / "g.swp")])
    swapper.synchronize_reads()
    assert as_bytes(swapper.buffer(0)) == as_bytes(data)


def test_optimizer_swapper_imported_later_uses_locked_buffers(patched, tmp_path):
    """Imported after install(); asks the accelerator for the builder by name, allocates with
    new_cpu_locked_tensor, and its SwapBufferPool checks aio_handle.is_pinned on each buffer."""
    from deepspeed.runtime.swap_tensor.optimizer_utils import OptimizerSwapper

    swapper = OptimizerSwapper(AIO_CONFIG, largest_numel=100_003, count=2, dtype=torch.float32)
    assert swapper.compatible is True
    assert type(swapper.aio_handle) is nvio.aio_handle
    buffers = swapper.manager.all_buffers
    assert all(as_bytes(b) == bytes(b.numel() * 4) for b in buffers)  # zeroed, as DeepSpeed's
    pool = swapper.pool()
    for i, b in enumerate(buffers):
        b.copy_(_random_tensor(100_003, torch.float32, seed=20 + i))
    expected = [as_bytes(b) for b in buffers]
    paths = [str(tmp_path / f"state{i}.swp") for i in range(2)]
    pool.swap_out(swapper.aio_handle, paths)
    assert [read_file(p) for p in paths] == expected
    for b in buffers:
        b.zero_()
    pool.swap_in(swapper.aio_handle, paths)
    assert [as_bytes(b) for b in buffers] == expected


def test_native_pinned_memory_backend(patched, tmp_path):
    """DS_PIN_MEMORY_BACKEND=native: PinMemoryBuilder().load().pin_handle(); the memory is freed
    through free_cpu_locked_tensor_by_ptr once DeepSpeed's tensor is collected."""
    import gc

    from deepspeed.utils.pin_memory import NativePinnedMemory

    pins = NativePinnedMemory()
    source = _random_tensor(3 * 5000, torch.int16, seed=3).view(3, 5000)
    locked = pins.pin(source)
    assert locked.shape == source.shape and as_bytes(locked) == as_bytes(source)
    assert locked.data_ptr() % 4096 == 0
    assert pins.is_pinned(locked) and pins.is_pinned(locked[1])
    assert not pins.is_pinned(source)
    handle = nds.AsyncIOBuilder().load().aio_handle()
    assert handle.is_pinned(locked)  # DeepSpeed's handles share one pinned-memory manager
    path = str(tmp_path / "pinned.bin")
    assert handle.sync_pwrite(locked, path) == 1
    assert read_file(path) == as_bytes(source)
    del locked
    gc.collect()
    assert pins.freed == [True]


def test_fastpersist_writer(patched, tmp_path):
    """FastPersist: UtilsBuilder's cast_to_byte_tensor, a locked buffer, async_pwrite to an
    O_DIRECT descriptor at aligned offsets, the tail buffered."""
    from deepspeed.io.fast_file_writer import FastFileWriter

    handle = nds.AsyncIOBuilder().load(verbose=False).aio_handle()
    pinned = handle.new_cpu_locked_tensor(64 * 1024, torch.empty(0, dtype=torch.uint8))
    path = str(tmp_path / "ckpt.pt")
    try:
        writer = FastFileWriter(path, handle, pinned)
    except OSError as e:
        pytest.skip(f"O_DIRECT is refused in {tmp_path}: {e}")
    tensors = [_random_tensor(70_001, torch.float32, seed=11), _random_tensor(9, torch.bfloat16, 12)
               .view(3, 3), _random_tensor(1, torch.int64, seed=13)]
    tail = writer.save_tensors(tensors)
    writer.close(tail)
    assert read_file(path) == b"".join(as_bytes(t) for t in tensors)


def test_install_is_idempotent_and_uninstall_restores(standin):
    import deepspeed
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
    from deepspeed.ops import op_builder
    from deepspeed.runtime.swap_tensor import partitioned_param_swapper

    originals = {name: getattr(op_builder, name) for name in NAMES}
    get_op_builder = CPU_Accelerator.get_op_builder
    nds.install()
    patched_get = CPU_Accelerator.get_op_builder
    from deepspeed.io import fast_file_writer  # imported while installed: bound nvio's class

    assert fast_file_writer.UtilsBuilder is nds.UtilsBuilder
    nds.install()
    assert CPU_Accelerator.get_op_builder is patched_get  # not wrapped twice
    assert patched_get.__wrapped__ is get_op_builder
    assert sum(f is inst._finder for f in sys.meta_path) == 1
    nds.uninstall()
    assert not nds.installed()
    assert inst._finder not in sys.meta_path
    assert CPU_Accelerator.get_op_builder is get_op_builder
    assert "create_op_builder" in vars(CPU_Accelerator)
    for name in NAMES:
        assert getattr(op_builder, name) is originals[name], name
    assert partitioned_param_swapper.AsyncIOBuilder is originals["AsyncIOBuilder"]
    assert fast_file_writer.UtilsBuilder is originals["UtilsBuilder"]
    assert deepspeed.get_accelerator().get_op_builder("GDSBuilder").__name__ == \
        "NotImplementedBuilder"
    with pytest.raises(RuntimeError, match="cannot be built"):
        op_builder.AsyncIOBuilder().load()
    nds.uninstall()  # a second uninstall is a no-op
    nds.install()  # and installing again works
    assert op_builder.AsyncIOBuilder is nds.AsyncIOBuilder


def test_nothing_to_patch_without_deepspeed(monkeypatch):
    nds.uninstall()
    _purge()
    # The environment may have the real DeepSpeed (requirements.txt): take its folder off the path.
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if not os.path.isdir(os.path.join(p or ".", "deepspeed"))])
    importlib.invalidate_caches()
    assert importlib.util.find_spec("deepspeed") is None
    with pytest.raises(nds.NothingToPatch, match="not installed") as info:
        nds.install()
    assert isinstance(info.value, ImportError) and isinstance(info.value, nvio.Error)
    assert not nds.installed()
    assert inst._finder not in sys.meta_path


def test_nothing_to_patch_in_a_deepspeed_without_builders():
    nds.uninstall()
    _purge()
    fake = {name: types.ModuleType(name)
            for name in ("deepspeed", "deepspeed.ops", "deepspeed.ops.op_builder")}
    sys.modules.update(fake)
    try:
        with pytest.raises(nds.NothingToPatch, match="none of AsyncIOBuilder"):
            nds.install()
        assert not nds.installed()
        assert inst._finder not in sys.meta_path
    finally:
        _purge()


@pytest.mark.parametrize("value", ["", "0", "false", "No", "off"])
def test_environment_switch_off(value, standin, monkeypatch):
    monkeypatch.setenv("NVIO_DEEPSPEED", value)
    assert nds.install_from_environment() is False
    assert not nds.installed()


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_environment_switch_on(value, standin, monkeypatch):
    monkeypatch.setenv("NVIO_DEEPSPEED", value)
    assert nds.install_from_environment() is True
    import deepspeed.ops.op_builder

    assert deepspeed.ops.op_builder.AsyncIOBuilder is nds.AsyncIOBuilder


def test_environment_switch_warns_never_raises(monkeypatch):
    nds.uninstall()
    _purge()
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if not os.path.isdir(os.path.join(p or ".", "deepspeed"))])
    importlib.invalidate_caches()
    monkeypatch.setenv("NVIO_DEEPSPEED", "maybe")
    with pytest.warns(RuntimeWarning, match="'maybe' is neither on"):
        assert nds.install_from_environment() is False
    monkeypatch.setenv("NVIO_DEEPSPEED", "1")
    with pytest.warns(RuntimeWarning, match="NVIO_DEEPSPEED is set but.*not installed"):
        assert nds.install_from_environment() is False
    assert not nds.installed()


_PTH_CHECK = """
import site, sys
site.addsitedir(sys.argv[1])
from deepspeed.ops.op_builder import AsyncIOBuilder
import deepspeed.runtime.swap_tensor.partitioned_param_swapper as swapper
print(AsyncIOBuilder.__module__, swapper.AsyncIOBuilder.__module__, "nvio" in sys.modules)
"""


@pytest.mark.parametrize("value, expected", [
    ("1", "nvio.deepspeed nvio.deepspeed True"),
    (None, "deepspeed.ops.op_builder.async_io deepspeed.ops.op_builder.async_io False"),
])
def test_pth_file_reads_the_switch_at_start(value, expected, tmp_path):
    """The .pth file the package installs, as the interpreter processes it at start (site)."""
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    with open(PTH) as f:
        (site_dir / "nvio-deepspeed.pth").write_text(f.read())
    import nvio as pkg

    env = {k: v for k, v in os.environ.items() if k != "NVIO_DEEPSPEED"}
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(pkg.__file__))), STANDIN])
    if value is not None:
        env["NVIO_DEEPSPEED"] = value
    r = subprocess.run([sys.executable, "-c", _PTH_CHECK, str(site_dir)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == expected, r.stderr


def test_setup_py_ships_the_pth_file(tmp_path):
    """setup.py's build_py puts the .pth file at the top of the built tree, next to nvio/, so a
    wheel installs it into site-packages itself."""
    if not os.access(os.path.join(ROOT, "python"), os.W_OK):
        pytest.skip("setup.py writes its egg-info into the source tree, not writable here")
    out = tmp_path / "lib"
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "No module named 'setuptools'" in r.stderr:
        pytest.skip("setuptools is not installed")
    assert r.returncode == 0, r.stderr
    with open(PTH, "rb") as f:
        assert (out / "nvio-deepspeed.pth").read_bytes() == f.read()
    assert (out / "nvio" / "_deepspeed_install.py").is_file()


# ---- the ops themselves -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool,
                                   torch.uint8, torch.complex64])
def test_cast_to_byte_tensor_aliases_the_bytes(dtype):
    cast = nds.UtilsBuilder().load().cast_to_byte_tensor
    t = torch.zeros(6, 5, dtype=dtype)
    b = cast(t)
    assert b.dtype == torch.uint8 and b.dim() == 1
    assert b.numel() == t.numel() * t.element_size() and b.data_ptr() == t.data_ptr()
    raw = random_bytes(b.numel(), 5)
    if dtype == torch.bool:
        raw = bytes(x & 1 for x in raw)
    b.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    assert as_bytes(t) == raw  # written through the byte view, seen in the typed tensor


def test_cast_to_byte_tensor_lists_and_refusals():
    cast = nds.UtilsBuilder().load().cast_to_byte_tensor
    ts = [torch.arange(4, dtype=torch.int32), torch.ones(2, 2, dtype=torch.float16)]
    out = cast(ts)
    assert isinstance(out, list) and [as_bytes(b) for b in out] == [as_bytes(t) for t in ts]
    assert cast(torch.tensor(7, dtype=torch.int16)).numel() == 2  # 0-d
    with pytest.raises(nvio.InvalidArgument, match="not contiguous"):
        cast(torch.zeros(4, 4).t())
    with pytest.raises(nvio.InvalidType):
        cast(b"bytes")


def test_utils_flatten_unflatten():
    ops = nds.UtilsBuilder().load()
    ts = [torch.arange(6, dtype=torch.float32).view(2, 3), torch.full((4,), 2.5)]
    flat = ops.flatten(ts)
    assert flat.shape == (10,) and flat.tolist() == [0, 1, 2, 3, 4, 5, 2.5, 2.5, 2.5, 2.5]
    back = ops.unflatten(flat, ts)
    assert [b.shape for b in back] == [t.shape for t in ts]
    assert all(torch.equal(b, t) for b, t in zip(back, ts))


def test_pin_handle():
    h = nds.PinMemoryBuilder().load().pin_handle()
    t = h.new_cpu_locked_tensor(1000, torch.empty(0, dtype=torch.float64))
    assert t.dtype == torch.float64 and t.shape == (1000,) and t.data_ptr() % 4096 == 0
    assert h.is_pinned(t) and h.is_pinned(t[10:20])
    assert not h.is_pinned(torch.empty(1000))
    t.copy_(_random_tensor(1000, torch.float64, 9))
    expected = as_bytes(t)
    assert h.free_cpu_locked_tensor_by_ptr(t.data_ptr()) is True
    assert h.free_cpu_locked_tensor_by_ptr(t.data_ptr()) is False
    assert as_bytes(t) == expected  # the tensor still owns its memory
    u = h.new_cpu_locked_tensor(10, torch.empty(0, dtype=torch.uint8))
    assert h.free_cpu_locked_tensor(torch.empty(10)) is False
    assert h.free_cpu_locked_tensor(u) is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nds.PinMemoryBuilder().is_compatible() and nds.PinMemoryBuilder().name == "pin_memory"
