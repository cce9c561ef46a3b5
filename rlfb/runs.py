"""Retrievals run by other engines, and feedback addressed by run id.

Framework adapters (``langchain_rlfb``) observe retrievals they did not make
and receive feedback keyed by their framework's run ids. What they need from
the core lives here, framework-free:

* :func:`content_id`: a stable chunk id for a text that came without one;
* :func:`log_external`: log what another retriever returned as an event (its
  decision is marked with the policy :data:`EXTERNAL_POLICY`, so no learner
  mistakes it for one of its own decisions);
* :func:`score_value`: a LangSmith-style feedback score as a reward value;
* :func:`record_run_feedback`: feedback on a run id (a retrieval's, or a chain's
  that contains retrievals), learned from by the ensemble that made the decision;
* :func:`observe_followup`: a follow-up query in a session that restates the
  previous one becomes a ``"reformulation"`` on the previous retrieval.

>>> from rlfb.store import FeedbackStore
>>> store = FeedbackStore()
>>> eid = log_external(store, "what causes the aurora", [("c1", 12.5), ("c2", None)],
...                    source="bm25", event_id="run-1", session_id="s1", timestamp=1000.0)
>>> [r.signal for r in record_run_feedback(store, "run-1", value=score_value(1.0), timestamp=1060.0)]
['score']
>>> [r.signal for r in observe_followup(store, "s1", "why does the aurora happen", timestamp=1100.0)]
['reformulation']
>>> store.close()
"""

from __future__ import annotations

import math
import numbers
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any
from uuid import UUID

import numpy as np

from rlfb.errors import (
    IdempotencyConflictError,
    NonFiniteValueError,
    UnknownChunkError,
    UnknownEventError,
    UnknownOptionError,
    UnknownSignalError,
    ValidationError,
)
from rlfb.reward import NUMERIC_SIGNALS, RewardFunction
from rlfb.types import EXTERNAL_POLICY as EXTERNAL_POLICY  # the policy of another engine's retrievals
from rlfb.types import closest_hint
from rlfb.types import content_id as content_id  # where it always was importable from

if TYPE_CHECKING:
    from rlfb.store.records import FeedbackRecord

__all__ = [
    "finite_score",
    "open_blocks",
    "learned_here",
    "learns_after_commit",
    "session_text",
    "EXTERNAL_POLICY",
    "SCORE_SCALES",
    "content_id",
    "log_external",
    "score_value",
    "key_or_score",
    "owns_event",
    "remember_maker",
    "maker_of",
    "same_store",
    "store_lock",
    "record_run_feedback",
    "observe_followup",
    "default_implicit",
]


#: How a LangSmith-style feedback score maps to a reward value in [-1, 1].
SCORE_SCALES = ("unit", "signed")


def log_external(
    store: Any,
    query: str,
    results: Sequence[tuple[str, float | None]],
    *,
    source: str,
    event_id: str | None = None,
    parent_id: str | None = None,
    session_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    timestamp: float | None = None,
) -> str:
    """Log what another retriever returned, best first, as ``(chunk_id, score or None)`` pairs.

    The decision is ``{source: 1.0}`` with propensity 1 and the policy
    :data:`EXTERNAL_POLICY`. A chunk listed twice keeps its first position; a
    non-finite score is stored as ``None``. Returns the event id.
    """
    if not isinstance(source, str) or not source:
        raise ValidationError("source must be a non-empty str (the retriever's name)")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for chunk_id, score in results:
        if chunk_id in seen:
            continue
        seen.add(chunk_id)
        s = finite_score(score)
        rows.append(
            {
                "chunk_id": chunk_id,
                "rank": len(rows) + 1,
                "score": s,
                "scores": {source: s},
                "normalized": {},
                "proposed_by": [source],
            }
        )
    decision = {"weights": {source: 1.0}, "arm": None, "propensity": 1.0, "explored": False,
                "policy": EXTERNAL_POLICY}
    return store.log_event(
        query,
        decision,
        rows,
        session_id=session_id,
        event_id=event_id,
        parent_id=parent_id,
        metadata=dict(metadata or {}),
        timestamp=timestamp,
    )


