"""`nvio ds-io` and `nvio ds-nvme-tune`: each DeepSpeed flag reaches the nvio option it means
(checked in the JSON that bench and tune print), flags nvio cannot honour are refused naming the
reason, accepted no-op flags say so, and ds-nvme-tune ends with a valid DeepSpeed "aio" block."""

import json

import pytest

from test_cli import assert_one_error_line, nvio

SIZE = "1M"


def ds_io_json(*args):
    r = nvio("ds-io", "--json", "--io_size", SIZE, *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r


def test_defaults_are_ds_io_handle_settings_and_a_write(tmp_path):
    doc, _ = ds_io_json("--folder", tmp_path, "--loops", 1)
    assert doc["size"] == 1 << 20
    assert [r["op"] for r in doc["results"]] == ["write"]
    o = doc["options"]
    assert (o["block_size"], o["queue_depth"], o["intra_op_parallelism"]) == (1 << 20, 32, 1)
    assert (o["single_submit"], o["overlap_events"]) == (False, True)
    assert doc["memory"] == "host"
    assert not list(tmp_path.iterdir())


def test_each_flag_reaches_its_option(tmp_path):
    doc, r = ds_io_json("--folder", tmp_path, "--read", "--block_size", "256K",
                        "--queue_depth", 8, "--io_parallel", 2, "--single_submit",
                        "--sequential_requests", "--loops", 2, "--validate")
    o = doc["options"]
    assert (o["block_size"], o["queue_depth"], o["intra_op_parallelism"]) == (256 << 10, 8, 2)
    assert (o["single_submit"], o["overlap_events"]) == (True, False)
    for name in ("block_size", "queue_depth", "intra_op_parallelism", "single_submit",
                 "overlap_events"):
        assert doc["options_sources"][name] == "explicit"
    [res] = doc["results"]
    assert res["op"] == "read" and res["loops"] == 2 and res["verified"] is True
    assert r.stderr == ""


def test_multi_process_is_procs(tmp_path):
    doc, _ = ds_io_json("--folder", tmp_path, "--multi_process", 2, "--loops", 1, "--validate")
    assert doc["procs"] == 2
    assert all(p["options"]["queue_depth"] == 32 for p in doc["processes"])
    assert [a["op"] for a in doc["aggregate"]] == ["write"]
    assert doc["aggregate"][0]["verified"] is True


def test_folder_to_device_mapping_is_device_map(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    doc, r = ds_io_json("--folder_to_device_mapping", f"{a}:0", f"{b}:1", "--loops", 1)
    assert [p["file"].rsplit("/", 1)[0] for p in doc["processes"]] == [str(a), str(b)]
    assert "GPU ordinals are not used" in r.stderr


def test_accepted_no_op_flags_say_so(tmp_path):
    _, r = ds_io_json("--folder", tmp_path, "--loops", 1, "--warmup_loops", 2, "--handle",
                      "--use_accelerator_pin_memory")
    assert "nvio: note: --warmup_loops 2" in r.stderr
    assert "nvio: note: --use_accelerator_pin_memory" in r.stderr


def test_engine_aio_handle_is_accepted(tmp_path):
    """ds_io's default engine, which ds_nvme_tune passes to every ds_io run, is nvio's handle."""
    doc, r = ds_io_json("--folder", tmp_path, "--loops", 1, "--engine", "aio_handle",
                        "--include_warmup_time")
    assert "nvio: note: --include_warmup_time" in r.stderr
    assert doc["results"], doc


def test_table_names_the_units(tmp_path):
    r = nvio("ds-io", "--folder", tmp_path, "--io_size", SIZE, "--loops", 1)
    assert r.returncode == 0, r.stderr
    assert "GB/s = 1e9 bytes/s, GiB/s = 2^30 bytes/s" in r.stdout
    assert 'ds_io prints 2^30 bytes/s as "GB/sec"' in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--slow_bounce_buffer"], "--slow_bounce_buffer: not supported by nvio"),
        (["--engine", "torch_io"], "--engine torch_io: not supported by nvio"),
        (["--different_file_each_iteration"],
         "--different_file_each_iteration: not supported by nvio"),
        (["--torch_legacy_save"], "--torch_legacy_save: not supported by nvio"),
        (["--use_fast_io"], "--use_fast_io: not supported by nvio"),
        (["--fast_io_size", "1M"], "--fast_io_size: not supported by nvio"),
        (["--use_gds"], "--use_gds needs --gpu"),
        (["--multi_process", "0"], "--multi_process: expected 1 to 1024 processes"),
        (["--block_size", "1Q"], "--block_size"),
    ],
)
def test_refused_and_bad_ds_io_flags(tmp_path, args, needle):
    r = nvio("ds-io", "--folder", tmp_path, "--io_size", SIZE, *args)
    assert_one_error_line(r)
    assert needle in r.stderr


def test_ds_io_folder_choices(tmp_path):
    r = nvio("ds-io", "--io_size", SIZE)
    assert_one_error_line(r)
    assert "--folder or --folder_to_device_mapping is required" in r.stderr
    r = nvio("ds-io", "--io_size", SIZE, "--folder", tmp_path,
             "--folder_to_device_mapping", f"{tmp_path}:0")
    assert_one_error_line(r)
    assert "exclude each other" in r.stderr
    r = nvio("ds-io", "--folder", tmp_path)
    assert_one_error_line(r)
    assert "--io_size" in r.stderr


