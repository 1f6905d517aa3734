#!/usr/bin/python3
"""Compare `nvio bench` with fio on the same file, alternately, over several rounds.

For every configuration (engine x op x queue depth) the script runs fio and `nvio bench` one
after the other on the SAME file with the same block size, queue depth and O_DIRECT, once per
round, and alternates which of the two goes first from one round to the next. It then prints,
per configuration, the median GB/s (1e9 bytes/s) of each tool, the ratio nvio/fio, the median
CPU seconds per GB of each and the ratio of those.

Engines are matched by name: nvio io_uring <-> fio io_uring, libaio <-> libaio, psync <-> psync.
fio's psync ioengine is synchronous and ignores iodepth (and nvio's psync engine ignores
--queue-depth too), so psync is compared at queue depth 1 only.

Fairness:
  * the same file, laid out once before the rounds (one untimed sequential fio write), so reads
    read real blocks and writes overwrite allocated blocks (no holes, no allocation);
  * 1 MiB blocks (--block-size), O_DIRECT for both (fio --direct=1, nvio --direct on);
  * one worker each: fio --numjobs=1 --thread, nvio --parallelism 1;
  * one pass over the file per timed run: nvio --loops 1 (the script does the rounds).

What is measured:
  * nvio: `seconds`, `gb_per_s` and `cpu_s_per_gb` from `nvio bench --json` (wall time and
    getrusage(RUSAGE_SELF) CPU time around the one timed call; buffer allocation and pattern
    fill are outside the timed region);
  * fio: `bw_bytes` of the job, and CPU = (usr_cpu + sys_cpu) / 100 x job_runtime, per GB of
    io_bytes (fio with --thread samples getrusage(RUSAGE_THREAD) of its job thread).
  * for information, each tool's whole-process CPU time (from the script's RUSAGE_CHILDREN) is
    kept in the --json dump too; it includes set-up work that is not part of the I/O.

--pattern random compares fio randread/randwrite (norandommap=1, randrepeat=0, time_based
runtime or number_ios) with `nvio bench --pattern random` at the same block size (--block-size,
default 4K), queue depth (= nvio --outstanding) and file (--size): IOPS and p50/p99/p99.9
latency, fio's clat percentiles against nvio's submission-to-completion latency. --latency is
the queue-depth-1 preset (one 4 KiB read in flight). --offset N compares `nvio bench` at offset 0
with `nvio bench --offset N` instead of fio (the bounce path against the aligned one).

--ramdisk (root only) runs everything on a RAM-backed block device instead of --dir: a tmpfs
holding an image file, attached with `losetup --direct-io=on`, formatted ext4 and mounted;
the device is always torn down afterwards, also on Ctrl-C or SIGTERM.

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # python3 -P leaves bench/ off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (Failure, error_exit, find_nvio, fmt, human, interrupt_on_sigterm, log,
                      machine_info, parse_size, positive_int, positive_seconds, run_cmd,
                      size_type)
from ramdisk import RamDisk, check_direct_io

ENGINES = ("io_uring", "libaio", "psync")
parse_size_or_zero = size_type(allow_zero=True)
OPS = ("read", "write")
FILE_NAME = "nvio-fio-compare.dat"
SLOW_RATIO = 0.95  # the acceptance bar: nvio >= 0.95 x fio throughput ...
CPU_RATIO = 1.20  # ... and <= 1.2 x fio's CPU seconds per GB, at queue depth >= 32
CHECKED_QD = 32
RANDOM_RATIO = 0.90  # random: nvio >= 0.9 x fio IOPS at queue depth >= 32 ...
LATENCY_RATIO = 1.20  # ... and a median latency <= 1.2 x fio's at queue depth 1


# ---- small helpers ----------------------------------------------------------------------------


def parse_list(allowed: tuple[str, ...] | None, conv=str):
    def parse(text: str):
        items = [conv(t.strip()) for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        if allowed is not None:
            bad = [i for i in items if i not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(allowed)}")
        return items

    return parse


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# ---- one timed run of each tool ---------------------------------------------------------------


FIO_EXTRA: list[str] = []  # --fio-arg, appended to every timed fio run


PERCENTILES = (("p50", "50.000000"), ("p99", "99.000000"), ("p99.9", "99.900000"))


def random_fio_args(args) -> list[str]:
    """fio's options for a random run: offsets anywhere, not repeating between runs, and a time
    or operation limit like nvio's --duration / --ops."""
    extra = ["--norandommap=1", "--randrepeat=0"]
    extra += [f"--number_ios={args.ios}"] if args.ios else ["--time_based=1",
                                                            f"--runtime={args.runtime}s"]
    if args.batch > 1:
        extra.append(f"--iodepth_batch_submit={args.batch}")
    return extra


