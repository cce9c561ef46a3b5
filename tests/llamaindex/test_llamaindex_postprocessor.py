"""FeedbackFusionPostprocessor in real query engines, its learning, and bad input."""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pytest
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import ImageNode, NodeWithScore, QueryBundle, TextNode
from typing_extensions import assert_type

from llamaindex_rlfb import EVENT_ID_KEY, METADATA_KEYS, FeedbackFusionPostprocessor
from rlfb import EmptyCorpusError, FeedbackEnsemble, NoStoreError, UnknownOptionError, ValidationError
from rlfb.store import FeedbackRecord, FeedbackStore

from _li_corpus import IDS, TEXTS
from _threads import Gate, cancel_inside

QUERY = "what causes the northern lights aurora"


def _ensemble(pp: FeedbackFusionPostprocessor) -> FeedbackEnsemble:
    """``pp.ensemble``, built by now (``None`` only before a self-indexing postprocessor's first call)."""
    assert pp.ensemble is not None
    return pp.ensemble


def _check_reranked(out: list[NodeWithScore], pp: FeedbackFusionPostprocessor, top_n: int) -> str:
    assert len(out) == top_n
    event_ids = {n.node.metadata[EVENT_ID_KEY] for n in out}
    assert len(event_ids) == 1
    (eid,) = event_ids
    event = pp.store.event(eid)
    assert [c["chunk_id"] for c in event["chunks"]] == [n.node.node_id for n in out]
    assert [c["score"] for c in event["chunks"]] == pytest.approx([n.score for n in out])  # fused scores
    assert [n.node.metadata["rank"] for n in out] == list(range(1, top_n + 1))
    for n in out:  # every retriever scored every node; the adapter's keys stay out of the LLM's text
        assert set(n.node.metadata["scores"]) == set(pp.weights)
        assert all(v is not None and math.isfinite(v) for v in n.node.metadata["scores"].values())
        assert not set(METADATA_KEYS) & set(n.node.metadata) - set(n.node.excluded_llm_metadata_keys)
    return eid


def test_in_as_query_engine(index: Any, make_ensemble: Any) -> None:
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(policy="gradient"), top_n=3)
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=6, node_postprocessors=[pp])
    response = engine.query(QUERY)
    eid = _check_reranked(response.source_nodes, pp, 3)
    assert response.source_nodes[0].node.node_id in {"doc0", "doc1"}
    assert pp.store.event(eid)["metadata"]["framework"] == "llamaindex"
    # the source nodes are copies: the docstore's nodes are unchanged
    assert EVENT_ID_KEY not in index.docstore.get_node(response.source_nodes[0].node.node_id).metadata


def test_in_retriever_query_engine(index: Any, make_ensemble: Any) -> None:
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(), top_n=2)
    engine = RetrieverQueryEngine.from_args(index.as_retriever(similarity_top_k=5), llm=MockLLM(),
                                            node_postprocessors=[pp])
    response = engine.query("why are there tides")
    _check_reranked(response.source_nodes, pp, 2)
    assert {n.node.node_id for n in response.source_nodes} <= {"doc2", "doc9", "doc0", "doc1", "doc3"}
    assert response.source_nodes[0].node.metadata["source"].endswith(".txt")  # original metadata kept


async def test_aquery(index: Any, make_ensemble: Any) -> None:
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(), top_n=2)
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=5, node_postprocessors=[pp])
    response = await engine.aquery("how do volcanoes erupt")
    eid = _check_reranked(response.source_nodes, pp, 2)
    assert response.source_nodes[0].node.node_id in {"doc3", "doc8"}
    assert assert_type(pp.feedback(eid, "thumbs_up"), list[FeedbackRecord])[0].reward > 0  # typed


async def test_a_cancelled_apostprocess_nodes_logs_nothing(
    nodes: list[TextNode], make_ensemble: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # asyncio.wait_for timing out cancels apostprocess_nodes, but its worker thread went on and logged the
    # re-ranking nobody saw: the session's "previous retrieval" from then on, and a decision nobody rates
    ens = make_ensemble()
    pp = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=2)
    scoring = Gate(ens.rerank_context)
    monkeypatch.setattr(ens, "rerank_context", scoring)  # the slow part waits until the caller is gone
    given = [NodeWithScore(node=n, score=1.0) for n in nodes[:5]]
    await cancel_inside(pp.apostprocess_nodes(given, query_str="why do tides happen"), scoring)
    assert ens.store.counts()["events"] == 0
    out = await pp.apostprocess_nodes(given, query_str="why do tides happen")  # the next call is logged as ever
    assert ens.store.counts()["events"] == 1
    _check_reranked(out, pp, 2)


