#!/usr/bin/env python3
"""nvio's aio_handle against the async_io op DeepSpeed builds (issue 30 #5), at equal settings.

For every folder (--dirs; default a RAM-backed one, /dev/shm, and a disk one, /var/tmp) x tensor
kind (locked: each handle's own new_cpu_locked_tensor; ordinary: torch.empty) x size (--sizes) x
operation (read, write), both handles move the same number of bytes to the same file with
sync_pread / sync_pwrite, one after the other, once per round; which goes first alternates from
round to round. Both are built with the same block size, queue depth, single_submit,
overlap_events and intra_op_parallelism (the flags below). Reported per configuration: the median
GB/s (1e9 bytes/s) of each, the ratio nvio / DeepSpeed, and the median CPU seconds per GB of each
(getrusage(RUSAGE_SELF) around the timed calls: all threads of the process, worker threads
included; only one handle works at a time).

--zero-steps N also times ZeRO-Infinity (tests/python/_ds_zero_worker.py: ZeRO-3, optimizer and
parameters offloaded to nvme in --zero-dir, one rank, DeepSpeed's CPU accelerator) on DeepSpeed's
op and on nvio's, alternating, --zero-rounds times each: the median step time of steps 3..N.

Needs the real DeepSpeed with its ops built (scripts/deepspeed_ops.sh). Run from the repository:
    PYTHONPATH=build/python .venv/bin/python bench/deepspeed_compare.py --rounds 5 --zero-steps 12
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import _ds_real  # noqa: E402

MIB = 1 << 20


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def handles(args):
    """(DeepSpeed's aio_handle, nvio's aio_handle), built with the same settings."""
    import nvio
    import nvio.deepspeed
    from deepspeed.ops.op_builder import AsyncIOBuilder

    nvio.deepspeed.uninstall()
    settings = (args.block_size, args.queue_depth, args.single_submit, args.overlap_events,
                args.intra_op_parallelism)
    theirs = AsyncIOBuilder().load(verbose=False).aio_handle(*settings)
    assert not isinstance(theirs, nvio.aio_handle)
    return theirs, nvio.aio_handle(*settings)


def timed(handle, op: str, tensor, path: str, repeats: int) -> "tuple[float, float]":
    call = handle.sync_pread if op == "read" else handle.sync_pwrite
    cpu, wall = cpu_seconds(), time.perf_counter()
    for _ in range(repeats):
        if call(tensor, path) != 1:
            raise RuntimeError(f"{type(handle).__module__} {op} of {path} failed")
    return time.perf_counter() - wall, cpu_seconds() - cpu


def buffers(handle, kind: str, size: int):
    import torch

    if kind == "locked":
        return handle.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
    return torch.empty(size, dtype=torch.uint8)


def measure(args, folder: str, kind: str, size: int, op: str, pair) -> dict:
    import torch

    repeats = max(1, args.bytes_per_sample // size)
    path = os.path.join(folder, f"nvio-ds-compare-{os.getpid()}.bin")
    data = torch.randint(0, 256, (size,), dtype=torch.uint8)
    with open(path, "wb") as f:
        f.write(data.numpy().tobytes())
    tensors = [buffers(h, kind, size) for h in pair]
    for t in tensors:
        t.copy_(data)
    samples = {"deepspeed": [], "nvio": []}
    try:
        for h, t in zip(pair, tensors):  # one untimed call each: first-use costs
            timed(h, op, t, path, 1)
        for r in range(args.rounds):
            order = [0, 1] if r % 2 == 0 else [1, 0]
            for i in order:
                wall, cpu = timed(pair[i], op, tensors[i], path, repeats)
                samples[("deepspeed", "nvio")[i]].append((wall, cpu))
    finally:
        os.unlink(path)
    total = repeats * size
    row = {"dir": folder, "kind": kind, "size": size, "op": op, "bytes": total}
    for name, got in samples.items():
        row[f"{name}_gb_s"] = statistics.median(total / w / 1e9 for w, _ in got)
        row[f"{name}_cpu_s_per_gb"] = statistics.median(c / (total / 1e9) for _, c in got)
    row["ratio"] = row["nvio_gb_s"] / row["deepspeed_gb_s"]
    return row


def zero_step_times(args) -> dict:
    from _ds_zero_worker import launch

    times = {"deepspeed": [], "nvio": []}
    aio = {"block_size": args.block_size, "queue_depth": args.queue_depth,
           "single_submit": args.single_submit, "overlap_events": args.overlap_events,
           "intra_op_parallelism": args.intra_op_parallelism}
    for r in range(args.zero_rounds):
        for use_nvio in ([False, True] if r % 2 == 0 else [True, False]):
            with tempfile.TemporaryDirectory(dir=args.zero_dir) as folder:
                result = launch(folder, 1, use_nvio, steps=args.zero_steps, aio=aio)[0]
            times["nvio" if use_nvio else "deepspeed"].extend(result["seconds"][2:])
    return {name: statistics.median(t) for name, t in times.items()}


def table(rows: list) -> str:
    lines = ["| dir | tensor | size | op | DeepSpeed GB/s | nvio GB/s | nvio/DS | "
             "DS CPU s/GB | nvio CPU s/GB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dir']} | {r['kind']} | {r['size'] // MIB} MiB | {r['op']} | "
                     f"{r['deepspeed_gb_s']:.2f} | {r['nvio_gb_s']:.2f} | {r['ratio']:.2f} | "
                     f"{r['deepspeed_cpu_s_per_gb']:.3f} | {r['nvio_cpu_s_per_gb']:.3f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dirs", nargs="+", default=["/dev/shm", "/var/tmp"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[1, 4, 16], help="MiB")
    ap.add_argument("--kinds", nargs="+", default=["locked", "ordinary"],
                    choices=["locked", "ordinary"])
    ap.add_argument("--ops", nargs="+", default=["read", "write"], choices=["read", "write"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bytes-per-sample", type=int, default=64 * MIB)
    ap.add_argument("--block-size", type=int, default=MIB)
    ap.add_argument("--queue-depth", type=int, default=8)
    ap.add_argument("--single-submit", action="store_true")
    ap.add_argument("--no-overlap-events", dest="overlap_events", action="store_false")
    ap.add_argument("--intra-op-parallelism", type=int, default=1)
    ap.add_argument("--zero-steps", type=int, default=0, help="0: no ZeRO timing")
    ap.add_argument("--zero-rounds", type=int, default=2)
    ap.add_argument("--zero-dir", default="/var/tmp")
    ap.add_argument("--json", help="also write the rows here")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    reason = _ds_real.missing_reason()
    if reason is not None:
        print(f"deepspeed_compare: {reason}", file=sys.stderr)
        return 2
    pair = handles(args)
    rows = []
    for folder in args.dirs:
        for kind in args.kinds:
            for size in args.sizes:
                for op in args.ops:
                    rows.append(measure(args, folder, kind, size * MIB, op, pair))
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\nsettings: block_size={args.block_size} queue_depth={args.queue_depth} "
          f"single_submit={args.single_submit} overlap_events={args.overlap_events} "
          f"intra_op_parallelism={args.intra_op_parallelism}; {args.rounds} rounds, "
          f"{args.bytes_per_sample // MIB} MiB per sample, medians\n")
    print(table(rows))
    result = {"rows": rows}
    if args.zero_steps:
        result["zero_step_s"] = zero_step_times(args)
        z = result["zero_step_s"]
        print(f"\nZeRO-Infinity step (median of steps 3..{args.zero_steps}, "
              f"{args.zero_rounds} runs each): DeepSpeed {z['deepspeed']:.3f} s, "
              f"nvio {z['nvio']:.3f} s, nvio/DeepSpeed {z['nvio'] / z['deepspeed']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
