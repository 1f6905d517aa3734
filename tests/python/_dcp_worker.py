"""One of the three ranks of tests/python/test_dcp_ranks.py, started as a process:

    _dcp_worker.py STORE RANK DIR

One world of three gloo ranks on the CPU runs every case, on process groups of 1, 2 and 3 of its
ranks (one start of three interpreters instead of one per case): a checkpoint saved on N ranks is
loaded on M, for (N, M) in (1, 2), (2, 1), (2, 3), (3, 2), written and read by nvio.dcp and by
torch's FileSystemWriter / FileSystemReader in both directions. The state: plain tensors, DTensors
sharded by rows and by columns over a device mesh of the group, a model wrapped with FSDP2's
fully_shard, and a non-tensor value. After each load every rank compares the bytes it holds with
what it should hold. Then a save on 2 ranks where rank 1 fails mid-save must raise on both, naming
rank 1, and leave the previous checkpoint in that directory loadable; then async_save.

Each rank writes its findings to DIR/result-RANK.json: {"checks": [...], "errors": [...]}.
"""

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

import nvio
import nvio.dcp

WORLD = 3


def full_values():
    g = torch.Generator().manual_seed(31)
    return {
        # Most above 8 KiB: read in part (only the rows a rank needs), not whole.
        "plain.w": torch.randn(137, 19, generator=g),
        "plain.idx": torch.randint(0, 1 << 40, (11,), generator=g),
        "plain.half": torch.randn(10000, generator=g).to(torch.bfloat16),
        "dt.rows": torch.randn(30001, 7, generator=g),  # most of the bytes
        "dt.cols": torch.randn(40, 301, generator=g).to(torch.float64),  # read through scratch
    }


def model(mesh, zero):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    fully_shard(m, mesh=mesh)
    if zero:
        with torch.no_grad():
            for p in m.parameters():
                p.zero_()
    return m


def state(mesh, zero):
    """The state dict every rank of the group holds; zeroed, the one a load fills."""
    full = full_values()
    fill = (lambda t: torch.zeros_like(t)) if zero else (lambda t: t)
    sd = {k: fill(v) for k, v in full.items() if k.startswith("plain.")}
    sd["dt.rows"] = distribute_tensor(fill(full["dt.rows"]), mesh, [Shard(0)])
    sd["dt.cols"] = distribute_tensor(fill(full["dt.cols"]), mesh, [Shard(1)])
    sd["model"] = model(mesh, zero).state_dict()
    sd["step"] = 0 if zero else 1234
    return sd


def raw(t):
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.contiguous().view(torch.uint8).reshape(-1)


def compare(got, want, where, findings):
    for key, value in want.items():
        if isinstance(value, dict):
            compare(got[key], value, f"{where}.{key}", findings)
        elif isinstance(value, torch.Tensor):
            g = got[key]
            same = (type(g) is type(value) and g.shape == value.shape and g.dtype == value.dtype
                    and torch.equal(raw(g), raw(value)))
            if not same:
                findings["errors"].append(f"{where}.{key}: bytes differ")
        elif got[key] != value:
            findings["errors"].append(f"{where}.{key}: {got[key]!r} != {value!r}")
    findings["checks"].append(where)


def writer(kind, path):
    return nvio.dcp.FileSystemWriter(path) if kind == "nvio" else dcp.FileSystemWriter(path)


def reader(kind, path):
    return nvio.dcp.FileSystemReader(path) if kind == "nvio" else dcp.FileSystemReader(path)


def save(mesh, group, kind, path):
    dcp.save(state(mesh, False), storage_writer=writer(kind, path), process_group=group)


def local_bytes(sd):
    total = 0
    for v in sd.values():
        if isinstance(v, dict):
            total += local_bytes(v)
        elif isinstance(v, torch.Tensor):
            t = v.to_local() if hasattr(v, "to_local") else v
            total += t.numel() * t.element_size()
    return total


