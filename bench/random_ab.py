#!/usr/bin/python3
"""Two builds of nvio and fio, alternated on one file: random I/O, IOPS medians.

For a change to the handle's small-operation path, `fio_compare.py` gives each build's ratio to
fio, but from runs minutes apart, while this machine's fio rate drifts by a third from hour to
hour. This script runs build A, build B and fio one after the other on the SAME file for every
configuration and round (the order reversed every other round), so that the A/B ratio and each
build's ratio to fio come from the same minutes.

Each configuration is ENGINE:OP:BLOCK:QD (e.g. io_uring:read:4K:32); each run is `nvio bench
--pattern random --parallelism 1 --direct on --duration S --loops 1` (one worker, queue depth =
operations in flight) against fio `--rw=randOP --direct=1 --iodepth=QD --norandommap
--time_based`, one job. The file must exist (lay it out with `nvio bench --op write --keep` or
fio first) and be at least --file-size long.

Example (the old build in a git worktree of the previous commit):
  bench/random_ab.py --a /tmp/old/build/bin/nvio --b build/bin/nvio --file /mnt/ram/ab.dat \\
      --file-size 512M --configs io_uring:read:4K:32,libaio:write:4K:128 --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from benchlib import Failure, ab_parser, error_exit, run_cmd, size_type


def nvio_iops(binary: str, path: str, file_size: int, eng: str, op: str, block: int, qd: int,
              seconds: float) -> float:
    out = run_cmd([binary, "bench", "--pattern", "random", "--file", path, "--file-size",
                   str(file_size), "--size", str(block), "--queue-depth", str(qd),
                   "--parallelism", "1", "--direct", "on", "--duration", str(seconds),
                   "--loops", "1", "--engine", eng, "--op", op, "--keep", "--json"]).stdout
    return float(json.loads(out)["results"][0]["iops"])


def fio_iops(path: str, file_size: int, eng: str, op: str, block: int, qd: int,
             seconds: float) -> float:
    out = run_cmd(["fio", "--name=r", f"--filename={path}", f"--rw=rand{op}", f"--bs={block}",
                   f"--iodepth={qd}", "--direct=1", f"--ioengine={eng}",
                   f"--runtime={seconds}", "--time_based", "--norandommap", "--randrepeat=0",
                   f"--size={file_size}", "--output-format=json"]).stdout
    return float(json.loads(out)["jobs"][0][op]["iops"])


def parse_config(text: str) -> tuple[str, str, int, int]:
    parts = text.split(":")
    if len(parts) != 4 or parts[0] not in ("io_uring", "libaio") or parts[1] not in ("read",
                                                                                   "write"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected ENGINE:OP:BLOCK:QD with ENGINE io_uring or libaio and OP read "
            "or write, e.g. io_uring:read:4K:32")
    block = size_type()(parts[2])
    try:
        qd = int(parts[3])
    except ValueError:
        qd = 0
    if qd < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the queue depth must be a positive integer")
    return parts[0], parts[1], block, qd


def main() -> int:
    ap = ab_parser(__doc__, "an existing file of at least --file-size", 3)
    ap.add_argument("--file-size", type=size_type(), default=size_type()("512M"),
                    help="bytes of the file the blocks are drawn from (default 512M)")
    ap.add_argument("--configs", required=True,
                    help="comma-separated ENGINE:OP:BLOCK:QD, e.g. io_uring:read:4K:32")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per run (default 2)")
    args = ap.parse_args()
    try:
        configs = [parse_config(c) for c in args.configs.split(",")]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if not os.path.isfile(args.file) or os.path.getsize(args.file) < args.file_size:
        ap.error(f"--file {args.file}: not a file of at least --file-size {args.file_size} bytes")
    try:
        print(f"{'engine':8} {'op':5} {'block':>6} {'qd':>4} {'A IOPS':>9} {'B IOPS':>9} "
              f"{'fio IOPS':>9} {'B/A':>5} {'B/fio':>5} {'A/fio':>5}")
        for eng, op, block, qd in configs:
            runs: dict[str, list[float]] = {"a": [], "b": [], "fio": []}
            for i in range(args.rounds):
                order = ["a", "b", "fio"] if i % 2 == 0 else ["fio", "b", "a"]
                for who in order:
                    if who == "fio":
                        runs[who].append(fio_iops(args.file, args.file_size, eng, op, block, qd,
                                                  args.seconds))
                    else:
                        binary = args.a if who == "a" else args.b
                        runs[who].append(nvio_iops(binary, args.file, args.file_size, eng, op,
                                                   block, qd, args.seconds))
            m = {k: statistics.median(v) for k, v in runs.items()}
            print(f"{eng:8} {op:5} {block:>6} {qd:>4} {m['a']:9.0f} {m['b']:9.0f} "
                  f"{m['fio']:9.0f} {m['b'] / m['a']:5.2f} {m['b'] / m['fio']:5.2f} "
                  f"{m['a'] / m['fio']:5.2f}", flush=True)
    except (Failure, KeyboardInterrupt) as e:
        return error_exit(ap.prog, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
