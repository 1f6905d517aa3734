"""Tests of the `nvio` command-line tool: exit codes, error lines, JSON shape, --verify, files.

The binary comes from the NVIO_BIN environment variable (ctest sets it). Every run gets an
environment without NVIO_* variables (and NVIO_CONFIG=none) unless a test adds one, so a developer's settings cannot
change the outcome. Sizes are small and odd so that the whole file runs in a few seconds.
"""

import hashlib
import json
import math
import os
import pty
import re
import signal
import stat
import subprocess
import time

import pytest

BIN = os.environ["NVIO_BIN"]
ODD_SIZE = 1048699  # 1 MiB + 123: not a multiple of any block size or alignment
OPTION_NAMES = {
    "engine",
    "block_size",
    "queue_depth",
    "single_submit",
    "overlap_events",
    "intra_op_parallelism",
    "direct",
    "gpu_direct",
    "cached_reads",
}
ENGINES = ("io_uring", "libaio", "psync")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIO_")}
    env["NVIO_CONFIG"] = "none"  # nor a configuration file saved by `nvio tune --save`
    env.update(extra)
    return env


def nvio(*args, env=None, timeout=60):
    return subprocess.run(
        [BIN, *map(str, args)],
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        timeout=timeout,
    )


def bench_json(*args, env=None):
    r = nvio("bench", "--json", *args, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # the whole of stdout must be one JSON document


_report_cache = {}


def report(path):
    if path not in _report_cache:
        r = nvio("report", "--json", "--dir", path)
        assert r.returncode == 0, r.stderr
        _report_cache[path] = json.loads(r.stdout)
    return _report_cache[path]


def median(values):
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def assert_one_error_line(r, code=2):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("nvio: error: "), r.stderr
    assert r.stdout == ""
    return lines[0]


# ---- version and help ---------------------------------------------------------------------------


def test_version_matches_report(tmp_path):
    r = nvio("--version")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"nvio \d+\.\d+\.\d+\S*\n", r.stdout), r.stdout
    assert r.stdout == f"nvio {report(str(tmp_path))['version']}\n"


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], ["bench", "report", "ckpt-bench"]),
        (["bench"], ["--queue-depth", "--block-size", "--verify", "--file", "--no-overlap-events",
                     "--pattern", "--offset", "--ops", "--duration", "--outstanding", "--batch",
                     "--sync"]),
        (["report"], ["--dir", "--json"]),
    ],
)
def test_help_exits_zero(args, expected):
    r = nvio(*args, "--help")
    assert r.returncode == 0, r.stderr
    for word in expected:
        assert word in r.stdout


# ---- bad arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, needle",
    [
        ([], "subcommand"),
        (["--bogus"], "--bogus"),
        (["bench", "--dir", "{d}", "--bogus"], "--bogus"),
        (["bench", "--dir", "{d}", "--size", "12Q"], "12Q"),
        (["bench", "--dir", "{d}", "--pattern", "random", "--sync"], "--sync applies to --pattern"),
        (["bench", "--dir", "{d}", "--size", "0"], "--size"),
        (["bench", "--dir", "{d}", "--size"], "--size"),
        (["bench", "--dir", "{d}", "--engine", "nope"], "nope"),
        (["bench", "--dir", "{d}", "--queue-depth", "0"], "(from --queue-depth)"),
        (["bench", "--dir", "{d}", "--queue-depth", "-3"], "-3"),
        (["bench", "--dir", "{d}", "--queue-depth", "4294967297"], "4294967297"),
        (["bench", "--dir", "{d}", "--block-size", "100"], "block_size"),
        (["bench", "--dir", "{d}", "--parallelism", "0"], "(from --parallelism)"),
        (["bench", "--dir", "{d}", "--direct", "maybe"], "maybe"),
        (["bench", "--dir", "{d}", "--op", "sideways"], "sideways"),
        (["bench", "--dir", "{d}", "--loops", "0"], "--loops"),
        (["bench", "--dir", "{d}", "--seed", "x1"], "x1"),
        (["bench", "--size", "1M"], "--dir"),
        (["bench", "--dir", "{d}", "--pattern", "bogus"], "bogus"),
        (["bench", "--dir", "{d}", "--pattern", "random", "--size", "0"], "--size"),
        (["bench", "--dir", "{d}", "--pattern", "random", "--size", "1000"], "multiple of 512"),
        (["bench", "--dir", "{d}", "--pattern", "random", "--size", "256"], "multiple of 512"),
        (["bench", "--dir", "{d}", "--pattern", "random", "--file-size", "2K"], "--file-size"),
        (["bench", "--dir", "{d}", "--pattern", "random", "--ops", "0"], "--ops"),
        (["bench", "--dir", "{d}", "--pattern", "random", "--duration", "0"], "--duration"),
        (["bench", "--dir", "{d}", "--pattern", "random", "--duration", "x"], "'x'"),
        (["bench", "--dir", "{d}", "--pattern", "random", "--outstanding", "6", "--batch", "4"],
         "--batch 4"),
        (["bench", "--dir", "{d}", "--pattern", "random", "--offset", "7"], "--offset"),
        (["bench", "--dir", "{d}", "--ops", "5"], "--pattern random"),
        (["bench", "--dir", "{d}", "--offset", "x"], "--offset"),
        (["report", "--bogus"], "--bogus"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, needle):
    scratch = tmp_path / "scratch"
    r = nvio(*[a.format(d=scratch) for a in args])
    line = assert_one_error_line(r)
    assert needle in line
    assert not scratch.exists()  # rejected before any file or directory was made


@pytest.mark.parametrize("command", ["bench", "report"])
def test_bad_environment_exits_2_naming_the_variable(tmp_path, command):
    r = nvio(command, "--dir", tmp_path / "d", env=clean_env(NVIO_QUEUE_DEPTH="garbage"))
    line = assert_one_error_line(r)
    assert "NVIO_QUEUE_DEPTH" in line
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "var, value, flag",
    [("NVIO_QUEUE_DEPTH", "0", "--queue-depth"), ("NVIO_BLOCK_SIZE", "16G", "--block-size"),
     ("NVIO_INTRA_OP_PARALLELISM", "0", "--queue-depth")],
)
def test_out_of_range_environment_is_an_error_even_with_a_flag(tmp_path, var, value, flag):
    r = nvio("bench", "--dir", tmp_path / "d", flag, "4", env=clean_env(**{var: value}))
    line = assert_one_error_line(r)
    assert var in line and f"'{value}'" in line
    assert "(from --" not in line  # the flag's value was fine; the variable was not
    assert not (tmp_path / "d").exists()


def test_io_failure_exits_1(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"x")
    r = nvio("bench", "--dir", blocker / "sub", "--size", "4096", "--loops", "1")
    assert_one_error_line(r, code=1)
    r = nvio("report", "--dir", tmp_path / "missing")
    assert_one_error_line(r, code=1)


# ---- bench JSON ---------------------------------------------------------------------------------


