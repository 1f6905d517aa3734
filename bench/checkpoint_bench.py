"""nvio.save / nvio.load against torch.save + fsync / torch.load and `nvio bench`, cold cache.

A state dict of 100 tensors of mixed sizes (fp32 and bf16, like a transformer's) of about --size
bytes is saved and loaded in interleaved rounds: nvio.save, torch.save + fsync, `nvio bench --op
write` of the same byte count; then, after dropping each file's pages (fsync + posix_fadvise
DONTNEED), nvio.load, nvio.load(into=) the same state dict, torch.load and `nvio bench --op read`,
all in this one process (`nvio ckpt-bench` loads each in a new process). Medians are printed with
the ratios the issue asks for, and the peak memory of a child process doing nvio.load (its VmHWM
growth over the load) against the file size.

    PYTHONPATH=build/python /usr/bin/python3 bench/checkpoint_bench.py --dir /var/tmp/ckpt
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
from benchlib import drop_cache


def state_dict(torch, total: int) -> dict:
    """100 tensors: a few large matrices and many small vectors, fp32 and bf16, ~total bytes."""
    weights = [8, 1, 1, 4, 0.01, 0.01] * 16 + [8, 4, 1, 1]
    unit = total / sum(w * (2 if i % 3 == 2 else 4) for i, w in enumerate(weights))
    sd = {}
    g = torch.Generator().manual_seed(0)
    for i, w in enumerate(weights):
        dtype = torch.bfloat16 if i % 3 == 2 else torch.float32
        n = max(1, int(w * unit))
        sd[f"layer{i // 6}.p{i % 6}"] = torch.randn(n, generator=g).to(dtype)
    return sd


def nvio_bench(op: str, size: int, directory: Path) -> float:
    """Seconds of one `nvio bench` transfer of `size` bytes (its own cold-cache handling)."""
    out = subprocess.run([str(benchlib.REPO / "build" / "bin" / "nvio"), "bench", "--dir",
                          str(directory), "--size", str(size), "--op", op, "--loops", "1",
                          "--json"], check=True, capture_output=True, text=True).stdout
    result = json.loads(out)["results"][0]
    return result["bytes"] / (result["gb_per_s"] * 1e9)


_PEAK_CHILD = r"""
import sys, torch, nvio
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
base = hwm()
sd = nvio.load(sys.argv[1])
print(hwm() - base)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/nvio-ckpt-bench"))
    parser.add_argument("--size", type=int, default=1 << 30, help="bytes of tensors (>= 1 GiB)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch

    import nvio

    args.dir.mkdir(parents=True, exist_ok=True)
    # A directory of its own inside --dir, the only thing removed at the end: --dir may be a
    # directory that holds other files (/var/tmp).
    where = args.dir
    args.dir = Path(tempfile.mkdtemp(prefix="nvio-ckpt-bench-", dir=args.dir))
    sd = state_dict(torch, args.size)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    mine, theirs = args.dir / "nvio.pt", args.dir / "torch.pt"
    times: dict = {k: [] for k in ("nvio.save", "torch.save+fsync", "bench write", "nvio.load",
                                    "nvio.load into", "torch.load", "bench read")}
    try:
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            nvio.save(sd, mine)
            times["nvio.save"].append(time.perf_counter() - t0)
            drop_cache(mine)
            t0 = time.perf_counter()
            with open(theirs, "wb") as f:
                torch.save(sd, f)
                f.flush()
                os.fsync(f.fileno())
            times["torch.save+fsync"].append(time.perf_counter() - t0)
            drop_cache(theirs)
            times["bench write"].append(nvio_bench("write", nbytes, args.dir))

            drop_cache(mine)
            t0 = time.perf_counter()
            loaded = nvio.load(mine)
            times["nvio.load"].append(time.perf_counter() - t0)
            del loaded
            # Into the existing tensors (into=): no fresh memory to fault in and zero.
            drop_cache(mine)
            t0 = time.perf_counter()
            nvio.load(mine, into=sd)
            times["nvio.load into"].append(time.perf_counter() - t0)
            drop_cache(theirs)
            t0 = time.perf_counter()
            loaded = torch.load(theirs)
            times["torch.load"].append(time.perf_counter() - t0)
            del loaded
            times["bench read"].append(nvio_bench("read", nbytes, args.dir))
        drop_cache(mine)
        peak = int(subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(mine)], check=True,
                                  capture_output=True, text=True).stdout)
        file_size = mine.stat().st_size
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    gbs = {k: nbytes / v / 1e9 for k, v in med.items()}
    print(f"{len(sd)} tensors, {nbytes / 2**30:.2f} GiB, {args.rounds} rounds, dir {where}, "
          f"load average {os.getloadavg()[0]:.2f}")
    for k in times:
        print(f"  {k:18s} {med[k]:7.3f} s  {gbs[k]:6.2f} GB/s  (all: "
              + ", ".join(f"{t:.3f}" for t in times[k]) + ")")
    print(f"  save: {med['torch.save+fsync'] / med['nvio.save']:.2f}x torch.save+fsync, "
          f"{med['bench write'] / med['nvio.save']:.2f}x nvio bench write")
    print(f"  load: {med['torch.load'] / med['nvio.load']:.2f}x torch.load (cold), "
          f"{med['bench read'] / med['nvio.load']:.2f}x nvio bench read; into existing "
          f"tensors {med['bench read'] / med['nvio.load into']:.2f}x nvio bench read")
    print(f"  peak memory of nvio.load: {peak / 2**20:.0f} MiB over the interpreter, file "
          f"{file_size / 2**20:.0f} MiB ({peak / file_size:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
