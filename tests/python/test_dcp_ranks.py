"""nvio.dcp across processes: torch.distributed.checkpoint saved on N gloo ranks (CPU), loaded on M,
for (N, M) in (1, 2), (2, 1), (2, 3), (3, 2); nvio's writer and reader against torch's in both
directions; plain tensors, DTensors sharded by rows and columns, an FSDP2 (fully_shard) model;
a rank failing mid-save; async_save. The cases run in one world of three ranks
(tests/python/_dcp_worker.py), each rank comparing the bytes it holds after every load."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")

WORKER = Path(__file__).parent / "_dcp_worker.py"


def test_save_on_n_load_on_m_and_a_failing_rank(tmp_path):
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(store), str(rank), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ))
             for rank in range(3)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    results = []
    for rank, (p, text) in enumerate(zip(procs, outputs)):
        path = tmp_path / f"result-{rank}.json"
        assert p.returncode == 0 and path.exists(), f"rank {rank} ({p.returncode}):\n{text}"
        results.append(json.loads(path.read_text()))
    for rank, found in enumerate(results):
        assert found["errors"] == [], f"rank {rank}: " + "\n".join(found["errors"])
    expected = {
        0: ["1->2 nvio->nvio", "1->2 stock->nvio", "2->1 nvio->stock", "2->1 nvio->nvio",
            "2->3 nvio->nvio", "2->3 nvio->stock", "3->2 nvio->nvio", "3->2 nvio->stock",
            "failing save raised naming rank 1", "after the failed save",
            "after the failed save, stock", "async_save 2->2"],
        1: ["1->2 nvio->nvio", "1->2 stock->nvio", "2->3 nvio->nvio", "3->2 nvio->stock",
            "failing save raised naming rank 1", "after the failed save", "async_save 2->2"],
        2: ["2->3 nvio->nvio", "2->3 nvio->stock"],
    }
    for rank, names in expected.items():
        for name in names:
            assert name in results[rank]["checks"], (rank, name)
            assert name + ".model" in results[rank]["checks"] or name.startswith("failing"), \
                (rank, name)
    # The failed save left its complete files (rank 0's) beside the checkpoint, never in it: the
    # next save removes them.
    a2 = tmp_path / "a2"
    import torch.distributed.checkpoint as dcp

    named = {s.relative_path for s in dcp.FileSystemReader(str(a2)).read_metadata()
             .storage_data.values()}
    on_disk = {p.name for p in a2.glob("*.distcp")}
    assert named < on_disk and len(on_disk - named) == 1
