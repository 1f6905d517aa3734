#!/usr/bin/python3
"""nvio from Python: the binding's overhead on a large file, and small asynchronous reads per second.

1. Large file (default 1 GiB). The same file is read (and written) by `nvio bench --json` (the
   C++ CLI) and by `nvio.Handle.read` / `.write` from Python on one `nvio.empty_locked` buffer,
   with the same default options (the NVIO_* environment is cleared for both). Each round runs
   both, alternating which goes first, each doing --loops timed loops; the figure per tool is the
   median over all its timed loops (the CLI's `seconds_all`). Overhead = Python / CLI - 1.

2. Small reads. For each size (4 KiB, 16 KiB, 64 KiB), --small-ops reads at distinct offsets of a
   file (distinct slots, shuffled) into distinct slices of one locked buffer are queued with
   `aio_handle.async_pread` and collected by one `wait()`; operations per second = ops / (time
   from the first submission to the return of wait()). Median of --small-loops. The same with
   `nvio.Handle.read_async` + `wait_all()` for comparison.

Usage:
    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py [--dir /tmp/nvio-bench]
        [--size 1G] [--rounds 3] [--loops 3] [--nvio build/bin/nvio] [--json]

The scratch files are removed afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # python3 -P leaves bench/ off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, built_nvio, size_type

SMALL_SIZES = (4096, 16384, 65536)

for _name in [k for k in os.environ if k.startswith("NVIO_")]:
    del os.environ[_name]


def _import_nvio():
    try:
        import nvio  # noqa: F401
    except ImportError:
        for candidate in sorted(glob.glob(str(REPO / "build*" / "python"))):
            if glob.glob(os.path.join(candidate, "nvio", "_nvio*.so")):
                sys.path.insert(0, candidate)
                break
    import nvio

    return nvio


# K/M/G only, and zero allowed, as this script has always taken.
parse_size = size_type(units="KMG", example="4096", allow_zero=True)


def find_cli(given: str | None) -> str:
    if given:
        return given
    found = built_nvio(newest_of_all=True)
    if not found:
        sys.exit("python_bench: no nvio binary under build*/bin; build it or pass --nvio PATH")
    return found


def cli_run(cli: str, path: Path, size: int, op: str, loops: int) -> list[float]:
    r = subprocess.run([cli, "bench", "--json", "--file", str(path), "--size", str(size),
                        "--op", op, "--loops", str(loops)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"python_bench: nvio bench failed ({r.returncode}): {r.stderr.strip()}")
    result = json.loads(r.stdout)["results"][0]
    return list(result.get("seconds_all") or [result["seconds"]])


def python_run(nvio, handle, buf, path: Path, op: str, loops: int) -> list[float]:
    times = []
    for _ in range(loops):
        t0 = time.perf_counter()
        if op == "read":
            handle.read(buf, path)
        else:
            handle.write(buf, path)
        times.append(time.perf_counter() - t0)
    return times


def large(nvio, args, cli: str) -> list[dict]:
    path = Path(args.dir) / "python-bench-large.dat"
    buf = nvio.empty_locked(args.size)
    nvio._nvio.pattern_fill(buf.data_ptr(), args.size, 0, 12345)
    handle = nvio.Handle()
    handle.write(buf, path)  # lay the file out once: reads read real blocks, writes overwrite
    rows = []
    for op in ("read", "write"):
        py_all: list[float] = []
        cli_all: list[float] = []
        for rnd in range(args.rounds):
            order = ("py", "cli") if rnd % 2 == 0 else ("cli", "py")
            for who in order:
                if who == "py":
                    py_all += python_run(nvio, handle, buf, path, op, args.loops)
                else:
                    cli_all += cli_run(cli, path, args.size, op, args.loops)
        if op == "read":  # the last Python read must have brought back what was written
            first = nvio._nvio.pattern_first_mismatch(buf.data_ptr(), args.size, 0, 12345)
            if first is not None:
                sys.exit(f"python_bench: read-back mismatch at file offset {first}")
        py_med, cli_med = statistics.median(py_all), statistics.median(cli_all)
        rows.append({
            "op": op, "bytes": args.size, "engine": handle.engine,
            "python_s": py_med, "cli_s": cli_med,
            "python_gb_s": args.size / py_med / 1e9, "cli_gb_s": args.size / cli_med / 1e9,
            "overhead_pct": (py_med / cli_med - 1) * 100,
            "python_all": py_all, "cli_all": cli_all,
        })
    if not args.keep:
        path.unlink(missing_ok=True)
    return rows


def small(nvio, args) -> list[dict]:
    max_size = max(SMALL_SIZES)
    file_size = max(args.small_file, args.small_ops * max_size)
    path = Path(args.dir) / "python-bench-small.dat"
    fill = nvio.empty_locked(file_size)
    nvio._nvio.pattern_fill(fill.data_ptr(), file_size, 0, 777)
    nvio.Handle().write(fill, path)
    del fill
    rng = random.Random(1)
    rows = []
    for size in SMALL_SIZES:
        slots = file_size // size
        n = min(args.small_ops, slots)
        offsets = [s * size for s in rng.sample(range(slots), n)]
        buf = nvio.empty_locked(n * size)
        views = [buf[i * size:(i + 1) * size] for i in range(n)]
        h = nvio.aio_handle()
        handle = nvio.Handle()
        aio_rates, fut_rates = [], []
        for loop in range(args.small_loops + 1):  # the first loop warms up and is not counted
            t0 = time.perf_counter()
            for v, off in zip(views, offsets):
                h.async_pread(v, str(path), off)
            done = h.wait()
            t = time.perf_counter() - t0
            assert done == n, (done, n)
            if loop:
                aio_rates.append(n / t)
            t0 = time.perf_counter()
            for v, off in zip(views, offsets):
                handle.read_async(v, path, off)
            done = handle.wait_all()
            t = time.perf_counter() - t0
            assert done == n, (done, n)
            if loop:
                fut_rates.append(n / t)
        # spot-check the data of the last loop
        for i in (0, n // 2, n - 1):
            first = nvio._nvio.pattern_first_mismatch(views[i].data_ptr(), size, offsets[i], 777)
            if first is not None:
                sys.exit(f"python_bench: small read {i} mismatch at file offset {first}")
        aio_med, fut_med = statistics.median(aio_rates), statistics.median(fut_rates)
        rows.append({
            "size": size, "ops": n, "engine": handle.engine,
            "aio_handle_ops_s": aio_med, "aio_handle_mb_s": aio_med * size / 1e6,
            "handle_futures_ops_s": fut_med,
            "aio_handle_all": aio_rates, "handle_futures_all": fut_rates,
        })
    if not args.keep:
        path.unlink(missing_ok=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/nvio-bench", help="scratch directory (made if missing)")
    ap.add_argument("--size", type=parse_size, default=parse_size("1G"), help="large file size")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per op")
    ap.add_argument("--loops", type=int, default=3, help="timed loops per tool per round")
    ap.add_argument("--nvio", help="the nvio CLI (default: newest build*/bin/nvio)")
    ap.add_argument("--small-ops", type=int, default=4096, help="reads per small-read batch")
    ap.add_argument("--small-loops", type=int, default=5, help="timed batches per size")
    ap.add_argument("--small-file", type=parse_size, default=parse_size("256M"),
                    help="small-read file size (at least small-ops x 64 KiB)")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--skip-small", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the scratch files")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = ap.parse_args()

    nvio = _import_nvio()
    os.makedirs(args.dir, exist_ok=True)
    cli = None if args.skip_large else find_cli(args.nvio)
    rep = nvio.report(args.dir)
    out = {
        "nvio_version": nvio.__version__, "python": platform.python_version(),
        "kernel": rep["kernel"], "cpus": os.cpu_count(), "dir": args.dir,
        "direct_io": rep["dir"]["direct_io"], "auto_engine": rep["auto_engine"],
        "memlock_limit": rep["memlock_limit"], "cli": cli,
        "rounds": args.rounds, "loops": args.loops,
        "large": [] if args.skip_large else large(nvio, args, cli),
        "small": [] if args.skip_small else small(nvio, args),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"nvio {out['nvio_version']}  python {out['python']}  {out['kernel']}  "
          f"{out['cpus']} CPUs  dir {args.dir} (O_DIRECT {'yes' if out['direct_io'] else 'no'})")
    if out["large"]:
        print(f"\nLarge file, median of {args.rounds} x {args.loops} loops each, alternating:")
        print(f"{'op':6} {'bytes':>12} {'engine':>9} {'python s':>9} {'cli s':>9} "
              f"{'python GB/s':>12} {'cli GB/s':>9} {'overhead':>9}")
        for r in out["large"]:
            print(f"{r['op']:6} {r['bytes']:>12} {r['engine']:>9} {r['python_s']:>9.4f} "
                  f"{r['cli_s']:>9.4f} {r['python_gb_s']:>12.2f} {r['cli_gb_s']:>9.2f} "
                  f"{r['overhead_pct']:>+8.1f}%")
    if out["small"]:
        print(f"\nSmall asynchronous reads at distinct offsets, one wait per batch "
              f"(median of {args.small_loops}):")
        print(f"{'size':>6} {'ops':>6} {'engine':>9} {'aio_handle ops/s':>17} {'MB/s':>8} "
              f"{'Handle futures ops/s':>21}")
        for r in out["small"]:
            print(f"{r['size']:>6} {r['ops']:>6} {r['engine']:>9} {r['aio_handle_ops_s']:>17.0f} "
                  f"{r['aio_handle_mb_s']:>8.0f} {r['handle_futures_ops_s']:>21.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