def test_from_index_and_nodes_outside_the_index(index: Any, fast_dense: dict[str, Any]) -> None:
    pp = FeedbackFusionPostprocessor.from_index(index, top_n=3, **fast_dense)
    assert len(_ensemble(pp)) == len(TEXTS)
    outsider = TextNode(id_="new", text="Auroras are caused by the solar wind exciting oxygen atoms.")
    given = [NodeWithScore(node=outsider, score=0.1)] + [
        NodeWithScore(node=index.docstore.get_node(i), score=0.5) for i in ("doc2", "doc6", "doc1")
    ]
    out = pp.postprocess_nodes(given, query_str="what causes auroras")
    _check_reranked(out, pp, 3)
    assert out[0].node.node_id == "new"  # scored from its text by BM25 and dense


def test_learns_from_feedback(make_ensemble: Any, nodes: list[TextNode]) -> None:
    """A user who clicks what BM25 likes best moves the weight towards BM25."""
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(policy="gradient"), top_n=3)
    assert pp.weights == pytest.approx({"bm25": 0.5, "dense": 0.5})
    given = [NodeWithScore(node=n) for n in nodes]
    for _ in range(15):
        for query in ("what makes the sky glow green", "moon", "hot rock from mountains", "titanium 400 bar"):
            out = pp.postprocess_nodes(given, query_str=query)
            lexical = max(out, key=lambda n: n.node.metadata["scores"]["bm25"]).node
            pp.feedback(lexical.metadata[EVENT_ID_KEY], "click", chunk_id=lexical.node_id)
    assert pp.weights["bm25"] > 0.52 > 0.48 > pp.weights["dense"]
    assert pp.store.counts()["feedback"] == 60
    assert pp.store.load_policy_state()["weights"] == pytest.approx(pp.weights)


def test_explore_false_is_greedy_and_repeatable(make_ensemble: Any, nodes: list[TextNode]) -> None:
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(policy="thompson"), top_n=4, explore=False)
    given = [NodeWithScore(node=n) for n in nodes]
    runs = [pp.postprocess_nodes(given, query_str="moon tides") for _ in range(5)]
    assert len({tuple(n.node.node_id for n in run) for run in runs}) == 1
    scores = [n.score for n in runs[0]]
    assert scores == sorted(cast("list[float]", scores), reverse=True)  # every node scored (None would raise)


def test_log_false_evaluates_without_writing_to_the_store(
    tmp_path: Any, make_ensemble: Any, nodes: list[TextNode]
) -> None:
    ens = make_ensemble(store=tmp_path / "fb.db", policy="thompson")
    logged = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=4, explore=False)
    quiet = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=4, explore=False, log=False)
    given = [NodeWithScore(node=n) for n in nodes]
    want = [n.node.node_id for n in logged.postprocess_nodes(given, query_str="moon tides")]
    before = ens.store.counts()
    got = quiet.postprocess_nodes(given, query_str="moon tides")
    assert [n.node.node_id for n in got] == want  # the same greedy ranking
    assert ens.store.counts() == before  # nothing written
    assert all(n.node.metadata["event_id"] is None for n in got)
    assert FeedbackFusionPostprocessor.from_dict(quiet.to_dict(), ensemble=ens).log is False
    with pytest.raises(ValidationError, match="log"):
        FeedbackFusionPostprocessor.from_ensemble(ens, log="no")  # type: ignore[arg-type]


def test_self_indexing_without_a_corpus(
    tmp_path: Any, nodes: list[TextNode], fast_dense: dict[str, Any]
) -> None:
    pp = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25", "dense"), top_n=2,
                                     **fast_dense)
    assert pp.ensemble is None
    assert pp.weights == pytest.approx({"bm25": 0.5, "dense": 0.5})  # before anything was indexed
    first = pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes[:4]], query_str="aurora solar wind")
    assert len(_ensemble(pp)) == 4 and first[0].node.node_id == "doc0"
    pp.feedback(first[0].node.metadata[EVENT_ID_KEY], "thumbs_up")
    learned = pp.weights
    # one unseen node: scored from its text, no re-index yet
    out = pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes[3:5]], query_str="titanium bolt XK-4471")
    assert len(_ensemble(pp)) == 4 and out[0].node.node_id == "doc4"
    # many unseen nodes: the index is rebuilt over every node seen, and the learned state carries over
    pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="glacier ice")
    assert len(_ensemble(pp)) == len(TEXTS)
    assert pp.weights == pytest.approx(learned)
    assert (tmp_path / "fb.db").is_file()