def score_value(score: float | bool, scale: str = "unit") -> float:
    """A LangSmith-style feedback score as a reward value in [-1, 1].

    ``scale="unit"`` (the default) reads the score on [0, 1], LangSmith's usual
    thumbs convention: ``0`` is negative (-1), ``1`` positive (+1), ``0.5``
    neutral, linearly in between (``2 * score - 1``). ``scale="signed"`` takes a
    score already on [-1, 1] as is. A bool is a thumb on either scale: ``True``
    is +1 and ``False`` -1.

    >>> score_value(1), score_value(0), score_value(0.75), score_value(True)
    (1.0, -1.0, 0.5, 1.0)
    >>> score_value(-0.5, "signed"), score_value(False, "signed")
    (-0.5, -1.0)
    >>> score_value(3)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: score must lie in [0, 1] with scale='unit', got 3.0 ...
    """
    if scale not in SCORE_SCALES:
        raise ValidationError(f"scale must be one of {SCORE_SCALES}, got {scale!r}")
    if isinstance(score, (bool, np.bool_)):  # a thumb; False on the signed scale used to read as neutral
        return 1.0 if score else -1.0
    if not isinstance(score, numbers.Real):
        raise ValidationError(f"score must be a number or a bool, got {type(score).__name__} {score!r}")
    try:
        s = float(score)
    except OverflowError:  # an int beyond float range: a bare OverflowError before
        raise NonFiniteValueError("score must be finite, got an int beyond float range") from None
    if not math.isfinite(s):
        raise NonFiniteValueError(f"score must be finite, got {s!r}")
    if scale == "unit":
        if not 0.0 <= s <= 1.0:
            raise ValidationError(
                f"score must lie in [0, 1] with scale='unit', got {s!r} (scale='signed' takes [-1, 1])"
            )
        return 2.0 * s - 1.0
    if not -1.0 <= s <= 1.0:
        raise ValidationError(f"score must lie in [-1, 1] with scale='signed', got {s!r}")
    return s


def key_or_score(args: tuple[Any, ...], key: str | None, score: Any, method: str, *, signal: str | None = None,
                 rated: bool = False, reward: Any = None) -> tuple[str | None, Any, str | None]:
    """``(key, score, signal)`` of a handler's ``record_feedback(run_id, *args, key=..., score=...)``: LangSmith's
    ``create_feedback(run_id, "user_score", score=1.0)`` puts the key second, and a number there is the score.

    A signal's name second (``record_feedback(run_id, "thumbs_up")``, as ``FeedbackEnsemble.feedback`` takes it)
    is the signal where nothing else rates the run (no ``score``, ``signal``, nor, ``rated``, a rating or value):
    it was read as a LangSmith key, and the call refused for want of a signal. A name no signal has, with nothing
    else rating the run, is :class:`~rlfb.errors.UnknownSignalError`, as ``FeedbackEnsemble.feedback`` raises: a
    mistyped signal was read as a key, and refused for want of a signal though one was given. ``reward``: the
    :class:`~rlfb.reward.RewardFunction` whose signals are known (the built-in ones without it).

    >>> key_or_score(("user_score",), None, 1.0, "record_feedback")
    ('user_score', 1.0, None)
    >>> key_or_score((0.0,), "thumbs", None, "record_feedback")
    ('thumbs', 0.0, None)
    >>> key_or_score(("thumbs_down",), None, None, "record_feedback")
    (None, None, 'thumbs_down')
    >>> key_or_score(("thumbsup",), None, None, "record_feedback")
    Traceback (most recent call last):
    ...
    rlfb.errors.UnknownSignalError: unknown signal type 'thumbsup' (did you mean 'thumbs_up'?); known: ...
    """
    if len(args) > 1:
        raise ValidationError(f"{method} takes the run id and a key or a score, got {len(args) + 1} "
                              "positional arguments")
    for given in args:
        if isinstance(given, str):
            if signal is None and score is None and not rated and key is None:
                base = _signal_base(given, reward, method)
                if base not in NUMERIC_SIGNALS:
                    signal = given
                    continue
            if key is not None:
                raise ValidationError(f"give the key once: {given!r} and key={key!r}")
            key = given
        else:
            if score is not None:
                raise ValidationError(f"give the score once: {given!r} and score={score!r}")
            score = given
    return key, score, signal


