"""One shared learner: a LangChain app and a LlamaIndex app on one store file learn into the same weights."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.llms import MockLLM

from llamaindex_rlfb import EVENT_ID_KEY, FeedbackEventHandler, FeedbackFusionPostprocessor

from _li_corpus import IDS, TEXTS

pytest.importorskip("langchain_core")
from langchain_rlfb import FeedbackEnsembleRetriever as LangChainRetriever  # noqa: E402

QUERIES = ("what makes the sky glow green", "moon", "hot rock from mountains", "titanium 400 bar")


def _best(items: list[Any], retriever: str) -> Any:
    return max(items, key=lambda x: x["scores"][retriever])


def test_langchain_and_llamaindex_share_one_learner(
    tmp_path: Any, index: Any, fast_dense: dict[str, Any]
) -> None:
    db = tmp_path / "fb.db"
    settings = dict(store=str(db), retrievers=("bm25", "dense"), policy="gradient", refresh_interval=0.0,
                    **fast_dense)
    langchain_app = LangChainRetriever.from_texts(TEXTS, ids=IDS, k=3, **settings)
    pp = FeedbackFusionPostprocessor.from_index(index, top_n=3, **settings)
    llamaindex_app = index.as_query_engine(llm=MockLLM(), similarity_top_k=8, node_postprocessors=[pp])
    start = {"bm25": 0.5, "dense": 0.5}
    assert langchain_app.weights == pytest.approx(start) and pp.weights == pytest.approx(start)

    # Users of the LangChain app click what BM25 ranks best: both apps now lean lexical.
    for _ in range(10):
        for question in QUERIES:
            docs = langchain_app.invoke(question)
            best = _best([d.metadata for d in docs], "bm25")
            langchain_app.feedback(best["event_id"], "click", chunk_id=best["chunk_id"])
    lexical = langchain_app.weights
    assert lexical["bm25"] > 0.505
    assert pp.weights == pytest.approx(lexical)  # LlamaIndex reads the weights LangChain's feedback wrote

    # Users of the LlamaIndex app, through its event handler, click what the dense model ranks best.
    with FeedbackEventHandler(store=db) as handler:
        for _ in range(20):
            for question in QUERIES:
                response = llamaindex_app.query(question)
                shown = [{**n.node.metadata, "id": n.node.node_id} for n in response.source_nodes]
                best = _best(shown, "dense")
                handler.record_feedback(signal="click", chunk_id=best["id"])
    semantic = pp.weights
    assert semantic["dense"] > lexical["dense"]
    assert langchain_app.weights == pytest.approx(semantic)  # and LangChain reads LlamaIndex's
    assert response.source_nodes[0].node.metadata[EVENT_ID_KEY] is not None
    events = pp.store.counts()["events"]
    assert events >= 40 + 80  # both apps' retrievals in one file


def test_an_adapters_feedback_on_a_query_teaches_each_decision_to_the_learner_that_made_it(tmp_path) -> None:
    # an rlfb retriever and an rlfb postprocessor of the same retrievers on one store: pp.feedback(query id)
    # taught the postprocessor both decisions, the retriever's too, and the retriever none
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.schema import TextNode

    from llamaindex_rlfb import FeedbackEnsembleRetriever
    from rlfb.store import FeedbackStore

    store = FeedbackStore(tmp_path / "fb.db")
    nodes = [TextNode(id_=i, text=t) for i, t in zip(IDS, TEXTS, strict=True)]
    retriever = FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25",), store=store,
                                                        similarity_top_k=6)
    pp = FeedbackFusionPostprocessor(store=store, retrievers=("bm25",), top_n=2, nodes=nodes)
    learned: list = []
    for name, ens in (("retriever", retriever.ensemble), ("postprocessor", pp.ensemble)):
        assert ens is not None
        def spy(record: Any, event: Any = None, _name: str = name, _learn: Any = ens._learn, **kw: Any) -> Any:
            learned.append((_name, (event or {}).get("metadata", {}).get("component")))
            return _learn(record, event, **kw)
        ens._learn = spy  # type: ignore[method-assign]  # a spy on the learner's private hook
    handler = FeedbackEventHandler(store=store).attach()
    try:
        engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM(), node_postprocessors=[pp])
        for adapter in (pp, retriever):
            learned.clear()
            engine.query("what causes the northern lights aurora")
            adapter.feedback(handler.last_query_id, score=1.0)
            assert sorted(learned) == [("postprocessor", "FeedbackFusionPostprocessor"),
                                       ("retriever", "FeedbackEnsembleRetriever")]
    finally:
        handler.detach()
