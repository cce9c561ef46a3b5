"""``BatchPolicy``: the batch weight updater of the design we work from.

It collects ``batch_size`` (50) feedback events. When their mean reward is
above ``positive_threshold`` (0.5, a rating above 4 of 5) it moves the weights
towards the weights that did well in those events; below ``negative_threshold``
(-0.5, a rating below 2 of 5) away from the ones that did badly; in between it
does nothing. The direction is computed from the weights that were logged with
each event, never drawn at random:

``d = sum_i (r_i - mean r) (w_i - w) / sum_i |r_i - mean r|``

that is, the reward-weighted mean of the logged weights minus the current
weights, with rewards centred on the batch mean, so that it points towards the
weights that scored better within the batch. ``d`` is divided by the mean
distance of the logged weights from ``w`` (so a batch whose rewards line up
perfectly with one direction moves the weights by ``learning_rate``), the step
is bounded by ``max_step``, and the result is clipped to ``bounds`` and
renormalised ((0.05, 0.95) by default, with a lower bound of ``0.5/n`` from 20
retrievers on, where 0.05 would pin every weight at ``1/n``).

To have anything to compare, its decisions vary: with ``explore=True`` it
plays, with equal probability, the current weights or a step from them towards
one retriever (``concentration`` sets the step, ``4 / sqrt(concentration)``).
The action set is discrete, so the logged propensity is a true probability,
as off-policy evaluation needs: ``1 / (n_retrievers + 1)``, or a multiple of
it where the bounds make several actions show the same weights (at 0.95, a
step towards that retriever is the current weights again).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, InvalidWeightsError, ValidationError
from rlfb.hyperparameters import check_float, check_int, plain_numbers
from rlfb.policies.base import BasePolicy, Context, Decision, Episode
from rlfb.policies.simplex import (
    check_bounds,
    check_simplex,
    check_within_bounds,
    logged_weights,
    project_simplex,
    weights_dict,
    weights_vector,
)
from rlfb.saved_state import check_at_most, float_list, read_array, read_count, read_field, read_number

__all__ = ["BatchParams", "BatchPolicy"]


@dataclass(frozen=True)
class BatchParams:
    """Hyperparameters of :class:`BatchPolicy` (validated on construction).

    >>> BatchParams(batch_size=0)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: batch_size must be in [1, 100000], got 0
    """

    batch_size: int = 50
    learning_rate: float = 0.05
    max_step: float = 0.1
    positive_threshold: float = 0.5
    negative_threshold: float = -0.5
    concentration: float = 200.0
    bounds: tuple[float, float] = (0.05, 0.95)  # the policy passes default_bounds(n) where none are given

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_int("batch_size", self.batch_size, 1, 100_000)
        check_float("learning_rate", self.learning_rate, 0.0, 1.0)
        check_float("max_step", self.max_step, 0.0, 1.0, lo_open=True)
        check_float("positive_threshold", self.positive_threshold, -1.0, 1.0)
        check_float("negative_threshold", self.negative_threshold, -1.0, 1.0)
        if self.negative_threshold > self.positive_threshold:
            raise ValidationError("negative_threshold must not exceed positive_threshold")
        check_float("concentration", self.concentration, 1.0, 1e6)
        object.__setattr__(self, "bounds", check_bounds(self.bounds))


class BatchPolicy(BasePolicy):
    """The design's batch updater over fusion weights.

    Parameters
    ----------
    retrievers
        Retriever names.
    weights
        The starting (default) weights; ``None`` for equal weights.
    batch_size, learning_rate, max_step, positive_threshold, negative_threshold, concentration, bounds
        See :class:`BatchParams` and the module docstring. ``bounds=None``: (0.05, 0.95), the lower
        bound ``0.5/n`` from 20 retrievers on (:func:`~rlfb.policies.simplex.default_bounds`); a lower bound given at or
        over ``1/n`` is refused.
    seed
        Seed of the policy's own generator.

    Examples
    --------
    >>> p = BatchPolicy(["bm25", "dense"], seed=1)
    >>> p.weights()
    {'bm25': 0.5, 'dense': 0.5}
    >>> p.decide(None, explore=False).explored
    False
    """

    name = "batch"
    params_type = BatchParams

    def __init__(
        self,
        retrievers: Sequence[str],
        weights: Mapping[str, float] | Sequence[float] | None = None,
        *,
        batch_size: int = 50,
        learning_rate: float = 0.05,
        max_step: float = 0.1,
        positive_threshold: float = 0.5,
        negative_threshold: float = -0.5,
        concentration: float = 200.0,
        bounds: tuple[float, float] | None = None,
        seed: int | None = 0,
    ) -> None:
        super().__init__(retrievers, seed)
        self.hyper = BatchParams(
            batch_size=batch_size,
            learning_rate=learning_rate,
            max_step=max_step,
            positive_threshold=positive_threshold,
            negative_threshold=negative_threshold,
            concentration=concentration,
            bounds=self._bounds_or_default(bounds),
        )
        self._check_bounds_fit(self.hyper.bounds)
        lo, hi = self.hyper.bounds
        self._default = project_simplex(weights_vector(weights, self.retrievers), lo, hi)
        self._w = self._default.copy()
        self._buffer: list[tuple[list[float], float, float]] = []
        self._n_batches = 0
        self._n_moves = 0
        self._last_mean = 0.0

    # ------------------------------------------------------------------ deciding
    def decide(self, context: Context | None, *, explore: bool = True) -> Decision:
        """The current weights, or with ``explore=True`` one of the current weights and a step from them
        towards each retriever, drawn uniformly."""
        w = self._w
        if not explore or len(self.retrievers) == 1 or self._explore_scale <= 0:
            return Decision(weights_dict(w, self.retrievers), arm=None, propensity=1.0,
                            explored=False, policy=self.name)
        # a discrete action, so that the logged propensity is a probability: keep the current
        # weights, or move a step towards one retriever; the step shrinks as concentration grows
        n = len(self.retrievers)
        step = min(0.5, 4.0 / math.sqrt(self.hyper.concentration / self._explore_scale))
        choice = int(self._rng.integers(n + 1))  # uniform over the current weights and n directions
        lo, hi = self.hyper.bounds
        actions = [project_simplex(w + step * (np.eye(n)[i] - w), lo, hi) for i in range(n)] + [w]
        shown = actions[choice]
        # at a bound several actions show the same weights (a step towards a retriever already at 0.95
        # stays put): they are one action, whose probability is the sum of theirs
        same = [i for i, a in enumerate(actions) if np.allclose(a, shown, rtol=0.0, atol=1e-12)]
        return Decision(
            weights_dict(shown, self.retrievers),
            # one action, one label: the weights as shown, not the direction they happened to be drawn by
            # (the store's per-arm report would split the current weights over two labels)
            arm="current" if n in same else f"towards:{self.retrievers[same[0]]}",
            propensity=len(same) / (n + 1),
            explored=n not in same,  # the current weights, however drawn, are no exploration
            policy=self.name,
        )

    # ------------------------------------------------------------------ learning
    def learn(self, episode: Episode, reward: float, *, weight: float = 1.0) -> BatchPolicy:
        """Buffer the event's logged weights and reward; update once ``batch_size`` are buffered."""
        r = check_float("reward", reward)
        weight = check_float("weight", weight, 0.0)
        if weight == 0.0:
            return self
        try:
            w = logged_weights(episode.decision.weights, self.retrievers)
        except InvalidWeightsError:
            w = self._w.copy()  # nothing usable was logged: count the reward at the current weights
        self._buffer.append(([float(x) for x in w], max(-1.0, min(1.0, r)), weight))
        self._n_updates += weight
        if len(self._buffer) >= self.hyper.batch_size:
            self._update()
        return self

    def _update(self) -> None:
        W = np.asarray([b[0] for b in self._buffer], dtype=float)
        r = np.asarray([b[1] for b in self._buffer], dtype=float)
        om = np.asarray([b[2] for b in self._buffer], dtype=float)
        self._buffer.clear()
        self._n_batches += 1
        mean = float(np.sum(om * r) / np.sum(om))
        self._last_mean = mean
        p = self.hyper
        if p.negative_threshold <= mean <= p.positive_threshold:
            return
        D = W - self._w[None, :]
        rc = r - mean
        den = float(np.sum(om * np.abs(rc)))
        radius = float(np.sum(om * np.linalg.norm(D, axis=1)) / np.sum(om))
        if den <= 1e-12 or radius <= 1e-9:
            return  # every event scored the same, or used the same weights: no direction
        d = (om * rc) @ D / den
        step = p.learning_rate * self._lr_scale * d / radius
        norm = float(np.linalg.norm(step))
        if norm > p.max_step:
            step *= p.max_step / norm
        lo, hi = p.bounds
        self._w = project_simplex(self._w + step, lo, hi)
        self._n_moves += 1

    # ------------------------------------------------------------------ reading
    def weights(self, query_type: str | None = None) -> dict[str, float]:
        return weights_dict(self._w, self.retrievers)

    @property
    def default_weights(self) -> np.ndarray:
        return self._default.copy()

    def set_weights(self, weights: Mapping[str, float] | Sequence[float]) -> BatchPolicy:
        """Replace the current weights (validated, then clipped to the bounds)."""
        lo, hi = self.hyper.bounds
        self._w = project_simplex(weights_vector(weights, self.retrievers), lo, hi)
        return self

    def uncertainty(self, context: Context | None) -> float:
        return float(1.0 / math.sqrt(1.0 + self._n_batches))

    def params(self) -> dict[str, Any]:
        d = asdict(self.hyper)
        d["bounds"] = list(d["bounds"])
        d["weights"] = weights_dict(self._default, self.retrievers)
        return d

    def _state(self) -> dict[str, Any]:
        return {
            "weights": float_list(self._w),
            "default": float_list(self._default),
            "buffer": [[b[0], b[1], b[2]] for b in self._buffer],
            "n_batches": self._n_batches,
            "n_moves": self._n_moves,
            "last_mean": self._last_mean,
        }

    def _load_state(self, state: Mapping[str, Any]) -> None:
        n = len(self.retrievers)
        # the default too: one off the simplex loaded, and the next save could not be rebuilt (InvalidWeightsError)
        w = check_simplex("saved batch weights", read_array(state, "weights", n))
        default = check_simplex("saved batch default weights", read_array(state, "default", n))
        # both are projected within the bounds whenever they change: outside them they were served as they were
        # (the buffer's logged weights are another policy's, or explored ones, and need not be)
        check_within_bounds("weights", w, self.hyper.bounds)
        check_within_bounds("default", default, self.hyper.bounds)
        buffer = []
        for i, item in enumerate(read_field(state, "buffer", list)):
            try:
                bw, br, bo = item
                bw, br, bo = [float(x) for x in bw], float(br), float(bo)
            except (TypeError, ValueError) as exc:
                raise CorruptStateError(f"policy state field 'buffer': event {i} is malformed: {exc}") from exc
            # learn() buffers rewards clipped to [-1, 1] and positive weights: a weight of 0 or less could make
            # the batch's weight sum 0, and its mean NaN
            if (len(bw) != n or not all(math.isfinite(x) for x in [*bw, br, bo])
                    or not -1.0 <= br <= 1.0 or bo <= 0.0):
                raise CorruptStateError(f"policy state field 'buffer': event {i} is malformed: {item!r}")
            # its logged weights as logged_weights() gives them
            check_simplex(f"policy state field 'buffer': event {i}'s weights", np.asarray(bw))
            buffer.append((bw, br, bo))
        # counted, never negative: a negative n_batches passed, and uncertainty()'s sqrt(1 + n) then failed at every
        # retrieval of every ensemble on the store; each batch moves the weights at most once
        n_batches = read_count(state, "n_batches")
        n_moves = read_count(state, "n_moves")
        if n_moves > n_batches:
            raise CorruptStateError(f"saved batch state has {n_moves} moves in only {n_batches} batches")
        last_mean = read_number(state, "last_mean", -1.0, 1.0)  # a weighted mean of rewards in [-1, 1]
        # learn() buffers every event it counts in n_updates and learns the buffer, emptying it, once it holds
        # batch_size events: so the buffer holds fewer, weighing at most n_updates, and all of it before a first batch
        held = sum(b[2] for b in buffer)
        if len(buffer) >= self.hyper.batch_size:
            raise CorruptStateError(f"policy state field 'buffer' holds {len(buffer)} events, a full batch of "
                                    f"{self.hyper.batch_size} is learned as it fills")
        check_at_most("policy state field 'buffer': its events' weight", held, self._n_updates)
        if n_batches == 0 and held < self._n_updates * (1.0 - 1e-9) - 1e-9:
            raise CorruptStateError(f"policy state field 'buffer' holds events of weight {held:g}, but "
                                    f"{self._n_updates:g} were learned and no batch: events were lost from it")
        self._w, self._default, self._buffer = w, default, buffer
        self._n_batches, self._n_moves, self._last_mean = n_batches, n_moves, last_mean
