"""Feedback, as the LlamaIndex adapters take it: their own ``feedback`` methods (with errors that speak
LlamaIndex), and :meth:`~llamaindex_rlfb.events.FeedbackEventHandler.record_feedback` by query id, routed to
the learner that made each decision under the query."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from llamaindex_rlfb._kept import write_kept
from llamaindex_rlfb._learners import ensemble_of, live_adapters, live_ensembles
from rlfb.errors import StoreBusyError, UnknownChunkError, UnknownEventError, ValidationError
from rlfb.runs import (
    key_or_score,
    learned_here,
    learns_after_commit,
    maker_of,
    owns_event,
    record_run_feedback,
    same_store,
)

if TYPE_CHECKING:
    import threading
    import weakref
    from collections import OrderedDict, deque
    from collections.abc import Callable

    from rlfb.store.records import FeedbackRecord

__all__ = ["adapter_feedback", "HandlerFeedback"]


def adapter_feedback(
    store: Any, event_id: Any, signal: str | float | None, *, ensemble: Any, **fields: Any
) -> list[FeedbackRecord]:
    """:func:`rlfb.runs.record_run_feedback` on ``store``; an unknown id names what a LlamaIndex app passes."""
    try:
        return record_run_feedback(store, event_id, signal, ensemble=ensemble, **fields)
    except UnknownEventError:
        # the core's message names LangChain's retriever and callback handler, which this app has neither of
        raise UnknownEventError(
            f"nothing was logged under {str(event_id)!r}, nor under a query below it; pass a node's "
            "metadata['event_id'] from this adapter's output, or a query id (handler.last_query_id, with a "
            "FeedbackEventHandler attached while querying), and check that the adapter logs (log=True) to "
            "this store"
        ) from None


class _Latest:
    """The default of a query id left out: the latest query (:attr:`FeedbackEventHandler.last_query_id`).

    Not ``None``: ``record_feedback(handler.query_id_of(response), ...)`` passes ``None`` for a response the
    handler never saw, and that rated the latest query, another turn than the one meant."""

    def __repr__(self) -> str:
        return "<the latest query>"


_LATEST: Any = _Latest()


def _no_query_named(what: str) -> UnknownEventError:
    return UnknownEventError(
        f"{what} got None for a query id, which names no query (handler.query_id_of(response) gives None for "
        "a response this handler did not see: it was not attached while the engine ran, or the response was "
        "made elsewhere); pass a query id (handler.query_id_of(response) of a response made with the handler "
        "attached, handler.last_query_id, or a node's metadata['event_id']), or leave the id out to rate the "
        "latest query"
    )


class HandlerFeedback:
    """Feedback by query id (a mixin of :class:`~llamaindex_rlfb.events.FeedbackEventHandler`, whose fields it
    reads)."""

    if TYPE_CHECKING:  # the handler's fields these methods read, and its query ids' method they call
        score_scale: str
        _store: Any
        _ensemble: Any
        _lock: threading.Lock
        _learners: OrderedDict[str, tuple[weakref.ref[Any], weakref.ref[Any] | None]]  # (adapter, its ensemble)
        _adapters: OrderedDict[int, weakref.ref[Any]]
        _raised: OrderedDict[str, None]
        _cut_from: OrderedDict[tuple[str, str], tuple[str, str]]
        _warned_unlearned: bool
        _kept_lock: threading.Lock
        _unwritten: deque[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]

        def _implied_query(self) -> str | None: ...

    def record_feedback(
        self,
        query_id: Any = _LATEST,
        *args: Any,
        score: float | bool | None = None,
        rating: float | None = None,
        signal: str | None = None,
        value: float | None = None,
        chunk_id: str | None = None,
        comment: str | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> list[FeedbackRecord]:
        """Feedback on a query (or on one retrieval's event id); returns one record per retrieval rated.

        ``query_id`` left out is :attr:`last_query_id`; ``None`` is refused
        (:class:`rlfb.errors.UnknownEventError`): it is what :meth:`query_id_of` gives for a response the handler
        did not see, and rating the latest query instead rated another turn than the one meant. Second, as
        LangSmith's ``create_feedback`` and the LangChain handler take them, a key
        (``record_feedback(qid, "user_score", score=1.0)``) or the score (``record_feedback(qid, 1.0)``), or a
        signal's name where nothing else rates it (``record_feedback(qid, "thumbs_up")``). Give one of ``score``
        (read with the handler's ``score_scale``), ``rating`` (1 to 5),
        ``signal`` (``"thumbs_up"``, ``"explicit_negative"``, ``"click"``, ...)
        or a raw ``value`` in [-1, 1]; ``chunk_id`` (a node id) rates one node.
        ``kwargs``: ``timestamp``, ``session_id``, ``user_id``, ``idempotency_key``.
        The learner that made a decision under the query learns from it, once, also
        when it ran nested in another retriever; a learner on another store gets the
        feedback in its own store too (on the decisions that returned ``chunk_id``);
        a refusal there (an idempotency conflict, a locked file) undoes the handler's
        rows as well.

        Without ``query_id``, a later query of this thread that ran in an asyncio task the
        calling code never saw (``asyncio.run``, a notebook cell's ``await``) is a
        :class:`rlfb.errors.ValidationError` asking for the id, rather than a silent rating of the
        code's earlier query.

        Raises :class:`rlfb.errors.UnknownEventError` for a query id nothing was
        logged under, :class:`rlfb.errors.UnknownChunkError` for a chunk none of
        its retrievals returned, :class:`rlfb.errors.UnknownSignalError` for a name second that no signal
        has, with nothing else rating it (a LangSmith key needs its ``score``), and the store's validation errors.
        """
        key, score, signal = key_or_score(args, key, score, "record_feedback", signal=signal,
                                          rated=rating is not None or value is not None,
                                          reward=getattr(self._store, "reward", None))
        given = [n for n, v in (("score", score), ("rating", rating), ("signal", signal), ("value", value))
                 if v is not None]
        if len(given) != 1:
            got = ", ".join(given) or "none"
            raise ValidationError(f"give exactly one of score, rating, signal or value (got {got})")
        if query_id is None:
            raise _no_query_named("record_feedback")
        implied = query_id is _LATEST
        qid = self._implied_query() if implied else query_id
        if qid is None:
            raise UnknownEventError("no query was captured in this thread or task; pass the query id")
        if implied and qid in self._raised:
            raise ValidationError(
                f"the latest query ({qid!r}) raised, so it gave no answer to rate: pass the id of the query "
                "the feedback is about"
            )
        qid = str(qid)
        write_kept(self)  # logs a locked store refused, so that the query is found (still locked: StoreBusyError)
        event_ids = self._store.resolve_run(qid)
        if not event_ids:
            raise UnknownEventError(
                f"nothing was logged under query id {qid!r}: attach the handler (handler.attach()) before "
                "querying, and pass an id from handler.last_query_id or a node's metadata['event_id']"
            )
        makers = self._makers_of(event_ids)
        here = {eid: ens for eid, ens in makers.items() if same_store(ens.store, self._store)}
        fb = dict(signal=signal, score=score, score_scale=self.score_scale, value=value, rating=rating,
                  chunk_id=chunk_id, comment=comment, key=key, **kwargs)
        # Each decision is learned once, by the learner that made it (two learners on one store may have the
        # same retrievers, over different corpora); _makers_of gives a decision no learner of this process made
        # to the handler's own ensemble, which learns from it if it owns it.
        # The learners' writes on other files inside the handler's block: a refusal on a learner's store (an
        # idempotency conflict, a locked file) undoes the handler's rows too. Each learner's store commits its own
        # block, so with learners on two other files a refusal by the second leaves the first one's row. Not
        # where a learner keeps this very file through another connection: it learns after the handler's commit,
        # which a block held around it would keep waiting (StoreBusyError): that feedback is written as before.
        # A learner on another file learns from its own copy of the event.
        elsewhere = [(eid, ens) for eid, ens in makers.items() if eid not in here and ens.store.has_event(eid)]
        derived = None if chunk_id is None else self._cut_from.get((qid, str(chunk_id)))
        if derived is not None and derived[0] not in makers:
            derived = None
        # the click copied onto a ranked node below (derived) is written in the block too: a refusal there used to
        # leave the response's row written
        together = (elsewhere or derived is not None) and not learns_after_commit(self._store, qid, here)
        with self._store.exclusive() if together else nullcontext():
            records = record_run_feedback(self._store, qid, ensembles=here, **fb)
            for eid, ens in elsewhere:
                try:
                    records += record_run_feedback(ens.store, eid, ensemble=ens, **fb)
                except UnknownChunkError:
                    # about one chunk its decision did not return (only another member of a fusion found it):
                    # record_run_feedback refuses before writing, and this store has taken the feedback
                    continue
            if derived is not None and not any(r.event_id == derived[0] for r in records):
                # a node made from a ranked one (a citation engine's source): the click is the ranked node's too
                eid, ranked = derived
                ens = makers[eid]
                again = {**fb, "chunk_id": ranked}
                if again.get("idempotency_key") is not None:  # its own key: the response's row holds the given one
                    again["idempotency_key"] = f"{again['idempotency_key']}/ranked"
                records += record_run_feedback(ens.store, eid, ensemble=ens, **again)
        self._warn_if_unlearned(qid, event_ids, makers)
        if chunk_id is not None and makers and not any(r.event_id in makers for r in records):
            # stored (on the response the user saw), but no rlfb decision of the query returned that node: a
            # CitationQueryEngine's sources, say, are new nodes cut from the ones ranked. It was silent.
            warnings.warn(
                f"feedback on chunk {chunk_id!r} of query {qid!r} was stored but taught no rlfb learner: none of "
                "the query's rlfb decisions returned that node (a CitationQueryEngine's sources are new nodes, a "
                "RecursiveRetriever shows the node an IndexNode points to, an AutoMergingRetriever the parent of "
                "the leaves ranked); give the id of a node the rlfb step returned, or feedback on the whole answer",
                RuntimeWarning, stacklevel=2,
            )
        return records

    def _makers_of(self, event_ids: Sequence[str]) -> dict[str, Any]:
        """The ensemble behind each of ``event_ids`` that has one: the learner seen making it in this
        process (or the one the core saw logging it, :func:`rlfb.runs.maker_of`); for a decision older than
        the last :data:`~llamaindex_rlfb._spans.KEPT`, or made before a restart, a live adapter whose store holds
        it and who made it (:func:`rlfb.runs.owns_event`): one seen here, the handler's own ensemble, or any rlfb
        adapter alive in this process (one that has not decided yet since the restart included); else the
        handler's own ensemble. Late feedback was stored and never learned."""
        with self._lock:
            refs = {e: self._learners.get(e) for e in event_ids}
            seen = [r() for r in reversed(self._adapters.values())]
        own = ensemble_of(self._ensemble)
        candidates: list[Any] | None = None  # the live ensembles, looked up once, for a decision none was seen making
        makers = {}
        for eid, ref in refs.items():
            adapter, ensemble = (None, None) if ref is None else (ref[0](), None if ref[1] is None else ref[1]())
            ens = ensemble_of(adapter) if adapter is not None else ensemble
            if ens is None or ens.store is None:
                ens = maker_of(eid)
            if ens is None or ens.store is None:
                if candidates is None:
                    candidates = live_ensembles([*seen, own, *live_adapters()])
                ens = next((e for e in candidates if e.store.has_event(eid) and owns_event(e, e.store.event(eid))),
                           own)
            if ens is not None and ens.store is not None:
                makers[eid] = ens
        return makers

    def _warn_if_unlearned(self, qid: str, event_ids: Sequence[str], makers: dict[str, Any]) -> None:
        """Warn (once per handler) where feedback was stored on an rlfb decision that no learner alive in this
        process learned from: one made before a restart, whose adapter has no ensemble yet (a self-indexing
        postprocessor builds it at its first query) or is not alive here. Silent before 2026-12-06."""
        if self._warned_unlearned:
            return
        own = ensemble_of(self._ensemble)
        for eid in event_ids:
            learner = makers.get(eid)
            if learner is not None and learner is not own:
                continue  # seen making it, or a live one that holds it and made it (_makers_of)
            # else the live one that logged it here, or the handler's own where it made it; the handler's own log
            # (or a copy of a decision on another store, learned there) has nothing to learn
            if not learned_here(self._store, eid, learner):
                self._warned_unlearned = True
                warnings.warn(
                    f"feedback on query {qid!r} was stored, but no rlfb learner alive in this process learned "
                    f"from it: decision {eid!r} was made by none that holds it (one made before a restart, say, "
                    "whose postprocessor or retriever is not built yet, or a self-indexing postprocessor that "
                    "has not indexed anything yet). An ensemble of that decision's policy and retrievers on this "
                    "store learns it at its next refresh or feedback (in any process, or once one starts); to "
                    "learn it at once, build the adapter before giving feedback, pass it as "
                    "FeedbackEventHandler(..., ensemble=...), or run a query through it first",
                    RuntimeWarning, stacklevel=3,
                )
                return

    def retrievals(self, query_id: Any = _LATEST) -> list[dict[str, Any]]:
        """The logged retrievals a query id stands for (store event dicts with their ranked ``chunks``); left out,
        the latest query's; ``None`` (:meth:`query_id_of` of a response the handler did not see) names none."""
        qid = self._implied_query() if query_id is _LATEST else query_id
        if qid is None:
            return []
        with contextlib.suppress(StoreBusyError):  # a read: the kept logs wait for a write that can wait
            write_kept(self)
        return [self._store.event(e) for e in self._store.resolve_run(str(qid))]

