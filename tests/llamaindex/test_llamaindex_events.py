"""FeedbackEventHandler: capture from any query engine through instrumentation, feedback by query id."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llamaindex_rlfb import (
    EVENT_ID_KEY,
    FeedbackEnsembleRetriever,
    FeedbackEventHandler,
    FeedbackFusionPostprocessor,
    current_query_id,
    instrument,
)
from rlfb import (
    FeedbackEnsemble,
    IdempotencyConflictError,
    RlfbError,
    UnknownChunkError,
    UnknownEventError,
    ValidationError,
)
from rlfb.store import FeedbackStore

from _li_corpus import IDS, TEXTS

LEXICAL_QUERIES = ("what makes the sky glow green", "moon", "hot rock from mountains", "titanium 400 bar")


def _ensemble(pp: FeedbackFusionPostprocessor) -> FeedbackEnsemble:
    """``pp.ensemble``, built by now (``None`` only before a self-indexing postprocessor's first call)."""
    assert pp.ensemble is not None
    return pp.ensemble


@pytest.fixture
def handler(tmp_path: Any) -> Iterator[FeedbackEventHandler]:
    h = FeedbackEventHandler(store=tmp_path / "fb.db").attach()
    yield h
    h.close()


def test_captures_a_plain_vector_index_engine(index: Any, handler: FeedbackEventHandler) -> None:
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=3)
    response = engine.query("what causes the aurora borealis")
    qid = handler.last_query_id
    assert qid is not None and qid.startswith("RetrieverQueryEngine.query-")
    assert current_query_id() is None  # the query is over
    [event] = handler.retrievals(qid)
    assert [c["chunk_id"] for c in event["chunks"]] == [n.node.node_id for n in response.source_nodes]
    assert event["query"] == "what causes the aurora borealis"
    assert event["policy"] == "external" and event["parent_id"] == qid
    assert event["metadata"]["component"] == "VectorIndexRetriever"
    assert event["chunks"][0]["score"] == pytest.approx(response.source_nodes[0].score)

    [up] = handler.record_feedback(qid, score=1.0)
    assert up.reward == pytest.approx(1.0, abs=1e-3) and up.event_id == event["id"]
    [low] = handler.record_feedback(qid, rating=1)
    assert low.reward < 0
    top = response.source_nodes[0].node.node_id
    [click] = handler.record_feedback(qid, signal="click", chunk_id=top)
    assert set(click.chunk_rewards) == {top}
    [again] = handler.record_feedback(score=0.0)  # defaults to the last query
    assert again.reward == pytest.approx(-1.0, abs=1e-3)
    assert handler.store.counts()["feedback"] == 4


def test_a_response_names_its_query_in_any_thread(index: Any, handler: FeedbackEventHandler) -> None:
    # last_query_id is per thread and task: a query run through asyncio.to_thread was not the caller's latest,
    # and feedback without an id rated the caller's earlier query. The response itself now names its query
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
    first = engine.query("tides")

    async def ask() -> Any:
        return await asyncio.to_thread(engine.query, "what causes the aurora borealis")

    second = asyncio.run(ask())
    qid = handler.query_id_of(second)
    assert qid is not None and qid != handler.query_id_of(first) and qid != handler.last_query_id
    [event] = handler.retrievals(qid)
    assert event["query"] == "what causes the aurora borealis"
    assert handler.record_feedback(qid, score=1.0)[0].event_id == event["id"]
    assert handler.query_id_of("not a response") is None and handler.query_id_of(object()) is None


def test_bad_feedback(index: Any, handler: FeedbackEventHandler) -> None:
    with pytest.raises(UnknownEventError, match="no query was captured"):
        handler.record_feedback(score=1.0)
    index.as_query_engine(llm=MockLLM(), similarity_top_k=2).query("tides")
    qid = handler.last_query_id
    with pytest.raises(UnknownEventError, match="nothing was logged under query id 'nope'"):
        handler.record_feedback("nope", score=1.0)
    with pytest.raises(UnknownChunkError):
        handler.record_feedback(qid, signal="click", chunk_id="not-retrieved")
    with pytest.raises(ValidationError, match="exactly one of score, rating, signal or value"):
        handler.record_feedback(qid)
    with pytest.raises(ValidationError, match="exactly one"):
        handler.record_feedback(qid, score=1.0, rating=5)
    with pytest.raises(ValidationError, match="score must lie in"):
        handler.record_feedback(qid, score=3.0)
    with pytest.raises(ValidationError, match="score_scale"):
        FeedbackEventHandler(score_scale="percent")
    with pytest.raises(ValidationError, match="store"):
        FeedbackEventHandler(store=42)
    assert handler.store.counts()["feedback"] == 0


def test_attach_detach_and_instrument(index: Any) -> None:
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
    handler = FeedbackEventHandler()
    engine.query("glaciers")
    assert handler.store.counts()["events"] == 0  # not attached: nothing seen
    with handler:
        assert sum(h is handler for h in get_dispatcher().event_handlers) == 1
        handler.attach()  # attaching twice is a no-op
        assert sum(h is handler for h in get_dispatcher().event_handlers) == 1
        engine.query("glaciers")
    assert not any(h is handler for h in get_dispatcher().event_handlers)
    engine.query("volcanoes")
    assert handler.store.counts()["events"] == 1
    other = instrument()  # a second handler on its own store sees the same queries
    with FeedbackEventHandler(store=other.store).attach() as twin:
        engine.query("stock market")
        assert twin.last_query_id == other.last_query_id
    assert other.store.counts()["events"] == 1
    other.close()


async def test_aquery_and_last_query_id_per_task(index: Any, handler: FeedbackEventHandler) -> None:
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)

    async def ask(question: str) -> tuple[str | None, Any]:
        response = await engine.aquery(question)
        return handler.last_query_id, response

    (id_a, resp_a), (id_b, resp_b) = await asyncio.gather(ask("aurora"), ask("volcano lava"))
    assert id_a != id_b
    for qid, resp in ((id_a, resp_a), (id_b, resp_b)):
        [event] = handler.retrievals(qid)
        assert [c["chunk_id"] for c in event["chunks"]] == [n.node.node_id for n in resp.source_nodes]
    assert handler.last_query_id is None  # the queries ran in their own tasks
    await engine.aquery("tides")
    assert handler.last_query_id not in (None, id_a, id_b)


def test_last_query_id_per_thread(index: Any, handler: FeedbackEventHandler) -> None:
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
    engine.query("aurora")
    mine = handler.last_query_id
    seen: list[str | None] = []

    def work() -> None:
        engine.query("tides")
        seen.append(handler.last_query_id)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert handler.last_query_id == mine
    assert seen[0] not in (None, mine)


