"""nvio.deepspeed: the shim used exactly as DeepSpeed's DeepNVMe tutorial shows (with CPU
tensors and smaller sizes: this suite has no GPU and must stay fast), and handles from a
DeepSpeed config."""

from __future__ import annotations

import inspect
import os
import warnings

import pytest
import torch

import nvio
from conftest import as_bytes, read_file
from nvio.deepspeed import AsyncIOBuilder, aio_handle_from_config

SIZE = 8 * 1024**2  # the tutorial's 1 GB, scaled down

TUTORIAL_METHODS = (
    "async_pread", "async_pwrite", "free_cpu_locked_tensor", "get_block_size",
    "get_intra_op_parallelism", "get_overlap_events", "get_queue_depth", "get_single_submit",
    "new_cpu_locked_tensor", "pread", "pwrite", "read", "sync_pread", "sync_pwrite", "wait",
    "write",
)


def test_builder_is_compatible_and_loads():
    builder = AsyncIOBuilder()
    assert builder.is_compatible() is True
    assert builder.NAME == "async_io"
    op = builder.load()
    for name in ("aio_handle", "aio_read", "aio_write"):
        assert callable(getattr(op, name)), name
    h = op.aio_handle()
    assert isinstance(h, nvio.aio_handle)


def test_tab_completion_lists_tutorial_methods():
    h = AsyncIOBuilder().load().aio_handle()
    public = {n for n in dir(h) if not n.startswith("_")}
    missing = set(TUTORIAL_METHODS) - public
    assert not missing, missing


def test_help_shows_deepspeed_constructor():
    sig = inspect.signature(AsyncIOBuilder().load().aio_handle)
    assert {k: v.default for k, v in sig.parameters.items()} == {
        "block_size": 1048576, "queue_depth": 128, "single_submit": False,
        "overlap_events": False, "intra_op_parallelism": 1,
    }


def _pattern(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64).remainder_(251).to(torch.uint8)


def test_tutorial_blocking_write(tmp_path):
    path = str(tmp_path / "test_1GB.pt")
    assert not os.path.isfile(path)
    t = torch.empty(SIZE, dtype=torch.uint8)
    t.copy_(_pattern(SIZE))
    h = AsyncIOBuilder().load().aio_handle()
    assert h.sync_pwrite(t, path) == 1
    assert os.path.isfile(path)
    assert os.path.getsize(path) == SIZE
    assert read_file(path) == as_bytes(t)


def test_tutorial_non_blocking_write(tmp_path):
    path = str(tmp_path / "test_1GB.pt")
    t = _pattern(SIZE)
    h = AsyncIOBuilder().load().aio_handle()
    assert h.async_pwrite(t, path) == 0
    assert h.wait() == 1
    assert os.path.isfile(path)
    assert os.path.getsize(path) == SIZE
    assert read_file(path) == as_bytes(t)


def test_tutorial_parallel_write(tmp_path):
    path = str(tmp_path / "test_1GB.pt")
    t = _pattern(SIZE)
    h = AsyncIOBuilder().load().aio_handle(intra_op_parallelism=4)
    assert h.get_intra_op_parallelism() == 4
    assert h.async_pwrite(t, path) == 0
    assert h.wait() == 1
    assert os.path.getsize(path) == SIZE
    assert read_file(path) == as_bytes(t)


def test_tutorial_pinned_tensor_write(tmp_path):
    """The tutorial pins with torch's pin_memory(), which needs CUDA; here the handle's own
    locked tensor stands in for it."""
    path = str(tmp_path / "test_1GB.pt")
    h = AsyncIOBuilder().load().aio_handle()
    t = h.new_cpu_locked_tensor(SIZE, torch.empty(0, dtype=torch.uint8))
    t.copy_(_pattern(SIZE))
    assert h.async_pwrite(t, path) == 0
    assert h.wait() == 1
    assert os.path.getsize(path) == SIZE
    assert read_file(path) == as_bytes(t)
    back = h.new_cpu_locked_tensor(SIZE, t)
    back.zero_()
    assert h.sync_pread(back, path) == 1
    assert torch.equal(back, t)
    assert h.free_cpu_locked_tensor(t) and h.free_cpu_locked_tensor(back)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch pin_memory() needs CUDA")
def test_tutorial_torch_pin_memory(tmp_path):  # pragma: no cover - no GPU in CI
    t = _pattern(SIZE).pin_memory()
    h = AsyncIOBuilder().load().aio_handle()
    assert h.async_pwrite(t, str(tmp_path / "p.pt")) == 0
    assert h.wait() == 1
    assert read_file(tmp_path / "p.pt") == as_bytes(t)