def _signal_base(name: str, reward: Any, method: str) -> str:
    """The base kind of the signal ``name`` given second with nothing else rating the run, by ``reward``'s signals
    (the built-in ones where it is ``None``); a name no signal has is :class:`~rlfb.errors.UnknownSignalError`,
    as :meth:`RewardFunction.resolve <rlfb.reward.RewardFunction.resolve>` names it: read as a LangSmith key
    with no score, it was refused for want of a signal."""
    reward = reward if isinstance(reward, RewardFunction) else RewardFunction()
    try:
        return reward.resolve(name)
    except UnknownSignalError as exc:
        raise UnknownSignalError(
            f"{exc}; a LangSmith-style feedback key needs its score: {method}(run_id, {name!r}, score=...)"
        ) from None


def same_store(a: Any, b: Any) -> bool:
    """Whether two feedback stores, or store file paths, are one database: the same object or SQLite file.

    >>> from rlfb.store import FeedbackStore
    >>> same_store(FeedbackStore(), FeedbackStore())  # two in-memory stores are two databases
    False
    """
    if a is b:
        return True
    # a FeedbackStore's file as opened (a relative path read after a chdir names another file), else its path
    pa, pb = (os.fspath(x) if isinstance(x, (str, os.PathLike))
              else getattr(x, "_opened", None) or getattr(x, "path", None) for x in (a, b))
    if not pa or not pb or ":memory:" in (pa, pb):
        return False
    return os.path.realpath(pa) == os.path.realpath(pb)


def store_lock(store: Any) -> AbstractContextManager[Any]:
    """The in-process lock of ``store`` (:attr:`rlfb.store.FeedbackStore.lock`), to take before one's own.

    A store of the user's own may have none: then nothing is taken.
    """
    lock = getattr(store, "lock", None)
    return lock if lock is not None else nullcontext()


def open_blocks(store: Any) -> int:
    """How many ``store.exclusive()`` blocks this thread has open on ``store`` (a store of the user's own without
    :attr:`~rlfb.store.FeedbackStore.exclusive_depth`: 0). A write made inside one is undone if it rolls back."""
    depth = getattr(store, "exclusive_depth", 0)
    return depth if isinstance(depth, int) else 0


def in_callers_block(store: Any) -> bool:
    """Inside one ``store.exclusive()`` block of rlfb's own: whether the caller holds another around it, which
    may still roll back what is written in this one. A store of the user's own without
    :attr:`~rlfb.store.FeedbackStore.exclusive_depth` is taken as not."""
    return open_blocks(store) > 1


def owns_event(ensemble: Any, event: Mapping[str, Any]) -> bool:
    """Whether ``ensemble`` made the logged decision (so it may learn from feedback on it): the same retrievers,
    and the same policy where the event names one. Apps of other policies on one file learn apart: a gradient
    app given feedback on a thompson app's decisions learned them (their propensities are another policy's),
    and the thompson app, restarted, had learned none."""
    logged = event.get("policy")
    if ensemble is None or logged == EXTERNAL_POLICY:
        return False
    if set(event.get("retrievers") or ()) != set(ensemble.retriever_names):
        return False
    policy = getattr(getattr(ensemble, "learner", None), "policy_name", None)
    return logged is None or policy is None or logged == policy


# The ensemble that logged each recent decision in this process. Several learners may share a store with
# the same retrievers (a two-corpus app, an rlfb retriever and an rlfb postprocessor in one engine): feedback on
# a run covering their decisions, given through one adapter, taught that one both decisions and the other none.
_MAKERS: OrderedDict[str, weakref.ref[Any]] = OrderedDict()
_MAKERS_LOCK = threading.Lock()
_MAKERS_KEPT = 100_000  # the newest decisions; older feedback falls back to owns_event (as after a restart)


