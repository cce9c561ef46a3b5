"""Feedback stored and not learned is learned later: each feedback row says whether a learner took it
(``feedback.learned``, schema step m012), and an ensemble learns the rows owed on its decisions at its next
refresh or feedback (:func:`rlfb.feedback_learning.catch_up`).

Before, such feedback was stored and never learned: a process killed between storing feedback and learning it,
feedback given while the newest snapshot was damaged, on the decisions of a policy no app was running, or
stored with ``FeedbackStore.record_feedback`` alone (and the same feedback given again through the ensemble was
then taken for its repeat: learned by neither).
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
from _damage import damage_newest_snapshot
from _restarts import bm25_ensemble, newest_n_learned, retrieved_before_a_restart

from rlfb import FeedbackEnsemble
from rlfb.cli import main
from rlfb.errors import CorruptStateError
from rlfb.store import MIGRATIONS, FeedbackStore

from _corpus import IDS, TEXTS


def test_feedback_stored_alone_is_learned_once_by_the_next_ensemble_of_its_policy(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    with FeedbackStore(path) as store:  # a feedback service of its own, writing to the app's file
        rec = store.record_feedback(r.event_id, "thumbs_up", chunk_id=r.hits[0].chunk_id)
        assert store.feedback_learned(rec.feedback_id) is None
        assert [x.feedback_id for x in store.unlearned_feedback()] == [rec.feedback_id]
        assert store.unlearned_feedback(policy="gradient") == []
        assert store.unlearned_feedback(after=rec.feedback_id) == []
        assert store.counts()["unlearned"] == 1
    assert main(["store", "stats", str(path)]) == 0
    assert re.search(r"not learned yet +1\n", capsys.readouterr().out)
    again = bm25_ensemble(path)
    assert again.learner.n_learned == 0  # not while it is built: a load may still replace its state
    again.retrieve("volcano lava", k=2)
    assert again.learner.n_learned == 1
    again.retrieve("volcano lava", k=2)
    again.close()
    assert newest_n_learned(path) == 1
    with FeedbackStore(path) as store:
        assert store.feedback_learned(rec.feedback_id) is True and store.unlearned_feedback() == []
        assert store.counts()["unlearned"] == 0
    assert main(["store", "stats", str(path)]) == 0
    assert "not learned yet" not in capsys.readouterr().out
    third = bm25_ensemble(path)  # a restart learns it no second time
    third.retrieve("volcano lava", k=2)
    assert third.learner.n_learned == 1
    third.close()


def test_feedback_of_a_process_killed_before_it_learned_is_learned_after_the_restart(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    child = textwrap.dedent(f"""
        import os
        from rlfb.store import FeedbackStore
        store = FeedbackStore({str(path)!r})
        store.record_feedback({r.event_id!r}, "thumbs_up")
        os._exit(9)  # killed before any learner took it
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert done.returncode == 9, done.stderr
    again = bm25_ensemble(path)
    r2 = again.retrieve("aurora", k=2)
    assert again.learner.n_learned == 1
    again.feedback(r2.event_id, "thumbs_down")  # its own feedback as before
    assert again.learner.n_learned == 2
    again.close()
    assert newest_n_learned(path) == 2


def test_the_same_feedback_stored_alone_then_given_to_the_ensemble_is_learned_once(tmp_path: Path) -> None:
    # the second is a repeat of the first (a double click): before, the first was never learned and the second
    # was taken for its repeat, so neither was
    path = tmp_path / "fb.db"
    ens = bm25_ensemble(path, refresh_interval=3600.0)
    ens.retrieve("glacier ice", k=2)  # its first look is done: the next refresh is an hour away
    r = ens.retrieve("what causes the tides", k=3)
    with FeedbackStore(path) as store:
        first = store.record_feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id, session_id="s")
    second = ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id, session_id="s")
    assert ens.learner.n_learned == 1
    store = ens.store
    assert store.feedback_learned(first.feedback_id) is True
    assert store.feedback_learned(second.feedback_id) is False  # a repeat: nothing to learn
    ens.close()


def test_feedback_on_a_policy_no_app_was_running_is_learned_when_one_starts(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)  # by a thompson app
    gradient = bm25_ensemble(path, policy="gradient")
    gradient.feedback(r.event_id, "thumbs_up")  # not its decision: stored, and not learned by it
    gradient.retrieve("aurora", k=2)
    assert gradient.learner.n_learned == 0
    gradient.close()
    again = bm25_ensemble(path)
    again.retrieve("aurora", k=2)
    assert again.learner.n_learned == 1
    again.close()


