"""A/B of io_uring registered buffers (issue 32 item 3): bench/small_reads.cpp reading SIZE bytes
at random aligned offsets into memory SKEW bytes past a page (so every read goes through a
worker's bounce buffer: READ_FIXED on a registered slab), against the same binary with
bench/no_fixed_buffers.c preloaded (registration refused: plain READ). Alternating rounds, medians.

  g++ -O2 -std=c++20 -Iinclude -o /tmp/nvio_fixed_small_reads bench/small_reads.cpp \\
      -Lbuild/src -lnvio -Wl,-rpath,$PWD/build/src
  gcc -O2 -shared -fPIC -o /tmp/nvio_no_fixed_buffers.so bench/no_fixed_buffers.c
  python3 bench/fixed_buffers_ab.py [--ramdisk] [--dir DIR] [--rounds 7]

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ramdisk import RamDisk  # noqa: E402

CASES = [(4096, 1, 20000), (4096, 32, 100000), (65536, 1, 10000), (65536, 32, 40000)]


def rate(binary: str, path: str, size: int, qd: int, n: int, preload: str | None) -> float:
    env = dict(os.environ, NVIO_CONFIG="none")
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run([binary, path, "file", str(n), str(qd), str(size), "auto", "1"], env=env,
                         check=True, capture_output=True, text=True).stdout
    return float(re.search(r"([0-9.]+) reads/s", out).group(1))


def run(directory: str, args: argparse.Namespace) -> None:
    path = os.path.join(directory, "fixed-ab.bin")
    with open(path, "wb") as f:
        for _ in range(256):
            f.write(os.urandom(1 << 20))
        # Written back before the runs: an O_DIRECT read of a range with dirty pages cannot run
        # without blocking, and io_uring hands it to a worker thread (the first runs paid that).
        f.flush()
        os.fsync(f.fileno())
    print(f"{'size':>6} {'QD':>3} {'fixed':>9} {'plain':>9} {'fixed/plain':>11}")
    for size, qd, n in CASES:
        fixed, plain = [], []
        for _ in range(args.rounds):
            fixed.append(rate(args.binary, path, size, qd, n, None))
            plain.append(rate(args.binary, path, size, qd, n, args.shim))
        f, p = statistics.median(fixed), statistics.median(plain)
        print(f"{size:>6} {qd:>3} {f:>9.0f} {p:>9.0f} {f / p:>11.3f}", flush=True)
    os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--ramdisk", action="store_true", help="a RAM-backed loop device (root)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--binary", default="/tmp/nvio_fixed_small_reads")
    ap.add_argument("--shim", default="/tmp/nvio_no_fixed_buffers.so")
    args = ap.parse_args()
    if args.ramdisk:
        with RamDisk(512 << 20) as rd:
            run(str(rd.mnt), args)
    else:
        run(args.dir, args)


if __name__ == "__main__":
    main()