def load_and_check(mesh, group, kind, path, findings, what):
    sd = state(mesh, True)
    handle = nvio.Handle()
    rd = nvio.dcp.FileSystemReader(path, handle=handle) if kind == "nvio" else reader(kind, path)
    dcp.load(sd, storage_reader=rd, process_group=group)
    compare(sd, state(mesh, False), what, findings)
    if kind == "nvio":
        # Only what this rank needs: its tensors' bytes, the ends of each stored archive, and
        # for the column-sharded tensor the rows' span of each stored chunk it overlaps.
        probes = sum(min(info.length, 2 * 4096) for info in rd.storage_data.values())
        cols = full_values()["dt.cols"]
        limit = local_bytes(sd) + probes + cols.numel() * cols.element_size()
        got = handle.stats()["bytes_read"]
        if got > limit:
            findings["errors"].append(f"{what}: read {got} bytes, at most {limit} needed")


def failing_save(mesh, group, rank, path, findings):
    """Rank 1's data file fails part way (the disk fills after the first half of its pieces)."""
    real = nvio.dcp.write_data_file

    def half_then_full(handle, target, layout, sync):
        from nvio._handle import shared_handle

        h = shared_handle()
        file = nvio._nvio.ReplacementFile(h._core, target)
        try:
            h.write_batch(layout.storages[:len(layout.storages) // 2], file.fd)
            raise nvio.NoSpace(f"injected: no space left on the device writing {target!r}")
        finally:
            file.discard()

    if rank == 1:
        nvio.dcp.write_data_file = half_then_full
    try:
        save(mesh, group, "nvio", path)
        findings["errors"].append("the failing save returned")
    except dcp.api.CheckpointException as e:
        failed = sorted(e.failures)
        text = str(e)
        if failed != [1] or "ranks:dict_keys([1])" not in text or "injected" not in text:
            findings["errors"].append(f"failure not named: {failed} {text[:300]}")
        findings["checks"].append("failing save raised naming rank 1")
    finally:
        nvio.dcp.write_data_file = real


def main():
    store, rank, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    findings = {"checks": [], "errors": []}
    try:
        # Every rank takes part in making each group and mesh (new_group is collective).
        groups = {n: dist.new_group(list(range(n))) if n < WORLD else dist.group.WORLD
                  for n in (1, 2, 3)}
        meshes = {n: DeviceMesh("cpu", list(range(n))) for n in (1, 2, 3)}
        d = {name: os.path.join(root, name) for name in ("a1", "s1", "a2", "a3", "a4")}

        def on(n, fn, *args):
            if rank < n:
                try:
                    fn(meshes[n], groups[n], *args)
                except BaseException:  # recorded; the other ranks still meet at the barrier
                    findings["errors"].append(f"{fn.__name__}{args[:2]}: "
                                              + traceback.format_exc())
            dist.barrier()

        on(1, save, "nvio", d["a1"])
        on(1, save, "stock", d["s1"])
        on(2, load_and_check, "nvio", d["a1"], findings, "1->2 nvio->nvio")
        on(2, load_and_check, "nvio", d["s1"], findings, "1->2 stock->nvio")
        on(2, save, "nvio", d["a2"])
        on(1, load_and_check, "stock", d["a2"], findings, "2->1 nvio->stock")
        on(1, load_and_check, "nvio", d["a2"], findings, "2->1 nvio->nvio")
        on(3, load_and_check, "nvio", d["a2"], findings, "2->3 nvio->nvio")
        on(3, load_and_check, "stock", d["a2"], findings, "2->3 nvio->stock")
        on(3, save, "nvio", d["a3"])
        on(2, load_and_check, "nvio", d["a3"], findings, "3->2 nvio->nvio")
        on(2, load_and_check, "stock", d["a3"], findings, "3->2 nvio->stock")
        on(2, failing_save, rank, d["a2"], findings)
        on(2, load_and_check, "nvio", d["a2"], findings, "after the failed save")
        on(2, load_and_check, "stock", d["a2"], findings, "after the failed save, stock")

        def async_case(mesh, group):
            fut = dcp.async_save(state(mesh, False),
                                 storage_writer=nvio.dcp.FileSystemWriter(d["a4"]),
                                 process_group=group)
            fut.result()

        on(2, async_case)
        on(2, load_and_check, "stock", d["a4"], findings, "async_save 2->2")
    except BaseException:
        findings["errors"].append(traceback.format_exc())
    with open(os.path.join(root, f"result-{rank}.json"), "w") as f:
        json.dump(findings, f)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
