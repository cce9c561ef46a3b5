"""``FeedbackEventHandler``: log what any LlamaIndex query engine retrieved, and take feedback by query id.

It is an event handler on LlamaIndex's instrumentation dispatcher; attach it
once (``handler = FeedbackEventHandler(store="fb.db").attach()``, or
:func:`instrument`) and every query engine, retriever and chat engine in the
process is observed.

* ``QueryStartEvent`` opens a query; its **query id** is the query's span id
  (``"RetrieverQueryEngine.query-<uuid>"``), the id LlamaIndex's own traces
  show. :attr:`FeedbackEventHandler.last_query_id` is the latest top-level
  query (or bare retrieval) in the current thread or asyncio task.
* ``RetrievalEndEvent`` of the outermost retrieval in a query is logged as an
  event (:func:`rlfb.runs.log_external`: its decision is marked ``"external"``,
  so no learner mistakes it for its own) under the retrieval's span id, with
  the query id as its parent. Retrievals nested inside another retrieval (the
  members of a ``QueryFusionRetriever``) are not logged: the outer result is
  what the engine used. A retrieval outside any query is its own query id;
  when rlfb adapters decided inside it, that id is a run above their decisions
  and the retrieval's result (logged as ``"<retrieval span id>/result"``).
* An rlfb re-ranking outside any query
  (``pp.postprocess_nodes(retriever.retrieve(q), query_str=q)``) is the latest
  query id; when it re-ranked the latest bare retrieval, both are linked under
  a new query id of that re-ranking's own
  (``"<retrieval span id>/reranked/<its event id>"``), so feedback reaches both
  retrievals, as it does in a query engine. Each re-ranking of one bare
  retrieval gets a query id of its own (a second request re-ranking cached
  first-stage nodes is not the first request's); a re-ranking of what the
  previous one returned (``pp2.postprocess_nodes(pp1.postprocess_nodes(...))``,
  told by the ``event_id`` its nodes carry) joins that one's query id.
* ``QueryEndEvent`` logs the response's source nodes when they differ from
  everything already logged for the query (a reranker changed them), and
  links a nested query (a sub-question) to the query around it.
* A chat engine's turn (``chat``, ``achat``, ``stream_chat``, ``astream_chat``)
  emits neither: its retrievals are bare ones, and the response its span's exit
  carries names the query ids made under it (:meth:`FeedbackEventHandler.query_id_of`).
* The rlfb adapters (:class:`~llamaindex_rlfb.FeedbackFusionPostprocessor`,
  :class:`~llamaindex_rlfb.FeedbackEnsembleRetriever`) log their own decision,
  with the query id as parent, and emit a :class:`FeedbackRetrievalEvent`; the
  handler remembers which learner made it, so feedback on the query teaches it.
  This holds wherever they run, a retriever nested in a ``QueryFusionRetriever``
  or in a custom retriever included: a decision on a store other than the
  handler's is copied into the handler's store under the query, and feedback
  on the query is stored in the learner's own store too, where it learns.

Feedback: ``handler.record_feedback(query_id, score=1.0)`` (a LangSmith-style
score, ``0`` thumbs down to ``1`` thumbs up), ``rating=`` (1 to 5) or
``signal=`` (``"thumbs_up"``, ``"click"``, ...), optionally about one
``chunk_id`` (a node id). It goes to every retrieval logged under the query
(:func:`rlfb.runs.record_run_feedback`); the learner that made a decision
learns from it. An unknown query id raises :class:`rlfb.errors.UnknownEventError`, as does
``None`` (what ``query_id_of`` gives for a response the handler did not see); leave the id out for the latest.

A session id can ride on LlamaIndex's instrument tags:
``with instrument_tags({"session_id": "s1"}): engine.query(q)`` (a user id goes with
the feedback: ``handler.record_feedback(query_id, score=1.0, user_id="u1")``).

Serialising: ``FeedbackEventHandler(**handler.model_dump())`` (or
``model_validate``) gives a handler on the same SQLite file. An in-memory store
or an ``ensemble=`` cannot be dumped: the dump lists them in ``not_serialised``
and the rebuild raises :class:`rlfb.errors.ValidationError` until they are
passed again (``FeedbackEventHandler(**data, store=store)``).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from contextvars import ContextVar
from pathlib import Path
from typing import Any, NamedTuple

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.query import QueryEndEvent, QueryStartEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent, RetrievalStartEvent
from llama_index.core.instrumentation.events.span import SpanDropEvent
from llama_index.core.instrumentation.span import active_span_id
from llama_index.core.schema import NodeWithScore, QueryBundle

from llamaindex_rlfb._checks import finite_or_none
from llamaindex_rlfb._nodes import EVENT_ID_KEY, event_id_of
from llamaindex_rlfb._spans import (
    QUERIES,
    RETRIEVALS,
    SpanParents,
    current_query_id,
    current_session,
    current_tags,
    pop,
    push,
    span_of,
    task_key,
)
from llamaindex_rlfb._store import MEMORY, check_given_again, open_store, store_path_of
from rlfb.errors import NoStoreError, NotCopyableError, UnknownChunkError, UnknownEventError, ValidationError
from rlfb.runs import (
    EXTERNAL_POLICY,
    SCORE_SCALES,
    key_or_score,
    learns_after_commit,
    log_external,
    maker_of,
    owns_event,
    record_run_feedback,
    same_store,
)

__all__ = [
    "FeedbackEventHandler",
    "FeedbackRetrievalEvent",
    "instrument",
    "current_query_id",
    "current_tags",
    "current_session",
]

_log = logging.getLogger(__name__)

_REMEMBER = 10_000  # queries and learner events kept in memory per handler
_ADAPTERS = 64  # distinct adapters remembered (weakly), to find the maker of a decision older than that


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


# Every rlfb adapter alive in this process (weakly), by id. A decision no handler saw being made (one logged
# before a restart) is learned by a live adapter whose store holds it and who made it (rlfb.runs.owns_event):
# until 2026-12-06 only one the handler had seen deciding in this process, so feedback on a query from before
# a restart, given before the postprocessor's first query, was stored and never learned.
_LIVE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_LIVE_LOCK = threading.Lock()


def remember_adapter(adapter: Any) -> None:
    """Note an rlfb adapter built in this process (weakly: the app keeps it alive, or not)."""
    with _LIVE_LOCK:
        _LIVE[id(adapter)] = adapter


def _live_adapters() -> list[Any]:
    """The rlfb adapters alive in this process, the newest first."""
    with _LIVE_LOCK:
        return list(reversed(list(_LIVE.values())))


class FeedbackRetrievalEvent(BaseEvent):
    """Emitted by the rlfb adapters after their ensemble logged a retrieval event.

    ``learner`` is the adapter that made the decision (it has ``ensemble``,
    ``store`` and ``feedback``); it is left out of serialised dumps.
    ``input_event_id`` is the rlfb event id every node a re-ranking was given
    carried (they were what that decision returned), else ``None``.
    """

    event_id: str
    query_str: str
    node_ids: list[str] = Field(default_factory=list)
    input_event_id: str | None = None  # the rlfb event the nodes it was given came from (all carried its id)
    learner: Any = Field(default=None, exclude=True)

    @classmethod
    def class_name(cls) -> str:
        return "FeedbackRetrievalEvent"


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


class FeedbackEventHandler(BaseEventHandler):
    """Captures retrievals of any LlamaIndex query engine into an rlfb feedback store.

    Parameters
    ----------
    store
        A path to an SQLite file, a :class:`rlfb.store.FeedbackStore`, or
        ``None`` for an in-memory store (nothing kept after the process).
    ensemble
        A learner whose decisions this handler's feedback should teach even
        when it did not see them being made (another process): an
        :class:`rlfb.FeedbackEnsemble` or an adapter holding one. The rlfb
        adapters alive in this process are found on their own, also ones that
        have not decided anything yet (after a restart); feedback on a decision
        no live learner made is stored, with a ``RuntimeWarning`` (once).
    score_scale
        How ``score=`` is read: ``"unit"`` (LangSmith thumbs, 0 to 1; default)
        or ``"signed"`` (-1 to 1).
    store_path, not_serialised
        The dumped form (``model_dump()``): the SQLite file to reopen (instead
        of ``store``), and the arguments the dump could not carry, which must
        be passed again (see the module docstring).

    Examples
    --------
    >>> from llamaindex_rlfb import FeedbackEventHandler
    >>> handler = FeedbackEventHandler()            # in-memory store
    >>> with handler:                               # attached to the root dispatcher inside the block
    ...     pass                                    # engine.query("...") here is captured
    >>> handler.close()
    """

    store_path: str = Field(default=MEMORY, description="Where the feedback store lives.")
    score_scale: str = Field(default="unit", description="How score= is read: 'unit' or 'signed'.")
    not_serialised: list[str] = Field(
        default_factory=list, description="Arguments a dump cannot carry; a rebuild needs them passed again."
    )

    _store: Any = PrivateAttr(default=None)
    _owns_store: bool = PrivateAttr(default=True)
    _ensemble: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _learners: Any = PrivateAttr(default_factory=OrderedDict)  # event id -> weak reference to the adapter
    _adapters: Any = PrivateAttr(default_factory=OrderedDict)  # id -> weak reference, each adapter seen
    _logged: Any = PrivateAttr(default_factory=OrderedDict)  # query id -> node-id lists logged under it
    _dispatchers: list[Any] = PrivateAttr(default_factory=list)
    _last: Any = PrivateAttr(default=None)  # ContextVar: this handler's latest query in the thread or task
    _bare: Any = PrivateAttr(default=None)  # ContextVar: the latest bare retrieval (a _Bare)
    _decision: Any = PrivateAttr(default=None)  # ContextVar: (event id, query id) of the latest top-level decision
    _thread_last: Any = PrivateAttr(default_factory=dict)  # thread id -> (latest query there, its task)
    _handled: Any = PrivateAttr(default_factory=OrderedDict)  # ids of recent events (attached twice: once)
    _nested: Any = PrivateAttr(default_factory=OrderedDict)  # open bare retrieval -> learner events inside it
    _raised: Any = PrivateAttr(default_factory=OrderedDict)  # latest query ids whose query raised
    _spans: Any = PrivateAttr(default=None)  # a SpanParents: the span each recent span ran under
    _span_of: Any = PrivateAttr(default_factory=OrderedDict)  # bare retrieval's query id -> its span
    # (query id, a response node's id) -> (the rlfb decision it was cut from, the ranked node's id): a
    # CitationQueryEngine's sources are new nodes carrying their ranked node's event id and rank
    _cut_from: Any = PrivateAttr(default_factory=OrderedDict)
    # open query id -> (learner event decided in it, whether inside a retrieval), and the node ids its outermost
    # retrievals returned
    _decided_in: Any = PrivateAttr(default_factory=OrderedDict)
    _retrieved_in: Any = PrivateAttr(default_factory=OrderedDict)
    # id(response) -> (a weak reference to it, its query id); by id, as LlamaIndex's Response is an unhashable
    # dataclass; an entry goes with its response
    _responses: Any = PrivateAttr(default_factory=dict)
    _warned_unlearned: bool = PrivateAttr(default=False)  # the warning that feedback taught no learner, given

    def __init__(
        self,
        store: Any = None,
        *,
        ensemble: Any = None,
        score_scale: str = "unit",
        store_path: str | Path | None = None,
        not_serialised: Sequence[str] = (),
    ) -> None:
        from rlfb.store import FeedbackStore

        if score_scale not in SCORE_SCALES:
            raise ValidationError(f"score_scale must be one of {SCORE_SCALES}, got {score_scale!r}")
        if ensemble is not None and _ensemble_of(ensemble) is None and not hasattr(ensemble, "ensemble"):
            # kept silently before: the handler fell back to a store of its own, and taught nothing
            raise ValidationError(
                "ensemble must be an rlfb.FeedbackEnsemble or an rlfb adapter holding one (a "
                f"FeedbackFusionPostprocessor, a FeedbackEnsembleRetriever), got {type(ensemble).__name__}"
            )
        if ensemble is not None and _store_of(ensemble) is None:
            # taken beside a store of the handler's own, feedback on its retrievals was stored and taught nothing
            raise NoStoreError()
        if store is None and ensemble is not None:
            store = _store_of(ensemble)
        # a rebuild from a dump: the store and ensemble it could not carry must come again, never a new store
        check_given_again(self.class_name(), not_serialised, {"store": store is not None,
                                                             "ensemble": ensemble is not None}, from_dict=False)
        handed = store if store is not None and not isinstance(store, (str, os.PathLike)) else None
        store = open_store(store, store_path)
        if store is None:
            store = FeedbackStore(MEMORY)
        path = store_path_of(store)
        lost = []  # what a dump of this handler cannot carry
        if path == MEMORY:
            lost.append("store")
        if ensemble is not None:
            lost.append("ensemble")
        super().__init__(store_path=path, score_scale=score_scale, not_serialised=lost)
        self._store = store
        self._owns_store = store is not handed  # close() closes only a store opened here, not a borrowed one
        self._ensemble = ensemble
        self._last = ContextVar(f"rlfb_llamaindex_last_query_{id(self)}", default=None)
        self._spans = SpanParents()
        self._spans.on_turn_end(self._turn_end)
        self._bare = ContextVar(f"rlfb_llamaindex_bare_retrieval_{id(self)}", default=None)
        self._decision = ContextVar(f"rlfb_llamaindex_top_level_decision_{id(self)}", default=None)

    @classmethod
    def class_name(cls) -> str:
        return "FeedbackEventHandler"

    @property
    def store(self) -> Any:
        """The :class:`rlfb.store.FeedbackStore` events and feedback go to."""
        return self._store

    @property
    def last_query_id(self) -> str | None:
        """Id of the latest top-level query (or bare retrieval) in the current thread or asyncio task."""
        last = self._last.get()
        return None if last is None else last[0]

    def query_id_of(self, response: Any) -> str | None:
        """The query id of a ``response`` a query engine or a chat engine (``chat``, ``achat``, ``stream_chat``,
        ``astream_chat``) returned while this handler was attached, from any thread or task; ``None`` for one it
        did not see (which :meth:`record_feedback` refuses, rather than rate the latest query).

        :attr:`last_query_id` is per thread and asyncio task, so a query run through
        ``asyncio.to_thread`` or a worker pool is not the calling code's latest; the response it
        returned still names its query: ``handler.record_feedback(handler.query_id_of(response), score=1.0)``.
        A chat turn's response names what the turn retrieved (its retrieval's query id, or the run of the rlfb
        re-ranking of it; a turn that made several is their run under the turn's span id); until 2026-12-06 it
        named nothing.
        """
        with self._lock:
            ref, qid = self._responses.get(id(response), (None, None))
        return qid if ref is not None and ref() is response else None

    def _remember_response(self, response: Any, qid: str) -> None:
        """Let ``response`` name its query wherever it is read (:meth:`query_id_of`), as long as it lives."""
        key, responses = id(response), self._responses

        def gone(_: Any) -> None:  # the response was collected: its id may name another object next
            responses.pop(key, None)

        try:
            ref = weakref.ref(response, gone)
        except TypeError:  # a response no weak reference can name (a str from a custom engine)
            return
        with self._lock:
            responses[key] = (ref, qid)

    def _turn_end(self, turn: str, qids: list[str], response: Any) -> None:
        """A chat engine's turn returned ``response``: it names the query ids made under the turn
        (:meth:`query_id_of`), as a query engine's response names its query. A chat turn emits no
        ``QueryStartEvent`` nor ``QueryEndEvent``; its retrievals are bare ones (their own query ids), and its
        span's exit carries the response. Several (a re-ranking's run stands for the retrieval it re-ranked)
        are linked under the turn's span id, which then names them all."""
        try:
            kept = [q for i, q in enumerate(qids) if not any(later.startswith(f"{q}/") for later in qids[i + 1:])]
            if len(kept) > 1:
                self._store.link_runs([(q, turn) for q in kept])
            self._remember_response(response, kept[0] if len(kept) == 1 else turn)
        except Exception:  # never break the user's chat; the dispatcher would swallow it silently
            _log.warning("rlfb could not note the query ids of chat turn %s", turn, exc_info=True)

    def _span_for(self, qid: str) -> str:
        """The span query id ``qid`` began with: a bare retrieval's, the one a re-ranking's run
        (``"<retrieval span id>/reranked/<event id>"``) re-ranked, or the query's own (its id is its span's)."""
        with self._lock:
            span = self._span_of.get(qid)
            base = qid.split("/", 1)[0]
            return span if span is not None else self._span_of.get(base, base)

    def _set_last(self, qid: str) -> None:
        self._spans.note_query(qid, active_span_id.get())  # a chat turn running now made it
        task = task_key()
        self._last.set((qid, task))  # and which task set it: a context copied into another task inherits it
        with self._lock:
            self._thread_last[threading.get_ident()] = (qid, task)

    def _implied_query(self) -> str | None:
        """:attr:`last_query_id`, unless a later query of this thread ran in a task the caller never saw.

        ``asyncio.run(engine.aquery(...))`` and a notebook cell's ``await`` run the query in a
        task of their own, whose latest query the calling code never sees: its ``last_query_id``
        is an earlier query, and feedback meant for the later one would rate it. Rather than
        guess, that is an error asking for the id. A task that ran its own query (a web server's
        request) keeps it: another request's query, in a task of its own, is not its.
        """
        last = self._last.get()
        own, own_task = (None, None) if last is None else last
        here = task_key()
        if own is not None and own_task == here and here is not None:
            return own  # this very task ran it
        with self._lock:
            latest = self._thread_last.get(threading.get_ident())
        if latest is not None and latest[0] != own and latest[1] != here:
            raise ValidationError(
                f"the latest query in this thread ({latest[0]!r}) ran in an asyncio task of its own "
                f"(asyncio.run, a notebook cell's await), and this code's latest is {own!r}: pass the query id "
                "(handler.last_query_id read in that task, or a node's metadata['event_id'])"
            )
        return own

    # ------------------------------------------------------------------ attaching
    def attach(self, dispatcher: Any = None) -> FeedbackEventHandler:
        """Add this handler to ``dispatcher`` (default: the root, which sees all); return it."""
        d = dispatcher if dispatcher is not None else get_dispatcher()
        if not any(h is self for h in d.event_handlers):
            d.add_event_handler(self)
        if not any(h is self._spans for h in d.span_handlers):
            d.add_span_handler(self._spans)
        if not any(x is d for x in self._dispatchers):
            self._dispatchers.append(d)
        return self

    def detach(self) -> None:
        """Remove this handler from every dispatcher it was attached to."""
        for d in self._dispatchers:
            d.event_handlers = [h for h in d.event_handlers if h is not self]
            d.span_handlers = [h for h in d.span_handlers if h is not self._spans]
        self._dispatchers.clear()

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> FeedbackEventHandler:
        # its lock, open queries and store connection (and the ensemble it teaches) cannot be copied: a bare
        # "cannot pickle '_thread.RLock' object" before
        raise NotCopyableError(
            "a FeedbackEventHandler cannot be copied or pickled: it holds its store's connection, the queries it "
            "follows and the learner it teaches; pass the same handler, or rebuild one with "
            "FeedbackEventHandler(**handler.model_dump())"
        )

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__deepcopy__()

    def __enter__(self) -> FeedbackEventHandler:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def close(self) -> None:
        """Detach, and close the store if the handler opened it (from a path, or its own in-memory one).

        A store handed in, or the ensemble's (``ensemble=`` a postprocessor or retriever), belongs to the
        caller and stays open: closing it here broke every later query of that postprocessor.
        """
        self.detach()
        if self._owns_store:
            self._store.close()

    # ------------------------------------------------------------------ events
    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        # One method per event type, found along the class's MRO so subclassed events still match.
        step = next((_STEPS[c] for c in type(event).__mro__ if c in _STEPS), None)
        if step is None:
            return
        eid = getattr(event, "id_", None)
        if eid is not None:  # attached to a dispatcher and to one of its parents, it hears each event twice
            with self._lock:
                if eid in self._handled:
                    return
                self._handled[eid] = None
                if len(self._handled) > _REMEMBER:
                    self._handled.popitem(last=False)
        try:
            step(self, event)
        except Exception:  # never break the user's query; the dispatcher would swallow it silently
            _log.warning("rlfb could not log a %s", type(event).__name__, exc_info=True)

    def _retrieval_start(self, event: RetrievalStartEvent) -> None:
        push(RETRIEVALS, span_of(event))

    def _span_drop(self, event: SpanDropEvent) -> None:
        # a query or retrieval that raised: forget its span
        pop(QUERIES, event.span_id)
        pop(RETRIEVALS, event.span_id)
        last = self.last_query_id
        # the span the latest query began with (its id, or the retrieval a re-ranking's run re-ranked: until
        # 2026-12-06 that run, "<span>/reranked/<event>", was looked up as a span, found none, and a chat turn
        # with an rlfb postprocessor whose LLM raised was rated by feedback naming no query)
        since = None if last is None else self._span_for(last)
        with self._lock:
            self._nested.pop(event.span_id, None)
            self._decided_in.pop(event.span_id, None)
            self._retrieved_in.pop(event.span_id, None)
            if last is not None and (event.span_id in (last, since) or self._spans.above(since, event.span_id)
                                     or self._spans.turn_after(event.span_id, since)):
                # (the last: a chat turn that raised before it retrieved, its condensing LLM or its retriever
                # down, left the latest query on the turn before, and a thumbs down on it rated that good answer)
                # the latest query, or the call its bare retrieval ran in (a chat engine's turn), gave no answer:
                # feedback that names no query must not rate what it retrieved
                self._raised[last] = None
                if len(self._raised) > _REMEMBER:
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
                while len(self._retrieved_in) > _REMEMBER:
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
                self._store.link_runs([(e, rid) for e in dict.fromkeys([*nested, *([own] if own else [])])])
                logged_as, parent = own or f"{rid}/result", rid
            self._set_last(qid)
            with self._lock:
                self._span_of[qid] = rid
                if len(self._span_of) > _REMEMBER:
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
            self._store.link_runs([(qid, outer)])
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
                    read[eid] = _ranked_ids(self._store, eid)
                return read[eid]

            own = self._own_event(nodes, ranked)
            self._log(event.query, nodes, own or f"{qid}/response", qid, "response")
            if own is None:
                self._mark_cut(nodes, ranked)
                self._note_derived(qid, nodes, ranked)

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
                    while len(self._cut_from) > _REMEMBER:
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
            decided = ranked_ids(eid) if store is self._store else _ranked_ids(store, eid)
            cut = [c for c in decided or () if c not in kept]
            if cut and decided is not None and len(cut) < len(decided):
                store.mark_unused(eid, cut)

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
                ranked = _ranked_ids(store, eid)
                if not ranked or kept & set(ranked):  # a later step that drops the metadata keeps the nodes
                    continue
                if in_retrieval and not set(ranked) <= retrieved:  # followed or merged within the retrieval
                    continue
                store.mark_unused(eid, ranked)

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
        logged = _ranked_ids(self._store, eid) if ranked_ids is None else ranked_ids(eid)
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
            while len(self._logged) > _REMEMBER:
                self._logged.popitem(last=False)
        if self._store.has_event(event_id):  # an rlfb adapter on this store logged it, with its decision
            return
        log_external(
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
            ensemble = _ensemble_of(event.learner)
            ref = (weakref.ref(event.learner), None if ensemble is None else weakref.ref(ensemble))
            with self._lock:
                self._learners[event.event_id] = ref
                while len(self._learners) > _REMEMBER:
                    self._learners.popitem(last=False)
                self._adapters[id(event.learner)] = ref[0]
                self._adapters.move_to_end(id(event.learner))
                while len(self._adapters) > _ADAPTERS:
                    self._adapters.popitem(last=False)
        query, retrievals = current_query_id(), RETRIEVALS.get()
        if query is not None:  # whether the query's response keeps any of its nodes is known at its end
            with self._lock:
                self._decided_in.setdefault(query, []).append((event.event_id, bool(retrievals)))
                while len(self._decided_in) > _REMEMBER:
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
                while len(self._nested) > _REMEMBER:
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
            self._store.link_runs([(before[0], run), (eid, run)])
        elif (bare is not None and bare.latest == last and bare.query == event.query_str
              and set(event.node_ids) <= {cid for cid, _ in bare.results}):
            # It re-ranked the latest bare retrieval: in a query engine the query id stands for both (the
            # candidates are stored, the re-ranking learns). A run id of its own: another re-ranking of the same
            # nodes (a second request served from cached first-stage nodes) is another user's decision, and
            # feedback on one must not rate the other.
            run = f"{bare.id}/reranked/{eid}"
            if not self._store.link_runs([(bare.id, run)]):
                # a run keeps its first parent, an earlier re-ranking's: this one gets a copy of the candidates
                log_external(self._store, bare.query, bare.results, source=bare.source,
                             event_id=f"{run}/candidates", parent_id=run, session_id=current_session(),
                             metadata={"framework": "llamaindex", "component": bare.source})
            self._store.link_runs([(eid, run)])
            self._bare.set(bare._replace(latest=run))
        else:
            run = eid  # it stands alone
            with self._lock:  # the span it ran in: a chat turn that raised after it gave no answer to rate
                self._span_of[run] = span_of(event)
                if len(self._span_of) > _REMEMBER:
                    self._span_of.popitem(last=False)
        self._set_last(run)
        self._decision.set((eid, run))

    def _copy_decision(self, event: FeedbackRetrievalEvent, parent: str | None = None) -> None:
        """Log a copy of a learner's decision made on another store, under ``parent``, so this store can resolve
        and rate it (the learner learns from its own store's event: :meth:`record_feedback`)."""
        ens = _ensemble_of(event.learner)
        if self._store.has_event(event.event_id) or ens is None or not ens.store.has_event(event.event_id):
            return
        made = ens.store.event(event.event_id)
        component = (made.get("metadata") or {}).get("component") or "rlfb"
        log_external(
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

    # ------------------------------------------------------------------ feedback
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
    ) -> list[Any]:
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
        together = elsewhere and not learns_after_commit(self._store, qid, here)
        with self._store.exclusive() if together else nullcontext():
            records = record_run_feedback(self._store, qid, ensembles=here, **fb)
            for eid, ens in elsewhere:
                try:
                    records += record_run_feedback(ens.store, eid, ensemble=ens, **fb)
                except UnknownChunkError:
                    # about one chunk its decision did not return (only another member of a fusion found it):
                    # record_run_feedback refuses before writing, and this store has taken the feedback
                    continue
        self._warn_if_unlearned(qid, event_ids, makers)
        derived = None if chunk_id is None else self._cut_from.get((qid, str(chunk_id)))
        if derived is not None and derived[0] in makers and not any(r.event_id == derived[0] for r in records):
            # a node made from a ranked one (a citation engine's source): the click is the ranked node's too
            eid, ranked = derived
            ens = makers[eid]
            again = {**fb, "chunk_id": ranked}
            if again.get("idempotency_key") is not None:  # its own key: the response's row holds the given one
                again["idempotency_key"] = f"{again['idempotency_key']}/ranked"
            records += record_run_feedback(ens.store, eid, ensemble=ens, **again)
        if chunk_id is not None and makers and not any(r.event_id in makers for r in records):
            # stored (on the response the user saw), but no rlfb decision of the query returned that node: a
            # CitationQueryEngine's sources, say, are new nodes cut from the ones ranked. It was silent.
            warnings.warn(
                f"feedback on chunk {chunk_id!r} of query {qid!r} was stored but taught no rlfb learner: none of "
                "the query's rlfb decisions returned that node (a CitationQueryEngine's sources are new nodes); "
                "give the id of a node the rlfb step returned, or feedback on the whole answer",
                RuntimeWarning, stacklevel=2,
            )
        return records

    def _makers_of(self, event_ids: Sequence[str]) -> dict[str, Any]:
        """The ensemble behind each of ``event_ids`` that has one: the learner seen making it in this
        process (or the one the core saw logging it, :func:`rlfb.runs.maker_of`); for a decision older than
        the last :data:`_REMEMBER`, or made before a restart, a live adapter whose store holds it and who made
        it (:func:`rlfb.runs.owns_event`): one seen here, the handler's own ensemble, or any rlfb adapter alive
        in this process (one that has not decided yet since the restart included); else the handler's own
        ensemble. Late feedback was stored and never learned."""
        with self._lock:
            refs = {e: self._learners.get(e) for e in event_ids}
            seen = [r() for r in reversed(self._adapters.values())]
        own = _ensemble_of(self._ensemble)
        candidates: list[Any] | None = None  # the live ensembles, looked up once, for a decision none was seen making
        makers = {}
        for eid, ref in refs.items():
            adapter, ensemble = (None, None) if ref is None else (ref[0](), ref[1] and ref[1]())
            ens = _ensemble_of(adapter) if adapter is not None else ensemble
            if ens is None or ens.store is None:
                ens = maker_of(eid)
            if ens is None or ens.store is None:
                if candidates is None:
                    candidates = _live_ensembles([*seen, own, *_live_adapters()])
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
        own = _ensemble_of(self._ensemble)
        for eid in event_ids:
            learner = makers.get(eid)
            if learner is not None and learner is not own:
                continue  # seen making it, or a live one that holds it and made it (_makers_of)
            event = self._store.event(eid)
            if event.get("policy") == EXTERNAL_POLICY:
                continue  # logged by the handler (or a copy of a decision on another store, learned there)
            if learner is None:  # (an ensemble of no chunks is falsy: compared with None)
                learner = maker_of(eid, self._store)
            if learner is None or not owns_event(learner, event):
                self._warned_unlearned = True
                warnings.warn(
                    f"feedback on query {qid!r} was stored, but no rlfb learner alive in this process learned "
                    f"from it: decision {eid!r} was made by none that holds it (one made before a restart, say, "
                    "whose postprocessor or retriever is not built yet, or a self-indexing postprocessor that "
                    "has not indexed anything yet); build the adapter before giving feedback, pass it as "
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
        return [self._store.event(e) for e in self._store.resolve_run(str(qid))]


class _Bare(NamedTuple):
    """The latest bare retrieval of a thread or task, which a re-ranking by hand may re-rank."""

    id: str  # its query id
    query: str
    results: tuple[tuple[str, float | None], ...]  # what it returned, as logged
    source: str  # the retriever, as logged
    latest: str  # the latest query id made of it: its own, or the run of a re-ranking of it


_STEPS: dict[type, Callable[[FeedbackEventHandler, Any], None]] = {
    QueryStartEvent: FeedbackEventHandler._query_start,
    RetrievalStartEvent: FeedbackEventHandler._retrieval_start,
    RetrievalEndEvent: FeedbackEventHandler._retrieval_end,
    FeedbackRetrievalEvent: FeedbackEventHandler._remember_learner,
    QueryEndEvent: FeedbackEventHandler._query_end,
    SpanDropEvent: FeedbackEventHandler._span_drop,
}


def _ids(nodes: Sequence[NodeWithScore]) -> tuple[str, ...]:
    return tuple(str(n.node.node_id) for n in nodes)


def _ranked_ids(store: Any, eid: str) -> list[str] | None:
    """The chunk ids ``store`` logged for event ``eid``, in rank order; ``None`` where it has no such event."""
    try:
        return [c["chunk_id"] for c in store.event(eid)["chunks"]]
    except UnknownEventError:
        return None


def _ensemble_of(obj: Any) -> Any:
    """The :class:`rlfb.FeedbackEnsemble` of an adapter (or the ensemble itself)."""
    if obj is None:
        return None
    if hasattr(obj, "learner") and hasattr(obj, "feedback") and hasattr(obj, "retriever_names"):
        return obj
    return getattr(obj, "ensemble", None)


def _live_ensembles(adapters: Sequence[Any]) -> list[Any]:
    """The ensembles of ``adapters`` (adapters or ensembles; ``None`` skipped) that have an open store, each
    once, in order."""
    out: dict[int, Any] = {}
    for a in adapters:
        ens = _ensemble_of(a) if a is not None else None
        store = getattr(ens, "store", None)
        if ens is not None and store is not None and not getattr(store, "closed", False):
            out.setdefault(id(ens), ens)
    return list(out.values())


def _store_of(obj: Any) -> Any:
    ens = _ensemble_of(obj)
    # a self-indexing postprocessor builds its ensemble on its first call; its store is there from the start
    return getattr(obj, "store", None) if ens is None else ens.store


def instrument(store: Any = None, *, dispatcher: Any = None, **kwargs: Any) -> FeedbackEventHandler:
    """Build a :class:`FeedbackEventHandler` and attach it to ``dispatcher`` (the root one by default).

    >>> handler = instrument()
    >>> handler.detach(); handler.close()
    """
    return FeedbackEventHandler(store, **kwargs).attach(dispatcher)
