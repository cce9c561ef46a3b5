"""Ranking metrics with trec_eval semantics: P@k, Recall@k, MRR@k and graded nDCG@k.

Relevance grades come from qrels (``{doc_id: grade}``); a grade above 0 is
relevant. nDCG uses linear gains and a ``log2(rank + 1)`` discount, as
trec_eval's ``ndcg_cut`` does, so the figures equal ``pytrec_eval`` and
``ir-measures`` on the same runs (``tests/test_metrics.py`` checks this), but
for scores closer than float32 can tell apart: those keep their float64 order
here, where pytrec_eval stores scores as float32 and breaks the tie by doc id
(``{"a": 0.3 + 1e-8, "b": 0.3}`` ranks ``a`` first here, ``b`` there).

>>> qrel = {"d1": 2, "d3": 1}
>>> round(ndcg_at_k(["d1", "d2", "d3"], qrel, 10), 4)
0.9502
>>> precision_at_k(["d1", "d2", "d3"], qrel, 2), recall_at_k(["d2", "d3"], qrel, 10), mrr_at_k(["d2", "d3"], qrel, 10)
(0.5, 0.5, 0.5)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Real

from rlfb.errors import ValidationError
from rlfb.types import check_choice, validate_k

__all__ = [
    "precision_at_k",
    "recall_at_k",
    "mrr_at_k",
    "ndcg_at_k",
    "METRICS",
    "evaluate_run",
    "run_to_ranking",
]

Qrel = Mapping[str, int]


def _top(ranking: Sequence[str], k: int) -> Sequence[str]:
    """The top ``k`` of ``ranking``; a document listed twice is an error (it would be counted twice)."""
    validate_k(k)
    top = ranking[:k]
    if len(set(top)) != len(top):
        twice = next(d for i, d in enumerate(top) if d in top[:i])
        raise ValidationError(f"a ranking lists each document once; {twice!r} is listed twice")
    return top


def precision_at_k(ranking: Sequence[str], qrel: Qrel, k: int) -> float:
    """Fraction of the top ``k`` slots holding a relevant document (the divisor is always ``k``)."""
    return sum(1 for d in _top(ranking, k) if qrel.get(d, 0) > 0) / k


def recall_at_k(ranking: Sequence[str], qrel: Qrel, k: int) -> float:
    """Fraction of the relevant documents found in the top ``k``."""
    top = _top(ranking, k)
    n_rel = sum(1 for g in qrel.values() if g > 0)
    if n_rel == 0:
        return 0.0
    return sum(1 for d in top if qrel.get(d, 0) > 0) / n_rel


def mrr_at_k(ranking: Sequence[str], qrel: Qrel, k: int) -> float:
    """Reciprocal rank of the first relevant document in the top ``k`` (0 if none)."""
    for i, d in enumerate(_top(ranking, k), start=1):
        if qrel.get(d, 0) > 0:
            return 1.0 / i
    return 0.0


def _dcg(gains: Sequence[float]) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains) if g > 0)


def ndcg_at_k(ranking: Sequence[str], qrel: Qrel, k: int) -> float:
    """Graded nDCG at ``k`` with linear gains (trec_eval ``ndcg_cut``)."""
    top = _top(ranking, k)
    ideal = _dcg(sorted((g for g in qrel.values() if g > 0), reverse=True)[:k])
    if ideal == 0:
        return 0.0
    return _dcg([max(qrel.get(d, 0), 0) for d in top]) / ideal


METRICS: dict[str, Callable[[Sequence[str], Qrel, int], float]] = {
    "ndcg": ndcg_at_k,
    "mrr": mrr_at_k,
    "p": precision_at_k,
    "recall": recall_at_k,
}


def run_to_ranking(run: Mapping[str, float]) -> list[str]:
    """Order a ``{doc_id: score}`` run as trec_eval does: score descending, then doc id descending.

    A NaN score is refused: it compares false both ways, so one would scramble the whole order.

    >>> run_to_ranking({"a": 1.0, "b": 3.0, "c": 1.0})
    ['b', 'c', 'a']
    """
    if isinstance(run, str) or not isinstance(run, Mapping):
        raise ValidationError(f"a run maps doc ids to scores, got {type(run).__name__}")
    for d, score in run.items():
        if not isinstance(d, str):
            raise ValidationError(f"doc ids must be strings, got {type(d).__name__} {d!r}")
        if isinstance(score, bool) or not isinstance(score, Real):
            raise ValidationError(f"score of {d!r} must be a number, got {type(score).__name__} {score!r}")
        if math.isnan(score):
            raise ValidationError(f"score of {d!r} is NaN; give a missing document -inf, or leave it out")
    return [d for d, _ in sorted(run.items(), key=lambda kv: (-kv[1], _neg_key(kv[0])))]


def _neg_key(doc_id: str) -> tuple[int, ...]:
    # trec_eval breaks score ties by doc id in *descending* string order
    return tuple(-ord(ch) for ch in doc_id) + (1,)


def evaluate_run(
    rankings: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Qrel],
    measures: Sequence[tuple[str, int]] = (("ndcg", 10), ("mrr", 10), ("p", 10), ("recall", 100)),
) -> dict[str, float]:
    """Mean of each measure over the judged queries.

    ``rankings`` maps query id to a ranked list of doc ids. A query is judged
    when ``qrels`` has any judgment for it, even only grade 0 (it then scores 0,
    as in trec_eval and ir-measures); queries without judgments are ignored. A
    judged query missing from ``rankings`` scores 0, which is stricter than
    trec_eval (it skips such queries) and never flatters.

    A ranking must be a sequence of doc ids: a ``{doc_id: score}`` run, as pytrec_eval takes, is refused
    (read as its keys in insertion order it would score wrongly without a word); order it first with
    :func:`run_to_ranking`.

    >>> evaluate_run({"q1": ["a", "b"]}, {"q1": {"b": 1}}, [("mrr", 10), ("p", 1)])
    {'mrr@10': 0.5, 'p@1': 0.0}
    >>> evaluate_run({"q1": {"b": 0.9, "a": 0.1}}, {"q1": {"b": 1}})
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: the ranking of query 'q1' is a dict, not a list of doc ids (see run_to_ranking)
    """
    for name, k in measures:  # checked before any query: with none judged, a bad measure would pass unseen
        check_choice(name, METRICS, "measure")
        validate_k(k)
    for q, ranking in rankings.items():
        if isinstance(ranking, (str, Mapping)) or not isinstance(ranking, Sequence):
            raise ValidationError(f"the ranking of query {q!r} is a {type(ranking).__name__}, not a list of doc "
                                  "ids (see run_to_ranking)")  # which orders a {doc_id: score} run
    out: dict[str, float] = {}
    judged = [q for q, rel in qrels.items() if rel]
    for name, k in measures:
        fn = METRICS[name]
        vals = [fn(list(rankings.get(q, ())), qrels[q], k) for q in judged]
        out[f"{name}@{k}"] = sum(vals) / len(vals) if vals else 0.0
    return out
