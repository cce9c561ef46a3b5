"""The weight configuration centre: the current weights and learner state, kept in the feedback store.

Every process that opens the same store file reads the newest snapshot (see
:meth:`rlfb.FeedbackEnsemble.refresh`), so weights exported from one place and
imported into the store reach every running app within its refresh interval.
Imports are validated: NaN, infinite or negative weights, unknown retrievers
and damaged learner states are rejected and nothing is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.files import write_text_atomically
from rlfb.fusion import validate_weights
from rlfb.memory import knows_questions_by_text, naming_model
from rlfb.policies.base import same_hyperparameters
from rlfb.runs import hashes_queries
from rlfb.snapshot_kind import SnapshotKind

__all__ = ["current_weights", "damaged_state", "describe_kind", "export_weights", "import_weights", "read_weights_file",
           "snapshot_damage", "sound_kinds", "WeightsFile", "NO_WEIGHTS_YET"]

#: What a store that holds no snapshot yet is said to hold: `weights export`'s refusal, `weights show`'s report.
NO_WEIGHTS_YET = "the store holds no weights yet"


def _sound_state(store: Any, saved: Mapping[str, Any]) -> None:
    """Raise :class:`CorruptStateError` when a snapshot's learner state is not a JSON object.

    rlfb writes only objects (``save_policy_state`` refuses anything else), so another value was written outside
    it: every ensemble on the store refuses it, an export of it (``"state": 5``) was refused by the import, and
    showing its weights as sound hid the damage.
    """
    state = saved.get("state")
    if not isinstance(state, Mapping):
        raise CorruptStateError(
            f"policy snapshot {saved.get('version')} in {getattr(store, 'path', 'the store')} is damaged: its "
            f"learner state is {type(state).__name__} {state!r}, not an object"[:300]
        )


def describe_kind(snapshot: Mapping[str, Any]) -> str:
    """One line naming a snapshot and its kind: ``version 3: policy thompson, bm25+dense``."""
    weights = snapshot.get("weights")
    names = "+".join(weights) if isinstance(weights, Mapping) else "weights unreadable"
    return f"version {snapshot.get('version')}: policy {snapshot.get('policy')}, {names}"


def _matches(snapshot: Mapping[str, Any], retrievers: Sequence[str] | None, policy: str | None) -> bool:
    weights = snapshot.get("weights")
    if retrievers is not None and not (isinstance(weights, Mapping) and set(weights) == set(retrievers)):
        return False
    return policy is None or snapshot.get("policy") == policy


def _chosen(store: Any, retrievers: Sequence[str] | None, policy: str | None, *, whole: bool,
            version: int | None = None) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The snapshot to show or export and the newest of each kind in the store.

    Without ``retrievers``, ``policy`` or ``version`` it is the newest snapshot; with ``version``, that one; with
    the others, the newest of the kinds whose weights name exactly those retrievers and whose policy is that one
    (none: :class:`ValidationError` listing the kinds there are). ``whole``: the choice must be one kind, since
    the newest may be another app's (an export meant as a backup of one app's state saved another's): where
    several kinds are left to choose from, a :class:`ValidationError` lists them.
    """
    kinds = store.newest_snapshots()
    if version is not None:
        saved = store.load_policy_state(version=version)
        if saved is None:
            there = "; ".join(describe_kind(k) for k in kinds) or "none"
            raise ValidationError(f"the store holds no snapshot of version {version}; the newest of each kind: {there}")
        if not _matches(saved, retrievers, policy):
            raise ValidationError(f"snapshot {describe_kind(saved)} is not of the retrievers or policy named")
        return saved, kinds
    if retrievers is None and policy is None:
        sound = _undamaged(store, kinds) if whole and len(kinds) > 1 else kinds
        if whole and len(sound) > 1:
            raise ValidationError(
                f"the store holds the snapshots of {len(sound)} kinds of ensemble ("
                + "; ".join(describe_kind(k) for k in sound) + f"): {_telling_apart(sound)}"
            )
        return store.load_policy_state(), kinds
    picked = [k for k in kinds if _matches(k, retrievers, policy)]
    if not picked:
        wanted = " and ".join(part for part in (
            None if retrievers is None else "retrievers " + "+".join(retrievers),
            None if policy is None else f"policy {policy}") if part)
        there = "; ".join(describe_kind(k) for k in kinds) or "none"
        raise ValidationError(f"the store holds no snapshot of {wanted}; it holds: {there}")
    if whole and len(picked) > 1:
        picked = _undamaged(store, picked)
    if whole and len(picked) > 1:  # other retrievers or policy than named, or other settings (the memory off)
        named = ("these retrievers and policy" if retrievers is not None and policy is not None
                 else "these retrievers" if retrievers is not None else "this policy")
        raise ValidationError(
            f"the store holds {len(picked)} kinds of ensemble with {named} ("
            + "; ".join(describe_kind(k) for k in picked) + f"): {_telling_apart(picked)}"
        )
    return store.load_policy_state(version=int(picked[0]["version"])), kinds


