"""Fixtures of the LlamaIndex adapter tests: a small corpus indexed once with BM25 and the offline MiniLM.

No test touches LlamaIndex's global ``Settings``: every index gets ``embed_model=``
and every query engine ``llm=MockLLM()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import TextNode

from rlfb import FeedbackEnsemble
from rlfb.retrievers.dense import DenseRetriever
from rlfb.store import FeedbackStore

from _li_corpus import IDS, TEXTS, MiniLMEmbedding


@pytest.fixture(scope="session")
def base_ensemble() -> FeedbackEnsemble:
    """BM25 + dense over :data:`TEXTS`, indexed once; tests build their own ensembles on its retrievers."""
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"))


@pytest.fixture
def make_ensemble(base_ensemble: FeedbackEnsemble) -> Callable[..., FeedbackEnsemble]:
    """A fresh ensemble (own store, own learner) over the shared indexed retrievers."""

    def make(store: Any = None, **kwargs: Any) -> FeedbackEnsemble:
        return FeedbackEnsemble(base_ensemble.retrievers, base_ensemble.chunks,
                                store=FeedbackStore() if store is None else store, **kwargs)

    return make


@pytest.fixture(scope="session")
def embed_model(base_ensemble: FeedbackEnsemble) -> MiniLMEmbedding:
    return MiniLMEmbedding(base_ensemble.retrievers["dense"])


@pytest.fixture(scope="session")
def fast_dense(base_ensemble: FeedbackEnsemble) -> dict[str, Any]:
    """``retriever_options`` that give a new dense retriever the already-loaded model."""
    dense = cast(DenseRetriever, base_ensemble.retrievers["dense"])
    return {"retriever_options": {"dense": {"model": dense.model}}}


@pytest.fixture
def nodes() -> list[TextNode]:
    return [TextNode(id_=i, text=t, metadata={"source": f"{i}.txt"}) for i, t in zip(IDS, TEXTS, strict=True)]


@pytest.fixture
def index(nodes: list[TextNode], embed_model: MiniLMEmbedding) -> VectorStoreIndex:
    return VectorStoreIndex(nodes, embed_model=embed_model)


@pytest.fixture(autouse=True)
def _no_leftover_handlers() -> Iterator[None]:
    """Every test leaves the root dispatcher's event handlers as it found them."""
    root = get_dispatcher()
    before = list(root.event_handlers)
    yield
    root.event_handlers = before
