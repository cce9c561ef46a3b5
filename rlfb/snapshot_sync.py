"""A live ensemble's learner kept in step with the snapshots of its feedback store.

Each feedback is learned on top of the store's newest state and written back as a snapshot (at most once per
``persist_interval``: :func:`persist_due`); another process on the same store does the same, and every ensemble
reads what the others wrote (:func:`load_newer`). Learning not written yet (``persist_interval`` above 0) is
kept as its episodes and learned again on top of a newer snapshot another process wrote (:func:`take_newer`):
whichever writes last then writes both processes' learning, not its own alone. Only a snapshot of the ensemble's
own kind is loaded (:func:`is_ours`, :class:`~rlfb.snapshot_kind.SnapshotKind`): another policy's, other
retrievers', another dense model's are passed by, paging back to its own newest (:func:`own_snapshot`), except
that a first start with a new dense model takes the old model's once (:func:`other_models_snapshot`). Learning
inside a caller's transaction is taken back if that transaction rolls back (:func:`undo_on_rollback`).

The functions read and update the bookkeeping of a :class:`~rlfb.ensemble.FeedbackEnsemble` (the versions read
and written, unwritten learning, the last write), under its locks; the ensemble reads the clock itself.
"""

from __future__ import annotations

import math
import os
import warnings
import weakref
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from rlfb._at_exit import run_at_exit
from rlfb._caller import warn_at_app
from rlfb.errors import CorruptStateError, ModelNotFoundError, UnknownFeedbackError
from rlfb.memory import naming_model, without_embeddings
from rlfb.snapshot_kind import SnapshotKind

if TYPE_CHECKING:
    from rlfb.ensemble import FeedbackEnsemble

_UNKNOWN = object()  # a cached value not computed yet (None is an answer)
#: an ensemble's snapshot bookkeeping, put back when a block's writes are undone: its own and newest versions
#: read or written, whether it holds learning unwritten, its last write, the unwritten episodes and asks, and
#: the feedback rows it holds
_Marks = tuple[int, int, bool, float, list[Any], dict[str, int], dict[int, Any]]


def persist_state(ens: FeedbackEnsemble, now: float, *, force: bool = False) -> None:
    """Note that ``ens``'s learner has learned, and write its state to the store as a snapshot if one is due at
    ``now`` (monotonic), or ``force``."""
    if ens._store is None:
        return
    ens._dirty = True
    if not force and not persist_due(ens, now):
        return
    before = _bookkeeping(ens)
    ens._state_version = ens._own_version = ens._store.save_policy_state(
        state_to_save(ens), ens._learner.weights(), policy=ens._learner.policy_name
    )
    # the feedback rows this snapshot writes the learning of: learned now, in its transaction (the caller's
    # store.exclusive() block), where until then they were held
    for feedback_id in ens._held:
        try:
            ens._store.mark_learned(feedback_id)
        except UnknownFeedbackError:
            pass  # pruned since it was learned (another process's prune): nothing is left to mark
    ens._held.clear()
    ens._last_persist = now
    ens._dirty = False
    ens._unsaved.clear()
    ens._unsaved_asks.clear()
    _PINNED.pop(id(ens), None)
    _unwritten_again_if_undone(ens, before)


def _bookkeeping(ens: FeedbackEnsemble) -> _Marks:
    """``ens``'s snapshot bookkeeping as it is now (copies), to put back if a block's writes are undone."""
    return (ens._own_version, ens._state_version, ens._dirty, ens._last_persist, list(ens._unsaved),
            dict(ens._unsaved_asks), dict(ens._held))


def _put_back(ens: FeedbackEnsemble, marks: _Marks) -> None:
    """Set ``ens``'s snapshot bookkeeping to ``marks`` (:func:`_bookkeeping`'s copy)."""
    (ens._own_version, ens._state_version, ens._dirty, ens._last_persist, ens._unsaved, ens._unsaved_asks,
     ens._held) = marks


