"""Feedback ids are never given twice: a prune that deletes the newest rows leaves their ids used.

A running ensemble catches up the feedback stored without it (another process's, a feedback service's) by id,
above the highest it has looked at. After a prune had deleted the newest feedback rows, the next rows were
given their ids again, and the running ensemble never looked at them until it restarted.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from _restarts import bm25_ensemble, newest_n_learned

from rlfb.store import FeedbackStore


def test_feedback_stored_after_a_prune_of_the_newest_rows_is_caught_up_by_a_running_ensemble(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    live = bm25_ensemble(path)
    first = live.retrieve("what causes the tides", k=3)
    assert first.event_id is not None
    with FeedbackStore(path) as service:  # a feedback service of its own, which learns nothing
        stored = service.record_feedback(first.event_id, "click", chunk_id=first.chunk_ids[0])
    live.retrieve("volcanoes", k=3)  # its refresh catches that row up
    assert live.learner.n_learned == 1 and newest_n_learned(path) == 1
    later = time.time() + 400 * 86_400.0  # every event so far is older than the retention then
    with FeedbackStore(path, clock=lambda: later) as service:
        pruned = service.prune(retention=service.attribution_window)
        assert pruned["feedback"] == 1 and service.counts()["feedback"] == 0
    second = live.retrieve("the aurora borealis", k=3)
    assert second.event_id is not None
    with FeedbackStore(path) as service:
        again = service.record_feedback(second.event_id, "click", chunk_id=second.chunk_ids[0])
        assert again.feedback_id > stored.feedback_id  # it was given id 1 again
    live.retrieve("volcanoes", k=3)
    assert live.learner.n_learned == 2  # it looked above id 1 only, and never learned the row
    with FeedbackStore(path) as store:
        assert store.feedback_learned(again.feedback_id) is True and store.counts()["unlearned"] == 0
    live.close()


def test_the_next_feedback_id_stays_above_every_pruned_row_across_prunes(tmp_path: Path) -> None:
    # what the prune keeps is a floor, never lowered: a second prune of an emptied table keeps it, and rows
    # above it (written after) still count
    now = [time.time()]
    store = FeedbackStore(tmp_path / "fb.db", clock=lambda: now[0])
    eid = store.log_event("tides", {"weights": {"bm25": 1.0}}, [{"chunk_id": "a"}])
    ids = [store.record_feedback(eid, "click", chunk_id="a").feedback_id for _ in range(3)]
    assert ids == [1, 2, 3]
    now[0] += 400 * 86_400.0
    assert store.prune(retention=store.attribution_window)["feedback"] == 3
    assert store.prune(retention=store.attribution_window)["feedback"] == 0
    eid = store.log_event("aurora", {"weights": {"bm25": 1.0}}, [{"chunk_id": "b"}])
    assert store.record_feedback(eid, "click", chunk_id="b").feedback_id == 4
    assert store.record_feedback(eid, "thumbs_up").feedback_id == 5
    store.close()


@pytest.mark.parametrize("kept", ["abc", "12.9", "-5", str(2**63 - 1), str(2**70)])
def test_a_kept_id_edited_by_hand_into_no_usable_id_leaves_the_tables_ids(tmp_path: Path, kept: str) -> None:
    store = FeedbackStore(tmp_path / "fb.db")
    eid = store.log_event("tides", {"weights": {"bm25": 1.0}}, [{"chunk_id": "a"}])
    store.record_feedback(eid, "click", chunk_id="a")
    with sqlite3.connect(tmp_path / "fb.db") as conn:
        conn.execute("INSERT INTO settings (key, value) VALUES ('feedback_id_high', ?)", (kept,))
    assert store.record_feedback(eid, "thumbs_up").feedback_id == 2
    store.close()
