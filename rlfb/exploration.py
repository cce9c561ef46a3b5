"""Chunk exploration: show, now and then, a chunk the ranking would not have shown.

A cascade user never clicks a relevant chunk that is never shown; exploration
is how those are found. Two strategies, each returning the propensity of what
it showed so that the exploration is logged with it:

* :class:`EpsilonGreedyExploration` (the design's): with probability epsilon,
  replace the chunk in one of the lower slots of the top ``k`` (from
  ``min_position * k`` on, where a swap costs least) with a chunk drawn
  uniformly from the next ``depth`` candidates. Epsilon decays with the number
  of episodes learned, halving every ``half_life`` down to ``epsilon_min``.
  The propensity is exact.
* :class:`ThompsonChunkExploration`: each candidate's fused score is perturbed
  by ``weight * (theta - mean)`` with ``theta`` drawn from the chunk's Beta
  posterior, so chunks with little evidence move the most. Its propensity, the
  probability of the shown top-``k`` set, is a Monte Carlo estimate.

>>> ex = EpsilonGreedyExploration(epsilon=1.0, seed=0)
>>> res = ex.explore(np.arange(20), 5)
>>> res.explored, len(res.order), round(res.propensity, 4)
(True, 5, 0.0222)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.hyperparameters import check_float, check_int, plain_numbers
from rlfb.saved_state import MAX_COUNT, rng_state, set_rng_state

__all__ = [
    "EXPLORATIONS",
    "ExplorationResult",
    "EpsilonGreedyExploration",
    "ThompsonChunkExploration",
    "NoExploration",
]


@dataclass(frozen=True)
class ExplorationResult:
    """What exploration showed: candidate indices best first, their propensity, and whether it deviated."""

    order: np.ndarray
    propensity: float
    explored: bool


class NoExploration:
    """Shows the greedy top ``k``."""

    kind = "none"

    def step(self, n: float = 1.0) -> None:
        return None

    @property
    def epsilon(self) -> float:
        return 0.0

    def explore(self, ranked: np.ndarray, k: int, **_: Any) -> ExplorationResult:
        return ExplorationResult(np.asarray(ranked[:k], dtype=np.int64), 1.0, False)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def load_state_dict(self, state: Mapping[str, Any]) -> NoExploration:
        """Check that ``state`` is of this kind (there is nothing else to restore)."""
        kind = state.get("kind") if isinstance(state, Mapping) else None
        if kind != self.kind:
            raise CorruptStateError(f"exploration state is for {kind!r}, not {self.kind!r}")
        return self


@dataclass(frozen=True)
class EpsilonParams:
    """Hyperparameters of :class:`EpsilonGreedyExploration`."""

    epsilon: float = 0.1
    epsilon_min: float = 0.02
    half_life: float = 1000.0
    depth: int = 50
    min_position: float = 0.5

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_float("epsilon", self.epsilon, 0.0, 1.0)
        check_float("epsilon_min", self.epsilon_min, 0.0, 1.0)
        if self.epsilon_min > self.epsilon:
            raise ValidationError("epsilon_min must not exceed epsilon")
        check_float("half_life", self.half_life, 0.0, None, lo_open=True)
        check_int("depth", self.depth, 1, 1_000_000)
        check_float("min_position", self.min_position, 0.0, 1.0)


class EpsilonGreedyExploration:
    """With probability epsilon, swap one shown chunk for a random candidate from further down.

    Parameters
    ----------
    epsilon
        The starting probability of exploring (0.1, as in the design).
    epsilon_min
        The floor it decays to.
    half_life
        Episodes learned over which epsilon halves.
    depth
        How many candidates below the top ``k`` can be swapped in.
    min_position
        The first slot that may be replaced, as a fraction of ``k``.
    seed
        Seed of its own generator.
    """

    kind = "epsilon"

    def __init__(
        self,
        epsilon: float = 0.1,
        *,
        epsilon_min: float = 0.02,
        half_life: float = 1000.0,
        depth: int = 50,
        min_position: float = 0.5,
        seed: int | None = 0,
    ) -> None:
        self.hyper = EpsilonParams(epsilon, epsilon_min, half_life, depth, min_position)
        self._rng = np.random.default_rng(_seed(seed))
        self._t = 0.0

    def step(self, n: float = 1.0) -> None:
        """Count learned episodes (epsilon decays with them)."""
        self._t += float(n)

    @property
    def epsilon(self) -> float:
        p = self.hyper
        return max(p.epsilon_min, p.epsilon * 0.5 ** (self._t / p.half_life))

    def explore(self, ranked: np.ndarray, k: int, *, scale: float = 1.0, **_: Any) -> ExplorationResult:
        """Explore on ``ranked`` (candidate indices, best first); ``scale`` multiplies epsilon."""
        ranked = np.asarray(ranked, dtype=np.int64)
        k = min(int(k), ranked.shape[0])
        shown = ranked[:k].copy()
        pool = ranked[k : k + self.hyper.depth]
        eps = min(1.0, self.epsilon * float(scale))
        if k == 0 or pool.size == 0 or eps <= 0:
            return ExplorationResult(shown, 1.0, False)
        if self._rng.random() >= eps:
            return ExplorationResult(shown, 1.0 - eps, False)
        first = min(k - 1, int(np.floor(self.hyper.min_position * k)))
        slot = int(self._rng.integers(first, k))
        pick = int(self._rng.integers(pool.size))
        shown[slot] = pool[pick]
        return ExplorationResult(shown, eps / ((k - first) * pool.size), True)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": asdict(self.hyper), "t": self._t, "rng": rng_state(self._rng)}

    def load_state_dict(self, state: Mapping[str, Any]) -> EpsilonGreedyExploration:
        self._t = _restore(self.kind, self._rng, state)
        return self


@dataclass(frozen=True)
class ThompsonChunkParams:
    """Hyperparameters of :class:`ThompsonChunkExploration`."""

    weight: float = 0.1
    draws: int = 16

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_float("weight", self.weight, 0.0, 10.0)
        check_int("draws", self.draws, 1, 10_000)


class ThompsonChunkExploration:
    """Perturb each candidate's score by a draw from its Beta posterior, centred on the posterior mean.

    Parameters
    ----------
    weight
        Size of the perturbation relative to the score scale.
    draws
        Monte Carlo draws for the propensity estimate.
    seed
        Seed of its own generator.
    """

    kind = "thompson"

    def __init__(self, weight: float = 0.1, *, draws: int = 16, seed: int | None = 0) -> None:
        self.hyper = ThompsonChunkParams(weight, draws)
        self._rng = np.random.default_rng(_seed(seed))
        self._t = 0.0

    def step(self, n: float = 1.0) -> None:
        self._t += float(n)

    @property
    def epsilon(self) -> float:
        return 0.0

    def explore(
        self,
        ranked: np.ndarray,
        k: int,
        *,
        fused: np.ndarray | None = None,
        alpha: np.ndarray | None = None,
        beta: np.ndarray | None = None,
        scale: float = 1.0,
        score_scale: float = 1.0,
    ) -> ExplorationResult:
        """Re-rank by ``fused + weight * (theta - mean)``; ``alpha``, ``beta`` per candidate."""
        ranked = np.asarray(ranked, dtype=np.int64)
        n = ranked.shape[0]
        k = min(int(k), n)
        if fused is None or alpha is None or beta is None or k == 0 or self.hyper.weight * scale <= 0:
            return ExplorationResult(ranked[:k].copy(), 1.0, False)
        w = self.hyper.weight * float(scale) * float(score_scale)
        mean = alpha / (alpha + beta)
        theta = self._rng.beta(alpha, beta)
        noisy = fused + w * (theta - mean)
        order = _top(noisy, k)
        # the order shown, not its set: with no more candidates than k every draw shows one set, and a list
        # reordered by the draw was logged as not explored (68 % of lists at 5 candidates and k = 10)
        explored = not np.array_equal(order, ranked[:k])
        d = self.hyper.draws
        thetas = self._rng.beta(alpha[None, :], beta[None, :], size=(d, n))
        sims = fused[None, :] + w * (thetas - mean[None, :])
        hits = _same_top(sims, order, k)
        return ExplorationResult(order, (hits + 1.0) / (d + 1.0), explored)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": asdict(self.hyper), "t": self._t, "rng": rng_state(self._rng)}

    def load_state_dict(self, state: Mapping[str, Any]) -> ThompsonChunkExploration:
        self._t = _restore(self.kind, self._rng, state)
        return self


def _restore(kind: str, rng: np.random.Generator, state: Mapping[str, Any]) -> float:
    """Check a saved explorer state of ``kind``, give ``rng`` its generator state and return its counter.

    Everything is checked before the generator takes the saved state, so a refused state
    (:class:`CorruptStateError`) changes nothing.
    """
    try:
        if state["kind"] != kind:
            raise CorruptStateError(f"exploration state is for {state['kind']!r}, not {kind!r}")
        t = float(state["t"])  # 10**400 raised a raw OverflowError here
        if not np.isfinite(t) or not 0 <= t <= MAX_COUNT:
            raise CorruptStateError(f"exploration counter must be in [0, {MAX_COUNT}]")
        set_rng_state(rng, state["rng"])
    except CorruptStateError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CorruptStateError(f"cannot read exploration state: {exc!r}") from exc
    return t


def _seed(seed: int | None) -> int | None:
    """``seed`` checked as numpy's generators take it: ``None`` or a non-negative integer."""
    return None if seed is None else check_int("seed", seed, 0)


def _same_top(sims: np.ndarray, shown: np.ndarray, k: int) -> int:
    """How many rows of ``sims`` put the same set of candidates as ``shown`` in their top ``k``.

    One ``argpartition`` over all rows, as :func:`_top` picks each row's set (a loop over the rows was
    half the cost of a decision at 100 candidates).
    """
    d, n = sims.shape
    if k >= n:
        return d
    tops = np.sort(np.argpartition(-sims, k - 1, axis=1)[:, :k], axis=1)
    return int(np.count_nonzero(np.all(tops == np.sort(shown)[None, :], axis=1)))


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    n = scores.shape[0]
    if k >= n:
        return np.argsort(-scores, kind="stable")
    top = np.argpartition(-scores, k - 1)[:k]
    return top[np.argsort(-scores[top], kind="stable")]


#: Exploration kind -> class.
EXPLORATIONS: dict[str, type] = {
    "epsilon": EpsilonGreedyExploration,
    "thompson": ThompsonChunkExploration,
    "none": NoExploration,
}
