"""LlamaIndex adapter of rlfb: learning by adding one postprocessor to a query engine you already have.

* :class:`FeedbackFusionPostprocessor` re-ranks the nodes of any LlamaIndex
  retriever with BM25 and dense scores (SPLADE too, if asked) fused by learned weights, and
  logs the retrieval for feedback.
* :class:`FeedbackEnsembleRetriever` is the whole rlfb ensemble as a
  LlamaIndex retriever (``from_defaults(index=|nodes=|docstore=)``).
* :class:`FeedbackEventHandler` captures what any query engine retrieved
  through LlamaIndex's instrumentation, and takes feedback by query id.

What is learned, ranked and stored lives in :mod:`rlfb`; this package converts between LlamaIndex's nodes and
rlfb's chunks, and keeps what only LlamaIndex's instrumentation tells: the spans open in each thread or task (so
that feedback by query id finds every retrieval a query made) and the live adapters that learn from it.
"""

from __future__ import annotations

from rlfb._extras import missing_framework

try:
    from llamaindex_rlfb._nodes import EVENT_ID_KEY, METADATA_KEYS, hit_to_node, node_to_chunk
    from llamaindex_rlfb.events import (
        FeedbackEventHandler,
        FeedbackRetrievalEvent,
        current_query_id,
        instrument,
    )
    from llamaindex_rlfb.postprocessor import FeedbackFusionPostprocessor
    from llamaindex_rlfb.retriever import FeedbackEnsembleRetriever
except ModuleNotFoundError as exc:  # the extra is not installed: say which
    missing_framework(exc, module="llama_index", package="llamaindex_rlfb", framework="LlamaIndex", extra="llamaindex")

__all__ = [
    "FeedbackFusionPostprocessor",
    "FeedbackEnsembleRetriever",
    "FeedbackEventHandler",
    "FeedbackRetrievalEvent",
    "instrument",
    "current_query_id",
    "EVENT_ID_KEY",
    "METADATA_KEYS",
    "hit_to_node",
    "node_to_chunk",
]
