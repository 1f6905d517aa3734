#!/usr/bin/env python3
"""A file to and from GPU memory from Python: nvio's pipelined device path against the staging
pattern DeepNVMe's aio_handle uses (the whole transfer into a page-locked host tensor, then one
copy to the GPU; the reverse for writes), on the same file, the same handle options, alternating.

For each direction and each --rounds, in turn:
  nvio     aio_handle.sync_pread(cuda_tensor, path): the handle moves the GPU data through its
           pipelined bounce chunks (copies overlap the file I/O).
  staged   aio_handle.sync_pread(pinned_host_tensor, path) then cuda_tensor.copy_(pinned): one
           host read, then one copy, nothing overlapped.
  host     aio_handle.sync_pread(pinned_host_tensor, path) alone: the file's bound.
  (writes the same with sync_pwrite and the copy first.)
Each figure is the median GB/s (1e9 bytes/s) over the rounds; the data read is checked against
what was written (torch.equal on the GPU) once per direction.

Usage (a machine with CUDA and PyTorch):
    PYTHONPATH=build/python python3 bench/gpu_python_bench.py --dir /nvme [--size 1G] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import size_type  # noqa: E402

import torch  # noqa: E402

from nvio.deepspeed import AsyncIOBuilder  # noqa: E402


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size", type=size_type(), default=1 << 30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parallelism", type=int, default=8)
    ap.add_argument("--queue-depth", type=int, default=32)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_python_bench: no CUDA device (torch.cuda.is_available() is False)")
        return 2
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"nvio-gpu-py-{os.getpid()}.dat")
    n = args.size
    h = AsyncIOBuilder().load().aio_handle(1 << 20, args.queue_depth, False, True,
                                          args.parallelism)
    pinned = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
    source = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    landing = torch.empty(n, dtype=torch.uint8, device="cuda")
    results: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        results.setdefault(name, []).append(n / seconds / 1e9)

    try:
        ways = {
            "write nvio": lambda: h.sync_pwrite(source, path),
            "write staged": lambda: (pinned.copy_(source), h.sync_pwrite(pinned, path)),
            "write host": lambda: h.sync_pwrite(pinned, path),
            "read nvio": lambda: h.sync_pread(landing, path),
            "read staged": lambda: (h.sync_pread(pinned, path), landing.copy_(pinned)),
            "read host": lambda: h.sync_pread(pinned, path),
        }
        h.sync_pwrite(source, path)
        for r in range(args.rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for name in order:
                if name.startswith("write"):
                    pinned.copy_(source)  # every write stores the same bytes
                record(name, timed(ways[name]))
        landing.zero_()
        h.sync_pread(landing, path)
        read_ok = torch.equal(landing, source)
        landing.zero_()
        pinned.zero_()
        h.sync_pread(pinned, path)
        landing.copy_(pinned)
        staged_ok = torch.equal(landing, source)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    print(f"gpu_python_bench: {n} bytes, {args.rounds} rounds, {torch.cuda.get_device_name()}, "
          f"file {path}, parallelism {args.parallelism}, queue_depth {args.queue_depth}")
    print(f"{'way':<14}{'GB/s median':>12}  all")
    for name, v in results.items():
        print(f"{name:<14}{statistics.median(v):>12.2f}  " + " ".join(f"{x:.2f}" for x in v))
    for d in ("write", "read"):
        ratio = statistics.median(results[f"{d} nvio"]) / statistics.median(results[f"{d} staged"])
        print(f"{d}: nvio / staged = {ratio:.2f}x")
    print(f"verified: nvio read {read_ok}, staged read {staged_ok}")
    return 0 if read_ok and staged_ok else 1


if __name__ == "__main__":
    sys.exit(main())