def _damage(store: Any, kind: Mapping[str, Any]) -> CorruptStateError | None:
    """The error naming the snapshot ``kind`` (one of ``newest_snapshots``) where no learner can be rebuilt
    from it, as ``weights show`` names it, else ``None``."""
    try:
        saved = store.load_policy_state(version=int(kind["version"]))
        if saved is not None:  # None: pruned since it was listed
            _sound_state(store, saved)
            _saved_learner(store, saved)
    except CorruptStateError as exc:
        return exc
    return None


def snapshot_damage(store: Any, version: int) -> CorruptStateError | None:
    """The error naming snapshot ``version`` of ``store`` where no learner can be rebuilt from it, else ``None``
    (a ``--weights-only`` export says so beside the sound weights it writes)."""
    return _damage(store, {"version": version})


def _undamaged(store: Any, kinds: Sequence[Mapping[str, Any]], *, first_sound: bool = True) -> list[dict[str, Any]]:
    """``kinds`` (newest first) without the snapshots no learner can be rebuilt from; with ``first_sound``, where
    the first, the one to export, is such a snapshot, its :class:`CorruptStateError` (with the way on,
    ``drop-snapshot``).

    A damaged state says nothing of the ensemble that wrote it, so the store groups it as a kind of its own:
    an export then listed it as a second kind of the same policy and retrievers ("name one by its --version").
    """
    sound = []
    for i, kind in enumerate(kinds):
        damage = _damage(store, kind)
        if damage is not None and i == 0 and first_sound:
            raise damage
        if damage is None:
            sound.append(dict(kind))
    return sound


def sound_kinds(store: Any) -> list[dict[str, Any]]:
    """The newest snapshot of each kind of ensemble in ``store`` (``newest_snapshots``), without those no
    learner can be rebuilt from (a damaged state is no kind: ``damaged_state`` names a damaged newest one)."""
    kinds = store.newest_snapshots()
    return kinds if len(kinds) < 2 else _undamaged(store, kinds, first_sound=False)


def _telling_apart(kinds: Sequence[Mapping[str, Any]]) -> str:
    """What to name to pick one of ``kinds``: ``--retrievers`` or ``--policy`` where those differ among them
    (an option given already matches them all), its ``--version`` always (kinds of the same retrievers and
    policy differ in settings no option names)."""
    def retrievers(k: Mapping[str, Any]) -> frozenset[str] | None:
        weights = k.get("weights")
        return frozenset(weights) if isinstance(weights, Mapping) else None

    options = [option for option, of in (("--retrievers", retrievers), ("--policy", lambda k: k.get("policy")))
               if len({of(k) for k in kinds}) > 1]
    if not options:
        return "name one by its --version"
    return f"name one with {', '.join(options)} or its --version"


def current_weights(store: Any, *, retrievers: Sequence[str] | None = None, policy: str | None = None,
                    version: int | None = None) -> dict[str, Any]:
    """``{"weights", "policy", "version", "updated_at", "kinds"}`` of the newest snapshot (empty weights if none).

    ``kinds`` lists the newest snapshot of each kind of ensemble in the store (without states): apps with other
    retrievers or another policy can share one file, and the newest snapshot is then only one of theirs.
    ``retrievers`` (their names, in any order) and ``policy`` pick the newest snapshot of such a kind instead,
    ``version`` one snapshot.

    A snapshot whose learner state was damaged outside rlfb (not an object, or one no learner can be rebuilt
    from) raises :class:`CorruptStateError` naming it: every ensemble on the store refuses it, so its weights
    are not the ones in use.
    """
    saved, kinds = _chosen(store, retrievers, policy, whole=False, version=version)
    if saved is None:
        return {"weights": {}, "policy": None, "version": 0, "updated_at": None, "kinds": []}
    _sound_state(store, saved)
    _saved_learner(store, saved)  # damaged inside (a policy field not an object) was shown as sound
    return {**{k: saved.get(k) for k in ("weights", "policy", "version", "updated_at")}, "kinds": kinds}


def damaged_state(store: Any) -> CorruptStateError | None:
    """The error naming the newest snapshot where no learner can be rebuilt from it, else ``None`` (and for a
    store with no snapshot): for reports that show the rest of the store whatever the snapshot holds."""
    try:
        current_weights(store)
    except CorruptStateError as exc:
        return exc
    return None


