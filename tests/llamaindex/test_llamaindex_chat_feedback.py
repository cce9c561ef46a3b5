"""Feedback on a chat engine's turns: the response names its turn, and feedback never lands on another turn.

A chat engine emits no ``QueryStartEvent``/``QueryEndEvent``: until 2026-12-06 ``handler.query_id_of(response)``
was ``None`` for its responses, and ``record_feedback(None, ...)`` then rated the latest turn, not the one meant.
A turn with an rlfb postprocessor whose LLM raised was still rated by feedback naming no query. And after a
restart, feedback on a query from before it was stored and never learned by a live postprocessor that had not
re-ranked anything yet in the new process.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.chat_engine import CondensePlusContextChatEngine, ContextChatEngine
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import LLMMetadata, MockLLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.schema import TextNode

from llamaindex_rlfb import EVENT_ID_KEY, FeedbackEventHandler, FeedbackFusionPostprocessor
from rlfb import UnknownEventError, ValidationError

TEXTS = {
    "kx": "The KX-4471 valve is rated for 400 bar at 120 C.",
    "test": "Pressure ratings are tested at room temperature.",
    "aurora": "The aurora is caused by charged particles from the sun.",
    "tides": "Tides follow the pull of the moon.",
    "volc": "Volcanoes erupt molten rock.",
}
ENGINES = [ContextChatEngine, CondensePlusContextChatEngine]


class DownLLM(MockLLM):
    """A chat model whose every answer raises: the turn's retrieval ended, its answer never came."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=True)

    @llm_chat_callback()
    def chat(self, messages: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the LLM is down")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise RuntimeError("the LLM is down")


@pytest.fixture
def mock_index() -> VectorStoreIndex:
    nodes = [TextNode(id_=i, text=t) for i, t in TEXTS.items()]
    return VectorStoreIndex(nodes, embed_model=MockEmbedding(embed_dim=8))


@pytest.fixture
def db(tmp_path: Any) -> str:
    return str(tmp_path / "fb.db")


@pytest.fixture
def handler(db: str) -> Iterator[FeedbackEventHandler]:
    h = FeedbackEventHandler(store=db).attach()
    yield h
    h.close()


def _rerank(index: VectorStoreIndex, db: str, **kwargs: Any) -> FeedbackFusionPostprocessor:
    return FeedbackFusionPostprocessor.from_index(index, store=db, retrievers=("bm25",), top_n=2, explore=False,
                                                  **kwargs)


def _engine(cls: Any, index: VectorStoreIndex, pp: Any, llm: Any = None) -> Any:
    # a plain buffer: the default Memory writes a streamed turn through aiosqlite from a thread that can outlive
    # the test's event loop (an unhandled-thread warning in a later test)
    from llama_index.core.memory import ChatMemoryBuffer

    return cls.from_defaults(retriever=index.as_retriever(similarity_top_k=5), node_postprocessors=[pp],
                             llm=llm or MockLLM(max_tokens=4), memory=ChatMemoryBuffer.from_defaults())


def _ask(engine: Any, method: str, message: str) -> Any:
    """A turn through ``method``, its stream read to the end, as an app shows it."""
    if method in ("chat", "stream_chat"):
        response = getattr(engine, method)(message)
        if method == "stream_chat":
            for _ in response.response_gen:
                pass
        return response

    async def turn() -> Any:
        response = await getattr(engine, method)(message)
        if method == "astream_chat":
            async for _ in response.async_response_gen():
                pass
        return response

    return asyncio.run(turn())


@pytest.mark.parametrize("method", ["chat", "stream_chat", "achat", "astream_chat"])
@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_a_chat_turns_response_names_its_own_turn(mock_index: Any, db: str, handler: FeedbackEventHandler,
                                                  cls: Any, method: str) -> None:
    # query_id_of(response) was None for any chat engine's response, and record_feedback(None, ...) rated the
    # latest turn: a thumbs down meant for the first answer landed on the second
    pp = _rerank(mock_index, db)
    first = _ask(_engine(cls, mock_index, pp), method, "What is KX-4471 rated for?")
    second = _ask(_engine(cls, mock_index, pp), method, "volcanoes")
    qid = handler.query_id_of(first)
    assert qid is not None and qid != handler.query_id_of(second) and handler.query_id_of(second) is not None

    decided = first.source_nodes[0].node.metadata[EVENT_ID_KEY]  # the rlfb re-ranking the first answer used
    assert {n.node.metadata[EVENT_ID_KEY] for n in first.source_nodes} == {decided}
    rated = handler.record_feedback(qid, score=0.0)
    assert decided in {r.event_id for r in rated}
    assert second.source_nodes[0].node.metadata[EVENT_ID_KEY] not in {r.event_id for r in rated}
    mine = next(r for r in rated if r.event_id == decided)
    assert set(mine.chunk_rewards) == {n.node.node_id for n in first.source_nodes}
    assert {e["id"] for e in handler.retrievals(qid)} == {r.event_id for r in rated}


def test_feedback_naming_none_is_refused_not_given_to_the_latest_query(
    mock_index: Any, db: str, handler: FeedbackEventHandler
) -> None:
    # record_feedback(handler.query_id_of(r), ...) for a response the handler never saw passed None, which was
    # read as "the latest query": another question's answer was rated
    pp = _rerank(mock_index, db)
    engine = mock_index.as_query_engine(llm=MockLLM(max_tokens=4), similarity_top_k=5, node_postprocessors=[pp])
    handler.detach()
    unseen = engine.query("aurora")
    handler.attach()
    engine.query("tides moon")
    assert handler.query_id_of(unseen) is None
    with pytest.raises(UnknownEventError, match="query_id_of"):
        handler.record_feedback(handler.query_id_of(unseen), score=0.0)
    with pytest.raises(UnknownEventError, match="None"):
        handler.record_feedback(None, 1.0)
    assert handler.store.counts()["feedback"] == 0
    assert handler.retrievals(None) == []  # names nothing, as an unknown id
    latest = handler.retrievals()  # left out: the latest query, as documented
    assert latest and all(e["query"] == "tides moon" for e in latest)
    assert handler.record_feedback(score=1.0)  # the id left out still rates the latest query


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_feedback_naming_no_query_refuses_a_chat_turn_with_an_rlfb_postprocessor_that_raised(
    mock_index: Any, db: str, handler: FeedbackEventHandler, cls: Any
) -> None:
    # the latest query id was the re-ranking's run "<retrieval>/reranked/<event>", which was looked up as a span:
    # the turn whose LLM raised was not known to be above it, and a thumbs down on it was recorded and learned
    pp = _rerank(mock_index, db)
    good = _engine(cls, mock_index, pp).chat("valve")
    with pytest.raises(RuntimeError, match="down"):
        _engine(cls, mock_index, pp, llm=DownLLM(max_tokens=None)).chat("aurora")
    before = handler.store.counts()["feedback"]
    with pytest.raises(ValidationError, match="raised"):
        handler.record_feedback(score=0.0)
    assert handler.store.counts()["feedback"] == before
    assert handler.record_feedback(handler.query_id_of(good), score=1.0)  # the answered turn, by its id


def _confidence(pp: FeedbackFusionPostprocessor, chunk: str) -> float:
    assert pp.ensemble is not None
    return float(pp.ensemble.learner.confidence.confidence([chunk])[0])


def test_feedback_on_a_query_from_before_a_restart_teaches_a_live_postprocessor(
    mock_index: Any, db: str
) -> None:
    # after a restart, a postprocessor that had not re-ranked anything yet was found by no handler: feedback on a
    # query from before the restart was stored and never learned, and no later query changed that
    before = _rerank(mock_index, db, policy="gradient")
    with FeedbackEventHandler(store=db) as old:
        response = mock_index.as_query_engine(llm=MockLLM(max_tokens=4), similarity_top_k=5,
                                              node_postprocessors=[before]).query("valve rated pressure")
        qid = old.query_id_of(response)
    top = response.source_nodes[0].node.node_id
    before.store.close()  # the process ended: that postprocessor is gone
    old.close()

    after = _rerank(mock_index, db, policy="gradient")  # the restarted app, not queried yet
    handler = FeedbackEventHandler(store=db).attach()
    try:
        start = _confidence(after, top)
        rated = handler.record_feedback(qid, signal="click", chunk_id=top)
        assert response.source_nodes[0].node.metadata[EVENT_ID_KEY] in {r.event_id for r in rated}
        assert _confidence(after, top) > start
    finally:
        handler.close()


def test_feedback_no_live_learner_can_learn_warns_once(mock_index: Any, db: str) -> None:
    # a self-indexing postprocessor has no learner until its first call: feedback on a decision from before the
    # restart is stored and taught nothing, which was silent
    before = FeedbackFusionPostprocessor(store=db, retrievers=("bm25",), top_n=2)
    with FeedbackEventHandler(store=db) as old:
        response = mock_index.as_query_engine(llm=MockLLM(max_tokens=4), similarity_top_k=5,
                                              node_postprocessors=[before]).query("valve")
        qid = old.query_id_of(response)
    before.store.close()
    old.close()

    after = FeedbackFusionPostprocessor(store=db, retrievers=("bm25",), top_n=2)  # self-indexing, no call yet
    assert after.ensemble is None
    handler = FeedbackEventHandler(store=db).attach()
    try:
        with pytest.warns(RuntimeWarning, match=r"no rlfb learner alive in this process learned.*ensemble="):
            assert handler.record_feedback(qid, score=1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            assert handler.record_feedback(qid, score=0.0)  # once per handler
        assert handler.store.counts()["feedback"] == 2 * len(handler.retrievals(qid))
    finally:
        handler.close()

