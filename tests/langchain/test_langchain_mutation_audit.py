"""Behaviours of the LangChain adapter that a mutation audit (2026-12-05) found no test for. Each test names the
bug it guards against."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from langchain_community.retrievers import BM25Retriever as LCBM25
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever, as_member
from rlfb import FeedbackEnsemble
from rlfb.store import FeedbackStore

from _lc_corpus import IDS, TEXTS


def _members_in_opposite_orders() -> dict[str, Any]:
    """Two LangChain runnables that return the corpus's first five documents in opposite orders."""
    docs = [Document(page_content=t, id=i) for i, t in zip(IDS[:5], TEXTS[:5], strict=True)]
    return {"a": RunnableLambda(lambda q: list(docs)), "b": RunnableLambda(lambda q: docs[::-1])}


async def test_ainvoke_with_explore_false_does_not_explore() -> None:
    # ainvoke dropped explore=False (passed None, the default), so an evaluation run under async explored:
    # 29 of 30 such calls were logged as explored
    retriever = FeedbackEnsembleRetriever.from_retrievers(_members_in_opposite_orders(), store=FeedbackStore(), k=3)
    store = retriever.ensemble.store
    explored = []
    for i in range(30):
        docs = await retriever.ainvoke(f"question {i}", explore=False)
        explored.append(store.event(docs[0].metadata["event_id"])["explored"])
    assert not any(explored)
    exploring = [store.event((await retriever.ainvoke(f"question {i}"))[0].metadata["event_id"])["explored"]
                 for i in range(30)]
    assert any(exploring)  # the same calls without explore=False do explore: the check above can fail


def test_a_similarity_retrievers_search_kwargs_reach_its_vector_store() -> None:
    # as_member(vs.as_retriever(search_kwargs={"filter": ...})) dropped every search setting but k: documents
    # the filter excludes (another tenant's, another language's) were fused in
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    store.add_documents([Document(page_content=f"doc {i}", metadata={"lang": "en" if i % 2 else "de"}, id=f"d{i}")
                         for i in range(8)])
    member = as_member("vs", store.as_retriever(search_kwargs={"k": 3, "filter": lambda d: d.metadata["lang"] == "en"}),
                       scores="rank")
    found = member.function("doc", 6)
    assert found and all(chunk.metadata["lang"] == "en" for chunk, _ in found)
    unfiltered = as_member("vs", store.as_retriever(search_kwargs={"k": 3}), scores="rank").function("doc", 6)
    assert {chunk.metadata["lang"] for chunk, _ in unfiltered} == {"en", "de"}


class _Starts(BaseCallbackHandler):
    """Records each retriever run's id and its parent's."""

    def __init__(self) -> None:
        self.runs: list[tuple[Any, Any]] = []

    def on_retriever_start(self, serialized: Any, query: str, *, run_id: Any, parent_run_id: Any = None,
                           **kwargs: Any) -> None:
        self.runs.append((run_id, parent_run_id))


async def test_member_runs_nest_under_the_ensembles_run_under_ainvoke_as_under_invoke() -> None:
    # under ainvoke the members were invoked without the callbacks: their runs vanished from traces
    retriever = FeedbackEnsembleRetriever.from_retrievers(
        {"a": FeedbackEnsembleRetriever.from_texts(TEXTS, IDS, retrievers=("bm25",), log=False)}, k=2)
    for call in ("invoke", "ainvoke"):
        seen = _Starts()
        top = uuid.uuid4()
        if call == "invoke":
            retriever.invoke("tides", config={"callbacks": [seen]}, run_id=top)
        else:
            await retriever.ainvoke("tides", config={"callbacks": [seen]}, run_id=top)
        assert seen.runs[0] == (top, None) and len(seen.runs) == 2, call
        assert seen.runs[1][1] == top, call  # the member's run is the ensemble run's child


def test_the_retrievers_feedback_reads_the_score_on_the_scale_given(make_ensemble: Callable[..., Any]) -> None:
    # score_scale was dropped on the way to the store: a neutral 0.0 on the signed scale was a thumbs down
    retriever = FeedbackEnsembleRetriever(ensemble=make_ensemble(), k=2)
    eid = retriever.invoke("tides")[0].metadata["event_id"]
    assert [r.reward for r in retriever.feedback(eid, score=0.0, score_scale="signed")] == [0.0]
    assert [r.reward for r in retriever.feedback(eid, score=0.0)] == [pytest.approx(-1.0, abs=1e-3)]  # a thumb down


def test_a_handler_restarted_with_the_ensemble_on_another_store_still_teaches_it(tmp_path) -> None:
    # after a restart no live ensemble has made the retrieval, and the handler fell back to nothing instead of
    # its own ensemble: the feedback was stored in the handler's file and never learned
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    ens = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",), store=str(b))
    run = uuid.uuid4()
    handler = FeedbackCallbackHandler(str(a))
    FeedbackEnsembleRetriever(ensemble=ens, k=2).invoke("tides", config={"callbacks": [handler]}, run_id=run)
    handler.store.close()
    ens.close()
    del ens, handler
    gc.collect()

    again = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",), store=str(b))
    restarted = FeedbackCallbackHandler(str(a), ensemble=again)
    before = again.learner.n_learned
    records = restarted.record_feedback(run, score=1.0)
    assert len(records) == 2  # the handler's row and the learner's
    assert len(again.store.feedback(str(run))) == 1 and again.learner.n_learned == before + 1


def test_observe_followups_false_records_no_reformulation() -> None:
    # the handler observed restated questions of a session whatever observe_followups said
    keyword = LCBM25.from_texts(TEXTS)
    for observe, expected in ((False, []), (True, ["reformulation"])):
        handler = FeedbackCallbackHandler(FeedbackStore(), observe_followups=observe)
        config: RunnableConfig = {"callbacks": [handler], "metadata": {"session_id": "s1"}}
        first = uuid.uuid4()
        keyword.invoke("what causes the aurora borealis", config=config, run_id=first)
        keyword.invoke("the aurora borealis, what causes it?", config=config)
        assert [f["signal"] for f in handler.store.feedback(str(first))] == expected, observe