def test_feedback_given_while_the_newest_snapshot_is_damaged_is_learned_once_it_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    ens = bm25_ensemble(path)
    for _ in range(2):
        r = ens.retrieve("aurora", k=2)
        ens.feedback(r.event_id, "thumbs_up")
    ens.close()
    newest = damage_newest_snapshot(path)
    with FeedbackStore(path) as store:
        lost = store.record_feedback(r.event_id, "thumbs_down", idempotency_key="k1")
        assert store.drop_snapshot(newest)
        again = store.record_feedback(r.event_id, "thumbs_down", idempotency_key="k1")  # the client's retry
        assert again.duplicate and again.feedback_id == lost.feedback_id
    ens = bm25_ensemble(path)
    assert ens.learner.n_learned == 1  # the snapshot before the damaged one
    ens.retrieve("aurora", k=2)
    assert ens.learner.n_learned == 2  # and the feedback stored meanwhile
    ens.close()
    with FeedbackStore(path) as store:
        assert store.feedback_learned(lost.feedback_id) is True


def test_damage_stops_the_catching_up_and_it_goes_on_after_the_drop(tmp_path: Path) -> None:
    # a row owed is not passed over while the snapshot is damaged: a running ensemble learns it after the drop
    path = tmp_path / "fb.db"
    ens = bm25_ensemble(path, refresh_interval=3600.0)
    r = ens.retrieve("aurora", k=2)
    ens.feedback(r.event_id, "thumbs_up")
    with sqlite3.connect(path) as db:
        newest = db.execute("SELECT MAX(version) FROM policy_snapshots").fetchone()[0]
        db.execute("INSERT INTO policy_snapshots (version, ts, policy, weights, state, kind) SELECT version + 1, "
                   "ts, policy, weights, ?, kind FROM policy_snapshots WHERE version = ?", ('{"broken": 1}', newest))
    db.close()
    with FeedbackStore(path) as store:
        owed = store.record_feedback(r.event_id, "thumbs_down")
    with pytest.raises(CorruptStateError, match="is damaged"):
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # stored; neither it nor the row owed learned
    assert ens.learner.n_learned == 1
    with FeedbackStore(path) as store:
        assert store.drop_snapshot(newest + 1)
    ens.refresh()
    assert ens.learner.n_learned == 3
    assert ens.store.feedback_learned(owed.feedback_id) is True and ens.store.counts()["unlearned"] == 0
    ens.close()


def test_a_row_another_process_learns_while_this_one_is_about_to_is_learned_once(tmp_path: Path) -> None:
    # both list the row owed; the other learns it first: this one checks the mark under the write lock
    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)  # neither live ensemble made it
    a, b = bm25_ensemble(path, refresh_interval=3600.0), bm25_ensemble(path, refresh_interval=3600.0)
    a.retrieve("aurora", k=2)
    b.retrieve("aurora", k=2)
    with FeedbackStore(path) as store:
        store.record_feedback(r.event_id, "thumbs_up")
    listed = a.store._owed_feedback  # the catch-up's look

    def listed_then_learned_elsewhere(*args: Any) -> Any:
        rows = listed(*args)
        b.refresh()  # another process learns them between this one's look and its learning
        return rows

    a.store._owed_feedback = listed_then_learned_elsewhere
    a.refresh()
    assert newest_n_learned(path) == 1  # not learned a second time on top of b's snapshot
    a.store._owed_feedback = listed
    a.refresh()
    assert (a.learner.n_learned, b.learner.n_learned) == (1, 1)
    a.close()
    b.close()
    assert newest_n_learned(path) == 1


