"""The console scripts and `python -m nvio` (nvio._cli): what they hand the bundled program, the
error when there is none, and the program itself as the build tree holds it. The installed
package is checked end to end by tests/pip."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import nvio
from nvio import _cli


@pytest.fixture
def fake_program(tmp_path, monkeypatch):
    """A stand-in for the bundled program, and the execv calls made instead of running it."""
    program = tmp_path / "nvio"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setattr(_cli, "BUNDLED", program)
    calls = []

    def execv(path, argv):
        calls.append((path, argv))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    return program, calls


@pytest.mark.parametrize("entry, argv, forwarded", [
    (_cli.main, ["report", "--json"], ["report", "--json"]),
    (_cli.ds_io, ["--help"], ["ds-io", "--help"]),
    (_cli.ds_nvme_tune, ["--nvme_dir", "/x"], ["ds-nvme-tune", "--nvme_dir", "/x"]),
])
def test_entry_points_forward_their_arguments(fake_program, monkeypatch, entry, argv, forwarded):
    program, calls = fake_program
    monkeypatch.setattr(sys, "argv", ["script", *argv])
    with pytest.raises(SystemExit):
        entry()
    assert calls == [(program, ["nvio", *forwarded])]


def test_missing_program_is_one_line_naming_where_it_looked(tmp_path, monkeypatch):
    missing = tmp_path / "no" / "nvio"
    monkeypatch.setattr(_cli, "BUNDLED", missing)
    with pytest.raises(_cli.BundledCommandMissing) as err:
        _cli.bundled_command()
    assert isinstance(err.value, FileNotFoundError) and str(missing) in str(err.value)
    monkeypatch.setattr(sys, "argv", ["nvio", "--version"])
    with pytest.raises(SystemExit) as exit_:
        _cli.main()
    message = exit_.value.code
    assert isinstance(message, str)  # sys.exit(str): status 1, the text on stderr
    assert message.startswith("nvio: error:") and str(missing) in message
    assert "\n" not in message


def test_a_file_that_is_not_executable_is_missing(tmp_path, monkeypatch):
    plain = tmp_path / "nvio"
    plain.write_text("")
    plain.chmod(0o644)
    monkeypatch.setattr(_cli, "BUNDLED", plain)
    with pytest.raises(_cli.BundledCommandMissing):
        _cli.bundled_command()


def test_python_m_nvio_runs_the_program_of_the_build_tree(tmp_path):
    if not os.access(_cli.BUNDLED, os.X_OK):
        pytest.skip(f"the bundled program is not built here: {_cli.BUNDLED}")
    package_root = Path(nvio.__file__).resolve().parents[1]
    # No nvio on PATH, so the bundled program is the one that runs; the loader's path is kept for
    # builds whose libraries lie outside the system's (the GPU machine's packed build).
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package_root), "NVIO_CONFIG": "none",
           **{k: os.environ[k] for k in ("LD_LIBRARY_PATH",) if k in os.environ}}
    r = subprocess.run([sys.executable, "-m", "nvio", "--version"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=60)
    assert (r.returncode, r.stdout) == (0, f"nvio {nvio.__version__}\n"), r.stderr
    # Its own exit status and error line, not Python's.
    r = subprocess.run([sys.executable, "-m", "nvio", "bench", "--size", "1M"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("nvio: error:"), r.stderr
