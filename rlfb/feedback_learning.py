"""Learning from feedback on a logged retrieval: what is logged for it, who learns it, and the Episode learned.

A retrieval is logged with what the learner needs back later (:func:`metadata_to_log`, :func:`log_retrieval`):
the decision, each hit's row and, where the store keeps no query text, the learner's key for the question
(:func:`learner_query`, :data:`QUERY_KEY`). Feedback on it is recorded and learned in one transaction
(:func:`record_and_learn`) by the live ensemble that made the decision (:func:`rlfb.runs.maker_of`), which
rebuilds the decision from the logged rows as an :class:`~rlfb.policies.base.Episode`
(:func:`rebuild_episode`) and learns it on top of the store's newest state (:func:`learn_record`). Implicit
feedback (:meth:`~rlfb.FeedbackEnsemble.observe`) is inferred from a session and given the same way
(:func:`record_implicit`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfb._caller import warn_at_app
from rlfb.errors import CorruptStateError, RlfbError, StoreClosedError, UnknownEventError, UnknownFeedbackError
from rlfb.memory import HASHED_KEY, question_key
from rlfb.policies.base import Context, Decision, Episode
from rlfb.runs import (
    followup_time,
    hashes_queries,
    in_callers_block,
    maker_of,
    open_blocks,
    owns_event,
    previous_retrieval,
)
from rlfb.snapshot_sync import learn_again_on_rollback, take_newer, undo_on_rollback
from rlfb.types import Hit

if TYPE_CHECKING:
    from rlfb.ensemble import FeedbackEnsemble
    from rlfb.store.records import FeedbackRecord

#: The event metadata key of the learner's key for a question, logged where the store keeps no text.
QUERY_KEY = "rlfb_query_key"


def learner_query(store: Any, query: str) -> str:
    """What the learner knows a question by: its text (a long one by its hash:
    :func:`rlfb.memory.question_key`), or, with a store that keeps no text
    (``store_text=False``), the sha256 of its normalised text. A key other than the text is logged with
    the event (:data:`QUERY_KEY`), so that no query text reaches the learner's saved state and a
    rebuilt episode finds the same question after a restart."""
    if hashes_queries(store):
        from rlfb.memory import is_blank, normalize_query
        from rlfb.store import query_hash

        if is_blank(query):
            return ""  # nothing to hide, and the memory must still see that it names nothing
        # of the normalised text, as the memory keys a question it knows by its text: a hash of the
        # raw text took "What causes tides?" and "what causes tides" for two questions
        return HASHED_KEY + query_hash(normalize_query(query))
    return question_key(query)


def metadata_to_log(
    store: Any,
    ctx: Context,
    key: str,
    *,
    event_id: str | None,
    parent_id: str | None,
    metadata: Mapping[str, Any] | None,
    timestamp: float | None,
) -> dict[str, Any]:
    """The metadata to log a retrieval of ``ctx`` with (the learner knowing its question by ``key``), once
    ``store`` has checked the event's arguments."""
    logged = _logged_metadata(metadata, key if key != ctx.query or hashes_queries(store) else None)
    # before ranking: a retrieval refused only when logged (a future timestamp, an id already
    # logged) had moved the policy's random state and the memory's count of asks all the same
    check = getattr(store, "check_event_args", None)  # a store of the user's own may lack it
    if check is not None:
        check(event_id=event_id, session_id=ctx.session_id, parent_id=parent_id, timestamp=timestamp,
              metadata=logged)
    return logged


def log_retrieval(
    store: Any,
    ctx: Context,
    decision: Decision,
    hits: Sequence[Hit],
    used: int | None,
    *,
    event_id: str | None,
    parent_id: str | None,
    metadata: dict[str, Any],
    timestamp: float | None,
) -> str:
    """Log a ranking of ``ctx`` in ``store``: its decision and each hit's row (the answer written from the top
    ``used``); returns the event id."""
    return store.log_event(
        ctx.query,
        decision.to_dict(),
        [_chunk_row(h, used) for h in hits],
        session_id=ctx.session_id,
        features=dict(ctx.features),
        query_type=ctx.query_type,
        event_id=event_id,
        parent_id=parent_id,
        metadata=metadata,
        timestamp=timestamp,
    )


