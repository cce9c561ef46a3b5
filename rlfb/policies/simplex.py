"""Fusion weights as vectors on the bounded simplex: validated, normalised, projected and checked.

Every policy keeps its weights non-negative, summing to 1 and within its ``bounds``; user weights, logged
weights and saved weights are all read through here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, InvalidWeightsError, ValidationError
from rlfb.hyperparameters import check_float

__all__ = [
    "check_bounds", "DEFAULT_BOUNDS", "default_bounds", "saved_bounds", "validate_retrievers", "weights_vector",
    "weights_dict", "logged_weights", "project_simplex", "check_within_bounds", "check_simplex",
]


def check_bounds(bounds: Any) -> tuple[float, float]:
    """Validate ``(low, high)`` weight bounds with ``0 <= low < high <= 1``."""
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise ValidationError(f"bounds must be a (low, high) pair, got {bounds!r}") from None
    lo = check_float("bounds[0]", lo, 0.0, 1.0)
    hi = check_float("bounds[1]", hi, 0.0, 1.0)
    if lo >= hi:
        raise ValidationError(f"bounds must have low < high, got {bounds!r}")
    return lo, hi


#: The weight bounds of a policy given none, up to 19 retrievers (:func:`default_bounds`).
DEFAULT_BOUNDS = (0.05, 0.95)


def default_bounds(n: int) -> tuple[float, float]:
    """The weight bounds of a policy over ``n`` retrievers that was given none: :data:`DEFAULT_BOUNDS` while its
    lower bound leaves ``n`` weights room to move (up to 19 retrievers), else a lower bound of ``0.5/n``. A lower
    bound of ``1/n`` or more pins every weight at ``1/n``, as 0.05 did from 20 retrievers on. Below 20 the
    bounds stay what earlier versions saved, so that their snapshots are still of the same kind.

    >>> default_bounds(3), default_bounds(19), default_bounds(20)
    ((0.05, 0.95), (0.05, 0.95), (0.025, 0.95))
    """
    lo, hi = DEFAULT_BOUNDS
    return (lo, hi) if lo * n < 1.0 - 1e-12 else (0.5 / n, hi)


def saved_bounds(bounds: tuple[float, float], n: int) -> tuple[float, float]:
    """Bounds as a saved state's hyperparameters give them, to rebuild its policy with: :data:`DEFAULT_BOUNDS`
    that pin ``n`` weights at ``1/n`` (the default of 20 or more retrievers in earlier versions, which the policies
    now refuse) read as :func:`default_bounds`; such a state's weights are ``1/n`` each, within those too.

    >>> saved_bounds((0.05, 0.95), 3), saved_bounds((0.05, 0.95), 20), saved_bounds((0.0, 1.0), 20)
    ((0.05, 0.95), (0.025, 0.95), (0.0, 1.0))
    """
    pins = tuple(bounds) == DEFAULT_BOUNDS and DEFAULT_BOUNDS[0] * n >= 1.0 - 1e-12
    return default_bounds(n) if pins else tuple(bounds)  # type: ignore[return-value]


def validate_retrievers(retrievers: Any) -> tuple[str, ...]:
    """Return the retriever names as a tuple; they must be distinct non-empty strings.

    >>> validate_retrievers(["bm25", "dense"])
    ('bm25', 'dense')
    """
    if isinstance(retrievers, str):
        raise ValidationError("retrievers must be a sequence of names, not one string")
    try:
        names = tuple(retrievers)
    except TypeError:
        raise ValidationError(f"retrievers must be a sequence of names, got {retrievers!r}") from None
    if not names:
        raise ValidationError("at least one retriever is needed")
    for n in names:
        if not isinstance(n, str) or not n:
            raise ValidationError(f"retriever names must be non-empty strings, got {n!r}")
    if len(set(names)) != len(names):
        raise ValidationError(f"retriever names must be distinct, got {names!r}")
    return names


def weights_vector(
    weights: Mapping[str, float] | Sequence[float] | np.ndarray | None,
    retrievers: Sequence[str],
) -> np.ndarray:
    """Validate weights and return them as a normalised vector in retriever order.

    ``None`` means equal weights. A mapping must name exactly the retrievers.
    NaN, infinite or negative weights, and an all-zero vector, raise
    :class:`InvalidWeightsError`.

    >>> weights_vector({"a": 2, "b": 2}, ["a", "b"]).tolist()
    [0.5, 0.5]
    >>> weights_vector({"a": -1, "b": 2}, ["a", "b"])
    Traceback (most recent call last):
    ...
    rlfb.errors.InvalidWeightsError: weights must be non-negative, got {'a': -1, 'b': 2}
    """
    n = len(retrievers)
    if weights is None:
        return np.full(n, 1.0 / n)
    if isinstance(weights, Mapping):
        keys = set(weights)
        if keys != set(retrievers):
            missing = sorted(set(retrievers) - keys)
            extra = sorted(keys - set(retrievers))
            raise InvalidWeightsError(
                f"weights must name exactly the retrievers {list(retrievers)}; "
                f"missing {missing}, unknown {extra}"
            )
        raw = [weights[r] for r in retrievers]
    else:
        if isinstance(weights, (str, bytes)):
            raise InvalidWeightsError(f"weights must be numbers, got {weights!r}")
        if isinstance(weights, np.ndarray):
            raw = list(np.asarray(weights, dtype=object).ravel())
        elif isinstance(weights, Iterable):
            raw = list(weights)
        else:  # one number: list() of it was a bare TypeError ("'float' object is not iterable")
            raise InvalidWeightsError(f"weights must be a mapping or a sequence of {n} numbers, got {weights!r}")
        if len(raw) != n:
            raise InvalidWeightsError(f"expected {n} weights for {list(retrievers)}, got {len(raw)}")
    vals = []
    for x in raw:
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
            raise InvalidWeightsError(f"weights must be numbers, got {weights!r}")
        try:
            vals.append(float(x))
        except OverflowError:  # an int beyond float range
            raise InvalidWeightsError(f"weights must be finite, got {weights!r}") from None
    vec = np.asarray(vals, dtype=float)
    if not np.all(np.isfinite(vec)):
        raise InvalidWeightsError(f"weights must be finite, got {weights!r}")
    if np.any(vec < 0):
        raise InvalidWeightsError(f"weights must be non-negative, got {weights!r}")
    if not vec.any():
        raise InvalidWeightsError(f"weights must not all be zero, got {weights!r}")
    vec = vec / vec.max()  # first: two weights of 1e308 would sum to inf, and every share to 0
    return vec / vec.sum()


def weights_dict(vec: np.ndarray, retrievers: Sequence[str]) -> dict[str, float]:
    """Return a ``{retriever: weight}`` dict of plain floats."""
    return {r: float(w) for r, w in zip(retrievers, vec, strict=True)}


def logged_weights(weights: Mapping[str, float], retrievers: Sequence[str]) -> np.ndarray:
    """The weights a logged decision used, as a vector; validated like user weights."""
    return weights_vector(dict(weights), retrievers)


def project_simplex(v: np.ndarray, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{w : sum(w) = 1, lo <= w <= hi}``.

    This is "clip to the bounds and renormalise" done exactly: the result is
    ``clip(v - theta, lo, hi)`` for the shift ``theta`` that makes it sum to one.
    When the bounds cannot hold for ``n`` weights they are widened to ``1/n``: then every
    weight is ``1/n``. The policies refuse such bounds (``BasePolicy._check_bounds_fit``),
    and their default lower bound stays under ``1/n`` (:func:`default_bounds`).

    >>> project_simplex(np.array([1.0, 0.0, 0.0]), 0.05, 0.95).round(3).tolist()
    [0.9, 0.05, 0.05]
    """
    v = np.asarray(v, dtype=float)
    n = v.shape[0]
    if n == 1:
        return np.ones(1)
    lo = min(lo, 1.0 / n)
    hi = max(hi, 1.0 / n)
    # g(theta) = sum(clip(v - theta, lo, hi)) is piecewise linear and non-increasing.
    bps = np.sort(np.concatenate([v - lo, v - hi]))
    g = np.clip(v[None, :] - bps[:, None], lo, hi).sum(axis=1)  # non-increasing in bps
    # find consecutive breakpoints with g[i] >= 1 >= g[i+1]
    idx = int(np.searchsorted(-g, -1.0, side="left"))
    if idx <= 0:
        theta = bps[0]
    elif idx >= len(bps):
        theta = bps[-1]
    else:
        g0, g1 = g[idx - 1], g[idx]
        t0, t1 = bps[idx - 1], bps[idx]
        theta = t0 if g0 == g1 else t0 + (g0 - 1.0) * (t1 - t0) / (g0 - g1)
    w = np.clip(v - theta, lo, hi)
    s = w.sum()
    return w / s if s > 0 else np.full(n, 1.0 / n)


