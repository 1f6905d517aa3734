"""nvio.deepspeed.install() on the real DeepSpeed (requirements.txt's pin, its ops built by
scripts/deepspeed_ops.sh; skipped with the reason without them), on its CPU accelerator.

Routing (issue 30 #2): after install() every way DeepSpeed reaches AsyncIOBuilder, GDSBuilder and
PinMemoryBuilder gives nvio's, uninstall() gives DeepSpeed's own back, and installing twice, after
DeepSpeed loaded its op, on an unknown release, or with a route left unpatched behave as documented.
Swappers (#3): DeepSpeed's AsyncTensorSwapper, PartitionedOptimizerSwapper and
AsyncPartitionedParameterSwapper, each driven once on DeepSpeed's op and once on nvio's: every
tensor swapped back is bit-identical to what went out (and, for the optimizer, to torch's Adam in
memory), and the two runs' files are byte for byte the same."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import types

import pytest
import torch

import _ds_real

deepspeed = _ds_real.require()

import deepspeed.comm as dist  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from deepspeed.ops import op_builder  # noqa: E402
from deepspeed.runtime.swap_tensor import partitioned_param_swapper as pps  # noqa: E402

import nvio  # noqa: E402
import nvio._deepspeed_install as inst  # noqa: E402
import nvio.deepspeed as nds  # noqa: E402
from conftest import as_bytes, random_bytes, read_file  # noqa: E402

# Once a test has had DeepSpeed load its own op, every later install() in this process says so;
# the test about that warning checks it with pytest.warns, which sees it regardless.
pytestmark = pytest.mark.filterwarnings("ignore:.*already loaded its own:RuntimeWarning")

NAMES = ("AsyncIOBuilder", "GDSBuilder", "PinMemoryBuilder")
AIO = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
       "single_submit": False, "overlap_events": True}
HANDLE_ARGS = (AIO["block_size"], AIO["queue_depth"], AIO["single_submit"],
               AIO["overlap_events"], AIO["intra_op_parallelism"])


@pytest.fixture(scope="module", autouse=True)
def gloo():
    """A one-rank gloo group: DeepSpeed's swappers ask dist.get_rank()."""
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                          WORLD_SIZE="1", LOCAL_RANK="0")
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    yield


@pytest.fixture(autouse=True)
def uninstalled():
    nds.uninstall()
    yield
    nds.uninstall()


def _random(numel: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    size = torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer(bytearray(random_bytes(numel * size, seed)), dtype=dtype)


def _routes() -> dict:
    """What every route to the builders gives now."""
    accelerator = get_accelerator()
    from deepspeed.ops import aio
    from deepspeed.ops.op_builder import cpu

    routes = {}
    for name in NAMES:
        routes[f"op_builder.{name}"] = getattr(op_builder, name)
        routes[f"get_op_builder({name})"] = accelerator.get_op_builder(name)
        routes[f"create_op_builder({name})"] = type(accelerator.create_op_builder(name))
    routes["aio.AsyncIOBuilder"] = aio.AsyncIOBuilder
    routes["cpu.AsyncIOBuilder"] = cpu.AsyncIOBuilder
    routes["cpu.PinMemoryBuilder"] = cpu.PinMemoryBuilder
    routes["partitioned_param_swapper.AsyncIOBuilder"] = pps.AsyncIOBuilder
    routes["partitioned_param_swapper.GDSBuilder"] = pps.GDSBuilder
    return routes


def _round_trip(handle, tmp_path, name: str) -> None:
    data = _random(300_032, seed=len(name))  # 4 KiB multiple: DeepSpeed reads O_DIRECT
    path = str(tmp_path / name)
    assert handle.sync_pwrite(data, path) == 1
    assert read_file(path) == as_bytes(data)
    back = torch.zeros_like(data)
    assert handle.sync_pread(back, path) == 1
    assert as_bytes(back) == as_bytes(data)


def test_routes_after_install_and_uninstall_restores(tmp_path):
    own = _routes()
    assert own["op_builder.AsyncIOBuilder"].__module__ == "deepspeed.ops.op_builder.cpu.async_io"
    # DeepSpeed's CPU accelerator has no GDS op at all.
    assert own["op_builder.GDSBuilder"].__name__ == "NotImplementedBuilder"
    nds.install()
    for route, value in _routes().items():
        assert value is getattr(nds, re.search(r"(\w+Builder)\)?$", route).group(1)), route
    handle = op_builder.AsyncIOBuilder().load().aio_handle(*HANDLE_ARGS)
    assert type(handle) is nvio.aio_handle
    assert handle.get_queue_depth() == 8 and handle.get_overlap_events() is True
    _round_trip(handle, tmp_path, "aio")
    gds = op_builder.GDSBuilder().load(verbose=False).gds_handle(*HANDLE_ARGS)
    assert type(gds) is nvio.gds_handle  # no GPU here: host tensors, and the bounce path
    _round_trip(gds, tmp_path, "gds")
    pins = op_builder.PinMemoryBuilder().load().pin_handle()
    locked = pins.new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.float16))
    assert locked.dtype == torch.float16 and handle.is_pinned(locked)
    assert pins.free_cpu_locked_tensor(locked)
    nds.uninstall()
    assert _routes() == own
    theirs = op_builder.AsyncIOBuilder().load(verbose=False).aio_handle(*HANDLE_ARGS)
    assert not isinstance(theirs, nvio.aio_handle)
    _round_trip(theirs, tmp_path, "deepspeed")


