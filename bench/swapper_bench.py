"""nvio.TensorSwapper swap_out / swap_in against `nvio bench` of the same bytes and settings.

For each tensor size (default 1, 16 and 64 MiB), --total bytes of tensors (locked memory) are
swapped out (every swap_out started, then wait(): write-behind under --budget) and swapped back
in (after dropping the swap files' pages: fsync + posix_fadvise DONTNEED) into the same tensors,
one swap_in at a time, then all in one swap_in_batch, then again after one prefetch of every
name; a snapshot() of them is timed after the swap_out; in the same round, `nvio bench --op write`
and `--op read` move the same byte count with the same handle settings (--block-size,
--queue-depth, --parallelism), and a bare nvio.Handle of those settings reads the same tensors
one at a time from consecutive offsets of one file (the reference for swap_in one at a time). Rounds
alternate them so that a drive's drift affects all; medians are printed with the ratios.

    PYTHONPATH=build/python /usr/bin/python3 bench/swapper_bench.py --dir /var/tmp/swap-bench
    ... --sizes 1M --total 64M --rounds 1          # a short run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from benchlib import drop_cache, human, parse_size


def nvio_bench(op: str, size: int, directory: Path, settings: dict) -> float:
    """Seconds of one `nvio bench` transfer of `size` bytes with `settings` (its own cold-cache
    handling for reads)."""
    cmd = [str(benchlib.REPO / "build" / "bin" / "nvio"), "bench", "--dir", str(directory),
           "--size", str(size), "--op", op, "--loops", "1", "--json",
           "--block-size", str(settings["block_size"]),
           "--queue-depth", str(settings["queue_depth"]),
           "--parallelism", str(settings["intra_op_parallelism"])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=benchlib.child_env()).stdout
    result = json.loads(out)["results"][0]
    return result["bytes"] / (result["gb_per_s"] * 1e9)


def handle_read_each(nvio, tensors: list, directory: Path, settings: dict) -> float:
    """Seconds to read `tensors` back one at a time, in order, from consecutive offsets of one
    file, with a bare nvio.Handle of the same settings (the file written untimed first, its pages
    dropped): the reference for swap_in one tensor at a time, whose reads are of the same sizes
    in the same order. The whole-file `nvio bench --op read` is not: it keeps queue depth x
    parallelism requests in flight whatever the tensor size."""
    path = directory / "each.dat"
    h = nvio.Handle(**settings)
    offset = 0
    for t in tensors:
        h.write(t, path, offset)
        offset += t.numel() * t.element_size()
    os.sync()
    drop_cache(path)
    t0 = time.perf_counter()
    offset = 0
    for t in tensors:
        h.read(t, path, offset)
        offset += t.numel() * t.element_size()
    seconds = time.perf_counter() - t0
    path.unlink()
    return seconds


def drop_directory_cache(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.name.endswith(".swap"):
            drop_cache(entry)


def one_size(nvio, size: int, args, settings: dict) -> dict:
    count = max(1, args.total // size)
    nbytes = count * size
    tensors = [nvio.empty_locked(size) for _ in range(count)]
    for i, t in enumerate(tensors):
        t.fill_(i % 251)
    times: dict = {k: [] for k in ("swap_out", "bench write", "snapshot", "swap_in",
                                    "swap_in_batch", "prefetch+swap_in", "bench read",
                                    "read each")}
    swap_dir = args.dir / "swap"
    with nvio.TensorSwapper(swap_dir, args.budget, **settings) as sw:
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for i, t in enumerate(tensors):
                sw.swap_out(f"t{i}", t)
            sw.wait()
            os.sync()  # the bytes on the drive, as `nvio bench --op write` leaves them
            times["swap_out"].append(time.perf_counter() - t0)
            times["bench write"].append(nvio_bench("write", nbytes, args.dir, settings))

            # A snapshot: every tensor copied (read back, written to one synced data file).
            snap_dir = args.dir / "snapshot"
            drop_directory_cache(swap_dir)
            t0 = time.perf_counter()
            sw.snapshot(snap_dir)
            times["snapshot"].append(time.perf_counter() - t0)
            shutil.rmtree(snap_dir)

            drop_directory_cache(swap_dir)
            t0 = time.perf_counter()
            for i, t in enumerate(tensors):
                sw.swap_in(f"t{i}", out=t)
            times["swap_in"].append(time.perf_counter() - t0)

            # All of them as one swap_in_batch: the reads in flight together.
            drop_directory_cache(swap_dir)
            t0 = time.perf_counter()
            sw.swap_in_batch([(f"t{i}", t) for i, t in enumerate(tensors)])
            times["swap_in_batch"].append(time.perf_counter() - t0)

            # Prefetched: a read of its own for every name (those the budget has no room for
            # queued, started as the swap_ins free it), then each swap_in copies from the pool.
            drop_directory_cache(swap_dir)
            t0 = time.perf_counter()
            sw.prefetch([f"t{i}" for i in range(count)])
            for i, t in enumerate(tensors):
                sw.swap_in(f"t{i}", out=t)
            times["prefetch+swap_in"].append(time.perf_counter() - t0)
            times["bench read"].append(nvio_bench("read", nbytes, args.dir, settings))
            times["read each"].append(handle_read_each(nvio, tensors, args.dir, settings))
        for i, t in enumerate(tensors):  # the bytes came back
            if int(t[0]) != i % 251 or int(t[-1]) != i % 251:
                raise benchlib.Failure(f"tensor t{i} of {human(size)} came back wrong")
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"size": size, "count": count, "bytes": nbytes, "median_s": med,
            "gb_per_s": {k: nbytes / v / 1e9 for k, v in med.items()}, "all_s": times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/nvio-swapper-bench"))
    parser.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")],
                        default=[1 << 20, 16 << 20, 64 << 20], help="tensor sizes, e.g. 1M,16M")
    parser.add_argument("--total", type=parse_size, default=1 << 30,
                        help="bytes swapped per size and round (default 1G)")
    parser.add_argument("--budget", type=parse_size, default=1 << 30,
                        help="the swapper's budget_bytes (default 1G)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block-size", type=parse_size, default=1 << 20)
    parser.add_argument("--queue-depth", type=int, default=32)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    benchlib.interrupt_on_sigterm()
    import nvio

    settings = {"block_size": args.block_size, "queue_depth": args.queue_depth,
                "intra_op_parallelism": args.parallelism}
    args.dir.mkdir(parents=True, exist_ok=True)
    # A directory of its own inside --dir, the only thing removed at the end: --dir may be a
    # directory that holds other files (/var/tmp).
    where = args.dir
    args.dir = Path(tempfile.mkdtemp(prefix="nvio-swapper-bench-", dir=args.dir))
    results = []
    try:
        for size in args.sizes:
            results.append(one_size(nvio, size, args, settings))
    except (benchlib.Failure, KeyboardInterrupt) as e:
        return benchlib.error_exit("swapper_bench", e)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        print(json.dumps({"settings": settings, "budget": args.budget, "rounds": args.rounds,
                          "results": results}, indent=1))
        return 0
    print(f"dir {where}, {args.rounds} rounds, budget {human(args.budget)}, block "
          f"{human(args.block_size)}, queue depth {args.queue_depth}, parallelism "
          f"{args.parallelism}, load average {os.getloadavg()[0]:.2f}")
    for r in results:
        g = r["gb_per_s"]
        print(f"  {r['count']} x {human(r['size'])}: swap_out {g['swap_out']:6.2f} GB/s "
              f"({g['swap_out'] / g['bench write']:.2f}x bench write {g['bench write']:.2f}), "
              f"swap_in {g['swap_in']:6.2f} GB/s ({g['swap_in'] / g['bench read']:.2f}x bench "
              f"read {g['bench read']:.2f}; {g['swap_in'] / g['read each']:.2f}x Handle.read "
              f"one at a time {g['read each']:.2f}), swap_in_batch {g['swap_in_batch']:6.2f} GB/s "
              f"({g['swap_in_batch'] / g['bench read']:.2f}x), prefetch+swap_in "
              f"{g['prefetch+swap_in']:6.2f} GB/s, snapshot {g['snapshot']:6.2f} GB/s "
              f"({g['snapshot'] / g['bench write']:.2f}x bench write)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
