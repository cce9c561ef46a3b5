"""FeedbackCallbackHandler: logs any retriever by run id, resolves a chain's or a tool's run id, bad input."""

from __future__ import annotations

import asyncio
import gc
import uuid
from typing import Any

import pytest
from langchain_classic.retrievers import EnsembleRetriever
from langchain_community.retrievers import BM25Retriever
from langchain_community.retrievers import BM25Retriever as LCBM25
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda, RunnablePassthrough
from langchain_core.tools import create_retriever_tool
from langchain_core.vectorstores import InMemoryVectorStore
from typing_extensions import assert_type

from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever, _runs, as_member
from rlfb import (
    FeedbackEnsemble,
    IdempotencyConflictError,
    NoStoreError,
    UnknownChunkError,
    UnknownEventError,
    ValidationError,
)
from rlfb.runs import EXTERNAL_POLICY
from rlfb.store import FeedbackRecord, FeedbackStore

from _lc_corpus import IDS, TEXTS

PROMPT = ChatPromptTemplate.from_template("Answer from the context.\n{context}\nQuestion: {question}")


def rag_chain(retriever: Any) -> Any:
    """A nested LCEL RAG chain: the retrieval sits two runs below the top-level run."""
    fmt: RunnableLambda[list[Document], str] = RunnableLambda(lambda docs: "\n".join(d.page_content for d in docs))
    llm = FakeListChatModel(responses=["an answer"])
    return {"context": retriever | fmt, "question": RunnablePassthrough()} | PROMPT | llm | StrOutputParser()


class Boom(BaseRetriever):
    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        raise RuntimeError("search backend down")


@pytest.fixture
def bm25() -> BM25Retriever:
    return BM25Retriever.from_texts(TEXTS, ids=IDS, k=3)


def test_plain_bm25_retriever_is_logged_by_run_id(bm25: BM25Retriever) -> None:
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    run_id = uuid.uuid4()
    docs = bm25.invoke("molten magma volcano", config={"callbacks": [handler]}, run_id=run_id)
    event = handler.store.event(str(run_id))
    assert event["query"] == "molten magma volcano" and event["policy"] == EXTERNAL_POLICY
    assert event["retrievers"] == ["BM25Retriever"]
    assert len(event["chunks"]) == len(docs) == 3
    (record,) = assert_type(  # typed: a typed app checks what it reads from the record
        handler.record_feedback(run_id, score=1.0, key="user_score", comment="helpful"), list[FeedbackRecord]
    )
    assert record.value == 1.0 and record.event_id == str(run_id)
    (record,) = handler.record_feedback(str(run_id), score=0)  # LangSmith thumbs down
    assert record.value == -1.0
    (record,) = handler.record_feedback(run_id, rating=4)
    assert record.value == 0.5
    second = event["chunks"][1]["chunk_id"]
    (record,) = handler.record_feedback(run_id, signal="explicit_negative", chunk_id=second)
    assert list(record.chunk_rewards) == [second]
    rows = handler.store.feedback(str(run_id))
    assert (rows[0]["key"], rows[0]["comment"]) == ("user_score", "helpful")


def test_file_store_path_and_signed_scores(tmp_path: Any, bm25: BM25Retriever) -> None:
    handler = FeedbackCallbackHandler(store=str(tmp_path / "fb.db"), score_scale="signed")
    run_id = uuid.uuid4()
    bm25.invoke("ocean tides", config={"callbacks": [handler]}, run_id=run_id)
    (record,) = handler.record_feedback(run_id, score=-0.5)
    assert record.value == -0.5
    with pytest.raises(ValidationError):
        FeedbackCallbackHandler(store=str(tmp_path / "fb.db"), score_scale="percent")
    with pytest.raises(ValidationError):
        FeedbackCallbackHandler()


def test_vector_store_retriever_with_real_embeddings(embeddings: Any) -> None:
    vs = InMemoryVectorStore(embeddings)
    vs.add_texts(TEXTS, ids=IDS)
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    run_id = uuid.uuid4()
    docs = vs.as_retriever(search_kwargs={"k": 2}).invoke(
        "why is the sky green near the poles", config={"callbacks": [handler]}, run_id=run_id
    )
    event = handler.store.event(str(run_id))
    assert [c["chunk_id"] for c in event["chunks"]] == [d.id for d in docs]
    assert event["chunks"][0]["chunk_id"] == "doc1"


def test_chain_run_id_finds_the_nested_retrieval(tmp_path: Any, bm25: BM25Retriever) -> None:
    path = tmp_path / "fb.db"
    handler = FeedbackCallbackHandler(store=str(path))
    top = uuid.uuid4()
    answer = rag_chain(bm25).invoke("what causes the aurora", config={"callbacks": [handler], "run_id": top})
    assert answer == "an answer"
    (event,) = handler.retrievals(top)
    assert event["query"] == "what causes the aurora"
    assert event["id"] != str(top) and event["parent_id"] != str(top)  # an intermediate run lies between
    (record,) = handler.record_feedback(top, score=1)
    assert record.event_id == event["id"]
    # another process, with only the file, resolves the chain's run id too
    other = FeedbackCallbackHandler(store=str(path))
    assert [e["id"] for e in other.retrievals(top)] == [event["id"]]
    assert other.record_feedback(top, signal="thumbs_up")[0].event_id == event["id"]


