"""Helpers shared by the benchmark scripts in bench/ (fio_compare.py, tune_vs_grid.py,
python_bench.py): argument parsing, formatting, running commands and finding the nvio CLI,
and describing the machine a result was measured on.

The scripts are run as `python3 bench/<script>.py` from any directory; Python puts the script's
own directory first on sys.path, so `import benchlib` finds this file. Python 3 standard library
only, like the scripts.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

# The repository the scripts belong to (bench/..): where a built nvio and the git commit are.
REPO = Path(__file__).resolve().parent.parent


class Failure(Exception):
    """A fatal, explained error: printed as one line, exit status 1 (or .code)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def interrupt_on_sigterm() -> None:
    """Makes SIGTERM raise KeyboardInterrupt, like Ctrl-C, so that `finally` blocks and context
    managers (scratch files, the ramdisk) clean up when the script is killed politely."""
    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


def error_exit(prog: str, exc: BaseException) -> int:
    """For `except (Failure, KeyboardInterrupt) as e: return error_exit(prog, e)` in a main():
    prints "<prog>: error: <message>" for a Failure or "<prog>: interrupted" on stderr and
    returns the exit status, Failure.code or 130."""
    if isinstance(exc, Failure):
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.code
    print(f"{prog}: interrupted", file=sys.stderr)
    return 130


def drop_cache(path: "os.PathLike[str] | str") -> None:
    """Makes the next read of `path` cold: its dirty pages are written (fsync), then its pages
    dropped from the page cache (posix_fadvise DONTNEED)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- argument types (argparse `type=`) --------------------------------------------------------


def size_type(units: str = "KMGT", example: str = "1073741824", allow_zero: bool = False):
    """Returns an argparse type that reads a byte count: a number with an optional suffix from
    `units` (K, M, G, T = powers of 1024, either case, optionally followed by B or iB).

    `example` is the plain number the error message shows next to 1G and 512M; zero is refused
    unless allow_zero. The defaults are parse_size's; python_bench.py takes K/M/G only and
    allows zero."""
    pattern = re.compile(rf"\s*(\d+)\s*([{units}{units.lower()}]?)(i?[bB])?\s*")
    scale = " " + units

    def parse(text: str) -> int:
        m = pattern.fullmatch(text)
        if not m:
            raise argparse.ArgumentTypeError(
                f"expected a size like 1G, 512M or {example}, got {text!r}")
        value = int(m.group(1)) * 1024 ** scale.index((m.group(2) or " ").upper())
        if value <= 0 and not allow_zero:
            raise argparse.ArgumentTypeError("size must be positive")
        return value

    return parse


# A positive byte count with K/M/G/T suffixes, e.g. `--size 1G`.
parse_size = size_type()


def positive(conv, expected: str, expected_positive: str | None = None):
    """Returns an argparse type that converts with conv (int, float) and refuses values that are
    not > 0. The messages say "expected <expected>, got '<text>'" when conv fails and
    "expected <expected_positive>, ..." (default: the same words) when the value is not
    positive."""
    expected_positive = expected_positive or expected

    def parse(text: str):
        try:
            v = conv(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not v > 0:  # also refuses a float NaN
            raise argparse.ArgumentTypeError(f"expected {expected_positive}, got {text!r}")
        return v

    return parse


# A positive integer, e.g. `--rounds 5`.
positive_int = positive(int, "a positive integer")
# A positive number of seconds, e.g. `--budget 30`.
positive_seconds = positive(float, "a number of seconds", "a positive number of seconds")


# ---- formatting and logging -------------------------------------------------------------------


def ab_parser(description: str, file_help: str, rounds: int) -> argparse.ArgumentParser:
    """The arguments every A/B script of two nvio builds takes: the two CLIs, the existing file
    they take turns on, and how many alternations."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the first nvio CLI (the baseline)")
    ap.add_argument("--b", required=True, help="the second nvio CLI (the change)")
    ap.add_argument("--file", required=True, help=file_help)
    ap.add_argument("--rounds", type=int, default=rounds,
                    help=f"alternations (default {rounds})")
    return ap