def _logged_metadata(metadata: Mapping[str, Any] | None, key: str | None) -> dict[str, Any]:
    """An event's metadata; where the learner knows the question by a key other than its text (a store
    that keeps no text), plus that ``key``, so that an episode rebuilt after a restart finds the question
    the memory knows (a hash, no text; ``""`` for a blank question)."""
    out = dict(metadata or {})
    if key is not None:
        out[QUERY_KEY] = key
    return out


def _chunk_row(hit: Hit, used: int | None = None) -> dict[str, Any]:
    return {
        "chunk_id": hit.chunk_id,
        "rank": hit.rank,
        "score": hit.score,
        "scores": dict(hit.scores),
        "normalized": dict(hit.normalized),
        "proposed_by": list(hit.proposed_by),
        "used": used is None or hit.rank <= used,
    }


def record_and_learn(
    ens: FeedbackEnsemble, event_id: str | None, signal: str | None, **fields: Any
) -> FeedbackRecord:
    """The body of :meth:`FeedbackEnsemble.feedback <rlfb.FeedbackEnsemble.feedback>`: record the feedback
    (``fields`` are ``record_feedback``'s keyword arguments) and have the event's maker learn it."""
    store = ens._require_store()
    damaged = None
    # one transaction: when learning fails (another process held the write lock too long), the feedback
    # is not kept either, so a retry with the same idempotency key records it and learns it; kept but
    # unlearned, the retry was a duplicate and was never learned
    undo = False
    with ens._guarded(), store.exclusive():
        record = store.record_feedback(event_id, signal, **fields)
        # two ensembles of the same retrievers on one store: the one that made the decision learns it
        maker = maker_of(record.event_id, store)
        learner: FeedbackEnsemble = ens if maker is None else maker
        together = learner.store is store
        if together:
            undo = in_callers_block(store)
            damaged = learn_recorded(learner, record, together=True, undo=undo)
    if not together:  # its own connection to this file waits for this one's write lock
        damaged = learn_recorded(learner, record, together=False)
    # feedback stored and not learned before (a killed process's, or stored alone): after this one, which the
    # caller waits for
    catch_up(learner, undo=undo)
    if damaged is not None:
        raise damaged
    return record


def learn_recorded(learner: FeedbackEnsemble, record: Any, event: Mapping[str, Any] | None = None, *,
                   together: bool, undo: bool = False) -> CorruptStateError | None:
    """Have ``learner`` learn the feedback ``record`` that was just recorded for it (``event``: its logged event,
    when already read), after the rows it keeps unlearned (:func:`learn_pending`); a damaged logged row of the
    event is returned, not raised: the feedback is kept.

    ``together``: inside the recording's transaction, on the learner's own store object (``undo``: inside a
    caller's block as well). Otherwise the row is committed already, and the learner, on its own connection to
    the file, waits for the lock: learning that fails then (another writer took the lock meanwhile) leaves it
    stored and unlearned, and a retry with its idempotency key is a duplicate, so the learner keeps it to learn
    at its next feedback and the error says so (an audit of 2026-12-06 found 3 of 40 feedbacks stored and
    never learned; through the adapters, run feedback, until a later audit that day).
    """
    if together:
        learn_pending(learner, undo=undo)
        return _learn_keeping(learner, record, event, undo=undo)
    try:
        learn_pending(learner)
        return _learn_keeping(learner, record, event)
    except BaseException as exc:
        _keep_unlearned(learner, record, exc)
        raise


def record_implicit(
    ens: FeedbackEnsemble,
    session_id: str,
    query: str | None,
    *,
    dwell_seconds: float | None,
    cited: Sequence[str],
    opened: Sequence[str],
    timestamp: float | None,
) -> list[FeedbackRecord]:
    """The body of :meth:`FeedbackEnsemble.observe <rlfb.FeedbackEnsemble.observe>`: the implicit signals on the
    session's latest retrieval (made by ``timestamp``, where given), each given to ``ens`` as feedback."""
    from rlfb.implicit import infer_at

    store = ens._require_store()
    at = followup_time(store, timestamp)
    previous = previous_retrieval(store, session_id, timestamp, at)
    implicit = ens.implicit
    if previous is None:
        # nothing to judge yet; a bad argument is an error all the same, not only once the session has a retrieval
        implicit.infer({"id": ""}, query, dwell_seconds=dwell_seconds, cited=cited, opened=opened)
        return []
    signals = infer_at(implicit, previous, query, dwell_seconds=dwell_seconds, cited=cited, opened=opened,
                       at=at)
    maker = maker_of(previous["id"], store)
    # all or nothing: a signal refused (an idempotency conflict, a busy or full store) took back those before it,
    # which were kept and learned. Not where another connection to the file learns them: it would wait on this
    # block's write lock (each is then a transaction of its own, as before)
    together = maker is None or maker.store is store
    records = []
    damaged = None
    with store.exclusive() if together else contextlib.nullcontext():
        for sig in signals:
            try:
                records.append(
                    ens.feedback(sig.event_id, sig.signal, chunk_id=sig.chunk_id, timestamp=timestamp,
                                 session_id=session_id, idempotency_key=sig.idempotency_key,
                                 comment=sig.reason or None)
                )
            except CorruptStateError as exc:  # stored, not learned (the event's row is damaged): kept, as it says
                damaged = exc
    if damaged is not None:
        raise damaged
    return records


