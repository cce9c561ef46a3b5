"""The :class:`FeedbackStore` class: connection, transactions, events, feedback and policy snapshots.

See :mod:`rlfb.store` for what each table keeps and how the file is kept safe.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from sqlite_utils import Database

from rlfb.errors import (
    CorruptStateError,
    DuplicateEventError,
    DuplicateIdError,
    FeedbackBeforeEventError,
    FutureTimestampError,
    IdempotencyConflictError,
    InvalidWeightsError,
    ReadOnlyStoreError,
    RlfbError,
    StoreBusyError,
    UnknownChunkError,
    UnknownEventError,
    ValidationError,
)
from rlfb.reward import RewardFunction, as_timestamp, finite_float
from rlfb.snapshot_kind import SnapshotKind
from rlfb.store import reports
from rlfb.store.checks import (
    _MEMORY,
    _batches,
    _check_event_id,
    _check_id,
    _check_int,
    _check_limit,
    _check_path,
    _check_weights,
    _get,
    _items,
    _marks,
    _number_map,
    _opt_str,
    _positive,
    _req_str,
)
from rlfb.store.codec import _dec, _decode_row, _dumps, _enc, _loads, query_hash
from rlfb.store.migrations import MIGRATIONS, expected_columns
from rlfb.store.records import (
    _DECISION_KEYS,
    _EVENT_COLS,
    _EVENT_PARAMS,
    _FEEDBACK_PARAMS,
    _N_EVENT_COLS,
    FeedbackRecord,
    _as_duplicate,
    _chunk_dict,
    _event_dict,
    _EventInfo,
    _feedback_dict,
    _Pending,
    _prefixed,
    _snapshot_dict,
)
from rlfb.types import validate_flag

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_TABLES = frozenset(
    {"events", "event_chunks", "feedback", "rewards", "policy_snapshots", "run_links", "failed_runs"}
)


def _read_only(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_READONLY: the file, or the folder its WAL side files go in, cannot be written."""
    return isinstance(exc, sqlite3.OperationalError) and "readonly" in str(exc)


