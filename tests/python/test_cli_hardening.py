"""Misuse of the Python command-line tools (nvio ckpt-bench, nvio.tune_plot, the console
scripts) ends in one line naming what failed and a non-zero exit status: never a traceback, an
OOM kill, or scratch files and child processes left behind after an error or a signal."""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest

import nvio
from nvio import _cli, ckpt_bench, tune_plot

PYTHON = sys.executable
ROOT = os.path.dirname(os.path.dirname(nvio.__file__))  # the nvio package the tests import


def run_python(*args, address_space=None, timeout=120, **kwargs):
    """This interpreter with ARGS and the tests' nvio package; `address_space` caps the child's
    virtual memory, so that a regression that allocates without bound fails instead of bringing
    the OOM killer onto the machine."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        ROOT, os.environ.get("PYTHONPATH")])))

    def limit():
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    return subprocess.run([PYTHON, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, **kwargs)


def one_error_line(stderr: str, prog: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# ---- nvio ckpt-bench: memory and disk are checked before anything is allocated ---------------

needs_torch = pytest.mark.skipif(
    subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="PyTorch is not installed")


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) << 10 for line in f
                        if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def test_a_size_over_the_memory_there_is_is_refused_before_allocating(tmp_path):
    have = mem_available()
    if have is None or have > 1 << 41:
        pytest.skip("no MemAvailable here, or more than 2 TiB of it")
    r = run_python("-m", "nvio", "ckpt-bench", "--dir", tmp_path, "--size", "1T", "--no-bench",
                   address_space=4 << 30)
    assert r.returncode == 2, r.stderr
    line = one_error_line(r.stderr, "nvio ckpt-bench")
    assert "--size 1.0 TiB (1099511627776 bytes)" in line
    assert "of memory" in line and "is available (MemAvailable" in line
    assert list(tmp_path.iterdir()) == []


def args_for(tmp_path, size):
    return argparse.Namespace(dir=tmp_path, size=size, layers=12)


def test_the_memory_check_counts_the_runs_peak_not_one_copy(tmp_path, monkeypatch):
    size = 64 << 20
    # Room for two copies and the interpreters is not enough: the run peaks at about 2.3.
    monkeypatch.setattr(ckpt_bench, "available_memory",
                        lambda: 2 * size + ckpt_bench._INTERPRETER_BYTES)
    problem = ckpt_bench.check_resources(args_for(tmp_path, size), size)
    assert problem and f"needs about {ckpt_bench._human(int(2.5 * size) + (512 << 20))}" in problem
    monkeypatch.setattr(ckpt_bench, "available_memory",
                        lambda: 3 * size + ckpt_bench._INTERPRETER_BYTES)
    assert ckpt_bench.check_resources(args_for(tmp_path, size), size) is None


def test_too_little_free_space_in_dir_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ckpt_bench, "free_space", lambda path: 5 << 20)
    assert ckpt_bench.main(["--dir", str(tmp_path), "--size", "4M", "--no-bench"]) == 2
    line = one_error_line(capsys.readouterr().err, "nvio ckpt-bench")
    assert f"free in --dir {tmp_path}" in line and "5.0 MiB (5242880 bytes) is free" in line
    assert list(tmp_path.iterdir()) == []


def test_many_layers_are_refused_and_small_sizes_count_their_real_bytes(tmp_path, capsys,
                                                                       monkeypatch):
    # A subprocess: a million tiny tensors take minutes and gigabytes to make.
    r = run_python("-m", "nvio", "ckpt-bench", "--dir", tmp_path, "--size", "1M", "--layers",
                   "100000", "--no-bench", address_space=4 << 30, timeout=60)
    assert r.returncode == 2
    assert "--layers 100000: at most 1024" in one_error_line(r.stderr, "nvio ckpt-bench")
    # At the smallest hidden size the checkpoint outgrows --size; the check uses its real size.
    real = ckpt_bench.checkpoint_bytes(ckpt_bench.checkpoint_shapes(1024, 1024))
    assert real > 7 << 20
    monkeypatch.setattr(ckpt_bench, "available_memory",
                        lambda: 2 * real + ckpt_bench._INTERPRETER_BYTES)
    argv = ["--dir", str(tmp_path), "--size", "1K", "--layers", "1024", "--no-bench"]
    assert ckpt_bench.main(argv) == 2
    line = one_error_line(capsys.readouterr().err, "nvio ckpt-bench")
    assert ("--size 1.0 KiB (1024 bytes) with --layers 1024 (a checkpoint of "
            f"{ckpt_bench._human(real)})") in line
    assert list(tmp_path.iterdir()) == []


def test_a_missing_nvio_command_is_refused_before_the_run(tmp_path, capsys):
    missing = tmp_path / "no-such-nvio"
    assert ckpt_bench.main(["--dir", str(tmp_path), "--size", "1M", "--nvio", str(missing)]) == 2
    assert f"--nvio {missing}: no such executable" in one_error_line(
        capsys.readouterr().err, "nvio ckpt-bench")
    assert list(tmp_path.iterdir()) == []


# ---- nvio ckpt-bench: --dir ------------------------------------------------------------------


@pytest.mark.parametrize("below, needle", [
    ("", "--dir {f}: not a directory"),
    ("sub/x", "--dir {f}/sub/x: {f} is not a directory"),
])
def test_a_dir_that_is_a_file_is_a_bad_argument(tmp_path, capsys, below, needle):
    f = tmp_path / "f1.dat"
    f.write_text("mine")
    directory = f / below if below else f
    assert ckpt_bench.main(["--dir", str(directory), "--size", "1M", "--no-bench"]) == 2
    assert needle.format(f=f) in one_error_line(capsys.readouterr().err, "nvio ckpt-bench")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f1.dat"] and f.read_text() == "mine"


@needs_torch
def test_a_missing_dir_is_made_and_removed_with_the_parents_it_lacked(tmp_path):
    r = run_python("-m", "nvio", "ckpt-bench", "--dir", tmp_path / "a" / "b" / "c", "--size",
                   "1M", "--layers", "1", "--rounds", "1", "--no-bench")
    assert r.returncode == 0, r.stderr
    assert str(tmp_path / "a" / "b" / "c") in r.stdout
    assert list(tmp_path.iterdir()) == []


@needs_torch
def test_what_is_put_in_a_made_dir_meanwhile_stays(tmp_path, monkeypatch):
    theirs = tmp_path / "a" / "theirs"

    def load_in_child(which, path):
        theirs.write_text("not the run's")
        return 0.5

    monkeypatch.setattr(ckpt_bench, "load_in_child", load_in_child)
    argv = ["--dir", str(tmp_path / "a" / "b"), "--size", "1M", "--layers", "1", "--rounds", "1",
            "--no-bench"]
    assert ckpt_bench.main(argv) == 0
    assert list(tmp_path.iterdir()) == [tmp_path / "a"]
    assert list((tmp_path / "a").iterdir()) == [theirs]


# ---- nvio ckpt-bench: signals ----------------------------------------------------------------


def wait_for(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


@needs_torch
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_removes_the_scratch_dir_and_kills_the_child(tmp_path, signum):
    work = tmp_path / "dir"
    work.mkdir()
    pid_file = tmp_path / "bench.pid"
    # A `nvio bench` that hangs: the signal comes while the run waits for its child.
    fake = tmp_path / "nvio"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 300\n")
    fake.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        ROOT, os.environ.get("PYTHONPATH")])))
    p = subprocess.Popen([PYTHON, "-m", "nvio", "ckpt-bench", "--dir", str(work), "--size", "1M",
                          "--layers", "1", "--rounds", "1", "--nvio", str(fake)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text().strip()), \
            p.stderr.read() if p.poll() is not None else "the bench never started"
        child = int(pid_file.read_text())
        assert [q.name for q in work.iterdir()][0].startswith("nvio-ckpt-bench-")
        p.send_signal(signum)  # to the run only, as `kill` does: its child is its business
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    try:
        assert p.returncode == 128 + signum, err
        assert one_error_line(err, "nvio ckpt-bench") == \
            f"nvio ckpt-bench: interrupted by {signal.Signals(signum).name}"
        assert list(work.iterdir()) == []
        assert wait_for(lambda: not alive(child), timeout=10), "the bench child was left running"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_signal_while_the_child_starts_kills_it(monkeypatch):
    # The signal comes after the child started and before Popen() returned it (on CI's two busy
    # cores the test above once found its bench child left running): the guard holds it until
    # the child is known; then the run kills the child and raises.
    started = []
    real_popen = subprocess.Popen

    def popen_then_signal(*args, **kwargs):
        child = real_popen(*args, **kwargs)
        started.append(child)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10000):  # Python runs the handler between bytecodes: here, unless held
            pass
        return child

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    try:
        with pytest.raises(ckpt_bench.Interrupted):
            with ckpt_bench.SignalGuard():
                ckpt_bench.run_child(["sleep", "300"], "the child")
        assert len(started) == 1
        assert started[0].wait(timeout=10) == -signal.SIGKILL
    finally:
        for child in started:
            child.kill()
            child.wait()


def test_the_guard_keeps_ignored_signals_ignored_and_restores_the_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
    try:
        with ckpt_bench.SignalGuard():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
    finally:
        signal.signal(signal.SIGHUP, before[signal.SIGHUP])


def test_a_signal_in_a_held_block_waits_for_its_end_and_later_ones_let_cleanup_finish():
    steps = []
    with pytest.raises(ckpt_bench.Interrupted) as e:
        with ckpt_bench.SignalGuard() as guard:
            with guard.held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler runs in here, and must not raise yet
                steps.append("held block done")
            steps.append("not reached")
    assert e.value.signum == signal.SIGTERM and steps == ["held block done"]
    with pytest.raises(ckpt_bench.Interrupted):
        with ckpt_bench.SignalGuard() as guard:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # a second one during the cleanup
                time.sleep(0.05)
                steps.append("cleanup done")
    assert steps[-1] == "cleanup done"


# ---- nvio.tune_plot --------------------------------------------------------------------------


def plot_module(*args, **kwargs):
    return run_python("-m", "nvio.tune_plot", *args, **kwargs)


def one_point(block_size="4096", queue_depth="4", engine="io_uring", count=1):
    """A result's JSON text with `count` points (one per engine), the numbers as JSON text."""
    points = []
    for i in range(count):
        name = json.dumps(f"{engine}{i}" if count > 1 else engine)
        points.append(f'{{"mode": "read", "median_gbps": 1.5, "options": {{"engine": {name}, '
                      f'"block_size": {block_size}, "queue_depth": {queue_depth}, '
                      f'"direct": "on"}}}}')
    return f'{{"points": [{", ".join(points)}]}}'


