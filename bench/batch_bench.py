#!/usr/bin/python3
"""Many tensors to and from one file: one batch against one call per tensor, and `nvio bench`.

--count tensors (default 1,000) of random sizes from --min-size to --max-size (default 64 KiB to
4 MiB, multiples of --granularity, default 4 KiB; seeded by --seed) are packed back to back in
one file. Each tensor is a torch view of one `nvio.empty_locked` buffer, so every Python variant
moves the same memory. Per op (write, then read), each round runs, in an order that rotates from
one round to the next:

  batch    one `Handle.write_batch` / `read_batch` of every tensor
  calls    one `Handle.write` / `read` per tensor
  async    one `Handle.write_async` / `read_async` per tensor, then `wait_all()`
  cli      `nvio bench --file F --size TOTAL --op write|read --loops 1` (the C++ CLI, one
           request of the same total bytes)

GB/s (10^9 bytes) of each is the median over the rounds; the ratios are batch/calls, batch/async
and batch/cli. Every tool uses the default options: the NVIO_* variables are cleared and
NVIO_CONFIG=none (no saved profile). After the timed rounds, an untimed write_batch and
read_batch into the zeroed buffer check every byte against the pattern (each 8-byte word holds
its own file offset). The scratch file is removed afterwards unless --keep.

Usage:
    PYTHONPATH=build/python /usr/bin/python3 bench/batch_bench.py [--dir /tmp/nvio-bench]
        [--count 1000] [--rounds 3] [--seed 1] [--nvio build/bin/nvio] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # python3 -P leaves bench/ off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (Failure, REPO, error_exit, filesystem_of, find_nvio, human, log,  # noqa: E402
                      positive_int, run_cmd, size_type)

for _name in [k for k in os.environ if k.startswith("NVIO_")]:
    del os.environ[_name]
os.environ["NVIO_CONFIG"] = "none"  # the same defaults for the Python handle and the CLI

METHODS = ("batch", "calls", "async", "cli")
PATTERN_SEED = 4242


def _import_nvio():
    try:
        import nvio  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "build" / "python"))
    import nvio

    return nvio


def layout(args) -> "list[tuple[int, int]]":
    """(file offset, size) of each tensor, packed back to back."""
    rng = random.Random(args.seed)
    g = args.granularity
    out, offset = [], 0
    for _ in range(args.count):
        size = rng.randrange(args.min_size // g, args.max_size // g + 1) * g
        out.append((offset, size))
        offset += size
    return out


def python_run(h, method: str, op: str, tensors, offsets, path: Path) -> float:
    t0 = time.perf_counter()
    if method == "batch":
        items = list(zip(tensors, offsets))
        if op == "write":
            h.write_batch(items, path)
        else:
            h.read_batch(items, path)
    elif method == "calls":
        call = h.write if op == "write" else h.read
        for t, off in zip(tensors, offsets):
            call(t, path, off)
    else:
        call = h.write_async if op == "write" else h.read_async
        for t, off in zip(tensors, offsets):
            call(t, path, off)
        h.wait_all()
    return time.perf_counter() - t0


def cli_run(cli: str, op: str, path: Path, total: int) -> float:
    p = run_cmd([cli, "bench", "--json", "--file", str(path), "--size", str(total), "--op", op,
                 "--loops", "1", "--seed", str(PATTERN_SEED)], timeout=600)
    return float(json.loads(p.stdout)["results"][0]["seconds"])


def measure(nvio, args, cli: str) -> dict:
    extents = layout(args)
    offsets = [off for off, _ in extents]
    total = extents[-1][0] + extents[-1][1]
    path = Path(args.dir) / "batch-bench.dat"
    buf = nvio.empty_locked(total)
    nvio._nvio.pattern_fill(buf.data_ptr(), total, 0, PATTERN_SEED)  # file offset = buffer offset
    tensors = [buf[off:off + size] for off, size in extents]
    h = nvio.Handle()
    log(f"batch_bench: {args.count} tensors, {total / 1e9:.2f} GB, engine {h.engine}, {path}")
    try:
        h.write(buf, path)  # lay the file out once: reads read real blocks, writes overwrite
        rows = []
        for op in ("write", "read"):
            times: "dict[str, list[float]]" = {m: [] for m in METHODS}
            for rnd in range(args.rounds):
                order = METHODS[rnd % len(METHODS):] + METHODS[:rnd % len(METHODS)]
                for method in order:
                    if method == "cli":
                        t = cli_run(cli, op, path, total)
                    else:
                        t = python_run(h, method, op, tensors, offsets, path)
                    times[method].append(t)
                    log(f"  {op:5} round {rnd + 1} {method:5} {total / t / 1e9:6.2f} GB/s")
            gbps = {m: total / statistics.median(ts) / 1e9 for m, ts in times.items()}
            rows.append({
                "op": op, "gb_s": gbps,
                "batch_over_calls": gbps["batch"] / gbps["calls"],
                "batch_over_async": gbps["batch"] / gbps["async"],
                "batch_over_cli": gbps["batch"] / gbps["cli"],
                "seconds_all": times,
            })
        # Untimed check of the bytes: the batch writes the pattern and reads it back into zeros.
        h.write_batch(list(zip(tensors, offsets)), path)
        buf.zero_()
        h.read_batch(list(zip(tensors, offsets)), path)
        first = nvio._nvio.pattern_first_mismatch(buf.data_ptr(), total, 0, PATTERN_SEED)
        if first is not None:
            raise Failure(f"read-back mismatch at file offset {first}")
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    sizes = [s for _, s in extents]
    return {
        "nvio_version": nvio.__version__, "engine": h.engine, "options": h.options,
        "cpus": os.cpu_count(), "dir": str(args.dir), "filesystem": filesystem_of(Path(args.dir)),
        "cli": cli, "count": args.count, "bytes": total, "min_tensor": min(sizes),
        "max_tensor": max(sizes), "granularity": args.granularity, "seed": args.seed,
        "rounds": args.rounds, "verified": True, "results": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/nvio-bench", help="scratch directory (made if missing)")
    ap.add_argument("--count", type=positive_int, default=1000, help="tensors")
    ap.add_argument("--min-size", type=size_type(), default=64 << 10, help="smallest tensor")
    ap.add_argument("--max-size", type=size_type(), default=4 << 20, help="largest tensor")
    ap.add_argument("--granularity", type=size_type(), default=4096,
                    help="tensor sizes are multiples of this (1 for any size)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the tensor sizes")
    ap.add_argument("--rounds", type=positive_int, default=3, help="alternating rounds per op")
    ap.add_argument("--nvio", help="the nvio CLI (default: build/bin/nvio, else nvio on PATH)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch file")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    try:
        if args.min_size > args.max_size or args.min_size < args.granularity:
            raise Failure("expected granularity <= min-size <= max-size")
        nvio = _import_nvio()
        cli = find_nvio(args.nvio)
        os.makedirs(args.dir, exist_ok=True)
        out = measure(nvio, args, cli)
    except (Failure, KeyboardInterrupt) as e:
        return error_exit("batch_bench", e)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"nvio {out['nvio_version']}  {out['cpus']} CPUs  {out['dir']} ({out['filesystem']})  "
          f"engine {out['engine']}")
    print(f"{out['count']} tensors of {human(out['min_tensor'])} to {human(out['max_tensor'])}, "
          f"{out['bytes'] / 1e9:.2f} GB in one file; GB/s, median of {out['rounds']} rounds")
    print(f"{'op':6} {'batch':>7} {'calls':>7} {'async':>7} {'cli':>7} "
          f"{'batch/calls':>12} {'batch/async':>12} {'batch/cli':>10}")
    for r in out["results"]:
        g = r["gb_s"]
        print(f"{r['op']:6} {g['batch']:>7.2f} {g['calls']:>7.2f} {g['async']:>7.2f} "
              f"{g['cli']:>7.2f} {r['batch_over_calls']:>12.2f} {r['batch_over_async']:>12.2f} "
              f"{r['batch_over_cli']:>10.2f}")
    print("bytes read back: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
