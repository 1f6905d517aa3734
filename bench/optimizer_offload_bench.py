"""Optimizer offload: Adam states on NVMe (examples/optimizer_offload.py), measured.

Three ways of taking the same Adam step over G groups of parameters, alternated round by round:
  memory      torch.optim.Adam with its states in memory (the reference),
  no-prefetch the states swapped in when a group steps and written behind,
  prefetch    the states of group k+1 read while group k steps (what a trainer would run).
Each group's step is followed by `--compute-ms` of work that releases the GIL (a stand-in for the
GPU work a trainer overlaps with I/O; default: the measured read time of one group, so that compute
takes as long as the group's I/O, the issue's condition). Reported, medians over the rounds:
step times, the time spent waiting for reads, and the share of the read time the prefetch hides:
1 - wait(prefetch) / wait(no-prefetch). The parameters are checked bit-exact against the reference
after each round.

    PYTHONPATH=build/python /usr/bin/python3 bench/optimizer_offload_bench.py --dir /var/tmp \
        --groups 8 --group-mib 32 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import nvio  # noqa: E402
from optimizer_offload import OffloadedAdam  # noqa: E402


def make_params(groups: int, group_bytes: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    n = group_bytes // 4
    params = [[torch.nn.Parameter(torch.randn(n, generator=g))] for _ in range(groups)]
    for group in params:
        for p in group:
            p.grad = torch.randn(n, generator=g)
    return params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-mib", type=int, default=32, help="parameter MiB per group")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compute-ms", type=float, default=None,
                    help="work after each group's step (default: one group's read time)")
    args = ap.parse_args()
    group_bytes = args.group_mib << 20
    state_bytes = 2 * group_bytes
    budget = 6 * state_bytes

    reference = make_params(args.groups, group_bytes, 1)
    ref_opt = torch.optim.Adam([p for g in reference for p in g], lr=1e-3)
    runs = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        swappers = {}
        for mode in ("no-prefetch", "prefetch"):
            path = os.path.join(d, mode)
            os.mkdir(path)
            swappers[mode] = nvio.TensorSwapper(path, budget_bytes=budget)
        compute_s = [0.0]

        def compute(_k: int) -> None:
            if compute_s[0] > 0:
                time.sleep(compute_s[0])  # releases the GIL, as waiting for a GPU does

        for mode, sw in swappers.items():
            runs[mode] = OffloadedAdam(make_params(args.groups, group_bytes, 1), sw,
                                       prefetch=(mode == "prefetch"), compute=compute, lr=1e-3)
        # One warm-up step each; it also measures one group's read time for --compute-ms.
        runs["no-prefetch"].step()
        read_per_group = runs["no-prefetch"].last_wait_s / args.groups
        compute_s[0] = (args.compute_ms / 1e3 if args.compute_ms is not None
                        else read_per_group)
        runs["prefetch"].step()
        ref_opt.step()
        times = {m: [] for m in ("memory", "no-prefetch", "prefetch")}
        waits = {m: [] for m in ("no-prefetch", "prefetch")}
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            ref_opt.step()
            for k in range(args.groups):
                compute(k)
            times["memory"].append(time.perf_counter() - t0)
            for mode in ("no-prefetch", "prefetch"):
                runs[mode].step()
                times[mode].append(runs[mode].last_step_s)
                waits[mode].append(runs[mode].last_wait_s)
        for mode, opt in runs.items():
            for g_ref, g_opt in zip(reference, (o.param_groups[0]["params"]
                                                for o in opt.optimizers)):
                for a, b in zip(g_ref, g_opt):
                    if not torch.equal(a, b):
                        raise SystemExit(f"{mode}: parameters differ from in-memory Adam")
        for sw in swappers.values():
            sw.close()

    med = {m: statistics.median(v) for m, v in times.items()}
    wait = {m: statistics.median(v) for m, v in waits.items()}
    io_gb = args.groups * state_bytes / 1e9
    print(f"{args.groups} groups x {args.group_mib} MiB of fp32 parameters "
          f"({2 * args.group_mib} MiB of Adam states each), compute {compute_s[0] * 1e3:.1f} ms "
          f"per group, {args.rounds} rounds, medians; parameters bit-exact: yes")
    print(f"{'mode':<12} {'step s':>8} {'vs memory':>10} {'read wait s':>12}")
    for m in ("memory", "no-prefetch", "prefetch"):
        w = f"{wait[m]:.3f}" if m in wait else "-"
        print(f"{m:<12} {med[m]:8.3f} {med[m] / med['memory']:9.2f}x {w:>12}")
    hidden = 1 - wait["prefetch"] / wait["no-prefetch"] if wait["no-prefetch"] > 0 else 0.0
    print(f"read time hidden by the prefetch: {hidden * 100:.0f}% "
          f"(states read per step: {io_gb:.2f} GB; read at "
          f"{io_gb / wait['no-prefetch']:.2f} GB/s without prefetch)")


if __name__ == "__main__":
    main()