def test_from_dict_reopens_the_same_store_file(tmp_path: Any, nodes: list[TextNode], make_ensemble: Any) -> None:
    path = tmp_path / "fb.db"
    pp = FeedbackFusionPostprocessor(store=path, retrievers=("bm25",), top_n=2, policy="thompson", seed=7,
                                     nodes=nodes)
    out = pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="aurora")
    data = pp.to_dict()
    assert data["store_path"] == str(path) and data["not_serialised"] == ["nodes"]  # the corpus is not dumped
    with pytest.raises(ValidationError, match="pass nodes= again"):
        FeedbackFusionPostprocessor.from_dict(data)
    twin = FeedbackFusionPostprocessor.from_json(pp.to_json(), nodes=nodes)
    assert twin.store.path == str(path) and twin.top_n == 2
    assert _ensemble(twin).retriever_names == ("bm25",) and _ensemble(twin).learner.policy_name == "thompson"
    assert twin.options == {"seed": 7}
    assert twin.feedback(out[0].node.metadata[EVENT_ID_KEY], "thumbs_up")[0].reward > 0  # pp's event, same file

    # self-indexing: nothing to pass again
    alone = FeedbackFusionPostprocessor(store=path, retrievers=("bm25",))
    assert alone.policy == "thompson"  # the default learner, as LangChain's
    assert FeedbackFusionPostprocessor.from_dict(alone.to_dict()).store.path == str(path)

    # an in-memory store is never silently replaced by a new one
    in_memory = FeedbackFusionPostprocessor(retrievers=("bm25",), nodes=nodes)
    with pytest.raises(ValidationError, match="pass store=, nodes= again"):
        FeedbackFusionPostprocessor.from_dict(in_memory.to_dict())
    assert FeedbackFusionPostprocessor.from_dict(in_memory.to_dict(), store=in_memory.store,
                                                 nodes=nodes).store is in_memory.store

    # an ensemble travels by reference; it must be on the dumped file
    ens = make_ensemble(store=FeedbackStore(path))
    data = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=2).to_dict()
    with pytest.raises(ValidationError, match="pass ensemble= again"):
        FeedbackFusionPostprocessor.from_dict(data)
    assert FeedbackFusionPostprocessor.from_dict(data, ensemble=ens).ensemble is ens
    with pytest.raises(ValidationError, match="different stores"):
        FeedbackFusionPostprocessor.from_dict(data, ensemble=make_ensemble())


def test_a_dump_rebuilds_through_the_constructor_and_model_validate(tmp_path: Any, nodes: list[TextNode]) -> None:
    # Every LlamaIndex dump carries "class_name"; it must not be taken for an ensemble option
    path = tmp_path / "fb.db"
    alone = FeedbackFusionPostprocessor(store=path, retrievers=("bm25",), top_n=1, seed=3)
    for data in (alone.to_dict(), alone.model_dump()):
        assert data["class_name"] == "FeedbackFusionPostprocessor"
        for twin in (FeedbackFusionPostprocessor(**data), FeedbackFusionPostprocessor.model_validate(data)):
            assert twin.options == {"seed": 3}
            [out] = twin.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="aurora")
            assert out.node.metadata[EVENT_ID_KEY]


def test_an_unknown_ensemble_option_fails_at_construction(nodes: list[TextNode]) -> None:
    # Self-indexing builds the ensemble at the first query: a typo used to surface there, as a TypeError
    with pytest.raises(ValidationError, match=r"unknown ensemble options \['candidat_k'\]"):
        FeedbackFusionPostprocessor(retrievers=("bm25",), candidat_k=50)
    with pytest.raises(ValidationError, match="unknown ensemble options"):
        FeedbackFusionPostprocessor.from_dict({"retrievers": ["bm25"], "options": {"rrf": 60}})
    # the postprocessor's own options are named too: stor= listed every ensemble option but store
    with pytest.raises(UnknownOptionError, match=r"\['stor'\] \(did you mean 'store'\?\)"):
        FeedbackFusionPostprocessor(retrievers=("bm25",), stor="fb.db")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"policy": "thompsen"}, "unknown policy"),
        ({"fusion": "max"}, "unknown fusion"),
        ({"candidate_k": 0}, "candidate_k"),
        ({"weights": {"bm25": float("nan")}}, "finite"),
        ({"retrievers": ("bm26",)}, "unknown retriever"),
        ({"seed": "x"}, "seed"),
        ({"refresh_interval": -1}, "refresh_interval"),
        ({"learner_config": {"memory_weight": -1}}, "memory_weight"),
    ],
)
def test_a_bad_setting_value_fails_at_construction_not_at_the_first_query(
    options: dict[str, Any], words: str, nodes: list[TextNode]
) -> None:
    # self-indexing builds the ensemble at the first query: only option names were checked before it, so a
    # misspelt policy surfaced inside a live query engine, and to_dict() passed it on
    kwargs = {"retrievers": ("bm25",), **options}
    with pytest.raises(ValidationError, match=words):
        FeedbackFusionPostprocessor(**kwargs)
    top = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items() if k in ("retrievers", "policy")}
    dumped = {"retrievers": ["bm25"], **top, "options": {k: v for k, v in options.items() if k not in top}}
    with pytest.raises(ValidationError, match=words):
        FeedbackFusionPostprocessor.from_dict(dumped)
    good = FeedbackFusionPostprocessor(retrievers=("bm25",), policy="thompson", seed=3)  # what it refused before
    given = [NodeWithScore(node=n, score=0.5) for n in nodes]
    assert len(good.postprocess_nodes(given, query_str="aurora")) == 3


