"""A top-level run (a chain, a tool) started under a run id the store already holds retrievals under, as the
caller gave ``config={"run_id": ...}`` again: told from a retry of a failed run, refused (raised with
``handler.raise_error``, else warned of), and the runs directly under it marked failed, so that feedback on the id
passes them by."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from langchain_rlfb._kept import mark_failed, write_unmarked
from rlfb._caller import warn_at_app
from rlfb.errors import DuplicateEventError, RlfbError, StoreBusyError

if TYPE_CHECKING:
    from langchain_rlfb.callbacks import FeedbackCallbackHandler

__all__ = ["given_again", "refuse", "refused_below"]


def given_again(handler: FeedbackCallbackHandler, rid: str) -> bool:
    """Whether the store holds retrievals under the top-level run id ``rid`` already. Not where that run
    failed: a retry under the same id (its first attempt's runs, which answered nobody, are marked failed
    here, so that feedback on ``rid`` rates the retry). While the store is locked, the retrievals under ``rid``
    whose writes the handler keeps for it count as logged, unless a run on their way up to ``rid`` failed, as
    the store passes failed runs by, and a failed mark kept for ``rid`` counts as written. Nothing here waits
    for the store a second time, nor raises into LangChain at every chain start: a store that is closed, or
    still locked for a mark, is answered as far as it can be read."""
    try:
        write_unmarked(handler)  # an attempt that failed on a locked store: its mark first
        locked = False
    except StoreBusyError:
        locked = True
    with handler._lock:
        unmarked = set(handler._unmarked)
        kept = [list(e["path"]) for e in handler._unlogged.values()
                if isinstance(e, dict) and e.get("path") and e["path"][-1] == rid]
    store = handler.store
    try:
        logged = bool(store.resolve_run(rid))
        if not logged and not kept:  # a new run id, as nearly every one is: one read
            return False
        if rid in unmarked or store.run_failed(rid):  # a retry: its first attempt's runs answered nobody
            _fail_first_attempt(handler, rid, kept, locked)
            return False
        return logged or any(not any(r in unmarked or store.run_failed(r) for r in path[:-1]) for path in kept)
    except RlfbError:  # a closed store: the retrieval's own log says so, where there is one
        return False


def _fail_first_attempt(handler: FeedbackCallbackHandler, rid: str, kept: list[list[str]], locked: bool) -> None:
    """Mark failed the runs directly under the failed run ``rid`` (``store.fail_children``), before its retry
    under the same id starts runs of its own there: those in the store, and those on the ``kept`` entries' paths,
    whose links wait for the store. On a locked store each mark is kept, as the runs under it are now, for the
    handler's next write."""
    below = {path[-2] for path in kept if len(path) > 1}
    if not locked:
        try:
            handler.store.fail_children(rid)
        except StoreBusyError:
            locked = True
    if locked:
        below.update(handler.store.run_children(rid))
    for run in sorted(below):
        mark_failed(handler, run, wait=False)


def refuse(handler: FeedbackCallbackHandler, rid: str, *, running: bool = False) -> None:
    """A top-level run started under a run id that retrievals were logged under already.

    Refused as a retrieval's own run id given again is (:class:`DuplicateEventError`): raised where LangChain
    passes the handler's errors on (``handler.raise_error = True``), and the run does not start. Otherwise
    LangChain would only print the error and run it all the same, so a warning says so, and the retrievals
    made under it are passed by when feedback is given on ``rid`` (:func:`refused_below`).
    """
    said = (f"run id {rid!r} was given to an earlier run" + (", still running," if running else "")
            + " whose retrievals are logged under it: a run id names one run (give each invoke its own, or none)")
    if handler.raise_error:
        raise DuplicateEventError(said)
    # runs at once under one id cannot be told apart: feedback on it rates both; a later one is passed by
    rates = ("both runs' retrievals: rate each retrieval by its own run id" if running else
             "the earlier run's retrievals only: rate this run's by their own run ids")
    warn_at_app(
        f"{said}; this run goes on, but feedback on {rid!r} rates {rates} (handler.raise_error = True refuses "
        "such a run with a DuplicateEventError)",
        UserWarning,
    )


def refused_below(handler: FeedbackCallbackHandler, path: Sequence[tuple[str, str]]) -> None:
    """Mark failed the run directly under a refused run on ``path`` (``(run, parent)`` pairs up to the root),
    once: feedback on the refused run id then passes this run's retrievals by (:meth:`FeedbackStore.resolve_run
    <rlfb.store.FeedbackStore.resolve_run>` skips failed runs), as it passes a failed run's by."""
    with handler._lock:
        below = [(run, top) for run, top in path if top in handler._refused and run not in handler._refused[top]]
        for run, top in below:
            handler._refused[top].add(run)
    for run, _ in below:
        # not waited for where writes wait for the store already: it was locked at their last try
        mark_failed(handler, run, wait=not (handler._unlogged or handler._unmarked))
