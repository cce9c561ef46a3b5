"""Score normalisation and weighted fusion, as small pure functions over arrays.

Every function takes a ``(n_candidates, n_retrievers)`` matrix whose columns
are retrievers, and returns a new array; inputs are never modified. Ranks are
**1-based** throughout (rank 1 is the best), as in LangChain's
``EnsembleRetriever`` and in the original RRF paper (Cormack et al., 2009):
``rrf = sum_i w_i / (c + rank_i)``.

>>> import numpy as np
>>> raw = np.array([[10.0, 0.2], [5.0, 0.9], [0.0, 0.5]])
>>> fuse(raw, [0.5, 0.5], method="minmax").round(3).tolist()
[0.5, 0.75, 0.214]
>>> int(fuse(raw, [1.0, 0.0], method="rrf").argmax())
0

A NaN marks a missing score: a candidate that a search-only member did not
return. Min-max and RRF map it to 0, and z-scores to the lowest z-score the
member gave, so it gets nothing from that member beyond what the member's worst
result gets; the member's other scores are normalised over the candidates it did
return. Tied scores share a rank (the best of their places), so a ranking never
depends on the order the corpus was indexed in.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from rlfb.errors import InvalidWeightsError, ValidationError
from rlfb.types import check_choice

__all__ = [
    "score_scale",
    "exploration_scale",
    "FUSION_METHODS",
    "check_fusion",
    "minmax_normalize",
    "zscore_normalize",
    "rank_matrix",
    "shared_ranks",
    "check_rrf_constant",
    "rrf_normalize",
    "normalize",
    "validate_weights",
    "weighted_fusion",
    "fuse",
    "weighted_rrf",
]


def _as_matrix(scores: np.ndarray) -> np.ndarray:
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValidationError(f"scores must be a (n_candidates, n_retrievers) matrix, got shape {arr.shape}")
    if np.any(np.isinf(arr)):
        raise ValidationError("scores must be finite (NaN marks a missing score)")
    return arr


#: a column whose scores reach this far is scaled down first: their span (up to 2e308) or squares overflow
_HUGE = 1e150


def _present(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mask of present scores, and ``arr`` with missing ones replaced by 0.

    A column with a score beyond ``1e150`` in size is divided by its largest: min-max and z-scores do not
    change with the scale, but its span or variance overflowed to infinity, which read as a constant column
    (a member scoring 1e308 and -1e308 had its best and worst results tie).
    """
    mask = ~np.isnan(arr)
    filled = np.where(mask, arr, 0.0)
    size = np.abs(filled).max(axis=0) if filled.shape[0] else np.zeros(filled.shape[1])
    huge = size > _HUGE
    if huge.any():
        filled = filled.copy()
        filled[:, huge] /= size[huge]
    return mask, filled


def minmax_normalize(scores: np.ndarray) -> np.ndarray:
    """Scale each column to [0, 1]; a constant column carries no information and becomes 0.

    A missing (NaN) score becomes 0. In a column with missing scores (a member retriever's, which scores
    only what it returned) whose present scores are all equal, being returned is all the column says: those
    become 1, so that a member's lone hit counts for more than the candidates it did not return.

    >>> minmax_normalize(np.array([[1.0], [3.0], [2.0]])).ravel().tolist()
    [0.0, 1.0, 0.5]
    >>> minmax_normalize(np.array([[0.7, 2.0], [np.nan, 2.0]])).tolist()
    [[1.0, 0.0], [0.0, 0.0]]
    """
    arr = _as_matrix(scores)
    if arr.shape[0] == 0:  # no candidates (a member that found nothing): nothing to scale
        return np.zeros_like(arr)
    mask, filled = _present(arr)
    lo, span, ok = _spread(mask, filled)
    out = np.zeros_like(arr)
    out[:, ok] = (filled[:, ok] - lo[ok]) / span[ok]
    out[:, ~ok & ~mask.all(axis=0)] = 1.0  # equal scores of what a member returned; the missing are zeroed below
    return np.where(mask, out, 0.0)


