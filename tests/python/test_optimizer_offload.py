"""examples/optimizer_offload.py: Adam with its states swapped to files is bit-exact against Adam
with its states in memory, with and without prefetch, under a budget of a few groups."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import nvio  # noqa: E402
from optimizer_offload import OffloadedAdam, backward, layered_model  # noqa: E402


@pytest.mark.parametrize("prefetch", [True, False])
def test_offloaded_adam_is_bit_exact(tmp_path, prefetch):
    layers, width = 4, 96
    reference = layered_model(layers, width, 3)
    offloaded = layered_model(layers, width, 3)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2, weight_decay=0.01)
    groups = [list(m.parameters()) for m in offloaded if list(m.parameters())]
    group_bytes = max(sum(p.numel() * p.element_size() for p in g) for g in groups)
    computed = []
    with nvio.TensorSwapper(tmp_path / "swap", budget_bytes=2 * 4 * group_bytes) as sw:
        opt = OffloadedAdam(groups, sw, prefetch=prefetch, compute=computed.append, lr=1e-2,
                            weight_decay=0.01)
        for step in range(4):
            backward(reference, width, step)
            ref_opt.step()
            backward(offloaded, width, step)
            opt.step()
        assert computed == list(range(len(groups))) * 4
        for a, b in zip(reference.parameters(), offloaded.parameters()):
            assert torch.equal(a, b)
        # The moments on the drive are torch's own, byte for byte.
        ref_params = list(reference.parameters())
        k = i = 0
        for n, p in enumerate(ref_params):
            state = ref_opt.state[p]
            assert torch.equal(opt.state_of(k, i, "exp_avg"), state["exp_avg"]), n
            assert torch.equal(opt.state_of(k, i, "exp_avg_sq"), state["exp_avg_sq"]), n
            i += 1
            if i == len(groups[k]):
                k, i = k + 1, 0
        # Nothing stays in memory between steps but the step counts.
        assert all(set(o.state[p]) == {"step"} for o in opt.optimizers for p in o.state)


def test_the_example_makes_a_missing_dir(tmp_path):
    """Issue 28: run as its docstring says, with a --dir that did not exist, it ended in
    FileNotFoundError."""
    example = Path(__file__).resolve().parents[2] / "examples" / "optimizer_offload.py"
    missing = tmp_path / "not" / "yet"
    env = dict(os.environ, PYTHONPATH=str(Path(nvio.__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, str(example), "--dir", str(missing), "--layers", "2",
                        "--width", "64", "--steps", "1"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "parameters bit-exact against in-memory Adam: True" in r.stdout
    assert missing.is_dir() and list(missing.iterdir()) == []  # the swap files went with it
