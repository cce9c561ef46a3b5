"""The handler's table of each thread's latest query is bounded, as its other tables are: an app that starts
a thread per request grew it by one entry per thread, forever (found while splitting events.py, 2026-12-06)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.llms import MockLLM

from llamaindex_rlfb import FeedbackEventHandler


def _ask_in_threads(engine: Any, handler: FeedbackEventHandler, questions: list[str]) -> list[Any]:
    """Each question asked in a thread of its own, all alive at once (a finished thread's ident is reused)."""
    seen: list[Any] = []
    done = threading.Barrier(len(questions))
    lock = threading.Lock()

    def ask(question: str) -> None:
        with lock:  # one query at a time: what is checked is the table, not concurrent queries
            engine.query(question)
            seen.append((threading.get_ident(), handler.last_query_id))
        done.wait(timeout=60)

    workers = [threading.Thread(target=ask, args=(q,)) for q in questions]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return seen


@pytest.fixture
def asked(index: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """A handler that keeps 3 threads' latest queries, and a query engine it sees."""
    import llamaindex_rlfb._queries as queries

    monkeypatch.setattr(queries, "KEPT", 3)
    handler = FeedbackEventHandler(store=tmp_path / "fb.db").attach()
    try:
        yield handler, index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
    finally:
        handler.close()


def test_the_latest_query_of_each_thread_is_kept_for_the_newest_threads_only(asked: tuple[Any, Any]) -> None:
    handler, engine = asked
    here = threading.get_ident()
    engine.query("aurora borealis")
    first = _ask_in_threads(engine, handler, ["tides", "geysers"])
    engine.query("solar wind")  # this thread's latest is now the newest entry, not the oldest
    later = _ask_in_threads(engine, handler, ["rain", "volcano", "moon", "magma"])
    assert all(q for _, q in first + later) and len({q for _, q in first + later}) == 6
    assert len({t for t, _ in later}) == 4
    assert len(handler._thread_last) == 3  # one entry per thread ever seen, before
    assert here not in handler._thread_last  # the oldest went first
    assert list(handler._thread_last) == [t for t, _ in later[-3:]]


def test_a_thread_asking_again_moves_to_the_newest_place(asked: tuple[Any, Any]) -> None:
    handler, engine = asked
    here = threading.get_ident()
    engine.query("aurora borealis")
    _ask_in_threads(engine, handler, ["tides", "geysers"])
    engine.query("solar wind")  # moved last: the next thread pushes out the oldest worker, not this thread
    _ask_in_threads(engine, handler, ["rain"])
    assert here in handler._thread_last
    assert handler._thread_last[here][0] == handler.last_query_id