def remember_maker(event_id: str, ensemble: Any) -> None:
    """Note that ``ensemble`` logged the decision ``event_id`` in this process (weakly: it may go away)."""
    with _MAKERS_LOCK:
        _MAKERS[event_id] = weakref.ref(ensemble)
        _MAKERS.move_to_end(event_id)
        while len(_MAKERS) > _MAKERS_KEPT:
            _MAKERS.popitem(last=False)


def maker_of(event_id: str, store: Any = None) -> Any:
    """The live ensemble of this process that logged ``event_id`` into ``store`` (the same file; ``None``: into
    any store) and has not closed it, else ``None``."""
    with _MAKERS_LOCK:
        ref = _MAKERS.get(event_id)
    ensemble = ref() if ref is not None else None
    theirs = getattr(ensemble, "store", None)
    if ensemble is None or theirs is None or getattr(theirs, "closed", False):
        return None  # gone, or closed (an app restarted in this process)
    if store is not None and not same_store(theirs, store):
        return None  # on another store
    return ensemble


def learned_here(store: Any, event_id: str, learner: Any) -> bool:
    """Whether feedback on ``event_id`` stored in ``store`` is learned in this process: by the live ensemble
    that logged it there (:func:`maker_of`), or else by ``learner`` where it made the decision
    (:func:`owns_event`). Another engine's retrieval (:func:`log_external`) has nothing to learn, and counts as
    learned. What the adapters' handlers warn of, once, when it is not."""
    if maker_of(event_id, store) is not None:
        return True
    event = store.event(event_id)
    return event.get("policy") == EXTERNAL_POLICY or owns_event(learner, event)


def learns_after_commit(store: Any, run_id: Any, ensembles: Mapping[str, Any] | None = None) -> bool:
    """Whether feedback on ``run_id`` recorded in ``store`` would be learned through another connection to
    its file (a live learner of this process whose store is another object on the same file).

    :func:`record_run_feedback` commits such feedback first and learns it after, so a caller holding
    ``store.exclusive()`` around it would keep that learner waiting for the file's write lock
    (:class:`~rlfb.errors.StoreBusyError`). ``ensembles`` as for :func:`record_run_feedback`. A run id
    nothing was logged under is ``False``: recording it fails on its own.
    """
    try:
        event_ids = store.resolve_run(_run_id(run_id))
    except ValidationError:
        return False
    makers = ensembles or {}
    for eid in event_ids:
        learner = makers.get(eid)
        if learner is None:
            learner = maker_of(eid, store)
        if learner is not None and getattr(learner, "store", None) is not store:
            return True
    return False


# what feedback on a run takes by name, beside the signal: the closest one is named for a misspelt keyword
FEEDBACK_ARGUMENTS = ("signal", "score", "rating", "value", "chunk_id", "comment", "key", "timestamp", "session_id",
                      "user_id", "idempotency_key")


