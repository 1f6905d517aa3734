"""`nvio bench --procs N` and `--device-map`: one result per process plus an aggregate whose
figures follow from the processes' own loop times, every file verified, and a process that fails
or is killed reported as one error line with its own message, never a hang."""

import json
import os
import signal
import subprocess
import time

import pytest

from test_cli import BIN, assert_one_error_line, clean_env, nvio, report

SIZE = 1 << 20


def procs_json(*args):
    r = nvio("bench", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_two_processes_give_two_results_and_an_honest_aggregate(tmp_path):
    doc = procs_json("--procs", 2, "--file", tmp_path / "f", "--size", SIZE, "--loops", 3,
                     "--verify")
    assert doc["procs"] == 2
    procs = doc["processes"]
    assert [p["rank"] for p in procs] == [0, 1]
    assert len({p["pid"] for p in procs}) == 2
    assert [p["file"] for p in procs] == [str(tmp_path / "f.0"), str(tmp_path / "f.1")]
    for p in procs:
        assert [r["op"] for r in p["results"]] == ["write", "read"]
        for r in p["results"]:
            assert r["verified"] is True
            assert len(r["start_ns_all"]) == len(r["end_ns_all"]) == 3
    assert not list(tmp_path.iterdir())  # both files were the run's own: removed
    agg = doc["aggregate"]
    assert [a["op"] for a in agg] == ["write", "read"]
    for k, a in enumerate(agg):
        assert a["processes"] == 2 and a["loops"] == 3 and a["verified"] is True
        assert a["bytes"] == 2 * SIZE
        for i in range(3):
            starts = [p["results"][k]["start_ns_all"][i] for p in procs]
            ends = [p["results"][k]["end_ns_all"][i] for p in procs]
            span = (max(ends) - min(starts)) / 1e9
            assert a["seconds_all"][i] == pytest.approx(span)
            assert a["gb_per_s_all"][i] == pytest.approx(2 * SIZE / span / 1e9)
            assert a["start_skew_s_all"][i] == pytest.approx((max(starts) - min(starts)) / 1e9)
            # The barrier: no process starts loop i before every process has ended loop i - 1.
            if i:
                assert min(starts) >= max(p["results"][k]["end_ns_all"][i - 1] for p in procs)
        assert a["gib_per_s"] == pytest.approx(a["gb_per_s"] * 1e9 / 2**30)


def test_kept_files_hold_each_process_pattern(tmp_path):
    procs_json("--procs", 2, "--file", tmp_path / "f", "--size", SIZE, "--op", "write",
               "--keep", "--seed", 7, "--loops", 1)
    for rank in (0, 1):
        assert (tmp_path / f"f.{rank}").stat().st_size == SIZE
        r = nvio("bench", "--file", tmp_path / f"f.{rank}", "--op", "read", "--size", SIZE,
                 "--seed", 7, "--verify", "--loops", 1)
        assert r.returncode == 0, r.stderr


def test_table_shows_each_process_and_all(tmp_path):
    r = nvio("bench", "--procs", 2, "--dir", tmp_path, "--size", SIZE, "--loops", 1,
             "--op", "write")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    assert [(row[0], row[2]) for row in rows if row and row[0] in ("0", "1")] == [
        ("0", "write"), ("1", "write")]
    assert any(row[:2] == ["all", "write"] for row in rows)
    assert "GB/s = 1e9 bytes/s, GiB/s = 2^30 bytes/s" in r.stdout


def test_random_pattern_aggregates_the_blocks(tmp_path):
    doc = procs_json("--procs", 2, "--dir", tmp_path, "--pattern", "random", "--file-size", "1M",
                     "--ops", 64, "--loops", 2, "--op", "read")
    a = doc["aggregate"][0]
    assert a["op"] == "read" and a["bytes"] == 2 * 64 * 4096


def test_failing_process_is_one_error_line_with_its_message(tmp_path):
    (tmp_path / "f.1").mkdir()  # process 1's file cannot be a file
    r = nvio("bench", "--procs", 2, "--file", tmp_path / "f", "--size", SIZE, "--op", "write",
             timeout=30)
    assert_one_error_line(r, code=2)
    assert "process 1 of 2" in r.stderr
    assert f"--file {tmp_path / 'f.1'} is a directory" in r.stderr
    assert not (tmp_path / "f.0").exists()  # process 0 stopped and removed its file


def children_of(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


@pytest.mark.parametrize("where", ["dir", "file", "existing-file"])
def test_killed_process_ends_the_run_without_a_hang(tmp_path, where):
    target = ["--dir", str(tmp_path)] if where == "dir" else ["--file", str(tmp_path / "f")]
    if where == "existing-file":  # the user's files: never removed, even when a process dies
        for rank in range(2):
            (tmp_path / f"f.{rank}").write_bytes(b"x" * (1 << 20))
    p = subprocess.Popen([BIN, "bench", "--procs", "2", *target, "--size", "1M",
                          "--loops", "1000000", "--op", "write"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=clean_env())
    try:
        deadline = time.monotonic() + 20
        kids = []
        while len(kids) < 2 and time.monotonic() < deadline:
            kids = children_of(p.pid)
            time.sleep(0.05)
        assert len(kids) == 2
        os.kill(kids[1], signal.SIGKILL)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvio: error: "), err
    assert f"process 1 of 2 (pid {kids[1]}" in err and "killed by signal 9" in err
    assert out == ""
    left = sorted(x.name for x in tmp_path.iterdir())
    # Files the run made are removed, the killed process's too; the user's stay.
    assert left == (["f.0", "f.1"] if where == "existing-file" else []), left


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--procs", "0"], "--procs: expected 1 to"),
        (["--procs", "x"], "--procs"),
        (["--device-map", "nodevice"], "expected DIR:ORDINAL"),
        (["--device-map", "/tmp:x"], "--device-map"),
        (["--device-map", "/tmp:0", "/tmp:1", "--procs", "3"], "disagrees with --device-map"),
        (["--device-map", "/tmp:0", "--dir", "/tmp"], "not with --dir or --file"),
        (["--device-map", "/tmp:0", "--gpu", "--device", "1"], "not with --device"),
        (["--procs", "2", "--gpu", "--h2d-only"], "not --h2d-only"),
    ],
)
def test_bad_procs_arguments(args, needle):
    r = nvio("bench", *args)
    assert_one_error_line(r)
    assert needle in r.stderr


def test_device_map_gpu_without_a_gpu_is_a_clear_error(tmp_path):
    if report(str(tmp_path))["gpu"]["devices"]:
        pytest.skip("a GPU is here")
    r = nvio("bench", "--device-map", f"{tmp_path}:0", f"{tmp_path}:1", "--gpu", "--size", SIZE,
             timeout=30)
    assert_one_error_line(r)
    assert "--gpu: no usable GPU here" in r.stderr
    assert "of 2" in r.stderr


def test_device_map_without_gpu_runs_host_memory_with_a_note(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    r = nvio("bench", "--json", "--device-map", f"{a}:0", f"{b}:1", "--size", SIZE, "--loops", 1)
    assert r.returncode == 0, r.stderr
    assert "nvio: note: --device-map without --gpu" in r.stderr
    doc = json.loads(r.stdout)
    assert [os.path.dirname(p["file"]) for p in doc["processes"]] == [str(a), str(b)]
    assert all(p["memory"] == "host" for p in doc["processes"])
