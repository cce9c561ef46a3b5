"""Fixtures of the LangChain adapter tests: one small corpus indexed once with BM25 and the offline MiniLM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.embeddings import Embeddings

from rlfb import FeedbackEnsemble
from rlfb.store import FeedbackStore

from _lc_corpus import IDS, TEXTS


class MiniLMEmbeddings(Embeddings):
    """A LangChain ``Embeddings`` over rlfb's dense retriever (the offline all-MiniLM-L6-v2, cached)."""

    def __init__(self, dense: Any) -> None:
        self.dense = dense

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.dense.encode_documents(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.dense.encode_queries([text])[0].tolist()


@pytest.fixture(scope="session")
def base_ensemble() -> FeedbackEnsemble:
    """BM25 + dense over :data:`TEXTS`, indexed once; tests build their own ensembles on its retrievers."""
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"))


@pytest.fixture
def make_ensemble(base_ensemble: FeedbackEnsemble) -> Callable[..., FeedbackEnsemble]:
    """A fresh ensemble (own store, own learner) over the shared indexed retrievers."""

    def make(store: Any = ":memory:", **kwargs: Any) -> FeedbackEnsemble:
        if isinstance(store, str) and store == ":memory:":
            store = FeedbackStore()
        return FeedbackEnsemble(base_ensemble.retrievers, base_ensemble.chunks, store=store, **kwargs)

    return make


@pytest.fixture(scope="session")
def embeddings(base_ensemble: FeedbackEnsemble) -> MiniLMEmbeddings:
    return MiniLMEmbeddings(base_ensemble.retrievers["dense"])
