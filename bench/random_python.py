#!/usr/bin/python3
"""Random 4 KiB reads from Python against fio randread, on the same file, in alternating rounds.

Each round runs, in an order that rotates from one round to the next:

  fio            fio --rw=randread --ioengine=io_uring --direct=1 --iodepth QD --bs BS
                 --number_ios OPS (bench/fio_compare.py's random run; its IOPS)
  async_path     nvio.Handle.read_async(buf, path, offset), QD outstanding: each new read waits
                 for the future of the read submitted QD calls earlier (a ring of QD buffers)
  async_fd       the same with an open descriptor instead of the path
  aio_pread      DeepSpeed-compatible aio_handle.async_pread(buf, path, offset), QD at a time,
                 then aio_handle.wait()
  batch_items    Handle.read_batch([(view, offset), ...], path), --batch items a call, each view a
                 BS slice of one preallocated tensor
  batch_offsets  Handle.read_batch(tensor, offsets=[...], size=BS, file=path), --batch offsets a
                 call

Offsets are random multiples of BS in the file (one fixed list, seeded by --seed, for every
Python form; fio draws its own). The nvio handles run with queue_depth QD and the default other
options (the NVIO_* variables are cleared and NVIO_CONFIG=none). Every buffer is allocated
once, before the rounds, page-aligned (nvio.empty_locked). Reported: the median ops/s of each
form over the rounds and its ratio to fio's.

--ramdisk (root only) runs on a RAM-backed block device (tmpfs image, loop device with direct
I/O, ext4: bench/ramdisk.py's RamDisk); else the file lives in --dir, which must support
O_DIRECT.

Usage:
    sudo PYTHONPATH=build/python /usr/bin/python3 bench/random_python.py --ramdisk
        [--size 512M] [--ops 65536] [--qd 128] [--bs 4096] [--batch 4096] [--rounds 5]
        [--forms fio,async_path,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # python3 -P leaves bench/ off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (REPO, Failure, error_exit, human, interrupt_on_sigterm, log,  # noqa: E402
                      machine_info, parse_size, positive_int)
from fio_compare import layout, random_fio_args, run_fio  # noqa: E402
from ramdisk import RamDisk, check_direct_io  # noqa: E402

# batch_bench clears the NVIO_* variables and sets NVIO_CONFIG=none when imported.
from batch_bench import _import_nvio  # noqa: E402

FORMS = ("fio", "async_path", "async_fd", "aio_pread", "batch_items", "batch_offsets")
FILE_NAME = "nvio-random-python.dat"


def run_fio_randread(fio: str, path: Path, args) -> float:
    """fio's IOPS for --ops random reads of the file (io_uring, O_DIRECT, one job): the run of
    `fio_compare.py --pattern random --ios N`."""
    random = random_fio_args(argparse.Namespace(ios=args.ops, runtime=None, batch=1))
    r = run_fio(fio, path, args.size, args.bs, "read", "io_uring", args.qd, 600, random)
    if "error" in r:
        raise Failure(r["error"])
    return r["iops"]


class PythonForms:
    """The nvio Python forms, each a method timing --ops reads; everything allocated up front."""

    def __init__(self, nvio, path: Path, args):
        import torch

        self.args = args
        self.path = str(path)
        self.handle = nvio.Handle(queue_depth=args.qd)
        self.aio = nvio.aio_handle(queue_depth=args.qd)
        rng = random.Random(args.seed)
        blocks = args.size // args.bs
        self.offsets = [rng.randrange(blocks) * args.bs for _ in range(args.ops)]
        # Page-aligned memory (nvio.empty_locked), as fio's and the DeepSpeed-style callers' is:
        # torch.empty gives 64-byte alignment, which O_DIRECT cannot take, so every read would
        # go through nvio's bounce buffers.
        ring = nvio.empty_locked(args.qd * args.bs, torch.uint8)
        self.ring = [ring[i * args.bs:(i + 1) * args.bs] for i in range(args.qd)]
        self.batch_buf = nvio.empty_locked(args.batch * args.bs, torch.uint8)
        self.views = [self.batch_buf[i * args.bs:(i + 1) * args.bs] for i in range(args.batch)]
        self.fd = os.open(self.path, os.O_RDONLY)
        self.cpu_us: dict[str, list[float]] = {}

    def close(self) -> None:
        os.close(self.fd)
        del self.handle, self.aio  # their files close with them (the ramdisk must unmount)

    def _ring(self, target) -> None:
        qd, ring, h = self.args.qd, self.ring, self.handle
        futures = [None] * qd
        for i, offset in enumerate(self.offsets):
            slot = i % qd
            if futures[slot] is not None:
                futures[slot].wait()
            futures[slot] = h.read_async(ring[slot], target, offset)
        h.wait_all()

    def async_path(self) -> None:
        self._ring(self.path)

    def async_fd(self) -> None:
        self._ring(self.fd)

    def aio_pread(self) -> None:
        qd, ring, aio, path = self.args.qd, self.ring, self.aio, self.path
        for i, offset in enumerate(self.offsets):
            aio.async_pread(ring[i % qd], path, offset)
            if i % qd == qd - 1:
                aio.wait()
        aio.wait()

    def _chunks(self):
        n = self.args.batch
        for start in range(0, len(self.offsets), n):
            yield self.offsets[start:start + n]

    def batch_items(self) -> None:
        for chunk in self._chunks():
            self.handle.read_batch(list(zip(self.views, chunk)), self.path)

    def batch_offsets(self) -> None:
        size = self.args.bs
        for chunk in self._chunks():
            self.handle.read_batch(self.batch_buf, offsets=chunk, size=size, file=self.path)

    def timed(self, form: str) -> float:
        """ops/s of one run of `form`; its CPU time per read (the whole process: the calling
        thread and nvio's workers, user + system) is appended to self.cpu_us[form]."""
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        getattr(self, form)()
        elapsed = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        self.cpu_us.setdefault(form, []).append(cpu / len(self.offsets) * 1e6)
        return len(self.offsets) / elapsed


def benchmark(args, directory: Path, fio: str | None) -> dict:
    nvio = _import_nvio()
    check_direct_io(directory)
    path = directory / FILE_NAME
    if "fio" in args.forms or not path.exists() or path.stat().st_size < args.size:
        if not fio:
            raise Failure("fio not found; apt-get install fio")
        layout(fio, path, args.size, 1 << 20, timeout=600)
    forms = PythonForms(nvio, path, args)
    runs: dict[str, list[float]] = {f: [] for f in args.forms}
    try:
        for r in range(args.rounds):
            shift = r % len(args.forms)
            for form in args.forms[shift:] + args.forms[:shift]:
                value = run_fio_randread(fio, path, args) if form == "fio" else forms.timed(form)
                runs[form].append(value)
                log(f"round {r + 1}/{args.rounds} {form}: {value:,.0f} ops/s")
    finally:
        forms.close()
        if not args.keep:
            path.unlink(missing_ok=True)
    medians = {f: statistics.median(v) for f, v in runs.items()}
    fio_median = medians.get("fio")
    return {
        "settings": {"size": args.size, "bs": args.bs, "qd": args.qd, "ops": args.ops,
                     "batch": args.batch, "rounds": args.rounds, "seed": args.seed},
        "runs": runs,
        "median_ops_per_s": medians,
        "ratio_to_fio": {f: (m / fio_median if fio_median else None) for f, m in medians.items()},
        "median_cpu_us_per_op": {f: statistics.median(v) for f, v in forms.cpu_us.items()},
    }


def parse_forms(text: str) -> list[str]:
    forms = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in forms if f not in FORMS]
    if bad or not forms:
        raise argparse.ArgumentTypeError(f"unknown form(s) {bad}; known: {','.join(FORMS)}")
    return forms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/nvio-bench"))
    ap.add_argument("--ramdisk", action="store_true", help="a RAM-backed ext4 (root only)")
    ap.add_argument("--size", type=parse_size, default=512 << 20, help="file size (512M)")
    ap.add_argument("--ops", type=positive_int, default=65536, help="reads a timed run (65536)")
    ap.add_argument("--qd", type=positive_int, default=128, help="queue depth (128)")
    ap.add_argument("--bs", type=parse_size, default=4096, help="bytes a read (4K)")
    ap.add_argument("--batch", type=positive_int, default=4096, help="reads a batch call (4096)")
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--forms", type=parse_forms, default=list(FORMS),
                    help=f"comma-separated subset of {','.join(FORMS)}")
    ap.add_argument("--fio", default="fio")
    ap.add_argument("--keep", action="store_true", help="keep the file (not with --ramdisk)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    if args.size < args.bs or args.size % args.bs:
        ap.error("--size must be a multiple of --bs")
    interrupt_on_sigterm()
    fio = shutil.which(args.fio)
    try:
        if args.ramdisk:
            with RamDisk(args.size) as rd:
                result = benchmark(args, rd.mnt, fio)
                where = f"ramdisk {rd.loop} (loop dio={rd.dio}), ext4"
                directory = rd.mnt
        else:
            args.dir.mkdir(parents=True, exist_ok=True)
            result = benchmark(args, args.dir, fio)
            where, directory = str(args.dir), args.dir
    except (Failure, KeyboardInterrupt) as e:
        return error_exit("random_python.py", e)
    nvio_cli = shutil.which("nvio") or str(REPO / "build" / "bin" / "nvio")
    result["machine"] = machine_info(nvio_cli, directory, fio=fio) if Path(nvio_cli).exists() \
        else None
    result["machine_where"] = where
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    s = result["settings"]
    print(f"random reads, {human(s['bs'])} at queue depth {s['qd']}, {s['ops']} reads a run, "
          f"{human(s['size'])} file on {where}; medians of {s['rounds']} rounds")
    print(f"{'form':<15}{'ops/s':>12}{'x fio':>8}{'CPU us/op':>11}")
    for form, m in result["median_ops_per_s"].items():
        ratio = result["ratio_to_fio"][form]
        cpu = result["median_cpu_us_per_op"].get(form)
        print(f"{form:<15}{m:>12,.0f}{'-' if ratio is None else format(ratio, '.2f'):>8}"
              f"{'-' if cpu is None else format(cpu, '.1f'):>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
