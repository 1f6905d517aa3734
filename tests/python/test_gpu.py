"""GPU memory from Python: device buffers of every kind on both handles, gds_handle and
GDSBuilder. Tests that need CUDA skip with the reason (torch without CUDA, or nvio.gpu_info());
the rest run everywhere: the builder, host I/O through gds_handle, the fallback warning, argument
checks, and device buffers raising a typed error where there is no CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import nvio
from conftest import ODD_OFFSETS, ODD_SIZES, as_bytes, read_file, write_file
from nvio.deepspeed import GDSBuilder

GPU = nvio.gpu_info()
HAVE_CUDA = torch.cuda.is_available() and bool(GPU["devices"])
NO_CUDA_REASON = (
    "no CUDA device: "
    + ("torch.cuda.is_available() is False; " if not torch.cuda.is_available() else "")
    + GPU["driver_reason"]
)
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason=NO_CUDA_REASON)
needs_no_cuda = pytest.mark.skipif(bool(GPU["devices"]), reason="a GPU is present")

GDS_TUTORIAL_METHODS = (
    "async_pread", "async_pwrite", "free_cpu_locked_tensor", "get_block_size",
    "get_intra_op_parallelism", "get_overlap_events", "get_queue_depth", "get_single_submit",
    "new_cpu_locked_tensor", "pread", "pwrite", "read", "sync_pread", "sync_pwrite", "wait",
    "write", "new_pinned_device_tensor", "free_pinned_device_tensor", "pin_device_tensor",
    "unpin_device_tensor",
)


class CudaArray:
    """A stand-in for a CuPy/Numba array: only __cuda_array_interface__."""

    def __init__(self, ptr, nbytes, read_only=False, strides=None):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, read_only), "version": 3,
            "strides": strides,
        }


class DLPackDevice:
    """Exposes a tensor through __dlpack__ only."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, stream=None):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def pattern(n: int, salt: int = 0) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.int64) * 7 + salt).remainder_(251).to(torch.uint8)


# ---- everywhere ---------------------------------------------------------------------------------


def test_gpu_info_explains_itself():
    info = nvio.gpu_info()
    assert info["gds_mode"] in ("unavailable", "compatibility", "p2p")
    assert info["gds_reason"] and info["driver_reason"] and info["cufile_reason"]
    if not info["driver_loaded"]:
        assert info["devices"] == [] and info["gds_mode"] == "unavailable"


def test_gds_builder_loads_and_handle_has_the_tutorial_methods():
    builder = GDSBuilder()
    assert builder.NAME == "gds" and builder.is_compatible() is True
    h = builder.load().gds_handle()
    assert isinstance(h, nvio.gds_handle) and isinstance(h, nvio.aio_handle)
    missing = set(GDS_TUTORIAL_METHODS) - {n for n in dir(h) if not n.startswith("_")}
    assert not missing, missing
    assert h.get_block_size() == 1048576 and h.get_queue_depth() == 128
    assert h.get_overlap_events() is False and h.get_intra_op_parallelism() == 1
    h2 = builder.load().gds_handle(4096, 8, True, True, 2)
    assert (h2.get_block_size(), h2.get_queue_depth(), h2.get_intra_op_parallelism()) == (4096, 8, 2)


@pytest.mark.parametrize("size", ODD_SIZES)
@pytest.mark.parametrize("offset", ODD_OFFSETS)
def test_gds_handle_host_tensors_take_the_host_path(tmp_path, size, offset):
    h = GDSBuilder().load().gds_handle(block_size=64 * 1024, intra_op_parallelism=2)
    src = pattern(size, offset)
    path = str(tmp_path / "g.bin")
    assert h.sync_pwrite(src, path, offset) == 1
    assert read_file(path, offset) == as_bytes(src)
    dst = torch.zeros(size, dtype=torch.uint8)
    assert h.async_pread(dst, path, offset) == 0
    assert h.wait() == 1
    assert torch.equal(dst, src)


def test_gds_handle_refuses_to_pin_host_tensors():
    h = nvio.gds_handle()
    with pytest.raises(nvio.InvalidArgument, match="CUDA tensors only"):
        h.pin_device_tensor(torch.zeros(8))
    with pytest.raises(nvio.InvalidArgument, match="CUDA example tensor"):
        h.new_pinned_device_tensor(8, torch.zeros(1))
    with pytest.raises(TypeError, match="unexpected"):
        h.new_pinned_device_tensor(8, torch.zeros(1), bogus=1)


