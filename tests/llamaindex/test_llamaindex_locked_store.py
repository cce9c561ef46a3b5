"""The LlamaIndex handler's logs while its store is locked past ``busy_timeout``: kept, in order, and written at
the handler's next write, its next feedback, its close or the process's exit. Until 2026-12-07 each was dropped
with a logged warning, and feedback on the query said to attach the handler before querying."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llamaindex_rlfb import FeedbackEventHandler
from rlfb.errors import StoreBusyError
from rlfb.store import FeedbackStore


class _Fixed(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(id_="a", text="tides follow the moon"), score=0.5),
                NodeWithScore(node=TextNode(id_="b", text="the aurora"), score=0.25)]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Another connection holds the file's write lock."""
    other = sqlite3.connect(path)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.rollback()
        other.close()


def _queries(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [q for (q,) in db.execute("SELECT query FROM events ORDER BY rowid")]


class _Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_retrieval_logged_while_the_store_is_locked_is_kept_and_rated(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2, clock=clock)
    with FeedbackEventHandler(store=store) as handler:
        _Fixed().retrieve("warm up")
        with _locked(tmp_path / "f.db"), caplog.at_level(logging.WARNING, "llamaindex_rlfb.events"):
            _Fixed().retrieve("moon tides")  # the user's query does not fail
            qid = handler.last_query_id
            assert "keeps this write" in caplog.text
            with pytest.raises(StoreBusyError):  # feedback on a locked store: the store's own error, not a lost query
                handler.record_feedback(qid, score=1.0)
        retrieved_at, clock.now = clock.now, clock.now + 120.0
        [record] = handler.record_feedback(qid, score=1.0)
        event = store.event(record.event_id)
        assert event["query"] == "moon tides" and [c["chunk_id"] for c in event["chunks"]] == ["a", "b"]
        assert event["timestamp"] == retrieved_at  # the retrieval's time, not the later write's
        assert record.delay == pytest.approx(120.0)
        assert not handler._unwritten


def test_kept_logs_are_written_in_order_before_the_next_one(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    with FeedbackEventHandler(store=store) as handler:
        with _locked(tmp_path / "f.db"):
            _Fixed().retrieve("first")
            first = handler.last_query_id
            _Fixed().retrieve("second")  # kept behind the first, not tried before it
            second = handler.last_query_id
            assert len(handler._unwritten) == 2
        _Fixed().retrieve("third")
        third = handler.last_query_id
        assert not handler._unwritten
        order = [r[0] for r in store.db.execute("SELECT id FROM events ORDER BY rowid").fetchall()]
        assert order == [first, second, third]


def test_close_writes_what_was_kept_and_keeps_it_where_the_store_is_locked_still(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    handler = FeedbackEventHandler(store=FeedbackStore(path, busy_timeout=0.2)).attach()
    with _locked(path):
        _Fixed().retrieve("moon tides")
        # the caller's store stays open: what was kept stays kept, for a later close, write or exit
        with pytest.warns(RuntimeWarning, match="1 log.*not written yet: it is locked still"):
            handler.close()
    handler.close()
    assert _queries(path) == ["moon tides"] and not handler._unwritten


def test_the_process_exit_writes_what_was_kept(tmp_path: Path) -> None:
    # the lock is let go after the last query and nothing writes again: the exit hook writes the kept log
    path = tmp_path / "f.db"
    code = textwrap.dedent(f"""
        import sqlite3
        from llama_index.core.base.base_retriever import BaseRetriever
        from llama_index.core.schema import NodeWithScore, TextNode
        from llamaindex_rlfb import FeedbackEventHandler
        from rlfb.store import FeedbackStore

        class Fixed(BaseRetriever):
            def _retrieve(self, query_bundle):
                return [NodeWithScore(node=TextNode(id_="a", text="tides"), score=0.5)]

        handler = FeedbackEventHandler(store=FeedbackStore({str(path)!r}, busy_timeout=0.2)).attach()
        other = sqlite3.connect({str(path)!r})
        other.execute("BEGIN IMMEDIATE")
        Fixed().retrieve("moon tides")
        other.rollback()
        other.close()
    """)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert _queries(path) == ["moon tides"]


def _nodes() -> list[TextNode]:
    return [TextNode(id_="a", text="the aurora is caused by the solar wind"),
            TextNode(id_="b", text="tides follow the moon"),
            TextNode(id_="c", text="volcanoes erupt molten rock")]


class _Three(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=n, score=1.0 - i / 10) for i, n in enumerate(_nodes())]


@pytest.mark.parametrize("lock", [False, True])
def test_a_query_engine_run_logs_the_same_lists_whether_the_store_was_locked_or_not(tmp_path: Path,
                                                                                   lock: bool) -> None:
    # the response's nodes are the postprocessor's decision, copied here: while that copy was kept, reading it
    # back found nothing, so the response was logged as a list of its own and feedback rated it twice
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine

    from llamaindex_rlfb import FeedbackFusionPostprocessor

    path = tmp_path / "h.db"
    store = FeedbackStore(path, busy_timeout=0.2)
    pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=2, nodes=_nodes(), store=tmp_path / "pp.db")
    engine = RetrieverQueryEngine.from_args(_Three(), llm=MockLLM(max_tokens=4), node_postprocessors=[pp])
    with FeedbackEventHandler(store=store) as handler:
        with _locked(path) if lock else contextlib.nullcontext():
            engine.query("aurora solar wind")
            qid = handler.last_query_id
            assert qid is not None and bool(handler._unwritten) is lock
        records = handler.record_feedback(qid, score=1.0)
    assert len(store.resolve_run(qid)) == 2  # the retriever's list and the postprocessor's, not the response too
    assert len(records) == 3  # those two, and the postprocessor's own store's row


def test_a_second_re_ranking_kept_while_locked_still_gets_its_candidates(tmp_path: Path) -> None:
    # a kept link counted as made, so the copy of the candidates a second re-ranking of the same cached nodes
    # needs (its run cannot be linked under the bare retrieval twice) was never made
    from llamaindex_rlfb import EVENT_ID_KEY, FeedbackFusionPostprocessor

    def rated(locked: bool) -> list[str]:
        folder = tmp_path / str(locked)
        folder.mkdir()
        pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=2, nodes=_nodes(), explore=False,
                                         store=folder / "pp.db")
        with FeedbackEventHandler(store=FeedbackStore(folder / "h.db", busy_timeout=0.2)) as handler:
            with _locked(folder / "h.db") if locked else contextlib.nullcontext():
                cached = _Three().retrieve("aurora solar wind")
                pp.postprocess_nodes(cached, query_str="aurora solar wind")
                second = pp.postprocess_nodes(cached, query_str="aurora solar wind")[0].node.metadata[EVENT_ID_KEY]
                qid = handler.last_query_id
            return sorted("candidates" if r.event_id.endswith("/candidates") else
                          "second" if r.event_id == second else r.event_id
                          for r in handler.record_feedback(qid, score=0.0))

    assert rated(True) == rated(False) == ["candidates", "second", "second"]


