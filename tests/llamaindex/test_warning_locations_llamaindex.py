"""Every warning of the LlamaIndex adapter names the app's line, not rlfb's nor LlamaIndex's.

A warning given inside a retrieval, a postprocessor or the event handler names the app's call into LlamaIndex
(``retrieve``, ``query``, ``postprocess_nodes``), past LlamaIndex's dispatcher (``llama_index_instrumentation``);
feedback's warnings name the ``record_feedback`` call. BM25-only ensembles, mock LLMs and embeddings.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import SummaryIndex, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

import llamaindex_rlfb._nodes
from llamaindex_rlfb import FeedbackEnsembleRetriever, FeedbackEventHandler, FeedbackFusionPostprocessor
from rlfb.store import FeedbackStore

from _li_corpus import IDS, TEXTS
from _warned import named_files

SESSION = "ignoring the session_id tag"
REPLACED = r"the metadata keys .* are replaced by rlfb's own"


def nodes(**metadata: Any) -> list[TextNode]:
    return [TextNode(id_=i, text=t, metadata=dict(metadata)) for i, t in zip(IDS, TEXTS, strict=True)]


def rlfb_retriever(store: Any = None, **metadata: Any) -> FeedbackEnsembleRetriever:
    return FeedbackEnsembleRetriever.from_defaults(nodes=nodes(**metadata), retrievers=("bm25",), store=store,
                                                   similarity_top_k=2, policy="gradient")


class Fixed(BaseRetriever):
    """A retriever of LlamaIndex's own (not rlfb's): the first node whatever the query."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=nodes()[0], score=0.5)]