def test_postprocessor_learns_from_feedback_by_query_id(
    index: Any, handler: FeedbackEventHandler, fast_dense: dict[str, Any]
) -> None:
    pp = FeedbackFusionPostprocessor.from_index(
        index, store=handler.store, top_n=3, policy="gradient", **fast_dense
    )
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=8, node_postprocessors=[pp])
    for _ in range(10):
        for question in LEXICAL_QUERIES:
            response = engine.query(question)
            lexical = max(response.source_nodes, key=lambda n: n.node.metadata["scores"]["bm25"]).node
            records = handler.record_feedback(handler.last_query_id, signal="click", chunk_id=lexical.node_id)
            # two retrievals under the query: the vector retriever's candidates (stored) and the re-ranking
            ours = lexical.metadata[EVENT_ID_KEY]
            assert len(records) == 2 and ours in {r.event_id for r in records}
            (theirs,) = {r.event_id for r in records} - {ours}
            assert handler.store.event(theirs)["policy"] == "external"
    assert pp.weights["bm25"] > 0.52


def test_learner_on_another_store_still_learns(index: Any, make_ensemble: Any) -> None:
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(policy="gradient"), top_n=3)
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=8, node_postprocessors=[pp])
    with FeedbackEventHandler() as handler:  # its own in-memory store
        # 15 rounds: PDGD's gate no longer lets the first click through, so it moves a few rounds later (0.518
        # after 10, 0.571 after 15)
        for _ in range(15):
            for question in LEXICAL_QUERIES:
                response = engine.query(question)
                lexical = max(response.source_nodes, key=lambda n: n.node.metadata["scores"]["bm25"]).node
                handler.record_feedback(signal="click", chunk_id=lexical.node_id)
        # the handler keeps a copy of the re-ranking under the same event id
        assert handler.store.has_event(response.source_nodes[0].node.metadata[EVENT_ID_KEY])
    assert pp.weights["bm25"] > 0.52
    assert pp.store.counts()["feedback"] == 60


def test_feedback_a_learners_store_refuses_leaves_no_row_in_the_handlers(index: Any, make_ensemble: Any) -> None:
    # the handler's store and the learner's were written in two transactions: when the learner's refused (here an
    # idempotency conflict) the call raised, but the handler's row stayed
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(policy="gradient"), top_n=3)
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=8, node_postprocessors=[pp])
    with FeedbackEventHandler() as handler:  # its own in-memory store
        response = engine.query("moon")
        eid = response.source_nodes[0].node.metadata[EVENT_ID_KEY]
        pp.store.record_feedback(eid, "explicit_negative", idempotency_key=f"fb-1:{eid}")  # taken there
        learned = _ensemble(pp).learner.n_learned
        with pytest.raises(IdempotencyConflictError):
            handler.record_feedback(score=1.0, idempotency_key="fb-1")
        assert handler.store.counts()["feedback"] == 0 and handler.store.counts()["rewards"] == 0
        assert pp.store.counts()["feedback"] == 1 and _ensemble(pp).learner.n_learned == learned
        records = handler.record_feedback(score=1.0, idempotency_key="fb-2")  # a retry lands on both
        assert [r.event_id for r in records].count(eid) == 2  # the handler's copy and the learner's event
        assert handler.store.counts()["feedback"] == len(records) - 1 and pp.store.counts()["feedback"] == 2


def test_our_retriever_is_not_logged_twice(make_ensemble: Any) -> None:
    ens = make_ensemble(policy="gradient")
    retriever = FeedbackEnsembleRetriever(ens, similarity_top_k=2)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    with FeedbackEventHandler(store=ens.store) as handler:
        with instrument_tags({"session_id": "s-1"}):
            response = engine.query("moon tides")
        eid = response.source_nodes[0].node.metadata[EVENT_ID_KEY]
        assert handler.store.counts()["events"] == 1
        event = handler.store.event(eid)
        assert event["parent_id"] == handler.last_query_id and event["session_id"] == "s-1"
        [record] = handler.record_feedback(score=1.0)
        assert record.event_id == eid and ens.learner.n_learned == 1
        retriever.retrieve("volcano")  # a bare retrieval is its own query id
        assert handler.last_query_id == retriever.store.event(handler.last_query_id)["id"]


class _Boom(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        raise RuntimeError("the vector store is down")


def test_nested_and_failed_retrievals(index: Any, handler: FeedbackEventHandler) -> None:
    members = [index.as_retriever(similarity_top_k=2), index.as_retriever(similarity_top_k=3)]
    fusion = QueryFusionRetriever(members, llm=MockLLM(), num_queries=1, use_async=False, similarity_top_k=3)
    engine = RetrieverQueryEngine.from_args(fusion, llm=MockLLM())
    engine.query("northern lights")
    [event] = handler.retrievals()  # the members' retrievals are nested: only the fused list is logged
    assert event["metadata"]["component"] == "QueryFusionRetriever"

    broken = RetrieverQueryEngine.from_args(_Boom(), llm=MockLLM())
    with pytest.raises(RuntimeError, match="down"):
        broken.query("anything")
    assert current_query_id() is None  # the failed query did not stay open
    engine.query("lava")
    assert handler.retrievals()[0]["query"] == "lava"


def test_in_memory_store_by_default() -> None:
    handler = FeedbackEventHandler()
    assert isinstance(handler.store, FeedbackStore) and handler.store_path == ":memory:"
    handler.close()


def test_handle_matches_subclassed_events_and_ignores_others(handler: FeedbackEventHandler) -> None:
    from llama_index.core.instrumentation.events.embedding import EmbeddingStartEvent
    from llama_index.core.instrumentation.events.query import QueryStartEvent
    from llama_index.core.instrumentation.events.span import SpanDropEvent

    class TracedQueryStart(QueryStartEvent):  # an app's own event type, derived from LlamaIndex's
        pass

    handler.handle(EmbeddingStartEvent(model_dict={}, span_id="embed-1"))  # not ours: ignored
    assert current_query_id() is None
    handler.handle(TracedQueryStart(query="aurora", span_id="q-1"))
    assert current_query_id() == "q-1" and handler.last_query_id == "q-1"
    handler.handle(SpanDropEvent(err_str="boom", span_id="q-1"))  # the query raised: its span is dropped
    assert current_query_id() is None


def test_manual_postprocessing_of_a_bare_retrieval_teaches_the_postprocessor(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    """``pp.postprocess_nodes(retriever.retrieve(q), query_str=q)`` outside a query engine: no id needed."""
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(store=handler.store, policy="gradient"), top_n=2)
    retriever = index.as_retriever(similarity_top_k=5)
    question = "what causes the aurora"
    out = pp.postprocess_nodes(retriever.retrieve(question), query_str=question)
    ours = out[0].node.metadata[EVENT_ID_KEY]
    qid = handler.last_query_id
    assert qid is not None and qid.startswith("VectorIndexRetriever.retrieve-")
    # as in a query engine, the query id stands for the candidates (stored) and the re-ranking (learned)
    assert [e["id"] for e in handler.retrievals()][1:] == [ours]
    records = handler.record_feedback(score=1.0)
    assert len(records) == 2 and ours in {r.event_id for r in records}
    assert _ensemble(pp).learner.n_learned == 1

    # nodes that did not come from the latest bare retrieval: the re-ranking is the query id on its own
    given = [NodeWithScore(node=index.docstore.get_node(i)) for i in ("doc2", "doc9")]
    out = pp.postprocess_nodes(given, query_str="tides")
    assert handler.last_query_id == out[0].node.metadata[EVENT_ID_KEY]
    handler.record_feedback(score=0.0)
    assert _ensemble(pp).learner.n_learned == 2


def test_manual_postprocessing_with_a_learner_on_another_store(index: Any, make_ensemble: Any) -> None:
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(policy="gradient"), top_n=2)
    with FeedbackEventHandler() as handler:  # its own in-memory store
        question = "moon tides"
        out = pp.postprocess_nodes(index.as_retriever(similarity_top_k=4).retrieve(question), query_str=question)
        records = handler.record_feedback(score=1.0, chunk_id=out[0].node.node_id)
    # the handler keeps a copy of the re-ranking; the learner learns from its own store's event
    assert out[0].node.metadata[EVENT_ID_KEY] in {r.event_id for r in records}
    assert pp.store.counts()["feedback"] == 1 and _ensemble(pp).learner.n_learned == 1


