"""Plain value types shared by every layer: chunks in, hits out."""

from __future__ import annotations

import copy
import difflib
import hashlib
import inspect
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlfb.errors import DuplicateIdError, EmptyCorpusError, UnknownOptionError, ValidationError

__all__ = [
    "EXTERNAL_POLICY", "Chunk", "Hit", "RetrievalResult", "check_choice", "check_chunk", "check_chunk_ids",
    "content_id", "content_ids", "copy_metadata", "make_chunks", "text_list", "validate_flag", "validate_k",
    "validate_seconds",
]

#: The ``policy`` recorded on events that another engine's retriever made (:func:`rlfb.runs.log_external`): no
#: learner made the decision, so none learns feedback on it (the store marks such feedback as nothing to learn).
EXTERNAL_POLICY = "external"


@dataclass(frozen=True)
class Chunk:
    """One retrievable unit of text.

    >>> Chunk("c1", "The aurora is caused by solar wind.").id
    'c1'
    """

    id: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


def copy_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """A deep copy of ``metadata`` (``{}`` for ``None``), so that nothing nested is shared.

    A chunk's metadata is taken in and handed out through this: with a shallow copy, appending to a
    result's ``metadata["authors"]`` changed the indexed chunk, every later result and the caller's own
    documents. A value that cannot be deep-copied (a lock, a handle) is shared as it is.

    >>> given = {"authors": ["ann"]}
    >>> copy_metadata(given)["authors"].append("bob")
    >>> given
    {'authors': ['ann']}
    """
    out = {}
    for key, value in (metadata or {}).items():
        try:
            out[key] = copy.deepcopy(value)
        except Exception:  # noqa: BLE001 - whatever a user's object raises: share it, as before
            out[key] = value
    return out


@dataclass(frozen=True)
class Hit:
    """One ranked result of a fused retrieval.

    ``scores`` holds each retriever's raw score (``None`` where it gave none: an ensemble member
    that did not return the chunk), ``normalized`` the score after
    the fusion's normalisation, ``score`` the fused score and ``rank`` the
    1-based position. ``proposed_by`` names the retrievers whose own top list
    contained the chunk with a score other than 0; the others only scored it
    (BM25 and SPLADE fill a top list longer than their matches with chunks they score 0).
    ``confidence`` is the chunk's confidence from feedback over all questions, 1 to 10 (5 for a chunk no
    feedback has reached yet), and ``memory`` what the feedback memory holds for this chunk on this question
    or similar ones, in [-1, 1] (0: nothing); both enter ``score`` (docs/concepts.md).
    """

    chunk_id: str
    text: str
    score: float
    rank: int
    scores: Mapping[str, float | None]
    normalized: Mapping[str, float]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    proposed_by: tuple[str, ...] = ()
    confidence: float | None = None
    memory: float | None = None


@dataclass(frozen=True)
class RetrievalResult:
    """What :meth:`rlfb.FeedbackEnsemble.retrieve` returns.

    ``event_id`` is the key that later feedback is attached to; it is ``None``
    only when the retrieval was not logged.
    """

    query: str
    hits: list[Hit]
    weights: Mapping[str, float]
    event_id: str | None = None
    arm: str | None = None
    propensity: float = 1.0
    explored: bool = False
    ask_for_feedback: bool = False

    @property
    def chunk_ids(self) -> list[str]:
        """The ids of :attr:`hits`, best first."""
        return [h.chunk_id for h in self.hits]

    def __len__(self) -> int:
        return len(self.hits)