def _locked(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_BUSY / SQLITE_LOCKED: another connection held the lock for the whole busy timeout."""
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


# What tells one ensemble's snapshots from another's (rlfb.snapshot_kind.SnapshotKind, here in SQL): the
# policy, and from the state the retrievers, the chunk exploration, the memory's embedding dimension and dense
# model, the policy's hyperparameters (its weights left out, as same_hyperparameters leaves them). A BLOB state
# (one holding a lone surrogate) is read as text; one that is no JSON at all is a kind of its own. An older
# snapshot with no policy column is grouped apart from those that name it: prune keeps one more, never one less.
_WAL_SIZE_LIMIT = 64 * 1024 * 1024  # bytes; PRAGMA journal_size_limit
_TEXT = "CAST(state AS TEXT)"
_VALID = f"typeof(state) IN ('text', 'blob') AND json_valid({_TEXT})"
_STATE = f"CASE WHEN {_VALID} THEN {_TEXT} END"
_SNAPSHOT_KIND = ", ".join([
    "policy",
    f"json_extract({_STATE}, '$.retrievers')",
    f"json_extract({_STATE}, '$.exploration.kind')",
    f"json_extract({_STATE}, '$.memory.dim')",
    f"json_extract({_STATE}, '$.memory.model')",
    f"json_remove(json_extract({_STATE}, '$.policy.params'), '$.weights')",
    f"CASE WHEN {_VALID} THEN 0 ELSE version END",
])


class FeedbackStore:
    """Retrieval events, their chunks, feedback, rewards and policy snapshots in one SQLite file.

    Parameters
    ----------
    path
        Database file (a ``str`` or ``os.PathLike``), or ``":memory:"``. Any other
        type, a directory, or a file in a folder that does not exist raises
        :class:`ValidationError`.
    store_text
        Keep the query text. ``False`` keeps only its sha256 (privacy).
    reward
        The :class:`rlfb.reward.RewardFunction`; the default settings otherwise.
    attribution_window
        Seconds after a retrieval during which feedback is learned from (24 h).
        Later feedback is stored with ``in_window=0`` and gets no reward rows.
    stats_window
        Sliding window of :meth:`stats`, in seconds (90 days).
    retention
        Seconds of history to keep, at least ``attribution_window`` (an event
        must outlive its window); ``None`` keeps everything. Older rows are
        pruned when the store opens and whenever :meth:`prune` is called (a
        long-running process should call it now and then).
    clock_skew
        Tolerance, in seconds, for timestamps in the future or feedback slightly
        before its event (300).
    busy_timeout
        Seconds a writer waits for the lock before giving up (30) with
        :class:`StoreBusyError`; opening a file that needs a migration, or its
        switch to WAL, is a write and waits likewise.
    synchronous
        ``"NORMAL"`` (default; survives process crashes) or ``"FULL"`` (also
        survives power loss). See the module docstring.
    clock
        Source of "now" (``time.time``); tests can pin it. It must return a
        finite number, else the call that reads it raises :class:`ValidationError`.
    snapshots_kept
        Policy snapshots kept of each kind of ensemble (5): a save drops the older
        ones of its kind. An ensemble snapshots its whole learned state after each
        feedback by default (megabytes once it has learned much: kept, every one, a
        soak test's file reached 4 GB after 10,000 retrievals), and reads back only
        its kind's newest. ``None`` keeps every snapshot (weights over time,
        :meth:`policy_history`).

    The store is safe to share between threads (one connection behind a lock).
    Do not carry an open store across ``fork()``; open one per process.
    """

    def __init__(
        self,
        path: str | Path = ":memory:",
        *,
        store_text: bool = True,
        reward: RewardFunction | None = None,
        attribution_window: float = 24 * 3600,
        stats_window: float = 90 * 86400,
        retention: float | None = None,
        clock_skew: float = 300,
        busy_timeout: float = 30.0,
        synchronous: str = "NORMAL",
        clock: Callable[[], float] = time.time,
        snapshots_kept: int | None = 5,
    ) -> None:
        self.store_text = validate_flag(store_text, "store_text")  # bool("no") would keep the query text
        self.reward = reward if reward is not None else RewardFunction()
        if not isinstance(self.reward, RewardFunction):
            raise ValidationError(f"reward must be a RewardFunction, got {type(reward).__name__}")
        self.attribution_window = float(finite_float(attribution_window, "attribution_window"))
        _positive(self.attribution_window, "attribution_window")
        self.stats_window = float(finite_float(stats_window, "stats_window"))
        _positive(self.stats_window, "stats_window")
        self.retention = self._check_retention(retention, allow_none=True)
        self.snapshots_kept = None if snapshots_kept is None else _check_int(snapshots_kept, "snapshots_kept", 1)
        self.clock_skew = finite_float(clock_skew, "clock_skew")
        if self.clock_skew < 0:
            raise ValidationError(f"clock_skew must not be negative, got {clock_skew}")
        self.busy_timeout = float(_positive(busy_timeout, "busy_timeout"))  # type: ignore[arg-type]
        sync = str(synchronous).upper()
        if sync not in _SYNCHRONOUS:
            raise ValidationError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        self.synchronous = sync
        if not callable(clock):
            raise ValidationError(f"clock must be a callable returning unix seconds, got {type(clock).__name__}")
        self._clock = clock
        self.path = _check_path(path)
        self._memory = self.path in _MEMORY
        self._lock = threading.RLock()
        self._exclusive = 0  # depth of exclusive() blocks on this connection
        self._undo: list[list[Callable[[], None]]] = []  # per open exclusive() block: on_rollback callbacks
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.OperationalError as exc:  # past _check_path: no permission, or a folder removed since
            raise ValidationError(f"cannot open path {self.path!r}: {exc}") from exc
        self._conn = conn
        # a store dropped without close() (the README's examples never call it) closes its connection when
        # collected: Python 3.13 warns of an unclosed one (a ResourceWarning, an error under -W error)
        self._finalizer = weakref.finalize(self, conn.close)
        self._closed = False
        self.db = Database(conn, execute_plugins=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            theirs = sorted(set(self.db.table_names()) - {MIGRATIONS.table})
            ours = MIGRATIONS.table in self.db.table_names() and {"migration_set", "name"} <= {
                c.name for c in self.db[MIGRATIONS.table].columns
            }  # a table of that name with other columns is another tool's
            if theirs and not ours:
                # another application's database: writing rlfb's schema into it would change a file
                # that is not ours (and a look with `rlfb store stats` would do it too)
                raise CorruptStateError(
                    f"{self.path} is not an rlfb feedback store: it holds other tables {theirs[:5]}; "
                    "give rlfb a file of its own"
                )
            self.journal_mode = "memory" if self._memory else self._enable_wal()
            conn.execute(f"PRAGMA synchronous = {sync}")
            conn.execute("PRAGMA foreign_keys = ON")
            # the write-ahead log is cut back to this size after a checkpoint: one large transaction (a prune)
            # left it at 140 MB for good
            conn.execute(f"PRAGMA journal_size_limit = {_WAL_SIZE_LIMIT}")
            self.migrations_applied = MIGRATIONS.apply(self.db)
            missing = sorted(_TABLES.difference(self.db.table_names()))
            if missing:  # recorded as migrated, yet gone: dropped by hand
                raise CorruptStateError(f"{self.path} is a feedback store without its tables {missing}")
            # a column dropped by hand (its migration still recorded) failed later, at the first write or read
            # that named it, as a raw OperationalError: one PRAGMA table_info per table finds it now
            lacking = {
                table: sorted(cols.difference(c.name for c in self.db[table].columns))
                for table, cols in sorted(expected_columns().items()) if table in _TABLES
            }
            lacking = {table: cols for table, cols in lacking.items() if cols}
            if lacking:
                raise CorruptStateError(f"{self.path} is a feedback store whose tables lack the columns {lacking}")
            if self.retention is not None:
                self.prune()
        except CorruptStateError:
            self.close()
            raise
        except sqlite3.DatabaseError as exc:
            self.close()
            if isinstance(exc, StoreBusyError):  # from prune, named already
                raise
            if _locked(exc):  # another connection holds the file: not damage (a migration waits for the lock)
                raise self._busy(exc) from exc
            if _read_only(exc):
                raise ReadOnlyStoreError(
                    f"{self.path} is read-only: rlfb writes to its feedback store (in WAL mode, also beside it): {exc}"
                ) from exc
            raise CorruptStateError(f"cannot open {self.path} as a feedback store: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def _check_retention(self, retention: Any, allow_none: bool = False) -> float | None:
        keep = _positive(retention, "retention", allow_none=allow_none)
        # pruning an event that is still inside the window would lose feedback that may yet arrive for it
        if keep is not None and keep < self.attribution_window:
            raise ValidationError(
                f"retention ({keep:g}s) must be at least the attribution window ({self.attribution_window:g}s): "
                "events younger than the window can still receive feedback"
            )
        return keep

    def _enable_wal(self) -> str:
        mode = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
        deadline = time.monotonic() + self.busy_timeout
        while mode.lower() != "wal":
            try:
                mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:  # another process is switching it: wait and retry
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        return str(mode).lower()

    # -- lifecycle -----------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (idempotent); not inside :meth:`exclusive`, whose writes it would drop."""
        with self._lock:
            if getattr(self, "_exclusive", 0):
                raise RlfbError("cannot close a FeedbackStore inside its exclusive() block: its writes would be lost")
            if not getattr(self, "_closed", True):
                self._closed = True
                self._finalizer()  # closes the connection, once

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return getattr(self, "_closed", True)

    def __enter__(self) -> FeedbackStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FeedbackStore({self.path!r})"

    @property
    def schema_migrations(self) -> list[str]:
        """Names of the migrations applied to this database."""
        with self._lock:
            self._check_open()  # closed: the named error, as every other call gives
            return MIGRATIONS.applied(self.db)

    def _now(self) -> float:
        # checked each time it is read: a bad clock would otherwise fail deep inside, as a bare ValueError
        return finite_float(self._clock(), "clock() value")

    def _check_open(self) -> sqlite3.Connection:
        if self._closed:
            raise RlfbError("FeedbackStore is closed")
        return self._conn

    @contextmanager
    def _sql_errors(self) -> Iterator[None]:
        """Name SQLite's errors about the file: damage after opening, or a file that cannot be written."""
        try:
            yield
        except StoreBusyError:
            raise  # named already, by the store it is about (another store's, inside an exclusive() block of this one)
        except sqlite3.DatabaseError as exc:
            if _read_only(exc):
                raise ReadOnlyStoreError(f"feedback store {self.path} is read-only: {exc}") from exc
            if type(exc) is sqlite3.DatabaseError:  # SQLITE_CORRUPT / SQLITE_NOTADB, not a constraint or lock
                raise CorruptStateError(f"feedback store {self.path} is damaged: {exc}") from exc
            if _locked(exc):
                raise self._busy(exc) from exc
            raise

    def _busy(self, exc: sqlite3.OperationalError) -> StoreBusyError:
        return StoreBusyError(
            f"feedback store {self.path} stayed locked for its busy_timeout ({self.busy_timeout:g} s): "
            "another connection holds its write lock (another process, or another FeedbackStore on this "
            f"file inside exclusive() in this thread, which would wait on itself): {exc}"
        )

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._sql_errors():
            conn = self._check_open()
            if self._exclusive:
                # inside exclusive(): the write lock is held already; a savepoint undoes only this write
                conn.execute("SAVEPOINT rlfb_write")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK TO rlfb_write")
                    conn.execute("RELEASE rlfb_write")
                    raise
                conn.execute("RELEASE rlfb_write")
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query inside sees one snapshot."""
        with self._lock, self._sql_errors():
            conn = self._check_open()
            if conn.in_transaction:
                yield conn
                return
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    @property
    def lock(self) -> threading.RLock:
        """The in-process lock every operation of this store holds while it runs.

        Code that holds a lock of its own while it calls the store takes this one
        first, so that every thread takes the two in one order (an ensemble does).
        """
        return self._lock

    @contextmanager
    def exclusive(self) -> Iterator[FeedbackStore]:
        """Hold the store's write lock for the whole block, across threads and processes.

        Reads inside see the newest data and no other writer can commit until the block ends,
        so a read-modify-write of the policy state (read the newest snapshot, learn, save) is
        not interleaved with another process's. Writes inside commit together at the end, or
        none of them on an error; a nested block that raises undoes its own writes only, when
        the outer block catches the error. Keep the block short: other writers wait up to
        ``busy_timeout``.
        """
        with self._lock:
            self._undo.append([])
            try:
                # the outermost block is one write transaction (BEGIN IMMEDIATE ... COMMIT or ROLLBACK); the
                # writes inside, and nested blocks, are savepoints of it: a nested block that raises undoes its
                # own writes even when the outer block catches the error (it used to join the transaction and
                # commit them)
                with self._write():
                    self._exclusive += 1
                    try:
                        yield self
                    finally:
                        self._exclusive -= 1
            except BaseException as exc:
                self._run_undo(self._undo.pop(), exc)
                raise
            undo = self._undo.pop()
            if self._undo:  # committed into the enclosing block, whose rollback undoes these writes too
                self._undo[-1].extend(undo)

    @property
    def exclusive_depth(self) -> int:
        """How many :meth:`exclusive` blocks are open on this connection (0 outside them).

        Read it inside a block of one's own (holding the store's lock): there, a depth above 1 says the
        caller holds a block around it.
        """
        return self._exclusive

    def on_rollback(self, undo: Callable[[], None]) -> None:
        """Call ``undo`` if the writes made so far in the current :meth:`exclusive` block are rolled back.

        That is when the block, or any block around it, ends with an error, or the commit fails; a block
        that commits into an enclosing one hands its callbacks on to it, and the outermost commit drops
        them. An ensemble uses it to take back what its in-memory learner learned from feedback whose rows
        were undone, so that a retry with the same idempotency key is not learned twice. Callbacks run
        newest first, holding the store's lock; an error in one is added to the block's error as a note (a
        warning on Python 3.10), and the others still run.
        """
        if not callable(undo):
            raise ValidationError(f"on_rollback takes a callable, got {type(undo).__name__}")
        with self._lock:
            if not self._exclusive:
                raise RlfbError("on_rollback is only meaningful inside an exclusive() block")
            self._undo[-1].append(undo)

    @staticmethod
    def _run_undo(undo: list[Callable[[], None]], exc: BaseException) -> None:
        for fn in reversed(undo):
            try:
                fn()
            except Exception as err:  # the block's own error is what the caller must see; keep this one beside it
                note = f"and an on_rollback callback failed: {err!r}"
                add_note = getattr(exc, "add_note", None)  # Python 3.11+; on 3.10 a warning says it instead
                if add_note is not None:
                    add_note(note)
                else:
                    warnings.warn(note, RuntimeWarning, stacklevel=2)

    def _timestamp(self, x: Any, name: str, now: float) -> float:
        ts = now if x is None else as_timestamp(x, name)
        if ts > now + self.clock_skew:
            raise FutureTimestampError(
                f"{name} {ts:.3f} is {ts - now:.0f}s in the future "
                f"(clock-skew tolerance {self.clock_skew:g}s)"
            )
        return ts

    # -- events --------------------------------------------------------------------
    def log_event(
        self,
        query: str,
        decision: Mapping[str, Any] | Any,
        chunks: Sequence[Mapping[str, Any] | Any],
        *,
        session_id: str | None = None,
        features: Mapping[str, Any] | None = None,
        query_type: str | None = None,
        event_id: str | None = None,
        parent_id: str | None = None,
        timestamp: float | datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Log one retrieval and the chunks it returned; return its event id (uuid4 hex by default).

        ``decision`` is ``{"weights", "arm", "propensity", "explored", "policy"}``,
        with ``"sampling_temperature"`` (positive) for a sampled ranking (or a
        :class:`rlfb.policies.base.Decision`); ``weights`` is required, any other
        key raises :class:`ValidationError` (a misspelt one would log a default). Each chunk is a mapping (or
        a :class:`rlfb.types.Hit`) with ``chunk_id``, ``rank`` (1-based; defaults
        to its position), ``score``, ``scores``, ``normalized``, ``proposed_by``
        and optionally ``used`` (default true: response-level feedback is spread
        over used chunks). A missing retriever score may be ``None``; NaN and
        infinity are rejected. ``features`` and ``metadata`` are JSON mappings
        whose keys, at any depth, are str (JSON would turn ``1`` into ``"1"``;
        another key raises :class:`ValidationError`). A logged id raises
        :class:`DuplicateEventError`.
        """
        return self.log_events(
            [
                {
                    "query": query,
                    "decision": decision,
                    "chunks": chunks,
                    "session_id": session_id,
                    "features": features,
                    "query_type": query_type,
                    "event_id": event_id,
                    "parent_id": parent_id,
                    "timestamp": timestamp,
                    "metadata": metadata,
                }
            ]
        )[0]

    def log_events(self, events: Iterable[Mapping[str, Any]]) -> list[str]:
        """Log many events (each a dict of :meth:`log_event` arguments) in one transaction; all or none."""
        now = self._now()
        prepared = []
        seen: set[str] = set()
        for i, kw in enumerate(_items(events, "events", "mappings of log_event arguments")):
            if not isinstance(kw, Mapping):
                raise ValidationError(f"event {i} must be a mapping of log_event arguments")
            unknown = set(kw) - _EVENT_PARAMS
            if unknown:
                raise ValidationError(f"event {i}: unknown argument(s) {sorted(unknown)}")
            ev, rows = self._prepare_event(now=now, **kw)
            if ev[0] in seen:
                raise DuplicateEventError(f"event id {ev[0]!r} appears twice in the batch")
            seen.add(ev[0])
            prepared.append((ev, rows))
        if not prepared:
            return []
        with self._write() as conn:
            try:
                conn.executemany(
                    f"INSERT INTO events ({_EVENT_COLS}) VALUES ({_marks(_N_EVENT_COLS)})",
                    [ev for ev, _ in prepared],
                )
            except sqlite3.IntegrityError as exc:
                if "events.id" in str(exc):
                    ids = [ev[0] for ev, _ in prepared]
                    taken = [
                        _dec(r[0])
                        for b in _batches(ids)
                        for r in conn.execute(
                            f"SELECT id FROM events WHERE id IN ({_marks(len(b))})", list(b)
                        )
                    ]
                    dup = taken[0] if taken else ids[0]
                    raise DuplicateEventError(f"event id {dup!r} was already logged") from exc
                raise
            conn.executemany(
                "INSERT INTO event_chunks "
                "(event_id, chunk_id, rank, score, scores, normalized, proposed_by, used) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [row for _, rows in prepared for row in rows],
            )
        return [_dec(ev[0]) for ev, _ in prepared]

    def _prepare_event(
        self,
        query: str,
        decision: Mapping[str, Any] | Any,
        chunks: Sequence[Any],
        *,
        now: float,
        session_id: str | None = None,
        features: Mapping[str, Any] | None = None,
        query_type: str | None = None,
        event_id: str | None = None,
        parent_id: str | None = None,
        timestamp: Any = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
        if not isinstance(query, str):
            raise ValidationError(f"query must be a str, got {type(query).__name__}")
        eid, ts, session_id, parent_id, meta_json = self._event_args(event_id, session_id, parent_id, timestamp,
                                                                     metadata, now)
        if hasattr(decision, "to_dict") and not isinstance(decision, Mapping):
            decision = decision.to_dict()
        if not isinstance(decision, Mapping):
            raise ValidationError(f"decision must be a mapping, got {type(decision).__name__}")
        unknown = set(decision) - _DECISION_KEYS
        if unknown:  # ignored, a misspelt key logged its default: a propensity of 1 for an explored ranking
            raise ValidationError(
                f"decision: unknown key(s) {sorted(unknown, key=repr)}; it takes {sorted(_DECISION_KEYS)}"
            )
        if "weights" not in decision:
            raise InvalidWeightsError("decision must include 'weights'")
        weights = _check_weights(decision["weights"])
        propensity = finite_float(decision.get("propensity", 1.0), "propensity")
        if not 0.0 < propensity <= 1.0:
            raise ValidationError(f"propensity must lie in (0, 1], got {propensity}")
        explored = decision.get("explored", False)
        if not isinstance(explored, (bool, np.bool_)):
            raise ValidationError(f"explored must be a bool, got {explored!r}")
        arm = _opt_str(decision.get("arm"), "arm")
        policy = _opt_str(decision.get("policy"), "policy")
        temp = decision.get("sampling_temperature")
        if temp is not None:
            temp = finite_float(temp, "sampling_temperature")
            if temp <= 0:
                raise ValidationError(f"sampling_temperature must be positive, got {temp}")
        if features is not None and not isinstance(features, Mapping):
            raise ValidationError(f"features must be a mapping, got {type(features).__name__}")
        if isinstance(chunks, (str, Mapping)) or not isinstance(chunks, Iterable):
            raise ValidationError("chunks must be a sequence of chunk mappings")
        rows = []
        ids: set[str] = set()
        ranks: set[int] = set()
        unused: list[str] = []
        enc_eid = _enc(eid)
        for pos, c in enumerate(chunks):
            cid = _get(c, "chunk_id")
            if not isinstance(cid, str):
                raise ValidationError(f"chunk {pos}: chunk_id must be a str, got {cid!r}")
            if cid in ids:
                raise DuplicateIdError(f"duplicate chunk id in event: {cid!r}")
            ids.add(cid)
            rank = _check_int(_get(c, "rank", pos + 1), f"chunk {cid!r}: rank")
            if rank in ranks:
                raise ValidationError(f"chunk {cid!r}: rank {rank} is used twice")
            ranks.add(rank)
            score = _get(c, "score")
            score = None if score is None else finite_float(score, f"chunk {cid!r} score")
            proposed = _get(c, "proposed_by", ()) or ()
            if isinstance(proposed, str) or not all(isinstance(p, str) for p in proposed):
                raise ValidationError(f"chunk {cid!r}: proposed_by must be a sequence of retriever names")
            used = validate_flag(_get(c, "used", True), f"chunk {cid!r}: used")  # "no" would count as used
            if not used:
                unused.append(cid)
            rows.append(
                (
                    enc_eid,
                    _enc(cid),
                    rank,
                    score,
                    _dumps(_number_map(_get(c, "scores"), f"chunk {cid!r} scores"), "scores"),
                    _dumps(_number_map(_get(c, "normalized"), f"chunk {cid!r} normalized"), "normalized"),
                    _dumps(list(proposed), "proposed_by"),
                    1 if used else 0,
                )
            )
        ev = (
            enc_eid,
            ts,
            _enc(query) if self.store_text else None,
            query_hash(query),
            _enc(session_id),
            _enc(parent_id),
            _enc(_opt_str(query_type, "query_type")),
            None if features is None else _dumps(dict(features), "features", str_keys=True),
            _dumps(weights, "weights"),
            _enc(arm),
            _enc(policy),
            1 if explored else 0,
            propensity,
            meta_json,
            len(rows),
            _dumps([cid for _, cid, *_ in sorted((r[2], _dec(r[1])) for r in rows)], "chunk_ids"),
            _dumps(unused, "unused_ids") if unused else None,
            now,
            temp,
        )
        return ev, rows

    def _event_args(
        self, event_id: Any, session_id: Any, parent_id: Any, timestamp: Any, metadata: Any, now: float
    ) -> tuple[str, float, str | None, str | None, str | None]:
        """An event's id (a new one for ``None``), timestamp, session and parent ids and metadata JSON, checked."""
        eid = uuid.uuid4().hex if event_id is None else _req_str(event_id, "event_id")
        ts = self._timestamp(timestamp, "timestamp", now)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ValidationError(f"metadata must be a mapping, got {type(metadata).__name__}")
        meta_json = None if metadata is None else _dumps(dict(metadata), "metadata", str_keys=True)
        return eid, ts, _opt_str(session_id, "session_id"), _opt_str(parent_id, "parent_id"), meta_json

    def check_event_args(
        self,
        *,
        event_id: str | None = None,
        session_id: str | None = None,
        parent_id: str | None = None,
        timestamp: float | datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Raise what :meth:`log_event` would for these arguments (an id already logged included), writing nothing.

        An ensemble checks them before it ranks: a retrieval refused only when logged had already moved
        the policy's random state and the memory's count of asks.
        """
        self._event_args(event_id, session_id, parent_id, timestamp, metadata, self._now())
        if event_id is not None and self.has_event(event_id):
            raise DuplicateEventError(f"event id {event_id!r} was already logged")

    def has_event(self, event_id: str) -> bool:
        """Whether ``event_id`` was logged."""
        enc = _enc(_check_id(event_id, "event_id", allow_empty=True))  # "" is never logged: False
        with self._read() as conn:
            return conn.execute("SELECT 1 FROM events WHERE id = ?", (enc,)).fetchone() is not None

    def event(self, event_id: str) -> dict[str, Any]:
        """The logged event, decoded, with its ``chunks`` in rank order; :class:`UnknownEventError` if absent.

        Keys: ``id`` (and ``event_id``), ``timestamp``, ``query`` (``None`` with
        ``store_text=False``), ``query_hash``, ``query_hashed`` (true when only
        the hash was kept), ``session_id``, ``parent_id``,
        ``query_type``, ``features``, ``weights``, ``retrievers`` (the weights'
        keys, in order), ``arm``, ``policy``, ``explored``, ``propensity``,
        ``decision`` (the five decision fields as one dict), ``metadata``,
        ``created_at`` and ``chunks``.
        """
        events = self._select_events("e.id = ?", [_enc(_check_event_id(event_id))])
        if not events:
            raise UnknownEventError(f"unknown event id {event_id!r}")
        return events[0]

    def events_for_session(
        self, session_id: str, limit: int | None = None, *, with_chunks: bool = True
    ) -> list[dict[str, Any]]:
        """The session's events, oldest first; with ``limit``, only the most recent ``limit`` of them."""
        lim = "" if limit is None else f" LIMIT {_check_limit(limit)}"
        rows = self._select_events(
            "e.session_id = ?",
            [_enc(_check_id(session_id, "session_id", allow_empty=True))],  # "" may be logged as a session
            order="e.ts DESC, e.rowid DESC",
            tail=lim,
            with_chunks=with_chunks,
        )
        return rows[::-1]

    def last_event(self, session_id: str) -> dict[str, Any] | None:
        """The session's most recent event, or ``None``."""
        rows = self.events_for_session(session_id, 1)
        return rows[-1] if rows else None

    def children(self, parent_id: str, *, with_chunks: bool = True) -> list[dict[str, Any]]:
        """Events logged with ``parent_id`` (oldest first)."""
        enc = _enc(_check_id(parent_id, "parent_id", allow_empty=True))  # "" may be logged as a parent
        return self._select_events("e.parent_id = ?", [enc], with_chunks=with_chunks)

    def descendants(self, root_id: str, *, with_chunks: bool = True) -> list[dict[str, Any]]:
        """Every event below ``root_id`` in the parent chain (children, their children, ...), oldest first.

        ``root_id`` need not be an event itself (a LangChain chain run id, say).
        Cycles in the parent chain are harmless.
        """
        cte = (
            "WITH RECURSIVE d(id) AS (SELECT id FROM events WHERE parent_id = ? "
            "UNION SELECT e.id FROM events e JOIN d ON e.parent_id = d.id) "
        )
        enc = _enc(_check_id(root_id, "root_id", allow_empty=True))
        return self._select_events("e.id IN (SELECT id FROM d)", [enc], with_chunks=with_chunks, cte=cte)

    def resolve(self, run_id: str) -> list[str]:
        """Event ids a run id stands for: itself if it is an event, else its descendants' ids."""
        _check_id(run_id, "run_id", allow_empty=True)  # named as the caller knows it, not as event_id
        if self.has_event(run_id):
            return [run_id]
        return [e["id"] for e in self.descendants(run_id, with_chunks=False)]

    def link_runs(self, links: Iterable[tuple[str, str]]) -> int:
        """Record ``(run_id, parent_id)`` links of runs that are not events (a chain's sub-runs).

        :meth:`resolve_run` follows them from a top-level run id down to the
        retrievals logged below it. A run keeps its first parent; relinking is a
        no-op. Returns the number of new links.
        """
        pairs = []
        for i, link in enumerate(_items(links, "links", "(run_id, parent_id) pairs")):
            # a str would unpack too: "ab" as ("a", "b")
            pair = None if isinstance(link, (str, bytes, Mapping)) or not isinstance(link, Iterable) else tuple(link)
            if pair is None or len(pair) != 2:
                raise ValidationError(f"link {i} must be a (run_id, parent_id) pair, got {link!r:.80}")
            pairs.append((_req_str(pair[0], f"link {i}: run_id"), _req_str(pair[1], f"link {i}: parent_id")))
        if not pairs:
            return 0
        now = self._now()
        rows = [(_enc(run), _enc(parent), now) for run, parent in pairs]
        with self._write() as conn:
            before = conn.total_changes
            conn.executemany("INSERT OR IGNORE INTO run_links (run_id, parent_id, ts) VALUES (?, ?, ?)", rows)
            return conn.total_changes - before

    def fail_run(self, run_id: str) -> bool:
        """Mark ``run_id`` as a run that raised (a retry's attempt, a branch a fallback replaced): feedback on
        the runs above it no longer rates the retrievals made inside it (:meth:`resolve_run` passes it by),
        and a follow-up question does not judge them (:meth:`run_failed`); its links stay, so a retry's next
        attempt is still known as the same run. Returns whether it was not marked before.
        """
        enc = _enc(_check_id(run_id, "run_id"))
        with self._write() as conn:
            return conn.execute("INSERT OR IGNORE INTO failed_runs (run_id, ts) VALUES (?, ?)",
                                [enc, self._now()]).rowcount == 1

    def run_failed(self, run_id: str) -> bool:
        """Whether ``run_id``, or a run above it through the links (:meth:`run_lineage`), was marked by
        :meth:`fail_run`."""
        return self.any_failed(self.run_lineage(run_id))

    def any_failed(self, run_ids: Iterable[str]) -> bool:
        """Whether any of ``run_ids`` was marked by :meth:`fail_run` (a lineage already walked)."""
        ids = [_enc(_check_id(r, "run_id", allow_empty=True)) for r in run_ids]
        with self._read() as conn:
            return any(
                conn.execute(f"SELECT 1 FROM failed_runs WHERE run_id IN ({_marks(len(b))}) LIMIT 1", b).fetchone()
                for b in _batches(ids)
            )

    def unlink_run(self, run_id: str) -> int:
        """Remove ``run_id``'s link to its parent: a run that failed (a retry's attempt, a branch a fallback
        replaced) no longer stands under the run above it, so feedback given there does not rate the
        retrievals made inside it. Returns the number of links removed (0 or 1)."""
        enc = _enc(_check_id(run_id, "run_id"))
        with self._write() as conn:
            return conn.execute("DELETE FROM run_links WHERE run_id = ?", [enc]).rowcount

    def run_lineage(self, run_id: str) -> list[str]:
        """``run_id`` and the runs above it through the links of :meth:`link_runs`, nearest first.

        >>> store = FeedbackStore()
        >>> store.link_runs([("retrieval", "tool"), ("tool", "agent")])
        2
        >>> store.run_lineage("retrieval"), store.run_lineage("unlinked")
        (['retrieval', 'tool', 'agent'], ['unlinked'])
        """
        lineage = [_check_id(run_id, "run_id", allow_empty=True)]
        seen = {run_id}
        with self._read() as conn:
            while True:  # one indexed lookup per level; a cycle (links are not checked for one) ends it
                row = conn.execute("SELECT parent_id FROM run_links WHERE run_id = ?", [_enc(lineage[-1])]).fetchone()
                parent = None if row is None else _dec(row[0])
                if parent is None or parent in seen:
                    return lineage
                seen.add(parent)
                lineage.append(parent)

    def resolve_run(self, run_id: str) -> list[str]:
        """Like :meth:`resolve`, but also through the run links of :meth:`link_runs` (oldest event first).

        The events a run id stands for: itself if it is an event; otherwise every
        event whose id or parent is a run below ``run_id``, through links and
        through events' ``parent_id``.
        """
        root = _enc(_check_id(run_id, "run_id"))
        if self.has_event(run_id):
            return [run_id]
        seen = {root}
        frontier = [root]
        with self._read() as conn:
            while frontier:  # breadth first, one indexed query per level and table (chains are shallow)
                nxt = []
                for b in _batches(frontier):
                    m = _marks(len(b))
                    for (child,) in conn.execute(
                        f"SELECT run_id FROM run_links WHERE parent_id IN ({m}) "
                        f"UNION SELECT id FROM events WHERE parent_id IN ({m}) "
                        "EXCEPT SELECT run_id FROM failed_runs",
                        [*b, *b],
                    ):
                        if child not in seen:
                            seen.add(child)
                            nxt.append(child)
                frontier = nxt
            seen.discard(root)
            found: list[tuple[float, int, str]] = []
            for b in _batches(list(seen)):
                found += [
                    (ts, rowid, _dec(eid))
                    for eid, ts, rowid in conn.execute(
                        f"SELECT id, ts, rowid FROM events WHERE id IN ({_marks(len(b))})", b
                    )
                ]
        return [eid for _, _, eid in sorted(found)]

    def _select_events(
        self,
        where: str,
        params: list[Any],
        *,
        order: str = "e.ts, e.rowid",
        tail: str = "",
        with_chunks: bool = True,
        cte: str = "",
    ) -> list[dict[str, Any]]:
        cols = ", ".join(f"e.{c.strip()}" for c in _EVENT_COLS.split(","))
        with self._read():
            sql = f"{cte}SELECT {cols} FROM events e WHERE {where} ORDER BY {order}{tail}"
            rows = list(self.db.query(sql, params))
            events = [_event_dict(r) for r in rows]
            if with_chunks and events:
                by_id = {e["id"]: e for e in events}
                for e in events:
                    e["chunks"] = []
                for b in _batches([r["id"] for r in rows]):
                    for c in self.db.query(
                        "SELECT event_id, chunk_id, rank, score, scores, normalized, proposed_by, used "
                        f"FROM event_chunks WHERE event_id IN ({_marks(len(b))}) ORDER BY event_id, rank",
                        list(b),
                    ):
                        by_id[_dec(c["event_id"])]["chunks"].append(_chunk_dict(c))
        return events

    # -- feedback ------------------------------------------------------------------
    def record_feedback(
        self,
        event_id: str,
        signal: str | None = None,
        *,
        value: float | None = None,
        rating: float | None = None,
        chunk_id: str | None = None,
        timestamp: float | datetime | None = None,
        session_id: str | None = None,
        user_id: str | None = None,
        idempotency_key: str | None = None,
        comment: str | None = None,
        key: str | None = None,
    ) -> FeedbackRecord:
        """Validate one feedback signal, then store it and its rewards in one transaction.

        Give a ``signal`` name (``"thumbs_up"``, ``"reformulation"``, ...), or
        ``rating=`` (1..5), or ``value=`` alone (a raw score in [-1, 1]);
        ``signal="rating"`` / ``"score"`` with the number is fine too.
        ``chunk_id`` makes the feedback chunk-level. ``key`` is a free label
        (a LangSmith feedback key); ``idempotency_key`` makes a retry safe: the
        second call returns the first record with ``duplicate=True`` and writes
        nothing (reusing the key for different feedback, another event, signal,
        chunk or value, raises :class:`IdempotencyConflictError`; the timestamp
        is not compared, since a retry may be stamped when it is sent).

        Raises (and writes nothing): :class:`UnknownEventError`,
        :class:`UnknownChunkError` (a chunk that was not part of the event),
        :class:`UnknownSignalError`, :class:`NonFiniteValueError`,
        :class:`RatingOutOfRangeError`, :class:`FutureTimestampError`,
        :class:`FeedbackBeforeEventError`, :class:`ValidationError`.
        """
        pending = self._prepare_feedback(
            self._now(),
            event_id,
            signal,
            value=value,
            rating=rating,
            chunk_id=chunk_id,
            timestamp=timestamp,
            session_id=session_id,
            user_id=user_id,
            idempotency_key=idempotency_key,
            comment=comment,
            key=key,
        )
        with self._write() as conn:
            return self._apply_feedback(conn, [pending])[0]

    def record_feedback_batch(self, items: Iterable[Mapping[str, Any]]) -> list[FeedbackRecord]:
        """Record many feedback dicts (:meth:`record_feedback` arguments) in one transaction; all or none.

        Every item is validated before anything is written; the first bad item
        raises its named error, prefixed with its index.
        """
        now = self._now()
        pendings = []
        items = list(_items(items, "items", "mappings of record_feedback arguments"))
        many = len(items) > 1  # "feedback item 0:" says nothing about a batch of one (run feedback on one event)
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise ValidationError(f"feedback item {i} must be a mapping")
            unknown = set(item) - _FEEDBACK_PARAMS
            if unknown:
                raise ValidationError(f"feedback item {i}: unknown argument(s) {sorted(unknown)}")
            if "event_id" not in item:
                raise ValidationError(f"feedback item {i} has no event_id")
            try:
                pendings.append(self._prepare_feedback(now, **item))
            except RlfbError as exc:
                if not many:
                    raise
                raise _prefixed(exc, f"feedback item {i}: ") from exc
        if not pendings:
            return []
        with self._write() as conn:
            return self._apply_feedback(conn, pendings, prefix=len(pendings) > 1)

    def _prepare_feedback(
        self,
        now: float,
        event_id: str,
        signal: str | None = None,
        *,
        value: Any = None,
        rating: Any = None,
        chunk_id: str | None = None,
        timestamp: Any = None,
        session_id: str | None = None,
        user_id: str | None = None,
        idempotency_key: str | None = None,
        comment: str | None = None,
        key: str | None = None,
    ) -> _Pending:
        eid = _check_event_id(event_id)
        name, kind, raw, val = self.reward.normalize(signal, value, rating)
        if idempotency_key is not None:
            _req_str(idempotency_key, "idempotency_key")
        return _Pending(
            event_id=eid,
            signal=name,
            kind=kind,
            raw_value=raw,
            value=val,
            chunk_id=_opt_str(chunk_id, "chunk_id"),
            ts=self._timestamp(timestamp, "timestamp", now),
            session_id=_opt_str(session_id, "session_id"),
            user_id=_opt_str(user_id, "user_id"),
            idempotency_key=idempotency_key,
            key=_opt_str(key, "key"),
            comment=_opt_str(comment, "comment"),
        )

    def _apply_feedback(
        self, conn: sqlite3.Connection, pendings: list[_Pending], prefix: bool = False
    ) -> list[FeedbackRecord]:
        """Inside a write transaction: check against the database, then insert. Raises before any insert."""
        keys = list({p.idempotency_key for p in pendings if p.idempotency_key is not None})
        existing: dict[str, FeedbackRecord] = {}
        for b in _batches(keys):
            for row in conn.execute(
                f"SELECT id FROM feedback WHERE idempotency_key IN ({_marks(len(b))})", [_enc(k) for k in b]
            ):
                rec = self._feedback_record(conn, row[0], duplicate=True)
                existing[rec.idempotency_key] = rec  # type: ignore[index]
        event_ids = list({p.event_id for p in pendings})
        info: dict[str, _EventInfo] = {}
        for b in _batches(event_ids):
            for eid, ts, chunk_ids, unused_ids in conn.execute(
                f"SELECT id, ts, chunk_ids, unused_ids FROM events WHERE id IN ({_marks(len(b))})",
                [_enc(e) for e in b],
            ):
                try:  # rows written outside rlfb may hold anything: name the event, not a raw error
                    chunks = _loads(chunk_ids)
                    skip = set() if unused_ids is None else set(_loads(unused_ids))
                    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or \
                            not isinstance(chunks, list) or not all(isinstance(c, str) for c in chunks):
                        raise ValueError("its timestamp or chunk ids are not what rlfb wrote")
                except (ValueError, TypeError) as exc:
                    raise CorruptStateError(f"event {_dec(eid)!r} in {self.path} is damaged: {exc}") from exc
                info[_dec(eid)] = _EventInfo(ts, chunks, chunks if unused_ids is None else
                                             [c for c in chunks if c not in skip])
        next_id = conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM feedback").fetchone()[0]
        rf = self.reward
        created = self._now()
        records: list[FeedbackRecord] = []
        feedback_rows: list[tuple[Any, ...]] = []
        reward_rows: list[tuple[Any, ...]] = []
        for i, p in enumerate(pendings):
            try:
                if p.idempotency_key is not None and p.idempotency_key in existing:
                    first = existing[p.idempotency_key]
                    # aliases of one kind ("cited", "opened": implicit positive) with one value are one feedback
                    if (first.event_id, rf.resolve(first.signal), first.chunk_id, first.value) != (
                        p.event_id, rf.resolve(p.signal), p.chunk_id, p.value
                    ):
                        raise IdempotencyConflictError(
                            f"idempotency key {p.idempotency_key!r} already recorded {first.signal!r} "
                            f"(value {first.value:g}) on event {first.event_id!r} (chunk {first.chunk_id!r})"
                        )
                    records.append(first)
                    continue
                ev = info.get(p.event_id)
                if ev is None:
                    raise UnknownEventError(f"unknown event id {p.event_id!r}")
                if p.chunk_id is not None and p.chunk_id not in ev.chunks:
                    raise UnknownChunkError(f"chunk {p.chunk_id!r} was not part of event {p.event_id!r}")
                if p.ts < ev.ts - self.clock_skew:
                    raise FeedbackBeforeEventError(
                        f"feedback at {p.ts:.3f} is {ev.ts - p.ts:.0f}s before its event "
                        f"(tolerance {self.clock_skew:g}s)"
                    )
            except RlfbError as exc:
                raise (_prefixed(exc, f"feedback item {i}: ") if prefix else exc) from None
            delay = max(0.0, p.ts - ev.ts)
            in_window = delay <= self.attribution_window
            discount = rf.discount(delay)
            discounted = p.value * discount
            reward = rf.clip(discounted)
            chunk_rewards = rf.attribute(reward, ev.used, p.chunk_id) if in_window else {}
            fid = next_id
            next_id += 1
            enc_eid = _enc(p.event_id)
            feedback_rows.append(
                (
                    fid,
                    enc_eid,
                    _enc(p.chunk_id),
                    _enc(p.signal),
                    p.kind,
                    p.raw_value,
                    p.value,
                    discount,
                    discounted,
                    reward,
                    p.ts,
                    delay,
                    1 if in_window else 0,
                    _enc(p.session_id),
                    _enc(p.user_id),
                    _enc(p.idempotency_key),
                    _enc(p.key),
                    _enc(p.comment),
                    created,
                )
            )
            if in_window:
                if chunk_rewards:
                    reward_rows.extend((fid, enc_eid, _enc(c), r, p.ts) for c, r in chunk_rewards.items())
                else:
                    reward_rows.append((fid, enc_eid, None, reward, p.ts))
            rec = FeedbackRecord(
                feedback_id=fid,
                event_id=p.event_id,
                chunk_id=p.chunk_id,
                signal=p.signal,
                value=p.value,
                reward=reward,
                chunk_rewards=chunk_rewards,
                in_window=in_window,
                duplicate=False,
                delay=delay,
                timestamp=p.ts,
                kind=p.kind,
                discount=discount,
                idempotency_key=p.idempotency_key,
            )
            records.append(rec)
            if p.idempotency_key is not None:
                existing[p.idempotency_key] = _as_duplicate(rec)
        conn.executemany(
            "INSERT INTO feedback (id, event_id, chunk_id, signal, kind, raw_value, value, discount, "
            "discounted, reward, ts, delay, in_window, session_id, user_id, idempotency_key, key, comment, "
            "created_at) "
            f"VALUES ({_marks(19)})",
            feedback_rows,
        )
        conn.executemany(
            "INSERT INTO rewards (feedback_id, event_id, chunk_id, reward, ts) VALUES (?, ?, ?, ?, ?)",
            reward_rows,
        )
        return records

    def _feedback_record(self, conn: sqlite3.Connection, feedback_id: int, duplicate: bool) -> FeedbackRecord:
        cols = (
            "id", "event_id", "chunk_id", "signal", "kind", "value", "reward", "in_window", "delay", "ts",
            "discount", "idempotency_key",
        )
        sql = f"SELECT {', '.join(cols)} FROM feedback WHERE id = ?"
        found = conn.execute(sql, (feedback_id,)).fetchone()
        row = _decode_row(dict(zip(cols, found, strict=True)))
        chunk_rewards = {
            _dec(c): r
            for c, r in conn.execute(
                "SELECT chunk_id, reward FROM rewards WHERE feedback_id = ? AND chunk_id IS NOT NULL "
                "ORDER BY id",
                (feedback_id,),
            )
        }
        return FeedbackRecord(
            feedback_id=row["id"],
            event_id=row["event_id"],
            chunk_id=row["chunk_id"],
            signal=row["signal"],
            value=row["value"],
            reward=row["reward"],
            chunk_rewards=chunk_rewards,
            in_window=bool(row["in_window"]),
            duplicate=duplicate,
            delay=row["delay"],
            timestamp=row["ts"],
            kind=row["kind"],
            discount=row["discount"],
            idempotency_key=row["idempotency_key"],
        )

    def feedback(self, event_id: str) -> list[dict[str, Any]]:
        """The event's feedback rows, oldest first (flagged out-of-window rows included)."""
        with self._read():
            rows = self.db.query(
                "SELECT * FROM feedback WHERE event_id = ? ORDER BY ts, id", [_enc(_check_event_id(event_id))]
            )
            return [_feedback_dict(r) for r in rows]

    def event_reward(self, event_id: str) -> tuple[float, dict[str, float]]:
        """``(reward, chunk_rewards)`` of an event over all its in-window feedback.

        The event reward is the sum of its discounted signals, clipped; each
        chunk's is the sum of the rewards attributed to it, clipped. An event
        without feedback has reward ``no_feedback`` (0) and no chunk rewards.
        """
        enc = _enc(_check_event_id(event_id))
        with self._read() as conn:
            if conn.execute("SELECT 1 FROM events WHERE id = ?", (enc,)).fetchone() is None:
                raise UnknownEventError(f"unknown event id {event_id!r}")
            total = conn.execute(
                "SELECT SUM(discounted) FROM feedback WHERE event_id = ? AND in_window = 1", (enc,)
            ).fetchone()[0]
            chunks = {
                _dec(c): self.reward.clip(r)
                for c, r in conn.execute(
                    "SELECT r.chunk_id, SUM(r.reward) FROM feedback f JOIN rewards r ON r.feedback_id = f.id "
                    "WHERE f.event_id = ? AND r.chunk_id IS NOT NULL GROUP BY r.chunk_id",
                    (enc,),
                )
            }
        reward = self.reward.clip(self.reward.config.no_feedback if total is None else total)
        return reward, chunks

    def chunk_reward_sums(self, event_id: str, *, before_feedback_id: int | None = None) -> dict[str, float]:
        """Per chunk, the rewards the event's feedback attributed to it, summed and not clipped.

        With ``before_feedback_id``, only feedback stored before that row counts
        (what earlier feedback taught, as :func:`rlfb.policies._util.chunk_evidence` wants it).
        """
        enc = _enc(_check_event_id(event_id))
        # through feedback, whose event_id is indexed (the copy in rewards is not)
        sql = (
            "SELECT r.chunk_id, SUM(r.reward) FROM feedback f JOIN rewards r ON r.feedback_id = f.id "
            "WHERE f.event_id = ? AND r.chunk_id IS NOT NULL"
        )
        params: list[Any] = [enc]
        if before_feedback_id is not None:
            sql += " AND f.id < ?"
            params.append(_check_int(before_feedback_id, "before_feedback_id", minimum=0))
        with self._read() as conn:
            return {_dec(c): float(r) for c, r in conn.execute(sql + " GROUP BY r.chunk_id", params)}

    # -- policy snapshots ----------------------------------------------------------
    def save_policy_state(
        self,
        state: Mapping[str, Any],
        weights: Mapping[str, Any],
        *,
        policy: str | None = None,
        timestamp: float | datetime | None = None,
    ) -> int:
        """Append a policy snapshot; return its version (1, 2, ...).

        ``state`` must be JSON-serialisable; ``weights`` finite and non-negative
        (flat, or one level nested per query type). The snapshots of its kind
        (:class:`~rlfb.snapshot_kind.SnapshotKind`) older than the newest
        ``snapshots_kept`` go, in the same transaction.
        """
        if not isinstance(state, Mapping):
            raise ValidationError(f"state must be a mapping, got {type(state).__name__}")
        w = _check_weights(weights)
        now = self._now()
        ts = self._timestamp(timestamp, "timestamp", now)
        name = _opt_str(policy, "policy")
        kind = SnapshotKind.of({"policy": name, "state": state}).key()
        row = (ts, _enc(name), _dumps(w, "weights"), _dumps(dict(state), "state"), kind)
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO policy_snapshots (ts, policy, weights, state, kind) VALUES (?, ?, ?, ?, ?)", row
            )
            if self.snapshots_kept is not None:
                conn.execute(
                    "DELETE FROM policy_snapshots WHERE kind = ? AND version <= (SELECT version FROM "
                    "policy_snapshots WHERE kind = ? ORDER BY version DESC LIMIT 1 OFFSET ?)",
                    (kind, kind, self.snapshots_kept),
                )
            return int(cur.lastrowid)  # type: ignore[arg-type]

    def load_policy_state(self, policy: str | None = None, *, before: int | None = None) -> dict[str, Any] | None:
        """The newest snapshot as ``{"state", "weights", "version", "updated_at", "policy"}``, or ``None``.

        With ``policy``, the newest snapshot that policy wrote (another may have written since); with
        ``before``, the newest older than that version (to page back through a policy's snapshots).
        """
        where, params = [], []
        if policy is not None:
            where.append("policy = ?")
            params.append(_enc(_opt_str(policy, "policy")))
        if before is not None:
            where.append("version < ?")
            params.append(_check_int(before, "before", minimum=0))
        sql = "SELECT * FROM policy_snapshots" + (" WHERE " + " AND ".join(where) if where else "")
        with self._read():
            rows = list(self.db.query(sql + " ORDER BY version DESC LIMIT 1", params))
        return self._snapshot(rows[0], with_state=True) if rows else None

    def policy_history(self, limit: int | None = None, *, with_state: bool = False) -> list[dict[str, Any]]:
        """Snapshots oldest first (weights over time, of the snapshots kept: ``snapshots_kept``); with ``limit``,
        the most recent ``limit``."""
        lim = "" if limit is None else f" LIMIT {_check_limit(limit)}"
        with self._read():
            rows = list(self.db.query(f"SELECT * FROM policy_snapshots ORDER BY version DESC{lim}"))
        return [self._snapshot(r, with_state=with_state) for r in reversed(rows)]

    def _snapshot(self, row: Mapping[str, Any], with_state: bool) -> dict[str, Any]:
        try:
            return _snapshot_dict(row, with_state)
        except ValueError as exc:  # its JSON was damaged outside rlfb (_loads names that a CorruptStateError)
            raise CorruptStateError(f"policy snapshot {row['version']} in {self.path} is damaged: {exc}") from exc

    def state_version(self) -> int:
        """Version of the newest snapshot (0 if none). Cheap: poll it to notice new weights."""
        with self._lock, self._sql_errors():
            conn = self._check_open()
            return int(conn.execute("SELECT COALESCE(MAX(version), 0) FROM policy_snapshots").fetchone()[0])

    # -- statistics, export, retention ---------------------------------------------
    def counts(self) -> dict[str, int]:
        """Row counts: events, chunks, feedback, rewards, flagged feedback, policy snapshots."""
        with self._read() as conn:
            q = conn.execute
            return {
                "events": q("SELECT COUNT(*) FROM events").fetchone()[0],
                "chunks": q("SELECT COUNT(*) FROM event_chunks").fetchone()[0],
                "feedback": q("SELECT COUNT(*) FROM feedback").fetchone()[0],
                "rewards": q("SELECT COUNT(*) FROM rewards").fetchone()[0],
                "flagged": q("SELECT COUNT(*) FROM feedback WHERE in_window = 0").fetchone()[0],
                "policy_snapshots": q("SELECT COUNT(*) FROM policy_snapshots").fetchone()[0],
            }

    def stats(self, window: float | None = None, *, now: float | datetime | None = None) -> dict[str, Any]:
        """Row counts, sliding-window statistics and the current weights.

        Top-level ``events``, ``chunks``, ``feedback``, ``rewards`` and
        ``flagged`` count the rows in the file. ``window`` holds the statistics
        over the ``window`` seconds (``stats_window``, 90 days, by default) up
        to ``now`` (the clock by default), from ``since`` to ``until``, both
        included; rows dated after ``now`` are left out, so a past ``now``
        gives the figures as they stood then. It holds the same counts
        restricted to it, ``mean_reward`` (mean event reward over the window's
        events that received in-window feedback; an event reward is all its
        discounted signals given by ``until``, summed and clipped),
        ``mean_feedback_reward`` (mean per-feedback reward) and ``by_arm``
        (events, explored events, rewarded events and mean reward per arm).
        ``mean_reward`` is repeated at the top level; ``weights``, ``policy``
        and ``policy_version`` come from the newest policy snapshot. A feedback or
        reward row whose number was damaged outside rlfb (text, infinity) raises
        :class:`CorruptStateError` naming it, rather than counting as 0.
        """
        return reports.stats(self, window, now=now)

    def export_rows(self, *, page: int = 500) -> Iterator[dict[str, Any]]:
        """One dict per (event, retrieved chunk), oldest event first, chunks in rank order.

        Each row carries the event's fields (``event_id``, ``timestamp``,
        ``query``, ``query_hash``, ``session_id``, ``parent_id``, ``query_type``,
        ``policy``, ``arm``, ``explored``, ``propensity``,
        ``sampling_temperature`` (``None`` unless a ranking was sampled),
        ``weights``, ``features``), the chunk's (``chunk_id``, ``rank``, ``score``,
        ``scores``, ``normalized``, ``proposed_by``, ``used``), and its feedback:
        ``feedback`` lists the feedback that concerns the chunk (response-level
        feedback on the event, and chunk-level feedback on this chunk) with the
        reward each attributed to it, ``chunk_reward`` is their sum clipped
        (``None`` without feedback), ``event_reward`` the event's reward and
        ``n_feedback`` the number of feedback rows on the event. An event that
        returned no chunks yields one row with the chunk fields set to ``None``.
        A feedback or reward row whose number was damaged outside rlfb raises
        :class:`CorruptStateError` naming it, before the first row is yielded.
        """
        # checked here, not in the generator: a bad page fails at the call, not at the first row
        return reports.export_rows(self, page=_check_int(page, "page"))

    def to_dataframe(self, *, flatten: bool = True) -> Any:
        """:meth:`export_rows` as a pandas DataFrame (pandas is imported here, lazily).

        With ``flatten``, the per-retriever mappings become columns
        ``weight.<name>``, ``score.<name>`` and ``norm.<name>``.
        """
        return reports.to_dataframe(self, flatten=flatten)

    def export_jsonl(self, path: str | Path | BinaryIO) -> int:
        """Write :meth:`export_rows` as JSON lines (UTF-8; lone surrogates escaped); return the row count.

        ``path`` may be a binary file object. A path is written next to its
        target and renamed into place, so a failed export leaves no partial file;
        it gets the mode ``open()`` would give it (``0o666`` less the umask for
        a new file; a file written over keeps its mode).
        """
        return reports.export_jsonl(self, path)

    def prune(self, now: float | datetime | None = None, *, retention: float | None = None) -> dict[str, int]:
        """Delete events older than ``retention`` seconds with their chunks, feedback and rewards.

        Policy snapshots older than the cutoff go too, except the newest of each kind: of each
        policy, retrievers, chunk exploration, embedding dimension, dense model and hyperparameters, what an
        ensemble tells its own state by (another kind's later snapshot must not take away an
        ensemble's only state),
        and so do run links (and the marks of failed runs, counted with them) older than the cutoff. With
        no retention (the store's or the argument) nothing is deleted; a
        retention shorter than ``attribution_window`` raises :class:`ValidationError`. ``now``
        (the clock by default) may lie in the past; one more than ``clock_skew`` past the clock
        raises :class:`FutureTimestampError`, as every other timestamp does. Returns the number
        of rows deleted per table.
        """
        keep = self.retention if retention is None else self._check_retention(retention)
        result = {"events": 0, "chunks": 0, "feedback": 0, "rewards": 0, "policy_snapshots": 0, "run_links": 0}
        if keep is None:
            return result
        # checked as every other timestamp is: a time in milliseconds by mistake put the cutoff far in the
        # future and deleted every event, its feedback, the snapshots and the run links, live ones included
        t = self._timestamp(now, "now", self._now())
        cutoff = t - keep
        old = "SELECT id FROM events WHERE ts < ?"
        old_feedback = f"SELECT id FROM feedback WHERE event_id IN ({old})"
        statements = {
            "rewards": f"DELETE FROM rewards WHERE feedback_id IN ({old_feedback})",
            "feedback": f"DELETE FROM feedback WHERE event_id IN ({old})",
            "chunks": f"DELETE FROM event_chunks WHERE event_id IN ({old})",
            "events": "DELETE FROM events WHERE ts < ?",
            "policy_snapshots": "DELETE FROM policy_snapshots WHERE ts < ? "
            f"AND version NOT IN (SELECT MAX(version) FROM policy_snapshots GROUP BY {_SNAPSHOT_KIND})",
            "run_links": "DELETE FROM run_links WHERE ts < ?",
            "failed_runs": "DELETE FROM failed_runs WHERE ts < ?",
        }
        with self._write() as conn:
            for table, sql in statements.items():  # children first; the cascades then find nothing left
                # a failed run's mark is part of the run tree: counted with the run links
                key = "run_links" if table == "failed_runs" else table
                result[key] = result[key] + conn.execute(sql, (cutoff,)).rowcount
        return result

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` for a sound file, else what SQLite found wrong."""
        with self._lock:
            conn = self._check_open()
            try:
                return "\n".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check"))
            except sqlite3.DatabaseError as exc:
                if type(exc) is not sqlite3.DatabaseError:
                    raise
                return str(exc)  # too damaged for the check itself to finish
