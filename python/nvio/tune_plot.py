"""Plot the result of ``nvio tune --json``: throughput against queue depth.

    python3 -m nvio.tune_plot RESULT.json -o OUT.png|OUT.svg [--mode read|write]

One row per mode (read, write), one panel per engine. In each panel the x-axis is the queue
depth (log2) and there is one line per block size and O_DIRECT setting (colour: block size;
solid line, filled dots: direct on; dashed, hollow: off). A point is the best median GB/s
measured at that engine, direct, block size and queue depth over the remaining settings
(parallelism, single_submit, overlap_events). The configuration the tuner chose is marked with
a star. A search (the default strategy) measures only part of the space, so lines may have few
points; ``nvio tune --grid`` fills them in.

This module imports nothing else from the nvio package (and matplotlib only when plotting), so
it can also be run as a plain script, ``python3 path/to/tune_plot.py``, without the compiled
extension. It draws on matplotlib's Figure directly (Agg for PNG) and never touches pyplot, so
calling :func:`plot` does not change the caller's matplotlib backend or open windows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

MODES = ("read", "write")
FORMATS = {".png": "png", ".svg": "svg"}
# Known engines first, in the order the docs list them; anything else after, by name.
ENGINE_ORDER = ("io_uring", "libaio", "psync")
# Larger than any `nvio tune --json` result (a grid over the whole space is a few MiB); json
# reads a whole file into memory, so a bigger one (a wrong file, /dev/zero) is refused unread.
MAX_RESULT_BYTES = 64 << 20
# Panels side by side: three engines exist; past this the figure is wider than Agg can draw.
MAX_ENGINES = 16
# Block sizes and queue depths beyond this are not measurements (nvio allows at most 1 GiB and
# 4096) and would not fit the float and int64 arithmetic of the log axes.
MAX_COUNT = 1 << 50


class TunePlotError(ValueError):
    """A result that cannot be plotted, or an unusable argument; the message says why."""


def _human_bytes(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _plain(text: str) -> str:
    """`text` drawn as it is: matplotlib reads text between two "$" as mathtext, which a name
    in the result could break (a parse error) or garble."""
    return text.replace("$", r"\$")


def _direct(value: Any) -> str:
    # The contract says "on"/"off"; tolerate a boolean so a hand-written result still plots.
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _points(result: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The measured points as flat dicts, checked; raises TunePlotError naming the bad one."""
    if not isinstance(result, dict):
        raise TunePlotError("the result is not a JSON object")
    raw = result.get("points")
    if not isinstance(raw, list) or not raw:
        raise TunePlotError("the result has no measured points")
    out = []
    for i, p in enumerate(raw):
        try:
            o = p["options"]
            median = p["median_gbps"]
            point = {
                "mode": str(p["mode"]),
                "engine": str(o["engine"]),
                "direct": _direct(o.get("direct", "on")),
                "block_size": int(o["block_size"]),
                "queue_depth": int(o["queue_depth"]),
                "gbps": None if median is None else float(median),
            }
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            # OverflowError: an infinite block size or queue depth (json reads Infinity).
            raise TunePlotError(f"point {i} is malformed ({type(e).__name__}: {e})") from None
        if point["queue_depth"] < 1 or point["block_size"] < 1:
            raise TunePlotError(f"point {i} has a non-positive block size or queue depth")
        if point["queue_depth"] > MAX_COUNT or point["block_size"] > MAX_COUNT:
            raise TunePlotError(f"point {i} has a block size or queue depth over 2^50")
        # A configuration that failed to run has no median; it has nothing to draw.
        if point["gbps"] is not None and math.isfinite(point["gbps"]):
            out.append(point)
    if not out:
        raise TunePlotError("the result has no points with a measured throughput")
    return out


def _engines(points: List[Dict[str, Any]]) -> List[str]:
    names = {p["engine"] for p in points}
    known = [e for e in ENGINE_ORDER if e in names]
    return known + sorted(names - set(known))


def _directs(points: List[Dict[str, Any]]) -> List[str]:
    values = {p["direct"] for p in points}
    return [d for d in ("on", "off") if d in values] + sorted(values - {"on", "off"})


def _best_options(result: Dict[str, Any], mode: str) -> Optional[Dict[str, Any]]:
    best = result.get("best")
    entry = best.get(mode) if isinstance(best, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("options"), dict):
        return None
    o = entry["options"]
    try:
        chosen = {"engine": str(o["engine"]), "direct": _direct(o.get("direct", "on")),
                  "block_size": int(o["block_size"]), "queue_depth": int(o["queue_depth"]),
                  "intra_op_parallelism": o.get("intra_op_parallelism"),
                  "single_submit": o.get("single_submit"),
                  "overlap_events": o.get("overlap_events"), "gbps": entry.get("median_gbps")}
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    # A choice no point could be is not starred (it would be off the axes, or overflow them).
    if not all(1 <= chosen[k] <= MAX_COUNT for k in ("block_size", "queue_depth")):
        return None
    if isinstance(chosen["gbps"], float) and not math.isfinite(chosen["gbps"]):
        chosen["gbps"] = None  # the measured point's value is drawn instead
    return chosen