def test_tutorial_advanced_creation_and_getters():
    h = AsyncIOBuilder().load().aio_handle(block_size=1048576, queue_depth=32,
                                           single_submit=False, overlap_events=True,
                                           intra_op_parallelism=8)
    assert h.get_block_size() == 1048576
    assert h.get_queue_depth() == 32
    assert h.get_single_submit() is False
    assert h.get_overlap_events() is True
    assert h.get_intra_op_parallelism() == 8


def test_tutorial_data_race_warning_example_is_safe_after_wait(tmp_path):
    path = str(tmp_path / "race.pt")
    t = _pattern(1 << 20)
    expected = as_bytes(t)
    h = AsyncIOBuilder().load().aio_handle()
    h.async_pwrite(t, path)
    assert h.wait() == 1
    t += 1  # after wait(): safe
    assert read_file(path) == expected


# --------------------------------------------------------------------------------------------
# aio_handle_from_config
# --------------------------------------------------------------------------------------------

TUNED = {  # ds_nvme_tune's output, as printed in the tutorial
    "aio": {
        "single_submit": "false",
        "overlap_events": "true",
        "intra_op_parallelism": 8,
        "queue_depth": 32,
        "block_size": 1048576,
    }
}


def _settings(h):
    return (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(),
            h.get_overlap_events(), h.get_intra_op_parallelism())


def test_config_whole_and_section():
    whole = dict(TUNED)
    whole_h = aio_handle_from_config(whole)
    section_h = aio_handle_from_config(TUNED["aio"])
    assert _settings(whole_h) == _settings(section_h) == (1048576, 32, False, True, 8)
    assert isinstance(whole_h, nvio.aio_handle)


def test_config_whole_deepspeed_config_with_other_sections():
    ds_config = {
        "train_batch_size": 8,
        "fp16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                                                             "nvme_path": "/local_nvme"}},
        "aio": {"block_size": 262144, "queue_depth": 16, "single_submit": False,
                "overlap_events": True, "thread_count": 2},
    }
    with pytest.warns(DeprecationWarning):
        h = aio_handle_from_config(ds_config)
    assert _settings(h) == (262144, 16, False, True, 2)


# DeepSpeed's defaults for keys the aio section leaves out (runtime/swap_tensor/constants.py):
# block_size 1 MiB, queue_depth 8, single_submit false, overlap_events true, parallelism 1.
DS_DEFAULTS = (1048576, 8, False, True, 1)


def test_config_defaults_are_deepspeeds():
    assert _settings(aio_handle_from_config({})) == DS_DEFAULTS
    assert _settings(aio_handle_from_config({"aio": {}})) == DS_DEFAULTS
    assert _settings(aio_handle_from_config({"aio": None})) == DS_DEFAULTS  # DeepSpeed: defaults
    assert _settings(aio_handle_from_config({"train_batch_size": 1})) == DS_DEFAULTS
    h = aio_handle_from_config({"aio": {"queue_depth": 4}})
    assert _settings(h) == (1048576, 4, False, True, 1)
    h = aio_handle_from_config({"aio": {"overlap_events": False}})
    assert _settings(h) == (1048576, 8, False, False, 1)
    assert type(aio_handle_from_config({})) is nvio.aio_handle


def test_config_use_gds_false_is_an_aio_handle():
    for section in ({"use_gds": False}, {"use_gds": "false"}, {}):
        h = aio_handle_from_config({"aio": section})
        assert type(h) is nvio.aio_handle, section


def test_config_use_gds_bad_value_rejected():
    with pytest.raises(nvio.InvalidArgument, match="use_gds"):
        aio_handle_from_config({"aio": {"use_gds": "yes please"}})


def _gds_round_trip(h, tmp_path):
    t = _pattern(2 * 1024**2 + 77)
    path = str(tmp_path / "gds.bin")
    assert h.async_pwrite(t, path) == 0
    assert h.wait() == 1
    assert read_file(path) == as_bytes(t)
    out = torch.zeros_like(t)
    assert h.sync_pread(out, path) == 1
    assert as_bytes(out) == as_bytes(t)


