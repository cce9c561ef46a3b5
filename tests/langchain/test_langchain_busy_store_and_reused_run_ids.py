"""Four gaps of the LangChain adapter an audit left (README, "What is not there yet", 2026-12-06):

1. metadata keys of the user's own that rlfb's ``METADATA_KEYS`` replace are warned of, as LlamaIndex does;
2. a locked store waits ``busy_timeout`` once, not again for the handler's own mark, and the handler prints
   no "Error in FeedbackCallbackHandler" line;
3. a chain run id the caller gives again is refused (an error with ``raise_error``, else a warning), and
   feedback on it rates the first run's question only;
4. an idempotency conflict on a run of several retrievals names the key as the caller gave it.
"""

from __future__ import annotations

import logging
import re
import uuid
import warnings
from collections.abc import Sequence
from typing import Any

import pytest
from langchain_community.retrievers import BM25Retriever
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableConfig, RunnableLambda, RunnablePassthrough

from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever, retrievers
from rlfb import DuplicateEventError, FeedbackEnsemble, IdempotencyConflictError, StoreBusyError
from rlfb.runs import log_external, record_run_feedback
from rlfb.store import FeedbackStore, connection

from _lc_corpus import IDS, TEXTS
from _store_lock import locked

PROMPT = ChatPromptTemplate.from_template("Answer from the context.\n{context}\nQuestion: {question}")
HANDLER_ERROR = "Error in FeedbackCallbackHandler"


def rag_chain(retriever: Any) -> Any:
    """The retrieval two runs below the top-level run, as in a RAG chain."""
    fmt: RunnableLambda[list[Document], str] = RunnableLambda(lambda docs: "\n".join(d.page_content for d in docs))
    llm = FakeListChatModel(responses=["an answer"])
    return {"context": retriever | fmt, "question": RunnablePassthrough()} | PROMPT | llm | StrOutputParser()


def flat_chain(retriever: Any) -> Any:
    """The retrieval right under the top-level run: its event's parent is the run id given."""
    return RunnablePassthrough() | retriever


def bm25_ensemble(store: Any) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="gradient", store=store)


def rlfb_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "rlfb" in str(w.message) or "replaced" in str(w.message)]


# ---------------------------------------------------------------- 1. the user's own metadata keys
@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-per-set-of-keys memory emptied, so each test sees its first warning."""
    monkeypatch.setattr(retrievers, "_warned", set(), raising=False)


def test_own_rank_and_score_keys_are_replaced_with_a_warning_once_per_set_of_keys(fresh_warnings: None) -> None:
    metadatas = [{"rank": "gold", "score": 0.9, "source": f"s{i}"} for i in range(len(TEXTS))]
    metadatas[0] = {"rank": "silver", "source": "s0"}  # another set of keys: a warning of its own
    retriever = FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, metadatas=metadatas, retrievers=("bm25",),
                                                     k=len(TEXTS), explore=False)
    with pytest.warns(UserWarning) as caught:
        docs = retriever.invoke("magma volcano tides aurora")
    said = rlfb_warnings(list(caught))
    assert len(said) == 2, said
    assert any(re.search(r"metadata keys \['score', 'rank'\] of document '[^']+' \(and of any document that has "
                         r"them\) are replaced by rlfb's own", s) for s in said), said
    assert any("metadata keys ['rank'] of document 'doc0'" in s for s in said), said
    # rlfb's keys win, as before (METADATA_KEYS override); the user's other keys stay
    assert [d.metadata["rank"] for d in docs] == list(range(1, len(docs) + 1))
    assert all(isinstance(d.metadata["score"], float) and d.metadata["source"] for d in docs)
    with warnings.catch_warnings(record=True) as again:  # once per set of keys in the process
        warnings.simplefilter("always")
        retriever.invoke("magma volcano tides aurora")
    assert rlfb_warnings(again) == []


def test_keys_rlfb_wrote_on_an_earlier_pass_are_not_warned_of(fresh_warnings: None) -> None:
    # a Document an rlfb retriever returned, fused again (an rlfb retriever as a member) or indexed again, holds
    # every one of METADATA_KEYS: they are rlfb's, replaced by this pass's values, and a warning would be noise.
    # Nor is a chunk_id that names the chunk (document_to_chunk reads the id from it).
    inner = FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), k=3, explore=False)
    outer = FeedbackEnsembleRetriever.from_retrievers({"inner": inner}, k=3, explore=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        docs = outer.invoke("molten magma volcano")
        again = FeedbackEnsembleRetriever.from_documents(docs, retrievers=("bm25",), k=2, explore=False)
        reranked = again.invoke("molten magma volcano")
        named = FeedbackEnsembleRetriever.from_documents(
            [Document(page_content=t, metadata={"chunk_id": i}) for t, i in zip(TEXTS, IDS, strict=True)],
            retrievers=("bm25",), k=2, explore=False)
        named.invoke("ocean tides")
    assert rlfb_warnings(caught) == []
    assert [d.metadata["rank"] for d in docs] == [1, 2, 3] and reranked[0].metadata["rank"] == 1
    assert docs[0].metadata["proposed_by"] == ["inner"]  # this pass's, not the inner retriever's


# ---------------------------------------------------------------- 2. a locked store
@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per write that waited the store's whole busy_timeout (each ends in connection.busy_error)."""
    seen: list[str] = []
    made = connection.busy_error

    def counting(path: str, busy_timeout: float, exc: Any) -> StoreBusyError:
        seen.append(path)
        return made(path, busy_timeout, exc)

    monkeypatch.setattr(connection, "busy_error", counting)
    return seen


