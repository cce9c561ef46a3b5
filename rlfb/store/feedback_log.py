"""The feedback log: each feedback signal checked, stored with the reward it gave, and attributed to chunks.

:func:`prepare_feedback` checks a signal's arguments; :func:`apply_feedback`, inside the write
transaction, checks it against the database (the idempotency key, the event, its chunks, the time)
before anything is inserted, then writes the feedback rows and their reward rows. The
:class:`~rlfb.store.FeedbackStore` methods ``record_feedback``, ``record_feedback_batch``,
``feedback``, ``event_reward`` and ``chunk_reward_sums`` call these.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlfb.errors import (
    CorruptStateError,
    IdempotencyConflictError,
    RlfbError,
    UnknownChunkError,
    UnknownEventError,
    UnknownFeedbackError,
    ValidationError,
)
from rlfb.reward import check_not_before
from rlfb.store.checks import _batches, _check_event_id, _check_int, _items, _marks, _opt_str, _req_str
from rlfb.store.codec import _dec, _decode_row, _enc, _loads
from rlfb.store.records import (
    _FEEDBACK_PARAMS,
    FeedbackRecord,
    _as_duplicate,
    _EventInfo,
    _feedback_dict,
    _Pending,
    _prefixed,
)
from rlfb.types import EXTERNAL_POLICY

if TYPE_CHECKING:
    from rlfb.store.feedback_store import FeedbackStore


def record_batch(store: FeedbackStore, items: Iterable[Mapping[str, Any]]) -> list[FeedbackRecord]:
    """Record many feedback dicts in one transaction, every one checked first; all or none."""
    now = store._now()
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
            pendings.append(prepare_feedback(store, now, **item))
        except RlfbError as exc:
            if not many:
                raise
            raise _prefixed(exc, f"feedback item {i}: ") from exc
    if not pendings:
        store._tx.check_open()  # a closed store is refused as for a batch with rows, not answered []
        return []
    with store._write() as conn:
        return apply_feedback(store, conn, pendings, prefix=len(pendings) > 1)


#: the ``settings`` row that keeps the highest feedback id given before a prune deleted rows
FEEDBACK_ID_HIGH = "feedback_id_high"


def next_feedback_id(conn: sqlite3.Connection) -> int:
    """The id the next feedback row gets: one above any given before, deleted rows' included.

    A running ensemble looks for rows to catch up by id, above the highest it has looked at
    (:func:`rlfb.feedback_learning.catch_up`); after a prune had deleted the newest rows, the next ones were given
    their ids again, and it never looked at them until it restarted. The prune keeps the highest id in
    ``settings`` (:func:`note_feedback_id_high`); an rlfb older than this, writing to the same file, still gives
    ids above the table's highest alone."""
    top, high = conn.execute(
        "SELECT COALESCE((SELECT MAX(id) FROM feedback), 0), (SELECT value FROM settings WHERE key = ?)",
        (FEEDBACK_ID_HIGH,),
    ).fetchone()
    try:
        kept = int(high)
    except (TypeError, ValueError):
        kept = 0  # none kept, or a row edited by hand into something else: the ids in the table still count
    # a kept id past what SQLite can store (edited by hand) is no id: the next one could not be written at all
    return max(int(top), kept if 0 <= kept < 2**63 - 1 else 0) + 1


def note_feedback_id_high(conn: sqlite3.Connection) -> None:
    """Before rows are deleted: keep the highest feedback id given, for :func:`next_feedback_id`."""
    high = conn.execute("SELECT MAX(id) FROM feedback").fetchone()[0]
    if high is not None:
        conn.execute(
            "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value "
            "WHERE CAST(settings.value AS INTEGER) < CAST(excluded.value AS INTEGER)",
            (FEEDBACK_ID_HIGH, str(int(high))),
        )


