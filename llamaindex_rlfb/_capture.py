"""What a :class:`~llamaindex_rlfb.events.FeedbackEventHandler` does with each instrumentation event: queries
and retrievals opening and closing, spans an error dropped, the rlfb adapters' decisions (each remembered with the
learner that made it, and linked under its query id), and what it logs of them in its store (the retrievals, the
response's nodes, the nodes a later step cut)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from llama_index.core.instrumentation.events.query import QueryEndEvent, QueryStartEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent, RetrievalStartEvent
from llama_index.core.instrumentation.events.span import SpanDropEvent
from llama_index.core.schema import NodeWithScore, QueryBundle

from llamaindex_rlfb._checks import finite_or_none
from llamaindex_rlfb._kept import kept_log, written
from llamaindex_rlfb._learners import ensemble_of
from llamaindex_rlfb._nodes import EVENT_ID_KEY, event_id_of
from llamaindex_rlfb._spans import (
    KEPT,
    QUERIES,
    RETRIEVALS,
    current_query_id,
    current_session,
    pop,
    push,
    span_of,
)
from rlfb.errors import UnknownEventError
from rlfb.runs import log_external, store_now

if TYPE_CHECKING:
    import threading
    from collections import OrderedDict, deque
    from contextvars import ContextVar

    from llamaindex_rlfb._spans import SpanParents
    from llamaindex_rlfb.events import FeedbackRetrievalEvent

__all__ = ["Capture"]

_ADAPTERS = 64  # distinct adapters remembered (weakly), to find the maker of a decision older than that


class Capture:
    """The handler's steps, one per event type (a mixin of :class:`~llamaindex_rlfb.events.FeedbackEventHandler`,
    whose fields it reads; ``handle`` there picks the step)."""

    if TYPE_CHECKING:  # the handler's fields these steps read, and its other mixins' methods they call
        _store: Any
        _lock: threading.Lock
        _spans: SpanParents
        _bare: ContextVar[_Bare | None]
        _decision: ContextVar[tuple[str, str] | None]  # (event id, query id) of the latest top-level decision
        _learners: OrderedDict[str, tuple[weakref.ref[Any], weakref.ref[Any] | None]]  # (adapter, its ensemble)
        _adapters: OrderedDict[int, weakref.ref[Any]]
        _logged: OrderedDict[str, list[tuple[str, ...]]]
        _inner: OrderedDict[str, list[tuple[str, tuple[str, ...]]]]
        _nested: OrderedDict[str, list[str]]
        _raised: OrderedDict[str, None]
        _span_of: OrderedDict[str, str]
        _cut_from: OrderedDict[tuple[str, str], tuple[str, str]]
        _decided_in: OrderedDict[str, list[tuple[str, bool]]]
        _retrieved_in: OrderedDict[str, set[str]]
        _kept_lock: threading.Lock
        _unwritten: deque[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]

        @property
        def last_query_id(self) -> str | None: ...
        def _span_for(self, qid: str) -> str: ...
        def _set_last(self, qid: str) -> None: ...
        def _remember_response(self, response: Any, qid: str) -> None: ...
        def _makers_of(self, event_ids: Sequence[str]) -> dict[str, Any]: ...

    def _retrieval_start(self, event: RetrievalStartEvent) -> None:
        push(RETRIEVALS, span_of(event))

    def _span_drop(self, event: SpanDropEvent) -> None:
        # a query or retrieval that raised: forget its span (the dispatcher's SpanDropEvent always names it; a
        # BaseEvent's span_id is optional for events made outside any span)
        dropped = cast(str, event.span_id)
        pop(QUERIES, dropped)
        pop(RETRIEVALS, dropped)
        last = self.last_query_id
        # the span the latest query began with (its id, or the retrieval a re-ranking's run re-ranked: until
        # 2026-12-06 that run, "<span>/reranked/<event>", was looked up as a span, found none, and a chat turn
        # with an rlfb postprocessor whose LLM raised was rated by feedback naming no query)
        since = None if last is None else self._span_for(last)
        with self._lock:
            self._nested.pop(dropped, None)
            self._inner.pop(dropped, None)
            self._decided_in.pop(dropped, None)
            self._retrieved_in.pop(dropped, None)
            if last is not None and (dropped in (last, since) or self._spans.above(since, dropped)
                                     or self._spans.turn_after(dropped, since)):
                # (the last: a chat turn that raised before it retrieved, its condensing LLM or its retriever
                # down, left the latest query on the turn before, and a thumbs down on it rated that good answer)
                # the latest query, or the call its bare retrieval ran in (a chat engine's turn), gave no answer:
                # feedback that names no query must not rate what it retrieved
                self._raised[last] = None
                if len(self._raised) > KEPT:
                    self._raised.popitem(last=False)

    def _query_start(self, event: QueryStartEvent) -> None:
        qid = span_of(event)
        if all(q == qid for q in QUERIES.get()):  # top-level (another handler may have pushed it already)
            self._set_last(qid)
        push(QUERIES, qid)

    def _retrieval_end(self, event: RetrievalEndEvent) -> None:
        rid = span_of(event)
        pop(RETRIEVALS, rid)
        if RETRIEVALS.get():  # nested in another retrieval: the outer result is what counts
            return
        parent = current_query_id()
        if parent is not None:  # what the query's retrieval returned, which _mark_all_cut reads at its end
            with self._lock:
                self._retrieved_in.setdefault(parent, set()).update(_ids(event.nodes))
                while len(self._retrieved_in) > KEPT:
                    self._retrieved_in.popitem(last=False)
        own = self._own_event(event.nodes)  # an rlfb retriever logged it already
        with self._lock:
            nested = self._nested.pop(rid, [])
        logged_as = own or rid
        if parent is None:
            qid = logged_as
            if any(e != own for e in nested):
                # rlfb learners decided inside this bare retrieval (members of a QueryFusionRetriever) and its
                # result is not simply theirs. Its span id stays the query id, but as a run above their
                # decisions and its own result: an event id would stand for that one event alone.
                qid = rid
                written(self, self._store.link_runs,
                        [(e, rid) for e in dict.fromkeys([*nested, *([own] if own else [])])])
                logged_as, parent = own or f"{rid}/result", rid
            self._set_last(qid)
            with self._lock:
                self._span_of[qid] = rid
                if len(self._span_of) > KEPT:
                    self._span_of.popitem(last=False)
            self._bare.set(_Bare(qid, _query_str(event.str_or_query_bundle), tuple(_results(event.nodes)),
                                 _component(rid, "retriever"), qid))
        self._log(event.str_or_query_bundle, event.nodes, logged_as, parent, _component(rid, "retriever"))

    def _query_end(self, event: QueryEndEvent) -> None:
        qid = span_of(event)
        pop(QUERIES, qid)
        self._remember_response(event.response, qid)
        outer = current_query_id()
        if outer is not None:
            written(self, self._store.link_runs, [(qid, outer)])
        else:
            self._set_last(qid)
        nodes = list(getattr(event.response, "source_nodes", None) or [])
        with self._lock:
            decided = self._decided_in.pop(qid, [])
            retrieved = self._retrieved_in.pop(qid, set())
        self._mark_all_cut(decided, retrieved, nodes)
        if nodes:
            read: dict[str, list[str] | None] = {}  # each decision the nodes name, read from the store once

            def ranked(eid: str) -> list[str] | None:
                if eid not in read:
                    read[eid] = self._ranked_in(self._store, eid)
                return read[eid]

            own = self._own_event(nodes, ranked)
            if own is not None or not self._an_inner_querys(qid, event.query, nodes):
                self._log(event.query, nodes, own or f"{qid}/response", qid, "response")
            if own is None:
                self._mark_cut(nodes, ranked)
                self._note_derived(qid, nodes, ranked)
        with self._lock:
            inner = self._inner.pop(qid, [])
            if outer is not None:  # what this query and those inside it logged, for the query around it
                question = _query_str(event.query)
                lists = self._inner.setdefault(outer, [])
                lists.extend((question, ids) for ids in self._logged.get(qid, ()))
                lists.extend(inner)
                while len(self._inner) > KEPT:
                    self._inner.popitem(last=False)

    def _an_inner_querys(self, qid: str, query: Any, nodes: Sequence[NodeWithScore]) -> bool:
        """Whether a query that ran inside query ``qid`` (linked to it) logged these very nodes, in this order, for
        the same question: a router with one selection, or a ``TransformQueryEngine`` that keeps the question,
        returns the inner engine's response as its own, and logging it again as ``<qid>/response`` gave one
        thumbs up on the outer query two feedback rows on one list. A transform that rewrote the question still
        logs the user's own; so does a response of other nodes (a router that combines several engines')."""
        with self._lock:
            return (_query_str(query), _ids(nodes)) in self._inner.get(qid, ())

    def _note_derived(self, qid: str, nodes: Sequence[NodeWithScore],
                      ranked_ids: Callable[[str], list[str] | None]) -> None:
        """Remember, for the response's nodes that are new nodes made from ranked ones (a citation engine's
        sources keep their ranked node's metadata: its event id and rank), which ranked node each came from."""
        for n in nodes:
            meta = n.node.metadata or {}
            eid, rank = meta.get(EVENT_ID_KEY), meta.get("rank")
            if not (isinstance(eid, str) and isinstance(rank, int) and rank >= 1):
                continue
            ranked = ranked_ids(eid) or []
            nid = str(n.node.node_id)
            if rank <= len(ranked) and nid not in ranked:
                with self._lock:
                    self._cut_from[(qid, nid)] = (eid, ranked[rank - 1])
                    while len(self._cut_from) > KEPT:
                        self._cut_from.popitem(last=False)

    def _mark_cut(self, nodes: Sequence[NodeWithScore], ranked_ids: Callable[[str], list[str] | None]) -> None:
        """An rlfb step's nodes some of which a later step cut before the answer (a cutoff, a dedup): those are
        marked unused in its event, so that praise of the answer is not shared with them nor reads them as passed
        over (criticism still gives them the weak share every shown chunk the answer did not use takes)."""
        eid = event_id_of(nodes)
        if eid is None:
            return
        kept = set(_ids(nodes))
        for store in self._stores_of(eid):
            decided = ranked_ids(eid) if store is self._store else self._ranked_in(store, eid)
            cut = [c for c in decided or () if c not in kept]
            if cut and decided is not None and len(cut) < len(decided):
                written(self, store.mark_unused, eid, cut)

    def _stores_of(self, eid: str) -> list[Any]:
        """The stores that hold decision ``eid``: the handler's, and the learner's where that is another file."""
        stores = [self._store, *(e.store for e in self._makers_of([eid]).values())]
        return list(dict.fromkeys(stores))

    def _mark_all_cut(self, decided: Sequence[tuple[str, bool]], retrieved: set[str],
                      nodes: Sequence[NodeWithScore]) -> None:
        """The rlfb decisions made in a query that no node of its response comes from (a later step, a cutoff
        above all of their scores, cut every one): all their nodes are marked unused, so that feedback on the
        answer praises none of them and reads none as passed over. Until 2026-12-05 no node named such a
        decision, so none was marked, and a thumbs up on the answer praised every one.

        A decision made inside a retrieval counts only where the query's retrieval returned its nodes as
        ranked: a ``RecursiveRetriever`` over an rlfb retriever returns the nodes its ranked index nodes point
        to, and the answer used those (``retrieved``: the node ids the query's outermost retrievals returned)."""
        named = {(n.node.metadata or {}).get(EVENT_ID_KEY) for n in nodes}
        kept = set(_ids(nodes))
        for eid, in_retrieval in dict.fromkeys(decided):
            if eid in named:  # its nodes, or new nodes made from them (a citation engine's): _mark_cut's case
                continue
            for store in self._stores_of(eid):
                ranked = self._ranked_in(store, eid)
                if not ranked or kept & set(ranked):  # a later step that drops the metadata keeps the nodes
                    continue
                if in_retrieval and not set(ranked) <= retrieved:  # followed or merged within the retrieval
                    continue
                written(self, store.mark_unused, eid, ranked)

    def _ranked_in(self, store: Any, eid: str) -> list[str] | None:
        """:func:`_ranked_ids`, a log this handler keeps for a locked store counted as logged."""
        kept = kept_log(self, store, eid)
        return kept if kept is not None else _ranked_ids(store, eid)

    def _has_event(self, eid: str) -> bool:
        """Whether the handler's store has event ``eid``, or the handler keeps its log for it."""
        return kept_log(self, self._store, eid) is not None or bool(self._store.has_event(eid))

    def _own_event(self, nodes: Sequence[NodeWithScore],
                   ranked_ids: Callable[[str], list[str] | None] | None = None) -> str | None:
        """The rlfb event these nodes are, as logged: the id they carry, when the store has it with these
        very nodes in this order.

        A document's own ``metadata["event_id"]`` (an incident's, a calendar's) is no rlfb id: taken for
        one, the retrieval was never logged. Nodes an rlfb step returned and a later step cut or reordered
        are not what it logged: the user saw other nodes, so they are logged as a retrieval of their own.
        """
        eid = event_id_of(nodes)
        if eid is None:
            return None
        logged = self._ranked_in(self._store, eid) if ranked_ids is None else ranked_ids(eid)
        return eid if logged is not None and tuple(logged) == _ids(nodes) else None

    def _log(
        self, query: Any, nodes: Sequence[NodeWithScore], event_id: str, parent: str | None, source: str
    ) -> None:
        """Log ``nodes`` under ``event_id`` unless the store or this query already has them."""
        ids = _ids(nodes)
        with self._lock:
            seen = self._logged.setdefault(parent or event_id, [])
            if ids in seen:
                return
            seen.append(ids)
            self._logged.move_to_end(parent or event_id)
            while len(self._logged) > KEPT:
                self._logged.popitem(last=False)
        if self._has_event(event_id):  # an rlfb adapter on this store logged it, with its decision
            return
        written(
            self,
            log_external,
            self._store,
            _query_str(query),
            _results(nodes),
            source=source,
            event_id=event_id,
            parent_id=parent,
            session_id=current_session(),
            metadata={"framework": "llamaindex", "component": source},
        )

    def _remember_learner(self, event: FeedbackRetrievalEvent) -> None:
        if event.learner is not None:
            # weakly, so that an adapter the app dropped is not kept alive here; its ensemble too, which an
            # app that builds an adapter per request around one long-lived ensemble keeps alive
            ensemble = ensemble_of(event.learner)
            ref = (weakref.ref(event.learner), None if ensemble is None else weakref.ref(ensemble))
            with self._lock:
                self._learners[event.event_id] = ref
                while len(self._learners) > KEPT:
                    self._learners.popitem(last=False)
                self._adapters[id(event.learner)] = ref[0]
                self._adapters.move_to_end(id(event.learner))
                while len(self._adapters) > _ADAPTERS:
                    self._adapters.popitem(last=False)
        query, retrievals = current_query_id(), RETRIEVALS.get()
        if query is not None:  # whether the query's response keeps any of its nodes is known at its end
            with self._lock:
                self._decided_in.setdefault(query, []).append((event.event_id, bool(retrievals)))
                while len(self._decided_in) > KEPT:
                    self._decided_in.popitem(last=False)
        if query is None and not retrievals:
            # A decision outside any query or retrieval (``pp.postprocess_nodes(...)`` called by hand): no
            # QueryEnd or RetrievalEnd will make it the latest query id, so do it here, or feedback with no
            # id would go to whatever came before and the learner would never learn.
            self._top_level_decision(event)
            return
        # Inside a query or a retrieval. The learner logged it in its own store, under the query; when an outer
        # retrieval returns a list of its own (a QueryFusionRetriever's), nothing else puts the decision under
        # the query in this store, and feedback by query id would never reach the learner. So copy it now.
        self._copy_decision(event, parent=query)
        if query is None:  # inside a bare retrieval: linked under it when it ends (see _retrieval_end)
            with self._lock:
                self._nested.setdefault(retrievals[0], []).append(event.event_id)
                while len(self._nested) > KEPT:
                    self._nested.popitem(last=False)

    def _top_level_decision(self, event: FeedbackRetrievalEvent) -> None:
        eid = event.event_id
        self._copy_decision(event)
        last, bare, before = self.last_query_id, self._bare.get(), self._decision.get()
        # Both sides are events, which resolve_run never looks below, so a run id above them links them.
        if before is not None and before[1] == last and event.input_event_id == before[0]:
            # It re-ranked what the decision just before it returned (pp2 after pp1): in a query engine the
            # query id stands for both, so it joins that one's query id (made here when it stood alone).
            run = before[1] if before[1] != before[0] else f"{before[0]}/reranked/{eid}"
            written(self, self._store.link_runs, [(before[0], run), (eid, run)])
        elif (bare is not None and bare.latest == last and bare.query == event.query_str
              and set(event.node_ids) <= {cid for cid, _ in bare.results}):
            # It re-ranked the latest bare retrieval: in a query engine the query id stands for both (the
            # candidates are stored, the re-ranking learns). A run id of its own: another re-ranking of the same
            # nodes (a second request served from cached first-stage nodes) is another user's decision, and
            # feedback on one must not rate the other.
            run = f"{bare.id}/reranked/{eid}"
            store, session, at = self._store, current_session(), store_now(self._store)

            def link_or_copy() -> None:  # one write, so that a kept link is tried again with its copy
                if not store.link_runs([(bare.id, run)]):
                    # a run keeps its first parent, an earlier re-ranking's: this one gets a copy of the candidates
                    log_external(store, bare.query, bare.results, source=bare.source, event_id=f"{run}/candidates",
                                 parent_id=run, session_id=session, timestamp=at,
                                 metadata={"framework": "llamaindex", "component": bare.source})

            written(self, link_or_copy)
            written(self, self._store.link_runs, [(eid, run)])
            self._bare.set(bare._replace(latest=run))
        else:
            run = eid  # it stands alone
            with self._lock:  # the span it ran in: a chat turn that raised after it gave no answer to rate
                self._span_of[run] = span_of(event)
                if len(self._span_of) > KEPT:
                    self._span_of.popitem(last=False)
        self._set_last(run)
        self._decision.set((eid, run))

    def _copy_decision(self, event: FeedbackRetrievalEvent, parent: str | None = None) -> None:
        """Log a copy of a learner's decision made on another store, under ``parent``, so this store can resolve
        and rate it (the learner learns from its own store's event: :meth:`record_feedback`)."""
        ens = ensemble_of(event.learner)
        if self._has_event(event.event_id) or ens is None or not ens.store.has_event(event.event_id):
            return
        made = ens.store.event(event.event_id)
        component = (made.get("metadata") or {}).get("component") or "rlfb"
        written(
            self,
            log_external,
            self._store,
            # a learner store that keeps no query text has none to copy: the event's own (this store's mode then
            # decides whether it is kept). Copying None failed, only logged, and the feedback never reached it
            made["query"] if made.get("query") is not None else event.query_str,
            [(c["chunk_id"], c["score"]) for c in made["chunks"]],
            source=component,
            event_id=event.event_id,
            parent_id=parent,
            session_id=made.get("session_id"),
            metadata={"framework": "llamaindex", "component": component},
        )