def _spread(mask: np.ndarray, filled: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each column's lowest present score, its span, and whether it varies (a finite span above 0)."""
    lo = np.where(mask, filled, np.inf).min(axis=0)
    span = np.where(mask, filled, -np.inf).max(axis=0) - lo
    return lo, span, np.isfinite(span) & (span > 0)


def zscore_normalize(scores: np.ndarray) -> np.ndarray:
    """Centre each column on its mean and divide by its standard deviation (constant column -> 0).

    A missing (NaN) score takes the column's lowest z-score.

    >>> zscore_normalize(np.array([[1.0], [3.0], [np.nan]])).ravel().tolist()
    [-1.0, 1.0, -1.0]
    >>> zscore_normalize(np.array([[0.1], [0.1], [0.1]])).ravel().tolist()
    [0.0, 0.0, 0.0]
    """
    arr = _as_matrix(scores)
    if arr.shape[0] == 0:
        return np.zeros_like(arr)
    mask, filled = _present(arr)
    count = mask.sum(axis=0)
    safe = np.maximum(count, 1)
    mean = filled.sum(axis=0) / safe
    std = np.sqrt((np.where(mask, filled - mean, 0.0) ** 2).sum(axis=0) / safe)
    # constant is judged on the values, not on std > 0: the mean's round-off leaves a std of 1e-17 on a
    # column of 0.1s, which would scale every entry to +-1
    ok = _spread(mask, filled)[2] & (std > 0)
    out = np.zeros_like(arr)
    out[:, ok] = (filled[:, ok] - mean[ok]) / std[ok]
    # a missing score is no better than the member's worst result (0 would put it at the member's mean)
    floor = np.where(mask, out, np.inf).min(axis=0)
    return np.where(mask, out, np.where(np.isfinite(floor), floor, 0.0))


def rank_matrix(scores: np.ndarray) -> np.ndarray:
    """1-based rank of each row within its column, best (highest) first; tied scores share the best rank.

    A missing (NaN) score has no rank: it stays NaN.

    >>> rank_matrix(np.array([[0.1, 5.0], [0.9, 5.0], [0.5, np.nan], [0.0, 1.0]])).tolist()
    [[3.0, 1.0], [1.0, 1.0], [2.0, nan], [4.0, 3.0]]
    """
    arr = _as_matrix(scores)
    mask, filled = _present(arr)
    ranks = np.full_like(arr, np.nan)
    for j in range(arr.shape[1]):  # one column per retriever: a handful of iterations
        present = np.flatnonzero(mask[:, j])
        order = present[np.argsort(-filled[present, j], kind="stable")]
        ranks[order, j] = shared_ranks(filled[order, j])
    return ranks


def shared_ranks(descending: np.ndarray) -> np.ndarray:
    """1-based ranks of scores sorted best first, where tied scores share the best of their places.

    >>> shared_ranks(np.array([0.9, 0.5, 0.5, 0.1, 0.0, 0.0])).tolist()
    [1.0, 2.0, 2.0, 4.0, 5.0, 5.0]
    """
    s = np.asarray(descending, dtype=np.float64)
    if s.size == 0:
        return np.zeros(0)
    starts = np.r_[True, s[1:] != s[:-1]]  # where a run of equal scores begins
    return np.maximum.accumulate(np.where(starts, np.arange(s.size), 0)).astype(np.float64) + 1.0


def rrf_normalize(ranks: np.ndarray, c: float = 60.0) -> np.ndarray:
    """Reciprocal-rank scores ``1 / (c + rank)`` for 1-based ranks; a missing (NaN) rank scores 0.

    >>> rrf_normalize(np.array([[1.0], [2.0], [np.nan]]), c=60).ravel().round(5).tolist()
    [0.01639, 0.01613, 0.0]
    """
    c = check_rrf_constant(c)
    r = np.asarray(ranks, dtype=np.float64)
    mask = ~np.isnan(r)
    if np.any(r[mask] < 1):
        raise ValidationError("ranks are 1-based and must be >= 1")
    return np.where(mask, 1.0 / (c + np.where(mask, r, 1.0)), 0.0)


def check_rrf_constant(c: object) -> float:
    """The RRF constant as a float, or :class:`ValidationError` (a bool, NaN, inf or negative number).

    >>> check_rrf_constant(np.int64(60))
    60.0
    """
    if isinstance(c, bool) or not isinstance(c, numbers.Real) or not math.isfinite(c) or c < 0:
        raise ValidationError(f"RRF constant c must be finite and >= 0, got {c!r}")
    return float(c)


def _rrf_from_scores(scores: np.ndarray, *, ranks: np.ndarray | None = None, c: float = 60.0) -> np.ndarray:
    if ranks is None:
        return rrf_normalize(rank_matrix(scores), c=c)
    if np.shape(ranks) != np.shape(scores):  # else one fused score for three candidates, or a weights error
        raise ValidationError(f"ranks of shape {np.shape(ranks)} do not match scores of shape {np.shape(scores)}")
    return rrf_normalize(ranks, c=c)


FUSION_METHODS: dict[str, Callable[..., np.ndarray]] = {
    "minmax": lambda scores, **_: minmax_normalize(scores),
    "zscore": lambda scores, **_: zscore_normalize(scores),
    "rrf": _rrf_from_scores,
}


def normalize(
    scores: np.ndarray, method: str = "minmax", *, ranks: np.ndarray | None = None, c: float = 60.0
) -> np.ndarray:
    """Normalise raw scores with ``method`` ("minmax", "zscore" or "rrf").

    For "rrf", ``ranks`` may give each candidate's 1-based rank in the
    retriever's full ranking (more faithful than its rank inside the pool).
    """
    return FUSION_METHODS[check_fusion(method)](scores, ranks=ranks, c=c)


def check_fusion(method: object) -> str:
    """``method`` if it names a fusion method, else :class:`ValidationError` (a list or dict too).

    >>> check_fusion("rrf")
    'rrf'
    """
    return check_choice(method, FUSION_METHODS, "fusion method")


def validate_weights(
    weights: Mapping[str, float] | Sequence[float] | np.ndarray, names: Sequence[str] | None = None
) -> np.ndarray:
    """Return weights as a float array summing to 1, or raise :class:`InvalidWeightsError`.

    Weights must be finite and non-negative, with a positive sum; they are then
    normalised to sum to 1. A mapping must name exactly ``names``.

    >>> validate_weights({"bm25": 1, "dense": 3}, ["bm25", "dense"]).tolist()
    [0.25, 0.75]
    >>> validate_weights([0.5, float("nan")])
    Traceback (most recent call last):
    ...
    rlfb.errors.InvalidWeightsError: weights must be finite numbers, got [0.5, nan]
    """
    if isinstance(weights, Mapping):
        if names is None:
            names = list(weights)
        missing = set(names) - set(weights)
        extra = set(weights) - set(names)
        if missing or extra:
            raise InvalidWeightsError(
                f"weights must name exactly the retrievers {list(names)}; "
                f"missing {sorted(missing)}, unknown {sorted(extra)}"
            )
        values = [weights[n] for n in names]
    else:
        values = list(weights)
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise InvalidWeightsError(f"weights must be finite numbers, got {values!r}") from None
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidWeightsError(f"weights must be a non-empty flat list, got {values!r}")
    if names is not None and arr.size != len(names):
        raise InvalidWeightsError(f"got {arr.size} weights for {len(names)} retrievers {list(names)}")
    if not np.all(np.isfinite(arr)):
        raise InvalidWeightsError(f"weights must be finite numbers, got {arr.tolist()}")
    if np.any(arr < 0):
        raise InvalidWeightsError(f"weights must be non-negative, got {arr.tolist()}")
    if not arr.any():
        raise InvalidWeightsError("weights must not all be zero")
    arr = arr / arr.max()  # first: two weights of 1e308 would sum to inf, and every share to 0
    return arr / arr.sum()


def weighted_fusion(
    normalized: np.ndarray, weights: Sequence[float] | np.ndarray
) -> np.ndarray:
    """Fused score of each candidate: the weighted sum of its normalised scores, ``weights`` in column order.

    >>> weighted_fusion(np.array([[1.0, 0.0], [0.0, 1.0]]), [0.8, 0.2]).tolist()
    [0.8, 0.2]
    >>> weighted_fusion(np.array([[1.0, 0.0]]), {"dense": 0.8, "bm25": 0.2})
    Traceback (most recent call last):
    ...
    rlfb.errors.InvalidWeightsError: weights of a score matrix are a sequence in its column order; a mapping ...
    """
    arr = np.nan_to_num(_as_matrix(normalized), nan=0.0)
    if isinstance(weights, Mapping):  # taken in the mapping's own order, {"dense": .8, "bm25": .2} weighed bm25 .8
        raise InvalidWeightsError(
            "weights of a score matrix are a sequence in its column order; a mapping names no column: "
            f"pass [weights[name] for name in <the columns' names>] (got {dict(weights)!r})"
        )
    w = validate_weights(weights)
    if w.size != arr.shape[1]:
        raise InvalidWeightsError(f"got {w.size} weights for {arr.shape[1]} score columns")
    return arr @ w


def fuse(
    raw: np.ndarray,
    weights: Sequence[float] | np.ndarray,
    method: str = "minmax",
    *,
    ranks: np.ndarray | None = None,
    c: float = 60.0,
) -> np.ndarray:
    """Normalise ``raw`` with ``method`` and return the weighted fused scores (``weights`` in column order)."""
    return weighted_fusion(normalize(raw, method, ranks=ranks, c=c), weights)


def weighted_rrf(
    ranked_lists: Sequence[Sequence[Hashable]], weights: Sequence[float] | None = None, c: float = 60.0
) -> dict[Hashable, float]:
    """Weighted reciprocal rank fusion of ranked id lists (1-based ranks).

    Used for members that return ids without scores. An id absent from a list
    gets nothing from it; an id listed twice counts at its first place. The
    result is ordered best first.

    >>> weighted_rrf([["a", "b"], ["b", "c"]], [0.5, 0.5], c=1)
    {'b': 0.5, 'a': 0.25, 'c': 0.16666666666666666}
    """
    c = check_rrf_constant(c)
    w = validate_weights([1.0] * len(ranked_lists) if weights is None else weights)
    if w.size != len(ranked_lists):
        raise InvalidWeightsError(f"got {w.size} weights for {len(ranked_lists)} ranked lists")
    fused: dict[Hashable, float] = {}
    for weight, ids in zip(w, ranked_lists, strict=True):
        seen: set[Hashable] = set()
        for rank, doc in enumerate(ids, start=1):
            if doc in seen:
                continue
            seen.add(doc)
            fused[doc] = fused.get(doc, 0.0) + float(weight) / (c + rank)
    return dict(sorted(fused.items(), key=lambda kv: -kv[1]))


def exploration_scale(scale: float, k: int, rrf_c: float | None = None) -> float:
    """The score scale chunk exploration perturbs fused scores in, showing ``k``: ``scale``, the normalised
    scores' own (:func:`score_scale`, which the caller has already), except for RRF scores (``rrf_c``, their
    constant), where it is their drop from the first rank to rank ``k + 1``.

    Min-max scores spread over [0, 1], much of that spread at the top of a ranking, so a perturbation of a
    fraction of the largest score moves a chunk a few places. RRF scores are ``1 / (c + rank)``: at ``c = 60``
    the largest is 1/61 and the first ten places lie within 0.0022 of it, so the same fraction of 1/61
    reshuffled the whole shown list: on SciFact's 300 test questions, each asked once, BM25 alone, served
    nDCG@10 fell from the greedy 0.665 to 0.372 (0.656 under min-max). Measured against the drop over the
    shown depth, it falls to 0.611; with BM25 + dense, from 0.687 to 0.662, where min-max falls from 0.713 to
    0.642 (``benchmarks/exploration_cost.py``): about what exploration costs under min-max, one way or the other.

    >>> exploration_scale(score_scale(np.array([[1.0, 0.2], [0.5, 0.9]])), 10)
    1.0
    >>> round(exploration_scale(1 / 61, 10, rrf_c=60.0), 6)  # 1/61 - 1/71
    0.002309
    """
    if rrf_c is None:
        return scale
    c = check_rrf_constant(rrf_c)
    return 1.0 / (c + 1.0) - 1.0 / (c + 1.0 + max(int(k), 1))


def score_scale(matrix: np.ndarray) -> float:
    """The scale of a normalised score matrix: its largest absolute value (1.0 when empty or zero).

    Min-max scores have a scale near 1, RRF scores near ``1/61``; dividing by
    the scale makes temperatures and feature weights mean the same under each.
    """
    if matrix.size == 0:
        return 1.0
    m = float(np.max(np.abs(matrix)))
    return m if m > 1e-12 and math.isfinite(m) else 1.0
