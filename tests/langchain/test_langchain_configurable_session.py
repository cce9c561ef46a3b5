"""A session named in ``config["configurable"]`` is the retrieval's session.

``RunnableWithMessageHistory`` names the conversation as ``configurable={"session_id": ...}`` (LangGraph as
``thread_id``), which LangChain 1 no longer copies into run metadata: the retriever and the handler logged such
retrievals without a session, so a restated follow-up was never recorded as a reformulation and nothing was
learned from it, without a word (an audit of 2026-12-06).
"""

from __future__ import annotations

from typing import Any

from langchain_community.retrievers import BM25Retriever
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.documents import Document
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda, RunnablePassthrough
from langchain_core.runnables.history import RunnableWithMessageHistory

from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever
from rlfb.store import FeedbackStore

from _lc_corpus import IDS, TEXTS

FIRST, RESTATED = "what causes the aurora borealis", "what really causes the aurora borealis lights"


def retriever(store: Any) -> FeedbackEnsembleRetriever:
    return FeedbackEnsembleRetriever.from_texts(TEXTS, IDS, retrievers=("bm25",), store=store, k=2)


def signals(store: FeedbackStore, event_id: str) -> list[str]:
    return [f["signal"] for f in store.feedback(event_id)]


def test_a_chain_with_message_history_logs_its_session_and_a_restatement(tmp_path: Any) -> None:
    r = retriever(tmp_path / "fb.db")
    histories: dict[str, InMemoryChatMessageHistory] = {}
    chain = RunnableWithMessageHistory(
        RunnableLambda(lambda d: d["question"]) | r | RunnableLambda(lambda docs: docs[0].page_content),
        lambda session_id: histories.setdefault(session_id, InMemoryChatMessageHistory()),
        input_messages_key="question", history_messages_key="history")
    config: RunnableConfig = {"configurable": {"session_id": "s1"}}
    chain.invoke({"question": FIRST}, config=config)
    chain.invoke({"question": RESTATED}, config=config)
    store = r.ensemble.store
    first, second = store.events_for_session("s1")  # logged with no session before
    assert signals(store, first["id"]) == ["reformulation"] and r.ensemble.learner.n_learned == 1
    assert histories["s1"].messages  # the history itself is as LangChain keeps it


def test_a_thread_id_and_a_plain_retrievers_handler_read_the_configurable_session(tmp_path: Any) -> None:
    r = retriever(tmp_path / "fb.db")
    passthrough: Runnable[Any, list[Document]] = RunnablePassthrough() | r
    passthrough.invoke(FIRST, config={"configurable": {"thread_id": "t1"}})  # LangGraph's key
    assert r.ensemble.store.last_event("t1") is not None
    handler = FeedbackCallbackHandler(FeedbackStore(tmp_path / "plain.db"))
    chain: Runnable[Any, list[Document]] = RunnablePassthrough() | BM25Retriever.from_texts(TEXTS, ids=IDS, k=2)
    for question in (FIRST, RESTATED):
        chain.invoke(question, config={"callbacks": [handler], "configurable": {"session_id": "p1"}})
    first, _ = handler.store.events_for_session("p1")
    assert signals(handler.store, first["id"]) == ["reformulation"]


def test_the_run_metadata_session_wins_over_the_configurable_one(tmp_path: Any) -> None:
    r = retriever(tmp_path / "fb.db")
    passthrough: Runnable[Any, list[Document]] = RunnablePassthrough() | r
    passthrough.invoke(FIRST, config={"metadata": {"session_id": "m1"}, "configurable": {"session_id": "c1"}})
    store = r.ensemble.store
    assert store.last_event("m1") is not None and store.last_event("c1") is None
