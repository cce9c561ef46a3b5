"""Reading the store back: row counts, sliding-window statistics and the per-chunk export.

The :class:`~rlfb.store.FeedbackStore` methods ``counts``, ``stats``, ``export_rows``,
``to_dataframe`` and ``export_jsonl`` call these; they read through the store's
own read transactions.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.files import path_text, refuse_overwriting_store, write_atomically
from rlfb.reward import as_timestamp, finite_float
from rlfb.store.checks import _marks, _positive
from rlfb.store.codec import _dec, _jsonl, _loads
from rlfb.store.feedback_log import repeats_sql
from rlfb.store.records import _EVENT_COLS, _chunk_dict, _event_dict, _feedback_dict

if TYPE_CHECKING:
    from rlfb.store.feedback_store import FeedbackStore


# The numeric columns the reports add up and average. rlfb writes finite floats there; a row written outside it may
# hold text ('abc'), which SQL's SUM and AVG take as 0 (stats showed a wrong mean unsaid) and Python's sum() refuses
# with a raw TypeError (export). Only NULL-able in raw_value, which no report adds up.
_NUMBER_COLUMNS = {"feedback": ("value", "discounted", "reward"), "rewards": ("reward",)}


def _check_numbers(store: FeedbackStore, conn: Any) -> None:
    """Raise :class:`CorruptStateError` naming the first feedback or reward row whose number is not a finite one.

    One scan of each table (its figures are read over the same rows): a report of a damaged file must say so
    rather than count text as 0.
    """
    for table, cols in _NUMBER_COLUMNS.items():
        # table and column names are this module's constants, never input
        bad = " OR ".join(f"typeof({c}) NOT IN ('real', 'integer') OR abs({c}) = 9e999" for c in cols)
        row = conn.execute(f"SELECT id, {', '.join(cols)} FROM {table} WHERE {bad} LIMIT 1").fetchone()
        if row is not None:
            for col, value in zip(cols, row[1:], strict=True):
                _finite(store, value, f"{table} row {row[0]}", col)


def _finite(store: FeedbackStore, value: Any, row: str, col: str) -> Any:
    """``value`` when it is a finite number; else :class:`CorruptStateError` naming the row and column."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CorruptStateError(
            f"{row} in {store.path} is damaged: its {col} is {value!r}, not a finite number"[:300]
        )
    return value


def logged_policies(store: FeedbackStore, retrievers: Collection[str], recent: int = 1000,
                    scanned: int = 100_000) -> list[str]:
    """The policies that made the store's ``recent`` newest retrievals of exactly ``retrievers`` (the names of
    their weights), the most recent first, among its ``scanned`` newest retrievals of any: which apps use the
    store, where no snapshot says so yet (an app writes its first snapshot when it first learns). Another
    engine's retrievals (logged as ``external``) and damaged events are passed by: this only guides a choice."""
    from rlfb.types import EXTERNAL_POLICY

    names = set(retrievers)
    found: dict[str, None] = {}
    matched = 0
    with store._read() as conn:
        # newest first, ties by insertion; another app's busier retrievals of other retrievers are read past
        rows = conn.execute("SELECT policy, weights FROM events WHERE policy IS NOT NULL AND policy != ? "
                            "ORDER BY ts DESC, rowid DESC LIMIT ?", (EXTERNAL_POLICY, int(scanned)))
        for policy, weights in rows:
            try:
                logged = _loads(weights)
                policy = _dec(policy)
            except CorruptStateError:
                continue
            if not isinstance(logged, Mapping) or set(logged) != names or not isinstance(policy, str):
                continue
            found.setdefault(policy)
            matched += 1
            if matched >= recent:
                break
    return list(found)


