"""``GradientPolicy``: Pairwise Differentiable Gradient Descent over the fusion weights.

PDGD (Oosterhuis and de Rijke, 2018) learns a linear ranker from clicks. Here
the linear model is the fusion itself, ``f(d) = w . x_d / (temperature * scale)``
over a candidate's normalised retriever scores ``x_d`` (plus the learner's
confidence and memory offsets, which do not depend on ``w``); ``scale`` is the
largest absolute normalised score, so the temperature means the same under
min-max, z-score and RRF normalisation.

Exploring. With ``explore=True`` a whole ranking is sampled from the
Plackett-Luce model ``P(d | remaining) = exp f(d) / sum exp f`` (with the
Gumbel trick) and returned in ``Decision.ranking``; its propensity is the
probability of the shown top ``k``. ``explore=False`` ranks by ``f``. The
guardrail's exploration multiplier scales the sampling temperature, and the
temperature used is logged as ``Decision.sampling_temperature``.

Learning. From chunk-level rewards PDGD infers preferences: a rewarded chunk
beats every unrewarded chunk shown above the last rewarded one and the first
one below it. Each pair ``(i, j)`` contributes the gradient of
``P(i > j) = exp f_i / (exp f_i + exp f_j)`` weighted by
``rho = P(R*) / (P(R) + P(R*))``, where ``R*`` is the shown ranking with ``i``
and ``j`` swapped: PDGD's debiasing, which makes a pair that the sampling was
as likely to show the other way round count fully and a pair that position
alone explains count little. ``rho`` uses the logged weights and the logged
sampling temperature (multiplier 1 when a decision lacks it), so a late
reward updates the decision that was made; the memory's offsets in the logged
fused scores are left out, or a click that the memory explains would teach
the weights nothing. The mass of the candidates that were not shown is
not logged and is taken as zero.

Evidence before change. A plain pairwise perceptron on noisy clicks drifts to
extreme weights, so the per-episode PDGD gradients are not applied one by one.
The policy keeps exponentially weighted running sums of them (``window``
episodes, at least 3) and steps along their mean shrunk towards zero by ``evidence_z``
standard errors of the unbiased variance (a coordinate moves only where the
mean gradient is clearly non-zero; below an effective count of two gradients
the standard error is infinite). The count is the sum of the decayed weights,
about half the Kish effective size of a full window, so ``evidence_z`` 3 acts
like about 4.2: consecutive gradients are not independent (questions repeat),
and with the Kish size the weights moved on a world where no retriever is
better. The shrunk mean is divided by the gradients' root mean square
(as in Adam), so the direction is a signal-to-noise ratio in [-1, 1] and does
not depend on the scale of scores or rewards.

Safety. The learning rate decays (``learning_rate / sqrt(1 + t / lr_decay)``,
never below ``min_learning_rate`` unless ``learning_rate`` itself is lower); every step is pulled back towards the
default weights with strength ``shrinkage`` (at equilibrium the weights sit
``signal / shrinkage`` away from the default) and bounded by ``max_step``; the
weights are projected back onto the simplex with ``bounds`` ((0.05, 0.95) by
default, with a lower bound of ``0.5/n`` from 20 retrievers on, where 0.05 would pin them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, InvalidWeightsError, ValidationError
from rlfb.fusion import score_scale
from rlfb.hyperparameters import check_float, plain_numbers
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
from rlfb.saved_state import MAX_COUNT, check_at_most, float_list, read_array, read_field, read_number

__all__ = ["GradientParams", "GradientPolicy", "pdgd_pairs", "plackett_luce_log_prob", "pdgd_debias_weights"]


def pdgd_pairs(rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PDGD's inferred preferences over a shown list, best first.

    A chunk with a positive reward (a click) is preferred over every
    unrewarded chunk shown above the last positive one and over the first
    unrewarded chunk right below it (Oosterhuis and de Rijke, 2018). Chunks
    with a negative reward are always on the losing side. Returns the
    positions of the preferred and the dispreferred chunks.

    >>> pos, neg = pdgd_pairs(np.array([0.0, 1.0, 0.0, 0.0]))
    >>> pos.tolist(), neg.tolist()
    ([1], [0, 2])
    """
    r = np.asarray(rewards, dtype=float)
    pos = np.flatnonzero(r > 0)
    if pos.size == 0:
        return pos, np.flatnonzero(r < 0)
    last = int(pos[-1])
    cutoff = min(last + 2, r.shape[0])
    region = np.zeros(r.shape[0], dtype=bool)
    region[:cutoff] = True
    neg = np.flatnonzero((region & (r <= 0)) | (r < 0))
    return pos, neg


