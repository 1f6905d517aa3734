#!/usr/bin/python3
"""Issue 32's table: small random reads through nvio against fio and a bare liburing loop.

For each device (the disk under --dir; with --ramdisk, as root, also a RAM-backed loop device),
block size (4K, 64K) and queue depth (1, 32, 128): random O_DIRECT reads, io_uring, one thread,
of the same file by the contenders below, alternated round by round (the order rotated by one each
round), the median IOPS of each over the rounds:

  * fio: randread, norandommap, time based, one job (bench/fio_compare.py's run_fio);
  * loop: bench/uring_loop.cpp, a bare liburing loop of one thread with nvio's ring flags (mode
    `split` by default), the ceiling of a thread that drives one ring; run twice, with its
    buffers in posix_memalign's pages and in memory advised for huge pages (URING_LOOP_HUGE), as
    nvio's buffers of 2 MiB and more are: the faster of the two is the ceiling ("loop" in the
    ratios and goals);
  * nvio: `nvio bench --pattern random` with --outstanding = the queue depth, by descriptor
    (fio_compare.py's run_nvio).

Then, at the --count-qds (4K by default), what each read costs: system calls, context switches
and CPU time per read from `perf stat -e raw_syscalls:sys_enter,context-switches,task-clock`
over the whole process (every thread), for each contender and for nvio::File
(bench/small_reads.cpp: blocking File::read at queue depth 1, QD submit_read then wait() above).
Each figure is a difference of two runs, a short and a long one, divided by the difference of
their reads, so that start-up and tear-down drop out. `strace -c -f` gives the system calls of
nvio's two forms by name (also differences of two runs).

Goals (issue 32): nvio >= 0.95x the loop; nvio >= 0.9x fio where the loop reaches 0.9x fio; at
4 KiB QD 32, <= 1.1 system calls per read through nvio::File, and <= 0.02 context switches per
read.

Python 3 standard library, fio, perf and strace; g++ and liburing to build the two C++ tools
(into --tools, once; the nvio::File one against the library next to --nvio).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import zlib
from pathlib import Path
from types import SimpleNamespace

if str(Path(__file__).resolve().parent) not in sys.path:  # python3 -P leaves bench/ off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (REPO, Failure, error_exit, find_nvio, fmt, human,  # noqa: E402
                      interrupt_on_sigterm, log, machine_info, median, parse_size, positive_int,
                      positive_seconds, run_cmd)
from fio_compare import (layout, markdown, parse_list, random_fio_args,  # noqa: E402
                         random_nvio_args, run_fio, run_nvio)
from ramdisk import RamDisk, check_direct_io  # noqa: E402

FILE_NAME = "nvio-small-ops.dat"
LOOP_GOAL, FIO_GOAL, SYSCALL_GOAL, CTX_GOAL = 0.95, 0.90, 1.1, 0.02
EVENTS = ("raw_syscalls:sys_enter", "context-switches", "task-clock")
CONTENDERS = ("fio", "loop", "loop-huge", "nvio")
LOOP_OUT = re.compile(r"reads/s \((\d+) reads in ([\d.]+) s\)")
FILE_OUT = re.compile(r"at QD \d+: ([\d.]+) reads/s")


# ---- the two C++ tools ------------------------------------------------------------------------


def compile_tool(out: Path, source: Path, extra: list[str], after: Path | None = None) -> str:
    """Builds source into out with g++ unless out is newer than source (and than `after`, the
    library it links); returns out."""
    newest = max(p.stat().st_mtime for p in (source, after) if p is not None)
    if not out.exists() or out.stat().st_mtime < newest:
        log(f"building {out} from {source.relative_to(REPO)}")
        run_cmd(["g++", "-O2", "-std=c++20", "-o", str(out), str(source), *extra], timeout=600)
    return str(out)


def tools(args, nvio: str) -> dict:
    """The bare loop and small_reads binaries, built into args.tools; small_reads links the
    libnvio beside the nvio CLI (<build>/bin/nvio -> <build>/src)."""
    args.tools.mkdir(parents=True, exist_ok=True)
    lib = Path(nvio).resolve().parent.parent / "src"
    if not (lib / "libnvio.so").exists():
        raise Failure(f"no libnvio.so in {lib} (next to {nvio}) for bench/small_reads.cpp")
    return {
        "loop": compile_tool(args.tools / "uring_loop", REPO / "bench" / "uring_loop.cpp",
                             ["-luring"]),
        "small_reads": compile_tool(
            args.tools / f"small_reads-{zlib.crc32(str(lib).encode()):08x}",
            REPO / "bench" / "small_reads.cpp",
            [f"-I{REPO / 'include'}", f"-L{lib}", "-lnvio", f"-Wl,-rpath,{lib}"],
            after=lib / "libnvio.so"),
    }


# ---- one run of each contender: {"iops", "ops"} or {"error"} ----------------------------------


def run_loop(loop: str, path: Path, bs: int, qd: int, mode: str, seconds: float,
             wrap: list[str] = (), huge: bool = False) -> dict:
    """The bare loop; huge: its buffers in memory advised for huge pages (URING_LOOP_HUGE), as
    nvio's buffers of 2 MiB and more are."""
    cmd = [*wrap, loop, str(path), str(qd), mode, str(bs), str(seconds)]
    env = {k: v for k, v in os.environ.items() if k != "URING_LOOP_HUGE"}
    if huge:
        env["URING_LOOP_HUGE"] = "1"
    proc = run_cmd(cmd, timeout=seconds + 120, check=False, env=env)
    m = LOOP_OUT.search(proc.stdout)
    if proc.returncode != 0 or not m:
        return {"error": f"loop exit {proc.returncode}: {(proc.stderr or proc.stdout)[-300:]}",
                "cmd": cmd}
    return {"iops": int(m.group(1)) / float(m.group(2)), "ops": int(m.group(1)), "cmd": cmd}