def human(n: int, short: bool = False) -> str:
    """A byte count in the largest binary unit that divides it: "1 GiB", "512 KiB", "100 B";
    with short, "1G", "512K", "100" (the form the nvio CLI options take)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}" if short else f"{n // scale} {unit}iB"
    return str(n) if short else f"{n} B"


def fmt(v, spec: str) -> str:
    """format(v, spec), or "-" for a missing value (None): for table cells."""
    return "-" if v is None else format(v, spec)


def log(msg: str) -> None:
    """A progress or warning line on stderr (stdout carries the result)."""
    print(msg, file=sys.stderr, flush=True)


# ---- running commands -------------------------------------------------------------------------


def child_env() -> dict:
    """The environment without NVIO_* variables: a developer's NVIO_* settings would change what
    a child `nvio` runs."""
    return {k: v for k, v in os.environ.items() if not k.startswith("NVIO_")}


def run_cmd(cmd: list[str], timeout: float | None = None, check: bool = True,
            env: dict | None = None, short_error: bool = False) -> subprocess.CompletedProcess:
    """Runs cmd with its output captured as text and returns the CompletedProcess.

    Raises Failure when cmd cannot be started or runs past timeout (subprocess.run kills the
    child then, and also when we are interrupted), and, with check, when it exits non-zero.
    env: the child's environment (default: ours). The Failure names the command joined with
    spaces and gives its whole stderr (or stdout); with short_error, the command shell-quoted
    and only the last line of its output."""
    def show(c: list[str]) -> str:
        return shlex.join(c) if short_error else " ".join(c)

    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout, env=env)
    except FileNotFoundError:
        raise Failure(f"{cmd[0]}: command not found") from None
    except subprocess.TimeoutExpired:
        raise Failure(f"timed out after {timeout:.0f} s: {show(cmd)}") from None
    if check and proc.returncode != 0:
        output = (proc.stderr or proc.stdout).strip()
        if short_error:
            lines = output.splitlines()
            output = lines[-1] if lines else "no output"
        raise Failure(f"`{show(cmd)}` failed (exit {proc.returncode}): {output}")
    return proc


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def built_nvio(newest_of_all: bool = False) -> str | None:
    """The nvio CLI built in this checkout: build/bin/nvio; with newest_of_all, the most
    recently built of every build*/bin/nvio (build, build-bench, ...). None if there is none."""
    if not newest_of_all:
        default = REPO / "build" / "bin" / "nvio"
        return str(default) if _executable(default) else None
    found = [p for p in glob.glob(str(REPO / "build*" / "bin" / "nvio")) if _executable(Path(p))]
    return sorted(found, key=os.path.getmtime)[-1] if found else None


def find_nvio(explicit: str | None, code: int = 1) -> str:
    """The nvio CLI to run: explicit (--nvio: an executable file, or a name on PATH), else
    build/bin/nvio in the repo, else `nvio` on PATH. Raises Failure(code) if there is none."""
    if explicit:
        p = Path(explicit)
        if _executable(p):
            return str(p.resolve())
        found = shutil.which(explicit)
        if found:
            return found
        raise Failure(f"--nvio {explicit}: not an executable file", code=code)
    found = built_nvio() or shutil.which("nvio")
    if found:
        return found
    raise Failure(f"no nvio binary: neither {REPO / 'build' / 'bin' / 'nvio'} nor `nvio` on PATH; "
                  "build it or pass --nvio", code=code)


# ---- the machine a result comes from ----------------------------------------------------------


def _proc_field(path: str, key: str) -> str | None:
    # The value after "key" in /proc/cpuinfo or /proc/meminfo (first match), or None.
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def git_commit(mark_modified: bool = False) -> str | None:
    """The repo's short HEAD commit, with " (tracked files modified)" appended when
    mark_modified and the working tree differs; None without git or outside a checkout."""
    git = shutil.which("git")
    if not git:
        return None
    p = run_cmd([git, "-C", str(REPO), "rev-parse", "--short", "HEAD"], timeout=30, check=False)
    if p.returncode != 0:
        return None
    commit = p.stdout.strip()
    if mark_modified:
        dirty = run_cmd([git, "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                        timeout=30, check=False)
        if dirty.returncode == 0 and dirty.stdout.strip():
            commit += " (tracked files modified)"
    return commit


def filesystem_of(directory: Path) -> str | None:
    """"<device> (<type>)" of the filesystem holding directory, from `df -T`; None if unknown."""
    df = shutil.which("df")
    if not df:
        return None
    p = run_cmd([df, "-T", str(directory)], timeout=30, check=False)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or len(lines) < 2:
        return None
    f = lines[-1].split()
    return f"{f[0]} ({f[1]})" if len(f) > 1 else lines[-1]


def machine_info(nvio: str, directory: Path, fio: str | None = None, full: bool = False) -> dict:
    """What a result was measured on, for a report header and a JSON dump: date, CPUs, kernel,
    CPU model, the nvio binary, its --version and the repo commit, and the directory.

    fio: also fio's --version. full: also total memory, the Python version, the filesystem of
    directory, and whether tracked files differ from the commit. (Keys keep one order.)"""
    def version(exe: str) -> str:
        return run_cmd([exe, "--version"], timeout=30, check=False).stdout.strip()

    info = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "cpu": _proc_field("/proc/cpuinfo", "model name"),
    }
    if full:
        mem = _proc_field("/proc/meminfo", "MemTotal:")
        info["mem_total_kib"] = int(mem.split()[0]) if mem else None
    if fio is not None:
        info["fio_version"] = version(fio)
    info["nvio_version"] = version(nvio)
    info["nvio_binary"] = nvio
    info["nvio_commit"] = git_commit(mark_modified=full)
    if full:
        info["python"] = platform.python_version()
    info["dir"] = str(directory)
    if full:
        info["filesystem"] = filesystem_of(directory)
    return info


# ---- Python-level contenders in alternating rounds (safetensors, checkpoint, HF folders) -------


def direct_io_works(directory: "os.PathLike[str] | str") -> bool:
    """Whether an aligned 4 KiB O_DIRECT write and read work in directory (tmpfs before Linux 6.6
    and some FUSE file systems refuse them; nvio then reads through the page cache)."""
    import mmap

    probe = Path(directory) / f".nvio-bench-odirect-{os.getpid()}"
    buf = mmap.mmap(-1, 4096)  # page aligned
    try:
        fd = os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
        try:
            return os.pwritev(fd, [buf], 0) == 4096 and os.preadv(fd, [buf], 0) == 4096
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


def ram_backed(directory: "os.PathLike[str] | str") -> bool:
    """Whether directory is on tmpfs/ramfs: its files live in the page cache, so dropping their
    pages is impossible and a "cold" read is a warm one."""
    fs = filesystem_of(Path(directory)) or ""
    return fs.endswith("(tmpfs)") or fs.endswith("(ramfs)")


def drop_caches(paths) -> None:
    """drop_cache() for each of paths (files; a directory stands for the files in it)."""
    for p in paths:
        p = Path(p)
        for f in (sorted(x for x in p.iterdir() if x.is_file()) if p.is_dir() else [p]):
            drop_cache(f)


def warm(paths) -> None:
    """Reads every byte of paths (files or directories of files) through the page cache, so that
    the next read of them is warm."""
    for p in paths:
        p = Path(p)
        for f in (sorted(x for x in p.iterdir() if x.is_file()) if p.is_dir() else [p]):
            with open(f, "rb", buffering=0) as fh:
                while fh.read(16 << 20):
                    pass


def alternate(contenders: dict, rounds: int) -> dict:
    """Runs each contender (name -> callable returning the seconds it measured itself, so that it
    can leave its setup, e.g. dropping the page cache, untimed) once per round, `rounds` rounds,
    the order rotated by one each round so that a drift of a loaded machine hits all alike.
    Returns name -> list of seconds. A callable returning None (not available) is recorded as
    None and left out of the medians."""
    names = list(contenders)
    times: dict = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            times[name].append(contenders[name]())
            log(f"  round {r + 1}/{rounds} {name}: "
                + ("n/a" if times[name][-1] is None else f"{times[name][-1]:.3f} s"))
    return times


def median(values) -> "float | None":
    """The median of the values that are not None; None if there are none."""
    import statistics

    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def print_times(times: dict, nbytes: int) -> dict:
    """Prints one line per contender: median seconds, GB/s of nbytes, every round's seconds; and
    returns name -> median (None where n/a)."""
    med = {k: median(v) for k, v in times.items()}
    width = max(len(k) for k in times)
    for k, v in times.items():
        if med[k] is None:
            print(f"  {k:{width}s}      n/a")
            continue
        print(f"  {k:{width}s} {med[k]:7.3f} s {nbytes / med[k] / 1e9:6.2f} GB/s  (rounds: "
              + ", ".join("n/a" if t is None else f"{t:.3f}" for t in v) + ")")
    return med


def ratio_line(med: dict, ours: str, theirs: str, goal: "float | None" = None) -> str:
    """"ours / theirs: 2.31x (goal >= 2x: met)": how many times faster `ours` ran than
    `theirs` (their median seconds over ours), with the goal's verdict."""
    a, b = med.get(ours), med.get(theirs)
    if a is None or b is None:
        return f"  {ours} vs {theirs}: n/a"
    r = b / a
    verdict = "" if goal is None else f"  (goal >= {goal:g}x: {'met' if r >= goal else 'MISSED'})"
    return f"  {ours} vs {theirs}: {r:.2f}x{verdict}"