@pytest.mark.parametrize("content, needle", [
    ("[" * 100000 + "]" * 100000, "JSON nested too deeply to read"),
    ('{"a":' * 100000 + "1" + "}" * 100000, "JSON nested too deeply to read"),
    (one_point(block_size="Infinity"), "point 0 is malformed (OverflowError"),
    (one_point(queue_depth="1e300"), "point 0 has a block size or queue depth over 2^50"),
    (one_point(queue_depth="1" + "0" * 400), "point 0 has a block size or queue depth over 2^50"),
    (one_point(count=200), "the result has 200 engines; at most 16"),
], ids=["deep-list", "deep-object", "infinite", "1e300", "400-digits", "200-engines"])
def test_hostile_results_are_one_line_errors(tmp_path, content, needle):
    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed")
    src = tmp_path / "result.json"
    src.write_text(content)
    out = tmp_path / "out.png"
    r = plot_module(src, "-o", out)
    assert r.returncode == 1
    assert needle in one_error_line(r.stderr, "nvio.tune_plot")
    assert not out.exists()


def test_a_result_too_large_to_be_one_is_not_read_into_memory(tmp_path, monkeypatch):
    # /dev/zero never ends: read whole, it would take all the memory there is.
    r = plot_module("/dev/zero", "-o", tmp_path / "out.png", address_space=2 << 30, timeout=60)
    assert r.returncode == 1
    assert "/dev/zero: over 64 MiB, too large" in one_error_line(r.stderr, "nvio.tune_plot")
    big = tmp_path / "big.json"
    big.write_text(" " * 2000 + "{}")
    monkeypatch.setattr(tune_plot, "MAX_RESULT_BYTES", 1000)
    with pytest.raises(tune_plot.TunePlotError, match="too large for a tune result"):
        tune_plot.load(str(big))


