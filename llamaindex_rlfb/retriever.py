"""``FeedbackEnsembleRetriever``: the whole rlfb ensemble as a LlamaIndex retriever.

Like ``BM25Retriever`` of ``llama-index-retrievers-bm25``, it is built with
``from_defaults(index=... | nodes=... | docstore=...)`` (exactly one). It
retrieves with every rlfb retriever over its own index, fuses with the learned
weights, logs the retrieval event and returns the original nodes (copies) with
the fused score and the event id in ``metadata["event_id"]``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.constants import DEFAULT_SIMILARITY_TOP_K
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle

from llamaindex_rlfb._checks import flag, positive_count
from llamaindex_rlfb._feedback import adapter_feedback
from llamaindex_rlfb._nodes import corpus_nodes, hit_to_node, node_text, nodes_to_chunks, warn_if_ids_were_made_anew
from llamaindex_rlfb._threads import in_thread
from llamaindex_rlfb.events import FeedbackRetrievalEvent, current_query_id, current_session, remember_adapter
from rlfb.defaults import ADAPTER_RETRIEVERS, LEARNING_POLICY
from rlfb.ensemble import FeedbackEnsemble
from rlfb.errors import NoStoreError, ValidationError

if TYPE_CHECKING:
    from rlfb.store.records import FeedbackRecord

__all__ = ["FeedbackEnsembleRetriever"]

dispatcher = get_dispatcher(__name__)


class FeedbackEnsembleRetriever(BaseRetriever):
    """Retrieves with an :class:`rlfb.FeedbackEnsemble` whose fusion weights learn from feedback.

    Parameters
    ----------
    ensemble
        The ensemble; it must have a feedback store.
    similarity_top_k
        How many nodes to return.
    nodes
        The original nodes by id, returned (copied) for the hits; chunks
        without one come back as ``TextNode``.
    explore
        Let the policy explore; ``False`` gives the greedy ranking (evaluation).
    log
        Log each retrieval to the store (``False`` with ``explore=False`` evaluates without writing
        anything; the nodes then carry no ``event_id``).
    callback_manager, objects, object_map, verbose
        Passed to LlamaIndex's ``BaseRetriever``, as every retriever takes them.

    Examples
    --------
    >>> from llama_index.core.schema import TextNode
    >>> retriever = FeedbackEnsembleRetriever.from_defaults(
    ...     nodes=[TextNode(id_="a", text="the aurora is caused by the solar wind"),
    ...            TextNode(id_="b", text="tides follow the moon")],
    ...     retrievers=("bm25",), similarity_top_k=1)
    >>> [hit] = retriever.retrieve("what causes aurora")
    >>> hit.node.node_id
    'a'
    >>> retriever.feedback(hit.node.metadata["event_id"], "thumbs_up")[0].reward
    1.0
    """

    def __init__(
        self,
        ensemble: FeedbackEnsemble,
        similarity_top_k: int = DEFAULT_SIMILARITY_TOP_K,
        *,
        nodes: dict[str, BaseNode] | None = None,
        explore: bool = True,
        log: bool = True,
        callback_manager: CallbackManager | None = None,
        objects: list[Any] | None = None,
        object_map: dict | None = None,
        verbose: bool = False,
    ) -> None:
        if not isinstance(ensemble, FeedbackEnsemble):
            raise ValidationError(f"ensemble must be an rlfb.FeedbackEnsemble, got {type(ensemble).__name__}")
        if ensemble.store is None:
            raise NoStoreError()
        self.ensemble = ensemble
        self.similarity_top_k = positive_count(similarity_top_k, "similarity_top_k")
        self.explore = flag(explore, "explore")  # bool("no") would be True: a typo must not turn exploring on
        self.log = flag(log, "log")
        self._nodes = dict(nodes or {})
        # an update of the index and of the nodes kept beside it, one at a time: two inserts of one id could
        # leave the index with one's text and the nodes with the other's, for every later retrieval
        self._nodes_lock = threading.Lock()
        super().__init__(
            callback_manager=callback_manager, object_map=object_map, objects=objects, verbose=verbose
        )
        remember_adapter(self)  # a handler finds it for feedback on a decision it made before a restart

    @classmethod
    def class_name(cls) -> str:
        return "FeedbackEnsembleRetriever"

    @classmethod
    def from_defaults(
        cls,
        index: Any = None,
        nodes: Sequence[BaseNode] | None = None,
        docstore: Any = None,
        *,
        retrievers: Sequence[Any] = ADAPTER_RETRIEVERS,
        store: Any = None,
        similarity_top_k: int = DEFAULT_SIMILARITY_TOP_K,
        policy: Any = LEARNING_POLICY,
        explore: bool = True,
        log: bool = True,
        callback_manager: CallbackManager | None = None,
        **ensemble_kwargs: Any,
    ) -> FeedbackEnsembleRetriever:
        """Index exactly one of ``index`` (its docstore), ``nodes`` or ``docstore`` with rlfb's retrievers.

        ``store`` is a path, a :class:`rlfb.store.FeedbackStore` or ``None``
        (in memory); ``policy`` learns the weights (``"thompson"`` by default, as the postprocessor's);
        ``ensemble_kwargs`` go to :class:`rlfb.FeedbackEnsemble`
        (``fusion``, ``weights``, ``candidate_k``, ``seed``, ``refresh_interval``, ...).
        """
        from llamaindex_rlfb.postprocessor import _open_store

        similarity_top_k = positive_count(similarity_top_k, "similarity_top_k")  # before indexing the corpus
        explore = flag(explore, "explore")
        log = flag(log, "log")
        corpus = corpus_nodes(index=index, nodes=nodes, docstore=docstore)
        ens = FeedbackEnsemble.from_chunks(
            nodes_to_chunks(corpus), retrievers=retrievers, store=_open_store(store), policy=policy,
            **ensemble_kwargs,
        )
        warn_if_ids_were_made_anew(corpus, ens)
        by_id: dict[str, BaseNode] = {}
        for node in corpus:
            by_id.setdefault(str(node.node_id), node)
        return cls(ens, similarity_top_k, nodes=by_id, explore=explore, log=log, callback_manager=callback_manager)

    def insert_nodes(self, nodes: Sequence[BaseNode]) -> None:
        """Index more nodes, as an index's ``insert_nodes``; a node whose id is indexed replaces it.

        See :meth:`rlfb.FeedbackEnsemble.add_chunks`.
        """
        nodes = list(nodes)
        chunks = nodes_to_chunks(nodes)  # validates; a node id given twice keeps its first
        first: dict[str, BaseNode] = {}
        for node in nodes:
            first.setdefault(str(node.node_id), node)
        with self._nodes_lock:
            self.ensemble.add_chunks(chunks)
            self._nodes.update(first)

    def delete_nodes(self, node_ids: Sequence[str]) -> None:
        """Remove the nodes with these ids from the index (:meth:`rlfb.FeedbackEnsemble.delete_chunks`)."""
        if isinstance(node_ids, str):
            raise ValidationError("node_ids must be a sequence of ids, not one string")
        node_ids = [str(n) for n in node_ids]
        with self._nodes_lock:
            self.ensemble.delete_chunks(node_ids)  # an unknown id is an error, and nothing is removed
            for nid in node_ids:
                self._nodes.pop(nid, None)

    @property
    def weights(self) -> dict[str, float]:
        """The current global fusion weights, ``{retriever name: weight}``.

        A query type with clear evidence of its own is ranked with its own weights, which can move while
        these stay put: ``retriever.ensemble.weights_for(query)``.
        """
        return self.ensemble.weights

    @property
    def store(self) -> Any:
        return self.ensemble.store

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
        """Feedback on a retrieval (a node's ``metadata["event_id"]``) or a query id above it; it learns.

        As :meth:`llamaindex_rlfb.FeedbackFusionPostprocessor.feedback`.
        """
        return adapter_feedback(self.ensemble.store, event_id, signal, ensemble=self.ensemble, score=score,
                                rating=rating, value=value, chunk_id=chunk_id, **kwargs)

    # ------------------------------------------------------------------ LlamaIndex hooks
    def _retrieve(
        self, query_bundle: QueryBundle, cancelled: threading.Event | None = None
    ) -> list[NodeWithScore]:
        ens = self.ensemble
        # the attributes checked again: one set after construction (retriever.similarity_top_k = "3") is a
        # named error, not a TypeError from deep inside
        k = positive_count(self.similarity_top_k, "similarity_top_k")
        explore, log = flag(self.explore, "explore"), flag(self.log, "log")
        # the slow part (encoding, scoring) before the decision, so a cancelled aretrieve can stop in between
        ctx = ens.context(query_bundle.query_str, session_id=current_session(), k=k,
                          embedding_strs=query_bundle.custom_embedding_strs)  # a HyDE transform's text (dense)
        if cancelled is not None and cancelled.is_set():
            # nobody will see this ranking: logged, it would be the session's "previous retrieval" for the next
            # question to be a reformulation of, and a decision nobody rates
            return []
        result = ens.rank_context(
            ctx,
            k,
            explore=explore,
            log=log,
            parent_id=current_query_id(),
            metadata={"framework": "llamaindex", "component": self.class_name()},
        )
        out = [hit_to_node(h, result.event_id, self._original(h)) for h in result.hits]
        if result.event_id is not None:
            dispatcher.event(FeedbackRetrievalEvent(event_id=result.event_id, query_str=result.query,
                                                    node_ids=result.chunk_ids, learner=self))
        return out

    def _original(self, hit: Any) -> BaseNode | None:
        """The node kept for ``hit``, if it holds the text the hit was scored on; else ``None`` (a node is built
        from the hit). Scored on the index before an insert swapped in an edited node, or after, a retrieval
        returned the other text with this one's rank and scores: the LLM read what nobody ranked."""
        node = self._nodes.get(hit.chunk_id)
        return node if node is not None and node_text(node) == hit.text else None

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await in_thread(self._retrieve, query_bundle)