def thompson_learning_in(path: Path) -> str:
    """A store file holding thompson's learning for BM25: a gradient postprocessor on it starts afresh, warned."""
    from rlfb import FeedbackEnsemble

    with FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=str(path), policy="thompson") as ens:
        for _ in range(3):
            r = ens.retrieve("moon tides", k=3)
            ens.feedback(r.event_id, "click", chunk_id=r.hits[-1].chunk_id)
    return str(path)


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-per-set-of-keys memory emptied, so each test sees its first warning."""
    monkeypatch.setattr(llamaindex_rlfb._nodes, "_warned", set())


# ---------------------------------------------------------------- a session tag that cannot be one
# stacklevel=2 named the adapter's module; past it, LlamaIndex's dispatcher
def test_a_session_tag_at_a_retrieval_names_the_retrieve() -> None:
    retriever = rlfb_retriever()
    with instrument_tags({"session_id": ""}), pytest.warns(UserWarning, match=SESSION) as caught:
        retriever.retrieve("moon tides")
    assert named_files(caught, SESSION) == [__file__]


def test_a_session_tag_at_a_query_names_the_query() -> None:
    engine = RetrieverQueryEngine.from_args(rlfb_retriever(), llm=MockLLM())
    with instrument_tags({"session_id": ""}), pytest.warns(UserWarning, match=SESSION) as caught:
        engine.query("moon tides")
    assert named_files(caught, SESSION) == [__file__]


def test_a_session_tag_at_a_rerank_names_the_postprocess_call() -> None:
    pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=1, nodes=nodes())
    with instrument_tags({"session_id": ""}), pytest.warns(UserWarning, match=SESSION) as caught:
        pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes()], query_str="moon tides")
    assert named_files(caught, SESSION) == [__file__]


def test_a_session_tag_the_event_handler_logs_names_the_retrieve() -> None:
    with FeedbackEventHandler(store=FeedbackStore()) as handler:
        with instrument_tags({"session_id": 1.5}), pytest.warns(UserWarning, match=SESSION) as caught:
            Fixed().retrieve("moon tides")
        assert handler.retrievals()
    assert named_files(caught, SESSION) == [__file__]


# ---------------------------------------------------------------- a node's own metadata keys replaced
# stacklevel=3 named the adapter's module; past it, LlamaIndex's dispatcher
def test_own_metadata_keys_at_a_retrieval_name_the_retrieve(fresh_warnings: None) -> None:
    retriever = rlfb_retriever(rank="gold")
    with pytest.warns(UserWarning, match=REPLACED) as caught:
        retriever.retrieve("moon tides")
    assert named_files(caught, REPLACED) == [__file__]


def test_own_metadata_keys_at_a_rerank_name_the_postprocess_call(fresh_warnings: None) -> None:
    pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=1, nodes=nodes(scores="x"))
    with pytest.warns(UserWarning, match=REPLACED) as caught:
        pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes(scores="x")], query_str="moon tides")
    assert named_files(caught, REPLACED) == [__file__]


# ---------------------------------------------------------------- the same, awaited
# aretrieve and apostprocess_nodes run rlfb in a worker thread: its warnings named concurrent/futures/thread.py
async def test_a_session_tag_at_an_aretrieve_names_the_aretrieve() -> None:
    retriever = rlfb_retriever()
    with instrument_tags({"session_id": ""}), pytest.warns(UserWarning, match=SESSION) as caught:
        await retriever.aretrieve("moon tides")
    assert named_files(caught, SESSION) == [__file__]


async def test_own_metadata_keys_at_an_aquery_name_the_aquery(fresh_warnings: None) -> None:
    engine = RetrieverQueryEngine.from_args(rlfb_retriever(rank="gold"), llm=MockLLM())
    with pytest.warns(UserWarning, match=REPLACED) as caught:
        await engine.aquery("moon tides")
    assert named_files(caught, REPLACED) == [__file__]


async def test_own_metadata_keys_at_an_async_rerank_name_the_apostprocess_call(fresh_warnings: None) -> None:
    pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=1, nodes=nodes(scores="x"))
    with pytest.warns(UserWarning, match=REPLACED) as caught:
        await pp.apostprocess_nodes([NodeWithScore(node=n) for n in nodes(scores="x")], query_str="moon tides")
    assert named_files(caught, REPLACED) == [__file__]


async def test_a_core_warning_at_an_async_rerank_names_the_apostprocess_call(tmp_path: Path) -> None:
    # the postprocessor builds its ensemble at its first nodes, here in the worker thread
    db = thompson_learning_in(tmp_path / "fb.db")
    pp = FeedbackFusionPostprocessor(store=db, retrievers=("bm25",), top_n=2, policy="gradient")
    with pytest.warns(RuntimeWarning, match="starts afresh") as caught:
        await pp.apostprocess_nodes([NodeWithScore(node=n) for n in nodes()], query_str="moon tides")
    assert named_files(caught, "starts afresh") == [__file__]
    pp.store.close()


# ---------------------------------------------------------------- already the app's line
def test_nodes_of_new_random_ids_name_the_build(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"

    def build() -> FeedbackEnsembleRetriever:
        made = [TextNode(id_=str(uuid.uuid4()), text=t) for t in TEXTS * 3]
        return FeedbackEnsembleRetriever.from_defaults(nodes=made, retrievers=("bm25",), store=path, explore=False)

    ens = build().ensemble
    ens.feedback(ens.retrieve("what causes the aurora", k=len(ens)).event_id, "thumbs_down")
    ens.close()
    with pytest.warns(UserWarning, match="random ids") as caught:
        built = build()
    assert named_files(caught, "random ids") == [__file__]
    built.ensemble.close()


def test_feedback_on_a_node_no_decision_returned_names_the_feedback(tmp_path: Path) -> None:
    with FeedbackEventHandler(store=tmp_path / "app.db") as handler:
        other = SummaryIndex(nodes()[5:7]).as_retriever()  # returns doc5 and doc6 whatever the query
        fusion = QueryFusionRetriever([rlfb_retriever(tmp_path / "own.db"), other], llm=MockLLM(), num_queries=1,
                                      similarity_top_k=4)
        RetrieverQueryEngine.from_args(fusion, llm=MockLLM()).query("moon tides")
        with pytest.warns(RuntimeWarning, match="taught no rlfb learner") as caught:
            handler.record_feedback(handler.last_query_id, score=1.0, chunk_id="doc6")
    assert named_files(caught, "taught no rlfb learner") == [__file__]


def test_feedback_no_live_learner_learns_names_the_feedback(tmp_path: Path) -> None:
    db = str(tmp_path / "fb.db")
    index = VectorStoreIndex(nodes(), embed_model=MockEmbedding(embed_dim=8))
    before = FeedbackFusionPostprocessor(store=db, retrievers=("bm25",), top_n=2)
    with FeedbackEventHandler(store=db) as old:
        response = index.as_query_engine(llm=MockLLM(max_tokens=4), similarity_top_k=5,
                                         node_postprocessors=[before]).query("moon tides")
        qid = old.query_id_of(response)
    before.store.close()
    FeedbackFusionPostprocessor(store=db, retrievers=("bm25",), top_n=2)  # after a restart: no learner yet
    with FeedbackEventHandler(store=db) as handler:
        with pytest.warns(RuntimeWarning, match="no rlfb learner alive in this process") as caught:
            handler.record_feedback(qid, score=1.0)
    assert named_files(caught, "no rlfb learner") == [__file__]


def test_a_core_warning_given_while_llamaindex_calls_the_postprocessor_names_the_app(tmp_path: Path) -> None:
    # the postprocessor builds its ensemble at its first nodes, inside LlamaIndex's dispatcher: the core's restart
    # note ("starts afresh") named llama_index_instrumentation/dispatcher.py (a review, 2026-12-07)
    db = thompson_learning_in(tmp_path / "fb.db")
    pp = FeedbackFusionPostprocessor(store=db, retrievers=("bm25",), top_n=2, policy="gradient")
    with pytest.warns(RuntimeWarning, match="starts afresh") as caught:
        pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes()], query_str="moon tides")
    assert named_files(caught, "starts afresh") == [__file__]
    pp.store.close()