def plackett_luce_log_prob(scores: np.ndarray, ranking: np.ndarray) -> float:
    """Log-probability that Plackett-Luce over ``scores`` puts ``ranking`` first, in that order.

    >>> round(math.exp(plackett_luce_log_prob(np.array([0.0, 0.0]), np.array([1]))), 3)
    0.5
    """
    s = np.asarray(scores, dtype=float)
    r = np.asarray(ranking, dtype=int)
    if r.size == 0:
        return 0.0
    top = float(s.max())
    e = np.exp(s - top)
    er = e[r]
    rest = np.ones(s.size, dtype=bool)
    rest[r] = False
    # each step's remaining mass as a sum of what remains (the chosen item, those after it, the unchosen),
    # not the total less what came before: that difference cancels to 0 once the first items dominate,
    # and a ranking of probability 1e-8 was logged with propensity 1
    denom = np.cumsum(er[::-1])[::-1] + float(e[rest].sum())
    er = np.maximum(er, 1e-300)
    return float(min(0.0, np.sum(np.log(er) - np.log(np.maximum(denom, 1e-300)))))


def pdgd_debias_weights(scores: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """PDGD's ``rho`` for each (pos, neg) pair of positions in a shown ranking.

    ``scores`` are the log-potentials of the shown chunks in shown order. For
    positions ``lo < hi`` the swapped ranking changes only the Plackett-Luce
    denominators of the positions after ``lo`` up to ``hi``, so
    ``P(R*)/P(R) = prod_{p=lo+1..hi} D_p / (D_p - e_hi + e_lo)``.
    Returns a ``(len(pos), len(neg))`` array.

    >>> pdgd_debias_weights(np.array([0.0, 0.0]), np.array([1]), np.array([0])).round(3).tolist()
    [[0.5]]
    """
    s = np.asarray(scores, dtype=float)
    e = np.exp(s - s.max())
    D = np.cumsum(e[::-1])[::-1]  # D_p = sum_{q >= p} e_q
    P, N = np.meshgrid(pos, neg, indexing="ij")
    lo = np.minimum(P, N).ravel()
    hi = np.maximum(P, N).ravel()
    p = np.arange(s.shape[0])
    mask = (p[None, :] > lo[:, None]) & (p[None, :] <= hi[:, None])
    swapped = D[None, :] - e[hi][:, None] + e[lo][:, None]
    log_ratio = np.where(mask, np.log(D)[None, :] - np.log(np.maximum(swapped, 1e-300)), 0.0).sum(axis=1)
    rho = 1.0 / (1.0 + np.exp(-log_ratio))  # ratio / (1 + ratio)
    return rho.reshape(P.shape)


def _sampling_temperature(decision: Decision, fallback: float) -> float:
    """The temperature the decision's ranking was sampled with; ``fallback`` if it was logged without one.

    A decision logged before the temperature travelled with it (or by another engine) falls back to
    the policy's temperature at the shown chunks' scale with an exploration multiplier of 1.
    """
    t = getattr(decision, "sampling_temperature", None)
    try:
        t = float(t) if t is not None else None
    except (TypeError, ValueError):
        t = None
    return t if t is not None and math.isfinite(t) and t > 0 else fallback


@dataclass(frozen=True)
class GradientParams:
    """Hyperparameters of :class:`GradientPolicy` (validated on construction).

    >>> GradientParams(temperature=0)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: temperature must be in [0.001, 10], got 0
    """

    learning_rate: float = 0.05
    lr_decay: float = 200.0
    min_learning_rate: float = 0.005
    temperature: float = 0.02
    shrinkage: float = 1.0
    evidence_z: float = 3.0
    window: float = 200.0
    max_step: float = 0.05
    bounds: tuple[float, float] = (0.05, 0.95)  # the policy passes default_bounds(n) where none are given

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_float("learning_rate", self.learning_rate, 0.0, 10.0)
        check_float("lr_decay", self.lr_decay, 0.0, None, lo_open=True)
        check_float("min_learning_rate", self.min_learning_rate, 0.0, 10.0)
        # at 5e-324 the scores overflowed and the gradient sums went NaN, so no state could be saved
        check_float("temperature", self.temperature, 1e-3, 10.0)
        check_float("shrinkage", self.shrinkage, 0.0, 100.0)
        check_float("evidence_z", self.evidence_z, 0.0, 10.0)
        # the effective count of gradients only approaches the window, and the gate needs two of them: a window
        # of 2 or less never opened it, so the weights never moved
        check_float("window", self.window, 3.0, 1e7)
        check_float("max_step", self.max_step, 0.0, 1.0, lo_open=True)
        object.__setattr__(self, "bounds", check_bounds(self.bounds))


class GradientPolicy(BasePolicy):
    """PDGD over the fusion weights, with Plackett-Luce exploration.

    Parameters
    ----------
    retrievers
        Retriever names.
    weights
        The default weights (start and shrinkage target); ``None`` for equal weights.
    learning_rate, lr_decay, min_learning_rate, temperature, shrinkage, evidence_z, window, max_step, bounds
        See :class:`GradientParams` and the module docstring (``window``: the episodes the running sums of
        the gradients span; ``evidence_z``: how many standard errors their mean is shrunk by).
        ``bounds=None``: (0.05, 0.95), the lower bound ``0.5/n`` from 20 retrievers on
        (:func:`~rlfb.policies.simplex.default_bounds`); a lower bound given at or over ``1/n`` is refused.
    seed
        Seed of the policy's own generator.

    Examples
    --------
    >>> p = GradientPolicy(["bm25", "dense"], seed=0)
    >>> ctx = Context("q", ("bm25", "dense"), ("a", "b", "c"), np.zeros((3, 2)),
    ...               np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]), k=2)
    >>> len(p.decide(ctx).ranking)
    2
    >>> p.decide(ctx, explore=False).ranking is None
    True
    """

    name = "gradient"
    params_type = GradientParams

    def __init__(
        self,
        retrievers: Sequence[str],
        weights: Mapping[str, float] | Sequence[float] | None = None,
        *,
        learning_rate: float = 0.05,
        lr_decay: float = 200.0,
        min_learning_rate: float = 0.005,
        temperature: float = 0.02,
        shrinkage: float = 1.0,
        evidence_z: float = 3.0,
        window: float = 200.0,
        max_step: float = 0.05,
        bounds: tuple[float, float] | None = None,
        seed: int | None = 0,
    ) -> None:
        super().__init__(retrievers, seed)
        self.hyper = GradientParams(
            learning_rate=learning_rate, lr_decay=lr_decay, min_learning_rate=min_learning_rate,
            temperature=temperature, shrinkage=shrinkage, evidence_z=evidence_z, window=window,
            max_step=max_step, bounds=self._bounds_or_default(bounds),
        )
        self._check_bounds_fit(self.hyper.bounds)
        lo, hi = self.hyper.bounds
        self._default = project_simplex(weights_vector(weights, self.retrievers), lo, hi)
        self._w = self._default.copy()
        self._n_pairs = 0.0
        n = len(self.retrievers)
        self._s0 = 0.0  # running (discounted) count of gradients
        self._s1 = np.zeros(n)  # running sum of gradients
        self._s2 = np.zeros(n)  # running sum of squared gradients

    # ------------------------------------------------------------------ deciding
    def decide(self, context: Context, *, explore: bool = True) -> Decision:
        """Current weights; with ``explore=True`` also a Plackett-Luce sampled ranking."""
        wd = weights_dict(self._w, self.retrievers)
        try:
            N = np.asarray(context.normalized, dtype=float)
            offsets = None if context.offsets is None else np.asarray(context.offsets, dtype=float)
        except (AttributeError, TypeError, ValueError) as exc:
            raise ValidationError(f"context must hold a matrix of normalised scores: {exc}") from exc
        # checked here too, not only by the Learner: NaN scores sampled a ranking with a made-up propensity
        if N.ndim != 2 or N.shape[1] != len(self.retrievers) or not np.all(np.isfinite(N)) \
                or (offsets is not None and (offsets.shape != (N.shape[0],) or not np.all(np.isfinite(offsets)))):
            raise ValidationError(f"context scores must be finite, of shape (n, {len(self.retrievers)}), and its "
                                  "offsets one finite number per candidate")
        n = N.shape[0]
        if not explore or n == 0 or self._explore_scale <= 0:
            return Decision(wd, arm=None, propensity=1.0, explored=False, policy=self.name)
        s = N @ self._w
        if offsets is not None:
            s = s + offsets
        tau = self.hyper.temperature * score_scale(N) * self._explore_scale
        u = s / tau
        k = max(1, min(int(context.k), n))
        keys = u + self._rng.gumbel(size=n)
        if k < n:
            top = np.argpartition(-keys, k - 1)[:k]
            ranking = top[np.argsort(-keys[top], kind="stable")]
        else:
            ranking = np.argsort(-keys, kind="stable")
        greedy = np.argsort(-s, kind="stable")[:k]
        prop = math.exp(plackett_luce_log_prob(u, ranking))
        return Decision(
            wd,
            arm=None,
            propensity=float(prop),
            explored=bool(not np.array_equal(ranking, greedy)),
            policy=self.name,
            ranking=tuple(int(i) for i in ranking),
            sampling_temperature=float(tau),
        )

    # ------------------------------------------------------------------ learning
    def _lr(self) -> float:
        p = self.hyper
        # the floor is never above the rate itself: learning_rate=0 learned at the default floor of 0.005
        floor = min(p.min_learning_rate, p.learning_rate)
        return max(floor, p.learning_rate / math.sqrt(1.0 + self._n_updates / p.lr_decay))

    def learn(self, episode: Episode, reward: float, *, weight: float = 1.0) -> GradientPolicy:
        """One PDGD step from the episode's chunk rewards (episodes without a preference are counted only)."""
        check_float("reward", reward)
        weight = check_float("weight", weight, 0.0)
        X = np.asarray(episode.shown, dtype=float)
        r = np.asarray(episode.chunk_rewards, dtype=float)
        if tuple(episode.retrievers) != self.retrievers:
            raise ValidationError(
                f"episode is for retrievers {list(episode.retrievers)}, not {list(self.retrievers)}"
            )
        if X.ndim == 2 and r.shape != (X.shape[0],):
            raise ValidationError(f"episode has {X.shape[0]} shown chunks but {r.shape} chunk rewards")
        if not (np.all(np.isfinite(X)) and np.all(np.isfinite(r))):
            raise ValidationError("episode scores and chunk rewards must be finite")
        if weight == 0.0 or (X.ndim == 2 and X.shape[1] != len(self.retrievers)):
            return self
        if X.ndim != 2 or X.shape[0] < 2:  # one chunk shown holds no preference: counted only, as the rest are
            self._n_updates += weight
            return self
        prior = episode.prior_rewards
        if prior is not None and np.shape(prior) == r.shape and np.any(np.asarray(prior) != 0):
            # a later click on the same event: read the pairs from all its clicks so far (a chunk clicked
            # before is no loser), but learn only this click's; the earlier ones were learned from then
            pos, neg = pdgd_pairs(r + np.asarray(prior, dtype=float))
            pos = pos[r[pos] > 0]
        else:
            pos, neg = pdgd_pairs(r)
        if pos.size == 0 or neg.size == 0:
            self._n_updates += weight
            return self
        scale = score_scale(X)
        tau = self.hyper.temperature * scale
        tau_log = _sampling_temperature(episode.decision, tau)
        try:
            w_log = logged_weights(episode.decision.weights, self.retrievers)
        except InvalidWeightsError:
            w_log = self._w
        base_log = X @ w_log
        # The logged fused scores (Episode.scores) also hold the memory's and confidence's offsets.
        # They are left out on purpose: a repeated question whose clicked chunk the memory already
        # put first would then explain the click by position alone, and teach the weights nothing.
        # rho corrects for how the shown ranking was drawn, so it is computed under the distribution it was
        # drawn from: at the temperature logged with the decision, which holds the guardrail's exploration
        # multiplier of that moment (the multiplier may have moved by the time the feedback comes).
        rho = pdgd_debias_weights(base_log / tau_log, pos, neg)
        # f is the learned model whose pairwise probability P(i > j) the step follows, not the sampling
        # distribution: it stays at the policy's own temperature, without the exploration multiplier. That
        # multiplier only widens the sampling (the greedy ranking ignores it); in f it would make how much
        # each pair counts (sigmoid(d) * sigmoid(-d)) depend on how far the guardrail had turned exploration up.
        f = (X @ self._w) / tau
        fp = f[pos][:, None]
        fn = f[neg][None, :]
        d = fp - fn
        pair_w = 0.25 / np.cosh(0.5 * d) ** 2  # = sigmoid(d) * sigmoid(-d), stable
        strength = np.minimum(r[pos], 1.0)[:, None]
        pw = rho * pair_w * strength
        diff = X[pos][:, None, :] - X[neg][None, :, :]
        grad = np.einsum("ij,ijk->k", pw, diff) / scale
        step_dir = self._evidence(grad, weight)
        eta = self._lr() * self._lr_scale * weight
        step = eta * (step_dir - self.hyper.shrinkage * (self._w - self._default))
        norm = float(np.linalg.norm(step))
        if norm > self.hyper.max_step:
            step *= self.hyper.max_step / norm
        lo, hi = self.hyper.bounds
        self._w = project_simplex(self._w + step, lo, hi)
        self._n_updates += weight
        self._n_pairs += float(pw.size) * weight
        return self

    def _evidence(self, grad: np.ndarray, weight: float) -> np.ndarray:
        """Add a gradient to the running sums; return the soft-thresholded, RMS-normalised mean."""
        beta = (1.0 - 1.0 / self.hyper.window) ** weight
        self._s0 = beta * self._s0 + weight
        self._s1 = beta * self._s1 + weight * grad
        self._s2 = beta * self._s2 + weight * grad * grad
        mean = self._s1 / self._s0
        second = self._s2 / self._s0
        n, z = self._s0, self.hyper.evidence_z
        if n < 2.0 and z > 0:
            # one gradient has no spread to measure: its standard error is unknown (infinite), not 0,
            # which let the very first click through at a full step
            shrunk = np.zeros_like(mean)
        else:
            var = np.maximum(second - mean * mean, 0.0) * n / max(n - 1.0, 1e-12)  # unbiased
            se = np.sqrt(var / n)
            shrunk = np.sign(mean) * np.maximum(np.abs(mean) - z * se, 0.0)
        rms = np.sqrt(second)
        return np.where(rms > 1e-12, shrunk / np.maximum(rms, 1e-12), 0.0)

    # ------------------------------------------------------------------ reading
    def weights(self, query_type: str | None = None) -> dict[str, float]:
        return weights_dict(self._w, self.retrievers)

    @property
    def default_weights(self) -> np.ndarray:
        return self._default.copy()

    def set_weights(self, weights: Mapping[str, float] | Sequence[float]) -> GradientPolicy:
        """Replace the current and the default weights (validated, clipped to the bounds).

        The default is the shrinkage target: left where it was, the weights drifted back to it
        within about 50 clicks.
        """
        lo, hi = self.hyper.bounds
        self._default = project_simplex(weights_vector(weights, self.retrievers), lo, hi)
        self._w = self._default.copy()
        return self

    def uncertainty(self, context: Context | None) -> float:
        return float(1.0 / math.sqrt(1.0 + self._n_updates / 50.0))

    def params(self) -> dict[str, Any]:
        d = asdict(self.hyper)
        d["bounds"] = list(d["bounds"])
        d["weights"] = weights_dict(self._default, self.retrievers)
        return d

    def _state(self) -> dict[str, Any]:
        return {
            "weights": float_list(self._w),
            "default": float_list(self._default),
            "n_pairs": self._n_pairs,
            "grad_sums": [float(self._s0), float_list(self._s1), float_list(self._s2)],
        }

    def _load_state(self, state: Mapping[str, Any]) -> None:
        n = len(self.retrievers)
        w = check_simplex("saved gradient weights", read_array(state, "weights", n))
        default = check_simplex("saved gradient default weights", read_array(state, "default", n))
        # both are projected within the bounds whenever they change: outside them they were served as they were
        check_within_bounds("weights", w, self.hyper.bounds)
        check_within_bounds("default", default, self.hyper.bounds)
        sums = read_field(state, "grad_sums", list)
        if len(sums) != 3:
            raise CorruptStateError(f"policy state field 'grad_sums' must hold a count, a sum and a sum of squares, "
                                    f"got {len(sums)} entries")
        named = {f"grad_sums[{i}]": v for i, v in enumerate(sums)}
        s0 = read_number(named, "grad_sums[0]", 0.0)
        s1, s2 = read_array(named, "grad_sums[1]", n), read_array(named, "grad_sums[2]", n)
        # only reported and saved, but an infinite count (1e999 reads as inf) made every later save fail
        n_pairs = read_number(state, "n_pairs", 0.0)
        # How far the sums can reach, from learn() and _evidence(): s0, s1 and s2 sum a, a*g and a*g*g over the same
        # decayed weights a <= w of the episodes' gradients g. A pair adds rho * sigmoid' * strength <= 1/4 times a
        # score difference of at most 2 scales (divided out), so |g| <= pairs / 2; n_pairs sums pairs * w, and an
        # episode's pairs are the entries of one array (fewer than MAX_COUNT). Hence s0 <= n_updates,
        # |s1| <= n_pairs / 2, s2 <= max|g| * sum a|g| <= MAX_COUNT / 2 * n_pairs / 2, n_pairs <= MAX_COUNT *
        # n_updates and s1 * s1 <= s0 * s2 (Cauchy-Schwarz). Sums of 1e300 loaded, and the steps follow their mean
        # over their root mean square.
        check_at_most("policy state field 'n_pairs'", n_pairs, MAX_COUNT * self._n_updates)
        check_at_most("policy state field 'grad_sums[0]'", s0, self._n_updates)
        check_at_most("policy state field 'grad_sums[1]' (its magnitude)", np.abs(s1), n_pairs / 2)
        check_at_most("policy state field 'grad_sums[2]'", s2, MAX_COUNT * n_pairs / 4)
        if np.any(s2 < 0) or np.any(s1 * s1 > s0 * s2 * (1.0 + 1e-9) + 1e-300):
            raise CorruptStateError("policy state field 'grad_sums' is malformed: a sum of squares is negative, or "
                                    "below the squared sum over the count")
        self._w, self._default = w, default
        self._n_pairs = n_pairs
        self._s0, self._s1, self._s2 = s0, s1, s2