def test_unpickling_rebuilds_or_asks_for_what_the_pickle_lacks(tmp_path: Any, nodes: list[TextNode]) -> None:
    import logging
    import pickle

    path = tmp_path / "fb.db"
    logging.disable(logging.WARNING)  # LlamaIndex warns that it drops the unpicklable ensemble and store
    try:
        alone = pickle.loads(pickle.dumps(FeedbackFusionPostprocessor(store=path, retrievers=("bm25",), top_n=1)))
        with_corpus = pickle.dumps(FeedbackFusionPostprocessor(store=path, retrievers=("bm25",), nodes=nodes))
    finally:
        logging.disable(logging.NOTSET)
    assert alone.store.path == str(path)  # reopened from store_path, and it works
    assert alone.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="aurora")
    with pytest.raises(ValidationError, match="pass nodes= again"):  # not a postprocessor without its ensemble
        pickle.loads(with_corpus)


# ---------------------------------------------------------------------- bad input
def test_empty_node_list(make_ensemble: Any) -> None:
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble())
    assert pp.postprocess_nodes([], query_str="anything") == []
    assert pp.store.counts()["events"] == 0


def test_nodes_without_text(make_ensemble: Any) -> None:
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(), top_n=5)
    given = [
        NodeWithScore(node=TextNode(id_="empty", text=""), score=0.3),
        NodeWithScore(node=ImageNode(id_="image"), score=0.2),
        NodeWithScore(node=TextNode(id_="doc0", text=TEXTS[0]), score=0.1),
        NodeWithScore(node=TextNode(id_="doc0", text=TEXTS[0]), score=0.1),  # the same node twice
    ]
    out = pp.postprocess_nodes(given, query_str="aurora")
    assert [n.node.node_id for n in out][0] == "doc0"
    assert sorted(n.node.node_id for n in out) == ["doc0", "empty", "image"]
    assert all(n.node.metadata[EVENT_ID_KEY] == out[0].node.metadata[EVENT_ID_KEY] for n in out)


def test_missing_query_is_a_clear_error(make_ensemble: Any, nodes: list[TextNode]) -> None:
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble())
    with pytest.raises(ValidationError, match="needs the query"):
        pp.postprocess_nodes([NodeWithScore(node=nodes[0])])
    out = pp.postprocess_nodes([NodeWithScore(node=nodes[0])], query_bundle=QueryBundle(""))
    assert [n.node.node_id for n in out] == ["doc0"]


def test_bad_construction(make_ensemble: Any, nodes: list[TextNode]) -> None:
    with pytest.raises(ValueError):
        FeedbackFusionPostprocessor.from_ensemble(make_ensemble(), top_n=0)
    with pytest.raises(ValidationError, match="exactly one"):
        FeedbackFusionPostprocessor(nodes=nodes, docstore=object(), retrievers=("bm25",))
    with pytest.raises(ValidationError, match="pass nothing else"):
        FeedbackFusionPostprocessor(ensemble=make_ensemble(), nodes=nodes)
    with pytest.raises(NoStoreError, match="no feedback store"):
        no_store = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",))
        FeedbackFusionPostprocessor.from_ensemble(no_store)
    with pytest.raises(EmptyCorpusError):
        FeedbackFusionPostprocessor(nodes=[], retrievers=("bm25",))
    with pytest.raises(ValidationError, match="unknown retriever"):
        FeedbackFusionPostprocessor(nodes=nodes, retrievers=("colbert",))
    with pytest.raises(ValidationError, match="store"):
        FeedbackFusionPostprocessor(store=42, nodes=nodes, retrievers=("bm25",))


def test_unknown_event_id(make_ensemble: Any) -> None:
    from rlfb import UnknownEventError

    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(store=FeedbackStore()))
    with pytest.raises(UnknownEventError):
        pp.feedback("no-such-event", "thumbs_up")


def test_feedback_during_a_re_index_is_carried_into_the_new_index(
    tmp_path: Any, nodes: list[TextNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the learner's state was copied before the slow rebuild: feedback learned by the old index meanwhile
    # was lost from the new one
    import threading

    pp = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25",), top_n=2, policy="gradient")
    first = pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes[:2]], query_str="aurora solar wind")
    event = first[0].node.metadata[EVENT_ID_KEY]
    add = FeedbackEnsemble.add_chunks
    giver = threading.Thread(target=lambda: pp.feedback(event, "thumbs_up"))

    def slow_add(self: FeedbackEnsemble, *args: Any, **kwargs: Any) -> list[str]:
        giver.start()
        giver.join(0.5)  # the old code let the feedback through here, into the index being replaced
        return add(self, *args, **kwargs)

    monkeypatch.setattr(FeedbackEnsemble, "add_chunks", slow_add)
    pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="glacier ice")
    giver.join()
    assert len(_ensemble(pp)) == len(TEXTS) and _ensemble(pp).learner.n_learned == 1