def write_sweep(tmp_path, **space):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(space))
    return path


def test_ds_nvme_tune_prints_a_valid_aio_block(tmp_path):
    sweep = write_sweep(tmp_path, block_size=["256K", 1048576], queue_depth=[8],
                        io_parallel=[1], single_submit=[False], sequential_requests=[False])
    logs = tmp_path / "logs"
    r = nvio("ds-nvme-tune", "--nvme_dir", tmp_path, "--io_size", SIZE, "--sweep_config",
             sweep, "--log_dir", logs, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("Best performance: read = ") and "GiB/s" in line
               for line in lines)
    start = lines.index("{")
    block = json.loads("\n".join(lines[start:]))
    aio = block["aio"]
    assert set(aio) == {"block_size", "queue_depth", "intra_op_parallelism", "single_submit",
                        "overlap_events", "use_gds"}
    assert aio["block_size"] in (256 << 10, 1 << 20)
    assert (aio["queue_depth"], aio["intra_op_parallelism"]) == (8, 1)
    assert aio["overlap_events"] is True and aio["single_submit"] is False
    assert aio["use_gds"] is False
    doc = json.loads((logs / "nvio_tune.json").read_text())
    assert doc["strategy"] == "grid" and doc["trial_bytes"] == 1 << 20
    assert doc["deepspeed"] == block
    # Every measured point is in the sweep's space.
    for p in doc["points"]:
        assert p["options"]["block_size"] in (256 << 10, 1 << 20)
        if p["options"]["engine"] != "psync":
            assert p["options"]["queue_depth"] == 8


def test_ds_nvme_tune_modes_and_json(tmp_path):
    sweep = write_sweep(tmp_path, block_size=["1M"], queue_depth=[4])
    r = nvio("ds-nvme-tune", "--nvme_dir", tmp_path, "--io_size", SIZE, "--sweep_config", sweep,
             "--no_write", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["modes"] == ["read"]
    assert doc["deepspeed"]["aio"]["use_gds"] is False


@pytest.mark.parametrize(
    "args, needle",
    [
        # No GPU in CI: --gpu reaches nvio tune's GPU check, which stops before anything is made.
        (["--gpu"], "--gpu: no usable GPU here"),
        (["--gds"], "--gds needs --gpu"),
        (["--no_read", "--no_write"], "excludes"),
        (["--sweep_config", "/nonexistent.json"], "cannot be read"),
    ],
)
def test_ds_nvme_tune_refusals(tmp_path, args, needle):
    r = nvio("ds-nvme-tune", "--nvme_dir", tmp_path, *args)
    assert_one_error_line(r)
    assert needle in r.stderr


@pytest.mark.parametrize(
    "space, needle",
    [
        ({"block_sizes": ["1M"]}, 'unknown key "block_sizes"'),
        ({"queue_depth": 8}, '"queue_depth" must be a non-empty list'),
        ({"single_submit": ["yes"]}, "not true or false"),
        ({"io_parallel": [0]}, "not a count"),
    ],
)
def test_ds_nvme_tune_bad_sweep_config(tmp_path, space, needle):
    r = nvio("ds-nvme-tune", "--nvme_dir", tmp_path, "--sweep_config",
             write_sweep(tmp_path, **space))
    assert_one_error_line(r)
    assert needle in r.stderr


@pytest.mark.parametrize("text, needle", [
    ('{"block_size": DEEP}', '"block_size" holds an array of 1'),
    ('{"queue_depth": [1e400]}', "not valid JSON ([json.exception.out_of_range.406] number"),
], ids=["deep", "1e400"])  # a 300 KB id would go into the environment of the process started
def test_ds_nvme_tune_sweep_config_values_that_broke_the_error_message(tmp_path, text, needle):
    """Nested 150,000 deep: a stack overflow in the JSON dump that quoted the value; 1e400: said
    "not a JSON object"."""
    sweep = tmp_path / "sweep.json"
    sweep.write_text(text.replace("DEEP", "[" * 150_000 + "]" * 150_000))
    r = nvio("ds-nvme-tune", "--nvme_dir", tmp_path, "--io_size", SIZE, "--sweep_config", sweep)
    line = assert_one_error_line(r)
    assert needle in line and len(line) < 400


@pytest.mark.parametrize("args, words", [
    (["--io_size", "0"], "--io_size: must be at least 1 byte"),
    (["--io_size", "1X"], "for --io_size"),
    (["--io_size", "1M", "--multi_process", "2000"], "--multi_process: expected 1 to 1024"),
])
def test_ds_io_errors_name_the_flags_typed(tmp_path, args, words):
    """Not bench's --size and --procs, which ds-io maps them to."""
    r = nvio("ds-io", "--folder", tmp_path, *args)
    assert words in assert_one_error_line(r)


def test_ds_nvme_tune_io_size_too_small_to_time_is_refused(tmp_path):
    r = nvio("ds-nvme-tune", "--nvme_dir", tmp_path, "--io_size", "0")  # became 16 MiB silently
    assert "--io_size: 0 is below 1 MiB" in assert_one_error_line(r)


def test_ds_nvme_tune_one_directory(tmp_path):
    r = nvio("ds-nvme-tune", "--nvme_dir", tmp_path, tmp_path / "x")
    assert_one_error_line(r)
    assert "one directory" in r.stderr
