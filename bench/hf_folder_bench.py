"""Loading a Hugging Face model folder (model.safetensors.index.json and its shards; issue 27
items 5 and 6): the reference `safetensors.torch.load_file` shard after shard (what
transformers does) against nvio's call for a whole folder, and against `nvio bench --op read` of
the same bytes: one file holding the shards one after another (the goal's yardstick) and each
shard file read by its own `nvio bench` (the sum of their times).

The folder, about --size bytes of --tensors tensors of mixed dtypes and sizes in --shards
shards, is written with the reference package (save_file per shard, metadata {"format": "pt"},
the index with total_size and weight_map, as save_pretrained writes them). nvio's side is
chosen with --nvio-calls (comma-separated, each its own contender):

  auto        the first of FOLDER_CALLS that this build of nvio has, else nvio.load_sharded
  per-shard   nvio.safetensors.load_file of each shard in turn
  a name      a dotted function, e.g. nvio.load_sharded, called with the folder's path

Rounds alternate (benchlib.alternate), cold (every file's pages dropped) and warm; a load's time
includes touching one byte of every page of every tensor. On a RAM-backed directory only warm.

    PYTHONPATH=build/python .venv/bin/python bench/hf_folder_bench.py --dir /var/tmp --size 1G --rounds 3
    PYTHONPATH=build/python .venv/bin/python bench/hf_folder_bench.py --dir /dev/shm --size 256M --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from benchlib import log, parse_size, positive_int  # noqa: E402
from safetensors_bench import make_tensors, same, touch  # noqa: E402

# Names a one-call folder loader may have in nvio (issue 27 item 5); `auto` takes the first found.
FOLDER_CALLS = ("nvio.safetensors.load_model_folder", "nvio.safetensors.load_folder",
                "nvio.load_folder", "nvio.load_sharded")


def resolve(name: str):
    """The function a dotted name names, or None if the module or attribute is missing."""
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None


def write_folder(ref, tensors: dict, folder: Path, shards: int) -> list:
    """The tensors in `shards` files of about equal size (in order, as save_pretrained splits),
    with the index; returns the shard paths."""
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    per = total / shards
    groups: list = [[]]
    size = 0
    for name, t in tensors.items():
        if size >= per * len(groups) and len(groups) < shards:
            groups.append([])
        groups[-1].append(name)
        size += t.numel() * t.element_size()
    paths, weight_map = [], {}
    for i, names in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        ref.save_file({n: tensors[n] for n in names}, str(folder / fname),
                      metadata={"format": "pt"})
        paths.append(folder / fname)
        weight_map.update({n: fname for n in names})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"),
                    help="where the folder goes (a directory of its own is made inside)")
    ap.add_argument("--size", type=parse_size, default=1 << 30, help="bytes of tensors (1G, 256M)")
    ap.add_argument("--tensors", type=positive_int, default=300)
    ap.add_argument("--shards", type=positive_int, default=4)
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--nvio-calls", default="auto,per-shard",
                    help="nvio's contenders: auto, per-shard or dotted function names")
    ap.add_argument("--nvio", default=None, help="the nvio CLI (default build/bin/nvio)")
    ap.add_argument("--only", metavar="WORDS",
                    help="run only the contenders whose name contains one of these "
                    "comma-separated words (e.g. 'cold')")
    ap.add_argument("--profile", metavar="NAME",
                    help="after the rounds, cProfile one run of this contender")
    args = ap.parse_args()
    benchlib.interrupt_on_sigterm()
    import safetensors.torch as ref
    import torch

    from nvio import safetensors as st

    nvio_cli = benchlib.find_nvio(args.nvio)
    args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="nvio-hf-bench-", dir=args.dir))
    ram = benchlib.ram_backed(work)
    try:
        folder = work / "model"
        folder.mkdir()
        tensors = make_tensors(torch, args.size, args.tensors)
        shards = write_folder(ref, tensors, folder, args.shards)
        del tensors
        nbytes = sum(p.stat().st_size for p in shards)
        whole = work / "all-shards.bin"  # the same bytes in one file, for `nvio bench`
        with open(whole, "wb") as out:
            for p in shards:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out, 16 << 20)

        def ref_per_shard() -> dict:
            out: dict = {}
            for p in shards:
                out.update(ref.load_file(str(p)))
            return out

        calls = {}
        for name in args.nvio_calls.split(","):
            if name == "per-shard":
                calls["nvio per-shard load_file"] = lambda: {
                    k: v for p in shards for k, v in st.load_file(p).items()}
                continue
            fname = next((n for n in FOLDER_CALLS if resolve(n)), None) if name == "auto" else name
            fn = resolve(fname) if fname else None
            if fn is None:
                raise benchlib.Failure(f"--nvio-calls {name}: no such function in this nvio")
            calls[fname] = lambda fn=fn: fn(folder)
        expected = ref_per_shard()
        for name, fn in calls.items():
            if not same(torch, dict(sorted(fn().items())), dict(sorted(expected.items()))):
                raise benchlib.Failure(f"{name} loads other tensors than the reference")
        count = len(expected)
        del expected

        def loader(fn, cold: bool):
            def run() -> float:
                (benchlib.drop_caches if cold else benchlib.warm)([folder])
                gc.collect()
                t0 = time.perf_counter()
                out = fn()
                touch(torch, out)
                dt = time.perf_counter() - t0
                if len(out) != count:
                    raise benchlib.Failure(f"a load returned {len(out)} tensors, not {count}")
                del out
                return dt
            return run

        def read_whole() -> float:
            benchlib.drop_cache(whole)
            return benchlib.nvio_read_seconds(nvio_cli, whole, nbytes)

        def read_shards() -> float:
            benchlib.drop_caches(shards)
            return sum(benchlib.nvio_read_seconds(nvio_cli, p, p.stat().st_size) for p in shards)

        modes = ["warm"] if ram else ["cold", "warm"]
        contenders = {}
        for mode in modes:
            contenders[f"ref per-shard load_file {mode}"] = loader(ref_per_shard, mode == "cold")
            for name, fn in calls.items():
                contenders[f"{name} {mode}"] = loader(fn, mode == "cold")
        read = "warm" if ram else "cold"
        contenders[f"nvio bench read, 1 file {read}"] = read_whole
        contenders[f"nvio bench read, per shard {read}"] = read_shards
        log(benchlib.bench_header("HF folder", work, nbytes, args.rounds))
        profiled = contenders.get(args.profile)
        if args.profile and profiled is None:
            raise benchlib.Failure(f"--profile {args.profile!r}: one of {list(contenders)}")
        contenders = benchlib.select(contenders, args.only)
        times = benchlib.alternate(contenders, args.rounds)
        print(benchlib.bench_header(f"HF folder of {len(shards)} shards, {count} tensors",
                                    args.dir, nbytes, args.rounds))
        med = benchlib.print_times(times, nbytes)
        for mode in modes:
            for name in calls:
                print(benchlib.ratio_line(med, f"{name} {mode}", f"ref per-shard load_file {mode}"))
        for name in calls:
            print(benchlib.ratio_line(med, f"{name} {read}", f"nvio bench read, 1 file {read}",
                                      0.9))
            print(benchlib.ratio_line(med, f"{name} {read}", f"nvio bench read, per shard {read}"))
        if args.profile:
            benchlib.profile_call(args.profile, profiled)
    except (benchlib.Failure, KeyboardInterrupt) as e:
        return benchlib.error_exit("hf_folder_bench", e)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
