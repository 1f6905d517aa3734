"""nvio.safetensors against the reference `safetensors` package (issue 27 item 6): save_file
against the reference's save_file + fsync, load_file against the reference's load_file with the
file's pages cold (dropped: fsync + posix_fadvise DONTNEED) and warm (read once before), and
against `nvio bench --op read` of the same file, and against a numpy memmap copy of the file
(the whole file into memory of its own: the speed a cached load that returns owned tensors can
reach).

One file of --tensors tensors of mixed dtypes and sizes (a transformer-like spread: a few large,
many small), about --size bytes, written by the reference, is what every load reads; each save
writes its own file. All contenders run in this one process, in rounds whose order rotates (see
benchlib.alternate), so that the load of a shared machine hits all alike; the medians, GB/s of
the file's size and the ratios with the issue's goals are printed. A load's time includes
touching one byte of every page of every tensor it returns (the reference's mmap backend maps
the file and reads it only when touched). On a RAM-backed directory (/dev/shm) the file always
lives in the page cache: only warm loads are run.

    PYTHONPATH=build/python .venv/bin/python bench/safetensors_bench.py --dir /var/tmp --size 1G --rounds 3
    PYTHONPATH=build/python .venv/bin/python bench/safetensors_bench.py --dir /dev/shm --size 256M --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from benchlib import drop_cache, positive_int  # noqa: E402


def make_tensors(torch, total: int, count: int) -> dict:
    """`count` tensors of mixed dtypes and sizes adding up to about `total` bytes."""
    weights = [1 + (i % 7) ** 3 for i in range(count)]
    scale = total / sum(weights)
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int64]
    tensors = {}
    for i, w in enumerate(weights):
        dtype = dtypes[i % len(dtypes)]
        n = max(1, int(w * scale) // torch.empty((), dtype=dtype).element_size())
        tensors[f"layer.{i}.weight"] = torch.full((n,), i % 100, dtype=dtype)
    return tensors


def touch(torch, tensors: dict) -> int:
    """Reads one byte of every 4 KiB page of every tensor (faults in a lazily mapped one)."""
    total = 0
    for t in tensors.values():
        if t.numel():
            total += int(t.reshape(-1).view(torch.uint8)[::4096].sum())
    return total


def same(torch, a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    benchlib.common_args(ap)
    ap.add_argument("--tensors", type=positive_int, default=200)
    ap.add_argument("--ref-backends", default="mmap,pread",
                    help="the reference load_file backends to run (safetensors >= 0.7 has pread)")
    ap.add_argument("--no-save", action="store_true", help="loads only")
    args = ap.parse_args()
    benchlib.interrupt_on_sigterm()
    import numpy as np
    import safetensors
    import safetensors.torch as ref
    import torch

    from nvio import safetensors as st

    nvio_cli = benchlib.find_nvio(args.nvio)
    args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="nvio-st-bench-", dir=args.dir))
    modes = ["warm"] if benchlib.ram_backed(work) else ["cold", "warm"]
    backends = args.ref_backends.split(",")
    try:
        tensors = make_tensors(torch, args.size, args.tensors)
        path = work / "model.safetensors"
        ref.save_file(tensors, str(path))
        size = path.stat().st_size
        if not same(torch, st.load_file(path), ref.load_file(str(path))):
            raise benchlib.Failure("nvio load_file and the reference's differ on the bench file")

        def ref_save() -> float:
            out = work / "ref-save.safetensors"
            t0 = time.perf_counter()
            ref.save_file(tensors, str(out))
            fd = os.open(out, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return time.perf_counter() - t0

        def nvio_save() -> float:
            t0 = time.perf_counter()
            st.save_file(tensors, work / "nvio-save.safetensors")  # durable: fsync'd, renamed
            return time.perf_counter() - t0

        def checked(out: dict) -> None:
            touch(torch, out)
            if len(out) != len(tensors):
                raise benchlib.Failure(f"a load returned {len(out)} tensors, not {len(tensors)}")

        def bench_read(cold: bool):
            def run() -> float:
                drop_cache(path) if cold else benchlib.warm([path])
                return benchlib.nvio_read_seconds(nvio_cli, path, size)
            return run

        contenders: dict = {}
        if not args.no_save:
            contenders["nvio save_file"] = nvio_save
            contenders["ref save_file+fsync"] = ref_save
        for mode in modes:
            cold = mode == "cold"
            contenders[f"nvio load_file {mode}"] = benchlib.timed_load(
                lambda: st.load_file(path), [path], cold, checked)
            for b in backends:
                # The default backend without the keyword: safetensors < 0.7 has none.
                fn = ((lambda: ref.load_file(str(path))) if b == "mmap" else
                      (lambda b=b: ref.load_file(str(path), backend=b)))
                contenders[f"ref load_file({b}) {mode}"] = benchlib.timed_load(
                    fn, [path], cold, checked)
            # The file copied into memory of its own through a mapping: what a load that returns
            # owned tensors can reach when the file is cached.
            contenders[f"numpy memmap copy {mode}"] = benchlib.timed_load(
                lambda: np.array(np.memmap(path, dtype=np.uint8, mode="r")), [path], cold)
            if cold or modes == ["warm"]:
                contenders[f"nvio bench read {mode}"] = bench_read(cold)
        med, profiled = benchlib.run_rounds(
            args, contenders, f"safetensors {safetensors.__version__} vs nvio, {args.tensors} "
            "tensors, file", work, size)
        if not args.no_save:
            print(benchlib.ratio_line(med, "nvio save_file", "ref save_file+fsync", 2))
        for mode in modes:
            ours = f"nvio load_file {mode}"
            for b in backends:
                print(benchlib.ratio_line(med, ours, f"ref load_file({b}) {mode}",
                                          2 if mode == "cold" else None))
            print(benchlib.ratio_line(med, ours, f"numpy memmap copy {mode}",
                                      1.0 if mode == "warm" else None))
            if f"nvio bench read {mode}" in med:
                print(benchlib.ratio_line(med, ours, f"nvio bench read {mode}", 0.9))
        benchlib.finish(args, profiled)
    except (benchlib.Failure, KeyboardInterrupt) as e:
        return benchlib.error_exit("safetensors_bench", e)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
