"""A mistyped signal given second to a handler's ``record_feedback`` is an unknown signal, as the ensemble says.

``handler.record_feedback(run_id, "thumbsup")`` read the typo as a LangSmith feedback key and refused for want of
a signal, though one was given: the LangChain handler with "feedback needs a signal, a rating or a value", the
LlamaIndex handler with "give exactly one of score, rating, signal or value (got none)". It is now the
:class:`~rlfb.errors.UnknownSignalError` that ``FeedbackEnsemble.feedback(eid, "thumbsup")`` raises, listing the
known signals, with the closest one and the LangSmith form (a key needs its score), and nothing is written. A
LangSmith key with a score is read as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rlfb import UnknownSignalError, ValidationError
from rlfb.reward import RewardConfig, RewardFunction
from rlfb.runs import key_or_score
from rlfb.store import FeedbackStore

TEXTS = [
    "The aurora borealis glows when charged particles of the solar wind strike the upper atmosphere.",
    "Ocean tides follow the pull of the moon and, more weakly, of the sun.",
    "A volcano erupts when molten magma rises through cracks in the crust.",
    "Titanium alloys keep their strength at 400 bar in deep-sea hulls.",
]
IDS = ["aurora", "tides", "volcano", "titanium"]


def _refusal_says_so(info: pytest.ExceptionInfo[UnknownSignalError]) -> None:
    text = str(info.value)
    assert "unknown signal type 'thumbsup'" in text
    assert "did you mean 'thumbs_up'?" in text
    assert "thumbs_down" in text and "explicit_positive" in text  # the known signals are listed
    assert "score=" in text  # a LangSmith-style key needs its score
    assert "needs a signal" not in text and "got none" not in text


# ---------------------------------------------------------------------------------------------------- the core
def test_key_or_score_refuses_an_unknown_signal_given_alone() -> None:
    with pytest.raises(UnknownSignalError) as info:
        key_or_score(("thumbsup",), None, None, "record_feedback")
    _refusal_says_so(info)
    assert isinstance(info.value, ValidationError)  # except ValidationError still catches it


def test_key_or_score_keeps_langsmiths_key_with_a_score_or_another_rating() -> None:
    assert key_or_score(("thumbsup",), None, 1.0, "record_feedback") == ("thumbsup", 1.0, None)
    assert key_or_score(("thumbsup",), None, None, "record_feedback", rated=True) == ("thumbsup", None, None)
    assert key_or_score(("thumbsup",), None, None, "record_feedback", signal="click") == ("thumbsup", None, "click")
    assert key_or_score(("user_score",), None, None, "record_feedback") == ("user_score", None, None)  # numeric
    assert key_or_score(("rating",), None, None, "record_feedback") == ("rating", None, None)  # stays a key
    assert key_or_score(("thumbs_up",), None, None, "record_feedback") == (None, None, "thumbs_up")
    assert key_or_score((1.0,), None, None, "record_feedback") == (None, 1.0, None)


def test_key_or_score_knows_the_stores_own_signals() -> None:
    reward = RewardFunction(RewardConfig(aliases={"meh": "neutral"}))
    assert key_or_score(("meh",), None, None, "record_feedback", reward=reward) == (None, None, "meh")
    with pytest.raises(UnknownSignalError, match="'meh'"):
        key_or_score(("meh",), None, None, "record_feedback")  # the built-in signals know no "meh"
    with pytest.raises(UnknownSignalError, match=r"did you mean 'meh'\?.*known: .*meh"):
        key_or_score(("mehh",), None, None, "record_feedback", reward=reward)


# ----------------------------------------------------------------------------------------------- LangChain
def test_langchain_handler_refuses_a_mistyped_signal_as_the_ensemble_does() -> None:
    pytest.importorskip("langchain_community.retrievers")
    from langchain_community.retrievers import BM25Retriever
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough

    from langchain_rlfb import FeedbackCallbackHandler

    handler = FeedbackCallbackHandler(FeedbackStore())
    bm25 = BM25Retriever.from_texts(TEXTS, ids=IDS, k=2)
    prompt = ChatPromptTemplate.from_template("Context: {context}\nQuestion: {question}")
    chain = {"context": bm25, "question": RunnablePassthrough()} | prompt | FakeListChatModel(
        responses=["The moon."]) | StrOutputParser()
    run = uuid.uuid4()
    assert chain.invoke("what moves the tides", config={"callbacks": [handler], "run_id": run}) == "The moon."
    assert handler.retrievals(run)  # the chain's run stands for the BM25 retrieval

    with pytest.raises(UnknownSignalError) as info:
        handler.record_feedback(run, "thumbsup")
    _refusal_says_so(info)
    with pytest.raises(UnknownSignalError):
        handler.record_feedback(run, signal="thumbsup")  # the keyword form, as before
    assert handler.store.counts()["feedback"] == 0  # nothing written on the refusal

    (keyed,) = handler.record_feedback(run, "thumbsup", score=1.0)  # LangSmith's key with its score, as before
    assert keyed.value == 1.0 and handler.store.feedback(keyed.event_id)[-1]["key"] == "thumbsup"
    (up,) = handler.record_feedback(run, "thumbs_up")
    assert up.signal == "thumbs_up"


def test_langchain_handler_takes_its_stores_own_signal_second() -> None:
    pytest.importorskip("langchain_community.retrievers")
    from langchain_community.retrievers import BM25Retriever

    from langchain_rlfb import FeedbackCallbackHandler

    store = FeedbackStore(reward=RewardFunction(RewardConfig(aliases={"meh": "neutral"})))
    handler = FeedbackCallbackHandler(store)
    run = uuid.uuid4()
    BM25Retriever.from_texts(TEXTS, ids=IDS, k=2).invoke("tides", config={"callbacks": [handler]}, run_id=run)
    (rec,) = handler.record_feedback(run, "meh")
    assert rec.signal == "meh"


# ---------------------------------------------------------------------------------------------- LlamaIndex
@pytest.fixture
def li_setup() -> Iterator[tuple[Any, Any]]:
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.schema import TextNode

    from llamaindex_rlfb import FeedbackEnsembleRetriever, FeedbackEventHandler

    nodes = [TextNode(text=t, id_=i) for t, i in zip(TEXTS, IDS, strict=True)]
    retriever = FeedbackEnsembleRetriever.from_defaults(nodes=nodes, retrievers=("bm25",), similarity_top_k=2)
    handler = FeedbackEventHandler(store=FeedbackStore()).attach()
    try:
        yield handler, RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    finally:
        handler.close()


def test_llamaindex_handler_refuses_a_mistyped_signal_as_the_ensemble_does(li_setup: tuple[Any, Any]) -> None:
    handler, engine = li_setup
    engine.query("what moves the tides")
    qid = handler.last_query_id
    assert qid is not None

    with pytest.raises(UnknownSignalError) as info:
        handler.record_feedback(qid, "thumbsup")
    _refusal_says_so(info)
    with pytest.raises(UnknownSignalError):
        handler.record_feedback(signal="thumbsup")  # the latest query, implied
    with pytest.raises(UnknownSignalError):
        handler.record_feedback(qid, signal="thumbsup")  # the keyword form, as before
    assert handler.store.counts()["feedback"] == 0  # nothing written on the refusal

    keyed = handler.record_feedback(qid, "thumbsup", score=1.0)  # LangSmith's key with its score, as before
    assert keyed and all(r.reward == pytest.approx(1.0, abs=1e-3) for r in keyed)
    assert all(handler.store.feedback(r.event_id)[-1]["key"] == "thumbsup" for r in keyed)
    up = handler.record_feedback(qid, "thumbs_up")
    assert up and {r.signal for r in up} == {"thumbs_up"}
