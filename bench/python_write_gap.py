"""One 1 GiB write into a new file from Python against `nvio bench --op write` (issue 31: why
nvio.dcp's save on the disk stays below the bench of the same bytes).

Alternates, in shuffled order each round: `nvio bench --op write [--sync] --loops 1` (a new file,
locked huge-page memory); `Handle.write_batch([(buf, 0)], path, sync=...)` from the default handle
in this process, of a 1 GiB anonymous mapping (huge pages advised, touched, mlocked where the limit
allows) into a new file; and the same into a file preallocated beforehand (untimed). Medians.

    PYTHONPATH=build/python .venv/bin/python bench/python_write_gap.py --dir /var/tmp --rounds 4
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import find_nvio, size_type


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--size", type=size_type(), default=1 << 30)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--no-sync", action="store_true", help="without fdatasync in either")
    ap.add_argument("--nvio", help="the nvio CLI (default: build/bin/nvio, else on PATH)")
    args = ap.parse_args()
    from nvio._handle import shared_handle

    cli, size, sync = find_nvio(args.nvio), args.size, not args.no_sync
    memory = mmap.mmap(-1, size)
    memory.madvise(mmap.MADV_HUGEPAGE)
    for i in range(0, size, 4096):
        memory[i] = 1
    libc = ctypes.CDLL(None, use_errno=True)
    address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    locked = libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(size)) == 0
    handle = shared_handle()
    path = args.dir / f"nvio-write-gap-{os.getpid()}"

    def bench() -> float:
        cmd = [cli, "bench", "--file", str(path), "--size", str(size), "--op", "write",
               "--loops", "1", "--json"] + (["--sync"] if sync else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        return json.loads(out)["results"][0]["seconds"]

    def python(preallocate: bool) -> float:
        if preallocate:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.posix_fallocate(fd, 0, size)
            os.fsync(fd)
            os.close(fd)
        start = time.perf_counter()
        handle.write_batch([(memoryview(memory), 0)], str(path), sync=sync)
        seconds = time.perf_counter() - start
        handle.close_files()
        os.unlink(path)
        return seconds

    cases = {"nvio bench --op write": bench,
             "Python write_batch, new file": lambda: python(False),
             "Python write_batch, preallocated file": lambda: python(True)}
    times: dict = {k: [] for k in cases}
    for _ in range(args.rounds):
        order = list(cases)
        random.shuffle(order)
        for k in order:
            times[k].append(cases[k]())
    print(f"{size / 2**30:.2f} GiB into {args.dir}, sync={sync}, memory locked={locked}, "
          f"{args.rounds} rounds, load average {os.getloadavg()[0]:.1f}")
    for k, v in times.items():
        print(f"  {k:40s} median {statistics.median(v):.3f} s  "
              f"({', '.join(f'{t:.3f}' for t in v)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
