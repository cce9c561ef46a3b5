"""Feedback on a wrapper retriever's run reaches only the rlfb documents its result kept.

A ``ContextualCompressionRetriever`` (or any retriever around a ``FeedbackEnsembleRetriever`` that returns a subset
of its documents) cut documents the user never saw: a thumbs up on the outer run gave them the full reward, and
their confidence rose as if they had been shown. The handler marks them unused in the rlfb decision, as the
LlamaIndex handler does with the nodes a later step cut. And a handler made from the store alone, whose feedback
no live learner learns (after a restart), says so once.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Sequence
from typing import Any

import pytest
from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_community.retrievers import BM25Retriever
from langchain_core.callbacks import CallbackManagerForRetrieverRun, Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.retrievers import BaseRetriever

from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever
from rlfb.store import FeedbackStore

TEXTS = ["The aurora is caused by charged particles from the sun.", "Tides follow the pull of the moon.",
         "Volcanoes erupt molten rock.", "The sun is a star.", "Moon phases repeat monthly."]
IDS = [f"c{i}" for i in range(len(TEXTS))]


class KeepOnly(BaseDocumentCompressor):
    """Keeps the documents at ``positions``, or those of ``ids`` (a relevance filter); ``fresh`` makes new
    Documents of them, with their metadata but no id, as LLMChainExtractor or a reranker's copies do."""

    positions: tuple[int, ...] = (1,)
    ids: tuple[str, ...] | None = None
    fresh: bool = False

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        kept = [documents[i] for i in self.positions if i < len(documents)] if self.ids is None \
            else [d for d in documents if d.id in self.ids]
        if self.fresh:
            kept = [Document(page_content=d.page_content.upper(), metadata=dict(d.metadata)) for d in kept]
        return kept


def _retriever(store: Any, **kw: Any) -> FeedbackEnsembleRetriever:
    return FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=store, k=2,
                                                explore=False, **kw)


def _used(store: FeedbackStore, event_id: str) -> dict[str, bool]:
    return {c["chunk_id"]: c["used"] for c in store.event(event_id)["chunks"]}


def test_a_compressed_out_document_gets_no_share_of_the_praise(tmp_path) -> None:
    retriever = _retriever(str(tmp_path / "fb.db"))
    handler = FeedbackCallbackHandler.from_ensemble(retriever)
    cc = ContextualCompressionRetriever(base_compressor=KeepOnly(positions=(1,)), base_retriever=retriever)
    run = uuid.uuid4()
    (doc,) = cc.invoke("what is the sun", config={"callbacks": [handler]}, run_id=run)
    decision = doc.metadata["event_id"]
    ranked = [c["chunk_id"] for c in handler.store.event(decision)["chunks"]]
    assert len(ranked) == 2 and doc.id == ranked[1]
    cut = ranked[0]
    assert _used(handler.store, decision) == {cut: False, doc.id: True}
    records = {r.event_id: r for r in handler.record_feedback(run, score=1.0)}
    assert set(records[decision].chunk_rewards) == {doc.id}  # the cut document was given 0.99999
    assert set(records[f"{run}/result"].chunk_rewards) == {doc.id}


def test_repeated_praise_of_the_compressed_result_leaves_the_cut_documents_confidence(tmp_path) -> None:
    retriever = _retriever(str(tmp_path / "fb.db"))
    handler = FeedbackCallbackHandler.from_ensemble(retriever)
    conf = retriever.ensemble.learner.confidence
    before = dict(zip(IDS, conf.posterior(IDS)[0], strict=True))
    cc = ContextualCompressionRetriever(base_compressor=KeepOnly(ids=("c1",)), base_retriever=retriever)
    shown: set[str] = set()
    cut: set[str] = set()
    for _ in range(4):  # BM25 finds c1 and c4 for "moon"; the compressor keeps c1
        run = uuid.uuid4()
        (doc,) = cc.invoke("moon", config={"callbacks": [handler]}, run_id=run)
        assert doc.id is not None
        shown.add(doc.id)
        cut |= {c["chunk_id"] for c in handler.store.event(doc.metadata["event_id"])["chunks"]} - {doc.id}
        handler.record_feedback(run, score=1.0)
    after = dict(zip(IDS, conf.posterior(IDS)[0], strict=True))
    assert shown == {"c1"} and cut == {"c4"}
    assert after["c4"] == pytest.approx(before["c4"])  # never seen (it rose as much as c1 before)
    assert after["c1"] > before["c1"]