def test_chain_with_two_retrievals_rates_both_and_chunk_feedback_picks_one(bm25: BM25Retriever) -> None:
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    other = BM25Retriever.from_texts(["an unrelated note about tides"], ids=["note"], k=1)
    chain = {"a": bm25, "b": other} | RunnableLambda(lambda d: len(d["a"]) + len(d["b"]))
    top = uuid.uuid4()
    assert chain.invoke("tides", config={"callbacks": [handler], "run_id": top}) == 4
    assert len(handler.retrievals(top)) == 2
    assert len(handler.record_feedback(top, score=1, idempotency_key="fb-1")) == 2
    (record,) = handler.record_feedback(top, signal="click", chunk_id="note")
    assert set(record.chunk_rewards) == {"note"}
    with pytest.raises(UnknownChunkError):
        handler.record_feedback(top, signal="click", chunk_id="no-such-chunk")


def test_a_run_id_spelled_as_another_form_of_its_uuid_finds_the_run(bm25: BM25Retriever) -> None:
    # run ids were matched as written: the hex, upper-case or braced spelling of a run's UUID (a trace's id,
    # copied) was an UnknownEventError, where LangSmith reads any of them as the run's UUID
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    run_id = uuid.uuid4()
    bm25.invoke("molten magma volcano", config={"callbacks": [handler]}, run_id=run_id)
    for spelling in (run_id.hex, str(run_id).upper(), f"{{{run_id}}}", f"urn:uuid:{run_id}"):
        (record,) = handler.record_feedback(spelling, score=1.0)
        assert record.event_id == str(run_id)
    assert handler.retrievals(run_id.hex)[0]["id"] == str(run_id)
    with pytest.raises(UnknownEventError):
        handler.record_feedback(uuid.uuid4().hex, score=1.0)


def test_unknown_run_id_is_a_clear_error() -> None:
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    run_id = uuid.uuid4()
    with pytest.raises(UnknownEventError, match=f"no retrieval was logged under run id '{run_id}'"):
        handler.record_feedback(run_id, score=1.0)
    with pytest.raises(ValidationError):
        handler.record_feedback("", score=1.0)


def test_bad_scores_are_rejected_before_anything_is_written(bm25: BM25Retriever) -> None:
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    run_id = uuid.uuid4()
    bm25.invoke("tides", config={"callbacks": [handler]}, run_id=run_id)
    for bad in (1.5, -0.1, float("nan"), "yes"):
        with pytest.raises(ValidationError):
            handler.record_feedback(run_id, score=bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        handler.record_feedback(run_id, score=1, value=1.0)
    assert handler.store.counts()["feedback"] == 0


def test_failing_retriever_logs_nothing_and_the_error_propagates(bm25: BM25Retriever) -> None:
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    top = uuid.uuid4()
    with pytest.raises(RuntimeError, match="search backend down"):
        rag_chain(Boom()).invoke("anything", config={"callbacks": [handler], "run_id": top})
    assert handler.store.counts()["events"] == 0
    assert handler._parents == {} and handler._retrievals == {}  # nothing left behind
    with pytest.raises(UnknownEventError):
        handler.record_feedback(top, score=1)
    # the same handler keeps working
    run_id = uuid.uuid4()
    bm25.invoke("tides", config={"callbacks": [handler]}, run_id=run_id)
    assert handler.store.has_event(str(run_id))


def test_our_retriever_is_not_logged_twice(make_ensemble: Any) -> None:
    ens = make_ensemble(policy="gradient")
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=3)
    top = uuid.uuid4()
    rag_chain(retriever).invoke("what causes the aurora", config={"callbacks": [handler], "run_id": top})
    assert ens.store.counts()["events"] == 1
    (event,) = handler.retrievals(top)
    assert event["policy"] == "gradient"  # the ensemble's own decision, not an external copy
    handler.record_feedback(top, score=1.0)
    assert ens.store.load_policy_state() is not None  # routed to the ensemble, which learned
    # a handler on another store keeps its own copy
    elsewhere = FeedbackCallbackHandler(store=FeedbackStore())
    run_id = uuid.uuid4()
    retriever.invoke("tides", config={"callbacks": [elsewhere]}, run_id=run_id)
    assert elsewhere.store.event(str(run_id))["policy"] == EXTERNAL_POLICY
    assert ens.store.has_event(str(run_id))


def test_a_copy_on_another_store_has_the_session_the_retriever_used(make_ensemble: Any) -> None:
    # the handler read the session from the run's metadata alone: its copy of a retrieval made with the
    # retriever's own session_id had none, so no follow-up was seen in the handler's store
    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=3, session_id="chat-1")
    elsewhere = FeedbackCallbackHandler(FeedbackStore(), ensemble=retriever)
    first, second = uuid.uuid4(), uuid.uuid4()
    retriever.invoke("what causes the aurora borealis", config={"callbacks": [elsewhere]}, run_id=first)
    retriever.invoke("the aurora borealis, what causes it?", config={"callbacks": [elsewhere]}, run_id=second)
    for store in (ens.store, elsewhere.store):
        assert [store.event(str(r))["session_id"] for r in (first, second)] == ["chat-1", "chat-1"]
        assert [f["signal"] for f in store.feedback(str(first))] == ["reformulation"]
    # the run's own session comes first, as for the retriever; an explicit None is no session
    for meta, want in ({"session_id": "chat-2"}, "chat-2"), ({"session_id": None}, None):
        run = uuid.uuid4()
        retriever.invoke("tides", config={"callbacks": [elsewhere], "metadata": meta}, run_id=run)
        assert elsewhere.store.event(str(run))["session_id"] == ens.store.event(str(run))["session_id"] == want


def test_session_followups_with_a_plain_retriever(bm25: BM25Retriever) -> None:
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    config: RunnableConfig = {"callbacks": [handler], "metadata": {"session_id": "chat-1"}}
    first = uuid.uuid4()
    bm25.invoke("what causes the aurora borealis", config=config, run_id=first)
    bm25.invoke("the aurora borealis, what causes it?", config=config)
    bm25.invoke("stock market and interest rates", config=config)
    assert [f["signal"] for f in handler.store.feedback(str(first))] == ["reformulation"]
    assert len(handler.store.events_for_session("chat-1")) == 3