def counts(store: FeedbackStore) -> dict[str, int]:
    """Row counts of each table, and of the flagged feedback: see :meth:`FeedbackStore.counts`."""
    with store._read() as conn:
        q = conn.execute
        return {
            "events": q("SELECT COUNT(*) FROM events").fetchone()[0],
            "chunks": q("SELECT COUNT(*) FROM event_chunks").fetchone()[0],
            "feedback": q("SELECT COUNT(*) FROM feedback").fetchone()[0],
            "rewards": q("SELECT COUNT(*) FROM rewards").fetchone()[0],
            "flagged": q("SELECT COUNT(*) FROM feedback WHERE in_window = 0").fetchone()[0],
            # stored, and not learned yet by any ensemble (rlfb.feedback_learning.catch_up learns them)
            "unlearned": q("SELECT COUNT(*) FROM feedback WHERE learned IS NULL").fetchone()[0],
            # learned by a running ensemble and not yet in a snapshot (persist_interval above 0): learned again by
            # the next ensemble to start if that one stops before it writes them
            "held": q("SELECT COUNT(*) FROM feedback WHERE learned = 2").fetchone()[0],
            "policy_snapshots": q("SELECT COUNT(*) FROM policy_snapshots").fetchone()[0],
        }


# Scratch tables of one stats() call, in the connection's own TEMP schema (a read-only connection has one too):
# made and dropped inside it, never left behind (an error part way drops them as well).
_REPEATS = "rlfb_stats_repeats"
_PER_EVENT = "rlfb_stats_per_event"
# The ids of the repeats, computed once a call: KEPT_FEEDBACK (feedback_log) ran its window function over the whole
# feedback table once per statement that named it, three times a call (2 to 6 s each on a store of 200k feedback
# rows). Only the events with two feedback rows or more can hold a repeat (a row with no earlier row of its event
# is none): the window function reads their rows alone, each event's rows whole, so it finds the same repeats.
_REPEATS_SQL = (
    f"INSERT INTO temp.{_REPEATS} (id) "
    + repeats_sql("event_id IN (SELECT event_id FROM feedback GROUP BY event_id HAVING COUNT(*) > 1)")
)
# KEPT_FEEDBACK, the in-window feedback less the repeats, with the repeats read from the scratch table
_KEPT_SQL = "(SELECT * FROM feedback{} WHERE in_window = 1 AND id NOT IN (SELECT id FROM temp." + _REPEATS + "))"
_KEPT = _KEPT_SQL.format("")
# The window's events, each with its whole reward (every in-window signal, whenever it came): summing only the
# feedback dated inside the window cut an event's reward in two at the window's edge, and counted an event of
# before the window as an arm's rewarded event without counting it as its event. Feedback after until is left
# out: the figures are those known at until. Written in the order of the events' ids, each event's rewards added
# in the order of their ids, whichever table leads (the unary + keeps the feedback's ts index out, which would
# add them in the order of their timestamps): a sum of floats depends on its order, and the figures are the same
# to the last bit as those the single statements gave. Two ways, the same rows:
_PER_EVENT_SQL = (
    f"INSERT INTO temp.{_PER_EVENT} (event_id, arm, r) "
    "SELECT f.event_id, e.arm, MAX(?, MIN(?, SUM(f.discounted))) FROM {} "
    "WHERE e.ts BETWEEN ? AND ? AND +f.ts <= ? GROUP BY f.event_id ORDER BY f.event_id"
)
# led by the window's events (its ts index), each looking up its feedback (their event_id index): a short window
_BY_EVENTS = _PER_EVENT_SQL.format(f"events e CROSS JOIN {_KEPT} f ON f.event_id = e.id")
# led by the feedback, read in the order of its rows (NOT INDEXED: the event_id index read them in random order),
# each looking up its event: a window of many more events than the store holds feedback rows (900k events' index
# lookups took 2 to 4 s where 200k feedback rows took 1 to 2)
_BY_FEEDBACK = _PER_EVENT_SQL.format(f"{_KEPT_SQL.format(' NOT INDEXED')} f CROSS JOIN events e ON e.id = f.event_id")