def learn_pending(ens: FeedbackEnsemble, *, undo: bool = False) -> None:
    """Learn the feedback rows ``ens`` keeps as stored and not learned (:func:`_keep_unlearned`), oldest first;
    one whose event's row is damaged is let go, stored and unlearned, as at its first try. Inside a block that
    may still roll back (the feedback's own, or ``undo``: a caller's), one learned is kept again if it does."""
    pending = ens._unlearned
    if not pending:
        return
    store = ens._require_store()
    with ens._guarded():
        for feedback_id, record in sorted(pending.items()):
            with contextlib.suppress(CorruptStateError):
                learn_record(ens, record, undo=undo)
            del pending[feedback_id]
            if open_blocks(store):
                store.on_rollback(lambda f=feedback_id, r=record: pending.setdefault(f, r))


def _keep_unlearned(ens: FeedbackEnsemble, record: Any, exc: BaseException) -> None:
    """``record`` was committed, and learning it on ``ens`` (its own connection to the file) failed with ``exc``:
    keep it for ``ens``'s next feedback (:func:`learn_pending`), and say so in ``exc``."""
    with ens._lock:
        if not record.duplicate and record.in_window:  # a duplicate's row is kept already, if it was not learned
            ens._unlearned[record.feedback_id] = record
        if record.feedback_id not in ens._unlearned:
            return
    note = (f"feedback {record.feedback_id} on event {record.event_id!r} is stored but not learned yet; the "
            "ensemble that made the retrieval learns it at its next feedback (a retry with the same "
            "idempotency key included)")
    add_note = getattr(exc, "add_note", None)  # Python 3.11+
    if add_note is not None:
        add_note(note)
    else:  # Python 3.10: said nowhere before, where a retry's caller needs it most
        warn_at_app(note, RuntimeWarning)


def _learn_keeping(ens: FeedbackEnsemble, record: Any, event: Mapping[str, Any] | None = None, *,
                   undo: bool = False) -> CorruptStateError | None:
    """``ens._learn``; a damaged logged row of the event is returned, not raised: the feedback is kept."""
    try:
        ens._learn(record, event, undo=undo)
    except CorruptStateError as exc:
        return exc
    return None