def record_run_feedback(
    store: Any,
    run_id: str,
    signal: str | float | None = None,
    *,
    ensemble: Any = None,
    ensembles: Mapping[str, Any] | None = None,
    score: float | bool | None = None,
    score_scale: str = "unit",
    value: float | None = None,
    rating: float | None = None,
    chunk_id: str | None = None,
    comment: str | None = None,
    key: str | None = None,
    timestamp: float | None = None,
    session_id: str | None = None,
    user_id: str | None = None,
    idempotency_key: str | None = None,
    **unknown: Any,
) -> list[FeedbackRecord]:
    """Record feedback on every retrieval that ``run_id`` stands for; return the records.

    ``run_id`` is a retrieval's event id, or the id of a run above retrievals
    (a chain), resolved through :meth:`~rlfb.store.FeedbackStore.resolve_run`.
    The feedback is a ``signal``, a ``rating``, a raw ``value`` in [-1, 1], or a
    LangSmith-style ``score`` (mapped by :func:`score_value` with ``score_scale``; a
    number in ``signal``'s place is the score, as the handlers take it second).
    Feedback on a chain that made several retrievals goes to each of them; with
    ``chunk_id``, only to those that returned that chunk. All of it is written
    in one transaction: when any retrieval rejects it, nothing is written and
    nothing learned. ``ensemble`` then learns from the events it made
    (:func:`owns_event`); other events (:func:`log_external`) are only stored.
    ``ensembles`` maps event ids to the ensemble that made each (several
    learners on one store): those events are learned by it instead. Without
    such an entry, an event a live ensemble of this process logged on this
    store (:func:`maker_of`) is learned by that one, not by ``ensemble``.

    Each event's idempotency key is ``"<idempotency_key>:<event id>"``, however
    many events the run resolves to (so a retry after the chain logged another
    retrieval is still a duplicate), kept as given when it already ends with
    ``":<event id>"``. A key stored bare on the event (how earlier versions
    keyed a run of one retrieval) is reused for that event. A conflict
    (:class:`~rlfb.errors.IdempotencyConflictError`) names the key as given, and
    the form it is stored under for the retrieval it conflicted on.

    Raises :class:`UnknownEventError` when nothing was logged under the run id,
    :class:`UnknownChunkError` when none of its retrievals returned ``chunk_id``.
    """
    if unknown:  # the adapters' feedback() passes its keywords on: a TypeError here named this function
        name = sorted(unknown)[0]
        raise UnknownOptionError(
            f"feedback takes no argument {name!r}{closest_hint(name, FEEDBACK_ARGUMENTS)}; it takes a signal, "
            "score, rating or value, and chunk_id, comment, key, timestamp, session_id, user_id, idempotency_key"
        )
    run_id = _run_id(run_id)
    if signal is not None and not isinstance(signal, str):
        # a number second is the score (`retriever.feedback(run_id, 1.0)`), as the handlers' record_feedback
        # takes it in LangSmith's shape; it was refused as a signal that is not a str
        key, score, _ = key_or_score((signal,), key, score, "feedback")
        signal = None
    if score is not None:
        value = _score_as_value(store, signal, score, score_scale, value, rating)
    events = _rated_events(store, run_id, chunk_id)
    reward = getattr(store, "reward", None)
    if reward is not None:
        # checked once here, once the run is known: the batch below names the item that failed ("feedback item 0:
        # ..."), which says nothing to a caller who rated one run and gave the same signal for each retrieval
        reward.normalize(signal, value, rating)
    items = [
        dict(event_id=e["id"], signal=signal, value=value, rating=rating, chunk_id=chunk_id, timestamp=timestamp,
             session_id=session_id, user_id=user_id, idempotency_key=_event_key(store, idempotency_key, e["id"]),
             comment=comment, key=key)
        for e in events
    ]
    makers = ensembles or {}
    learners = [(e, learner) for e in events if owns_event(learner := _learner_of(e["id"], makers, store, ensemble), e)]
    return _record_and_learn(store, items, learners, idempotency_key)


def _score_as_value(store: Any, signal: str | None, score: float | bool, score_scale: str, value: float | None,
                    rating: float | None) -> float:
    """A LangSmith-style ``score`` as the value in [-1, 1] feedback takes, checked against what else was given."""
    if value is not None or rating is not None:  # the store would name value=, which this caller never gave
        raise ValidationError(f"give score= or {'value' if value is not None else 'rating'}=, not both")
    if signal is not None and (base := _resolve_beside_score(store, signal)) != "score":
        # the score becomes a value in [-1, 1], which a rating signal would read as stars: a thumbs up
        # (score 1) was stored as one star
        takes = "a rating (rating=)" if base == "rating" else "no number"
        raise ValidationError(f"score= goes alone or with a score signal; signal {signal!r} takes {takes}")
    return score_value(score, score_scale)


def _resolve_beside_score(store: Any, signal: str) -> str:
    """The base kind of a signal given with a ``score``; a name no signal has says where a LangSmith key goes
    (``create_feedback(run_id, "correctness", score=1.0)`` puts its key where rlfb's adapters take a signal)."""
    try:
        return str(store.reward.resolve(signal))
    except UnknownSignalError as exc:
        raise UnknownSignalError(f"{exc}; with a score, a LangSmith key goes as key={signal!r}") from None


