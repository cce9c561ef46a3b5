"""What a :class:`~langchain_rlfb.callbacks.FeedbackCallbackHandler` does when a retrieval starts and ends: the
retrieval kept open with its query, session and name, and linked to the runs above it; at its end, whether it is
logged (the outermost retrieval; an rlfb decision below another retriever is kept reachable from it), under which
id (``"<run id>/result"`` above rlfb decisions), the chunks an outer result cut marked unused in those decisions,
a restated follow-up observed, and the log kept where the store is locked."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

from langchain_core.documents import Document

from langchain_rlfb._checks import session_key, session_text, usable_score, with_configured_session
from langchain_rlfb._given_again import refused_below
from langchain_rlfb._kept import keep, write_unmarked
from langchain_rlfb._runs import ancestor_links, opened, parent_of, run_str
from langchain_rlfb.retrievers import SESSION_KEY, document_to_chunk
from rlfb._caller import warn_at_app
from rlfb.errors import DuplicateEventError, StoreBusyError
from rlfb.runs import default_implicit, log_external, maker_of, observe_followup, same_store, store_now

if TYPE_CHECKING:
    from langchain_rlfb.callbacks import FeedbackCallbackHandler

__all__ = ["retrieval_started", "retrieval_ended"]


def retrieval_started(handler: FeedbackCallbackHandler, query: str, run_id: UUID, parent_run_id: UUID | None,
                      metadata: Mapping[str, Any] | None, name: Any) -> None:
    """``on_retriever_start``: keep the retrieval open, and link it to the runs above it. ``name``: the run's
    name as LangChain gave it (``kwargs["name"]``), if any."""
    # the run's metadata, with the session its chain's configurable names (RunnableWithMessageHistory's)
    metadata = with_configured_session(metadata)
    # the run's session (session_id, else LangSmith's thread_id or conversation_id), else the one a
    # FeedbackEnsembleRetriever falls back to (its session_id), as it does
    key = session_key(metadata)
    session = metadata[key] if key is not None else metadata.get(SESSION_KEY)
    with handler._lock:
        parent = parent_of(handler, run_str(parent_run_id))
        adopted = parent != run_str(parent_run_id)
        opened(handler, str(run_id), parent, {
            "query": query,
            "session_id": session_text(session),
            "raw_session_id": session,  # to name in the warning when it is dropped
            "name": name or metadata.get("ls_retriever_name") or "retriever",
        })
        links = ancestor_links(handler, parent)
        # the outermost open retrieval (this one, if none is above it) keeps the links written at its start and
        # its members': the next member (an EnsembleRetriever's second and third) does not write them again
        outer = _outermost_open(handler, parent, links) or str(run_id)
        written: set[tuple[str, str]] = handler._retrievals.get(outer, {}).setdefault("linked", set())
    if handler._refused and parent is not None:
        refused_below(handler, [(str(run_id), parent), *links])  # under a run id given again
    if adopted and parent is not None:
        # under a run LangChain did not report as its parent (a fallback's attempt): the retrieval's own event
        # names the reported parent, so it is linked to the run it is under
        links = [(str(run_id), parent), *links]
    links = [link for link in links if link not in written]
    if links:
        # Linked before the retrieval runs, so that a FeedbackEnsembleRetriever's own follow-up check
        # (which knows only its parent run) sees the runs above it: an agent's second call of its
        # retriever tool is then known as the same run as its first. Nested in another retrieval too: an rlfb
        # retriever inside a wrapper called twice in one run took the wrapper's second call for a restatement
        # of its first (the wrapper's own link to the run above it is written here, by its first member)
        try:
            handler.store.link_runs(links)
            with handler._lock:
                written.update(links)
        except StoreBusyError:
            # the store stayed locked: the retrieval's own log waits for it too (and raises, for an rlfb
            # retriever on this store), so the links are written when the retrieval ends, not printed by
            # LangChain as this handler's error
            with handler._lock:
                if str(run_id) in handler._retrievals:
                    handler._retrievals[str(run_id)]["unlinked"] = links


def retrieval_ended(handler: FeedbackCallbackHandler, documents: Sequence[Document], run_id: UUID,
                    parent_run_id: UUID | None) -> None:
    """``on_retriever_end``: log the retrieval where it is to be logged (see the module's docstring). Its
    warnings name the app's call into LangChain (``invoke``), past LangChain's callback manager."""
    rid = str(run_id)
    with handler._lock:
        info = handler._retrievals.pop(rid, None)
        parent = handler._parents.pop(rid, run_str(parent_run_id))
        links = ancestor_links(handler, parent)
        outer = _outermost_open(handler, parent, links)
    if info is None:
        return
    at = store_now(handler.store)  # the retrieval's time, before any wait for a locked store
    try:  # kept for a later write: this retrieval's own log comes first
        write_unmarked(handler)  # runs that failed, and retrievals not logged, while the store was locked
        locked = False
    except StoreBusyError:
        locked = True  # found locked just now: this retrieval's writes are kept without a second wait
    later = _Later(handler, at, locked)
    logged = _what_to_log(handler, info, documents, rid, parent, links, outer, later)
    if logged is None and not later.writes:
        return
    # the runs from this retrieval up to its top-level run: a run id given again while this entry waits is told by
    # them (_given_again.given_again), as the store tells it by its links once the entry is written
    path = [rid, *([parent] if parent is not None else []), *(p for _, p in links)]
    entry: dict[str, Any] = {"before": later.writes, "log": logged, "path": path}
    # writes alone under a key of their own: a run id given again must not put them in an earlier entry's place
    key = logged["event_id"] if logged is not None else f"{rid}/writes/{uuid4().hex}"
    if logged is not None:
        with handler._lock:
            taken = key in handler._unlogged
        if taken:
            # a retrieval's own run id given again while the first one's log waits: refused, as the store
            # refuses it once that log is written (kept under the id, it replaced the first retrieval's log); its
            # writes before the log are kept, as an open store makes them before it refuses the log
            if later.writes:  # under a key of its own: the id may be given a third time
                keep(handler, handler._unlogged, f"{rid}/writes/{uuid4().hex}", {**entry, "log": None})
            raise DuplicateEventError(f"event id {key!r} was already logged (its log waits for the locked store)")
    # else behind the kept writes, or on a store found locked just now
    if logged is not None and not later.writes and not handler._unlogged and not locked:
        try:
            log_external(handler.store, **logged)
            return
        except StoreBusyError:
            pass
    # the store stayed locked past busy_timeout (now, or for an earlier retrieval's writes, which this one's
    # follow): LangChain would print this as the handler's error, and the retrieval was lost (feedback on its
    # run found nothing). Kept, and written at the handler's next write, in order
    keep(handler, handler._unlogged, key, entry)
    what = "log retrieval" if logged is not None else "write the run links of retrieval"
    warn_at_app(f"rlfb could not {what} {rid} now (its feedback store stayed locked): it is kept, "
                "and written before this handler next logs a retrieval or takes feedback", RuntimeWarning)


class _Later:
    """A retrieval's writes before its log (run links, a follow-up observed, chunks marked unused), each written
    now unless the store is locked or earlier writes wait: then kept, in order, for the retrieval's kept entry."""

    def __init__(self, handler: FeedbackCallbackHandler, at: float, locked: bool = False) -> None:
        self.handler, self.at, self.locked = handler, at, locked
        self.writes: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if "timestamp" in kwargs and kwargs["timestamp"] is None:
            stamped = {**kwargs, "timestamp": self.at}  # kept: judged at the retrieval's time, not the write's
        else:
            stamped = kwargs
        if self.writes or self.handler._unlogged or self.locked:  # behind them, or on a store found locked
            self.writes.append((write, args, stamped))
            return
        try:
            write(*args, **kwargs)
        except StoreBusyError:
            self.writes.append((write, args, stamped))


def _outermost_open(handler: FeedbackCallbackHandler, parent: str | None,
                    links: Sequence[tuple[str, str]]) -> str | None:
    """The outermost open retriever run above a run whose parent is ``parent`` and whose links up are ``links``
    (:func:`ancestor_links`), also through a chain (``with_retry``, ``rewrite | retriever``); ``None``: none is
    open above it. Called under the handler's lock."""
    return next((r for r in reversed([parent, *(p for _, p in links)]) if r in handler._retrievals), None)


def _what_to_log(handler: FeedbackCallbackHandler, info: dict[str, Any], documents: Sequence[Document], rid: str,
                 parent: str | None, links: list[tuple[str, str]], outer: str | None,
                 write: _Later) -> dict[str, Any] | None:
    """The retrieval's writes before its log (through ``write``), and the log to make: ``log_external``'s
    arguments, or ``None`` where this retrieval is not logged here."""
    if info.get("unlinked"):
        write(handler.store.link_runs, info["unlinked"])  # links the store was locked for at the start
    decided = handler.store.has_event(rid)  # a FeedbackEnsembleRetriever logged it, and observed the session
    if outer is not None:
        # A member of an outer retriever: the outer result is what the user saw, so a plain member is not
        # logged. An rlfb retriever's own decision is what its learner learns from: keep it reachable from
        # the outer run (links through the runs between them), which then stands above it (see below).
        if not decided and not _in_ensemble_store(handler, rid):
            return None
        write(handler.store.link_runs, links)
        with handler._lock:
            if outer in handler._retrievals:
                handler._retrievals[outer]["decided_below"] = True
                handler._retrievals[outer].setdefault("decisions", []).append(rid)
        if decided:
            return None
        # made on the ensemble's own store: a copy here, as for an outermost one, which feedback resolves to
    elif decided:
        return None
    event_id = rid
    if outer is None and info.get("decided_below"):
        # the decisions made below this run and still under it (a failed branch's are passed by); not those of
        # an earlier run under its id given again, nor that run's result copy, which resolve_run finds there too
        mine = set(info.get("decisions", ()))
        below = [e for e in handler.store.resolve_run(rid) if e in mine]
        if not below and (write.writes or handler._unlogged or write.locked):
            # their links, or their copies here, wait for the locked store, where resolve_run cannot see them yet
            below = [e for e in info.get("decisions", ()) if _ranked(handler, e) is not None]
        if below:
            # rlfb retrievers decided inside this one (a wrapper that trims, compresses or re-ranks their
            # documents). Logged under the run id, this result would be an event, and resolve_run never looks
            # below an event: feedback on the run id would rate this copy alone and no learner would learn.
            # So the run id stays a run above their decisions and this result, logged as "<run id>/result",
            # as the LlamaIndex handler does with a bare retrieval that had rlfb learners inside.
            if parent is not None:
                write(handler.store.link_runs, [(rid, parent)])
            _mark_cut(handler, documents, below, write)
            if _is_decision(handler, documents, below):
                return None  # the wrapper returned one decision as it was logged: no copy to add
            event_id, parent = f"{rid}/result", rid
    session = info["session_id"]
    if session is not None and handler.observe_followups:
        # given, else the ensemble's as they are now (ens.implicit), else word overlap
        implicit = handler._implicit if handler._implicit is not None else default_implicit(handler.ensemble)
        # a retrieval under the same run (parent or any run above it) is a restatement on purpose; so is one
        # under this very retrieval (an rlfb retriever inside a wrapper retriever logged it moments ago)
        ancestors = {p for _, p in links} | ({parent} if parent is not None else set()) | {rid}
        write(observe_followup, handler.store, session, info["query"], ensemble=handler.ensemble,
              implicit=implicit, run_ancestors=ancestors, timestamp=None)
    results, dropped = _results(documents)
    if session is None and info["raw_session_id"] is not None:
        dropped.insert(0, f"its session_id {info['raw_session_id']!r} (not a non-empty str, int or UUID)")
    if dropped:
        # LangChain only prints a callback's exception, so failing here would lose the retrieval and every
        # later feedback on it; log what is usable and say once what was left out.
        # the app's call into LangChain (invoke), past its callback manager (stacklevel=3 named it)
        warn_at_app(f"rlfb logged retrieval {rid} without " + "; ".join(dropped))
    return dict(query=info["query"], results=results, source=info["name"], event_id=event_id, parent_id=parent,
                session_id=session, metadata={"framework": "langchain", "run_name": info["name"]},
                timestamp=write.at)


def _in_ensemble_store(handler: FeedbackCallbackHandler, rid: str) -> bool:
    """Whether the handler's ensemble, keeping its log in another store, logged a retrieval under ``rid``."""
    ens = handler.ensemble
    return (ens is not None and ens.store is not None and not same_store(ens.store, handler.store)
            and ens.store.has_event(rid))


def _mark_cut(handler: FeedbackCallbackHandler, documents: Sequence[Document], event_ids: Sequence[str],
              write: Callable[..., None]) -> None:
    """The chunks of the rlfb decisions ``event_ids`` that the outer result ``documents`` left out (a
    ``ContextualCompressionRetriever``'s compressor, a trimmer, a re-ranker's cutoff) are marked unused in
    each decision's event, in this store and in the learner's where that is another file, as the LlamaIndex
    handler marks the nodes a later step cut: praise of the outer run is not shared with documents the user
    never saw, nor reads them as passed over. All of a decision's chunks where the result is empty. A
    document counts as kept by its chunk id (``Document.id``, or the ``metadata["chunk_id"]`` rlfb's
    Documents carry, which a compressor that makes new Documents keeps with their metadata). A result none
    of whose documents is any decision's (a wrapper that wrote new Documents without their ids: summaries,
    parent documents) tells nothing of what was kept, and marks nothing."""
    kept: set[str] = set()
    for doc in documents:
        kept.add(document_to_chunk(doc).id)
        cid = (doc.metadata or {}).get("chunk_id")
        if isinstance(cid, str):
            kept.add(cid)
    rankings = {eid: _ranked(handler, eid) or [] for eid in event_ids}
    if documents and not any(c in kept for ranked in rankings.values() for c in ranked):
        return
    for eid, ranked in rankings.items():
        cut = [c for c in ranked if c not in kept]
        if not cut:
            continue
        for store in _stores_of(handler, eid):
            write(store.mark_unused, eid, cut)


def _stores_of(handler: FeedbackCallbackHandler, eid: str) -> list[Any]:
    """The stores that hold decision ``eid``: the handler's, and its learner's where that is another file
    (the live ensemble of this process that made it, else the handler's ``ensemble``)."""
    stores = [handler.store]
    for learner in (maker_of(eid), handler.ensemble):
        theirs = getattr(learner, "store", None)
        if theirs is not None and not any(same_store(theirs, s) for s in stores) and theirs.has_event(eid):
            stores.append(theirs)
    return stores


def _is_decision(handler: FeedbackCallbackHandler, documents: Sequence[Document], event_ids: Sequence[str]) -> bool:
    """Whether ``documents`` are one of ``event_ids`` as logged: its Documents, in its order."""
    eid = (documents[0].metadata or {}).get("event_id") if documents else None
    if not isinstance(eid, str) or eid not in event_ids:
        return False
    if any((d.metadata or {}).get("event_id") != eid for d in documents):
        return False
    return _ranked(handler, eid) == [cid for cid, _ in _results(documents)[0]]


def _ranked(handler: FeedbackCallbackHandler, eid: str) -> list[str] | None:
    """The chunk ids of decision ``eid`` as logged in the handler's store, in rank order, or as its copy is kept
    there for a locked store; ``None`` where it is neither."""
    with handler._lock:
        entry = handler._unlogged.get(eid)
        kept = entry.get("log") if isinstance(entry, dict) else None
    if kept is not None:
        return list(dict.fromkeys(cid for cid, _ in kept["results"]))
    if not handler.store.has_event(eid):
        return None
    return [c["chunk_id"] for c in handler.store.event(eid)["chunks"]]


def _results(documents: Sequence[Document]) -> tuple[list[tuple[str, float | None]], list[str]]:
    """``(chunk id, score)`` of each document, and a note on the scores that could not be kept.

    A ``metadata["score"]`` that is not a finite number (an int beyond float range, NaN, a string) is
    logged as no score, as for a document that has none: the ranking is still what the user saw.
    """
    results: list[tuple[str, float | None]] = []
    bad: list[str] = []
    for doc in documents:
        chunk = document_to_chunk(doc)
        score, usable = usable_score(chunk.metadata.get("score"))
        if not usable:
            bad.append(chunk.id)
        results.append((chunk.id, score))
    notes = [f"the scores of {len(bad)} documents (not finite numbers: {bad[:5]!r})"] if bad else []
    return results, notes
