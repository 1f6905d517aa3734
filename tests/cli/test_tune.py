"""`nvio tune` end to end with tiny budgets: JSON shape, the budget kept, --save and what it
changes (`nvio report`, a plain `nvio bench`), and argument errors."""

import json
import os

import pytest

from test_cli import OPTION_NAMES, assert_one_error_line, bench_json, clean_env, nvio, report

TINY = ("--size", "32M", "--budget", "3")
# Without --gpu the tuner measures host memory: gpu_direct is not part of its space, nor of what it
# shows or saves. cached_reads is never tuned: its trials read with direct on or off, which it leaves
# as they are.
TUNED = OPTION_NAMES - {"gpu_direct", "cached_reads"}


def tune_json(tmp_path, *args, env=None):
    r = nvio("tune", "--dir", tmp_path, "--json", *TINY, *args, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r


def test_json_document_and_budget(tmp_path):
    doc, r = tune_json(tmp_path)
    assert doc["strategy"] == "search"
    assert doc["modes"] == ["read", "write"]
    assert doc["directory"] == str(tmp_path)
    assert doc["device"].startswith("dev:")
    assert doc["file_size"] == 32 << 20
    assert 0 < doc["trial_bytes"] <= doc["file_size"]
    # Within the budget (with room for one slow trial), and not giving up early.
    assert doc["elapsed_s"] <= 3 * 1.5
    assert len(doc["points"]) >= 4
    for p in doc["points"]:
        assert p["mode"] in ("read", "write")
        assert set(p["options"]) == TUNED
        assert p["options"]["engine"] in ("io_uring", "libaio", "psync")
        assert p["options"]["direct"] in ("on", "off")
        assert len(p["samples_gbps"]) >= 1 and all(g > 0 for g in p["samples_gbps"])
        assert min(p["samples_gbps"]) <= p["median_gbps"] <= max(p["samples_gbps"])
    best = doc["best"]
    for mode in ("read", "write"):
        pick = best[mode]
        # The pick is the measured point of that mode with the highest median among the most
        # repeated ones, not a value made up.
        same = [p for p in doc["points"] if p["mode"] == mode and p["options"] == pick["options"]]
        assert len(same) == 1
        assert same[0]["median_gbps"] == pick["median_gbps"]
    mixed = best["mixed"]
    r_, w_ = mixed["read_gbps"], mixed["write_gbps"]
    assert abs(mixed["mixed_gbps"] - 2 * r_ * w_ / (r_ + w_)) < 1e-9
    assert doc["recommended"] == "mixed"
    aio = doc["deepspeed"]["aio"]
    assert set(aio) == {"block_size", "queue_depth", "intra_op_parallelism", "single_submit",
                        "overlap_events"}
    assert isinstance(aio["single_submit"], bool) and isinstance(aio["overlap_events"], bool)
    assert aio["block_size"] == mixed["options"]["block_size"]
    # The scratch file is gone; no progress line when stderr is not a terminal.
    assert os.listdir(tmp_path) == []
    assert "\r" not in r.stderr


def test_read_only_and_engines(tmp_path):
    doc, _ = tune_json(tmp_path, "--read-only", "--engines", "psync")
    assert doc["modes"] == ["read"]
    assert doc["best"]["write"] is None and doc["best"]["mixed"] is None
    assert doc["recommended"] == "read"
    assert {p["options"]["engine"] for p in doc["points"]} == {"psync"}
    assert {p["mode"] for p in doc["points"]} == {"read"}


def test_text_output_has_table_and_deepspeed_section(tmp_path):
    r = nvio("tune", "--dir", tmp_path, *TINY, "--write-only", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "write " in r.stdout and "GB/s" in r.stdout and "spread" in r.stdout
    assert '"aio"' in r.stdout and '"intra_op_parallelism"' in r.stdout
    lines = r.stdout.splitlines()
    assert any(line.startswith("write ") for line in lines)
    assert not any(line.startswith(("read ", "mixed ")) for line in lines)  # write-only


def test_save_then_report_bench_and_precedence(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    config = tmp_path / "cfg" / "config.json"
    env = clean_env(NVIO_CONFIG=str(config))
    doc, r = tune_json(work, "--save", env=env)
    assert "saved to" in r.stderr
    saved = json.loads(config.read_text())
    profile = saved["profiles"][doc["device"]]
    assert saved["default"] == doc["device"]
    assert profile["options"] == doc["best"]["mixed"]["options"]

    rep = json.loads(nvio("report", "--json", "--dir", work, env=env).stdout)
    assert rep["config"] == {"path": str(config), "found": True, "profile": doc["device"]}
    assert rep["options"]["gpu_direct"]["source"] == "default"
    for name in TUNED:
        assert rep["options"][name]["source"] == "config", name
        assert rep["options"][name]["value"] == profile["options"][name], name
    text = nvio("report", "--dir", work, env=env).stdout
    assert f"{config} (profile {doc['device']})" in text

    # A plain bench uses the saved settings and says so.
    out = bench_json("--dir", work, "--size", "1M", "--loops", "1", env=env)
    assert {k: out["options"][k] for k in TUNED} == profile["options"]
    assert {out["options_sources"][k] for k in TUNED} == {"config"}
    assert out["config"]["profile"] == doc["device"]
    # The environment and explicit flags still win over the file.
    env_qd = dict(env, NVIO_QUEUE_DEPTH="3")
    out = bench_json("--dir", work, "--size", "1M", "--loops", "1", "--block-size", "64K",
                     env=env_qd)
    assert out["options"]["queue_depth"] == 3
    assert out["options_sources"]["queue_depth"] == "environment"
    assert out["options"]["block_size"] == 64 << 10
    assert out["options_sources"]["block_size"] == "explicit"
    assert out["options_sources"]["engine"] == "config"
    # NVIO_CONFIG=none turns the file off.
    out = bench_json("--dir", work, "--size", "1M", "--loops", "1", env=clean_env())
    assert set(out["options_sources"].values()) == {"default"}


def test_malformed_config_is_a_usage_error_naming_the_file(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"version": 1, "profiles": {"k": {"options": {"queue_depth": "deep"}}}}')
    env = clean_env(NVIO_CONFIG=str(config))
    line = assert_one_error_line(nvio("report", "--dir", tmp_path, env=env))
    assert str(config) in line and "queue_depth" in line
    line = assert_one_error_line(nvio("bench", "--dir", tmp_path, "--size", "1M", env=env))
    assert str(config) in line
    # --save refuses before spending the budget.
    line = assert_one_error_line(nvio("tune", "--dir", tmp_path, *TINY, "--save", env=env))
    assert str(config) in line
    assert os.listdir(tmp_path) == ["config.json"]


def test_argument_errors(tmp_path):
    cases = [
        (("--budget", "abc"), "--budget"),
        (("--budget", "0"), "--budget"),
        (("--budget", "-5"), "--budget"),
        (("--size", "12Q"), "--size"),
        (("--size", "1M"), "16 MiB"),
        (("--engines", "warp"), "--engines"),
        (("--engines", "auto"), "concrete"),
        (("--engines", ""), "--engines"),
        (("--engines", "psync,psync"), "twice"),
        (("--read-only", "--write-only"), "excludes"),
        (("--trial-size", "64M", "--size", "32M"), "trial size"),
        # Options that were silently ignored or replaced.
        (("--trial-size", "0"), "below 1 MiB"),
        (("--trial-size", "1"), "below 1 MiB"),
        (("--grid", "--budget", "2"), "--budget does not apply with --grid"),
        (("--engines", "psync,"), "empty item"),
        (("--engines", ",psync"), "empty item"),
        (("--device", "3"), "--device applies with --gpu only"),
    ]
    for args, needle in cases:
        line = assert_one_error_line(nvio("tune", "--dir", tmp_path, *args))
        assert needle in line, (args, line)
    line = assert_one_error_line(nvio("tune"))
    assert "--dir" in line
    # A directory that cannot be made is a failure of the run (exit 1), naming it.
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = assert_one_error_line(nvio("tune", "--dir", blocker / "sub", *TINY), code=1)
    assert str(blocker / "sub") in line
    blocker.unlink()
    line = assert_one_error_line(
        nvio("tune", "--dir", tmp_path, *TINY, "--save", env=clean_env(NVIO_CONFIG="none")))
    assert "--save" in line
    assert os.listdir(tmp_path) == []


def test_missing_directory_is_created(tmp_path):
    d = tmp_path / "a" / "b"
    doc, _ = tune_json(d, "--read-only", "--engines", "psync")
    assert doc["directory"] == str(d)
    assert doc["memory"] == "host"
    assert d.is_dir() and os.listdir(d) == []  # made, and the scratch file removed


def has_gpu(tmp_path):
    return bool(report(str(tmp_path))["gpu"]["devices"])


def test_gpu_without_a_gpu_is_one_clear_line_before_anything_is_made(tmp_path):
    if has_gpu(tmp_path):
        pytest.skip("a GPU is present")
    d = tmp_path / "not-made"
    for args in (["--gpu"], ["--gpu", "--gds"], ["--gpu", "--device", "3"]):
        line = assert_one_error_line(nvio("tune", "--dir", d, *TINY, *args))
        assert line.startswith("nvio: error: --gpu: no usable GPU here: "), (args, line)
        assert len(line) > len("nvio: error: --gpu: no usable GPU here: ")  # and why
    assert not d.exists()


def test_gpu_flag_errors(tmp_path):
    line = assert_one_error_line(nvio("tune", "--dir", tmp_path, *TINY, "--gds"))
    assert "--gds needs --gpu" in line
    line = assert_one_error_line(nvio("tune", "--dir", tmp_path, *TINY, "--gpu", "--device", "x"))
    assert "--device" in line
    assert os.listdir(tmp_path) == []


def test_gpu_tunes_the_device_path(tmp_path):
    if not has_gpu(tmp_path):
        pytest.skip("no GPU: " + report(str(tmp_path))["gpu"]["driver"]["reason"])
    gds = report(str(tmp_path))["gpu"]["gds"]["mode"] != "unavailable"
    args = ["--gpu", "--gds"] if gds else ["--gpu"]
    doc, r = tune_json(tmp_path, *args)
    assert doc["memory"] == "device"
    seen = {p["options"]["gpu_direct"] for p in doc["points"]}
    assert seen == ({"off", "on"} if gds else {"off"}), seen
    for p in doc["points"]:
        assert set(p["options"]) == OPTION_NAMES
        assert all(g > 0 for g in p["samples_gbps"])
    assert doc["best"]["mixed"]["options"]["gpu_direct"] in seen
    text = nvio("tune", "--dir", tmp_path, *TINY, *args, "--write-only", timeout=120)
    assert text.returncode == 0, text.stderr
    assert "gpu_direct" in text.stdout and "GPU 0" in text.stdout


# ---- several drives -------------------------------------------------------------------------------


def test_several_dirs_tune_each_then_measure_them_together(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]  # made by the run
    cfg = tmp_path / "cfg.json"
    r = nvio("tune", "--dir", dirs[0], "--dir", dirs[1], "--json", *TINY, "--stripe-size", "256K",
             "--save", env=clean_env(NVIO_CONFIG=str(cfg)), timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [d["directory"] for d in doc["drives"]] == [str(d) for d in dirs]
    for d in doc["drives"]:
        assert d["budget_s"] <= 3 * 0.8 / 2 + 1e-9  # an equal share of 80% of --budget
        assert d["recommended"] in ("mixed", "read", "write")
    s = doc["striped"]
    assert s["directories"] == [str(d) for d in dirs]
    assert s["stripe_size"] == 256 * 1024
    assert {m["mode"] for m in s["modes"]} == {"read", "write"}
    for m in s["modes"]:
        assert m["gb_per_s"] > 0 and len(m["gb_per_s_all"]) == 3
        assert len(m["drive_gb_per_s"]) == 2 and all(g > 0 for g in m["drive_gb_per_s"])
    # Both directories are on one device here: a warning (issue 28: none was given), one profile
    # and a note saying so.
    assert len(doc["drive_of_directory"]) == 2
    assert doc["drive_of_directory"][0] == doc["drive_of_directory"][1]
    assert len(doc["warnings"]) == 1 and "are on one drive" in doc["warnings"][0]
    assert f"--dir {dirs[0]} and --dir {dirs[1]}" in doc["warnings"][0]
    assert "nvio: warning: " + doc["warnings"][0] in r.stderr
    saved = json.loads(cfg.read_text())
    assert len(saved["profiles"]) == 1
    assert "like an earlier --dir" in r.stderr
    # Nothing left behind in either directory.
    assert list(dirs[0].iterdir()) == [] and list(dirs[1].iterdir()) == []


def test_several_dirs_on_one_drive_text_output_says_so(tmp_path):
    """Issue 28: two --dir on one drive gave no warning and "37% of the sum of the drives"."""
    r = nvio("tune", "--dir", tmp_path / "a", "--dir", tmp_path / "b", *TINY, "--read-only",
             timeout=120)
    assert r.returncode == 0, r.stderr
    together = "All 2 directories (1 drive) together"
    assert together in r.stdout
    assert "% of the sum of the 1 distinct drive alone, directories on one drive counted once" \
        in r.stdout
    assert "of the sum of the drives alone" not in r.stdout
    assert f"warning: --dir {tmp_path / 'a'} and --dir {tmp_path / 'b'} are on one drive" \
        in r.stdout
    assert "write " not in r.stdout.split(together)[1]


def test_several_dirs_on_distinct_drives_give_no_warning(tmp_path):
    other = "/dev/shm"
    if not os.access(other, os.W_OK) or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip(f"{other} is not a writable second file system here")
    b = os.path.join(other, f"nvio-tune-test-{os.getpid()}")
    try:
        r = nvio("tune", "--dir", tmp_path / "a", "--dir", b, *TINY, "--read-only", timeout=120)
    finally:
        if os.path.isdir(b):
            os.rmdir(b)
    assert r.returncode == 0, r.stderr
    assert "All 2 drives together" in r.stdout
    assert "% of the sum of the drives alone" in r.stdout
    assert "warning" not in r.stdout + r.stderr


@pytest.mark.parametrize("args,needle", [
    (("--stripe-size", "64K"), "--stripe-size needs several --dir"),
    (("--dir", "B", "--stripe-size", "1000"), "stripe_size 1000"),
    (("--dir", "B", "--gpu"), "--gpu tunes one --dir at a time"),
    (("--dir", "A"), "given twice"),
])
def test_several_dirs_argument_errors(tmp_path, args, needle):
    a = tmp_path / "a"
    args = [str(tmp_path / "b") if x == "B" else str(a) if x == "A" else x for x in args]
    line = assert_one_error_line(nvio("tune", "--dir", a, *TINY, *args))
    assert needle in line


def test_save_where_the_file_cannot_be_written_fails_before_measuring(tmp_path):
    """It spent the whole budget, then failed on the lock file."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    import subprocess
    import time

    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        config = ro / "sub" / "config.json"
        start = time.monotonic()
        r = nvio("tune", "--dir", tmp_path / "d", "--size", "32M", "--budget", "30", "--save",
                 env=clean_env(NVIO_CONFIG=str(config)), timeout=120)
        line = assert_one_error_line(r, code=1)
        assert str(config) in line and "does not take new files" in line
        assert time.monotonic() - start < 10
    finally:
        subprocess.run(["umount", str(ro)])
