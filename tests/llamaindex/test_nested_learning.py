"""Feedback by query id teaches an rlfb learner nested in another retriever, whichever store it logs to.

A ``QueryFusionRetriever`` (or a custom retriever) that mixes the rlfb result with another
retriever's returns a list of its own: the handler logs that list, and the rlfb decision
under it must still be reached by feedback on the query, stored in the learner's own store
and learned once. BM25-only ensembles and a ``SummaryIndex`` member keep these tests fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llama_index.core import SummaryIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llamaindex_rlfb import EVENT_ID_KEY, FeedbackEnsembleRetriever, FeedbackEventHandler, FeedbackFusionPostprocessor
from rlfb.store import FeedbackStore

QUESTION = "moon tides"


@pytest.fixture
def handler(tmp_path: Any) -> Iterator[FeedbackEventHandler]:
    h = FeedbackEventHandler(store=tmp_path / "app.db").attach()
    yield h
    h.close()


def _rlfb(nodes: list[TextNode], store: Any) -> FeedbackEnsembleRetriever:
    return FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25",), store=store,
                                                   similarity_top_k=2, policy="gradient")


def _fusion(member: BaseRetriever, nodes: list[TextNode], *, use_async: bool = False) -> QueryFusionRetriever:
    """``member`` fused with a retriever that returns doc5 and doc6 whatever the query."""
    other = SummaryIndex(nodes[5:7]).as_retriever()
    return QueryFusionRetriever([member, other], llm=MockLLM(), num_queries=1, use_async=use_async,
                                similarity_top_k=4)


def _decision(nodes: list[NodeWithScore]) -> str:
    """The one rlfb event id among the fused nodes (the other member's nodes carry none)."""
    (eid,) = {n.node.metadata[EVENT_ID_KEY] for n in nodes if n.node.metadata.get(EVENT_ID_KEY)}
    assert any(EVENT_ID_KEY not in n.node.metadata for n in nodes)  # a mixed list: not the rlfb one
    return eid


@pytest.mark.parametrize("use_async", [False, True], ids=["query", "aquery"])
async def test_fused_retriever_on_its_own_store_learns_by_query_id(
    nodes: list[TextNode], handler: FeedbackEventHandler, tmp_path: Any, use_async: bool
) -> None:
    retriever = _rlfb(nodes, tmp_path / "own.db")
    engine = RetrieverQueryEngine.from_args(_fusion(retriever, nodes, use_async=use_async), llm=MockLLM())
    response = await engine.aquery(QUESTION) if use_async else engine.query(QUESTION)
    qid = handler.last_query_id
    eid = _decision(response.source_nodes)
    # the handler's store holds the decision under the query (a copy: the learner's store has its own)
    assert eid in {e["id"] for e in handler.retrievals(qid)}
    assert handler.store.event(eid)["parent_id"] == qid

    records = handler.record_feedback(qid, score=1.0)
    assert retriever.ensemble.learner.n_learned == 1
    assert retriever.store.counts()["feedback"] == 1  # stored where the learner learns from it
    assert [r.event_id for r in records].count(eid) == 2  # the handler's copy and the learner's own event
    assert handler.store.counts()["feedback"] == 2  # the copy and the fused list


@pytest.mark.parametrize("same", ["same object", "same file"])
def test_fused_retriever_on_the_handlers_store_learns_once(
    nodes: list[TextNode], handler: FeedbackEventHandler, same: str
) -> None:
    store = handler.store if same == "same object" else FeedbackStore(str(handler.store.path))
    retriever = _rlfb(nodes, store)
    engine = RetrieverQueryEngine.from_args(_fusion(retriever, nodes), llm=MockLLM())
    eid = _decision(engine.query(QUESTION).source_nodes)

    records = handler.record_feedback(handler.last_query_id, score=1.0)
    assert retriever.ensemble.learner.n_learned == 1
    assert sorted(r.event_id for r in records).count(eid) == 1  # no copy, no second record
    counts = handler.store.counts()
    assert (counts["events"], counts["feedback"]) == (2, 2)  # the decision and the fused list, once each


def test_feedback_on_a_chunk_only_another_member_found(
    nodes: list[TextNode], handler: FeedbackEventHandler, tmp_path: Any
) -> None:
    retriever = _rlfb(nodes, tmp_path / "own.db")
    engine = RetrieverQueryEngine.from_args(_fusion(retriever, nodes), llm=MockLLM())
    eid = _decision(engine.query(QUESTION).source_nodes)
    qid = handler.last_query_id

    with pytest.warns(RuntimeWarning, match="taught no rlfb learner"):  # the rlfb retriever never returned it
        [record] = handler.record_feedback(qid, score=1.0, chunk_id="doc6")
    assert record.event_id != eid
    assert retriever.store.counts()["feedback"] == 0 and retriever.ensemble.learner.n_learned == 0

    ours = retriever.store.event(eid)["chunks"][0]["chunk_id"]
    handler.record_feedback(qid, signal="click", chunk_id=ours)
    assert retriever.store.counts()["feedback"] == 1 and retriever.ensemble.learner.n_learned == 1


@pytest.mark.parametrize("own_store", [False, True], ids=["handler's store", "own store"])
async def test_a_bare_fused_retrieval_is_a_query_id_that_teaches(
    nodes: list[TextNode], handler: FeedbackEventHandler, tmp_path: Any, own_store: bool
) -> None:
    retriever = _rlfb(nodes, tmp_path / "own.db" if own_store else handler.store)
    fusion = _fusion(retriever, nodes)
    retrieves: tuple[Callable[[str], Any], ...] = (fusion.retrieve, fusion.aretrieve)
    for n, retrieve in enumerate(retrieves, start=1):
        out = retrieve(QUESTION)
        out = await out if n == 2 else out
        eid = _decision(out)
        qid = handler.last_query_id
        assert qid is not None
        assert qid.startswith("QueryFusionRetriever.")  # the retrieval's span id is still the query id
        assert {e["id"] for e in handler.retrievals(qid)} == {eid, f"{qid}/result"}
        handler.record_feedback(score=1.0)
        assert retriever.ensemble.learner.n_learned == n
        assert retriever.store.counts()["feedback"] == (n if own_store else 2 * n)


class _PinnedAndReranked(BaseRetriever):
    """A custom retriever: candidates re-ranked by an rlfb postprocessor, then a pinned notice appended."""

    def __init__(self, candidates: BaseRetriever, pp: FeedbackFusionPostprocessor) -> None:
        self._candidates, self._pp = candidates, pp
        self._notice = NodeWithScore(node=TextNode(id_="notice", text="Opening hours changed."), score=0.0)
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        ranked = self._pp.postprocess_nodes(self._candidates.retrieve(query_bundle), query_bundle)
        return [*ranked, self._notice]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        candidates = await self._candidates.aretrieve(query_bundle)
        return [*await self._pp.apostprocess_nodes(candidates, query_bundle), self._notice]


@pytest.mark.parametrize("use_async", [False, True], ids=["query", "aquery"])
async def test_postprocessor_in_a_custom_retriever_on_its_own_store_learns(
    nodes: list[TextNode], handler: FeedbackEventHandler, tmp_path: Any, use_async: bool
) -> None:
    pp = FeedbackFusionPostprocessor(tmp_path / "pp.db", retrievers=("bm25",), top_n=2, nodes=nodes,
                                     policy="gradient")
    engine = RetrieverQueryEngine.from_args(_PinnedAndReranked(SummaryIndex(nodes).as_retriever(), pp),
                                            llm=MockLLM())
    response = await engine.aquery(QUESTION) if use_async else engine.query(QUESTION)
    eid = _decision(response.source_nodes)

    handler.record_feedback(handler.last_query_id, rating=5)
    assert pp.ensemble is not None
    assert pp.ensemble.learner.n_learned == 1
    assert pp.store.counts()["feedback"] == 1 and pp.store.has_event(eid)


@pytest.mark.parametrize("where", ["handler's store", "a store of their own"])
def test_two_nested_learners_on_one_store_each_learn_their_own_decision_once(
    nodes: list[TextNode], handler: FeedbackEventHandler, tmp_path: Any, where: str
) -> None:
    # same retrievers and policy over different corpora: each owns the other's events by name, so only the
    # handler's memory of who decided what keeps a decision from being stored or learned twice
    store = handler.store if where == "handler's store" else FeedbackStore(str(tmp_path / "own.db"))
    first, second = _rlfb(nodes[:5], store), _rlfb(nodes[3:], store)
    fusion = QueryFusionRetriever([first, second], llm=MockLLM(), num_queries=1, similarity_top_k=4)
    RetrieverQueryEngine.from_args(fusion, llm=MockLLM()).query(QUESTION)
    decisions = [e["id"] for e in handler.retrievals(handler.last_query_id)
                 if store.has_event(e["id"]) and store.event(e["id"])["policy"] == "gradient"]
    assert len(decisions) == 2

    handler.record_feedback(handler.last_query_id, score=1.0)
    assert [len(store.feedback(e)) for e in decisions] == [1, 1]  # one row each, not one per learner
    first.ensemble.refresh()
    assert first.ensemble.learner.n_learned == 2  # the shared state holds each decision once
    store.close()


def test_learners_with_other_retrievers_on_the_handlers_store_both_learn(
    nodes: list[TextNode], handler: FeedbackEventHandler, fast_dense: dict[str, Any]
) -> None:
    bm25 = _rlfb(nodes, handler.store)
    both = FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25", "dense"), store=handler.store,
                                                   similarity_top_k=2, policy="gradient", **fast_dense)
    fusion = QueryFusionRetriever([bm25, both], llm=MockLLM(), num_queries=1, similarity_top_k=4)
    RetrieverQueryEngine.from_args(fusion, llm=MockLLM()).query(QUESTION)

    handler.record_feedback(handler.last_query_id, score=1.0)
    assert (bm25.ensemble.learner.n_learned, both.ensemble.learner.n_learned) == (1, 1)