def _unwritten_again_if_undone(ens: FeedbackEnsemble, before: _Marks) -> None:
    """A snapshot was just written inside a ``store.exclusive()`` block: if the block's writes are undone (its
    commit fails on a full disk or a file gone, or a block around it fails), its learning is unwritten again and
    its feedback rows held again, as ``before``, so that a later snapshot writes and marks them.

    Before, the bookkeeping said written: the rows stayed held in the store while the next snapshot wrote their
    learning unmarked, and the next ensemble to start learned them again (an audit: 3 feedbacks, 4 learned).
    Callbacks run newest first, so one registered before the learning (:func:`undo_on_rollback`,
    :func:`learn_again_on_rollback`) still has the last word."""
    from rlfb.runs import open_blocks

    on_rollback = getattr(ens._store, "on_rollback", None)
    if not callable(on_rollback) or not open_blocks(ens._store):
        return

    def unwritten() -> None:
        with ens._guarded():
            _put_back(ens, before)
            ens._dirty = True  # the learner still holds what the undone snapshot wrote
            _flush_at_exit(ens, pin=True)

    on_rollback(unwritten)


#: unwritten episodes kept for learning again on a newer snapshot; at this many a snapshot is written even
#: before ``persist_interval`` has passed (an infinite interval included), so that they stay bounded
MAX_UNSAVED = 1_000
#: after learning more than this many episodes again on another's snapshot, write at once: each further
#: snapshot of another process would have them learned again (about 0.6 ms each, under the locks, in a
#: retrieval's refresh), and 1,000 of them took 0.6 s each time beside a process writing after every feedback
RELEARN_WRITE = 20


def asked(ens: FeedbackEnsemble, query: str) -> None:
    """``ens``'s learner counted one more asking of a remembered question (``query``, as the learner knows it):
    state worth writing (repeat discovery reads the counts), kept until written and counted again on top of a
    newer snapshot another process wrote. It goes with the next snapshot feedback writes, or at ``flush()``,
    ``close()`` or exit; a retrieval writes none itself. Before, a restart, or another process's snapshot, set
    a question asked ten times back to none."""
    if ens._store is None:
        return
    ens._unsaved_asks[query] = ens._unsaved_asks.get(query, 0) + 1
    _flush_at_exit(ens)


def learned(ens: FeedbackEnsemble, episode: Any, now: float) -> None:
    """``ens``'s learner learned ``episode`` (under the store's write lock): keep it until written, and write a
    snapshot if one is due at ``now``; if none is, have it written when the interpreter exits."""
    ens._unsaved.append(episode)
    persist_state(ens, now, force=len(ens._unsaved) >= MAX_UNSAVED)
    if ens._dirty:
        _flush_at_exit(ens, pin=True)


# ensembles holding learning not written yet, with the process they learned in, flushed at exit: a script that
# ended without close() lost up to persist_interval of learning (49 of 50 feedbacks at persist_interval=1.0).
# A forked child inherits the parent's entries and skips them (its copy flushed them as well: 9 learned of 5).
# Filled on first use, not at import.
_UNWRITTEN: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
# Those with learning from feedback not yet written, held strongly until it is: an ensemble local to main() or
# to a worker's function was collected on its return, before the exit hook, and took its learning with it (1 of
# 30 feedbacks learned). Not those with only asks unwritten (counts repeat discovery reads): with the default
# persist_interval=0 every retrieval of a remembered question would pin its ensemble, and an app that built one
# per request without close() kept them all, with their connections (2 file descriptors each).
_PINNED: dict[int, Any] = {}


def forget(ens: FeedbackEnsemble) -> None:
    """``ens`` is closed: nothing of it is written at exit, nor is it held for that."""
    _PINNED.pop(id(ens), None)
    _UNWRITTEN.pop(ens, None)


def _flush_at_exit(ens: FeedbackEnsemble, *, pin: bool = False) -> None:
    _UNWRITTEN[ens] = os.getpid()
    if pin:
        _PINNED[id(ens)] = ens
    run_at_exit(_flush_all)


