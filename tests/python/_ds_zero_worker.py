"""One rank of a ZeRO-Infinity run on the real DeepSpeed (CPU accelerator, gloo): a small
transformer trained with ZeRO stage 3, ``offload_optimizer`` and ``offload_param`` to ``nvme``
(a directory), on DeepSpeed's own async_io op or, with ``--nvio``, after
``nvio.deepspeed.install()``. ``launch()`` runs it as one process per rank (RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT set), for test_deepspeed_zero.py and bench/deepspeed_compare.py.

Writes JSON to ``--out``: the loss of every step on this rank, the seconds of each step, which
aio_handle class the swappers held, and the files under the NVMe folder (relative path, size,
sha256) while the engine is alive, as DeepSpeed leaves them after the last step.

Every parameter partition and the optimizer's flat partition are at least 1 MiB, DeepSpeed's
smallest swappable size (``MIN_AIO_BYTES``), at 2 ranks too, so all of them go through the
swappers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _ds_real  # noqa: E402

_ds_real.configure_environment()

import torch  # noqa: E402
from torch import nn  # noqa: E402

VOCAB = 2048
WIDTH = 256  # the embedding and output weights are VOCAB * WIDTH = 2 MiB of fp32
FEED_FORWARD = 2048  # each feed-forward weight 2 MiB
LAYERS = 1
SEQUENCE = 16
BATCH = 2


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=FEED_FORWARD,
                                       dropout=0.0, batch_first=True)
            for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(x[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def config(nvme: str, aio: dict) -> dict:
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "zero_allow_untested_optimizer": True,
        # torch's Adam, not DeepSpeedCPUAdam (another op to compile); the same in both runs.
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "buffer_count": 4},
            "offload_param": {"device": "nvme", "nvme_path": nvme, "buffer_count": 8,
                              "buffer_size": 2 * VOCAB * WIDTH, "max_in_cpu": 0},
            "stage3_param_persistence_threshold": 0,
            "stage3_prefetch_bucket_size": 0,
            "stage3_max_live_parameters": 0,
            "stage3_max_reuse_distance": 0,
        },
        "aio": aio,
    }


def batch(step: int, rank: int) -> torch.Tensor:
    """Runs of consecutive token ids from random starts: a pattern the model can learn."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    starts = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    return (starts + torch.arange(SEQUENCE)) % VOCAB


def files_under(root: str) -> list:
    """[relative path, size, sha256] of every file under root."""
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            found.append([os.path.relpath(path, root), os.path.getsize(path), digest])
    return sorted(found)


def _nvio_root() -> str:
    import nvio

    return os.path.dirname(os.path.dirname(os.path.abspath(nvio.__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(folder: str, world: int, use_nvio: bool, steps: int = 20,
          aio: "dict | None" = None) -> "tuple[list, list]":
    """Starts this script as `world` ranks (one process each) with the NVMe folder under
    `folder`; finish() waits for them."""
    nvme = os.path.join(folder, "nvme")
    os.makedirs(nvme, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIO_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1", NVIO_CONFIG="none",
               PYTHONPATH=os.pathsep.join([_nvio_root(), env.get("PYTHONPATH", "")]))
    procs, outs = [], []
    for rank in range(world):
        out = os.path.join(folder, f"rank{rank}.json")
        outs.append(out)
        cmd = [sys.executable, os.path.abspath(__file__), "--nvme", nvme, "--out", out,
               "--steps", str(steps), "--aio", json.dumps(aio or {})]
        cmd += ["--nvio"] if use_nvio else []
        procs.append(subprocess.Popen(cmd, env={**env, "RANK": str(rank),
                                                "LOCAL_RANK": str(rank)},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    return procs, outs


def finish(started: "tuple[list, list]", timeout: float = 600) -> list:
    """Each rank's result of a start(). Raises RuntimeError with a rank's output when one fails
    (the others are killed)."""
    procs, outs = started
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, proc in enumerate(procs):
        if proc.returncode != 0:
            raise RuntimeError(f"ZeRO worker rank {rank} of {len(procs)} exited with status "
                               f"{proc.returncode}:\n{logs[rank][-4000:]}")
    results = []
    for out in outs:
        with open(out) as f:
            results.append(json.load(f))
    return results


def launch(folder: str, world: int, use_nvio: bool, steps: int = 20,
           aio: "dict | None" = None) -> list:
    """start() and finish(): each rank's result."""
    return finish(start(folder, world, use_nvio, steps, aio))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvme", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nvio", action="store_true")
    parser.add_argument("--aio", default="{}", help="the aio section, as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the same reductions, in the same order, in both runs
    if args.nvio:
        import nvio.deepspeed

        nvio.deepspeed.install()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    aio = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
           "single_submit": False, "overlap_events": True, **json.loads(args.aio)}
    with deepspeed.zero.Init(config_dict_or_path=config(args.nvme, aio)):
        model = TinyTransformer()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           config=config(args.nvme, aio))
    losses, seconds = [], []
    for step in range(args.steps):
        start = time.perf_counter()
        loss = engine(batch(step, rank))
        engine.backward(loss)
        engine.step()
        seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
    swapper = engine.optimizer.optimizer_swapper
    param_swapper = next(p for p in engine.module.parameters()).nvme_swapper
    param_swapper.synchronize_writes()  # the last parameter swap-outs, before the files are read
    deepspeed.comm.barrier()
    result = {
        "rank": rank,
        "losses": losses,
        "seconds": seconds,
        "optimizer_handle": f"{type(swapper.aio_handle).__module__}."
                            f"{type(swapper.aio_handle).__qualname__}",
        "param_handle": f"{type(param_swapper.aio_read_handle).__module__}."
                        f"{type(param_swapper.aio_read_handle).__qualname__}",
        "files": files_under(args.nvme),
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    deepspeed.comm.barrier()


if __name__ == "__main__":
    main()
