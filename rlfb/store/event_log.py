"""The event log: one row per retrieval and one per chunk it returned, written whole and read back decoded.

:func:`log_events` checks every event of a batch before it writes any (:func:`prepare_event`), and
:func:`select_events` reads events with their chunks in one read transaction, for the lookups (by id,
session, parent, or the whole parent chain below a run). The :class:`~rlfb.store.FeedbackStore`
methods ``log_event``, ``log_events``, ``check_event_args``, ``has_event``, ``event``,
``events_for_session``, ``children`` and ``descendants`` call these.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfb.errors import (
    DuplicateEventError,
    DuplicateIdError,
    InvalidWeightsError,
    UnknownChunkError,
    UnknownEventError,
    ValidationError,
)
from rlfb.reward import finite_float
from rlfb.store.checks import (
    _batches,
    _check_event_id,
    _check_id,
    _check_int,
    _check_limit,
    _check_weights,
    _get,
    _items,
    _marks,
    _number_map,
    _opt_str,
    _req_str,
)
from rlfb.store.codec import _dec, _dumps, _enc, _loads, query_hash
from rlfb.store.records import _DECISION_KEYS, _EVENT_COLS, _EVENT_PARAMS, _N_EVENT_COLS, _chunk_dict, _event_dict
from rlfb.types import validate_flag

if TYPE_CHECKING:
    from rlfb.store.feedback_store import FeedbackStore


def log_events(store: FeedbackStore, events: Iterable[Mapping[str, Any]]) -> list[str]:
    """Log many events (each a dict of ``log_event`` arguments) in one transaction; all or none."""
    now = store._now()
    prepared = []
    seen: set[str] = set()
    for i, kw in enumerate(_items(events, "events", "mappings of log_event arguments")):
        if not isinstance(kw, Mapping):
            raise ValidationError(f"event {i} must be a mapping of log_event arguments")
        unknown = set(kw) - _EVENT_PARAMS
        if unknown:
            raise ValidationError(f"event {i}: unknown argument(s) {sorted(unknown)}")
        missing = [name for name in ("query", "decision", "chunks") if name not in kw]
        if missing:  # a TypeError naming prepare_event() before
            raise ValidationError(f"event {i}: missing argument(s) {missing}")
        ev, rows = prepare_event(store, now=now, **kw)
        if ev[0] in seen:
            raise DuplicateEventError(f"event id {ev[0]!r} appears twice in the batch")
        seen.add(ev[0])
        prepared.append((ev, rows))
    if not prepared:
        store._tx.check_open()  # a closed store is refused as for a batch with rows, not answered []
        return []
    with store._write() as conn:
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


#: The keys of a chunk row given as a mapping (what :meth:`FeedbackStore.event` gives back for each chunk).
_CHUNK_KEYS = frozenset({"chunk_id", "rank", "score", "scores", "normalized", "proposed_by", "used"})


def prepare_event(
    store: FeedbackStore,
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
    """One event's row and its chunks' rows, every argument checked; nothing is written."""
    if not isinstance(query, str):
        raise ValidationError(f"query must be a str, got {type(query).__name__}")
    eid, ts, session_id, parent_id, meta_json = event_args(store, event_id, session_id, parent_id, timestamp,
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
        if isinstance(c, Mapping) and not _CHUNK_KEYS.issuperset(c.keys()):
            # a misspelt key ("usd" for "used") was dropped, and its default logged: a chunk the answer left out
            # took the praise of the answer, as a misspelt decision key would (refused for that reason)
            raise ValidationError(f"chunk {pos}: unknown key(s) {sorted(map(str, set(c) - _CHUNK_KEYS))}; a chunk row "
                                  f"takes {sorted(_CHUNK_KEYS)}")
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
        # read once: a generator checked by all() was stored empty
        proposed = list(proposed) if isinstance(proposed, Iterable) and not isinstance(proposed, str) else proposed
        if not isinstance(proposed, list) or not all(isinstance(p, str) for p in proposed):
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
        _enc(query) if store.store_text else None,
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


def event_args(
    store: FeedbackStore, event_id: Any, session_id: Any, parent_id: Any, timestamp: Any, metadata: Any, now: float
) -> tuple[str, float, str | None, str | None, str | bytes | None]:
    """An event's id (a new one for ``None``), timestamp, session and parent ids and metadata JSON (as
    :func:`~rlfb.store.codec._dumps` gives it: a str, or the BLOB of one with lone surrogates), checked."""
    eid = uuid.uuid4().hex if event_id is None else _req_str(event_id, "event_id")
    ts = store._timestamp(timestamp, "timestamp", now)
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ValidationError(f"metadata must be a mapping, got {type(metadata).__name__}")
    meta_json = None if metadata is None else _dumps(dict(metadata), "metadata", str_keys=True)
    return eid, ts, _opt_str(session_id, "session_id"), _opt_str(parent_id, "parent_id"), meta_json


def select_events(
    store: FeedbackStore,
    where: str,
    params: list[Any],
    *,
    order: str = "e.ts, e.rowid",
    tail: str = "",
    with_chunks: bool = True,
    cte: str = "",
) -> list[dict[str, Any]]:
    """The events ``where`` selects, decoded, with their ``chunks`` in rank order unless ``with_chunks`` is false."""
    cols = ", ".join(f"e.{c.strip()}" for c in _EVENT_COLS.split(","))
    with store._read():
        sql = f"{cte}SELECT {cols} FROM events e WHERE {where} ORDER BY {order}{tail}"
        rows = list(store.db.query(sql, params))
        events = [_event_dict(r) for r in rows]
        if with_chunks and events:
            by_id = {e["id"]: e for e in events}
            for e in events:
                e["chunks"] = []
            for b in _batches([r["id"] for r in rows]):
                for c in store.db.query(
                    "SELECT event_id, chunk_id, rank, score, scores, normalized, proposed_by, used "
                    f"FROM event_chunks WHERE event_id IN ({_marks(len(b))}) ORDER BY event_id, rank",
                    list(b),
                ):
                    by_id[_dec(c["event_id"])]["chunks"].append(_chunk_dict(c))
    return events


def has_event(store: FeedbackStore, event_id: str) -> bool:
    """Whether ``event_id`` was logged."""
    enc = _enc(_check_id(event_id, "event_id", allow_empty=True))  # "" is never logged: False
    with store._read() as conn:
        return conn.execute("SELECT 1 FROM events WHERE id = ?", (enc,)).fetchone() is not None


def mark_unused(store: FeedbackStore, event_id: str, chunk_ids: Iterable[str]) -> int:
    """Mark chunks of a logged event as not used by the answer; returns how many were used before."""
    enc = _enc(_check_event_id(event_id))
    if isinstance(chunk_ids, str):
        raise ValidationError("chunk_ids must be a sequence of chunk ids, not one string")
    gone = [_req_str(c, "chunk id") for c in chunk_ids]
    with store._write() as conn:
        row = conn.execute("SELECT chunk_ids, unused_ids FROM events WHERE id = ?", (enc,)).fetchone()
        if row is None:
            raise UnknownEventError(f"unknown event id {event_id!r}")
        shown, before = _loads(row[0]), set(_loads(row[1]) or ())
        unknown = [c for c in gone if c not in shown]
        if unknown:
            raise UnknownChunkError(f"chunk {unknown[0]!r} was not part of event {event_id!r}")
        unused = [c for c in shown if c in before or c in gone]  # in rank order, as logged
        conn.execute("UPDATE events SET unused_ids = ? WHERE id = ?",
                     (_dumps(unused, "unused_ids") if unused else None, enc))
        conn.executemany("UPDATE event_chunks SET used = 0 WHERE event_id = ? AND chunk_id = ?",
                         [(enc, _enc(c)) for c in gone])
    return len(unused) - len(before)


def event(store: FeedbackStore, event_id: str | None) -> dict[str, Any]:
    """The logged event with its chunks; :class:`UnknownEventError` if absent."""
    events = select_events(store, "e.id = ?", [_enc(_check_event_id(event_id))])
    if not events:
        raise UnknownEventError(f"unknown event id {event_id!r}")
    return events[0]


def events_for_session(
    store: FeedbackStore, session_id: str, limit: int | None = None, *, with_chunks: bool = True
) -> list[dict[str, Any]]:
    """The session's events, oldest first; with ``limit``, only the most recent ``limit`` of them."""
    lim = "" if limit is None else f" LIMIT {_check_limit(limit)}"
    rows = select_events(
        store,
        "e.session_id = ?",
        [_enc(_check_id(session_id, "session_id", allow_empty=True))],  # "" may be logged as a session
        order="e.ts DESC, e.rowid DESC",
        tail=lim,
        with_chunks=with_chunks,
    )
    return rows[::-1]


