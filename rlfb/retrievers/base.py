"""The retriever contract and the id bookkeeping every retriever shares.

A retriever scores the whole corpus for a query as one numpy vector aligned
with :attr:`Retriever.ids`. ``search``, ``search_batch`` and ``score`` are all
derived from that vector, so each concrete retriever only has to implement
:meth:`score_all_batch` (corpus scores) and :meth:`score_texts` (scores of
texts outside the index, used by the LlamaIndex postprocessor).
"""

from __future__ import annotations

import copy
import json
import tokenize
import weakref
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from rlfb.errors import (
    CorruptStateError,
    DuplicateIdError,
    EmptyCorpusError,
    UnknownChunkError,
    ValidationError,
)
from rlfb.files import folder_path
from rlfb.saved_folder import saving_into
from rlfb.types import Chunk, make_chunks, validate_k

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "Retriever",
    "dense_retriever",
    "ChunkTable",
    "CorpusRetriever",
    "top_k",
    "read_meta",
    "load_meta",
    "write_meta",
    "check_format_version",
    "saved_positive_int",
    "check_query",
    "check_texts",
    "reused_rows",
    "kept_then_new",
    "as_table",
    "ARRAY_HEADER_ERRORS",
    "NPZ_ERRORS",
    "array_problem",
]

#: what the built-in retrievers' saves hold: a folder holding anything else is not replaced by a save
SAVED_NAMES = frozenset({"meta.json", "chunks.jsonl", "term_counts.npz", "bm25s", "embeddings.npy", "doc_matrix.npz"})

#: what ``np.load`` lets escape from a damaged ``.npy`` header besides ``ValueError``: a header that
#: ``ast.literal_eval`` refuses is tokenized again for old files (``tokenize.TokenError``), and the
#: parser can raise ``SyntaxError`` (or ``RecursionError`` on deep nesting) itself; a header whose shape is
#: beyond memory (10^11 numbers) makes numpy try to allocate it (``MemoryError``, its text naming the size)
ARRAY_HEADER_ERRORS: tuple[type[BaseException], ...] = (tokenize.TokenError, SyntaxError, RecursionError,
                                                        MemoryError)

#: what reading a damaged ``.npz`` can raise: a file that is no zip (``BadZipFile``), a truncated or
#: bit-flipped member (``zlib.error``, ``EOFError``), a member whose compression method field was damaged
#: (``NotImplementedError``: "That compression method is not supported"), a missing array (``KeyError``),
#: arrays that form no matrix (``ValueError``, ...), a damaged ``.npy`` header inside (ARRAY_HEADER_ERRORS)
NPZ_ERRORS: tuple[type[BaseException], ...] = (
    OSError, ValueError, KeyError, TypeError, IndexError, EOFError, NotImplementedError, zipfile.BadZipFile,
    zlib.error, *ARRAY_HEADER_ERRORS,
)


def array_problem(exc: BaseException) -> str:
    """What a saved array's load raised, in words; a ``MemoryError`` may also be a machine short of memory.

    >>> print(array_problem(MemoryError("Unable to allocate 745. GiB")))
    Unable to allocate 745. GiB (a header claiming more than the file holds; if the file is intact, this
    machine has too little memory to load it)
    >>> print(array_problem(ValueError("Object arrays cannot be loaded when allow_pickle=False")))
    it holds Python objects, which rlfb never saves and never unpickles: the file is damaged or not rlfb's
    """
    if isinstance(exc, MemoryError):
        return (f"{exc} (a header claiming more than the file holds; if the file is intact, this machine has too "
                "little memory to load it)")
    if "allow_pickle" in str(exc):  # numpy's advice, to load it with allow_pickle=True, would run its code
        return "it holds Python objects, which rlfb never saves and never unpickles: the file is damaged or not rlfb's"
    return str(exc)


