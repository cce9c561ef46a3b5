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

from rlfb import FeedbackEnsemble
from rlfb.cli import main
from rlfb.store import FeedbackStore

from _corpus import IDS, TEXTS

TESTS = Path(__file__).resolve().parent


def _ensemble(path: Path, **kw: Any) -> FeedbackEnsemble:
    kw.setdefault("policy", "thompson")
    kw.setdefault("refresh_interval", 0.0)
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=str(path), **kw)


def _retrieved_before_a_restart(path: Path) -> Any:
    """A retrieval logged by an ensemble that is gone since: no live ensemble made it."""
    made = _ensemble(path)
    result = made.retrieve("what causes the tides", k=3)
    made.close()
    return result


def _newest_n_learned(path: Path) -> int:
    with FeedbackStore(path) as store:
        return int(store.load_policy_state()["state"]["n_learned"])


def test_feedback_learned_by_a_process_killed_before_its_snapshot_is_learned_after_the_restart(
        tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "fb.db"
    child = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(TESTS)!r})
        from _corpus import IDS, TEXTS
        from rlfb import FeedbackEnsemble
        ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="thompson",
                                          store={str(path)!r}, persist_interval=3600.0)
        r = ens.retrieve("what causes the tides", k=3)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # the first snapshot: written at once
        ens.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)  # learned, its snapshot an hour away
        assert ens.learner.n_learned == 2
        os._exit(9)  # killed: no flush, no exit hook
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert done.returncode == 9, done.stderr
    assert _newest_n_learned(path) == 1
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
    again = _ensemble(path)
    again.retrieve("aurora", k=2)  # its first look takes the held row
    assert again.learner.n_learned == 2
    again.close()
    assert _newest_n_learned(path) == 2
    with FeedbackStore(path) as store:
        assert store.feedback_learned(second) is True and store.counts()["held"] == 0
    third = _ensemble(path)  # once
    third.retrieve("aurora", k=2)
    assert third.learner.n_learned == 2
    third.close()


def test_held_rows_are_marked_learned_by_the_snapshot_that_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    ens = _ensemble(path, persist_interval=3600.0)
    r = ens.retrieve("what causes the tides", k=3)
    first = ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    second = ens.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)
    third = ens.feedback(r.event_id, "thumbs_up")
    store = ens.store
    assert store.feedback_learned(first.feedback_id) is True  # the first snapshot is written at once
    assert store.feedback_learned(second.feedback_id) is None and store.feedback_learned(third.feedback_id) is None
    assert store.counts()["held"] == 2 and _newest_n_learned(path) == 1
    ens.flush()
    assert _newest_n_learned(path) == 3
    assert store.feedback_learned(second.feedback_id) is True and store.feedback_learned(third.feedback_id) is True
    assert store.counts()["held"] == 0
    ens.close()


def test_the_default_persist_interval_marks_learned_at_once_and_holds_nothing(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    ens = _ensemble(path)
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
    r = _retrieved_before_a_restart(path)
    a = _ensemble(path, persist_interval=3600.0)
    a.retrieve("aurora", k=2)
    a.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # written: a's first snapshot
    held = a.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)
    assert a.learner.n_learned == 2 and a.store.feedback_learned(held.feedback_id) is None
    b = _ensemble(path)
    b.retrieve("aurora", k=2)
    assert b.learner.n_learned == 2  # a's snapshot, and the row a held
    assert b.store.feedback_learned(held.feedback_id) is True
    a.retrieve("aurora", k=2)  # a loads b's snapshot, without learning the row again on it
    assert a.learner.n_learned == 2
    a.feedback(r.event_id, "click", chunk_id=r.hits[2].chunk_id)
    a.close()
    b.close()
    assert _newest_n_learned(path) == 3


def test_a_running_ensemble_leaves_the_rows_another_holds_to_it(tmp_path: Path) -> None:
    # only the looks from an ensemble's start take held rows: later ones would take a live worker's every time
    path = tmp_path / "fb.db"
    r = _retrieved_before_a_restart(path)
    b = _ensemble(path)
    b.retrieve("aurora", k=2)  # its looks from its start are done
    a = _ensemble(path, persist_interval=3600.0)
    a.retrieve("aurora", k=2)
    a.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # written: a's first snapshot
    held = a.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)
    b.retrieve("aurora", k=2)  # refresh_interval 0: it loads a's snapshot and looks again
    assert b.learner.n_learned == 1 and b.store.feedback_learned(held.feedback_id) is None
    a.close()
    b.retrieve("aurora", k=2)
    assert b.learner.n_learned == 2 and b.store.feedback_learned(held.feedback_id) is True
    b.close()


def test_an_ensemble_does_not_take_its_own_held_rows_again(tmp_path: Path, monkeypatch: Any) -> None:
    # its looks from its start take held rows while each finds a whole batch (a backlog): one of them then finds
    # a row it holds itself, on the decision of an ensemble gone since
    from rlfb import feedback_learning

    monkeypatch.setattr(feedback_learning, "CATCH_UP_BATCH", 1)
    path = tmp_path / "fb.db"
    r = _retrieved_before_a_restart(path)
    with FeedbackStore(path) as store:  # a feedback service of its own: a row owed
        store.record_feedback(r.event_id, "thumbs_down")
    ens = _ensemble(path, persist_interval=3600.0)
    ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # its first snapshot; then the owed row
    assert ens.learner.n_learned == 2
    held = ens.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)  # held; the next look finds it
    assert ens.store.feedback_learned(held.feedback_id) is None
    assert ens.learner.n_learned == 3
    ens.retrieve("aurora", k=2)
    assert ens.learner.n_learned == 3
    ens.close()
    assert _newest_n_learned(path) == 3


def test_held_feedback_rolled_back_with_a_callers_block_is_learned_once_at_its_retry(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    ens = _ensemble(path, persist_interval=3600.0)
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
    assert ens.store.feedback_learned(retry.feedback_id) is True and _newest_n_learned(path) == 2
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
