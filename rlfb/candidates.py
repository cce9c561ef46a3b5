"""The candidate pool: the chunks a question's ranking chooses among, and the hits a ranking of them gives.

:meth:`rlfb.FeedbackEnsemble.context` pools each corpus retriever's best rows and each search member's
results, every candidate scored by every corpus retriever (:func:`pool_rows`, :func:`add_member_candidates`,
:func:`score_chunks`); :meth:`~rlfb.FeedbackEnsemble.rerank_context` scores the chunks a caller gives
(:func:`rerank_scores`). The raw score matrix, each retriever's ranks and which retrievers proposed each
candidate make the :class:`~rlfb.policies.base.Context` the learner ranks (:func:`make_context`), and
:func:`make_hits` turns its ranking into the :class:`~rlfb.types.Hit` objects handed out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlfb.errors import ValidationError
from rlfb.fusion import normalize, rank_matrix, shared_ranks
from rlfb.members import SearchMember
from rlfb.policies.base import Context
from rlfb.retrievers.base import ChunkTable, Retriever, dense_retriever, top_k
from rlfb.types import Chunk, Hit, check_chunk, copy_metadata

Pool = tuple[list[str], np.ndarray, np.ndarray, np.ndarray]  # ids, raw, ranks, proposed: one row a candidate


def pool_rows(
    query: str, depth: int, table: ChunkTable, retrievers: Mapping[str, Retriever], embedding_strs: tuple[str, ...]
) -> Pool:
    """The union of each corpus retriever's best ``depth`` rows of ``table``, each scored by every retriever.

    Returns the candidates' ids, their raw scores, each retriever's rank of them and whether it proposed
    them (``(n_cand, n_ret)`` each).
    """
    full = [retriever_scores(r, query, embedding_strs, lambda r, q: r.score_all(q)) for r in retrievers.values()]
    n_docs = len(table)
    tops = [top_k(s, min(depth, n_docs)) for s in full]
    rows = np.unique(np.concatenate(tops)) if tops else np.zeros(0, dtype=np.int64)
    ids = [table.ids[int(r)] for r in rows]
    raw = np.stack([s[rows] for s in full], axis=1) if full else np.zeros((len(rows), 0))
    ranks = np.zeros_like(raw)
    proposed = np.zeros(raw.shape, dtype=bool)  # in the retriever's own top list (a pool of depth k), scored
    for j, (s, top) in enumerate(zip(full, tops, strict=True)):
        at = np.searchsorted(rows, top)  # rows is sorted, so this finds each top row
        # a chunk scored 0 (for BM25 and SPLADE, no term in common) fills a top list longer than the matches:
        # its retriever did not propose it
        proposed[at, j] = s[top] != 0
        # the 1-based rank inside the retriever's own top list, then candidates below that list in
        # their order after it; tied scores share a rank (BM25's zeros are not ranked by corpus position)
        outside = np.setdiff1d(np.arange(len(rows)), at, assume_unique=True)
        outside = outside[np.argsort(-s[rows[outside]], kind="stable")]
        order = np.concatenate([at, outside])
        ranks[order, j] = shared_ranks(s[rows[order]])
    return ids, raw, ranks, proposed


def add_member_candidates(
    query: str,
    depth: int,
    pool: Pool,
    table: ChunkTable,
    retrievers: Mapping[str, Retriever],
    members: Mapping[str, SearchMember],
    *,
    rrf_c: float,
    keep_extra: Callable[[Chunk], None],
    embedding_strs: tuple[str, ...] = (),
) -> Pool:
    """``pool`` with each search member's results: its chunks not pooled yet join it (those outside the index
    are handed to ``keep_extra``), scored by the corpus retrievers, and each member's scores are a column."""
    ids, raw, ranks, proposed = pool
    results = [m.search(query, depth, c=rrf_c) for m in members.values()]
    known = set(ids)
    new: list[Chunk] = []
    for found in results:
        for chunk, _ in found:
            if chunk.id not in known:
                known.add(chunk.id)
                new.append(chunk)
                if chunk.id not in table.row:
                    keep_extra(chunk)
    if new:
        # scored as the pooled candidates are: a dense column of two scales would mis-rank in any fusion
        corpus = score_chunks(query, new, table, retrievers, embedding_strs)
        raw = np.vstack([raw, corpus])
        # below every ranked candidate, in score order
        tail = rank_matrix(corpus) + (ranks.max(axis=0) if ranks.size else 0)
        ranks = np.vstack([ranks, tail])
        proposed = np.vstack([proposed, np.zeros((len(new), proposed.shape[1]), dtype=bool)])  # scored only
        ids = ids + [c.id for c in new]
    position = {cid: i for i, cid in enumerate(ids)}
    member_cols = np.full((len(ids), len(results)), np.nan)
    for j, found in enumerate(results):
        for chunk, score in found:
            member_cols[position[chunk.id], j] = score
    return (ids, np.hstack([raw, member_cols]), np.hstack([ranks, rank_matrix(member_cols)]),
            np.hstack([proposed, ~np.isnan(member_cols)]))


