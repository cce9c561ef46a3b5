"""Offline evaluation of each retriever alone and of a fixed fusion, on judged queries."""

from __future__ import annotations

import numbers
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from rlfb._progress import progress
from rlfb.errors import ValidationError
from rlfb.metrics import evaluate_run, run_to_ranking

__all__ = ["evaluate_ensemble", "trec_top", "MEASURES"]

MEASURES: tuple[tuple[str, int], ...] = (("ndcg", 10), ("mrr", 10), ("p", 10), ("recall", 100))


def evaluate_ensemble(
    ensemble: Any,
    queries: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    depth: int = 100,
    measures: Sequence[tuple[str, int]] = MEASURES,
    show_progress: bool = False,
    k: int = 10,
    left_out: Mapping[str, Collection[str]] | None = None,
) -> dict[str, dict[str, float]]:
    """Metrics of each retriever alone (all documents ranked) and of the greedy fused ranking.

    Returns ``{"bm25": {...}, "dense": {...}, ..., "fused": {...}}``. Nothing is
    logged and nothing is explored: this is the policy's greedy ranking. Runs are
    ``depth`` deep, or as deep as the deepest cut-off in ``measures``; the fused run
    ranks the pool the ensemble serves ``retrieve(query, k)`` from (each retriever's
    ``max(candidate_k, k)`` best, and the members'), so it is shorter where that pool is.

    Each run is ordered as trec_eval orders it (:func:`rlfb.metrics.run_to_ranking`: score descending,
    then document id descending), so that the metrics equal ``pytrec_eval``'s on the same scores; see
    :func:`trec_top` for ties at the run's depth.

    ``left_out``: for a query id, the chunk ids its runs leave out, as if they were not in the corpus (a query's
    own document: :meth:`rlfb.datasets.BeirDataset.own_documents`).
    """
    from rlfb.candidates import without_candidates

    depth = max([depth, *(k for _, k in measures)])  # --k 200 was scored on runs cut at 100
    left_out = left_out or {}
    ids = ensemble.chunks.ids
    qids = list(queries)
    texts = [queries[q] for q in qids]
    runs: dict[str, dict[str, list[str]]] = {}
    for name, retriever in ensemble.retrievers.items():
        scores = retriever.score_all_batch(texts, show_progress=show_progress)
        runs[name] = {q: _without(trec_top(ids, row, depth + len(left_out.get(q, ()))), left_out.get(q), depth)
                      for q, row in zip(qids, scores, strict=True)}
    fused: dict[str, list[str]] = {}
    for q, text in progress(list(zip(qids, texts, strict=True)), desc="fused", disable=not show_progress):
        # the pool retrieve(k) serves from: retrieve(k=depth) would widen it to the run's depth (Recall@100)
        ctx = ensemble.context(text, k=k)
        if left_out.get(q):
            ctx = without_candidates(ctx, left_out[q], fusion=ensemble.fusion, rrf_c=ensemble.rrf_c)
        # the whole pool, ranked greedily (by fused score alone), so that ties at the depth are cut in trec order
        hits = ensemble.rank_context(ctx, max(1, len(ctx.candidate_ids)), explore=False, log=False).hits
        fused[q] = trec_top([h.chunk_id for h in hits], np.array([h.score for h in hits], dtype=float), depth)
    runs["fused"] = fused
    return {name: evaluate_run(run, qrels, measures) for name, run in runs.items()}


def _without(run: list[str], left_out: Collection[str] | None, depth: int) -> list[str]:
    """``run`` without the ids ``left_out``, cut at ``depth``."""
    return run[:depth] if not left_out else [d for d in run if d not in left_out][:depth]


def trec_top(ids: Sequence[str], scores: np.ndarray, depth: int) -> list[str]:
    """The best ``depth`` of ``ids`` by ``scores``, in trec_eval's order: score descending, then id descending.

    Documents that tie with the last one kept are ordered with the others before the cut, so the cut
    keeps the ids trec_eval would rank first, not the first in corpus order (``top_k``'s tie-break).
    A NaN score ranks last.

    >>> trec_top(["a", "b", "c", "d"], np.array([0.5, 1.0, 0.5, 0.5]), 2)
    ['b', 'd']
    >>> trec_top(["a", "b"], np.array([1.0, 0.5]), 0)  # numpy's partition raised ValueError here
    []
    """
    if isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or depth < 0:
        raise ValidationError(f"depth must be a non-negative int, got {depth!r}")
    if depth == 0:
        return []
    s = np.where(np.isnan(scores), -np.inf, np.asarray(scores, dtype=float))
    n = s.shape[0]
    if depth < n:
        kth = np.partition(s, n - depth)[n - depth]  # the depth-th best score; every tie with it is a candidate
        keep = np.flatnonzero(s >= kth)
    else:
        keep = np.arange(n)
    return run_to_ranking({ids[i]: float(s[i]) for i in keep})[:depth]
