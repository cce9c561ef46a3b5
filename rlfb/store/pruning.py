"""Pruning: the store's retention (how long it keeps rows) and the prune that deletes older ones.

:class:`~rlfb.store.FeedbackStore` checks its ``retention`` with :func:`check_retention`
and its ``prune`` method calls :func:`prune` (so does opening a store that has a retention).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from rlfb.errors import ValidationError
from rlfb.store.checks import _positive
from rlfb.store.feedback_log import note_feedback_id_high
from rlfb.store.snapshots import PRUNE_SNAPSHOTS

if TYPE_CHECKING:
    from rlfb.store.feedback_store import FeedbackStore


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
        return result
    cutoff = t - keep
    old = "SELECT id FROM events WHERE ts < ?"
    old_feedback = f"SELECT id FROM feedback WHERE event_id IN ({old})"
    statements = {
        "rewards": f"DELETE FROM rewards WHERE feedback_id IN ({old_feedback})",
        "feedback": f"DELETE FROM feedback WHERE event_id IN ({old})",
        "chunks": f"DELETE FROM event_chunks WHERE event_id IN ({old})",
        "events": "DELETE FROM events WHERE ts < ?",
        "policy_snapshots": PRUNE_SNAPSHOTS,
        "run_links": "DELETE FROM run_links WHERE ts < ?",
        "failed_runs": "DELETE FROM failed_runs WHERE ts < ?",
    }
    with store._write() as conn:
        note_feedback_id_high(conn)  # the ids of the rows it deletes are not given again
        for table, sql in statements.items():  # children first; the cascades then find nothing left
            # a failed run's mark is part of the run tree: counted with the run links
            key = "run_links" if table == "failed_runs" else table
            result[key] = result[key] + conn.execute(sql, (cutoff,)).rowcount
    return result