@runtime_checkable
class Retriever(Protocol):
    """What the fusion layer needs from a retriever."""

    name: str

    @property
    def ids(self) -> list[str]: ...

    def __len__(self) -> int: ...

    def index(self, chunks: Sequence[Chunk], *, show_progress: bool = False) -> Retriever: ...

    def score_all(self, query: str) -> np.ndarray: ...

    def score_all_batch(self, queries: Sequence[str], *, show_progress: bool = False) -> np.ndarray: ...

    def search(self, query: str, k: int) -> list[tuple[str, float]]: ...

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[tuple[str, float]]]: ...

    def score(self, query: str, chunk_ids: Sequence[str]) -> np.ndarray: ...

    def score_texts(self, query: str, texts: Sequence[str]) -> np.ndarray: ...

    def save(self, path: str | Path) -> None: ...


def dense_retriever(retrievers: Mapping[str, Any]) -> Any | None:
    """The retriever named ``dense`` among ``retrievers`` (whose normalised embeddings the feedback memory, the
    reformulation check and relevance feedback compare by cosine; SPLADE's sparse vectors are not), or ``None``."""
    return next((r for r in retrievers.values() if getattr(r, "name", None) == "dense"), None)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Row indices of the ``k`` highest scores, best first.

    Selection (``np.partition``) finds the k-th largest score in O(n); only the
    k winners are sorted. Ties go to the lower index, so results are deterministic.

    >>> top_k(np.zeros(5), 2).tolist()
    [0, 1]

    >>> top_k(np.array([0.1, 0.9, 0.5, 0.9]), 2).tolist()
    [1, 3]

    >>> top_k(np.array([0.1, np.nan, 0.5, 0.3]), 3).tolist()
    [2, 3, 0]
    """
    n = scores.shape[0]
    k = min(validate_k(k), n)
    if np.isnan(scores).any():  # a NaN would compare false with everything and drop hits: it ranks last
        scores = np.where(np.isnan(scores), -np.inf, scores)
    if k < n:
        # the k-th largest value by selection in O(n); ties at that value go to the lowest indices
        kth = np.partition(scores, n - k)[n - k]
        above = np.flatnonzero(scores > kth)
        part = np.concatenate([above, np.flatnonzero(scores == kth)[: k - above.size]])
    else:
        part = np.arange(n)
    # lexsort: last key is primary -> sort by -score, then by index
    order = np.lexsort((part, -scores[part]))
    return part[order]


class ChunkTable:
    """Chunk ids, texts and metadata in index order, with an id -> row map.

    Retrievers hold one of these so that every id lookup is a dict access and
    every score vector is aligned with :attr:`ids`.
    """

    #: set by :meth:`changed`: (a weak reference to the table it came from, the reused row of each row)
    _origin: tuple[Any, np.ndarray] | None = None

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        chunks = list(chunks)
        # re-validate: catches empty corpora and duplicate ids from any caller
        make_chunks([c.text for c in chunks], [c.id for c in chunks], [c.metadata for c in chunks])
        self.ids: list[str] = [c.id for c in chunks]
        self.texts: list[str] = [c.text for c in chunks]
        self.metadatas: list[dict[str, Any]] = [dict(c.metadata) for c in chunks]
        self.row: dict[str, int] = {cid: i for i, cid in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def empty(cls) -> ChunkTable:
        """A table with no chunks, for an ensemble made only of search-only members."""
        table = cls.__new__(cls)
        table.ids, table.texts, table.metadatas, table.row = [], [], [], {}
        return table

    def rows(self, chunk_ids: Sequence[str]) -> np.ndarray:
        """Row numbers of ``chunk_ids``; :class:`UnknownChunkError` names the first unknown id."""
        try:
            return np.fromiter((self.row[c] for c in chunk_ids), dtype=np.int64, count=len(chunk_ids))
        except KeyError as exc:
            raise UnknownChunkError(f"chunk id {exc.args[0]!r} is not in the index") from None

    def chunk(self, row: int) -> Chunk:
        return Chunk(self.ids[row], self.texts[row], self.metadatas[row])

    def changed(self, upserts: Sequence[Chunk] = (), deletes: Sequence[str] = ()) -> ChunkTable:
        """A new table: ``deletes`` removed, ``upserts`` replacing the rows of their ids or appended.

        ``self`` is left as it was. Only the changes are validated (``upserts`` must be
        valid chunks with distinct ids; an unknown id in ``deletes`` is an
        :class:`UnknownChunkError`), and the new table remembers which of its rows it
        kept from ``self`` unchanged, so :func:`reused_rows` need not compare texts.

        >>> t = ChunkTable(make_chunks(["a", "b", "c"], ids=["x", "y", "z"]))
        >>> u = t.changed(make_chunks(["B", "d"], ids=["y", "w"]), deletes=["x"])
        >>> u.ids, u.texts, reused_rows(t, u).tolist()
        (['y', 'z', 'w'], ['B', 'c', 'd'], [-1, 2, -1])
        """
        upserts = list(upserts)
        if len({c.id for c in upserts}) != len(upserts):
            raise DuplicateIdError("upserts must not repeat a chunk id")
        drop = set(self.rows(list(deletes)).tolist()) if deletes else set()
        replace: dict[int, Chunk] = {}
        appended: list[Chunk] = []
        for c in upserts:
            row = self.row.get(c.id)
            if row is None or row in drop:
                appended.append(c)
            else:
                replace[row] = c
        table = ChunkTable.empty()
        if not drop and not replace:  # only new chunks: the old rows as they are, then the new ones
            table.ids, table.texts, table.metadatas = list(self.ids), list(self.texts), list(self.metadatas)
            src = list(range(len(self.ids)))
        else:
            src = []
            for i, (cid, text, meta) in enumerate(zip(self.ids, self.texts, self.metadatas, strict=True)):
                if i in drop:
                    continue
                new = replace.get(i)
                if new is not None:
                    cid, meta, same = new.id, dict(new.metadata), new.text == text
                    text = new.text
                table.ids.append(cid)
                table.texts.append(text)
                table.metadatas.append(meta)
                src.append(i if new is None or same else -1)
        for c in appended:
            table.ids.append(c.id)
            table.texts.append(c.text)
            table.metadatas.append(dict(c.metadata))
            src.append(-1)
        if not table.ids:
            raise EmptyCorpusError("the change would leave no chunks to index")
        table.row = {cid: i for i, cid in enumerate(table.ids)}
        # a weak reference: a chain of updates must not keep every earlier table alive
        table._origin = (weakref.ref(self), np.asarray(src, dtype=np.int64))
        return table

    def chunks(self) -> list[Chunk]:
        return [self.chunk(i) for i in range(len(self))]

    def save(self, path: Path) -> None:
        """Write ``chunks.jsonl``. Every line is made before the file is opened: metadata JSON cannot hold
        is a :class:`ValidationError` naming the chunk and the key, and leaves no file half written."""
        lines = []
        for cid, text, meta in zip(self.ids, self.texts, self.metadatas, strict=True):
            _check_json(meta, cid)
            row = {"id": cid, "text": text, "metadata": meta}
            line = json.dumps(row, ensure_ascii=False)
            if not line.isascii():
                try:
                    line.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate: UTF-8 cannot hold it, a \u escape can
                    line = json.dumps(row)
            lines.append(line + "\n")
        path.mkdir(parents=True, exist_ok=True)
        with open(path / "chunks.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(lines)

    @classmethod
    def load(cls, path: Path, *, allow_empty: bool = False) -> ChunkTable:
        """The table :meth:`save` wrote into ``path``; ``allow_empty``: a file without chunks is an empty table
        (the save of an ensemble made only of search members) rather than an :class:`EmptyCorpusError`."""
        file = path / "chunks.jsonl"
        try:
            with open(file, encoding="utf-8") as fh:
                rows = [json.loads(line) for line in fh if line.strip()]
            if not rows and allow_empty:
                return cls.empty()
            return cls([Chunk(r["id"], r["text"], r.get("metadata") or {}) for r in rows])
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            # RecursionError: json gives up on deeply nested arrays or objects (a damaged line, not a caller's bug)
            raise CorruptStateError(f"cannot read chunks from {file}: {exc}") from exc


def as_table(chunks: Sequence[Chunk] | ChunkTable) -> ChunkTable:
    """``chunks`` as a validated table; a table is taken as it is (one table can serve every retriever)."""
    return chunks if isinstance(chunks, ChunkTable) else ChunkTable(chunks)


def reused_rows(old: ChunkTable, new: ChunkTable) -> np.ndarray:
    """For each row of ``new``, the row of ``old`` that holds the same id with the same text, else -1.

    >>> old = ChunkTable(make_chunks(["a", "b", "c"], ids=["x", "y", "z"]))
    >>> reused_rows(old, ChunkTable(make_chunks(["c", "B", "d"], ids=["z", "y", "w"]))).tolist()
    [2, -1, -1]
    """
    origin = new._origin
    if origin is not None and origin[0]() is old:  # a table made by ``old.changed(...)`` knows already
        return origin[1].copy()
    rows = (old.row.get(cid, -1) for cid in new.ids)
    src = np.fromiter(rows, dtype=np.int64, count=len(new))
    for i in np.flatnonzero(src >= 0):  # an id kept with a new text is encoded again
        if old.texts[src[i]] != new.texts[i]:
            src[i] = -1
    return src


def kept_then_new(src: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows that reuse an old row (``src >= 0``, from :func:`reused_rows`), the rows that do not, and
    the order that puts a stack of the kept rows, then the new ones, back in table order.

    >>> [a.tolist() for a in kept_then_new(np.array([-1, 4, 2, -1]))]
    [[1, 2], [0, 3], [2, 0, 1, 3]]
    """
    kept, missing = np.flatnonzero(src >= 0), np.flatnonzero(src < 0)
    order = np.empty(src.size, dtype=np.int64)
    order[kept], order[missing] = np.arange(kept.size), kept.size + np.arange(missing.size)
    return kept, missing, order


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    """Write a retriever's settings as ``meta.json``."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")


def read_meta(path: Path, expected_kind: str) -> dict[str, Any]:
    """Read ``meta.json`` and check that it was written by ``expected_kind``."""
    meta = load_meta(path)
    if meta.get("kind") != expected_kind:
        raise CorruptStateError(f"{Path(path) / 'meta.json'} does not describe a {expected_kind!r} retriever")
    return meta


def load_meta(path: Path) -> dict[str, Any]:
    """A saved retriever's ``meta.json``, whatever its kind; damage is a :class:`CorruptStateError`."""
    file = Path(path) / "meta.json"
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply to parse
        raise CorruptStateError(f"cannot read retriever settings from {file}: {exc}") from exc
    if not isinstance(meta, dict):
        raise CorruptStateError(f"{file} holds a {type(meta).__name__}, not retriever settings")
    return meta


