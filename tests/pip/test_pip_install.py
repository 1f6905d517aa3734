"""`pip install .` into a fresh virtual environment gives the `nvio` commands, which work with no
build tree: the package's bundled program (nvio/_bin/nvio) runs from a directory outside the
source tree with no LD_LIBRARY_PATH or PYTHONPATH, through each console script and `python -m
nvio`, and moves bytes that verify.

Offline, as pyproject.toml says: Debian's setuptools and wheel (--system-site-packages,
--no-build-isolation, --no-index). The install builds the extension and the command from a copy
of the source tree (so that setuptools' in-tree build/ cannot land in a CMake build directory of
the checkout); it takes minutes, or seconds under ctest, which packages its own build tree's
extension and command (NVIO_PREBUILT_BUILD_DIR) instead of compiling them again. Skipped, with the
reason, where venv, pip or setuptools are missing."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"
# At the top of the source tree only: build directories, virtual environments, VCS data.
SKIPPED_AT_TOP = {".git", ".venv", "dist", ".whl", ".gl"}


def skip_reason():
    if not os.access(PYTHON, os.X_OK):
        return f"{PYTHON} is missing"
    # setuptools first: imported after pip (which imports distutils), it refuses to load.
    probe = subprocess.run([PYTHON, "-c", "import setuptools, wheel, pip, venv"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"setuptools, wheel, pip or venv cannot be imported by {PYTHON}: {last}"
    return None


def ignore_top(directory, names):
    if Path(directory) != SOURCE:
        return {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    return {n for n in names
            if n in SKIPPED_AT_TOP or n.startswith("build") or n == "__pycache__"
            or n.endswith(".egg-info")}


def clean_env(venv, **extra):
    """No LD_LIBRARY_PATH, PYTHONPATH or NVIO_* from the caller; the venv first on PATH."""
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "NVIO_CONFIG": "none", "LANG": "C.UTF-8"}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("pip")
    source = root / "src"
    shutil.copytree(SOURCE, source, ignore=ignore_top, symlinks=True)
    venv = root / "venv"
    subprocess.run([PYTHON, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True)
    env = clean_env(venv)
    # ctest passes its build tree: the install packages what that build compiled (setup.py's
    # NVIO_PREBUILT_BUILD_DIR) rather than compiling the project a second time on CI's two cores.
    # Run by hand without it, the install compiles from the sources as a user's pip does.
    if os.environ.get("NVIO_PREBUILT_BUILD_DIR"):
        env["NVIO_PREBUILT_BUILD_DIR"] = os.environ["NVIO_PREBUILT_BUILD_DIR"]
    if shutil.which("ccache"):
        # Repeated runs compile the same copy at a new path: relative paths let ccache hit.
        env.update(CMAKE_CXX_COMPILER_LAUNCHER="ccache", CMAKE_C_COMPILER_LAUNCHER="ccache",
                   CCACHE_BASEDIR=str(root))
        if "CCACHE_DIR" in os.environ:
            env["CCACHE_DIR"] = os.environ["CCACHE_DIR"]
    r = subprocess.run([f"{venv}/bin/python", "-m", "pip", "install", "--no-build-isolation",
                        "--no-deps", "--no-index", str(source)],
                       capture_output=True, text=True, env=env, cwd=root, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    # The installed package alone: the copy of the sources goes, and nothing may need it.
    shutil.rmtree(source)
    work = root / "work"
    work.mkdir()
    return venv, work


def run(installed, *argv, **kwargs):
    venv, work = installed
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          env=clean_env(venv), cwd=work, timeout=120, **kwargs)


def site_packages(venv):
    r = subprocess.run([f"{venv}/bin/python", "-c", "import nvio, os; print(os.path.dirname("
                        "nvio.__file__))"], capture_output=True, text=True, env=clean_env(venv),
                       cwd="/")
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip())


def test_the_bundled_program_is_self_contained(installed):
    venv, _ = installed
    package = site_packages(venv)
    assert package.is_relative_to(venv), package  # the venv's copy, not a source tree's
    program = package / "_bin" / "nvio"
    assert os.access(program, os.X_OK), program
    libs = subprocess.run(["ldd", str(program)], capture_output=True, text=True).stdout
    assert "libnvio" not in libs and "not found" not in libs, libs


def test_version_through_every_way_in(installed):
    venv, _ = installed
    want = run(installed, f"{venv}/bin/nvio", "--version")
    assert want.returncode == 0, want.stderr
    assert want.stdout.startswith("nvio 0."), want.stdout
    for argv in ([f"{venv}/bin/python", "-m", "nvio", "--version"], ["nvio", "--version"]):
        r = run(installed, *argv)
        assert (r.returncode, r.stdout) == (0, want.stdout), (argv, r.stderr)


def test_report(installed):
    _, work = installed
    r = run(installed, "nvio", "report", "--json", "--dir", work)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["version"] and doc["engines"], doc


def test_bench_verifies_its_bytes(installed):
    _, work = installed
    target = work / "made" / "by" / "bench"
    r = run(installed, "nvio", "bench", "--dir", target, "--size", "1M", "--loops", "1",
            "--verify", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(x["op"], x["verified"]) for x in doc["results"]] == [("write", True),
                                                                   ("read", True)]


def test_exit_status_and_errors_are_the_programs(installed):
    r = run(installed, "nvio", "bench", "--size", "1M")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("nvio: error:") and "--dir" in r.stderr, r.stderr


@pytest.mark.parametrize("script, subcommand", [("nvio-ds-io", "ds-io"),
                                                ("nvio-ds-nvme-tune", "ds-nvme-tune")])
def test_compatibility_scripts_are_their_subcommand(installed, script, subcommand):
    for args in (["--help"], ["--no-such-flag"]):
        via = run(installed, script, *args)
        direct = run(installed, "nvio", subcommand, *args)
        assert (via.returncode, via.stdout, via.stderr) == (
            direct.returncode, direct.stdout, direct.stderr), args
    refused = run(installed, script, "--no-such-flag")
    assert refused.returncode == 2 and refused.stderr.startswith("nvio: error:"), refused.stderr
    if subcommand in run(installed, "nvio", "--help").stdout:
        # The subcommand's own help, not the program's.
        helped = run(installed, script, "--help")
        assert helped.returncode == 0 and f"Usage: nvio {subcommand}" in helped.stdout, helped.stdout


def test_ckpt_bench_through_the_script_and_the_bundled_program(installed):
    # The console script runs nvio.ckpt_bench in its own interpreter; the bundled program hands
    # ckpt-bench to the Python it was built with, finding the package it sits in (nvio/_bin/..).
    venv, work = installed
    program = site_packages(venv) / "_bin" / "nvio"
    scratch = work / "ckpt"
    scratch.mkdir()
    for argv in (["nvio"], [program]):
        r = run(installed, *argv, "ckpt-bench", "--dir", scratch, "--size", "1M", "--layers", "1",
                "--rounds", "1", "--no-bench", "--json")
        assert r.returncode == 0, (argv, r.stderr)
        assert json.loads(r.stdout)["tensors"] == 44
    assert list(scratch.iterdir()) == []