def test_bench_json_shape(tmp_path):
    out = bench_json("--dir", tmp_path, "--size", ODD_SIZE, "--loops", 3, "--op", "both")
    assert set(out) >= {"results", "options", "engine", "engine_reason", "file", "size", "version"}
    assert out["size"] == ODD_SIZE
    assert out["engine"] in ENGINES
    assert isinstance(out["engine_reason"], str) and out["engine_reason"]
    assert re.fullmatch(r"nvio-bench-\d+\.dat", os.path.basename(out["file"]))
    assert os.path.dirname(out["file"]) == str(tmp_path)
    assert not os.path.exists(out["file"])  # scratch file removed without --keep
    assert set(out["options"]) == OPTION_NAMES
    assert out["options"]["block_size"] == 1 << 20 and out["options"]["queue_depth"] == 128
    assert out["options"]["single_submit"] is False and out["options"]["overlap_events"] is True
    assert out["options"]["direct"] == "auto" and out["options"]["engine"] == "auto"

    assert [r["op"] for r in out["results"]] == ["write", "read"]
    for r in out["results"]:
        assert r["engine"] == out["engine"]
        assert r["bytes"] == ODD_SIZE
        assert r["verified"] is None
        assert r["loops"] == 3 and len(r["seconds_all"]) == 3
        assert all(isinstance(s, float) and s > 0 for s in r["seconds_all"])
        assert r["seconds"] == pytest.approx(median(r["seconds_all"]))
        assert r["gb_per_s"] == pytest.approx(ODD_SIZE / r["seconds"] / 1e9)
        assert r["gib_per_s"] == pytest.approx(ODD_SIZE / r["seconds"] / 2**30)
        assert isinstance(r["cpu_s_per_gb"], float) and r["cpu_s_per_gb"] >= 0


STATS_KEYS = {
    "reads", "writes", "bytes_read", "bytes_written", "pieces", "retries", "short_transfers",
    "bounced_bytes", "edge_bytes", "gds_bytes", "device_bounce_bytes", "shifted_bytes", "cached_bytes",
    "errors",
}