def run_file(small_reads: str, path: Path, bs: int, qd: int, n: int,
             wrap: list[str] = ()) -> dict:
    """nvio::File through bench/small_reads.cpp: `read` (blocking, caller-driven) at QD 1, else
    `file` (QD submit_read, then wait())."""
    form = "read" if qd == 1 else "file"
    cmd = [*wrap, small_reads, str(path), form, str(n), str(qd), str(bs), "on"]
    env = {**os.environ, "NVIO_ENGINE": "io_uring"}
    proc = run_cmd(cmd, timeout=600, check=False, env=env)
    m = FILE_OUT.search(proc.stdout)
    if proc.returncode != 0 or not m:
        return {"error": f"small_reads exit {proc.returncode}: {proc.stderr[-300:]}", "cmd": cmd}
    return {"iops": float(m.group(1)), "ops": n, "cmd": cmd}


def contenders(args, nvio: str, fio: str, bins: dict, path: Path) -> dict:
    """name -> run(bs, qd, seconds, wrap): one timed run of that contender."""
    timeout = 300.0

    def timed(seconds):
        return SimpleNamespace(ios=None, runtime=seconds, batch=1)

    return {
        "fio": lambda bs, qd, s, wrap=(): run_fio(
            fio, path, args.size, bs, "read", "io_uring", qd, timeout,
            random=random_fio_args(timed(s)), wrap=wrap),
        "loop": lambda bs, qd, s, wrap=(): run_loop(bins["loop"], path, bs, qd, args.loop_mode,
                                                    s, wrap),
        "loop-huge": lambda bs, qd, s, wrap=(): run_loop(bins["loop"], path, bs, qd,
                                                         args.loop_mode, s, wrap, huge=True),
        "nvio": lambda bs, qd, s, wrap=(): run_nvio(
            nvio, path, args.size, bs, "read", "io_uring", qd, timeout,
            random=random_nvio_args(timed(s)), wrap=wrap),
    }


# ---- the IOPS rounds --------------------------------------------------------------------------


