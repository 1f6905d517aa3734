"""``nvio.tune``: the tuner from Python, returning the same document as ``nvio tune --json``."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Optional, Union

from . import _args, _nvio

_MODES = {"both": ("read", "write"), "read": ("read",), "write": ("write",)}


def _size(value: Union[int, str], what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"nvio.tune: {what} must be a byte count or a string like '1G'")
    if isinstance(value, str):
        return _nvio.parse_size(value, what)
    if value < 0:
        raise _nvio.InvalidArgument(f"nvio.tune: {what} must not be negative, got {value}")
    return value


class TuneResult:
    """What ``nvio.tune`` measured and picked.

    ``best(mode)`` gives the pick for "read", "write" or "mixed" (``None`` if not measured);
    ``options`` the recommended handle options (mixed, else the one mode measured), ready for
    ``nvio.Handle(**result.options)``; ``deepspeed_config`` DeepSpeed's ``{"aio": {...}}``
    section; ``points`` every measured configuration; ``to_dict()`` the whole document.
    """

    def __init__(self, document: "dict[str, Any]", saved_to: Optional[str]) -> None:
        self._doc = document
        self.saved_to = saved_to

    def best(self, mode: str = "mixed") -> "Optional[dict[str, Any]]":
        if mode not in ("read", "write", "mixed"):
            raise _nvio.InvalidArgument(f"mode must be 'read', 'write' or 'mixed', got {mode!r}")
        return self._doc["best"][mode]

    @property
    def options(self) -> "dict[str, Any]":
        pick = self._doc["best"][self._doc["recommended"]]
        return dict(pick["options"])

    @property
    def deepspeed_config(self) -> "dict[str, Any]":
        return json.loads(json.dumps(self._doc["deepspeed"]))

    @property
    def points(self) -> "list[dict[str, Any]]":
        return self._doc["points"]

    @property
    def elapsed_s(self) -> float:
        return self._doc["elapsed_s"]

    @property
    def warnings(self) -> "list[str]":
        return self._doc["warnings"]

    def to_dict(self) -> "dict[str, Any]":
        return json.loads(json.dumps(self._doc))

    def plot(self, path: Union[str, "os.PathLike[str]"], mode: Optional[str] = None) -> None:
        """Draws throughput against queue depth and block size per engine (needs matplotlib)."""
        from .tune_plot import plot

        plot(self._doc, os.fspath(path), mode)

    def __repr__(self) -> str:
        picks = []
        for mode in ("read", "write"):
            p = self._doc["best"][mode]
            if p is not None:
                picks.append(f"{mode}={p['median_gbps']:.2f} GB/s")
        mixed = self._doc["best"]["mixed"]
        if mixed is not None:
            picks.append(f"mixed={mixed['mixed_gbps']:.2f} GB/s")
        return f"<nvio.TuneResult {self._doc['directory']} {' '.join(picks)} options={self.options}>"


def tune(
    directory: Union[str, "os.PathLike[str]"],
    *,
    budget: float = 60.0,
    size: Union[int, str] = "1G",
    mode: str = "both",
    engines: Optional[Iterable[str]] = None,
    trial_size: Union[int, str] = 0,
    grid: bool = False,
    save: bool = False,
) -> TuneResult:
    """Finds the fastest handle options for the drive holding ``directory``.

    Writes a scratch file of ``size`` bytes there (removed afterwards) and searches engine, block
    size, queue depth, parallelism, submission policy and direct I/O for ``budget`` seconds (set-up
    included). ``mode`` is "both", "read" or "write". With ``save=True`` the recommended options
    become the default of every handle (the configuration file of ``nvio tune --save``). Releases
    the GIL while it runs.
    """
    if mode not in _MODES:
        raise _nvio.InvalidArgument(f"mode must be 'both', 'read' or 'write', got {mode!r}")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise _args.InvalidType("nvio.tune: budget must be a number of seconds")
    document, saved_to = _nvio.tune(
        _args.path(directory, "directory"),
        size=_size(size, "size"),
        budget=float(budget),
        modes=list(_MODES[mode]),
        engines=None if engines is None else [str(e) for e in engines],
        trial_bytes=_size(trial_size, "trial_size"),
        grid=_args.boolean(grid, "grid"),
        save=_args.boolean(save, "save"),
    )
    return TuneResult(json.loads(document), saved_to if save else None)
