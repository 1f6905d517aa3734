"""nvio.tune_plot: renders a synthetic `nvio tune --json` result, and refuses bad input clearly."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed")

import nvio
from nvio import tune_plot

PYTHON = sys.executable  # the interpreter that found matplotlib above
ENGINES = ("io_uring", "libaio", "psync")
QDS = tuple(1 << i for i in range(9))  # 1 .. 256
BLOCKS = (128 << 10, 1 << 20, 4 << 20, 16 << 20)
PEAK = {"read": ("io_uring", "on", 4 << 20, 64), "write": ("libaio", "on", 1 << 20, 32)}


def gbps(mode, engine, direct, bs, qd):
    """A smooth surface with its single maximum at PEAK[mode]."""
    p_engine, p_direct, p_bs, p_qd = PEAK[mode]
    g = 3.0 if mode == "read" else 2.0
    g -= 0.1 * abs(math.log2(bs / p_bs)) + 0.1 * abs(math.log2(qd / p_qd))
    g -= 0.5 * (engine != p_engine) + 0.7 * (direct != p_direct)
    return round(g, 4)


def synthetic_result() -> dict:
    points = []
    for mode in ("read", "write"):
        for engine in ENGINES:
            for direct in ("on", "off"):
                for bs in BLOCKS:
                    for qd in QDS:
                        g = gbps(mode, engine, direct, bs, qd)
                        points.append({
                            "mode": mode,
                            "options": {"engine": engine, "block_size": bs, "queue_depth": qd,
                                        "intra_op_parallelism": 1, "single_submit": False,
                                        "overlap_events": True, "direct": direct},
                            "samples_gbps": [g, g, g], "median_gbps": g, "spread": 0.0,
                            "cpu_s_per_gb": 0.1})
    best = {}
    for mode, (engine, direct, bs, qd) in PEAK.items():
        best[mode] = {"options": {"engine": engine, "block_size": bs, "queue_depth": qd,
                                  "intra_op_parallelism": 1, "single_submit": False,
                                  "overlap_events": True, "direct": direct},
                      "median_gbps": gbps(mode, engine, direct, bs, qd), "spread": 0.0,
                      "cpu_s_per_gb": 0.1}
    best["mixed"] = None
    return {"nvio_version": "0.1.0", "directory": "/tmp/nvio-tune", "device": "254:1",
            "filesystem": "ext4", "file_size": 1 << 30, "trial_bytes": 1 << 27,
            "strategy": "grid", "budget_s": 60.0, "elapsed_s": 812.0, "modes": ["read", "write"],
            "warnings": [], "points": points, "best": best,
            "deepspeed": {"aio": {"block_size": 4 << 20, "queue_depth": 64,
                                  "intra_op_parallelism": 1, "single_submit": False,
                                  "overlap_events": True}}}


def run_python(*args):
    """This interpreter with ARGS, importing the same nvio package as the tests did."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(nvio.__file__)))
    return subprocess.run([PYTHON, *map(str, args)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60)


def run_module(*args):
    return run_python("-m", "nvio.tune_plot", *args)


def test_synthetic_peak_is_the_best_point():
    # Guards the fixture itself: the starred point must be the maximum of its mode.
    r = synthetic_result()
    for mode in ("read", "write"):
        top = max(p["median_gbps"] for p in r["points"] if p["mode"] == mode)
        assert r["best"][mode]["median_gbps"] == top


def test_png_and_svg(tmp_path):
    r = synthetic_result()
    png, svg = tmp_path / "tune.png", tmp_path / "tune.svg"
    tune_plot.plot(r, str(png))
    tune_plot.plot(r, str(svg), mode="write")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert len(text) > 20_000
    # Only the write row: its chosen configuration is named, the read one's is not.
    assert "write: libaio" in text and "read: io_uring" not in text


def test_plot_leaves_pyplot_alone(tmp_path):
    # A library call must not choose a backend for, or open figures in, the caller's pyplot;
    # checked in a fresh interpreter, as this one may have imported pyplot already.
    src = tmp_path / "result.json"
    r = synthetic_result()
    r["points"] = r["points"][::10]  # what is drawn does not matter here; time does
    src.write_text(json.dumps(r))
    code = ("import json, sys; from nvio import tune_plot; "
            f"tune_plot.plot(json.load(open({str(src)!r})), {str(tmp_path / 'a.png')!r}, 'read'); "
            "print('matplotlib.pyplot' in sys.modules)")
    p = run_python("-c", code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_sparse_search_result_with_one_mode(tmp_path):
    # A search measures a few points, of one mode only, and may have no best entry at all.
    r = synthetic_result()
    r["points"] = [p for p in r["points"] if p["mode"] == "read"][::37]
    r["best"] = {"read": None, "write": None, "mixed": None}
    out = tmp_path / "sparse.png"
    tune_plot.plot(r, str(out))
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_no_points_is_an_error(tmp_path):
    r = synthetic_result()
    r["points"] = []
    with pytest.raises(ValueError, match="no measured points"):
        tune_plot.plot(r, str(tmp_path / "x.png"))
    assert not (tmp_path / "x.png").exists()


def test_mode_without_points_is_an_error(tmp_path):
    r = synthetic_result()
    r["points"] = [p for p in r["points"] if p["mode"] == "read"]
    with pytest.raises(ValueError, match="no write points"):
        tune_plot.plot(r, str(tmp_path / "x.png"), mode="write")


@pytest.mark.parametrize("mode", ["both", "mixed", "READ"])
def test_bad_mode(tmp_path, mode):
    with pytest.raises(ValueError, match="unknown mode"):
        tune_plot.plot(synthetic_result(), str(tmp_path / "x.png"), mode=mode)


def test_bad_extension(tmp_path):
    with pytest.raises(ValueError, match="unknown output format"):
        tune_plot.plot(synthetic_result(), str(tmp_path / "x.jpeg"))


def test_malformed_point(tmp_path):
    r = synthetic_result()
    del r["points"][3]["options"]["queue_depth"]
    with pytest.raises(ValueError, match="point 3 is malformed"):
        tune_plot.plot(r, str(tmp_path / "x.png"))


def test_module_entry_point(tmp_path):
    src = tmp_path / "result.json"
    src.write_text(json.dumps(synthetic_result()))
    out = tmp_path / "out.svg"
    p = run_module(src, "-o", out, "--mode", "read")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and p.stderr == ""
    assert "<svg" in out.read_text()


@pytest.mark.parametrize("content, message", [
    (None, "No such file"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"points": []}', "no measured points"),
])
def test_module_errors(tmp_path, content, message):
    src = tmp_path / "result.json"
    if content is not None:
        src.write_text(content)
    out = tmp_path / "out.png"
    p = run_module(src, "-o", out)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvio.tune_plot: error: ")
    assert message in lines[0]
    assert not out.exists()


def test_ctrl_c_while_matplotlib_loads_an_extension_is_an_interruption(tmp_path, monkeypatch, capsys):
    # pybind11 (matplotlib's ft2font) turns a KeyboardInterrupt during its module's initialization
    # into ImportError("initialization failed") raised from it: that is Ctrl-C, not a missing
    # matplotlib (seen when SIGINT landed while the font library loaded).
    def interrupted_import(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as k:
            raise ImportError("initialization failed") from k

    src = tmp_path / "result.json"
    src.write_text(json.dumps({"points": []}))
    monkeypatch.setattr(tune_plot, "load", lambda path: {})
    monkeypatch.setattr(tune_plot, "plot", interrupted_import)
    assert tune_plot.main([str(src), "-o", str(tmp_path / "out.png")]) == 130
    assert capsys.readouterr().err == "nvio.tune_plot: interrupted\n"
    # A real missing matplotlib still says so.
    monkeypatch.setattr(tune_plot, "plot", lambda *a: (_ for _ in ()).throw(ImportError("no")))
    assert tune_plot.main([str(src), "-o", str(tmp_path / "out.png")]) == 1
    assert "matplotlib is needed" in capsys.readouterr().err
