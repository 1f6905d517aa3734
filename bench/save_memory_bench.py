#!/usr/bin/python3
"""Where nvio.save's time goes, and how much of it is the memory the tensors live in.

A synthetic training checkpoint (`nvio.ckpt_bench.synthetic_checkpoint`: bf16 weights, fp32 Adam
moments, 484 tensors per GiB) is written in alternating, shuffled rounds, each into a new file
under --dir (the files of a round are removed after it):
- `nvio.save`: the whole job (pickling, write_batch, headers, fdatasync, rename, directory fsync);
- `tensors`: only its data, `Handle.write_batch` of the tensors at the file offsets nvio.save
  gives them (file offset = address modulo the page, so nothing bounces), then fdatasync;
- `clones`: the same batch from clones of the tensors (the same sizes and page offsets, memory
  allocated afresh, one tensor after the other);
- `fresh`: the same batch from slices of one fresh 4 KiB-page anonymous mapping;
- `bench`: `nvio bench --op write --loops 1` of the same byte count (its own locked, huge-page
  buffer) into a new file.

Also printed: for each memory, how many 4 KiB pages lie in one physically contiguous run on
average (from /proc/self/pagemap; root only). A virtio disk takes a request's memory as one
segment per contiguous run, so the same bytes cost it more the more scattered their pages are.

    NVIO_CONFIG=none PYTHONPATH=build/python /usr/bin/python3 bench/save_memory_bench.py \
        --dir /var/tmp/nvio-save --rounds 7
"""
from __future__ import annotations

import argparse
import io
import json
import mmap
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

if str(Path(__file__).resolve().parent) not in sys.path:  # python3 -P leaves bench/ off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import find_nvio, size_type  # noqa: E402

PAGE = 4096


def pages_per_run(spans: List[Tuple[int, int]]) -> Optional[float]:
    """Average 4 KiB pages per physically contiguous run over (address, length) spans, or None
    where the kernel hides frame numbers (not root)."""
    try:
        pagemap = open("/proc/self/pagemap", "rb")
    except OSError:
        return None
    pages = runs = 0
    with pagemap:
        for address, length in spans:
            first = address // PAGE
            count = (address + length + PAGE - 1) // PAGE - first
            pagemap.seek(first * 8)
            entries = struct.unpack(f"{count}Q", pagemap.read(count * 8))
            frames = [e & ((1 << 55) - 1) for e in entries]
            if not any(frames):
                return None
            pages += count
            runs += 1 + sum(1 for a, b in zip(frames, frames[1:]) if b != a + 1)
    return pages / runs


def layout(tensors: List[Any]) -> List[Tuple[Any, int]]:
    """(tensor, file offset) as nvio.save places records: each at the next offset congruent to
    its address modulo the page."""
    items = []
    offset = 0
    for t in tensors:
        if t.numel() == 0:
            continue
        offset += (t.data_ptr() % PAGE - offset) % PAGE
        items.append((t, offset))
        offset += t.numel()
    return items


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="directory for the files (made)")
    ap.add_argument("--size", type=size_type(), default=1 << 30, help="checkpoint bytes (1G)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nvio", help="the nvio CLI for `bench` (default: the build's)")
    args = ap.parse_args()

    import torch
    import nvio
    from nvio import checkpoint
    from nvio.ckpt_bench import synthetic_checkpoint

    nvio_cli = find_nvio(args.nvio)
    work = args.dir / f"save-memory-{os.getpid()}"
    work.mkdir(parents=True)
    sd = synthetic_checkpoint(torch, args.size, 12)
    pickler = checkpoint._StoragePickler(io.BytesIO(), 2)
    pickler.dump(sd)
    tensors = [checkpoint._storage_bytes(torch, pickler.storages[k])
               for k in sorted(pickler.storages)]
    items = layout(tensors)
    total = items[-1][1] + items[-1][0].numel()
    clones = [(t.clone(), off) for t, off in items]
    fresh_map = mmap.mmap(-1, total)
    fresh_map.madvise(mmap.MADV_NOHUGEPAGE)
    fresh_buf = torch.frombuffer(fresh_map, dtype=torch.uint8)
    fresh_buf.fill_(7)
    fresh = [(fresh_buf[off:off + t.numel()], off) for t, off in items]
    handle = nvio.Handle()
    counter = iter(range(1 << 30))

    def new_path() -> Path:
        return work / f"f{next(counter)}.dat"

    def batch(these: List[Tuple[Any, int]]) -> Callable[[], float]:
        def run() -> float:
            fd = os.open(new_path(), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                start = time.perf_counter()
                handle.write_batch(these, fd)
                os.fdatasync(fd)
                return time.perf_counter() - start
            finally:
                os.close(fd)
        return run

    def save() -> float:
        start = time.perf_counter()
        nvio.save(sd, new_path())
        return time.perf_counter() - start

    def bench() -> float:
        out = subprocess.run([nvio_cli, "bench", "--file", str(new_path()), "--keep", "--size",
                              str(total), "--op", "write", "--loops", "1", "--json"],
                             check=True, capture_output=True, text=True).stdout
        result = json.loads(out)["results"][0]
        return result["bytes"] / (result["gb_per_s"] * 1e9)

    kinds: Dict[str, Callable[[], float]] = {
        "nvio.save": save, "tensors": batch(items), "clones": batch(clones),
        "fresh": batch(fresh), "bench": bench}
    times: Dict[str, List[float]] = {k: [] for k in kinds}
    try:
        for _ in range(args.rounds):
            order = list(kinds)
            random.shuffle(order)
            for k in order:
                times[k].append(kinds[k]())
            for f in work.iterdir():
                f.unlink()
            os.sync()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    contiguity = {
        "tensors": pages_per_run([(t.data_ptr(), t.numel()) for t, _ in items]),
        "clones": pages_per_run([(t.data_ptr(), t.numel()) for t, _ in clones]),
        "fresh": pages_per_run([(fresh_buf.data_ptr(), total)]),
    }
    bench_median = statistics.median(times["bench"])
    print(f"{total / 2**30:.3f} GiB in {len(items)} tensors, {args.rounds} rounds, seconds")
    print(f"{'what':10s} {'median':>7s} {'x bench':>8s} {'pages/run':>10s}  rounds")
    for k, v in times.items():
        run = contiguity.get(k)
        print(f"{k:10s} {statistics.median(v):7.3f} {bench_median / statistics.median(v):8.2f} "
              f"{'' if run is None else f'{run:.1f}':>10s}  "
              + " ".join(f"{x:.3f}" for x in v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
