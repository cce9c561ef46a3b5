"""The handler's table of each thread's latest query is bounded, as its other tables are: an app that starts
a thread per request grew it by one entry per thread, forever (found while splitting events.py, 2026-12-06)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from llama_index.core.llms import MockLLM

from llamaindex_rlfb import FeedbackEventHandler


def test_the_latest_query_of_each_thread_is_kept_for_the_newest_threads_only(
    index: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llamaindex_rlfb._queries as queries

    monkeypatch.setattr(queries, "KEPT", 3)
    handler = FeedbackEventHandler(store=tmp_path / "fb.db").attach()
    try:
        engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
        seen: list[str | None] = []
        for question in ["aurora", "tides", "geysers", "rain", "volcano", "moon"]:
            worker = threading.Thread(target=lambda q=question: (engine.query(q), seen.append(handler.last_query_id)))
            worker.start()
            worker.join()
        assert len(handler._thread_last) <= 3  # one entry per thread ever seen before
        assert all(seen) and len(set(seen)) == len(seen)
        engine.query("aurora borealis")  # this thread's own latest query, after the others
        assert handler.last_query_id == next(reversed(handler._thread_last.values()))[0]
    finally:
        handler.close()
