"""nvio.save / nvio.load against torch.save + fsync / torch.load (issue 27 item 6), and against
`nvio bench --op read` of the same file.

A state dict of 100 tensors of mixed sizes (fp32 and bf16, like a transformer's) of about --size
bytes. Saves: nvio.save (durable: fsync'd and renamed into place) against torch.save + flush +
fsync, each to its own file. Loads, all of the one file torch.save wrote: nvio.load, torch.load,
both again with mmap=True (n/a where this build's nvio.load has no mmap), and nvio.load(into=) the
existing state dict; each cold (the file's pages dropped: fsync + posix_fadvise DONTNEED) and
warm (read once before); and `nvio bench --op read` of the file, cold. A load's time includes
touching one byte of every page of every tensor (a mmap'd load reads the file only then).

All in this one process, in rounds whose order rotates (benchlib.alternate), so that the load of
a shared machine hits all alike; medians, GB/s of the tensors' bytes and the ratios are printed.
On a RAM-backed directory (/dev/shm) only warm loads are run (the file cannot be dropped).

    PYTHONPATH=build/python .venv/bin/python bench/checkpoint_bench.py --dir /var/tmp --size 1G --rounds 3
    PYTHONPATH=build/python .venv/bin/python bench/checkpoint_bench.py --dir /dev/shm --size 256M --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from benchlib import drop_cache, log, parse_size, positive_int  # noqa: E402
from safetensors_bench import touch  # noqa: E402


def state_dict(torch, total: int) -> dict:
    """100 tensors: a few large matrices and many small vectors, fp32 and bf16, ~total bytes."""
    weights = [8, 1, 1, 4, 0.01, 0.01] * 16 + [8, 4, 1, 1]
    unit = total / sum(w * (2 if i % 3 == 2 else 4) for i, w in enumerate(weights))
    sd = {}
    g = torch.Generator().manual_seed(0)
    for i, w in enumerate(weights):
        dtype = torch.bfloat16 if i % 3 == 2 else torch.float32
        n = max(1, int(w * unit))
        sd[f"layer{i // 6}.p{i % 6}"] = torch.randn(n, generator=g).to(dtype)
    return sd


_PEAK_CHILD = r"""
import sys, torch, nvio
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
base = hwm()
sd = nvio.load(sys.argv[1])
print(hwm() - base)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"),
                    help="where the files go (a directory of their own is made inside)")
    ap.add_argument("--size", type=parse_size, default=1 << 30, help="bytes of tensors (1G, 256M)")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--nvio", default=None, help="the nvio CLI (default build/bin/nvio)")
    ap.add_argument("--peak", action="store_true",
                    help="also the peak memory of a child process doing nvio.load (VmHWM growth)")
    ap.add_argument("--only", metavar="WORDS",
                    help="run only the contenders whose name contains one of these "
                    "comma-separated words (e.g. 'cold')")
    ap.add_argument("--profile", metavar="NAME",
                    help="after the rounds, cProfile one run of this contender (e.g. "
                    "'nvio.load cold')")
    args = ap.parse_args()
    benchlib.interrupt_on_sigterm()
    import torch

    import nvio

    nvio_cli = benchlib.find_nvio(args.nvio)
    args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="nvio-ckpt-bench-", dir=args.dir))
    ram = benchlib.ram_backed(work)
    nvio_mmap = "mmap" in inspect.signature(nvio.load).parameters
    try:
        sd = state_dict(torch, args.size)
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        path = work / "torch.pt"  # what every load reads
        torch.save(sd, path)
        size = path.stat().st_size

        def torch_save() -> float:
            t0 = time.perf_counter()
            with open(work / "torch-save.pt", "wb") as f:
                torch.save(sd, f)
                f.flush()
                os.fsync(f.fileno())
            return time.perf_counter() - t0

        def nvio_save() -> float:
            t0 = time.perf_counter()
            nvio.save(sd, work / "nvio-save.pt")
            return time.perf_counter() - t0

        def loader(fn, cold: bool, available: bool = True):
            def run():
                if not available:
                    return None
                drop_cache(path) if cold else benchlib.warm([path])
                gc.collect()
                t0 = time.perf_counter()
                out = fn()
                touch(torch, out)
                dt = time.perf_counter() - t0
                del out
                return dt
            return run

        def bench_read() -> float:
            drop_cache(path)
            return benchlib.nvio_read_seconds(nvio_cli, path, size)

        contenders = {"nvio.save": nvio_save, "torch.save+fsync": torch_save}
        for mode in (["warm"] if ram else ["cold", "warm"]):
            cold = mode == "cold"
            contenders[f"nvio.load {mode}"] = loader(lambda: nvio.load(path), cold)
            contenders[f"torch.load {mode}"] = loader(lambda: torch.load(path), cold)
            contenders[f"nvio.load mmap {mode}"] = loader(
                lambda: nvio.load(path, mmap=True), cold, nvio_mmap)
            contenders[f"torch.load mmap {mode}"] = loader(
                lambda: torch.load(path, mmap=True), cold)
            contenders[f"nvio.load into {mode}"] = loader(lambda: nvio.load(path, into=sd), cold)
        contenders["nvio bench read" + (" warm" if ram else " cold")] = bench_read
        log(benchlib.bench_header("checkpoint", work, nbytes, args.rounds))
        profiled = contenders.get(args.profile)
        if args.profile and profiled is None:
            raise benchlib.Failure(f"--profile {args.profile!r}: one of {list(contenders)}")
        contenders = benchlib.select(contenders, args.only)
        times = benchlib.alternate(contenders, args.rounds)
        print(benchlib.bench_header(f"torch {torch.__version__} vs nvio, {len(sd)} tensors "
                                    f"(file {size / 2**30:.3f} GiB)", args.dir, nbytes,
                                    args.rounds))
        med = benchlib.print_times(times, nbytes)
        print(benchlib.ratio_line(med, "nvio.save", "torch.save+fsync"))
        for mode in (["warm"] if ram else ["cold", "warm"]):
            print(benchlib.ratio_line(med, f"nvio.load {mode}", f"torch.load {mode}"))
            print(benchlib.ratio_line(med, f"nvio.load mmap {mode}", f"torch.load mmap {mode}"))
            print(benchlib.ratio_line(med, f"nvio.load {mode}", f"torch.load mmap {mode}"))
        read = "nvio bench read" + (" warm" if ram else " cold")
        first = "warm" if ram else "cold"
        print(benchlib.ratio_line(med, f"nvio.load {first}", read))
        print(benchlib.ratio_line(med, f"nvio.load into {first}", read))
        if args.peak:
            drop_cache(path)
            peak = int(subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(path)], check=True,
                                      capture_output=True, text=True).stdout)
            print(f"  peak memory of nvio.load: {peak / 2**20:.0f} MiB over the interpreter, "
                  f"file {size / 2**20:.0f} MiB ({peak / size:.3f}x)")
        if args.profile:
            benchlib.profile_call(args.profile, profiled)
    except (benchlib.Failure, KeyboardInterrupt) as e:
        return benchlib.error_exit("checkpoint_bench", e)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
