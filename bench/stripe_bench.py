"""Striping over two drives against one: nvio.StripedHandle and fio on the same RAM-backed drives.

Two RAM-backed block devices (bench/ramdisk.py's RamDisk: tmpfs image -> loop device with
direct I/O -> ext4; root only) stand for two NVMe drives. Each round runs, in an order that
alternates between rounds:

  * nvio, one drive:  StripedHandle([A]) writes then reads a --size file;
  * nvio, two drives: StripedHandle([A, B]) writes then reads it striped (--stripe-size);
  * fio, one drive:   one job, --size bytes on A;
  * fio, two drives:  two jobs in one fio run, --size/2 bytes on each drive, group_reporting.

Same block size, queue depth (per drive) and engine for both tools; O_DIRECT; each file's page
cache is dropped before it is read. Reports median GB/s (10^9 bytes/s) per configuration, the
two/one ratio of each tool, nvio/fio, and nvio's per-drive GB/s. The striped file is verified
(each 8-byte word holds its offset) once at the end. A RAM-backed loop device is bound by the
CPU that copies for it (its kernel worker), so on a machine with few cores the two/one ratio
says as much about the CPUs as about nvio: the script prints the core count.

    sudo python3 bench/stripe_bench.py --size 1G --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from benchlib import (Failure, error_exit, fmt, human, interrupt_on_sigterm, log, machine_info,
                      run_cmd, size_type, drop_cache, find_nvio)
from ramdisk import RamDisk

import nvio  # noqa: E402  (PYTHONPATH: the build tree's python folder, or an installed nvio)

CONFIGS = ("nvio-1", "nvio-2", "fio-1", "fio-2")


def run_fio(fio: str, dirs: list[Path], size: int, args, op: str) -> float:
    """One fio run of `op` over `dirs`, size/len(dirs) bytes per drive, one job each; GB/s."""
    per = size // len(dirs)
    cmd = [fio, "--output-format=json", "--direct=1", f"--bs={args.block_size}",
           f"--iodepth={args.queue_depth}", f"--rw={op}", f"--ioengine={args.engine}",
           "--thread", "--group_reporting"]
    for i, d in enumerate(dirs):
        path = d / "fio.dat"
        if op == "read":
            drop_cache(path)
        cmd += [f"--name=drive{i}", f"--filename={path}", f"--size={per}"]
    proc = run_cmd(cmd, timeout=args.timeout, check=False)
    if proc.returncode != 0:
        raise Failure(f"fio exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    side = data["jobs"][0][op]
    if int(side["io_bytes"]) != per * len(dirs):
        raise Failure(f"fio moved {side['io_bytes']} bytes, expected {per * len(dirs)}")
    return float(side["bw_bytes"]) / 1e9


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def address(buf) -> int:
    """The address of nvio.empty_locked's buffer (a torch tensor, or numpy without torch)."""
    return buf.data_ptr() if hasattr(buf, "data_ptr") else buf.ctypes.data


