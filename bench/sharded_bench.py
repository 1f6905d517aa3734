"""Sharded save on several ranks against one writer of the same total (issue 12).

N processes (torch.distributed, gloo on the CPU, one machine) each hold total/N bytes of tensors
and call nvio.save_sharded together; the time is from a barrier before the call to the end of the
slowest rank. The single writer is the same call on one rank holding everything (one safetensors
file through one write batch). Rounds alternate the configurations; medians are printed as GB/s
of the total, with each one's ratio to the single writer.

    PYTHONPATH=build/python /usr/bin/python3 bench/sharded_bench.py --dir /var/tmp --size 1G --ranks 1,2,4
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import size_type

_RANK = r"""
import sys, time, torch, torch.distributed as dist, nvio
store, rank, world, total, directory = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
per_rank = total // world
sizes = [per_rank // 64] * 60 + [per_rank // 160] * 10  # ~total/world bytes in 70 tensors
sd = {f"rank{rank}.t{i}": torch.full((max(1, n // 4),), float(i), dtype=torch.float32)
      for i, n in enumerate(sizes)}
dist.barrier()
start = time.perf_counter()
nvio.save_sharded(sd, directory)
dist.barrier()
if rank == 0:
    print(time.perf_counter() - start, flush=True)
dist.destroy_process_group()
"""


def run(world: int, total: int, directory: Path) -> float:
    """Seconds of one sharded save of `total` bytes on `world` ranks into a fresh directory."""
    shutil.rmtree(directory, ignore_errors=True)
    store = Path(tempfile.mkdtemp(prefix="nvio-sharded-store-")) / "store"
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(store), str(r), str(world),
                               str(total), str(directory)], stdout=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    shutil.rmtree(store.parent, ignore_errors=True)
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"a rank failed: {[p.returncode for p in procs]}")
    return float(outs[0].strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--size", type=size_type(), default=1 << 30)
    ap.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts; 1 is the "
                    "single writer the others are compared with")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    worlds = sorted({int(w) for w in args.ranks.split(",")} | {1})
    directory = args.dir / f"nvio-sharded-bench-{os.getpid()}"
    times = {w: [] for w in worlds}
    try:
        for r in range(args.rounds):
            for w in (worlds if r % 2 == 0 else list(reversed(worlds))):
                times[w].append(run(w, args.size, directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"sharded save of {args.size / 1e9:.2f} GB, {args.rounds} rounds, dir {args.dir}, "
          f"load average {load:.2f}")
    single = statistics.median(times[1])
    for w in worlds:
        m = statistics.median(times[w])
        print(f"  {w} rank(s)  {m:7.3f} s  {args.size / m / 1e9:6.2f} GB/s  "
              f"{single / m:5.2f}x the single writer  (all: "
              f"{', '.join(f'{t:.3f}' for t in times[w])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