def test_install_twice_is_one_install():
    own = _routes()
    nds.install()
    patched = _routes()
    records = len(inst._records)
    nds.install()
    assert _routes() == patched and len(inst._records) == records
    assert sum(f is inst._finder for f in sys.meta_path) == 1
    nds.uninstall()
    assert _routes() == own and not nds.installed()


def test_install_after_deepspeed_loaded_its_op(tmp_path):
    """DeepSpeed's own op loaded and a handle made before install(): a warning says that handle
    stays DeepSpeed's; what is loaded from then on is nvio's."""
    theirs = op_builder.AsyncIOBuilder().load(verbose=False).aio_handle(*HANDLE_ARGS)
    with pytest.warns(RuntimeWarning, match="already loaded its own async_io"):
        nds.install()
    assert nds.installed()
    assert type(op_builder.AsyncIOBuilder().load().aio_handle(*HANDLE_ARGS)) is nvio.aio_handle
    assert not isinstance(theirs, nvio.aio_handle)
    _round_trip(theirs, tmp_path, "before")


def test_unknown_release_warns_and_is_verified(monkeypatch):
    monkeypatch.setattr(deepspeed, "__version__", "0.99.1")
    with pytest.warns(RuntimeWarning, match="DeepSpeed 0.99.1 is not a release .* tested with "
                                            r"\(0.19.8\)"):
        nds.install()
    assert op_builder.AsyncIOBuilder is nds.AsyncIOBuilder
    assert get_accelerator().get_op_builder("GDSBuilder") is nds.GDSBuilder


def test_a_route_left_unpatched_rolls_everything_back(monkeypatch):
    """A DeepSpeed whose accelerator cannot be patched (simulated): install() raises and leaves
    nothing patched."""
    own = _routes()
    monkeypatch.setattr(inst, "_patch_accelerator_class", lambda cls: False)
    # (AsyncIOBuilder still comes out nvio's: the CPU accelerator imports it from a module patched
    # anyway; GDSBuilder, which it answers with NotImplementedBuilder, does not.)
    with pytest.raises(nds.InstallFailed, match=r"accelerator.get_op_builder\('GDSBuilder'\)"):
        nds.install()
    assert not nds.installed()
    assert inst._finder not in sys.meta_path and not inst._records
    assert _routes() == own


_SUBPROCESS = """
import site, sys
site.addsitedir(sys.argv[1])
sys.path.insert(0, sys.argv[2])
import _ds_real
_ds_real.configure_environment()
import deepspeed
from deepspeed.ops.op_builder import AsyncIOBuilder
from deepspeed.accelerator import get_accelerator
h = AsyncIOBuilder().load(verbose=False).aio_handle()
print(AsyncIOBuilder.__module__, get_accelerator().get_op_builder("GDSBuilder").__module__,
      type(h).__module__)
"""