def random_nvio_args(args) -> list[str]:
    """`nvio bench`'s options for the same random run (--outstanding = the queue depth)."""
    extra = ["--pattern", "random", "--batch", str(args.batch)]
    extra += ["--ops", str(args.ios)] if args.ios else ["--duration", str(args.runtime)]
    return extra


def run_fio(fio: str, path: Path, size: int, bs: int, op: str, engine: str, qd: int,
            timeout: float, random: list[str] | None = None, wrap: list[str] = ()) -> dict:
    """One fio run; random: the options of random_fio_args (op is then randread/randwrite and
    IOPS and clat percentiles are kept). wrap: a command the run goes under (perf stat, strace)."""
    rw = ("rand" + op) if random is not None else op
    cmd = [*wrap, fio, "--name=nvio-compare", "--output-format=json", "--direct=1", f"--bs={bs}",
           f"--iodepth={qd}", f"--rw={rw}", f"--size={size}", f"--filename={path}",
           f"--ioengine={engine}", "--numjobs=1", "--thread", "--group_reporting",
           *(random or []), *FIO_EXTRA]
    cpu0 = children_cpu()
    proc = run_cmd(cmd, timeout=timeout, check=False)
    process_cpu = children_cpu() - cpu0
    if proc.returncode != 0:
        return {"error": f"fio exit {proc.returncode}: {proc.stderr.strip()[-500:]}", "cmd": cmd}
    try:
        # fio may print warnings before the JSON object.
        data = json.loads(proc.stdout[proc.stdout.index("{"):])
        job = data["jobs"][0]
        side = job[op]
        io_bytes = int(side["io_bytes"])
        bw = float(side["bw_bytes"])
        runtime_s = float(job["job_runtime"]) / 1000.0
        cpu_s = (float(job["usr_cpu"]) + float(job["sys_cpu"])) / 100.0 * runtime_s
        if random is not None:
            pct = side["clat_ns"]["percentile"]
            lat = {name: float(pct[key]) / 1e3 for name, key in PERCENTILES}
            iops, ios = float(side["iops"]), int(side["total_ios"])
    except (ValueError, KeyError, IndexError) as e:
        return {"error": f"cannot parse fio JSON ({e}): {proc.stdout[:300]}", "cmd": cmd}
    if random is not None:
        if ios <= 0:
            return {"error": "fio completed no operations", "cmd": cmd}
        return {"iops": iops, "ops": ios, "lat_us": lat, "gb_per_s": bw / 1e9,
                "cpu_s_per_gb": cpu_s / (io_bytes / 1e9), "cpu_s": cpu_s,
                "job_runtime_ms": job["job_runtime"], "process_cpu_s": process_cpu, "cmd": cmd}
    if io_bytes != size:
        return {"error": f"fio moved {io_bytes} bytes, expected {size}", "cmd": cmd}
    return {
        "gb_per_s": bw / 1e9,
        "seconds": io_bytes / bw if bw > 0 else None,
        "cpu_s_per_gb": cpu_s / (io_bytes / 1e9),
        "cpu_s": cpu_s,
        "usr_cpu_pct": job["usr_cpu"],
        "sys_cpu_pct": job["sys_cpu"],
        "ctx": job.get("ctx"),
        "io_bytes": io_bytes,
        "job_runtime_ms": job["job_runtime"],
        "process_cpu_s": process_cpu,
        "cmd": cmd,
    }


