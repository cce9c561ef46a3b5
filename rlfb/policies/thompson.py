"""``ThompsonPolicy``: a contextual bandit over a grid of weight vectors, behind an evidence gate.

Arms. Arm 0, ``"default"``, is the default weights (equal unless given); the
others are the points of a grid on the simplex with step ``step`` (0.1 gives 66
arms for three retrievers, ``C(1/step + n - 1, n - 1)`` for ``n``), clipped to
``bounds`` ((0.05, 0.95) by default, the lower bound ``0.5/n`` from 20 retrievers on: see
:func:`~rlfb.policies.simplex.default_bounds`).

Posteriors. Each arm's mean reward has a Gaussian posterior. Neighbouring arms
share evidence through a Gaussian kernel of width ``bandwidth`` over the weight
vectors (rewards change smoothly with the weights), which makes 66 arms behave
like a handful. Statistics are kept globally and per query type; a type's
posterior is shrunk towards the global one with ``type_prior`` pseudo-samples,
so a type falls back to global statistics while it has few samples. The
statistics forget: ``forget`` per update and a ``half_life_days`` clock, so a
drifting world is followed.

Deciding. ``exploration="thompson"`` draws one sample per arm and plays the
best; ``"epsilon"`` plays the greedy arm, or with probability ``epsilon``
(decaying as ``epsilon / (1 + n / epsilon_decay)``) a uniformly random arm.
With Thompson sampling the default arm is also played outright with
probability ``baseline_share`` (0.1), so that the default keeps enough samples
to be compared with (the gate below needs them, and so does the guardrail).
The propensity is exact for epsilon-greedy and, for Thompson sampling, an unbiased
estimate over ``propensity_draws`` posterior draws (:func:`sampled_share`).

Evidence gate. The greedy choice (``explore=False``, what evaluation uses, and
what ``weights()`` shows) is the default arm unless another arm's lower
confidence bound on its advantage over the default is positive:
``mean_a - mean_0 - z * sqrt(var_a + var_0) > 0``, with ``z`` corrected for the
number of arms (Bonferroni at 5 % unless ``gate_z`` is given). On real
collections the best fixed weights are only 0.01 to 0.04 nDCG@10 above equal
weights, so without strong evidence the policy keeps the default. After more
than ``default_after`` (50) global samples, the default weights themselves move
by ``default_step`` towards the globally best arm whenever that arm passes the
gate.

Click evidence (``counterfactual=True``, the default). Rewards per arm are too
weak a signal to tell weights 0.01 nDCG@10 apart. So every clicked chunk also
scores *every* arm: the shown chunks are re-ranked by each arm's weights (plus
the memory's offsets) and the arm earns the DCG of the clicked chunk in its
order (:mod:`rlfb.policies.click_evidence`). Advantages over the default are
paired differences with a variance clustered by query. Once ``cf_min_clicks``
clicks are in (per query type, else globally; a type also needs clicks on
``cf_min_questions`` distinct questions, 1 by default: 10 suits a stream of few
questions asked many times), the greedy arm is the one with
the best lower bound ``advantage - cf_gate_z * sd`` (the default, whose bound
is 0, unless another arm is surely better), and that arm is shown: the
evidence leans towards the weights shown, so sampling arms from it would
reinforce whichever arm chance showed first. On cranfield this moves the
weights towards dense retrieval, as tuning on full judgments does. On toy
worlds where no retriever is better it keeps equal weights with the learner's
default settings (``tests/test_policies.py``); with the feedback memory and
chunk exploration off it moves on some seeds (12 of 36 weightings over 3 worlds
x 4 seeds x global and two query types, 0.010 nDCG@10 worse on average): the
gate (``cf_gate_z``) takes the best of 66 arms without a correction for
testing that many. The epsilon policy moves with the defaults too.

Only clicks add click evidence: a thumbs down or a reformulation says that the
answer was bad, not which weights would have ranked a good chunk higher, and
praise spread alike over every shown chunk says no order of them is better (it
teaches the arms' reward posterior, as any reward does). But
every timed feedback passes time: the global evidence and its query type's decay
on the ``half_life_days`` clock at each one (``forget`` applies per click), so
evidence that stops being renewed falls below ``cf_min_clicks`` and the gate,
and arm sampling, resume.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfb.credit import ranks_nothing
from rlfb.decay import clock_decay, episode_time
from rlfb.errors import CorruptStateError, InvalidWeightsError, ValidationError
from rlfb.hyperparameters import check_float
from rlfb.policies.arms import _arm_names, sampled_share, simplex_grid
from rlfb.policies.base import BasePolicy, Context, Decision, Episode
from rlfb.policies.click_evidence import ClickEvidence, shown_utility
from rlfb.policies.simplex import (
    check_simplex,
    check_within_bounds,
    logged_weights,
    project_simplex,
    weights_dict,
    weights_vector,
)
from rlfb.policies.thompson_params import ThompsonParams
from rlfb.saved_state import check_at_most, float_list, read_array, read_field, read_number, saved_times

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ThompsonParams", "ThompsonPolicy", "EpsilonGreedyPolicy", "sampled_share", "simplex_grid"]

GLOBAL = "*"


class ThompsonPolicy(BasePolicy):
    """A contextual Thompson-sampling (or epsilon-greedy) bandit over simplex weight arms.

    Parameters
    ----------
    retrievers
        Retriever names.
    weights
        The default weights (arm 0, where the policy starts); ``None`` for equal weights.
    step, exploration, epsilon, ..., bounds
        See :class:`ThompsonParams` and the module docstring. ``bounds=None``: (0.05, 0.95), the lower
        bound ``0.5/n`` from 20 retrievers on (:func:`~rlfb.policies.simplex.default_bounds`); a lower bound given at or
        over ``1/n`` is refused.
    seed
        Seed of the policy's own generator.

    Examples
    --------
    >>> p = ThompsonPolicy(["bm25", "dense", "splade"], seed=0)
    >>> len(p.arm_names)
    67
    >>> p.weights()  # no evidence yet: the default, equal weights
    {'bm25': 0.333..., 'dense': 0.333..., 'splade': 0.333...}
    """

    name = "thompson"
    params_type = ThompsonParams

    def __init__(
        self,
        retrievers: Sequence[str],
        weights: Mapping[str, float] | Sequence[float] | None = None,
        *,
        step: float = 0.1,
        exploration: str = "thompson",
        epsilon: float = 0.1,
        epsilon_min: float = 0.01,
        epsilon_decay: float = 500.0,
        baseline_share: float = 0.1,
        prior_strength: float = 2.0,
        type_prior: float = 20.0,
        bandwidth: float = 0.1,
        noise: float = 0.5,
        gate_z: float | None = None,
        min_samples: float = 10.0,
        default_after: int = 50,
        default_step: float = 0.05,
        forget: float = 0.999,
        half_life_days: float | None = 45.0,
        contextual: bool = True,
        propensity_draws: int = 32,
        bounds: tuple[float, float] | None = None,
        max_arms: int = 5000,
        counterfactual: bool = True,
        cf_min_clicks: float = 20.0,
        cf_min_questions: int = 1,
        cf_gate_z: float = 1.5,
        cf_max_queries: int = 2000,
        seed: int | None = 0,
    ) -> None:
        super().__init__(retrievers, seed)
        self.hyper = ThompsonParams(
            step=step, exploration=exploration, epsilon=epsilon, epsilon_min=epsilon_min,
            epsilon_decay=epsilon_decay, baseline_share=baseline_share, prior_strength=prior_strength,
            type_prior=type_prior,
            bandwidth=bandwidth, noise=noise, gate_z=gate_z, min_samples=min_samples,
            default_after=default_after, default_step=default_step, forget=forget,
            half_life_days=half_life_days, contextual=contextual, propensity_draws=propensity_draws,
            bounds=self._bounds_or_default(bounds), max_arms=max_arms, counterfactual=counterfactual,
            cf_min_clicks=cf_min_clicks,
            cf_min_questions=cf_min_questions, cf_gate_z=cf_gate_z, cf_max_queries=cf_max_queries,
        )
        self._check_bounds_fit(self.hyper.bounds)
        n = len(self.retrievers)
        m = round(1.0 / self.hyper.step)
        n_grid = math.comb(m + n - 1, n - 1)
        if n_grid + 1 > self.hyper.max_arms:
            raise ValidationError(
                f"a step of {self.hyper.step} gives {n_grid} arms for {n} retrievers, more than "
                f"max_arms={self.hyper.max_arms}; use a coarser step"
            )
        lo, hi = self.hyper.bounds
        self._initial_default = project_simplex(weights_vector(weights, self.retrievers), lo, hi)
        grid = np.asarray([project_simplex(g, lo, hi) for g in simplex_grid(n, self.hyper.step)])
        # bounds can clip grid points onto one another: one arm each, or the logged propensities lie
        _, first = np.unique(np.round(grid, 12), axis=0, return_index=True)
        grid = grid[np.sort(first)]
        self._arms = np.vstack([self._initial_default[None, :], grid])
        self.arm_names: tuple[str, ...] = ("default",) + _arm_names(grid)
        self._arm_index = {a: i for i, a in enumerate(self.arm_names)}
        self._kernel()
        self._stats: dict[str, np.ndarray] = {}
        self._clock: dict[str, float] = {}
        self._clicks: dict[str, ClickEvidence] = {}  # counterfactual click evidence, global and per type
        self._version = 0
        self._cache: dict[str | None, tuple[int, Any]] = {}
        zs = self.hyper.gate_z
        bonferroni = NormalDist().inv_cdf(1.0 - 0.05 / max(1, len(self._arms) - 1))
        self._z = float(zs) if zs is not None else bonferroni

    # ------------------------------------------------------------------ arms and statistics
    @property
    def n_arms(self) -> int:
        return int(self._arms.shape[0])

    @property
    def default_weights(self) -> np.ndarray:
        return self._arms[0].copy()

    def _kernel(self) -> None:
        h = self.hyper.bandwidth
        if 2.0 * h * h <= 0.0:  # 0, or so small that its square is: each arm its own (1e-200 made every K NaN)
            self._K = np.eye(self._arms.shape[0])
        else:
            d2 = np.sum((self._arms[:, None, :] - self._arms[None, :, :]) ** 2, axis=2)
            self._K = np.exp(-d2 / (2.0 * h * h))
        self._K2 = self._K**2

    def _scope(self, key: str) -> np.ndarray:
        st = self._stats.get(key)
        if st is None:
            st = np.zeros((3, self.n_arms))
            self._stats[key] = st
        return st

    def _noise_var(self) -> float:
        st = self._stats.get(GLOBAL)
        prior_n = 5.0
        prior = self.hyper.noise**2
        if st is None:
            return prior
        n, s, ss = st
        active = n > 1e-9
        within = float(np.sum(ss[active] - s[active] ** 2 / n[active]))
        dof = max(0.0, float(n.sum()) - float(active.sum()))
        var = (max(within, 0.0) + prior * prior_n) / (dof + prior_n)
        return max(var, 1e-3)

    def _posterior(self, query_type: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Posterior mean and variance of every arm, and the global effective sample sizes (cached)."""
        typed = query_type is not None and self.hyper.contextual and query_type in self._stats
        key = query_type if typed else None
        hit = self._cache.get(key)
        if hit is not None and hit[0] == self._version:
            return hit[1]
        out = self._compute_posterior(key)
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[key] = (self._version, out)
        return out

    def _compute_posterior(self, query_type: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sigma2 = self._noise_var()
        k0 = self.hyper.prior_strength
        g = self._stats.get(GLOBAL)
        if g is None:
            z = np.zeros(self.n_arms)
            return z, np.full(self.n_arms, sigma2 / k0), z
        n, s, _ = g
        mu0 = float(s.sum() / (n.sum() + 1.0))
        nK = self._K @ n
        sK = self._K @ s
        n2K = self._K2 @ n
        mean = (sK + k0 * mu0) / (nK + k0)
        var = sigma2 * (n2K + k0) / (nK + k0) ** 2
        if query_type is not None and self.hyper.contextual and query_type in self._stats:
            nt, st, _ = self._stats[query_type]
            kt = self.hyper.type_prior
            ntK = self._K @ nt
            stK = self._K @ st
            n2tK = self._K2 @ nt
            denom = ntK + kt
            if kt > 0:
                # The global posterior as the prior holds this type's own episodes too, and adding both as
                # independent counts them twice (a type's sd can come out at 0.71 of the global one). The
                # other types' posterior as the prior was measured and not kept: through the uncertainty
                # that scales exploration it moved the weights on a toy world where no retriever is better
                # (tests/test_policies.py). docs/limitations.md.
                mean_t = (stK + kt * mean) / denom
                var_t = sigma2 * n2tK / denom**2 + (kt / denom) ** 2 * var
            else:
                safe = np.maximum(ntK, 1e-9)
                mean_t = np.where(ntK > 1e-9, stK / safe, mean)
                var_t = np.where(ntK > 1e-9, sigma2 * n2tK / safe**2, var)
            mean, var = mean_t, var_t
        return mean, np.maximum(var, 1e-12), nK

    def _gate(self, mean: np.ndarray, var: np.ndarray, nK: np.ndarray) -> int:
        """The default arm, unless other arms' lower bounds on their advantage are positive.

        Among the arms that pass, the one with the highest posterior mean.
        """
        adv = mean - mean[0]
        lcb = adv - self._z * np.sqrt(var + var[0])
        passed = (lcb > 0) & (nK >= self.hyper.min_samples)
        passed[0] = False
        if not np.any(passed):
            return 0
        return int(np.argmax(np.where(passed, mean, -np.inf)))

    # ------------------------------------------------------------------ counterfactual click evidence
    def _cf_scope(self, query_type: str | None) -> ClickEvidence | None:
        """The click evidence to decide with: the type's once it has enough clicks on enough questions, else
        the global."""
        if not self.hyper.counterfactual:
            return None
        need = max(self.hyper.cf_min_clicks, 2.0)
        if query_type is not None and self.hyper.contextual:
            typed = self._clicks.get(str(query_type))
            # clicks are plenty where a few questions are asked many times, but the variance clustered by
            # question is then an estimate from a handful of clusters: a type of two to four questions can
            # depart on luck. cf_min_questions guards against that; it is 1 (off) by default, since at 10 the
            # 200-question LangChain cranfield run's weights no longer moved (docs/limitations.md)
            if typed is not None and typed.n >= need and typed.n_queries >= self.hyper.cf_min_questions:
                return typed
        g = self._clicks.get(GLOBAL)
        return g if g is not None and g.n >= need else None

    def _cf_gate(self, adv: np.ndarray, var: np.ndarray) -> int:
        # the arm with the best lower confidence bound: the default (bound 0) unless another is
        # surely better, and between two better arms the one we are surer of
        with np.errstate(invalid="ignore"):  # 0 * inf when cf_gate_z is 0 and an arm has one question
            lcb = np.where(np.isfinite(var), adv - self.hyper.cf_gate_z * np.sqrt(var), -np.inf)
        lcb[0] = 0.0
        return int(np.argmax(lcb))

    def _greedy(self, query_type: str | None) -> int:
        scope = self._cf_scope(query_type)
        if scope is not None:
            return self._cf_gate(*scope.posterior())
        mean, var, nK = self._posterior(query_type)
        return self._gate(mean, var, nK)

    def _utility(self, episode: Episode) -> np.ndarray | None:
        """Each arm's DCG of the rewarded chunks after re-ranking the shown chunks as it would have.

        Only chunks with a positive reward count as relevant. Each arm's scores
        are its weights plus the offsets (memory, confidence) that the logged
        fused scores held, so a chunk the memory put on top earns no arm credit.
        """
        rewards = np.asarray(episode.chunk_rewards, dtype=float)
        if not np.all(np.isfinite(rewards)):  # one NaN made every arm's click evidence NaN for good
            raise ValidationError("episode chunk rewards must be finite")
        gains = np.clip(rewards, 0.0, 1.0)  # rewards live in [-1, 1]: a larger one overflowed the sums
        X = np.asarray(episode.shown, dtype=float)
        if gains.size == 0 or not np.any(gains > 0) or X.shape != (gains.size, len(self.retrievers)):
            return None
        if ranks_nothing(gains):
            # praise of every shown chunk alike (a thumbs up on an answer made of them all) ranks no arm above
            # another: counted, it opened the gate on advantages of 0 and stopped arm sampling, so an app whose
            # users only rate answers never moved its weights (0.50 after 3,000 thumbs where A was better)
            return None
        if tuple(episode.retrievers) != self.retrievers or not np.all(np.isfinite(X)):
            return None
        offsets = np.zeros(X.shape[0])
        logged = getattr(episode, "scores", None)
        if logged is not None:
            sc = np.asarray(logged, dtype=float)
            try:
                w_log = logged_weights(episode.decision.weights, self.retrievers)
            except InvalidWeightsError:
                w_log = None
            if w_log is not None and sc.shape == (X.shape[0],) and np.all(np.isfinite(sc)):
                offsets = sc - X @ w_log
        return shown_utility(gains, X @ self._arms.T + offsets[:, None])

    def _learn_counterfactual(self, key: str, episode: Episode, u: np.ndarray, weight: float, t: float) -> None:
        ev = self._clicks.get(key)
        if ev is None:
            ev = self._clicks[key] = ClickEvidence(self.n_arms, self.hyper.cf_max_queries)
        past, late, ev.clock = clock_decay(ev.clock, t, self.hyper.half_life_days)
        ev.update(u, str(episode.query), weight * late, past * self.hyper.forget**weight)
        self._version += 1

    def _age_counterfactual(self, key: str, t: float) -> None:
        # feedback with no click (a thumbs down, a reformulation) adds no click evidence, but its time passes:
        # evidence decayed only when a click came, so a world that stopped showing anything worth a click kept
        # months-old evidence whole, its gate open and arm exploration off, for good
        ev = self._clicks.get(key)
        if ev is None:
            return
        past, _, clock = clock_decay(ev.clock, t, self.hyper.half_life_days)
        if clock != ev.clock:
            ev.decay(past)
            ev.clock = clock
            self._version += 1

    def _epsilon(self) -> float:
        p = self.hyper
        eps = max(p.epsilon_min, p.epsilon / (1.0 + self._n_updates / p.epsilon_decay))
        return min(1.0, eps * self._explore_scale)

    # ------------------------------------------------------------------ deciding
    def decide(self, context: Context | None, *, explore: bool = True) -> Decision:
        """Pick an arm for the context's query type; ``explore=False`` is the gated greedy arm."""
        qtype = getattr(context, "query_type", None)
        scope = self._cf_scope(qtype)
        if scope is not None:
            greedy = self._cf_gate(*scope.posterior())
        else:
            mean, var, nK = self._posterior(qtype)
            greedy = self._gate(mean, var, nK)
        if not explore or scope is not None:
            # With click evidence every arm is scored on every click, so no arm needs playing to be
            # learned about; and since that evidence leans towards the weights shown, sampling arms
            # from it would reinforce whichever arm chance showed first. Show the gated greedy arm.
            arm, prop = greedy, 1.0
        elif self.hyper.exploration == "epsilon":
            eps = self._epsilon()
            arm = int(self._rng.integers(self.n_arms)) if self._rng.random() < eps else greedy
            same = self._same_weights(arm)
            prop = (1.0 - eps) * same[greedy] + eps * np.count_nonzero(same) / self.n_arms
        elif self._explore_scale <= 0:  # tuned to no exploration, as the other policies read it
            arm, prop = greedy, 1.0
        else:
            share = self.hyper.baseline_share
            sd = np.sqrt(var) * self._explore_scale
            if self._rng.random() < share:
                arm = 0
            else:
                draw = mean + sd * self._rng.standard_normal(self.n_arms)
                arm = int(np.argmax(draw))
            m = self.hyper.propensity_draws
            more = mean[None, :] + sd[None, :] * self._rng.standard_normal((m, self.n_arms))
            same = self._same_weights(arm)
            prop = share * same[0] + (1.0 - share) * sampled_share(more, mean, sd, same)
        return Decision(
            weights_dict(self._arms[arm], self.retrievers),
            arm=self.arm_names[arm],
            propensity=float(prop),
            explored=bool(explore and not self._same_weights(arm)[greedy]),
            policy=self.name,
        )

    def _same_weights(self, arm: int) -> np.ndarray:
        """Which arms show the weights of ``arm``: the default can sit on a grid point (0.5/0.5 with two
        retrievers, or weights set there), and what the user saw was drawn with the two arms' chances together
        (one logged 0.0015 for weights shown 90 % of the time)."""
        return np.all(np.abs(self._arms - self._arms[arm]) <= 1e-12, axis=1)

    # ------------------------------------------------------------------ learning
    def _arm_of(self, episode: Episode) -> int | None:
        arm = episode.decision.arm
        named = self._arm_index.get(arm) if isinstance(arm, str) else None
        try:
            w = logged_weights(episode.decision.weights, self.retrievers)
        except InvalidWeightsError:
            # an arm's name lists its weights in the logging policy's retriever order: trust it only in ours
            return named if tuple(episode.retrievers) == self.retrievers else None
        # the name, when its weights are the ones shown (it tells the default from a grid arm of the same
        # weights); a learner hands over episodes in its own retriever order, so the order alone could not
        # tell that a name was written in another and the mirror-image arm was credited
        if named is not None and np.allclose(self._arms[named], w, atol=1e-9):
            return named
        return int(np.argmin(np.abs(self._arms - w[None, :]).sum(axis=1)))

    def _add(self, key: str, arm: int, reward: float, weight: float, t: float) -> None:
        st = self._scope(key)
        last = self._clock.get(key, 0.0)
        past, late, clock = clock_decay(last, t, self.hyper.half_life_days)
        if clock != last:
            self._clock[key] = clock
        w = weight * late
        st *= past * self.hyper.forget**weight
        self._version += 1
        st[0, arm] += w
        st[1, arm] += w * reward
        st[2, arm] += w * reward * reward

    def learn(self, episode: Episode, reward: float, *, weight: float = 1.0) -> ThompsonPolicy:
        """Credit ``reward`` to the arm the logged decision played (by name, else nearest weights)."""
        r = max(-1.0, min(1.0, check_float("reward", reward)))
        weight = check_float("weight", weight, 0.0)
        arm = self._arm_of(episode)
        if arm is None or weight == 0.0:
            return self
        t = episode_time(episode)
        # the global scope, and the episode's query type's; a type named as the global scope ("*", which a
        # caller's log_event(query_type=...) can give) is that scope, learned once (it was learned twice)
        scopes = [GLOBAL]
        if self.hyper.contextual and episode.query_type and str(episode.query_type) != GLOBAL:
            scopes.append(str(episode.query_type))
        u = self._utility(episode) if self.hyper.counterfactual else None
        for scope in scopes:
            if u is not None:
                self._learn_counterfactual(scope, episode, u, weight, t)
            elif self.hyper.counterfactual:
                self._age_counterfactual(scope, t)
        for scope in scopes:
            self._add(scope, arm, r, weight, t)
        self._n_updates += weight
        self._move_default()
        return self

    def _move_default(self) -> None:
        p = self.hyper
        g = self._stats.get(GLOBAL)
        if g is None or float(g[0].sum()) <= p.default_after or p.default_step <= 0 or self._cf_scope(None):
            return  # with click evidence the greedy arm is chosen directly, against a fixed default
        mean, var, nK = self._posterior(None)
        best = self._gate(mean, var, nK)
        if best == 0:
            return
        lo, hi = p.bounds
        step = min(1.0, p.default_step * self._lr_scale)
        new = project_simplex(self._arms[0] + step * (self._arms[best] - self._arms[0]), lo, hi)
        self._set_default(new)

    def _set_default(self, w: np.ndarray) -> None:
        self._version += 1
        self._arms[0] = w
        h = self.hyper.bandwidth
        if h > 0:
            row = np.exp(-np.sum((self._arms - w[None, :]) ** 2, axis=1) / (2.0 * h * h))
            self._K[0, :] = row
            self._K[:, 0] = row
            self._K2[0, :] = row**2
            self._K2[:, 0] = row**2

    # ------------------------------------------------------------------ reading
    def weights(self, query_type: str | None = None) -> dict[str, float]:
        """The gated greedy weights, for a query type or globally."""
        return weights_dict(self._arms[self._greedy(query_type)], self.retrievers)

    def set_weights(self, weights: Mapping[str, float] | Sequence[float]) -> ThompsonPolicy:
        """Replace the default weights (validated, clipped to the bounds)."""
        lo, hi = self.hyper.bounds
        self._set_default(project_simplex(weights_vector(weights, self.retrievers), lo, hi))
        return self

    def arm_stats(self, query_type: str | None = None) -> dict[str, dict[str, float]]:
        """Posterior mean, standard deviation and effective samples of every arm."""
        mean, var, nK = self._posterior(query_type)
        return {
            a: {"mean": float(m), "sd": float(math.sqrt(v)), "n": float(k)}
            for a, m, v, k in zip(self.arm_names, mean, var, nK, strict=True)
        }

    def uncertainty(self, context: Context | None) -> float:
        qtype = getattr(context, "query_type", None)
        mean, var, nK = self._posterior(qtype)
        arm = self._greedy(qtype)
        return float(min(1.0, math.sqrt(var[arm]) / self.hyper.noise))

    def params(self) -> dict[str, Any]:
        d = asdict(self.hyper)
        d["bounds"] = list(d["bounds"])
        d["weights"] = weights_dict(self._initial_default, self.retrievers)
        return d

    def _state(self) -> dict[str, Any]:
        return {
            "default": float_list(self._arms[0]),
            "stats": {k: [float_list(row) for row in v] for k, v in self._stats.items()},
            "clock": {k: float(v) for k, v in self._clock.items()},
            "clicks": {k: v.state_dict() for k, v in self._clicks.items()},
        }

    def _load_state(self, state: Mapping[str, Any]) -> None:
        default = check_simplex("saved default weights", read_array(state, "default", len(self.retrievers)))
        check_within_bounds("default", default, self.hyper.bounds)  # every default is projected within them
        stats = {}
        for key, rows in read_field(state, "stats", Mapping).items():
            arr = np.asarray(rows, dtype=float)
            if arr.shape != (3, self.n_arms) or not np.all(np.isfinite(arr)) or np.any(arr[0] < 0):
                raise CorruptStateError(f"arm statistics for {key!r} are malformed")
            # each arm's weighted count n, reward sum s and sum of squares ss: rewards are clipped to [-1, 1], so
            # |s| <= n and 0 <= ss <= n (a sum of 1e308 loaded and gave the arm a mean of 7e306)
            n, s, ss = arr
            slack = 1e-9 * n + 1e-12  # rounding in the running sums
            if np.any(np.abs(s) > n + slack) or np.any(ss < 0) or np.any(ss > n + slack):
                raise CorruptStateError(f"arm statistics for {key!r} are out of range: with rewards in [-1, 1], "
                                        "an arm's reward sum and sum of squares are at most its count")
            # each update adds at most its weight to one arm's count and decays the rest: the counts sum to at most
            # the n_updates learned (a count of 1e300 made that arm certain); the global scope's to twice that,
            # as rlfb before 2026-12-05 learned an episode of query type "*" into it twice
            check_at_most(f"arm statistics for {key!r}: their count", n.sum(), self._n_updates * _times(key))
            stats[str(key)] = arr
        # a clock is the time of the latest reward: an infinite one (1e999 reads as inf) made every later reward
        # count as infinitely late, weight 0, so the policy silently stopped learning; one far in the future (1e15)
        # did the same until the wall clock caught up; no time is 0, so a negative one is damage
        saved_clock = read_field(state, "clock", Mapping)
        clock = {str(k): read_number({f"clock[{k}]": t}, f"clock[{k}]", 0.0) for k, t in saved_clock.items()}
        saved_clicks = state.get("clicks", {})  # absent in states saved before clicks counted
        if not isinstance(saved_clicks, Mapping):  # a null here loaded as "no clicks": the weights reset, silently
            raise CorruptStateError(f"click evidence is malformed: {type(saved_clicks).__name__}, not a mapping")
        clicks = {
            str(k): ClickEvidence(self.n_arms, self.hyper.cf_max_queries).load_state_dict(v)
            for k, v in saved_clicks.items()
        }
        # checked after the click evidence loaded and checked its own clock, which is never past this one
        # (_check_scopes): a far-future time is named where it was first written, in the click evidence
        saved_times("thompson's clock", list(clock.values()))
        self._check_scopes(stats, clock, clicks)
        self._stats, self._clock = stats, clock
        self._clicks = clicks
        self._cache.clear()
        self._set_default(default)

    def _check_scopes(self, stats: Mapping[str, Any], clock: Mapping[str, float],
                      clicks: Mapping[str, ClickEvidence]) -> None:
        """Refuse a state whose query types do not fit together as :meth:`learn` writes them: every update adds to
        the global statistics (and its type's) after its click evidence, at one time, so a clock or click
        evidence has arm statistics of its scope, a type's imply the global ones, no type's clock is past the
        global clock and no click evidence's clock past its scope's. A dropped scope or clock broke one of these
        and loaded: the type decided by the global posterior, or its next update aged nothing (a clock of 0)."""
        orphans = sorted((set(clock) | set(clicks)) - set(stats))
        if orphans:
            raise CorruptStateError(f"thompson state has a clock or click evidence for {orphans} but no arm "
                                    "statistics for them: field 'stats' lost them")
        if stats and GLOBAL not in stats:
            raise CorruptStateError(f"thompson state has arm statistics of query types {sorted(stats)} but none "
                                    f"global ({GLOBAL!r}): field 'stats' lost them")
        # a click adds to the global click evidence as to its type's: a type's without the global one left the
        # types that have too few clicks of their own deciding by arm sampling, as if nothing were clicked
        if clicks and GLOBAL not in clicks:
            raise CorruptStateError(f"thompson state has click evidence of query types {sorted(clicks)} but none "
                                    f"global ({GLOBAL!r}): field 'clicks' lost it")
        for key, t in clock.items():
            if t > clock.get(GLOBAL, 0.0):
                raise CorruptStateError(f"thompson's clock of {key!r} ({t:g}) is past its global clock "
                                        f"({clock.get(GLOBAL, 0.0):g}): field 'clock' lost or moved it")
        for key, ev in clicks.items():
            if ev.clock > clock.get(key, 0.0):
                raise CorruptStateError(f"click evidence of {key!r} has a clock ({ev.clock:g}) past its arm "
                                        f"statistics' ({clock.get(key, 0.0):g}): field 'clock' lost or moved it")
            # a click adds at most its episode's weight, as the arm statistics do
            check_at_most(f"click evidence of {key!r}: its weight", ev.n, self._n_updates * _times(key))


def _times(scope: str) -> int:
    """How many times an update could add to ``scope``: the global scope twice (an episode of query type "*"
    was learned into it twice before 2026-12-05, and states saved then must load), a query type's once."""
    return 2 if scope == GLOBAL else 1


class EpsilonGreedyPolicy(ThompsonPolicy):
    """:class:`ThompsonPolicy` with ``exploration="epsilon"``: epsilon-greedy over the same arms.

    >>> EpsilonGreedyPolicy(["a", "b"], step=0.5).hyper.exploration
    'epsilon'
    """

    name = "epsilon"

    def __init__(self, retrievers: Sequence[str], weights: Any = None, **kwargs: Any) -> None:
        # another exploration given is kept: states saved so load back (they are refused by from_params alone)
        kwargs.setdefault("exploration", "epsilon")
        super().__init__(retrievers, weights, **kwargs)

    @classmethod
    def from_params(cls, retrievers: Sequence[str], params: Any,
                    weights: Mapping[str, float] | Sequence[float] | None = None, *, seed: int | None = 0) -> Self:
        """:meth:`BasePolicy.from_params <rlfb.policies.base.BasePolicy.from_params>`, for ``ThompsonParams``
        that explore by epsilon (``exploration="epsilon"``): their default, Thompson sampling, would make a
        Thompson policy under this one's name."""
        if isinstance(params, ThompsonParams) and params.exploration != "epsilon":
            raise ValidationError(f"EpsilonGreedyPolicy explores by epsilon, got ThompsonParams with exploration="
                                  f"{params.exploration!r}: give exploration='epsilon', or use ThompsonPolicy")
        return super().from_params(retrievers, params, weights, seed=seed)