def _flush_all() -> None:
    """At exit: write every live ensemble's unwritten learning of this process, warning where that fails (a store
    closed already, a full disk)."""
    pid = os.getpid()
    for ens, owner in list(_UNWRITTEN.items()):
        if owner != pid:
            continue
        try:
            ens.flush()
        except Exception as exc:  # noqa: BLE001 - at exit there is no caller to raise to
            warnings.warn(f"rlfb: an ensemble's learning since its last snapshot was not written at exit: {exc!r}",
                          RuntimeWarning, stacklevel=1)


def persist_due(ens: FeedbackEnsemble, now: float) -> bool:
    """Whether a snapshot is due at ``now`` (monotonic): ``persist_interval`` after the last, or none was
    written yet; an infinite interval writes only when forced (flush, close, save). None is while a batch of rows
    owed is learned: it writes one after it (:func:`rlfb.feedback_learning.catch_up`)."""
    return (not ens._holding_snapshots and ens.persist_interval < math.inf
            and now - ens._last_persist >= ens.persist_interval)


def refresh_state(ens: FeedbackEnsemble, now: float, *, force: bool = False) -> bool:
    """Pick up weights and policy state another process wrote to ``ens``'s store, if ``refresh_interval`` has
    passed since the last look at ``now`` (monotonic), or ``force``; returns whether it looked."""
    if ens._store is None:
        return False
    if not force and now - ens._last_refresh < ens.refresh_interval:
        return False
    ens._last_refresh = now
    # check, read and load under both locks: feedback learned between a read made outside them and the
    # load was thrown away (the weights property refreshes from any thread)
    with ens._guarded():
        load_newer(ens, now)
    return True


def load_newer(ens: FeedbackEnsemble, now: float) -> None:
    """The body of :func:`refresh_state`, under both locks."""
    if (ens._dirty and persist_due(ens, now)) or take_newer(ens) > RELEARN_WRITE:
        write_unsaved(ens, now)


def write_unsaved(ens: FeedbackEnsemble, now: float) -> None:
    """Write ``ens``'s learning now, on top of what others wrote meanwhile: read, learn again and write under the
    store's write lock, or another's snapshot saved in between would be lost. Call under ``ens``'s locks.

    Inside a caller's own ``store.exclusive()`` block, the learner and its bookkeeping are restored if that
    block rolls back: the written snapshot is undone with it, and SQLite gives its version to the next writer.
    """
    from rlfb.runs import in_callers_block

    if not callable(getattr(ens._store, "exclusive", None)):  # a store of the user's own may have none
        take_newer(ens)
        persist_state(ens, now, force=True)
        return
    with ens._store.exclusive() as store:
        if in_callers_block(store):
            undo_on_rollback(ens, store)
        take_newer(ens)
        persist_state(ens, now, force=True)


def take_newer(ens: FeedbackEnsemble) -> int:
    """Load the store's newest snapshot of ``ens``'s kind if another wrote one since ``ens`` last looked, and
    learn again on top of it what ``ens`` learned and has not written (its unsaved episodes).

    Before, an ensemble with unwritten learning read nothing until it had written, and then took the next
    snapshot of another process whole: with ``persist_interval=1.0``, four processes sharing a file kept about
    a quarter of their learning, the last writer's. Returns how many episodes were learned again.
    """
    if ens._store.state_version() <= ens._state_version:
        return 0
    saved = ens._store.load_policy_state()
    if saved is None:
        return 0
    newest = int(saved["version"])
    # this process's first snapshot: at its start (a restart, a new worker). Read before the branch below marks
    # another kind's newest as seen: a restart after another app wrote last drew the seed's first draws again
    first = ens._state_version == 0
    if not is_ours(ens, saved):
        # another policy, or an ensemble of other retrievers, wrote this store last: do not mis-read
        # its state, nor read that snapshot again; but this policy's own newest snapshot under it
        # (a store shared by two apps, or a policy switched and switched back) is still ours
        # snapshots up to the newest already seen were searched before: page back only through the new ones
        seen, ens._state_version = ens._state_version, newest
        theirs, saved = saved, own_snapshot(ens, after=max(ens._own_version, seen))
        if saved is None and ens._own_version == 0:
            saved = other_models_snapshot(ens)
        if saved is None:
            if ens._own_version == 0:
                note_default_exploration(ens)
                note_other_policy(ens, theirs)
            return 0
    try:
        # the learning is shared, not the random draws: with the writer's generators, workers given other
        # seeds explored in lockstep (20 of 20 explored rankings alike after one exchange)
        ens._learner.load_state_dict(saved["state"], keep_random=True)
        if first:  # nor the seed's first draws again at every restart: started from the seed and the version
            ens._learner.reseed(int(saved["version"]))
    except CorruptStateError as exc:  # name the snapshot, and the way past it
        from rlfb.store.snapshots import damaged_snapshot  # here: `import rlfb` does not load the store

        raise damaged_snapshot(ens._store, saved["version"], exc) from exc
    _leave_out_taken(ens)
    _learn_unwritten(ens, ens._unsaved, ens._unsaved_asks)
    ens._own_version = int(saved["version"])
    ens._state_version = max(newest, ens._own_version)
    return len(ens._unsaved)


