"""4 KiB reads from the page cache, one Python thread: nvio.File against Handle calls by path and
by descriptor (issue 32; bench/results.md, "Opened files (issue 32)"). Rounds alternate the
forms; prints each form's median operations per second.

    PYTHONPATH=build/python python bench/file_python.py FILE [--n 20000] [--rounds 5] [--async]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import nvio


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--async", dest="use_async", action="store_true",
                   help="read_async(...).wait() instead of read")
    a = p.parse_args()
    size = os.path.getsize(a.file)
    blocks = size // a.size
    offsets = (np.random.default_rng(1).integers(0, blocks, a.n) * a.size).tolist()
    buf = np.empty(a.size, dtype=np.uint8)
    with open(a.file, "rb") as f:  # into the page cache
        while f.read(1 << 24):
            pass
    h = nvio.Handle(direct="off")  # from the page cache: buffered reads
    fd = os.open(a.file, os.O_RDONLY)
    nf = nvio.File(a.file, "r", handle=h)

    def run(form: str) -> "tuple[float, float]":
        t = time.perf_counter()
        c = time.process_time()
        if a.use_async:
            if form == "file":
                for off in offsets:
                    nf.read_async(buf, off).wait()
            else:
                target = a.file if form == "path" else fd
                for off in offsets:
                    h.read_async(buf, target, off).wait()
        elif form == "file":
            for off in offsets:
                nf.read(buf, off)
        else:
            target = a.file if form == "path" else fd
            for off in offsets:
                h.read(buf, target, off)
        return a.n / (time.perf_counter() - t), (time.process_time() - c) / a.n * 1e6

    rates: "dict[str, list[float]]" = {"path": [], "fd": [], "file": []}
    cpu: "dict[str, list[float]]" = {"path": [], "fd": [], "file": []}
    for _ in range(a.rounds):
        for form in rates:
            rate, us = run(form)
            rates[form].append(rate)
            cpu[form].append(us)
    call = "read_async().wait()" if a.use_async else "read"
    for form, r in rates.items():
        print(f"{form:5s} {call}: median {statistics.median(r):9.0f} ops/s "
              f"CPU {statistics.median(cpu[form]):5.1f} us/op (all threads) "
              f"(rounds: {', '.join(f'{x:.0f}' for x in r)})")
    nf.close()
    os.close(fd)


if __name__ == "__main__":
    main()
