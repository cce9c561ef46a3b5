"""A store at scale: a prune deletes in batches that other writers get in between, and the run tree is read by index.

An audit of a store at scale (1.5 million events, 2026-12-07) found a prune of 300,000 events holding the write
lock for 38 s in one transaction (another process's ``log_event`` gave up with ``StoreBusyError`` after its 30 s
busy timeout), the prune's deletes of run links and failed runs scanning both tables whole at every opening of a
store with a retention, and ``resolve_run`` reading every failed run at each level of a run tree. These tests
time nothing: they see what another connection can write while a prune runs, and read SQLite's query plans, on
stores of a few dozen rows (a batch of a few rows stands for one of thousands).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _clock import NOW, Clock

from rlfb.errors import StoreBusyError
from rlfb.store import FeedbackStore, pruning

DAY = 86400.0
RETENTION = 30 * DAY
CUTOFF = NOW - RETENTION
OLD = 12  # events older than the cutoff, each with chunks; some with feedback and rewards
DECISION = {"weights": {"bm25": 1.0}}
TABLES = ("events", "event_chunks", "feedback", "rewards", "policy_snapshots", "run_links", "failed_runs",
          "settings", "_migrations")


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 3 events or run links (2 snapshots), no pause between them. ``raising=False``: the code before
    batches runs too (its prune ignores them), for checking that these tests fail on it."""
    monkeypatch.setattr(pruning, "PRUNE_BATCH", 3, raising=False)
    monkeypatch.setattr(pruning, "PRUNE_LINK_BATCH", 3, raising=False)
    monkeypatch.setattr(pruning, "PRUNE_SNAPSHOT_BATCH", 2, raising=False)
    monkeypatch.setattr(pruning, "PRUNE_PAUSE", 0.0, raising=False)


def _build(path: Path) -> Path:
    """A store with old and new rows in every table a prune deletes from, ties of ``ts`` and rows at the cutoff."""
    clock = Clock()  # moved back only to stamp old run links and marks (they take the clock's time)
    with FeedbackStore(path, clock=clock, snapshots_kept=None, attribution_window=DAY) as store:
        for i in range(OLD):
            ts = CUTOFF - 10 * DAY + 60 * (i // 2 if i >= 6 else i)  # events 6 and 7 share their ts, 8 and 9 too
            eid = store.log_event(f"old {i}", DECISION, [{"chunk_id": f"c{i}"}, {"chunk_id": "shared"}],
                                  event_id=f"old-{i}", timestamp=ts)
            if i % 3 == 0:
                store.record_feedback(eid, "thumbs_up", timestamp=ts + 10)  # in the window: rewards rows
            if i % 4 == 1:
                store.record_feedback(eid, "thumbs_down", chunk_id=f"c{i}", timestamp=ts + 20)
            if i == 5:
                store.record_feedback(eid, "thumbs_up", timestamp=ts + 2 * DAY)  # late: no rewards
        for i, ts in enumerate((CUTOFF, CUTOFF + 1, NOW - DAY)):  # at the cutoff is kept (ts < cutoff goes)
            eid = store.log_event(f"new {i}", DECISION, [{"chunk_id": "shared"}], event_id=f"new-{i}", timestamp=ts)
            store.record_feedback(eid, "thumbs_up", timestamp=ts + 10)
        # late feedback on an old event, the newest row: its id goes with the prune, and is not given again
        store.record_feedback("old-2", "thumbs_down", timestamp=CUTOFF - 10 * DAY + 300)
        for i in range(5):  # one kind's old snapshots, the newest of them kept only while no newer one is saved
            store.save_policy_state({}, {"bm25": 1.0}, policy="a", timestamp=CUTOFF - 9 * DAY + i)
        store.save_policy_state({}, {"bm25": 1.0}, policy="b", timestamp=CUTOFF - 8 * DAY)  # kind b's only one
        store.save_policy_state({}, {"bm25": 1.0}, policy="a", timestamp=CUTOFF + DAY)
        for when, tag in ((CUTOFF - 5 * DAY, "old"), (CUTOFF, "cut"), (NOW - DAY, "new")):
            clock.t = when
            store.link_runs([(f"{tag}-run{j}", f"{tag}-chain") for j in range(4)])
            store.fail_run(f"{tag}-run0")
            store.fail_run(f"{tag}-run1")
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("INSERT INTO policy_snapshots (ts, policy, weights, state, kind) "  # no kind: a kind of its own
                "VALUES (?, 'x', '{\"bm25\": 1.0}', '{}', NULL)", [CUTOFF - 7 * DAY])
    raw.close()
    return path


def _copy(src: Path, dst: Path) -> Path:
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    a.close()
    b.close()
    return dst


def _dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(path)
    try:
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in TABLES}
    finally:
        conn.close()


