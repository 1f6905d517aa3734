"""`nvio ckpt-bench` (nvio.ckpt_bench): the synthetic checkpoint, the byte comparison that guards
the measured loads, the run's output and exit codes, and what it leaves in --dir."""

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from nvio import ckpt_bench  # noqa: E402


def test_the_checkpoint_is_a_training_state_of_about_the_size_asked():
    ck = ckpt_bench.synthetic_checkpoint(torch, 8 << 20, layers=2)
    tensors = ckpt_bench.tensors_of(ck)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    assert 0.8 * (8 << 20) <= nbytes <= 1.05 * (8 << 20)
    assert set(ck) == {"model", "optimizer", "step"}
    assert {t.dtype for t in ck["model"].values()} == {torch.bfloat16}
    state = ck["optimizer"]["state"]
    assert len(state) == len(ck["model"]) == 1 + 2 * 10
    for i, (name, w) in enumerate(ck["model"].items()):
        assert state[i]["exp_avg"].shape == w.shape and state[i]["exp_avg"].dtype == torch.float32
    # Matrices, vectors and scalars: the mixed sizes of a real checkpoint.
    assert {t.dim() for t in tensors.values()} == {0, 1, 2}
    assert ck["optimizer"]["param_groups"][0]["params"] == list(range(len(ck["model"])))


def test_same_checkpoint_finds_one_changed_byte_and_a_changed_dtype():
    ck = ckpt_bench.synthetic_checkpoint(torch, 1 << 20, layers=1)
    assert ckpt_bench.same_checkpoint(ck, ck) is None
    other = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in ck["model"].items()}
    name = "layers.0.mlp.up.weight"
    other[name].view(-1).view(torch.uint8)[12345] ^= 1
    assert name in ckpt_bench.same_checkpoint(ck["model"], other)
    other[name] = ck["model"][name].float()
    assert "float32" in ckpt_bench.same_checkpoint(ck["model"], other)
    assert "paths differ" in ckpt_bench.same_checkpoint(ck["model"], {})


def test_a_run_prints_json_and_leaves_dir_as_it_was(tmp_path, capsys):
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    argv = ["--dir", str(tmp_path), "--size", "2M", "--layers", "1", "--rounds", "2", "--json"]
    if not nvio_command():
        argv.append("--no-bench")
    assert ckpt_bench.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rounds"] == 2 and result["tensors"] == 44
    for name in ("nvio.save", "torch.save+fsync", "nvio.load", "torch.load"):
        assert len(result["seconds"][name]) == 2 and result["median_s"][name] > 0
    assert result["ratios"]["save_vs_torch"] > 0 and result["ratios"]["load_vs_torch"] > 0
    if nvio_command():
        assert result["ratios"]["load_vs_bench_read"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]  # its scratch dir is gone
    assert keep.read_text() == "mine"


def nvio_command():
    return ckpt_bench.find_nvio(None)


@pytest.mark.parametrize("argv, needle", [
    (["--size", "0"], "argument --size: must be at least 1 byte"),
    (["--size", "1X"], "argument --size: invalid value '1X' for --size"),
    (["--rounds", "0"], "--layers and --rounds must be at least 1"),
    (["--layers", "0"], "--layers and --rounds must be at least 1"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (None, "the following arguments are required: --dir"),
])
def test_bad_arguments_exit_2(tmp_path, argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        ckpt_bench.main(["--size", "1M"] if argv is None else ["--dir", str(tmp_path), *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "nvio ckpt-bench: error:" in err and needle in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_failure_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    # A --dir that is a file is refused before the run (exit 2, test_cli_hardening.py); a failure
    # in the run is exit 1.
    monkeypatch.setattr(ckpt_bench, "same_checkpoint", lambda a, b: "a planted difference")
    argv = ["--dir", str(tmp_path), "--size", "1M", "--layers", "1", "--no-bench"]
    assert ckpt_bench.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("nvio ckpt-bench: error:") and err.count("\n") == 1, err
    assert "a planted difference" in err
    assert list(tmp_path.iterdir()) == []


def test_a_failing_bench_reference_is_reported(tmp_path, capsys):
    fake = tmp_path / "nvio"
    fake.write_text("#!/bin/sh\necho 'nvio: error: no' >&2\nexit 1\n")
    fake.chmod(0o755)
    argv = ["--dir", str(tmp_path), "--size", "1M", "--layers", "1", "--rounds", "1",
            "--nvio", str(fake)]
    assert ckpt_bench.main(argv) == 1
    assert "nvio bench --op write failed (1): nvio: error: no" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["nvio"]


def test_python_m_nvio_ckpt_bench_runs_the_module(tmp_path):
    r = subprocess.run([sys.executable, "-m", "nvio", "ckpt-bench", "--dir", str(tmp_path),
                        "--size", "1M", "--layers", "1", "--rounds", "1", "--no-bench"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "nvio.load" in r.stdout and "x torch.load" in r.stdout
    r = subprocess.run([sys.executable, "-m", "nvio", "ckpt-bench", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: nvio ckpt-bench"), r.stderr


def test_a_load_that_fails_in_its_process_names_the_file_and_the_error(tmp_path):
    missing = tmp_path / "missing.pt"
    with pytest.raises(RuntimeError, match=r"the nvio load of .*missing\.pt failed \(1\): "
                                           r".*FileNotFound.*missing\.pt"):
        ckpt_bench.load_in_child("nvio", missing)
