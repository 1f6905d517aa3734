#!/usr/bin/python3
"""Two builds of nvio alternated on one file: a large transfer at an odd file offset and at 0.

For a change to the unaligned path (bounce buffers, shifted reads), `offset_bench.py` gives one
build's offset/aligned ratio; this script runs build A and build B, each at --offset and at 0, one
after the other on the SAME file for every round (the order reversed every other round), so that
the B/A ratio and each build's offset/aligned ratio come from the same minutes. Each run is `nvio
bench --file F --size S --offset O --op OP --loops L --json` (the page-aligned buffer of `nvio
bench`); the figures are medians of every timed loop, with the median CPU seconds per GB. The file
must exist and hold at least --offset + --size bytes (lay it out with `nvio bench --file F --size S
--offset O --op write --keep`).

Example (the old build in a git worktree of the previous commit):
  bench/offset_ab.py --a /tmp/old/build/bin/nvio --b build/bin/nvio --file /mnt/ram/off.dat \\
      --size 1G --offset 4103 --op read --rounds 5
"""
from __future__ import annotations

import json
import os
import statistics
import sys

from benchlib import Failure, ab_parser, error_exit, run_cmd, size_type


def run(binary: str, path: str, size: int, offset: int, op: str, loops: int
        ) -> tuple[list[float], float]:
    """GB/s of each timed loop, and CPU seconds per GB."""
    out = run_cmd([binary, "bench", "--file", path, "--size", str(size), "--offset", str(offset),
                   "--op", op, "--loops", str(loops), "--json"]).stdout
    r = json.loads(out)["results"][0]
    return [r["bytes"] / s / 1e9 for s in r["seconds_all"]], float(r["cpu_s_per_gb"])


def main() -> int:
    ap = ab_parser(__doc__, "an existing file of at least --offset + --size", 5)
    ap.add_argument("--size", type=size_type(), default=size_type()("1G"),
                    help="bytes per transfer (default 1G)")
    ap.add_argument("--offset", type=size_type(allow_zero=True), default=4103,
                    help="the odd file offset (default 4103 = 4096 + 7)")
    ap.add_argument("--op", choices=("read", "write"), default="read")
    ap.add_argument("--loops", type=int, default=3, help="timed loops per run (default 3)")
    args = ap.parse_args()
    if args.rounds < 1 or args.loops < 1:
        ap.error("--rounds and --loops must be at least 1")
    if not os.path.isfile(args.file) or os.path.getsize(args.file) < args.offset + args.size:
        ap.error(f"--file {args.file}: not a file of at least --offset + --size bytes")
    configs = [("A", args.a, args.offset), ("B", args.b, args.offset), ("B", args.b, 0),
               ("A", args.a, 0)]
    gbs: dict[tuple[str, int], list[float]] = {(w, o): [] for w, _, o in configs}
    cpu: dict[tuple[str, int], list[float]] = {(w, o): [] for w, _, o in configs}
    try:
        for i in range(args.rounds):
            for who, binary, offset in (configs if i % 2 == 0 else configs[::-1]):
                speeds, cpu_per_gb = run(binary, args.file, args.size, offset, args.op,
                                         args.loops)
                gbs[(who, offset)] += speeds
                cpu[(who, offset)].append(cpu_per_gb)
    except (Failure, KeyboardInterrupt) as e:
        return error_exit(ap.prog, e)
    m = {k: statistics.median(v) for k, v in gbs.items()}
    for (who, offset), v in gbs.items():
        print(f"{who} {args.op} at {offset:>6}: {m[(who, offset)]:6.2f} GB/s (min {min(v):.2f}, "
              f"max {max(v):.2f}), CPU {statistics.median(cpu[(who, offset)]):.3f} s/GB")
    o = args.offset
    print(f"offset/aligned: A {m[('A', o)] / m[('A', 0)]:.2f}, B {m[('B', o)] / m[('B', 0)]:.2f}; "
          f"B/A at {o}: {m[('B', o)] / m[('A', o)]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