@pytest.mark.parametrize("how", ["invoke", "flat chain"])
def test_a_locked_store_waits_once_and_the_handler_prints_no_error(
    tmp_path: Any, waits: list[str], caplog: pytest.LogCaptureFixture, how: str
) -> None:
    # the handler's on_retriever_error (and each enclosing chain's on_chain_error) marked the run failed in the
    # locked store: a second (third) full busy_timeout, and LangChain printed "Error in FeedbackCallbackHandler"
    path = tmp_path / "fb.db"
    ens = bm25_ensemble(FeedbackStore(path, busy_timeout=0.05))
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    runnable = retriever if how == "invoke" else flat_chain(retriever)
    with caplog.at_level(logging.WARNING), locked(path), pytest.raises(StoreBusyError):
        runnable.invoke("molten magma", config={"callbacks": [handler]})  # the retrieval's own error
    assert len(waits) == 1, waits
    assert not [r for r in caplog.records if HANDLER_ERROR in r.getMessage()]
    assert handler._parents == {} and handler._retrievals == {}  # the open runs are forgotten all the same
    # the store free again: the handler and the retriever work on
    run_id = uuid.uuid4()
    retriever.invoke("ocean tides", config={"callbacks": [handler]}, run_id=run_id)
    assert len(handler.record_feedback(run_id, score=1.0)) == 1