@contextmanager
def _scratch(conn: Any) -> Iterator[None]:
    """The scratch tables of :func:`stats`: the ids of the repeats (:func:`repeats_sql`), and an empty one for
    the window's rewarded events; dropped at the end, whatever happens."""
    drop = [f"DROP TABLE IF EXISTS temp.{name}" for name in (_PER_EVENT, _REPEATS)]
    for sql in drop:  # left by a call cut short where even dropping them failed
        conn.execute(sql)
    try:
        conn.execute(f"CREATE TEMP TABLE {_REPEATS} (id INTEGER PRIMARY KEY)")
        conn.execute(_REPEATS_SQL)
        # no declared types: the values kept as they were read (a TEXT column would turn an arm 1 into '1')
        conn.execute(f"CREATE TEMP TABLE {_PER_EVENT} (event_id, arm, r)")
        yield
    except BaseException:
        for sql in drop:
            with suppress(sqlite3.Error):  # the error that cut it short is the one to see
                conn.execute(sql)
        raise
    for sql in drop:
        conn.execute(sql)


def stats(
    store: FeedbackStore, window: float | None = None, *, now: float | datetime | None = None
) -> dict[str, Any]:
    """Row counts, window statistics and the current weights: see :meth:`FeedbackStore.stats`."""
    w = store.stats_window if window is None else finite_float(window, "window")
    _positive(w, "window")
    t = store._now() if now is None else as_timestamp(now, "now")
    since = t - w
    cfg = store.reward.config
    with store._read() as conn:
        _check_numbers(store, conn)
        q = conn.execute

        def one(sql: str, *params: Any) -> Any:
            return q(sql, params).fetchall()[0][0]

        totals = store.counts()
        # every windowed figure is bounded on both sides: with a past now, rows after it (events, feedback,
        # rewards) were counted although the window reported ends there
        span = (since, t)
        # the window's events per arm, read once for the arms and the chunks (one pass over the events' rows)
        arms = q(
            "SELECT arm, COUNT(*), SUM(explored), SUM(n_chunks) FROM events WHERE ts BETWEEN ? AND ? "
            "GROUP BY arm ORDER BY arm",
            span,
        ).fetchall()
        chunks: Any = sum(row[3] for row in arms)
        if not all(isinstance(row[3], int) for row in arms):  # damaged counts (text, fractions): SQL's own sum
            chunks = one("SELECT COALESCE(SUM(n_chunks), 0) FROM events WHERE ts BETWEEN ? AND ?", *span)
        win: dict[str, Any] = {
            "seconds": w,
            "since": since,
            "until": t,
            "events": one("SELECT COUNT(*) FROM events WHERE ts BETWEEN ? AND ?", *span),
            "chunks": chunks,
            "feedback": one("SELECT COUNT(*) FROM feedback WHERE ts BETWEEN ? AND ?", *span),
            # no index on rewards.ts: a scan of the table
            "rewards": one("SELECT COUNT(*) FROM rewards WHERE ts BETWEEN ? AND ?", *span),
            "flagged": one("SELECT COUNT(*) FROM feedback WHERE ts BETWEEN ? AND ? AND in_window = 0", *span),
        }
        by_arm: dict[Any, dict[str, Any]] = {}
        for arm, n_ev, n_exp, _ in arms:
            by_arm[_dec(arm)] = {
                "events": n_ev, "explored": n_exp, "rewarded_events": 0, "mean_reward": None
            }
        with _scratch(conn):
            # what was learned: repeats (a double click, a retry without an idempotency key) left out, as
            # event_reward() and the export leave them out
            win["mean_feedback_reward"] = one(f"SELECT AVG(reward) FROM {_KEPT} WHERE ts BETWEEN ? AND ?", *span)
            # the way of fewer lookups: one per feedback row, or one per event of the window (about half the cost)
            by_feedback = 2 * totals["feedback"] < win["events"]
            q(_BY_FEEDBACK if by_feedback else _BY_EVENTS, (cfg.clip_low, cfg.clip_high, since, t, t))
            # in the order written (the events' ids), the order the figures were always added in
            n, mean = q(f"SELECT COUNT(*), AVG(r) FROM temp.{_PER_EVENT}").fetchall()[0]
            rewarded = q(f"SELECT arm, COUNT(*), AVG(r) FROM temp.{_PER_EVENT} GROUP BY arm").fetchall()
        win["rewarded_events"] = n
        win["mean_reward"] = mean
        for arm, n_rw, m in rewarded:
            entry = by_arm.setdefault(_dec(arm), {"events": 0, "explored": 0})
            entry.update(rewarded_events=n_rw, mean_reward=m)
        win["by_arm"] = by_arm
        newest = store.newest_snapshots()  # a damaged one without its weights
        try:
            snap, damage = store.load_policy_state(), None
        except CorruptStateError as exc:  # the counts are sound whatever the snapshot holds
            snap, damage = {**newest[0], "weights": None} if newest else None, exc
    return {
        "path": store.path,
        **totals,
        "mean_reward": win["mean_reward"],
        "window": win,
        "weights": None if snap is None else snap["weights"],
        "policy": None if snap is None else snap["policy"],
        "policy_version": 0 if snap is None else snap["version"],
        "policy_updated_at": None if snap is None else snap["updated_at"],
        # apps with other retrievers or another policy on one file: the newest snapshot is one of theirs
        "snapshot_kinds": len(newest),
        "snapshot_error": None if damage is None else str(damage),
    }

