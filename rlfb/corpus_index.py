"""An ensemble's corpus index: its retrievers built over a chunk table, at first and after each change.

:meth:`FeedbackEnsemble.from_chunks <rlfb.FeedbackEnsemble.from_chunks>` indexes the chunks with each
retriever (:func:`index_with`); the ensemble takes the retrievers by name (:func:`retriever_map`) and checks
that they index its chunk table in its order (:func:`indexed_table`). ``add_chunks`` and ``delete_chunks``
check what they are given (:func:`checked_chunks`, :func:`checked_ids`), build the changed
:class:`~rlfb.retrievers.base.ChunkTable` (:func:`removal` for a delete) and each corpus retriever over it
beside the live ones (:func:`rebuilt`), which the ensemble then swaps in whole under its lock.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlfb.errors import ValidationError
from rlfb.retrievers.base import ChunkTable, Retriever
from rlfb.types import Chunk, make_chunks


def index_with(
    table: ChunkTable,
    retrievers: Sequence[str | Retriever],
    options: Mapping[str, Mapping[str, Any]],
    show_progress: bool,
) -> dict[str, Retriever]:
    """``table`` indexed with each named retriever (``options``: its keyword arguments by name) or given,
    unindexed retriever instance."""
    from rlfb.retrievers import make_retriever

    specs = [retrievers] if isinstance(retrievers, str) else list(retrievers)  # "bm25" is one name
    check_retriever_options(specs, options)  # before anything is indexed
    built: dict[str, Retriever] = {}
    for spec in specs:
        r = make_retriever(spec, **options.get(spec, {})) if isinstance(spec, str) else spec
        if r.name in built:
            raise ValidationError(f"retriever {r.name!r} is listed twice")
        r.index(table.chunks(), show_progress=show_progress)
        built[r.name] = r
    return built


def check_retriever_options(retrievers: Sequence[str | Retriever], options: Mapping[str, Any]) -> None:
    """Refuse ``retriever_options`` that name no retriever of ``retrievers`` built by name, or whose value is
    not a mapping: such options were ignored, so a typo (``"bm52"``) or options for a retriever handed over
    as an instance silently changed nothing (``FeedbackEnsemble.load`` refused them already).

    >>> check_retriever_options(["bm25"], {"bm52": {}})
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: retriever_options names ['bm52'], but the retrievers built by name are ['bm25'] ...
    """
    specs = [retrievers] if isinstance(retrievers, str) else list(retrievers)
    named = [spec for spec in specs if isinstance(spec, str)]
    given = sorted(str(name) for name in options if name not in named)
    if given:
        raise ValidationError(f"retriever_options names {given}, but the retrievers built by name are {named} "
                              "(a retriever given as an instance takes its options in its own constructor)")
    for name, opts in options.items():
        if not isinstance(opts, Mapping):
            raise ValidationError(f"retriever_options[{name!r}] must be a mapping of keyword arguments by name")


def retriever_map(
    retrievers: Mapping[str, Retriever] | Sequence[Retriever], *, allow_empty: bool = False
) -> dict[str, Retriever]:
    """Retrievers by name, given by name or as a sequence (each one's ``name``; two of one name are refused)."""
    if isinstance(retrievers, Mapping):
        out = dict(retrievers)
    else:
        out = {}
        for r in retrievers:
            if r.name in out:
                raise ValidationError(f"two retrievers are named {r.name!r}")
            out[r.name] = r
    if not out and not allow_empty:
        raise ValidationError("an ensemble needs at least one retriever or member")
    return out


def indexed_table(chunks: Sequence[Chunk] | ChunkTable | None, retrievers: Mapping[str, Retriever]) -> ChunkTable:
    """The table of ``chunks`` (empty for an ensemble of search members alone), which every corpus retriever
    must index in its order."""
    if isinstance(chunks, ChunkTable):
        table = chunks
    elif chunks is None and not retrievers:
        table = ChunkTable.empty()
    elif chunks is None:
        raise ValidationError("pass the indexed chunks together with the corpus retrievers")
    else:
        table = ChunkTable(chunks)
    for name, r in retrievers.items():
        if list(r.ids) != table.ids:
            raise ValidationError(f"retriever {name!r} does not index the ensemble's chunks in the same order")
        # the ids alone were checked: a retriever indexed on other texts under the same ids (an older copy, a
        # damaged save's chunks.jsonl) scored one text while the hits showed another
        texts = getattr(r, "texts", None)  # a retriever of the caller's own may not say
        if texts is not None and texts is not table.texts and list(texts) != table.texts:
            at = next(i for i, (a, b) in enumerate(zip(texts, table.texts, strict=True)) if a != b)
            raise ValidationError(f"retriever {name!r} indexes another text for chunk {table.ids[at]!r} than the "
                                  "ensemble's chunks: index it with the same chunks")
    return table


def checked_chunks(chunks: Iterable[Chunk]) -> list[Chunk]:
    """The chunks ``add_chunks`` is given, as a list of validated chunks with distinct ids (``[]``: none)."""
    chunks = list(chunks)
    if not chunks:
        return []
    for c in chunks:
        if not isinstance(c, Chunk):
            raise ValidationError(f"add_chunks takes Chunk objects, got {type(c).__name__}")
    # validates, rejects repeated ids
    return make_chunks([c.text for c in chunks], [c.id for c in chunks], [c.metadata for c in chunks])


def checked_ids(chunk_ids: Iterable[str]) -> set[str]:
    """The ids ``delete_chunks`` is given, as a set of strings."""
    if isinstance(chunk_ids, str):
        raise ValidationError("chunk_ids must be a sequence of ids, not one string")
    if not isinstance(chunk_ids, Iterable):
        raise ValidationError(f"chunk_ids must be a sequence of ids, got {type(chunk_ids).__name__}")
    ids = list(chunk_ids)
    for c in ids:
        if not isinstance(c, str):
            raise ValidationError(f"chunk ids are strings, got {type(c).__name__} {c!r}")
    return set(ids)


def removal(table: ChunkTable, gone: set[str]) -> tuple[ChunkTable, list[Chunk]]:
    """``table`` without the chunks ``gone`` (an unknown id is an :class:`~rlfb.errors.UnknownChunkError`),
    and those chunks."""
    rows = table.rows(sorted(gone))  # names the first unknown id
    if len(gone) == len(table):
        raise ValidationError("cannot delete every indexed chunk: the ensemble would have nothing to search")
    changed = table.changed(deletes=sorted(gone))
    return changed, [table.chunk(int(r)) for r in rows]


def rebuilt(retrievers: Mapping[str, Retriever], table: ChunkTable, show_progress: bool) -> dict[str, Retriever]:
    """A copy of each corpus retriever indexing ``table``, the live ones left untouched."""
    if not retrievers:
        raise ValidationError("this ensemble has no corpus retrievers to index chunks with")
    built = {name: _updated(r, table, show_progress) for name, r in retrievers.items()}
    for name, r in built.items():
        if list(r.ids) != table.ids:
            raise ValidationError(f"retriever {name!r} did not index the chunks in the order given")
    return built


def _updated(r: Retriever, table: ChunkTable, show_progress: bool) -> Retriever:
    """``r.updated(table)`` (which reuses unchanged chunks' work), else a copy of ``r`` indexed afresh."""
    update = getattr(r, "updated", None)
    if update is None:  # a retriever of the user's own that only follows the Retriever protocol
        return copy.copy(r).index(table.chunks(), show_progress=show_progress)
    return update(table, show_progress=show_progress)
