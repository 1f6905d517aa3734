"""Cold-cache load of a safetensors file of many tensors: nvio.safetensors.load_file against the
mmap way (torch.frombuffer over an mmap of the file, then a clone per tensor: what the reference
library does on the CPU) and against `nvio bench --op read` of the same bytes.

Each round runs the three in turn (interleaved, so a drift of the machine hits all alike), each
after dropping the file's pages from the page cache (posix_fadvise DONTNEED); the medians are
printed as GB/s of the file's size, with the ratios.

    PYTHONPATH=build/python /usr/bin/python3 bench/safetensors_bench.py --dir /var/tmp --size 1G
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import drop_cache  # bench/ is the script's directory


def make_file(path: Path, total: int, count: int) -> None:
    """`count` tensors of mixed dtypes and sizes (a transformer-like spread: a few large, many
    small) adding up to about `total` bytes."""
    import torch

    from nvio import safetensors as st

    weights = [1 + (i % 7) ** 3 for i in range(count)]
    scale = total / sum(weights)
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int64]
    tensors = {}
    for i, w in enumerate(weights):
        dtype = dtypes[i % len(dtypes)]
        size = torch.empty((), dtype=dtype).element_size()
        n = max(1, int(w * scale) // size)
        tensors[f"layer.{i}.weight"] = torch.full((n,), i % 100, dtype=dtype)
    st.save_file(tensors, path)


def load_mmap(path: Path) -> dict:
    import torch

    from nvio import safetensors as st

    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    n = int.from_bytes(m[:8], "little")
    header = json.loads(m[8:8 + n])
    base = 8 + n
    out = {}
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            dtype = st._to_torch_dtype(info["dtype"], name)
            raw = torch.frombuffer(m, dtype=torch.uint8, count=e - b, offset=base + b)
            out[name] = raw.view(dtype).reshape(info["shape"]).clone()
    return out


def nvio_bench(nvio_bin: str, path: Path, size: int) -> float:
    """Seconds of one `nvio bench --op read` of the file's bytes (one loop, cold)."""
    res = subprocess.run([nvio_bin, "bench", "--file", str(path), "--op", "read", "--size",
                          str(size), "--loops", "1", "--json"], check=True, capture_output=True,
                         text=True)
    return json.loads(res.stdout)["results"][0]["seconds"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--size", default="1G", help="bytes of tensors (K/M/G)")
    ap.add_argument("--tensors", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nvio", default="build/bin/nvio")
    args = ap.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    total = int(args.size[:-1]) * units[args.size[-1]] if args.size[-1] in units else int(args.size)

    from nvio import safetensors as st

    path = Path(args.dir) / f"nvio-st-bench-{os.getpid()}.safetensors"
    try:
        make_file(path, total, args.tensors)
        size = path.stat().st_size
        times = {"nvio load_file": [], "mmap + clone": [], "nvio bench --op read": []}
        for r in range(args.rounds):
            for name in times:
                drop_cache(path)
                if name == "nvio bench --op read":
                    times[name].append(nvio_bench(args.nvio, path, size))
                    continue
                start = time.perf_counter()
                out = st.load_file(path) if name == "nvio load_file" else load_mmap(path)
                times[name].append(time.perf_counter() - start)
                del out
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        print(f"file {size / 2**30:.2f} GiB, {args.tensors} tensors, {args.rounds} rounds, "
              f"cold cache, load average {load}")
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in med.items():
            print(f"  {k:22s} {size / v / 1e9:6.2f} GB/s  (median {v:.3f} s; "
                  f"{', '.join(f'{x:.3f}' for x in times[k])})")
        print(f"  load_file / mmap         {med['mmap + clone'] / med['nvio load_file']:.2f}x")
        print(f"  load_file / bench read   {med['nvio bench --op read'] / med['nvio load_file']:.2f}x")
    finally:
        path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