def export_weights(store: Any, path: str | Path | None, *, with_state: bool = True,
                   retrievers: Sequence[str] | None = None, policy: str | None = None,
                   version: int | None = None) -> dict[str, Any]:
    """Write the newest snapshot to a JSON file (the learner state too, unless ``with_state=False``).

    Where the store holds the snapshots of more than one kind of ensemble (apps with other retrievers or
    another policy on one file), ``retrievers`` (and ``policy``, or a snapshot's ``version``) must name the one
    to export: otherwise a :class:`ValidationError` lists the kinds, since the newest snapshot may be another
    app's.

    Returns what was written; with ``path=None`` it only returns it. With the state, a snapshot whose state
    was damaged outside rlfb (not an object, or one no learner can be rebuilt from) raises
    :class:`CorruptStateError` and nothing is written; its weights alone, still sound, export with
    ``with_state=False``.
    """
    saved, _ = _chosen(store, retrievers, policy, whole=True, version=version)
    if saved is None:
        raise ValidationError(f"{NO_WEIGHTS_YET}: nothing to export")
    out = {k: saved.get(k) for k in ("weights", "policy", "version", "updated_at")}
    if with_state:
        _sound_state(store, saved)
        # an export is for importing: one of a state no learner can read (damaged inside, a policy field not an
        # object) was written, and the import then refused it
        _saved_learner(store, saved)
        out["state"] = saved.get("state")
    if path is not None:
        write_text_atomically(path, json.dumps(out, indent=2))  # a failed write leaves an earlier export whole
    return out


def _saved_learner(store: Any, saved: Mapping[str, Any]) -> Any:
    """The learner the snapshot ``saved`` rebuilds; one no learner can be rebuilt from was damaged outside rlfb,
    and is the store's named error for such a snapshot, with the way on (``drop-snapshot``)."""
    from rlfb.learner import Learner
    from rlfb.store.snapshots import damaged_snapshot

    try:
        return Learner.from_state_dict(saved["state"])
    except (CorruptStateError, ValidationError) as exc:
        raise damaged_snapshot(store, saved.get("version"), exc) from exc


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once: ``{"bm25": 1, "bm25": 0}`` kept the last silently (an edit
    that meant another retriever imported weights no one chose). rlfb's own exports never repeat a key."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} appears twice in one object")
        out[key] = value
    return out