def learn_record(ens: FeedbackEnsemble, record: Any, event: Mapping[str, Any] | None = None, *,
                 undo: bool = False) -> None:
    """Learn from a stored feedback record, unless it is a retry, out of window, on another's retrieval, or
    a repeat of the latest feedback of its session and user on the same chunk (:meth:`FeedbackStore.repeats_latest
    <rlfb.store.FeedbackStore.repeats_latest>`).

    ``undo``: the record was written inside a caller's ``store.exclusive()`` block, which may still roll
    it back; the learning is then taken back with it (:func:`rlfb.snapshot_sync.undo_on_rollback`).
    """
    if record.duplicate or not record.in_window:
        return
    marked = _marks(ens._require_store(), record)
    with ens._guarded():
        try:
            event = ens._require_store().event(record.event_id) if event is None else event
            if event is None or not owns_event(ens, event):
                # another engine's decision (log_external): its propensities are not ours to learn from, nor
                # anyone's (stored as nothing to learn). Another policy's, or other retrievers': theirs (catch_up)
                return
            if ens._require_store().repeats_latest(record):
                # a double click, a retry without an idempotency key: stored as given, learned once. Learned
                # again and again, one repeated request would lift a chunk past anything a user said
                if marked:
                    with contextlib.suppress(UnknownFeedbackError):  # pruned meanwhile: nothing left to mark
                        ens._require_store().mark_learned(record.feedback_id, False)
                return
            episode = ens.episode(record.event_id, record, event=event)
        except RlfbError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            # the feedback is stored (nothing lost); only the logged retrieval is unreadable
            raise CorruptStateError(
                f"feedback {getattr(record, 'feedback_id', '?')} on event {record.event_id!r} is stored, but "
                f"the event's logged row is damaged, so it is not learned from: {exc!r}"
            ) from exc
        # learn on top of the newest shared state, holding the store's write lock from reading it to
        # saving the result: another process learning meanwhile would otherwise start from the same
        # snapshot, and whichever saved last would drop the other's learning
        with ens._require_store().exclusive() as store:
            # checked under the write lock: another process (or this one, catching up) may have learned it since;
            # or this ensemble holds it learned, its snapshot not written yet
            if marked and (record.feedback_id in ens._held or store.feedback_learned(record.feedback_id) is not None):
                return
            if undo:
                undo_on_rollback(ens, store)
            else:  # rlfb's own block, undone only by a failure (a full disk): go back to the last snapshot
                learn_again_on_rollback(ens, store)
            ens._refresh(force=True, catch_up=False)
            ens._learner.learn(episode)
            if marked:  # marked learned by the snapshot that writes this learning (persist_state), held until then
                ens._held[record.feedback_id] = episode
            ens._learned(episode)
            if marked and record.feedback_id in ens._held:
                # no snapshot yet (persist_interval above 0): killed before it, the row is learned again at the
                # next start; marked learned at once, the learning was lost with the process
                _hold(ens, store, record.feedback_id)


def _hold(ens: FeedbackEnsemble, store: Any, feedback_id: int) -> None:
    """Mark the row ``feedback_id``, which ``ens`` learned and has not written, as held; a store of the user's own
    whose ``mark_learned`` takes no ``held`` gets it marked learned, as before held rows were kept."""
    try:
        store.mark_learned(feedback_id, held=True)
    except UnknownFeedbackError:  # pruned by another process since it was read: nothing to hold, nor to write
        del ens._held[feedback_id]
    except TypeError:
        store.mark_learned(feedback_id)
        del ens._held[feedback_id]  # settled: not one another ensemble may have taken (take_newer)


def _marks(store: Any, record: Any) -> bool:
    """Whether ``store`` keeps which feedback rows were learned (a store of the user's own may not) and
    ``record`` names one of its rows."""
    fid = getattr(record, "feedback_id", None)
    return (callable(getattr(store, "mark_learned", None)) and callable(getattr(store, "feedback_learned", None))
            and isinstance(fid, int) and not isinstance(fid, bool) and fid >= 1)


#: rows owed learned at one look, in one transaction with one snapshot: a backlog (a feedback service writing
#: while the app was down) is learned a batch per refresh, so that no retrieval waits for all of it
CATCH_UP_BATCH = 100


