"""Feedback owed to another policy is read once per ensemble, not at every look for the rows owed to its own.

Rows stored on the decisions of a policy no app runs any more (an app moved from ``gradient`` to
``thompson``) stay unlearned for good. The look for an ensemble's own rows (at each feedback and refresh,
:func:`rlfb.feedback_learning.catch_up`) asked SQLite for its policy's rows after the last one it learned, and
SQLite walked every such row of other policies to find none: with 20,000 of them each feedback took 0.14 s
longer, with 100,000 0.6 s (an audit of a store at scale, 2026-12-07). A look now reads at most
``OWED_SCAN`` rows of each mark, and the next one starts past those it read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _restarts import bm25_ensemble, retrieved_before_a_restart

from rlfb import FeedbackEnsemble
from rlfb.store import FeedbackStore, feedback_log

from _corpus import IDS, TEXTS

SCAN = 10


@pytest.fixture
def small_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A look reads 10 rows of each mark (1,000 in use), so that a few dozen rows cross the bound."""
    monkeypatch.setattr(feedback_log, "OWED_SCAN", SCAN)


def stranded(store: FeedbackStore, n: int, policy: str = "gradient") -> list[int]:
    """``n`` feedback rows on decisions of ``policy``, which no ensemble here runs: owed for good."""
    ids = []
    for i in range(n):
        eid = store.log_event(f"question {i}", {"weights": {"bm25": 1.0}, "policy": policy}, [{"chunk_id": "tides"}])
        ids.append(store.record_feedback(eid, "thumbs_up").feedback_id)
    return ids


def looks(ens: Any) -> list[int]:
    """The ``after`` of each look ``ens`` makes for owed rows from now on (a spy on the store's look)."""
    seen: list[int] = []
    look = ens.store._owed_feedback

    def spy(after: int, *args: Any) -> Any:
        seen.append(after)
        return look(after, *args)

    ens.store._owed_feedback = spy
    return seen


def test_rows_of_another_policy_are_read_once_not_at_every_look(tmp_path: Path, small_scan: None) -> None:
    path = tmp_path / "fb.db"
    retrieved_before_a_restart(path)  # the store's retrievers and policy, as an app of them left it
    with FeedbackStore(path) as store:
        ids = stranded(store, 4 * SCAN + 3)
    ens = bm25_ensemble(path)
    after = looks(ens)
    for _ in range(8):
        r = ens.retrieve("what causes the tides", k=2)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    # each look starts past the rows the one before read: 10 at a time, then past the last; before, every look
    # started at 0 and read all 43
    assert after[:5] == [0, ids[SCAN - 1], ids[2 * SCAN - 1], ids[3 * SCAN - 1], ids[4 * SCAN - 1]]
    assert all(a >= ids[-1] for a in after[5:]) and len(after) > 5
    assert ens.store.counts()["unlearned"] == len(ids)  # still owed: no ensemble of theirs has run
    ens.close()


def test_rows_owed_among_many_of_another_policy_are_all_learned_once(tmp_path: Path, small_scan: None) -> None:
    path = tmp_path / "fb.db"
    made = bm25_ensemble(path)
    mine = [made.retrieve(q, k=3) for q in ("what causes the tides", "volcano lava", "aurora") * 4]
    made.close()  # a restart: no live ensemble made them
    with FeedbackStore(path) as store:
        owed = []
        for r in mine:  # 12 rows owed to thompson, each between 5 rows of gradient's
            stranded(store, 5)
            owed.append(store.record_feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id).feedback_id)
        stranded(store, 5)
    ens = bm25_ensemble(path)
    for _ in range(12):
        ens.retrieve("what causes the tides", k=2)
    assert ens.learner.n_learned == len(owed)
    assert all(ens.store.feedback_learned(fid) is True for fid in owed)
    assert ens.store.counts()["unlearned"] == 13 * 5  # gradient's, left to an app of gradient
    again = bm25_ensemble(path)  # a restart learns none of them a second time
    for _ in range(4):
        again.retrieve("volcano lava", k=2)
    assert again.learner.n_learned == len(owed)
    ens.close()
    again.close()


def test_a_look_reads_a_bounded_number_of_rows_and_says_how_far(tmp_path: Path, small_scan: None) -> None:
    with FeedbackStore(tmp_path / "fb.db") as store:
        other = stranded(store, 2 * SCAN)
        theirs = stranded(store, 3, policy="thompson")
        first = feedback_log.owed(store, 0, "thompson", limit=100)
        assert (first.records, first.through, first.complete) == ([], other[SCAN - 1], False)
        second = feedback_log.owed(store, first.through, "thompson", limit=100)
        assert (second.records, second.through, second.complete) == ([], other[-1], False)
        third = feedback_log.owed(store, second.through, "thompson", limit=2)  # more owed than the batch
        assert [r.feedback_id for r in third.records] == theirs[:2]
        assert (third.through, third.complete) == (theirs[1], False)
        last = feedback_log.owed(store, third.through, "thompson", limit=2)
        assert ([r.feedback_id for r in last.records], last.through, last.complete) == (theirs[2:], theirs[2], True)
        done = feedback_log.owed(store, last.through, "thompson", limit=2)
        assert (done.records, done.through, done.complete) == ([], last.through, True)


def test_held_rows_read_beside_owed_ones_stop_at_the_lower_bound(tmp_path: Path, small_scan: None) -> None:
    # two marks, each read to OWED_SCAN rows: a row past one mark's last read may sit below the other's
    with FeedbackStore(tmp_path / "fb.db") as store:
        ids = stranded(store, 3 * SCAN, policy="thompson")
        for fid in ids[::2]:  # every other row held by a learner that has not written it yet
            store.mark_learned(fid, held=True)
        look = feedback_log.owed(store, 0, "thompson", limit=100, held=True)
        # each mark's 10th row: 19 (held) and 20 (owed); past 19, the held rows were not all read
        assert look.through == ids[2 * SCAN - 2] and not look.complete
        assert [r.feedback_id for r in look.records] == ids[:2 * SCAN - 1]  # none past the lower bound
        rest = feedback_log.owed(store, look.through, "thompson", limit=100, held=True)
        assert [r.feedback_id for r in rest.records] == ids[2 * SCAN - 1:] and rest.complete


def test_a_look_inside_a_block_that_rolls_back_reads_those_rows_again(tmp_path: Path) -> None:
    # the look found only another policy's rows, written in the caller's block, and started the next look past
    # them; the block rolled back and SQLite gave their ids again, to a row owed to this ensemble, never learned
    # (a review, 2026-12-07)
    store = FeedbackStore(str(tmp_path / "fb.db"))
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=store, policy="thompson",
                                      refresh_interval=0.0)
    with pytest.raises(RuntimeError, match="the app's block fails"), store.exclusive():
        stranded(store, 3)
        ens.retrieve("what causes the tides", k=3)  # the first look for owed rows, inside the block
        raise RuntimeError("the app's block fails")
    r = ens.retrieve("what causes the tides", k=3)
    owed = store.record_feedback(r.event_id, "thumbs_up")  # stored without the ensemble: owed to it
    assert owed.feedback_id == 1  # the rolled back rows' id, given again
    for _ in range(2):
        ens.retrieve("aurora", k=2)
    assert ens.learner.n_learned == 1 and store.feedback_learned(owed.feedback_id) is True
    ens.close()
