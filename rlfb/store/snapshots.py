"""Policy snapshots: the learned state and weights, appended after learning, newest read back.

A save keeps the newest ``snapshots_kept`` of its kind (:class:`~rlfb.snapshot_kind.SnapshotKind`,
by the ``kind`` column); :data:`PRUNE_SNAPSHOTS` is what a prune deletes, keeping the newest of
each kind. The :class:`~rlfb.store.FeedbackStore` methods ``save_policy_state``,
``load_policy_state``, ``policy_history`` and ``state_version`` call these.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.snapshot_kind import SnapshotKind
from rlfb.store.checks import _check_int, _check_limit, _check_weights, _opt_str
from rlfb.store.codec import _dumps, _enc
from rlfb.store.records import _snapshot_dict

if TYPE_CHECKING:
    from rlfb.store.connection import Transactions
    from rlfb.store.feedback_store import FeedbackStore

# What tells one ensemble's snapshots from another's: the kind column (rlfb.snapshot_kind.SnapshotKind.key, the
# policy, the retrievers, the chunk exploration, the memory's dimension and dense model, the hyperparameters less
# the weights), written with each snapshot since m009 and filled in for older ones by m011. Until 2026-12-06 the
# reports and prune grouped by those fields read off the state in SQL, and a save by the column: snapshots saved
# before m009 were never dropped by a save, and the same app showed as two kinds once it had saved again. A row
# with no kind (written outside rlfb) is a kind of its own: prune keeps one more, never one less.
_SNAPSHOT_KIND = "COALESCE(kind, 'version ' || version)"

# the snapshots older than a prune's cutoff (its one parameter), but the newest of each kind: another kind's later
# snapshot must not take away an ensemble's only state
PRUNE_SNAPSHOTS = (
    "DELETE FROM policy_snapshots WHERE ts < ? "
    f"AND version NOT IN (SELECT MAX(version) FROM policy_snapshots GROUP BY {_SNAPSHOT_KIND})"
)


def save_policy_state(
    store: FeedbackStore,
    state: Mapping[str, Any],
    weights: Mapping[str, Any],
    *,
    policy: str | None = None,
    timestamp: float | datetime | None = None,
) -> int:
    """Append a policy snapshot, dropping the older ones of its kind past ``snapshots_kept``; return its version."""
    if not isinstance(state, Mapping):
        raise ValidationError(f"state must be a mapping, got {type(state).__name__}")
    w = _check_weights(weights)
    now = store._now()
    ts = store._timestamp(timestamp, "timestamp", now)
    name = _opt_str(policy, "policy")
    snapshot_kind = SnapshotKind.of({"policy": name, "state": state})
    kind = snapshot_kind.key()
    row = (ts, _enc(name), _dumps(w, "weights"), _dumps(dict(state), "state"), kind)
    with store._write() as conn:
        cur = conn.execute(
            "INSERT INTO policy_snapshots (ts, policy, weights, state, kind) VALUES (?, ?, ?, ?, ?)", row
        )
        _adopt_compatible_kinds(conn, snapshot_kind, kind)
        if store.snapshots_kept is not None:
            conn.execute(
                "DELETE FROM policy_snapshots WHERE kind = ? AND version <= (SELECT version FROM "
                "policy_snapshots WHERE kind = ? ORDER BY version DESC LIMIT 1 OFFSET ?)",
                (kind, kind, store.snapshots_kept),
            )
        return int(cur.lastrowid)  # type: ignore[arg-type]


def _adopt_compatible_kinds(conn: Any, mine: SnapshotKind, kind: str) -> None:
    """Give the snapshots of every kind that differs from ``mine`` (whose key is ``kind``) only where one of them
    does not say (a snapshot of an older rlfb: no dense model named, fewer hyperparameters) the kind ``kind``.

    The ensemble takes such a snapshot for its own (:meth:`SnapshotKind.differences`), but its key differs:
    until 2026-12-06 the same app upgraded showed as two kinds in ``rlfb weights show`` and ``store stats``,
    ``rlfb weights export`` refused the store as shared whatever ``--policy`` and ``--retrievers`` said, and
    a save never dropped the older kind's snapshots (88 MB of a 92 MB file in an audit's upgraded store).
    """
    others = [k for (k,) in conn.execute("SELECT DISTINCT kind FROM policy_snapshots WHERE kind != ?", (kind,))]
    for other in others:
        theirs = SnapshotKind.from_key(other)
        if theirs is not None and not theirs.differences(mine):
            conn.execute("UPDATE policy_snapshots SET kind = ? WHERE kind = ?", (kind, other))


def load_policy_state(
    store: FeedbackStore, policy: str | None = None, *, before: int | None = None, version: int | None = None
) -> dict[str, Any] | None:
    """The newest snapshot (of ``policy``, older than ``before``; the one of ``version``), decoded with its state,
    or ``None``."""
    where: list[str] = []
    params: list[str | bytes | int | None] = []
    if policy is not None:
        where.append("policy = ?")
        params.append(_enc(_opt_str(policy, "policy")))
    if before is not None:
        where.append("version < ?")
        params.append(_check_int(before, "before", minimum=0))
    if version is not None:
        where.append("version = ?")
        params.append(_check_int(version, "version", minimum=0))
    sql = "SELECT * FROM policy_snapshots" + (" WHERE " + " AND ".join(where) if where else "")
    with store._read():
        rows = list(store.db.query(sql + " ORDER BY version DESC LIMIT 1", params))
    return _snapshot(store, rows[0], with_state=True) if rows else None


def newest_of_each_kind(store: FeedbackStore) -> list[dict[str, Any]]:
    """The newest snapshot of each kind of ensemble that wrote to the store (as a prune keeps them), newest first,
    without their states: ``{"version", "updated_at", "policy", "weights"}``; weights damaged outside rlfb are
    ``None`` here (reading that snapshot whole names the damage)."""
    sql = (f"SELECT version, ts, policy, weights FROM policy_snapshots WHERE version IN "
           f"(SELECT MAX(version) FROM policy_snapshots GROUP BY {_SNAPSHOT_KIND}) ORDER BY version DESC")
    with store._read():
        rows = list(store.db.query(sql))
    out = []
    for row in rows:
        try:
            out.append(_snapshot_dict(row, with_state=False))
        except ValueError:  # CorruptStateError and ValidationError are ValueErrors
            policy = row["policy"] if isinstance(row["policy"], str) else None  # what the column says, if text
            out.append({"version": row["version"], "updated_at": row["ts"], "policy": policy, "weights": None})
    return out


def policy_history(store: FeedbackStore, limit: int | None = None, *, with_state: bool = False) -> list[dict[str, Any]]:
    """Snapshots oldest first; with ``limit``, the most recent ``limit``."""
    lim = "" if limit is None else f" LIMIT {_check_limit(limit)}"
    with store._read():
        rows = list(store.db.query(f"SELECT * FROM policy_snapshots ORDER BY version DESC{lim}"))
    return [_snapshot(store, r, with_state=with_state) for r in reversed(rows)]


def drop_snapshot(store: FeedbackStore, version: int) -> bool:
    """Delete the policy snapshot ``version``; whether there was one."""
    v = _check_int(version, "version", minimum=1)
    with store._write() as conn:
        return conn.execute("DELETE FROM policy_snapshots WHERE version = ?", (v,)).rowcount > 0


def damaged_snapshot(store: FeedbackStore, version: Any, problem: object) -> CorruptStateError:
    """The error for a snapshot no learner can read, saying how to go on from the one before it."""
    return CorruptStateError(
        f"policy snapshot {version} in {store.path} is damaged: {problem}. The feedback rows are kept, and "
        "feedback given while it is the newest is learned once it is gone: "
        f"`rlfb store drop-snapshot {store.path} {version}` (or store.drop_snapshot({version})) removes it, "
        "ensembles opened afterwards start from the snapshot before it, and each learns the feedback on its "
        "decisions that was stored and not learned"
    )


def _snapshot(store: FeedbackStore, row: Mapping[str, Any], with_state: bool) -> dict[str, Any]:
    try:
        return _snapshot_dict(row, with_state)
    except ValueError as exc:  # its JSON was damaged outside rlfb (_loads names that a CorruptStateError)
        raise damaged_snapshot(store, row["version"], exc) from exc


def state_version(tx: Transactions) -> int:
    """Version of the newest snapshot (0 if none): one query, with no read transaction around it (a cheap poll)."""
    with tx.lock, tx.sql_errors():
        conn = tx.check_open()
        return int(conn.execute("SELECT COALESCE(MAX(version), 0) FROM policy_snapshots").fetchone()[0])
