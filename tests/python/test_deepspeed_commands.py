"""DeepSpeed's own ds_io and ds_nvme_tune (the installed package's commands, on its async_io op)
and nvio's ds-io and ds-nvme-tune, given the same flags: both run, and both report what the flags
asked for (issue 30 #6; docs/deepnvme.md lists where their output differs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import _ds_real

_ds_real.require()

from nvio.deepspeed import aio_handle_from_config  # noqa: E402

BIN = os.path.dirname(sys.executable)


def _env() -> dict:
    import nvio

    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIO_")}
    env["NVIO_CONFIG"] = "none"
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(nvio.__file__)))
    return env


def _run(cmd: list, cwd) -> str:
    r = subprocess.run([str(c) for c in cmd], env=_env(), cwd=cwd, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def _nvio(*args) -> list:
    return [sys.executable, "-m", "nvio", *args]


@pytest.mark.parametrize("op", [[], ["--read"]])
def test_ds_io_and_nvio_ds_io_same_flags(op, tmp_path):
    flags = ["--folder", tmp_path, "--io_size", "4M", "--block_size", "1M", "--queue_depth", "8",
             "--io_parallel", "2", "--loops", "2", "--engine", "aio_handle", "--validate", *op]
    theirs = _run([os.path.join(BIN, "ds_io"), *flags], tmp_path)
    word = "Read" if op else "Write"
    speed = re.search(rf"E2E {word} Speed = ([0-9.]+) GB/sec", theirs)
    assert speed and float(speed.group(1)) > 0, theirs
    ours = json.loads(_run(_nvio("ds-io", *flags, "--json"), tmp_path))
    assert [r["op"] for r in ours["results"]] == [word.lower()]
    options = ours["options"]
    assert (options["block_size"], options["queue_depth"], options["intra_op_parallelism"]) == \
        (1 << 20, 8, 2)
    assert ours["size"] == 4 << 20 and ours["results"][0]["gb_per_s"] > 0


def test_ds_nvme_tune_and_nvio_ds_nvme_tune_same_flags(tmp_path):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"block_size": ["1M"], "queue_depth": [8], "io_parallel": [1],
                                 "single_submit": [False], "sequential_requests": [False]}))
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    flags = ["--nvme_dir", nvme, "--sweep_config", sweep, "--io_size", "4M", "--loops", "1"]
    theirs = _run([os.path.join(BIN, "ds_nvme_tune"), *flags, "--log_dir", tmp_path / "ds"],
                  tmp_path)
    assert re.search(r"Best performance \(GB/sec\): read = *[0-9.]+, write = *[0-9.]+", theirs), \
        theirs
    ours = _run(_nvio("ds-nvme-tune", *flags, "--log_dir", tmp_path / "nvio"), tmp_path)
    assert re.search(r"Best performance: read = [0-9.]+ GB/s", ours), ours
    assert os.path.exists(tmp_path / "nvio" / "nvio_tune.json")
    # The aio blocks differ in keys and value types (docs/deepnvme.md): DeepSpeed's names the
    # parallelism num_threads and prints booleans as strings; nvio's has intra_op_parallelism,
    # JSON booleans and use_gds. Read as DeepSpeed configs, one swept configuration gives one
    # handle either way.
    theirs_block, ours_block = _aio_block(theirs)["aio"], _aio_block(ours)["aio"]
    assert set(theirs_block) == {"block_size", "queue_depth", "num_threads", "single_submit",
                                 "overlap_events"}
    assert set(ours_block) == {"block_size", "queue_depth", "intra_op_parallelism",
                               "single_submit", "overlap_events", "use_gds"}
    assert theirs_block["single_submit"] == "false" and ours_block["single_submit"] is False
    with pytest.warns(DeprecationWarning, match="num_threads"):
        from_theirs = aio_handle_from_config({"aio": theirs_block})
    from_ours = aio_handle_from_config({"aio": ours_block})
    settings = ("get_block_size", "get_queue_depth", "get_single_submit", "get_overlap_events",
                "get_intra_op_parallelism")
    assert [getattr(from_theirs, g)() for g in settings] == \
        [getattr(from_ours, g)() for g in settings] == [1 << 20, 8, False, True, 1]


def _aio_block(text: str) -> dict:
    """The last {"aio": {...}} JSON object printed."""
    start = text.rindex('"aio"')
    start = text.rindex("{", 0, start)
    depth = 0
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return json.loads(text[start:end + 1])
    raise AssertionError(f"no aio block in:\n{text}")
