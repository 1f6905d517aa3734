#!/usr/bin/env python3
"""Model weights from a file into GPU memory: nvio against the loaders people use, on the same
files, cold (each file fsync'ed and dropped from the page cache before every timed load), the
ways alternated every round.

The weights are a stand-in for a transformer's: --layers layers of four 4096 x 4096 attention
matrices, three 4096 x 11008 MLP matrices and two norms, in bf16 (about 386 MiB a layer). They
are saved once as safetensors (nvio.safetensors.save_file) and once with torch.save, then loaded
onto the GPU by:
  nvio.safetensors      nvio.safetensors.load_file(path, device="cuda"): tensors allocated on
                        the device, one read batch through the handle's pipelined bounce chunks
  safetensors           safetensors.torch.load_file(path, device="cuda") (the reference
                        package, where installed)
  nvio.load             nvio.load(path, map_location="cuda") of the torch.save file
  torch.load            torch.load(path, map_location="cuda")
Each load's tensors are checked against the saved ones (torch.equal on the GPU) after the clock.
GB/s = 1e9 bytes/s of tensor data; medians over --rounds.

Usage (a machine with CUDA and PyTorch):
    PYTHONPATH=build/python python3 bench/gpu_load_bench.py --dir /nvme [--layers 5] [--rounds 5]
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
from benchlib import drop_cache  # noqa: E402

import torch  # noqa: E402

import nvio  # noqa: E402
import nvio.safetensors  # noqa: E402


def weights(layers: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(1)
    out = {}
    for i in range(layers):
        shapes = {"q": (4096, 4096), "k": (4096, 4096), "v": (4096, 4096), "o": (4096, 4096),
                  "gate": (11008, 4096), "up": (11008, 4096), "down": (4096, 11008),
                  "norm1": (4096,), "norm2": (4096,)}
        for name, shape in shapes.items():
            out[f"layers.{i}.{name}"] = torch.randn(shape, generator=g, device="cuda").to(
                torch.bfloat16)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_load_bench: no CUDA device (torch.cuda.is_available() is False)")
        return 2
    os.makedirs(args.dir, exist_ok=True)
    ref = weights(args.layers)
    nbytes = sum(t.numel() * t.element_size() for t in ref.values())
    st_path = os.path.join(args.dir, f"nvio-gpu-load-{os.getpid()}.safetensors")
    pt_path = os.path.join(args.dir, f"nvio-gpu-load-{os.getpid()}.pt")
    ways = {
        "nvio.safetensors": (st_path, lambda: nvio.safetensors.load_file(st_path, device="cuda")),
        "nvio.load": (pt_path, lambda: nvio.load(pt_path, map_location="cuda")),
        "torch.load": (pt_path, lambda: torch.load(pt_path, map_location="cuda")),
    }
    try:
        import safetensors.torch as reference
        ways["safetensors"] = (st_path, lambda: reference.load_file(st_path, device="cuda"))
    except ImportError:
        print("gpu_load_bench: the safetensors package is not installed; skipped")
    times: dict = {k: [] for k in ways}
    bad = []
    try:
        cpu = {k: v.cpu() for k, v in ref.items()}
        nvio.safetensors.save_file(cpu, st_path)
        torch.save(cpu, pt_path)
        del cpu
        for r in range(args.rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for name in order:
                path, load = ways[name]
                drop_cache(path)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                got = load()
                torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
                if r == 0:
                    for k, t in ref.items():
                        if k not in got or got[k].device.type != "cuda" or not torch.equal(got[k], t):
                            bad.append(f"{name}: {k}")
                            break
                del got
    finally:
        for p in (st_path, pt_path):
            if os.path.exists(p):
                os.unlink(p)
    print(f"gpu_load_bench: {len(ref)} tensors, {nbytes} bytes of bf16, {args.rounds} rounds, "
          f"{torch.cuda.get_device_name()}, {args.dir}")
    print(f"{'loader':<18}{'median s':>10}{'GB/s':>8}  all s")
    for name, v in times.items():
        med = statistics.median(v)
        print(f"{name:<18}{med:>10.3f}{nbytes / med / 1e9:>8.2f}  " + " ".join(f"{x:.3f}" for x in v))
    base = statistics.median(times["nvio.safetensors"])
    for name in ways:
        if name != "nvio.safetensors":
            print(f"{name} takes {statistics.median(times[name]) / base:.2f}x the time of "
                  "nvio.safetensors")
    print("verified: " + ("all tensors equal" if not bad else "MISMATCH " + ", ".join(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