def test_rebuilt_from_its_dump_on_the_same_file(tmp_path: Any, make_ensemble: Any) -> None:
    handler = FeedbackEventHandler(store=tmp_path / "fb.db", score_scale="signed")
    data = handler.model_dump()
    for twin in (FeedbackEventHandler(**data), FeedbackEventHandler.model_validate(data)):
        assert twin.store.path == handler.store.path and twin.score_scale == "signed"
        twin.close()
    assert data == {"store_path": str(tmp_path / "fb.db"), "score_scale": "signed", "not_serialised": []}
    with pytest.raises(ValidationError, match="name different stores"):
        FeedbackEventHandler(store=tmp_path / "other.db", store_path=str(tmp_path / "fb.db"))
    handler.close()

    # an in-memory store and an ensemble cannot be dumped: the rebuild asks for them, never a new store
    in_memory = FeedbackEventHandler(ensemble=make_ensemble())
    data = in_memory.model_dump()
    assert data["not_serialised"] == ["store", "ensemble"]
    with pytest.raises(ValidationError, match="pass store=, ensemble= again"):
        FeedbackEventHandler(**data)
    with pytest.raises(ValueError, match="pass store=, ensemble= again"):  # pydantic wraps it in its own
        FeedbackEventHandler.model_validate(data)
    again = FeedbackEventHandler(**data, ensemble=in_memory._ensemble)
    assert again.store is in_memory.store


async def test_async_manual_postprocessing_teaches_the_postprocessor(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    """The async pattern runs the re-ranking in a thread; the latest query id must still reach this task."""
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(store=handler.store, policy="gradient"), top_n=2)
    question = "how do volcanoes erupt"
    candidates = await index.as_retriever(similarity_top_k=5).aretrieve(question)
    out = await pp.apostprocess_nodes(candidates, query_str=question)
    records = handler.record_feedback(score=1.0)
    assert out[0].node.metadata[EVENT_ID_KEY] in {r.event_id for r in records}
    assert _ensemble(pp).learner.n_learned == 1


def test_feedback_without_an_id_after_a_query_in_another_task_asks_for_the_id(
    index: Any, handler: FeedbackEventHandler
) -> None:
    # asyncio.run (or a notebook cell's await) runs the query in a task of its own: the caller's latest
    # query is still the earlier one, and feedback meant for the later query must not rate it
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
    engine.query("what causes the aurora borealis")
    first = handler.last_query_id

    async def ask() -> str | None:
        await engine.aquery("volcano lava")
        return handler.last_query_id

    later = asyncio.run(ask())
    assert later != first and handler.last_query_id == first
    with pytest.raises(ValidationError, match="ran in an asyncio task of its own"):
        handler.record_feedback(score=0.0)
    with pytest.raises(ValidationError, match="ran in an asyncio task of its own"):
        handler.retrievals()
    [record] = handler.record_feedback(later, score=0.0)  # with the id, as the error says
    assert record.event_id in [e["id"] for e in handler.retrievals(later)]
    engine.query("tides")  # a query in this task again: the implied id is back
    assert handler.record_feedback(score=1.0)


def test_a_handler_attached_to_a_dispatcher_and_its_parent_hears_each_event_once(
    index: Any, tmp_path: Any
) -> None:
    pp = FeedbackFusionPostprocessor.from_index(index, store=tmp_path / "pp.db", retrievers=("bm25",), top_n=2)
    retriever = index.as_retriever(similarity_top_k=4)
    question = "what causes the aurora"
    runs = []
    for children in ((), ("llamaindex_rlfb.postprocessor", "llama_index.core.base.base_retriever")):
        handler = FeedbackEventHandler(store=pp.store).attach()
        for name in children:
            handler.attach(get_dispatcher(name))
        pp.postprocess_nodes(retriever.retrieve(question), query_str=question)
        qid = handler.last_query_id
        assert qid is not None
        runs.append(qid.count("/reranked"))  # the re-ranking, linked once under its retrieval
        handler.detach()
    assert runs == [1, 1]


async def test_code_in_a_task_keeps_its_own_latest_query(index: Any, handler: FeedbackEventHandler) -> None:
    # a web server's request: another request's query, in a task of its own, is not this one's
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
    await engine.aquery("what causes the aurora borealis")
    mine = handler.last_query_id
    await asyncio.gather(engine.aquery("volcano lava"))  # a concurrent request, finished later
    [record] = handler.record_feedback(score=1.0)
    assert record.event_id in [e["id"] for e in handler.retrievals(mine)]


def test_a_later_task_asking_after_another_task_queried_asks_for_the_id(
    index: Any, handler: FeedbackEventHandler
) -> None:
    # a notebook: one cell queries, a cell with `await` queries in a task of its own, and the next cell
    # (another task) asks without an id: its latest query is the first cell's, which it must not rate
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
    engine.query("what causes the aurora borealis")

    async def next_cells() -> None:
        await asyncio.create_task(engine.aquery("volcano lava"))
        with pytest.raises(ValidationError, match="ran in an asyncio task of its own"):
            handler.record_feedback(score=1.0)

    asyncio.run(next_cells())