def _read(path: str | Path) -> dict[str, Any]:
    try:
        # utf-8-sig: a byte-order mark (files saved by some Windows editors) is not JSON; the BEIR loader skips it too
        data = json.loads(Path(path).read_text(encoding="utf-8-sig"), object_pairs_hook=_no_repeated_keys)
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply to parse
        raise CorruptStateError(f"cannot read weights from {path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise CorruptStateError(f"{path} must hold a JSON object")
    return dict(data)


# the keys of an export (see export_weights); any other key in such a file is a mistake
_EXPORT_KEYS = frozenset({"weights", "policy", "version", "updated_at", "state"})


def _numbers(path: str | Path, raw: Mapping[str, Any]) -> dict[str, float]:
    """The weights as floats: JSON numbers only (``true`` is not 1). ``validate_weights`` normalises them."""
    weights: dict[str, float] = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValidationError(f"{path}: weights must be numbers, got {dict(raw)!r}")
        try:
            weights[str(k)] = float(v)
        except OverflowError:  # an integer beyond float range, e.g. 1e400 written out in digits
            raise ValidationError(f"{path}: weights must be finite numbers, got {dict(raw)!r}") from None
    return weights


def _naming(path: str | Path, exc: CorruptStateError | ValidationError) -> CorruptStateError | ValidationError:
    """``exc`` again, of the same type, with ``path`` in front: the checks it comes from do not know which
    file their values were read from, and "weights must be finite" alone does not say where to look."""
    return type(exc)(f"{path}: {exc}")


def _check_export_fields(path: str | Path, data: Mapping[str, Any]) -> None:
    """Reject an export's ``policy``, ``version`` or extra keys that the import could not honour."""
    from rlfb.policies import check_policy_name

    unknown = sorted(set(data) - _EXPORT_KEYS)
    if unknown:
        raise ValidationError(f"{path}: unknown keys {unknown}; a weights file has {sorted(_EXPORT_KEYS)}")
    policy = data.get("policy")
    if policy is not None:
        try:
            check_policy_name(policy)
        except ValidationError as exc:
            raise ValidationError(f"{path}: {exc}") from None
    version = data.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise ValidationError(f"{path}: version must be a non-negative integer, got {version!r}")


def _clamped(learner: Any, weights: Mapping[str, float]) -> dict[str, float] | None:
    """The weights as ``learner``'s policy clamps them to its bounds, or ``None`` when they are within them."""
    from rlfb.policies.simplex import project_simplex

    bounds = getattr(getattr(learner.policy, "hyper", None), "bounds", None)
    if bounds is None:  # e.g. the fixed policy takes any weights
        return None
    names = list(learner.retrievers)
    wanted = np.array([weights[n] for n in names], dtype=np.float64)
    got = project_simplex(wanted, *bounds)
    if np.allclose(got, wanted, rtol=0.0, atol=1e-9):
        return None
    return dict(zip(names, got.tolist(), strict=True))


def _other_hyperparameters(learner: Any, saved: Mapping[str, Any] | None) -> str | None:
    """How ``saved``'s policy hyperparameters differ from ``learner``'s, when both are of one policy and retrievers."""
    theirs, ours = SnapshotKind.of(saved), SnapshotKind.of_learner(learner)
    if theirs.policy != ours.policy or theirs.retrievers != ours.retrievers:
        return None
    differ = theirs.differences(ours).get("params")
    if differ is None:
        return None
    there, here = differ
    keys = sorted(k for k in set(there) & set(here)
                  if k != "weights" and not same_hyperparameters({k: there[k]}, {k: here[k]}))
    return ", ".join(f"{k} {there.get(k)!r} there, {here.get(k)!r} here" for k in keys)


def _other_kind(learner: Any, saved: Mapping[str, Any] | None) -> str | None:
    """How ``learner``'s (the file's) policy, retrievers or chunk exploration differ from ``saved``'s, or ``None``."""
    differ = SnapshotKind.of_learner(learner).differences(SnapshotKind.of(saved))
    shown = {"policy": repr, "retrievers": lambda r: repr(list(r)), "exploration": repr}
    diffs = [f"{name} {show(differ[name][0])} in the file, {show(differ[name][1])} in the snapshot"
             for name, show in shown.items() if name in differ]
    return ", ".join(diffs) or None


def _same(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    return all(abs(float(a[n]) - float(b[n])) <= 1e-9 for n in b)


def _close(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` (JSON data: weights, learner states) are equal, floats within 1e-9.

    A ``--weights-only`` export holds the weights as the policy serves them (0.20000000000000007), and setting
    them again normalised them to other last bits (0.2): compared exactly, its import again wrote a new version
    instead of saying the store already held them.
    """
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if a == b or (a != a and b != b):  # NaN is NaN in a saved state, as its JSON compared
            return True
        try:
            return abs(float(a) - float(b)) <= 1e-9
        except OverflowError:  # integers beyond float range, and unequal
            return False
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _learned_count(state: Any) -> int | None:
    """How many feedbacks a learner state learned from (its ``n_learned``), or ``None`` where it does not say."""
    count = state.get("n_learned") if isinstance(state, Mapping) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


def _newest_learned(store: Any, kind: SnapshotKind) -> tuple[int, int] | None:
    """``(version, feedbacks learned)`` of the store's newest snapshot of ``kind`` (as an ensemble of that kind
    takes its own: :func:`rlfb.snapshot_sync.is_ours`), or ``None``. Damaged snapshots are passed by."""
    for newest in store.newest_snapshots():  # the newest of each kind, newest first
        if kind.policy is not None and newest.get("policy") not in (None, kind.policy):
            continue
        try:
            saved = store.load_policy_state(version=int(newest["version"]))
        except CorruptStateError:
            continue
        count = _learned_count((saved or {}).get("state"))
        if count is not None and not SnapshotKind.of(saved).differences(kind):
            return int(saved["version"]), count  # type: ignore[index]
    return None


def _refuse_rollback(store: Any, path: str, learner: Any, state: Mapping[str, Any], policy: str) -> None:
    """Refuse a file state that learned from fewer feedbacks than the store's newest snapshot of its kind: the
    import silently rolled the store back (learned 25, imported an export of 5: the 20 feedbacks' rows stay,
    but no ensemble learns them again), where ``FeedbackEnsemble.load(..., store=)`` never rolls a store back."""
    theirs = _newest_learned(store, SnapshotKind.of({"policy": policy, "state": state}))
    if theirs is None or theirs[1] <= learner.n_learned:
        return
    version, count = theirs
    raise ValidationError(
        f"{path}: the store's newest snapshot of this kind (version {version}) has learned from {count} "
        f"feedbacks and the file's state from {learner.n_learned}: importing it would roll the store back, and "
        f"the feedback learned since would not be learned again; to roll back on purpose, import with "
        "--rollback (import_weights(..., rollback=True)), or import the weights alone (a file without its state)"
    )


def import_weights(store: Any, source: str | Path | WeightsFile, *, rollback: bool = False,
                   retrievers: Sequence[str] | None = None, policy: str | None = None,
                   version: int | None = None) -> dict[str, Any]:
    """Validate a weights file and append it to the store as the newest snapshot.

    The file is either an export (``{"weights": ..., "state": ...}``) or just
    ``{"weights": {"bm25": 0.3, ...}}`` / a bare ``{"bm25": 0.3, ...}``. With a
    learner state, the state must load; with weights only, they are applied to
    the newest state in the store (into a store with no snapshot: a new state, see below).
    Weights are JSON numbers (not booleans), normalised to sum to 1.

    An export's ``version`` and ``updated_at`` describe the exported snapshot:
    the store numbers the new one itself (the ``version`` returned). ``version``
    must still be a non-negative integer and ``policy`` a known policy. With a
    file state, the weights are set only when they differ from those the state
    serves: an unmodified export is imported as it was exported (setting them
    would move ``thompson``'s default arm and restart its comparison with it).

    Reported in ``notes``: a policy other than the one the weights go to;
    weights the policy clamps to its bounds (e.g. 1/0 becomes 0.95/0.05); served
    weights other than the requested ones (``thompson`` and ``epsilon`` move
    their default arm to them, but an arm that passed the evidence gate is
    served still); a file state of another policy, other retrievers or another
    chunk exploration than the snapshot it is compared with (the newest of the state's own kind where the
    store holds one, else the store's newest), or with other policy
    hyperparameters (``step``, ``bounds``, ...) than it: ensembles built like the
    snapshot treat the imported state as another kind's and keep their own.
    Importing what that snapshot already holds (the same file again; weights compared within
    1e-9) writes nothing: another copy would push older snapshots out of those the store keeps (``written`` is
    ``False``, and a note says so).

    A file state that learned from fewer feedbacks (``n_learned``) than the store's newest snapshot of its
    kind is refused (:class:`ValidationError`, nothing written): it would roll the store back, and the
    feedback learned since is not learned again. ``rollback=True`` imports it all the same. Weights alone
    (no state) are set on the store's newest state, and roll nothing back.

    Apps with other retrievers or another policy can share one store, and its newest snapshot is then only one
    of theirs: ``retrievers``, ``policy`` (or the ``version`` of the newest snapshot of one kind) pick the kind
    whose newest state weights alone go onto, as :func:`export_weights` picks the one to write (several kinds
    left to choose from: a :class:`ValidationError` lists them). Without them, weights alone of other
    retrievers than the newest snapshot's go onto the newest snapshot of the one kind of their retrievers (of
    the policy the file names, where several are), with a note; where no kind or several could take them, the
    :class:`ValidationError` lists the kinds and the option that picks one. A file's state is imported as it
    is: the options must agree with it (a ``version`` of another kind's snapshot is refused too), and name the
    snapshot it is compared with (whether it is held already, of another kind, of other hyperparameters). Into
    a store that holds no snapshot (its apps have learned nothing yet), weights alone start a new state of
    ``policy``, else of the policy a file's export names, else of the policy of the retrievals the store
    logged with the same retrievers (several such policies: a :class:`ValidationError` asks for ``policy``),
    else of ``"fixed"``, with a note saying which.
    Returns ``{"weights", "policy", "version", "requested", "notes", "written"}``.
    """
    from rlfb.learner import Learner

    wf = source if isinstance(source, WeightsFile) else read_weights_file(source)
    # one read-modify-write of the newest snapshot: a snapshot an app saved between the read and the save
    # was overwritten by one built from the older state
    if hashes_queries(store) and knows_questions_by_text(wf.state):
        raise ValidationError(f"{wf.path}: its state's memory knows questions by their text, and this store keeps "
                              "no query text: import the weights alone (a file without its state)")
    if retrievers is not None and set(retrievers) != set(wf.normalised):
        raise ValidationError(f"{wf.path}: weights name {sorted(wf.normalised)}, not the retrievers named "
                              f"({'+'.join(retrievers)})")
    # options given: the kind was picked on purpose, and no note suggests another (read before the policy of a
    # new state is filled in below)
    picked = retrievers is not None or policy is not None or version is not None
    with store.exclusive():
        saved, label, notes = _import_onto(store, wf, retrievers, policy, version)
        if wf.state is not None:  # loaded once more: read_weights_file only checked it, and this one changes
            learner, target = Learner.from_state_dict(wf.state), "the file's state"
            if policy is not None and learner.policy_name != policy:
                raise ValidationError(f"{wf.path}: its state is of policy {learner.policy_name!r}, not {policy!r} as "
                                      "named")
            other = None if saved is None else _other_kind(learner, saved)
            if other is not None and version is not None:
                # as --policy and --retrievers are: the state went to its own kind, and changed that kind's weights,
                # while the snapshot named was left as it was (each retry wrote one more copy)
                raise ValidationError(f"{wf.path}: its state is of another kind than snapshot {version} ({other}): "
                                      "a file's state is imported as it is, into its own kind; leave the version "
                                      "out, or name a snapshot of the state's kind")
            if other is not None and not picked:
                # compared with the newest snapshot of the state's own kind, where the store holds one: compared
                # with another kind's, the first import of a state already held wrote a copy of it
                own = _newest_of_kind(store, learner)
                if own is not None:
                    saved, label = own, "the store's newest snapshot of the file's kind"
        elif saved and saved.get("state"):
            learner, target = _saved_learner(store, saved), f"{label} ({describe_kind(saved)})"
        else:
            # an empty store: the weights become the policy's named, else the file's policy's (an export names it),
            # else that of the apps whose retrievals the store logged (_logged_policy). Always fixed before: an
            # export of a thompson store imported into a new one was a fixed snapshot, which the thompson
            # ensembles on it passed by, serving equal weights
            if policy is None:
                policy = wf.policy or _logged_policy(store, wf, notes)
            try:
                learner = Learner(tuple(wf.normalised), policy=policy)
            except ValidationError as exc:  # a policy this rlfb does not know
                raise _naming(wf.path, exc) from exc
            target = "a new state (the store held none)"
        return _apply(store, learner, target, saved, wf, rollback=rollback, label=label, notes=notes, picked=picked)


def _newest_of_kind(store: Any, learner: Any) -> dict[str, Any] | None:
    """The newest snapshot of ``learner``'s kind (its policy, retrievers and chunk exploration) the store holds,
    whole, or ``None``; a damaged one is passed by (reading it names the damage where it is used)."""
    for k in store.newest_snapshots():
        if not _matches(k, list(learner.retrievers), learner.policy_name):
            continue
        try:
            saved = store.load_policy_state(version=int(k["version"]))
        except (CorruptStateError, ValidationError):
            continue
        if saved is not None and _other_kind(learner, saved) is None:
            return dict(saved)
    return None


def _logged_policy(store: Any, wf: WeightsFile, notes: list[str]) -> str:
    """The policy weights alone start a state of in a store with no snapshot: that of the retrievals the store
    logged with the same retrievers (an app writes its first snapshot when it first learns, so apps that have
    served and learned nothing yet are told apart by their retrievals alone), else ``"fixed"``
    (FeedbackEnsemble's default). Until 2026-12-07 it was always ``"fixed"``, which the thompson apps serving
    from the store passed by: the weights an operator set right after a deployment were never served."""
    from rlfb.policies import POLICIES
    from rlfb.store.reports import logged_policies

    # a policy object of the app's own is logged under its name, which no import can rebuild: passed by
    logged = [name for name in logged_policies(store, wf.normalised) if name in POLICIES]
    if len(logged) > 1:
        raise ValidationError(f"the store holds no snapshot, and its retrievals with these retrievers were made by "
                              f"policies {' and '.join(map(repr, logged))}: name the one these weights are for with "
                              "--policy (policy= in Python)")
    if logged:
        notes.append(f"the store held no snapshot, so these weights start a {logged[0]!r} policy's state, the "
                     "policy of the retrievals it logged with these retrievers (--policy names another; policy= "
                     "in Python)")
        return logged[0]
    # an app of another policy on this store passes the snapshot by, unsaid
    notes.append("the store held no snapshot, so these weights start a 'fixed' policy's state, which only "
                 "ensembles of policy 'fixed' read (FeedbackEnsemble's default; the adapters and the quick start "
                 "learn with 'thompson'): name the app's policy with --policy (policy= in Python)")
    return "fixed"


#: How :func:`import_weights`'s notes name the snapshot it compares with, where it is the store's newest.
_NEWEST = "the store's newest snapshot"


def _import_onto(store: Any, wf: WeightsFile, retrievers: Sequence[str] | None, policy: str | None,
                 version: int | None) -> tuple[Mapping[str, Any] | None, str, list[str]]:
    """The snapshot :func:`import_weights` puts weights alone onto (a file's state: compares with), how its notes
    name it, and the notes on the choice. See :func:`import_weights` for what the options pick."""
    newest = store.load_policy_state()
    if retrievers is None and policy is None and version is None:
        if newest is None or wf.state is not None or _retrievers_of(newest) is None:
            return newest, _NEWEST, []
        if _retrievers_of(newest) == set(wf.normalised):
            return _of_their_policy(store, wf, newest)
        return _of_their_retrievers(store, wf, newest)
    if newest is None:  # nothing to pick from: the weights make a new state, of the policy named
        if version is not None:
            raise ValidationError(f"the store holds no snapshot of version {version}: it holds none yet")
        return None, _NEWEST, []
    kinds = store.newest_snapshots()
    if wf.state is not None and version is None and not any(_matches(k, retrievers, policy) for k in kinds):
        return None, _NEWEST, []  # a file's state of a kind the store holds none of yet: a new kind on it
    saved, _ = _chosen(store, retrievers, policy, whole=True, version=version)
    if saved is None:
        return None, _NEWEST, []
    if version is not None and all(int(k["version"]) != version for k in kinds):
        # weights go onto a kind's newest state: an older one's would roll its kind back, unsaid
        raise ValidationError(f"snapshot {describe_kind(saved)} is not the newest of its kind: weights are imported "
                              "onto a kind's newest state; the newest of each kind: "
                              + "; ".join(describe_kind(k) for k in kinds))
    if int(saved["version"]) == int(newest["version"]):
        return saved, _NEWEST, []
    return saved, "the store's newest snapshot of the kind named", []


def _of_their_policy(store: Any, wf: WeightsFile,
                     newest: Mapping[str, Any]) -> tuple[Mapping[str, Any], str, list[str]]:
    """Weights alone of the newest snapshot's retrievers: onto it, unless the file names another policy (a
    ``--weights-only`` export of one app's, on a store another app of the same retrievers wrote to last) and the
    store holds one kind of that policy and those retrievers, whose newest snapshot they then go onto, with a
    note (until a review of 2026-12-06 they went onto the other app's policy, with a note alone)."""
    named = wf.policy
    if named is None or newest.get("policy") == named:
        return newest, _NEWEST, []
    theirs = [k for k in store.newest_snapshots() if _matches(k, list(wf.normalised), named)]
    saved = store.load_policy_state(version=int(theirs[0]["version"])) if len(theirs) == 1 else None
    if saved is None:  # none of that policy (or several: its other kinds are told apart by options alone)
        return newest, _NEWEST, []
    note = (f"the store's newest snapshot ({describe_kind(newest)}) is another policy's: the weights go onto the "
            f"newest snapshot of the file's policy {named!r} and their retrievers, version {saved['version']}")
    return saved, "the store's newest snapshot of the file's policy", [note]


def _retrievers_of(snapshot: Mapping[str, Any]) -> set[str] | None:
    """The retrievers a snapshot's weights name (``None``: its weights are unreadable, left to the learner's
    own error)."""
    weights = snapshot.get("weights")
    return set(weights) if isinstance(weights, Mapping) else None


def _of_their_retrievers(store: Any, wf: WeightsFile,
                         newest: Mapping[str, Any]) -> tuple[dict[str, Any], str, list[str]]:
    """Weights alone of other retrievers than the store's newest snapshot (another app's, on a store several
    kinds of ensemble share): the newest snapshot of the one kind of their retrievers (of the policy the file
    names, where it names one and several are of those retrievers). None, or several: a
    :class:`ValidationError` that lists the kinds and says which option picks one."""
    names = sorted(wf.normalised)
    said = (f"{wf.path}: weights name {names} but the store's newest snapshot ({describe_kind(newest)}) is for "
            f"{sorted(_retrievers_of(newest) or ())}")
    kinds = store.newest_snapshots()
    theirs = [k for k in kinds if _matches(k, names, None)]
    if len(theirs) > 1:
        theirs = _undamaged(store, theirs, first_sound=False)
    named = wf.policy  # a --weights-only export names its kind's policy
    if len(theirs) > 1 and any(k.get("policy") == named for k in theirs):
        theirs = [k for k in theirs if k.get("policy") == named]
    if not theirs:
        if len(kinds) < 2:
            raise ValidationError(said)
        raise ValidationError(f"{said}, and none of the {len(kinds)} kinds of ensemble on the store is of these "
                              "retrievers (" + "; ".join(describe_kind(k) for k in kinds) + ")")
    if len(theirs) > 1:
        raise ValidationError(f"{said}; the store holds {len(theirs)} kinds of ensemble of these retrievers ("
                              + "; ".join(describe_kind(k) for k in theirs) + f"): {_telling_apart(theirs)}")
    saved = store.load_policy_state(version=int(theirs[0]["version"]))
    if saved is None:  # pruned since it was listed
        raise ValidationError(said)
    note = (f"the store's newest snapshot ({describe_kind(newest)}) is another kind's: the weights go onto the "
            f"newest snapshot of their retrievers, version {saved['version']}")
    return saved, "the store's newest snapshot of their retrievers", [note]


@dataclass(frozen=True)
class WeightsFile:
    """A weights file read and checked (:func:`read_weights_file`), before any store is opened."""

    path: str
    data: Mapping[str, Any]
    structured: bool  # an export's shape ({"weights": ..., "state": ...}), not a bare mapping
    normalised: dict[str, float]  # the weights, summing to 1, in the file's order

    @property
    def state(self) -> Any:
        """The learner state the file holds (an export's), or ``None``."""
        return self.data.get("state")

    @property
    def policy(self) -> str | None:
        """The policy an export names (checked as it was read), or ``None``: a bare mapping names none."""
        named = self.data.get("policy") if self.structured else None
        return named if isinstance(named, str) else None


def read_weights_file(path: str | Path) -> WeightsFile:
    """Read and check a weights file for :func:`import_weights`: its JSON, its fields, its weights and, when it
    holds one, that its learner state loads. A bad file is refused before any store is opened (``rlfb
    weights import`` migrated an older store, then refused the file)."""
    from rlfb.learner import Learner

    data = _read(path)
    structured = "weights" in data or "state" in data
    raw = data.get("weights", data if "state" not in data else None)
    if not isinstance(raw, Mapping) or not raw:
        raise ValidationError(f"{path}: no weights mapping found")
    if structured:
        _check_export_fields(path, data)
    weights = _numbers(path, raw)
    names = list(weights)
    try:
        normalised = dict(zip(names, validate_weights(weights, names).tolist(), strict=True))
    except ValidationError as exc:  # NaN, infinite or negative weights
        raise _naming(path, exc) from exc
    if data.get("state") is not None:
        try:
            Learner.from_state_dict(data["state"])  # CorruptStateError on damage
        except (CorruptStateError, ValidationError) as exc:
            raise _naming(path, exc) from exc
    return WeightsFile(str(path), data, structured, normalised)


def _apply(store: Any, learner: Any, target: str, saved: Mapping[str, Any] | None, wf: WeightsFile, *,
           rollback: bool = False, label: str = _NEWEST, notes: list[str] | None = None,
           picked: bool = False) -> dict[str, Any]:
    """The body of :func:`import_weights` once the learner the weights go to is chosen, under the store's lock;
    ``saved`` is the snapshot compared with, named ``label`` in the notes (more ``notes`` go first)."""
    path, normalised = wf.path, wf.normalised
    from_file = wf.state is not None
    names = list(normalised)
    if set(learner.retrievers) != set(names):
        # "the state is for" did not say which: the file's, or the store's snapshot (another app's, on a shared store)
        raise ValidationError(f"{path}: weights name {sorted(names)} but {target} is for {list(learner.retrievers)}")
    requested = {n: normalised[n] for n in learner.retrievers}
    if not from_file or not _same(learner.weights(), requested):
        learner.set_weights(requested)
    applied = learner.weights()
    notes = list(notes or ())
    if wf.policy not in (None, learner.policy_name):
        notes.append(f"the file's policy {wf.policy!r} is not used: the weights go to the "
                     f"{learner.policy_name!r} policy of {target}"
                     f"{'' if picked else _policy_option(store, wf, saved)}")
    clamped = _clamped(learner, normalised)
    if clamped is not None:
        shown = ", ".join(f"{n} {normalised[n]:.4g} -> {clamped[n]:.4g}" for n in learner.retrievers)
        notes.append(f"the {learner.policy_name!r} policy clamps weights to its bounds "
                     f"{list(learner.policy.hyper.bounds)}: {shown}")
    if not _same(applied, clamped or requested):
        shown = ", ".join(f"{n} {applied[n]:.4g}" for n in learner.retrievers)
        why = ("it takes them as its default arm, but serves the learned arm that passed its evidence gate "
               "until the evidence turns" if hasattr(learner.policy, "arm_names") else "it serves its own")
        notes.append(f"the {learner.policy_name!r} policy serves other weights than these ({shown}): {why}")
    if from_file:
        kind = _other_kind(learner, saved)
        if kind is not None:
            notes.append(f"the file's state is of another kind than {label} ({kind}): "
                         "ensembles built like that snapshot ignore it and keep their own state")
    other = _other_hyperparameters(learner, saved)
    if other is not None:
        notes.append(f"the file's {learner.policy_name!r} hyperparameters differ from {label} ({other}): "
                     "ensembles built like that snapshot keep their own state, not these weights")
    # the dense model the memory's embeddings are of, as the file's or the snapshot's state named it: the
    # learner does not keep it (the ensemble adds it when it saves), and without it any ensemble would take them
    source = wf.state if from_file else (saved or {}).get("state")
    state = naming_model(learner.state_dict(), SnapshotKind.of({"state": source}).model)
    if saved is not None and saved.get("policy") == learner.policy_name and _close(saved.get("weights"), applied) \
            and (_canonical(saved.get("state")) == _canonical(state) or _close(saved.get("state"), state)):
        # the same import again (a retry): another copy would push the store's older snapshots out of those kept
        notes.append(f"{label} (version {saved['version']}) holds these already: nothing was written")
        return {"weights": dict(saved["weights"]), "policy": learner.policy_name, "version": saved["version"],
                "requested": normalised, "notes": notes, "written": False}
    if from_file and not rollback:
        _refuse_rollback(store, path, learner, state, learner.policy_name)
    version = store.save_policy_state(state, applied, policy=learner.policy_name, timestamp=time.time())
    return {"weights": applied, "policy": learner.policy_name, "version": version, "requested": normalised,
            "notes": notes, "written": True}


def _policy_option(store: Any, wf: WeightsFile, saved: Mapping[str, Any] | None) -> str:
    """For weights alone that went onto another policy than their file names: how ``--policy`` puts them onto the
    newest snapshot of the file's policy and their retrievers, where the store holds one (a --weights-only
    export of one app's, imported into a store another app of the same retrievers wrote to last)."""
    if wf.state is not None or saved is None:
        return ""
    named = wf.policy
    theirs = [k for k in store.newest_snapshots() if _matches(k, list(wf.normalised), named)]
    if len(theirs) != 1:
        return ""
    return f"; --policy {named} imports them onto the newest snapshot of that policy (version {theirs[0]['version']})"


def _canonical(state: Any) -> str:
    """``state`` as JSON text that compares equal for equal states (keys sorted; tuples as lists)."""
    return json.dumps(state, sort_keys=True, allow_nan=True, default=str)
