"""One rank of a ZeRO-Infinity run on the real DeepSpeed (CPU accelerator, gloo): a small
transformer trained with ZeRO stage 3, ``offload_optimizer`` and ``offload_param`` to ``nvme``
(a directory), on DeepSpeed's own async_io op or, with ``--nvio``, after
``nvio.deepspeed.install()``. Run by test_deepspeed_zero.py (one process per rank, RANK /
WORLD_SIZE / MASTER_ADDR / MASTER_PORT set) and by bench/deepspeed_compare.py.

Writes JSON to ``--out``: the loss of every step on this rank, the seconds of each step, which
aio_handle class the swappers held, and the files under the NVMe folder (relative path and size)
while the engine is alive, as DeepSpeed leaves them after the last step.

Every parameter partition and the optimizer's flat partition are at least 1 MiB, DeepSpeed's
smallest swappable size (``MIN_AIO_BYTES``), at 2 ranks too, so all of them go through the
swappers.
"""

from __future__ import annotations

import argparse
import json
import os
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
LAYERS = 2
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
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (BATCH, SEQUENCE), generator=g)


def files_under(root: str) -> list:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            found.append([os.path.relpath(path, root), os.path.getsize(path)])
    return sorted(found)


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
