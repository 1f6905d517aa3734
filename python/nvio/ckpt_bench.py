"""``nvio ckpt-bench``: checkpoint save and load with nvio against PyTorch, cold cache.

A synthetic training checkpoint of about ``--size`` bytes (a transformer's weights in bf16 and its
Adam states in fp32: matrices, vectors and scalars, nested the way ``{"model": model.state_dict(),
"optimizer": optimizer.state_dict()}`` nests them) is saved and loaded in alternating rounds:

- save: ``nvio.save`` against ``torch.save`` into a file then ``os.fsync`` (a checkpoint is only
  saved once it is on the drive; ``nvio.save`` is durable and atomic by itself);
- load: ``nvio.load`` against ``torch.load``, each file's pages dropped first (``nvio.evict``),
  each load in a new Python process (as a job that starts from a checkpoint loads it: into memory
  that process never had);
- the same byte count written and read by ``nvio bench`` (the drive's speed with nvio's handle),
  where the ``nvio`` command is found (``--nvio``, the one bundled with this package, or PATH).

The first round checks (untimed) that every tensor ``nvio.load`` and ``torch.load`` return from
nvio's file equals the one saved. Medians, GB/s and the ratios are printed (``--json``: one JSON
object). The order of nvio and torch alternates between rounds, so that a drive's drift is shared.

    python -m nvio ckpt-bench --dir /nvme/scratch --size 4G --rounds 5
    nvio ckpt-bench ...        # the same: the command hands ckpt-bench to this module
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple

# Bytes of one parameter in the checkpoint: its bf16 weight and two fp32 Adam moments.
_BYTES_PER_PARAM = 2 + 4 + 4
# Bytes of one optimizer step counter (an fp32 scalar per parameter tensor).
_BYTES_PER_STEP = 4
# More layers than any transformer has; beyond it the tensor count, not --size, would decide the
# memory and the time a run takes (each layer is ten tensors, each with three more in the
# optimizer state, however small --size makes them).
_MAX_LAYERS = 1024

# Peak memory of a run, in copies of the checkpoint's bytes: the checkpoint, which this process
# holds to the end, and one loaded copy beside it (the untimed check loads in this process; each
# timed load is a child process; `nvio bench` holds a buffer of the same size), plus what the
# allocator keeps of the temporaries made while building the checkpoint (measured: 2.3 copies in
# all with torch 1.13 and glibc).
_PEAK_COPIES = 2.5
# What the interpreters take besides: this one and a load's child, each with torch imported
# (measured: 230 MiB each).
_INTERPRETER_BYTES = 2 * (256 << 20)
# Peak bytes in the scratch directory, in copies of the checkpoint: nvio's file and torch's, and
# a third file of the same size (nvio.save's new file before it replaces the last round's, or
# `nvio bench`'s file); the archives' headers are a small fraction of a copy on top.
_DISK_COPIES = 3.1


def parse_size(text: str) -> int:
    """A byte count as the nvio command reads one (core's parse_size: K, M, G, T suffixes, powers
    of 1024), at least 1."""
    from . import _nvio

    try:
        size = _nvio.parse_size(text, "--size")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if size == 0:
        raise argparse.ArgumentTypeError("must be at least 1 byte")
    return size


def checkpoint_shapes(total: int, layers: int) -> Dict[str, Tuple[int, ...]]:
    """The weights' shapes of synthetic_checkpoint(total, layers), by name; nothing allocated."""
    params = max(1, total // _BYTES_PER_PARAM)
    hidden = max(8, int(math.sqrt(params / (12 * layers + 8))) // 8 * 8)
    shapes = {"embed.weight": (8 * hidden, hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        for name in ("q", "k", "v", "o"):
            shapes[f"{p}attn.{name}.weight"] = (hidden, hidden)
        shapes[f"{p}mlp.up.weight"] = (4 * hidden, hidden)
        shapes[f"{p}mlp.down.weight"] = (hidden, 4 * hidden)
        for name in ("norm1", "norm2"):
            shapes[f"{p}{name}.weight"] = (hidden,)
            shapes[f"{p}{name}.bias"] = (hidden,)
    return shapes


def checkpoint_bytes(shapes: Dict[str, Tuple[int, ...]]) -> int:
    """The tensor bytes of a checkpoint with weights of these shapes (the smallest hidden size
    can make them more than --size asked for)."""
    return sum(_BYTES_PER_PARAM * math.prod(s) + _BYTES_PER_STEP for s in shapes.values())


def synthetic_checkpoint(torch: Any, total: int, layers: int, seed: int = 0) -> Dict[str, Any]:
    """A transformer's training checkpoint of about `total` bytes: per layer four attention
    matrices (h x h), two MLP matrices (4h x h, h x 4h) and four norm vectors (h), plus an
    embedding (8h x h); the weights bf16, each with fp32 exp_avg and exp_avg_sq and a step."""
    shapes = checkpoint_shapes(total, layers)
    g = torch.Generator().manual_seed(seed)
    model = {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}
    state = {
        i: {"step": torch.tensor(100.0),
            "exp_avg": torch.randn(s, generator=g) * 1e-3,
            "exp_avg_sq": torch.rand(s, generator=g) * 1e-6}
        for i, s in enumerate(shapes.values())
    }
    groups = [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
               "amsgrad": False, "params": list(range(len(shapes)))}]
    return {"model": model, "optimizer": {"state": state, "param_groups": groups}, "step": 100}


def tensors_of(obj: Any, prefix: str = "") -> Dict[str, Any]:
    """Every tensor of a nested checkpoint, by its path ("model/embed.weight")."""
    import torch

    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return {}
    out: Dict[str, Any] = {}
    for k, v in items:
        out.update(tensors_of(v, f"{prefix}/{k}" if prefix else str(k)))
    return out


def same_checkpoint(a: Any, b: Any) -> Optional[str]:
    """None when `b` holds the tensors of `a` with the same dtypes, shapes and bytes; else what
    differs first."""
    import torch

    ta, tb = tensors_of(a), tensors_of(b)
    if ta.keys() != tb.keys():
        return f"tensor paths differ: {sorted(ta.keys() ^ tb.keys())[:3]}"
    for k, x in ta.items():
        y = tb[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"{k}: {y.dtype} {tuple(y.shape)} where {x.dtype} {tuple(x.shape)} was saved"
        # Bytes, not values: bf16 and NaN compare as what they are on disk.
        if not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            return f"{k}: the bytes differ"
    return None


# A child that takes longer than this is taken for hung (a 1 GiB load or bench takes seconds).
_CHILD_TIMEOUT_S = 1800


def run_child(argv: Sequence[str], what: str, env: Optional[Dict[str, str]] = None
              ) -> "subprocess.CompletedProcess[str]":
    """Runs a child process to its end; RuntimeError naming `what` when it outlives the timeout
    (it is killed then). A signal that ends the run kills the child first, also one that comes
    while the child starts: the guard in force holds it until the child is known (a signal
    raised inside Popen() would leave a child nobody kills)."""
    proc: "Optional[subprocess.Popen[str]]" = None
    try:
        with _held_by_the_guard():
            proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env)
        stdout, stderr = proc.communicate(timeout=_CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        assert proc is not None
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"{what} did not finish in {_CHILD_TIMEOUT_S} s") from None
    except BaseException:
        if proc is not None:
            proc.kill()
            proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def find_nvio(explicit: Optional[str]) -> Optional[str]:
    """The `nvio` command for the bench reference: --nvio, the bundled one, or PATH's."""
    if explicit:
        return explicit
    from . import _cli

    try:
        return str(_cli.bundled_command())
    except _cli.BundledCommandMissing:
        return shutil.which("nvio")


def nvio_bench(command: str, op: str, size: int, directory: Path) -> float:
    """Seconds of one `nvio bench --op OP` of `size` bytes in `directory` (it drops the pages of
    its file before a read itself)."""
    r = run_child([command, "bench", "--dir", str(directory), "--size", str(size), "--op", op,
                   "--loops", "1", "--json"], f"nvio bench --op {op}")
    if r.returncode != 0:
        raise RuntimeError(f"nvio bench --op {op} failed ({r.returncode}): {r.stderr.strip()}")
    try:
        return float(json.loads(r.stdout)["results"][0]["seconds"])
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise RuntimeError(f"nvio bench --op {op} printed no result: {e!r}") from None


# A load in a process of its own, as a job that starts from a checkpoint does: in the process that
# made and freed the other loads' memory, a load would get memory the allocator kept (glibc keeps
# freed tensors of up to 32 MiB) or memory just given back to the kernel, and the order of the
# loads would decide which one pays for fresh memory.
_LOAD_CHILD = """
import sys, time
import torch, nvio
path, which = sys.argv[1], sys.argv[2]
nvio.evict(path)
t0 = time.perf_counter()
# Files this run wrote itself: both loads unpickle them the same way, without the restricted
# unpickler (torch 1.13's refuses the floats an optimizer's state holds).
load = nvio.load if which == "nvio" else torch.load
loaded = load(path, weights_only=False)
print(time.perf_counter() - t0)
"""


def load_in_child(which: str, path: Path) -> float:
    """Seconds of one cold load of `path` by `which` ("nvio" or "torch") in a new interpreter."""
    import nvio

    env = dict(os.environ)
    root = str(Path(nvio.__file__).resolve().parent.parent)  # the same nvio package
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    what = f"the {which} load of {path}"
    r = run_child([sys.executable, "-c", _LOAD_CHILD, str(path), which], what, env)
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines() or ["(no message)"]
        raise RuntimeError(f"{what} failed ({r.returncode}): {lines[-1]}")
    try:
        return float(r.stdout.split()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"{what} printed no time: {r.stdout!r}") from None


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _human(n: float) -> str:
    """Bytes as "1.5 GiB (1610612736 bytes)": the unit to read, the count to check."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({int(n)} bytes)"
    return f"{int(n)} bytes"


def available_memory() -> Optional[int]:
    """The kernel's estimate of the memory a new allocation can get without swapping
    (MemAvailable in /proc/meminfo); None where it does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB meaning KiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def free_space(path: Path) -> Optional[int]:
    """Bytes an unprivileged writer can still put on the file system of `path`; None where it
    cannot be asked."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    if st.f_blocks == 0:  # ramfs, tmpfs with size=0: no size to judge by
        return None
    return st.f_bavail * st.f_frsize


def existing_ancestor(path: Path) -> Path:
    """`path` itself, or its nearest ancestor that exists (a dangling link counts: it is there)."""
    while not os.path.lexists(path) and path.parent != path:
        path = path.parent
    return path


def check_dir(directory: Path) -> Optional[str]:
    """None when --dir is a directory, or can be made one; else why not."""
    there = existing_ancestor(directory)
    if not there.is_dir():
        if there == directory:
            return f"--dir {directory}: not a directory"
        return f"--dir {directory}: {there} is not a directory"
    return None


def check_resources(args: argparse.Namespace, nbytes: int) -> Optional[str]:
    """None when the machine has the memory, and --dir the space, for a checkpoint of `nbytes`;
    else what is missing (run before anything is allocated: more than the memory there is ends
    in the kernel's OOM killer, which may pick another process than this one)."""
    what = f"--size {_human(args.size)}"
    if nbytes > args.size * 1.1:  # the smallest hidden size makes a bigger checkpoint
        what += f" with --layers {args.layers} (a checkpoint of {_human(nbytes)})"
    need = int(_PEAK_COPIES * nbytes) + _INTERPRETER_BYTES
    have = available_memory()
    if have is not None and need > have:
        return (f"{what} needs about {_human(need)} of memory ({_PEAK_COPIES} times the "
                f"checkpoint: it, a loaded copy and allocator slack; and two Python processes) "
                f"and {_human(have)} is available (MemAvailable in /proc/meminfo); use a smaller "
                f"--size")
    need = int(_DISK_COPIES * nbytes)
    where = existing_ancestor(args.dir)
    have = free_space(where)
    if have is not None and need > have:
        return (f"{what} needs about {_human(need)} free in --dir {args.dir} (nvio's file, "
                f"torch's and a third of the same size) and {_human(have)} is free on {where}'s "
                f"file system; use a smaller --size or another --dir")
    return None


def make_dirs(directory: Path, made: List[Path]) -> None:
    """Makes `directory` and its missing parents, appending each one made to `made` (outermost
    first) as it is made, so that a failure part way still leaves the list to remove."""
    missing = []
    path = directory
    while not os.path.lexists(path) and path.parent != path:
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except OSError as e:
            raise RuntimeError(f"--dir {directory}: cannot make {path}: "
                               f"{e.strerror or e}") from None
        made.append(path)


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived while a run was in progress (a KeyboardInterrupt, so
    that the code it passes through cancels and cleans up as it does for Ctrl-C)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# The signals that end a run with its scratch directory removed (a terminal closed, a job
# scheduler's or `timeout`'s TERM); their default action would end the process on the spot.
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# The guard whose handlers are in force (signal handlers are the process's, so is this).
_GUARD: "Optional[SignalGuard]" = None


def _held_by_the_guard() -> ContextManager[None]:
    """The guard's held(), or nothing to hold when no guard is in force."""
    return _GUARD.held() if _GUARD is not None else contextlib.nullcontext()


class SignalGuard:
    """While entered (in the main thread), SIGINT, SIGTERM and SIGHUP raise Interrupted;
    ``held()`` puts one that arrives off to the end of the block, and once one was raised the
    others are ignored, so that the cleanup they start runs to its end. A signal ignored when
    the guard is entered (nohup's SIGHUP) stays ignored; the previous handlers are restored on
    exit."""

    def __init__(self) -> None:
        self.previous: Dict[int, Any] = {}
        self.pending: Optional[int] = None
        self.holding = 0
        self.fired = False

    def __enter__(self) -> "SignalGuard":
        global _GUARD
        if threading.current_thread() is threading.main_thread():
            _GUARD = self
            for signum in _SIGNALS:
                old = signal.getsignal(signum)
                if old is signal.SIG_IGN:
                    continue
                self.previous[signum] = signal.SIG_DFL if old is None else old
                signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        global _GUARD
        if _GUARD is self:
            _GUARD = None
        for signum, old in self.previous.items():
            signal.signal(signum, old)
        self.previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.fired:
            return
        if self.holding:
            self.pending = signum
            return
        self.fired = True
        raise Interrupted(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
            if not self.holding and self.pending is not None and not self.fired:
                self.fired = True
                raise Interrupted(self.pending)


def run(args: argparse.Namespace, out: Any = None,
        signals: Optional[SignalGuard] = None) -> Dict[str, Any]:
    """Runs the rounds args asks for and prints the result to `out` (default: stdout).
    `signals`: the guard main() runs it under, whose held() keeps the making and removing of the
    scratch directory whole."""
    import torch

    import nvio

    held = signals.held if signals is not None else contextlib.nullcontext
    ckpt = synthetic_checkpoint(torch, args.size, args.layers)
    tensors = tensors_of(ckpt)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    command = None if args.no_bench else find_nvio(args.nvio)
    made: List[Path] = []  # --dir and the parents it lacked: removed at the end when empty
    work: Optional[Path] = None

    def clean_up() -> None:
        with held():
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
            for path in reversed(made):
                try:
                    path.rmdir()
                except OSError:
                    break  # something was put there meanwhile: it stays, and so do its parents

    try:
        with held():
            make_dirs(args.dir, made)
            # A directory of its own inside --dir, the only thing removed at the end.
            work = Path(tempfile.mkdtemp(prefix="nvio-ckpt-bench-", dir=args.dir))
    except BaseException:
        clean_up()
        raise
    mine, theirs = work / "nvio.pt", work / "torch.pt"

    def torch_save() -> None:
        with open(theirs, "wb") as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())

    times: Dict[str, List[float]] = {k: [] for k in (
        "nvio.save", "torch.save+fsync", "nvio.load", "torch.load", "bench write", "bench read")}
    try:
        for r in range(args.rounds):
            saves = [("nvio.save", lambda: nvio.save(ckpt, mine)),
                     ("torch.save+fsync", torch_save)]
            for name, fn in (saves if r % 2 == 0 else saves[::-1]):
                times[name].append(timed(fn))
            if r == 0:  # untimed: what the timed loads read is the checkpoint saved
                for who, load in (("nvio.load", nvio.load), ("torch.load", torch.load)):
                    # one loaded copy at a time; weights_only=False as in _LOAD_CHILD
                    problem = same_checkpoint(ckpt, load(mine, weights_only=False))
                    if problem:
                        raise RuntimeError(f"{who} of nvio's file returned another checkpoint: "
                                           f"{problem}")
            loads = [("nvio.load", "nvio", mine), ("torch.load", "torch", theirs)]
            for name, which, path in (loads if r % 2 == 0 else loads[::-1]):
                times[name].append(load_in_child(which, path))
            if command:
                times["bench write"].append(nvio_bench(command, "write", nbytes, work))
                times["bench read"].append(nvio_bench(command, "read", nbytes, work))
    finally:
        clean_up()

    out = out if out is not None else sys.stdout
    med = {k: statistics.median(v) for k, v in times.items() if v}
    result: Dict[str, Any] = {
        "dir": str(args.dir), "bytes": nbytes, "tensors": len(tensors), "rounds": args.rounds,
        "torch": torch.__version__, "nvio": nvio.__version__, "nvio_command": command,
        "seconds": times, "median_s": med,
        "gb_per_s": {k: nbytes / v / 1e9 for k, v in med.items()},
        "ratios": {"save_vs_torch": med["torch.save+fsync"] / med["nvio.save"],
                   "load_vs_torch": med["torch.load"] / med["nvio.load"]},
    }
    if command:
        result["ratios"]["save_vs_bench_write"] = med["bench write"] / med["nvio.save"]
        result["ratios"]["load_vs_bench_read"] = med["bench read"] / med["nvio.load"]
    if args.json:
        print(json.dumps(result, indent=1), file=out)
        return result
    g = result["gb_per_s"]
    print(f"checkpoint of {nbytes / 2**20:.1f} MiB in {len(tensors)} tensors, {args.rounds} "
          f"round(s), {args.dir}, torch {torch.__version__}, cold cache, medians", file=out)
    for name in times:
        if name in med:
            print(f"  {name:17s} {med[name]:8.3f} s  {g[name]:6.2f} GB/s", file=out)
    ratios = result["ratios"]
    print(f"  save: nvio {ratios['save_vs_torch']:.2f}x torch.save+fsync", end="", file=out)
    print(f", {ratios['save_vs_bench_write']:.2f}x nvio bench write" if command else "", file=out)
    print(f"  load: nvio {ratios['load_vs_torch']:.2f}x torch.load", end="", file=out)
    print(f", {ratios['load_vs_bench_read']:.2f}x nvio bench read" if command else "", file=out)
    if not command and not args.no_bench:
        print("  (no nvio command found for the bench reference: --nvio PATH)", file=out)
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nvio ckpt-bench",
        description="Save and load a synthetic training checkpoint with nvio and with PyTorch "
                    "(cold cache) and print both with the ratios.")
    p.add_argument("--dir", type=Path, required=True,
                   help="directory on the drive to measure (a scratch directory is made in it "
                        "and removed; a missing DIR is made, and removed again at the end)")
    p.add_argument("--size", type=parse_size, default=1 << 30,
                   help="bytes of tensors (default 1G; the figures mean most from 1G up); a run "
                        "needs about 2.5 times this in memory and 3 times in DIR, and is refused "
                        "without them")
    p.add_argument("--layers", type=int, default=12,
                   help=f"transformer layers (default 12, at most {_MAX_LAYERS})")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--nvio", help="the nvio command for the `nvio bench` reference")
    p.add_argument("--no-bench", action="store_true", help="skip the `nvio bench` reference")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _refuse(message: str) -> int:
    """One line on stderr and the exit status of bad arguments (argparse's error, without the
    usage it prints first)."""
    print(f"nvio ckpt-bench: error: {message}", file=sys.stderr)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Exit status: 0, 1 on a failure (one line on stderr), 2 on bad arguments, 128 + the signal
    number when SIGINT, SIGTERM or SIGHUP ended the run (its scratch directory removed)."""
    args = parser().parse_args(argv)
    if args.layers < 1 or args.rounds < 1:
        parser().error("--layers and --rounds must be at least 1")
    if args.layers > _MAX_LAYERS:
        return _refuse(f"--layers {args.layers}: at most {_MAX_LAYERS}")
    if args.nvio and not args.no_bench:
        found = shutil.which(args.nvio)
        if found is None:
            return _refuse(f"--nvio {args.nvio}: no such executable")
        args.nvio = found
    problem = check_dir(args.dir) or check_resources(
        args, checkpoint_bytes(checkpoint_shapes(args.size, args.layers)))
    if problem:
        return _refuse(problem)
    try:
        with SignalGuard() as signals:
            try:
                import torch  # noqa: F401
            except ImportError as e:
                print(f"nvio ckpt-bench: error: PyTorch is needed and cannot be imported: {e}",
                      file=sys.stderr)
                return 1
            run(args, signals=signals)
    except Interrupted as e:
        print(f"nvio ckpt-bench: interrupted by {signal.Signals(e.signum).name}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("nvio ckpt-bench: interrupted", file=sys.stderr)
        return 130
    except (OSError, RuntimeError, ValueError) as e:
        print(f"nvio ckpt-bench: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 (a command: one line, never a traceback)
        print(f"nvio ckpt-bench: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
