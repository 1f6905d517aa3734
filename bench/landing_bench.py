"""How a whole-file read into fresh memory (nvio.load, nvio.safetensors.load_file) pays for that
memory: the reads of python/nvio/_landing.py with and without its populating thread, against the
same read into memory populated before the timing starts (what `nvio bench` reads into).

Modes, alternated every round on the same file, medians and quartiles printed:
  thread      _landing.read_region as shipped: a second thread populates ahead of the read
  no-thread   the same mapping, faulted in by the read itself (the populating thread disabled)
  populated   the read alone, into a mapping populated (MADV_POPULATE_WRITE) before the clock
              starts: the bound for the other two

    PYTHONPATH=build/python /usr/bin/python3 bench/landing_bench.py --file /mnt/ram/f.bin --rounds 11
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time

import benchlib

MODES = ("thread", "no-thread", "populated")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", required=True, help="an existing file, read whole (≥ 1 GiB "
                        "shows the effect)")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    benchlib.interrupt_on_sigterm()
    import nvio
    from nvio import _landing

    size = os.path.getsize(args.file)
    handle = nvio.Handle()
    populate = _landing._populate
    times: dict = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            _landing._populate = populate if mode == "thread" else (lambda *a: None)
            if mode == "populated":
                memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                memory.madvise(mmap.MADV_HUGEPAGE)
                memory.madvise(_landing._MADV_POPULATE_WRITE)
                view = memoryview(memory)
                t0 = time.perf_counter()
                handle.read(view, args.file)
                times[mode].append(time.perf_counter() - t0)
                view.release()
                memory.close()
            else:
                t0 = time.perf_counter()
                view = _landing.read_region(handle, args.file, 0, size)
                times[mode].append(time.perf_counter() - t0)
                del view
    _landing._populate = populate
    print(f"{benchlib.human(size)} from {args.file}, {args.rounds} rounds, load average "
          f"{os.getloadavg()[0]:.2f}")
    for mode in MODES:
        v = times[mode]
        q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
        print(f"  {mode:10s} median {statistics.median(v):.3f} s ({size / statistics.median(v) / 1e9:.2f}"
              f" GB/s), quartiles {q[0]:.3f}-{q[2]:.3f} s, max {max(v):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
