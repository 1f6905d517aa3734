"""The option table reaches Python through the binding: every option is a keyword argument of
nvio.Handle, arrives by every route (keyword, NVIO_* variable, configuration file, the options
dict handed back), and a bad value by any route raises InvalidArgument whose ``option`` names it."""

import inspect
import json

import pytest

import nvio
from nvio import _nvio

SPECS = _nvio.option_specs()
NAMES = [s["name"] for s in SPECS]
ENV = {s["name"]: s["environment"] for s in SPECS}

# Per option: a non-default value (typed, and as an NVIO_* variable spells it) and a bad one.
SAMPLES = {
    "engine": ("psync", "psync", "fast"),
    "block_size": (4096, "4K", 100),
    "queue_depth": (7, "7", 0),
    "single_submit": (True, "yes", "2"),
    "overlap_events": (False, "off", "maybe"),
    "intra_op_parallelism": (3, "3", 257),
    "direct": ("off", "off", "sometimes"),
    "gpu_direct": ("off", "off", "p2p"),
    "cached_reads": ("off", "off", "on"),
}


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NVIO_CONFIG", "none")


def test_samples_cover_the_table_and_differ_from_defaults():
    assert set(SAMPLES) == set(NAMES)
    for spec in SPECS:
        assert SAMPLES[spec["name"]][0] != spec["default"], spec["name"]
    assert nvio.Handle().options == {s["name"]: s["default"] for s in SPECS}


def test_handle_keywords_are_the_table():
    params = inspect.signature(nvio.Handle).parameters
    assert list(params) == NAMES
    assert all(p.default is None and p.kind is p.KEYWORD_ONLY for p in params.values())
    with pytest.raises(TypeError, match="queue_dept"):
        nvio.Handle(queue_dept=8)


@pytest.mark.parametrize("name", NAMES)
def test_every_option_arrives_by_every_route(name, monkeypatch, tmp_path):
    value, text, _ = SAMPLES[name]
    # Keyword argument, and the options dict handed back (every option) round trip.
    h = nvio.Handle(**{name: value})
    assert h.options[name] == value
    assert nvio.Handle(**h.options).options == h.options
    # NVIO_* variable.
    monkeypatch.setenv(ENV[name], text)
    assert nvio.Handle().options[name] == value
    assert nvio.report(str(tmp_path))["options"][name] == {"value": value, "source": "environment"}
    monkeypatch.delenv(ENV[name])
    # Configuration file.
    path = tmp_path / "config.json"
    path.write_text(json.dumps(
        {"version": 1, "default": "k", "profiles": {"k": {"options": {name: value}}}}))
    monkeypatch.setenv("NVIO_CONFIG", str(path))
    assert nvio.Handle().options[name] == value
    assert nvio.report(str(tmp_path))["options"][name] == {"value": value, "source": "config"}


@pytest.mark.parametrize("name", NAMES)
def test_bad_value_by_every_route_names_the_option(name, monkeypatch, tmp_path):
    _, _, bad = SAMPLES[name]
    kinds = {"boolean": bool, "integer": int, "choice": str}
    kind = kinds[next(s["type"] for s in SPECS if s["name"] == name)]
    if isinstance(bad, kind):  # a value of the right type but out of range or not a choice
        with pytest.raises(nvio.InvalidArgument) as info:
            nvio.Handle(**{name: bad})
        assert info.value.option == name
    else:  # the wrong type is refused before the core, as a TypeError naming the option
        with pytest.raises(TypeError, match=name):
            nvio.Handle(**{name: bad})
    monkeypatch.setenv(ENV[name], str(bad))
    with pytest.raises(nvio.InvalidArgument) as info:
        nvio.Handle()
    assert info.value.option == name and ENV[name] in str(info.value)
    monkeypatch.delenv(ENV[name])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(
        {"version": 1, "default": "k", "profiles": {"k": {"options": {name: bad}}}}))
    monkeypatch.setenv("NVIO_CONFIG", str(path))
    with pytest.raises(nvio.InvalidArgument) as info:
        nvio.Handle()
    assert info.value.option == name and str(path) in str(info.value)


def test_option_is_none_when_the_error_is_not_about_an_option(tmp_path):
    with pytest.raises(nvio.InvalidArgument) as info:
        nvio.Handle().read(bytearray(4), str(tmp_path / "f"), offset=-1)
    assert info.value.option is None