def score_chunks(
    query: str, chunks: Sequence[Chunk], table: ChunkTable, retrievers: Mapping[str, Retriever],
    embedding_strs: tuple[str, ...] = (), by_text: Collection[str] = (),
) -> np.ndarray:
    """Raw scores of ``chunks`` by each corpus retriever: indexed ids by id, others (and the ids in
    ``by_text``) by their text."""
    out = np.zeros((len(chunks), len(retrievers)))
    at_inside = [i for i, c in enumerate(chunks) if c.id in table.row and c.id not in by_text]
    at_outside = [i for i, c in enumerate(chunks) if c.id not in table.row or c.id in by_text]
    ids = [chunks[i].id for i in at_inside]
    texts = [chunks[i].text for i in at_outside]
    for j, r in enumerate(retrievers.values()):
        if ids:
            out[at_inside, j] = retriever_scores(r, query, embedding_strs, lambda r, q: r.score(q, ids))
        if texts:
            out[at_outside, j] = retriever_scores(r, query, embedding_strs, lambda r, q: r.score_texts(q, texts))
    return out


def rerank_scores(
    query: str,
    chunks: Sequence[Chunk],
    table: ChunkTable,
    retrievers: Mapping[str, Retriever],
    n_members: int,
    embedding_strs: tuple[str, ...],
    keep_extra: Callable[[Chunk], None],
) -> tuple[np.ndarray, dict[str, Chunk]]:
    """The raw scores of chunks given to re-rank (a NaN column for each of ``n_members`` members), and the chunks
    given under an indexed id with another text (edited since), scored from the text given; chunks outside the
    index are handed to ``keep_extra``."""
    edited: dict[str, Chunk] = {}
    for c in chunks:
        row = table.row.get(c.id)
        if row is None:
            keep_extra(c)
        elif table.texts[row] != c.text:
            # scored by id, it would be ranked (and its scores reported) by a text the caller no longer has
            edited[c.id] = c
    raw = score_chunks(query, chunks, table, retrievers, embedding_strs, by_text=edited)
    if n_members:  # members did not see these chunks: they contribute nothing
        raw = np.hstack([raw, np.full((len(chunks), n_members), np.nan)])
    return raw, edited


