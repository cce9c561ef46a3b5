"""Feedback on a store whose disk fills up while it is written (SQLite's own limit on the file's pages, a real
SQLITE_FULL): a named error, nothing stored, and a retry with the same idempotency key learned once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlfb import FeedbackEnsemble
from rlfb.errors import StoreFullError

TEXTS = [f"document number {i} about topic {i % 7} and things {i * 3}" for i in range(200)]
QUESTION = "topic 3 things"


def _learned_once(tmp_path: Path, name: str, *, warm: bool, fill: bool) -> tuple[float, float, int]:
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(tmp_path / f"{name}.db"),
                                      policy="thompson", seed=0)
    if warm:  # a snapshot written before: the learner's state is learned on top of it
        first = ens.retrieve("number 5 document", k=5, session_id="s0", timestamp=1_700_000_000.0)
        ens.feedback(first.event_id, "implicit_positive", chunk_id=first.hits[0].chunk_id,
                     timestamp=1_700_000_010.0)
    result = ens.retrieve(QUESTION, k=5, session_id="s1", timestamp=1_700_000_100.0)
    chunk = result.hits[1].chunk_id
    if fill:
        db = ens.store.db
        db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
        # it raised sqlite3.OperationalError "no such savepoint": SQLite had rolled the whole write back itself
        with pytest.raises(StoreFullError):
            ens.feedback(result.event_id, "implicit_positive", chunk_id=chunk, idempotency_key="k1",
                         timestamp=1_700_000_110.0)
        db.execute("PRAGMA max_page_count = 1073741823")
        assert ens.store.counts()["feedback"] == int(warm)  # nothing of it stored
    ens.feedback(result.event_id, "implicit_positive", chunk_id=chunk, idempotency_key="k1",
                 timestamp=1_700_000_110.0)
    memory = float(ens.learner.memory.score(QUESTION, None, (chunk,), touch=False)[0])
    confidence = float(ens.learner.confidence.read((chunk,))[0][0])
    n = ens.store.counts()["feedback"]
    ens.close()
    return memory, confidence, n


@pytest.mark.parametrize("warm", [False, True], ids=["first feedback", "after a snapshot"])
def test_feedback_refused_by_a_full_disk_is_learned_once_when_retried(tmp_path: Path, warm: bool) -> None:
    """The in-memory learner kept what it learned from feedback whose row a full disk rolled back, so the retry
    with the same idempotency key was learned twice (the memory's evidence for the chunk about doubled)."""
    clean = _learned_once(tmp_path, "clean", warm=warm, fill=False)
    retried = _learned_once(tmp_path, "retried", warm=warm, fill=True)
    assert retried[2] == clean[2] == 1 + int(warm)
    np.testing.assert_allclose(retried[:2], clean[:2], rtol=1e-9)