def iops_rounds(args, runs: dict, blocks: list[int]) -> list[dict]:
    """Every (block, qd) configuration, each round all contenders in an order rotated by one per
    round; returns one summary per configuration."""
    configs = [(bs, qd) for bs in blocks for qd in args.qds]
    got = {c: {n: [] for n in CONTENDERS} for c in configs}
    for r in range(args.rounds):
        for bs, qd in configs:
            line = []
            for i in range(len(CONTENDERS)):
                name = CONTENDERS[(i + r) % len(CONTENDERS)]
                res = runs[name](bs, qd, args.runtime)
                if "error" in res:
                    log(f"  {name} {human(bs)} qd {qd}: ERROR {res['error']}")
                got[(bs, qd)][name].append(res.get("iops"))
                line.append(f"{name} {fmt(res.get('iops'), '.0f')}")
            log(f"  round {r + 1}/{args.rounds} {human(bs)} qd {qd}: " + ", ".join(line))
    out = []
    for (bs, qd), per in got.items():
        med = {n: median(v) for n, v in per.items()}
        # the ceiling of a round: the faster of the loop's two kinds of memory
        best = [max(a or 0, b or 0) for a, b in zip(per["loop"], per["loop-huge"])]
        paired = [n / lp for n, lp in zip(per["nvio"], best) if n and lp]
        out.append({"block": bs, "qd": qd, "iops": med, "rounds": per,
                    "nvio_loop_paired": [min(paired), max(paired)] if paired else None})
    return out


# ---- what a read costs: perf stat and strace, differences of a short and a long run ----------


def perf_counts(run, tmp: Path) -> tuple[dict, dict]:
    """run(wrap) under perf stat: (the run's result, event -> count; task-clock in ms)."""
    out = tmp / "perf.txt"
    res = run(["perf", "stat", "-x,", "-o", str(out), "-e", ",".join(EVENTS), "--"])
    counts = {}
    for line in out.read_text().splitlines() if out.exists() else []:
        f = line.split(",")
        if len(f) > 2 and f[2] in EVENTS:
            try:
                counts[f[2]] = float(f[0])
            except ValueError:
                pass
    return res, counts


def strace_counts(run, tmp: Path) -> tuple[dict, dict]:
    """run(wrap) under strace -c -f: (the run's result, system call name -> calls)."""
    out = tmp / "strace.txt"
    res = run(["strace", "-c", "-f", "-o", str(out), "--"])
    calls = {}
    for line in out.read_text().splitlines() if out.exists() else []:
        t = line.split()
        if len(t) >= 5 and t[-1] != "total" and re.fullmatch(r"[\d.]+", t[0]):
            calls[t[-1]] = int(t[3])
    return res, calls


def per_read(measure, run, short: float, long: float, tmp: Path) -> dict | None:
    """(counts of the long run - the short run's) / (reads of the long run - the short run's),
    and the long run's reads/s; None if a run failed."""
    (r1, c1), (r2, c2) = measure(lambda w: run(short, w), tmp), measure(lambda w: run(long, w), tmp)
    if "error" in r1 or "error" in r2 or r2["ops"] <= r1["ops"]:
        log(f"    counting failed: {r1.get('error') or r2.get('error') or 'no more reads'}")
        return None
    reads = r2["ops"] - r1["ops"]
    out = {k: (c2.get(k, 0) - c1.get(k, 0)) / reads for k in set(c1) | set(c2)}
    out["iops"] = r2["iops"]
    return out


def count_costs(args, runs: dict, bins: dict, path: Path, bs: int) -> list[dict]:
    """perf stat per read for every contender and nvio::File at each --count-qds, median of
    --count-rounds; strace by name for nvio and nvio::File, once."""
    short, long = args.count_runtimes
    rate = {}  # reads/s of the File form, to size its fixed counts

    def file_run(qd):
        def run(seconds, wrap):
            n = max(2000, int(rate.get(qd, 20000) * seconds))
            return run_file(bins["small_reads"], path, bs, qd, n, wrap)
        return run

    out = []
    with tempfile.TemporaryDirectory(prefix="nvio-small-ops-") as t:
        tmp = Path(t)
        for qd in args.count_qds:
            rate[qd] = run_file(bins["small_reads"], path, bs, qd, 2000).get("iops", 20000)
            who = {n: (lambda s, w, n=n: runs[n](bs, qd, s, w)) for n in CONTENDERS}
            who["nvio::File"] = file_run(qd)
            for name, run in who.items():
                got = [per_read(perf_counts, run, short, long, tmp)
                       for _ in range(args.count_rounds)]
                got = [g for g in got if g]
                row = {"block": bs, "qd": qd, "tool": name,
                       **{k: statistics.median(g[k] for g in got) if got else None
                          for k in (*EVENTS, "iops")}}
                if name in ("nvio", "nvio::File"):
                    row["strace"] = per_read(strace_counts, run, short, long, tmp)
                out.append(row)
                log(f"  counts {human(bs)} qd {qd} {name}: "
                    f"{fmt(row['raw_syscalls:sys_enter'], '.3f')} calls, "
                    f"{fmt(row['context-switches'], '.4f')} switches, "
                    f"{fmt(row['task-clock'] and row['task-clock'] * 1e3, '.2f')} us CPU per read")
    return out