def catch_up(ens: FeedbackEnsemble, *, undo: bool = False) -> int:
    """Learn the feedback stored on ``ens``'s decisions that no learner has taken
    (:meth:`FeedbackStore.unlearned_feedback <rlfb.store.FeedbackStore.unlearned_feedback>`; a
    ``FeedbackStore`` is read through :func:`rlfb.store.feedback_log.owed`, a bounded look), oldest first, at
    most :data:`CATCH_UP_BATCH` rows, and return how many rows were looked at.

    That is feedback stored by a process killed before it learned it, stored while the store's newest snapshot
    was damaged, given on this policy's decisions while no app of it ran, or stored with
    ``FeedbackStore.record_feedback`` alone. Each row is looked at once per ensemble; one on another live
    ensemble's decision is left to that one, one whose event's row is damaged is let go (stored, unlearned).
    The rows looked at, their marks and one snapshot are written in one transaction; while a backlog lasts,
    each retrieval looks again.
    ``undo``: inside a caller's block that may roll back (as :func:`learn_pending`). It runs beside a retrieval
    or a feedback that succeeded, so a failure (a busy store) is not raised: it is warned of, once per
    ensemble, and the rows not learned are looked at again at the next refresh or feedback.
    """
    store = ens._store
    find = getattr(store, "unlearned_feedback", None)
    if store is None or not callable(find) or ens._catching_up:
        return 0
    ens._catching_up = True
    start = ens._caught_up
    try:
        with ens._guarded():
            ens._caught_up_once = True
            held = ens._take_held
            records, through, last = _owed(store, find, start, ens._learner.policy_name, held)
            ens._owed_more = False  # a look that fails is tried again at the next refresh, not at each retrieval
            # held rows looked at to the end (once this batch is learned and written): those held later are live
            # ensembles', left to them
            if not records:
                if open_blocks(store):  # rows of a caller's block it may roll back, whose ids
                    store.on_rollback(lambda: _look_again(ens, start, held))  # SQLite then gives again
                ens._caught_up = max(ens._caught_up, through)  # other policies' rows: not read again
                ens._owed_more = not last  # OWED_SCAN of them read: the next retrieval reads on
                if last:
                    ens._take_held = False
                return 0
            exclusive = getattr(store, "exclusive", None)  # a store of the user's own may have none
            with exclusive() if callable(exclusive) else contextlib.nullcontext():
                on_rollback = getattr(store, "on_rollback", None)
                if callable(on_rollback):  # this block, or a caller's around it, rolled back: look at them again
                    on_rollback(lambda: _look_again(ens, start, held))
                # the snapshot after the batch, not one per row: a backlog of 1,000 rows wrote 1,000 of them
                ens._holding_snapshots = True
                try:
                    looked = _learn_owed(ens, store, records, undo)
                finally:
                    ens._holding_snapshots = False
                if ens._dirty:
                    # on the newest snapshot (a batch that learned nothing read none under this lock), when
                    # persist_interval says: until then the rows are held, and a process killed first leaves them
                    # to the next ensemble to start (written at once whatever it said until 2026-12-06, when
                    # they were marked learned before their learning was written)
                    take_newer(ens)
                    ens._persist()
            if looked == len(records):
                ens._caught_up = max(ens._caught_up, through)
                if last:
                    ens._take_held = False
            # a backlog, or a look that read OWED_SCAN rows: the next retrieval looks again, not refresh_interval
            # later
            ens._owed_more = not last
            return looked
    except CorruptStateError:
        return 0  # a damaged snapshot: the retrieval's or the feedback's own refresh says so
    except StoreClosedError:
        # another thread closed the ensemble after this call's own feedback was learned and written: nothing is
        # "tried again" on a closed store (it warned so at most closes under load; a thread audit, 2026-12-07),
        # and the rows owed are the next ensemble's on the file
        return 0
    except RlfbError as exc:
        if not ens._catch_up_warned:
            ens._catch_up_warned = True
            # the app's line (stacklevel=3 named ensemble.py)
            warn_at_app(f"rlfb: feedback stored and not learned yet could not be learned now ({exc}); it is "
                        "tried again at the next refresh or feedback", RuntimeWarning)
        return 0
    finally:
        ens._catching_up = False


def _owed(store: Any, find: Callable[..., Any], after: int, policy: str, held: bool) -> tuple[list[Any], int, bool]:
    """The rows owed after id ``after`` on ``policy``'s decisions, a batch, the id up to which every row owed
    (to any policy) was read, and whether the look read them all (``find``: the store's ``unlearned_feedback``,
    for a store of the user's own, which is read as before: to the batch's last row); with ``held``, the rows
    running learners hold unwritten too."""
    bounded = getattr(store, "_owed_feedback", None)
    if callable(bounded):
        batch = bounded(after, policy, CATCH_UP_BATCH, held)
        return batch.records, batch.through, batch.complete
    records: list[Any] = []
    if held:
        try:
            records = list(find(after=after, policy=policy, limit=CATCH_UP_BATCH, held=True))
        except TypeError:  # a store of the user's own, whose unlearned_feedback knows no held rows
            held = False
    if not held:
        records = list(find(after=after, policy=policy, limit=CATCH_UP_BATCH))
    return records, after, len(records) < CATCH_UP_BATCH


def _look_again(ens: FeedbackEnsemble, start: int, held: bool) -> None:
    """A look's writes were undone: look again from row ``start`` on, at held rows too if it did."""
    ens._caught_up = min(ens._caught_up, start)
    ens._take_held = ens._take_held or held