def test_gpu_direct_option_is_strict_and_reported():
    assert nvio.Handle(gpu_direct="off").options["gpu_direct"] == "off"
    with pytest.raises(ValueError, match="gpu_direct"):
        nvio.Handle(gpu_direct="sometimes")


def test_cuda_array_interface_checks(tmp_path):
    path = write_file(tmp_path / "f", b"x" * 64)
    with pytest.raises(ValueError, match="read-only"):
        nvio.Handle().read(CudaArray(0x1000, 64, read_only=True), path)
    with pytest.raises(ValueError, match="contiguous"):
        nvio.Handle().read(CudaArray(0x1000, 64, strides=(2,)), path)


@needs_no_cuda
@pytest.mark.parametrize("api", ["Handle", "aio_handle", "gds_handle"])
def test_device_buffers_without_cuda_raise_a_typed_error(tmp_path, api):
    path = write_file(tmp_path / "f", b"x" * 64)
    fake = CudaArray(0x10000, 64)
    h = getattr(nvio, api)()  # gds_handle's fallback warning: test_fallback_is_said_once...
    with pytest.raises(nvio.GpuError, match="CUDA driver cannot be used") as info:
        if api == "Handle":
            h.read(fake, path)
        else:
            h.sync_pread(fake, path)
    assert isinstance(info.value, RuntimeError)
    assert info.value.api == "CUDA driver"
    assert read_file(path) == b"x" * 64


def test_fallback_is_said_once_when_cufile_is_missing(tmp_path):
    """NVIO_CUFILE_LIBRARY at a missing file: gds_handle works (host I/O) and warns once."""
    script = textwrap.dedent(f"""
        import warnings, torch, nvio
        from nvio.deepspeed import GDSBuilder
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            a = GDSBuilder().load().gds_handle()
            b = GDSBuilder().load().gds_handle()
            t = torch.arange(1000, dtype=torch.int32)
            a.sync_pwrite(t, {str(tmp_path / 'h.bin')!r})
            back = torch.zeros_like(t)
            b.sync_pread(back, {str(tmp_path / 'h.bin')!r})
            assert torch.equal(t, back)
        info = nvio.gpu_info()
        assert info["cufile_loaded"] is False and "libcufile-missing" in info["cufile_reason"]
        msgs = [str(x.message) for x in w if "gpu_direct=on" in str(x.message)]
        assert len(msgs) == 1, msgs
        assert "bounce path" in msgs[0] and "libcufile-missing" in msgs[0]
        print("ok")
    """)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(nvio.__file__)))
    env = dict(os.environ, NVIO_CUFILE_LIBRARY=str(tmp_path / "libcufile-missing.so.0"),
               PYTHONPATH=package_root)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ---- with CUDA ----------------------------------------------------------------------------------


def _device_kinds():
    return ["tensor", "cuda_array_interface", "dlpack"]


def _wrap(kind, t):
    if kind == "tensor":
        return t
    if kind == "cuda_array_interface":
        return CudaArray(t.data_ptr(), t.numel() * t.element_size())
    return DLPackDevice(t)


@needs_cuda
@pytest.mark.parametrize("api", ["Handle", "aio_handle", "gds_handle"])
@pytest.mark.parametrize("kind", _device_kinds())
@pytest.mark.parametrize("size", ODD_SIZES)
@pytest.mark.parametrize("offset", ODD_OFFSETS)
def test_device_round_trips(tmp_path, api, kind, size, offset):
    h = getattr(nvio, api)(block_size=256 * 1024) if api != "Handle" else nvio.Handle(
        block_size=256 * 1024, intra_op_parallelism=2)
    src_host = pattern(size, offset)
    src = src_host.cuda()
    path = str(tmp_path / "d.bin")
    if api == "Handle":
        h.write(_wrap(kind, src), path, offset)
    else:
        assert h.sync_pwrite(_wrap(kind, src), path, offset) == 1
    assert read_file(path, offset) == as_bytes(src_host)
    dst = torch.zeros(size, dtype=torch.uint8, device="cuda")
    if api == "Handle":
        h.read(_wrap(kind, dst), path, offset)
    else:
        assert h.sync_pread(_wrap(kind, dst), path, offset) == 1
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), src_host)