def _one_shot_prune(path: Path, cutoff: float) -> dict[str, int]:
    """The prune as it was before batches: every delete in one write transaction (the reference end state)."""
    from rlfb.store.snapshots import PRUNE_SNAPSHOTS

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    old = "SELECT id FROM events WHERE ts < ?"
    statements = {
        "rewards": f"DELETE FROM rewards WHERE feedback_id IN (SELECT id FROM feedback WHERE event_id IN ({old}))",
        "feedback": f"DELETE FROM feedback WHERE event_id IN ({old})",
        "chunks": f"DELETE FROM event_chunks WHERE event_id IN ({old})",
        "events": "DELETE FROM events WHERE ts < ?",
        "policy_snapshots": PRUNE_SNAPSHOTS,
        "run_links": "DELETE FROM run_links WHERE ts < ?",
        "failed_runs": "DELETE FROM failed_runs WHERE ts < ?",
    }
    result = {"events": 0, "chunks": 0, "feedback": 0, "rewards": 0, "policy_snapshots": 0, "run_links": 0}
    conn.execute("BEGIN IMMEDIATE")
    high = conn.execute("SELECT MAX(id) FROM feedback").fetchone()[0]
    conn.execute("INSERT INTO settings (key, value) VALUES ('feedback_id_high', ?) "
                 "ON CONFLICT(key) DO UPDATE SET value = excluded.value", [str(high)])
    for table, sql in statements.items():
        result["run_links" if table == "failed_runs" else table] += conn.execute(sql, [cutoff]).rowcount
    conn.execute("COMMIT")
    conn.close()
    return result


@contextmanager
def _traced(store: FeedbackStore, callback: Callable[[str], None]) -> Iterator[None]:
    store.db.conn.set_trace_callback(callback)
    try:
        yield
    finally:
        store.db.conn.set_trace_callback(None)


# ---------------------------------------------------------------- (a) the prune, in batches
@pytest.mark.usefixtures("small_batches")
def test_another_writer_gets_the_lock_between_a_prunes_batches(tmp_path: Path) -> None:
    # one write transaction: another store's log_event, waiting 1 ms for the lock, failed all through the prune
    path = _build(tmp_path / "fb.db")
    store = FeedbackStore(path, clock=Clock(), snapshots_kept=None)
    other = FeedbackStore(path, clock=Clock(), busy_timeout=0.001)  # another process's store, as good as not waiting
    tries: list[tuple[int, bool]] = []  # (old events left, whether the other store's write went in)

    def before_each_transaction(sql: str) -> None:
        if sql.startswith("BEGIN IMMEDIATE"):  # the prune is about to take the lock again
            left = other.db.execute("SELECT COUNT(*) FROM events WHERE ts < ?", [CUTOFF]).fetchone()[0]
            try:
                other.log_event("meanwhile", DECISION, [{"chunk_id": "a"}], event_id=f"meanwhile-{len(tries)}")
            except StoreBusyError:
                tries.append((left, False))
            else:
                tries.append((left, True))

    with _traced(store, before_each_transaction):
        result = store.prune(retention=RETENTION)
    assert result["events"] == OLD
    assert all(went_in for _, went_in in tries)
    # the other writer went in while some old events, and not all of them, were deleted: between two batches
    assert [left for left, _ in tries if 0 < left < OLD] == [9, 6, 3]
    assert store.counts()["events"] == 3 + len(tries)  # every write it made is kept
    store.close()
    other.close()


@pytest.mark.parametrize("batch", [1, 3, 4, 1000])
def test_a_prune_in_batches_ends_as_the_one_transaction_prune_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    monkeypatch.setattr(pruning, "PRUNE_BATCH", batch, raising=False)
    monkeypatch.setattr(pruning, "PRUNE_LINK_BATCH", batch, raising=False)
    monkeypatch.setattr(pruning, "PRUNE_SNAPSHOT_BATCH", min(batch, 2), raising=False)
    monkeypatch.setattr(pruning, "PRUNE_PAUSE", 0.0, raising=False)
    path = _build(tmp_path / "fb.db")
    reference = _copy(path, tmp_path / "reference.db")
    expected = _one_shot_prune(reference, CUTOFF)
    assert expected == {"events": OLD, "chunks": 2 * OLD, "feedback": 9, "rewards": 13, "policy_snapshots": 5,
                        "run_links": 6}
    with FeedbackStore(path, clock=Clock(), snapshots_kept=None) as store:
        assert store.prune(retention=RETENTION) == expected
        assert store.prune(retention=RETENTION) == dict.fromkeys(expected, 0)  # nothing left to delete
        assert store.integrity_check() == "ok"
        assert store.db.execute("PRAGMA foreign_key_check").fetchall() == []
    assert _dump(path) == _dump(reference)