# -- from an audit of the LlamaIndex adapter ----------------------------------------------------------------
def test_a_documents_own_event_id_is_not_taken_for_an_rlfb_one(embed_model: Any, handler: Any) -> None:
    # every node carried the incident id "INC-42": the retrieval was taken as logged under it, so it never
    # was, and feedback on the query raised UnknownEventError
    from llama_index.core import Document, VectorStoreIndex

    docs = [Document(text="Outage in eu-west: an expired TLS certificate.", metadata={"event_id": "INC-42"}),
            Document(text="The failover drill lost no data.", metadata={"event_id": "INC-43"})]
    engine = VectorStoreIndex.from_documents(docs, embed_model=embed_model).as_query_engine(
        llm=MockLLM(), similarity_top_k=1)
    for question in ("what caused the outage?", "why did the outage happen?"):
        engine.query(question)
        (logged,) = handler.retrievals()
        assert logged["id"] != "INC-42" and logged["query"] == question
        assert len(handler.record_feedback(score=1.0)) == 1


def test_nodes_cut_after_the_rlfb_step_are_logged_as_what_was_shown(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    # the response's nodes still carried the re-ranking's event id, so what the user saw was never logged
    from llama_index.core.postprocessor import LongContextReorder

    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(store=handler.store), top_n=4, explore=False)
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=8, node_postprocessors=[pp, LongContextReorder()])
    response = engine.query("moon tides")
    shown = [n.node.node_id for n in response.source_nodes]
    logged = {e["metadata"]["component"]: [c["chunk_id"] for c in e["chunks"]] for e in handler.retrievals()}
    assert logged["response"] == shown != logged["FeedbackFusionPostprocessor"]
    # an rlfb step's output shown as it was is not logged twice
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=8, node_postprocessors=[pp])
    engine.query("moon tides")
    assert "response" not in {e["metadata"]["component"] for e in handler.retrievals()}


def test_late_feedback_still_teaches_the_adapter_that_decided(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # after KEPT newer decisions the handler forgot who made the first one: stored, never learned
    import llamaindex_rlfb._capture as capture

    monkeypatch.setattr(capture, "KEPT", 3)
    ens = make_ensemble(store=handler.store, policy="thompson")
    pp = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=2)
    nodes = index.as_retriever(similarity_top_k=6).retrieve("aurora")
    pp.postprocess_nodes(nodes, query_str="aurora borealis")
    first = handler.last_query_id
    for question in LEXICAL_QUERIES:
        pp.postprocess_nodes(nodes, query_str=question)
    before = ens.learner.n_learned
    handler.record_feedback(first, score=1.0)
    assert ens.learner.n_learned == before + 1


def test_the_handler_keeps_no_adapter_alive(handler: FeedbackEventHandler, make_ensemble: Any, nodes: Any) -> None:
    import gc
    import weakref

    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(store=handler.store), top_n=2)
    pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="aurora")
    gone = weakref.ref(pp)
    del pp
    gc.collect()
    assert gone() is None


def test_a_handler_given_a_self_indexing_postprocessor_uses_its_store(tmp_path: Any) -> None:
    # before its first call the postprocessor has no ensemble: the handler fell back to an in-memory store
    pp = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25",), top_n=2)
    handler = FeedbackEventHandler(ensemble=pp)
    assert handler.store_path == str(tmp_path / "fb.db")
    handler.close()


def test_adapter_feedback_on_an_unknown_id_speaks_llamaindex(make_ensemble: Any) -> None:
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(), top_n=2)
    retriever = FeedbackEnsembleRetriever(ensemble=make_ensemble())
    for adapter in (pp, retriever):
        with pytest.raises(UnknownEventError, match=r"metadata\['event_id'\]") as info:
            adapter.feedback("nope", "thumbs_up")
        assert "LangChain" not in str(info.value) and "FeedbackCallbackHandler" not in str(info.value)


def test_feedback_teaches_the_ensemble_of_an_adapter_built_per_request(make_ensemble: Any) -> None:
    # the handler held the adapter weakly, and an adapter made for one request was gone by the feedback
    import gc

    ens = make_ensemble(policy="gradient")
    handler = instrument(ens.store)  # no ensemble=: the maker is found through the events
    try:
        FeedbackEnsembleRetriever(ens, similarity_top_k=2).retrieve("aurora")
        query = handler.last_query_id
        gc.collect()
        before = ens.learner.n_learned
        handler.record_feedback(query, score=1.0)
        assert ens.learner.n_learned == before + 1
    finally:
        handler.detach()


def test_feedback_through_the_handler_during_a_re_index_is_carried_over(
    tmp_path: Any, nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pp.feedback waited for the re-index; the handler's feedback, the usual way, learned on the old index
    # and the state copied before the build missed it
    from rlfb import FeedbackEnsemble

    pp = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25",), top_n=2, policy="gradient")
    handler = FeedbackEventHandler(store=pp.store).attach()
    try:
        pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes[:2]], query_str="aurora solar wind")
        query = handler.last_query_id
        add = FeedbackEnsemble.add_chunks

        def add_after_feedback(self: FeedbackEnsemble, *args: Any, **kwargs: Any) -> list[str]:
            handler.record_feedback(query, score=1.0)  # arrives while the new index is being built
            return add(self, *args, **kwargs)

        monkeypatch.setattr(FeedbackEnsemble, "add_chunks", add_after_feedback)
        pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="glacier ice")
        assert len(_ensemble(pp)) == len(nodes) and _ensemble(pp).learner.n_learned == 1
    finally:
        handler.detach()
        handler.close()


def test_a_second_request_re_ranking_cached_nodes_gets_a_query_id_of_its_own(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    # the second re-ranking of the same first-stage nodes was chained under the first's run
    # ("<id>/reranked/reranked"), and the second user's thumbs down also rated the first user's decision
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(store=handler.store, policy="gradient"), top_n=2,
                                                   explore=False)  # both requests get the same ranking
    question = "what causes the aurora"
    cached = index.as_retriever(similarity_top_k=4).retrieve(question)
    first = pp.postprocess_nodes(cached, query_str=question)[0].node.metadata[EVENT_ID_KEY]
    qid_a = handler.last_query_id
    second = pp.postprocess_nodes(cached, query_str=question)[0].node.metadata[EVENT_ID_KEY]
    qid_b = handler.last_query_id
    records = handler.record_feedback(qid_b, score=0.0)
    assert second in {r.event_id for r in records} and first not in {r.event_id for r in records}
    assert handler.store.feedback(first) == []
    assert qid_a is not None and qid_b is not None
    assert qid_a.endswith(f"/reranked/{first}") and qid_b.endswith(f"/reranked/{second}")
    assert len(records) == 2  # its decision, and the candidates it re-ranked (a copy: the first run holds them)
    candidates = [e for e in handler.retrievals(qid_b) if e["id"] != second]
    assert [c["chunk_id"] for c in candidates[0]["chunks"]] == [n.node.node_id for n in cached]
    assert {r.event_id for r in handler.record_feedback(qid_a, score=1.0)} == {first, qid_a.split("/")[0]}
    assert _ensemble(pp).learner.n_learned == 2