def _title(result: Dict[str, Any]) -> str:
    parts = ["nvio tune"]
    if result.get("directory"):
        where = str(result["directory"])
        extra = ", ".join(str(result[k]) for k in ("filesystem", "device") if result.get(k))
        parts.append(f"{where} ({extra})" if extra else where)
    if isinstance(result.get("file_size"), int):
        parts.append(f"{_human_bytes(result['file_size'])} file")
    if result.get("strategy"):
        s = str(result["strategy"])
        if isinstance(result.get("elapsed_s"), (int, float)):
            s += f", {result['elapsed_s']:.0f} s"
            if s.startswith("search") and isinstance(result.get("budget_s"), (int, float)):
                s += f" of {result['budget_s']:.0f} s budget"
        parts.append(s)
    if result.get("nvio_version"):
        parts.append(f"nvio {result['nvio_version']}")
    return " | ".join(parts)


def plot(result: Dict[str, Any], path: str, mode: Optional[str] = None) -> None:
    """Draws `result` (the parsed output of ``nvio tune --json``) into `path`.

    The format comes from the extension (.png or .svg). `mode` ("read" or "write") draws that
    row only; None draws every mode that has points. Raises TunePlotError (a ValueError) for a
    result without usable points, an unknown mode or extension; ImportError without matplotlib.
    """
    if mode is not None and mode not in MODES:
        raise TunePlotError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    ext = os.path.splitext(str(path))[1].lower()
    if ext not in FORMATS:
        raise TunePlotError(f"{path}: unknown output format {ext or '(none)'!r}; use .png or .svg")
    points = _points(result)
    modes = [m for m in MODES if any(p["mode"] == m for p in points)] if mode is None else [mode]
    if not modes:
        raise TunePlotError("the result has no read or write points")
    points = [p for p in points if p["mode"] in modes]
    if not points:
        raise TunePlotError(f"the result has no {mode} points")
    if len(_engines(points)) > MAX_ENGINES:
        raise TunePlotError(f"the result has {len(_engines(points))} engines; at most "
                            f"{MAX_ENGINES} panels fit side by side")

    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator

    engines = _engines(points)
    directs = _directs(points)
    blocks = sorted({p["block_size"] for p in points})
    qds = sorted({p["queue_depth"] for p in points})
    # One colour per block size across all panels, light (small) to dark (large), so the
    # legend is shared and a trend with block size reads at a glance; direct on/off share a
    # panel (solid/dashed) because the interesting question is the gap between them.
    cmap = colormaps["viridis"]
    colour = {b: cmap(0.9 - 0.8 * i / max(1, len(blocks) - 1)) for i, b in enumerate(blocks)}
    styles = ["-", "--", ":", "-."]
    style = {d: styles[i % len(styles)] for i, d in enumerate(directs)}

    fig = Figure(figsize=(max(4.6 * len(engines), 6.0) + 1.2, 3.6 * len(modes) + 0.6),
                 layout="constrained")
    axes = fig.subplots(len(modes), len(engines), squeeze=False, sharex=True)
    for r, m in enumerate(modes):
        best = _best_options(result, m)
        rows = [p for p in points if p["mode"] == m]
        top = max((p["gbps"] for p in rows), default=0.0)
        for c, engine in enumerate(engines):
            ax = axes[r][c]
            # Best median per (direct, block size, queue depth) over the dimensions not drawn.
            cell: Dict[Tuple[str, int, int], float] = {}
            for p in rows:
                if p["engine"] == engine:
                    k = (p["direct"], p["block_size"], p["queue_depth"])
                    cell[k] = max(cell.get(k, 0.0), p["gbps"])
            for d in directs:
                for b in blocks:
                    xs = sorted(q for (dd, bb, q) in cell if (dd, bb) == (d, b))
                    if xs:
                        # Hollow markers for direct off: a lone point has no line style.
                        ax.plot(xs, [cell[(d, b, q)] for q in xs], linestyle=style[d],
                                marker="o", markersize=3.5, linewidth=1.5, color=colour[b],
                                markerfacecolor=colour[b] if d == "on" else "white")
            if not cell:
                ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center",
                        va="center", color="0.5")
            title = f"{m}: {engine}"
            if best and best["engine"] == engine:
                y = best["gbps"] if isinstance(best["gbps"], (int, float)) else \
                    cell.get((best["direct"], best["block_size"], best["queue_depth"]))
                if y is not None:
                    ax.plot([best["queue_depth"]], [y], marker="*", markersize=18,
                            color="crimson", markeredgecolor="black", linestyle="none",
                            zorder=5)
                    title += (f"\nchosen: {_human_bytes(best['block_size'])} blocks, "
                              f"qd {best['queue_depth']}, direct {best['direct']}")
                    if best["intra_op_parallelism"] not in (None, 1):
                        title += f", parallelism {best['intra_op_parallelism']}"
                    if best["single_submit"]:
                        title += ", single_submit"
                    if best["overlap_events"] is False:
                        title += ", no overlap_events"
                    title += f": {y:.2f} GB/s"
            ax.set_title(_plain(title), fontsize=9)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(qds))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(q) for q in qds], fontsize=8)
            ax.set_xlim(qds[0] / 1.4, qds[-1] * 1.4)
            # One y scale per row so panels compare at a glance; 0-based so ratios read true.
            ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
            ax.grid(True, which="major", alpha=0.3)
            if r == len(modes) - 1:
                ax.set_xlabel("queue depth")
            if c == 0:
                ax.set_ylabel(f"{m} GB/s (1e9 B/s)")
    handles = [Line2D([], [], color=colour[b], marker="o", markersize=4, label=_human_bytes(b))
               for b in blocks]
    handles += [Line2D([], [], color="0.3", linestyle=style[d], marker="o", markersize=4,
                       markerfacecolor="0.3" if d == "on" else "white",
                       label=_plain(f"direct {d}"))
                for d in directs]
    handles.append(Line2D([], [], color="crimson", marker="*", markersize=12, linestyle="none",
                          markeredgecolor="black", label="chosen"))
    # On the top-right panel, outside it: constrained layout makes room for an axes legend.
    axes[0][-1].legend(handles=handles, title="block size", loc="upper left",
                       bbox_to_anchor=(1.02, 1.0), fontsize=8, title_fontsize=8)
    fig.suptitle(_plain(_title(result)), fontsize=10)
    fig.savefig(path, format=FORMATS[ext], dpi=110)