def check_within_bounds(key: str, weights: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """``weights``, read from the policy state field ``key``, or :class:`CorruptStateError` where one lies outside
    ``bounds`` as :func:`project_simplex` applies them (widened to ``1/n``) by more than float round-off: a policy
    projects every weight it keeps within them, so one outside was written by hand, and was served as it was.

    >>> check_within_bounds("weights", np.array([0.99, 0.01]), (0.05, 0.95))
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: policy state field 'weights' holds weights outside the policy's bounds ...
    """
    n = weights.shape[0]
    lo, hi = min(bounds[0], 1.0 / n), max(bounds[1], 1.0 / n)
    if np.any(weights < lo - 1e-9) or np.any(weights > hi + 1e-9):
        raise CorruptStateError(f"policy state field {key!r} holds weights outside the policy's bounds "
                                f"[{lo:g}, {hi:g}]: {weights.tolist()}")
    return weights


def check_simplex(what: str, weights: np.ndarray) -> np.ndarray:
    """``weights``, or :class:`CorruptStateError` where they are not on the simplex (non-negative, summing to 1),
    as every policy keeps and logs its weights."""
    if np.any(weights < 0) or abs(float(weights.sum()) - 1.0) > 1e-6:
        raise CorruptStateError(f"{what} are not on the simplex: {weights.tolist()}")
    return weights