# ---- one device -------------------------------------------------------------------------------


def device(args, name: str, directory: Path, nvio: str, fio: str, bins: dict) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    check_direct_io(directory)
    path = directory / FILE_NAME
    blocks = args.ram_block_sizes if name == "RAM" and args.ram_block_sizes else args.block_sizes
    layout(fio, path, args.size, 1 << 20, 600)
    runs = contenders(args, nvio, fio, bins, path)
    try:
        log(f"{name}: {directory}, {human(args.size)} file, blocks "
            f"{','.join(human(b) for b in blocks)}, queue depths {args.qds}, {args.rounds} rounds")
        rows = iops_rounds(args, runs, blocks) if args.iops else []
        costs = count_costs(args, runs, bins, path, 4096) if args.counts else []
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    return {"device": name, "dir": str(directory), "rows": rows, "costs": costs}


# ---- the report -------------------------------------------------------------------------------


def iops_table(results: list[dict]) -> str:
    rows = [("device", "block", "QD", "fio IOPS", "loop IOPS", "loop, huge pages", "nvio IOPS",
             "nvio/loop", "(rounds)", "nvio/fio", "loop/fio", "goals: ≥0.95x loop, ≥0.9x fio")]
    for d in results:
        for r in d["rows"]:
            f, l4, lh, n = (r["iops"][k] for k in CONTENDERS)
            lp = max(l4 or 0, lh or 0) or None  # the better loop is the ceiling
            nl = n / lp if n and lp else None
            nf = n / f if n and f else None
            lf = lp / f if lp and f else None
            goals = [] if nl is None else ["loop ✓" if nl >= LOOP_GOAL else "loop ✗"]
            if nf is not None and lf is not None:
                goals.append(("fio ✓" if nf >= FIO_GOAL else "fio ✗") if lf >= FIO_GOAL
                             else "fio n/a")
            pr = r["nvio_loop_paired"]
            rows.append((d["device"], human(r["block"]), str(r["qd"]), fmt(f, ",.0f"),
                         fmt(l4, ",.0f"), fmt(lh, ",.0f"), fmt(n, ",.0f"), fmt(nl, ".2f"),
                         f"{pr[0]:.2f}-{pr[1]:.2f}" if pr else "-", fmt(nf, ".2f"),
                         fmt(lf, ".2f"), ", ".join(goals)))
    return markdown(rows)


def cost_table(results: list[dict]) -> str:
    rows = [("device", "block", "QD", "contender", "reads/s", "system calls per read",
             "context switches per read", "CPU µs per read")]
    for d in results:
        for c in d["costs"]:
            cpu = c["task-clock"]
            rows.append((d["device"], human(c["block"]), str(c["qd"]), c["tool"],
                         fmt(c["iops"], ",.0f"), fmt(c["raw_syscalls:sys_enter"], ".3f"),
                         fmt(c["context-switches"], ".4f"),
                         fmt(None if cpu is None else cpu * 1e3, ".2f")))
    return markdown(rows)