def load(path: str) -> Dict[str, Any]:
    """Reads a tune result; raises TunePlotError with the reason for a missing or bad file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RESULT_BYTES + 1)
    except OSError as e:
        raise TunePlotError(f"{path}: {e.strerror or e}") from None
    if len(raw) > MAX_RESULT_BYTES:
        raise TunePlotError(f"{path}: over {MAX_RESULT_BYTES >> 20} MiB, too large for a tune "
                            "result (is it `nvio tune --json` output?)")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise TunePlotError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise TunePlotError(f"{path}: JSON nested too deeply to read (is it `nvio tune --json` "
                            "output?)") from None
    if not isinstance(data, dict):
        raise TunePlotError(f"{path}: not a JSON object (is it `nvio tune --json` output?)")
    return data


def _remove_unfinished(path: str, existed: bool) -> None:
    if not existed and os.path.isfile(path) and not os.path.islink(path):
        try:
            os.unlink(path)
        except OSError:
            pass


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m nvio.tune_plot",
        description="Plot `nvio tune --json` output: GB/s against queue depth, one line per "
                    "block size (solid: direct on, dashed: off), one panel per engine, read and "
                    "write rows; "
                    "the chosen configuration is starred.")
    ap.add_argument("result", help="JSON file written by `nvio tune --json`")
    ap.add_argument("-o", "--output", required=True,
                    help="image to write; the format comes from the extension (.png or .svg)")
    ap.add_argument("--mode", choices=MODES, help="plot only this mode (default: all measured)")
    args = ap.parse_args(argv)
    # An image this run started and did not finish (an error or Ctrl-C inside savefig) is removed;
    # one that was there before is the user's.
    existed = os.path.lexists(args.output)
    try:
        plot(load(args.result), args.output, args.mode)
    except KeyboardInterrupt:
        return _interrupted(args.output, existed)
    except TunePlotError as e:
        print(f"nvio.tune_plot: error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        # Ctrl-C while matplotlib loads a pybind11 extension (ft2font): pybind11 turns the
        # KeyboardInterrupt into ImportError("initialization failed") raised from it.
        if isinstance(e.__cause__ or e.__context__, KeyboardInterrupt):
            return _interrupted(args.output, existed)
        print(f"nvio.tune_plot: error: matplotlib is needed ({e}); "
              "apt-get install python3-matplotlib", file=sys.stderr)
        return 1
    except OSError as e:
        _remove_unfinished(args.output, existed)
        print(f"nvio.tune_plot: error: {args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 (a command: one line, never a traceback)
        _remove_unfinished(args.output, existed)
        print(f"nvio.tune_plot: error: {args.output}: cannot draw the result "
              f"({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    return 0


def _interrupted(output: str, existed: bool) -> int:
    _remove_unfinished(output, existed)
    print("nvio.tune_plot: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
