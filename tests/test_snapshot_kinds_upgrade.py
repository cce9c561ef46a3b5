"""A store upgraded from an older rlfb keeps one kind of snapshot per app.

Snapshots saved before the store kept each one's kind (schema step m009) had none, and one of an older rlfb
names no dense model and fewer hyperparameters. The ensemble takes such a snapshot for its own, but until
2026-12-06 the store grouped it apart: after the upgraded app's first save, ``rlfb weights show`` and ``store
stats`` showed two kinds that read alike, ``rlfb weights export`` refused the store whatever ``--policy`` and
``--retrievers`` said, and no save ever dropped the old snapshots (found by an audit that built stores with
five older commits of rlfb)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from rlfb import FeedbackEnsemble
from rlfb.snapshot_kind import SnapshotKind
from rlfb.store import FeedbackStore

TEXTS = ["solar wind and the aurora", "sourdough starter feeding", "tidal forces of the moon",
         "volcanic lava flows", "charged particles in the magnetosphere", "bread crust and steam"]
PARAMS = {"step": 0.1, "window": 100}


def _state(*, old: bool, policy: str = "thompson", step: float = 0.1) -> dict:
    """A learned state as a newer rlfb saves it (its dense model named, one more hyperparameter), or as an older
    one did."""
    params = {**PARAMS, "step": step} if old else {**PARAMS, "step": step, "added_later": 3}
    memory = {"dim": 384} if old else {"dim": 384, "model": "all-MiniLM-L6-v2|query"}
    return {"retrievers": ["bm25", "dense"], "exploration": {"kind": "thompson"}, "memory": memory,
            "policy": {"name": policy, "params": params}}


def _as_before_m009(path: Path, m011: bool = True) -> None:
    """Leave every snapshot of ``path`` without its kind, as a store upgraded past m009 by an older rlfb holds
    the snapshots saved before it; without ``m011``, as that older rlfb left the file."""
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE policy_snapshots SET kind = NULL")
        if m011:
            conn.execute("DELETE FROM _migrations WHERE name = 'm011_snapshot_kinds'")
    conn.close()


def _kinds(path: Path) -> list[str | None]:
    with sqlite3.connect(path) as conn:
        rows = [k for (k,) in conn.execute("SELECT kind FROM policy_snapshots ORDER BY version")]
    conn.close()
    return rows


def test_an_older_rlfbs_snapshots_are_one_kind_with_the_upgraded_apps(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    with FeedbackStore(path, snapshots_kept=3) as store:
        for i in range(4):
            store.save_policy_state(_state(old=True), {"bm25": 0.5, "dense": 0.5}, policy="thompson",
                                    timestamp=1_000.0 + i)
    _as_before_m009(path)
    with FeedbackStore(path, snapshots_kept=3) as store:  # m011 gives each its kind, as saved then
        assert _kinds(path) == [SnapshotKind.of({"policy": "thompson", "state": _state(old=True)}).key()] * 3
        assert len(store.newest_snapshots()) == 1
        store.save_policy_state(_state(old=False), {"bm25": 0.3, "dense": 0.7}, policy="thompson", timestamp=2_000.0)
        newest = store.newest_snapshots()  # two kinds that read alike, before
        assert [(n["policy"], n["weights"]) for n in newest] == [("thompson", {"bm25": 0.3, "dense": 0.7})]
        assert store.stats()["snapshot_kinds"] == 1
        for i in range(2):
            store.save_policy_state(_state(old=False), {"bm25": 0.3, "dense": 0.7}, policy="thompson",
                                    timestamp=2_001.0 + i)
        # the older rlfb's snapshots go as the newest 3 of the one kind come: before, none ever went
        assert store.counts()["policy_snapshots"] == 3
        assert all(s["state"] == _state(old=False) for s in store.policy_history(with_state=True))


def test_another_kind_is_not_taken_in(tmp_path: Path) -> None:
    # another policy, or the same one with another step, is another app's: its snapshots stay as they are
    path = tmp_path / "fb.db"
    with FeedbackStore(path, snapshots_kept=1) as store:
        store.save_policy_state(_state(old=True, policy="gradient"), {"bm25": 1.0, "dense": 0.0}, policy="gradient")
        store.save_policy_state(_state(old=True, step=0.5), {"bm25": 0.0, "dense": 1.0}, policy="thompson")
    _as_before_m009(path)
    with FeedbackStore(path, snapshots_kept=1) as store:
        for _ in range(3):
            store.save_policy_state(_state(old=False), {"bm25": 0.5, "dense": 0.5}, policy="thompson")
        assert sorted((n["policy"], n["weights"]["bm25"]) for n in store.newest_snapshots()) == [
            ("gradient", 1.0), ("thompson", 0.0), ("thompson", 0.5)]
        assert store.counts()["policy_snapshots"] == 3


def test_a_snapshot_that_cannot_be_read_is_a_kind_of_its_own_and_the_step_is_safe_to_rerun(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    with FeedbackStore(path) as store:
        store.save_policy_state(_state(old=True), {"bm25": 0.5, "dense": 0.5}, policy="thompson", timestamp=1_000.0)
        store.save_policy_state(_state(old=True), {"bm25": 0.5, "dense": 0.5}, policy="thompson", timestamp=1_001.0)
    _as_before_m009(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE policy_snapshots SET state = '{not json' WHERE version = 1")
    conn.close()
    from sqlite_utils import Database

    from rlfb.store.migrations import m011_snapshot_kinds

    with FeedbackStore(path) as store:
        kinds = _kinds(path)
        assert kinds[0] is not None
        assert json.loads(kinds[0]) == ["unreadable snapshot", 1] and SnapshotKind.from_key(kinds[1]) is not None
        m011_snapshot_kinds(Database(store._tx.conn))  # again: it changes nothing
        assert _kinds(path) == kinds
        # prune keeps the newest of each kind: the damaged one is its own, as it was when read off the state
        assert store.prune(now=1_000.0 + 400 * 86400, retention=86400)["policy_snapshots"] == 0


def test_an_upgraded_apps_store_exports_its_weights(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # a real app: its snapshots made to look as an older rlfb saved them (one hyperparameter fewer), then the
    # app started again and learned; `rlfb weights export` refused the store as shared by two kinds alike
    from rlfb.cli import main

    path = tmp_path / "fb.db"
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(path), policy="thompson", seed=0)
    result = ens.retrieve("aurora", k=3)
    ens.feedback(result.event_id, "implicit_positive", chunk_id=result.hits[0].chunk_id)
    learned = ens.weights
    ens.close()
    with sqlite3.connect(path) as conn:
        (param,) = conn.execute("SELECT key FROM policy_snapshots, json_each(state, '$.policy.params') "
                                "WHERE key != 'weights' LIMIT 1").fetchone()
        conn.execute("UPDATE policy_snapshots SET state = json_remove(state, ?)", (f"$.policy.params.{param}",))
    conn.close()
    _as_before_m009(path)
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(path), policy="thompson", seed=0)
    assert ens.weights == learned  # its own state, as before
    result = ens.retrieve("sourdough", k=3)
    ens.feedback(result.event_id, "implicit_positive", chunk_id=result.hits[0].chunk_id)
    ens.close()
    with FeedbackStore(path) as store:
        assert store.stats()["snapshot_kinds"] == 1
    out = tmp_path / "w.json"
    assert main(["weights", "export", str(path), str(out)]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["policy"] == "thompson"
