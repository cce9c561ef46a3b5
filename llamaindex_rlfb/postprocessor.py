"""``FeedbackFusionPostprocessor``: re-rank any retriever's nodes with learned fusion weights.

Add it to a query engine you already have::

    pp = FeedbackFusionPostprocessor.from_index(index, store="fb.db", retrievers=("bm25", "dense"), top_n=3)
    engine = index.as_query_engine(similarity_top_k=20, node_postprocessors=[pp])

For the nodes any LlamaIndex retriever returned, the ensemble scores each one
with every rlfb retriever (nodes in its index by id, others from their text,
as is a node whose text changed since it was indexed, say after
``index.insert_nodes`` replaced it: so every node has a BM25 and a dense
score, and a SPLADE one when SPLADE is among the retrievers, of the text the
LLM reads), fuses them with the learned weights and per-chunk
confidence, keeps ``top_n`` and logs the retrieval event. Every node it returns is a copy carrying the event id in
``metadata["event_id"]`` (plus its rank, each retriever's raw score and which
retrievers proposed it; these keys are hidden from the LLM and the embedder,
and replace a node's own keys of the same names, with a warning naming them:
:data:`~llamaindex_rlfb.METADATA_KEYS`).

**Where the corpus comes from.** BM25 needs corpus statistics (IDF, average
length) to score a text, so the ensemble indexes a corpus:

* ``from_index(index)``, ``nodes=`` or ``docstore=``: the query engine's own
  nodes (the recommended set-up; every node the engine can return is in the
  index, so it is scored by id);
* :meth:`from_ensemble`: an :class:`rlfb.FeedbackEnsemble` built elsewhere
  (shared with a LangChain app, loaded from disk, ...); a node whose content
  alone (without the metadata LlamaIndex puts in its text) is what its id was
  indexed with is scored by id;
* nothing (``FeedbackFusionPostprocessor(store="fb.db")``): the postprocessor
  indexes the nodes it is given. The first call indexes them; later nodes it
  has not seen (or has seen with another text) are scored from their text
  with the statistics of the index so far, and once they add up to more than
  a quarter of it they are indexed too, as last seen
  (:meth:`rlfb.FeedbackEnsemble.add_chunks`: only new texts are encoded, and
  other calls score with the index as it was until the new one is complete;
  the learned state stays in the ensemble).

Without a ``store`` events go to an in-memory store: feedback works in the
process, nothing is kept after it.

**Serialising.** ``FeedbackFusionPostprocessor.from_dict(pp.to_dict())`` (or
``from_json(pp.to_json())``) gives a postprocessor on the same SQLite file,
with the same ``top_n``, ``explore``, ``log``, retriever names, policy name and
JSON-able ensemble options; the learned state is in the store. What a dump
cannot carry (an in-memory store, the ``nodes``/``index``/``docstore`` corpus,
an ``ensemble``, retriever or policy objects, options that are objects) is
listed in its ``not_serialised``, and ``from_dict`` raises
:class:`rlfb.errors.ValidationError` until it is passed again:
``FeedbackFusionPostprocessor.from_dict(data, index=index)``. A self-indexing
postprocessor carries no corpus: the rebuilt one indexes the nodes it is given
afresh.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle

from llamaindex_rlfb._checks import flag, positive_count
from llamaindex_rlfb._feedback import adapter_feedback
from llamaindex_rlfb._nodes import (
    corpus_nodes,
    event_id_of,
    hit_to_node,
    nodes_to_chunks,
    warn_if_ids_were_made_anew,
)
from llamaindex_rlfb._store import MEMORY, check_given_again, open_store, store_path_of
from llamaindex_rlfb._threads import in_thread
from llamaindex_rlfb.events import FeedbackRetrievalEvent, current_query_id, current_session, remember_adapter
from rlfb.defaults import ADAPTER_RETRIEVERS, LEARNING_POLICY
from rlfb.ensemble import FeedbackEnsemble, check_settings
from rlfb.errors import CorruptStateError, NoStoreError, UnknownChunkError, UnknownOptionError, ValidationError
from rlfb.types import Chunk, closest_hint

if TYPE_CHECKING:
    from rlfb.store.records import FeedbackRecord

__all__ = ["FeedbackFusionPostprocessor"]

dispatcher = get_dispatcher(__name__)

#: Self-indexing: index the nodes scored from their text once they exceed this fraction of the index.
REINDEX_FRACTION = 0.25


_DEFAULT_RETRIEVERS = ADAPTER_RETRIEVERS  # rlfb.defaults: as LangChain's, so that both share a store
_DEFAULT_POLICY = LEARNING_POLICY


def _open_store(store: Any, store_path: str | None = None) -> Any:
    from rlfb.store import FeedbackStore

    opened = open_store(store, store_path)
    return FeedbackStore(MEMORY) if opened is None else opened


@functools.cache
def _ensemble_options() -> frozenset[str]:
    """The keyword options FeedbackEnsemble.from_chunks takes, less those the postprocessor passes itself."""
    params = {**inspect.signature(FeedbackEnsemble.__init__).parameters,
              **inspect.signature(FeedbackEnsemble.from_chunks).parameters}
    own = {"store", "policy", "retrievers", "chunks"}
    return frozenset(n for n, p in params.items() if p.kind is p.KEYWORD_ONLY and n not in own)


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


class FeedbackFusionPostprocessor(BaseNodePostprocessor):
    """Re-ranks nodes by fusing BM25 and dense (and optionally SPLADE) scores with weights learned from feedback.

    Parameters
    ----------
    store
        A path to the SQLite feedback store, a :class:`rlfb.store.FeedbackStore`,
        or ``None`` (in memory).
    retrievers
        rlfb retriever names (``"bm25"``, ``"dense"``, ``"splade"``) or unindexed instances.
    top_n
        How many nodes to keep.
    policy
        The learning policy: ``"thompson"`` (default), ``"gradient"``, ``"epsilon"``, ``"batch"`` or ``"fixed"``.
        (``None`` for ``retrievers`` or ``policy``: the default.)
    nodes, index, docstore
        At most one: the corpus to index (see the module docstring for none).
    ensemble
        An existing :class:`rlfb.FeedbackEnsemble` (with a store) to re-rank with, its corpus, store, policy
        and learned state, instead of the arguments above (:meth:`from_ensemble`).
    explore
        Let the policy explore; ``False`` gives the greedy ranking (evaluation).
    log
        Log each re-ranking to the store, so feedback can reach it (the default).
        ``False`` for evaluation: nothing is written, and the nodes carry no
        ``event_id``, so no feedback can be given on them.
    callback_manager
        LlamaIndex's, as every postprocessor takes it.
    ensemble_kwargs
        Passed to :class:`rlfb.FeedbackEnsemble`: ``fusion``, ``weights``,
        ``candidate_k``, ``rrf_c``, ``seed``, ``refresh_interval``, ``persist_interval``,
        ``learner_config``, ``members``, ``retriever_options``, ``show_progress``.
    store_path, options, not_serialised
        The dumped form (``to_dict()``): the SQLite file to reopen (instead of
        ``store``), the JSON-able ensemble options, and the arguments the dump
        could not carry, which must be passed again (see the module docstring).

    Examples
    --------
    >>> from llama_index.core.schema import NodeWithScore, TextNode
    >>> nodes = [TextNode(id_="a", text="the aurora is caused by the solar wind"),
    ...          TextNode(id_="b", text="tides follow the moon")]
    >>> pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=1, nodes=nodes)
    >>> [out] = pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="what causes aurora")
    >>> out.node.node_id, out.node.metadata["event_id"] is not None
    ('a', True)
    >>> pp.weights
    {'bm25': 1.0}
    """

    top_n: int = Field(default=3, gt=0, description="How many nodes to keep after re-ranking.")
    explore: bool = Field(default=True, description="Let the policy explore (False: greedy ranking).")
    log: bool = Field(default=True, description="Log each re-ranking to the store (False: evaluation).")
    store_path: str = Field(default=MEMORY, description="The SQLite file of the feedback store.")
    retrievers: list[str] | None = Field(default=None, description="The rlfb retriever names (None: not dumped).")
    policy: str | None = Field(default=None, description="The policy name (None: not dumped).")
    options: dict[str, Any] = Field(default_factory=dict, description="The JSON-able ensemble options.")
    not_serialised: list[str] = Field(
        default_factory=list, description="Arguments a dump cannot carry; from_dict needs them passed again."
    )

    _ensemble: Any = PrivateAttr(default=None)
    _store: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.RLock)
    # self-indexing mode only
    _seen: Any = PrivateAttr(default=None)  # chunk id -> chunk, every node seen so far
    _pending: Any = PrivateAttr(default=None)  # chunk id -> chunk, seen and not indexed yet (as last seen)
    _specs: tuple[Any, ...] = PrivateAttr(default=())
    _built: list[Any] | None = PrivateAttr(default=None)
    _options: dict[str, Any] = PrivateAttr(default_factory=dict)

    def __init__(
        self,
        store: Any = None,
        retrievers: Sequence[Any] | None = None,
        top_n: int = 3,
        policy: Any = None,
        *,
        nodes: Sequence[BaseNode] | None = None,
        index: Any = None,
        docstore: Any = None,
        ensemble: FeedbackEnsemble | None = None,
        explore: bool = True,
        log: bool = True,
        callback_manager: CallbackManager | None = None,
        store_path: str | None = None,
        options: Mapping[str, Any] | None = None,
        not_serialised: Sequence[str] = (),
        **ensemble_kwargs: Any,
    ) -> None:
        # Checked before pydantic (which reads top_n=2.0 as 2 and explore="no" as False, and raises its own
        # error for top_n=0) and before any indexing; _rerank relies on a plain positive int.
        top_n = positive_count(top_n, "top_n")
        explore = flag(explore, "explore")
        log = flag(log, "log")
        ensemble_kwargs = {**(options or {}), **ensemble_kwargs}  # a dump's options; explicit ones win
        ensemble_kwargs.pop("class_name", None)  # every LlamaIndex dump carries it; it is not an ensemble option
        unknown = sorted(set(ensemble_kwargs) - _ensemble_options())
        if unknown:  # now, not at the first query (self-indexing builds the ensemble late) nor saved in a dump
            own = [n for n, prm in inspect.signature(FeedbackFusionPostprocessor.__init__).parameters.items()
                   if prm.kind in (prm.KEYWORD_ONLY, prm.POSITIONAL_OR_KEYWORD)
                   and n not in ("self", "options", "not_serialised")]
            hint = closest_hint(unknown[0], [*own, *_ensemble_options()])  # stor= listed every option but store
            raise UnknownOptionError(
                f"unknown ensemble options {unknown}{hint}; FeedbackFusionPostprocessor takes {sorted(own)}, "
                f"and FeedbackEnsemble {sorted(_ensemble_options())}"
            )
        corpus = {"nodes": nodes, "index": index, "docstore": docstore}
        has_corpus = any(v is not None for v in corpus.values())
        # A rebuild from a dump: what it could not carry must come again, never a silent in-memory store or corpus.
        given = {
            "store": store is not None or ensemble is not None,
            "ensemble": ensemble is not None,
            "retrievers": retrievers is not None,
            "policy": policy is not None,
            **dict.fromkeys(corpus, has_corpus),
            **dict.fromkeys(ensemble_kwargs, True),
        }
        check_given_again(self.class_name(), not_serialised, {n: given.get(n, False) for n in not_serialised})
        manager = callback_manager or CallbackManager()
        if ensemble is not None:
            if not isinstance(ensemble, FeedbackEnsemble):
                got = type(ensemble).__name__
                raise ValidationError(f"ensemble must be an rlfb.FeedbackEnsemble, got {got}")
            if (has_corpus or any(v is not None for v in (store, retrievers, policy))) or ensemble_kwargs:
                raise ValidationError("an ensemble brings its own corpus, store and policy: pass nothing else")
            if ensemble.store is None:
                raise NoStoreError()
            open_store(ensemble.store, store_path)  # raises when a dump's file is not the ensemble's
            # (pydantic's __init__ takes this model's fields; mypy reads the base's, which has none of them)
            super().__init__(top_n=top_n, explore=explore, log=log, callback_manager=manager,  # type: ignore[call-arg]
                             store_path=store_path_of(ensemble.store), not_serialised=["ensemble"])
            self._ensemble = ensemble
            self._store = ensemble.store
            remember_adapter(self)  # a handler finds it for feedback on a decision it made before a restart
            return
        retrievers = _DEFAULT_RETRIEVERS if retrievers is None else retrievers
        policy = _DEFAULT_POLICY if policy is None else policy
        if isinstance(retrievers, str):
            retrievers = (retrievers,)
        # before the store is opened (a refusal left it open until garbage collection), and before the first
        # query where the nodes come with the queries: a bad setting fails here, not in a live query engine
        check_settings(retrievers, policy=policy, **ensemble_kwargs)
        store = _open_store(store, store_path)
        names = [r for r in retrievers if isinstance(r, str)]
        lost = []  # what a dump cannot carry
        if store_path_of(store) == MEMORY:
            lost.append("store")
        lost += [n for n, v in corpus.items() if v is not None]
        if len(names) != len(retrievers):  # retriever objects, not names
            lost.append("retrievers")
        if not isinstance(policy, str):
            lost.append("policy")
        lost += [k for k, v in ensemble_kwargs.items() if not _jsonable(v)]
        super().__init__(  # type: ignore[call-arg]  # this model's fields: mypy reads the base's __init__
            top_n=top_n, explore=explore, log=log, callback_manager=manager, store_path=store_path_of(store),
            retrievers=None if "retrievers" in lost else names, policy=policy if isinstance(policy, str) else None,
            options={k: v for k, v in ensemble_kwargs.items() if k not in lost}, not_serialised=lost,
        )
        self._store = store
        options = {"policy": policy, **ensemble_kwargs}
        if any(v is not None for v in (nodes, index, docstore)):
            indexed = corpus_nodes(index=index, nodes=nodes, docstore=docstore)
            self._ensemble = FeedbackEnsemble.from_chunks(
                nodes_to_chunks(indexed), retrievers=retrievers, store=self._store, **options
            )
            warn_if_ids_were_made_anew(indexed, self._ensemble)
        else:
            self._seen = OrderedDict()
            self._pending = OrderedDict()
            self._specs = tuple(retrievers)
            self._options = options
        remember_adapter(self)  # a handler finds it for feedback on a decision it made before a restart

    @classmethod
    def class_name(cls) -> str:
        return "FeedbackFusionPostprocessor"

    def __setattr__(self, name: str, value: Any) -> None:
        # pydantic checks no assignment: pp.top_n = "3" (a config value, as rerankers are tuned) was a bare
        # TypeError at the next query, and explore = "no" would have been read as true
        if name == "top_n":
            value = positive_count(value, "top_n")
        elif name in ("explore", "log"):
            value = flag(value, name)
        super().__setattr__(name, value)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickling rebuilds from the dumped fields, as from_dict does: the store reopens from store_path, and
        # a corpus, ensemble or in-memory store the pickle could not carry raises ValidationError here.
        # (LlamaIndex's BaseComponent would instead fall back to a bare restore without the ensemble.)
        self.__init__(**state["__dict__"])  # type: ignore[misc]

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_ensemble(
        cls, ensemble: FeedbackEnsemble, top_n: int = 3, *, explore: bool = True, log: bool = True
    ) -> FeedbackFusionPostprocessor:
        """Re-rank with an existing ensemble (its corpus, store, policy and learned state).

        ``explore=False, log=False`` evaluates the learned ranking without writing to the store.
        """
        return cls(ensemble=ensemble, top_n=top_n, explore=explore, log=log)

    @classmethod
    def from_index(cls, index: Any, **kwargs: Any) -> FeedbackFusionPostprocessor:
        """Index the nodes of a LlamaIndex index's docstore (``kwargs``: the constructor's)."""
        if index is None:  # an index that failed to load: the postprocessor silently indexed what it was given
            raise ValidationError("from_index needs an index, got None (to index the nodes each query gives, "
                                  "build FeedbackFusionPostprocessor(...) without one)")
        return cls(index=index, **kwargs)

    # ------------------------------------------------------------------ state
    @property
    def ensemble(self) -> FeedbackEnsemble | None:
        """The rlfb ensemble (``None`` until the first call when it indexes the nodes it sees)."""
        return self._ensemble

    @property
    def store(self) -> Any:
        """The :class:`rlfb.store.FeedbackStore` events and feedback go to."""
        return self._store

    @property
    def weights(self) -> dict[str, float]:
        """The current global fusion weights, ``{retriever name: weight}`` (reloaded when the store has newer).

        A query type with clear evidence of its own is ranked with its own weights, which can move while
        these stay put: ``postprocessor.ensemble.weights_for(query)``.
        """
        if self._ensemble is not None:
            return self._ensemble.weights
        from rlfb.learner import Learner  # self-indexing, before the first call: what the first build loads

        names = [s if isinstance(s, str) else s.name for s in self._specs]
        learner = Learner(names, policy=self._options["policy"], weights=self._options.get("weights"),
                          config=self._options.get("learner_config"), seed=self._options.get("seed", 0))
        # this policy's newest snapshot this learner can take: one of other retrievers or another chunk
        # exploration on a shared store is not this one's, and the first build pages back past it too
        if self._options.get("weights") is not None:
            return learner.weights()  # weights given win over the store's at the first build (and are written)
        saved = self._store.load_policy_state(policy=learner.policy_name)
        while saved is not None:
            try:
                learner.load_state_dict(saved["state"])
                break
            except CorruptStateError:
                saved = self._store.load_policy_state(policy=learner.policy_name, before=int(saved["version"]))
        return learner.weights()  # with no snapshot of its own: the default weights, as the first build starts

    def feedback(
        self,
        event_id: Any,
        signal: str | float | None = None,
        *,
        score: float | bool | None = None,
        rating: float | None = None,
        value: float | None = None,
        chunk_id: str | None = None,
        **kwargs: Any,
    ) -> list[FeedbackRecord]:
        """Feedback on a re-ranking (a node's ``metadata["event_id"]``) or on a query id above it; it learns.

        Give a ``signal`` (``"thumbs_up"``, ``"explicit_negative"``, ``"click"``, ...),
        a LangSmith-style ``score`` (0 to 1; a number second is the score, as the
        handler's ``record_feedback(query_id, 1.0)`` takes it), a ``rating`` (1 to 5) or a raw
        ``value`` in [-1, 1]. ``kwargs``: ``timestamp``, ``session_id``,
        ``user_id``, ``idempotency_key``, ``comment``, ``key``. Returns the
        stored :class:`~rlfb.store.FeedbackRecord` of each retrieval rated.
        """
        return adapter_feedback(self._store, event_id, signal, ensemble=self._ensemble, score=score,
                                rating=rating, value=value, chunk_id=chunk_id, **kwargs)

    # ------------------------------------------------------------------ LlamaIndex hook
    def _postprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
    ) -> list[NodeWithScore]:
        out, decided = self._reranked(nodes, query_bundle)
        if decided is not None:
            dispatcher.event(decided)
        return out

    async def _apostprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
    ) -> list[NodeWithScore]:
        # The core is synchronous (numpy, SQLite), so it runs in a thread; but the decision is announced from
        # this task: a handler keeps the latest query id in the task's context, and a thread's copy is lost.
        out, decided = await in_thread(self._reranked, nodes, query_bundle)
        if decided is not None:
            dispatcher.event(decided)
        return out

    def _reranked(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None,
        cancelled: threading.Event | None = None,
    ) -> tuple[list[NodeWithScore], FeedbackRetrievalEvent | None]:
        """The re-ranked nodes, and the event announcing the logged decision (``None``: nothing logged).

        Once ``cancelled`` is set (the async caller is gone), nothing is ranked after the scoring: no nodes.
        """
        if query_bundle is None:
            raise ValidationError("the postprocessor needs the query: give query_bundle or query_str")
        if not nodes:
            return [], None
        for n in nodes:  # a bare AttributeError ('TextNode' object has no attribute 'node') before
            if not isinstance(n, NodeWithScore):
                hint = " (wrap nodes as NodeWithScore(node=...))" if isinstance(n, BaseNode) else ""
                raise ValidationError(f"expected a list of NodeWithScore, got {type(n).__name__}{hint}")
        query = query_bundle.query_str
        originals: dict[str, BaseNode] = {}
        for n in nodes:
            originals.setdefault(str(n.node.node_id), n.node)
        chunks = nodes_to_chunks(originals.values())
        if self._seen is None:  # a corpus given (not self-indexing, which indexes the texts as given)
            chunks = self._content_as_indexed(chunks, originals)
        dispatcher.event(ReRankStartEvent(query=query_bundle, nodes=nodes, top_n=self.top_n,
                                          model_name=self.class_name()))
        with self.callback_manager.event(
            CBEventType.RERANKING,
            payload={EventPayload.NODES: nodes, EventPayload.MODEL_NAME: self.class_name(),
                     EventPayload.QUERY_STR: query, EventPayload.TOP_K: self.top_n},
        ) as cb_event:
            result = self._rerank(query, chunks, query_bundle.custom_embedding_strs, cancelled)
            out = [] if result is None else [hit_to_node(h, result.event_id, originals[h.chunk_id])
                                             for h in result.hits]
            cb_event.on_end(payload={EventPayload.NODES: out})
        dispatcher.event(ReRankEndEvent(nodes=out))
        if result is None or result.event_id is None:
            return out, None
        # the event id the given nodes carry, when they are one rlfb decision's: a re-ranking of a re-ranking
        return out, FeedbackRetrievalEvent(event_id=result.event_id, query_str=query,
                                           node_ids=[h.chunk_id for h in result.hits],
                                           input_event_id=event_id_of(nodes), learner=self)

    def _content_as_indexed(self, chunks: list[Chunk], originals: Mapping[str, BaseNode]) -> list[Chunk]:
        """``chunks``, each one the ensemble indexed from the node's content alone given with that text.

        A chunk whose text differs from the one its id was indexed with is scored from its own text (an edited
        node: :meth:`rlfb.FeedbackEnsemble.rerank`). An ensemble built from plain texts (shared with a LangChain
        app, loaded from disk) indexed the content without the metadata LlamaIndex puts in a node's text: that
        node is not edited, and is scored by id, as before.
        """
        ens = self._ensemble
        out = []
        for c in chunks:
            try:
                indexed = ens.chunk(c.id).text
            except UnknownChunkError:  # outside the index: scored from its text
                indexed = None
            if (indexed is not None and indexed != c.text
                    and indexed == originals[c.id].get_content(metadata_mode=MetadataMode.NONE)):
                c = Chunk(c.id, indexed, c.metadata)
            out.append(c)
        return out

    def _rerank(
        self, query: str, chunks: list[Any], embedding_strs: list[str] | None = None,
        cancelled: threading.Event | None = None,
    ) -> Any:
        """The ensemble's re-ranking of ``chunks`` (ids unique), logged; ``None`` once ``cancelled`` is set."""
        ens = self._ensemble if self._seen is None else self._indexed(chunks)
        return self._scored_and_ranked(ens, query, chunks, embedding_strs, cancelled)

    def _scored_and_ranked(
        self, ens: FeedbackEnsemble, query: str, chunks: list[Any], embedding_strs: list[str] | None,
        cancelled: threading.Event | None,
    ) -> Any:
        # ens.rerank in its two steps: the scoring (the slow part) and the decision it logs, so that a cancelled
        # apostprocess_nodes can stop in between
        ctx = ens.rerank_context(query, chunks, session_id=current_session(),
                                 embedding_strs=embedding_strs)  # a HyDE transform's text, for the dense scores
        if cancelled is not None and cancelled.is_set():
            # nobody will see this ranking: logged, it would be the session's "previous retrieval" for the next
            # question to be a reformulation of, and a decision nobody rates
            return None
        return ens.rank_context(
            ctx,
            min(self.top_n, len(chunks)),
            explore=self.explore,
            log=self.log,
            parent_id=current_query_id(),
            metadata={"framework": "llamaindex", "component": self.class_name()},
        )

    def _indexed(self, chunks: Sequence[Chunk]) -> FeedbackEnsemble:
        """Self-indexing: the ensemble to score ``chunks`` with, after indexing what they add when it is due.

        ``self._lock`` guards the bookkeeping alone and is never held while the store is used or an index is
        built: a caller inside ``store.exclusive()`` waiting for it while its holder waits for the store would
        wait for ever. So calls are not serialised: a re-index builds updated copies of the retrievers
        (:meth:`rlfb.FeedbackEnsemble.add_chunks`) while other calls score with the index as it was, and the
        learned state never leaves the ensemble. Two first calls at once may each build an ensemble: the first
        built is kept, and the other call's nodes are added to it.
        """
        with self._lock:
            # a node seen before with another text (its document was edited and re-ingested under the same id)
            # is new too: indexed as it is now, where its feedback history stays with its id; until then the
            # ensemble scores it from the text given (FeedbackEnsemble.rerank), not the one it was indexed with
            for c in chunks:
                if c.id not in self._seen or self._seen[c.id].text != c.text:
                    self._seen[c.id] = c
                    self._pending[c.id] = c
            ens = self._ensemble
            if ens is not None and len(self._pending) <= REINDEX_FRACTION * len(ens):
                return ens  # the new ones are scored from their text with the current statistics
            # a first build takes every node seen: a racing first call may have taken this call's from pending
            batch = list(self._pending.values() if ens is not None else self._seen.values())
            self._pending.clear()
            templates = self._templates()
        try:
            if ens is None:
                # copies of the unindexed templates (which share a loaded model): a racing first build indexes
                # its own
                built = FeedbackEnsemble.from_chunks(
                    batch, retrievers=[copy.copy(t) for t in templates], store=self._store, **self._build_options()
                )
                with self._lock:
                    if self._ensemble is None:
                        self._ensemble = built
                        self._requeue_edited(batch)
                        return built
                    ens = self._ensemble  # another call's first build came first: these nodes go into it
            ens.add_chunks(batch)
        except BaseException:
            with self._lock:  # not indexed: the next call that finds a re-index due tries them again
                for c in batch:
                    self._pending.setdefault(c.id, self._seen[c.id])
            raise
        with self._lock:
            self._requeue_edited(batch)
        return ens

    def _requeue_edited(self, batch: Sequence[Chunk]) -> None:
        """Queue again each node of an indexed ``batch`` seen since with another text (call under ``self._lock``).

        Two re-indexes reach the ensemble in either order: an older batch applied last put a node's old text back
        in the index, and the newer text, already taken from the queue, was never indexed.
        """
        for c in batch:
            newest = self._seen[c.id]
            if newest is not c:
                self._pending.setdefault(c.id, newest)

    def _templates(self) -> list[Any]:
        """The retrievers to index copies of, made once (so that a dense model is loaded once); call under
        ``self._lock``."""
        if self._built is None:
            from rlfb.retrievers import make_retriever

            options = self._options.get("retriever_options") or {}
            self._built = [make_retriever(s, **options.get(s, {})) if isinstance(s, str) else s
                           for s in self._specs]
        return self._built

    def _build_options(self) -> dict[str, Any]:
        """The options the ensemble is built with (``retriever_options`` went to the templates)."""
        return {k: v for k, v in self._options.items() if k != "retriever_options"}
