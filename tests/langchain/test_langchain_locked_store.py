"""The LangChain handler's writes while its store is locked past ``busy_timeout``: a retrieval's links, its
follow-up check and its log kept together, in order behind the writes kept before them, stamped with the
retrieval's time by the store's clock; kept again when written inside an app's block that rolls back; dropped
with one warning when the store is closed. (The writes around the log raised before the log was kept, so the
retrieval was lost; a store with a clock of its own refused every log as from the future.)"""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_community.retrievers import BM25Retriever
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableLambda,
    RunnableParallel,
    RunnablePassthrough,
)

from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever
from rlfb import FeedbackEnsemble
from rlfb.errors import DuplicateEventError
from rlfb.store import FeedbackStore

from _lc_corpus import IDS, TEXTS


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


def _bm25() -> BM25Retriever:
    return BM25Retriever.from_texts(TEXTS, ids=IDS, k=2)


class _Trim(BaseRetriever):
    """A wrapper retriever that returns the first of its member's documents (a compressor's cut); ``on_trim``, if
    given, is called as it trims."""

    inner: Any
    on_trim: Any = None

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        docs = self.inner.invoke(query, config={"callbacks": run_manager.get_child()})
        if self.on_trim is not None:
            self.on_trim()
        return list(docs[:1])


def _learner_elsewhere(tmp_path: Path, learner_timeout: float | None = None,
                       ) -> tuple[FeedbackStore, FeedbackStore, FeedbackEnsemble, FeedbackCallbackHandler]:
    """The handler's store (``h.db``, ``busy_timeout`` 0.2 s), a gradient learner over BM25 logging to a store of
    its own (``learner.db``), and a handler on the first that teaches the learner."""
    base = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",))
    own = FeedbackStore(tmp_path / "h.db", busy_timeout=0.2)
    theirs = (FeedbackStore(tmp_path / "learner.db") if learner_timeout is None
              else FeedbackStore(tmp_path / "learner.db", busy_timeout=learner_timeout))
    ensemble = FeedbackEnsemble(base.retrievers, base.chunks, store=theirs, policy="gradient")
    return own, theirs, ensemble, FeedbackCallbackHandler(own, ensemble=ensemble)


def _trim(ensemble: FeedbackEnsemble, **kwargs: Any) -> _Trim:
    """:class:`_Trim` over an rlfb retriever (k=3) of ``ensemble``."""
    return _Trim(inner=FeedbackEnsembleRetriever.from_ensemble(ensemble, k=3), **kwargs)


def _fails_first(message: str, before: Callable[[], object] = lambda: None) -> Runnable[Any, Any]:
    """A step that raises ``ValueError(message)`` on its first call (after ``before()``), and passes its input on
    at every later one: a run's first attempt that fails after retrieving, and its retry."""
    calls = itertools.count()

    def step(docs: Any) -> Any:
        if next(calls) == 0:
            before()
            raise ValueError(message)
        return docs

    return RunnableLambda(step)


def _queries(store: FeedbackStore) -> list[str]:
    return [q for (q,) in store.db.execute("SELECT query FROM events ORDER BY rowid")]


@pytest.mark.parametrize("lock", [False, True])
def test_a_retrieval_whose_links_wait_for_a_locked_store_is_kept_with_them(tmp_path: Path, lock: bool) -> None:
    # the links the store was locked for at the retrieval's start were written at its end with no try: a
    # locked store raised there, before the log was kept, and feedback on the chain found nothing
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    chain: Runnable[Any, Any] = RunnablePassthrough() | RunnableParallel(docs=_bm25())
    top = uuid.uuid4()
    with _locked(tmp_path / "f.db") if lock else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "it is kept"
        chain.invoke("molten magma", config={"callbacks": [handler], "run_id": top})
    [record] = handler.record_feedback(top, score=1.0)
    assert store.event(record.event_id)["query"] == "molten magma" and not handler._unlogged