def test_bench_json_stats_cover_the_timed_loops(tmp_path):
    # An unaligned offset: with direct I/O each transfer is a buffered head and tail around direct
    # 64 KiB pieces, whose memory (the page-aligned buffer + the head) is not aligned: a write
    # bounces them; a read lands them shifted in the buffer, its middle ending `shift` bytes
    # earlier (the tail grows to the page before).
    size, loops, block, offset = 1 << 20, 3, 64 << 10, 4096 + 17
    out = bench_json("--dir", tmp_path, "--size", size, "--loops", loops, "--op", "both",
                     "--offset", offset, "--block-size", block, "--verify")
    probe = report(str(tmp_path))["dir"]
    direct = out["options"]["direct"] != "off" and probe["direct_io"]
    align = max(probe["offset_align"], 4096)
    end = offset + size
    head_end, tail_begin = -(-offset // align) * align, end // align * align
    middle = tail_begin - head_end
    for r in out["results"]:
        stats = r["stats"]
        assert set(stats) == STATS_KEYS
        moved = ("bytes_read", "reads") if r["op"] == "read" else ("bytes_written", "writes")
        other = ("bytes_written", "writes") if r["op"] == "read" else ("bytes_read", "reads")
        # The timed loops only: not the untimed read that verifies the written file.
        assert stats[moved[0]] == size * loops and stats[moved[1]] == loops
        assert stats[other[0]] == 0 and stats[other[1]] == 0
        assert stats["errors"] == {} and stats["retries"] == 0
        assert stats["gds_bytes"] == 0 and stats["device_bounce_bytes"] == 0
        mem_align = probe["mem_align"]
        if direct and r["op"] == "read" and mem_align > 1:
            shift = -(head_end - offset) % max(mem_align, os.sysconf("SC_PAGE_SIZE"))
            shifted = (end - shift) // align * align - head_end
            assert shift > 0 and shifted > block
            assert stats["edge_bytes"] == (size - shifted) * loops
            assert stats["pieces"] == (-(-shifted // block) + 2) * loops
            assert stats["shifted_bytes"] == shifted * loops and stats["bounced_bytes"] == 0
        elif direct:
            assert stats["edge_bytes"] == (size - middle) * loops
            assert stats["pieces"] == (-(-middle // block) + 2) * loops
            assert stats["bounced_bytes"] == (middle * loops if mem_align > 1 else 0)
            assert stats["shifted_bytes"] == 0
        else:
            assert stats["edge_bytes"] == 0 and stats["bounced_bytes"] == 0
            assert stats["pieces"] == size // block * loops


def test_bench_explicit_options_reach_the_handle(tmp_path):
    out = bench_json("--dir", tmp_path, "--size", "64K", "--loops", 1, "--op", "write",
                     "--engine", "psync", "--block-size", "8K", "--queue-depth", "3",
                     "--parallelism", "2", "--single-submit", "--no-overlap-events",
                     "--direct", "off")
    assert out["options"] == {
        "engine": "psync", "block_size": 8192, "queue_depth": 3, "single_submit": True,
        "overlap_events": False, "intra_op_parallelism": 2, "direct": "off",
        "gpu_direct": "auto", "cached_reads": "auto",
    }
    assert out["engine"] == "psync"
    assert [r["op"] for r in out["results"]] == ["write"]
    assert out["results"][0]["bytes"] == 65536


def test_bench_environment_fills_unset_options(tmp_path):
    env = clean_env(NVIO_BLOCK_SIZE="2M", NVIO_QUEUE_DEPTH="7")
    out = bench_json("--dir", tmp_path, "--size", "4096", "--loops", 1, "--queue-depth", "5",
                     env=env)
    assert out["options"]["block_size"] == 2 << 20  # from the environment
    assert out["options"]["queue_depth"] == 5  # the command line wins


def test_bench_human_output(tmp_path):
    r = nvio("bench", "--dir", tmp_path, "--size", ODD_SIZE, "--loops", 1, "--verify")
    assert r.returncode == 0, r.stderr
    assert "1e9 bytes/s" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["write"], ["read"])]
    assert [row[0] for row in rows] == ["write", "read"]
    assert all(row[1] == str(ODD_SIZE) and row[-1] == "yes" for row in rows)


# ---- --verify -----------------------------------------------------------------------------------

VERIFY_CONFIGS = {
    "odd-direct-on": ["--size", ODD_SIZE, "--block-size", "4K", "--queue-depth", 2,
                      "--parallelism", 3, "--single-submit", "--no-overlap-events",
                      "--direct", "on"],
    "odd-direct-off": ["--size", ODD_SIZE, "--block-size", "4K", "--queue-depth", 2,
                       "--parallelism", 3, "--single-submit", "--no-overlap-events",
                       "--direct", "off"],
    "tiny-auto": ["--size", 4095, "--block-size", "512", "--queue-depth", 1, "--parallelism", 4],
    "big-blocks": ["--size", 3 * 1048576 + 7, "--block-size", "1M", "--queue-depth", 128,
                   "--parallelism", 2, "--direct", "auto"],
}


def require_engine(engine, tmp_path):
    probe = report(str(tmp_path))["engines"][engine]
    if not probe["available"]:
        pytest.skip(f"{engine} unavailable: {probe['reason']}")


@pytest.mark.parametrize("config", sorted(VERIFY_CONFIGS))
@pytest.mark.parametrize("engine", ENGINES)
def test_verify_passes_for_every_engine(tmp_path, engine, config):
    require_engine(engine, tmp_path)
    args = VERIFY_CONFIGS[config]
    if "on" in args and not report(str(tmp_path))["dir"]["direct_io"]:
        pytest.skip(f"O_DIRECT unsupported in {tmp_path}")
    out = bench_json("--dir", tmp_path, "--engine", engine, "--loops", 2, "--verify", *args)
    size = int(args[args.index("--size") + 1])
    assert out["engine"] == engine
    assert [r["op"] for r in out["results"]] == ["write", "read"]
    for r in out["results"]:
        assert r["bytes"] == size and r["verified"] is True


@pytest.mark.parametrize("op", ["write", "read"])
def test_verify_single_op(tmp_path, op):
    # read: the missing file is written first (untimed); write: the file is read back once.
    out = bench_json("--dir", tmp_path, "--op", op, "--size", ODD_SIZE, "--loops", 1, "--verify")
    assert [r["op"] for r in out["results"]] == [op]
    assert out["results"][0]["verified"] is True
    assert list(tmp_path.iterdir()) == []


def test_verify_catches_a_flipped_byte(tmp_path):
    f = tmp_path / "data.bin"
    seed = "12345"
    r = nvio("bench", "--op", "write", "--keep", "--file", f, "--seed", seed, "--size", ODD_SIZE,
             "--loops", 1)
    assert r.returncode == 0, r.stderr
    assert f.stat().st_size == ODD_SIZE

    # Same file, same seed: clean. This is what makes the failure below meaningful.
    r = nvio("bench", "--op", "read", "--verify", "--file", f, "--seed", seed, "--size", ODD_SIZE,
             "--loops", 1)
    assert r.returncode == 0, r.stderr

    bad_offset = 777_777  # not a multiple of 8 or of any alignment
    data = bytearray(f.read_bytes())
    data[bad_offset] ^= 0x40
    f.write_bytes(bytes(data))

    r = nvio("bench", "--op", "read", "--verify", "--file", f, "--seed", seed, "--size", ODD_SIZE,
             "--loops", 1, "--json")
    assert r.returncode == 1, r.stderr
    assert f"verify failed: first bad byte at file offset {bad_offset} " in r.stderr
    assert json.loads(r.stdout)["results"][0]["verified"] is False
    assert f.read_bytes() == bytes(data)  # a read-only run leaves the file alone


def test_verify_of_an_existing_file_needs_its_seed(tmp_path):
    # Only the run that wrote a file knows its pattern: without --seed, verifying an existing file
    # (nvio's or anyone's) is refused rather than reported as corrupt at offset 0.
    stale = tmp_path / "data.bin"
    r = nvio("bench", "--op", "write", "--keep", "--file", stale, "--size", 65536, "--loops", 1)
    assert r.returncode == 0, r.stderr
    foreign = tmp_path / "foreign.bin"
    foreign.write_bytes(os.urandom(65536))
    for f in (stale, foreign):
        before = fingerprint(f)
        r = nvio("bench", "--op", "read", "--verify", "--file", f, "--size", 65536, "--loops", 1)
        line = assert_one_error_line(r)
        assert "--seed" in line and str(f) in line
        assert "verify failed" not in r.stderr
        assert fingerprint(f) == before


# ---- --offset and --pattern random -------------------------------------------------------------


@pytest.mark.parametrize("size", [4103, ODD_SIZE])
@pytest.mark.parametrize("direct", ["on", "off"])
def test_offset_round_trip_verifies(tmp_path, size, direct):
    if direct == "on" and not report(str(tmp_path))["dir"]["direct_io"]:
        pytest.skip(f"O_DIRECT unsupported in {tmp_path}")
    offset = 4096 + 7
    f = tmp_path / "off.bin"
    out = bench_json("--file", f, "--offset", offset, "--size", size, "--loops", 2, "--verify",
                     "--direct", direct, "--keep")
    assert out["pattern"] == "sequential" and out["offset"] == offset
    assert [r["verified"] for r in out["results"]] == [True, True]
    assert all(r["bytes"] == size for r in out["results"])
    data = f.read_bytes()
    assert len(data) == offset + size  # written exactly at [offset, offset + size)
    assert data[:offset] == b"\0" * offset


def test_offset_read_only_run_of_a_short_existing_file_is_refused(tmp_path):
    f = tmp_path / "mine.bin"
    f.write_bytes(b"x" * 8192)
    r = nvio("bench", "--op", "read", "--file", f, "--offset", 4103, "--size", 4096)
    line = assert_one_error_line(r)
    assert "--offset 4103 plus --size 4096" in line and "8192 bytes" in line


RANDOM = ["--pattern", "random", "--file-size", "1M"]


def assert_random_result(r, ops, block=4096):
    assert r["block_bytes"] == block
    assert r["ops"] == ops and r["ops_all"] == [ops] * r["loops"]
    assert r["bytes"] == ops * block
    assert len(r["iops_all"]) == len(r["lat_us_all"]) == len(r["seconds_all"]) == r["loops"]
    assert r["iops"] > 0 and r["gb_per_s"] > 0
    assert r["iops"] == pytest.approx(median(r["iops_all"]))
    assert r["gb_per_s"] == pytest.approx(r["iops"] * block / 1e9)
    for p50, p99, p999 in r["lat_us_all"]:
        assert 0 < p50 <= p99 <= p999
    assert 0 < r["lat_p50_us"] <= r["lat_p99_us"] <= r["lat_p999_us"]
    # Latency cannot exceed the loop: every operation was submitted and completed inside it.
    assert r["lat_p999_us"] <= max(r["seconds_all"]) * 1e6


def test_random_json(tmp_path):
    out = bench_json("--dir", tmp_path, *RANDOM, "--ops", 300, "--loops", 3, "--outstanding", 8)
    assert out["pattern"] == "random" and out["size"] == 4096  # the random default block size
    assert out["file_size"] == 1 << 20 and out["ops_limit"] == 300
    assert out["duration_s"] is None
    assert out["outstanding"] == 8 and out["batch"] == 1
    assert [r["op"] for r in out["results"]] == ["write", "read"]
    for r in out["results"]:
        assert_random_result(r, 300)
        assert r["verified"] is None
    assert list(tmp_path.iterdir()) == []  # the scratch file is removed


def test_random_default_outstanding_is_queue_depth_times_parallelism(tmp_path):
    out = bench_json("--dir", tmp_path, *RANDOM, "--ops", 50, "--loops", 1, "--op", "read",
                     "--queue-depth", 3, "--parallelism", 2)
    assert out["outstanding"] == 6
    assert_random_result(out["results"][0], 50)


def test_random_duration_ends_the_loop(tmp_path):
    out = bench_json("--dir", tmp_path, *RANDOM, "--duration", "0.2", "--loops", 1, "--op",
                     "read", "--outstanding", 4)
    assert out["ops_limit"] is None and out["duration_s"] == 0.2
    r = out["results"][0]
    assert r["ops"] > 0
    assert 0.2 <= r["seconds"] < 5


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("engine", ENGINES)
def test_random_verify_passes(tmp_path, engine, batch):
    require_engine(engine, tmp_path)
    out = bench_json("--dir", tmp_path, *RANDOM, "--ops", 203, "--loops", 2, "--verify",
                     "--engine", engine, "--outstanding", 8, "--batch", batch, "--size", "8K")
    assert out["engine"] == engine and out["batch"] == batch
    for r in out["results"]:
        assert_random_result(r, 203, 8192)  # 203: the last batch of each loop is short
        assert r["verified"] is True


@pytest.mark.parametrize("op", ["read", "write"])
def test_random_verify_single_op(tmp_path, op):
    out = bench_json("--dir", tmp_path, *RANDOM, "--op", op, "--ops", 100, "--loops", 1,
                     "--verify", "--size", "512", "--direct", "off")
    assert [r["op"] for r in out["results"]] == [op]
    assert out["results"][0]["verified"] is True


def test_random_verify_catches_a_flipped_byte(tmp_path):
    f = tmp_path / "data.bin"
    seed = "4242"
    size = 65536  # 16 blocks of 4 KiB: 2000 random reads read every one of them
    r = nvio("bench", "--op", "write", "--keep", "--file", f, "--seed", seed, "--size", size,
             "--loops", 1)
    assert r.returncode == 0, r.stderr
    args = ["bench", "--pattern", "random", "--op", "read", "--verify", "--file", f, "--seed",
            seed, "--file-size", size, "--ops", 2000, "--loops", 1, "--outstanding", 4]
    r = nvio(*args)
    assert r.returncode == 0, r.stderr  # clean before the flip: the failure below is the flip's

    bad_offset = 40_000 + 3
    data = bytearray(f.read_bytes())
    data[bad_offset] ^= 0x10
    f.write_bytes(bytes(data))
    r = nvio(*args, "--json")
    assert r.returncode == 1, r.stderr
    assert f"verify failed: first bad byte at file offset {bad_offset} " in r.stderr
    assert json.loads(r.stdout)["results"][0]["verified"] is False
    assert f.read_bytes() == bytes(data)


def test_random_read_only_run_of_a_short_existing_file_is_refused(tmp_path):
    f = tmp_path / "mine.bin"
    f.write_bytes(b"x" * 8192)
    before = fingerprint(f)
    r = nvio("bench", "--pattern", "random", "--op", "read", "--file", f, "--file-size", "1M")
    line = assert_one_error_line(r)
    assert "--file-size 1048576" in line and "8192 bytes" in line
    assert fingerprint(f) == before


def test_random_buffers_beyond_memory_are_refused_naming_the_flags(tmp_path):
    """Issue 28: a large --size failed as a bare "mmap of 34359738368 bytes failed"."""
    # 1024 x 1 GiB: more than any machine running this has; nothing is written.
    r = nvio("bench", "--dir", tmp_path / "made", "--pattern", "random", "--size", "1G",
             "--file-size", "1G", "--outstanding", 1024, "--ops", 1)
    line = assert_one_error_line(r, code=1)
    assert "--outstanding 1024 x --size 1 GiB = 1024.0 GiB" in line, line
    fits = r"(at most \d+ operations|not even 1 operation) of this --size fit"
    assert re.search(fits, line), line
    assert "MemAvailable" in line or "RLIMIT_AS" in line or "memory.max" in line, line
    assert list(tmp_path.iterdir()) == []  # not even the --dir was made


# ASan and TSan reserve terabytes of shadow address space at start: under an RLIMIT_AS of 3 GiB the
# sanitized program dies before main (SIGABRT, SIGSEGV), which says nothing about nvio.
@pytest.mark.skipif(os.environ.get("NVIO_SANITIZE", "") != "",
                    reason="a sanitizer build cannot start under an address-space limit (its shadow memory)")
def test_random_buffers_beyond_the_address_space_limit_name_it(tmp_path):
    import resource

    def limit():  # 3 GiB of address space, and a run asking for 4 GiB of buffers
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    r = subprocess.run([BIN, "bench", "--dir", str(tmp_path), "--pattern", "random", "--size",
                        "64M", "--file-size", "64M", "--outstanding", "64", "--ops", "1"],
                       capture_output=True, text=True, env=clean_env(), timeout=60,
                       preexec_fn=limit)
    line = assert_one_error_line(r, code=1)
    assert "--outstanding 64 x --size 64 MiB = 4.0 GiB" in line, line
    # Fewer than 48 fit under 3 GiB, whichever bound (this limit or MemAvailable) is lower.
    fit = int(re.search(r"at most (\d+) operations", line).group(1))
    assert fit < 48, line
    assert list(tmp_path.iterdir()) == []


def test_random_default_outstanding_is_named_when_it_makes_the_memory(tmp_path):
    r = nvio("bench", "--dir", tmp_path, "--pattern", "random", "--size", "1G", "--file-size",
             "1G", "--queue-depth", 512, "--parallelism", 2, "--ops", 1)
    line = assert_one_error_line(r, code=1)
    assert "--outstanding 1024 (default: queue_depth x parallelism) x --size 1 GiB" in line, line


def test_random_human_output(tmp_path):
    r = nvio("bench", "--dir", tmp_path, *RANDOM, "--ops", 64, "--loops", 1, "--batch", 2,
             "--outstanding", 4)
    assert r.returncode == 0, r.stderr
    assert "IOPS" in r.stdout and "p99.9 us" in r.stdout and "batch's" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["write"], ["read"])]
    assert [row[0] for row in rows] == ["write", "read"]
    assert all(row[1] == "64" for row in rows)


# ---- files --------------------------------------------------------------------------------------


def test_file_removed_without_keep(tmp_path):
    f = tmp_path / "new.bin"
    out = bench_json("--file", f, "--size", ODD_SIZE, "--loops", 1)
    assert out["file"] == str(f)
    assert not f.exists()


def test_file_kept_with_keep(tmp_path):
    f = tmp_path / "kept.bin"
    bench_json("--file", f, "--size", ODD_SIZE, "--loops", 1, "--keep")
    assert f.stat().st_size == ODD_SIZE


def test_existing_file_is_never_removed(tmp_path):
    f = tmp_path / "mine.bin"
    content = os.urandom(2 * ODD_SIZE)
    f.write_bytes(content)
    out = bench_json("--op", "read", "--file", f, "--size", ODD_SIZE, "--loops", 1)
    assert out["results"][0]["bytes"] == ODD_SIZE
    assert f.read_bytes() == content


def fingerprint(path):
    """What must not change when a run only reads a file: its bytes, size and mtime."""
    st = os.stat(path)
    return hashlib.sha256(open(path, "rb").read()).hexdigest(), st.st_size, st.st_mtime_ns


@pytest.mark.parametrize("content_size", [0, 3, ODD_SIZE - 1])
@pytest.mark.parametrize("mode", [0o644, 0o444])
def test_read_only_run_never_writes_an_existing_file(tmp_path, content_size, mode):
    # A --size larger than the file is refused (exit 2, naming the file, its size and --size)
    # rather than the file being extended or overwritten with the pattern.
    f = tmp_path / "mine.bin"
    f.write_bytes(os.urandom(content_size))
    f.chmod(mode)
    before = fingerprint(f)
    r = nvio("bench", "--op", "read", "--file", f, "--size", ODD_SIZE, "--loops", 1)
    line = assert_one_error_line(r)
    assert str(f) in line and f"{content_size} bytes" in line and str(ODD_SIZE) in line
    assert fingerprint(f) == before
    if content_size:  # a --size the file holds is read, and the file is left as it was
        out = bench_json("--op", "read", "--file", f, "--size", content_size, "--loops", 2)
        assert out["results"][0]["bytes"] == content_size
        assert fingerprint(f) == before


def test_default_op_does_not_overwrite_an_existing_file(tmp_path):
    f = tmp_path / "mine.bin"
    f.write_bytes(os.urandom(ODD_SIZE))
    before = fingerprint(f)
    r = nvio("bench", "--file", f, "--size", 65536, "--loops", 1)
    line = assert_one_error_line(r)
    assert str(f) in line and "--op read" in line and "--op write" in line
    assert fingerprint(f) == before


@pytest.mark.parametrize("op", ["write", "both"])
def test_explicit_write_op_overwrites_an_existing_file_and_keeps_it(tmp_path, op):
    f = tmp_path / "mine.bin"
    f.write_bytes(b"\0" * (2 * 65536))
    out = bench_json("--op", op, "--file", f, "--size", 65536, "--loops", 1, "--verify")
    assert all(r["verified"] is True for r in out["results"])
    data = f.read_bytes()
    assert len(data) == 2 * 65536  # only the first --size bytes are written
    assert data[:65536] != b"\0" * 65536 and data[65536:] == b"\0" * 65536


def dummy_block_device(tmp_path):
    """A block device node for device 0:0, which no driver has: never a real disk, so a test (or a
    regression) can never write to one."""
    path = tmp_path / "blockdev"
    try:
        os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(0, 0))
    except OSError as e:
        pytest.skip(f"cannot make a block device node here: {e}")
    return path


