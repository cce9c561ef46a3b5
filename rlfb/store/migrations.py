"""The store's schema: named migration steps, each applied once and recorded.

The migration set keeps its historical name, ``"rlfb.store"``: existing files
record their applied steps under it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import cast

from sqlite_utils import Database
from sqlite_utils.db import ForeignKey, Table

_Step = Callable[[Database], None]


def _table(db: Database, name: str) -> Table:
    """``db[name]``, typed as the table the steps make or change (sqlite-utils types it ``Table | View``; no step
    names a view)."""
    return cast(Table, db[name])


class Migrations:
    """A named, ordered set of schema changes, each applied once and recorded in ``_migrations``.

    Like ``sqlite_utils.migrations.Migrations``, but :meth:`apply` takes the
    write lock (``BEGIN IMMEDIATE``) before it looks at what is pending, so two
    processes opening one new file cannot both create the tables; and all
    pending steps commit together or not at all.

    >>> m = Migrations("demo")
    >>> @m()
    ... def create_things(db):
    ...     db["things"].create({"id": int}, pk="id")
    >>> db = Database(memory=True)
    >>> m.apply(db), m.apply(db), m.applied(db)
    (['create_things'], [], ['create_things'])
    """

    table = "_migrations"

    def __init__(self, name: str) -> None:
        self.name = name
        self._steps: list[tuple[str, _Step]] = []

    def __call__(self, *, name: str | None = None) -> Callable[[_Step], _Step]:
        def register(fn: _Step) -> _Step:
            step = name or fn.__name__
            if any(step == s for s, _ in self._steps):
                raise ValueError(f"migration {step!r} is already registered in {self.name!r}")
            self._steps.append((step, fn))
            return fn

        return register

    @property
    def names(self) -> list[str]:
        return [s for s, _ in self._steps]

    def applied(self, db: Database) -> list[str]:
        """Names already applied, in order. Read-only."""
        if not db[self.table].exists():
            return []
        rows = db.execute(
            f"SELECT name FROM {self.table} WHERE migration_set = ? ORDER BY rowid", [self.name]
        ).fetchall()
        return [r[0] for r in rows]

    def unknown(self, db: Database) -> list[str]:
        """Names applied to ``db`` that this set does not have: the file was written by a newer version. Read-only.

        >>> m = Migrations("demo")
        >>> db = Database(memory=True)
        >>> db["_migrations"].insert({"migration_set": "demo", "name": "m999_later", "applied_at": 0.0})
        <Table _migrations (migration_set, name, applied_at)>
        >>> m.unknown(db)
        ['m999_later']
        """
        known = set(self.names)
        return [s for s in self.applied(db) if s not in known]

    def pending(self, db: Database) -> list[str]:
        """Names not yet applied. Read-only."""
        done = set(self.applied(db))
        return [s for s, _ in self._steps if s not in done]

    def apply(self, db: Database) -> list[str]:
        """Apply what is pending, in one write transaction; return the names applied."""
        if not self.pending(db):
            return []
        conn = db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            _table(db, self.table).create(
                {"migration_set": str, "name": str, "applied_at": float},
                pk=("migration_set", "name"),
                if_not_exists=True,
            )
            done = set(self.applied(db))
            ran = []
            for step, fn in self._steps:
                if step in done:
                    continue
                fn(db)
                conn.execute(
                    f"INSERT INTO {self.table} (migration_set, name, applied_at) VALUES (?, ?, ?)",
                    (self.name, step, time.time()),
                )
                ran.append(step)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return ran


MIGRATIONS = Migrations("rlfb.store")


@functools.cache
def expected_columns() -> dict[str, frozenset[str]]:
    """Each table's columns once every step of :data:`MIGRATIONS` is applied (read off an in-memory database
    migrated once per process, so a new step needs no second list to keep in step).

    >>> sorted(expected_columns()["run_links"])
    ['parent_id', 'run_id', 'ts']
    """
    db = Database(memory=True)
    try:
        MIGRATIONS.apply(db)
        return {t.name: frozenset(c.name for c in t.columns) for t in db.tables if t.name != MIGRATIONS.table}
    finally:
        db.conn.close()


@MIGRATIONS()
def m001_events(db: Database) -> None:
    _table(db, "events").create(
        {
            "id": str,
            "ts": float,
            "query": str,
            "query_hash": str,
            "session_id": str,
            "parent_id": str,
            "query_type": str,
            "features": str,
            "weights": str,
            "arm": str,
            "policy": str,
            "explored": int,
            "propensity": float,
            "metadata": str,
            "n_chunks": int,
            "chunk_ids": str,
            "unused_ids": str,
            "created_at": float,
        },
        pk="id",
        not_null=["ts", "query_hash", "weights", "explored", "propensity", "n_chunks", "created_at"],
    )
    _table(db, "events").create_index(["ts"])
    _table(db, "events").create_index(["session_id", "ts"])
    _table(db, "events").create_index(["parent_id"])


@MIGRATIONS()
def m002_event_chunks(db: Database) -> None:
    _table(db, "event_chunks").create(
        {
            "event_id": str,
            "chunk_id": str,
            "rank": int,
            "score": float,
            "scores": str,
            "normalized": str,
            "proposed_by": str,
            "used": int,
        },
        pk=("event_id", "chunk_id"),
        not_null=["rank", "used"],
        foreign_keys=[ForeignKey("event_chunks", "event_id", "events", "id", on_delete="CASCADE")],
    )


@MIGRATIONS()
def m003_feedback(db: Database) -> None:
    _table(db, "feedback").create(
        {
            "id": int,
            "event_id": str,
            "chunk_id": str,
            "signal": str,
            "kind": str,
            "raw_value": float,
            "value": float,
            "discount": float,
            "discounted": float,
            "reward": float,
            "ts": float,
            "delay": float,
            "in_window": int,
            "session_id": str,
            "user_id": str,
            "idempotency_key": str,
            "key": str,
            "comment": str,
            "created_at": float,
        },
        pk="id",
        not_null=[
            "event_id", "signal", "kind", "value", "discount", "discounted", "reward", "ts", "delay",
            "in_window",
        ],
        foreign_keys=[ForeignKey("feedback", "event_id", "events", "id", on_delete="CASCADE")],
    )
    # Partial: only feedback that has a key is indexed (SQLite uses it for "key = ?" and "key IN (...)").
    db.execute(
        "CREATE UNIQUE INDEX idx_feedback_idempotency_key ON feedback (idempotency_key) "
        "WHERE idempotency_key IS NOT NULL"
    )
    _table(db, "feedback").create_index(["event_id"])
    _table(db, "feedback").create_index(["ts"])


@MIGRATIONS()
def m004_rewards(db: Database) -> None:
    # Reached through feedback_id (indexed; deleting feedback, or its event, cascades here).
    # event_id is a copy for notebooks: neither indexed nor a foreign key, since a second
    # index costs a fifth of batched ingestion and an unindexed foreign key would make
    # every event delete scan this table.
    _table(db, "rewards").create(
        {"id": int, "feedback_id": int, "event_id": str, "chunk_id": str, "reward": float, "ts": float},
        pk="id",
        not_null=["feedback_id", "event_id", "reward", "ts"],
        foreign_keys=[ForeignKey("rewards", "feedback_id", "feedback", "id", on_delete="CASCADE")],
    )
    _table(db, "rewards").create_index(["feedback_id"])


@MIGRATIONS()
def m005_policy_snapshots(db: Database) -> None:
    _table(db, "policy_snapshots").create(
        {"version": int, "ts": float, "policy": str, "weights": str, "state": str},
        pk="version",
        not_null=["ts", "weights", "state"],
    )
    _table(db, "policy_snapshots").create_index(["ts"])


@MIGRATIONS()
def m006_run_links(db: Database) -> None:
    # Parent links of framework runs (a LangChain chain and its sub-runs) that are not events
    # themselves, so feedback given on a top-level run id finds the retrievals nested below it.
    _table(db, "run_links").create(
        {"run_id": str, "parent_id": str, "ts": float}, pk="run_id", not_null=["parent_id"]
    )
    _table(db, "run_links").create_index(["parent_id"])


@MIGRATIONS()
def m007_sampling_temperature(db: Database) -> None:
    # the Plackett-Luce temperature a sampled ranking was drawn with (NULL: none, or logged before it was kept)
    _table(db, "events").add_column("sampling_temperature", float)


@MIGRATIONS()
def m008_failed_runs(db: Database) -> None:
    # Runs that raised (a retry's attempt, a branch a fallback replaced; LangChain runs a fallback's attempts
    # as top-level runs, which have no link to mark): feedback on the runs above skips what was retrieved
    # inside, and a follow-up question does not judge it, since nobody saw an answer from it.
    _table(db, "failed_runs").create({"run_id": str, "ts": float}, pk="run_id", not_null=["ts"])


@MIGRATIONS()
def m009_snapshot_kind(db: Database) -> None:
    # the kind of ensemble each snapshot is of (rlfb.snapshot_kind.SnapshotKind.key), written with it, so that a
    # save can drop the older snapshots of its kind by index: one after every feedback, each a copy of the whole
    # learned state (megabytes), grew a soak test's file to 4 GB in 10,000 retrievals. NULL: saved before it was kept.
    _table(db, "policy_snapshots").add_column("kind", str)
    _table(db, "policy_snapshots").create_index(["kind", "version"])


@MIGRATIONS()
def m010_settings(db: Database) -> None:
    # settings the file itself must keep, whoever opens it: store_text. Set per connection only, a restart that
    # opened a store_text=False file by its path (the default, True) wrote query text into it, and keyed the
    # learner by the text, so nothing the memory had learned under the hashed keys was found again. A file
    # made before this step keeps no text if any of its events kept none (that bug mixed the two, and a
    # privacy app must not be refused its own file); one with text events only keeps text; one without
    # events, what the next opener says.
    _table(db, "settings").create({"key": str, "value": str}, pk="key")
    hashed, any_event = db.execute(
        "SELECT EXISTS(SELECT 1 FROM events WHERE query IS NULL), EXISTS(SELECT 1 FROM events)"
    ).fetchone()
    if any_event:
        _table(db, "settings").insert({"key": "store_text", "value": "false" if hashed else "true"})


@MIGRATIONS()
def m011_snapshot_kinds(db: Database) -> None:
    # the kind of each snapshot saved before m009 (rlfb.snapshot_kind.SnapshotKind.key), read off its state, so
    # that every snapshot is grouped by the kind column: until 2026-12-06 they were grouped by their states in
    # SQL, and a save (keeping the newest of its kind by the column) never dropped one of them; a snapshot
    # whose state cannot be read is a kind of its own, as it was. Safe to rerun: only rows with no kind.
    import json

    from rlfb.errors import CorruptStateError
    from rlfb.snapshot_kind import SnapshotKind
    from rlfb.store.codec import _dec

    kinds = []
    for version, policy, state in db.execute("SELECT version, policy, state FROM policy_snapshots WHERE kind IS NULL"):
        try:
            key = SnapshotKind.of({"policy": _dec(policy), "state": json.loads(_dec(state))}).key()
        except (CorruptStateError, ValueError, TypeError, RecursionError):
            key = json.dumps(["unreadable snapshot", version])
        kinds.append((key, version))
    db.conn.executemany("UPDATE policy_snapshots SET kind = ? WHERE version = ?", kinds)


@MIGRATIONS()
def m012_feedback_learned(db: Database) -> None:
    # whether a learner has taken each feedback row (1), or there is nothing in it to learn (0: out of the
    # attribution window, a repeat); NULL: stored and not learned yet. An ensemble learns the NULL rows on its
    # decisions when it next looks (rlfb.feedback_learning.catch_up): feedback stored by a process killed before
    # it learned it, stored while the newest snapshot was damaged, on a decision of a policy no app was running,
    # or by FeedbackStore.record_feedback alone, was stored and never learned before. Rows stored before this step
    # were learned, or not, by the rules of their day: they count as settled, and so does a row written without
    # naming the column (DEFAULT 1): an rlfb of before this step still running on the file while another process
    # upgrades it learns what it stores, and a NULL there was learned again after it (an audit's rolling upgrade).
    # rlfb writes NULL itself for a row to learn. Safe to rerun: once the column is there, nothing changes.
    if "learned" not in {c.name for c in db["feedback"].columns}:
        db.execute("ALTER TABLE feedback ADD COLUMN learned INTEGER DEFAULT 1")
        db.execute("UPDATE feedback SET learned = 0 WHERE in_window = 0")
    # partial: the rows still to learn are few, and an ensemble looks for them at every refresh
    db.execute("CREATE INDEX IF NOT EXISTS idx_feedback_unlearned ON feedback (id) WHERE learned IS NULL")


@MIGRATIONS()
def m013_feedback_held(db: Database) -> None:
    # learned = 2: a running learner has learned the row and not yet written that in a snapshot (persist_interval
    # above 0). Marked 1 with the snapshot that writes it; a process killed first leaves it 2, and the next
    # ensemble to start learns it again (rlfb.feedback_learning.catch_up). Partial, as idx_feedback_unlearned:
    # such rows are few, and looked for at each ensemble's start. Safe to rerun.
    db.execute("CREATE INDEX IF NOT EXISTS idx_feedback_held ON feedback (id) WHERE learned = 2")


@MIGRATIONS()
def m014_run_tree_ts(db: Database) -> None:
    # a prune deletes the run links and the marks of failed runs older than its cutoff by ts: unindexed, each
    # delete scanned its whole table at every prune, whether it deleted anything or not (222 ms with 1.5 million
    # links, at every opening of a store with a retention; an audit of a store at scale, 2026-12-07). Safe to rerun.
    db.execute("CREATE INDEX IF NOT EXISTS idx_run_links_ts ON run_links (ts)")
    db.execute("CREATE INDEX IF NOT EXISTS idx_failed_runs_ts ON failed_runs (ts)")