def validate_k(k: int, name: str = "k") -> int:
    """Return ``k`` as an int, or raise :class:`ValidationError` unless it is positive.

    >>> validate_k(3)
    3
    >>> validate_k(0)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: k must be a positive integer, got 0
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k <= 0:  # numpy integers are integers
        raise ValidationError(f"{name} must be a positive integer, got {k!r}")
    return int(k)


def validate_flag(value: object, name: str) -> bool:
    """``value`` if it is a bool (``numpy.bool_`` too); ``"no"`` or ``0`` is a mistake, not False.

    >>> validate_flag(True, "explore")
    True
    >>> validate_flag("no", "explore")
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: explore must be True or False, got 'no'
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValidationError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def validate_seconds(value: object, name: str) -> float:
    """A number of seconds >= 0; infinity means never (simulations never write snapshots).

    >>> validate_seconds(5, "refresh_interval")
    5.0
    >>> validate_seconds(-1, "refresh_interval")
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: refresh_interval must be a number of seconds >= 0, got -1
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:  # NaN fails >= too
        raise ValidationError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def check_choice(value: object, choices: Mapping[str, Any], what: str) -> str:
    """``value`` if it is one of the names in ``choices``, else :class:`ValidationError` naming ``what``.

    >>> check_choice("rrf", {"rrf": None}, "fusion method")
    'rrf'
    >>> check_choice(["rrf"], {"rrf": None}, "fusion method")
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: unknown fusion method ['rrf']; choose one of ['rrf']
    """
    if not isinstance(value, str) or value not in choices:
        raise ValidationError(f"unknown {what} {value!r}; choose one of {sorted(choices)}")
    return value


def check_known_options(given: Iterable[str], known: Iterable[str], owner: str) -> None:
    """Raise :class:`~rlfb.errors.UnknownOptionError` (a ``ValidationError``, and a ``TypeError`` as Python's own
    is) for the first name in ``given`` that is not in ``known``, with the closest known name and the whole list: a
    bare ``TypeError`` ("got an unexpected keyword argument") listed neither.

    >>> check_known_options(["memory_wieght"], ["memory_weight", "exploration"], "the learner")
    Traceback (most recent call last):
    ...
    rlfb.errors.UnknownOptionError: the learner takes no option 'memory_wieght' (did you mean 'memory_weight'?); ...
    """
    options = sorted(known)
    for name in sorted(set(given) - set(options)):
        raise UnknownOptionError(f"{owner} takes no option {name!r}{closest_hint(name, options)}; its options are "
                                 f"{options}")


def closest_hint(name: str, options: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` with the option closest to a misspelt ``name``, or ``""`` where none is close.

    >>> closest_hint("stor", ["store", "top_n"])
    " (did you mean 'store'?)"
    """
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def keyword_options(func: Any, *, leave_out: Iterable[str] = ()) -> list[str] | None:
    """The names ``func`` takes by keyword (leaving out ``self`` and ``leave_out``); ``None`` where it takes any
    (``**kwargs``)."""
    params = inspect.signature(func).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    skip = {"self", *leave_out}
    return [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n not in skip]


def check_chunk(chunk: Any, where: str) -> Chunk:
    """``chunk`` where it is a :class:`Chunk` of a string id, a string text and a mapping (or ``None``) of
    metadata; else a :class:`ValidationError` naming ``where`` it came from. A dataclass checks no types, and a
    chunk of a list id or metadata failed deep inside the ranking (an unhashable list, no ``.items``).

    >>> check_chunk(Chunk("c1", "tides", [1]), "rerank")
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: rerank: chunk 'c1' has metadata of type list, not a mapping
    """
    if not isinstance(chunk, Chunk):
        raise ValidationError(f"{where}: got {type(chunk).__name__}, not a Chunk (rlfb.Chunk(id, text, metadata))")
    if not isinstance(chunk.id, str) or not chunk.id:
        raise ValidationError(f"{where}: a chunk's id must be a non-empty string, got {type(chunk.id).__name__} "
                              f"{chunk.id!r:.80}")
    if not isinstance(chunk.text, str):
        raise ValidationError(f"{where}: chunk {chunk.id!r} has a text of type {type(chunk.text).__name__}, not str")
    if chunk.metadata is not None and not isinstance(chunk.metadata, Mapping):
        raise ValidationError(f"{where}: chunk {chunk.id!r} has metadata of type {type(chunk.metadata).__name__}, "
                              "not a mapping")
    return chunk


def check_chunk_ids(ids: Sequence[Any], what: str = "chunk id") -> None:
    """Refuse chunk ids that are not strings, empty, or repeated.

    A saved state keys chunks by JSON strings (chunk 101 would come back as ``"101"`` and lose all it had
    learned), and ``str(7)`` would index ``"7"`` where ``chunk(7)`` then finds nothing; of a repeated id only
    one place would be scored.

    >>> check_chunk_ids(["a", "b"])
    >>> check_chunk_ids(["a", 7], "shown id")
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: shown ids must be strings, got int 7
    >>> check_chunk_ids(["x", "x"])
    Traceback (most recent call last):
    ...
    rlfb.errors.DuplicateIdError: duplicate chunk id: 'x'
    """
    seen: set[str] = set()
    for cid in ids:
        if not isinstance(cid, str):
            raise ValidationError(f"{what}s must be strings, got {type(cid).__name__} {cid!r}")
        if not cid:  # indexed, logged and rated, then refused by the store where a later step cut it
            raise ValidationError(f"{what}s must not be empty")
        if cid in seen:
            raise DuplicateIdError(f"duplicate {what}: {cid!r}")
        seen.add(cid)