def _leave_out_taken(ens: FeedbackEnsemble) -> None:
    """Before ``ens``'s unwritten learning is learned again on a newer snapshot: leave out the feedback rows it
    held that another ensemble has learned and written since (one that started meanwhile takes the held rows it
    finds, as it takes those of a process killed before its snapshot), so that each is learned once."""
    if not ens._held:
        return
    taken = [fid for fid in ens._held if ens._store.feedback_learned(fid) is not None]
    if not taken:
        return
    gone = {id(ens._held.pop(fid)) for fid in taken}
    ens._unsaved = [episode for episode in ens._unsaved if id(episode) not in gone]


def _learn_unwritten(ens: FeedbackEnsemble, unsaved: list[Any], asks: Mapping[str, int]) -> None:
    """Learn again, on a snapshot just loaded, the episodes ``ens`` learned and had not written (``unsaved``), and
    count again the asks of remembered questions (``asks``), after the episodes that made them remembered."""
    for episode in unsaved:
        ens._learner.learn(episode)
    memory = ens._learner.memory
    for query, n in asks.items():
        for _ in range(n):
            memory.note_ask(query)


def own_snapshot(ens: FeedbackEnsemble, after: int) -> Mapping[str, Any] | None:
    """The store's newest snapshot that is ``ens``'s own (:func:`is_ours`) and newer than version
    ``after``; ``None`` if there is none, or from a store that cannot tell.

    Snapshots of this policy are read newest first: another app of the same policy with other settings
    (hyperparameters, chunk exploration) may have written since, and this app's own older state, not a
    fresh learner, is what it goes on from after a restart.
    """
    name = ens._learner.policy_name
    try:
        saved = ens._store.load_policy_state(policy=name)
        while saved is not None and int(saved["version"]) > after:
            if is_ours(ens, saved):
                return saved
            saved = ens._store.load_policy_state(policy=name, before=int(saved["version"]))
    except TypeError:  # a store of the user's own, whose load_policy_state takes no policy (or no before)
        pass
    return None


def _policys_newest(ens: FeedbackEnsemble, *,
                    unanswered: Mapping[str, Any] | None = None) -> Mapping[str, Any] | None:
    """The store's newest snapshot of ``ens``'s policy, of any kind; ``None`` if there is none, and
    ``unanswered`` from a store of the user's own whose ``load_policy_state`` takes no policy."""
    try:
        return ens._store.load_policy_state(policy=ens._learner.policy_name)
    except TypeError:
        return unanswered


