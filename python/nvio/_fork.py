"""fork() support for the Python handles.

The core makes fresh worker threads in a forked child on the first call (include/nvio/handle.hpp,
"fork()"). What the Python objects hold is reset here, in the child, right after the fork: their
locks (another thread of the parent may have held one at the fork, and it would stay locked
forever in the child) and their pending futures (nvio/_future.py: those belong to the parent:
the child never submitted them, so its wait() must not count them).
"""

from __future__ import annotations

import os
import weakref

_live: "weakref.WeakSet[object]" = weakref.WeakSet()

# This process's id, kept up to date here so that checking it (each nvio.Future's wait) costs no
# system call. A child forked by os.fork() updates it before any other after-fork handler runs.
pid = os.getpid()


def track(obj: object) -> None:
    """Registers ``obj``, whose ``_after_fork_in_child()`` then runs in every forked child."""
    _live.add(obj)


def _reset_in_child() -> None:
    global pid
    pid = os.getpid()
    for obj in list(_live):
        obj._after_fork_in_child()  # type: ignore[attr-defined]


os.register_at_fork(after_in_child=_reset_in_child)