@needs_cuda
def test_one_batch_mixes_host_and_device_buffers(tmp_path):
    """Each batch item moves as its own buffer's memory kind: host and CUDA items in one
    write_batch and one read_batch, bytes compared, the device items counted as device bytes."""
    n = 300 * 1024 + 7
    path = str(tmp_path / "mixed.bin")
    sources = [pattern(n, i * n) for i in range(4)]
    items = [(s.cuda() if i % 2 == 0 else s.clone(), i * n) for i, s in enumerate(sources)]
    with nvio.Handle(block_size=256 * 1024, intra_op_parallelism=2) as h:
        before = h.stats()
        h.write_batch(items, path, sync=True)
        back = [torch.zeros(n, dtype=torch.uint8, device="cuda" if i % 2 == 0 else "cpu")
                for i in range(4)]
        h.read_batch([(b, i * n) for i, b in enumerate(back)], path)
        torch.cuda.synchronize()
        after = h.stats()
    for i in range(4):
        assert torch.equal(back[i].cpu(), sources[i]), i
    device = (after["device_bounce_bytes"] + after["gds_bytes"]
              - before["device_bounce_bytes"] - before["gds_bytes"])
    assert device == 2 * 2 * n  # two device items, written and read


@needs_cuda
def test_device_transfers_register_their_bounce_memory(tmp_path):
    """A fresh process's first device transfers: each worker page-locks its bounce chunks with
    cuMemHostRegister, which needs a CUDA context current on the worker's thread. On the first
    real GPU (an H200) every registration failed with CUDA_ERROR_INVALID_CONTEXT; the copies still
    worked, from pageable memory, with only a warning. Any nvio warning fails this test."""
    path = str(tmp_path / "r.bin")
    script = textwrap.dedent(f"""
        import warnings, torch, nvio
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            src = torch.arange(3 << 20, dtype=torch.int32, device="cuda")
            dst = torch.zeros_like(src)
            with nvio.Handle(intra_op_parallelism=4, gpu_direct="off") as h:
                h.write(src, {path!r})
                h.read(dst, {path!r})
            torch.cuda.synchronize()
            assert torch.equal(src, dst)
        msgs = [str(x.message) for x in w if "nvio" in str(x.message)]
        assert not msgs, msgs
        print("ok")
    """)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(nvio.__file__)))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=package_root), timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@needs_cuda
def test_gds_handle_pinned_tensors_and_views(tmp_path):
    h = GDSBuilder().load().gds_handle()
    example = torch.empty(1, dtype=torch.float16, device="cuda")
    t = h.new_pinned_device_tensor(1 << 20, example)
    assert t.is_cuda and t.dtype == torch.float16 and t.numel() == 1 << 20
    t.copy_(torch.arange(1 << 20, dtype=torch.float16, device="cuda"))
    path = str(tmp_path / "p.bin")
    h.async_pwrite(t, path)
    assert h.wait() == 1
    view = t[1000:1000 + 4097]  # a view into the registered tensor, at an odd element offset
    back = torch.zeros_like(view)
    h.sync_pread(back, path, 1000 * 2)
    assert torch.equal(back, view)
    view.zero_()
    h.sync_pread(view, path, 1000 * 2)
    assert torch.equal(back, view)
    assert h.free_pinned_device_tensor(t) is True
    assert h.free_pinned_device_tensor(t) is False
    u = torch.empty(4096, dtype=torch.uint8, device="cuda")
    h.pin_device_tensor(u)
    assert h.unpin_device_tensor(u) is True


@needs_cuda
def test_device_errors_are_typed(tmp_path):
    h = nvio.gds_handle()
    t = torch.empty(1 << 16, dtype=torch.uint8, device="cuda")
    with pytest.raises(nvio.ShortFile):
        h.sync_pread(t, write_file(tmp_path / "s", b"x" * 10))
    with pytest.raises(FileNotFoundError):
        h.sync_pread(t, str(tmp_path / "missing"))
    with pytest.raises(nvio.InvalidArgument):
        nvio.Handle()._core.read(t.data_ptr() + (1 << 40), 16, str(tmp_path / "s"), 0, True)