def test_a_self_indexing_call_inside_store_exclusive_beside_a_first_build_does_not_deadlock(
    tmp_path: Any, nodes: list[TextNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller held the store's lock (store.exclusive()) and called the postprocessor while another thread's
    # first build held the postprocessor's own lock and waited for the store's: each waited for the other for ever
    import threading

    pp = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25",), top_n=2, policy="gradient")
    build = FeedbackEnsemble.from_chunks
    building = threading.Event()
    holding, done = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def first_build(*args: Any, **kwargs: Any) -> FeedbackEnsemble:
        if threading.current_thread().name == "builder":
            building.set()  # from here the builder waits for the store, which the holder has
        return build(*args, **kwargs)

    def builder() -> None:
        holding.wait()
        results["builder"] = pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes[:3]], query_str="aurora")

    def holder() -> None:
        with pp.store.exclusive():
            holding.set()
            building.wait()
            results["holder"] = pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes[3:6]],
                                                     query_str="glacier")
            done.set()

    monkeypatch.setattr(FeedbackEnsemble, "from_chunks", first_build)
    threads = [threading.Thread(target=builder, name="builder", daemon=True),
               threading.Thread(target=holder, daemon=True)]
    for t in threads:
        t.start()
    # a liveness guard, not a speed limit: with the old lock order the holder never gets here
    assert done.wait(120), "deadlock: the holder of store.exclusive() waits for the postprocessor's lock"
    for t in threads:
        t.join()
    assert len(results["holder"]) == 2 and len(results["builder"]) == 2
    for out in results.values():
        assert pp.store.event(out[0].node.metadata[EVENT_ID_KEY])["chunks"]
    assert len(_ensemble(pp)) == 6  # the holder's build came first; the builder's nodes were added to it


def test_a_self_indexing_call_is_not_held_up_by_another_calls_re_index(
    tmp_path: Any, nodes: list[TextNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    # calls were serialised: every query waited for a re-index of the nodes another query brought
    import threading

    pp = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25",), top_n=2, policy="gradient")
    pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes[:4]], query_str="aurora solar wind")
    gate = Gate(FeedbackEnsemble.add_chunks)
    monkeypatch.setattr(FeedbackEnsemble, "add_chunks", lambda self, *a, **kw: gate(self, *a, **kw))
    indexing = threading.Thread(
        target=lambda: pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="glacier ice"),
        daemon=True,
    )
    indexing.start()
    try:
        assert gate.entered.wait(120)
        # meanwhile another query is ranked with the index as it was (a liveness guard, not a speed limit)
        ranked: list[Any] = []
        query = threading.Thread(target=lambda: ranked.extend(pp.postprocess_nodes(
            [NodeWithScore(node=n) for n in nodes[:4]], query_str="aurora solar wind")), daemon=True)
        query.start()
        query.join(120)
        assert ranked, "the query waited for another call's re-index"
        assert ranked[0].node.node_id == "doc0" and len(_ensemble(pp)) == 4
    finally:
        gate.opened.set()
        indexing.join()
    assert len(_ensemble(pp)) == len(TEXTS)


def test_two_first_calls_with_the_same_nodes_both_rank(monkeypatch: pytest.MonkeyPatch, nodes: list[TextNode]) -> None:
    # the second first call built over the nodes still pending, none (the first had taken them): EmptyCorpusError
    import threading

    build = FeedbackEnsemble.from_chunks
    entered: list[int] = []
    both = threading.Event()

    def racing(*args: Any, **kwargs: Any) -> FeedbackEnsemble:
        entered.append(1)
        if len(entered) == 2:
            both.set()
        both.wait(60)  # both calls build at once (a liveness bound, not a speed limit)
        return build(*args, **kwargs)

    monkeypatch.setattr(FeedbackEnsemble, "from_chunks", racing)
    pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=2)
    ranked: list[Any] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            ranked.append(pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes[:6]], query_str="aurora"))
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and [len(r) for r in ranked] == [2, 2] and len(entered) == 2
    assert len(_ensemble(pp)) == 6


def test_an_edited_node_reaches_the_index_whichever_re_index_lands_last(
    monkeypatch: pytest.MonkeyPatch, nodes: list[TextNode]
) -> None:
    # an older re-index applied after a newer one put the node's old text back in the index, and the newer text,
    # already taken from the queue, was never indexed
    import threading

    pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=2)
    pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes[:4]], query_str="aurora")
    edited = nodes[0].node_id
    add = FeedbackEnsemble.add_chunks
    entered, go = threading.Event(), threading.Event()

    def held(self: FeedbackEnsemble, *args: Any, **kwargs: Any) -> list[str]:
        if threading.current_thread().name == "older":
            entered.set()
            go.wait(60)  # lands after the newer re-index (a liveness bound, not a speed limit)
        return add(self, *args, **kwargs)

    monkeypatch.setattr(FeedbackEnsemble, "add_chunks", held)

    def version(text: str, new_id: str) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(id_=edited, text=text)),
                NodeWithScore(node=TextNode(id_=new_id, text=new_id))]

    older = threading.Thread(name="older",
                             target=lambda: pp.postprocess_nodes(version("tides v1", "n-a"), query_str="q"))
    older.start()
    assert entered.wait(60)
    pp.postprocess_nodes(version("tides v2 newest", "n-b"), query_str="q")
    go.set()
    older.join()
    # the next re-index due brings the newest text in
    pp.postprocess_nodes([NodeWithScore(node=TextNode(id_=f"more{i}", text=f"more text {i}")) for i in range(4)],
                         query_str="q")
    assert _ensemble(pp).chunk(edited).text == "tides v2 newest"


