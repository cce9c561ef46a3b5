"""The run tree a :class:`~langchain_rlfb.callbacks.FeedbackCallbackHandler` keeps in memory: each open run's parent
(a fallbacks run's attempts placed under it), the links from a run up to the root, how the end of a run refused as
running at once under another's id is told from that run's own, and the bound on every table of open runs.

The tables are the handler's own (``handler._parents``, ``handler._retrievals``, ``handler._fallbacks``, ...); the
functions here that read or write them are called under ``handler._lock``, as each one says.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from langchain_core.runnables.config import var_child_runnable_config

if TYPE_CHECKING:
    from langchain_rlfb.callbacks import FeedbackCallbackHandler

__all__ = [
    "OPEN_RUNS", "FALLBACKS", "trim", "run_str", "parent_of", "opened", "ended", "forget", "ancestor_links",
]

#: Open runs a handler keeps at most; past it the oldest are forgotten. LangChain reports no end nor error for
#: some runs (a chain whose ainvoke is cancelled before it starts: its start hook runs in a worker thread after
#: the cancellation), so without a bound their entries would pile up for the life of the handler.
OPEN_RUNS = 100_000

#: The run name of ``Runnable.with_fallbacks``'s runnable, whose attempts LangChain reports under another run.
FALLBACKS = "RunnableWithFallbacks"


def trim(table: OrderedDict[str, Any]) -> None:
    """Drop the oldest entries of one of the handler's tables past :data:`OPEN_RUNS` (call under its lock)."""
    while len(table) > OPEN_RUNS:
        table.popitem(last=False)


def run_str(run_id: Any) -> str | None:
    """``run_id`` (a LangChain ``UUID``) as text, ``None`` kept."""
    return None if run_id is None else str(run_id)


def parent_of(handler: FeedbackCallbackHandler, reported: str | None) -> str | None:
    """The run a starting run is under (call under ``handler._lock``): ``reported``, or an open run below it.

    LangChain (1.8) runs each attempt of a ``RunnableWithFallbacks`` with the config the fallbacks run was
    given, not its child's, so the attempt is reported under the run above the fallbacks (or under none,
    a top-level run), and feedback on the fallbacks run's id reached no retrieval. The child's config is in
    the context then (``var_child_runnable_config``): its callbacks name the fallbacks run as the parent.
    That run is taken only when it is an open fallbacks run (named ``RunnableWithFallbacks``: one given
    another ``run_name`` is not known as one) below ``reported``, or ``reported`` is ``None``: so a run is
    only ever placed deeper on its own branch, and a retrieval code starts as a trace of its own (with a
    callbacks list of its own) stays one.
    """
    config = var_child_runnable_config.get()
    in_context = run_str(getattr(config.get("callbacks"), "parent_run_id", None)) if config else None
    if in_context is None or in_context == reported or in_context not in handler._fallbacks \
            or in_context not in handler._parents:
        return reported
    if reported is None or any(p == reported for _, p in ancestor_links(handler, in_context)):
        return in_context
    return reported


def opened(handler: FeedbackCallbackHandler, rid: str, parent: str | None,
           retrieval: dict[str, Any] | None = None) -> None:
    """Keep ``rid`` open (under ``handler._lock``), dropping the oldest open runs past :data:`OPEN_RUNS`.

    A run forgotten so that later ends without being logged (a retrieval) or linked above it: one open
    while 100,000 newer runs started is almost surely one whose end LangChain never reports.
    """
    handler._parents[rid] = parent
    while len(handler._parents) > OPEN_RUNS:
        gone = handler._parents.popitem(last=False)[0]
        handler._fallbacks.discard(gone)
        handler._refused.pop(gone, None)
    if retrieval is not None:
        handler._retrievals[rid] = retrieval
        trim(handler._retrievals)


def ended(handler: FeedbackCallbackHandler, rid: str) -> bool:
    """Whether the end (or failure) of a top-level run under ``rid`` is another run's, refused as running at
    once under the same id (call under ``handler._lock``): then the run still open under it stays so, and a
    failure is not marked on the id, which the other run holds."""
    extra = handler._doubled.get(rid, 0)
    if extra:
        if extra == 1:
            del handler._doubled[rid]
        else:
            handler._doubled[rid] = extra - 1
        return True
    return False


def forget(handler: FeedbackCallbackHandler, rid: str) -> None:
    """Drop run ``rid`` from every table of open runs (call under ``handler._lock``)."""
    handler._parents.pop(rid, None)
    handler._retrievals.pop(rid, None)
    handler._fallbacks.discard(rid)
    handler._refused.pop(rid, None)
    handler._started_in.pop(rid, None)


def ancestor_links(handler: FeedbackCallbackHandler, run_id: str | None) -> list[tuple[str, str]]:
    """``(run, parent)`` pairs from ``run_id`` up to the root, as far as this handler saw the tree."""
    links: list[tuple[str, str]] = []
    seen: set[str] = set()
    while run_id is not None and run_id not in seen:
        seen.add(run_id)
        parent = handler._parents.get(run_id)
        if parent is None:
            break
        links.append((run_id, parent))
        run_id = parent
    return links