def test_two_live_ensembles_learn_a_row_owed_once_between_them(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    a, b = bm25_ensemble(path), bm25_ensemble(path)
    r = a.retrieve("what causes the tides", k=3)
    with FeedbackStore(path) as store:
        store.record_feedback(r.event_id, "thumbs_up")
    b.retrieve("aurora", k=2)  # another handle on the file catches up first
    a.retrieve("aurora", k=2)
    b.retrieve("aurora", k=2)
    assert (a.learner.n_learned, b.learner.n_learned) == (1, 1)  # a loaded b's snapshot: one learning
    a.close()
    b.close()
    assert newest_n_learned(path) == 1


def test_a_busy_store_while_catching_up_is_warned_of_once_and_tried_again(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="thompson",
                                      refresh_interval=0.0, store=FeedbackStore(path, busy_timeout=0.05))
    ens.retrieve("glacier", k=2)
    with FeedbackStore(path) as store:
        store.record_feedback(r.event_id, "thumbs_up")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process writing for longer than busy_timeout
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hits = ens.retrieve("glacier", k=2, log=False).hits  # the retrieval itself is served
        ens.retrieve("glacier", k=2, log=False)
    assert hits and ens.learner.n_learned == 0
    said = [str(w.message) for w in caught if "not learned yet" in str(w.message)]
    assert len(said) == 1 and "tried again" in said[0]
    holder.execute("ROLLBACK")
    holder.close()
    ens.retrieve("glacier", k=2)
    assert ens.learner.n_learned == 1
    ens.close()


def test_feedback_rolled_back_with_a_callers_block_is_caught_up_again(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    ens = bm25_ensemble(path, refresh_interval=3600.0)
    ens.retrieve("glacier ice", k=2)  # its first look is done: the next refresh is an hour away
    r = ens.retrieve("what causes the tides", k=3)
    with FeedbackStore(path) as other:
        owed = other.record_feedback(r.event_id, "thumbs_up")
    with pytest.raises(RuntimeError), ens.store.exclusive():
        ens.feedback(r.event_id, "thumbs_down")  # learned, and the row owed with it, inside the caller's block
        assert ens.learner.n_learned == 2
        raise RuntimeError("the caller's block fails")
    assert ens.learner.n_learned == 0  # both taken back with the block
    assert ens.store.feedback_learned(owed.feedback_id) is None
    ens.refresh()
    assert ens.learner.n_learned == 1  # and the row owed learned again, once
    ens.close()


def test_the_schema_step_counts_rows_stored_before_it_as_settled_and_is_safe_to_rerun(tmp_path: Path) -> None:
    from sqlite_utils import Database

    from rlfb.store.migrations import m012_feedback_learned

    path = tmp_path / "fb.db"
    with FeedbackStore(path, attribution_window=60.0) as store:
        eid = store.log_event("q", {"weights": {"bm25": 1.0}}, [{"chunk_id": "a"}], timestamp=1000.0)
        kept = store.record_feedback(eid, "thumbs_up", timestamp=1010.0)
        late = store.record_feedback(eid, "thumbs_down", timestamp=2000.0)
        assert store.feedback_learned(kept.feedback_id) is None  # stored, not learned yet
        assert store.feedback_learned(late.feedback_id) is False  # out of the window: nothing to learn
    raw = sqlite3.connect(path, isolation_level=None)  # as an older rlfb left it
    raw.execute("DELETE FROM _migrations WHERE name IN ('m012_feedback_learned', 'm013_feedback_held', "
                "'m014_run_tree_ts')")
    raw.execute("DROP INDEX idx_run_links_ts")
    raw.execute("DROP INDEX idx_failed_runs_ts")
    raw.execute("DROP INDEX idx_feedback_unlearned")
    raw.execute("DROP INDEX idx_feedback_held")
    raw.execute("ALTER TABLE feedback DROP COLUMN learned")
    raw.close()
    with FeedbackStore(path) as store:
        assert store.schema_migrations == MIGRATIONS.names
        assert store.feedback_learned(kept.feedback_id) is True  # learned, or not, by the rules of its day
        assert store.feedback_learned(late.feedback_id) is False
        assert store.unlearned_feedback() == []
        m012_feedback_learned(Database(store._tx.conn))  # again: it changes nothing
        assert store.feedback_learned(kept.feedback_id) is True


def test_marks_are_checked_at_the_boundary(tmp_path: Path) -> None:
    from rlfb.errors import UnknownFeedbackError, ValidationError

    with FeedbackStore(tmp_path / "fb.db") as store:
        for bad in (0, -1, 1.0, True, "1"):
            with pytest.raises(ValidationError):
                store.feedback_learned(bad)  # type: ignore[arg-type]
            with pytest.raises(ValidationError):
                store.mark_learned(bad)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            store.unlearned_feedback(after=-1)
        with pytest.raises(ValidationError):
            store.unlearned_feedback(policy="")
        assert store.feedback_learned(12345) is None  # no such row
        with pytest.raises(UnknownFeedbackError, match="no feedback row 12345"):
            store.mark_learned(12345)  # said, not done quietly: nothing names the row


def test_feedback_on_another_engines_retrieval_is_owed_to_no_learner(tmp_path: Path) -> None:
    # a plain retriever's log (log_external) has no learner: its feedback is not counted as not learned yet
    from rlfb.runs import log_external, record_run_feedback

    path = tmp_path / "fb.db"
    ens = bm25_ensemble(path)
    with FeedbackStore(path) as store:
        by_run = log_external(store, "tides", [("doc2", 1.0), ("doc9", 0.5)], source="bm25", event_id="run-1")
        direct = log_external(store, "tides", [("doc2", 1.0)], source="bm25")
        (rec,) = record_run_feedback(store, by_run, score=1.0)
        alone = store.record_feedback(direct, "click", chunk_id="doc2")  # an audit found it owed for ever
        assert store.feedback_learned(rec.feedback_id) is False and store.feedback_learned(alone.feedback_id) is False
    given = ens.feedback(direct, "thumbs_up")  # through an ensemble, which does not learn it either
    assert ens.store.feedback_learned(given.feedback_id) is False
    assert ens.store.counts()["unlearned"] == 0 and ens.learner.n_learned == 0
    ens.close()


def test_a_row_owed_on_another_live_ensembles_decision_is_left_to_that_one(tmp_path: Path) -> None:
    # two ensembles of one kind in one process (a two-corpus app): the one that made the decision learns it
    path = tmp_path / "fb.db"
    a, b = bm25_ensemble(path, refresh_interval=3600.0), bm25_ensemble(path, refresh_interval=3600.0)
    r = a.retrieve("what causes the tides", k=3)
    b.retrieve("aurora", k=2)
    with FeedbackStore(path) as store:
        store.record_feedback(r.event_id, "thumbs_up")
    b.refresh()
    assert b.learner.n_learned == 0 and b.store.counts()["unlearned"] == 1
    a.refresh()
    assert a.learner.n_learned == 1 and a.store.counts()["unlearned"] == 0
    a.close()
    b.close()


def test_a_backlog_is_learned_a_batch_at_a_time_with_one_snapshot_each(tmp_path: Path, monkeypatch: Any) -> None:
    # a feedback service wrote while the app was down: each look learns a bounded batch, and writes one snapshot
    # for it (not one per row), in the transaction that marks the batch
    from rlfb import feedback_learning

    monkeypatch.setattr(feedback_learning, "CATCH_UP_BATCH", 4)
    path = tmp_path / "fb.db"
    made = bm25_ensemble(path)
    events = [made.retrieve(q, k=2).event_id for q in ("tides", "aurora", "volcano", "glacier", "lava")]
    made.close()
    with FeedbackStore(path) as store:
        for signal in ("thumbs_up", "thumbs_down"):
            for eid in events:
                store.record_feedback(eid, signal)
        before = store.state_version()
    ens = bm25_ensemble(path, refresh_interval=3600.0)  # each retrieval looks again while the backlog lasts
    versions = [before]
    for _ in range(4):
        ens.retrieve("tides", k=2, log=False)
        versions.append(ens.store.state_version())
    assert ens.learner.n_learned == 10
    assert [b - a for a, b in zip(versions, versions[1:], strict=False)] == [1, 1, 1, 0]
    assert ens.store.counts()["unlearned"] == 0
    ens.close()
    assert newest_n_learned(path) == 10


def test_rows_caught_up_at_a_persist_interval_are_held_until_its_snapshot(tmp_path: Path) -> None:
    # marked learned in the look's transaction while their learning waited for persist_interval, they were lost
    # to a process killed before its next snapshot (then written at once instead); now they are held until it
    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    ens = bm25_ensemble(path, persist_interval=3600.0)
    own = ens.retrieve("aurora", k=2)
    ens.feedback(own.event_id, "thumbs_up")  # its first snapshot: the next is an hour away
    assert newest_n_learned(path) == 1
    with FeedbackStore(path) as store:
        owed = store.record_feedback(r.event_id, "thumbs_up")
    ens.retrieve("aurora", k=2, log=False)
    assert ens.learner.n_learned == 2
    assert newest_n_learned(path) == 1 and ens.store.counts()["held"] == 1
    assert ens.store.feedback_learned(owed.feedback_id) is None
    ens.close()
    assert newest_n_learned(path) == 2
    with FeedbackStore(path) as store:
        assert store.feedback_learned(owed.feedback_id) is True and store.counts()["held"] == 0


def test_a_row_an_rlfb_of_before_the_step_writes_after_it_counts_as_learned(tmp_path: Path) -> None:
    # a rolling upgrade: an app of the previous version, still running on the file another process upgraded,
    # learns what it stores and writes rows without the column; taken as owed, they were learned a second time
    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    with sqlite3.connect(path) as db:  # the previous version's insert names no `learned`
        db.execute("INSERT INTO feedback (id, event_id, chunk_id, signal, kind, raw_value, value, discount, "
                   "discounted, reward, ts, delay, in_window, created_at) SELECT 99, id, NULL, 'thumbs_up', "
                   "'explicit', 1.0, 1.0, 1.0, 1.0, 1.0, ts + 1, 1.0, 1, ts + 1 FROM events WHERE id = ?",
                   (r.event_id,))
    db.close()
    ens = bm25_ensemble(path)
    ens.retrieve("aurora", k=2, log=False)
    assert ens.learner.n_learned == 0 and ens.store.feedback_learned(99) is True
    ens.close()


def test_a_look_whose_writes_are_undone_looks_again(tmp_path: Path) -> None:
    # a full disk while the batch's snapshot is written undoes the marks and the learning: the rows are looked
    # at again at the next look, not passed over until a restart
    from rlfb.errors import StoreFullError

    path = tmp_path / "fb.db"
    r = retrieved_before_a_restart(path)
    with FeedbackStore(path) as store:
        owed = store.record_feedback(r.event_id, "thumbs_up")
    ens = bm25_ensemble(path, refresh_interval=3600.0)
    persist = ens._persist

    def full_once(**kw: Any) -> None:
        ens._persist = persist  # type: ignore[method-assign]
        raise StoreFullError("database or disk is full")

    ens._persist = full_once  # type: ignore[method-assign]
    with pytest.warns(RuntimeWarning, match="not learned yet could not be learned now"):
        ens.retrieve("aurora", k=2, log=False)
    assert ens.learner.n_learned == 0 and ens.store.feedback_learned(owed.feedback_id) is None
    ens.refresh()
    assert ens.learner.n_learned == 1 and ens.store.feedback_learned(owed.feedback_id) is True
    ens.close()
    assert newest_n_learned(path) == 1


def test_a_limit_lists_the_oldest_rows_not_learned(tmp_path: Path) -> None:
    # "oldest first, the first `limit`": listed newest first, a caller working through a backlog by `limit`
    # would take the newest rows and leave the oldest
    with FeedbackStore(tmp_path / "fb.db") as store:
        ids = []
        for text in ("tides", "aurora", "volcano"):
            event = store.log_event(text, {"policy": "thompson", "weights": {"bm25": 1.0}}, [{"chunk_id": "doc1"}])
            ids.append(store.record_feedback(event, "thumbs_up").feedback_id)
        assert [r.feedback_id for r in store.unlearned_feedback(limit=1)] == ids[:1]
        assert [r.feedback_id for r in store.unlearned_feedback(policy="thompson", limit=2)] == ids[:2]


def test_feedback_on_a_decision_logged_without_a_policy_is_learned_by_the_ensemble_that_owns_it(
        tmp_path: Path) -> None:
    # a decision logged by the app's own logger (or an older rlfb) names no policy; the ensemble of its retrievers
    # owns it, so the feedback on it is owed to that ensemble, not to none
    path = tmp_path / "fb.db"
    with FeedbackStore(path) as store:
        event = store.log_event("volcano lava", {"weights": {"bm25": 1.0}}, [{"chunk_id": IDS[2]}])
        fid = store.record_feedback(event, "thumbs_up").feedback_id
    ens = bm25_ensemble(path)
    ens.retrieve("volcano lava", k=2)
    assert ens.learner.n_learned == 1
    ens.close()
    with FeedbackStore(path) as store:
        assert store.feedback_learned(fid) is True and store.counts()["unlearned"] == 0


def test_a_retry_through_a_store_without_learned_marks_is_learned_once(tmp_path: Path) -> None:
    # a store of the user's own that keeps no learned marks: the retry's `duplicate` is all there is to go on

    class NoMarks:  # passes everything on but the marks
        def __init__(self, store: FeedbackStore) -> None:
            self._store = store

        def __getattr__(self, name: str) -> Any:
            if name in ("mark_learned", "feedback_learned", "unlearned_feedback", "_owed_feedback"):
                raise AttributeError(name)
            return getattr(self._store, name)

    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="thompson",
                                      store=NoMarks(FeedbackStore(tmp_path / "fb.db")))
    r = ens.retrieve("volcano lava", k=2)
    ens.feedback(r.event_id, "thumbs_up", idempotency_key="k1")
    again = ens.feedback(r.event_id, "thumbs_up", idempotency_key="k1")
    assert again.duplicate and ens.learner.n_learned == 1
    ens.close()