def run_nvio(h: "nvio.StripedHandle", buf, op: str) -> dict:
    if op == "write":
        return h.write(buf, "stripe.dat", truncate=True)
    for i in range(len(h.directories)):
        drop_cache(h.part_path(i, "stripe.dat"))
    return h.read(buf, "stripe.dat")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=size_type(), default=1 << 30, help="file size (default 1G)")
    ap.add_argument("--stripe-size", type=size_type(), default=1 << 20, help="default 1M")
    ap.add_argument("--block-size", type=size_type(), default=1 << 20, help="default 1M")
    ap.add_argument("--queue-depth", type=int, default=16, help="per drive (default 16)")
    ap.add_argument("--engine", default="io_uring", choices=("io_uring", "libaio", "psync"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = ap.parse_args()
    interrupt_on_sigterm()
    try:
        return run(args)
    except (Failure, KeyboardInterrupt) as e:
        return error_exit("stripe_bench", e)


def run(args) -> int:
    fio = find_fio()
    size = args.size - args.size % (2 * args.stripe_size) or 2 * args.stripe_size
    disk = 2 * size + (256 << 20)  # drive A holds fio.dat and the one-drive stripe.dat
    opts = dict(engine=args.engine, block_size=args.block_size, queue_depth=args.queue_depth,
                intra_op_parallelism=1, direct="on")
    results: dict[str, dict[str, list[float]]] = {c: {"write": [], "read": []} for c in CONFIGS}
    # The machine's CPU busy fraction (all CPUs, /proc/stat) while each configuration ran: near 1
    # means the CPUs, not the drives, set the pace.
    busy: dict[str, dict[str, list[float]]] = {c: {"write": [], "read": []} for c in CONFIGS}
    per_drive: dict[str, list[list[float]]] = {"write": [], "read": []}
    with RamDisk(disk) as a, RamDisk(disk) as b:
        dirs = [Path(a.mnt), Path(b.mnt)]
        one = nvio.StripedHandle([dirs[0]], stripe_size=args.stripe_size, **opts)
        two = nvio.StripedHandle(dirs, stripe_size=args.stripe_size, **opts)
        buf = nvio.empty_locked(size)
        nvio._nvio.pattern_fill(address(buf), size, 0, 7)
        # fio's files are laid out once (untimed), like fio_compare's.
        for d in dirs:
            run_cmd([fio, "--name=layout", f"--filename={d / 'fio.dat'}", f"--size={size}",
                     "--rw=write", f"--bs={args.block_size}", "--direct=1"], timeout=args.timeout)
        for r in range(args.rounds):
            order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
            log(f"round {r + 1}/{args.rounds}: {' '.join(order)}")
            for config in order:
                for op in ("write", "read"):
                    b0, t0 = cpu_times()
                    if config.startswith("nvio"):
                        h = one if config == "nvio-1" else two
                        t = run_nvio(h, buf, op)
                        results[config][op].append(t["bytes"] / t["seconds"] / 1e9)
                        if h is two:
                            per_drive[op].append([d["bytes"] / d["seconds"] / 1e9
                                                  for d in t["drives"]])
                    else:
                        n = 1 if config == "fio-1" else 2
                        results[config][op].append(run_fio(fio, dirs[:n], size, args, op))
                    b1, t1 = cpu_times()
                    busy[config][op].append((b1 - b0) / max(t1 - t0, 1))
        # Verify the striped file, written afresh (nvio-1 wrote another layout into drive A).
        check = nvio.empty_locked(size)
        two.write(buf, "stripe.dat", truncate=True)
        two.read(check, "stripe.dat")
        bad = nvio._nvio.pattern_first_mismatch(address(check), size, 0, 7)
        if bad is not None:
            raise Failure(f"the striped file read back wrong at offset {bad}")
        dio = [a.dio, b.dio]
    med = {c: {op: statistics.median(v) for op, v in ops.items()} for c, ops in results.items()}
    cpu = {c: {op: statistics.median(v) for op, v in ops.items()} for c, ops in busy.items()}
    drive_med = {op: [statistics.median(col) for col in zip(*rows)] for op, rows in
                 per_drive.items()}
    out = {
        "size": size, "stripe_size": args.stripe_size, "block_size": args.block_size,
        "queue_depth_per_drive": args.queue_depth, "engine": args.engine, "rounds": args.rounds,
        "cpus": os.cpu_count(), "loop_direct_io": dio, "median_gb_per_s": med,
        "median_cpu_busy_fraction": cpu,
        "nvio_two_drives_per_drive_gb_per_s": drive_med, "samples": results,
        "machine": machine_info(find_nvio(None), dirs[0].parent),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{human(size)} file, {human(args.stripe_size)} stripes, bs {human(args.block_size)}, "
          f"qd {args.queue_depth} per drive, {args.engine}, {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs, loop dio {dio}")
    print(f"{'':8} {'nvio 1':>8} {'nvio 2':>8} {'2/1':>6} {'fio 1':>8} {'fio 2':>8} {'2/1':>6} "
          f"{'nvio/fio (2)':>13}   nvio per drive (2)")
    for op in ("write", "read"):
        n1, n2 = med["nvio-1"][op], med["nvio-2"][op]
        f1, f2 = med["fio-1"][op], med["fio-2"][op]
        drives = " ".join(fmt(x, ".2f") for x in drive_med[op])
        print(f"{op:8} {n1:8.2f} {n2:8.2f} {n2 / n1:6.2f} {f1:8.2f} {f2:8.2f} {f2 / f1:6.2f} "
              f"{n2 / f2:13.2f}   {drives}")
    print("CPU busy (all CPUs, /proc/stat), median: " + "; ".join(
        f"{c} {op} {cpu[c][op]:.0%}" for c in CONFIGS for op in ("write", "read")))
    print("GB/s = 10^9 bytes/s, medians over rounds")
    return 0


def find_fio() -> str:
    import shutil
    fio = shutil.which("fio")
    if not fio:
        raise Failure("fio is not installed (apt-get install fio)")
    return fio


if __name__ == "__main__":
    sys.exit(main())