def _rated_events(store: Any, run_id: str, chunk_id: str | None) -> list[dict[str, Any]]:
    """The logged retrievals feedback on ``run_id`` rates (those that returned ``chunk_id``, where given)."""
    event_ids = store.resolve_run(run_id)
    if not event_ids:
        raise UnknownEventError(
            f"no retrieval was logged under run id {run_id!r}, nor under a run below it; "
            "check that the run went through a retriever with feedback logging (a FeedbackEnsembleRetriever, "
            "or a FeedbackCallbackHandler in the run's callbacks) and that the id is the run's id; a run above "
            "the retrieval's parent (a whole chain's run id) resolves only with a FeedbackCallbackHandler in the "
            "chain's callbacks, which links each run to its parent; a LangChain retriever called on its own "
            "takes its run id as retriever.invoke(query, run_id=...), not in config (BaseRetriever drops it)"
        )
    events = [store.event(e) for e in event_ids]
    if chunk_id is not None:
        events = [e for e in events if any(c["chunk_id"] == chunk_id for c in e["chunks"])]
        if not events:
            raise UnknownChunkError(f"chunk {chunk_id!r} was not returned by any retrieval of run {run_id!r}")
    return events


def _record_and_learn(store: Any, items: list[dict[str, Any]], learners: list[tuple[dict[str, Any], Any]],
                      idempotency_key: str | None) -> list[FeedbackRecord]:
    """Record ``items`` (one per retrieval rated) all or nothing, and have each ``(event, learner)`` of
    ``learners`` learn its event's record; then each learner catches up on feedback it owes."""
    # Recorded and learned in one transaction, as FeedbackEnsemble.feedback does, when every learner keeps
    # its state in this store object; a learner on another connection (even to this file) must wait for
    # this one's write lock, so there the feedback is committed first and learned after.
    together = all(learner.store is store for _, learner in learners)
    # here: rlfb.feedback_learning imports this module
    from rlfb.feedback_learning import catch_up, learn_recorded

    damaged = failed = None
    with store.exclusive() if together else nullcontext():
        try:
            records = store.record_feedback_batch(items)  # all or nothing
        except IdempotencyConflictError as exc:
            raise _conflict_as_given(exc, idempotency_key, items) from None
        by_event = {r.event_id: r for r in records}
        undo = together and in_callers_block(store)
        for event, learner in learners:
            # that event's row damaged: the feedback kept, unlearned; after the commit, a failure keeps the row
            # for the learner's next feedback and says so (it was neither kept nor said: a retry learned nothing)
            try:
                found = learn_recorded(learner, by_event[event["id"]], event, together=together, undo=undo)
            except Exception as exc:
                if together:  # inside the recording's transaction: nothing of it is kept
                    raise
                failed = failed or exc  # committed: the other retrievals' learners still learn theirs, or keep it
                continue
            damaged = damaged or found
    if failed is not None:
        raise failed
    # feedback stored and not learned before (a killed process's, or stored alone), as ens.feedback does: a
    # feedback endpoint that never retrieves learned none of it
    for learner in {id(learner): learner for _, learner in learners}.values():
        catch_up(learner, undo=undo)
    if damaged is not None:
        raise damaged
    return records


def _learner_of(event_id: str, makers: Mapping[str, Any], store: Any, ensemble: Any) -> Any:
    """Who learns from feedback on ``event_id``: the one ``makers`` names, else its maker in this process, else
    ``ensemble`` (compared with ``is None``: an ensemble of no chunks has length 0)."""
    for learner in (makers.get(event_id), maker_of(event_id, store)):
        if learner is not None:
            return learner
    return ensemble