def test_writing_what_was_kept_waits_for_a_block_holding_the_store_and_does_not_hang(tmp_path: Path) -> None:
    # the kept writes were written under the handler's own lock, then the store's; a thread inside the store's
    # exclusive() whose query wrote through the handler waited for the first while holding the second
    import threading

    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    with FeedbackEventHandler(store=store) as handler:
        with _locked(tmp_path / "f.db"):
            _Three().retrieve("kept while locked")
        inside, done = threading.Event(), []

        def in_a_block() -> None:
            with store.exclusive():
                inside.set()
                reader.join(0.3)  # the other thread starts to write the kept log meanwhile
                _Three().retrieve("inside the block")
            done.append("block")

        def read() -> None:
            inside.wait()
            handler.retrievals("x")
            done.append("read")

        reader = threading.Thread(target=read, daemon=True)
        block = threading.Thread(target=in_a_block, daemon=True)
        reader.start()
        block.start()
        block.join(120)
        reader.join(120)
        assert sorted(done) == ["block", "read"]
        assert _queries(tmp_path / "f.db") == ["kept while locked", "inside the block"]


def test_a_kept_log_has_the_time_its_retrieval_was_made(tmp_path: Path) -> None:
    # the time was read once the store had refused the write, busy_timeout after the retrieval
    import time

    store = FeedbackStore(tmp_path / "f.db", busy_timeout=1.0)
    with FeedbackEventHandler(store=store) as handler:
        with _locked(tmp_path / "f.db"):
            before = time.time()
            _Three().retrieve("moon tides")
            after = time.time()  # at least busy_timeout later
        [event] = handler.retrievals()
    assert before <= event["timestamp"] < before + (after - before) / 2


def test_a_kept_log_written_inside_a_block_that_rolls_back_is_kept_again(tmp_path: Path) -> None:
    # written in the app's exclusive() block and taken off the kept list, it went with the block's rollback
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=0.2)
    with FeedbackEventHandler(store=store) as handler:
        with _locked(tmp_path / "f.db"):
            _Three().retrieve("kept while locked")
        with pytest.raises(ValueError), store.exclusive():
            _Three().retrieve("inside a block that rolls back")
            assert not handler._unwritten
            raise ValueError
        assert len(handler._unwritten) == 1
        _Three().retrieve("after")
    assert _queries(tmp_path / "f.db") == ["kept while locked", "after"]
