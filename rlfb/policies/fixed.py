"""``FixedPolicy``: static fusion weights, the baselines every learner is measured against.

With equal weights over min-max scores it is "equal min-max"; over RRF scores
it is RRF. The normalisation is the ensemble's choice, not the policy's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, InvalidWeightsError
from rlfb.hyperparameters import check_float
from rlfb.policies.base import BasePolicy, Context, Decision, Episode
from rlfb.policies.simplex import weights_dict, weights_vector

__all__ = ["FixedParams", "FixedPolicy"]


@dataclass(frozen=True)
class FixedParams:
    """The weights in retriever order: finite, non-negative, summing to one (the policy normalises them first).

    >>> FixedParams((0.75, 0.25)).weights
    (0.75, 0.25)
    >>> FixedParams((-1.0, float("nan")))
    Traceback (most recent call last):
    ...
    rlfb.errors.InvalidWeightsError: FixedParams weights must be finite and non-negative and sum to one, ...
    """

    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        # was taken unchecked, though exported and said to be validated: FixedParams((-1.0, nan)) was accepted
        try:
            w = np.array(self.weights, dtype=float)
        except (TypeError, ValueError):
            w = np.array([np.nan])
        if w.ndim != 1 or not w.size or not np.isfinite(w).all() or (w < 0).any() or abs(w.sum() - 1.0) > 1e-9:
            raise InvalidWeightsError(
                f"FixedParams weights must be finite and non-negative and sum to one, got {self.weights!r}"
            )
        object.__setattr__(self, "weights", tuple(float(x) for x in w))


class FixedPolicy(BasePolicy):
    """Always the same weights; learning is a no-op.

    Parameters
    ----------
    retrievers
        Retriever names, in the column order of the score matrices.
    weights
        ``{name: weight}`` or a sequence in retriever order; ``None`` for equal
        weights. They must be finite and non-negative, not all zero, and name
        exactly the retrievers; they are normalised to sum to one. Zero is
        allowed, so ``{"bm25": 1, "dense": 0}`` is BM25 alone.
    seed
        Unused (the policy never samples); accepted so every policy has one signature.

    Examples
    --------
    >>> p = FixedPolicy(["bm25", "dense"], {"bm25": 3, "dense": 1})
    >>> p.weights()
    {'bm25': 0.75, 'dense': 0.25}
    >>> FixedPolicy(["bm25", "dense"], {"bm25": float("nan"), "dense": 1})
    Traceback (most recent call last):
    ...
    rlfb.errors.InvalidWeightsError: weights must be finite, got {'bm25': nan, 'dense': 1}
    """

    name = "fixed"

    def __init__(
        self,
        retrievers: Sequence[str],
        weights: Mapping[str, float] | Sequence[float] | None = None,
        *,
        seed: int | None = 0,
    ) -> None:
        super().__init__(retrievers, seed)
        self._w = weights_vector(weights, self.retrievers)
        self.hyper = FixedParams(tuple(float(x) for x in self._w))

    def decide(self, context: Context, *, explore: bool = True) -> Decision:
        """The fixed weights; never explores."""
        return Decision(weights=weights_dict(self._w, self.retrievers), arm="fixed", propensity=1.0,
                        explored=False, policy=self.name)

    def learn(self, episode: Episode, reward: float, *, weight: float = 1.0) -> FixedPolicy:
        """Count the episode; the weights do not change."""
        check_float("reward", reward)  # checked as every policy does, though unused
        self._n_updates += check_float("weight", weight, 0.0)
        return self

    def weights(self, query_type: str | None = None) -> dict[str, float]:
        return weights_dict(self._w, self.retrievers)

    @property
    def default_weights(self) -> np.ndarray:
        return self._w.copy()

    def params(self) -> dict[str, Any]:
        return {"weights": weights_dict(self._w, self.retrievers)}

    def _state(self) -> dict[str, Any]:
        return {"weights": [float(x) for x in self._w]}

    def set_weights(self, weights: Mapping[str, float] | Sequence[float]) -> FixedPolicy:
        """Replace the weights (validated as in the constructor), e.g. after ``rlfb weights import``."""
        self._w = weights_vector(weights, self.retrievers)
        self.hyper = FixedParams(tuple(float(x) for x in self._w))
        return self

    def _load_state(self, state: Mapping[str, Any]) -> None:
        try:
            w = weights_vector(list(state["weights"]), self.retrievers)
        except InvalidWeightsError as exc:
            raise CorruptStateError(f"saved fixed weights are invalid: {exc}") from exc
        self._w = w
        self.hyper = FixedParams(tuple(float(x) for x in w))