class _Bare(NamedTuple):
    """The latest bare retrieval of a thread or task, which a re-ranking by hand may re-rank."""

    id: str  # its query id
    query: str
    results: tuple[tuple[str, float | None], ...]  # what it returned, as logged
    source: str  # the retriever, as logged
    latest: str  # the latest query id made of it: its own, or the run of a re-ranking of it


def _query_str(query: Any) -> str:
    if isinstance(query, QueryBundle):
        return query.query_str
    return query if isinstance(query, str) else str(query)


def _results(nodes: Sequence[NodeWithScore]) -> list[tuple[str, float | None]]:
    return [(str(n.node.node_id), finite_or_none(n.score)) for n in nodes]


def _component(span_id: str | None, default: str) -> str:
    """``"VectorIndexRetriever"`` from a span id like ``"VectorIndexRetriever.retrieve-<uuid>"``."""
    if not span_id:
        return default
    return span_id.split(".", 1)[0] or default


def _ids(nodes: Sequence[NodeWithScore]) -> tuple[str, ...]:
    return tuple(str(n.node.node_id) for n in nodes)


def _ranked_ids(store: Any, eid: str) -> list[str] | None:
    """The chunk ids ``store`` logged for event ``eid``, in rank order; ``None`` where it has no such event."""
    try:
        return [c["chunk_id"] for c in store.event(eid)["chunks"]]
    except UnknownEventError:
        return None