@pytest.mark.parametrize("lock", [False, True])
def test_a_follow_up_made_while_locked_is_observed_and_logged(tmp_path: Path, lock: bool) -> None:
    # the follow-up check's reformulation was written before the log was kept: a locked store raised there,
    # and both the restated question and its reformulation of the first were lost
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    retriever = _bm25()
    first, second = uuid.uuid4(), uuid.uuid4()
    config: RunnableConfig = {"callbacks": [handler], "metadata": {"session_id": "s1"}}
    retriever.invoke("where does molten magma come from", config=config, run_id=first)
    with _locked(tmp_path / "f.db") if lock else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        retriever.invoke("where does the molten magma come from?", config=config, run_id=second)
    handler.record_feedback(second, score=1.0)
    signals = store.db.execute("SELECT event_id, signal FROM feedback ORDER BY id").fetchall()
    assert signals == [(str(first), "reformulation"), (str(second), "score")]


def test_a_retrieval_after_kept_ones_goes_behind_them(tmp_path: Path) -> None:
    # with the kept log still waiting (the store locked through the next retrieval's first try), the next
    # retrieval's writes go behind it, not past it: its follow-up then judges the kept retrieval
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    retriever = _bm25()
    first, second = uuid.uuid4(), uuid.uuid4()
    config: RunnableConfig = {"callbacks": [handler], "metadata": {"session_id": "s1"}}
    with _locked(tmp_path / "f.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        retriever.invoke("where does molten magma come from", config=config, run_id=first)
        retriever.invoke("where does the molten magma come from?", config=config, run_id=second)
        assert list(handler._unlogged) == [str(first), str(second)]
    handler.record_feedback(second, score=1.0)
    assert _queries(store) == ["where does molten magma come from", "where does the molten magma come from?"]
    assert store.db.execute("SELECT signal FROM feedback ORDER BY id").fetchall() == [("reformulation",),
                                                                                     ("score",)]


def test_a_store_with_a_clock_of_its_own_logs_retrievals_by_it(tmp_path: Path) -> None:
    # the log was stamped with time.time(): a store whose clock is behind it refused every log as from the
    # future, only printed by LangChain, with no lock at all
    store = FeedbackStore(tmp_path / "f.db", clock=lambda: 1_000_000.0)
    handler = FeedbackCallbackHandler(store)
    run = uuid.uuid4()
    _bm25().invoke("molten magma", config={"callbacks": [handler]}, run_id=run)
    assert store.event(str(run))["timestamp"] == 1_000_000.0
    assert handler.record_feedback(run, score=1.0)[0].delay == 0.0


def test_a_kept_log_written_inside_a_block_that_rolls_back_is_kept_again(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    chain: Runnable[Any, Any] = RunnablePassthrough() | _bm25()
    first = uuid.uuid4()
    with _locked(tmp_path / "f.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        chain.invoke("molten magma", config={"callbacks": [handler], "run_id": first})
    with pytest.raises(ValueError), store.exclusive():
        chain.invoke("ocean tides", config={"callbacks": [handler]})
        assert not handler._unlogged
        raise ValueError
    assert len(handler._unlogged) == 1
    [record] = handler.record_feedback(first, score=1.0)
    assert store.event(record.event_id)["query"] == "molten magma" and _queries(store) == ["molten magma"]


def test_what_was_kept_for_a_store_closed_since_is_dropped_with_one_warning(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    chain: Runnable[Any, Any] = RunnablePassthrough() | _bm25()
    with _locked(tmp_path / "f.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        chain.invoke("molten magma", config={"callbacks": [handler]})
    store.close()
    with pytest.warns(RuntimeWarning, match="1 retrieval log.*lost: the store was closed") as caught:
        for _ in range(3):
            chain.invoke("ocean tides", config={"callbacks": [handler]})
    assert sum("lost: the store was closed" in str(w.message) for w in caught) == 1
    assert not handler._unlogged
    assert caught[0].filename == __file__  # the app's line


def test_a_kept_write_for_a_learners_store_closed_since_loses_that_write_alone(tmp_path: Path) -> None:
    # a kept unused mark on the learner's own file, closed since, dropped every kept log of the handler's file
    # (still open), with a warning that said the store was closed
    holders: list[sqlite3.Connection] = []

    def lock_the_learners_file() -> None:  # as the wrapper trims
        holder = sqlite3.connect(tmp_path / "learner.db", isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        holders.append(holder)

    own, theirs, ensemble, handler = _learner_elsewhere(tmp_path, learner_timeout=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _trim(ensemble, on_trim=lock_the_learners_file).invoke(
            "What causes the aurora", config={"callbacks": [handler]})
    holders.pop().execute("ROLLBACK")
    assert [len(entry["before"]) for entry in handler._unlogged.values()] == [1]  # the unused mark, kept
    theirs.close()
    with pytest.warns(RuntimeWarning, match="for a learner's feedback store is lost"):
        _bm25().invoke("ocean tides", config={"callbacks": [handler]})
    assert _queries(own)[-2:] == ["What causes the aurora", "ocean tides"] and not handler._unlogged


@pytest.mark.parametrize("lock", [False, True])
def test_a_wrapper_over_a_decision_whose_copy_is_kept_still_teaches_its_learner(tmp_path: Path, lock: bool) -> None:
    # the wrapper's end read the store for the decisions below it, and the copy of the learner's decision waited
    # for the locked store: the result was logged as a retrieval of its own, and feedback taught the learner nothing
    own, theirs, ensemble, handler = _learner_elsewhere(tmp_path)
    run = uuid.uuid4()
    with _locked(tmp_path / "h.db") if lock else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _trim(ensemble).invoke(
            "What causes the aurora", config={"callbacks": [handler]}, run_id=run)
    rated = sorted(r.event_id.endswith("/result") for r in handler.record_feedback(run, score=1.0))
    assert rated == [False, False, True]  # the decision's copy, the learner's own row, the wrapper's result
    assert theirs.counts()["feedback"] == 1
    cut = [u for (u,) in own.db.execute("SELECT unused_ids FROM events WHERE id NOT LIKE '%/result'")]
    assert cut == ['["doc2","doc3"]']


@pytest.mark.parametrize("chained", [False, True], ids=["flat", "nested"])
def test_a_chain_run_id_given_again_while_its_first_run_is_kept_is_told(tmp_path: Path, chained: bool) -> None:
    # the check read the store, which the first run's kept log was not in yet: the second run was taken for a new
    # one, and feedback on the id rated both questions
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    inner: Runnable[Any, Any] = RunnablePassthrough() | _bm25()
    chain: Runnable[Any, Any] = RunnablePassthrough() | RunnableParallel(docs=inner) if chained else inner
    top = uuid.uuid4()
    with _locked(tmp_path / "f.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "it is kept"
        chain.invoke("molten magma", config={"callbacks": [handler], "run_id": top})
        with pytest.warns(UserWarning, match=rf"run id '{top}' was given to an earlier run.*rates the earlier"):
            chain.invoke("ocean tides", config={"callbacks": [handler], "run_id": top})
    [record] = handler.record_feedback(top, score=1.0)
    assert store.event(record.event_id)["query"] == "molten magma"
    assert sorted(_queries(store)) == ["molten magma", "ocean tides"] and not handler._unlogged
    # a new run id under the same lock is not taken for one given again
    with _locked(tmp_path / "f.db"), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        chain.invoke("molten magma", config={"callbacks": [handler], "run_id": uuid.uuid4()})
        chain.invoke("ocean tides", config={"callbacks": [handler], "run_id": uuid.uuid4()})


def test_a_retrievals_own_run_id_given_again_while_its_log_is_kept_is_refused(tmp_path: Path) -> None:
    # kept under its id, the second retrieval's log replaced the first's: the first question was lost, and
    # feedback on the id rated the second
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    handler.raise_error = True  # LangChain's switch: the handler's errors reach the caller
    retriever = _bm25()
    run = uuid.uuid4()
    with _locked(tmp_path / "f.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        retriever.invoke("molten magma", config={"callbacks": [handler]}, run_id=run)
        with pytest.raises(DuplicateEventError, match=rf"event id '{run}' was already logged"):
            retriever.invoke("ocean tides", config={"callbacks": [handler]}, run_id=run)
    [record] = handler.record_feedback(run, score=1.0)
    assert store.event(record.event_id)["query"] == "molten magma" and _queries(store) == ["molten magma"]


def test_a_run_id_whose_kept_retrieval_failed_is_not_given_again(tmp_path: Path) -> None:
    # the kept retrievals counted whatever became of their runs: a fallback's first attempt that retrieved and
    # failed made the next run under the id refused, and feedback on the id found nothing
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    attempt: Runnable[Any, Any] = _bm25() | _fails_first("the first attempt fails after retrieving")
    chain: Runnable[Any, Any] = RunnablePassthrough() | attempt.with_fallbacks([RunnableLambda(lambda _: [])])
    top = uuid.uuid4()
    with _locked(tmp_path / "f.db"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chain.invoke("molten magma", config={"callbacks": [handler], "run_id": top})
        chain.invoke("ocean tides", config={"callbacks": [handler], "run_id": top})
    assert not [w for w in caught if "given to an earlier run" in str(w.message)]
    assert [store.event(r.event_id)["query"] for r in handler.record_feedback(top, score=1.0)] == ["ocean tides"]


def test_a_retry_of_a_failed_run_whose_retrieval_is_kept_is_rated_alone(tmp_path: Path) -> None:
    # the run failed once the store was free again (its mark written), its retrieval's log still kept: the retry
    # under its id was refused as given again, and feedback on the id rated the failed attempt
    path = tmp_path / "f.db"
    store = FeedbackStore(path, busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    # the store is free when the run's failure is marked
    fail_once = _fails_first("boom", before=lambda: holder.execute("ROLLBACK"))
    chain: Runnable[Any, Any] = RunnablePassthrough() | _bm25() | fail_once
    top = uuid.uuid4()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="boom"):
            chain.invoke("molten magma", config={"callbacks": [handler], "run_id": top})
        assert store.run_failed(str(top)) and handler._unlogged  # the mark written, the log kept
        holder.execute("BEGIN IMMEDIATE")
        chain.invoke("molten magma again", config={"callbacks": [handler], "run_id": top})
        holder.execute("ROLLBACK")
    holder.close()
    assert not [w for w in caught if "given to an earlier run" in str(w.message)]
    rated = [store.event(r.event_id)["query"] for r in handler.record_feedback(top, score=1.0)]
    assert rated == ["molten magma again"]


@pytest.mark.parametrize("lock", [False, True])
def test_a_wrapper_run_id_given_again_still_marks_what_it_cut_in_its_decision(tmp_path: Path, lock: bool) -> None:
    # refused while the first result's log was kept, the second wrapper's writes before its log were dropped with
    # it: its decision's cut chunks stayed credited, where an open store marks them before it refuses the log
    own, theirs, ensemble, handler = _learner_elsewhere(tmp_path)
    run = uuid.uuid4()
    # given a third time, the refused writes replaced the second's where they stood, ahead of the third decision's
    # copy: its mark failed on an event not logged yet, and stopped every later write of the handler
    questions = ("What causes the aurora", "ocean tides", "molten magma")
    with _locked(tmp_path / "h.db") if lock else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for question in questions:
            _trim(ensemble).invoke(
                question, config={"callbacks": [handler]}, run_id=run)
    after = uuid.uuid4()
    chain: Runnable[Any, Any] = RunnablePassthrough() | _bm25()
    chain.invoke("ocean tides", config={"callbacks": [handler], "run_id": after})
    assert not handler._unlogged and handler.retrievals(after)
    for question in questions[1:]:
        [(chunks, unused)] = theirs.db.execute("SELECT chunk_ids, unused_ids FROM events WHERE query = ?",
                                               [question])
        assert unused is not None and json.loads(unused) == json.loads(chunks)[1:]


def test_a_retry_whose_failed_mark_is_kept_too_is_rated_alone(tmp_path: Path) -> None:
    # the whole first attempt waited for the store, its failed mark too: the retry's check answered "not given
    # again" and marked nothing, so feedback on the id rated the failed attempt beside the retry
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    chain: Runnable[Any, Any] = RunnablePassthrough() | _bm25() | _fails_first("boom")
    top = uuid.uuid4()
    with _locked(tmp_path / "f.db"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="boom"):
            chain.invoke("molten magma", config={"callbacks": [handler], "run_id": top})
        assert str(top) in handler._unmarked and handler._unlogged
        chain.invoke("molten magma again", config={"callbacks": [handler], "run_id": top})
    assert not [w for w in caught if "given to an earlier run" in str(w.message)]
    rated = [store.event(r.event_id)["query"] for r in handler.record_feedback(top, score=1.0)]
    assert rated == ["molten magma again"]


def test_a_kept_write_the_store_refuses_for_what_it_is_is_dropped_with_a_warning(tmp_path: Path) -> None:
    # kept first and refused at every try (not for a lock: here the store's clock was set back past the log), it
    # stopped every later log and feedback of the handler
    now = [1_000_000.0]
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2, clock=lambda: now[0])
    handler = FeedbackCallbackHandler(store)
    first, second = uuid.uuid4(), uuid.uuid4()
    with _locked(tmp_path / "f.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _bm25().invoke("molten magma", config={"callbacks": [handler]}, run_id=first)
    now[0] -= 3600.0
    with pytest.warns(RuntimeWarning, match="is lost: the store refused it"):
        _bm25().invoke("ocean tides", config={"callbacks": [handler]}, run_id=second)
    assert _queries(store) == ["ocean tides"] and not handler._unlogged
    assert handler.record_feedback(second, score=1.0)


def test_a_retry_whose_first_attempt_is_part_logged_part_kept_marks_both_parts(tmp_path: Path) -> None:
    # the failed attempt's first retrieval was logged, its second kept, and the store locked again at the retry:
    # the children in the store were marked with a second wait, which failed, and were never marked
    path = tmp_path / "f.db"
    store = FeedbackStore(path, busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    attempts: list[int] = []

    def lock_first(question: Any) -> Any:
        if not attempts:
            holder.execute("BEGIN IMMEDIATE")  # locked between the attempt's two retrievals
        return question

    def fail_once(docs: Any) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            holder.execute("ROLLBACK")  # free when the run's failure is marked
            raise ValueError("boom")
        return docs

    chain: Runnable[Any, Any] = (RunnablePassthrough() | _bm25() | RunnableLambda(lambda _: "ocean tides")
                                 | RunnableLambda(lock_first) | _bm25() | RunnableLambda(fail_once))
    top = uuid.uuid4()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="boom"):
            chain.invoke("molten magma", config={"callbacks": [handler], "run_id": top})
        assert store.run_failed(str(top)) and len(handler._unlogged) == 1 and _queries(store) == ["molten magma"]
        holder.execute("BEGIN IMMEDIATE")
        chain.invoke("molten magma", config={"callbacks": [handler], "run_id": top})
        holder.execute("ROLLBACK")
    holder.close()
    assert not [w for w in caught if "given to an earlier run" in str(w.message)]
    rated = [store.event(r.event_id)["query"] for r in handler.record_feedback(top, score=1.0)]
    assert rated == ["molten magma", "ocean tides"]  # the retry's two, not the failed attempt's
    # the four retrievals right under the run, the failed attempt's two marked
    assert sorted(store.run_failed(r) for r in store.run_children(str(top))) == [False, False, True, True]


def test_a_kept_log_on_a_full_disk_stays_kept_until_there_is_room(tmp_path: Path) -> None:
    # a full disk is no refusal of the write itself: the kept log is written once there is room, not dropped
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    first = uuid.uuid4()
    with _locked(tmp_path / "f.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _bm25().invoke("molten magma " * 3000, config={"callbacks": [handler]}, run_id=first)
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _bm25().invoke("ocean tides", config={"callbacks": [handler]})
    assert not [w for w in caught if "is lost" in str(w.message)] and len(handler._unlogged) == 1
    store.db.execute("PRAGMA max_page_count = 1000000")  # room again
    [record] = handler.record_feedback(first, score=1.0)
    assert store.event(record.event_id)["query"].startswith("molten magma") and not handler._unlogged


@pytest.mark.parametrize("locked_from", ["the failure", "the start"])
def test_a_restatement_after_a_failed_run_whose_mark_is_kept_judges_nothing(tmp_path: Path, locked_from: str) -> None:
    # the kept marks were written after the kept logs: the restated question's follow-up check ran before the
    # failed run was marked, and took its retrieval (which answered nobody) for one the user reformulated
    path = tmp_path / "f.db"
    store = FeedbackStore(path, busy_timeout=0.2)
    handler = FeedbackCallbackHandler(store)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    config: RunnableConfig = {"callbacks": [handler], "metadata": {"session_id": "s1"}}

    def fail(docs: Any) -> Any:
        if not holder.in_transaction:
            holder.execute("BEGIN IMMEDIATE")  # locked as the run fails: its mark is kept
        raise ValueError("boom")

    failing = uuid.uuid4()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if locked_from == "the start":
            holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(ValueError, match="boom"):
            (_bm25() | RunnableLambda(fail)).invoke("molten magma volcano", config={**config, "run_id": failing})
        assert handler._unmarked
        _bm25().invoke("molten magma volcano", config=config)
        holder.execute("ROLLBACK")
    holder.close()
    handler.retrievals(failing)  # what was kept, written
    assert store.run_failed(str(failing)) and store.counts()["feedback"] == 0


def test_a_kept_write_for_a_learners_store_deleted_since_loses_that_write_alone(tmp_path: Path) -> None:
    # anything but a closed learner's store raised on: its file deleted, the kept mark stopped every later log
    # and feedback of the handler, whose own store was fine
    import os

    own, theirs, ensemble, handler = _learner_elsewhere(tmp_path)
    with _locked(tmp_path / "h.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _trim(ensemble).invoke(
            "What causes the aurora", config={"callbacks": [handler]})
    for name in os.listdir(tmp_path):
        if name.startswith("learner.db"):
            os.remove(tmp_path / name)
    run = uuid.uuid4()
    with pytest.warns(RuntimeWarning, match="for a learner's feedback store is lost: that store refused it"):
        _bm25().invoke("ocean tides", config={"callbacks": [handler]}, run_id=run)
    assert own.has_event(str(run)) and not handler._unlogged
    assert handler.record_feedback(run, score=1.0)


def test_kept_marks_and_logs_are_written_in_the_order_they_were_kept(tmp_path: Path) -> None:
    # the marks were all written before the logs: a restatement whose retrieval ended before the first run failed
    # was judged as if that run had failed first, where a free store records the reformulation
    signals: dict[bool, list[tuple[str]]] = {}
    for lock in (False, True):
        path = tmp_path / f"{lock}.db"
        store = FeedbackStore(path, busy_timeout=0.2)
        handler = FeedbackCallbackHandler(store)
        config: RunnableConfig = {"callbacks": [handler], "metadata": {"session_id": "s1"}}

        def restated_then_failed(docs: Any, base: RunnableConfig = config) -> Any:
            _bm25().invoke("molten magma volcano", config={**base, "run_id": uuid.uuid4()})  # another request
            raise ValueError("the first run fails after the restatement ended")

        with _locked(path) if lock else contextlib.nullcontext(), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with pytest.raises(ValueError):
                (_bm25() | RunnableLambda(restated_then_failed)).invoke("molten magma volcano", config=config)
            assert bool(handler._unlogged and handler._unmarked) == lock
        handler.retrievals("anything")  # what was kept, written
        signals[lock] = store.db.execute("SELECT signal FROM feedback").fetchall()
    assert signals[True] == signals[False] == [("reformulation",)]


def test_a_kept_write_of_a_wrapped_store_is_the_handlers_own(tmp_path: Path) -> None:
    # a store that hands every call on to a FeedbackStore (anything with log_event is taken): its bound writes are
    # the inner store's, which was read as a learner's store on another file, so a full disk dropped the write
    import rlfb.store.run_tree as run_tree
    from rlfb.errors import StoreFullError

    class Wrapped:
        def __init__(self, inner: FeedbackStore) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    inner = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    handler = FeedbackCallbackHandler(Wrapped(inner))
    top = uuid.uuid4()
    inner_chain: Runnable[Any, Any] = RunnableLambda(lambda q: q) | _bm25()
    outer: Runnable[Any, Any] = RunnableLambda(lambda q, config: inner_chain.invoke(q, config))
    with _locked(tmp_path / "f.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outer.invoke("ocean tides", config={"callbacks": [handler], "run_id": top})  # its run links, kept
    assert [[w[0].__name__ for w in entry["before"]] for entry in handler._unlogged.values()] == [["link_runs"]]
    real = run_tree.link_runs

    def full(*args: Any, **kwargs: Any) -> Any:
        raise StoreFullError("the disk is full")

    run_tree.link_runs = full
    try:
        with warnings.catch_warnings(record=True) as caught, pytest.raises(StoreFullError):
            warnings.simplefilter("always")
            handler.retrievals(top)
    finally:
        run_tree.link_runs = real
    assert not [w for w in caught if "is lost" in str(w.message)] and handler._unlogged
    [record] = handler.record_feedback(top, score=1.0)
    assert inner.event(record.event_id)["query"] == "ocean tides"