def export_rows(store: FeedbackStore, *, page: int = 500) -> Iterator[dict[str, Any]]:
    """One dict per (event, retrieved chunk) of ``store``: see :meth:`FeedbackStore.export_rows`."""
    cfg = store.reward.config
    last: tuple[float, int] = (-math.inf, -1)
    with store._read() as conn:
        _check_numbers(store, conn)  # before the first row: a stream to stdout is not left half written
    while True:
        with store._read() as conn:
            ev_rows = list(
                store.db.query(
                    f"SELECT e.rowid AS _rowid, {_EVENT_COLS} FROM events e "
                    "WHERE (e.ts, e.rowid) > (?, ?) ORDER BY e.ts, e.rowid LIMIT ?",
                    [last[0], last[1], page],
                )
            )
            if not ev_rows:
                return
            last = (ev_rows[-1]["ts"], ev_rows[-1]["_rowid"])
            enc_ids = [r["id"] for r in ev_rows]
            chunks: dict[str, list[dict[str, Any]]] = {}
            feedback: dict[str, list[dict[str, Any]]] = {}
            shares: dict[tuple[str, str | None, int], float] = {}
            m = _marks(len(enc_ids))
            for c in store.db.query(
                "SELECT event_id, chunk_id, rank, score, scores, normalized, proposed_by, used "
                f"FROM event_chunks WHERE event_id IN ({m}) ORDER BY event_id, rank",
                enc_ids,
            ):
                chunks.setdefault(_dec(c["event_id"]), []).append(_chunk_dict(c))
            fb_sql = f"SELECT * FROM feedback WHERE event_id IN ({m}) ORDER BY ts, id"
            for f in store.db.query(fb_sql, enc_ids):
                fd = _feedback_dict(f)
                for col in _NUMBER_COLUMNS["feedback"]:  # checked again: rows written since the check above
                    _finite(store, fd[col], f"feedback row {fd['id']}", col)
                feedback.setdefault(fd["event_id"], []).append(fd)
            for eid, cid, fid, rid, r in conn.execute(
                "SELECT f.event_id, r.chunk_id, r.feedback_id, r.id, r.reward FROM feedback f "
                f"JOIN rewards r ON r.feedback_id = f.id WHERE f.event_id IN ({m})",
                enc_ids,
            ):
                shares[(_dec(eid), _dec(cid), fid)] = _finite(store, r, f"rewards row {rid}", "reward")
            # repeats were stored and not learned: the rewards leave them out, as event_reward() does
            again = {int(fid) for (fid,) in conn.execute(repeats_sql(f"event_id IN ({m})"), enc_ids)}
        for r in ev_rows:
            ev = _event_dict(r)
            eid = ev["id"]
            fbs = feedback.get(eid, [])
            in_win = [f["discounted"] for f in fbs if f["in_window"] and f["id"] not in again]
            event_reward = min(cfg.clip_high, max(cfg.clip_low, math.fsum(in_win))) if in_win else None
            base = {
                "event_id": eid,
                "timestamp": ev["timestamp"],
                "query": ev["query"],
                "query_hash": ev["query_hash"],
                "session_id": ev["session_id"],
                "parent_id": ev["parent_id"],
                "query_type": ev["query_type"],
                "policy": ev["policy"],
                "arm": ev["arm"],
                "explored": ev["explored"],
                "propensity": ev["propensity"],
                "sampling_temperature": ev["sampling_temperature"],
                "weights": ev["weights"],
                "features": ev["features"],
            }
            for c in chunks.get(eid) or [None]:  # type: ignore[list-item]
                cid = None if c is None else c["chunk_id"]
                items = []
                for f in fbs:
                    if f["chunk_id"] is not None and f["chunk_id"] != cid:
                        continue
                    items.append(
                        {
                            "feedback_id": f["id"],
                            "signal": f["signal"],
                            "kind": f["kind"],
                            "value": f["value"],
                            "raw_value": f["raw_value"],
                            "reward": shares.get((eid, cid, f["id"])),
                            "timestamp": f["timestamp"],
                            "delay": f["delay"],
                            "in_window": f["in_window"],
                            "repeat": f["id"] in again,
                            "chunk_level": f["chunk_id"] is not None,
                            "user_id": f["user_id"],
                            "key": f["key"],
                            "comment": f["comment"],
                        }
                    )
                got = [i["reward"] for i in items if i["reward"] is not None and not i["repeat"]]
                yield {
                    **base,
                    "chunk_id": cid,
                    "rank": None if c is None else c["rank"],
                    "score": None if c is None else c["score"],
                    "scores": None if c is None else c["scores"],
                    "normalized": None if c is None else c["normalized"],
                    "proposed_by": None if c is None else c["proposed_by"],
                    "used": None if c is None else c["used"],
                    "chunk_reward": min(cfg.clip_high, max(cfg.clip_low, sum(got))) if got else None,
                    "event_reward": event_reward,
                    "n_feedback": len(fbs),
                    "feedback": items,
                }

