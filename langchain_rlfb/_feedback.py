"""Feedback given to a :class:`~langchain_rlfb.callbacks.FeedbackCallbackHandler` by run id: the retrievals under
the run whose ensemble keeps its log in another store than the handler's, the feedback recorded in both stores
there (each learner learning on its own file), and the warnings where feedback was stored but taught no rlfb
learner. Each warning names the caller of ``record_feedback``, which calls it (``stacklevel=3``)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from rlfb.errors import RlfbError
from rlfb.runs import EXTERNAL_POLICY, learned_here, learns_after_commit, maker_of, record_run_feedback, same_store

if TYPE_CHECKING:
    from langchain_rlfb.callbacks import FeedbackCallbackHandler
    from rlfb.store.records import FeedbackRecord

__all__ = ["learners_elsewhere", "record_in_both_stores", "warn_unlearned", "warn_chunk_unlearned"]


def record_in_both_stores(handler: FeedbackCallbackHandler, run_id: Any, signal: str | None, fb: dict[str, Any],
                          elsewhere: dict[str, Any]) -> list[FeedbackRecord]:
    """Feedback ``fb`` on ``run_id`` recorded in the handler's store and, for each retrieval under it whose
    learner keeps its log in another store (``elsewhere``: :func:`learners_elsewhere`), in that store too."""
    # The run tree (links) lives in this handler's store: resolve here, record per event there. The learner's
    # writes inside the handler's block, so that a refusal there (an idempotency conflict, a locked file)
    # undoes the handler's rows too; each is a transaction of the learner's file, as before, since a block
    # held on that file would keep waiting a learner on another connection to it (another ensemble of the
    # same file that made the decision). Not where a learner keeps the handler's file through another
    # connection: it learns after the handler's commit, which a block around it would keep waiting.
    with ExitStack() as block:
        if not learns_after_commit(handler.store, run_id):
            block.enter_context(handler.store.exclusive())
        records = record_run_feedback(handler.store, run_id, signal, ensemble=handler.ensemble, **fb)
        ikey = fb.pop("idempotency_key", None)
        rated = [r.event_id for r in records]
        for eid in rated:
            learner = elsewhere.get(eid)
            if learner is not None:
                # the same key per event as record_run_feedback gave it in this store
                key_there = ikey if ikey is None or len(rated) == 1 else f"{ikey}:{eid}"
                records += record_run_feedback(learner.store, eid, signal, ensemble=learner,
                                               idempotency_key=key_there, **fb)
    return records


def warn_chunk_unlearned(handler: FeedbackCallbackHandler, run_id: Any, chunk_id: str | None,
                         records: Sequence[Any], elsewhere: dict[str, Any]) -> None:
    """Warn where feedback on ``chunk_id`` was stored on a copy of what the run returned (its
    ``"<run id>/result"``) while the rlfb decisions below it never returned that document: a wrapper that
    returns other documents than those ranked (a ``ParentDocumentRetriever`` or ``MultiVectorRetriever`` gives
    the parents of the chunks rlfb ranked) took the click, and no learner learned it (an audit, 2026-12-06:
    silent before)."""
    if chunk_id is None:
        return

    def decided(eid: str) -> bool:  # an rlfb decision, here or in its ensemble's own store
        return eid in elsewhere or handler.store.event(eid).get("policy") != EXTERNAL_POLICY

    if any(decided(r.event_id) for r in records):
        return
    try:
        below = handler.store.resolve_run(str(run_id))
    except RlfbError:
        return
    if any(decided(eid) for eid in below):
        warnings.warn(
            f"feedback on document {chunk_id!r} of run {str(run_id)!r} was stored but taught no rlfb learner: "
            "no rlfb retrieval of the run returned that document (a ParentDocumentRetriever or "
            "MultiVectorRetriever returns the parents of the chunks rlfb ranked); give the id of a document "
            "the rlfb retriever returned, or feedback on the whole run",
            RuntimeWarning, stacklevel=3,
        )


def warn_unlearned(handler: FeedbackCallbackHandler, run_id: Any, records: Sequence[Any],
                   elsewhere: dict[str, Any]) -> None:
    """Warn, once per handler, where feedback was stored on an rlfb decision that no live learner of this
    process learned: a handler made from the store alone (no ``ensemble``), after a restart or in another
    process than the retriever's, stores the feedback, which an ensemble of the decision's policy and retrievers
    learns only when it next refreshes (:func:`rlfb.feedback_learning.catch_up`). A plain retriever's log (an
    external event) has no learner to teach, and is not warned of."""
    if handler._warned_unlearned:
        return
    for eid in dict.fromkeys(r.event_id for r in records):
        # learned by its ensemble on its own store, or by the live one that logged it here (as
        # record_run_feedback picks it; it made the decision, so it owns it), or by the handler's own
        if eid in elsewhere or learned_here(handler.store, eid, handler.ensemble):
            continue
        handler._warned_unlearned = True
        warnings.warn(
            f"feedback on run {str(run_id)!r} was stored, but no rlfb learner of this process learned it: "
            f"the ensemble that made retrieval {eid!r} is not alive here (a restart, another process) and "
            "the handler was given none that made it. An ensemble of that retrieval's policy and retrievers "
            "on this store learns it at its next refresh or feedback (in any process, or once one starts); to "
            "learn it at once, make the handler with FeedbackCallbackHandler.from_ensemble(retriever) where "
            "the retriever runs (this warning is given once per handler)",
            RuntimeWarning, stacklevel=3,
        )
        return


def learners_elsewhere(handler: FeedbackCallbackHandler, run_id: Any) -> dict[str, Any]:
    """The retrievals under ``run_id`` whose decision an ensemble keeps in another store than this handler's,
    by event id, with that ensemble: the live one of this process that made it (any adapter's, on any store),
    else the handler's own ``ensemble`` where its store holds the event (made before a restart)."""
    try:
        event_ids = handler.store.resolve_run(str(run_id))
    except RlfbError:  # a bad run id: record_run_feedback names it
        return {}
    out = {}
    for eid in event_ids:
        learner = maker_of(eid)
        if learner is None:  # compared with None: an ensemble of no chunks (members only) has length 0
            learner = handler.ensemble
        theirs = getattr(learner, "store", None)
        if theirs is not None and not same_store(theirs, handler.store) and theirs.has_event(eid):
            out[eid] = learner
    return out
