"""Pruning: the store's retention (how long it keeps rows) and the prune that deletes older ones.

:class:`~rlfb.store.FeedbackStore` checks its ``retention`` with :func:`check_retention`
and its ``prune`` method calls :func:`prune` (so does opening a store that has a retention).

A prune deletes in batches, each its own short write transaction, oldest first, so that other writers
(another process's ``log_event``, feedback) take the lock between them: deleting 300,000 events in one
transaction held the write lock for 38 s, and a writer in another process gave up with
:class:`~rlfb.errors.StoreBusyError` after its 30 s busy timeout (an audit of a store at scale, 2026-12-07).
A batch deletes whole events, each with its chunks, feedback and their rewards, so a prune stopped between
batches (a killed process, a batch that failed) leaves the oldest events deleted with everything that hung
on them and the others whole; the next prune deletes the rest. Inside an
:meth:`~rlfb.store.FeedbackStore.exclusive` block the batches are savepoints of its one transaction.
The price is time: a prune of a large backlog takes two to three times as long as the one transaction did
(each commit's checkpoint writes the indexes' pages again, and :data:`PRUNE_PAUSE` separates batches); a
store pruned at every opening deletes a batch or so each time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rlfb.errors import ValidationError
from rlfb.store.checks import _batches, _marks, _positive
from rlfb.store.feedback_log import note_feedback_id_high
from rlfb.store.snapshots import PRUNE_SNAPSHOTS

if TYPE_CHECKING:
    import sqlite3

    from rlfb.store.feedback_store import FeedbackStore

#: events a prune deletes per write transaction, with their chunks, feedback and rewards (about 0.2 s of the write
#: lock in a store of 300,000 events, where one transaction of 160,000 held it for 14 s or more)
PRUNE_BATCH = 2000
#: run links, or marks of failed runs, a prune deletes per write transaction (also about 0.2 s there)
PRUNE_LINK_BATCH = 5000
#: policy snapshots a prune deletes per write transaction: each is an ensemble's whole learned state (megabytes)
PRUNE_SNAPSHOT_BATCH = 20
#: seconds a prune waits between two batches, the lock free: as long as the longest sleep of SQLite's busy handler
#: (100 ms), so that a writer waiting for the lock tries it during the pause. Without it, a prune that began its
#: next batch at once took the lock again before the waiting writer's next try, batch after batch
PRUNE_PAUSE = 0.1


def check_retention(retention: Any, attribution_window: float, allow_none: bool = False) -> float | None:
    """``retention`` in seconds, checked: positive (or ``None`` with ``allow_none``), and no shorter than the window."""
    keep = _positive(retention, "retention", allow_none=allow_none)
    # pruning an event that is still inside the window would lose feedback that may yet arrive for it
    if keep is not None and keep < attribution_window:
        raise ValidationError(
            f"retention ({keep:g}s) must be at least the attribution window ({attribution_window:g}s): "
            "events younger than the window can still receive feedback"
        )
    return keep


def prune(
    store: FeedbackStore, now: float | datetime | None = None, *, retention: float | None = None
) -> dict[str, int]:
    """Delete the rows older than the retention (the store's, or ``retention``); return the count per table."""
    keep = store.retention if retention is None else check_retention(retention, store.attribution_window)
    result = {"events": 0, "chunks": 0, "feedback": 0, "rewards": 0, "policy_snapshots": 0, "run_links": 0}
    # checked as every other timestamp is: a time in milliseconds by mistake put the cutoff far in the
    # future and deleted every event, its feedback, the snapshots and the run links, live ones included.
    # Also with no retention, when nothing is deleted: a NaN passed unnoticed until a retention was set
    t = store._timestamp(now, "now", store._now())
    if keep is None:
        store._tx.check_open()  # a closed store is refused as when there is a retention, not answered zeros
        return result
    cutoff = t - keep
    # children first, in each batch: the cascades then find nothing left, and each table's count is its own
    for table, count in _prune_events(store, cutoff).items():
        result[table] += count
    result["policy_snapshots"] = _prune_snapshots(store, cutoff)
    # a failed run's mark is part of the run tree: counted with the run links
    result["run_links"] = _prune_by_ts(store, "run_links", cutoff) + _prune_by_ts(store, "failed_runs", cutoff)
    return result


def _prune_events(store: FeedbackStore, cutoff: float) -> dict[str, int]:
    """Delete the events older than ``cutoff``, oldest first, :data:`PRUNE_BATCH` a transaction, each with its
    chunks, feedback and their rewards; return the count per table."""
    counts = {"rewards": 0, "feedback": 0, "chunks": 0, "events": 0}
    while True:
        with store._write() as conn:
            note_feedback_id_high(conn)  # the ids of the rows it deletes are not given again (in each batch: a
            # row stored since the last one may be among them)
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM events WHERE ts < ? ORDER BY ts LIMIT ?", (cutoff, PRUNE_BATCH))]
            for b in _batches(ids):
                for table, count in _delete_events(conn, b).items():
                    counts[table] += count
        if len(ids) < PRUNE_BATCH:
            return counts
        _pause(store)


def _delete_events(conn: sqlite3.Connection, ids: Sequence[Any]) -> dict[str, int]:
    """Delete the events ``ids`` (at most SQLite's parameter limit) and what hangs on them; the count per table."""
    m = _marks(len(ids))
    statements = {  # every table that refers to events, directly or through feedback (foreign keys ON DELETE CASCADE)
        "rewards": f"DELETE FROM rewards WHERE feedback_id IN (SELECT id FROM feedback WHERE event_id IN ({m}))",
        "feedback": f"DELETE FROM feedback WHERE event_id IN ({m})",
        "chunks": f"DELETE FROM event_chunks WHERE event_id IN ({m})",
        "events": f"DELETE FROM events WHERE id IN ({m})",
    }
    return {table: conn.execute(sql, ids).rowcount for table, sql in statements.items()}


def _prune_snapshots(store: FeedbackStore, cutoff: float) -> int:
    """Delete the policy snapshots older than ``cutoff`` but the newest of each kind (:data:`PRUNE_SNAPSHOTS`),
    oldest first, about :data:`PRUNE_SNAPSHOT_BATCH` a transaction; return how many."""
    deleted = 0
    after = 0  # versions up to this one were looked at by an earlier batch
    while True:
        with store._write() as conn:
            # the newest of each kind is found again in each batch: a snapshot saved since may have replaced one
            row = conn.execute(
                "SELECT version FROM policy_snapshots WHERE ts < ? AND version > ? ORDER BY version LIMIT 1 OFFSET ?",
                (cutoff, after, PRUNE_SNAPSHOT_BATCH - 1),
            ).fetchone()
            if row is None:  # the last batch: whatever is left
                return deleted + int(conn.execute(PRUNE_SNAPSHOTS, (cutoff,)).rowcount)
            after = int(row[0])
            # PRUNE_SNAPSHOTS ends in its WHERE clause: bounded here to the versions up to the batch's last
            deleted += conn.execute(PRUNE_SNAPSHOTS + " AND version <= ?", (cutoff, after)).rowcount
        _pause(store)


def _prune_by_ts(store: FeedbackStore, table: str, cutoff: float) -> int:
    """Delete the rows of ``table`` (``run_links`` or ``failed_runs``: indexed by ``ts``, m014) older than
    ``cutoff``, oldest first, :data:`PRUNE_LINK_BATCH` a transaction; return how many."""
    deleted = 0
    while True:
        with store._write() as conn:
            n = conn.execute(
                f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE ts < ? ORDER BY ts LIMIT ?)",
                (cutoff, PRUNE_LINK_BATCH),
            ).rowcount
        deleted += n
        if n < PRUNE_LINK_BATCH:
            return deleted
        _pause(store)


def _pause(store: FeedbackStore) -> None:
    """Between two batches: :data:`PRUNE_PAUSE`, unless an :meth:`~rlfb.store.FeedbackStore.exclusive` block holds
    the lock throughout anyway, or the store is in memory (no other connection can wait for it)."""
    if not store.exclusive_depth and not store._memory:
        time.sleep(PRUNE_PAUSE)