def to_dataframe(store: FeedbackStore, *, flatten: bool = True) -> Any:
    """``export_rows`` as a pandas DataFrame: see :meth:`FeedbackStore.to_dataframe`."""
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - pandas is in the eval extra
        raise ModuleNotFoundError("to_dataframe needs pandas: pip install 'rlfb[eval]'") from exc
    rows = list(store.export_rows())
    if flatten:
        for row in rows:
            for col, prefix in (("weights", "weight"), ("scores", "score"), ("normalized", "norm")):
                for name, v in (row.get(col) or {}).items():
                    if not isinstance(v, Mapping):
                        row[f"{prefix}.{name}"] = v
    return pd.DataFrame(rows)

def export_jsonl(store: FeedbackStore, path: str | Path | BinaryIO) -> int:
    """``export_rows`` as JSON lines: see :meth:`FeedbackStore.export_jsonl`."""
    if not hasattr(path, "write"):
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ValidationError(f"export_jsonl needs a file path or a binary file object, got {path!r}")
        path = path_text(path, "export path")  # a NUL character: a bare ValueError from os.path.samefile
        if store._opened is not None:  # an export written over the store it reads destroys it ("not a database")
            refuse_overwriting_store(path, store._opened)
    if hasattr(path, "write"):
        n = 0
        try:
            for row in store.export_rows():
                try:
                    line = _jsonl(row)
                except ValueError as exc:  # NaN or infinity, written outside rlfb (a traceback before; its own
                    # writes keep every number finite, and feedback's and rewards' are checked before the first row)
                    raise CorruptStateError(f"event {row.get('event_id')!r} is damaged: it holds a number JSON "
                                            f"cannot hold ({exc})") from exc
                path.write(line)  # type: ignore[union-attr]
                n += 1
        except CorruptStateError as exc:  # a row damaged outside rlfb: say in which store
            raise CorruptStateError(f"cannot export {store.path}: {exc}") from exc
        return n
    # whole or not at all: a failure part way leaves an earlier export as it was
    return write_atomically(Path(path), lambda fh: export_jsonl(store, fh))  # type: ignore[arg-type]
