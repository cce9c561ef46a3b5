"""Feedback learned before an ensemble's first snapshot (``persist_interval`` above 0): what a rollback goes
back to is the learner's state copied once, not a copy taken at every feedback."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from rlfb import FeedbackEnsemble, snapshot_sync
from rlfb.errors import StoreFullError
from rlfb.learner import Learner

TEXTS = [f"document number {i} about topic {i % 7} and things {i * 3}" for i in range(200)]
QUESTIONS = ["topic 3 things", "number 5 document", "topic 6 about", "things 30"]
T0 = 1_700_000_000.0


def _ensemble(tmp_path: Path, name: str) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(tmp_path / f"{name}.db"),
                                       policy="thompson", seed=0, persist_interval=math.inf)


def _fill(conn: sqlite3.Connection) -> None:
    """SQLite's own limit on the file's pages, at the pages it has, and their free space filled: the next write
    fails with a real SQLITE_FULL."""
    conn.execute("CREATE TABLE IF NOT EXISTS filler (x BLOB)")
    conn.commit()
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
    for size in (4096, 512, 64, 8, 1):
        try:
            while True:
                conn.execute("INSERT INTO filler VALUES (zeroblob(?))", (size,))
                conn.commit()
        except sqlite3.OperationalError as exc:
            assert "full" in str(exc)
            conn.rollback()


def _run(tmp_path: Path, name: str, *, failures: int) -> tuple[np.ndarray, int]:
    """Feedback on twelve retrievals, written as a snapshot only at the twelfth (``MAX_UNSAVED``, patched to
    12); that write first meets a full disk ``failures`` times, after the feedback was learned."""
    ens = _ensemble(tmp_path, name)
    chunks = []
    for i in range(12):
        t = T0 + 100 * i
        result = ens.retrieve(QUESTIONS[i % 4], k=5, session_id=f"s{i}", timestamp=t)
        chunk = result.hits[i % 3].chunk_id
        chunks.append(chunk)
        if i == 11 and failures:
            _fill(ens.store.db.conn)
            for _ in range(failures):  # the second goes back to the same copy, after learning again on it
                with pytest.raises(StoreFullError):
                    ens.feedback(result.event_id, "implicit_positive", chunk_id=chunk, idempotency_key=f"k{i}",
                                 timestamp=t + 10)
                assert ens.store.counts()["policy_snapshots"] == 0
            ens.store.db.conn.execute("DROP TABLE filler")
            ens.store.db.conn.commit()
            ens.store.db.conn.execute("PRAGMA max_page_count = 1073741823")
        ens.feedback(result.event_id, "implicit_positive", chunk_id=chunk, idempotency_key=f"k{i}",
                     timestamp=t + 10)
    assert ens.store.counts()["policy_snapshots"] == 1 and ens.store.counts()["feedback"] == 12
    learned = np.array([ens.learner.memory.score(q, None, tuple(chunks), touch=False) for q in QUESTIONS])
    n = ens.learner.n_learned
    ens.close()
    return learned, n


@pytest.mark.parametrize("failures", [1, 2])
def test_feedback_rolled_back_before_the_first_snapshot_is_learned_once_when_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: int
) -> None:
    # the learning is taken back to the state copied before the first feedback, and the eleven unwritten
    # episodes learned again on it; the copy is kept as JSON text, so learning on a loaded copy leaves it as it was
    monkeypatch.setattr(snapshot_sync, "MAX_UNSAVED", 12)
    clean = _run(tmp_path, "clean", failures=0)
    retried = _run(tmp_path, f"retried{failures}", failures=failures)
    assert retried[1] == clean[1] == 12
    np.testing.assert_allclose(retried[0], clean[0], rtol=1e-9)


def test_the_state_is_copied_once_before_the_first_snapshot_not_at_every_feedback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a copy at every feedback until the first snapshot (up to 1,000 episodes) made the simulator 50 % slower
    ens = _ensemble(tmp_path, "count")
    copies = 0
    state_dict = type(ens.learner).state_dict

    def counted(self: Learner) -> dict:
        nonlocal copies
        copies += 1
        return state_dict(self)

    monkeypatch.setattr(type(ens.learner), "state_dict", counted)
    for i in range(20):
        result = ens.retrieve(QUESTIONS[i % 4], k=5, session_id=f"s{i}", timestamp=T0 + 100 * i)
        ens.feedback(result.event_id, "implicit_positive", chunk_id=result.hits[0].chunk_id,
                     timestamp=T0 + 100 * i + 10)
    assert copies == 1
    monkeypatch.undo()
    ens.close()
