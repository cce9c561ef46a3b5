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

The handler is assembled here from its parts, a module each: the query ids it hands out and reads back
(``_queries``), what it does with each event and logs in its store (``_capture``) and feedback by query id
(``_feedback``); the rlfb adapters it can teach are found through ``_learners``, the queries, retrievals and
spans open in a thread or task through ``_spans``.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.query import QueryEndEvent, QueryStartEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent, RetrievalStartEvent
from llama_index.core.instrumentation.events.span import SpanDropEvent

from llamaindex_rlfb._capture import Capture
from llamaindex_rlfb._feedback import HandlerFeedback
from llamaindex_rlfb._kept import drop_kept, write_kept, written
from llamaindex_rlfb._learners import ensemble_of, store_of
from llamaindex_rlfb._learners import remember_adapter as remember_adapter  # the adapters import it from here
from llamaindex_rlfb._queries import QueryIds
from llamaindex_rlfb._spans import KEPT, SpanParents, current_query_id, current_session, current_tags
from llamaindex_rlfb._store import MEMORY, check_given_again, open_store, store_path_of
from rlfb.errors import NoStoreError, NotCopyableError, StoreBusyError, ValidationError
from rlfb.runs import SCORE_SCALES

__all__ = [
    "FeedbackEventHandler",
    "FeedbackRetrievalEvent",
    "instrument",
    "current_query_id",
    "current_tags",
    "current_session",
]

_log = logging.getLogger(__name__)


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


class FeedbackEventHandler(QueryIds, Capture, HandlerFeedback, BaseEventHandler):
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
    _inner: Any = PrivateAttr(default_factory=OrderedDict)  # query id -> (question, node ids) its inner queries logged
    _dispatchers: list[Any] = PrivateAttr(default_factory=list)
    _last: Any = PrivateAttr(default=None)  # ContextVar: this handler's latest query in the thread or task
    _bare: Any = PrivateAttr(default=None)  # ContextVar: the latest bare retrieval (a _Bare)
    _decision: Any = PrivateAttr(default=None)  # ContextVar: (event id, query id) of the latest top-level decision
    _thread_last: Any = PrivateAttr(default_factory=OrderedDict)  # thread id -> (latest query there, its task)
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
    # (write, args, kwargs) a locked store refused, oldest first, and the lock of the one thread writing them
    # (llamaindex_rlfb._kept)
    _unwritten: Any = PrivateAttr(default_factory=deque)
    _kept_lock: Any = PrivateAttr(default_factory=threading.Lock)

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
        if ensemble is not None and ensemble_of(ensemble) is None and not hasattr(ensemble, "ensemble"):
            # kept silently before: the handler fell back to a store of its own, and taught nothing
            raise ValidationError(
                "ensemble must be an rlfb.FeedbackEnsemble or an rlfb adapter holding one (a "
                f"FeedbackFusionPostprocessor, a FeedbackEnsembleRetriever), got {type(ensemble).__name__}"
            )
        if ensemble is not None and store_of(ensemble) is None:
            # taken beside a store of the handler's own, feedback on its retrievals was stored and taught nothing
            raise NoStoreError()
        if store is None and ensemble is not None:
            store = store_of(ensemble)
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
        # pydantic's __init__ takes this model's fields; mypy reads BaseEventHandler's, which has none of them
        super().__init__(store_path=path, score_scale=score_scale, not_serialised=lost)  # type: ignore[call-arg]
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
        try:
            write_kept(self)  # what a locked store refused, before its connection goes
        except StoreBusyError:
            if self._owns_store:  # closed below: nothing could write them later
                warnings.warn(f"rlfb: {drop_kept(self)} log(s) kept while the feedback store was locked were not "
                              "written at close: it is locked still", RuntimeWarning, stacklevel=2)
            else:  # the caller's store stays open: the process's exit tries again
                warnings.warn(f"rlfb: {len(self._unwritten)} log(s) kept while the feedback store was locked "
                              "are not written yet: it is locked still; the process's exit tries again",
                              RuntimeWarning, stacklevel=2)
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
                if len(self._handled) > KEPT:
                    self._handled.popitem(last=False)
        try:
            step(self, event)
        except Exception:  # never break the user's query; the dispatcher would swallow it silently
            _log.warning("rlfb could not log a %s", type(event).__name__, exc_info=True)

    def _turn_end(self, turn: str, qids: list[str], response: Any) -> None:
        """A chat engine's turn returned ``response``: it names the query ids made under the turn
        (:meth:`query_id_of`), as a query engine's response names its query. A chat turn emits no
        ``QueryStartEvent`` nor ``QueryEndEvent``; its retrievals are bare ones (their own query ids), and its
        span's exit carries the response. Several (a re-ranking's run stands for the retrieval it re-ranked)
        are linked under the turn's span id, which then names them all."""
        try:
            kept = [q for i, q in enumerate(qids) if not any(later.startswith(f"{q}/") for later in qids[i + 1:])]
            if len(kept) > 1:
                written(self, self._store.link_runs, [(q, turn) for q in kept])
            self._remember_response(response, kept[0] if len(kept) == 1 else turn)
        except Exception:  # never break the user's chat; the dispatcher would swallow it silently
            _log.warning("rlfb could not note the query ids of chat turn %s", turn, exc_info=True)


_STEPS: dict[type, Callable[[FeedbackEventHandler, Any], None]] = {
    QueryStartEvent: FeedbackEventHandler._query_start,
    RetrievalStartEvent: FeedbackEventHandler._retrieval_start,
    RetrievalEndEvent: FeedbackEventHandler._retrieval_end,
    FeedbackRetrievalEvent: FeedbackEventHandler._remember_learner,
    QueryEndEvent: FeedbackEventHandler._query_end,
    SpanDropEvent: FeedbackEventHandler._span_drop,
}


def instrument(store: Any = None, *, dispatcher: Any = None, **kwargs: Any) -> FeedbackEventHandler:
    """Build a :class:`FeedbackEventHandler` and attach it to ``dispatcher`` (the root one by default).

    >>> handler = instrument()
    >>> handler.detach(); handler.close()
    """
    return FeedbackEventHandler(store, **kwargs).attach(dispatcher)