def run_nvio(nvio: str, path: Path, size: int, bs: int, op: str, engine: str, qd: int,
             timeout: float, random: list[str] | None = None, offset: int = 0,
             wrap: list[str] = ()) -> dict:
    """One `nvio bench` run: sequential, of size bytes at offset (in bs pieces), or with random
    (random_nvio_args) bs blocks over a size-byte file, keeping IOPS and latency percentiles.
    wrap: a command the run goes under (perf stat, strace)."""
    if random is not None:
        shape = ["--file-size", str(size), "--size", str(bs), *random]
    else:
        shape = ["--size", str(size), "--block-size", str(bs)]
        shape += ["--offset", str(offset)] if offset else []
    cmd = [*wrap, nvio, "bench", "--file", str(path), *shape, "--op", op, "--engine", engine,
           "--queue-depth", str(qd), "--parallelism", "1", "--direct", "on", "--loops", "1",
           "--json"]
    cpu0 = children_cpu()
    proc = run_cmd(cmd, timeout=timeout, check=False)
    process_cpu = children_cpu() - cpu0
    if proc.returncode != 0:
        return {"error": f"nvio exit {proc.returncode}: {proc.stderr.strip()[-500:]}", "cmd": cmd}
    try:
        data = json.loads(proc.stdout)
        results = [r for r in data["results"] if r["op"] == op]
        r = results[0]
        got_engine = r.get("engine", data.get("engine"))
    except (ValueError, KeyError, IndexError) as e:
        return {"error": f"cannot parse nvio JSON ({e}): {proc.stdout[:300]}", "cmd": cmd}
    if got_engine != engine:
        return {"error": f"nvio ran engine {got_engine!r}, not {engine!r}", "cmd": cmd}
    if random is not None:
        return {"iops": float(r["iops"]), "ops": int(r["ops"]),
                "lat_us": {"p50": r["lat_p50_us"], "p99": r["lat_p99_us"],
                           "p99.9": r["lat_p999_us"]},
                "gb_per_s": float(r["gb_per_s"]), "cpu_s_per_gb": float(r["cpu_s_per_gb"]),
                "options": data.get("options"), "process_cpu_s": process_cpu, "cmd": cmd}
    if int(r["bytes"]) != size:
        return {"error": f"nvio moved {r['bytes']} bytes, expected {size}", "cmd": cmd}
    return {
        "gb_per_s": float(r["gb_per_s"]),
        "seconds": float(r["seconds"]),
        "cpu_s_per_gb": float(r["cpu_s_per_gb"]),
        "seconds_all": r.get("seconds_all"),
        "options": data.get("options"),
        "process_cpu_s": process_cpu,
        "cmd": cmd,
    }


# ---- the benchmark ----------------------------------------------------------------------------


def configurations(engines, ops, qds) -> list[dict]:
    out = []
    for engine in engines:
        for op in ops:
            for qd in ([1] if engine == "psync" else qds):
                out.append({"engine": engine, "op": op, "qd": qd})
    return out


def layout(fio: str, path: Path, size: int, bs: int, timeout: float) -> None:
    """Writes the whole file once (untimed) so that no run meets holes or unallocated blocks."""
    log(f"laying out {path} ({human(size)}) with one sequential O_DIRECT fio write")
    cmd = [fio, "--name=nvio-compare-layout", "--output-format=json", "--direct=1", f"--bs={bs}",
           "--iodepth=1", "--rw=write", f"--size={size}", f"--filename={path}",
           "--ioengine=psync", "--numjobs=1", "--thread"]
    run_cmd(cmd, timeout=timeout)
    if path.stat().st_size < size:
        raise Failure(f"layout of {path} left {path.stat().st_size} bytes, expected {size}")


def verify_nvio(nvio: str, path: Path, size: int, bs: int, engines, timeout: float,
                shape: list[str] | None = None) -> dict:
    """An untimed `nvio bench --verify --op both` per engine on the same file: a correctness
    check, so a fast figure cannot come from a run that moved the wrong bytes. shape: the
    options saying what is moved (default: --size size --block-size bs)."""
    out = {}
    shape = shape or ["--size", str(size), "--block-size", str(bs)]
    for engine in engines:
        qd = 1 if engine == "psync" else CHECKED_QD
        cmd = [nvio, "bench", "--file", str(path), *shape, "--op", "both",
               "--engine", engine, "--queue-depth", str(qd),
               "--parallelism", "1", "--direct", "on", "--loops", "1", "--verify", "--json"]
        proc = run_cmd(cmd, timeout=timeout, check=False)
        ok = proc.returncode == 0
        detail = ""
        if ok:
            try:
                ok = all(r.get("verified") is True for r in json.loads(proc.stdout)["results"])
            except (ValueError, KeyError):
                ok, detail = False, "unparsable JSON"
        else:
            detail = f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
        out[engine] = {"ok": ok, "detail": detail, "cmd": cmd}
        log(f"verify {engine}: {'ok' if ok else 'FAILED ' + detail}")
    return out