@pytest.mark.parametrize("kind", ["directory", "fifo", "char-device", "block-device"])
@pytest.mark.parametrize("op", ["read", "both"])
def test_file_that_is_not_a_regular_file_is_refused(tmp_path, kind, op):
    if kind == "directory":
        target, words = tmp_path / "d", "is a directory"
        target.mkdir()
    elif kind == "fifo":
        target, words = tmp_path / "fifo", "is a FIFO"
        os.mkfifo(target)
    elif kind == "char-device":
        target, words = "/dev/null", "is a character device"
    else:
        target, words = dummy_block_device(tmp_path), "is a block device"
    r = nvio("bench", "--op", op, "--file", target, "--size", 4096, "--loops", 1, timeout=20)
    line = assert_one_error_line(r)
    assert str(target) in line and words in line
    if kind == "directory":
        assert list(target.iterdir()) == []


def test_dir_is_created_and_scratch_file_kept_with_keep(tmp_path):
    d = tmp_path / "a" / "b"
    out = bench_json("--dir", d, "--size", ODD_SIZE, "--loops", 1, "--keep")
    assert [p.name for p in d.iterdir()] == [os.path.basename(out["file"])]
    assert os.path.getsize(out["file"]) == ODD_SIZE


# ---- configuration file ---------------------------------------------------------------------


