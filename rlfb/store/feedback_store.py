"""The :class:`FeedbackStore` class: its settings, its lifecycle, and every call it answers.

The work of each call is done in the module of its concept, which the methods here call:
:mod:`~rlfb.store.connection` (opening the file; transactions and the lock),
:mod:`~rlfb.store.event_log`, :mod:`~rlfb.store.run_tree`, :mod:`~rlfb.store.feedback_log`,
:mod:`~rlfb.store.snapshots`, :mod:`~rlfb.store.pruning` and :mod:`~rlfb.store.reports`.
See :mod:`rlfb.store` for what each table keeps and how the file is kept safe.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from sqlite_utils import Database

from rlfb.errors import CorruptStateError, DuplicateEventError, FutureTimestampError, StoreBusyError, ValidationError
from rlfb.reward import RewardFunction, as_timestamp, finite_float
from rlfb.store import connection, event_log, feedback_log, pruning, reports, run_tree, snapshots
from rlfb.store.checks import _MEMORY, _check_int, _check_path, _positive, _req_str
from rlfb.store.codec import query_hash as query_hash  # importable from this module, as before the split
from rlfb.store.connection import _SYNCHRONOUS
from rlfb.store.migrations import MIGRATIONS
from rlfb.store.records import FeedbackRecord
from rlfb.types import validate_flag

if TYPE_CHECKING:
    from typing_extensions import Self


class FeedbackStore:
    """Retrieval events, their chunks, feedback, rewards and policy snapshots in one SQLite file.

    Parameters
    ----------
    path
        Database file (a ``str`` or ``os.PathLike``), or ``":memory:"``. Any other
        type, a directory, or a file in a folder that does not exist raises
        :class:`ValidationError`.
    store_text
        Keep the query text. ``False`` keeps only its sha256 (privacy). The file records it when it is made:
        ``None`` (the default) opens a file as it records it (a new one keeps text), and a value other than
        the recorded one is a :class:`ValidationError`.
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
        store_text: bool | None = None,
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
        # bool("no") would keep the query text; None: as the file records it (a new file: True)
        given_text = None if store_text is None else validate_flag(store_text, "store_text")
        self.store_text = True if given_text is None else given_text
        self.reward = reward if reward is not None else RewardFunction()
        if not isinstance(self.reward, RewardFunction):
            raise ValidationError(f"reward must be a RewardFunction, got {type(reward).__name__}")
        self.attribution_window = float(finite_float(attribution_window, "attribution_window"))
        _positive(self.attribution_window, "attribution_window")
        self.stats_window = float(finite_float(stats_window, "stats_window"))
        _positive(self.stats_window, "stats_window")
        self.retention = pruning.check_retention(retention, self.attribution_window, allow_none=True)
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
        conn = connection.connect(self.path, self.busy_timeout)
        self._conn = conn
        # a store dropped without close() (the README's examples never call it) closes its connection when
        # collected: Python 3.13 warns of an unclosed one (a ResourceWarning, an error under -W error)
        finalizer = weakref.finalize(self, conn.close)
        self._tx = connection.Transactions(
            conn, self._lock, self.path, self.busy_timeout, finalizer, file=None if self._memory else self.path
        )
        self.db = Database(conn, execute_plugins=False)
        try:
            self.journal_mode, self.migrations_applied = connection.prepare(
                self.db, self.path, memory=self._memory, synchronous=sync, busy_timeout=self.busy_timeout
            )
            self.store_text = connection.settled_store_text(self._tx, given_text, self.path)
            if self.retention is not None:
                self.prune()
        except CorruptStateError:
            self.close()
            raise
        except sqlite3.DatabaseError as exc:
            self.close()
            if isinstance(exc, StoreBusyError):  # from prune, named already
                raise
            raise connection.opening_error(exc, self.path, self.busy_timeout) from exc
        except BaseException:
            self.close()
            raise

    # -- lifecycle -----------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (idempotent); not inside :meth:`exclusive`, whose writes it would drop."""
        tx = getattr(self, "_tx", None)  # None when __init__ failed before connecting
        if tx is not None:
            tx.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        tx = getattr(self, "_tx", None)
        return tx is None or tx.closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FeedbackStore({self.path!r})"

    @property
    def schema_migrations(self) -> list[str]:
        """Names of the migrations applied to this database."""
        with self._lock:
            self._tx.check_open()  # closed: the named error, as every other call gives
            return MIGRATIONS.applied(self.db)

    def _now(self) -> float:
        # checked each time it is read: a bad clock would otherwise fail deep inside, as a bare ValueError
        return finite_float(self._clock(), "clock() value")

    @property
    def _opened(self) -> str | None:
        """The file as opened, absolute (``None`` in memory): a relative path read again after a chdir names another
        file (an export guard that compared it let an export overwrite this store, and same_store took two files
        for one). The one the connection's checks keep (``Transactions``)."""
        return self._tx.file

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction (a savepoint inside :meth:`exclusive`): all of it or none."""
        return self._tx.write()

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        """A read transaction: every query inside sees one snapshot."""
        return self._tx.read()

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
        with self._tx.exclusive():
            yield self

    @property
    def exclusive_depth(self) -> int:
        """How many :meth:`exclusive` blocks are open on this connection (0 outside them).

        Read it inside a block of one's own (holding the store's lock): there, a depth above 1 says the
        caller holds a block around it.
        """
        return self._tx.depth

    def on_rollback(self, undo: Callable[[], None]) -> None:
        """Call ``undo`` if the writes made so far in the current :meth:`exclusive` block are rolled back.

        That is when the block, or any block around it, ends with an error, or the commit fails; a block
        that commits into an enclosing one hands its callbacks on to it, and the outermost commit drops
        them. An ensemble uses it to take back what its in-memory learner learned from feedback whose rows
        were undone, so that a retry with the same idempotency key is not learned twice. Callbacks run
        newest first, holding the store's lock; an error in one is added to the block's error as a note (a
        warning on Python 3.10), and the others still run.
        """
        self._tx.on_rollback(undo)

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
        event = {
            "query": query, "decision": decision, "chunks": chunks, "session_id": session_id, "features": features,
            "query_type": query_type, "event_id": event_id, "parent_id": parent_id, "timestamp": timestamp,
            "metadata": metadata,
        }
        return self.log_events([event])[0]

    def log_events(self, events: Iterable[Mapping[str, Any]]) -> list[str]:
        """Log many events (each a dict of :meth:`log_event` arguments) in one transaction; all or none."""
        return event_log.log_events(self, events)

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
        self._tx.check_open()  # as log_event would: a closed store, before the ensemble ranks
        event_log.event_args(self, event_id, session_id, parent_id, timestamp, metadata, self._now())
        if event_id is not None and self.has_event(event_id):
            raise DuplicateEventError(f"event id {event_id!r} was already logged")

    def mark_unused(self, event_id: str, chunk_ids: Iterable[str]) -> int:
        """Mark chunks of a logged retrieval as not used by its answer (a later step cut them before the LLM
        saw them): response-level feedback recorded from now on is spread over the chunks still used, as if
        they had been logged with ``used=False``. Returns how many were used before. An unknown event is an
        :class:`UnknownEventError`, a chunk it did not return an :class:`UnknownChunkError`, and nothing is
        changed."""
        return event_log.mark_unused(self, event_id, chunk_ids)

    def has_event(self, event_id: str) -> bool:
        """Whether ``event_id`` was logged."""
        return event_log.has_event(self, event_id)

    def event(self, event_id: str | None) -> dict[str, Any]:
        """The logged event, decoded, with its ``chunks`` in rank order; :class:`UnknownEventError` if absent
        (``None``, a retrieval that was not logged, is a :class:`ValidationError` that says so).

        Keys: ``id`` (and ``event_id``), ``timestamp``, ``query`` (``None`` with
        ``store_text=False``), ``query_hash``, ``query_hashed`` (true when only
        the hash was kept), ``session_id``, ``parent_id``,
        ``query_type``, ``features``, ``weights``, ``retrievers`` (the weights'
        keys, in order), ``arm``, ``policy``, ``explored``, ``propensity``,
        ``decision`` (the five decision fields as one dict), ``metadata``,
        ``created_at`` and ``chunks``.
        """
        return event_log.event(self, event_id)

    def events_for_session(
        self, session_id: str, limit: int | None = None, *, with_chunks: bool = True
    ) -> list[dict[str, Any]]:
        """The session's events, oldest first; with ``limit``, only the most recent ``limit`` of them."""
        return event_log.events_for_session(self, session_id, limit, with_chunks=with_chunks)

    def last_event(self, session_id: str, *, at: Any = None) -> dict[str, Any] | None:
        """The session's most recent event, or ``None``; with ``at`` (unix seconds, a ``datetime`` or ISO
        text), its most recent one made at or before then (a follow-up replayed from a log judges the
        retrieval that came before it, not the session's newest)."""
        if at is None:
            rows = self.events_for_session(session_id, 1)
            return rows[-1] if rows else None
        return event_log.last_event_at(self, session_id, as_timestamp(at, "at"))

    def children(self, parent_id: str, *, with_chunks: bool = True) -> list[dict[str, Any]]:
        """Events logged with ``parent_id`` (oldest first)."""
        return event_log.children(self, parent_id, with_chunks=with_chunks)

    def descendants(self, root_id: str, *, with_chunks: bool = True) -> list[dict[str, Any]]:
        """Every event below ``root_id`` in the parent chain (children, their children, ...), oldest first.

        ``root_id`` need not be an event itself (a LangChain chain run id, say).
        Cycles in the parent chain are harmless.
        """
        return event_log.descendants(self, root_id, with_chunks=with_chunks)

    def resolve(self, run_id: str) -> list[str]:
        """Event ids a run id stands for: itself if it is an event, else its descendants' ids."""
        return run_tree.resolve(self, run_id)

    def link_runs(self, links: Iterable[tuple[str, str]]) -> int:
        """Record ``(run_id, parent_id)`` links of runs that are not events (a chain's sub-runs).

        :meth:`resolve_run` follows them from a top-level run id down to the
        retrievals logged below it. A run keeps its first parent; relinking is a
        no-op. Returns the number of new links.
        """
        return run_tree.link_runs(self, links)

    def fail_run(self, run_id: str) -> bool:
        """Mark ``run_id`` as a run that raised (a retry's attempt, a branch a fallback replaced): feedback on
        the runs above it no longer rates the retrievals made inside it (:meth:`resolve_run` passes it by),
        and a follow-up question does not judge them (:meth:`run_failed`); its links stay, so a retry's next
        attempt is still known as the same run. Returns whether it was not marked before.
        """
        return run_tree.fail_run(self, run_id)

    def fail_children(self, run_id: str) -> int:
        """:meth:`fail_run` for every run and retrieval directly under ``run_id`` (a failed run's attempt, before
        a retry under the same run id: feedback on it then rates the retry alone). Returns how many were not
        marked before."""
        return run_tree.fail_children(self, run_id)

    def run_children(self, run_id: str) -> list[str]:
        """The runs and retrievals directly under ``run_id`` (sorted): what :meth:`fail_children` would mark, read
        without a write, so that a caller facing a locked file can keep the marks for later."""
        return run_tree.run_children(self, run_id)

    def run_failed(self, run_id: str) -> bool:
        """Whether ``run_id``, or a run above it through the links (:meth:`run_lineage`), was marked by
        :meth:`fail_run`."""
        return self.any_failed(self.run_lineage(run_id))

    def any_failed(self, run_ids: Iterable[str]) -> bool:
        """Whether any of ``run_ids`` was marked by :meth:`fail_run` (a lineage already walked)."""
        return run_tree.any_failed(self, run_ids)

    def unlink_run(self, run_id: str) -> int:
        """Remove ``run_id``'s link to its parent: a run that failed (a retry's attempt, a branch a fallback
        replaced) no longer stands under the run above it, so feedback given there does not rate the
        retrievals made inside it. Returns the number of links removed (0 or 1)."""
        return run_tree.unlink_run(self, run_id)

    def run_lineage(self, run_id: str) -> list[str]:
        """``run_id`` and the runs above it through the links of :meth:`link_runs`, nearest first.

        >>> store = FeedbackStore()
        >>> store.link_runs([("retrieval", "tool"), ("tool", "agent")])
        2
        >>> store.run_lineage("retrieval"), store.run_lineage("unlinked")
        (['retrieval', 'tool', 'agent'], ['unlinked'])
        """
        return run_tree.run_lineage(self, run_id)

    def resolve_run(self, run_id: str) -> list[str]:
        """Like :meth:`resolve`, but also through the run links of :meth:`link_runs` (oldest event first).

        The events a run id stands for: itself if it is an event; otherwise every
        event whose id or parent is a run below ``run_id``, through links and
        through events' ``parent_id``.
        """
        return run_tree.resolve_run(self, run_id)

    # -- feedback ------------------------------------------------------------------
    def record_feedback(
        self,
        event_id: str | None,
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

        This stores it only; an ensemble of the policy and retrievers that made the retrieval learns it at its
        next refresh or feedback (one started later, at its first: :meth:`unlearned_feedback`), in another
        process too. Feedback given through the ensemble that made the retrieval
        (:meth:`rlfb.FeedbackEnsemble.feedback`, or :func:`rlfb.runs.record_run_feedback`) is learned at once.

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
        :class:`FeedbackBeforeEventError`, :class:`ValidationError`, and
        :class:`StoreFileGoneError` (the store's file deleted or replaced while it was open).
        """
        pending = feedback_log.prepare_feedback(
            self, self._now(), event_id, signal, value=value, rating=rating, chunk_id=chunk_id, timestamp=timestamp,
            session_id=session_id, user_id=user_id, idempotency_key=idempotency_key, comment=comment, key=key,
        )
        with self._write() as conn:
            return feedback_log.apply_feedback(self, conn, [pending])[0]

    def record_feedback_batch(self, items: Iterable[Mapping[str, Any]]) -> list[FeedbackRecord]:
        """Record many feedback dicts (:meth:`record_feedback` arguments) in one transaction; all or none.

        Every item is validated before anything is written; the first bad item
        raises its named error, prefixed with its index.
        """
        return feedback_log.record_batch(self, items)

    def feedback(self, event_id: str | None) -> list[dict[str, Any]]:
        """The event's feedback rows, oldest first (flagged out-of-window rows included); an id that names no
        logged event is an :class:`~rlfb.errors.UnknownEventError`."""
        return feedback_log.feedback_rows(self, event_id)

    def event_reward(self, event_id: str | None, *, repeats: bool = False) -> tuple[float, dict[str, float]]:
        """``(reward, chunk_rewards)`` of an event over all its in-window feedback.

        The event reward is the sum of its discounted signals, clipped; each
        chunk's is the sum of the rewards attributed to it, clipped. An event
        without feedback has reward ``no_feedback`` (0) and no chunk rewards.
        Feedback :meth:`repeats_latest` finds repeated is stored but was not
        learned, and is left out, as the learner leaves it out; ``repeats=True``
        counts it, as it was sent.
        """
        return feedback_log.event_reward(self, event_id, repeats=repeats)

    def repeats_latest(self, record: FeedbackRecord) -> bool:
        """Whether a stored ``record`` repeats the latest earlier feedback of its session and user on the same
        chunk of its retrieval, word for word (:func:`rlfb.store.feedback_log.repeats_latest`): a double click
        or a retry without an idempotency key, which the learner learns once."""
        return feedback_log.repeats_latest(self, record)

    def chunk_reward_sums(
        self, event_id: str, *, before_feedback_id: int | None = None, repeats: bool = False
    ) -> dict[str, float]:
        """Per chunk, the rewards the event's feedback attributed to it, summed and not clipped.

        With ``before_feedback_id``, only feedback stored before that row counts
        (what earlier feedback taught, as :func:`rlfb.credit.chunk_evidence` wants it).
        The feedback :meth:`repeats_latest` finds repeated taught nothing and is left out;
        ``repeats=True`` counts it, as it was sent. An id that names no logged event is an
        :class:`~rlfb.errors.UnknownEventError`.
        """
        return feedback_log.chunk_reward_sums(self, event_id, before_feedback_id=before_feedback_id,
                                              repeats=repeats)

    def unlearned_feedback(
        self, *, after: int = 0, policy: str | None = None, limit: int | None = None, held: bool = False
    ) -> list[FeedbackRecord]:
        """The stored feedback no learner has taken yet, oldest first: rows after id ``after``, on decisions
        of ``policy`` (or of one not named; ``None``: of any policy), the first ``limit`` of them; with
        ``held``, also rows a running learner has learned and not yet written in a snapshot
        (:meth:`mark_learned` with ``held=True``).

        An ensemble learns those on its own decisions when it next looks (at a refresh or a feedback), so that
        feedback stored by a process killed before it learned it, stored while the newest snapshot was damaged,
        on the decision of a policy no app was running, or stored here alone (:meth:`record_feedback`), is
        learned once an ensemble that made such decisions runs; at its start it takes the held rows too, those
        of a process killed before its next snapshot. Feedback out of the attribution window or on another
        engine's retrieval, a repeat once an ensemble has looked at it, and rows stored before this was kept
        (schema step ``m012_feedback_learned``) are not listed.

        >>> store = FeedbackStore(":memory:")
        >>> eid = store.log_event("tides", {"weights": {"bm25": 1.0}, "policy": "thompson"}, [{"chunk_id": "a"}])
        >>> rec = store.record_feedback(eid, "thumbs_up")
        >>> [r.feedback_id for r in store.unlearned_feedback(policy="thompson")], store.feedback_learned(1)
        ([1], None)
        >>> store.mark_learned(rec.feedback_id, held=True)
        >>> store.unlearned_feedback(), len(store.unlearned_feedback(held=True)), store.counts()["held"]
        ([], 1, 1)
        >>> store.mark_learned(rec.feedback_id)
        >>> store.unlearned_feedback(held=True), store.feedback_learned(rec.feedback_id), store.counts()["unlearned"]
        ([], True, 0)
        """
        return feedback_log.unlearned(self, _check_int(after, "after", minimum=0),
                                      None if policy is None else _req_str(policy, "policy"),
                                      None if limit is None else _check_int(limit, "limit"),
                                      validate_flag(held, "held"))

    def _owed_feedback(self, after: int, policy: str, limit: int, held: bool) -> feedback_log.OwedBatch:
        """An ensemble's look for the rows owed to ``policy`` (:func:`rlfb.store.feedback_log.owed`): a bounded
        read, and how far it went, where :meth:`unlearned_feedback` reads every row of other policies before
        the first of ``policy``'s."""
        return feedback_log.owed(self, after, policy, limit, held)

    def feedback_learned(self, feedback_id: int) -> bool | None:
        """Whether a learner took the feedback row ``feedback_id`` and wrote what it learned in a snapshot
        (``True``), there was nothing in it to learn (``False``: out of the attribution window, a repeat, on
        another engine's retrieval), or neither yet (``None``: owed, or held by a running learner; also for an
        id that names no row)."""
        return feedback_log.learned_mark(self, _check_int(feedback_id, "feedback_id", minimum=1))

    def mark_learned(self, feedback_id: int, learned: bool = True, *, held: bool = False) -> None:
        """Mark the feedback row ``feedback_id`` as taken by a learner, or (``learned=False``) as holding nothing
        to learn; ``held``: taken by a learner that has not yet written it in a snapshot (a process killed
        before it does leaves the row to the next ensemble to start). An ensemble marks what it learns in the
        transaction that writes the learning, and holds it meanwhile. An id that names no row (never stored, or
        pruned) is :class:`~rlfb.errors.UnknownFeedbackError`."""
        if validate_flag(held, "held") and not learned:
            raise ValidationError("held=True marks a row a learner took: learned must be True")
        feedback_log.mark_learned(self, _check_int(feedback_id, "feedback_id", minimum=1), bool(learned), held)

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
        return snapshots.save_policy_state(self, state, weights, policy=policy, timestamp=timestamp)

    def load_policy_state(self, policy: str | None = None, *, before: int | None = None,
                          version: int | None = None) -> dict[str, Any] | None:
        """The newest snapshot as ``{"state", "weights", "version", "updated_at", "policy"}``, or ``None``.

        With ``policy``, the newest snapshot that policy wrote (another may have written since); with
        ``before``, the newest older than that version (to page back through a policy's snapshots); with
        ``version``, that snapshot (``None`` where it is not kept).
        """
        return snapshots.load_policy_state(self, policy, before=before, version=version)

    def newest_snapshots(self) -> list[dict[str, Any]]:
        """The newest snapshot of each kind of ensemble that wrote to this store (other retrievers, policy,
        hyperparameters: :class:`~rlfb.snapshot_kind.SnapshotKind`), newest first, without their states."""
        return snapshots.newest_of_each_kind(self)

    def drop_snapshot(self, version: int) -> bool:
        """Delete the policy snapshot ``version`` (one that is damaged: its error names it); whether there was one.

        Ensembles opened afterwards start from the newest snapshot of their kind that is left. Restart the
        processes that share the store: the next snapshot written may take the dropped one's version.
        """
        return snapshots.drop_snapshot(self, version)

    def policy_history(self, limit: int | None = None, *, with_state: bool = False) -> list[dict[str, Any]]:
        """Snapshots oldest first (weights over time, of the snapshots kept: ``snapshots_kept``); with ``limit``,
        the most recent ``limit``."""
        return snapshots.policy_history(self, limit, with_state=with_state)

    def state_version(self) -> int:
        """Version of the newest snapshot (0 if none). Cheap: poll it to notice new weights."""
        return snapshots.state_version(self._tx)

    # -- statistics, export, retention ---------------------------------------------
    def counts(self) -> dict[str, int]:
        """Row counts: events, chunks, feedback, rewards, flagged feedback, feedback not learned yet
        (``unlearned``: :meth:`unlearned_feedback`), policy snapshots."""
        return reports.counts(self)

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
        (events, explored events, rewarded events and mean reward per arm); the rewards
        leave out repeated feedback (:meth:`repeats_latest`), as the learner does, the counts not.
        ``mean_reward`` is repeated at the top level; ``weights``, ``policy``
        and ``policy_version`` come from the newest policy snapshot, ``snapshot_kinds`` counts the kinds of
        ensemble whose snapshots the file holds (:meth:`newest_snapshots`); a newest snapshot damaged
        outside rlfb gives ``weights`` ``None`` and ``snapshot_error`` naming the damage (``None`` else). A
        feedback or reward row whose number was damaged outside rlfb (text, infinity) raises
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
        ``n_feedback`` the number of feedback rows on the event. Each feedback
        item says whether it is a ``repeat`` (:meth:`repeats_latest`: stored,
        not learned); ``chunk_reward`` and ``event_reward`` leave repeats out,
        as :meth:`event_reward` does. An event that
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
        a new file; a file written over keeps its mode). The store's own file, or a side file of it
        (``-wal``, ``-shm``, ``-journal``), is refused with :class:`ValidationError`: written over, the store
        would be lost.
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
        raises :class:`FutureTimestampError`, as every other timestamp does. The ids of the feedback rows
        it deletes are not given again (a running ensemble catches up rows stored without it by id). Returns
        the number of rows deleted per table.

        It deletes in batches, oldest first (:data:`rlfb.store.pruning.PRUNE_BATCH` events, each with what hangs
        on them, a write transaction), so that other processes' writes go on between them: one stopped part way
        has deleted the oldest events whole and left the rest for the next prune. Inside :meth:`exclusive` the
        batches are part of the block's one transaction.
        """
        return pruning.prune(self, now, retention=retention)

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` for a sound file, else what SQLite found wrong."""
        return connection.integrity_check(self._tx)


#: What an ensemble calls on its store; a handler or an adapter logging decisions needs only ``log_event``.
ENSEMBLE_STORE_METHODS = ("log_event", "state_version", "load_policy_state")


def as_store(store: Any, *, methods: Sequence[str] = ("log_event",)) -> Any:
    """``store`` as the caller keeps it: a path (``str`` or ``os.PathLike``) opened as a :class:`FeedbackStore`,
    ``None`` as ``None``, and anything with each of ``methods`` as it is (a store, or a wrapper of one).

    Anything else is a :class:`ValidationError` naming what was given, so a wrong argument fails where it is
    passed, not at the first retrieval (whose error a framework's callback manager may only print).

    >>> as_store(None) is None
    True
    >>> as_store(5)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: store must be a FeedbackStore or a path to an SQLite file, got int
    """
    if store is None:
        return None
    if isinstance(store, (str, os.PathLike)):
        return FeedbackStore(os.fspath(store))
    if not all(callable(getattr(store, name, None)) for name in methods):
        raise ValidationError(
            f"store must be a FeedbackStore or a path to an SQLite file, got {type(store).__name__}"
        )
    return store
