#!/usr/bin/python3
"""How long a Ctrl-C takes to stop a blocking nvio call, and what the call had done by then.

A long read (by default 2 GiB in 64 KiB pieces, one at a time, O_DIRECT where the directory
allows) runs on the main thread; another thread sends SIGINT to the process --after seconds into
it. Reported per round: the read's uninterrupted time (first round only), the time from the
signal to the KeyboardInterrupt, and the bytes the read had moved (pieces whose bytes are the
file's; the rest stayed untouched). Before nvio ran the signal handlers during its waits, the
KeyboardInterrupt came when the whole read had finished.

Usage:
    PYTHONPATH=build/python /usr/bin/python3 bench/interrupt_latency.py [--dir /var/tmp/nvio-bench]
        [--size 2G] [--block 64K] [--after 0.5] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time

import numpy as np

from benchlib import size_type

import nvio

SENTINEL = 0xA5


def aligned(n: int) -> np.ndarray:
    raw = np.full(n + 4096, SENTINEL, np.uint8)
    skip = -raw.ctypes.data % 4096
    return raw[skip:skip + n]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="/var/tmp/nvio-bench")
    p.add_argument("--size", type=size_type(), default=2 << 30)
    p.add_argument("--block", type=size_type(), default=64 << 10)
    p.add_argument("--after", type=float, default=0.5, help="seconds into the read (default 0.5)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "interrupt.dat")
    words = np.arange(args.size // 8, dtype=np.uint64) * 8  # each word holds its own offset
    expected = words.view(np.uint8)
    expected.tofile(path)
    h = nvio.Handle(block_size=args.block, queue_depth=1, intra_op_parallelism=1)
    buf = aligned(args.size)
    start = time.monotonic()
    h.read(buf, path)
    full = time.monotonic() - start
    print(f"uninterrupted read of {args.size} bytes in {args.block}-byte pieces, queue depth 1: "
          f"{full:.3f} s ({args.size / full / 1e9:.2f} GB/s)")
    latencies = []
    for r in range(args.rounds):
        buf[:] = SENTINEL
        sent = []

        def send() -> None:
            time.sleep(args.after)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        t = threading.Thread(target=send)
        t.start()
        start = time.monotonic()
        try:
            h.read(buf, path)
            time.sleep(60)  # the read ended before the signal: it lands here
        except KeyboardInterrupt:
            raised = time.monotonic()
        t.join()
        moved = int(np.count_nonzero(buf.reshape(-1, 4096)[:, 0] != SENTINEL)) * 4096
        latency = raised - sent[0]
        latencies.append(latency)
        print(f"round {r + 1}: signal at {sent[0] - start:.3f} s, KeyboardInterrupt "
              f"{latency * 1e3:.1f} ms later, {moved} of {args.size} bytes moved")
    print(f"median signal-to-KeyboardInterrupt: {statistics.median(latencies) * 1e3:.1f} ms "
          f"(the whole read: {full * 1e3:.0f} ms)")
    os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