@pytest.mark.parametrize("bare", [True, False])
def test_a_re_ranking_of_a_re_ranking_by_hand_joins_its_query_id(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any, bare: bool
) -> None:
    # each on a store of its own (learners on one store share their state), which the handler copies from
    pp1 = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(policy="gradient"), top_n=3)
    pp2 = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(policy="gradient"), top_n=2)
    question = "what causes the aurora"
    if bare:
        nodes = index.as_retriever(similarity_top_k=5).retrieve(question)
    else:  # nodes of the app's own: the first re-ranking stands alone
        nodes = [NodeWithScore(node=index.docstore.get_node(i)) for i in list(index.docstore.docs)[:5]]
    middle = pp1.postprocess_nodes(nodes, query_str=question)
    out = pp2.postprocess_nodes(middle, query_str=question)
    decisions = {middle[0].node.metadata[EVENT_ID_KEY], out[0].node.metadata[EVENT_ID_KEY]}
    assert decisions <= {e["id"] for e in handler.retrievals()}
    assert len(handler.retrievals()) == 2 + bare
    handler.record_feedback(score=1.0)
    assert _ensemble(pp1).learner.n_learned == _ensemble(pp2).learner.n_learned == 1


def test_feedback_naming_no_query_refuses_a_latest_query_that_raised(index: Any, handler: FeedbackEventHandler) -> None:
    # the latest query id moved to a query whose LLM raised, and feedback naming no query rated what that query
    # retrieved, which no user saw an answer from
    class Down(MockLLM):
        def complete(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the LLM is down")

    index.as_query_engine(llm=MockLLM(), similarity_top_k=2).query("tides")
    answered = handler.last_query_id
    with pytest.raises(RuntimeError, match="down"):
        index.as_query_engine(llm=Down(max_tokens=None), similarity_top_k=2).query("aurora")
    failed = handler.last_query_id
    assert failed != answered
    with pytest.raises(ValidationError, match="raised, so it gave no answer"):
        handler.record_feedback(score=1.0)
    assert handler.store.counts()["feedback"] == 0
    assert [r.event_id for r in handler.record_feedback(answered, score=1.0)]  # by id, as before
    index.as_query_engine(llm=MockLLM(), similarity_top_k=2).query("volcano")
    assert len(handler.record_feedback(score=1.0)) == 1  # the next query answered: the default again


def test_record_feedback_takes_langsmiths_key_second_as_the_langchain_handler_does(
    index: Any, handler: FeedbackEventHandler
) -> None:
    # record_feedback(qid, "user_score", score=1.0) was a TypeError (score given twice), and
    # record_feedback(qid, "user_score") said "score must be a number"
    index.as_query_engine(llm=MockLLM(), similarity_top_k=2).query("tides")
    qid = handler.last_query_id
    [keyed] = handler.record_feedback(qid, "user_score", score=1.0)
    assert keyed.reward == pytest.approx(1.0, abs=1e-3)
    assert handler.store.feedback(keyed.event_id)[-1]["key"] == "user_score"
    [scored] = handler.record_feedback(qid, 0.0)
    assert scored.reward == pytest.approx(-1.0, abs=1e-3)
    with pytest.raises(ValidationError, match="give the key once"):
        handler.record_feedback(qid, "user_score", score=1.0, key="other")
    with pytest.raises(ValidationError, match="a key or a score"):
        handler.record_feedback(qid, "user_score", 1.0)
    # a signal's name second, as FeedbackEnsemble.feedback takes it, was read as a key: "got none"
    [down] = handler.record_feedback(qid, "thumbs_down")
    assert down.reward == pytest.approx(-1.0, abs=1e-3) and handler.store.feedback(down.event_id)[-1]["key"] is None


@pytest.mark.parametrize("mode", ["context", "condense_plus_context"])
def test_feedback_naming_no_query_refuses_a_chat_turn_that_raised(index: Any, handler: FeedbackEventHandler,
                                                                  mode: str) -> None:
    # a chat engine's latest id is its retrieval's, which ended before the chat's LLM raised: feedback naming no
    # query rated the failed turn's retrieval
    class Down(MockLLM):
        def complete(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the LLM is down")

        def stream_complete(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the LLM is down")

    index.as_chat_engine(chat_mode=mode, llm=MockLLM()).chat("tides")
    answered = handler.last_query_id
    assert len(handler.record_feedback(score=1.0)) == 1
    with pytest.raises(RuntimeError, match="down"):
        index.as_chat_engine(chat_mode=mode, llm=Down(max_tokens=None)).chat("aurora")
    assert handler.last_query_id != answered
    with pytest.raises(ValidationError, match="raised, so it gave no answer"):
        handler.record_feedback(score=1.0)
    index.as_chat_engine(chat_mode=mode, llm=MockLLM()).chat("volcano")
    assert len(handler.record_feedback(score=1.0)) == 1  # the next turn answered: the default again


@pytest.mark.parametrize("borrow", ["ensemble", "store"])
def test_close_leaves_open_a_store_the_handler_borrowed(tmp_path: Any, borrow: str) -> None:
    # handler.close() closed the postprocessor's own store, and every later query through it raised
    # "FeedbackStore is closed"
    nodes = [TextNode(id_="a", text="the aurora is caused by the solar wind"), TextNode(id_="b", text="tides")]
    pp = FeedbackFusionPostprocessor(store=str(tmp_path / "fb.db"), retrievers=("bm25",), top_n=1, nodes=nodes)
    borrowed: dict[str, Any] = {borrow: pp if borrow == "ensemble" else pp.store}
    handler = FeedbackEventHandler(**borrowed).attach()
    pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="aurora")
    handler.record_feedback(score=1.0)
    handler.close()
    assert [n.node.node_id for n in pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes],
                                                         query_str="tides")] == ["b"]
    # one it opened itself, from a path, it closes
    own = FeedbackEventHandler(store=tmp_path / "fb.db")
    own.close()
    with pytest.raises(RlfbError, match="closed"):
        own.store.log_event("q", {"weights": {"bm25": 1.0}}, chunks=[])


