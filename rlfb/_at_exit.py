"""Work a process still has to write when its interpreter exits (learning not in a snapshot yet, logs kept while a
store was locked): each hook registered once per process, on first use, never at import."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable

__all__ = ["run_at_exit"]

_REGISTERED: set[tuple[int, Callable[[], None]]] = set()  # (process id, hook): a forked child registers its own


def run_at_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` when this process exits; registering the same hook again in the same process does nothing.

    Registered after the stores it writes to were opened, it runs before their own exit hooks close them (atexit
    runs the latest first). A multiprocessing worker ends with ``os._exit``, which runs no atexit hook, but runs
    its finalizers: the hook is one of those there.
    """
    key = (os.getpid(), hook)
    if key in _REGISTERED:
        return
    _REGISTERED.add(key)
    atexit.register(hook)
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        from multiprocessing.util import Finalize

        Finalize(None, hook, exitpriority=10)