def test_a_locked_store_under_a_nested_chain_prints_no_handler_error(
    tmp_path: Any, waits: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "fb.db"
    ens = bm25_ensemble(FeedbackStore(path, busy_timeout=0.05))
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    with caplog.at_level(logging.WARNING), locked(path), pytest.raises(StoreBusyError):
        rag_chain(FeedbackEnsembleRetriever.from_ensemble(ens, k=2)).invoke(
            "molten magma", config={"callbacks": [handler]})
    # the links above the retrieval, written before it runs (its follow-up check reads them), and the
    # retrieval's own log; not the handler's marks of the failed runs (one per run of the chain, before)
    assert len(waits) == 2, waits
    assert not [r for r in caplog.records if HANDLER_ERROR in r.getMessage()]
    assert handler._parents == {} and handler._retrievals == {}


def fail_second_retrieval_locked(path: Any, **metadata: Any) -> tuple[FeedbackEnsemble, Any, uuid.UUID]:
    """A chain of two retrievals whose second finds the store locked (another process writing): the ensemble,
    its handler and the chain's run id."""
    ens = bm25_ensemble(FeedbackStore(path, busy_timeout=0.05))
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    handler = FeedbackCallbackHandler.from_ensemble(ens)

    def ask_again_locked(docs: Any, config: Any) -> Any:
        with locked(path):
            return retriever.invoke("ocean tides", config=config)

    top = uuid.uuid4()
    with pytest.raises(StoreBusyError):
        (retriever | RunnableLambda(ask_again_locked)).invoke(
            "molten magma", config={"callbacks": [handler], "run_id": top, "metadata": metadata})
    return ens, handler, top


def test_a_run_that_failed_on_a_locked_store_is_marked_before_the_handler_next_logs(tmp_path: Any) -> None:
    # the failed marks not written while the store was locked are kept, and written before the handler next
    # logs or takes feedback: the chain that failed answered nobody, so a follow-up does not judge its question
    session = {"session_id": "s1"}
    ens, handler, top = fail_second_retrieval_locked(tmp_path / "fb.db", **session)
    (first,) = ens.store.db.query("SELECT id FROM events")
    assert handler._parents == {} and handler._retrievals == {}
    plain = BM25Retriever.from_texts(TEXTS, ids=IDS, k=2)
    plain.invoke("molten magma volcano", config={"callbacks": [handler], "metadata": session})  # a restatement
    assert ens.store.run_failed(str(top))
    assert ens.store.feedback(first["id"]) == []  # no reformulation of the failed chain's question
    assert [e["id"] for e in handler.retrievals(top)] == [first["id"]]


# ---------------------------------------------------------------- 3. a chain run id given again
def make_retriever(kind: str, store: FeedbackStore) -> tuple[Any, Any]:
    if kind == "rlfb":
        ens = bm25_ensemble(store)
        return FeedbackEnsembleRetriever.from_ensemble(ens, k=2), FeedbackCallbackHandler.from_ensemble(ens)
    return BM25Retriever.from_texts(TEXTS, ids=IDS, k=2), FeedbackCallbackHandler(store)


@pytest.mark.parametrize("kind", ["rlfb", "plain"])
@pytest.mark.parametrize("chain", [flat_chain, rag_chain], ids=["flat", "nested"])
def test_a_chain_run_id_given_again_is_warned_and_feedback_on_it_rates_the_first_question(
    tmp_path: Any, kind: str, chain: Any
) -> None:
    path = tmp_path / "fb.db"
    retriever, handler = make_retriever(kind, FeedbackStore(path))
    top = uuid.uuid4()
    chain(retriever).invoke("molten magma", config={"callbacks": [handler], "run_id": top})
    with pytest.warns(UserWarning, match=rf"run id '{top}' was given to an earlier run.*feedback on '{top}' rates "
                                         r"the earlier run's retrievals only"):
        chain(retriever).invoke("ocean tides", config={"callbacks": [handler], "run_id": top})
    assert [e["query"] for e in handler.retrievals(top)] == ["molten magma"]
    (record,) = handler.record_feedback(top, score=1.0)
    assert handler.store.event(record.event_id)["query"] == "molten magma"
    # in another process too (the refusal is in the file), and the second question is rated by its own run id
    other = FeedbackCallbackHandler(FeedbackStore(path))
    assert [e["query"] for e in other.retrievals(top)] == ["molten magma"]
    (second,) = [r["id"] for r in other.store.db.query("SELECT id FROM events WHERE query = 'ocean tides'")]
    assert [r.event_id for r in handler.record_feedback(second, score=0.0)] == [second]
    assert handler._refused == {} and handler._parents == {}  # nothing left open


def test_with_raise_error_a_chain_run_id_given_again_is_refused_before_it_runs(tmp_path: Any) -> None:
    retriever, handler = make_retriever("rlfb", FeedbackStore(tmp_path / "fb.db"))
    handler.raise_error = True  # LangChain's switch: the handler's errors reach the caller
    top = uuid.uuid4()
    flat_chain(retriever).invoke("molten magma", config={"callbacks": [handler], "run_id": top})
    with pytest.raises(DuplicateEventError, match=rf"run id '{top}' was given to an earlier run"):
        flat_chain(retriever).invoke("ocean tides", config={"callbacks": [handler], "run_id": top})
    assert handler.store.counts()["events"] == 1  # the second question was not asked
    assert [e["query"] for e in handler.retrievals(top)] == ["molten magma"]
    assert handler._parents == {} and handler._retrievals == {}
    # a new run id is taken, and a fresh run id never warns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat_chain(retriever).invoke("ocean tides", config={"callbacks": [handler], "run_id": uuid.uuid4()})
        flat_chain(retriever).invoke("ocean tides", config={"callbacks": [handler]})
    assert handler.store.counts()["events"] == 3


# ---------------------------------------------------------------- 4. an idempotency conflict on a fanned-out run
CONFLICT_AS_GIVEN = r"^idempotency key 'k1' \(stored for retrieval '([^']+)' as 'k1:\1'\) already recorded 'score'"


def test_an_idempotency_conflict_on_a_run_of_two_retrievals_names_the_key_as_given() -> None:
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    bm25 = BM25Retriever.from_texts(TEXTS, ids=IDS, k=2)
    other = BM25Retriever.from_texts(["an unrelated note about tides"], ids=["note"], k=1)
    top = uuid.uuid4()
    ({"a": bm25, "b": other} | RunnableLambda(lambda d: d)).invoke("tides",
                                                                    config={"callbacks": [handler], "run_id": top})
    assert len(handler.record_feedback(top, score=1.0, idempotency_key="k1")) == 2
    assert all(r.duplicate for r in handler.record_feedback(top, score=1.0, idempotency_key="k1"))  # a retry
    with pytest.raises(IdempotencyConflictError, match=CONFLICT_AS_GIVEN) as err:
        handler.record_feedback(top, score=0.0, idempotency_key="k1")
    assert "feedback item" not in str(err.value)  # one feedback was given, not a batch
    assert handler.store.counts()["feedback"] == 2


def test_an_idempotency_conflict_through_the_retriever_and_the_core_names_the_key_as_given() -> None:
    # the retriever's feedback on its run id, and rlfb.runs.record_run_feedback, which the LlamaIndex handler's
    # record_feedback calls with a query id the same way
    ens = bm25_ensemble(FeedbackStore())
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    run_id = uuid.uuid4()
    retriever.invoke("molten magma", run_id=run_id)
    retriever.feedback(run_id, score=1.0, idempotency_key="k1")
    with pytest.raises(IdempotencyConflictError, match=CONFLICT_AS_GIVEN):
        retriever.feedback(run_id, score=0.0, idempotency_key="k1")
    store = FeedbackStore()
    for eid in ("e1", "e2"):
        log_external(store, "tides", [("c1", 1.0)], source="bm25", event_id=eid, parent_id="query-1")
    record_run_feedback(store, "query-1", "thumbs_up", idempotency_key="k1")
    with pytest.raises(IdempotencyConflictError, match=r"^idempotency key 'k1' \(stored for retrieval 'e1' as "
                                                       r"'k1:e1'\) already recorded"):
        record_run_feedback(store, "query-1", "thumbs_down", idempotency_key="k1")
    # a key the caller gave in its stored form is named as given, as before
    with pytest.raises(IdempotencyConflictError, match=r"^idempotency key 'k1:e1' already recorded"):
        record_run_feedback(store, "e1", "thumbs_down", idempotency_key="k1:e1")


# ---------------------------------------------------------------- found by the review of the fixes above
def test_a_handler_given_to_langchain_twice_is_one_run_not_a_run_id_given_again(tmp_path: Any) -> None:
    # with_config(callbacks=[h]) and invoke(config={"callbacks": [h]}): LangChain calls h twice at each start
    handler = FeedbackCallbackHandler(FeedbackStore(tmp_path / "fb.db"))
    chain = flat_chain(BM25Retriever.from_texts(TEXTS, ids=IDS, k=2)).with_config(callbacks=[handler])
    run_id = uuid.uuid4()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chain.invoke("molten magma", config={"callbacks": [handler], "run_id": run_id})
    assert not [w for w in caught if "run id" in str(w.message)]
    assert len(handler.record_feedback(run_id, score=1.0)) == 1
    handler.raise_error = True
    chain.invoke("ocean tides", config={"callbacks": [handler]})  # a DuplicateEventError at every invoke, before


def test_a_retry_of_a_failed_run_under_its_run_id_is_taken_and_rated_alone(tmp_path: Any) -> None:
    # an app that handed the run id to its UI retries a chain whose model timed out, under the same id: it was
    # refused as an id given again, and feedback on it rated the failed attempt's retrieval, which answered nobody
    calls: list[int] = []

    def flaky_model(docs: Any) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("the model timed out")
        return "an answer"

    for raise_error in (False, True):
        calls.clear()
        store = FeedbackStore(tmp_path / f"fb{raise_error}.db")
        handler = FeedbackCallbackHandler(store)
        handler.raise_error = raise_error
        chain = flat_chain(BM25Retriever.from_texts(TEXTS, ids=IDS, k=2)) | RunnableLambda(flaky_model)
        run_id = uuid.uuid4()
        with pytest.raises(TimeoutError):
            chain.invoke("molten magma", config={"callbacks": [handler], "run_id": run_id})
        (failed,) = [e["id"] for e in store.db.query("SELECT id FROM events")]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert chain.invoke("molten magma", config={"callbacks": [handler], "run_id": run_id}) == "an answer"
        assert not [w for w in caught if "run id" in str(w.message)]
        rated = [r.event_id for r in handler.record_feedback(run_id, score=1.0)]
        assert len(rated) == 1 and rated[0] != failed and store.feedback(failed) == []


def test_feedback_right_after_a_locked_failure_writes_the_kept_failed_marks(tmp_path: Any) -> None:
    # the failed marks kept while the store was locked are written when feedback is given, with no retrieval
    # between: a follow-up of the session then passes the failed chain by
    ens, handler, top = fail_second_retrieval_locked(tmp_path / "fb.db")
    assert not ens.store.run_failed(str(top))  # kept in memory: the store was locked
    (first,) = [e["id"] for e in ens.store.db.query("SELECT id FROM events")]
    assert [r.event_id for r in handler.record_feedback(first, score=1.0)] == [first]
    assert ens.store.run_failed(str(top))


def test_links_the_store_was_locked_for_at_the_start_are_written_at_the_end(tmp_path: Any) -> None:
    # a plain retriever nested in a chain: the handler links it to the chain when it starts; with the store
    # locked then, the links are kept and written when the retrieval ends, so feedback on the chain finds it
    path = tmp_path / "fb.db"
    store = FeedbackStore(path, busy_timeout=0.05)
    handler = FeedbackCallbackHandler(store)
    plain = BM25Retriever.from_texts(TEXTS, ids=IDS, k=2)
    state: dict[str, Any] = {}

    class LockedAtStart(BM25Retriever):
        def _get_relevant_documents(self, query: str, **kwargs: Any) -> Any:
            state["lock"].__exit__(None, None, None)  # the other writer is done before this retrieval ends
            return plain._get_relevant_documents(query, run_manager=CallbackManagerForRetrieverRun.get_noop_manager())

    inner = LockedAtStart.from_texts(TEXTS, ids=IDS, k=2)
    real = handler.on_retriever_start

    def start_locked(*args: Any, **kwargs: Any) -> Any:
        state["lock"] = locked(path)
        state["lock"].__enter__()
        return real(*args, **kwargs)

    handler.on_retriever_start = start_locked  # type: ignore[method-assign]
    top = uuid.uuid4()
    rag_chain(inner).invoke("molten magma", config={"callbacks": [handler], "run_id": top})
    assert len(handler.record_feedback(top, score=1.0)) == 1


# ---------------------------------------------------------------- found by an audit of async and concurrent use
@pytest.mark.parametrize("raise_error", [False, True])
def test_two_runs_at_once_under_one_run_id_are_told_apart_from_one_start_reported_twice(
    tmp_path: Any, raise_error: bool
) -> None:
    # asyncio.gather of two ainvokes with one run id: the second was taken silently (a run still open under the
    # id looked like the handler given twice), and feedback on the id rated both questions
    import asyncio

    ens = bm25_ensemble(FeedbackStore(tmp_path / "fb.db"))
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    handler.raise_error = raise_error
    chain = flat_chain(FeedbackEnsembleRetriever.from_ensemble(ens, k=2))
    config: RunnableConfig = {"callbacks": [handler], "run_id": uuid.uuid4()}

    async def both() -> Sequence[Any]:
        return await asyncio.gather(chain.ainvoke("molten magma", config=config),
                                    chain.ainvoke("ocean tides", config=config), return_exceptions=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = asyncio.run(both())
    said = [str(w.message) for w in caught if "still running" in str(w.message)]
    asked = {e["query"] for e in handler.retrievals(config["run_id"])}
    if raise_error:
        assert sorted(type(r).__name__ for r in results) == ["DuplicateEventError", "list"] and not said
        assert len(asked) == 1  # the refused run never ran
    else:
        assert len(said) == 1 and "rates both runs' retrievals" in said[0]
        assert asked == {"molten magma", "ocean tides"}
    # the handler given twice, in an async run too: one start reported twice, not refused
    twice = flat_chain(FeedbackEnsembleRetriever.from_ensemble(ens, k=2)).with_config(callbacks=[handler])
    run_id = uuid.uuid4()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(twice.ainvoke("glaciers", config={"callbacks": [handler], "run_id": run_id}))
    assert not [w for w in caught if "run id" in str(w.message)]
    assert [e["query"] for e in handler.retrievals(run_id)] == ["glaciers"]


def test_a_retry_after_a_locked_store_failed_the_run_is_taken_before_its_mark_is_written(tmp_path: Any) -> None:
    # the failed attempt's mark was kept in memory (its store was locked), so the retry under the same id looked
    # like a run id given again: warned of (refused with raise_error), and feedback rated the failed attempt
    from langchain_core.runnables import RunnableParallel

    free = bm25_ensemble(FeedbackStore(tmp_path / "a.db"))
    busy_path = tmp_path / "b.db"
    busy = bm25_ensemble(FeedbackStore(busy_path, busy_timeout=0.05))
    handler = FeedbackCallbackHandler.from_ensemble(free)
    handler.raise_error = True
    chain = RunnableParallel(a=FeedbackEnsembleRetriever.from_ensemble(free, k=2),
                             b=FeedbackEnsembleRetriever.from_ensemble(busy, k=2))
    run_id = uuid.uuid4()
    config: RunnableConfig = {"callbacks": [handler], "run_id": run_id}
    with locked(busy_path), pytest.raises(StoreBusyError):
        chain.invoke("molten magma", config=config)
    (failed,) = [e["id"] for e in free.store.db.query("SELECT id FROM events")]
    out = chain.invoke("molten magma", config=config)  # a DuplicateEventError before
    rated = {r.event_id for r in handler.record_feedback(run_id, score=1.0)}
    assert failed not in rated and out["a"][0].metadata["event_id"] in rated


def test_a_plain_retrieval_the_locked_store_could_not_log_is_kept_and_logged_later(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # its log failed once the store stayed locked past busy_timeout: LangChain printed the handler's error and the
    # retrieval was lost (feedback on its run found nothing)
    path = tmp_path / "fb.db"
    handler = FeedbackCallbackHandler(FeedbackStore(path, busy_timeout=0.05))
    chain = flat_chain(BM25Retriever.from_texts(TEXTS, ids=IDS, k=2))
    first, second = uuid.uuid4(), uuid.uuid4()
    with caplog.at_level(logging.WARNING), locked(path), pytest.warns(RuntimeWarning, match="could not log"):
        chain.invoke("molten magma", config={"callbacks": [handler], "run_id": first})
        # still locked: writing the first one's kept log fails again, and this one is kept too, not lost
        chain.invoke("ocean tides", config={"callbacks": [handler], "run_id": second})
    assert not [r for r in caplog.records if HANDLER_ERROR in r.getMessage()]
    for run_id, question in ((first, "molten magma"), (second, "ocean tides")):
        (record,) = handler.record_feedback(run_id, score=1.0)  # logged first, then rated
        assert handler.store.event(record.event_id)["query"] == question


def test_the_end_of_a_run_refused_as_running_at_once_leaves_the_first_run_open(tmp_path: Any) -> None:
    # its end closed the run still open under the id, and its failure marked that id failed
    import threading

    ens = bm25_ensemble(FeedbackStore(tmp_path / "fb.db"))
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    second_done = threading.Event()

    def wait_for_the_second(docs: Any) -> Any:
        assert second_done.wait(timeout=60)
        return docs

    def fail(docs: Any) -> Any:
        raise RuntimeError("the second run fails")

    run_id = uuid.uuid4()
    config: RunnableConfig = {"callbacks": [handler], "run_id": run_id}
    first = threading.Thread(target=lambda: (retriever | RunnableLambda(wait_for_the_second)).invoke(
        "molten magma", config=config))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first.start()
        while str(run_id) not in handler._parents:  # the first run has started (checked and opened)
            first.join(timeout=0.01)
        with pytest.raises(RuntimeError):
            (retriever | RunnableLambda(fail)).invoke("ocean tides", config=config)
        assert str(run_id) in handler._parents and not ens.store.run_failed(str(run_id))
        second_done.set()
        first.join()
    assert handler._parents == {} and handler._started_in == {} and handler._doubled == {}
    assert not ens.store.run_failed(str(run_id))