def prepare_feedback(
    store: FeedbackStore,
    now: float,
    event_id: str | None,
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
    """One signal's arguments, checked and normalised; the database is not read."""
    eid = _check_event_id(event_id)
    name, kind, raw, val = store.reward.normalize(signal, value, rating)
    if idempotency_key is not None:
        _req_str(idempotency_key, "idempotency_key")
    return _Pending(
        event_id=eid,
        signal=name,
        kind=kind,
        raw_value=raw,
        value=val,
        chunk_id=_opt_str(chunk_id, "chunk_id"),
        ts=store._timestamp(timestamp, "timestamp", now),
        session_id=_opt_str(session_id, "session_id"),
        user_id=_opt_str(user_id, "user_id"),
        idempotency_key=idempotency_key,
        key=_opt_str(key, "key"),
        comment=_opt_str(comment, "comment"),
    )


def apply_feedback(
    store: FeedbackStore, conn: sqlite3.Connection, pendings: list[_Pending], prefix: bool = False
) -> list[FeedbackRecord]:
    """Inside a write transaction: check against the database, then insert. Raises before any insert."""
    existing = _recorded_keys(conn, pendings)
    info = _events_of(store, conn, pendings)
    next_id = next_feedback_id(conn)
    created = store._now()
    records: list[FeedbackRecord] = []
    feedback_rows: list[tuple[Any, ...]] = []
    reward_rows: list[tuple[Any, ...]] = []
    for i, p in enumerate(pendings):
        try:
            first = _recorded_before(store, p, existing)
            if first is not None:
                records.append(first)
                continue
            ev = _event_for(store, p, info)
        except RlfbError as exc:
            raise (_prefixed(exc, f"feedback item {i}: ") if prefix else exc) from None
        rec = _scored(store, p, ev, next_id)
        next_id += 1
        feedback_rows.append(_feedback_row(p, rec, ev, created))
        reward_rows.extend(_reward_rows(p, rec))
        records.append(rec)
        if p.idempotency_key is not None:
            existing[p.idempotency_key] = _as_duplicate(rec)
    conn.executemany(
        "INSERT INTO feedback (id, event_id, chunk_id, signal, kind, raw_value, value, discount, "
        "discounted, reward, ts, delay, in_window, session_id, user_id, idempotency_key, key, comment, "
        "created_at, learned) "
        f"VALUES ({_marks(20)})",
        feedback_rows,
    )
    conn.executemany(
        "INSERT INTO rewards (feedback_id, event_id, chunk_id, reward, ts) VALUES (?, ?, ?, ?, ?)",
        reward_rows,
    )
    return records


def _recorded_keys(conn: sqlite3.Connection, pendings: Sequence[_Pending]) -> dict[str, FeedbackRecord]:
    """The feedback already stored under the idempotency keys of ``pendings``, by key."""
    keys = list({p.idempotency_key for p in pendings if p.idempotency_key is not None})
    existing: dict[str, FeedbackRecord] = {}
    for b in _batches(keys):
        for row in conn.execute(
            f"SELECT id FROM feedback WHERE idempotency_key IN ({_marks(len(b))})", [_enc(k) for k in b]
        ):
            rec = stored_record(conn, row[0], duplicate=True)
            existing[rec.idempotency_key] = rec  # type: ignore[index]
    return existing


def _events_of(store: FeedbackStore, conn: sqlite3.Connection, pendings: Sequence[_Pending]) -> dict[str, _EventInfo]:
    """What feedback needs of the events ``pendings`` rate (those the store holds), by id; a damaged event row
    is a :class:`CorruptStateError` naming it."""
    event_ids = list({p.event_id for p in pendings})
    info: dict[str, _EventInfo] = {}
    for b in _batches(event_ids):
        for eid, ts, chunk_ids, unused_ids, policy in conn.execute(
            f"SELECT id, ts, chunk_ids, unused_ids, policy FROM events WHERE id IN ({_marks(len(b))})",
            [_enc(e) for e in b],
        ):
            try:  # rows written outside rlfb may hold anything: name the event, not a raw error
                chunks = _loads(chunk_ids)
                skip = set() if unused_ids is None else set(_loads(unused_ids))
                if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or \
                        not isinstance(chunks, list) or not all(isinstance(c, str) for c in chunks):
                    raise ValueError("its timestamp or chunk ids are not what rlfb wrote")
            except (ValueError, TypeError) as exc:
                raise CorruptStateError(f"event {_dec(eid)!r} in {store.path} is damaged: {exc}") from exc
            info[_dec(eid)] = _EventInfo(ts, chunks, chunks if unused_ids is None else
                                         [c for c in chunks if c not in skip], _dec(policy) == EXTERNAL_POLICY)
    return info


def _recorded_before(store: FeedbackStore, p: _Pending,
                     existing: Mapping[str, FeedbackRecord]) -> FeedbackRecord | None:
    """The record already stored under ``p``'s idempotency key, where it is the same feedback; ``None`` where
    the key is new. The same key on other feedback is an :class:`IdempotencyConflictError`."""
    if p.idempotency_key is None or p.idempotency_key not in existing:
        return None
    first = existing[p.idempotency_key]
    rf = store.reward
    # aliases of one kind ("cited", "opened": implicit positive) with one value are one feedback
    if (first.event_id, rf.resolve(first.signal), first.chunk_id, first.value) != (
        p.event_id, rf.resolve(p.signal), p.chunk_id, p.value
    ):
        recorded = (f"already recorded {first.signal!r} (value {first.value:g}) on event "
                    f"{first.event_id!r} (chunk {first.chunk_id!r})")
        conflict = IdempotencyConflictError(f"idempotency key {p.idempotency_key!r} {recorded}")
        conflict.key, conflict.recorded = p.idempotency_key, recorded
        raise conflict
    return first


def _event_for(store: FeedbackStore, p: _Pending, info: Mapping[str, _EventInfo]) -> _EventInfo:
    """The event ``p`` rates, checked: known, holding ``p``'s chunk, and not after ``p``."""
    ev = info.get(p.event_id)
    if ev is None:
        raise UnknownEventError(f"unknown event id {p.event_id!r}")
    if p.chunk_id is not None and p.chunk_id not in ev.chunks:
        raise UnknownChunkError(f"chunk {p.chunk_id!r} was not part of event {p.event_id!r}")
    check_not_before(p.ts, ev.ts, store.clock_skew)
    return ev


def _scored(store: FeedbackStore, p: _Pending, ev: _EventInfo, fid: int) -> FeedbackRecord:
    """``p`` as feedback row ``fid``: its delay after the event, the recency discount, the clipped reward,
    and (inside the attribution window) each used chunk's share of it."""
    rf = store.reward
    delay = max(0.0, p.ts - ev.ts)
    in_window = delay <= store.attribution_window
    discount = rf.discount(delay)
    reward = rf.clip(p.value * discount)
    return FeedbackRecord(
        feedback_id=fid,
        event_id=p.event_id,
        chunk_id=p.chunk_id,
        signal=p.signal,
        value=p.value,
        reward=reward,
        chunk_rewards=rf.attribute(reward, ev.used, p.chunk_id) if in_window else {},
        in_window=in_window,
        duplicate=False,
        delay=delay,
        timestamp=p.ts,
        kind=p.kind,
        discount=discount,
        idempotency_key=p.idempotency_key,
    )


def _reward_rows(p: _Pending, rec: FeedbackRecord) -> list[tuple[Any, ...]]:
    """The ``rewards`` table's rows of ``p``, scored as ``rec``: one per chunk credited, else one for the whole
    event; none outside the attribution window."""
    if not rec.in_window:
        return []
    enc_eid = _enc(p.event_id)
    if rec.chunk_rewards:
        return [(rec.feedback_id, enc_eid, _enc(c), r, p.ts) for c, r in rec.chunk_rewards.items()]
    return [(rec.feedback_id, enc_eid, None, rec.reward, p.ts)]


def _feedback_row(p: _Pending, rec: FeedbackRecord, ev: _EventInfo, created: float) -> tuple[Any, ...]:
    """The ``feedback`` table's row of ``p``, scored as ``rec``."""
    return (
        rec.feedback_id,
        _enc(p.event_id),
        _enc(p.chunk_id),
        _enc(p.signal),
        p.kind,
        p.raw_value,
        p.value,
        rec.discount,
        p.value * rec.discount,
        rec.reward,
        p.ts,
        rec.delay,
        1 if rec.in_window else 0,
        _enc(p.session_id),
        _enc(p.user_id),
        _enc(p.idempotency_key),
        _enc(p.key),
        _enc(p.comment),
        created,
        # out of the window, or on another engine's retrieval: nothing to learn (feedback_learning.catch_up)
        None if rec.in_window and not ev.external else 0,
    )


def stored_record(conn: sqlite3.Connection, feedback_id: int, duplicate: bool) -> FeedbackRecord:
    """The :class:`FeedbackRecord` of a stored feedback row (an idempotent retry's answer)."""
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


def feedback_rows(store: FeedbackStore, event_id: str | None) -> list[dict[str, Any]]:
    """The event's feedback rows, decoded, oldest first; an event never logged is an :class:`UnknownEventError`
    (as in :func:`event_reward`), where ``[]`` read as "no feedback yet" for a mistyped id."""
    enc = _enc(_check_event_id(event_id))
    with store._read() as conn:
        rows = [_feedback_dict(r) for r in store.db.query(
            "SELECT * FROM feedback WHERE event_id = ? ORDER BY ts, id", [enc])]
        _known(conn, enc, event_id, rows)
        return rows


def _known(conn: sqlite3.Connection, enc_event_id: Any, event_id: str | None, found: Any) -> None:
    """Refuse an event id that names no logged event, where ``found`` (what was read for it) is empty."""
    if not found and conn.execute("SELECT 1 FROM events WHERE id = ?", (enc_event_id,)).fetchone() is None:
        raise UnknownEventError(f"unknown event id {event_id!r}")


def event_reward(
    store: FeedbackStore, event_id: str | None, *, repeats: bool = False
) -> tuple[float, dict[str, float]]:
    """``(reward, chunk_rewards)`` of an event over all its in-window feedback, each clipped; without the
    feedback :func:`repeats_latest` finds repeated (which taught the learner nothing), unless ``repeats``."""
    enc = _enc(_check_event_id(event_id))
    with store._read() as conn:
        _known(conn, enc, event_id, None)
        left_out = set() if repeats else _repeats(conn, enc, _MAX_ID)
        said = [d for fid, d in conn.execute(
            "SELECT id, discounted FROM feedback WHERE event_id = ? AND in_window = 1", (enc,)) if fid not in left_out]
        chunks = {c: store.reward.clip(r) for c, r in _chunk_sums(conn, enc, None, left_out).items()}
    reward = store.reward.clip(math.fsum(said) if said else store.reward.config.no_feedback)
    return reward, chunks


_MAX_ID = 2**63 - 1  # SQLite's largest rowid
_WHO = ("chunk_id", "session_id", "user_id", "key")  # whose say on what: a repeat must match these
_SAYS = ("signal", "raw_value", "value", "idempotency_key")  # and say what the latest such row said


def repeats_sql(where: str) -> str:
    """SQL of the ids of the in-window feedback rows (of those matching ``where``) that say again, word for
    word, what the latest earlier in-window row of the same event, chunk, session, user and LangSmith key said
    (same signal, raw value and value), neither row with an idempotency key: a double click, a retry without
    a key. The one definition of a repeat, for the learner (:func:`repeats_latest`) and the reports alike;
    thumbs up, down, then up again is no repeat."""
    lags = ", ".join(f"LAG({c}) OVER w AS p_{c}" for c in ("id", *_SAYS))
    same = " AND ".join(f"p_{c} IS {c}" for c in _SAYS[:3])
    return (
        f"SELECT id FROM (SELECT id, idempotency_key, {', '.join(_SAYS[:3])}, {lags} FROM feedback "
        f"WHERE in_window = 1 AND ({where}) WINDOW w AS (PARTITION BY event_id, {', '.join(_WHO)} ORDER BY id)) "
        f"WHERE idempotency_key IS NULL AND p_id IS NOT NULL AND p_idempotency_key IS NULL AND {same}"
    )


#: the store's in-window feedback rows less the repeats, for the reports' aggregates
KEPT_FEEDBACK = f"(SELECT * FROM feedback WHERE in_window = 1 AND id NOT IN ({repeats_sql('1')}))"


def _repeats(conn: sqlite3.Connection, enc_event_id: Any, upto_id: int) -> set[int]:
    """The ids of the event's repeated feedback rows (:func:`repeats_sql`) up to ``upto_id``."""
    return {int(fid) for (fid,) in conn.execute(repeats_sql("event_id = ? AND id <= ?"), (enc_event_id, upto_id))}


def _chunk_sums(conn: sqlite3.Connection, enc_event_id: Any, before_id: int | None,
                left_out: set[int]) -> dict[str, float]:
    """Per chunk, the rewards of the event's feedback (stored before ``before_id``, not in ``left_out``)."""
    # through feedback, whose event_id is indexed (the copy in rewards is not)
    sql = ("SELECT f.id, r.chunk_id, r.reward FROM feedback f JOIN rewards r ON r.feedback_id = f.id "
           "WHERE f.event_id = ? AND r.chunk_id IS NOT NULL")
    params: list[Any] = [enc_event_id]
    if before_id is not None:
        sql += " AND f.id < ?"
        params.append(before_id)
    sums: dict[str, float] = {}
    for fid, c, r in conn.execute(sql, params):
        if fid not in left_out:
            sums[_dec(c)] = sums.get(_dec(c), 0.0) + float(r)
    return sums


def repeats_latest(store: FeedbackStore, record: FeedbackRecord) -> bool:
    """Whether ``record`` says again what the latest earlier in-window feedback on its retrieval from the same
    session and user, on the same chunk and LangSmith key, said (same signal and value, and no idempotency
    key): a double click, a retry without a key. Thumbs up, down, then up again is no repeat."""
    cols = ("event_id", "chunk_id", "signal", "ts")
    with store._read() as conn:
        found = conn.execute(f"SELECT {', '.join(cols)} FROM feedback WHERE id = ?", (record.feedback_id,)).fetchone()
        if found is None:
            return False
        mine = _decode_row(dict(zip(cols, found, strict=True)))
        if (mine["event_id"], mine["chunk_id"], mine["signal"], mine["ts"]) != (
                record.event_id, record.chunk_id, record.signal, record.timestamp):
            return False  # the id names another row: a record of another store
        return record.feedback_id in _repeats(conn, found[0], record.feedback_id)


def chunk_reward_sums(
    store: FeedbackStore, event_id: str, *, before_feedback_id: int | None = None, repeats: bool = False
) -> dict[str, float]:
    """Per chunk, the rewards the event's feedback attributed to it, summed (before ``before_feedback_id``;
    without the feedback :func:`repeats_latest` finds repeated, unless ``repeats``)."""
    enc = _enc(_check_event_id(event_id))
    before = None if before_feedback_id is None else _check_int(before_feedback_id, "before_feedback_id", minimum=0)
    with store._read() as conn:
        left_out = set() if repeats else _repeats(conn, enc, _MAX_ID if before is None else before - 1)
        sums = _chunk_sums(conn, enc, before, left_out)
        _known(conn, enc, event_id, sums)
        return sums


#: the ``learned`` mark of a row a running learner has learned and not yet written in a snapshot
HELD = 2


def unlearned(store: FeedbackStore, after: int, policy: str | None, limit: int | None, held: bool = False
              ) -> list[FeedbackRecord]:
    """The feedback rows after id ``after`` that no learner has taken (``learned`` NULL; with ``held``, also those
    a running learner holds unwritten, ``HELD``), oldest first, on decisions logged by ``policy`` or by a policy
    not named (``None``: any policy); the first ``limit`` of them."""
    # one query a mark, each on its partial index and each limited: an OR of the two, or an IN over both,
    # listed every row owed before the limit applied (a look at 100 of 196,000 owed took 96 ms, not 0.3)
    marks = ("f.learned IS NULL", f"f.learned = {HELD}") if held else ("f.learned IS NULL",)
    ids: list[int] = []
    with store._read() as conn:
        for mark in marks:
            sql = f"SELECT f.id FROM feedback f JOIN events e ON e.id = f.event_id WHERE {mark} AND f.id > ?"
            params: list[Any] = [after]
            if policy is not None:
                sql += " AND (e.policy IS NULL OR e.policy = ?)"
                params.append(_enc(policy))
            sql += " ORDER BY f.id"
            if limit is not None:
                sql += " LIMIT ?"
                params.append(limit)
            ids.extend(fid for (fid,) in conn.execute(sql, params).fetchall())
        ids.sort()
        return [stored_record(conn, fid, duplicate=False) for fid in ids[:limit]]


#: unlearned rows of each mark one look for owed feedback reads at most, of any policy's decisions: the rows of
#: another policy (one an app ran before, or runs beside this one) are passed over a look at a time, where a
#: query for one policy's rows walked all of them at every look (20,000 such rows made each feedback 0.14 s
#: slower, 100,000 0.6 s; an audit of a store at scale, 2026-12-07)
OWED_SCAN = 1000


@dataclass(frozen=True)
class OwedBatch:
    """One look for owed feedback (:func:`owed`): ``records``, the rows owed to the policy, oldest first;
    ``through``, the id up to which every unlearned row (of the marks looked at, of any policy) was read, so
    that the next look starts after it; ``complete``, whether the look read to the last such row."""

    records: list[FeedbackRecord]
    through: int
    complete: bool


def owed(store: FeedbackStore, after: int, policy: str, limit: int, held: bool = False) -> OwedBatch:
    """The first ``limit`` rows after id ``after`` owed to ``policy`` (:func:`unlearned`), among at most
    :data:`OWED_SCAN` unlearned rows of each mark, and how far the look read.

    >>> from rlfb.store import FeedbackStore
    >>> store = FeedbackStore(":memory:")
    >>> for policy in ("greedy", "greedy", "thompson"):
    ...     eid = store.log_event("tides", {"weights": {"bm25": 1.0}, "policy": policy}, [{"chunk_id": "a"}])
    ...     _ = store.record_feedback(eid, "thumbs_up")
    >>> batch = owed(store, 0, "thompson", limit=100)
    >>> [r.feedback_id for r in batch.records], batch.through, batch.complete
    ([3], 3, True)
    """
    marks = ("f.learned IS NULL", f"f.learned = {HELD}") if held else ("f.learned IS NULL",)
    rows: list[tuple[int, Any]] = []
    bound: int | None = None  # the lowest id past which a mark's rows were not all read
    with store._read() as conn:
        for mark in marks:
            read = conn.execute(f"SELECT f.id, e.policy FROM feedback f JOIN events e ON e.id = f.event_id "
                                f"WHERE {mark} AND f.id > ? ORDER BY f.id LIMIT ?", (after, OWED_SCAN)).fetchall()
            rows.extend(read)
            if len(read) == OWED_SCAN:
                bound = read[-1][0] if bound is None else min(bound, read[-1][0])
        wanted = _enc(policy)
        mine = sorted(fid for fid, p in rows if (bound is None or fid <= bound) and (p is None or p == wanted))
        if len(mine) > limit:
            through, complete = mine[limit - 1], False
        elif bound is not None:
            through, complete = bound, False
        else:
            through, complete = max((fid for fid, _ in rows), default=after), True
        records = [stored_record(conn, fid, duplicate=False) for fid in mine[:limit]]
    return OwedBatch(records, max(through, after), complete)


def learned_mark(store: FeedbackStore, feedback_id: int) -> bool | None:
    """Whether a learner took the feedback row and wrote its learning (``True``), there was nothing in it to learn
    (``False``), or neither yet (``None``: owed, or held by a running learner; also for an id that names no row)."""
    with store._read() as conn:
        found = conn.execute("SELECT learned FROM feedback WHERE id = ?", (feedback_id,)).fetchone()
    return None if found is None or found[0] is None or found[0] == HELD else bool(found[0])


def mark_learned(store: FeedbackStore, feedback_id: int, learned: bool, held: bool = False) -> None:
    """Mark the feedback row as taken by a learner (``learned``; ``held``: not written in a snapshot yet) or as
    holding nothing to learn; :class:`UnknownFeedbackError` (nothing written) if no row has the id."""
    with store._write() as conn:
        changed = conn.execute("UPDATE feedback SET learned = ? WHERE id = ?",
                               (HELD if held else 1 if learned else 0, feedback_id)).rowcount
        if not changed:
            raise UnknownFeedbackError(f"no feedback row {feedback_id} (never stored, or pruned)")