def test_a_handler_refuses_a_copy_or_pickle_by_name(tmp_path: Any) -> None:
    # a bare "TypeError: cannot pickle '_thread.RLock' object", where the README promises NotCopyableError
    import copy
    import pickle

    from rlfb import NotCopyableError

    handler = FeedbackEventHandler(store=tmp_path / "fb.db")
    for duplicate in (copy.deepcopy, pickle.dumps):
        with pytest.raises(NotCopyableError, match="FeedbackEventHandler cannot be copied or pickled"):
            duplicate(handler)
    assert FeedbackEventHandler(**handler.model_dump()).store_path == handler.store_path  # what it says to do
    handler.close()


def test_nodes_a_later_step_cut_take_no_share_of_praise_of_the_answer(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    # the learner was rated on its whole decision: a thumbs up on the answer praised a node a later step cut
    # before the LLM saw it, and the README says feedback on the answer speaks for the chunks it used
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class DropFirst(BaseNodePostprocessor):  # any later cut: a similarity cutoff, a dedup, a token budget
        def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: Any = None) -> list[NodeWithScore]:
            return nodes[1:]

    ens = make_ensemble(store=handler.store, policy="thompson")
    pp = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=3, explore=False)
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=6, node_postprocessors=[pp, DropFirst()])
    used = [n.node.node_id for n in engine.query("moon tides").source_nodes]
    decision = next(e for e in handler.retrievals() if e["metadata"]["component"] == "FeedbackFusionPostprocessor")
    cut = [c["chunk_id"] for c in decision["chunks"] if c["chunk_id"] not in used]
    assert len(cut) == 1 and {c["chunk_id"]: c["used"] for c in decision["chunks"]} == {
        **{u: True for u in used}, cut[0]: False}
    before = ens.learner.confidence.confidence(cut)[0]
    [record] = [r for r in handler.record_feedback(score=1.0) if r.event_id == decision["id"]]
    assert set(record.chunk_rewards) == set(used)  # the praise went to the answer's chunks only
    assert ens.learner.confidence.confidence(cut)[0] == before  # neither praised nor read as passed over
    assert ens.learner.memory.known("moon tides").get(cut[0], 0.0) == 0.0


def _keeping(n: int) -> Any:
    """A later step that keeps the first ``n`` nodes it is given (0: a cutoff above all of them)."""
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class Keeping(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: Any = None) -> list[NodeWithScore]:
            return nodes[:n]

    return Keeping()


def test_nodes_of_a_decision_a_later_step_cut_whole_take_no_share_of_praise_of_the_answer(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    # a cutoff above every node: no response node named the decision any more, so none was marked unused, and a
    # thumbs up on the answer (written without them) praised every one
    ens = make_ensemble(store=handler.store, policy="thompson")
    pp = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=3, explore=False)
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=6, node_postprocessors=[pp, _keeping(0)])
    assert engine.query("moon tides").source_nodes == []
    decision = next(e for e in handler.retrievals() if e["metadata"]["component"] == "FeedbackFusionPostprocessor")
    ranked = [c["chunk_id"] for c in decision["chunks"]]
    assert len(ranked) == 3 and [c["used"] for c in decision["chunks"]] == [False] * 3
    assert [c["used"] for c in ens.store.event(decision["id"])["chunks"]] == [False] * 3  # the learner's too
    before = ens.learner.confidence.confidence(ranked).tolist()
    [record] = [r for r in handler.record_feedback(score=1.0) if r.event_id == decision["id"]]
    assert record.chunk_rewards == {}  # the praise reached none of them
    assert ens.learner.confidence.confidence(ranked).tolist() == before
    assert not any(ens.learner.memory.known("moon tides").get(c, 0.0) > 0 for c in ranked)
    # a later step that keeps a node of the decision (here its first) leaves the whole-cut rule out of it
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=6, node_postprocessors=[pp, _keeping(1)])
    kept = engine.query("moon tides").source_nodes[0].node.node_id
    decision = [e for e in handler.retrievals() if e["metadata"]["component"] == "FeedbackFusionPostprocessor"][-1]
    assert {c["chunk_id"]: c["used"] for c in decision["chunks"]}[kept] is True


def test_a_recursive_retrievers_followed_index_nodes_stay_used(handler: FeedbackEventHandler) -> None:
    # a RecursiveRetriever over an rlfb retriever of index nodes answers from the nodes they point to: none of
    # the decision's nodes is among the response's, and the whole-cut rule took them all for cut (a review found
    # praise of the answer reaching none of them)
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.retrievers import RecursiveRetriever
    from llama_index.core.schema import IndexNode

    pointers = [IndexNode(id_=f"ptr-{i}", text=t, index_id="detail") for i, t in zip(IDS, TEXTS, strict=True)]
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=[p.node_id for p in pointers], retrievers=("bm25",),
                                      store=handler.store, policy="thompson")
    top = FeedbackEnsembleRetriever(ens, similarity_top_k=2, nodes={p.node_id: p for p in pointers}, explore=False)

    class Detail(BaseRetriever):
        def _retrieve(self, query_bundle: Any) -> list[NodeWithScore]:
            return [NodeWithScore(node=TextNode(id_="detail-part", text="the moon pulls the tides"), score=1.0)]

    engine = RetrieverQueryEngine.from_args(RecursiveRetriever("root", {"root": top, "detail": Detail()}),
                                            llm=MockLLM())
    assert [n.node.node_id for n in engine.query("moon tides").source_nodes] == ["detail-part"]
    decision = next(e for e in handler.retrievals() if e["metadata"]["component"] == "FeedbackEnsembleRetriever")
    assert [c["used"] for c in decision["chunks"]] == [True, True]
    [record] = [r for r in handler.record_feedback(score=1.0) if r.event_id == decision["id"]]
    assert set(record.chunk_rewards) == {c["chunk_id"] for c in decision["chunks"]}


def test_an_rlfb_retrievers_nodes_a_later_step_cut_whole_are_marked_unused(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    ens = make_ensemble(store=handler.store, policy="thompson")
    retriever = FeedbackEnsembleRetriever(ens, similarity_top_k=3, explore=False)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM(), node_postprocessors=[_keeping(0)])
    assert engine.query("moon tides").source_nodes == []
    decision = next(e for e in handler.retrievals() if e["metadata"]["component"] == "FeedbackEnsembleRetriever")
    assert [c["used"] for c in decision["chunks"]] == [False] * 3