def test_dollar_signs_in_names_are_drawn_as_they_are(tmp_path):
    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed")
    result = json.loads(one_point(engine="x$\\frac{$"))
    result["directory"] = "$\\undefinedcommand$"
    src = tmp_path / "result.json"
    src.write_text(json.dumps(result))
    for name in ("out.png", "out.svg"):
        r = plot_module(src, "-o", tmp_path / name)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert (tmp_path / name).stat().st_size > 0
    assert "\\undefinedcommand" in (tmp_path / "out.svg").read_text()


def test_an_impossible_chosen_configuration_is_not_starred(tmp_path):
    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed")
    result = json.loads(one_point())
    result["best"] = {"read": {"options": {"engine": "io_uring", "block_size": 4096,
                                           "queue_depth": 1e300}, "median_gbps": 2.0}}
    src = tmp_path / "result.json"
    src.write_text(json.dumps(result))
    r = plot_module(src, "-o", tmp_path / "out.png")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # no overflow warnings


def test_an_image_left_unfinished_by_an_error_is_removed(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed")
    from matplotlib.figure import Figure

    def savefig(self, path, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", savefig)
    src = tmp_path / "result.json"
    src.write_text(one_point())
    out = tmp_path / "out.png"
    assert tune_plot.main([str(src), "-o", str(out)]) == 1
    assert one_error_line(capsys.readouterr().err, "nvio.tune_plot") == \
        f"nvio.tune_plot: error: {out}: No space left on device"
    assert not out.exists()
    out.write_bytes(b"theirs")  # an image that was there before is left alone
    assert tune_plot.main([str(src), "-o", str(out)]) == 1
    assert out.read_bytes() == b"\x89PNG half"


def test_ctrl_c_while_plotting_is_one_line_and_leaves_no_image(tmp_path):
    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed")
    points = []  # 32 panels of 24 lines: seconds of drawing to interrupt
    for mode in ("read", "write"):
        for e in range(16):
            for direct in ("on", "off"):
                for b in range(12):
                    for q in range(12):
                        points.append({"mode": mode, "median_gbps": 1 + b / 10 + q / 100,
                                       "options": {"engine": f"e{e}", "block_size": 4096 << b,
                                                   "queue_depth": 1 << q, "direct": direct}})
    src = tmp_path / "result.json"
    src.write_text(json.dumps({"points": points}))
    out = tmp_path / "out.png"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        ROOT, os.environ.get("PYTHONPATH")])))
    p = subprocess.Popen([PYTHON, "-m", "nvio.tune_plot", str(src), "-o", str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # matplotlib's font library is loaded once plot() has checked the points and draws.
        def drawing():
            try:
                with open(f"/proc/{p.pid}/maps") as f:
                    return "ft2font" in f.read()
            except OSError:  # it has ended: the poll() before the next call says so
                return False

        assert wait_for(lambda: p.poll() is not None or drawing(), timeout=60)
        assert p.poll() is None, "the plot was done before it could be interrupted"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # 130, or death by SIGINT: CPython ends that way when the interrupt went through C code that
    # runs Python source (PyRun_*, an extension's import), however main() handled it.
    assert p.returncode in (130, -signal.SIGINT), err
    assert one_error_line(err, "nvio.tune_plot") == "nvio.tune_plot: interrupted"
    assert not out.exists()


# ---- the console scripts ---------------------------------------------------------------------


def test_a_bundled_program_that_cannot_run_is_one_line(tmp_path, monkeypatch):
    program = tmp_path / "nvio"
    program.write_text("not a program\n")  # no #!: the kernel refuses it (ENOEXEC)
    program.chmod(0o755)
    monkeypatch.setattr(_cli, "BUNDLED", program)
    monkeypatch.setattr(sys, "argv", ["nvio", "--version"])
    with pytest.raises(SystemExit) as exit_:
        _cli.main()
    message = exit_.value.code
    assert isinstance(message, str) and "\n" not in message
    assert message == f"nvio: error: cannot run {program}: Exec format error"


def test_free_space_of_a_file_system_that_reports_no_size_is_not_judged(tmp_path):
    """ramfs (and tmpfs with size=0) report 0 blocks and 0 free: every run was refused there."""
    if os.geteuid() != 0:
        pytest.skip("mounting ramfs needs root")
    from nvio import ckpt_bench

    mnt = tmp_path / "ram"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount ramfs here")
    try:
        assert ckpt_bench.free_space(mnt) is None
        assert ckpt_bench.free_space(tmp_path) is not None
    finally:
        subprocess.run(["umount", str(mnt)])