async def test_async_chain_and_abatch_log_every_event(bm25: BM25Retriever) -> None:
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    chain = rag_chain(bm25)
    tops = [uuid.uuid4() for _ in range(6)]
    await chain.abatch(
        [f"question {i} about tides" for i in range(6)],
        config=[{"callbacks": [handler], "run_id": t} for t in tops],
    )
    assert handler.store.counts()["events"] == 6
    assert all(len(handler.retrievals(t)) == 1 for t in tops)
    assert await chain.ainvoke("glaciers", config={"callbacks": [handler]}) == "an answer"
    assert handler.store.counts()["events"] == 7


async def test_a_chain_cancelled_in_ainvoke_drops_the_open_retrieval_under_it() -> None:
    # LangChain reports a cancelled chain (its error hook takes BaseException) but not the retriever that was
    # awaiting inside it: the handler must not keep that retrieval's entries for ever
    started = asyncio.Event()

    class Waiting(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
            raise NotImplementedError

        async def _aget_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
            started.set()
            await asyncio.Event().wait()  # until cancelled
            return []

    handler = FeedbackCallbackHandler(store=FeedbackStore())
    chain = RunnableLambda(lambda q: q) | Waiting()
    task = asyncio.create_task(chain.ainvoke("what causes the aurora", config={"callbacks": [handler]}))
    await started.wait()
    assert len(handler._retrievals) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handler._retrievals == {} and handler._parents == {}
    assert handler.store.counts()["events"] == 0


def test_open_runs_that_never_end_are_bounded(bm25: BM25Retriever, monkeypatch: pytest.MonkeyPatch) -> None:
    # An ainvoke cancelled before its chain starts (asyncio.wait_for with a tiny timeout): the sync handler's
    # start hook runs in a worker thread after the cancellation, and LangChain sends no end nor error for it,
    # so every such run's entry stayed for the life of the handler
    monkeypatch.setattr(_runs, "OPEN_RUNS", 10)  # the bound on every table of open runs
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    chains = [uuid.uuid4() for _ in range(12)]
    for run in chains:
        handler.on_chain_start({}, "what causes the aurora", run_id=run)
    assert list(handler._parents) == [str(r) for r in chains[2:]]  # the two oldest are forgotten
    retrievals = [uuid.uuid4() for _ in range(12)]
    for run in retrievals:
        handler.on_retriever_start({}, "what causes the aurora", run_id=run)
    assert list(handler._retrievals) == list(handler._parents) == [str(r) for r in retrievals[2:]]
    top = uuid.uuid4()  # a run as ever: its own entries are the newest
    assert rag_chain(bm25).invoke("ocean tides", config={"callbacks": [handler], "run_id": top}) == "an answer"
    (event,) = handler.retrievals(top)
    (record,) = handler.record_feedback(top, score=1.0)
    assert record.event_id == event["id"] and event["query"] == "ocean tides"
    assert len(handler._parents) <= 10 and set(handler._parents) <= {str(r) for r in retrievals}


def test_retrieval_through_a_tool_links_up_to_the_root_run(bm25: BM25Retriever) -> None:
    # What an agent or a LangGraph ToolNode does: a chain step calls a tool that calls the retriever.
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    kb = create_retriever_tool(bm25, "kb", "search the knowledge base")
    step: RunnableLambda[str, dict[str, Any]] = RunnableLambda(
        lambda q: {"context": kb.invoke({"query": q}), "question": q})
    agent = step | PROMPT | FakeListChatModel(responses=["an answer"]) | StrOutputParser()
    top = uuid.uuid4()
    assert agent.invoke("what causes the aurora", config={"callbacks": [handler], "run_id": top}) == "an answer"
    (event,) = handler.retrievals(top)
    (record,) = handler.record_feedback(top, score=1.0)
    assert record.event_id == event["id"]
    assert handler._parents == {}  # tool and chat model runs are forgotten when they end


def test_a_failing_tool_leaves_no_open_run(bm25: BM25Retriever) -> None:
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    kb = create_retriever_tool(Boom(), "kb", "search the knowledge base")
    with pytest.raises(RuntimeError, match="search backend down"):
        kb.invoke({"query": "anything"}, config={"callbacks": [handler]})
    assert handler._parents == {} and handler._retrievals == {}


@pytest.mark.parametrize("wrap", ["with_retry", "rewrite_then_search", "search_then_trim"])
def test_members_reached_through_a_chain_are_not_logged_twice(bm25: BM25Retriever, wrap: str) -> None:
    other = BM25Retriever.from_texts(["an unrelated note about tides"], ids=["note"], k=1)
    member = {
        "with_retry": lambda: bm25.with_retry(stop_after_attempt=2),
        "rewrite_then_search": lambda: RunnableLambda(str.lower) | bm25,
        "search_then_trim": lambda: bm25 | RunnableLambda(lambda docs: docs[:2]),
    }[wrap]()
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    ensemble = EnsembleRetriever(retrievers=[member, other], weights=[0.5, 0.5])
    top = uuid.uuid4()
    chain: Runnable[Any, list[Document]] = RunnablePassthrough() | ensemble
    chain.invoke("Tides", config={"callbacks": [handler], "run_id": top})
    (event,) = handler.retrievals(top)  # only the outer ensemble's result
    assert event["retrievers"] == ["EnsembleRetriever"]
    assert len(handler.record_feedback(top, score=1.0)) == 1


def test_rlfb_member_behind_a_chain_is_not_logged_twice(make_ensemble: Any, bm25: BM25Retriever) -> None:
    ens = make_ensemble(members=[as_member("rewritten", RunnableLambda(str.lower) | bm25)])
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    top = uuid.uuid4()
    chain: Runnable[Any, list[Document]] = RunnablePassthrough() | FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    chain.invoke("Molten magma", config={"callbacks": [handler], "run_id": top})
    assert ens.store.counts()["events"] == 1
    (record,) = handler.record_feedback(top, score=0.0)
    assert record.event_id == handler.retrievals(top)[0]["id"]


def test_handler_on_another_store_teaches_the_ensemble(make_ensemble: Any) -> None:
    ens = make_ensemble(policy="gradient")
    handler = FeedbackCallbackHandler(FeedbackStore(), ensemble=ens)  # keeps its own log
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    top = uuid.uuid4()
    rag_chain(retriever).invoke("what causes the aurora", config={"callbacks": [handler], "run_id": top})
    (copy,) = handler.retrievals(top)
    assert copy["policy"] == EXTERNAL_POLICY and ens.store.event(copy["id"])["policy"] == "gradient"
    records = handler.record_feedback(top, score=1.0, idempotency_key="fb-1")
    assert [r.event_id for r in records] == [copy["id"], copy["id"]]  # the handler's copy, the ensemble's
    assert handler.store.counts()["feedback"] == ens.store.counts()["feedback"] == 1
    assert ens.store.load_policy_state() is not None  # the ensemble learned
    # a retry with the same idempotency key is not learned twice
    handler.record_feedback(top, score=1.0, idempotency_key="fb-1")
    assert ens.store.counts()["feedback"] == 1


def test_feedback_the_learners_store_refuses_leaves_no_row_in_the_handlers(make_ensemble: Any) -> None:
    # the handler's store and the learner's were written in two transactions: a refusal of the second (here an
    # idempotency conflict) raised, but the handler's row stayed, and a retry with a fresh key rated it twice
    ens = make_ensemble(policy="gradient")
    handler = FeedbackCallbackHandler(FeedbackStore(), ensemble=ens)
    top = uuid.uuid4()
    rag_chain(FeedbackEnsembleRetriever.from_ensemble(ens, k=2)).invoke(
        "what causes the aurora", config={"callbacks": [handler], "run_id": top})
    (copy,) = handler.retrievals(top)
    ens.store.record_feedback(copy["id"], "explicit_negative", idempotency_key="fb-1")  # the key, taken there
    learned = ens.learner.n_learned
    with pytest.raises(IdempotencyConflictError):
        handler.record_feedback(top, score=1.0, idempotency_key="fb-1")
    assert handler.store.counts()["feedback"] == 0 and handler.store.counts()["rewards"] == 0
    assert ens.store.counts()["feedback"] == 1 and ens.learner.n_learned == learned
    records = handler.record_feedback(top, score=1.0, idempotency_key="fb-2")  # a retry lands on both
    assert [r.event_id for r in records] == [copy["id"], copy["id"]]
    assert handler.store.counts()["feedback"] == 1 and ens.store.counts()["feedback"] == 2


def test_feedback_on_another_ensembles_decision_on_the_learners_file_is_learned(tmp_path: Any) -> None:
    # a handler on its own file, given one ensemble of a two-corpus app whose ensembles share one file through
    # stores of their own: holding a block on that file around the learner's write kept the other ensemble, which
    # made the decision, waiting for its own connection until busy_timeout, and nothing was recorded
    from rlfb import FeedbackEnsemble

    shared = str(tmp_path / "fb.db")
    texts = ["tides and the moon", "magma and volcanoes", "aurora and the sun", "rain and clouds"]
    ens_a, ens_b = (FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), policy="gradient",
                                                store=FeedbackStore(shared, busy_timeout=1)) for _ in range(2))
    handler = FeedbackCallbackHandler(FeedbackStore(tmp_path / "h.db"), ensemble=ens_a)
    top = uuid.uuid4()
    rag_chain(FeedbackEnsembleRetriever.from_ensemble(ens_b, k=2)).invoke(
        "moon", config={"callbacks": [handler], "run_id": top})
    assert len(handler.record_feedback(top, score=1.0)) == 2
    assert ens_b.learner.n_learned == 1 and handler.store.counts()["feedback"] == 1


