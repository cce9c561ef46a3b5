"""LangChain adapter of rlfb: a drop-in retriever that learns its fusion weights, and a feedback handler.

* :class:`FeedbackEnsembleRetriever` wraps an :class:`rlfb.FeedbackEnsemble` as a
  LangChain ``BaseRetriever``; LangChain retrievers and vector stores can join
  it as ensemble members (:func:`as_member`).
* :class:`FeedbackCallbackHandler` logs what any retriever returned, keyed by
  LangChain's run id, and records LangSmith-style feedback on a run id (a
  retrieval's or a whole chain's).

What is learned, ranked and stored lives in :mod:`rlfb`; this package converts between LangChain's objects and
rlfb's, and keeps what only LangChain's callbacks tell: the tree of runs open in the process (so that feedback on
a chain's run id finds the retrieval inside it), a run id given again, and what a locked store could not take yet.
"""

from __future__ import annotations

from rlfb._extras import missing_framework

try:
    from langchain_rlfb.callbacks import FeedbackCallbackHandler
    from langchain_rlfb.retrievers import (
        METADATA_KEYS,
        FeedbackEnsembleRetriever,
        as_member,
        document_to_chunk,
        hit_to_document,
    )
except ModuleNotFoundError as exc:  # the extra is not installed: say which
    missing_framework(exc, module="langchain_core", package="langchain_rlfb", framework="LangChain", extra="langchain")

__all__ = [
    "FeedbackEnsembleRetriever",
    "FeedbackCallbackHandler",
    "METADATA_KEYS",
    "as_member",
    "document_to_chunk",
    "hit_to_document",
]
