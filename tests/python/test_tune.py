"""nvio.tune from Python, the saved configuration, and Handle.from_config."""

from __future__ import annotations

import json
import os

import pytest

import nvio

# The tuner measures host memory: gpu_direct is not part of what it picks or saves.
OPTION_NAMES = {"engine", "block_size", "queue_depth", "single_submit", "overlap_events",
                "intra_op_parallelism", "direct"}


def tuned(options):
    return {k: options[k] for k in OPTION_NAMES}


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "cfg" / "config.json"
    monkeypatch.setenv("NVIO_CONFIG", str(path))
    return path


def test_tune_saves_and_handles_use_it(tmp_path, config):
    work = tmp_path / "work"
    work.mkdir()
    result = nvio.tune(work, budget=2, size="32M", save=True)
    assert result.saved_to == str(config)
    assert result.elapsed_s <= 2 * 1.5
    assert set(result.options) == OPTION_NAMES
    assert result.best("mixed")["options"] == result.options
    assert result.best("read")["median_gbps"] > 0 and result.best("write")["median_gbps"] > 0
    assert set(result.deepspeed_config["aio"]) == {
        "block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events"}
    assert result.points and all(p["mode"] in ("read", "write") for p in result.points)
    assert "GB/s" in repr(result)
    doc = result.to_dict()
    assert doc["best"]["mixed"]["options"] == result.options
    doc["points"].clear()  # a copy: the result is not changed through it
    assert result.points

    saved = json.loads(config.read_text())
    assert saved["profiles"][saved["default"]]["options"] == result.options
    # A plain Handle uses the saved settings; report says where they came from.
    h = nvio.Handle()
    assert tuned(h.options) == result.options
    rep = nvio.report(str(work))
    assert rep["config"]["found"] and rep["config"]["profile"] == saved["default"]
    assert {rep["options"][k]["source"] for k in OPTION_NAMES} == {"config"}
    assert rep["options"]["gpu_direct"]["source"] == "default"
    # Explicit options and NVIO_* variables still win.
    assert nvio.Handle(queue_depth=5).options["queue_depth"] == 5
    os.environ["NVIO_BLOCK_SIZE"] = "64K"
    try:
        assert nvio.Handle().options["block_size"] == 64 << 10
    finally:
        del os.environ["NVIO_BLOCK_SIZE"]
    h2 = nvio.Handle.from_config(work, intra_op_parallelism=3)
    assert tuned(h2.options) == {**result.options, "intra_op_parallelism": 3}
    # The saved handle moves data correctly.
    data = bytes(range(256)) * 4099
    buf = bytearray(len(data))
    h.write(data, work / "f.bin")
    h.read(buf, work / "f.bin")
    assert bytes(buf) == data
    # DeepSpeed's handle takes its five settings explicitly but the engine from the file.
    ds = nvio.aio_handle()
    assert ds.get_queue_depth() == 128
    from nvio.deepspeed import aio_handle_from_config

    ds = aio_handle_from_config(result.deepspeed_config)
    assert ds.get_queue_depth() == result.options["queue_depth"]
    assert ds.get_block_size() == result.options["block_size"]
    assert ds.get_intra_op_parallelism() == result.options["intra_op_parallelism"]


def test_tune_read_only_without_save(tmp_path, config):
    result = nvio.tune(tmp_path, budget=1.5, size="32M", mode="read", engines=["psync"])
    assert result.saved_to is None
    assert result.best("write") is None and result.best("mixed") is None
    assert result.options["engine"] == "psync"
    assert not config.exists()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kwargs, exc, needle",
    [
        (dict(mode="sideways"), nvio.InvalidArgument, "mode"),
        (dict(budget=0), nvio.InvalidArgument, "budget"),
        (dict(budget="60"), TypeError, "budget"),
        (dict(size="1M"), nvio.InvalidArgument, "16 MiB"),
        (dict(size="lots"), nvio.InvalidArgument, "size"),
        (dict(size=-1), nvio.InvalidArgument, "size"),
        (dict(engines=["warp"]), nvio.InvalidArgument, "engines"),
        (dict(engines=["auto"]), nvio.InvalidArgument, "concrete"),
        (dict(engines=["psync", "psync"]), nvio.InvalidArgument, "twice"),
    ],
)
def test_tune_argument_errors(tmp_path, kwargs, exc, needle):
    with pytest.raises(exc, match=needle):
        nvio.tune(tmp_path, **{"budget": 1, "size": "32M", **kwargs})
    assert os.listdir(tmp_path) == []


def test_tune_missing_directory(tmp_path):
    with pytest.raises(nvio.FileNotFound, match="nope"):
        nvio.tune(tmp_path / "nope", budget=1, size="32M")


def test_save_needs_a_configuration_file(tmp_path):
    assert os.environ["NVIO_CONFIG"] == "none"
    with pytest.raises(nvio.InvalidArgument, match="save"):
        nvio.tune(tmp_path, budget=1, size="32M", save=True)


def test_malformed_configuration_file(tmp_path, config):
    config.parent.mkdir()
    config.write_text('{"version": 1, "default": "k", "profiles": {"k": {"options": {"engine": 3}}}}')
    with pytest.raises(nvio.InvalidArgument, match="engine") as info:
        nvio.Handle()
    assert str(config) in str(info.value)
    with pytest.raises(nvio.InvalidArgument):
        nvio.report()
    # Explicit options do not hide a broken file: it is named either way.
    with pytest.raises(nvio.InvalidArgument, match=str(config)):
        nvio.Handle(engine="psync")


def test_from_config_rejects_unknown_options():
    with pytest.raises(TypeError, match="queue_dpeth"):
        nvio.Handle.from_config(queue_dpeth=4)
