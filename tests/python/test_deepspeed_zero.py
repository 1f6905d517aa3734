"""ZeRO-Infinity end to end on the real DeepSpeed (issue 30 #4): a small transformer trained for
20 steps with ZeRO stage 3, ``offload_optimizer`` and ``offload_param`` to ``nvme`` (a directory on
the disk), on DeepSpeed's CPU accelerator over gloo, with 1 and 2 ranks — once on DeepSpeed's own
async_io op, once after ``nvio.deepspeed.install()``. The losses agree step by step, bit for bit,
and the swap files DeepSpeed leaves have the same names, sizes and bytes in both runs.

Each rank is a process running _ds_zero_worker.py; the two runs go side by side. Labelled
deepspeed_long in ctest."""

from __future__ import annotations

import os

import pytest

import _ds_real

_ds_real.require()

from _ds_zero_worker import finish, start  # noqa: E402

STEPS = 20
# Parameters of the worker's model at least 1 MiB per partition (DeepSpeed's MIN_AIO_BYTES): the
# embedding, the layer's two feed-forward weights and the output weight.
SWAPPED_PARAMS = 4


def _expected_layout(files: list, world: int) -> None:
    """The swap files ZeRO-3 writes per rank: one per swappable parameter partition under
    zero_stage_3/float32params/rank<r>/, and under zero_stage_3/optimizer/rank<r>/ the flat fp32
    partition, Adam's exp_avg and exp_avg_sq of it (same size) and the gradient pieces."""
    names = [f[0] for f in files]
    sizes = dict((f[0], f[1]) for f in files)
    for rank in range(world):
        params = [n for n in names if n.startswith(f"zero_stage_3/float32params/rank{rank}/")]
        assert len(params) == SWAPPED_PARAMS, params
        assert all(n.endswith("_param.tensor.swp") for n in params)
        optimizer = [n for n in names if n.startswith(f"zero_stage_3/optimizer/rank{rank}/")]
        flat = [n for n in optimizer if "gradient" not in n and "exp_avg" not in n]
        assert len(flat) == 1, optimizer
        base = os.path.basename(flat[0])
        folder = os.path.dirname(flat[0])
        for state in ("exp_avg", "exp_avg_sq"):
            assert sizes[f"{folder}/{state}-{base}"] == sizes[flat[0]]
        assert any("_gradient_" in n for n in optimizer)
    assert len(names) == len(set(names))


@pytest.mark.parametrize("world", [1, 2])
def test_zero_infinity_losses_identical(world, tmp_path):
    # Both runs at once (they share nothing but the CPUs; the losses do not depend on timing).
    own_run = start(str(tmp_path / "deepspeed"), world, use_nvio=False, steps=STEPS)
    our_run = start(str(tmp_path / "nvio"), world, use_nvio=True, steps=STEPS)
    try:
        own = finish(own_run)
    finally:
        ours = finish(our_run)  # waited for (or killed) even when the first run failed
    for rank in range(world):
        a, b = own[rank], ours[rank]
        assert not a["optimizer_handle"].startswith("nvio."), a["optimizer_handle"]
        assert not a["param_handle"].startswith("nvio."), a["param_handle"]
        assert b["optimizer_handle"] == b["param_handle"] == "nvio._aio.aio_handle"
        assert len(a["losses"]) == len(b["losses"]) == STEPS
        assert all(x == x for x in a["losses"])  # no NaN: a real run, compared exactly
        assert a["losses"] == b["losses"], (rank, a["losses"], b["losses"])
        assert len(set(a["losses"])) > STEPS // 2  # the weights move: a real run
        _expected_layout(a["files"], world)
        # The same files, of the same sizes and bytes.
        assert a["files"] == b["files"]
    if world == 2:
        assert own[0]["losses"] != own[1]["losses"]  # each rank saw its own batches