def _learn_owed(ens: FeedbackEnsemble, store: Any, records: Sequence[Any], undo: bool) -> int:
    """The body of :func:`catch_up`, inside its transaction: learn ``records`` in order; returns how many were
    looked at (all but those from a damaged snapshot on, which are looked at again once it is dropped)."""
    looked = 0
    for record in records:
        maker = maker_of(record.event_id, store)
        if maker is None or maker is ens:  # another live ensemble's decision: that one learns it
            try:
                learn_record(ens, record, undo=undo)
            except CorruptStateError:
                try:  # the newest snapshot is damaged (this raises again): stop before this row
                    ens._refresh(force=True, catch_up=False)
                except CorruptStateError:
                    return looked
                # else the event's logged row is: let it go
        ens._caught_up = record.feedback_id
        looked += 1
    return looked


def rebuild_episode(
    store: Any,
    event_id: str,
    record: Any,
    event: Mapping[str, Any] | None,
    *,
    names: tuple[str, ...],
    contexts: Mapping[str, Context],
    embed: Callable[[str], np.ndarray | None],
) -> Episode:
    """The body of :meth:`FeedbackEnsemble.episode <rlfb.FeedbackEnsemble.episode>`: the decision logged as
    ``event`` (read from ``store`` if ``None``), for an ensemble of the retrievers ``names``, with the rewards of
    ``record``. The question's embedding is the live context's (``contexts``), else ``embed`` of its text."""
    event = store.event(event_id) if event is None else event
    if event is None:
        raise UnknownEventError(f"no retrieval event {event_id!r}")
    chunks = event["chunks"]
    shown_ids = tuple(c["chunk_id"] for c in chunks)
    shown = np.array(
        [[_as_float(c["normalized"].get(n)) for n in names] for c in chunks], dtype=np.float64
    ).reshape(len(chunks), len(names))
    chunk_rewards = np.array([float(record.chunk_rewards.get(c, 0.0)) for c in shown_ids])
    # the fused scores as shown (weights plus memory and confidence): policies re-rank with them
    logged = np.array([np.nan if c.get("score") is None else c["score"] for c in chunks], dtype=np.float64)
    scores = logged if logged.size and np.all(np.isfinite(logged)) else None
    # unclipped: a chunk's clipped total minus this record hides earlier rewards once the sum hits the clip
    # what earlier feedback taught: repeats, stored but not learned, taught nothing
    try:
        earlier = store.chunk_reward_sums(event_id, before_feedback_id=getattr(record, "feedback_id", None),
                                          repeats=False)
    except UnknownEventError:  # ``event`` given, logged on another file than the learner's: no feedback here
        earlier = {}
    prior = np.array([earlier.get(c, 0.0) for c in shown_ids], dtype=np.float64)
    decision = event["decision"]
    ctx = contexts.get(event_id)
    embedding = ctx.query_embedding if ctx is not None else None
    if embedding is None and event.get("query") and not event.get("query_hashed"):
        embedding = embed(event["query"])
    if ctx is not None:
        query = learner_query(store, ctx.query)
    elif event.get("query_hashed"):
        # the learner's key as logged (a hash of the normalised text); events logged before it was kept
        # are known by the hash of their raw text
        key = (event.get("metadata") or {}).get(QUERY_KEY)
        query = key if isinstance(key, str) else HASHED_KEY + event["query_hash"]
    else:
        # as the learner knows it: a text event in a store that keeps none (written before 2026-12-05, when a
        # restart by path could) is known by its hash, and its text goes into no snapshot
        query = learner_query(store, event.get("query") or "")
    return Episode(
        event_id=event_id,
        query=query,
        retrievers=names,
        decision=Decision(
            weights=decision.get("weights") or {},
            arm=decision.get("arm"),
            propensity=float(decision.get("propensity", 1.0)),
            explored=bool(decision.get("explored", False)),
            policy=decision.get("policy") or "",
            sampling_temperature=decision.get("sampling_temperature"),
        ),
        shown_ids=shown_ids,
        shown=shown,
        chunk_rewards=chunk_rewards,
        reward=float(record.reward),
        query_type=event.get("query_type") or "default",
        features=event.get("features") or {},
        timestamp=float(event["timestamp"]),
        feedback_time=float(record.timestamp) if hasattr(record, "timestamp") else time.time(),
        query_embedding=embedding,
        prior_rewards=prior,
        response_level=getattr(record, "chunk_id", None) is None,
        scores=scores,
        used=None if all(c.get("used", True) for c in chunks) else np.array([bool(c.get("used", True))
                                                                              for c in chunks]),
    )


def _as_float(value: Any) -> float:
    """A logged score as a float; a missing one (None or NaN) counts as 0."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return out if math.isfinite(out) else 0.0