def other_models_snapshot(ens: FeedbackEnsemble) -> Mapping[str, Any] | None:
    """For an ensemble with no snapshot of its own, asked once: this policy's newest snapshot if it is of its
    kind but for the dense model, with the memory's query embeddings left out (another model's), or ``None``.

    A new dense model (another version of its package changes its cache key too) thus starts from what was
    learned with the old one: the weights, confidences and the memory of each question asked, by its text;
    only the similarity to other questions is learned again. Once it has saved a snapshot of its own, the
    old model's (an app still running it) are another kind's again.
    """
    # asked once, of this policy's newest snapshot alone: not paged back through the history on every
    # refresh, nor taken from an app still running the old model once this one has begun
    model = None if ens._other_models_asked else dense_model_key(ens)
    ens._other_models_asked = True
    if model is None:
        return None
    saved = _policys_newest(ens)
    theirs = SnapshotKind.of(saved)
    if saved is None or theirs.model is None:
        return None
    ours = SnapshotKind.of_learner(ens._learner, dim=query_dim(ens) if theirs.dim is not None else None,
                                   model=model)
    if set(theirs.differences(ours)) != {"model"}:
        return None
    state = dict(saved["state"])
    try:
        state["memory"] = without_embeddings(state["memory"])
    except (TypeError, ValueError, AttributeError):  # a damaged memory: not a state to start from
        return None
    return {**saved, "state": state}


def note_default_exploration(ens: FeedbackEnsemble) -> None:
    """Warn, once, where ``ens`` runs no chunk exploration because its memory is off (the default since
    2026-12-05; ``"thompson"`` before) and its policy's newest snapshot in the store differs from it in that
    alone: the learning of an app that ran with ``memory_weight=0`` before is another kind's, and not taken."""
    config = ens._learner.config
    if ens._exploration_noted or config.exploration is not None or config.memory_weight > 0:
        return
    ens._exploration_noted = True
    saved = _policys_newest(ens)
    if saved is None:
        return
    theirs = SnapshotKind.of(saved)
    if set(theirs.differences(SnapshotKind.of_learner(ens._learner))) == {"exploration"}:
        warn_at_app(
            f"rlfb: the store holds this policy's learning with chunk exploration {theirs.exploration!r}, and "
            "with the memory off this ensemble explores no chunks by default (since 2026-12-05), so it starts "
            f"afresh; pass learner_config={{'exploration': {theirs.exploration!r}, ...}} to go on with that "
            "learning",
            RuntimeWarning,  # the user's line (stacklevel=2 named this module)
        )


#: Set while :meth:`FeedbackEnsemble.load <rlfb.FeedbackEnsemble.load>` builds an ensemble: the save's learning is
#: loaded after the constructor's first look at the store, so nothing starts afresh there.
LOADING: ContextVar[bool] = ContextVar("rlfb_loading_a_save", default=False)


def note_other_policy(ens: FeedbackEnsemble, newest: Mapping[str, Any]) -> None:
    """Warn, once, where ``ens`` starts afresh, at its first look at the store, on a store whose newest snapshot is
    another policy's learning for the same retrievers and which holds none of its own policy's: an app restarted
    without the ``policy=`` it ran with (``FeedbackEnsemble``'s own default is ``fixed``) dropped what it had
    learned without a word. Not where ``ens`` has learned (a save being loaded: :data:`LOADING`), where its policy
    has learning of another kind there (another note names that), nor where the store cannot be asked by policy
    (a store of the user's own). A first app of another policy beside the one that learned is told too, once."""
    if ens._policy_noted or LOADING.get() or ens._learner.n_learned or ens._unsaved:
        return
    ens._policy_noted = True
    theirs = SnapshotKind.of(newest)
    differ = theirs.differences(SnapshotKind.of_learner(ens._learner))
    if "policy" not in differ or "retrievers" in differ or not _learned_count(newest):
        return
    # its policy's learning, of any kind; a store of the user's own that takes no policy cannot say (newest)
    if _policys_newest(ens, unanswered=newest) is not None:
        return
    warn_at_app(
        f"rlfb: the store holds {theirs.policy!r} learning for these retrievers (snapshot {newest['version']}), "
        f"and this ensemble runs {ens._learner.policy_name!r}, which has none there, so it starts afresh; pass "
        f"policy={theirs.policy!r} to go on with that learning",
        RuntimeWarning,
    )


