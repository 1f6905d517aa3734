"""One rank of the sharded-checkpoint tests (tests/python/test_sharded.py), started as a process:

    _sharded_worker.py STORE RANK WORLD MODE DIR OUT

MODE "save": saves this rank's part of expected_state(WORLD) with nvio.save_sharded.
MODE "split": loads its part with nvio.load_sharded(keys="split") and torch.saves it to OUT.
MODE "fail1": as "save", but rank 1 gives a tensor that conflicts with rank 0's.
MODE "badtype": as "save", but rank 1 gives a list among its tensors (refused before any
collective on that rank alone).
MODE "badmeta": as "save", but rank 1 gives metadata that is not str -> str (refused while the
shards are written, after rank 0 wrote its own).
"""

import datetime
import sys

import torch
import torch.distributed as dist

import nvio


def expected_state(world):
    """What rank r holds: its own layers (odd sizes, several dtypes) and a replicated bias."""
    parts = []
    for r in range(world):
        g = torch.Generator().manual_seed(1000 + r)
        sd = {
            f"layer{r}.weight": torch.randn(257, 33, generator=g),
            f"layer{r}.half": torch.randn(4095, generator=g).to(torch.bfloat16),
            f"layer{r}.index": torch.randint(0, 1 << 40, (123,), generator=g),
            f"layer{r}.mask": torch.rand(17, generator=g) > 0.5,
            "shared.bias": torch.arange(11, dtype=torch.float64),
        }
        parts.append(sd)
    return parts


def main():
    store, rank, world, mode, directory, out = sys.argv[1:7]
    rank, world = int(rank), int(world)
    # A hang in a collective fails the test in a minute, not in gloo's default 30.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        if mode in ("save", "fail1", "badtype", "badmeta"):
            mine = expected_state(world)[rank]
            metadata = None
            if mode == "fail1" and rank == 1:
                mine["shared.bias"] = torch.zeros(12, dtype=torch.float64)
            if mode == "badtype" and rank == 1:
                mine["not.a.tensor"] = [1, 2, 3]
            if mode == "badmeta" and rank == 1:
                metadata = {"step": 7}
            try:
                nvio.save_sharded(mine, directory, metadata=metadata)
            except nvio.Error as e:
                print(f"ERROR {e}", flush=True)
                return 3
        elif mode == "split":
            torch.save(nvio.load_sharded(directory, keys="split"), out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
