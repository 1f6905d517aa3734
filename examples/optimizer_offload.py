"""Adam whose states live on NVMe: ZeRO-Infinity's optimizer offload with ``nvio.TensorSwapper``.

The parameters are split into groups (here: a model's layers). Each group has its own
``torch.optim.Adam``, whose ``exp_avg`` and ``exp_avg_sq`` stay on the drive between steps. A step
walks the groups in order: the states of group k+1 are prefetched while group k steps, and group
k's updated states are written behind while group k+1 steps. Only about three groups' states are in
memory at a time (the one stepping, the one being read, the one being written), which is what the
swapper's byte budget has to hold.

Because torch's own Adam does the arithmetic on the same tensors, the result is bit for bit what
in-memory Adam gives (tests/python/test_optimizer_offload.py checks it).

Run it (a small model, three steps, checks against in-memory Adam and prints the times):

    PYTHONPATH=build/python /usr/bin/python3 examples/optimizer_offload.py --dir /var/tmp/offload

bench/optimizer_offload_bench.py measures the overlap: how much of the read time the prefetch
hides, and the step time against in-memory states.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Callable, List, Optional, Sequence

import torch

import nvio

_KEYS = ("exp_avg", "exp_avg_sq")


class OffloadedAdam:
    """``torch.optim.Adam`` per parameter group, with the moment estimates swapped to NVMe.

    ``groups``: lists of parameters, stepped in this order. ``swapper``: an open
    ``nvio.TensorSwapper`` whose budget holds about three groups' states (two fp32 tensors per
    parameter). ``prefetch=False`` reads each group's states only when it steps (for measuring what
    the prefetch hides). ``compute`` (optional) runs after each group's step with the group's
    index: a stand-in for the work a trainer overlaps with I/O. Not thread-safe.
    """

    def __init__(self, groups: Sequence[Sequence[torch.nn.Parameter]],
                 swapper: "nvio.TensorSwapper", *, prefetch: bool = True,
                 compute: Optional[Callable[[int], None]] = None, **adam_options) -> None:
        self.swapper = swapper
        self.prefetch = prefetch
        self.compute = compute
        self.optimizers = [torch.optim.Adam(list(g), **adam_options) for g in groups]
        self.names: List[List[str]] = []
        for k, opt in enumerate(self.optimizers):
            names = []
            for i, p in enumerate(opt.param_groups[0]["params"]):
                # Adam's own initial state, made here so that it never makes one in memory:
                # the step count stays in memory (a scalar), the moments go to the drive.
                opt.state[p]["step"] = torch.tensor(0.0)
                for key in _KEYS:
                    name = f"g{k}.p{i}.{key}"
                    swapper.swap_out(name, torch.zeros_like(p, memory_format=torch.contiguous_format))
                    names.append(name)
            self.names.append(names)
        swapper.wait()
        self.last_wait_s = 0.0  # time step() spent waiting for reads
        self.last_step_s = 0.0

    def step(self) -> None:
        """One Adam step over every group (the gradients must be in place)."""
        start = time.perf_counter()
        waited = 0.0
        writes: List[nvio.Future] = []  # the previous group's, waited one group later
        if self.prefetch:
            self.swapper.prefetch(self.names[0])
        for k, opt in enumerate(self.optimizers):
            if self.prefetch and k + 1 < len(self.optimizers):
                self.swapper.prefetch(self.names[k + 1])
            t0 = time.perf_counter()
            states = [self.swapper.swap_in(n) for n in self.names[k]]
            waited += time.perf_counter() - t0
            params = opt.param_groups[0]["params"]
            for i, p in enumerate(params):
                opt.state[p]["exp_avg"] = states[2 * i]
                opt.state[p]["exp_avg_sq"] = states[2 * i + 1]
            opt.step()
            for p in params:
                del opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]
            if self.compute is not None:
                self.compute(k)
            for w in writes:  # written while this group stepped: their memory goes back now
                w.wait()
            writes = [self.swapper.swap_out(n, t) for n, t in zip(self.names[k], states)]
            del states
        for w in writes:
            w.wait()
        self.last_wait_s = waited
        self.last_step_s = time.perf_counter() - start

    def state_of(self, k: int, i: int, key: str) -> torch.Tensor:
        """A copy of one moment tensor (group k, parameter i), read back from the drive."""
        return self.swapper.swap_in(f"g{k}.p{i}.{key}").clone()


def layered_model(layers: int, width: int, seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    mods: List[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*mods)


def backward(model: torch.nn.Module, width: int, step: int) -> None:
    """Gradients of a fixed random batch for `step` (the same in every run)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, width, generator=g)
    model.zero_grad(set_to_none=False)
    model(x).square().mean().backward()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where the swap directory goes (made when missing; default: the system's temporary directory)")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    reference = layered_model(args.layers, args.width, 0)
    offloaded = layered_model(args.layers, args.width, 0)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-3)
    groups = [list(m.parameters()) for m in offloaded if list(m.parameters())]
    group_bytes = max(sum(p.numel() * p.element_size() for p in g) for g in groups)
    budget = 2 * 4 * group_bytes  # two moments, for four groups (stepping, read, written, spare)
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)  # made when missing, as `nvio bench --dir` does
    with tempfile.TemporaryDirectory(dir=args.dir) as d, \
            nvio.TensorSwapper(d, budget_bytes=budget) as swapper:
        opt = OffloadedAdam(groups, swapper, lr=1e-3)
        for step in range(args.steps):
            backward(reference, args.width, step)
            t0 = time.perf_counter()
            ref_opt.step()
            mem_s = time.perf_counter() - t0
            backward(offloaded, args.width, step)
            opt.step()
            print(f"step {step}: in memory {mem_s * 1e3:.1f} ms, offloaded "
                  f"{opt.last_step_s * 1e3:.1f} ms (waiting for reads "
                  f"{opt.last_wait_s * 1e3:.1f} ms)")
        same = all(torch.equal(a, b) for a, b in zip(reference.parameters(),
                                                      offloaded.parameters()))
        print("parameters bit-exact against in-memory Adam:", same)
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
