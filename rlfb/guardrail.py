"""``Guardrail``: watch the learned weights against the default weights, and tune the learning.

For every episode with a rewarded chunk, the guardrail re-ranks the shown
chunks twice, once by the policy's current greedy weights and once
by the baseline (default) weights, and compares the discounted gain of the
rewarded chunks under the two orders (normalised by the ideal gain, so each
difference lies in [-1, 1]). This is an interleaving-style paired comparison on
the same shown chunks, so it needs no separate traffic for the baseline, and it
is zero whenever the learned weights equal the default.

Its exponentially weighted mean (rate ``alpha``, bias-corrected) and the
standard error of that mean drive two bounded multipliers, after ``min_episodes``:

* when the mean is below ``-tolerance`` by ``z`` standard errors (the learned
  weights surely do worse): the learning-rate multiplier drops by ``factor``
  and the exploration multiplier rises by it;
* when it is above ``+tolerance`` by ``z`` standard errors: the reverse;
* otherwise both ease back towards 1 by ``factor``, so an adjustment lasts only
  while its evidence does.

The standard error matters. Per-episode differences are large and noisy (a
click either moves or not), and a mean over the last 40 or so of them crosses
a tolerance of 0.01 by chance all the time; acting on that sent the exploration
multiplier to its bound for hundreds of episodes on a run where nothing was
wrong (scifact, seed 1: online nDCG@10 0.648, RRF 0.709). Multipliers stay within
``lr_bounds`` and ``explore_bounds``; this is the design's advice ("if the
metrics degraded, reduce the learning rate, increase exploration") made
continuous.

>>> import numpy as np
>>> g = Guardrail(min_episodes=1, factor=1.25)
>>> shown = np.array([[1.0, 0.0], [0.0, 1.0]])
>>> g.observe(shown, np.array([0.0, 1.0]), np.array([0.9, 0.1]), np.array([0.1, 0.9]))
(0.8, 1.25)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlfb.credit import ranks_nothing
from rlfb.errors import CorruptStateError, ValidationError
from rlfb.hyperparameters import check_float, check_int, plain_numbers
from rlfb.saved_state import saved_count

__all__ = ["GuardrailParams", "Guardrail"]


@dataclass(frozen=True)
class GuardrailParams:
    """Hyperparameters of :class:`Guardrail` (validated)."""

    alpha: float = 0.05
    tolerance: float = 0.01
    min_episodes: int = 30
    factor: float = 1.05
    lr_bounds: tuple[float, float] = (0.1, 2.0)
    explore_bounds: tuple[float, float] = (0.5, 3.0)
    z: float = 3.0

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_float("alpha", self.alpha, 0.0, 1.0, lo_open=True)
        check_float("tolerance", self.tolerance, 0.0, 1.0)
        check_float("z", self.z, 0.0, 10.0)
        check_int("min_episodes", self.min_episodes, 0)
        check_float("factor", self.factor, 1.0, 10.0)
        for name, bounds in (("lr_bounds", self.lr_bounds), ("explore_bounds", self.explore_bounds)):
            try:
                lo, hi = bounds
            except (TypeError, ValueError):
                raise ValidationError(f"{name} must be a (low, high) pair, got {bounds!r}") from None
            check_float(f"{name}[0]", lo, 0.0, 10.0)
            check_float(f"{name}[1]", hi, 0.0, 10.0)
            if not lo <= 1.0 <= hi:
                raise ValidationError(f"{name} must contain 1, got {(lo, hi)}")
        object.__setattr__(self, "lr_bounds", tuple(float(x) for x in self.lr_bounds))
        object.__setattr__(self, "explore_bounds", tuple(float(x) for x in self.explore_bounds))


def _ndcg_of_order(gains: np.ndarray, scores: np.ndarray) -> float:
    order = np.argsort(-scores, kind="stable")
    disc = 1.0 / np.log2(np.arange(2, gains.shape[0] + 2))
    ideal = float(np.sort(gains)[::-1] @ disc)
    return float(gains[order] @ disc) / ideal if ideal > 0 else 0.0


def _towards_one(x: float, factor: float) -> float:
    return min(1.0, x * factor) if x < 1.0 else max(1.0, x / factor)


class Guardrail:
    """Rolling paired comparison of learned against default weights, with bounded tuning multipliers."""

    def __init__(
        self,
        *,
        alpha: float = 0.05,
        tolerance: float = 0.01,
        min_episodes: int = 30,
        factor: float = 1.05,
        lr_bounds: tuple[float, float] = (0.1, 2.0),
        explore_bounds: tuple[float, float] = (0.5, 3.0),
        z: float = 3.0,
    ) -> None:
        self.hyper = GuardrailParams(alpha, tolerance, min_episodes, factor, lr_bounds, explore_bounds, z)
        self._ema = 0.0  # exponentially weighted sums of the differences and their squares (uncorrected)
        self._ema2 = 0.0
        self._n = 0
        self._lr = 1.0
        self._explore = 1.0

    def _moments(self) -> tuple[float, float]:
        """Bias-corrected rolling mean of the differences and the standard error of that mean."""
        if self._n == 0:
            return 0.0, 0.0
        a = self.hyper.alpha
        seen = 1.0 - (1.0 - a) ** self._n  # the weight the observations hold in the sums
        mean, second = self._ema / seen, self._ema2 / seen
        n_eff = min(float(self._n), (2.0 - a) / a)  # effective sample size of an EMA
        return mean, math.sqrt(max(second - mean * mean, 0.0) / n_eff)

    @property
    def lift(self) -> float:
        """Rolling mean gain of the learned weights over the default (nDCG of the shown chunks)."""
        return self._moments()[0]

    @property
    def multipliers(self) -> tuple[float, float]:
        """``(learning-rate multiplier, exploration multiplier)``."""
        return self._lr, self._explore

    def observe(
        self, shown: np.ndarray, chunk_rewards: np.ndarray, learned: np.ndarray, default: np.ndarray
    ) -> tuple[float, float]:
        """Take one episode into account; returns the updated multipliers."""
        gains = np.maximum(np.asarray(chunk_rewards, dtype=float), 0.0)
        X = np.asarray(shown, dtype=float)
        if X.ndim != 2 or X.shape[0] < 2 or not np.any(gains > 0) or X.shape[1] != len(learned):
            return self.multipliers
        if ranks_nothing(gains):  # praise of every shown chunk alike: no order is better, no comparison
            return self.multipliers
        diff = _ndcg_of_order(gains, X @ learned) - _ndcg_of_order(gains, X @ default)
        a = self.hyper.alpha
        self._ema = (1 - a) * self._ema + a * diff
        self._ema2 = (1 - a) * self._ema2 + a * diff * diff
        self._n += 1
        p = self.hyper
        if self._n >= p.min_episodes:
            mean, se = self._moments()
            if mean + p.z * se < -p.tolerance:
                self._lr = max(p.lr_bounds[0], self._lr / p.factor)
                self._explore = min(p.explore_bounds[1], self._explore * p.factor)
            elif mean - p.z * se > p.tolerance:
                self._lr = min(p.lr_bounds[1], self._lr * p.factor)
                self._explore = max(p.explore_bounds[0], self._explore / p.factor)
            else:  # no clear difference (any more): ease back towards 1, one step at a time
                self._lr = _towards_one(self._lr, p.factor)
                self._explore = _towards_one(self._explore, p.factor)
        return self.multipliers

    def state_dict(self) -> dict[str, Any]:
        d = asdict(self.hyper)
        d["lr_bounds"] = list(d["lr_bounds"])
        d["explore_bounds"] = list(d["explore_bounds"])
        return {"params": d, "ema": self._ema, "ema2": self._ema2, "n": self._n, "lr": self._lr,
                "explore": self._explore}

    def load_state_dict(self, state: Mapping[str, Any]) -> Guardrail:
        try:
            # a count over MAX_COUNT (10**400) loaded, and the next update took it as a float: OverflowError
            n = saved_count("the guardrail's episode count", state["n"])
            ema, lr, ex = float(state["ema"]), float(state["lr"]), float(state["explore"])
            # absent in states saved before the guardrail kept it: no spread known yet
            ema2 = float(state.get("ema2", ema * ema))
        except CorruptStateError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # OverflowError: an infinite count
            raise CorruptStateError(f"cannot read the guardrail state: {exc!r}") from exc
        p = self.hyper
        if not (-1.0 <= ema <= 1.0 and 0.0 <= ema2 <= 1.0 and n >= 0 and p.lr_bounds[0] <= lr <= p.lr_bounds[1]
                and p.explore_bounds[0] <= ex <= p.explore_bounds[1]):
            raise CorruptStateError("guardrail state is out of range")
        if ema * ema > ema2 + 1e-9:
            # the mean's square above the mean square is a negative variance, which no sequence of rewards gives:
            # its standard error of 0 would let the next episode move the multipliers on the mean alone
            raise CorruptStateError(f"guardrail state is inconsistent: ema {ema!r} squared is above ema2 {ema2!r}")
        self._ema, self._ema2, self._n, self._lr, self._explore = ema, ema2, n, lr, ex
        return self
