"""The Python-level benchmarks of bench/ (issue 27 item 6) run end to end at a tiny size: their
contenders load what was saved, and each prints its table and ratio lines. Timings are not
checked (benchmarks are never asserted in tests)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

import nvio  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "bench"
CLI = Path(nvio.__file__).resolve().parent / "_bin" / "nvio"


@pytest.mark.parametrize("script, extra", [
    ("safetensors_bench.py", ["--tensors", "8"]),
    ("checkpoint_bench.py", []),
    ("hf_folder_bench.py", ["--tensors", "12", "--shards", "3"]),
])
def test_bench_script_runs_at_a_tiny_size(tmp_path, script, extra):
    if not CLI.exists():
        pytest.skip(f"no bundled nvio CLI at {CLI}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIO_")}
    env["NVIO_CONFIG"] = "none"
    p = subprocess.run([sys.executable, str(BENCH / script), "--dir", str(tmp_path), "--size",
                        "1M", "--rounds", "1", "--nvio", str(CLI), *extra],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert " GB/s " in p.stdout and "x" in p.stdout.splitlines()[-1], p.stdout
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed


def test_fio_compare_runs_at_a_tiny_size(tmp_path):
    """bench/fio_compare.py end to end (layout, both tools, the untimed --verify pass): a
    NameError in its verify step once went unseen because nothing ran it."""
    if not CLI.exists():
        pytest.skip(f"no bundled nvio CLI at {CLI}")
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (scripts/deps.sh installs it)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIO_")}
    env["NVIO_CONFIG"] = "none"
    p = subprocess.run([sys.executable, str(BENCH / "fio_compare.py"), "--dir", str(tmp_path),
                        "--size", "8M", "--rounds", "1", "--engines", "psync", "--qds", "1",
                        "--ops", "read", "--nvio", str(CLI)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "| psync  | read | 1  |" in p.stdout, p.stdout
    assert "verify on the same file: psync ok" in p.stdout + p.stderr, p.stdout + p.stderr