def _conflict_as_given(exc: IdempotencyConflictError, given: str | None,
                       items: Sequence[Mapping[str, Any]]) -> IdempotencyConflictError:
    """The conflict naming the idempotency key as the caller gave it, with the form it is stored under for
    the retrieval it conflicted on (``"k1:<event id>"``, :func:`_event_key`). The store names the stored form,
    after ``"feedback item <i>: "`` where the run stood for several retrievals: neither is what the caller
    passed. ``exc`` itself where the key is stored as given."""
    stored = exc.key
    if stored is None or stored == given or exc.recorded is None:
        return exc
    event_id = next((item["event_id"] for item in items if item["idempotency_key"] == stored), None)
    return IdempotencyConflictError(
        f"idempotency key {given!r} (stored for retrieval {event_id!r} as {stored!r}) {exc.recorded}")


def _event_key(store: Any, key: str | None, event_id: str) -> str | None:
    """The idempotency key of one event's share of run feedback (see :func:`record_run_feedback`)."""
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise ValidationError(f"idempotency_key must be a non-empty str, got {key!r}")
    if any(f["idempotency_key"] == key for f in store.feedback(event_id)):
        return key  # stored bare by an earlier version: keep it, so the retry stays a duplicate
    suffix = f":{event_id}"
    return key if key.endswith(suffix) else key + suffix


def default_implicit(ensemble: Any = None) -> Any:
    """:class:`~rlfb.implicit.ImplicitSignals` as :meth:`rlfb.FeedbackEnsemble.observe` reads them: the
    ensemble's own (:attr:`rlfb.FeedbackEnsemble.implicit`) where it has them.

    With an ensemble that has a dense retriever, follow-ups are compared by
    embedding similarity; otherwise by word overlap.
    """
    from rlfb.implicit import ImplicitSignals
    from rlfb.retrievers.base import dense_retriever

    own = getattr(ensemble, "implicit", None)  # a FeedbackEnsemble's, whose settings the user may have set
    if isinstance(own, ImplicitSignals):
        return own
    encode = None
    if ensemble is not None:
        pick = getattr(ensemble, "_dense_encoder", None)
        if callable(pick):
            encode = pick()
        else:  # the ensemble's rule: the dense retriever, never SPLADE (its sparse vectors have no cosine)
            encode = getattr(dense_retriever(ensemble.retrievers), "encode_queries", None)
    return ImplicitSignals(encode=encode)


def observe_followup(
    store: Any,
    session_id: str,
    query: str,
    *,
    ensemble: Any = None,
    implicit: Any = None,
    timestamp: float | None = None,
    run_ancestors: Collection[str] = (),
) -> list[Any]:
    """Record what a follow-up ``query`` says about the session's previous retrieval; return the records.

    A restatement of the previous query is a ``"reformulation"`` (implicit
    negative); a new topic records nothing. Signals carry the idempotency key of
    :class:`~rlfb.implicit.InferredSignal`, so observing the same follow-up twice
    records it once. Call it before logging the follow-up's own retrieval.

    ``run_ancestors`` are the runs above this retrieval (its parent first, as far
    as known). A previous retrieval under one of them, or under a run above one of
    them in the store's run links (:meth:`~rlfb.store.FeedbackStore.link_runs`),
    belongs to the same run: a multi-query retriever's variants, parallel branches,
    an agent calling its retriever tool again. Those restate the question on
    purpose, so it is not a follow-up and records nothing.
    """
    if not isinstance(session_id, str) or not session_id:
        raise ValidationError(f"session_id must be a non-empty str, got {session_id!r}")
    at = followup_time(store, timestamp)
    previous = previous_retrieval(store, session_id, timestamp, at)
    if previous is None:
        return []
    if previous.get("parent_id") is not None:
        theirs = store.run_lineage(previous["parent_id"])
        any_failed = getattr(store, "any_failed", None)  # a store of the user's own may lack it
        if any_failed is not None and any_failed(theirs):
            return []  # retrieved under a run that raised (a retry's attempt, a fallback's branch): answered nobody
        # the runs above each side, as far as the links go: a shared one is a shared run
        if run_ancestors and not {run for a in run_ancestors for run in store.run_lineage(a)}.isdisjoint(theirs):
            return []
    implicit = implicit if implicit is not None else default_implicit(ensemble)
    own = owns_event(ensemble, previous)
    records = []
    from rlfb.implicit import infer_at

    for sig in infer_at(implicit, previous, query, at=at):
        if own:
            records.append(
                ensemble.feedback(sig.event_id, sig.signal, chunk_id=sig.chunk_id, timestamp=timestamp,
                                  session_id=session_id, idempotency_key=sig.idempotency_key,
                                  comment=sig.reason or None)
            )
        else:
            fields = sig.as_feedback(session_id=session_id, timestamp=timestamp)
            records.append(store.record_feedback(**fields))
    return records