def last_event_at(store: FeedbackStore, session_id: str, at: float) -> dict[str, Any] | None:
    """The session's most recent event made at or before ``at``, or ``None``."""
    rows = select_events(
        store,
        "e.session_id = ? AND e.ts <= ?",
        [_enc(_check_id(session_id, "session_id", allow_empty=True)), at],
        order="e.ts DESC, e.rowid DESC",
        tail=" LIMIT 1",
    )
    return rows[0] if rows else None


def children(store: FeedbackStore, parent_id: str, *, with_chunks: bool = True) -> list[dict[str, Any]]:
    """Events logged with ``parent_id`` (oldest first)."""
    enc = _enc(_check_id(parent_id, "parent_id", allow_empty=True))  # "" may be logged as a parent
    return select_events(store, "e.parent_id = ?", [enc], with_chunks=with_chunks)


def descendants(store: FeedbackStore, root_id: str, *, with_chunks: bool = True) -> list[dict[str, Any]]:
    """Every event below ``root_id`` in the parent chain, oldest first (cycles in the chain are harmless)."""
    cte = (
        "WITH RECURSIVE d(id) AS (SELECT id FROM events WHERE parent_id = ? "
        "UNION SELECT e.id FROM events e JOIN d ON e.parent_id = d.id) "
    )
    enc = _enc(_check_id(root_id, "root_id", allow_empty=True))
    return select_events(store, "e.id IN (SELECT id FROM d)", [enc], with_chunks=with_chunks, cte=cte)