@pytest.mark.parametrize("given", ["fb.db", 5, object()])
def test_a_handler_refuses_an_ensemble_that_is_none_of_rlfbs(given: Any) -> None:
    # kept silently: the handler fell back to an in-memory store of its own and taught nothing
    with pytest.raises(ValidationError, match="ensemble must be an rlfb.FeedbackEnsemble"):
        FeedbackEventHandler(ensemble=given)


def test_a_chat_turn_that_raised_before_it_retrieved_is_not_rated_by_feedback_naming_no_query(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    # the latest query stayed on the turn before (a chat turn has no QueryStartEvent, and this one never
    # retrieved): a thumbs down on the failed turn was recorded on that good answer and taught the learner
    from llama_index.core.chat_engine import ContextChatEngine
    from llama_index.core.retrievers import BaseRetriever

    class Flaky(BaseRetriever):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner, self.fail = inner, False

        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            if self.fail:
                raise RuntimeError("vector store down")
            return self.inner.retrieve(query_bundle)

    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(store=handler.store), top_n=2)
    flaky = Flaky(index.as_retriever(similarity_top_k=5))
    chat = ContextChatEngine.from_defaults(retriever=flaky, node_postprocessors=[pp], llm=MockLLM())
    chat.chat("what makes the sky glow green")
    first = handler.last_query_id
    flaky.fail = True
    with pytest.raises(RuntimeError):
        chat.chat("and the tides?")
    with pytest.raises(ValidationError, match="raised"):
        handler.record_feedback(score=0.0)
    assert handler.record_feedback(first, score=1.0)  # the good turn is still rated by its id


def test_a_click_on_a_citation_engines_source_teaches_the_ranked_node_it_was_cut_from(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    # a CitationQueryEngine's sources are new nodes cut from the ranked ones: a click on one was stored on the
    # response's copy and taught no learner, silently
    from llama_index.core.query_engine import CitationQueryEngine

    ens = make_ensemble(store=handler.store, policy="thompson")
    pp = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=2)
    engine = CitationQueryEngine.from_args(index, llm=MockLLM(), similarity_top_k=5, node_postprocessors=[pp])
    source = engine.query("moon tides").source_nodes[0].node
    decided = next(e for e in handler.retrievals() if e["metadata"]["component"] == "FeedbackFusionPostprocessor")
    ranked = decided["chunks"][source.metadata["rank"] - 1]["chunk_id"]
    assert source.node_id != ranked
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        records = handler.record_feedback(handler.last_query_id, signal="click", chunk_id=source.node_id)
    [learned] = [r for r in records if r.event_id == decided["id"]]
    assert list(learned.chunk_rewards) == [ranked] and learned.chunk_rewards[ranked] == pytest.approx(0.4, abs=1e-3)
    assert ens.learner.n_learned == 1


def test_feedback_on_an_outer_query_reaches_a_nested_query_engines_retrievals(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    # a query engine run inside another (a router's choice, a sub-question) was not linked to the query around
    # it: feedback on the outer query id, the one the app holds, never reached the learner that ranked the nodes
    ens = make_ensemble(store=handler.store, policy="thompson")
    pp = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=2, explore=False)
    inner = index.as_query_engine(llm=MockLLM(), similarity_top_k=5, node_postprocessors=[pp])
    response = _router(inner).query("moon tides")
    outer = handler.last_query_id
    assert outer is not None and outer.startswith("RouterQueryEngine.query-")
    decision = response.source_nodes[0].node.metadata[EVENT_ID_KEY]
    assert decision in {e["id"] for e in handler.retrievals(outer)}  # the inner engine's ranking
    records = handler.record_feedback(outer, score=1.0)
    assert decision in {r.event_id for r in records} and ens.learner.n_learned == 1


def _router(*engines: Any) -> Any:
    """A ``RouterQueryEngine`` over ``engines`` that selects every one of them, without an LLM to choose."""
    from llama_index.core.base.base_selector import BaseSelector, SelectorResult, SingleSelection
    from llama_index.core.query_engine import RouterQueryEngine
    from llama_index.core.tools import QueryEngineTool

    class Every(BaseSelector):
        def _get_prompts(self) -> dict[str, Any]:
            return {}

        def _update_prompts(self, prompts: Any) -> None:
            pass

        def _select(self, choices: Any, query: Any) -> SelectorResult:
            return SelectorResult(selections=[SingleSelection(index=i, reason="") for i in range(len(choices))])

        async def _aselect(self, choices: Any, query: Any) -> SelectorResult:
            return self._select(choices, query)

    tools = [QueryEngineTool.from_defaults(e, description=f"engine {i}") for i, e in enumerate(engines)]
    return RouterQueryEngine(selector=Every(), query_engine_tools=tools, llm=MockLLM())


@pytest.mark.parametrize("wrapper", ["router", "transform"])
def test_an_engine_that_returns_the_inner_engines_response_logs_it_once(
    index: Any, handler: FeedbackEventHandler, wrapper: str
) -> None:
    # a router with one selection, or a TransformQueryEngine, returns the inner engine's response as its own:
    # it was logged again as "<outer query id>/response", so one thumbs up on the outer query gave two feedback
    # rows on the one list the user saw
    from llama_index.core.indices.query.query_transform.base import IdentityQueryTransform
    from llama_index.core.query_engine import TransformQueryEngine

    inner = index.as_query_engine(llm=MockLLM(), similarity_top_k=3)
    outer = _router(inner) if wrapper == "router" else TransformQueryEngine(inner, IdentityQueryTransform())
    response = outer.query("moon tides")
    qid = handler.last_query_id
    assert qid is not None and qid.startswith(f"{type(outer).__name__}.query-")
    [event] = handler.retrievals(qid)
    assert [c["chunk_id"] for c in event["chunks"]] == [n.node.node_id for n in response.source_nodes]
    assert event["metadata"]["component"] == "VectorIndexRetriever"
    assert [r.event_id for r in handler.record_feedback(qid, score=1.0)] == [event["id"]]


def test_a_transform_that_rewrites_the_question_still_logs_the_users_own(
    index: Any, handler: FeedbackEventHandler
) -> None:
    # the inner engine logged the rewritten question; the list the user saw is the same, but the question is
    # theirs, which the store's statistics, exports and follow-ups read: the outer response is logged as before
    from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
    from llama_index.core.query_engine import TransformQueryEngine

    class Rewrite(BaseQueryTransform):
        def _get_prompts(self) -> dict[str, Any]:
            return {}

        def _update_prompts(self, prompts: Any) -> None:
            pass

        def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
            return QueryBundle(query_str="lunar gravity and the ocean")

    inner = index.as_query_engine(llm=MockLLM(), similarity_top_k=3)
    TransformQueryEngine(inner, Rewrite()).query("why does the sea rise twice a day")
    qid = handler.last_query_id
    assert qid is not None
    events = handler.retrievals(qid)
    assert [(e["query"], e["metadata"]["component"]) for e in events] == [
        ("lunar gravity and the ocean", "VectorIndexRetriever"), ("why does the sea rise twice a day", "response")]
    assert [c["chunk_id"] for c in events[0]["chunks"]] == [c["chunk_id"] for c in events[1]["chunks"]]


