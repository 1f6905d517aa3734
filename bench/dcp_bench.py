"""torch.distributed.checkpoint with nvio's storage writer/reader against torch's (issue 31).

W ranks (torch.distributed, gloo on the CPU, one machine) each hold SIZE bytes of tensors (70
float32 tensors, 60 of SIZE/64 and 10 of SIZE/160, distinct per rank) and save them together with
``dcp.save``: through torch's ``FileSystemWriter`` with its defaults (thread_count=1) and with
each ``--threads`` count, and through ``nvio.dcp.FileSystemWriter``; each into a fresh directory,
timed from a barrier before the call to a barrier after it. Loads (``dcp.load`` into existing
tensors, the checkpoint nvio's writer made that round, its files dropped from the page cache
first) through torch's ``FileSystemReader`` and nvio's. The reference for the write is
``nvio bench --op write --sync`` of the same bytes per rank into a new file (``--procs W``). The
configurations alternate within each round (their order rotates from round to round); medians.
The ranks start once per (directory, W) and run every round.

    PYTHONPATH=build/python .venv/bin/python bench/dcp_bench.py --dir /dev/shm --dir /var/tmp \\
        --size 1G --ranks 1,2 --rounds 3
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
from pathlib import Path

from benchlib import find_nvio, size_type

_RANK = r"""
import json, os, shutil, subprocess, sys, time
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import nvio.dcp
sys.path.insert(0, sys.argv[7])
from benchlib import drop_cache
store, rank, world, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
root, plan = sys.argv[5], json.loads(sys.argv[6])
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
sizes = [size // 64] * 60 + [size // 160] * 10
sd = {f"rank{rank}.t{i}": torch.full((max(1, n // 4),), float(i + 100 * rank))
      for i, n in enumerate(sizes)}
target = {k: torch.empty_like(v) for k, v in sd.items()}
nvio_cli = plan["nvio"]

def timed(fn):
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start

def cold(path):
    if rank == 0:
        for name in os.listdir(path):
            drop_cache(os.path.join(path, name))

def fresh(path):
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)

def run(config, r):
    kind, what = config.split(":")
    path = os.path.join(root, "ckpt-" + (what if kind == "save" else "nvio"))
    if kind == "save":
        fresh(path)
        if what == "nvio":
            w = nvio.dcp.FileSystemWriter(path)
        else:
            w = dcp.FileSystemWriter(path, thread_count=int(what[5:] or 1))
        t = timed(lambda: dcp.save(sd, storage_writer=w))
        if what != "nvio":
            fresh(path)
        return t
    if kind == "load":
        cold(path)
        rd = nvio.dcp.FileSystemReader(path) if what == "nvio" else dcp.FileSystemReader(path)
        for v in target.values():
            v.zero_()
        t = timed(lambda: dcp.load(target, storage_reader=rd))
        if r == 0:
            for k, v in sd.items():
                assert torch.equal(target[k], v), (config, k)
        return t
    # the reference: nvio bench --op write --sync of the same bytes per rank, new files
    dist.barrier()
    if rank == 0:
        out = subprocess.run([nvio_cli, "bench", "--file", os.path.join(root, "ref"), "--size",
                              str(sum(v.numel() * 4 for v in sd.values())), "--op", "write",
                              "--sync", "--loops", "1", "--json"]
                             + (["--procs", str(world)] if world > 1 else []),
                             capture_output=True, text=True, check=True).stdout
        report = json.loads(out)
        seconds = (report["aggregate"] if world > 1 else report["results"])[0]["seconds"]
    else:
        seconds = 0.0
    dist.barrier()
    return seconds

configs = plan["configs"]
dist.barrier()  # a checkpoint for the loads before the first nvio save of round 0
fresh(os.path.join(root, "ckpt-nvio"))
dcp.save(sd, storage_writer=nvio.dcp.FileSystemWriter(os.path.join(root, "ckpt-nvio")))
for r in range(plan["rounds"]):
    k = r % len(configs)
    for config in configs[k:] + configs[:k]:
        t = run(config, r)
        if rank == 0:
            print(json.dumps({"config": config, "round": r, "seconds": t}), flush=True)
fresh(os.path.join(root, "ckpt-nvio"))
dist.destroy_process_group()
"""


def run_world(world: int, size: int, directory: Path, plan: dict) -> dict:
    """Starts `world` ranks that run every round in `directory`; {config: [seconds]}."""
    directory.mkdir(parents=True, exist_ok=True)
    store_dir = Path(tempfile.mkdtemp(prefix="nvio-dcp-store-"))
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(store_dir / "store"), str(r),
                               str(world), str(size), str(directory), json.dumps(plan),
                               str(Path(__file__).parent)],
                              stdout=subprocess.PIPE, text=True, env=env)
             for r in range(world)]
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    shutil.rmtree(store_dir, ignore_errors=True)
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"a rank failed: {[p.returncode for p in procs]}")
    times: dict = {}
    for line in outs[0].splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            times.setdefault(row["config"], []).append(row["seconds"])
    return times


def report(dirname: str, world: int, size: int, times: dict) -> list:
    total = size * world  # every rank writes its own; the state dict's bytes
    med = {c: statistics.median(v) for c, v in times.items()}
    gbs = {c: total / s / 1e9 for c, s in med.items()}
    stock_saves = [c for c in med if c.startswith("save:stock")]
    best = min(stock_saves, key=lambda c: med[c])
    rows = [f"| {dirname} | {world} | {c} | {med[c]:.3f} | {gbs[c]:.2f} | "
            f"{', '.join(f'{t:.3f}' for t in times[c])} |" for c in sorted(med)]
    rows.append(f"| {dirname} | {world} | **save: nvio / stock default** | | "
                f"**{med['save:stock'] / med['save:nvio']:.2f}x** | |")
    rows.append(f"| {dirname} | {world} | **save: nvio / stock best ({best})** | | "
                f"**{med[best] / med['save:nvio']:.2f}x** | |")
    rows.append(f"| {dirname} | {world} | **save: nvio / nvio bench --sync** | | "
                f"**{med['ref:write'] / med['save:nvio']:.2f}x** | |")
    rows.append(f"| {dirname} | {world} | **load: nvio / stock** | | "
                f"**{med['load:stock'] / med['load:nvio']:.2f}x** | |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, action="append",
                    help="directory to run in (repeatable; default /dev/shm and /var/tmp)")
    ap.add_argument("--size", type=size_type(), default=1 << 30, help="bytes per rank")
    ap.add_argument("--ranks", default="1,2", help="comma-separated rank counts")
    ap.add_argument("--threads", default="2,4", help="torch writer thread_count values to try "
                    "besides its default 1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nvio", help="the nvio CLI (default: build/bin/nvio, else on PATH)")
    args = ap.parse_args()
    dirs = args.dir or [Path("/dev/shm"), Path("/var/tmp")]
    configs = (["save:stock"] + [f"save:stock{t}" for t in args.threads.split(",") if t]
               + ["save:nvio", "ref:write", "load:stock", "load:nvio"])
    plan = {"configs": configs, "rounds": args.rounds, "nvio": find_nvio(args.nvio)}
    print("| directory | ranks | configuration | median s | GB/s | all rounds (s) |")
    print("|---|---|---|---|---|---|")
    for d in dirs:
        for world in [int(w) for w in args.ranks.split(",")]:
            work = d / f"nvio-dcp-bench-{os.getpid()}"
            try:
                times = run_world(world, args.size, work, plan)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            for row in report(str(d), world, args.size, times):
                print(row, flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f}; {args.rounds} rounds; "
          f"{args.size / 2**30:.2f} GiB per rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
