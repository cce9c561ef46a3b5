"""FeedbackStore under several writer processes, and after a writer is killed with SIGKILL."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from rlfb.store import MIGRATIONS, FeedbackStore

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL and POSIX file semantics")

N_PROCS = 4
N_EVENTS = 2000
K = 3
SIGNALS = ("thumbs_up", "thumbs_down", "click", "reformulation")


def _event_args(tag: str, i: int) -> dict:
    return {
        "query": f"{tag} query {i} '; DROP TABLE events; --",
        "decision": {"weights": {"bm25": 0.5, "dense": 0.5}, "arm": f"arm{i % 3}", "propensity": 0.9,
                     "explored": i % 10 == 0, "policy": "fixed"},
        "chunks": [{"chunk_id": f"{tag}-doc{(i + j) % 50}", "rank": j + 1, "score": 1.0 / (j + 1),
                    "scores": {"bm25": 5.0 - j, "dense": 0.5}, "normalized": {"bm25": 1.0, "dense": 0.5},
                    "proposed_by": ["bm25"]} for j in range(K)],
        "session_id": tag,
        "event_id": f"{tag}-{i}",
    }


def _writer(path: str, worker: int, n: int, start, results) -> None:
    """Open the store (all workers at once, on a new file), then log n retrievals, each with feedback."""
    tag = f"w{worker}"
    try:
        start.wait(60)
        with FeedbackStore(path) as store:
            for i in range(n):
                eid = store.log_event(**_event_args(tag, i))
                store.record_feedback(eid, SIGNALS[i % len(SIGNALS)], idempotency_key=f"{tag}-fb-{i}")
        results.put((worker, None))
    except BaseException as exc:  # reported to the parent: "database is locked" would land here
        results.put((worker, f"{type(exc).__name__}: {exc}"))
        raise


def test_four_processes_each_log_2000_retrievals_with_feedback(tmp_path):
    path = str(tmp_path / "shared.db")
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, w, N_EVENTS, start, results)) for w in range(N_PROCS)]
    for p in procs:
        p.start()
    t0 = time.monotonic()
    start.set()
    for p in procs:
        p.join(120)
    elapsed = time.monotonic() - t0
    reports = dict(results.get(timeout=10) for _ in procs)
    assert {w: None for w in range(N_PROCS)} == reports, reports
    assert [0] * N_PROCS == [p.exitcode for p in procs]

    with FeedbackStore(path) as store:
        counts = store.counts()
        assert N_PROCS * N_EVENTS == counts["events"]
        assert N_PROCS * N_EVENTS * K == counts["chunks"]
        assert N_PROCS * N_EVENTS == counts["feedback"]
        assert N_PROCS * N_EVENTS * K == counts["rewards"]
        for w in range(N_PROCS):
            assert N_EVENTS == len(store.events_for_session(f"w{w}", with_chunks=False))
        assert "ok" == store.integrity_check()
        assert MIGRATIONS.names == store.schema_migrations  # four racing openers migrated it exactly once
    print(f"\n{N_PROCS} processes x {N_EVENTS} retrievals + feedback in {elapsed:.1f}s")


# -- crash ---------------------------------------------------------------------------------------
def _crash_writer(path: str, ack_path: str, tag: str) -> None:
    """Log retrievals with feedback forever; after each record_feedback returns, append its ids to ack_path.

    The store runs with its default synchronous=NORMAL: in WAL mode a commit is in
    the WAL file (the OS page cache) before it returns, which a process kill cannot undo.
    """
    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    store = FeedbackStore(path)
    assert 1 == store.db.conn.execute("PRAGMA synchronous").fetchone()[0]  # NORMAL
    i = 0
    while True:
        eid = store.log_event(**_event_args(tag, i))
        rec = store.record_feedback(eid, "thumbs_up", idempotency_key=f"{tag}-fb-{i}")
        os.write(fd, f"{eid} {rec.feedback_id}\n".encode())  # unbuffered: on disk (page cache) once written
        i += 1


def _acked(ack_path: Path) -> list[tuple[str, int]]:
    if not ack_path.exists():
        return []
    out = []
    for line in ack_path.read_bytes().split(b"\n")[:-1]:  # a torn last line has no newline: ignored
        eid, fid = line.decode().split()
        out.append((eid, int(fid)))
    return out


def test_sigkill_mid_stream_loses_no_acknowledged_feedback(tmp_path):
    path = tmp_path / "crash.db"
    ack_path = tmp_path / "acked.txt"
    FeedbackStore(path).close()  # schema first, so the rounds measure writes
    ctx = mp.get_context("spawn")
    rng = random.Random(7)
    kills = 0
    for round_ in range(3):
        before = len(_acked(ack_path))
        target = before + rng.randint(150, 400)
        p = ctx.Process(target=_crash_writer, args=(str(path), str(ack_path), f"r{round_}"))
        p.start()
        # not a speed limit: a writer that acknowledges nothing for ten minutes is stuck (a deadlock), and the
        # test must then fail, not hang; a slow machine only waits longer
        seen, last_progress = before, time.monotonic()
        while (now_acked := len(_acked(ack_path))) < target:
            assert p.is_alive(), f"writer died on its own (exit code {p.exitcode})"
            if now_acked > seen:
                seen, last_progress = now_acked, time.monotonic()
            assert time.monotonic() - last_progress < 600, f"writer stuck at {seen} acknowledged rows"
            time.sleep(0.005)
        time.sleep(rng.random() * 0.02)  # land the kill at an arbitrary point of the stream
        assert p.pid is not None
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        assert -signal.SIGKILL == p.exitcode
        kills += 1

    acked = _acked(ack_path)
    assert len(acked) >= 450 and kills == 3
    raw = sqlite3.connect(path)
    assert [("ok",)] == raw.execute("PRAGMA integrity_check").fetchall()
    raw.close()
    with FeedbackStore(path) as store:
        assert "ok" == store.integrity_check()
        stored = {(f["event_id"], f["id"]) for e, _ in acked for f in store.feedback(e)}
        assert set(acked) <= stored
        for eid, _ in acked[:: max(1, len(acked) // 50)]:
            assert K == len(store.event(eid)["chunks"])
            assert 1.0 == pytest.approx(store.event_reward(eid)[0], abs=0.01)
        counts = store.counts()
        # at most one unacknowledged feedback per killed writer (committed, killed before the ack)
        assert len(acked) <= counts["feedback"] <= len(acked) + kills
        assert counts["feedback"] * K == counts["rewards"]


def test_opening_a_store_another_connection_holds_locked_is_store_busy(tmp_path):
    # a store that needed a migration (or a new file's switch to WAL) raised SQLite's bare "database is locked"
    from rlfb.errors import StoreBusyError

    old = tmp_path / "old.db"
    FeedbackStore(old).close()
    raw = sqlite3.connect(old, isolation_level=None)  # as an older rlfb left it: before sampling_temperature
    raw.execute("DELETE FROM _migrations WHERE name IN ('m007_sampling_temperature', 'm008_failed_runs', "
                "'m009_snapshot_kind', 'm010_settings', 'm011_snapshot_kinds', 'm012_feedback_learned', "
                "'m013_feedback_held', 'm014_run_tree_ts')")
    raw.execute("DROP INDEX idx_run_links_ts")
    raw.execute("DROP INDEX idx_feedback_unlearned")
    raw.execute("DROP INDEX idx_feedback_held")
    raw.execute("ALTER TABLE feedback DROP COLUMN learned")
    raw.execute("DROP TABLE settings")
    raw.execute("ALTER TABLE events DROP COLUMN sampling_temperature")
    raw.execute("DROP TABLE failed_runs")
    raw.execute("DROP INDEX idx_policy_snapshots_kind_version")
    raw.execute("ALTER TABLE policy_snapshots DROP COLUMN kind")
    new = tmp_path / "new.db"
    holder = sqlite3.connect(new, isolation_level=None)
    for path, conn in ((old, raw), (new, holder)):
        conn.execute("BEGIN IMMEDIATE")  # another process writing
        with pytest.raises(StoreBusyError, match="busy_timeout") as caught:
            FeedbackStore(path, busy_timeout=0.05)
        assert isinstance(caught.value, sqlite3.OperationalError)  # as it was before it had a name
        conn.execute("ROLLBACK")
        conn.close()
        with FeedbackStore(path) as store:  # free again: the migrations run
            assert MIGRATIONS.names == store.schema_migrations


def test_another_stores_busy_error_inside_an_exclusive_block_keeps_its_name(tmp_path):
    # a StoreBusyError of store B raised inside A's exclusive() block was named again as A's ("A stayed
    # locked"), though A was never locked
    from rlfb.errors import StoreBusyError

    a, b = FeedbackStore(tmp_path / "a.db"), FeedbackStore(tmp_path / "b.db", busy_timeout=0.05)
    holder = sqlite3.connect(tmp_path / "b.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreBusyError) as caught, a.exclusive():
            b.save_policy_state({}, {"bm25": 1.0})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "b.db" in str(caught.value) and "a.db" not in str(caught.value)
