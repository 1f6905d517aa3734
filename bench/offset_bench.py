#!/usr/bin/python3
"""nvio at an odd file offset: a large read and write at file offset 0 and at an unaligned offset
(default 4103 = 4096 + 7) with the same page-aligned buffer, and the ratio of their speeds.

At an unaligned offset the buffer's address is no longer aligned with the file for O_DIRECT, so
the direct middle of a write goes through the workers' bounce chunks (a checked copy per piece),
and that of a read lands a few bytes past its place in the buffer and is moved there (a memmove
per piece); at offset 0 both are zero-copy. Both move --size bytes (default 1 GiB + 123) with
`nvio.Handle.read` / `.write` from Python on one `nvio.empty_locked` buffer, for each handle
configuration given (default: the default options, then intra_op_parallelism 1, 2 and 4). Rounds
alternate which offset goes first; the figure is the median over the rounds; ratio = offset GB/s
/ aligned GB/s. The file's pages are dropped from the page cache (posix_fadvise DONTNEED) before
every timed run, so that the buffered edges read the device, and every read is byte-compared once
(the pattern holds each 8-byte word's file offset).

Usage (as root for --ramdisk, which runs on a RAM-backed ext4 set up as bench/fio_compare.py
--ramdisk does):
    PYTHONPATH=build/python /usr/bin/python3 bench/offset_bench.py [--dir /var/tmp/nvio-offset]
        [--ramdisk] [--size 1G+123] [--offset 4103] [--rounds 5] [--iop default,1,2,4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # python3 -P leaves bench/ off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Failure, drop_cache, error_exit, interrupt_on_sigterm, log
from ramdisk import RamDisk
from python_bench import _import_nvio

SEED = 4103


def size_with_extra(text: str) -> int:
    """A size such as 1G, 1G+123 or 1073741947."""
    total = 0
    for part in text.split("+"):
        part = part.strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(part[-1:].upper(), 1)
        digits = part[:-1] if scale > 1 else part
        if not digits.isdigit():
            raise argparse.ArgumentTypeError(f"expected a size like 1G+123, got {text!r}")
        total += int(digits) * scale
    if total <= 0:
        raise argparse.ArgumentTypeError("size must be positive")
    return total


def timed(handle, op: str, buf, path: Path, offset: int) -> float:
    drop_cache(path)
    t0 = time.perf_counter()
    if op == "read":
        handle.read(buf, path, offset)
    else:
        handle.write(buf, path, offset)
    return time.perf_counter() - t0


def check(nvio, buf, size: int, offset: int, what: str) -> None:
    first = nvio._nvio.pattern_first_mismatch(buf.data_ptr(), size, offset, SEED)
    if first is not None:
        raise Failure(f"{what}: read-back mismatch at file offset {first}")


def measure(nvio, args, directory: Path) -> list[dict]:
    size, odd = args.size, args.offset
    path = directory / "offset-bench.dat"
    buf = nvio.empty_locked(size)
    rows = []
    try:
        for iop in args.iop:
            options = {} if iop == "default" else {"intra_op_parallelism": int(iop)}
            handle = nvio.Handle(**options)
            for op in ("read", "write"):
                times: dict[int, list[float]] = {0: [], odd: []}
                if op == "read":  # the pattern of each byte's own file offset, [0, odd + size)
                    for offset in (odd, 0):
                        nvio._nvio.pattern_fill(buf.data_ptr(), size, offset, SEED)
                        handle.write(buf, path, offset)
                for rnd in range(args.rounds + 1):  # round 0 warms up and is not counted
                    order = (0, odd) if rnd % 2 == 0 else (odd, 0)
                    for offset in order:
                        if op == "write":
                            nvio._nvio.pattern_fill(buf.data_ptr(), size, offset, SEED)
                        else:
                            buf[:] = 0
                        t = timed(handle, op, buf, path, offset)
                        if op == "read" and rnd == 0:
                            check(nvio, buf, size, offset, f"iop={iop} offset={offset}")
                        if rnd:
                            times[offset].append(t)
                med = {o: statistics.median(v) for o, v in times.items()}
                row = {
                    "iop": iop, "op": op, "bytes": size, "offset": odd, "engine": handle.engine,
                    "aligned_gb_s": size / med[0] / 1e9, "offset_gb_s": size / med[odd] / 1e9,
                    "ratio": med[0] / med[odd], "aligned_all": times[0], "offset_all": times[odd],
                }
                rows.append(row)
                log(f"iop={iop:>7} {op:5}  aligned {row['aligned_gb_s']:6.2f} GB/s  offset "
                    f"{odd}: {row['offset_gb_s']:6.2f} GB/s  ratio {row['ratio']:.2f}")
    finally:
        path.unlink(missing_ok=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp/nvio-offset", help="scratch directory on the disk")
    ap.add_argument("--ramdisk", action="store_true", help="root only: a RAM-backed ext4 instead")
    ap.add_argument("--size", type=size_with_extra, default=size_with_extra("1G+123"))
    ap.add_argument("--offset", type=int, default=4103, help="the unaligned file offset")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per configuration")
    ap.add_argument("--iop", type=lambda s: s.split(","), default=["default", "1", "2", "4"],
                    help="comma-separated intra_op_parallelism values ('default': no option)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    interrupt_on_sigterm()
    for name in [k for k in os.environ if k.startswith("NVIO_")]:
        del os.environ[name]
    os.environ["NVIO_CONFIG"] = "none"  # the defaults, not a saved tuning profile
    nvio = _import_nvio()
    try:
        if args.ramdisk:
            with RamDisk(2 * args.size + (64 << 20)) as disk:
                rows = measure(nvio, args, disk.mnt)
        else:
            os.makedirs(args.dir, exist_ok=True)
            rows = measure(nvio, args, Path(args.dir))
    except (Failure, KeyboardInterrupt) as e:
        return error_exit("offset_bench", e)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