def make_context(
    query: str, ids: Sequence[str], raw: np.ndarray, ranks: np.ndarray, session_id: str | None,
    proposed: np.ndarray | None = None, *, retrievers: tuple[str, ...], fusion: str, rrf_c: float,
    embed: Callable[[str], np.ndarray | None], candidate_embeddings: np.ndarray | None = None,
) -> Context:
    """The :class:`~rlfb.policies.base.Context` of a scored pool: normalised by ``fusion``, with the question's
    features, type and embedding (``embed``), and the candidates' embeddings where there are any."""
    from rlfb.features import query_features, query_type

    feats = query_features(query)
    return Context(
        query=query,
        retrievers=retrievers,
        candidate_ids=tuple(ids),
        raw=raw,
        normalized=normalize(raw, fusion, ranks=ranks, c=rrf_c),
        features=feats,
        query_type=query_type(feats),
        query_embedding=embed(query),
        session_id=session_id,
        ranks=ranks,
        proposed=proposed,
        candidate_embeddings=candidate_embeddings,
        rrf_c=rrf_c if fusion == "rrf" else None,
    )


def without_candidates(ctx: Context, left_out: Collection[str], *, fusion: str, rrf_c: float) -> Context:
    """``ctx`` as if the chunks ``left_out`` had not been in the corpus: their rows gone, each retriever's ranks
    of the others closed up, and the scores normalised again over what is left. An evaluation leaves a query's
    own document out of its ranking so (:attr:`rlfb.datasets.BeirDataset.query_documents`, BEIR's
    ``ignore_identical_ids``); ``ctx`` itself when none of them is a candidate.

    >>> raw = np.array([[9.0, 0.9], [4.0, 0.5], [1.0, 0.7]])
    >>> ctx = make_context("q", ["self", "a", "b"], raw, np.array([[1.0, 1.0], [2.0, 3.0], [3.0, 2.0]]), None,
    ...                    retrievers=("bm25", "dense"), fusion="minmax", rrf_c=60.0, embed=lambda q: None)
    >>> out = without_candidates(ctx, {"self"}, fusion="minmax", rrf_c=60.0)
    >>> out.candidate_ids, out.ranks.tolist(), out.normalized.tolist()
    (('a', 'b'), [[1.0, 2.0], [2.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]])
    """
    drop = np.array([c in left_out for c in ctx.candidate_ids], dtype=bool)
    if not drop.any():
        return ctx
    keep = ~drop
    raw = ctx.raw[keep]
    ranks = None
    if ctx.ranks is not None:
        # a candidate moves up one place in a retriever's ranking for each chunk left out above it there (tied
        # ones share a place, and keep it)
        gone = ctx.ranks[drop]
        with np.errstate(invalid="ignore"):
            above = (gone[None, :, :] < ctx.ranks[keep][:, None, :]).sum(axis=1)
        ranks = ctx.ranks[keep] - above

    def rows(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[keep]

    return dataclasses.replace(
        ctx, candidate_ids=tuple(c for c, d in zip(ctx.candidate_ids, drop, strict=True) if not d), raw=raw,
        normalized=normalize(raw, fusion, ranks=ranks, c=rrf_c), ranks=ranks, proposed=rows(ctx.proposed),
        offsets=rows(ctx.offsets), candidate_embeddings=rows(ctx.candidate_embeddings),
    )


def candidate_vectors(
    retrievers: Mapping[str, Retriever], ids: Sequence[str], edited: Collection[str] = ()
) -> np.ndarray | None:
    """The dense retriever's embeddings of the candidates ``ids`` (``None`` without one); a zero row for a chunk
    outside its index, and for one given with a text other than the indexed one (``edited``)."""
    vectors = getattr(dense_retriever(retrievers), "vectors", None)
    if vectors is None:
        return None
    out = vectors(list(ids))
    for i, c in enumerate(ids):
        if c in edited:
            out[i] = 0.0
    return out


def make_hits(
    ctx: Context,
    ranking: Any,
    *,
    table: ChunkTable | None,
    given: Mapping[str, Chunk],
    chunk: Callable[[str], Chunk],
    candidate_k: int,
) -> list[Hit]:
    """The hits of ``ranking``: each chunk as given to re-rank (``given``), else as the ``table`` the context was
    scored against holds it, else as ``chunk`` finds it (a member's find, a chunk deleted since)."""
    names = ctx.retrievers
    # which retrievers' own top lists held each candidate; a context built elsewhere may lack the mask
    if ctx.proposed is not None:
        proposed = ctx.proposed
    else:
        assert ctx.ranks is not None  # every context the ensemble ranks is made with ranks (make_context)
        proposed = ctx.ranks <= candidate_k
    hits = []
    for rank, idx in enumerate(ranking.order, start=1):
        idx = int(idx)
        found = given.get(ctx.candidate_ids[idx])
        if found is None:
            row = None if table is None else table.row.get(ctx.candidate_ids[idx])
            found = chunk(ctx.candidate_ids[idx]) if table is None or row is None else table.chunk(row)
        hits.append(
            Hit(
                chunk_id=found.id,
                text=found.text,
                score=float(ranking.fused[idx]),
                rank=rank,
                scores={n: _finite_or_none(ctx.raw[idx, j]) for j, n in enumerate(names)},
                normalized={n: float(ctx.normalized[idx, j]) for j, n in enumerate(names)},
                metadata=copy_metadata(found.metadata),  # a caller changing it must not change the index
                proposed_by=tuple(n for j, n in enumerate(names) if proposed[idx, j]),
                confidence=float(ranking.confidence[idx]) if ranking.confidence is not None else None,
                memory=float(ranking.memory[idx]) if ranking.memory is not None else None,
            )
        )
    return hits


def check_query(query: object) -> str:
    if not isinstance(query, str):
        raise ValidationError(f"query must be a string, got {type(query).__name__}")
    return query


def check_embedding_strs(strs: Sequence[str] | None) -> tuple[str, ...]:
    """The texts to embed in place of the question (``()``: the question itself).

    Blank ones are left out, not refused: a HyDE transform passes its LLM's answer on as it is, and
    LlamaIndex's own retrievers take an empty one.
    """
    if strs is None:
        return ()
    if isinstance(strs, (str, bytes)) or not isinstance(strs, Iterable):
        raise ValidationError(f"embedding_strs must be a sequence of strings, got {type(strs).__name__}")
    out = tuple(strs)
    for s in out:
        if not isinstance(s, str):
            raise ValidationError(f"embedding_strs must hold strings, got {s!r}")
    return tuple(s for s in out if s.strip())


def check_rerank_chunks(chunks: Any) -> list[Chunk]:
    """``chunks`` to re-rank as a list, each id once (the first chunk given with it); else ValidationError."""
    if chunks is None or isinstance(chunks, (str, Chunk)) or not isinstance(chunks, Iterable):
        raise ValidationError(f"chunks must be a sequence of Chunk objects, got {type(chunks).__name__}")
    unique: dict[str, Chunk] = {}
    for c in chunks:
        unique.setdefault(check_chunk(c, "rerank").id, c)
    return list(unique.values())


def retriever_scores(
    r: Retriever, query: str, embedding_strs: tuple[str, ...], score: Callable[[Retriever, str], Any]
) -> np.ndarray:
    """``score(r, query)`` as float64; for a retriever that embeds queries, the mean over ``embedding_strs``
    where there are any (normalised embeddings: the mean similarity is the averaged embedding's, scaled)."""
    if embedding_strs and getattr(r, "embeds_queries", False):
        out = np.mean([np.asarray(score(r, s), dtype=np.float64) for s in embedding_strs], axis=0)
    else:
        out = np.asarray(score(r, query), dtype=np.float64)
    if not np.all(np.isfinite(out)):
        # rlfb's own retrievers give none; a custom one's NaN or inf was fused one way by min-max (an error, or
        # a NaN taken as missing) and another by RRF (an inf ranked first, its score shown as None)
        bad = out[~np.isfinite(out)][0]
        raise ValidationError(f"retriever {getattr(r, 'name', type(r).__name__)!r} scored {query!r} {bad}: a "
                              "corpus retriever's scores must be finite")
    return out


def _finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None