@pytest.mark.usefixtures("small_batches")
def test_a_prune_stopped_between_batches_leaves_the_oldest_events_deleted_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a process killed part way: what the batches committed is whole events with everything that hung on them
    path = _build(tmp_path / "fb.db")
    reference = _copy(path, tmp_path / "reference.db")
    _one_shot_prune(reference, CUTOFF)
    before = _dump(path)
    store = FeedbackStore(path, clock=Clock(), snapshots_kept=None)
    commits = []
    real = store._tx.check_file

    def killed_at_the_second_commit() -> None:  # checked just before each outermost COMMIT
        commits.append(1)
        if len(commits) == 2:
            raise KeyboardInterrupt
        real()

    monkeypatch.setattr(store._tx, "check_file", killed_at_the_second_commit)
    with pytest.raises(KeyboardInterrupt):
        store.prune(retention=RETENTION)
    monkeypatch.setattr(store._tx, "check_file", real)
    after = _dump(path)
    gone = {"old-0", "old-1", "old-2"}  # the first batch: the three oldest
    assert {r[0] for r in before["events"]} - {r[0] for r in after["events"]} == gone
    for table, column in (("event_chunks", 0), ("feedback", 1), ("rewards", 2)):
        assert [r for r in before[table] if r[column] not in gone] == after[table], table
    assert store.db.execute("PRAGMA foreign_key_check").fetchall() == []
    for table in ("policy_snapshots", "run_links", "failed_runs"):
        assert after[table] == before[table]  # later phases: not begun
    store.prune(retention=RETENTION)  # the next prune deletes the rest
    store.close()
    assert _dump(path) == _dump(reference)


def test_a_prune_pauses_between_batches_but_not_inside_an_exclusive_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_batches: None
) -> None:
    # the pause, the lock free, is what lets a writer waiting in SQLite's busy handler (it tries again every 100 ms
    # at most) in: a prune that took the lock again at once was before it at almost every try
    from types import SimpleNamespace

    sleeps: list[float] = []
    monkeypatch.setattr(pruning, "time", SimpleNamespace(sleep=sleeps.append))
    monkeypatch.setattr(pruning, "PRUNE_PAUSE", 0.25)
    path = _build(tmp_path / "fb.db")
    before = _dump(path)
    with FeedbackStore(path, clock=Clock(), snapshots_kept=None) as store:
        with pytest.raises(RuntimeError), store.exclusive():  # the lock held throughout: no pause, all undone
            assert store.prune(retention=RETENTION)["events"] == OLD
            raise RuntimeError("undo")
        assert sleeps == [] and _dump(path) == before
        assert store.prune(retention=RETENTION)["events"] == OLD
    # after each full batch: 4 of events, 3 of snapshots, 1 of run links
    assert sleeps == [0.25] * 8


# ---------------------------------------------------------------- (b) run links and failed runs by ts
def _plans(path: Path, statements: list[str]) -> list[str]:
    """Each statement's query plan, one line per step, ``SQL -> step``."""
    conn = sqlite3.connect(path)
    try:
        return [f"{sql[:120]} -> {row[3]}" for sql in statements
                for row in conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall()]
    finally:
        conn.close()


def _scans(plans: list[str], tables: tuple[str, ...]) -> list[str]:
    return [p for p in plans if any(p.split(" -> ")[-1].startswith(f"SCAN {t}") for t in tables)]


@pytest.mark.usefixtures("small_batches")
def test_a_prune_finds_what_it_deletes_by_index(tmp_path: Path) -> None:
    # "DELETE FROM run_links WHERE ts < ?" and the same of failed_runs read both tables whole at every prune
    path = _build(tmp_path / "fb.db")
    statements: list[str] = []
    with FeedbackStore(path, clock=Clock(), snapshots_kept=None) as store:
        with _traced(store, lambda sql: statements.append(sql) if sql.lstrip().upper().startswith(("DELETE", "SELECT"))
                     else None):
            store.prune(retention=RETENTION)
            store.prune(retention=RETENTION)  # with nothing to delete, as at each opening of a pruned store
    plans = _plans(path, statements)
    assert any("run_links" in p for p in plans) and any("failed_runs" in p for p in plans)
    assert _scans(plans, ("run_links", "failed_runs", "events", "event_chunks", "feedback", "rewards")) == []