def test_config_use_gds_without_cufile_warns_and_uses_the_bounce_path(tmp_path, monkeypatch):
    """Where cuFile is unusable (this machine, or forced so), use_gds still gives a gds_handle
    (DeepSpeed's GDS code calls its pin_device_tensor), and says once that it bounces."""
    import nvio.deepspeed as ds

    monkeypatch.setattr(ds, "_gds_usable", lambda: (False, "no cuFile in this test"))
    with pytest.warns(RuntimeWarning, match="use_gds.*no cuFile in this test.*bounce"):
        h = aio_handle_from_config({"aio": {"use_gds": True, "queue_depth": 16}})
    assert isinstance(h, nvio.gds_handle)
    assert _settings(h) == (1048576, 16, False, True, 1)
    _gds_round_trip(h, tmp_path)


def test_config_use_gds_real_availability_check():
    usable, why = __import__("nvio.deepspeed").deepspeed._gds_usable()
    assert usable == (nvio.gpu_info()["gds_mode"] != "unavailable")
    assert usable or why  # unusable always comes with its reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = aio_handle_from_config({"aio": {"use_gds": "true"}})
    assert isinstance(h, nvio.gds_handle)
    said = [w for w in caught if "use_gds" in str(w.message)]
    assert bool(said) == (not usable)


def test_config_use_gds_with_cufile_is_a_gds_handle_without_warning(tmp_path, monkeypatch):
    import nvio.deepspeed as ds

    monkeypatch.setattr(ds, "_gds_usable", lambda: (True, ""))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h = aio_handle_from_config({"train_batch_size": 4, "aio": {"use_gds": True}})
    assert isinstance(h, nvio.gds_handle)
    assert _settings(h) == DS_DEFAULTS
    _gds_round_trip(h, tmp_path)  # host tensors take the host path of a gds_handle


@pytest.mark.parametrize("text,value", [("true", True), ("false", False), ("True", True),
                                        ("FALSE", False), (True, True), (False, False)])
def test_config_string_booleans(text, value):
    h = aio_handle_from_config({"aio": {"single_submit": text, "overlap_events": text}})
    assert h.get_single_submit() is value
    assert h.get_overlap_events() is value


def test_config_bad_boolean_rejected():
    with pytest.raises(ValueError, match="single_submit"):
        aio_handle_from_config({"aio": {"single_submit": "maybe"}})


@pytest.mark.parametrize("alias", ["thread_count", "num_threads"])
def test_config_parallelism_aliases_warn(alias):
    with pytest.warns(DeprecationWarning, match=alias):
        h = aio_handle_from_config({"aio": {alias: 3, "block_size": 4096}})
    assert h.get_intra_op_parallelism() == 3
    assert h.get_block_size() == 4096


@pytest.mark.parametrize("alias", ["thread_count", "num_threads"])
@pytest.mark.parametrize("value", [-1, 0, None, [], "2", 2.0, 10**6])
def test_config_alias_is_checked_beside_intra_op_parallelism(alias, value):
    """issue 28 #9: an alias overridden by intra_op_parallelism was dropped unchecked, so a
    config holding thread_count -1, None or [] loaded with only a DeprecationWarning."""
    with pytest.warns(DeprecationWarning, match=alias):
        with pytest.raises(ValueError, match=alias):
            aio_handle_from_config({"aio": {alias: value, "intra_op_parallelism": 2}})


def test_config_alias_and_intra_op_parallelism_both_valid():
    with pytest.warns(DeprecationWarning, match="thread_count"):
        h = aio_handle_from_config({"aio": {"thread_count": 4, "intra_op_parallelism": 2}})
    assert h.get_intra_op_parallelism() == 2


def test_config_without_alias_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        aio_handle_from_config(TUNED)


def test_config_unknown_keys_rejected():
    with pytest.raises(ValueError, match="queue_dept"):
        aio_handle_from_config({"aio": {"queue_dept": 8}})
    with pytest.raises(nvio.Error):
        aio_handle_from_config({"aio": {"blocksize": 8}})


def test_config_bad_values_rejected():
    with pytest.raises(ValueError, match="queue_depth"):
        aio_handle_from_config({"aio": {"queue_depth": 0}})
    with pytest.raises(ValueError, match="block_size"):
        aio_handle_from_config({"aio": {"block_size": "big"}})


def test_config_handle_does_io(tmp_path):
    h = aio_handle_from_config(TUNED)
    t = _pattern(3 * 1024**2 + 5)
    assert h.async_pwrite(t, str(tmp_path / "c.pt")) == 0
    assert h.wait() == 1
    out = torch.zeros_like(t)
    assert h.sync_pread(out, str(tmp_path / "c.pt")) == 1
    assert torch.equal(out, t)
