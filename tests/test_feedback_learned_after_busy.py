"""Feedback committed through one store handle and learned by the ensemble that made the retrieval through its own:
when another writer takes the file's write lock between the commit and the learning, the caller gets a
StoreBusyError, the row stays stored, and it must still be learned, once (a retry with the same idempotency key
included). Until 2026-12-06 (an audit) such a retry was a duplicate and the feedback was never learned.

The contention is forced, not raced: another connection holds ``BEGIN IMMEDIATE`` from the moment the maker asks for
its write lock to learn, until that attempt has failed.
"""

from __future__ import annotations

import contextlib
import sqlite3
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlfb import FeedbackEnsemble
from rlfb.errors import StoreBusyError
from rlfb.store import FeedbackStore

from _corpus import IDS, TEXTS
from _warned import noted


def _ensemble(store: Any, **kw: Any) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=store, policy="thompson", **kw)


class _Blocker:
    """Arm it, and the next write lock ``store`` asks for finds another connection holding the file's."""

    def __init__(self, path: Path, store: FeedbackStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.armed = 0
        self.blocked = 0
        original = store.exclusive

        @contextlib.contextmanager
        def exclusive() -> Iterator[FeedbackStore]:
            if not self.armed:
                with original() as s:
                    yield s
                return
            self.armed -= 1
            self.blocked += 1
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                with original() as s:
                    yield s
            finally:
                self.conn.execute("COMMIT")

        monkeypatch.setattr(store, "exclusive", exclusive)


@pytest.fixture()
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, FeedbackEnsemble, Any, _Blocker]]:
    path = tmp_path / "fb.db"
    maker = _ensemble(FeedbackStore(path, busy_timeout=0.01))  # logs the retrievals and learns their feedback
    other = _ensemble(FeedbackStore(path))  # feedback arrives through this handle
    blocker = _Blocker(path, maker.store, monkeypatch)
    yield path, maker, other, blocker
    blocker.conn.close()
    for e in (maker, other):
        e.close()


def _rows(store: FeedbackStore, key: str) -> int:
    return store.db.execute("SELECT count(*) FROM feedback WHERE idempotency_key = ?", [key]).fetchone()[0]


def test_a_retry_with_the_same_key_learns_feedback_stored_before_a_busy_error(pair: Any) -> None:
    path, maker, other, blocker = pair
    r = maker.retrieve("what causes the tides", k=3)
    blocker.armed = 2  # the first try, and its first retry, find the lock taken after the row is committed
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught, pytest.raises(StoreBusyError) as err:
            warnings.simplefilter("always")
            other.feedback(r.event_id, "thumbs_up", idempotency_key="k1")
        assert _rows(other.store, "k1") == 1  # stored all the same
        assert maker.learner.n_learned == 0
    assert "stored but not learned" in noted(err.value, caught)
    assert blocker.blocked == 2
    again = other.feedback(r.event_id, "thumbs_up", idempotency_key="k1")
    assert again.duplicate
    assert maker.learner.n_learned == 1
    other.feedback(r.event_id, "thumbs_up", idempotency_key="k1")  # learned once, however often it is retried
    maker.flush()
    assert maker.learner.n_learned == 1
    assert _rows(other.store, "k1") == 1
    fresh = _ensemble(str(path))
    assert fresh.learner.n_learned == 1
    fresh.close()


def test_feedback_stored_before_a_busy_error_is_learned_at_the_makers_next_feedback(pair: Any) -> None:
    path, maker, other, blocker = pair
    r1 = maker.retrieve("what causes the tides", k=3)
    r2 = maker.retrieve("why do volcanoes erupt", k=3)
    blocker.armed = 1
    with warnings.catch_warnings(record=True) as caught, pytest.raises(StoreBusyError) as err:
        warnings.simplefilter("always")
        other.feedback(r1.event_id, "thumbs_up", chunk_id=r1.hits[0].chunk_id)  # no key, and never retried
    assert "stored but not learned" in noted(err.value, caught)
    assert maker.learner.n_learned == 0
    other.feedback(r2.event_id, "thumbs_down")
    assert maker.learner.n_learned == 2
    # a retry without a key, after that: a repeat of the row learned, stored and not learned again
    other.feedback(r1.event_id, "thumbs_up", chunk_id=r1.hits[0].chunk_id)
    maker.feedback(r2.event_id, "thumbs_up")  # through the maker's own handle: nothing is pending any more
    assert maker.learner.n_learned == 3
    maker.flush()
    fresh = _ensemble(str(path))
    assert fresh.learner.n_learned == 3
    fresh.close()


def test_run_feedback_stored_before_a_busy_error_is_kept_and_learned_once_at_its_retry(pair: Any) -> None:
    # the adapters' path (rlfb.runs.record_run_feedback, by run id, on a handle of their own): the error had no
    # note, the row was not kept, and the retry, a duplicate, learned nothing until a later retrieval
    from rlfb.runs import record_run_feedback

    path, maker, other, blocker = pair
    r = maker.retrieve("what causes the tides", k=3)
    blocker.armed = 1
    with warnings.catch_warnings(record=True) as caught, pytest.raises(StoreBusyError) as err:
        warnings.simplefilter("always")
        record_run_feedback(other.store, r.event_id, signal="thumbs_up", idempotency_key="k1")
    assert "stored but not learned" in noted(err.value, caught)
    assert _rows(other.store, "k1:" + r.event_id) == 1 and maker.learner.n_learned == 0
    (again,) = record_run_feedback(other.store, r.event_id, signal="thumbs_up", idempotency_key="k1")
    assert again.duplicate and maker.learner.n_learned == 1
    record_run_feedback(other.store, r.event_id, signal="thumbs_up", idempotency_key="k1")
    maker.flush()
    assert maker.learner.n_learned == 1
    fresh = _ensemble(str(path))
    assert fresh.learner.n_learned == 1
    fresh.close()


def test_run_feedback_on_two_retrievals_keeps_both_rows_when_the_learning_meets_a_busy_store(pair: Any) -> None:
    # one chain run that made two retrievals: the first retrieval's learning failed and was raised at once, so the
    # second retrieval's row, committed with it, was not learned either, nor kept
    from rlfb.runs import record_run_feedback

    path, maker, other, blocker = pair
    maker.retrieve("what causes the tides", k=3, parent_id="chain-run")
    maker.retrieve("why do volcanoes erupt", k=3, parent_id="chain-run")
    blocker.armed = 1
    with warnings.catch_warnings(record=True) as caught, pytest.raises(StoreBusyError) as err:
        warnings.simplefilter("always")
        record_run_feedback(other.store, "chain-run", signal="thumbs_up", idempotency_key="k1")
    assert "stored but not learned" in noted(err.value, caught)
    # the second retrieval's learning got the lock, and learned the first's row, kept, before its own
    assert maker.learner.n_learned == 2
    records = record_run_feedback(other.store, "chain-run", signal="thumbs_up", idempotency_key="k1")
    assert all(r.duplicate for r in records) and maker.learner.n_learned == 2
    maker.flush()
    fresh = _ensemble(str(path))
    assert fresh.learner.n_learned == 2
    fresh.close()
