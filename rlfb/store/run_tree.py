"""The run tree: links between runs that are not events (a chain's sub-runs), and the runs that failed.

Feedback given on a run rates the retrievals logged below it: :func:`resolve` finds them through the
events' ``parent_id``, :func:`resolve_run` through the links too, passing failed runs by, and
:func:`run_lineage` walks up. The :class:`~rlfb.store.FeedbackStore` methods of the same names call these.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rlfb.errors import ValidationError
from rlfb.store.checks import _batches, _check_id, _items, _marks, _req_str
from rlfb.store.codec import _dec, _enc

if TYPE_CHECKING:
    from rlfb.store.feedback_store import FeedbackStore


def link_runs(store: FeedbackStore, links: Iterable[tuple[str, str]]) -> int:
    """Record ``(run_id, parent_id)`` links; return the number of new ones."""
    pairs = []
    for i, link in enumerate(_items(links, "links", "(run_id, parent_id) pairs")):
        # a str would unpack too: "ab" as ("a", "b")
        pair = None if isinstance(link, (str, bytes, Mapping)) or not isinstance(link, Iterable) else tuple(link)
        if pair is None or len(pair) != 2:
            raise ValidationError(f"link {i} must be a (run_id, parent_id) pair, got {link!r:.80}")
        pairs.append((_req_str(pair[0], f"link {i}: run_id"), _req_str(pair[1], f"link {i}: parent_id")))
    if not pairs:
        return 0
    now = store._now()
    rows = [(_enc(run), _enc(parent), now) for run, parent in pairs]
    with store._write() as conn:
        before = conn.total_changes
        conn.executemany("INSERT OR IGNORE INTO run_links (run_id, parent_id, ts) VALUES (?, ?, ?)", rows)
        return conn.total_changes - before


def fail_run(store: FeedbackStore, run_id: str) -> bool:
    """Mark ``run_id`` as a run that raised; return whether it was not marked before."""
    enc = _enc(_check_id(run_id, "run_id"))
    with store._write() as conn:
        return conn.execute("INSERT OR IGNORE INTO failed_runs (run_id, ts) VALUES (?, ?)",
                            [enc, store._now()]).rowcount == 1


#: the runs linked directly under a run and the events logged with it as their parent (the run id twice): what
#: :func:`fail_children` marks and :func:`run_children` reads
_CHILDREN = "SELECT run_id AS child FROM run_links WHERE parent_id = ? UNION SELECT id FROM events WHERE parent_id = ?"


def fail_children(store: FeedbackStore, run_id: str) -> int:
    """Mark failed every run linked directly under ``run_id`` and every event logged with it as its parent, in
    one transaction; return how many were not marked before."""
    enc = _enc(_check_id(run_id, "run_id"))
    with store._write() as conn:
        return conn.execute(
            f"INSERT OR IGNORE INTO failed_runs (run_id, ts) SELECT child, ? FROM ({_CHILDREN})",
            [store._now(), enc, enc],
        ).rowcount


def run_children(store: FeedbackStore, run_id: str) -> list[str]:
    """What :func:`fail_children` marks, read: the runs linked directly under ``run_id`` and the events logged with
    it as their parent."""
    enc = _enc(_check_id(run_id, "run_id"))
    with store._read() as conn:
        rows = conn.execute(_CHILDREN, [enc, enc]).fetchall()
    return sorted(_dec(r) for (r,) in rows)


def any_failed(store: FeedbackStore, run_ids: Iterable[str]) -> bool:
    """Whether any of ``run_ids`` was marked by :func:`fail_run`."""
    ids = [_enc(_check_id(r, "run_id", allow_empty=True)) for r in run_ids]
    with store._read() as conn:
        return any(
            conn.execute(f"SELECT 1 FROM failed_runs WHERE run_id IN ({_marks(len(b))}) LIMIT 1", b).fetchone()
            for b in _batches(ids)
        )


def unlink_run(store: FeedbackStore, run_id: str) -> int:
    """Remove ``run_id``'s link to its parent; return the number of links removed (0 or 1)."""
    enc = _enc(_check_id(run_id, "run_id"))
    with store._write() as conn:
        return conn.execute("DELETE FROM run_links WHERE run_id = ?", [enc]).rowcount


def run_lineage(store: FeedbackStore, run_id: str) -> list[str]:
    """``run_id`` and the runs above it through the links, nearest first."""
    lineage = [_check_id(run_id, "run_id", allow_empty=True)]
    seen = {run_id}
    with store._read() as conn:
        while True:  # one indexed lookup per level; a cycle (links are not checked for one) ends it
            row = conn.execute("SELECT parent_id FROM run_links WHERE run_id = ?", [_enc(lineage[-1])]).fetchone()
            parent = None if row is None else _dec(row[0])
            if parent is None or parent in seen:
                return lineage
            seen.add(parent)
            lineage.append(parent)


def resolve(store: FeedbackStore, run_id: str) -> list[str]:
    """Event ids a run id stands for: itself if it is an event, else its descendants' ids."""
    _check_id(run_id, "run_id", allow_empty=True)  # named as the caller knows it, not as event_id
    if store.has_event(run_id):
        return [run_id]
    return [e["id"] for e in store.descendants(run_id, with_chunks=False)]


def resolve_run(store: FeedbackStore, run_id: str) -> list[str]:
    """The events ``run_id`` stands for, through the links and the events' ``parent_id`` (oldest first).

    A run id that names nothing as written, but is another spelling of a UUID (upper case, without dashes, in
    braces, as ``uuid.UUID`` reads them; LangSmith parses run ids so), is looked up as the UUID's dashed and
    plain hex forms: LangChain's run ids are logged dashed, and an id copied from a trace as hex found nothing.
    """
    found = _resolve_run(store, run_id)
    if not found:
        for spelling in _uuid_spellings(run_id):
            found = _resolve_run(store, spelling)
            if found:
                break
    return found


def _uuid_spellings(run_id: str) -> list[str]:
    """The dashed and hex forms of the UUID ``run_id`` spells, other than ``run_id`` itself."""
    try:
        u = uuid.UUID(run_id)
    except (ValueError, TypeError, AttributeError):
        return []
    return [s for s in (str(u), u.hex) if s != run_id]


def _resolve_run(store: FeedbackStore, run_id: str) -> list[str]:
    root = _enc(_check_id(run_id, "run_id"))
    if store.has_event(run_id):
        return [run_id]
    seen = {root}
    frontier = [root]
    with store._read() as conn:
        while frontier:  # breadth first, one indexed query per level and table (chains are shallow)
            nxt = []
            for b in _batches(frontier):
                m = _marks(len(b))
                # the failed runs passed by one indexed lookup per child: "... EXCEPT SELECT run_id FROM
                # failed_runs" read the whole table at each level (9.8 ms with 50,000 failed runs; an audit of a
                # store at scale, 2026-12-07). IS, as EXCEPT compares: a NULL child is passed by a NULL mark
                for (child,) in conn.execute(
                    f"SELECT child FROM (SELECT run_id AS child FROM run_links WHERE parent_id IN ({m}) "
                    f"UNION SELECT id FROM events WHERE parent_id IN ({m})) "
                    "WHERE NOT EXISTS (SELECT 1 FROM failed_runs WHERE failed_runs.run_id IS child)",
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
