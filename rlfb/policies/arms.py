"""The arms of the grid policies (:mod:`rlfb.policies.thompson`): the weight vectors of a grid on the simplex,
their names, and the chance that Thompson sampling's best draw is one of them (its logged propensity)."""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["sampled_share", "simplex_grid"]


def simplex_grid(n: int, step: float) -> np.ndarray:
    """All weight vectors with ``n`` entries that are multiples of ``step`` and sum to one.

    >>> simplex_grid(3, 0.1).shape
    (66, 3)
    >>> simplex_grid(2, 0.5).tolist()
    [[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]]
    """
    m = int(round(1.0 / step))
    rows = []
    for bars in itertools.combinations(range(m + n - 1), n - 1):
        prev = -1
        parts = []
        for b in bars:
            parts.append(b - prev - 1)
            prev = b
        parts.append(m + n - 1 - prev - 1)
        rows.append(parts)
    return np.asarray(rows, dtype=float) / m


def sampled_share(draws: np.ndarray, mean: np.ndarray, sd: np.ndarray, arms: np.ndarray) -> float:
    """The probability that Thompson sampling's best draw is one of ``arms`` (a mask over the arms), from
    ``draws`` (rows of one posterior draw per arm, ``mean + sd * z``): for each row and each arm ``a`` of
    ``arms``, the chance that a draw of ``a`` beats the best draw of the other arms in that row, averaged.

    Unbiased (each row's term is the exact probability given the other arms' draws), and above 0 for any arm
    with a spread. Counting the rows whose best draw is one of ``arms``, plus one, over the rows plus one
    (what Thompson logged before 2026-12-05) overstated a rarely drawn arm's chance about 3 times among 67
    arms, so off-policy estimates from the logs weighed rare arms too little. The same draws are used, so
    what is shown does not change.

    >>> rng = np.random.default_rng(0)
    >>> mean, sd = np.array([0.0, 1.0]), np.array([1.0, 1.0])
    >>> draws = mean + sd * rng.standard_normal((20_000, 2))
    >>> round(sampled_share(draws, mean, sd, np.array([True, False])), 3)  # exactly Phi(-1/sqrt(2)) = 0.240
    0.24
    """
    from scipy.special import ndtr

    rows = np.arange(draws.shape[0])
    top = np.argmax(draws, axis=1)
    best = draws[rows, top]
    others = draws.copy()
    others[rows, top] = -np.inf
    second = others.max(axis=1)  # the best draw but for the row's best arm
    total = 0.0
    for a in np.flatnonzero(arms):
        rival = np.where(top == a, second, best)
        if sd[a] > 0:
            total += float(np.mean(ndtr((mean[a] - rival) / sd[a])))
        else:  # no spread: its draw is its mean
            total += float(np.mean(mean[a] > rival))
    return min(1.0, total)


def _arm_names(grid: np.ndarray) -> tuple[str, ...]:
    """Each grid arm's weights as a name, with as many digits as keep the names apart (three on the default
    grid): at step 0.0005, 446 arms shared a name, so logs and per-arm reports merged them.

    >>> _arm_names(np.array([[0.1005, 0.8995], [0.101, 0.899]]))
    ('0.1005/0.8995', '0.101/0.899')
    """
    for digits in range(3, 18):
        names = tuple("/".join(f"{x:.{digits}g}" for x in row) for row in grid)
        if len(set(names)) == len(names):
            return names
    return tuple(f"arm {i}" for i in range(len(grid)))  # points closer than floats print: not on a grid
