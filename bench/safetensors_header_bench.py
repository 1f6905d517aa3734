"""Parse time of safetensors headers by entry count (issue 28: the old parser was quadratic, 20,000
entries 3.2 s). Each header is {"t<i>": {"dtype": "U8", "shape": [1], "data_offsets": [i, i+1]}}
as nvio's own save_file writes it; the time is nvio's parse (C++, plus the Python tuple of the
header), the best of --rounds, and for comparison the reference package's (safetensors.deserialize
of the same bytes, which also copies the data) where it is installed.

    PYTHONPATH=build/python .venv/bin/python bench/safetensors_header_bench.py
"""

from __future__ import annotations

import argparse
import time

from nvio import _nvio


def header_bytes(n: int) -> bytes:
    body = ",".join(f'"t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}'
                    for i in range(n))
    text = ("{" + body + "}").encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + bytes(n)


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, nargs="+", default=[10_000, 25_000, 100_000, 400_000])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    try:
        import safetensors
    except ImportError:
        safetensors = None
    print(f"{'entries':>8} {'header MB':>10} {'nvio s':>8} {'reference s':>12}")
    for n in args.entries:
        data = header_bytes(n)
        ours = best(lambda: _nvio.safetensors_parse(data, "<bench>"), args.rounds)
        theirs = best(lambda: safetensors.deserialize(data), args.rounds) if safetensors else None
        ref = f"{theirs:12.3f}" if theirs is not None else f"{'-':>12}"
        print(f"{n:>8} {(len(data) - n) / 1e6:>10.1f} {ours:>8.3f} {ref}")


if __name__ == "__main__":
    main()