def content_id(text: str) -> str:
    """A stable id for a chunk that came without one: the first 16 hex digits of its text's sha256.

    >>> content_id("the aurora is caused by the solar wind")
    'sha256:b82187c14dc21ffa'
    """
    if not isinstance(text, str):
        raise ValidationError(f"text must be a str, got {type(text).__name__}")
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def content_ids(texts: Sequence[str]) -> list[str]:
    """:func:`content_id` of each text; the second and later copies of one text get ``#2``, ``#3``, ...

    What is learned about a chunk is kept by its id, so an id must name the same text when the corpus is
    built again from a list that changed (a text added at the front renumbered every positional id, and
    handed each chunk's learning to its neighbour).

    >>> content_ids(["a", "b", "a"])
    ['sha256:ca978112ca1bbdca', 'sha256:3e23e8160039594a', 'sha256:ca978112ca1bbdca#2']
    """
    seen: dict[str, int] = {}
    out = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValidationError(f"texts[{i}] is {type(text).__name__}, not str")
        cid = content_id(text)
        seen[cid] = n = seen.get(cid, 0) + 1
        out.append(cid if n == 1 else f"{cid}#{n}")
    return out


def text_list(texts: Iterable[str]) -> list[str]:
    """``texts`` as a list, read once (a generator too); one string or a mapping is refused.

    A mapping of ids to texts, a common shape, would index its keys as the texts (a list of it is its keys):

    >>> text_list({"doc-1": "Geysers erupt hot water"})
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: texts must be a sequence of strings, not a mapping: give its values as texts ...
    """
    if isinstance(texts, str):
        raise ValidationError("texts must be a sequence of strings, not one string")
    if isinstance(texts, Mapping):
        raise ValidationError("texts must be a sequence of strings, not a mapping: give its values as texts and its "
                              "keys as ids (texts=list(d.values()), ids=list(d.keys()))")
    return list(texts)


def make_chunks(
    texts: Sequence[str],
    ids: Sequence[str] | None = None,
    metadatas: Sequence[Mapping[str, Any] | None] | None = None,
) -> list[Chunk]:
    """Zip texts, ids and metadata into validated chunks.

    Ids default to a hash of each text (:func:`content_ids`), so that what is learned about a chunk stays
    with its text when the list is built again in another order (they were ``"0"``, ``"1"``, ... until
    2026-12-05). Duplicate ids, an empty corpus and mismatched lengths are rejected.

    >>> [c.id for c in make_chunks(["a", "b"])]
    ['sha256:ca978112ca1bbdca', 'sha256:3e23e8160039594a']
    >>> [c.id for c in make_chunks(["a", "b"], ids=["x", "y"])]
    ['x', 'y']
    >>> make_chunks(["a", "b"], ids=["x", "x"])
    Traceback (most recent call last):
    ...
    rlfb.errors.DuplicateIdError: duplicate chunk id: 'x'
    """
    texts = text_list(texts)
    if not texts:
        raise EmptyCorpusError("cannot index an empty corpus: no texts given")
    if ids is None:
        ids = content_ids(texts)
    if isinstance(ids, str):  # a string is a sequence too: "ab" would silently become ids "a" and "b"
        raise ValidationError("ids must be a sequence of strings, not one string")
    if isinstance(ids, Mapping):  # its keys would be the ids, whatever its values are
        raise ValidationError("ids must be a sequence of strings, not a mapping")
    ids = list(ids)
    check_chunk_ids(ids)
    if len(ids) != len(texts):
        raise ValidationError(f"got {len(texts)} texts but {len(ids)} ids")
    if metadatas is None:
        metadatas = [None] * len(texts)
    if isinstance(metadatas, (str, Mapping)):
        raise ValidationError("metadatas must be a sequence with one mapping (or None) per text")
    metadatas = list(metadatas)
    for meta in metadatas:
        if meta is not None and not isinstance(meta, Mapping):
            raise ValidationError(f"each metadata must be a mapping or None, got {type(meta).__name__}")
    if len(metadatas) != len(texts):
        raise ValidationError(f"got {len(texts)} texts but {len(metadatas)} metadatas")
    chunks = []
    for cid, text, meta in zip(ids, texts, metadatas, strict=True):
        if not isinstance(text, str):
            raise ValidationError(f"text of chunk {cid!r} is {type(text).__name__}, not str")
        chunks.append(Chunk(cid, text, copy_metadata(meta)))
    return chunks