def _learned_count(saved: Mapping[str, Any]) -> int:
    """How many episodes a snapshot's state says it learned (0 where it says nothing usable: weights set alone)."""
    state = saved.get("state")
    n = state.get("n_learned") if isinstance(state, Mapping) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def is_ours(ens: FeedbackEnsemble, saved: Mapping[str, Any]) -> bool:
    """Whether a store snapshot is of ``ens``'s kind (:class:`~rlfb.snapshot_kind.SnapshotKind`).

    Not ours: another policy; other retrievers; the same policy with other hyperparameters
    (another ``step``, other bounds; the weights may differ), whose learned state has another
    shape; another chunk exploration (``LearnerConfig.exploration``: an evaluation app with
    ``exploration="none"`` beside the live one), whose explorer state would not load; a memory of
    another dense model's embeddings (a model upgrade on the same store): of another dimension, with
    which every retrieval would fail, or of another model named in the snapshot (its cache key), whose
    similarities mean nothing to this one (but see :func:`other_models_snapshot`, for a first start).
    Older snapshots name neither policy nor retrievers; a
    damaged one is read (and refused) by ``load_state_dict``.
    """
    theirs = SnapshotKind.of(saved)
    # the query dimension costs an embedding the first time: only asked for when the snapshot names one
    ours = SnapshotKind.of_learner(ens._learner, dim=query_dim(ens) if theirs.dim is not None else None,
                                   model=dense_model_key(ens) if theirs.model is not None else None)
    return not theirs.differences(ours)


def dense_model_key(ens: FeedbackEnsemble) -> str | None:
    """The dense retriever's model as its encodings are cached (``None``: no dense retriever, or a model handed
    over already loaded, whose origin is unknown)."""
    try:
        key = getattr(ens._dense_retriever(), "cache_key", None)
    except ModelNotFoundError:  # a corpus read from the cache alone, the model since uninstalled: name none
        return None
    return key if isinstance(key, str) else None


def state_to_save(ens: FeedbackEnsemble) -> dict[str, Any]:
    """The learner's state, its memory naming the dense model its query embeddings are of: a snapshot of
    another model's memory is then set aside (:func:`is_ours`) even when the two share a dimension.

    With a store that keeps no query text the memory's query embeddings are left out (snapshots, saves and
    weights exports): an embedding can be partly read back into its text. The memory then recalls a
    question after a restart, or from another process, by its hashed key alone, not by similarity.
    """
    state = naming_model(ens._learner.state_dict(), dense_model_key(ens))
    from rlfb.runs import hashes_queries

    if hashes_queries(ens._store) and "memory" in state:
        state["memory"] = without_embeddings(state["memory"])
    return state


def query_dim(ens: FeedbackEnsemble) -> int | None:
    """The dimension of ``ens``'s query embeddings (``None`` without a dense retriever)."""
    if ens._query_dim_cache is _UNKNOWN:
        e = ens._query_embedding("dimension")
        ens._query_dim_cache = None if e is None else int(e.shape[0])
    return ens._query_dim_cache


def undo_on_rollback(ens: FeedbackEnsemble, store: Any) -> None:
    """Before learning inside ``store.exclusive()``: take the learning back if the block's writes are undone.

    A caller's own block around :meth:`~rlfb.FeedbackEnsemble.feedback` that then fails rolls the feedback row
    and the snapshot back; the in-memory learner kept what it learned, so a retry with the same idempotency key
    learned it twice. A copy of the learner's state is taken first, not the last snapshot: retrievals since then
    changed it too (the memory's count of asks, the random state). The copy costs about as much as a
    snapshot, so it is taken only inside a caller's block; the replay buffer, of which a snapshot keeps the
    newest ``replay_persist`` episodes, is kept whole beside it.
    """
    on_rollback = getattr(store, "on_rollback", None)
    if on_rollback is None:  # a store of the user's own, without rollback callbacks
        return
    marks = _bookkeeping(ens)
    state, replay = ens._learner.state_dict(), ens._learner.replay.held()
    on_rollback(lambda: _take_back(ens, state, replay, marks))


