"""bench/random_python.py with two builds of the Python package, alternating (issue 32 item 5: the
per-call Python path of one commit against another's on the same machine and file).

Each round runs random_python.py once (--rounds 1) with PYTHONPATH set to --a's package, once
with --b's, the order swapped every round so that a drift of a loaded machine hits both alike;
the medians of each form's ops/s and CPU time per read (the whole process, user + system:
less sensitive than ops/s to other processes' load) over the rounds and b/a are printed. fio
is left out (it is the same for both builds). Options after `--` go to random_python.py.

    PYTHONPATH=build/python .venv/bin/python bench/random_python_ab.py --a OLD/build/python --b build/python --rounds 5 -- --dir /dev/shm --size 512M --ops 65536
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Failure, child_env, error_exit, log, positive_int  # noqa: E402

FORMS = "async_path,async_fd,aio_pread,batch_items,batch_offsets"


def one_run(pythonpath: str, rest: list) -> dict:
    """random_python.py once with the package at pythonpath: form -> (ops/s, CPU us per read
    of the whole process)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = child_env()
        env.update(PYTHONPATH=pythonpath, NVIO_CONFIG="none")
        p = subprocess.run([sys.executable, str(Path(__file__).parent / "random_python.py"),
                            "--rounds", "1", "--json", out.name, *rest], env=env,
                           capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise Failure(f"random_python.py with PYTHONPATH={pythonpath} failed: "
                          f"{p.stderr.strip().splitlines()[-1:]}")
        result = json.loads(Path(out.name).read_text())
        return {f: (v, result["median_cpu_us_per_op"][f])
                for f, v in result["median_ops_per_s"].items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the baseline's package directory (PYTHONPATH)")
    ap.add_argument("--b", required=True, help="the change's package directory (PYTHONPATH)")
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- random_python.py's options")
    args = ap.parse_args()
    rest = [x for x in args.rest if x != "--"]
    if "--forms" not in rest:
        rest += ["--forms", FORMS]
    runs: dict = {"a": [], "b": []}
    try:
        for r in range(args.rounds):
            for which in (("a", "b") if r % 2 == 0 else ("b", "a")):
                runs[which].append(one_run(getattr(args, which), rest))
                log(f"round {r + 1}/{args.rounds} {which}: " + ", ".join(
                    f"{k} {v:,.0f} ops/s {c:.1f} us" for k, (v, c) in runs[which][-1].items()))
    except (Failure, KeyboardInterrupt) as e:
        return error_exit("random_python_ab.py", e)
    print(f"a = {args.a}\nb = {args.b}\n{args.rounds} rounds alternating, load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'form':<15}{'a ops/s':>12}{'b ops/s':>12}{'b/a':>7}{'a CPU us/op':>13}"
          f"{'b CPU us/op':>13}{'b/a':>7}")
    for form in runs["a"][0]:
        a, b = (statistics.median(x[form][0] for x in runs[w]) for w in "ab")
        ca, cb = (statistics.median(x[form][1] for x in runs[w]) for w in "ab")
        print(f"{form:<15}{a:>12,.0f}{b:>12,.0f}{b / a:>7.2f}{ca:>13.1f}{cb:>13.1f}"
              f"{cb / ca:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