def strace_lines(results: list[dict]) -> list[str]:
    out = []
    for d in results:
        for c in d["costs"]:
            s = c.get("strace")
            if not s:
                continue
            top = sorted(((k, v) for k, v in s.items() if k != "iops" and v >= 0.005),
                         key=lambda kv: -kv[1])
            out.append(f"- {d['device']} {human(c['block'])} QD {c['qd']} {c['tool']}: "
                       + ", ".join(f"{k} {v:.2f}" for k, v in top))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="small_ops_table.py", description=__doc__.split("\n\n")[0],
        epilog="Example: sudo bench/small_ops_table.py --nvio build/bin/nvio --dir /var/tmp/"
               "nvio-small-ops --ramdisk --rounds 3 --json small-ops.json")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/nvio-small-ops"),
                    help="the disk's directory (default: %(default)s)")
    ap.add_argument("--ramdisk", action="store_true",
                    help="root only: also a RAM-backed loop device (bench/ramdisk.py)")
    ap.add_argument("--no-disk", dest="disk", action="store_false", help="skip --dir")
    ap.add_argument("--no-iops", dest="iops", action="store_false",
                    help="skip the IOPS rounds: only the per-read counts")
    ap.add_argument("--size", type=parse_size, default=512 << 20,
                    help="the file the reads are drawn from (default 512M)")
    ap.add_argument("--block-sizes", type=parse_list(None, parse_size), default=[4096, 65536])
    ap.add_argument("--ram-block-sizes", type=parse_list(None, parse_size),
                    help="block sizes on the RAM device (default: --block-sizes)")
    ap.add_argument("--qds", type=parse_list(None, positive_int), default=[1, 32, 128])
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--runtime", type=positive_int, default=2,
                    help="seconds per IOPS run (default %(default)s)")
    ap.add_argument("--loop-mode", default="split",
                    choices=("split", "joined", "plain", "defer"), help="bench/uring_loop.cpp's")
    ap.add_argument("--count-qds", type=parse_list(None, positive_int), default=[1, 32],
                    help="queue depths of the 4 KiB cost counts (default 1,32)")
    ap.add_argument("--no-counts", dest="counts", action="store_false",
                    help="skip the per-read counts")
    ap.add_argument("--count-runtimes", type=parse_list(None, positive_int), default=[1, 3],
                    help="the short and the long run's seconds (default 1,3)")
    ap.add_argument("--count-rounds", type=positive_int, default=3)
    ap.add_argument("--nvio", help="the nvio CLI (default build/bin/nvio)")
    ap.add_argument("--fio", default="fio")
    ap.add_argument("--tools", type=Path, default=Path(tempfile.gettempdir()) / "nvio-small-ops",
                    help="where the C++ tools are built (default: %(default)s)")
    ap.add_argument("--keep", action="store_true", help="keep the disk's file")
    ap.add_argument("--json", metavar="FILE", help="also write everything measured to FILE")
    args = ap.parse_args(argv)
    if len(args.count_runtimes) != 2 or args.count_runtimes[0] >= args.count_runtimes[1]:
        ap.error("--count-runtimes takes SHORT,LONG seconds, SHORT < LONG")
    if not args.disk and not args.ramdisk:
        ap.error("nothing to measure: --no-disk without --ramdisk")
    interrupt_on_sigterm()
    try:
        nvio = find_nvio(args.nvio)
        fio = shutil.which(args.fio)
        for tool, need in ((fio, "fio"), (shutil.which("perf"), "perf"),
                           (shutil.which("strace"), "strace"), (shutil.which("g++"), "g++")):
            if not tool:
                raise Failure(f"{need} not found")
        bins = tools(args, nvio)
        info = machine_info(nvio, args.dir, fio=fio, full=True)
        load0 = os.getloadavg()
        results = []
        if args.disk:
            results.append(device(args, "disk", args.dir, nvio, fio, bins))
        if args.ramdisk:
            with RamDisk(args.size) as rd:
                results.append(device(args, "RAM", rd.mnt, nvio, fio, bins))
        load1 = os.getloadavg()
    except (Failure, KeyboardInterrupt) as e:
        return error_exit("small_ops_table.py", e)
    print(f"Random O_DIRECT reads, io_uring, one thread, {human(args.size)} file, "
          f"{args.rounds} rounds alternating ({args.runtime} s each), medians; loop mode "
          f"{args.loop_mode}.\n{info['date']}, commit {info['nvio_commit']}, "
          f"{info['nvio_version']}, {info['fio_version']}, Linux {info['kernel']}, "
          f"{info['nproc']} CPUs; load average {load0[0]:.2f} at the start, "
          f"{load1[0]:.2f} at the end.\n")
    if args.iops:
        print(iops_table(results))
    if any(d["costs"] for d in results):
        print(f"\nPer read (perf stat over every thread; runs of {args.count_runtimes[1]} s "
              f"less runs of {args.count_runtimes[0]} s, median of {args.count_rounds}):\n")
        print(cost_table(results))
        print("\nSystem calls per read by name (strace -c -f, the same difference):\n")
        print("\n".join(strace_lines(results)))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "load": [load0, load1],
                                               "args": {k: str(v) for k, v in
                                                        vars(args).items()},
                                               "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
