#!/usr/bin/python3
"""How close does `nvio tune` (a budgeted search) get to `nvio tune --grid` (every configuration)?

The script runs, on the same --dir with the same --size and --engines,

  * `nvio tune --grid --json` (slow: it measures the whole space; --grid-json FILE reuses one),
  * `nvio tune --json` with the default budget or --budget (--tune-json FILE reuses one),

and records each one's wall time. Then, for each mode (read, write), it measures the search's
pick and the grid's best head-to-head with `nvio bench` and explicit options (engine, block size,
queue depth, parallelism, single_submit, overlap_events, direct): both on the SAME file, one
pass each per round, alternating which goes first from one round to the next, --rounds rounds.
The tuners' own figures come from short trials inside their runs; the head-to-head measures
both configurations the same way, at the same time, so the ratio pick/grid-best is fair.

Output: a Markdown table (mode, grid best + GB/s, tuner pick + GB/s, ratio of the medians, tune
elapsed vs budget, grid elapsed) and the exact commands used, ready for bench/results.md
(and its current figures for docs/performance.md).
--json-out FILE keeps everything (both tune results, every bench run).

Exit status: 0 done; 1 a run failed; 2 bad usage, or the nvio binary has no `tune` subcommand.
Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # python3 -P leaves bench/ off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib
from benchlib import (Failure, child_env, error_exit, find_nvio, fmt, human, interrupt_on_sigterm,
                      log, machine_info, parse_size, positive_int, positive_seconds)

MODES = ("read", "write")
FILE_NAME = "nvio-tune-vs-grid.dat"
# The options a tune result names and `nvio bench` takes; all must match for a fair run.
OPTION_KEYS = ("engine", "block_size", "queue_depth", "intra_op_parallelism", "single_submit",
               "overlap_events", "direct")


# ---- small helpers ----------------------------------------------------------------------------


def run_cmd(cmd: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    """Runs cmd without NVIO_* in its environment; raises Failure when it cannot start, times out
    or fails (naming the command shell-quoted, with the last line of its output)."""
    return benchlib.run_cmd(cmd, timeout=timeout, env=child_env(), short_error=True)


def require_tune(nvio: str) -> None:
    # `nvio tune --help` is no test: the CLI answers an unknown subcommand followed by --help
    # with the top-level help and exit 0. The top-level help lists the subcommands.
    proc = run_cmd([nvio, "--help"], timeout=30)
    if not re.search(r"^\s+tune\s", proc.stdout, re.MULTILINE):
        raise Failure(f"{nvio} has no `tune` subcommand (too old?); build one that has it or "
                      "pass --nvio", code=2)


# ---- the two tuner runs -----------------------------------------------------------------------


def tune_cmd(nvio: str, args, grid: bool) -> list[str]:
    cmd = [nvio, "tune", "--dir", str(args.dir)]
    if args.size is not None:
        cmd += ["--size", str(args.size)]
    if args.engines:
        cmd += ["--engines", args.engines]
    if grid:
        cmd.append("--grid")  # the budget does not apply to a grid
    elif args.budget is not None:
        cmd += ["--budget", f"{args.budget:g}"]
    return cmd + ["--json"]


def load_tune(path: Path, what: str, strategy: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise Failure(f"{what} {path}: {e.strerror}", code=2) from None
    except ValueError as e:
        raise Failure(f"{what} {path}: not valid JSON ({e})", code=2) from None
    check_tune(data, f"{what} {path}")
    # Swapped files would silently turn the comparison around.
    if data.get("strategy", strategy) != strategy:
        raise Failure(f"{what} {path}: a {data['strategy']!r} result, expected {strategy!r}",
                      code=2)
    return data


def check_tune(data, what: str) -> None:
    if not isinstance(data, dict) or not isinstance(data.get("best"), dict) \
            or not isinstance(data.get("file_size"), int):
        raise Failure(f"{what}: not `nvio tune --json` output (no best / file_size)", code=2)


def reused(path: Path, what: str, strategy: str) -> dict:
    return {"cmd": None, "wall_s": None, "reused": str(path),
            "result": load_tune(path, what, strategy)}


def run_tune(nvio: str, args, grid: bool) -> dict:
    cmd = tune_cmd(nvio, args, grid)
    log(f"running {shlex.join(cmd)}" + (" (every configuration: this takes long)" if grid else ""))
    started = time.monotonic()
    proc = run_cmd(cmd)  # no time limit: a grid on a slow device can take hours
    wall = time.monotonic() - started
    try:
        data = json.loads(proc.stdout)
    except ValueError as e:
        raise Failure(f"`{shlex.join(cmd)}` printed no JSON ({e})") from None
    check_tune(data, shlex.join(cmd))
    log(f"  done in {wall:.1f} s")
    return {"cmd": cmd, "wall_s": wall, "reused": None, "result": data}


# ---- the head-to-head -------------------------------------------------------------------------


def options_of(best: dict | None) -> dict | None:
    if not isinstance(best, dict) or not isinstance(best.get("options"), dict):
        return None
    o = best["options"]
    missing = [k for k in OPTION_KEYS if k not in o]
    if missing:
        raise Failure(f"a best configuration lacks {', '.join(missing)}: {json.dumps(o)}")
    return {k: o[k] for k in OPTION_KEYS}


def describe(o: dict | None) -> str:
    if o is None:
        return "-"
    text = (f"{o['engine']} {human(int(o['block_size']), short=True)} qd{o['queue_depth']} "
            f"p{o['intra_op_parallelism']} direct {o['direct']}")
    if o["single_submit"]:
        text += " single_submit"
    if not o["overlap_events"]:
        text += " no-overlap"
    return text


def bench_cmd(nvio: str, path: Path, size: int, mode: str, o: dict) -> list[str]:
    cmd = [nvio, "bench", "--file", str(path), "--keep", "--size", str(size), "--op", mode,
           "--engine", str(o["engine"]), "--block-size", str(o["block_size"]),
           "--queue-depth", str(o["queue_depth"]), "--parallelism", str(o["intra_op_parallelism"]),
           "--direct", str(o["direct"])]
    if o["single_submit"]:
        cmd.append("--single-submit")
    if not o["overlap_events"]:
        cmd.append("--no-overlap-events")
    return cmd + ["--loops", "1", "--json"]


def run_bench(cmd: list[str], mode: str, size: int, o: dict, timeout: float) -> dict:
    proc = run_cmd(cmd, timeout=timeout)
    try:
        data = json.loads(proc.stdout)
        r = next(r for r in data["results"] if r["op"] == mode)
        got = data["options"]
    except (ValueError, KeyError, StopIteration) as e:
        raise Failure(f"cannot parse `{shlex.join(cmd)}` output ({e})") from None
    # The engine could fall back, or a setting be adjusted; then the pair would not be compared.
    differ = {k: (o[k], got.get(k)) for k in OPTION_KEYS if str(got.get(k)) != str(o[k])}
    if differ:
        raise Failure(f"`{shlex.join(cmd)}` ran other options than asked (asked, got): {differ}")
    if int(r["bytes"]) != size:
        raise Failure(f"`{shlex.join(cmd)}` moved {r['bytes']} bytes, expected {size}")
    return {"gb_per_s": float(r["gb_per_s"]), "seconds": float(r["seconds"]),
            "cpu_s_per_gb": float(r["cpu_s_per_gb"])}


def head_to_head(nvio: str, path: Path, size: int, mode: str, grid_o: dict, pick_o: dict,
                 rounds: int, timeout: float) -> dict:
    cmds = {"grid": bench_cmd(nvio, path, size, mode, grid_o),
            "pick": bench_cmd(nvio, path, size, mode, pick_o)}
    opts = {"grid": grid_o, "pick": pick_o}
    runs = []
    for rnd in range(rounds):
        # Alternating the order cancels drift (device heating, background work) between the two.
        order = ("grid", "pick") if rnd % 2 == 0 else ("pick", "grid")
        entry = {"round": rnd + 1, "first": order[0]}
        for side in order:
            entry[side] = run_bench(cmds[side], mode, size, opts[side], timeout)
        runs.append(entry)
        log(f"  {mode} round {rnd + 1}/{rounds}: grid best {entry['grid']['gb_per_s']:.3f} GB/s, "
            f"tuner pick {entry['pick']['gb_per_s']:.3f} GB/s ({order[0]} first)")
    med = {s: statistics.median(r[s]["gb_per_s"] for r in runs) for s in ("grid", "pick")}
    paired = [r["pick"]["gb_per_s"] / r["grid"]["gb_per_s"] for r in runs
              if r["grid"]["gb_per_s"] > 0]
    return {
        "grid_gb_per_s": med["grid"], "pick_gb_per_s": med["pick"],
        "ratio": med["pick"] / med["grid"] if med["grid"] > 0 else None,
        "paired_ratio_min": min(paired) if paired else None,
        "paired_ratio_max": max(paired) if paired else None,
        "cmds": cmds, "runs": runs,
    }


def layout(nvio: str, path: Path, size: int, timeout: float) -> None:
    """Writes the file once (untimed) so reads meet real blocks and writes overwrite them."""
    log(f"laying out {path} ({human(size)}) with one untimed `nvio bench` write")
    run_cmd([nvio, "bench", "--file", str(path), "--keep", "--size", str(size), "--op", "write",
             "--loops", "1", "--json"], timeout=timeout)


# ---- the report -------------------------------------------------------------------------------


def table(rows: list[dict], tune: dict, grid: dict) -> str:
    t = tune["result"]
    budget = t.get("budget_s")
    tune_elapsed = f"{fmt(t.get('elapsed_s'), '.1f')} s / {fmt(budget, '.0f')} s"
    grid_elapsed = f"{fmt(grid['result'].get('elapsed_s'), '.1f')} s"
    head = ("mode", "grid best", "GB/s", "tuner pick", "GB/s", "pick/grid", "paired min-max",
            "tune elapsed / budget", "grid elapsed")
    lines = ["| " + " | ".join(head) + " |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        same = " (same)" if r["grid_options"] == r["pick_options"] and r["pick_options"] else ""
        lines.append("| " + " | ".join((
            r["mode"], describe(r["grid_options"]), fmt(r.get("grid_gb_per_s"), ".3f"),
            describe(r["pick_options"]) + same, fmt(r.get("pick_gb_per_s"), ".3f"),
            fmt(r.get("ratio"), ".3f"),
            f"{fmt(r.get('paired_ratio_min'), '.2f')}-{fmt(r.get('paired_ratio_max'), '.2f')}",
            tune_elapsed, grid_elapsed)) + " |")
    return "\n".join(lines)


def commands(tune: dict, grid: dict, rows: list[dict]) -> str:
    out = []
    for name, run in (("grid", grid), ("tune", tune)):
        if run["reused"]:
            out.append(f"# {name}: reused {run['reused']}")
        else:
            out.append(f"# {name}: {run['wall_s']:.1f} s wall")
            out.append(shlex.join(run["cmd"]))
    for r in rows:
        for side, label in (("grid", "grid best"), ("pick", "tuner pick")):
            if r.get("cmds"):
                out.append(f"# {r['mode']}, {label} (x{len(r['runs'])}, alternating)")
                out.append(shlex.join(r["cmds"][side]))
    return "\n".join(out)


def compare(args, nvio: str, tune: dict, grid: dict) -> dict:
    size = args.size if args.size is not None else grid["result"]["file_size"]
    for name, run in (("grid", grid), ("tune", tune)):
        if run["result"]["file_size"] != size:
            log(f"warning: the {name} result was measured with {human(run['result']['file_size'])}"
                f" files; the head-to-head uses {human(size)}")
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / FILE_NAME
    free = shutil.disk_usage(args.dir).free
    existing = path.stat().st_size if path.exists() else 0
    if free + existing < size + (64 << 20):
        raise Failure(f"{args.dir}: {human(free)} free, the {human(size)} file does not fit")
    # Generous per-run limit: the whole file at 20 MB/s, twice, or two minutes.
    timeout = max(120.0, size / 20e6 * 2)
    rows = []
    try:
        for mode in MODES:
            grid_o = options_of(grid["result"]["best"].get(mode))
            pick_o = options_of(tune["result"]["best"].get(mode))
            row = {"mode": mode, "grid_options": grid_o, "pick_options": pick_o}
            if grid_o is None or pick_o is None:
                log(f"{mode}: not measured by " + ("the grid" if grid_o is None else "the tuner")
                    + "; no head-to-head")
            else:
                if not path.exists() or path.stat().st_size < size:
                    layout(nvio, path, size, timeout)
                log(f"{mode}: grid best {describe(grid_o)} vs tuner pick {describe(pick_o)}, "
                    f"{args.rounds} rounds")
                row.update(head_to_head(nvio, path, size, mode, grid_o, pick_o, args.rounds,
                                        timeout))
            rows.append(row)
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    return {"size": size, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="tune_vs_grid.py",
        description="Run `nvio tune --grid` and `nvio tune` on the same directory, then measure "
                    "each mode's grid best and tuner pick head-to-head with `nvio bench` "
                    "(alternating, several rounds) and print a Markdown table of the medians "
                    "and the ratio pick/grid-best.",
        epilog="Examples:  bench/tune_vs_grid.py --dir /mnt/nvme/tmp --size 1G\n"
               "           bench/tune_vs_grid.py --dir /mnt/nvme/tmp --grid-json grid.json "
               "--budget 30 --json-out out.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True,
                    help="directory on the device to tune (made if missing)")
    ap.add_argument("--size", type=parse_size,
                    help="file size for both tuner runs and the head-to-head, K/M/G = powers of "
                         "1024 (default: tune's own; the head-to-head uses the grid's file size)")
    ap.add_argument("--engines", help="comma-separated engines, passed to both tuner runs "
                                      "(default: tune's own)")
    ap.add_argument("--budget", type=positive_seconds,
                    help="seconds, passed to the search run only (default: tune's own)")
    ap.add_argument("--rounds", type=positive_int, default=5,
                    help="head-to-head rounds per mode (default: %(default)s)")
    ap.add_argument("--nvio", help="nvio binary (default: build/bin/nvio in the repo, else `nvio` "
                                   "on PATH)")
    ap.add_argument("--grid-json", type=Path, metavar="FILE",
                    help="reuse this earlier `nvio tune --grid --json` output instead of running "
                         "the grid again")
    ap.add_argument("--tune-json", type=Path, metavar="FILE",
                    help="reuse this earlier `nvio tune --json` output")
    ap.add_argument("--json-out", type=Path, metavar="FILE",
                    help="write everything (both tune results, every bench run) to FILE")
    ap.add_argument("--keep", action="store_true", help="keep the head-to-head file afterwards")
    args = ap.parse_args(argv)

    interrupt_on_sigterm()
    try:
        nvio = find_nvio(args.nvio, code=2)
        # Reused results are read first, so a bad file fails before any long run starts.
        grid = reused(args.grid_json, "--grid-json", "grid") if args.grid_json else None
        tune = reused(args.tune_json, "--tune-json", "search") if args.tune_json else None
        if grid is None or tune is None:
            require_tune(nvio)
        if tune is None:  # the short run first: it fails fast if something is wrong
            tune = run_tune(nvio, args, grid=False)
        if grid is None:
            grid = run_tune(nvio, args, grid=True)
        info = machine_info(nvio, args.dir)
        result = compare(args, nvio, tune, grid)
    except (Failure, KeyboardInterrupt) as e:
        return error_exit("tune_vs_grid.py", e)

    t, g = tune["result"], grid["result"]
    print(f"nvio tune vs nvio tune --grid: {args.dir} ({g.get('filesystem', '?')} on "
          f"{g.get('device', '?')}), {human(result['size'])} file; head-to-head with `nvio bench`, "
          f"{args.rounds} rounds alternating, medians, GB = 1e9 bytes")
    print(f"{info['nproc']} CPUs ({info['cpu']}), Linux {info['kernel']}, {info['nvio_version']} "
          f"commit {info['nvio_commit']}, {info['date']}")
    print(f"search: {len(t.get('points') or [])} points measured in "
          f"{fmt(t.get('elapsed_s'), '.1f')} s (budget {fmt(t.get('budget_s'), '.0f')} s); "
          f"grid: {len(g.get('points') or [])} points in {fmt(g.get('elapsed_s'), '.1f')} s")
    print()
    print(table(result["rows"], tune, grid))
    print()
    print("```")
    print(commands(tune, grid, result["rows"]))
    print("```")
    if args.json_out:
        dump = {"machine": info, "settings": {"rounds": args.rounds, "size": result["size"],
                                              "file": str(args.dir / FILE_NAME)},
                "tune": tune, "grid": grid, "rows": result["rows"]}
        args.json_out.write_text(json.dumps(dump, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