def test_weights_before_the_first_call_skip_another_apps_snapshot(tmp_path: Any, nodes: list[TextNode]) -> None:
    # the store's newest snapshot is a bm25 + dense learner's: reading it raised CorruptStateError
    from rlfb.learner import Learner

    other = Learner(("bm25", "dense"), policy="thompson")
    with FeedbackStore(tmp_path / "fb.db") as store:
        store.save_policy_state(other.state_dict(), other.weights(), policy=other.policy_name)
    pp = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25",), top_n=2, policy="thompson")
    assert pp.weights == {"bm25": 1.0}


def test_weights_before_the_first_call_page_back_to_this_apps_own(tmp_path: Any, nodes: list[TextNode]) -> None:
    # its own 0.8/0.2 lay under an evaluation app's later snapshot (exploration "none"): it showed 0.5/0.5 until
    # the first call, which pages back to it
    from rlfb.learner import Learner

    with FeedbackStore(tmp_path / "fb.db") as store:
        for config, weights in (({}, {"bm25": 0.8, "dense": 0.2}), ({"exploration": "none"}, None)):
            learner = Learner(("bm25", "dense"), policy="gradient", config=config)
            if weights is not None:
                learner.set_weights(weights)
            store.save_policy_state(learner.state_dict(), learner.weights(), policy=learner.policy_name)
    pp = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25", "dense"), top_n=2,
                                     policy="gradient")
    assert pp.weights == pytest.approx({"bm25": 0.8, "dense": 0.2})
    evaluation = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25", "dense"), top_n=2,
                                             policy="gradient", learner_config={"exploration": "none"})
    assert evaluation.weights == pytest.approx({"bm25": 0.5, "dense": 0.5})  # its own, the newest


def test_a_dump_names_the_store_file_wherever_it_is_rebuilt(
    tmp_path: Any, nodes: list[TextNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a relative store path reopened another (new, empty) file when rebuilt from another working directory
    (tmp_path / "app").mkdir()
    monkeypatch.chdir(tmp_path / "app")
    pp = FeedbackFusionPostprocessor(store="fb.db", retrievers=("bm25",), top_n=2)
    assert pp.to_dict()["store_path"] == str(tmp_path / "app" / "fb.db")


def test_a_hyde_query_bundle_moves_the_dense_scores_of_a_rerank(make_ensemble: Any, nodes: list[Any]) -> None:
    from llama_index.core.indices.query.query_transform import HyDEQueryTransform

    ens = make_ensemble()
    pp = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=len(nodes), explore=False)
    bundle = HyDEQueryTransform(llm=MockLLM(), include_original=True).run("moon tides")
    got = pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_bundle=bundle)
    ids = [n.node.node_id for n in got]
    assert bundle.custom_embedding_strs is not None
    want = np.mean([ens.retrievers["dense"].score(s, ids) for s in bundle.custom_embedding_strs], axis=0)
    assert [n.node.metadata["scores"]["dense"] for n in got] == pytest.approx(want.tolist())


def test_a_node_edited_under_the_same_id_is_ranked_by_its_new_text(
    tmp_path: Any, nodes: list[TextNode], index: Any, make_ensemble: Any
) -> None:
    # a known node id that came back with new text was ranked and scored by its old indexed text, while the LLM
    # read the new one; the self-indexing postprocessor never re-indexed it
    edited = TextNode(id_="doc0", text="Glaciers carve valleys slowly over millennia.")
    question = "what causes the aurora borealis"

    def scores(pp: FeedbackFusionPostprocessor, given: list[TextNode]) -> dict[str, Any]:
        out = pp.postprocess_nodes([NodeWithScore(node=n) for n in given], query_str=question)
        return {o.node.node_id: o.node.metadata["scores"]["bm25"] for o in out}

    alone = FeedbackFusionPostprocessor(store=tmp_path / "alone.db", retrievers=("bm25",), top_n=len(nodes),
                                        explore=False)
    before = scores(alone, nodes)
    after = scores(alone, [edited, *nodes[1:]])
    assert before["doc0"] > 0 and after["doc0"] == 0.0  # no aurora in the edited text
    assert _ensemble(alone).chunk("doc0").text != edited.text  # one edit: not re-indexed yet
    more = [TextNode(id_=n.node_id, text=f"{n.text} (revised)") for n in nodes[1:3]]
    scores(alone, [edited, *more, *nodes[3:]])  # edits count towards the re-index, which takes them as they are
    assert _ensemble(alone).chunk("doc0").text == edited.text and _ensemble(alone).chunk("doc1").text == more[0].text

    # an ensemble of plain texts (the nodes' content without their metadata): by id, unless edited
    plain = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(), top_n=len(nodes), explore=False)
    by_id = dict(zip(IDS, _ensemble(plain).retrievers["bm25"].score(question, IDS), strict=True))
    assert scores(plain, nodes) == pytest.approx(by_id)
    assert scores(plain, [edited, *nodes[1:]]) == pytest.approx({**by_id, "doc0": 0.0})

    from_index = FeedbackFusionPostprocessor.from_index(index, store=tmp_path / "idx.db", retrievers=("bm25",),
                                                        top_n=2, explore=False)
    index.insert_nodes([edited])  # replaces doc0 in the index's docstore; the postprocessor indexed the old one
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=len(nodes), node_postprocessors=[from_index])
    response = engine.query(question)
    assert "doc0" not in [n.node.node_id for n in response.source_nodes]
    assert all("Glaciers" not in n.node.get_content() for n in response.source_nodes)