def test_a_compressor_that_cuts_every_document_marks_the_whole_decision_unused(tmp_path) -> None:
    retriever = _retriever(str(tmp_path / "fb.db"))
    handler = FeedbackCallbackHandler.from_ensemble(retriever)
    cc = ContextualCompressionRetriever(base_compressor=KeepOnly(positions=()), base_retriever=retriever)
    run = uuid.uuid4()
    assert cc.invoke("what is the sun", config={"callbacks": [handler]}, run_id=run) == []
    (decision,) = [e["id"] for e in handler.retrievals(run) if e["id"] != f"{run}/result"]
    assert not any(_used(handler.store, decision).values())
    assert all(r.chunk_rewards == {} for r in handler.record_feedback(run, score=1.0))


def test_documents_a_compressor_rewrote_count_as_kept_by_their_chunk_id(tmp_path) -> None:
    # new Documents with the rlfb metadata but no id (LLMChainExtractor's): the kept one keeps its share
    retriever = _retriever(str(tmp_path / "fb.db"))
    handler = FeedbackCallbackHandler.from_ensemble(retriever)
    cc = ContextualCompressionRetriever(base_compressor=KeepOnly(positions=(0,), fresh=True),
                                        base_retriever=retriever)
    run = uuid.uuid4()
    (doc,) = cc.invoke("what is the sun", config={"callbacks": [handler]}, run_id=run)
    assert doc.id is None
    decision, kept = doc.metadata["event_id"], doc.metadata["chunk_id"]
    records = {r.event_id: r for r in handler.record_feedback(run, score=1.0)}
    assert set(records[decision].chunk_rewards) == {kept}


class Summarise(BaseDocumentCompressor):
    """One new Document written from all of them, with none of their ids or metadata (a summary)."""

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        return [Document(page_content=" ".join(d.page_content for d in documents))]


def test_a_result_of_new_documents_tells_nothing_of_what_was_kept_and_marks_nothing(tmp_path) -> None:
    # a summary of every document is no cut of them: marking them all unused would make praise teach nothing
    retriever = _retriever(str(tmp_path / "fb.db"))
    handler = FeedbackCallbackHandler.from_ensemble(retriever)
    cc = ContextualCompressionRetriever(base_compressor=Summarise(), base_retriever=retriever)
    run = uuid.uuid4()
    (summary,) = cc.invoke("what is the sun", config={"callbacks": [handler]}, run_id=run)
    assert "event_id" not in summary.metadata
    (decision,) = [e["id"] for e in handler.retrievals(run) if e["id"] != f"{run}/result"]
    assert all(_used(handler.store, decision).values())
    records = {r.event_id: r for r in handler.record_feedback(run, score=1.0)}
    assert len(records[decision].chunk_rewards) == 2


def test_a_handler_on_another_store_marks_the_cut_documents_in_the_ensembles_store_too(tmp_path) -> None:
    retriever = _retriever(FeedbackStore(tmp_path / "ens.db"))
    handler = FeedbackCallbackHandler(FeedbackStore(tmp_path / "handler.db"), ensemble=retriever)
    cc = ContextualCompressionRetriever(base_compressor=KeepOnly(positions=(1,)), base_retriever=retriever)
    run = uuid.uuid4()
    (doc,) = cc.invoke("what is the sun", config={"callbacks": [handler]}, run_id=run)
    assert doc.id is not None
    decision = doc.metadata["event_id"]
    ens_store = retriever.ensemble.store
    for store in (handler.store, ens_store):
        assert _used(store, decision)[doc.id] and sum(_used(store, decision).values()) == 1
    records = [r for r in handler.record_feedback(run, score=1.0) if r.event_id == decision]
    assert len(records) == 2  # the handler's copy, and the ensemble's own event it learns from
    assert all(set(r.chunk_rewards) == {doc.id} for r in records)