def medians(runs: list[dict], tool: str, key: str, sub: str | None = None):
    """(median, min, max, count) of runs' tool[key] (or tool[key][sub]) over runs without an
    error; Nones and 0 when there is none."""
    vals = [r[tool][key] if sub is None else r[tool][key][sub] for r in runs
            if "error" not in r[tool] and r[tool].get(key) is not None]
    return (statistics.median(vals), min(vals), max(vals), len(vals)) if vals else (None, None, None, 0)


def paired(runs: list[dict], a: str, b: str, key: str) -> dict:
    """The range and median over rounds of a/b within the same round (a measure of the noise)."""
    ratios = [r[a][key] / r[b][key] for r in runs
              if "error" not in r[a] and "error" not in r[b] and r[b][key] > 0]
    return {"paired_ratio_min": min(ratios) if ratios else None,
            "paired_ratio_max": max(ratios) if ratios else None,
            "paired_ratio_median": statistics.median(ratios) if ratios else None}


def summarize_random(config: dict, runs: list[dict]) -> dict:
    n_iops, n_lo, n_hi, n_n = medians(runs, "nvio", "iops")
    f_iops, f_lo, f_hi, f_n = medians(runs, "fio", "iops")
    ratio = n_iops / f_iops if n_iops and f_iops else None
    out = {**config, "nvio_iops": n_iops, "nvio_iops_min": n_lo, "nvio_iops_max": n_hi,
           "nvio_n": n_n, "fio_iops": f_iops, "fio_iops_min": f_lo, "fio_iops_max": f_hi,
           "fio_n": f_n, "ratio": ratio, **paired(runs, "nvio", "fio", "iops")}
    for tool in ("nvio", "fio"):
        for name, _ in PERCENTILES:
            out[f"{tool}_{name}_us"] = medians(runs, tool, "lat_us", name)[0]
    p50_ratio = out["nvio_p50_us"] / out["fio_p50_us"] \
        if out["nvio_p50_us"] and out["fio_p50_us"] else None
    out["p50_ratio"] = p50_ratio
    flags = []
    if ratio is None:
        flags.append("ERROR")
    elif config["qd"] >= CHECKED_QD and ratio < RANDOM_RATIO:
        flags.append("SLOW")
    if config["qd"] == 1 and p50_ratio is not None and p50_ratio > LATENCY_RATIO:
        flags.append("LAT")
    checked = config["qd"] >= CHECKED_QD or config["qd"] == 1
    out["verdict"] = "+".join(flags) if flags else ("ok" if checked else "n/a")
    return out


def table_random(summaries: list[dict]) -> str:
    head = ("engine", "op", "qd", "nvio IOPS", "fio IOPS", "nvio/fio", "paired min-max",
            "p50 us nvio/fio", "p99 us nvio/fio", "p99.9 us nvio/fio", "check")
    rows = [head]
    for s in summaries:
        lat = [f"{fmt(s[f'nvio_{n}_us'], '.1f')}/{fmt(s[f'fio_{n}_us'], '.1f')}"
               for n, _ in PERCENTILES]
        rows.append((s["engine"], s["op"], str(s["qd"]), fmt(s["nvio_iops"], ".0f"),
                     fmt(s["fio_iops"], ".0f"), fmt(s["ratio"], ".3f"),
                     f"{fmt(s['paired_ratio_min'], '.2f')}-{fmt(s['paired_ratio_max'], '.2f')}",
                     *lat, s["verdict"]))
    return markdown(rows)


def summarize_offset(config: dict, runs: list[dict]) -> dict:
    a_gb = medians(runs, "aligned", "gb_per_s")[0]
    o_gb = medians(runs, "offset", "gb_per_s")[0]
    return {**config, "aligned_gb_per_s": a_gb, "offset_gb_per_s": o_gb,
            "ratio": o_gb / a_gb if a_gb and o_gb else None,
            **paired(runs, "offset", "aligned", "gb_per_s")}