def test_feedback_on_a_plain_retrievers_run_does_not_wait_for_the_learners_file(tmp_path: Any) -> None:
    # the learner's file was locked for every feedback, even on a run it holds nothing of: another process
    # writing there failed the feedback of a plain retriever's run after busy_timeout
    import sqlite3

    from rlfb import FeedbackEnsemble

    class Plain(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list:
            return [Document(page_content="tides and the moon", id="x1")]

    learner_file = tmp_path / "fb.db"
    ens = FeedbackEnsemble.from_texts(["tides and the moon", "magma"], retrievers=("bm25",), policy="gradient",
                                      store=FeedbackStore(learner_file, busy_timeout=0.5))
    handler = FeedbackCallbackHandler(FeedbackStore(tmp_path / "h.db"), ensemble=ens)
    Plain().invoke("moon", config={"callbacks": [handler]})
    (event,) = handler.store.db.query("SELECT id FROM events")
    other = sqlite3.connect(learner_file, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process writing the learner's file
    try:
        (record,) = handler.record_feedback(event["id"], score=1.0)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert record.event_id == event["id"] and not record.duplicate


def test_handler_on_the_ensemble_file_records_once(tmp_path: Any, make_ensemble: Any) -> None:
    path = str(tmp_path / "fb.db")
    ens = make_ensemble(store=FeedbackStore(path), policy="gradient")
    handler = FeedbackCallbackHandler(path, ensemble=ens)  # another connection to the same file
    run_id = uuid.uuid4()
    FeedbackEnsembleRetriever.from_ensemble(ens).invoke("tides", config={"callbacks": [handler]}, run_id=run_id)
    assert len(handler.record_feedback(run_id, score=1.0)) == 1
    assert ens.store.counts()["feedback"] == 1 and ens.store.load_policy_state() is not None


# -- from an audit of the LangChain adapter ---------------------------------------------------------------
def test_an_rlfb_retriever_inside_a_wrapper_retriever_is_not_its_own_follow_up(make_ensemble: Any) -> None:
    # the handler took the inner retrieval, logged moments before in the same turn, for the session's previous
    # question and recorded it as a reformulation, which the ensemble learned from
    ens = make_ensemble(policy="thompson")
    inner = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    outer = EnsembleRetriever(retrievers=[inner], weights=[1.0])
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    outer.invoke("what causes the aurora borealis", config={"callbacks": [handler],
                                                            "metadata": {"session_id": "u1"}})
    assert ens.store.counts()["feedback"] == 0 and ens.store.counts()["policy_snapshots"] == 0


def _flaky_setup(make_ensemble: Any) -> tuple[Any, FeedbackEnsembleRetriever, FeedbackCallbackHandler, Any]:
    """An ensemble, its retriever and handler, and an "LLM" that fails its first call (rate limited) only."""
    ens = make_ensemble()
    calls = []

    def flaky_llm(prompt: Any) -> str:
        calls.append(prompt)
        if len(calls) == 1:
            raise RuntimeError("429 rate limited")
        return "answer"

    return ens, FeedbackEnsembleRetriever.from_ensemble(ens, k=2), FeedbackCallbackHandler.from_ensemble(ens), flaky_llm


def test_feedback_on_a_chain_skips_the_retrieval_of_a_failed_retry_attempt(make_ensemble: Any) -> None:
    # both attempts' retrievals were linked under the top run, and feedback rated the ranking that never
    # produced the answer
    ens, retriever, handler, flaky_llm = _flaky_setup(make_ensemble)
    join: RunnableLambda[list[Document], str] = RunnableLambda(lambda docs: " ".join(d.page_content for d in docs))
    context = retriever | join
    chain = ({"context": context, "question": RunnablePassthrough()} | RunnableLambda(flaky_llm)).with_retry(
        stop_after_attempt=2, wait_exponential_jitter=False)
    top = uuid.uuid4()
    assert chain.invoke("why do tides happen", config={"callbacks": [handler], "run_id": top}) == "answer"
    assert ens.store.counts()["events"] == 2
    assert len(handler.retrievals(top)) == 1
    (record,) = handler.record_feedback(top, score=1.0)
    assert record.event_id == handler.retrievals(top)[0]["id"]


@pytest.mark.parametrize("wrap", ["with_fallbacks", "with_retry"])
def test_a_retry_or_fallback_in_a_session_is_no_reformulation_of_the_failed_attempt(make_ensemble: Any,
                                                                                     wrap: str) -> None:
    # the failed attempt's run was unlinked from the run above it, so the second attempt's retrieval shared no
    # run with the first and was taken for the user restating it: a -0.2 reformulation was learned on a
    # ranking nobody saw an answer from
    ens, retriever, handler, flaky_llm = _flaky_setup(make_ensemble)
    attempt = retriever | RunnableLambda(flaky_llm)
    chain = (attempt.with_fallbacks([retriever | RunnableLambda(flaky_llm)]) if wrap == "with_fallbacks"
             else attempt.with_retry(stop_after_attempt=2, wait_exponential_jitter=False))
    top = uuid.uuid4()
    config: RunnableConfig = {"callbacks": [handler], "run_id": top, "metadata": {"session_id": "s"}}
    assert chain.invoke("why do tides happen", config=config) == "answer"
    assert ens.store.counts()["events"] == 2 and ens.store.counts()["feedback"] == 0
    assert ens.learner.n_learned == 0
    first, answered = ens.store.events_for_session("s")
    assert ens.store.run_failed(first["parent_id"]) and not ens.store.run_failed(answered["parent_id"])
    # feedback on the chain rates the attempt that answered only (LangChain reports a fallback's attempts as
    # top-level runs, under no run of the chain's: feedback on the chain's id reached neither)
    (record,) = handler.record_feedback(top, score=1.0)
    assert record.event_id == answered["id"]
    # the session's next question, restating this one, is a reformulation of the attempt that answered
    retriever.invoke("why do the tides happen", config={"callbacks": [handler], "metadata": {"session_id": "s"}})
    assert [f["signal"] for f in ens.store.feedback(answered["id"]) if f["signal"] != "score"] == ["reformulation"]
    assert ens.store.feedback(first["id"]) == []


def test_feedback_on_a_fallbacks_run_inside_a_chain_reaches_the_attempt_that_answered(make_ensemble: Any) -> None:
    # LangChain reports a fallback's attempts under the run above the fallbacks: feedback on the fallbacks run's
    # own id reached no retrieval
    ens, retriever, handler, flaky_llm = _flaky_setup(make_ensemble)
    fallbacks = (retriever | RunnableLambda(flaky_llm)).with_fallbacks([retriever | RunnableLambda(flaky_llm)])
    inner = uuid.uuid4()
    outer: RunnableLambda[str, str] = RunnableLambda(
        lambda q, config: fallbacks.invoke(q, config={**config, "run_id": inner}))
    top = uuid.uuid4()
    assert outer.invoke("why do tides happen", config={"callbacks": [handler], "run_id": top}) == "answer"
    assert ens.store.counts()["events"] == 2
    (answered,) = handler.retrievals(inner)
    assert handler.retrievals(top) == [answered]
    (record,) = handler.record_feedback(inner, score=1.0)
    assert record.event_id == answered["id"] and ens.learner.n_learned == 1


@pytest.mark.parametrize("call", ["invoke", "ainvoke"])
def test_feedback_on_a_fallbacks_run_reaches_a_retriever_that_is_the_fallback(make_ensemble: Any,
                                                                              call: str) -> None:
    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    handler = FeedbackCallbackHandler.from_ensemble(ens)

    def down(query: str) -> list[Document]:
        raise ConnectionError("the search service is down")

    chain = RunnableLambda(down).with_fallbacks([retriever])
    top = uuid.uuid4()
    config: RunnableConfig = {"callbacks": [handler], "run_id": top}
    docs = chain.invoke("tides", config=config) if call == "invoke" else asyncio.run(chain.ainvoke("tides", config))
    (event,) = handler.retrievals(top)
    assert event["id"] == docs[0].metadata["event_id"]
    assert [r.event_id for r in handler.record_feedback(top, score=1.0)] == [event["id"]]


def test_a_run_is_placed_under_the_run_in_the_context_only_below_its_reported_parent(make_ensemble: Any) -> None:
    # the run named by the context's config (a fallbacks run) is taken only below the reported parent: a run is
    # never moved onto another branch
    from langchain_core.callbacks import CallbackManager
    from langchain_core.runnables.config import set_config_context

    handler = FeedbackCallbackHandler.from_ensemble(make_ensemble())
    branch, other = uuid.uuid4(), uuid.uuid4()
    handler.on_chain_start({}, {}, run_id=branch)
    handler.on_chain_start({}, {}, run_id=other)
    below, plain = uuid.uuid4(), uuid.uuid4()
    handler.on_chain_start(None, {}, run_id=below, parent_run_id=branch, name="RunnableWithFallbacks")
    handler.on_chain_start(None, {}, run_id=plain, parent_run_id=branch, name="RunnableLambda")

    def start_each(under: uuid.UUID) -> dict[str, str | None]:
        placed = {}
        for name, reported in (("none", None), ("branch", branch), ("other", other), ("under", under)):
            run = uuid.uuid4()
            handler.on_retriever_start({}, "tides", run_id=run, parent_run_id=reported)
            placed[name] = handler._parents[str(run)]
        return placed

    # as a fallbacks run calls its attempts: the context names it as the parent
    with set_config_context({"callbacks": CallbackManager([handler], parent_run_id=below)}) as context:
        placed = context.run(start_each, below)
    assert placed == {"none": str(below), "branch": str(below), "other": str(other), "under": str(below)}
    # any other run in the context is no fallbacks run: a run stays where LangChain reports it
    with set_config_context({"callbacks": CallbackManager([handler], parent_run_id=plain)}) as context:
        placed = context.run(start_each, plain)
    assert placed == {"none": None, "branch": str(branch), "other": str(other), "under": str(plain)}


def test_a_retrieval_started_as_a_trace_of_its_own_inside_a_run_stays_one(make_ensemble: Any) -> None:
    # code inside a run starting a retrieval with a callbacks list of its own (a separate trace) had it placed
    # under the run around it, and feedback on that run rated it
    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    handler = FeedbackCallbackHandler.from_ensemble(ens)

    def tool(query: str) -> str:
        retriever.invoke("glacier", config={"callbacks": [handler]})
        return query

    top = uuid.uuid4()
    RunnableLambda(tool).invoke("tides", config={"callbacks": [handler], "run_id": top})
    assert ens.store.counts()["events"] == 1 and handler.retrievals(top) == []


def test_a_handler_given_a_retriever_as_its_ensemble_unwraps_it(make_ensemble: Any) -> None:
    # accepted, then every retrieval failed inside the callback and record_feedback raised AttributeError
    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    handler = FeedbackCallbackHandler(ens.store, ensemble=retriever)
    assert handler.ensemble is ens
    run = uuid.uuid4()
    retriever.invoke("tides", config={"callbacks": [handler], "metadata": {"session_id": "s"}}, run_id=run)
    assert len(handler.record_feedback(run, score=1.0)) == 1
    with pytest.raises(ValidationError, match="FeedbackEnsemble or a retriever"):
        FeedbackCallbackHandler(ens.store, ensemble="not an ensemble")


def test_a_handler_given_an_ensemble_without_a_store_says_so() -> None:
    # it said "needs a store (a path or a FeedbackStore) or an ensemble", though an ensemble was given
    no_store = FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, retrievers=("bm25",))
    for given in (no_store, no_store.ensemble):
        with pytest.raises(NoStoreError, match="the ensemble has no feedback store"):
            FeedbackCallbackHandler(ensemble=given)
        with pytest.raises(NoStoreError, match="the ensemble has no feedback store"):
            FeedbackCallbackHandler.from_ensemble(given)
        # with a store of the handler's own it was taken: feedback on its retrievals was stored and taught it
        # nothing (they are logged in no store its learner reads)
        with pytest.raises(NoStoreError, match="the ensemble has no feedback store"):
            FeedbackCallbackHandler(FeedbackStore(), ensemble=given)
    with pytest.raises(ValidationError, match="needs a store"):
        FeedbackCallbackHandler()


def test_record_feedback_takes_langsmiths_key_second(bm25: BM25Retriever) -> None:
    handler = FeedbackCallbackHandler(FeedbackStore())
    run = uuid.uuid4()
    bm25.invoke("tides", config={"callbacks": [handler]}, run_id=run)
    (rec,) = handler.record_feedback(run, "user_score", score=1)  # create_feedback(run_id, key, score=...)
    assert rec.value == 1.0
    (again,) = handler.record_feedback(run, 0.0)  # a number second is the score, as before
    assert again.value == -1.0
    with pytest.raises(ValidationError, match="key once"):
        handler.record_feedback(run, "user_score", key="other", score=1)


def test_record_feedback_takes_a_signals_name_second_as_the_ensemble_does(bm25: BM25Retriever) -> None:
    # record_feedback(run, "thumbs_down") read the signal as a LangSmith key and refused for want of a signal
    handler = FeedbackCallbackHandler(FeedbackStore())
    run = uuid.uuid4()
    bm25.invoke("tides", config={"callbacks": [handler]}, run_id=run)
    (down,) = handler.record_feedback(run, "thumbs_down")
    assert down.value == -1.0 and handler.store.feedback(down.event_id)[-1]["key"] is None
    (keyed,) = handler.record_feedback(run, "thumbs_up", score=0.0)  # with a score it is LangSmith's key
    assert keyed.value == -1.0 and handler.store.feedback(keyed.event_id)[-1]["key"] == "thumbs_up"
    with pytest.raises(ValidationError, match="needs a signal"):
        handler.record_feedback(run, "rating")  # a signal that takes a number stays a key


class Trim(BaseRetriever):
    """A wrapper retriever (compression, dedup, re-ranking...): calls ``inner`` as a child run, keeps ``keep``."""

    inner: Any
    keep: int | None = 1

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        docs = self.inner.invoke(query, config={"callbacks": run_manager.get_child()})
        return docs if self.keep is None else docs[: self.keep]


@pytest.mark.parametrize("inner", ["retriever", "behind_a_chain"])
def test_feedback_on_a_wrapper_retrievers_run_teaches_the_rlfb_retriever_inside(make_ensemble: Any,
                                                                                 inner: str) -> None:
    # the handler logged the wrapper's result as an event under its run id; the rlfb decision below it had that
    # run id as parent, but resolve_run never looks below an event, so feedback rated the copy and nothing learned
    ens = make_ensemble(policy="gradient")
    fer = FeedbackEnsembleRetriever.from_ensemble(ens, k=3)
    wrapper = Trim(inner=fer if inner == "retriever" else RunnableLambda(str.lower) | fer)
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    run = uuid.uuid4()
    (doc,) = wrapper.invoke("What causes the aurora", config={"callbacks": [handler]}, run_id=run)
    decision = doc.metadata["event_id"]
    assert [e["id"] for e in handler.retrievals(run)] == [decision, f"{run}/result"]
    assert handler.store.event(f"{run}/result")["policy"] == EXTERNAL_POLICY
    assert len(handler.store.event(f"{run}/result")["chunks"]) == 1  # what the wrapper returned
    records = handler.record_feedback(run, score=1.0)
    assert {r.event_id for r in records} == {decision, f"{run}/result"}
    assert ens.store.load_policy_state() is not None  # the ensemble learned from its own decision
    assert len(fer.feedback(run, score=1.0)) == 2  # the retriever's own feedback by run id too
    # and from a chain above the wrapper
    top = uuid.uuid4()
    chain: Runnable[Any, list[Document]] = RunnablePassthrough() | wrapper
    chain.invoke("tides", config={"callbacks": [handler], "run_id": top})
    assert len(handler.retrievals(top)) == 2


def test_a_wrapper_that_returns_the_rlfb_ranking_as_is_adds_no_copy(make_ensemble: Any) -> None:
    ens = make_ensemble(policy="gradient")
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    run = uuid.uuid4()
    docs = Trim(inner=FeedbackEnsembleRetriever.from_ensemble(ens, k=2), keep=None).invoke(
        "tides", config={"callbacks": [handler]}, run_id=run)
    (record,) = handler.record_feedback(run, score=1.0)
    assert record.event_id == docs[0].metadata["event_id"] and ens.store.counts()["events"] == 1
    assert ens.store.load_policy_state() is not None


def test_a_handler_on_another_store_teaches_the_rlfb_retriever_inside_a_wrapper(make_ensemble: Any) -> None:
    ens = make_ensemble(policy="gradient")
    handler = FeedbackCallbackHandler(FeedbackStore(), ensemble=ens)
    run = uuid.uuid4()
    (doc,) = Trim(inner=FeedbackEnsembleRetriever.from_ensemble(ens, k=3)).invoke(
        "What causes the aurora", config={"callbacks": [handler]}, run_id=run)
    decision = doc.metadata["event_id"]
    assert [e["id"] for e in handler.retrievals(run)] == [decision, f"{run}/result"]  # a copy of the decision
    records = handler.record_feedback(run, score=1.0)
    assert sorted(r.event_id for r in records) == sorted([decision, f"{run}/result", decision])
    assert ens.store.counts()["feedback"] == 1 and ens.store.load_policy_state() is not None


def _spy_learning(retriever: FeedbackEnsembleRetriever, name: str, learned: list) -> None:
    learn = retriever.ensemble._learn

    def spy(record: Any, event: Any = None, **kw: Any) -> Any:
        learned.append((name, tuple(c["chunk_id"] for c in (event or {}).get("chunks", []))))
        return learn(record, event, **kw)

    retriever.ensemble._learn = spy  # type: ignore[method-assign]


def test_two_retrievers_of_one_store_each_learn_their_own_decision_from_feedback_on_the_chain(tmp_path) -> None:
    # two corpora with the same retrievers on one store: feedback on the chain's run through a handler made
    # from_ensemble of one taught that one both decisions and the other none; a handler made from the store
    # alone taught neither
    store = FeedbackStore(tmp_path / "fb.db")
    manual = [Document(page_content=f"manual page {i} valve pressure rating {i}", id=f"A{i}") for i in range(8)]
    faq = [Document(page_content=f"faq entry {i} valve pressure question {i}", id=f"B{i}") for i in range(8)]
    ra = FeedbackEnsembleRetriever.from_documents(manual, retrievers=("bm25",), store=store, k=2)
    rb = FeedbackEnsembleRetriever.from_documents(faq, retrievers=("bm25",), store=store, k=2)
    learned: list = []
    _spy_learning(ra, "A", learned)
    _spy_learning(rb, "B", learned)
    ids: RunnableLambda[list[Document], list[str | None]] = RunnableLambda(lambda docs: [d.id for d in docs])
    chain: Runnable[Any, dict[str, Any]] = RunnablePassthrough() | {"manual": ra | ids, "faq": rb | ids}
    for handler in (FeedbackCallbackHandler.from_ensemble(ra), FeedbackCallbackHandler(store=store)):
        learned.clear()
        run = uuid.uuid4()
        chain.invoke("valve pressure", config={"callbacks": [handler], "run_id": run})
        assert len(handler.record_feedback(run, score=1.0)) == 2
        assert sorted(name for name, _ in learned) == ["A", "B"]
        assert all(all(c.startswith(name) for c in chunks) for name, chunks in learned)


@pytest.mark.parametrize("wrap", ["with_retry", "with_fallbacks"])
def test_feedback_skips_a_decision_under_an_outer_retriever_that_raised(make_ensemble: Any, wrap: str) -> None:
    # an outer retriever (a trimmer) around an rlfb retriever failed once after its member had ranked: the
    # handler forgot the failed run without marking it failed, so feedback on the chain also rated the
    # first attempt's ranking, which produced no answer, and the learner learned from it
    ens = make_ensemble()
    inner = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    calls: list[int] = []

    class Trim(BaseRetriever):
        member: Any

        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            docs = self.member.invoke(query, config={"callbacks": run_manager.get_child()})
            calls.append(1)
            if len(calls) == 1:
                raise ConnectionError("the reranking service timed out")
            return docs[:1]

    trim = Trim(member=inner)
    wrapped = (trim.with_retry(stop_after_attempt=2, wait_exponential_jitter=False) if wrap == "with_retry"
               else trim.with_fallbacks([trim]))
    top = uuid.uuid4()
    (doc,) = (RunnableLambda(lambda q: q) | wrapped).invoke("why do tides happen",
                                                            config={"callbacks": [handler], "run_id": top})
    assert ens.store.counts()["events"] >= 2  # each attempt's rlfb decision is logged
    rated = {r.event_id for r in handler.record_feedback(top, score=1.0)}
    answered = doc.metadata["event_id"]
    assert answered in rated
    decisions = [e for e in rated if ens.store.event(e)["policy"] != EXTERNAL_POLICY]
    assert decisions == [answered]  # the first attempt's decision is not rated
    assert ens.learner.n_learned == 1


@pytest.mark.parametrize("handler_of", ["first_ensemble", "store_alone"])
def test_two_rlfb_retrievers_on_two_stores_in_one_chain_both_learn(make_ensemble: Any, handler_of: str) -> None:
    # the handler knew one ensemble: the other retriever's decision got the chain's feedback on the handler's
    # copy only, and its own store and learner never saw it
    first, second = make_ensemble(policy="gradient"), make_ensemble(policy="gradient")
    handler = (FeedbackCallbackHandler.from_ensemble(first) if handler_of == "first_ensemble"
               else FeedbackCallbackHandler(FeedbackStore()))
    fmt: RunnableLambda[list[Document], str] = RunnableLambda(lambda docs: " ".join(d.page_content for d in docs))
    chain = ({"a": FeedbackEnsembleRetriever.from_ensemble(first, k=2) | fmt,
              "b": FeedbackEnsembleRetriever.from_ensemble(second, k=2) | fmt, "question": RunnablePassthrough()}
             | ChatPromptTemplate.from_template("{a} {b} {question}") | FakeListChatModel(responses=["ok"]))
    top = uuid.uuid4()
    chain.invoke("what causes the aurora", config={"callbacks": [handler], "run_id": top})
    records = handler.record_feedback(top, score=1.0, idempotency_key="fb-1")
    assert handler.store.counts()["feedback"] == 2  # both retrievals (on the first's store: a copy of the second)
    assert second.store.counts()["feedback"] == 1
    assert first.learner.n_learned == second.learner.n_learned == 1
    assert {r.event_id for r in records} == {e["id"] for e in handler.retrievals(top)}
    handler.record_feedback(top, score=1.0, idempotency_key="fb-1")  # a retry is learned by neither again
    assert first.learner.n_learned == second.learner.n_learned == 1


def test_the_handler_reads_the_follow_up_settings_given_or_the_ensembles_as_they_are_now() -> None:
    from rlfb.implicit import ImplicitSignals

    def restated_twice(handler: FeedbackCallbackHandler, retriever: Any, session: str) -> list[str]:
        config = {"callbacks": [handler], "metadata": {"session_id": session}}
        first = uuid.uuid4()
        retriever.invoke("what causes the aurora borealis", config=config, run_id=first)
        retriever.invoke("what really causes the aurora borealis", config=config)
        return [f["signal"] for f in handler.store.feedback(str(first))]

    plain = BM25Retriever.from_documents([Document(page_content=t, id=i) for i, t in zip(IDS, TEXTS, strict=True)],
                                         k=2)
    given = FeedbackCallbackHandler(store=FeedbackStore(), implicit=ImplicitSignals(followup_window=1e-6))
    assert restated_twice(given, plain, "a") == []  # the window given: no follow-up within a microsecond
    from rlfb import FeedbackEnsemble

    ours = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=FeedbackStore())
    handler = FeedbackCallbackHandler.from_ensemble(ours)
    assert restated_twice(handler, plain, "b") == ["reformulation"]
    ours.implicit = ImplicitSignals(followup_window=1e-6)  # read at the next follow-up, not kept
    assert restated_twice(handler, plain, "c") == []


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


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
