"""The folder :meth:`FeedbackEnsemble.save <rlfb.FeedbackEnsemble.save>` writes and ``load`` reads back.

``ensemble.json`` (the ensemble's settings and the names of its retrievers and search members), the chunk
table, one folder a retriever under ``retrievers/`` and ``learner.json`` (the learner's state): JSON and
``.npy``, never pickle. A save is written beside the folder and swapped in whole
(:func:`rlfb.saved_folder.saving_into`); a load reads one save whole (:func:`rlfb.saved_folder.read_whole`: again
if another process's save is swapped in meanwhile), checks every file before it builds the ensemble, and keeps a
store's state that has learned from more feedback than the save.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rlfb.corpus_index import indexed_table
from rlfb.errors import CorruptStateError, SaveNotFoundError, ValidationError
from rlfb.files import folder_path
from rlfb.members import SearchMember
from rlfb.memory import knows_questions_by_text
from rlfb.retrievers.base import ChunkTable
from rlfb.runs import hashes_queries
from rlfb.saved_folder import read_whole, saving_into
from rlfb.snapshot_sync import state_to_save
from rlfb.types import validate_seconds

if TYPE_CHECKING:
    from rlfb.ensemble import FeedbackEnsemble

#: the class ``load`` was called on (a subclass of :class:`~rlfb.FeedbackEnsemble` loads as itself)
_E = TypeVar("_E", bound="FeedbackEnsemble")

_CONFIG_FILE = "ensemble.json"
_FORMAT = 1
#: what a save holds: a folder holding anything else is not replaced by a save
_SAVED_NAMES = frozenset({_CONFIG_FILE, "chunks.jsonl", "retrievers", "learner.json"})


def save_ensemble(ens: FeedbackEnsemble, path: str | Path) -> None:
    """The body of :meth:`FeedbackEnsemble.save <rlfb.FeedbackEnsemble.save>`."""
    path = folder_path(path)
    # flushed before this save's lock: flushing takes the store's lock, which a caller saving inside its own
    # store.exclusive() block holds while it waits for this lock (another thread's save held both for ever).
    # The state is read (and encoded) in the same hold of the store's lock and the ensemble's as the flush: a
    # feedback learned between the two went into the save and not the store, and a load of the save on that
    # store wrote it back as the newest snapshot, whose learning this ensemble then took on top of its own (a
    # row counted twice; a thread audit, 2026-12-07). Under the ensemble's lock a save made while feedback
    # arrives does not see dicts change size mid-read, or half of one update.
    with ens._guarded():
        ens.flush()
        state = json.dumps(state_to_save(ens), allow_nan=False)
        ens._save_seq += 1
        seq = ens._save_seq
    folder = str(Path(path).resolve())
    with ens._save_lock:
        # two threads saving to one folder may take this lock in the other order than they read their states:
        # the older state is not written over the newer (a review, 2026-12-07)
        if ens._saved_seq.get(folder, 0) > seq:
            return
        table, retrievers = ens._index()
        config = {
            "format": _FORMAT,
            "retrievers": list(retrievers),
            "members": list(ens._members),  # callables are not saved: pass members= to load()
            "fusion": ens.fusion,
            "candidate_k": ens.candidate_k,
            "rrf_c": ens.rrf_c,
            "seed": ens.seed,
            "policy": ens._learner.policy_name,
            "refresh_interval": _interval_json(ens.refresh_interval),
            "persist_interval": _interval_json(ens.persist_interval),
        }
        with saving_into(Path(path), marker=_CONFIG_FILE, what="ensemble", names=_SAVED_NAMES) as tmp:
            table.save(tmp)  # metadata JSON cannot hold is a ValidationError naming the chunk
            for name, r in retrievers.items():
                r.save(tmp / "retrievers" / name)
            (tmp / _CONFIG_FILE).write_text(json.dumps(config, indent=2, allow_nan=False), encoding="utf-8")
            (tmp / "learner.json").write_text(state, encoding="utf-8")
        ens._saved_seq[folder] = seq  # once written whole: a save that failed leaves the folder to the older one


def load_ensemble(
    cls: type[_E],
    path: str | Path,
    *,
    store: Any,
    retriever_options: Mapping[str, Mapping[str, Any]] | None,
    kwargs: Mapping[str, Any],
) -> _E:
    """The body of :meth:`FeedbackEnsemble.load <rlfb.FeedbackEnsemble.load>` (``kwargs``: its keyword
    arguments that override the saved settings)."""
    root = folder_path(path)
    learned = sorted({"policy", "learner_config", "weights"} & set(kwargs))
    if learned:  # the saved learner state would overwrite them: refuse rather than drop them unsaid
        raise ValidationError(
            f"load() brings back the saved learner, so it takes no {learned}: set weights afterwards with "
            "ens.set_weights(...), or build a new ensemble for another policy"
        )
    from rlfb.ensemble import check_options

    # a bare TypeError of the constructor's, once the whole save was read; not listing those refused above
    check_options(kwargs, cls, leave_out=("policy", "learner_config", "weights"),
                  owner=f"{cls.__name__}.load")
    members = kwargs.get("members", ())
    if isinstance(members, (str, bytes, Mapping)) or not isinstance(members, Iterable):
        raise ValidationError(f"members must be a list of SearchMember, got {type(members).__name__}")
    if retriever_options is not None and not isinstance(retriever_options, Mapping):
        raise ValidationError("retriever_options must map retriever names to mappings of load() arguments")
    options_of = dict(retriever_options or {})
    for name, opts in options_of.items():
        if not isinstance(opts, Mapping) or not all(isinstance(k, str) for k in opts):
            raise ValidationError(f"retriever_options[{name!r}] must be a mapping of load() arguments by name")
    from rlfb.ensemble import open_store

    # one save read from start to end: again if another process's save is swapped in meanwhile
    read = read_whole(root, lambda: _read_folder(root, options_of, kwargs), marker=_CONFIG_FILE)
    # opened once the save is read (a mistyped folder leaves no new store file behind) and before the ensemble
    # is built: a store that cannot be opened (a missing folder, a directory, not a store) is the caller's
    # argument at fault, which the refusal below would have blamed on the saved folder
    opened = open_store(store)
    try:
        return _built(cls, root, opened, read, kwargs)
    except BaseException:
        if opened is not store:  # opened here from a path: nobody else will close it
            opened.close()
        raise


def _built(cls: type[_E], root: Path, store: Any, read: tuple[Any, ...], kwargs: Mapping[str, Any]) -> _E:
    """The ensemble in the save ``read`` (what :func:`_read_folder` read of ``root``), on the opened ``store``."""
    config, state, learner, saved_count, table, retrievers = read
    if hashes_queries(store) and knows_questions_by_text(state):
        # its memory's keys are question texts: taken or written, they would go into a store that keeps none
        raise ValidationError(
            f"{root} was learned on a store that keeps query text, and its memory knows questions by their text: "
            "a store_text=False store must not hold them; load it onto a store that keeps text"
        )
    options = {
        "fusion": config.get("fusion", "minmax"),
        "candidate_k": config.get("candidate_k", 100),
        "rrf_c": config.get("rrf_c", 60.0),
        "seed": config.get("seed", 0),
        "policy": learner.policy,
        "learner_config": learner.config,
    }
    for name in ("refresh_interval", "persist_interval"):  # older saves have neither: the defaults
        if name in config and name not in kwargs:  # one given explicitly wins, a damaged saved one too
            options[name] = _interval_from_json(config[name], name, root / _CONFIG_FILE)
    options.update(kwargs)
    from rlfb.snapshot_sync import LOADING  # here: as the ensemble's own imports

    token = LOADING.set(True)  # the save's learning comes next: no note that the ensemble starts afresh
    try:
        ens = cls(retrievers, table, store=store, **options)
    except ValidationError as exc:
        if kwargs:  # the caller's own settings may be what is wrong
            raise
        raise CorruptStateError(f"{root / _CONFIG_FILE}: {exc}") from exc
    finally:
        LOADING.reset(token)
    if ens._own_version > 0 and ens._learner.n_learned >= saved_count:
        # the store already holds this policy's state, learned from as much feedback as the save or more:
        # the store is the live record (other processes may have learned since the save, or set weights,
        # which learns from nothing), so the save must not roll it back
        return ens
    ens._learner.load_state_dict(state)
    if ens._store is not None:
        # and the save's state becomes the store's, for every process on it: kept here alone, the next snapshot
        # another worker wrote replaced it (40 episodes learned, then 4), and a restart never saw it
        ens._dirty = True
        ens.flush()
    return ens


def _json_file(file: Path) -> Any:
    """The JSON that ``file`` holds; a file missing or damaged is a :class:`CorruptStateError` that names it."""
    try:
        return json.loads(file.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise CorruptStateError(f"cannot read {file}: {type(exc).__name__}: {exc}"[:500]) from exc


def _read_folder(
    root: Path, options_of: Mapping[str, Mapping[str, Any]], kwargs: Mapping[str, Any]
) -> tuple[dict[str, Any], Any, Any, int, ChunkTable, dict[str, Any]]:
    """The settings, the learner state, an untrained learner of its settings and how many feedbacks the state
    learned, the chunk table and the retrievers saved in ``root``, every file checked."""
    from rlfb.learner import Learner
    from rlfb.retrievers import load_retriever

    if not (root / _CONFIG_FILE).is_file():
        # a typo'd path, an empty folder, a retriever's own save: said so, not FileNotFoundError(2, ...). A
        # FileNotFoundError still, and a CorruptStateError, which read_whole waits on while a save swaps it in
        what = "there is no such folder" if not root.exists() else f"it holds no {_CONFIG_FILE}"
        raise SaveNotFoundError(f"cannot read an ensemble from {root}: {what} (FeedbackEnsemble.save(path) "
                                "writes one)")
    config = _json_file(root / _CONFIG_FILE)
    state = _json_file(root / "learner.json")
    try:
        if not isinstance(config, dict):
            raise CorruptStateError(f"{root / _CONFIG_FILE} holds a {type(config).__name__}, not settings")
        if config.get("format") != _FORMAT:
            raise CorruptStateError(f"{root / _CONFIG_FILE}: unknown format {config.get('format')!r}")
        names = [str(n) for n in config["retrievers"]]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise CorruptStateError(f"cannot read an ensemble from {root}: {exc!r}"[:500]) from exc
    saved_members = config.get("members") or []
    given = {m.name for m in kwargs.get("members", ()) if isinstance(m, SearchMember)}
    if isinstance(saved_members, list) and not set(map(str, saved_members)) <= given:
        raise ValidationError(
            f"{root} was saved with the search members {saved_members!r}: pass them again, "
            "load(path, members=[SearchMember(name, search_fn), ...])"
        )
    unknown = sorted(map(str, set(options_of) - set(names)))
    if unknown:
        raise ValidationError(f"retriever_options names {unknown}, but {root} holds the retrievers {names}")
    # an ensemble of search members alone indexes no chunks, and saves none
    table = ChunkTable.load(root, allow_empty=not names and bool(saved_members))
    retrievers = {n: load_retriever(root / "retrievers" / n, **options_of.get(n, {})) for n in names}
    try:
        indexed_table(table, retrievers)  # each retriever's own chunks.jsonl: the same ids and texts
    except ValidationError as exc:
        raise CorruptStateError(f"{root}: {exc}; the save is damaged") from exc
    learner = Learner.untrained_like(state)  # settings and hyperparameters as saved; state loads later
    saved_count = _n_learned(state, root)
    try:
        # the whole state is checked now, before a store is opened: also when the store turns out
        # to be ahead of this save and keeps its own state, a damaged learner.json is an error
        Learner.untrained_like(state).load_state_dict(state)
    except CorruptStateError as exc:
        raise CorruptStateError(f"{root / 'learner.json'}: {exc}") from exc
    return config, state, learner, saved_count, table, retrievers


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a saved state may hold")


def _interval_json(seconds: float) -> float | str:
    """An interval as JSON holds it: infinity ("writes only when forced") is the string ``"inf"``, as JSON has none."""
    return "inf" if seconds == math.inf else seconds


def _interval_from_json(value: object, name: str, file: Path) -> float:
    """A saved interval back in seconds; a damaged one is a :class:`CorruptStateError` naming the file."""
    if value == "inf":
        return math.inf
    try:
        return validate_seconds(value, name)
    except ValidationError as exc:  # damaged saved settings, not the caller's argument
        raise CorruptStateError(f"{file}: {exc}") from exc


def _n_learned(state: Any, root: Path) -> int:
    """How many episodes a saved learner state has learned from."""
    count = state.get("n_learned") if isinstance(state, Mapping) else None
    # a negative count would always lose to the store's and skip this save's state unsaid
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise CorruptStateError(f"{root / 'learner.json'}: n_learned must be a count of episodes, got {count!r}")
    return count
