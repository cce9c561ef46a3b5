"""Offline evaluation of each retriever alone and of a fixed fusion, on judged queries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from rlfb.metrics import evaluate_run
from rlfb.retrievers.base import top_k

__all__ = ["evaluate_ensemble", "MEASURES"]

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
) -> dict[str, dict[str, float]]:
    """Metrics of each retriever alone (all documents ranked) and of the greedy fused ranking.

    Returns ``{"bm25": {...}, "dense": {...}, ..., "fused": {...}}``. Nothing is
    logged and nothing is explored: this is the policy's greedy ranking. Runs are
    ``depth`` deep, or as deep as the deepest cut-off in ``measures``; the fused run
    ranks the pool the ensemble serves ``retrieve(query, k)`` from (each retriever's
    ``max(candidate_k, k)`` best, and the members'), so it is shorter where that pool is.
    """
    depth = max([depth, *(k for _, k in measures)])  # --k 200 was scored on runs cut at 100
    ids = ensemble.chunks.ids
    qids = list(queries)
    texts = [queries[q] for q in qids]
    runs: dict[str, dict[str, list[str]]] = {}
    for name, retriever in ensemble.retrievers.items():
        scores = retriever.score_all_batch(texts, show_progress=show_progress)
        runs[name] = {q: [ids[i] for i in top_k(row, depth)] for q, row in zip(qids, scores, strict=True)}
    fused: dict[str, list[str]] = {}
    for q, text in tqdm(list(zip(qids, texts, strict=True)), desc="fused", disable=not show_progress):
        # the pool retrieve(k) serves from: retrieve(k=depth) would widen it to the run's depth (Recall@100)
        ctx = ensemble.context(text, k=k)
        fused[q] = ensemble.rank_context(ctx, depth, explore=False, log=False).chunk_ids
    runs["fused"] = fused
    return {name: evaluate_run(run, qrels, measures) for name, run in runs.items()}