def table_offset(summaries: list[dict], offset: int) -> str:
    rows = [("engine", "op", "qd", "aligned GB/s", f"offset {offset} GB/s", "offset/aligned",
             "paired min-max")]
    for s in summaries:
        rows.append((s["engine"], s["op"], str(s["qd"]), fmt(s["aligned_gb_per_s"], ".3f"),
                     fmt(s["offset_gb_per_s"], ".3f"), fmt(s["ratio"], ".3f"),
                     f"{fmt(s['paired_ratio_min'], '.2f')}-{fmt(s['paired_ratio_max'], '.2f')}"))
    return markdown(rows)


def summarize(config: dict, runs: list[dict]) -> dict:
    def med(tool, key):
        return medians(runs, tool, key)

    n_gb, n_lo, n_hi, n_n = med("nvio", "gb_per_s")
    f_gb, f_lo, f_hi, f_n = med("fio", "gb_per_s")
    n_cpu = med("nvio", "cpu_s_per_gb")[0]
    f_cpu = med("fio", "cpu_s_per_gb")[0]
    ratio = n_gb / f_gb if n_gb and f_gb else None
    cpu_ratio = n_cpu / f_cpu if n_cpu is not None and f_cpu else None
    checked = config["qd"] >= CHECKED_QD
    verdict = "n/a"
    if ratio is None:
        verdict = "ERROR"
    elif checked:
        flags = []
        if ratio < SLOW_RATIO:
            flags.append("SLOW")
        if cpu_ratio is not None and cpu_ratio > CPU_RATIO:
            flags.append("CPU")
        verdict = "+".join(flags) if flags else "ok"
    return {
        **config,
        "nvio_gb_per_s": n_gb, "nvio_gb_per_s_min": n_lo, "nvio_gb_per_s_max": n_hi, "nvio_n": n_n,
        "fio_gb_per_s": f_gb, "fio_gb_per_s_min": f_lo, "fio_gb_per_s_max": f_hi, "fio_n": f_n,
        "ratio": ratio,
        **paired(runs, "nvio", "fio", "gb_per_s"),
        "nvio_cpu_s_per_gb": n_cpu, "fio_cpu_s_per_gb": f_cpu, "cpu_ratio": cpu_ratio,
        "verdict": verdict,
    }


def table(summaries: list[dict]) -> str:
    head = ("engine", "op", "qd", "nvio GB/s", "fio GB/s", "nvio/fio", "paired min-max",
            "nvio CPU s/GB", "fio CPU s/GB", "CPU nvio/fio", "check")
    rows = [head]
    for s in summaries:
        rows.append((s["engine"], s["op"], str(s["qd"]), fmt(s["nvio_gb_per_s"], ".3f"),
                     fmt(s["fio_gb_per_s"], ".3f"), fmt(s["ratio"], ".3f"),
                     f"{fmt(s['paired_ratio_min'], '.2f')}-{fmt(s['paired_ratio_max'], '.2f')}",
                     fmt(s["nvio_cpu_s_per_gb"], ".4f"), fmt(s["fio_cpu_s_per_gb"], ".4f"),
                     fmt(s["cpu_ratio"], ".2f"), s["verdict"]))
    return markdown(rows)


def markdown(rows: list[tuple]) -> str:
    """A markdown table: the first row is the head; the first three columns left-aligned."""
    head = rows[0]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for n, r in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) if i < 3 else c.rjust(w)
                                        for i, (c, w) in enumerate(zip(r, widths))) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) if i < 3 else "-" * (w + 1) + ":"
                                        for i, w in enumerate(widths)) + "|")
    return "\n".join(lines)


def runners(args, nvio: str, fio: str, path: Path, timeout: float) -> dict:
    """The two things each round runs, by name, each a function of a configuration: nvio and fio,
    or for --offset nvio aligned and nvio at the offset."""
    def nvio_at(offset):
        return lambda c: run_nvio(nvio, path, args.size, args.block_size, c["op"], c["engine"],
                                  c["qd"], timeout, offset=offset)

    if args.offset:
        return {"aligned": nvio_at(0), "offset": nvio_at(args.offset)}
    rn = random_nvio_args(args) if args.pattern == "random" else None
    rf = random_fio_args(args) if args.pattern == "random" else None
    return {
        "nvio": lambda c: run_nvio(nvio, path, args.size, args.block_size, c["op"], c["engine"],
                                   c["qd"], timeout, random=rn),
        "fio": lambda c: run_fio(fio, path, args.size, args.block_size, c["op"], c["engine"],
                                 c["qd"], timeout, random=rf),
    }