def test_a_nodes_own_rank_and_scores_are_replaced_with_a_warning(
    nodes: list[TextNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the adapter's values replaced them and hid them from the LLM without a word
    import warnings

    from llama_index.core.schema import MetadataMode

    from llamaindex_rlfb import _nodes

    monkeypatch.setattr(_nodes, "_warned", set(), raising=False)  # warned afresh, whatever ran before
    mine = [TextNode(id_=n.node_id, text=n.text, metadata={"rank": "gold-tier source", "scores": {"editor": 5}})
            for n in nodes]
    pp = FeedbackFusionPostprocessor(nodes=mine, retrievers=("bm25",), top_n=2)
    given = [NodeWithScore(node=n) for n in mine]
    with pytest.warns(UserWarning, match=r"\['rank', 'scores'\].*rename those keys"):
        out = pp.postprocess_nodes(given, query_str="aurora")
    assert out[0].node.metadata["rank"] == 1 and "gold-tier" not in out[0].node.get_content(MetadataMode.LLM)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pp.postprocess_nodes(given, query_str="tides")  # once per set of keys
        pp.postprocess_nodes(out, query_str="aurora")  # the adapter's own keys on its own nodes: nothing replaced
        pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="aurora")  # no such keys
    with pytest.warns(UserWarning, match=r"\['event_id'\]"):  # a document's own event id (an incident's)
        pp.postprocess_nodes([NodeWithScore(node=TextNode(id_="x", text="aurora", metadata={"event_id": "INC-7"}))],
                             query_str="aurora")


def test_the_nodes_given_keep_their_own_nested_metadata(make_ensemble: Any) -> None:
    # the output node was a copy whose metadata lists were the input node's: appending to one changed both
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(), top_n=2)
    given = [NodeWithScore(node=TextNode(id_=i, text=t, metadata={"tags": ["kb"]}), score=0.5)
             for i, t in zip(IDS[:4], TEXTS[:4], strict=True)]
    out = pp.postprocess_nodes(given, query_str="moon tides")
    out[0].node.metadata["tags"].append("INJECTED")
    assert all(n.node.metadata["tags"] == ["kb"] for n in given)
    assert all(n.node.metadata["tags"] == ["kb"] for n in pp.postprocess_nodes(given, query_str="moon tides"))



def test_fields_set_after_construction_are_checked_as_the_constructor_checks_them(nodes: list[TextNode]) -> None:
    # pp.top_n = "3" (a config value, as rerankers are tuned) was a bare TypeError at the next query
    pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=2, nodes=nodes)
    for field, value in (("top_n", "3"), ("top_n", 2.5), ("top_n", None), ("top_n", 0), ("explore", "no"),
                         ("log", 1)):
        with pytest.raises(ValidationError, match=field):
            setattr(pp, field, value)
    pp.top_n = 1
    assert len(pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="aurora")) == 1


def test_a_node_added_or_edited_since_indexing_wins_on_its_own_words() -> None:
    """BM25 dropped the query words its index had never seen, so a node added to the LlamaIndex index after
    the postprocessor was built, or one whose text was edited, scored 0 on exactly the words it alone held."""
    nodes = [TextNode(id_=f"n{i}", text=f"The KX-{4400 + i} valve is rated for {100 + i} bar.") for i in range(20)]
    pp = FeedbackFusionPostprocessor(nodes=nodes, retrievers=("bm25",), top_n=3, explore=False, log=False)
    new = TextNode(id_="new", text="The ZQ-9000 pump is rated for 50 bar.")
    edited = TextNode(id_="n5", text="The KX-4405 valve was recalled after a seal failure.")
    candidates = [NodeWithScore(node=n, score=0.5) for n in nodes[:4]]
    candidates += [NodeWithScore(node=new), NodeWithScore(node=edited)]
    for query, winner in (("ZQ-9000 pump", "new"), ("recalled seal failure", "n5")):
        out = pp.postprocess_nodes(candidates, query_str=query)
        assert out[0].node.node_id == winner
        assert out[0].node.metadata["scores"]["bm25"] > 0


