"""Every warning of the LangChain adapter names the app's line, not rlfb's nor LangChain's.

A warning given inside a callback (the handler's ``on_retriever_end``) or a retrieval names the app's call
into LangChain (``invoke``), past LangChain's callback manager and runnables; feedback's warnings name the
``record_feedback`` call. BM25-only ensembles, LangChain's fake embeddings: no model is loaded.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever, retrievers
from rlfb.store import FeedbackStore

from _lc_corpus import IDS, TEXTS
from _store_lock import locked
from _warned import disk_full_once, named_files


def rlfb_retriever(store: Any, **kwargs: Any) -> FeedbackEnsembleRetriever:
    return FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=store, k=2,
                                                explore=False, **kwargs)


class Plain(BaseRetriever):
    """A retriever of LangChain's own (not rlfb's): its first two documents whatever the query."""

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [Document(id=i, page_content=t) for i, t in zip(IDS[:2], TEXTS[:2], strict=True)]


class Parents(BaseRetriever):
    """Returns a parent document for each chunk its rlfb retriever ranked, as ``ParentDocumentRetriever`` does."""

    child: Any

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        found = self.child.invoke(query, config={"callbacks": run_manager.get_child()})
        return [Document(id=f"parent-of-{d.id}", page_content=d.page_content) for d in found]


# ---------------------------------------------------------------- the retriever
def test_own_metadata_keys_replaced_name_the_invoke(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retrievers, "_warned", set(), raising=False)  # once per set of keys in the process
    retriever = FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, metadatas=[{"rank": "gold"}] * len(TEXTS),
                                                     retrievers=("bm25",), k=2)
    with pytest.warns(UserWarning, match="are replaced by rlfb's own") as caught:
        retriever.invoke("ocean tides")
    assert named_files(caught, "are replaced by rlfb's own") == [__file__]


def test_a_vector_store_member_without_relevance_scores_names_the_invoke() -> None:
    # stacklevel=2 named rlfb/members.py
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))
    store.add_texts(TEXTS, ids=IDS)
    retriever = FeedbackEnsembleRetriever.from_retrievers({"vs": store}, store=FeedbackStore(), k=2)
    with pytest.warns(UserWarning, match="gives no relevance scores") as caught:
        retriever.invoke("ocean tides")
    assert named_files(caught, "gives no relevance scores") == [__file__]


def test_run_metadata_that_cannot_be_a_session_names_the_invoke() -> None:
    # stacklevel=2 named langchain_rlfb/retrievers.py
    with pytest.warns(UserWarning, match="ignoring run metadata session_id") as caught:
        rlfb_retriever(FeedbackStore()).invoke("ocean tides", config={"metadata": {"session_id": ""}})
    assert named_files(caught, "ignoring run metadata") == [__file__]


# ---------------------------------------------------------------- the retriever, awaited
# ainvoke runs the retrieval in a worker thread: its warnings named concurrent/futures/thread.py
async def test_own_metadata_keys_replaced_name_the_ainvoke(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retrievers, "_warned", set(), raising=False)
    retriever = FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, metadatas=[{"rank": "gold"}] * len(TEXTS),
                                                     retrievers=("bm25",), k=2)
    with pytest.warns(UserWarning, match="are replaced by rlfb's own") as caught:
        await retriever.ainvoke("ocean tides")
    assert named_files(caught, "are replaced by rlfb's own") == [__file__]


async def test_a_vector_store_member_without_relevance_scores_names_the_ainvoke() -> None:
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))
    store.add_texts(TEXTS, ids=IDS)
    retriever = FeedbackEnsembleRetriever.from_retrievers({"vs": store}, store=FeedbackStore(), k=2)
    with pytest.warns(UserWarning, match="gives no relevance scores") as caught:
        await retriever.ainvoke("ocean tides")
    assert named_files(caught, "gives no relevance scores") == [__file__]


async def test_run_metadata_that_cannot_be_a_session_names_the_ainvoke_in_a_chain() -> None:
    chain: Any = RunnablePassthrough() | rlfb_retriever(FeedbackStore())
    with pytest.warns(UserWarning, match="ignoring run metadata session_id") as caught:
        await chain.ainvoke("ocean tides", config={"metadata": {"session_id": ""}})
    assert named_files(caught, "ignoring run metadata") == [__file__]


async def test_a_core_warning_in_the_worker_thread_names_the_ainvoke(tmp_path: Path) -> None:
    # feedback stored and not learned, which the retrieval's catch-up (in the thread) cannot learn now
    path = str(tmp_path / "fb.db")
    before = rlfb_retriever(path)
    run = uuid.uuid4()
    before.invoke("ocean tides", run_id=run)
    before.ensemble.close()
    with FeedbackStore(path) as store:
        store.record_feedback(str(run), "thumbs_up")  # stored, learned by no ensemble yet
    retriever = rlfb_retriever(path)
    ens = retriever.ensemble
    disk_full_once(ens)
    with pytest.warns(RuntimeWarning, match="could not be learned now") as caught:
        await retriever.ainvoke("ocean tides")
    assert named_files(caught, "could not be learned now") == [__file__]
    ens.close()


async def test_a_warning_of_a_retrieval_run_by_asyncio_gather_names_the_gather() -> None:
    # gather makes each ainvoke a task of its own: the line is the one awaiting the gather
    retriever = rlfb_retriever(FeedbackStore())
    with pytest.warns(UserWarning, match="ignoring run metadata session_id") as caught:
        await asyncio.gather(retriever.ainvoke("ocean tides", config={"metadata": {"session_id": ""}}),
                             retriever.ainvoke("the moon"))
    assert named_files(caught, "ignoring run metadata") == [__file__]


async def test_a_warning_of_a_retrieval_under_asyncio_wait_for_names_the_wait_for() -> None:
    # Python 3.11's wait_for runs the call as a task of its own and waits on a future of its own; 3.12's awaits
    # it in the caller's task (the next test)
    retriever = rlfb_retriever(FeedbackStore())
    with pytest.warns(UserWarning, match="ignoring run metadata session_id") as caught:
        await asyncio.wait_for(retriever.ainvoke("ocean tides", config={"metadata": {"session_id": ""}}), 60)
    assert named_files(caught, "ignoring run metadata") == [__file__]


async def test_a_warning_of_a_retrieval_an_asyncio_coroutine_awaits_in_the_callers_task_names_the_app() -> None:
    """Bug: Python 3.12's ``wait_for`` awaits the call in the caller's own task, so the first frame below rlfb and
    LangChain was asyncio's coroutine, taken for the event loop's: the warning named the thread pool's module.
    ``relay`` stands for it on every Python: a coroutine of a module named ``asyncio...``, awaiting the call."""
    namespace: dict[str, Any] = {"__name__": "asyncio.relay"}
    exec("async def relay(call):\n    return await call\n", namespace)  # noqa: S102 - a module of asyncio's name
    retriever = rlfb_retriever(FeedbackStore())
    with pytest.warns(UserWarning, match="ignoring run metadata session_id") as caught:
        await namespace["relay"](retriever.ainvoke("ocean tides", config={"metadata": {"session_id": ""}}))
    assert named_files(caught, "ignoring run metadata") == [__file__]


# ---------------------------------------------------------------- the callback handler
def test_a_retrieval_logged_without_its_session_names_the_invoke() -> None:
    # a callback's warning: stacklevel=3 named LangChain's callback manager
    handler = FeedbackCallbackHandler(FeedbackStore())
    with pytest.warns(UserWarning, match="rlfb logged retrieval .* without its session_id") as caught:
        Plain().invoke("ocean tides", config={"callbacks": [handler], "metadata": {"session_id": ""}})
    assert named_files(caught, "rlfb logged retrieval") == [__file__]


def test_a_retrieval_a_locked_store_could_not_log_names_the_invoke(tmp_path: Path) -> None:
    # a callback's warning: stacklevel=3 named LangChain's callback manager
    path = tmp_path / "fb.db"
    handler = FeedbackCallbackHandler(FeedbackStore(path, busy_timeout=0.05))
    with locked(path), pytest.warns(RuntimeWarning, match="could not log retrieval") as caught:
        Plain().invoke("ocean tides", config={"callbacks": [handler]})
    assert named_files(caught, "could not log retrieval") == [__file__]
    Plain().invoke("the moon", config={"callbacks": [handler]})  # the kept log is written first: none at exit
    assert handler.store.counts()["events"] == 2
    handler.store.close()


def test_a_run_id_given_again_names_the_invoke() -> None:
    handler = FeedbackCallbackHandler(FeedbackStore())
    chain: Any = RunnablePassthrough() | Plain()
    top = uuid.uuid4()
    chain.invoke("ocean tides", config={"callbacks": [handler], "run_id": top})
    with pytest.warns(UserWarning, match="was given to an earlier run") as caught:
        chain.invoke("the moon", config={"callbacks": [handler], "run_id": top})
    assert named_files(caught, "was given to an earlier run") == [__file__]


def test_feedback_no_live_learner_learns_names_the_feedback(tmp_path: Path) -> None:
    path = str(tmp_path / "fb.db")
    before_restart = rlfb_retriever(path)
    run = uuid.uuid4()
    before_restart.invoke("ocean tides", run_id=run)
    before_restart.ensemble.store.close()  # the app restarted: the ensemble that decided is gone
    handler = FeedbackCallbackHandler(store=path)
    with pytest.warns(RuntimeWarning, match="no rlfb learner of this process learned it") as caught:
        handler.record_feedback(run, score=1.0)
    assert named_files(caught, "no rlfb learner") == [__file__]
    handler.store.close()


def test_feedback_on_a_document_no_decision_returned_names_the_feedback(tmp_path: Path) -> None:
    retriever = rlfb_retriever(str(tmp_path / "fb.db"))
    handler = FeedbackCallbackHandler.from_ensemble(retriever)
    run = uuid.uuid4()
    shown = Parents(child=retriever).invoke("ocean tides", config={"callbacks": [handler]}, run_id=run)
    with pytest.warns(RuntimeWarning, match="taught no rlfb learner") as caught:
        handler.record_feedback(run, signal="click", chunk_id=shown[0].id)
    assert named_files(caught, "taught no rlfb learner") == [__file__]