def nvio_read_seconds(nvio: str, path: "os.PathLike[str] | str", size: int) -> float:
    """Seconds of one `nvio bench --op read` of the first `size` bytes of the existing file path
    (one loop; the transfer alone, from the JSON report)."""
    import json

    out = run_cmd([nvio, "bench", "--file", str(path), "--op", "read", "--size", str(size),
                   "--loops", "1", "--json"], timeout=600, env=child_env()).stdout
    return json.loads(out)["results"][0]["seconds"]


def bench_header(what: str, directory: Path, nbytes: int, rounds: int) -> str:
    """The first line of a Python-level benchmark's report: what, how much, where (file system,
    O_DIRECT or not, RAM-backed), the commit and the load average (the machine may be shared)."""
    where = f"{directory} ({filesystem_of(directory) or 'unknown fs'}; O_DIRECT " \
            f"{'works' if direct_io_works(directory) else 'refused'}" \
            f"{'; RAM-backed: cold = warm' if ram_backed(directory) else ''})"
    return (f"{what}: {nbytes / 2**30:.3f} GiB, {rounds} rounds alternating, {where}, commit "
            f"{git_commit(mark_modified=True)}, load average "
            + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def profile_call(what: str, fn, top: int = 15) -> None:
    """Runs fn() once under cProfile and prints (stdout) the `top` functions by cumulative time:
    where a contender's time goes, for a goal it misses."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    print(f"--- cProfile of {what} (top {top} by cumulative time) ---")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))


def select(contenders: dict, only: "str | None") -> dict:
    """The contenders whose name contains one of the comma-separated words of `only` (all of
    them for None), e.g. --only "nvio.load cold,bench read"; Failure if none is left."""
    if not only:
        return contenders
    words = [w for w in only.split(",") if w]
    kept = {k: v for k, v in contenders.items() if any(w in k for w in words)}
    if not kept:
        raise Failure(f"--only {only!r} matches none of {list(contenders)}")
    return kept