def check_format_version(meta: Mapping[str, Any], expected: int, file: Path) -> None:
    """Raise :class:`CorruptStateError` unless ``meta["format_version"]`` is ``expected``.

    A file of another version is laid out differently: reading it as this one would
    misread it without an error.

    >>> check_format_version({"format_version": 2}, 1, Path("meta.json"))
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: meta.json: unknown format_version 2; this rlfb reads 1
    """
    version = meta.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version != expected:
        raise CorruptStateError(f"{file}: unknown format_version {version!r}; this rlfb reads {expected}")


def saved_positive_int(meta: Mapping[str, Any], key: str, default: int, file: Path) -> int:
    """``meta[key]`` (``default`` when absent), checked as a positive JSON integer.

    The value came from a file, so a bad one is :class:`CorruptStateError` naming the file: the
    constructor's :class:`ValidationError` would blame the caller, and ``int()`` would take ``"7"``
    or ``7.9`` and raise a bare ``ValueError`` on ``"x"``.

    >>> saved_positive_int({"batch_size": 8}, "batch_size", 64, Path("meta.json"))
    8
    >>> saved_positive_int({"batch_size": "x"}, "batch_size", 64, Path("meta.json"))
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: meta.json: batch_size must be a positive integer, got 'x'
    """
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CorruptStateError(f"{file}: {key} must be a positive integer, got {value!r}")
    return value


