"""FeedbackEnsembleRetriever: from_defaults like llama-index-retrievers-bm25, sync and async, learning."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeRelationship, QueryBundle, RelatedNodeInfo, TextNode
from llama_index.core.storage.docstore import SimpleDocumentStore
from typing_extensions import assert_type

from llamaindex_rlfb import EVENT_ID_KEY, FeedbackEnsembleRetriever, FeedbackRetrievalEvent
from rlfb import EmptyCorpusError, FeedbackEnsemble, NoStoreError, ValidationError
from rlfb.store import FeedbackRecord

from _li_corpus import IDS, TEXTS
from _threads import Gate, cancel_inside


def test_from_nodes(nodes: list[TextNode], fast_dense: dict[str, Any], tmp_path: Any) -> None:
    retriever = FeedbackEnsembleRetriever.from_defaults(
        nodes=nodes, store=tmp_path / "fb.db", similarity_top_k=3, **fast_dense
    )
    out = retriever.retrieve("what causes the aurora borealis")
    assert len(out) == 3 and out[0].node.node_id == "doc0"
    assert out[0].node.metadata["source"] == "doc0.txt"  # the original node, copied
    assert EVENT_ID_KEY not in nodes[0].metadata
    eid = out[0].node.metadata[EVENT_ID_KEY]
    assert [c["chunk_id"] for c in retriever.store.event(eid)["chunks"]] == [n.node.node_id for n in out]
    assert (tmp_path / "fb.db").is_file()
    assert retriever.ensemble.learner.policy_name == "thompson"  # learns by default, as the postprocessor


def test_log_false_evaluates_without_writing_to_the_store(nodes: list[TextNode], tmp_path: Any) -> None:
    logged = FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25",), store=tmp_path / "fb.db",
                                                     similarity_top_k=3, explore=False)
    quiet = FeedbackEnsembleRetriever(logged.ensemble, 3, explore=False, log=False)
    want = [n.node.node_id for n in logged.retrieve("moon tides")]
    before = logged.store.counts()
    got = quiet.retrieve("moon tides")
    assert [n.node.node_id for n in got] == want and logged.store.counts() == before  # it wrote an event before
    assert all(n.node.metadata[EVENT_ID_KEY] is None for n in got)
    with pytest.raises(ValidationError, match="log"):
        FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25",), log="no")  # type: ignore[arg-type]


def test_attributes_set_after_construction_are_named_when_wrong(nodes: list[TextNode]) -> None:
    # similarity_top_k = "3" set afterwards was a bare TypeError from inside the ranking
    retriever = FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25",), similarity_top_k=2)
    for attribute, value in (("similarity_top_k", "3"), ("similarity_top_k", 0), ("explore", "no"), ("log", 1.5)):
        setattr(retriever, attribute, value)
        with pytest.raises(ValidationError, match=attribute):
            retriever.retrieve("moon tides")
        setattr(retriever, attribute, {"similarity_top_k": 2, "explore": True, "log": True}[attribute])
    assert len(retriever.retrieve("moon tides")) == 2


def test_from_index_and_docstore(index: Any, fast_dense: dict[str, Any]) -> None:
    from_index = FeedbackEnsembleRetriever.from_defaults(index=index, retrievers=("bm25",),
                                                         similarity_top_k=2)
    assert len(from_index.ensemble) == len(TEXTS)
    docstore = SimpleDocumentStore()
    docstore.add_documents([TextNode(id_=i, text=t) for i, t in zip(IDS, TEXTS, strict=True)])
    from_docstore = FeedbackEnsembleRetriever.from_defaults(docstore=docstore, similarity_top_k=2,
                                                            **fast_dense)
    for r in (from_index, from_docstore):
        assert r.retrieve("XK-4471")[0].node.node_id == "doc4"


def test_exactly_one_source(nodes: list[TextNode], index: Any) -> None:
    with pytest.raises(ValidationError, match="exactly one of index, nodes or docstore"):
        FeedbackEnsembleRetriever.from_defaults()
    with pytest.raises(ValidationError, match="exactly one"):
        FeedbackEnsembleRetriever.from_defaults(index=index, nodes=nodes)
    with pytest.raises(EmptyCorpusError):
        FeedbackEnsembleRetriever.from_defaults(nodes=[])
    with pytest.raises(EmptyCorpusError, match="docstore holds no nodes"):
        FeedbackEnsembleRetriever.from_defaults(docstore=SimpleDocumentStore())
    with pytest.raises(ValidationError, match="similarity_top_k"):
        FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25",), similarity_top_k=0)
    with pytest.raises(NoStoreError, match="no feedback store"):
        FeedbackEnsembleRetriever(FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",)))


async def test_aretrieve_and_feedback(make_ensemble: Any) -> None:
    retriever = FeedbackEnsembleRetriever(make_ensemble(policy="gradient"), similarity_top_k=2)
    out = await retriever.aretrieve("why do tides happen")
    assert {n.node.node_id for n in out} <= {"doc2", "doc9"}
    assert isinstance(out[0].node, TextNode)
    assert out[0].node.text in TEXTS  # no original nodes given: TextNodes built from the chunks
    record = assert_type(retriever.feedback(out[0].node.metadata[EVENT_ID_KEY], rating=5), list[FeedbackRecord])[0]
    assert record.reward > 0
    assert retriever.store.counts()["feedback"] == 1


async def test_a_cancelled_aretrieve_logs_nothing(make_ensemble: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # asyncio.wait_for timing out cancels aretrieve, but its worker thread goes on: it logged the ranking nobody
    # saw (the session's "previous retrieval" from then on, and a decision nobody rates) and announced it
    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever(ens, similarity_top_k=2)
    scoring = Gate(ens.context)
    monkeypatch.setattr(ens, "context", scoring)  # the slow part waits until the caller is gone
    announced = _Announced()
    get_dispatcher().add_event_handler(announced)  # the conftest takes it off again
    await cancel_inside(retriever.aretrieve("why do tides happen"), scoring)
    assert ens.store.counts()["events"] == 0 and announced.events == []
    out = await retriever.aretrieve("why do tides happen")  # the next call is logged as ever
    assert ens.store.counts()["events"] == 1 and len(announced.events) == 1
    assert out[0].node.metadata[EVENT_ID_KEY] == announced.events[0].event_id


class _Announced(BaseEventHandler):
    """The FeedbackRetrievalEvents dispatched."""

    events: list[Any] = []

    @classmethod
    def class_name(cls) -> str:
        return "Announced"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, FeedbackRetrievalEvent):
            self.events.append(event)


def test_in_a_query_engine(make_ensemble: Any) -> None:
    retriever = FeedbackEnsembleRetriever(make_ensemble(), similarity_top_k=2, explore=False)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    response = engine.query(QueryBundle("how do volcanoes erupt"))
    assert response.source_nodes[0].node.node_id == "doc3"
    scores = [n.score for n in response.source_nodes]
    assert scores == sorted(cast("list[float]", scores), reverse=True)  # every node scored (None would raise)
    assert retriever.weights == pytest.approx({"bm25": 0.5, "dense": 0.5})


def test_insert_and_delete_nodes_change_the_index_and_return_the_inserted_nodes(
    nodes: list[TextNode], tmp_path: Any
) -> None:
    retriever = FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25",), similarity_top_k=1,
                                                        store=tmp_path / "fb.db")
    penguin = TextNode(id_="penguin", text="Penguins huddle together through the Antarctic winter.",
                       metadata={"source": "zoo.txt"})
    retriever.insert_nodes([penguin])
    [hit] = retriever.retrieve("penguins in the antarctic winter")
    assert hit.node.node_id == "penguin" and hit.node.metadata["source"] == "zoo.txt"  # the node inserted
    retriever.insert_nodes([TextNode(id_="penguin", text="Koalas sleep in eucalyptus trees.")])
    assert len(retriever.ensemble) == len(TEXTS) + 1
    assert retriever.retrieve("koalas sleeping")[0].node.get_content() == "Koalas sleep in eucalyptus trees."
    retriever.delete_nodes(["penguin"])
    assert retriever.retrieve("koalas sleeping")[0].node.node_id != "penguin"
    with pytest.raises(ValidationError, match="not one string"):
        retriever.delete_nodes("doc0")
    with pytest.raises(ValidationError, match="LlamaIndex nodes"):
        retriever.insert_nodes(["a text"])  # type: ignore[list-item]


def test_from_index_of_none_is_refused() -> None:
    # an index variable left None by a failed load: the postprocessor silently indexed whatever it was given
    from llamaindex_rlfb import FeedbackFusionPostprocessor

    with pytest.raises(ValidationError, match="got None"):
        FeedbackFusionPostprocessor.from_index(None)


def test_a_hyde_query_bundle_moves_the_dense_scores_only(make_ensemble: Any) -> None:
    # HyDE hands the retriever a hypothetical answer as custom_embedding_strs: LlamaIndex's vector retriever
    # embeds those (averaged) in place of the question; rlfb's dense member does too, BM25 keeps the question
    from llama_index.core.indices.query.query_transform import HyDEQueryTransform

    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever(ens, similarity_top_k=len(TEXTS), explore=False)
    bundle = HyDEQueryTransform(llm=MockLLM(), include_original=True).run("moon tides")
    strs = bundle.custom_embedding_strs
    assert strs is not None
    assert len(strs) == 2 and strs[1] == "moon tides"
    dense, bm25 = ens.retrievers["dense"], ens.retrievers["bm25"]
    got = retriever.retrieve(bundle)
    ids = [n.node.node_id for n in got]
    want_dense = np.mean([dense.score(s, ids) for s in strs], axis=0)
    assert [n.node.metadata["scores"]["dense"] for n in got] == pytest.approx(want_dense.tolist())
    assert [n.node.metadata["scores"]["bm25"] for n in got] == pytest.approx(bm25.score("moon tides", ids).tolist())
    assert not np.allclose(want_dense, dense.score("moon tides", ids))  # the question alone would score otherwise
    assert ens.store.event(got[0].node.metadata[EVENT_ID_KEY])["query"] == "moon tides"  # the learner's question


def test_a_misspelt_ensemble_option_is_a_named_error_before_indexing(monkeypatch) -> None:
    from rlfb.retrievers import BM25Retriever

    indexed: list[int] = []
    monkeypatch.setattr(BM25Retriever, "index", lambda self, *a, **k: indexed.append(1))
    nodes = [TextNode(text=t, id_=i) for t, i in zip(TEXTS, IDS, strict=True)]
    with pytest.raises(ValidationError, match="takes no option 'top_k'"):
        FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25",), top_k=3)
    assert indexed == []


def test_a_retrieval_returns_the_text_it_ranked_while_an_insert_swaps_a_node(monkeypatch: Any) -> None:
    # the nodes kept beside the index were updated after the index: a retrieval between the two returned the
    # new text with the old text's rank and scores (45 of 8,500 hits under a thread upserting one id), and two
    # inserts of one id could leave the two apart for good
    from llama_index.core.schema import TextNode

    from llamaindex_rlfb import FeedbackEnsembleRetriever

    base = [TextNode(id_=f"n{i}", text=f"filler text number {i} about rivers") for i in range(20)]
    r = FeedbackEnsembleRetriever.from_defaults(nodes=[*base, TextNode(id_="x", text="x v0 aurora")],
                                                retrievers=("bm25",), similarity_top_k=3, log=False)
    r._nodes["x"] = TextNode(id_="x", text="x v1 volcano")  # as between the index's swap and the nodes'
    (top, *_) = r.retrieve("aurora")
    assert isinstance(top.node, TextNode)
    assert top.node.node_id == "x" and top.node.text == "x v0 aurora"
    held: list[bool] = []
    add = r.ensemble.add_chunks

    def add_chunks(chunks: Any, **kw: Any) -> Any:
        held.append(r._nodes_lock.locked())
        return add(chunks, **kw)

    monkeypatch.setattr(r.ensemble, "add_chunks", add_chunks)
    r.insert_nodes([TextNode(id_="x", text="x v2 aurora")])
    assert held == [True] and cast(TextNode, r.retrieve("aurora")[0].node).text == "x v2 aurora"


def test_the_ids_made_anew_warning_fires_only_on_random_ids_unknown_to_a_store_that_learned_enough() -> None:
    import inspect
    import uuid
    import warnings
    from types import SimpleNamespace

    from llamaindex_rlfb._nodes import warn_if_ids_were_made_anew
    from rlfb.confidence import ChunkConfidence

    def store_that_learned(n: int, also: tuple[str, ...] = ()) -> Any:
        confidence = ChunkConfidence()
        confidence.update([f"old{i}" for i in range(n)] + list(also), [1.0] * (n + len(also)))
        return SimpleNamespace(learner=SimpleNamespace(confidence=confidence))

    def nodes(ids: list[str]) -> list[TextNode]:
        return [TextNode(id_=i, text=f"text {i}") for i in ids]

    fresh = [str(uuid.uuid4()) for _ in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_ids_were_made_anew(nodes(fresh), store_that_learned(0))  # a new store
        warn_if_ids_were_made_anew(nodes(fresh), store_that_learned(19))  # too little learned to tell
        warn_if_ids_were_made_anew(nodes([*fresh, "own-id"]), store_that_learned(30))  # ids of the app's own
        warn_if_ids_were_made_anew(nodes([str(uuid.uuid5(uuid.NAMESPACE_URL, u)) for u in "ab"]),
                                   store_that_learned(30))  # derived from a name: the same at each build
        warn_if_ids_were_made_anew(nodes(["x" * 36]), store_that_learned(30))
        warn_if_ids_were_made_anew(nodes(fresh), store_that_learned(30, also=(fresh[0],)))  # a loaded index
    frame = inspect.currentframe()
    assert frame is not None
    with pytest.warns(UserWarning, match="these 4 nodes have random ids") as caught:
        line = frame.f_lineno + 1
        warn_if_ids_were_made_anew(nodes(fresh), store_that_learned(20))
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)  # the app's line


def test_a_retriever_built_again_over_nodes_of_new_random_ids_warns(tmp_path: Any) -> None:
    import uuid

    path = tmp_path / "fb.db"

    def build() -> FeedbackEnsembleRetriever:
        made = [TextNode(id_=str(uuid.uuid4()), text=t) for t in TEXTS * 3]
        return FeedbackEnsembleRetriever.from_defaults(nodes=made, retrievers=("bm25",), store=path, explore=False)

    ens = build().ensemble
    result = ens.retrieve("what causes the aurora", k=len(ens))
    ens.feedback(result.event_id, "thumbs_down")  # criticism of the answer reaches every chunk shown
    assert len(ens.learner.confidence) == len(ens) >= 20
    ens.close()
    with pytest.warns(UserWarning, match="random ids"):
        build().ensemble.close()


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


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


def test_a_node_id_given_twice_returns_the_first_node_as_the_index_keeps_it() -> None:
    # kept by its last copy, whose text the index did not keep, the hit came back as a bare node rebuilt from
    # the chunk: its source link lost, its metadata in the text the LLM reads (a mutation review, 2026-12-07)
    first = TextNode(id_="x", text="the aurora is caused by the solar wind", metadata={"file": "a.txt"},
                     relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="doc-a")})
    again = TextNode(id_="x", text="a later copy of x with other text")
    other = TextNode(id_="y", text="tides follow the moon")
    retriever = FeedbackEnsembleRetriever.from_defaults(nodes=[first, again, other], retrievers=("bm25",),
                                                        similarity_top_k=1)
    (hit,) = retriever.retrieve("what causes the aurora")
    assert hit.node.node_id == "x" and hit.node.ref_doc_id == "doc-a"
    assert hit.node.get_content() == first.get_content() and hit.node.metadata["file"] == "a.txt"
