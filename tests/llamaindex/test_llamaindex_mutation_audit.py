"""Guards found by a mutation audit of the LlamaIndex adapter: each test fails with one surviving mutant."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.llms import MockLLM
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode

from llamaindex_rlfb import FeedbackEnsembleRetriever, FeedbackEventHandler, FeedbackFusionPostprocessor
from rlfb.store import FeedbackStore


def test_an_option_given_to_from_dict_wins_over_the_dumped_one(tmp_path: Any, nodes: list[TextNode]) -> None:
    # the dump's options were merged over the explicit keywords: a rebuild asked for candidate_k=9 and silently
    # kept the dumped 7
    pp = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25",), nodes=nodes, candidate_k=7)
    data = pp.to_dict()
    assert data["options"] == {"candidate_k": 7}
    rebuilt = FeedbackFusionPostprocessor.from_dict(data, nodes=nodes, candidate_k=9)
    assert rebuilt.ensemble is not None
    assert rebuilt.ensemble.candidate_k == 9 and rebuilt.options["candidate_k"] == 9
    default = FeedbackFusionPostprocessor.from_dict(data, nodes=nodes).ensemble
    assert default is not None
    assert default.candidate_k == 7  # none given: the dump's


def test_an_inserted_node_is_returned_as_inserted(nodes: list[TextNode]) -> None:
    # insert_nodes indexed the text but kept no node: the hit came back as a bare TextNode built from the chunk,
    # without its source document (ref_doc_id) or its metadata keys hidden from the LLM
    retriever = FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25",), similarity_top_k=1)
    inserted = TextNode(id_="n9", text="Penguins huddle together through the antarctic winter.",
                        metadata={"secret": "x"}, excluded_llm_metadata_keys=["secret"],
                        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="doc-7")})
    retriever.insert_nodes([inserted])
    [hit] = retriever.retrieve("penguins in the antarctic winter")
    assert hit.node.node_id == "n9"
    assert hit.node.ref_doc_id == "doc-7"
    assert "secret" in hit.node.excluded_llm_metadata_keys
    assert hit.node.metadata["secret"] == "x"


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
