"""Feedback learned and not yet written in a snapshot (``persist_interval`` above 0) is "held" in the store
(``feedback.learned = 2``, schema step m013), and marked learned by the snapshot that writes it.

Before, such a row was marked learned when it was learned: a process killed before its next snapshot lost that
learning, and a restart did not learn the row again, so the feedback was stored and never learned. Now the next
ensemble to start learns the held rows it finds; one that holds them and is still running leaves out of its
unwritten learning those another has taken, so that each row is learned once.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _restarts import bm25_ensemble, newest_n_learned, retrieved_before_a_restart

from rlfb.cli import main
from rlfb.store import FeedbackStore

TESTS = Path(__file__).resolve().parent


def _killed_holding_one(path: Path, r: Any) -> None:
    """A process at ``persist_interval=3600`` clicks two of retrieval ``r``'s hits and is killed: the first click
    is written (its first snapshot), the second held."""
    child = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(TESTS)!r})
        from _restarts import bm25_ensemble
        ens = bm25_ensemble({str(path)!r}, persist_interval=3600.0)
        ens.feedback({r.event_id!r}, "click", chunk_id={r.hits[0].chunk_id!r})  # written
        ens.feedback({r.event_id!r}, "click", chunk_id={r.hits[1].chunk_id!r})  # held
        os._exit(9)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert done.returncode == 9, done.stderr


def test_feedback_learned_by_a_process_killed_before_its_snapshot_is_learned_after_the_restart(
        tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "fb.db"
    child = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(TESTS)!r})
        from _restarts import bm25_ensemble
        ens = bm25_ensemble({str(path)!r}, persist_interval=3600.0)
        r = ens.retrieve("what causes the tides", k=3)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # the first snapshot: written at once
        ens.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)  # learned, its snapshot an hour away
        assert ens.learner.n_learned == 2
        os._exit(9)  # killed: no flush, no exit hook
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert done.returncode == 9, done.stderr
    assert newest_n_learned(path) == 1
    with sqlite3.connect(path) as raw:
        first, second = (fid for (fid,) in raw.execute("SELECT id FROM feedback ORDER BY id"))
    raw.close()
    with FeedbackStore(path) as store:
        assert store.feedback_learned(first) is True
        assert store.feedback_learned(second) is None  # held: its learning died with the process
        assert [r.feedback_id for r in store.unlearned_feedback(held=True)] == [second]
        assert store.unlearned_feedback() == []  # not owed to a running ensemble's next look
        assert store.counts()["held"] == 1
    assert main(["store", "stats", str(path)]) == 0
    assert re.search(r"held unwritten +1\n", capsys.readouterr().out)
    again = bm25_ensemble(path)
    again.retrieve("aurora", k=2)  # its first look takes the held row
    assert again.learner.n_learned == 2
    again.close()
    assert newest_n_learned(path) == 2
    with FeedbackStore(path) as store:
        assert store.feedback_learned(second) is True and store.counts()["held"] == 0
    third = bm25_ensemble(path)  # once
    third.retrieve("aurora", k=2)
    assert third.learner.n_learned == 2
    third.close()


def test_held_rows_are_marked_learned_by_the_snapshot_that_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    ens = bm25_ensemble(path, persist_interval=3600.0)
    r = ens.retrieve("what causes the tides", k=3)
    first = ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    second = ens.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)
    third = ens.feedback(r.event_id, "thumbs_up")
    store = ens.store
    assert store.feedback_learned(first.feedback_id) is True  # the first snapshot is written at once
    assert store.feedback_learned(second.feedback_id) is None and store.feedback_learned(third.feedback_id) is None
    assert store.counts()["held"] == 2 and newest_n_learned(path) == 1
    ens.flush()
    assert newest_n_learned(path) == 3
    assert store.feedback_learned(second.feedback_id) is True and store.feedback_learned(third.feedback_id) is True
    assert store.counts()["held"] == 0
    ens.close()


def test_a_held_row_pruned_before_its_snapshot_does_not_stop_the_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    ens = bm25_ensemble(path, persist_interval=3600.0)
    r = ens.retrieve("what causes the tides", k=3)
    ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # written at once
    ens.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)  # held
    # another process prunes the retrieval, its feedback with it (as `prune` does, by the foreign keys' cascade)
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA foreign_keys = ON")
        raw.execute("DELETE FROM events WHERE id = ?", (r.event_id,))
    raw.close()
    with FeedbackStore(path) as other:
        assert other.counts()["feedback"] == 0
    ens.flush()  # the snapshot holds the learning; the row it would mark is gone
    assert newest_n_learned(path) == 2 and ens.store.counts()["held"] == 0
    ens.close()


def test_the_default_persist_interval_marks_learned_at_once_and_holds_nothing(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    ens = bm25_ensemble(path)
    r = ens.retrieve("what causes the tides", k=3)
    for hit in r.hits:
        rec = ens.feedback(r.event_id, "click", chunk_id=hit.chunk_id)
        assert ens.store.feedback_learned(rec.feedback_id) is True
    assert ens.store.counts()["held"] == 0
    ens.close()


def test_an_ensemble_started_meanwhile_takes_held_rows_and_their_holder_leaves_them_out(tmp_path: Path) -> None:
    # a second worker starting while the first holds rows cannot tell it from the restart of a killed one: it
    # learns them, and the first, loading its snapshot, does not learn them a second time on top of it
    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    a = bm25_ensemble(path, persist_interval=3600.0)
    a.retrieve("aurora", k=2)
    a.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # written: a's first snapshot
    held = a.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)
    assert a.learner.n_learned == 2 and a.store.feedback_learned(held.feedback_id) is None
    b = bm25_ensemble(path)
    b.retrieve("aurora", k=2)
    assert b.learner.n_learned == 2  # a's snapshot, and the row a held
    assert b.store.feedback_learned(held.feedback_id) is True
    a.retrieve("aurora", k=2)  # a loads b's snapshot, without learning the row again on it
    assert a.learner.n_learned == 2
    a.feedback(r.event_id, "click", chunk_id=r.hits[2].chunk_id)
    a.close()
    b.close()
    assert newest_n_learned(path) == 3


@pytest.mark.parametrize("owed_at_start", [0, 1])
def test_a_running_ensemble_leaves_the_rows_another_holds_to_it(tmp_path: Path, owed_at_start: int) -> None:
    # only the looks from an ensemble's start take held rows, whether its first look found rows owed or none:
    # later ones would take a live worker's every time
    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    with FeedbackStore(path) as store:  # rows owed, which b's first look learns
        for _ in range(owed_at_start):
            store.record_feedback(r.event_id, "thumbs_up")
    b = bm25_ensemble(path)
    b.retrieve("aurora", k=2)  # its looks from its start are done
    assert b.learner.n_learned == owed_at_start
    a = bm25_ensemble(path, persist_interval=3600.0)
    a.retrieve("aurora", k=2)
    a.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # written: a's first snapshot
    held = a.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)
    b.retrieve("aurora", k=2)  # refresh_interval 0: it loads a's snapshot and looks again
    assert b.learner.n_learned == owed_at_start + 1 and b.store.feedback_learned(held.feedback_id) is None
    a.close()
    b.retrieve("aurora", k=2)
    assert b.learner.n_learned == owed_at_start + 2 and b.store.feedback_learned(held.feedback_id) is True
    b.close()


def test_an_ensemble_does_not_take_its_own_held_rows_again(tmp_path: Path, monkeypatch: Any) -> None:
    # its looks from its start take held rows while each finds a whole batch (a backlog): one of them then finds
    # a row it holds itself, on the decision of an ensemble gone since
    from rlfb import feedback_learning

    monkeypatch.setattr(feedback_learning, "CATCH_UP_BATCH", 1)
    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    with FeedbackStore(path) as store:  # a feedback service of its own: a row owed
        store.record_feedback(r.event_id, "thumbs_down")
    ens = bm25_ensemble(path, persist_interval=3600.0)
    ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # its first snapshot; then the owed row
    assert ens.learner.n_learned == 2
    held = ens.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)  # held; the next look finds it
    assert ens.store.feedback_learned(held.feedback_id) is None
    assert ens.learner.n_learned == 3
    ens.retrieve("aurora", k=2)
    assert ens.learner.n_learned == 3
    ens.close()
    assert newest_n_learned(path) == 3


def test_held_feedback_rolled_back_with_a_callers_block_is_learned_once_at_its_retry(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    ens = bm25_ensemble(path, persist_interval=3600.0)
    r = ens.retrieve("what causes the tides", k=3)
    ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # the first snapshot
    with pytest.raises(RuntimeError), ens.store.exclusive():
        ens.feedback(r.event_id, "thumbs_up", idempotency_key="k1")
        assert ens.learner.n_learned == 2
        raise RuntimeError("the caller's block fails")
    assert ens.learner.n_learned == 1 and ens.store.counts()["held"] == 0
    retry = ens.feedback(r.event_id, "thumbs_up", idempotency_key="k1")
    assert ens.learner.n_learned == 2 and ens.store.feedback_learned(retry.feedback_id) is None
    ens.flush()
    assert ens.store.feedback_learned(retry.feedback_id) is True and newest_n_learned(path) == 2
    ens.close()


def test_held_marks_are_checked_at_the_boundary(tmp_path: Path) -> None:
    from rlfb.errors import ValidationError

    with FeedbackStore(tmp_path / "fb.db") as store:
        eid = store.log_event("q", {"weights": {"bm25": 1.0}, "policy": "thompson"}, [{"chunk_id": "a"}])
        rec = store.record_feedback(eid, "thumbs_up")
        with pytest.raises(ValidationError, match="learned must be True"):
            store.mark_learned(rec.feedback_id, False, held=True)
        with pytest.raises(ValidationError, match="held must be True or False"):
            store.mark_learned(rec.feedback_id, held="yes")  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="held must be True or False"):
            store.unlearned_feedback(held=1)  # type: ignore[arg-type]
        assert store.feedback_learned(rec.feedback_id) is None


def test_a_snapshot_whose_commit_fails_leaves_its_rows_held_and_written_later(tmp_path: Path) -> None:
    # flush's snapshot and marks undone (a full disk when the commit writes them): the bookkeeping said written,
    # the rows stayed held while the next snapshot wrote their learning unmarked, and the next ensemble to start
    # learned them again (an audit: 3 feedbacks, 4 learned)
    from rlfb.errors import StoreFullError

    path = tmp_path / "fb.db"
    ens = bm25_ensemble(path, persist_interval=3600.0)
    r = ens.retrieve("what causes the tides", k=3)
    ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # the first snapshot
    held = ens.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)
    tx = ens.store._tx
    check_file = tx.check_file  # the last step before the commit, inside the same try

    def full_once() -> None:
        tx.check_file = check_file
        raise StoreFullError("database or disk is full")

    tx.check_file = full_once
    with pytest.raises(StoreFullError):
        ens.flush()
    assert newest_n_learned(path) == 1 and ens.store.counts()["held"] == 1
    ens.feedback(r.event_id, "click", chunk_id=r.hits[2].chunk_id)
    ens.close()
    assert newest_n_learned(path) == 3
    with FeedbackStore(path) as store:
        assert store.feedback_learned(held.feedback_id) is True and store.counts()["held"] == 0
    again = bm25_ensemble(path)
    again.retrieve("aurora", k=2)
    assert again.learner.n_learned == 3  # nothing left to learn a second time
    again.close()


def test_held_rows_a_start_could_not_take_are_taken_at_its_next_look(tmp_path: Path) -> None:
    # the first look found a killed process's held row and could not take the write lock (another writer): it
    # had stopped taking held rows already, so the warning's "tried again" was not so for them
    import warnings

    from rlfb import FeedbackEnsemble

    from _corpus import IDS, TEXTS

    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    _killed_holding_one(path, r)
    with FeedbackStore(path) as store:
        (held,) = store.unlearned_feedback(held=True)
    starter = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="thompson",
                                          refresh_interval=0.0, store=FeedbackStore(path, busy_timeout=0.05))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process writing for longer than busy_timeout
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        starter.retrieve("glacier", k=2, log=False)
    assert any("tried again" in str(w.message) for w in caught)
    holder.execute("ROLLBACK")
    holder.close()
    starter.retrieve("glacier", k=2)
    assert starter.learner.n_learned == 2 and starter.store.feedback_learned(held.feedback_id) is True
    starter.close()


def test_a_store_of_the_users_own_without_held_marks_is_marked_as_before(tmp_path: Path) -> None:
    # written against the protocol before held marks: mark_learned and unlearned_feedback take no held
    from rlfb import FeedbackEnsemble

    from _corpus import IDS, TEXTS

    class OlderStore(FeedbackStore):
        def mark_learned(self, feedback_id: int, learned: bool = True) -> None:  # type: ignore[override]
            super().mark_learned(feedback_id, learned)

        def unlearned_feedback(self, *, after: int = 0, policy: str | None = None,  # type: ignore[override]
                               limit: int | None = None) -> Any:
            return super().unlearned_feedback(after=after, policy=policy, limit=limit)

    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    with FeedbackStore(path) as store:
        owed = store.record_feedback(r.event_id, "thumbs_up")
    for interval in (0.0, 3600.0):
        ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="thompson",
                                          store=OlderStore(path), persist_interval=interval)
        own = ens.retrieve("volcano", k=2)  # at 0, the look learns the owed row
        first = ens.feedback(own.event_id, "thumbs_up")
        second = ens.feedback(own.event_id, "thumbs_down")
        assert ens.store.feedback_learned(owed.feedback_id) is True
        assert ens.store.feedback_learned(first.feedback_id) is True
        assert ens.store.feedback_learned(second.feedback_id) is True  # marked when learned, as before
        ens.close()


def test_owed_and_held_rows_are_listed_together_oldest_first_within_the_limit(tmp_path: Path) -> None:
    with FeedbackStore(tmp_path / "fb.db") as store:
        eid = store.log_event("q", {"weights": {"bm25": 1.0}, "policy": "thompson"}, [{"chunk_id": "a"}])
        rows = [store.record_feedback(eid, "thumbs_up", idempotency_key=f"k{i}").feedback_id for i in range(6)]
        for fid in rows[1::2]:
            store.mark_learned(fid, held=True)
        store.mark_learned(rows[4])
        listed = store.unlearned_feedback(held=True, limit=3)
        assert [r.feedback_id for r in listed] == [rows[0], rows[1], rows[2]]
        assert [r.feedback_id for r in store.unlearned_feedback(held=True, after=rows[2])] == [rows[3], rows[5]]
        assert [r.feedback_id for r in store.unlearned_feedback()] == [rows[0], rows[2]]
        assert [r.feedback_id for r in store.unlearned_feedback(held=True, policy="gradient")] == []


def test_a_look_that_learns_nothing_writes_on_top_of_the_newest_snapshot(tmp_path: Path, monkeypatch: Any) -> None:
    # a look whose rows were all repeats learned nothing, so read no newer snapshot under its lock, and its
    # snapshot, due by then, replaced another process's newer one (an audit: 3 feedbacks, 2 kept)
    import time
    import types

    import rlfb.ensemble

    now = [1000.0]
    clock = types.SimpleNamespace(monotonic=lambda: now[0], time=time.time, perf_counter=time.perf_counter)
    monkeypatch.setattr(rlfb.ensemble, "time", clock)
    path = tmp_path / "fb.db"
    a = bm25_ensemble(path, persist_interval=100.0, refresh_interval=3600.0)
    b = bm25_ensemble(path)
    r = a.retrieve("what causes the tides", k=3)
    b.retrieve("aurora", k=2)
    a.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # a's first snapshot
    a.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)  # held by a
    rb = b.retrieve("volcano magma", k=3)
    b.feedback(rb.event_id, "thumbs_up")  # b writes a's first and its own
    assert newest_n_learned(path) == 2
    now[0] += 200.0  # a's snapshot is due
    with FeedbackStore(path) as store:  # a double click stored alone: owed, and a repeat
        store.record_feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    a.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)  # a repeat too; then a's look at the owed row
    assert newest_n_learned(path) == 3
    a.close()
    b.close()
    assert newest_n_learned(path) == 3


def test_run_feedback_takes_a_killed_processs_held_rows_without_a_retrieval(tmp_path: Path) -> None:
    # a feedback endpoint (the adapters' handlers give feedback by run id: rlfb.runs.record_run_feedback) that
    # never retrieves: it learned its own feedback and none of the rows owed or held, which the warnings said it
    # would at its next feedback
    from rlfb.runs import record_run_feedback

    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    _killed_holding_one(path, r)
    endpoint = bm25_ensemble(path)
    record_run_feedback(endpoint.store, r.event_id, ensemble=endpoint, signal="thumbs_up")
    assert endpoint.learner.n_learned == 3
    assert endpoint.store.counts()["held"] == 0 and endpoint.store.counts()["unlearned"] == 0
    endpoint.close()
    assert newest_n_learned(path) == 3