def learn_again_on_rollback(ens: FeedbackEnsemble, store: Any) -> None:
    """Before learning inside a ``store.exclusive()`` block of rlfb's own: if its writes are undone (a full disk
    while the feedback or its snapshot is written, a failed commit), take the learning back.

    The feedback row is rolled back, so a retry with the same idempotency key is recorded and learned again:
    the in-memory learner, which had kept what it learned, learned it twice (an audit of 2026-12-06). Unlike
    :func:`undo_on_rollback` this copies no state, so that it costs nothing when nothing fails: the learner
    loads again the snapshot its state was learned on top of and learns again what it had not written then
    (its generators, and the replay buffer's episodes beyond what a snapshot keeps, stay as they are). Before
    its first snapshot it goes back to the state it started from instead, copied once
    (:func:`_base_before_first_snapshot`).
    """
    on_rollback = getattr(store, "on_rollback", None)
    if on_rollback is None:  # a store of the user's own, without rollback callbacks
        return
    base = None
    if ens._own_version == 0:
        base = _base_before_first_snapshot(ens)
        if base is None:
            undo_on_rollback(ens, store)
            return
    else:
        ens._rollback_base = None  # a snapshot of its own now: no need to hold the copy
    marks = _bookkeeping(ens)
    replay = ens._learner.replay.held()  # the episodes themselves are not copied
    on_rollback(lambda: _learn_again(ens, base, replay, marks))


def _base_before_first_snapshot(ens: FeedbackEnsemble) -> str | bytes | None:
    """The learner's state that its unsaved learning went on top of, as JSON text, before ``ens`` has a snapshot
    of its own; ``None`` where that state was not kept.

    Copied once, when nothing is unsaved, and used while the learner is the same object and has learned exactly
    the unsaved episodes since: with ``persist_interval`` above 0 a copy at every feedback until the first
    snapshot (after up to ``MAX_UNSAVED`` episodes) made the simulator's 2,000 interactions 50 % slower.
    """
    from rlfb.store.codec import _dumps  # here: `import rlfb` does not load the store

    learner = ens._learner
    kept = ens._rollback_base
    if kept is None or kept[0] is not learner or kept[1] + len(ens._unsaved) != learner.n_learned:
        if ens._unsaved or ens._unsaved_asks:  # learned on top of a state not kept: undo_on_rollback's copy
            ens._rollback_base = None
            return None
        # kept as JSON text, as a snapshot is: loaded perhaps more than once, and nothing the learner does later
        # can reach it
        kept = ens._rollback_base = (learner, learner.n_learned, _dumps(learner.state_dict(), "learner state"))
    return kept[2]


def _learn_again(ens: FeedbackEnsemble, base: str | bytes | None, replay: Any,
                 marks: _Marks) -> None:
    """Load snapshot ``marks[0]`` again (before the first snapshot, the state ``base``, JSON text) and learn again
    on it what was unwritten: as :func:`learn_again_on_rollback` found the learner, less the random draws made
    since."""
    from rlfb.store.codec import _loads

    own, _, _, _, unsaved, asks, _ = marks
    with ens._guarded():
        if base is None:
            saved = ens._store.load_policy_state(version=own)
            if saved is None:  # pruned meanwhile: nothing to go back to
                raise CorruptStateError(f"snapshot {own}, which the learner's state was learned on, is gone: the "
                                        "feedback rolled back may stay learned in this process")
            state = saved["state"]
        else:
            state = _loads(base, "the learner's state before its first snapshot")
        ens._learner.load_state_dict(state, keep_random=True)
        _learn_unwritten(ens, unsaved, asks)
        _restore(ens, replay, marks)


def _take_back(ens: FeedbackEnsemble, state: Mapping[str, Any], replay: Any,
               marks: _Marks) -> None:
    """Restore the learner, and its snapshot bookkeeping, as :func:`undo_on_rollback` found them."""
    with ens._guarded():
        ens._learner.load_state_dict(state)
        _restore(ens, replay, marks)


def _restore(ens: FeedbackEnsemble, replay: Any, marks: _Marks
             ) -> None:
    """Put back the replay buffer's episodes and the snapshot bookkeeping ``marks`` (under ``ens``'s locks)."""
    ens._learner.replay.restore_held(replay)
    _put_back(ens, marks)
    if ens._dirty or ens._unsaved_asks:  # unwritten again: written later, at exit at the latest
        _flush_at_exit(ens, pin=ens._dirty)
    else:
        _PINNED.pop(id(ens), None)