def model_text(text: str) -> str:
    """``text`` as a model's tokenizer can take it: a lone surrogate (valid in a Python string, not in
    UTF-8, and refused by the tokenizers) becomes ``?``; any other text is returned as it is.

    >>> model_text("wing " + chr(0xD800) + " slipstream"), model_text("café")
    ('wing ? slipstream', 'café')
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def check_query(query: object) -> str:
    """Return ``query`` if it is a string, else raise :class:`ValidationError`."""
    if not isinstance(query, str):
        raise ValidationError(f"query must be a string, got {type(query).__name__}")
    return query


def check_texts(texts: object, what: str = "texts") -> list[str]:
    """Return ``texts`` as a list of strings; one bare string is rejected (it is not a sequence of texts).

    >>> check_texts(("a", "b"))
    ['a', 'b']
    >>> check_texts("ab")
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: texts must be a sequence of strings, not one string
    """
    if isinstance(texts, str):
        raise ValidationError(f"{what} must be a sequence of strings, not one string")
    try:
        out = list(texts)  # type: ignore[call-overload]
    except TypeError:
        raise ValidationError(f"{what} must be a sequence of strings, got {type(texts).__name__}") from None
    for t in out:
        if not isinstance(t, str):
            raise ValidationError(f"{what} must be strings, got {type(t).__name__}")
    return out


class CorpusRetriever:
    """Shared half of every retriever: id bookkeeping and everything derived from the score vector.

    A subclass sets :attr:`name`, stores a :class:`ChunkTable` in ``self._table``
    when it indexes, and implements :meth:`score_all_batch`. :meth:`score_all`,
    :meth:`search`, :meth:`search_batch` and :meth:`score` then all read the same
    score vector, so :meth:`score` returns exactly the values :meth:`search` reports.
    """

    name: str = ""
    _table: ChunkTable | None = None

    @property
    def ids(self) -> list[str]:
        """Chunk ids in index order (the order of every score vector); do not mutate."""
        return self._table.ids if self._table is not None else []

    @property
    def texts(self) -> list[str]:
        """Chunk texts in index order, as indexed; do not mutate."""
        return self._table.texts if self._table is not None else []

    def __len__(self) -> int:
        return len(self._table) if self._table is not None else 0

    def _require_table(self) -> ChunkTable:
        if self._table is None:
            raise EmptyCorpusError(f"the {self.name} retriever has no index yet: call index(chunks) first")
        return self._table

    def _save_with(self, path: str | Path, write_index: Callable[[Path], None], meta: dict[str, Any]) -> None:
        """The built-in retrievers' :meth:`save`: the chunks, then ``write_index(folder)``, then ``meta.json``
        (``kind`` added), into a new folder beside ``path`` swapped in when complete (:func:`saving_into`).

        So a save that fails (metadata JSON cannot hold: a :class:`ValidationError` naming the chunk, checked
        first, before any array is written) leaves an earlier save as it was. ``path`` must be new, empty, or
        an earlier save.
        """
        path = folder_path(path)  # None, a NUL or a lone surrogate: a named error, not pathlib's bare one
        table = self._require_table()
        with saving_into(path, marker="meta.json", what="retriever", names=SAVED_NAMES) as tmp:
            table.save(tmp)
            write_index(tmp)
            write_meta(tmp, {"kind": self.name, **meta})

    def score_all_batch(self, queries: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        raise NotImplementedError

    if TYPE_CHECKING:  # every subclass defines it; declared for the checker only, so nothing changes at run time

        def index(self, chunks: Sequence[Chunk], *, show_progress: bool = False) -> Self: ...

    def updated(self, chunks: Sequence[Chunk] | ChunkTable, *, show_progress: bool = False) -> Self:
        """A retriever with these settings over ``chunks``; ``self`` is left as it was.

        This one indexes a copy from scratch; retrievers that can reuse what they
        computed for chunks they already index (same id, same text) override it.
        """
        return copy.copy(self).index(as_table(chunks).chunks(), show_progress=show_progress)

    def score_all(self, query: str) -> np.ndarray:
        """Scores of every indexed chunk for ``query``, shape ``(len(self),)``, aligned with :attr:`ids`."""
        return self.score_all_batch([check_query(query)])[0]

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        """The ``k`` best ``(chunk_id, score)`` pairs, best first (ties by index order)."""
        validate_k(k)
        scores = self.score_all(query)
        ids = self._require_table().ids
        return [(ids[i], float(scores[i])) for i in top_k(scores, k)]

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[tuple[str, float]]]:
        """:meth:`search` for several queries, scored in one batch."""
        validate_k(k)
        matrix = self.score_all_batch(queries)
        ids = self._require_table().ids
        return [[(ids[i], float(row[i])) for i in top_k(row, k)] for row in matrix]

    def score(self, query: str, chunk_ids: Sequence[str]) -> np.ndarray:
        """Raw scores of ``chunk_ids``, the very values :meth:`search` reports.

        An id that is not indexed raises :class:`UnknownChunkError`.
        """
        rows = self._require_table().rows(check_texts(chunk_ids, "chunk_ids"))
        return self.score_all(query)[rows]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_chunks={len(self)})"


def _check_json(value: Any, chunk_id: str, where: str = "", _open: frozenset[int] = frozenset()) -> None:
    """Refuse metadata JSON cannot hold as it is, as a :class:`ValidationError` naming the chunk and the key:
    a key that is not a string (``{1: "a", "1": "b"}`` would come back as one key), a container that holds
    itself, or a value of another type than JSON's (a date: ``json.dumps`` raised a bare TypeError).

    >>> import datetime
    >>> _check_json({"tags": ["a"], "published": datetime.date(2024, 5, 1)}, "c1")
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: chunk 'c1': metadata['published'] is a date, which JSON cannot hold
    """
    if value is None or isinstance(value, (str, float)):
        return
    if isinstance(value, int):  # bool is an int
        try:
            int.__str__(value)
        except ValueError:  # json.dumps raised it bare: "Exceeds the limit (4300 digits) for integer string ..."
            raise ValidationError(f"chunk {chunk_id!r}: metadata{where} is an integer of more digits than Python "
                                  "writes as text") from None
        return
    if not isinstance(value, (dict, list, tuple)):  # what json.dumps writes, and only that
        raise ValidationError(
            f"chunk {chunk_id!r}: metadata{where} is a {type(value).__name__}, which JSON cannot hold"
        )
    if id(value) in _open:
        raise ValidationError(f"chunk {chunk_id!r}: its metadata holds itself (a circular reference)")
    from rlfb.store.codec import MAX_DEPTH  # here: importing rlfb stays light (rlfb.store loads on first use)

    if len(_open) >= MAX_DEPTH:  # json.loads recurses: deeper nesting was a RecursionError at save or load
        raise ValidationError(f"chunk {chunk_id!r}: its metadata is nested deeper than {MAX_DEPTH} levels")
    inside = _open | {id(value)}
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValidationError(f"chunk {chunk_id!r}: metadata key {k!r} is not a string")
            _check_json(v, chunk_id, f"{where}[{k!r}]", inside)
    else:
        for i, v in enumerate(value):
            _check_json(v, chunk_id, f"{where}[{i}]", inside)