def round_line(entry: dict) -> str:
    """One tool's figures in a round, for the progress log."""
    parts = []
    for tool, r in entry.items():
        if not isinstance(r, dict):
            continue
        if "iops" in r:
            parts.append(f"{tool} {r['iops']:.0f} IOPS p50 {r['lat_us']['p50']:.1f} us")
        else:
            parts.append(f"{tool} {fmt(r.get('gb_per_s'), '.3f')} GB/s "
                         f"{fmt(r.get('cpu_s_per_gb'), '.4f')} s/GB")
    return " | ".join(parts)


def benchmark(args, directory: Path, nvio: str, fio: str, where: str) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    check_direct_io(directory)
    path = directory / FILE_NAME
    # --offset: the offset run reads and writes [offset, offset + size), past the aligned one's.
    file_size = args.size + (-(-args.offset // (1 << 20)) << 20 if args.offset else 0)
    free = shutil.disk_usage(directory).free
    existing = path.stat().st_size if path.exists() else 0
    if free + existing < file_size + (64 << 20):
        raise Failure(f"{directory}: {human(free)} free, the {human(file_size)} file does not fit")
    # Generous per-run limit: 1 GiB at 20 MB/s is ~54 s.
    timeout = max(120.0, args.size / 20e6 * 2)
    info = machine_info(nvio, directory, fio=fio, full=True)
    info["where"] = where
    configs = configurations(args.engines, args.ops, args.qds)
    tools = runners(args, nvio, fio, path, timeout)
    log(f"nvio {info['nvio_version']} ({nvio}), {info['fio_version']}, {where}: {directory}")
    log(f"{len(configs)} configurations x {args.rounds} rounds x {' and '.join(tools)}, "
        f"{args.pattern}, {human(args.size)} file, {human(args.block_size)} blocks")
    layout(fio, path, file_size, max(args.block_size, 1 << 20), timeout)
    runs: dict[int, list[dict]] = {i: [] for i in range(len(configs))}
    started = time.monotonic()
    try:
        for rnd in range(args.rounds):
            order = list(tools) if rnd % 2 == 0 else list(reversed(tools))
            for i, c in enumerate(configs):
                entry = {"round": rnd + 1, "first": order[0]}
                for tool in order:
                    entry[tool] = tools[tool](c)
                    if "error" in entry[tool]:
                        log(f"  round {rnd + 1} {c['engine']} {c['op']} qd {c['qd']}: {tool} "
                            f"ERROR {entry[tool]['error']}")
                runs[i].append(entry)
                log(f"  round {rnd + 1}/{args.rounds} {c['engine']:8} {c['op']:5} qd {c['qd']:3}: "
                    f"{round_line({t: entry[t] for t in tools})}  ({order[0]} first)")
        shape = None
        if args.pattern == "random":
            shape = ["--pattern", "random", "--file-size", str(args.size), "--size",
                     str(args.block_size), "--ops", "2000"]
        elif args.offset:
            shape = ["--size", str(args.size), "--block-size", str(args.block_size),
                     "--offset", str(args.offset)]
        verify = verify_nvio(nvio, path, args.size, args.block_size, args.engines, timeout,
                             shape) if args.verify else None
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    if args.offset:
        summaries = [summarize_offset(c, runs[i]) for i, c in enumerate(configs)]
    elif args.pattern == "random":
        summaries = [summarize_random(c, runs[i]) for i, c in enumerate(configs)]
    else:
        summaries = [summarize(c, runs[i]) for i, c in enumerate(configs)]
    return {
        "machine": info,
        "settings": {"size": args.size, "block_size": args.block_size, "rounds": args.rounds,
                     "engines": args.engines, "ops": args.ops, "qds": args.qds, "direct": True,
                     "nvio_parallelism": 1, "fio_numjobs": 1, "file": str(path),
                     "fio_extra_args": list(FIO_EXTRA),
                     "ramdisk": args.ramdisk, "pattern": args.pattern, "offset": args.offset,
                     "runtime_s": args.runtime, "ios": args.ios, "batch": args.batch},
        "elapsed_s": time.monotonic() - started,
        "summary": summaries,
        "runs": [{"config": c, "rounds": runs[i]} for i, c in enumerate(configs)],
        "verify": verify,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="fio_compare.py",
        description="Run fio and `nvio bench` alternately on the same file (1 MiB blocks, O_DIRECT, "
                    "one worker each) for each engine/op/queue depth, several rounds, and print the "
                    "median GB/s (1e9 bytes/s), the ratio nvio/fio, and CPU seconds per GB of each. "
                    "psync is compared at queue depth 1 only (fio's psync ignores iodepth).",
        epilog="Examples:  bench/fio_compare.py --dir /tmp/nvio-bench --size 1G --rounds 5\n"
               "           sudo bench/fio_compare.py --ramdisk --size 1G --rounds 5 --json out.json\n"
               "           sudo bench/fio_compare.py --ramdisk --pattern random --qds 32,128 "
               "--engines io_uring,libaio --rounds 5\n"
               "           sudo bench/fio_compare.py --ramdisk --latency --rounds 5\n"
               "           bench/fio_compare.py --dir /tmp/nvio-bench --offset 4103 --engines io_uring\n"
               "check column (queue depth >= 32 only): ok, SLOW (nvio < 0.95 x fio GB/s), "
               "CPU (nvio > 1.2 x fio CPU s/GB); n/a below queue depth 32. Random: SLOW (nvio < "
               "0.9 x fio IOPS at queue depth >= 32), LAT (nvio p50 > 1.2 x fio's at queue depth 1).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/nvio-bench"),
                    help="directory for the shared test file (default: %(default)s; made if missing)")
    ap.add_argument("--size", type=parse_size, default=1 << 30,
                    help="file size, K/M/G = powers of 1024 (default: 1G)")
    ap.add_argument("--rounds", type=positive_int, default=5, help="rounds (default: %(default)s)")
    ap.add_argument("--engines", type=parse_list(ENGINES), default=list(ENGINES),
                    help="comma-separated engines (default: io_uring,libaio,psync)")
    ap.add_argument("--qds", type=parse_list(None, positive_int),
                    help="comma-separated queue depths (default: 8,32,128, for --pattern random "
                         "1,32,128; psync always runs at 1)")
    ap.add_argument("--ops", type=parse_list(OPS), default=list(OPS),
                    help="comma-separated ops (default: read,write)")
    ap.add_argument("--block-size", type=parse_size,
                    help="block size for both tools (default: 1M, for --pattern random 4K)")
    ap.add_argument("--pattern", choices=("sequential", "random"), default="sequential",
                    help="random: fio randread/randwrite (norandommap, randrepeat=0) against "
                         "`nvio bench --pattern random` with --outstanding = the queue depth, "
                         "comparing IOPS and p50/p99/p99.9 latency (fio: clat percentiles); "
                         "--size is then the file the blocks are drawn from")
    ap.add_argument("--runtime", type=positive_seconds, default=2.0,
                    help="random: seconds per run (fio time_based runtime, nvio --duration; "
                         "default: %(default)s)")
    ap.add_argument("--ios", type=positive_int,
                    help="random: operations per run instead of --runtime (fio number_ios, "
                         "nvio --ops)")
    ap.add_argument("--batch", type=positive_int, default=1,
                    help="random: operations per nvio submission (nvio --batch; fio "
                         "iodepth_batch_submit when > 1; default: 1)")
    ap.add_argument("--latency", action="store_true",
                    help="the latency preset: --pattern random --block-size 4K --qds 1 --ops read "
                         "--engines io_uring,libaio (one 4 KiB read in flight)")
    ap.add_argument("--offset", type=parse_size_or_zero, default=0,
                    help="sequential: instead of fio, compare `nvio bench` at file offset 0 with "
                         "`nvio bench --offset N` (e.g. 4103), printing offset/aligned GB/s")
    ap.add_argument("--nvio", help="nvio binary (default: build/bin/nvio in the repo, else `nvio` on PATH)")
    ap.add_argument("--fio", default="fio", help="fio binary (default: fio on PATH)")
    ap.add_argument("--fio-arg", action="append", default=[], metavar="ARG",
                    help="extra option for every timed fio run, e.g. --fio-arg=--mem=mmap "
                         "(repeatable; default: none, i.e. fio's defaults)")
    ap.add_argument("--ramdisk", action="store_true",
                    help="root only: run on a RAM-backed ext4 (tmpfs image, losetup --direct-io=on) "
                         "instead of --dir; always torn down afterwards")
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip the final untimed `nvio bench --verify` per engine on the same file")
    ap.add_argument("--keep", action="store_true", help="keep the test file afterwards (not with --ramdisk)")
    ap.add_argument("--json", metavar="FILE", nargs="?", const="-",
                    help="dump everything (machine, settings, every run, summary) as JSON to FILE, "
                         "or to stdout instead of the table when FILE is - or omitted")
    args = ap.parse_args(argv)
    if args.latency:
        args.pattern, args.block_size, args.qds, args.ops = "random", 4096, [1], ["read"]
        if "--engines" not in (argv if argv is not None else sys.argv[1:]):
            args.engines = ["io_uring", "libaio"]
    random = args.pattern == "random"
    if args.offset and random:
        ap.error("--offset compares sequential transfers; it does not go with --pattern random")
    if args.block_size is None:
        args.block_size = 4096 if random else 1 << 20
    if args.qds is None:
        args.qds = [1, 32, 128] if random else [8, 32, 128]
    if random and (args.block_size % 512 or args.size < args.block_size):
        ap.error("--pattern random needs a --block-size that is a multiple of 512 and a --size "
                 "(the file) of at least one block")

    interrupt_on_sigterm()
    FIO_EXTRA[:] = args.fio_arg
    try:
        nvio = find_nvio(args.nvio)
        fio = shutil.which(args.fio)
        if not fio:
            raise Failure(f"fio not found ({args.fio}); apt-get install fio")
        if args.ramdisk:
            with RamDisk(args.size) as rd:
                result = benchmark(args, rd.mnt, nvio, fio, "ramdisk")
                result["machine"]["ramdisk"] = {"loop": rd.loop, "loop_dio": rd.dio,
                                                "backing": "tmpfs image file", "fs": "ext4"}
        else:
            result = benchmark(args, args.dir, nvio, fio, "dir")
    except (Failure, KeyboardInterrupt) as e:
        return error_exit("fio_compare.py", e)

    m = result["machine"]
    if args.offset:
        what = f"nvio at offset 0 vs nvio --offset {args.offset}, {human(args.size)} transfers"
    elif random:
        limit = f"{args.ios} ops" if args.ios else f"{args.runtime:g} s"
        what = (f"nvio vs fio, random {human(args.block_size)} blocks over a {human(args.size)} "
                f"file, {limit} per run, batch {args.batch}, latency in us (fio: clat)")
    else:
        what = f"nvio vs fio, {human(args.size)} file, {human(args.block_size)} blocks"
    header = (f"{what}, O_DIRECT, 1 worker each, {args.rounds} rounds alternating; medians, "
              f"GB = 1e9 bytes\n"
              f"{m['where']}: {m['dir']} on {m['filesystem']}"
              + (f" (loop dio={m['ramdisk']['loop_dio']})" if args.ramdisk else "") + "\n"
              f"{m['nproc']} CPUs ({m['cpu']}), Linux {m['kernel']}, {m['fio_version']}, "
              f"{m['nvio_version']} commit {m['nvio_commit']}, {m['date']}"
              + (f"\nextra fio options: {' '.join(args.fio_arg)}" if args.fio_arg else ""))
    if args.json and args.json != "-":
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.json == "-":
        print(json.dumps(result, indent=2))
    else:
        print(header)
        if args.offset:
            print(table_offset(result["summary"], args.offset))
        elif random:
            print(table_random(result["summary"]))
        else:
            print(table(result["summary"]))
        if result.get("verify"):
            print("nvio --verify on the same file: " + ", ".join(
                f"{e} {'ok' if v['ok'] else 'FAILED'}" for e, v in result["verify"].items()))
    bad = [s for s in result["summary"] if s.get("ratio") is None]
    if bad or (result.get("verify") and not all(v["ok"] for v in result["verify"].values())):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