def test_the_ts_indexes_of_the_run_tree_are_a_schema_step_safe_to_rerun(tmp_path: Path) -> None:
    from sqlite_utils import Database

    from rlfb.store.migrations import MIGRATIONS, m014_run_tree_ts

    path = tmp_path / "fb.db"
    FeedbackStore(path).close()
    raw = sqlite3.connect(path, isolation_level=None)  # as an older rlfb left it
    raw.execute("DELETE FROM _migrations WHERE name = 'm014_run_tree_ts'")
    raw.execute("DROP INDEX idx_run_links_ts")
    raw.execute("DROP INDEX idx_failed_runs_ts")
    raw.close()
    with FeedbackStore(path) as store:
        assert store.migrations_applied == ["m014_run_tree_ts"] and store.schema_migrations == MIGRATIONS.names
        indexes = {r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"idx_run_links_ts", "idx_failed_runs_ts"} <= indexes
        m014_run_tree_ts(Database(store.db.conn))  # again: nothing changes, nothing fails
        assert indexes == {r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}


# ---------------------------------------------------------------- (c) resolving a run past failed runs
def _tree(path: Path) -> FeedbackStore:
    """chain -> sub1 -> sub3 -> chain (a cycle), chain -> sub2 (failed), chain -> gone (failed); events under each
    (e5, under sub1, is itself failed); many failed runs elsewhere, and a mark with no run id (written outside rlfb)."""
    store = FeedbackStore(path, clock=Clock())
    store.link_runs([("sub1", "chain"), ("sub2", "chain"), ("sub3", "sub1"), ("chain", "sub3"), ("gone", "chain")])
    for i, parent in enumerate(("chain", "sub1", "sub1", "sub3", "sub2", "sub1", "gone")):
        store.log_event(f"q{i}", DECISION, [{"chunk_id": "a"}], event_id=f"e{i}", parent_id=parent,
                        timestamp=NOW - 100 + (7 - i))  # e6 oldest, e0 newest: found oldest first
    for run in ("sub2", "gone", "e5", *(f"elsewhere-{j}" for j in range(50))):
        store.fail_run(run)
    store.db.execute("INSERT INTO failed_runs (run_id, ts) VALUES (NULL, 0)")
    return store


def _resolve_as_before(conn: sqlite3.Connection, root: str) -> list[str]:
    """``resolve_run`` as it was, with ``... EXCEPT SELECT run_id FROM failed_runs`` (the reference)."""
    if conn.execute("SELECT 1 FROM events WHERE id = ?", [root]).fetchone():
        return [root]
    seen, frontier = {root}, [root]
    while frontier:
        m = ",".join("?" * len(frontier))
        children = [c for (c,) in conn.execute(
            f"SELECT run_id FROM run_links WHERE parent_id IN ({m}) UNION SELECT id FROM events WHERE parent_id IN "
            f"({m}) EXCEPT SELECT run_id FROM failed_runs", [*frontier, *frontier]) if c not in seen]
        seen.update(children)
        frontier = children
    seen.discard(root)
    m = ",".join("?" * len(seen))
    return [r[0] for r in conn.execute(f"SELECT id FROM events WHERE id IN ({m}) ORDER BY ts, rowid", list(seen))]


def test_resolving_a_run_passes_failed_runs_by_as_before(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    store = _tree(path)
    raw = sqlite3.connect(path)
    try:
        for root in ("chain", "sub1", "sub2", "sub3", "gone", "e0", "e5", "nothing"):
            assert store.resolve_run(root) == _resolve_as_before(raw, root), root
    finally:
        raw.close()
    assert store.resolve_run("chain") == ["e3", "e2", "e1", "e0"]  # not e4 (sub2), e5, e6 (gone)
    assert store.resolve_run("sub1") == ["e3", "e2", "e1", "e0"]  # round the cycle
    assert store.resolve_run("sub2") == ["e4"]  # a failed run asked for by name: what is under it
    store.close()


def test_resolving_a_run_looks_failed_runs_up_by_index(tmp_path: Path) -> None:
    # "... EXCEPT SELECT run_id FROM failed_runs" read every failed run at each level of the tree
    path = tmp_path / "fb.db"
    store = _tree(path)
    statements: list[str] = []
    with _traced(store, lambda sql: statements.append(sql) if "failed_runs" in sql else None):
        assert store.resolve_run("chain") == ["e3", "e2", "e1", "e0"]
    store.close()
    plans = _plans(path, statements)
    assert len(statements) >= 3 and any("failed_runs" in p for p in plans)  # a query per level of the tree
    assert _scans(plans, ("failed_runs", "run_links", "events")) == []