@pytest.mark.parametrize("value, expected", [
    ("1", "nvio.deepspeed nvio.deepspeed nvio._aio"),
    ("0", "deepspeed.ops.op_builder.cpu.async_io deepspeed.ops.op_builder.cpu.no_impl async_io"),
])
def test_environment_switch_before_import(value, expected, tmp_path):
    """NVIO_DEEPSPEED through the package's .pth file: nvio installs before DeepSpeed is
    imported, and the finder patches it as it loads."""
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "python", "nvio-deepspeed.pth")) as f:
        (site_dir / "nvio-deepspeed.pth").write_text(f.read())
    env = {**os.environ, "NVIO_DEEPSPEED": value,
           "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(nvio.__file__)))}
    r = subprocess.run([sys.executable, "-c", _SUBPROCESS, str(site_dir),
                        os.path.dirname(os.path.abspath(__file__))],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == expected, r.stderr[-3000:]


# ---- the swappers, on DeepSpeed's op and on nvio's ----------------------------------------------

def _on(mode: str) -> None:
    if mode == "nvio":
        nds.install()
    else:
        nds.uninstall()


def _handle(mode: str):
    _on(mode)
    handle = op_builder.AsyncIOBuilder().load(verbose=False).aio_handle(*HANDLE_ARGS)
    assert isinstance(handle, nvio.aio_handle) == (mode == "nvio")
    return handle


def _files(folder: str) -> dict:
    found = {}
    for here, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(here, name)
            found[os.path.relpath(path, folder)] = read_file(path)
    return found


SIZES = (262_144, 300_032, 1_000_448)  # numels, multiples of the swappers' 256-element alignment


def _async_tensor_swapper_run(mode: str, folder: str) -> dict:
    from deepspeed.runtime.swap_tensor.async_swapper import AsyncTensorSwapper
    from deepspeed.runtime.swap_tensor.utils import swap_in_tensors

    handle = _handle(mode)
    example = torch.empty(0, dtype=torch.float32)
    buffers = [handle.new_cpu_locked_tensor(max(SIZES), example) for _ in range(2)]
    swapper = AsyncTensorSwapper(aio_handle=handle, numel_alignment=256, timers=None)
    swapper.add_buffers(buffers)
    tensors = [_random(n, seed=i) for i, n in enumerate(SIZES * 2)]
    paths = [os.path.join(folder, f"t{i}.swp") for i in range(len(tensors))]
    swapper.swap_out_tensors(tensors, paths)
    swapper.release_buffers()  # flushes: every write done
    back = [handle.new_cpu_locked_tensor(t.numel(), example) for t in tensors]
    swap_in_tensors(handle, back, paths)
    assert handle.wait() == len(paths)
    for t, b in zip(tensors, back):
        assert as_bytes(b) == as_bytes(t)
    return _files(folder)


def _param_swapper_run(mode: str, folder: str) -> dict:
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus

    _on(mode)
    config = DeepSpeedConfig({
        "train_batch_size": 1,
        "zero_optimization": {"stage": 3, "offload_param": {
            "device": "nvme", "nvme_path": folder, "buffer_count": 4,
            "buffer_size": max(SIZES)}},
        "aio": AIO})
    swapper = pps.AsyncPartitionedParameterSwapper(config, torch.float32)
    assert isinstance(swapper.aio_read_handle, nvio.aio_handle) == (mode == "nvio")
    params = []
    for i, numel in enumerate(SIZES):
        tensor = torch.empty(0)
        tensor.ds_numel, tensor.status = numel, PartitionedParamStatus.AVAILABLE
        param = types.SimpleNamespace(ds_id=i, ds_tensor=tensor)
        buffer = swapper.get_buffer(param, numel)
        buffer.copy_(_random(numel, seed=100 + i))
        tensor.data = buffer.data
        params.append(param)
    swapper.swap_out_and_release(params)  # writes, waits, gives the buffers back
    assert all(p.ds_tensor.status == PartitionedParamStatus.NOT_AVAILABLE for p in params)
    swapper.swap_in(params[::-1], async_op=False)
    for i, p in enumerate(params):
        assert p.ds_tensor.status == PartitionedParamStatus.AVAILABLE
        assert as_bytes(p.ds_tensor) == as_bytes(_random(SIZES[i], seed=100 + i))
    swapper.remove_partition_and_release_buffers(params)
    # Into a caller's unaligned, unpinned buffer: through a swap buffer, then copied.
    dest = torch.zeros(SIZES[0])
    swapper.swap_into_buffer(params[0], dest)
    assert as_bytes(dest) == as_bytes(_random(SIZES[0], seed=100))
    return _files(folder)


def _optimizer_swapper_run(mode: str, folder: str) -> "tuple[dict, list]":
    """Three Adam steps the way ZeRO-3 takes them with offload_optimizer to nvme: the gradient
    out through the AsyncTensorSwapper, the parameter and its state in, step, all out again."""
    from deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper import (
        PartitionedOptimizerSwapper)
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig

    _on(mode)
    numel = SIZES[1]
    param = torch.nn.Parameter(torch.zeros(numel))
    param.ds_id = "0_1"
    optimizer = torch.optim.Adam([param], lr=1e-2)
    swapper = PartitionedOptimizerSwapper(
        swap_config=DeepSpeedZeroOffloadOptimizerConfig(device="nvme", nvme_path=folder,
                                                        buffer_count=4),
        aio_config=AIO, base_folder=folder, optimizer=optimizer, largest_numel=numel,
        device="cpu", dtype=torch.float32, timers=None)
    assert isinstance(swapper.aio_handle, nvio.aio_handle) == (mode == "nvio")
    swapper.initialize_parameters(parameters=[param], src_tensors=[_random(numel, seed=7)])
    for step in range(3):
        gradient = _random(numel, seed=20 + step) * 1e-3
        swapper.swap_out_gradients(param, gradient_offsets=[0], gradient_tensors=[gradient])
        swapper.swap_in_optimizer_state(param)
        assert as_bytes(param.grad) == as_bytes(gradient)
        optimizer.step()
        swapper.swap_out_optimizer_state(param)
    swapper.swap_in_optimizer_state(param)
    state = optimizer.state[param]
    final = [as_bytes(param.data), as_bytes(state["exp_avg"]), as_bytes(state["exp_avg_sq"])]
    swapper.release_swap_buffers(param)
    return _files(folder), final


def _adam_in_memory() -> list:
    numel = SIZES[1]
    param = torch.nn.Parameter(_random(numel, seed=7).clone())
    optimizer = torch.optim.Adam([param], lr=1e-2)
    for step in range(3):
        param.grad = _random(numel, seed=20 + step) * 1e-3
        optimizer.step()
    state = optimizer.state[param]
    return [as_bytes(param.data), as_bytes(state["exp_avg"]), as_bytes(state["exp_avg_sq"])]


def _both(run, tmp_path):
    results = []
    for mode in ("deepspeed", "nvio"):
        os.makedirs(tmp_path / mode)
        results.append(run(mode, str(tmp_path / mode)))
    return results


def test_async_tensor_swapper(tmp_path):
    own, ours = _both(_async_tensor_swapper_run, tmp_path)
    assert len(own) == 2 * len(SIZES)
    assert own == ours


def test_partitioned_param_swapper(tmp_path):
    own, ours = _both(_param_swapper_run, tmp_path)
    names = sorted(own)
    assert names == [f"zero_stage_3/float32params/rank0/{i}_param.tensor.swp"
                     for i in range(len(SIZES))]
    assert own == ours


def test_partitioned_optimizer_swapper(tmp_path):
    (own_files, own_final), (our_files, our_final) = _both(_optimizer_swapper_run, tmp_path)
    expected = _adam_in_memory()
    assert own_final == expected  # DeepSpeed's swapped Adam is torch's Adam, bit for bit
    assert our_final == expected
    assert sorted(own_files) == sorted(our_files)
    assert any(name.endswith("exp_avg_sq-0_1.tensor.swp") for name in own_files)
    assert own_files == our_files


_FAILING_BEFORE_IMPORT = """
import sys, warnings
sys.path.insert(0, sys.argv[1])
import _ds_real
_ds_real.configure_environment()
import nvio._deepspeed_install as inst
inst._patch_accelerator_class = lambda cls: False  # a route install() cannot patch (simulated)
inst.install()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import deepspeed
from deepspeed.ops.op_builder import AsyncIOBuilder, GDSBuilder
print([str(w.message) for w in caught if "could not route" in str(w.message)])
print(inst.installed(), AsyncIOBuilder.__module__, GDSBuilder.__name__, len(inst._records),
      inst._finder in sys.meta_path)
"""


def test_install_before_import_that_cannot_route_leaves_deepspeed_alone():
    """Through the finder the check runs once deepspeed has imported: a warning, and DeepSpeed
    on its own ops with nothing of nvio's left in it."""
    env = {**os.environ,
           "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(nvio.__file__)))}
    r = subprocess.run([sys.executable, "-c", _FAILING_BEFORE_IMPORT,
                        os.path.dirname(os.path.abspath(__file__))],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    warned, state = r.stdout.strip().splitlines()[-2:]
    assert "accelerator.get_op_builder('GDSBuilder')" in warned
    assert state == ("False deepspeed.ops.op_builder.cpu.async_io NotImplementedBuilder 0 False")