@pytest.mark.parametrize("command", ["report", "bench"])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "huge"])
def test_unreadable_kinds_of_configuration_file_are_one_line_not_a_hang(tmp_path, command, kind):
    if kind == "dev-zero":
        config, words = "/dev/zero", "character device"
    elif kind == "fifo":
        config, words = str(tmp_path / "config.fifo"), "FIFO"
        os.mkfifo(config)
    else:
        config, words = str(tmp_path / "config.json"), "limit"
        with open(config, "wb") as f:
            f.truncate(1 << 30)  # sparse: costs no disk
    args = ["--dir", tmp_path / "d"]
    if command == "bench":
        args += ["--size", 4096, "--loops", 1]
    r = nvio(command, *args, env=clean_env(NVIO_CONFIG=config), timeout=20)
    line = assert_one_error_line(r)
    assert config in line and words in line
    assert not (tmp_path / "d").exists()


def test_directory_as_configuration_file_says_so(tmp_path):
    r = nvio("report", "--dir", tmp_path, env=clean_env(NVIO_CONFIG=str(tmp_path)), timeout=20)
    line = assert_one_error_line(r, code=1)
    assert str(tmp_path) in line and "Is a directory" in line


# ---- report -------------------------------------------------------------------------------------


def test_report_json(tmp_path):
    r = nvio("report", "--json", "--dir", tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert set(rep) >= {"engines", "auto_engine", "auto_reason", "dir", "memlock_limit",
                        "aio_max_nr", "aio_nr", "kernel", "options", "version"}
    assert set(rep["engines"]) == set(ENGINES)
    for probe in rep["engines"].values():
        assert isinstance(probe["available"], bool) and isinstance(probe["reason"], str)
    assert rep["engines"]["psync"]["available"] is True
    assert rep["auto_engine"] in ENGINES and rep["engines"][rep["auto_engine"]]["available"]
    assert isinstance(rep["auto_reason"], str) and rep["auto_reason"]
    assert os.uname().release in rep["kernel"]
    d = rep["dir"]
    assert d["path"] == str(tmp_path)
    assert isinstance(d["direct_io"], bool) and isinstance(d["source"], str)
    assert d["error"] is None
    for key in ("mem_align", "offset_align"):
        assert isinstance(d[key], int) and d[key] >= 0
        if d["direct_io"]:
            assert d[key] > 0 and d[key] & (d[key] - 1) == 0  # a power of two
    for key in ("memlock_limit", "aio_max_nr", "aio_nr"):
        assert rep[key] is None or (isinstance(rep[key], int) and rep[key] >= 0)
    with open("/proc/self/status") as status:  # this process's capabilities are the CLI's
        capeff = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    assert rep["memlock_capability"] is bool(capeff >> 14 & 1)
    text = nvio("report", "--dir", tmp_path).stdout
    assert ("CAP_IPC_LOCK" in text) == rep["memlock_capability"]
    assert set(rep["options"]) == OPTION_NAMES
    assert all(o["source"] == "default" for o in rep["options"].values())
    assert rep["options"]["block_size"]["value"] == 1 << 20
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_report_in_a_directory_it_cannot_probe():
    # The probe creates a file; sysfs refuses that even to root. The report still comes, its
    # directory section saying why; a --dir named by the user is an error instead.
    r = subprocess.run([BIN, "report", "--json"], capture_output=True, text=True, env=clean_env(),
                       cwd="/sys", timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["dir"]
    assert d["path"] == "/sys"
    assert "probing the directory" in d["error"]
    assert d["direct_io"] is None and d["mem_align"] is None and d["offset_align"] is None
    text = subprocess.run([BIN, "report"], capture_output=True, text=True, env=clean_env(),
                          cwd="/sys", timeout=60)
    assert text.returncode == 0, text.stderr
    assert "not probed" in text.stdout and "--dir DIR probes another" in text.stdout
    named = nvio("report", "--dir", "/sys")
    assert named.returncode != 0
    assert "probing the directory" in named.stderr and named.stdout == ""


def test_report_shows_environment_sources(tmp_path):
    rep = json.loads(nvio("report", "--json", "--dir", tmp_path,
                          env=clean_env(NVIO_BLOCK_SIZE="2M")).stdout)
    assert rep["options"]["block_size"] == {"value": 2 << 20, "source": "environment"}
    others = {k: v["source"] for k, v in rep["options"].items() if k != "block_size"}
    assert set(others.values()) == {"default"}


def test_report_text(tmp_path):
    r = nvio("report", "--dir", tmp_path)
    assert r.returncode == 0, r.stderr
    assert os.uname().release in r.stdout
    for word in ("io_uring", "libaio", "psync", "O_DIRECT", "RLIMIT_MEMLOCK", "fs.aio-max-nr"):
        assert word in r.stdout


def test_evict_and_report_cached(tmp_path):
    path = tmp_path / "f.bin"
    size = (1 << 20) + 123
    path.write_bytes(os.urandom(size))
    rep = json.loads(nvio("report", "--json", "--dir", tmp_path, "--cached", path).stdout)
    (c,) = rep["cached"]
    assert c["path"] == str(path) and c["file_bytes"] == size
    assert c["cached_bytes"] == size  # just written through the page cache
    r = nvio("evict", path)
    assert r.returncode == 0, r.stderr
    assert str(path) in r.stdout and "now 0 of" in r.stdout
    rep = json.loads(nvio("report", "--json", "--dir", tmp_path, "--cached", path).stdout)
    assert rep["cached"][0]["cached_bytes"] == 0
    text = nvio("report", "--dir", tmp_path, "--cached", path).stdout
    assert f"{path}: 0 of {size} bytes cached" in text
    assert "cached" not in json.loads(nvio("report", "--json", "--dir", tmp_path).stdout)


def test_evict_errors(tmp_path):
    r = nvio("evict", tmp_path / "missing")
    assert r.returncode == 1 and "missing" in r.stderr and "No such file" in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("nvio: error:")
    r = nvio("evict")
    assert r.returncode == 2 and "required" in r.stderr
    r = nvio("report", "--cached", tmp_path / "missing")
    assert r.returncode == 1 and "missing" in r.stderr


def test_evict_and_report_cached_of_a_fifo_refuse_it_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args in (("evict", fifo), ("report", "--cached", fifo)):
        r = nvio(*args, timeout=20)
        line = assert_one_error_line(r, code=1)
        assert str(fifo) in line and "not a regular file" in line


# ---- sizes no run can have, and deeply nested JSON ----------------------------------------------


@pytest.mark.parametrize("args", [
    # Within a page of 2^64: rounding the buffer up wrapped to a tiny mapping, filled in full.
    ("--op", "write", "--size", 2**64 - 1),
    ("--op", "write", "--size", 2**64 - 4096),
    # Sizes that fit memory but no disk: refused before a byte is written.
    ("--op", "write", "--size", "16777215T"),
    ("--pattern", "random", "--file-size", 2**64 - 4096, "--size", "4K", "--duration", "0.1"),
])
def test_sizes_no_run_can_have_are_refused_before_writing(tmp_path, args):
    d = tmp_path / "d"
    r = nvio("bench", "--dir", d, "--loops", 1, *args, timeout=60)
    assert_one_error_line(r, code=1)
    assert not d.exists() or list(d.iterdir()) == []


def test_tune_refuses_a_size_that_wraps_its_free_space_check(tmp_path):
    r = nvio("tune", "--dir", tmp_path, "--size", 2**64 - (64 << 20), "--budget", 2, timeout=60)
    line = assert_one_error_line(r, code=1)
    assert "bytes are free" in line
    assert list(tmp_path.iterdir()) == []


def _deep(n: int = 150_000) -> str:
    return "[" * n + "]" * n


# The texts are built in the test (DEEP stands for the nesting): pytest puts a test's id, which
# holds its parameters, in the environment of the processes it starts, and 300 KB there is more
# than exec takes.
@pytest.mark.parametrize("text, words", [
    ('{"version":1,"default":DEEP}', "default must be a string, got an array of 1 item"),
    ('{"version":1,"profiles":{"x":{"options":{"engine":DEEP}}}}', "profiles.x.options.engine"),
    ('{"version":1,"profiles":{"x":{"options":{"queue_depth":1e400}}}}', "number overflow"),
], ids=["deep default", "deep option", "1e400"])
def test_configuration_values_that_broke_the_error_message(tmp_path, text, words):
    """A value nested 150,000 deep crashed (stack overflow) in the JSON dump meant to quote it;
    a number past a double's range escaped as a bare json exception naming no file."""
    config = tmp_path / "config.json"
    config.write_text(text.replace("DEEP", _deep()))
    r = nvio("report", "--dir", tmp_path, env=clean_env(NVIO_CONFIG=str(config)), timeout=30)
    line = assert_one_error_line(r)
    assert str(config) in line and words in line
    assert len(line) < 400


# ---- GPU ----------------------------------------------------------------------------------------


def test_report_gpu_section_explains_what_it_found(tmp_path):
    rep = report(str(tmp_path))
    g = rep["gpu"]
    assert set(g) == {"driver", "runtime", "devices", "cufile", "gds"}
    assert isinstance(g["driver"]["loaded"], bool) and g["driver"]["reason"]
    assert isinstance(g["cufile"]["loaded"], bool) and g["cufile"]["reason"]
    assert g["gds"]["mode"] in ("unavailable", "compatibility", "p2p") and g["gds"]["reason"]
    if not g["driver"]["loaded"]:
        assert g["devices"] == [] and g["gds"]["mode"] == "unavailable"
    text = nvio("report", "--dir", tmp_path)
    assert text.returncode == 0, text.stderr
    assert "GDS mode" in text.stdout and "CUDA driver" in text.stdout
    assert g["gds"]["reason"] in text.stdout


def test_report_cufile_library_override_names_the_missing_file(tmp_path):
    missing = tmp_path / "libcufile-missing.so.0"
    r = nvio("report", "--json", "--dir", tmp_path,
             env=clean_env(NVIO_CUFILE_LIBRARY=str(missing)))
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)["gpu"]
    assert g["cufile"]["loaded"] is False
    assert str(missing) in g["cufile"]["reason"] and "NVIO_CUFILE_LIBRARY" in g["cufile"]["reason"]
    assert g["gds"]["mode"] == "unavailable"


def test_bench_gpu_without_a_gpu_is_one_clear_line(tmp_path):
    if report(str(tmp_path))["gpu"]["devices"]:
        pytest.skip("a GPU is present")
    for args in (["--gpu"], ["--gpu", "--gds"], ["--gpu", "--h2d-only"]):
        r = nvio("bench", "--dir", tmp_path, "--size", "1M", *args)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("nvio: error: --gpu: no usable GPU"), lines
    assert list(tmp_path.iterdir()) == []


def test_bench_gpu_flag_combinations_are_usage_errors(tmp_path):
    for args in (["--gds"], ["--h2d-only"], ["--gpu", "--gds", "--h2d-only"]):
        r = nvio("bench", "--dir", tmp_path, *args)
        assert r.returncode == 2 and "nvio: error: --gds" in r.stderr, (args, r.stderr)


def test_bench_gpu_round_trip(tmp_path):
    if not report(str(tmp_path))["gpu"]["devices"]:
        pytest.skip("no GPU: " + report(str(tmp_path))["gpu"]["driver"]["reason"])
    for extra in ([], ["--gds"]):
        out = bench_json("--dir", tmp_path, "--size", ODD_SIZE, "--loops", 1, "--verify", "--gpu",
                         "--block-size", "64K", *extra)
        assert out["memory"] == "device"
        assert [r["verified"] for r in out["results"]] == [True, True]


# ---- progress -----------------------------------------------------------------------------------


def progress_args(tmp_path, loops):
    return ["bench", "--dir", tmp_path, "--op", "write", "--size", "16M", "--loops", loops,
            "--direct", "off"]


def long_non_terminal_run(tmp_path, seconds):
    """Finds a loop count whose run takes more than `seconds`; returns (loops, its result)."""
    out = bench_json(*progress_args(tmp_path, 3)[1:])
    loops = int(math.ceil(1.5 * seconds / max(out["results"][0]["seconds"], 1e-4)))
    for _ in range(4):
        loops = min(loops, 100000)
        start = time.monotonic()
        r = nvio(*progress_args(tmp_path, loops))
        elapsed = time.monotonic() - start
        assert r.returncode == 0, r.stderr
        if elapsed > seconds:
            return loops, r
        loops = int(math.ceil(loops * 1.5 * seconds / elapsed))
    pytest.fail("could not make a bench run last long enough to test progress")


def run_on_pty(args):
    """Runs nvio with stderr on a terminal; returns (exit code, what it wrote there, seconds)."""
    start = time.monotonic()
    master, slave = pty.openpty()
    proc = subprocess.Popen([BIN, *map(str, args)], stdout=subprocess.DEVNULL, stderr=slave,
                            env=clean_env())
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    code = proc.wait(timeout=60)
    return code, b"".join(chunks).decode(errors="replace"), time.monotonic() - start


def test_progress_only_on_a_terminal(tmp_path):
    # Long enough (> 2 s) that a terminal would get progress.
    loops, r = long_non_terminal_run(tmp_path, 2.5)
    assert "\r" not in r.stderr and "loop" not in r.stderr

    # The terminal run can be faster than the calibration run (page cache, a quieter machine);
    # only a run that lasted well past the 2 s delay may be judged for its missing progress.
    for _ in range(4):
        code, tty_err, elapsed = run_on_pty(progress_args(tmp_path, loops))
        assert code == 0, tty_err
        if tty_err or elapsed > 3.0:
            break
        loops = min(loops * 2, 100000)
    assert "\rnvio bench: write loop" in tty_err, f"nothing shown in a {elapsed:.1f} s run"
    assert tty_err.endswith("\r\x1b[K")  # the status line is cleared at the end


@pytest.mark.parametrize("command", [
    ("bench", "--size", "16M", "--op", "write", "--loops", "1000000", "--direct", "off"),
    ("tune", "--size", "64M", "--budget", "60"),
])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_interrupted_run_removes_its_scratch_file(tmp_path, command, sig):
    """Ctrl-C, a kill and a closed terminal: the run ends by the signal with no file left (tune's
    file, the library's, went when its blocking calls stopped and unwound; before, tune left it
    on every signal and bench on SIGHUP)."""
    proc = subprocess.Popen([BIN, command[0], "--dir", str(tmp_path), *command[1:]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env(),
                            text=True)
    deadline = time.monotonic() + 20
    while not any(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any(tmp_path.iterdir()), "the scratch file never appeared"
    time.sleep(0.2)
    proc.send_signal(sig)
    assert proc.wait(timeout=20) == -sig
    assert list(tmp_path.iterdir()) == []
    if command[0] == "tune":
        assert f"stopped by {signal.Signals(sig).name}" in proc.stderr.read()


# ---- several drives: --dir repeated ---------------------------------------------------------------


def test_striped_bench_verifies_and_reports_each_drive(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]  # made by the run
    args = [x for d in dirs for x in ("--dir", d)]
    out = bench_json(*args, "--size", ODD_SIZE, "--stripe-size", "64K", "--loops", 2, "--verify",
                     "--keep", "--block-size", "16K", "--seed", "99")
    assert out["stripe"]["directories"] == [str(d) for d in dirs]
    assert out["stripe"]["stripe_size"] == 65536
    # Each drive's handle: the flags over its own saved profile.
    assert [d["options"]["block_size"] for d in out["stripe"]["drives"]] == [16384] * 3
    assert all(d["options_sources"]["block_size"] == "explicit" for d in out["stripe"]["drives"])
    for r in out["results"]:
        assert r["verified"] is True
        drives = r["drives"]
        assert [d["directory"] for d in drives] == [str(d) for d in dirs]
        assert sum(d["bytes"] for d in drives) == ODD_SIZE
        assert all(d["gb_per_s"] > 0 and 0 < d["seconds"] for d in drives)
    # The parts hold the layout's stripes: stripe k of the pattern in directory k % 3 at
    # (k // 3) * 64K; checked against a --file run of the same seed.
    name = out["file"]
    parts = [(d / name).read_bytes() for d in dirs]
    assert sum(map(len, parts)) == ODD_SIZE
    whole = tmp_path / "whole.bin"
    r = nvio("bench", "--op", "write", "--keep", "--file", whole, "--size", ODD_SIZE, "--loops", 1,
             "--seed", "99")
    assert r.returncode == 0, r.stderr
    data = whole.read_bytes()
    for k in range(math.ceil(ODD_SIZE / 65536)):
        part = parts[k % 3]
        at = (k // 3) * 65536
        assert part[at:at + 65536] == data[k * 65536:(k + 1) * 65536], k


def test_striped_bench_removes_every_part(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    r = nvio("bench", "--dir", dirs[0], "--dir", dirs[1], "--size", "1M", "--loops", 1)
    assert r.returncode == 0, r.stderr
    assert "striped over 2 drives in 1 MiB stripes" in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if re.match(r"\s+drive\s+\d", ln)]
    assert len(rows) == 4  # each drive under the write row and under the read row
    assert len([ln for ln in r.stdout.splitlines() if re.match(r"\s+drive /.*: engine", ln)]) == 2
    assert list(dirs[0].iterdir()) == [] and list(dirs[1].iterdir()) == []


@pytest.mark.parametrize("extra,needle", [
    (["--stripe-size", "64K"], "--stripe-size needs several --dir"),
    (["--dir", "SECOND", "--stripe-size", "5000"], "stripe_size 5000"),
    (["--dir", "SECOND", "--pattern", "random"], "--pattern random takes one --dir"),
    (["--dir", "SECOND", "--file", "F"], "--file and --dir exclude each other"),
    (["--dir", "FIRST"], "given twice"),
])
def test_striped_bench_bad_arguments(tmp_path, extra, needle):
    first = tmp_path / "a"
    extra = [str(tmp_path / "b") if x == "SECOND" else str(tmp_path / "f") if x == "F"
             else str(first) if x == "FIRST" else x for x in extra]
    line = assert_one_error_line(nvio("bench", "--dir", first, *extra, "--size", "1M"))
    assert needle in line


# ---- ckpt-bench: handed to the Python module nvio.ckpt_bench ------------------------------------

# The build's Python package beside the program (build/python next to build/bin), which
# `nvio ckpt-bench` finds; the sanitizer builds have none.
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(BIN))), "python", "nvio",
                       "ckpt_bench.py")
needs_package = pytest.mark.skipif(not os.path.isfile(PACKAGE),
                                   reason=f"this build has no Python package ({PACKAGE})")


@needs_package
def test_ckpt_bench_runs_the_python_module(tmp_path):
    r = nvio("ckpt-bench", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: nvio ckpt-bench"), r.stderr
    r = nvio("ckpt-bench", "--dir", tmp_path, "--size", "1M", "--layers", 1, "--rounds", 1,
             "--no-bench", "--json", timeout=120)
    if r.returncode == 1 and "PyTorch is needed" in r.stderr:
        pytest.skip(f"the Python this build runs has no PyTorch: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["ratios"]["load_vs_torch"] > 0 and result["tensors"] == 44
    assert list(tmp_path.iterdir()) == []
    # Its exit status and error line are the module's own.
    r = nvio("ckpt-bench", "--size", "0")
    assert r.returncode == 2 and "nvio ckpt-bench: error: argument --size" in r.stderr


def test_ckpt_bench_without_python_is_one_error_line():
    r = nvio("ckpt-bench", "--size", "1M", env=clean_env(NVIO_PYTHON="/nonexistent/python3"))
    line = assert_one_error_line(r, code=1)
    assert "cannot start '/nonexistent/python3': No such file or directory" in line


def test_sync_makes_the_timed_writes_durable(tmp_path):
    # Buffered writes, kept: without --sync the file's pages are still dirty after the run, with it
    # none are (cachestat, Linux 6.5: mincore cannot tell dirty pages; tmpfs has no writeback).
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True,
                          text=True).stdout.strip()
    if kind == "tmpfs":
        pytest.skip(f"{tmp_path} is on tmpfs, whose pages stay dirty whatever is synced")

    def dirty_after(*extra):
        path = tmp_path / f"f{len(extra)}.dat"
        r = nvio("bench", "--file", path, "--size", "8M", "--op", "write", "--loops", 2,
                 "--direct", "off", "--keep", "--json", *extra)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["results"][0]["synced"] == bool(extra)
        report = nvio("report", "--cached", path, "--json")
        assert report.returncode == 0, report.stderr
        cached = json.loads(report.stdout)["cached"][0]
        if cached["method"] != "cachestat":
            pytest.skip(f"no cachestat here ({cached['method']}): dirty pages cannot be counted")
        return cached["dirty_bytes"]

    assert dirty_after("--sync") == 0
    assert dirty_after() > 0


@pytest.mark.parametrize("args", [("bench", "--size", "1M", "--loops", 1, "--json"),
                                  ("report", "--json"), ("bench", "--size", "1M", "--loops", 1)])
def test_output_that_cannot_be_written_is_a_failure(tmp_path, args):
    """Results written to a full disk (here /dev/full) are lost: the run fails, saying so, instead
    of exiting 0 with an empty results file."""
    with open("/dev/full", "w") as full:
        r = subprocess.run([BIN, args[0], "--dir", str(tmp_path), *map(str, args[1:])],
                           stdout=full, stderr=subprocess.PIPE, text=True, env=clean_env(),
                           timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "nvio: error: writing the output failed: No space left on device")


def test_every_rate_printed_is_its_rows_bytes_over_its_seconds(tmp_path):
    """With an even number of loops the median of the loops' rates is not the rate of the median
    bytes and seconds: the per-drive and all-process rows printed one of each (1.42 GB/s beside
    bytes and seconds that give 1.17)."""
    def check(row):
        assert math.isclose(row["gb_per_s"], row["bytes"] / row["seconds"] / 1e9, rel_tol=1e-9), row

    striped = bench_json("--dir", tmp_path / "a", "--dir", tmp_path / "b", "--size", "5M",
                         "--loops", 2)
    for result in striped["results"]:
        check(result)
        assert len(result["drives"]) == 2
        for drive in result["drives"]:
            check(drive)
    procs = bench_json("--dir", tmp_path / "p", "--size", "4M", "--loops", 2, "--procs", 2)
    assert len(procs["aggregate"]) == 2
    for row in procs["aggregate"]:
        check(row)


def test_file_that_is_a_dangling_link_is_refused_and_left_alone(tmp_path):
    """Before: the run wrote the link's missing target, then removed the link (the user's) and
    left the 1 MiB target behind."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    r = nvio("bench", "--file", link, "--size", "1M", "--loops", 1, "--op", "write")
    line = assert_one_error_line(r)
    assert "symbolic link to a file that does not exist" in line
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["link"]


@pytest.mark.parametrize("args, words", [
    (("--device", "3"), "--device applies with --gpu only"),
    (("--op", "read", "--sync"), "--sync applies to writes"),
])
def test_bench_options_that_were_silently_ignored_are_refused(tmp_path, args, words):
    r = nvio("bench", "--dir", tmp_path, "--size", "1M", "--loops", 1, *args)
    assert words in assert_one_error_line(r)
    r = nvio("bench", "--dir", "", "--size", "1M", "--loops", 1)  # ran in the current directory
    assert "--dir: the directory name is empty" in assert_one_error_line(r)


@pytest.mark.parametrize("flags", [("--no-single-submit", "--single-submit"),
                                   ("--overlap-events", "--no-overlap-events")])
def test_a_boolean_flag_and_its_negation_together_are_refused(tmp_path, flags):
    """Both were accepted and --no-X won whatever the order (CLI11 runs callbacks in definition
    order)."""
    r = nvio("bench", "--dir", tmp_path, "--size", "1M", "--loops", 1, *flags)
    line = assert_one_error_line(r)
    assert "excludes" in line


@pytest.mark.parametrize("command", [
    ("bench", "--size", "16M", "--op", "write", "--loops", "1000000", "--direct", "off"),
    ("tune", "--size", "64M", "--budget", "60"),
])
def test_a_signal_ignored_at_start_stays_ignored(tmp_path, command):
    """`nohup nvio tune ... &`: a closed terminal's SIGHUP must not stop the run (its handler for
    SIGHUP took over the inherited SIG_IGN); Ctrl-C still does, and removes the file."""
    proc = subprocess.Popen([BIN, command[0], "--dir", str(tmp_path), *command[1:]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    deadline = time.monotonic() + 20
    while not any(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any(tmp_path.iterdir()), "the scratch file never appeared"
    time.sleep(0.2)
    proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert proc.poll() is None, "SIGHUP, ignored when the run started, stopped it"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == -signal.SIGINT
    assert list(tmp_path.iterdir()) == []