def test_plain_nodes_are_refused_by_name() -> None:
    nodes = [TextNode(id_=f"n{i}", text=t) for i, t in enumerate(["aurora glows", "tides rise"])]
    pp = FeedbackFusionPostprocessor(nodes=nodes, retrievers=("bm25",), log=False)
    with pytest.raises(ValidationError, match=r"NodeWithScore, got TextNode \(wrap nodes"):
        pp.postprocess_nodes(nodes, query_str="aurora")  # type: ignore[arg-type]  # a bare AttributeError before
    with pytest.raises(ValidationError, match="got str"):
        pp.postprocess_nodes(["aurora glows"], query_str="aurora")  # type: ignore[list-item]


def test_weights_given_are_the_weights_before_the_first_call_as_after_it(
    tmp_path: Any, nodes: list[TextNode], fast_dense: dict[str, Any]
) -> None:
    # weights= win over the store's at the first build, but before it the property showed the store's snapshot
    from rlfb.learner import Learner

    with FeedbackStore(tmp_path / "fb.db") as store:
        learner = Learner(("bm25", "dense"), policy="gradient")
        learner.set_weights({"bm25": 0.8, "dense": 0.2})
        store.save_policy_state(learner.state_dict(), learner.weights(), policy=learner.policy_name)
    pp = FeedbackFusionPostprocessor(store=tmp_path / "fb.db", retrievers=("bm25", "dense"), top_n=2,
                                     policy="gradient", weights={"bm25": 0.3, "dense": 0.7}, **fast_dense)
    assert pp.weights == pytest.approx({"bm25": 0.3, "dense": 0.7})
    pp.postprocess_nodes([NodeWithScore(node=n) for n in nodes], query_str="tides")
    assert pp.weights == pytest.approx({"bm25": 0.3, "dense": 0.7})


def test_an_index_built_again_with_new_node_ids_is_named_and_id_func_keeps_what_was_learned(
    tmp_path: Any, embed_model: Any, fast_dense: dict[str, Any]
) -> None:
    # LlamaIndex's node parsers give every node a random id at each build: an app that built its index from its
    # documents at each start found every chunk's confidence and memory back at the prior, without a word
    import warnings

    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.node_parser import SentenceSplitter

    docs = [Document(text=f"{t} (copy {i // len(TEXTS)})", doc_id=f"doc{i}.txt")
            for i, t in enumerate(TEXTS * 3)]
    db = str(tmp_path / "fb.db")

    def start(splitter: Any) -> FeedbackFusionPostprocessor:
        index = VectorStoreIndex.from_documents(docs, embed_model=embed_model, transformations=[splitter])
        return FeedbackFusionPostprocessor.from_index(index, store=db, top_n=3, explore=False, **fast_dense)

    def click_every_chunk(pp: FeedbackFusionPostprocessor) -> None:
        for chunk_id in _ensemble(pp).chunks.ids:
            text = _ensemble(pp).chunk(chunk_id).text
            out = pp.postprocess_nodes([NodeWithScore(node=TextNode(id_=chunk_id, text=text))], query_str=text)
            pp.feedback(out[0].node.metadata[EVENT_ID_KEY], "click", chunk_id=chunk_id)

    pp = start(SentenceSplitter())
    click_every_chunk(pp)
    _ensemble(pp).close()
    with pytest.warns(UserWarning, match=f"these {3 * len(TEXTS)} nodes have random ids.*id_func") as caught:
        _ensemble(start(SentenceSplitter())).close()  # the same documents, new random node ids
    assert caught[0].filename == __file__  # it names the app's line, not the library's
    stable = SentenceSplitter(id_func=lambda i, doc: f"{doc.doc_id}-{i}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pp = start(stable)  # ids of the app's own: new to this store, but no sign of ids made anew
        click_every_chunk(pp)
        _ensemble(pp).close()
        pp = start(stable)  # the next start: the same ids, and what was learned under them is found
    assert _ensemble(pp).learner.confidence.known(_ensemble(pp).chunks.ids) == len(docs) == 3 * len(TEXTS)
    _ensemble(pp).close()


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


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


def test_feedback_takes_a_number_second_as_the_score_as_the_handler_does(index: Any, make_ensemble: Any) -> None:
    # pp.feedback(event_id, 1.0) was an UnknownSignalError ("signal must be a str"), where the handler's
    # record_feedback(query_id, 1.0) takes LangSmith's score second
    pp = FeedbackFusionPostprocessor.from_ensemble(make_ensemble(), top_n=2)
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=5, node_postprocessors=[pp])
    eid = _check_reranked(engine.query("why are there tides").source_nodes, pp, 2)
    assert [r.value for r in pp.feedback(eid, 1.0)] == [1.0]
    assert [r.value for r in pp.feedback(eid, 0.0, idempotency_key="down")] == [-1.0]