def hashes_queries(store: Any) -> bool:
    """Whether ``store`` keeps questions only hashed (``store_text=False``); no store, or a store of the user's
    own without the setting, keeps what it is given."""
    return store is not None and getattr(store, "store_text", True) is False


def store_now(store: Any) -> float:
    """Now by ``store``'s clock (``FeedbackStore(clock=...)``, ``time.time`` by default); ``time.time()`` for a
    store of the user's own without one. What a log kept for a locked store is stamped with: the store refuses
    a timestamp past its own clock."""
    clock = getattr(store, "_now", None)
    return float(clock()) if callable(clock) else time.time()


def followup_time(store: Any, timestamp: Any) -> float:
    """When a follow-up came, for :meth:`ImplicitSignals.infer <rlfb.implicit.ImplicitSignals.infer>`'s window:
    ``timestamp`` as given (unix seconds, a ``datetime`` or ISO text), else now by the store's clock.

    A time past the store's clock is its :class:`~rlfb.errors.FutureTimestampError`, as feedback's is: one in
    milliseconds fell outside the follow-up window and a reformulation passed for a new visit, without a word.
    """
    from rlfb.reward import as_timestamp

    clock = getattr(store, "_now", None)  # a store of the user's own may have no clock of its own
    check = getattr(store, "_timestamp", None)
    if timestamp is not None:
        if callable(clock) and callable(check):
            return float(check(timestamp, "timestamp", float(clock())))
        return as_timestamp(timestamp)
    return store_now(store)


def previous_retrieval(store: Any, session_id: str, timestamp: Any, at: float) -> dict[str, Any] | None:
    """The session's retrieval a follow-up at ``at`` judges: its latest made by then when the follow-up's
    ``timestamp`` was given (a log replayed, a client's queue), else its latest. Taking the latest whatever
    the time judged a replayed reformulation against a later question and dropped it, and gave a dwell to a
    retrieval made after it."""
    if timestamp is None:
        return store.last_event(session_id)
    try:
        return store.last_event(session_id, at=at)
    except TypeError:  # a store of the user's own, whose last_event takes no time
        return store.last_event(session_id)


def _run_id(run_id: Any) -> str:
    text = str(run_id) if run_id is not None and not isinstance(run_id, str) else run_id
    if not isinstance(text, str) or not text:
        raise ValidationError(f"run_id must be a non-empty str or UUID, got {run_id!r}")
    return text


def finite_score(score: Any) -> float | None:
    """A retrieval score as a finite float, else ``None`` (logged as no score): a NaN, an infinity, an int
    beyond float range, a bool or a non-number is no usable score.

    >>> finite_score(0.5), finite_score(float("nan")), finite_score(10**400), finite_score("1")
    (0.5, None, None, None)
    """
    if score is None or isinstance(score, bool) or not isinstance(score, numbers.Real):
        return None
    try:
        f = float(score)
    except OverflowError:  # an int beyond float range is no usable score
        return None
    return f if math.isfinite(f) else None


def session_text(value: Any) -> str | None:
    """A session id as the store keeps it, or ``None`` when ``value`` cannot be one.

    A non-empty str is kept; an int or a UUID (a chat thread id) is kept as its
    text, which is stable. Anything else (``""``, a bool, a float, an object
    whose text is a repr) would not name the same session twice, so it is none.

    >>> session_text("t1"), session_text(7), session_text(""), session_text(1.5)
    ('t1', '7', None, None)
    """
    if isinstance(value, str):
        return value or None
    if isinstance(value, UUID) or (isinstance(value, numbers.Integral) and not isinstance(value, bool)):
        return str(value)
    return None
