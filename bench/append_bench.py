#!/usr/bin/python3
"""Writes into new files with one build's Python package: what a write past the end costs.

Three measurements, each in a fresh file under --dir, alternated over --rounds rounds:
- one `Handle.write` of --size bytes from locked memory into a new file, as it comes, after
  `posix_fallocate` of the whole file, and after `ftruncate` to its size (seconds);
- appends one after the other: `Handle.write` of B bytes at offset i x B, for B in --appends
  (appends per second);
- pipelined appends: `aio_handle().async_pwrite` of C bytes at offset i x C, up to 8 in flight,
  then `wait()`, for C in --pipelined (GB/s, and the slowest single submit call in ms: an
  asynchronous call should not wait for earlier I/O).

To compare two builds, run it once with each build's package on PYTHONPATH, alternating:
  for b in /tmp/old/build/python build/python; do
      NVIO_CONFIG=none PYTHONPATH=$b /usr/bin/python3 bench/append_bench.py \
          --dir /var/tmp/nvio-append
  done
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # python3 -P leaves bench/ off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import size_type  # noqa: E402


def fresh(path: Path) -> None:
    if path.exists():
        path.unlink()
    os.sync()


def one_write(h, buf, path: Path, prepare: str) -> float:
    fresh(path)
    t0 = time.perf_counter()
    if prepare != "as it comes":
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if prepare == "posix_fallocate":
                os.posix_fallocate(fd, 0, len(buf))
            else:
                os.ftruncate(fd, len(buf))
        finally:
            os.close(fd)
    h.write(buf, str(path), 0)
    return time.perf_counter() - t0


def appends(h, buf, path: Path, count: int) -> float:
    fresh(path)
    t0 = time.perf_counter()
    for i in range(count):
        h.write(buf, str(path), i * len(buf))
    return count / (time.perf_counter() - t0)


def pipelined(aio, buf, path: Path, total: int) -> tuple[float, float]:
    fresh(path)
    worst, inflight = 0.0, 0
    t0 = time.perf_counter()
    for i in range(total // len(buf)):
        if inflight == 8:
            aio.wait()
            inflight = 0
        s = time.perf_counter()
        aio.async_pwrite(buf, str(path), i * len(buf))
        worst = max(worst, time.perf_counter() - s)
        inflight += 1
    aio.wait()
    return total / (time.perf_counter() - t0) / 1e9, worst * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/nvio-append"))
    ap.add_argument("--size", type=size_type(), default=size_type()("1G"),
                    help="bytes of the single write and of the pipelined appends (default 1G)")
    ap.add_argument("--appends", default="4K,64K,1M", help="sizes of the one-by-one appends")
    ap.add_argument("--append-bytes", type=size_type(), default=size_type()("96M"),
                    help="bytes appended one by one per size (default 96M)")
    ap.add_argument("--pipelined", default="1M,8M", help="sizes of the pipelined appends")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    import numpy as np

    import nvio

    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / "append-bench.dat"
    h = nvio.Handle()
    aio = nvio.aio_handle()
    big = nvio.empty_locked(args.size, np.uint8)
    big[:] = 7
    sizes = [size_type()(s) for s in args.appends.split(",")]
    piped = [size_type()(s) for s in args.pipelined.split(",")]
    singles: dict[str, list[float]] = {k: [] for k in ("as it comes", "posix_fallocate",
                                                       "ftruncate")}
    rate: dict[int, list[float]] = {b: [] for b in sizes}
    pipe: dict[int, list[tuple[float, float]]] = {c: [] for c in piped}
    rng = random.Random(1)
    try:
        for _ in range(args.rounds):
            order = list(singles)
            rng.shuffle(order)
            for k in order:
                singles[k].append(one_write(h, big, path, k))
            for b in sizes:
                rate[b].append(appends(h, big[:b], path, max(1, args.append_bytes // b)))
            for c in piped:
                pipe[c].append(pipelined(aio, big[:c], path, args.size // c * c))
    finally:
        if path.exists():
            path.unlink()
    for k, v in singles.items():
        print(f"one write of {args.size} bytes, {k:15s}: median {statistics.median(v):.3f} s "
              f"({' '.join(f'{x:.3f}' for x in v)})")
    for b, v in rate.items():
        print(f"appends of {b:>8} bytes one by one: median {statistics.median(v):,.0f} per s")
    for c, v in pipe.items():
        print(f"pipelined appends of {c:>8} bytes: median "
              f"{statistics.median(x[0] for x in v):.2f} GB/s, slowest submit "
              f"{max(x[1] for x in v):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
