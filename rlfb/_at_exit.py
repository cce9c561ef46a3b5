"""Work a process still has to write when its interpreter exits (learning not in a snapshot yet, logs kept while a
store was locked): each hook registered once per process, on first use, never at import."""

from __future__ import annotations

import atexit
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["run_at_exit", "write_kept_of_this_process"]

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


def write_kept_of_this_process(keeping: dict[Any, tuple[int, T]], write: Callable[[T], None],
                               what: Callable[[T], str]) -> None:
    """At exit: ``write(holder)`` for each holder ``keeping`` lists for this process (``{key: (pid, holder)}``:
    an adapter's handler holding what its store refused while locked), warning with ``what(holder)`` (the
    writes still kept) where that fails, and forgetting each. A forked child's copy of its parent's entries is
    left to the parent."""
    pid = os.getpid()
    for key, (owner, holder) in list(keeping.items()):
        if owner != pid:
            continue
        try:
            write(holder)
        except Exception as exc:  # noqa: BLE001 - at exit there is no caller to raise to
            warnings.warn(f"rlfb: {what(holder)} kept while the feedback store was locked were not written at "
                          f"exit: {exc!r}", RuntimeWarning, stacklevel=1)
        keeping.pop(key, None)