def test_a_router_that_combines_two_engines_logs_the_combined_response(
    index: Any, handler: FeedbackEventHandler
) -> None:
    # the combined response's nodes are no one engine's list: the user saw them together, so they are logged
    response = _router(index.as_query_engine(llm=MockLLM(), similarity_top_k=2),
                       index.as_query_engine(llm=MockLLM(), similarity_top_k=3)).query("moon tides")
    qid = handler.last_query_id
    assert qid is not None
    events = handler.retrievals(qid)
    assert [e["metadata"]["component"] for e in events] == ["VectorIndexRetriever", "VectorIndexRetriever",
                                                             "response"]
    # both engines found doc2 and doc9: the list is logged once per node, as the response first names it
    shown = list(dict.fromkeys(n.node.node_id for n in response.source_nodes))
    assert len(shown) < len(response.source_nodes)
    assert [c["chunk_id"] for c in events[-1]["chunks"]] == shown


def test_a_citation_engines_sources_leave_the_ranked_nodes_they_were_cut_from_used(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any
) -> None:
    # every source of a CitationQueryEngine is a new node cut from a ranked one, so none of the decision's node
    # ids is among them: the whole decision was marked unused, and praise of the answer reached none of it
    from llama_index.core.query_engine import CitationQueryEngine

    ens = make_ensemble(store=handler.store, policy="thompson")
    pp = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=2, explore=False)
    engine = CitationQueryEngine.from_args(index, llm=MockLLM(), similarity_top_k=5, node_postprocessors=[pp])
    sources = engine.query("moon tides").source_nodes
    decided = next(e for e in handler.retrievals() if e["metadata"]["component"] == "FeedbackFusionPostprocessor")
    ranked = [c["chunk_id"] for c in decided["chunks"]]
    assert not {s.node.node_id for s in sources} & set(ranked)  # all derived copies
    assert [c["used"] for c in decided["chunks"]] == [True, True]
    [record] = [r for r in handler.record_feedback(score=1.0) if r.event_id == decided["id"]]
    assert set(record.chunk_rewards) == set(ranked) and ens.learner.n_learned == 1


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_a_handler_on_the_root_and_on_child_dispatchers_handles_each_event_once(make_ensemble: Any) -> None:
    # without the check of events already handled, a handler attached to a dispatcher and to its parent heard
    # every event of that dispatcher twice and linked the re-ranking under the bare retrieval twice
    handler = FeedbackEventHandler()
    retriever = FeedbackEnsembleRetriever(make_ensemble(store=handler.store), similarity_top_k=4, explore=False)
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(store=handler.store), top_n=2, explore=False)
    children = [get_dispatcher("llamaindex_rlfb.postprocessor"), get_dispatcher("llamaindex_rlfb.retriever")]
    before = {id(d): (list(d.event_handlers), list(d.span_handlers)) for d in children}
    try:
        handler.attach()
        for d in children:
            handler.attach(d)
        out = pp.postprocess_nodes(retriever.retrieve("aurora"), query_str="aurora")
        qid = handler.last_query_id
        assert qid is not None and qid.count("/reranked/") == 1
        events = handler.store.resolve_run(qid)
        assert len(events) == 2 and out[0].node.metadata["event_id"] in events
        assert len(handler.record_feedback(score=1.0)) == 2
    finally:
        handler.close()
        for d in children:
            d.event_handlers, d.span_handlers = before[id(d)]
    for d in children:
        assert not any(h is handler for h in d.event_handlers)


def test_score_is_read_with_the_handlers_signed_scale(index: Any) -> None:
    # record_feedback did not pass its score_scale on: score=0.0 of a "signed" handler (neutral) was read on the
    # unit scale, a thumbs down
    with FeedbackEventHandler(score_scale="signed") as handler:
        index.as_query_engine(llm=MockLLM(), similarity_top_k=2).query("what causes the aurora borealis")
        qid = handler.last_query_id
        [record] = handler.record_feedback(qid, score=0.0)
        assert record.reward == pytest.approx(0.0, abs=1e-3)
        [record] = handler.record_feedback(qid, score=-1.0)
        assert record.reward == pytest.approx(-1.0, abs=1e-3)
    handler.close()


def test_a_re_ranking_for_another_question_is_not_linked_under_the_bare_retrieval(
    index: Any, make_ensemble: Any
) -> None:
    # the question was not compared: re-ranking cached "aurora" nodes for "solar power" was linked under the aurora
    # retrieval, and feedback on the solar power answer rated the aurora candidates too
    with FeedbackEventHandler() as handler:
        pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(store=handler.store), top_n=2)
        got = index.as_retriever(similarity_top_k=4).retrieve("aurora")
        bare = handler.last_query_id
        out = pp.postprocess_nodes(got, query_str="solar power")
        qid = handler.last_query_id
        events = handler.store.resolve_run(qid)
        assert len(events) == 1  # the re-ranking alone, not the aurora candidates beside it
        assert qid != bare and qid == out[0].node.metadata["event_id"] == events[0]
        assert handler.store.event(events[0])["query"] == "solar power"
        assert len(handler.record_feedback(score=1.0)) == 1
    handler.close()


def test_feedback_teaches_a_long_lived_ensemble_after_its_per_request_adapter_is_gone(make_ensemble: Any) -> None:
    # the handler did not remember which learner made a decision: once the per-request adapter was collected,
    # feedback was stored in the handler's own store only and the ensemble (on another store) never learned
    ens = make_ensemble(policy="gradient")
    with FeedbackEventHandler(store=FeedbackStore()) as handler:
        assert handler.store is not ens.store
        retriever = FeedbackEnsembleRetriever(ens, similarity_top_k=2)
        retriever.retrieve("aurora")
        gone = weakref.ref(retriever)
        del retriever
        gc.collect()
        assert gone() is None  # the adapter really was collected
        learned = ens.learner.n_learned
        records = handler.record_feedback(handler.last_query_id, score=1.0)
        assert len(records) == 2  # the handler's copy and the learner's own event
        assert ens.learner.n_learned == learned + 1
        assert ens.store.counts()["feedback"] == 1
    handler.close()