def test_feedback_no_live_learner_learns_is_warned_of_once(tmp_path) -> None:
    path = str(tmp_path / "fb.db")
    before_restart = _retriever(path)
    runs = [uuid.uuid4() for _ in range(3)]
    for run in runs:
        before_restart.invoke("sun", run_id=run)
    before_restart.ensemble.store.close()  # the app restarted: the ensemble that decided is gone
    handler = FeedbackCallbackHandler(store=path)  # from the store alone
    with pytest.warns(RuntimeWarning, match="no rlfb learner of this process learned it"):
        handler.record_feedback(runs[0], score=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handler.record_feedback(runs[1], score=1.0)  # once per handler
        # a handler that learns (a live ensemble of the same retrievers) and a plain retriever's log: no warning
        after_restart = _retriever(path)
        FeedbackCallbackHandler.from_ensemble(after_restart).record_feedback(runs[2], score=1.0)
        plain = FeedbackCallbackHandler(store=FeedbackStore(tmp_path / "plain.db"))
        run = uuid.uuid4()
        BM25Retriever.from_texts(TEXTS, k=2).invoke("sun", config={"callbacks": [plain]}, run_id=run)
        plain.record_feedback(run, score=1.0)



class Parents(BaseRetriever):
    """Returns a parent document for each chunk its rlfb retriever ranked, as ``ParentDocumentRetriever`` does."""

    child: Any

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        found = self.child.invoke(query, config={"callbacks": run_manager.get_child()})
        return [Document(id=f"parent-of-{d.id}", page_content=d.page_content) for d in found]


def test_a_click_on_a_document_no_rlfb_decision_returned_says_it_taught_nothing(tmp_path) -> None:
    # a click on a parent was stored on the run's result copy and taught no learner, silently (an audit, 2026-12-06)
    retriever = _retriever(str(tmp_path / "fb.db"))
    handler = FeedbackCallbackHandler.from_ensemble(retriever)
    run = uuid.uuid4()
    shown = Parents(child=retriever).invoke("what is the sun", config={"callbacks": [handler]}, run_id=run)
    (decision,) = [e["id"] for e in handler.retrievals(run) if e["id"] != f"{run}/result"]
    ranked = [c["chunk_id"] for c in handler.store.event(decision)["chunks"]]
    with pytest.warns(RuntimeWarning, match=r"document 'parent-of-.*' of run .* taught no rlfb learner"):
        (record,) = handler.record_feedback(run, signal="click", chunk_id=shown[0].id)
    assert record.event_id == f"{run}/result" and retriever.ensemble.learner.n_learned == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a chunk the decision returned: learned, and nothing to say
        handler.record_feedback(run, signal="click", chunk_id=ranked[0])
        handler.record_feedback(run, score=1.0)  # the whole run: learned too
    assert retriever.ensemble.learner.n_learned == 2


@pytest.mark.parametrize("behind_a_chain", [False, True], ids=["direct", "behind-a-chain"])
def test_a_wrapper_called_twice_in_one_run_is_not_a_reformulation(tmp_path, behind_a_chain: bool) -> None:
    # the rlfb retriever inside the wrapper's second call saw only the wrapper's run above it (linked when the
    # wrapper ended), so it took the call for a restatement of the first one's result (a mutation review, 2026-12-07)
    from langchain_core.runnables import RunnableLambda

    retriever = _retriever(str(tmp_path / "fb.db"))
    handler = FeedbackCallbackHandler.from_ensemble(retriever)
    inner: Any = (RunnableLambda(lambda q: q) | retriever) if behind_a_chain else retriever
    cc = ContextualCompressionRetriever(base_compressor=KeepOnly(positions=(0,)), base_retriever=inner)
    agent: Any = RunnableLambda(lambda q: [cc.invoke(q), cc.invoke("what really is the sun, the star")])
    run = uuid.uuid4()
    agent.invoke("what is the sun", config={"callbacks": [handler], "metadata": {"session_id": "s1"}, "run_id": run})
    events = handler.retrievals(run)
    assert len(events) == 4 and not any(handler.store.feedback(e["id"]) for e in events)
    # the user restating the question in a run of its own is a follow-up, as before
    cc.invoke("what really is the sun, a star", config={"callbacks": [handler], "metadata": {"session_id": "s1"}})
    assert [f["signal"] for f in handler.store.feedback(events[-1]["id"])] == ["reformulation"]


def test_the_members_of_an_ensemble_retriever_write_the_runs_above_them_once(tmp_path) -> None:
    # linked at each member's start since a nested retrieval's links are written there: one write transaction a
    # member for the same rows, where the outermost retrieval keeps what its members wrote
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_core.runnables import RunnableLambda

    store = FeedbackStore(":memory:")
    writes: list[list[tuple[str, str]]] = []
    link_runs = store.link_runs

    def counted(links: Any) -> int:
        writes.append(list(links))
        return link_runs(links)

    store.link_runs = counted  # type: ignore[method-assign]
    handler = FeedbackCallbackHandler(store)
    members: list[Any] = [BM25Retriever.from_texts(TEXTS, k=2) for _ in range(3)]
    chain = RunnableLambda(lambda q: q) | EnsembleRetriever(retrievers=members, weights=[1 / 3] * 3)
    agent: Any = RunnableLambda(lambda q: chain.invoke(q))
    agent.invoke("what is the sun", config={"callbacks": [handler]})
    rows = [link for batch in writes for link in batch]
    assert len(rows) == len(set(rows)) and len(writes) <= 2
