"""``Learner``: the online learner the ensemble calls.

It joins a policy, chunk confidence, feedback memory, exploration, replay and a guardrail.

For each query the ensemble builds a :class:`~rlfb.policies.base.Context` and
calls :meth:`Learner.rank`::

    fused = normalized @ w  +  scale * (confidence_weight * confidence  +  memory_weight * memory
                                         +  memory_weight * relevance_feedback_weight * likeness)

``w`` comes from the policy's decision; ``confidence`` is each candidate's
centred chunk confidence (:class:`~rlfb.confidence.ChunkConfidence`, 0 when
unseen); ``memory`` the per-candidate score from feedback on this and similar
queries (:class:`~rlfb.memory.FeedbackMemory`); ``likeness`` each candidate's
likeness to the chunks the memory holds as good for this very query
(:func:`~rlfb.relevance_feedback.similar_to_clicked`, 0 without candidate
embeddings); ``scale`` the largest absolute
normalised score, so the extra features weigh the same under min-max,
z-score and RRF scores. When the decision carries a Plackett-Luce ranking
(``gradient``) it is shown as sampled; otherwise the top ``k`` of ``fused`` is
shown, and with ``explore=True`` chunk exploration may swap one in.

When feedback arrives, :meth:`Learner.learn` takes the episode as logged at
decision time: the policy learns from it, chunk confidences and the feedback
memory take in its per-chunk evidence, the replay buffer keeps it, every
``replay_every`` episodes a prioritised batch is replayed through the policy
(those whose update is a gradient step; see :class:`LearnerConfig`), and the
guardrail compares the learned weights with the default weights and tunes the
learning rate and exploration.

>>> import numpy as np
>>> from rlfb.policies.base import Context
>>> learner = Learner(("bm25", "dense"), policy="gradient", seed=0)
>>> ctx = Context("q", ("bm25", "dense"), ("a", "b", "c"), np.zeros((3, 2)),
...               np.array([[1.0, 0.0], [0.6, 0.6], [0.0, 0.9]]))
>>> learner.rank(ctx, 2, explore=False).order.tolist()
[1, 0]
>>> learner.weights()
{'bm25': 0.5, 'dense': 0.5}
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfb.confidence import ChunkConfidence
from rlfb.credit import chunk_evidence, shared_credit
from rlfb.decay import episode_time
from rlfb.discovery import RepeatDiscovery
from rlfb.errors import CorruptStateError, InvalidWeightsError, ValidationError
from rlfb.exploration import NoExploration, ThompsonChunkExploration
from rlfb.fusion import exploration_scale, score_scale
from rlfb.guardrail import Guardrail
from rlfb.hyperparameters import check_int
from rlfb.learner_checks import (
    FUTURE_TOLERANCE,
    _candidate_embeddings,
    _check_finite,
    _check_logged_fields,
    _embedding_dim,
    _valid_ranking,
)
from rlfb.learner_config import LearnerConfig  # its own module; importable from here, where code found it first
from rlfb.memory import FeedbackMemory
from rlfb.memory import keyed as _keyed
from rlfb.policies import make_policy
from rlfb.policies.base import Context, Decision, Episode, Policy
from rlfb.policies.simplex import logged_weights, saved_bounds, validate_retrievers, weights_vector
from rlfb.replay import PrioritizedReplay
from rlfb.saved_state import saved_count
from rlfb.types import check_chunk_ids, validate_k

__all__ = ["LearnerConfig", "Ranking", "Learner"]

STATE_FORMAT = 1

#: Policies whose update is a gradient step, so a replayed episode is just another (down-weighted) step.
REPLAY_SAFE = frozenset({"gradient"})


@dataclass(frozen=True, eq=False)
class Ranking:
    """What :meth:`Learner.rank` returns.

    ``order`` holds candidate indices best first (``min(k, n_candidates)`` of
    them); ``fused``, ``confidence`` (chunk confidence, 1 to 10) and ``memory``
    (in [-1, 1]) have one entry per candidate; ``decision`` is what to log,
    its propensity including that of chunk exploration.
    """

    order: np.ndarray
    fused: np.ndarray
    decision: Decision
    confidence: np.ndarray
    memory: np.ndarray
    ask_for_feedback: bool = False
    #: whether the feedback memory counted this ranking as one more asking of a question it remembers
    asked: bool = False


class Learner:
    """A fusion-weight policy plus chunk confidence, feedback memory, exploration, replay and a guardrail.

    Parameters
    ----------
    retrievers
        Retriever names, in the column order of the score matrices.
    policy
        A policy name from :data:`rlfb.policies.POLICIES` or a policy instance.
    config
        A :class:`LearnerConfig`, a dict of its fields, or ``None`` for the defaults.
    seed
        Seeds the policy built by name, and the learner's own parts each with a stream of its own
        (:func:`~rlfb.learner_config.part_seed`).
    weights
        Default weights for the policy built by name (for ``fixed``, the weights).
    **policy_options
        Further constructor arguments of the policy built by name.
    """

    def __init__(
        self,
        retrievers: Sequence[str],
        policy: str | Policy = "fixed",
        config: LearnerConfig | Mapping[str, Any] | None = None,
        seed: int = 0,
        *,
        weights: Mapping[str, float] | Sequence[float] | None = None,
        **policy_options: Any,
    ) -> None:
        self.retrievers = validate_retrievers(retrievers)
        seed = check_int("seed", seed, 0)  # a numpy integer as a plain one: its state is written as JSON
        self.seed = seed
        if config is None:
            config = LearnerConfig()
        elif isinstance(config, Mapping):
            config = LearnerConfig.from_dict(config)
        elif not isinstance(config, LearnerConfig):
            raise ValidationError(f"config must be a LearnerConfig or a dict, got {type(config).__name__}")
        self.config = config
        if isinstance(policy, str):
            options = dict(policy_options)
            options.setdefault("seed", seed)
            if weights is not None:
                options["weights"] = weights
            self.policy: Any = make_policy(policy, self.retrievers, **options)
        else:
            if policy_options:
                raise ValidationError(
                    "policy options go to the policy's constructor, not to a given instance"
                )
            self.policy = make_policy(policy, self.retrievers)
            if weights is not None:
                setter = getattr(self.policy, "set_weights", None)
                if setter is None:
                    raise ValidationError("this policy instance cannot take weights")
                setter(weights)
        try:
            self._weighted_learn = "weight" in inspect.signature(self.policy.learn).parameters
        except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
            self._weighted_learn = False
        parts = config._parts(seed)
        self._confidence: ChunkConfidence = parts["confidence"]
        self._memory: FeedbackMemory = parts["memory"]
        self._explorer: Any = parts["explorer"]
        self._discovery: RepeatDiscovery = parts["discovery"]
        self._replay: PrioritizedReplay = parts["replay"]
        self._guardrail: Guardrail = parts["guardrail"]
        self._n_learned = 0
        self._now = 0.0

    # ------------------------------------------------------------------ properties
    @property
    def policy_name(self) -> str:
        return str(self.policy.name)

    @property
    def confidence(self) -> ChunkConfidence:
        return self._confidence

    @property
    def memory(self) -> FeedbackMemory:
        return self._memory

    @property
    def discovery(self) -> RepeatDiscovery:
        return self._discovery

    @property
    def replay(self) -> PrioritizedReplay:
        return self._replay

    @property
    def guardrail(self) -> Guardrail:
        return self._guardrail

    @property
    def n_learned(self) -> int:
        return self._n_learned

    def _default_weights(self) -> np.ndarray:
        d = getattr(self.policy, "default_weights", None)
        if d is None:
            return np.full(len(self.retrievers), 1.0 / len(self.retrievers))
        return np.asarray(d, dtype=float)

    # ------------------------------------------------------------------ checking inputs
    def _matrix(self, retrievers: Sequence[str], matrix: Any, rows: int, what: str) -> np.ndarray:
        names = tuple(retrievers)
        try:
            M = np.asarray(matrix, dtype=float)
        except (TypeError, ValueError) as exc:  # strings, ragged rows: a bare ValueError before
            raise ValidationError(f"{what} must be a matrix of numbers: {exc}") from exc
        if M.ndim != 2 or M.shape[0] != rows or M.shape[1] != len(names):
            raise ValidationError(f"{what} must have shape ({rows}, {len(names)}), got {M.shape}")
        if names != self.retrievers:
            if set(names) != set(self.retrievers):
                raise ValidationError(
                    f"{what} is for retrievers {list(names)}, the learner has {list(self.retrievers)}"
                )
            M = M[:, [names.index(r) for r in self.retrievers]]
        if not np.all(np.isfinite(M)):
            M = np.nan_to_num(M, nan=0.0, posinf=0.0, neginf=0.0)
        return M

    def _weights_of(self, decision: Decision) -> np.ndarray:
        try:
            return logged_weights(decision.weights, self.retrievers)
        except InvalidWeightsError:
            return weights_vector(self.policy.weights(), self.retrievers)

    # ------------------------------------------------------------------ ranking
    def _features(self, context: Context, *, touch: bool = True) -> tuple[
            np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray, np.ndarray, float]:
        """The normalised scores, each candidate's ``(confidence, alpha, beta)``, memory score, offsets and score
        scale (confidences and posteriors read once: exploration and the ask for feedback use them too).
        ``touch``: the memory counts the read as a use (not in an evaluation's ranking)."""
        ids = tuple(context.candidate_ids)
        N = self._matrix(context.retrievers, context.normalized, len(ids), "context.normalized")
        cfg = self.config
        read = self._confidence.read(ids)
        conf = read[0]
        conf_feat = self._confidence.as_feature(conf) if cfg.confidence_weight > 0 else np.zeros(len(ids))
        if cfg.memory_weight > 0:
            mem = self._memory.score(context.query, context.query_embedding, ids, touch=touch)
        else:
            mem = np.zeros(len(ids))
        scale = score_scale(N)
        offsets = scale * (cfg.confidence_weight * conf_feat + cfg.memory_weight * mem)
        if cfg.reads_candidate_embeddings:
            vectors = _candidate_embeddings(context, len(ids))
            if vectors is not None:
                rf = self._memory.relevance_feedback(context.query, ids, vectors)
                offsets = offsets + scale * cfg.memory_weight * cfg.relevance_feedback_weight * rf
        return N, read, mem, offsets, scale

    def rank(self, context: Context, k: int, *, explore: bool = True, touch: bool = True) -> Ranking:
        """Decide the weights, fuse, and choose the ``k`` chunks to show (with exploration if asked).

        ``touch=False`` reads without counting the read as a use of the feedback memory's entries (which keeps
        them from eviction longest): an evaluation's ranking, which no user sees. With ``explore=False`` too,
        ranking changes no state at all.
        """
        validate_k(k)
        if not isinstance(context.query, str):  # the memory keys questions by their text
            raise ValidationError(f"context query must be a str, got {type(context.query).__name__}")
        context = _keyed(context)
        check_chunk_ids(context.candidate_ids, "context candidate id")
        N, (conf, alpha, beta), mem, offsets, scale = self._features(context, touch=touch)
        n = N.shape[0]
        ctx = dataclasses.replace(context, retrievers=self.retrievers, normalized=N, k=k, offsets=offsets)
        decision = self.policy.decide(ctx, explore=explore)
        w = self._weights_of(decision)
        fused = N @ w + offsets
        kk = min(k, n)
        ranked = np.argsort(-fused, kind="stable")
        ranking = decision.ranking
        sampled = explore and ranking is not None and _valid_ranking(ranking, n)
        if sampled:
            order = np.asarray(ranking[:kk], dtype=np.int64)
            if order.shape[0] < kk:
                rest = ranked[~np.isin(ranked, order)]
                order = np.concatenate([order, rest[: kk - order.shape[0]]])
        else:
            order = ranked[:kk]
            if explore and kk > 0 and not isinstance(self._explorer, NoExploration):
                extra: dict[str, Any] = {}
                if isinstance(self._explorer, ThompsonChunkExploration):
                    extra = {"fused": fused, "alpha": alpha, "beta": beta,
                             "score_scale": exploration_scale(scale, kk, context.rrf_c)}
                res = self._explorer.explore(ranked, kk, scale=self._guardrail.multipliers[1], **extra)
                order = res.order
                decision = _explored(decision, res)
        noted = False
        if explore and kk > 0 and _discovers(self.config):
            before = self._memory.ask(context.query)
            noted, asks = before is not None, before or 0
            # A policy that samples whole rankings (PDGD) explores by itself, and its gradient assumes
            # that what was shown is what it sampled: discovery leaves those rankings alone.
            # (the memory's evidence for the question is read only for questions repeated often enough)
            found = None if sampled or not self._discovery.due(asks) else self._discovery.explore(
                order, ranked, context.candidate_ids, self._memory.known(context.query), asks)
            if found is not None:
                order = found.order
                decision = _explored(decision, found)
        ask = self._ask(context, order, alpha, beta)
        return Ranking(order=order, fused=fused, decision=decision, confidence=conf, memory=mem,
                       ask_for_feedback=ask, asked=noted)

    def _uncertainty(self, context: Context, order: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> float:
        """Of the chunks shown (``order``), from the candidates' posteriors ``alpha``, ``beta``."""
        order = np.asarray(order, dtype=np.int64)
        chunk = float(np.mean(self._confidence.uncertainty_of(alpha[order], beta[order]))) if order.size else 1.0
        unc = getattr(self.policy, "uncertainty", None)
        pol = float(unc(context)) if unc is not None else 0.0
        return 0.5 * chunk + 0.5 * min(1.0, max(0.0, pol))

    def _ask(self, context: Context, order: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> bool:
        return self._uncertainty(context, order, alpha, beta) >= self.config.ask_threshold

    def should_ask_for_feedback(self, context: Context, k: int = 10) -> bool:
        """Whether feedback on this retrieval would be informative (its posterior is uncertain).

        Looks at the greedy top ``k``: the mean posterior uncertainty of its
        chunks and the policy's uncertainty about its weights, averaged,
        against ``config.ask_threshold``. Uses no randomness.
        """
        return bool(self.rank(context, k, explore=False, touch=False).ask_for_feedback)

    # ------------------------------------------------------------------ learning
    def _episode(self, episode: Episode) -> tuple[np.ndarray, np.ndarray, float]:
        """The episode's checked arrays. Everything :meth:`learn` could refuse is refused here, before any
        part of the learner changes: a refusal halfway would leave the policy updated and the rest not,
        and a retry would learn the episode twice."""
        if not isinstance(episode.decision, Decision):  # a dict or None: AttributeError deep inside before
            raise ValidationError(f"episode decision must be a Decision, got {type(episode.decision).__name__}")
        if isinstance(episode.retrievers, (str, bytes)) or not isinstance(episode.retrievers, Sequence):
            raise ValidationError(f"episode retrievers must be a sequence of names, got {episode.retrievers!r}")
        if isinstance(episode.shown_ids, (str, bytes)):  # a string is a sequence of one-letter ids
            raise ValidationError(f"episode shown_ids must be a sequence of chunk ids, got {episode.shown_ids!r}")
        ids = tuple(episode.shown_ids)
        check_chunk_ids(ids, "episode shown id")
        X = self._matrix(episode.retrievers, episode.shown, len(ids), "episode.shown")
        try:
            r = np.asarray(episode.chunk_rewards, dtype=float)
            reward = float(episode.reward)
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"episode rewards must be numbers: {exc}") from exc
        if r.shape != (len(ids),):
            raise ValidationError(f"episode has {len(ids)} shown chunks but {r.shape} chunk rewards")
        if not np.all(np.isfinite(r)):
            raise ValidationError("chunk rewards must be finite")
        if not math.isfinite(reward):
            raise ValidationError(f"episode reward must be finite, got {episode.reward!r}")
        used = episode.used
        if used is not None and (np.shape(used) != r.shape or np.asarray(used).dtype != bool):
            raise ValidationError(f"episode used must be {r.shape[0]} booleans, one per shown chunk, got {used!r}")
        prior = episode.prior_rewards
        if prior is not None and np.shape(prior) != r.shape:
            raise ValidationError(f"episode has {r.shape[0]} shown chunks but {np.shape(prior)} prior rewards")
        if prior is not None and not np.all(np.isfinite(np.asarray(prior, dtype=float))):
            raise ValidationError("prior rewards must be finite")
        if not isinstance(episode.query, str):
            raise ValidationError(f"episode query must be a str, got {type(episode.query).__name__}")
        _check_logged_fields(episode, r.shape[0])
        self._memory.check_embedding(episode.query_embedding)
        return X, np.clip(r, -1.0, 1.0), max(-1.0, min(1.0, reward))

    def learn(self, episode: Episode) -> Learner:
        """Learn from one logged episode; returns ``self``. A malformed episode raises
        :class:`ValidationError` and changes nothing."""
        parsed = self._episode(episode)
        return self._learn_checked(_keyed(episode), *parsed)

    def _learn_checked(self, episode: Episode, X: np.ndarray, r: np.ndarray, reward: float) -> Learner:
        """:meth:`learn` of an episode :meth:`_episode` has checked, with what it returned."""
        if tuple(episode.retrievers) != self.retrievers or not np.array_equal(X, episode.shown) \
                or not np.array_equal(r, episode.chunk_rewards):
            # the policy learns from the rewards as checked and clipped to [-1, 1]: given 1e308, thompson's
            # click evidence overflowed to NaN and no state could be saved again
            episode = dataclasses.replace(episode, retrievers=self.retrievers, shown=X, chunk_rewards=r)
        t = episode_time(episode)
        self._now = max(self._now, t)
        cfg = self.config
        if cfg.guardrail:
            greedy = weights_vector(self.policy.weights(episode.query_type), self.retrievers)
            lr_m, ex_m = self._guardrail.observe(X, r, greedy, self._default_weights())
            tune = getattr(self.policy, "tune", None)
            if tune is not None:
                tune(learning_rate=lr_m, exploration=ex_m)
        self.policy.learn(_as_answered(episode), reward)
        ids = tuple(episode.shown_ids)
        prior = episode.prior_rewards  # its shape was checked by _episode
        ev = chunk_evidence(r, reward, cfg.skip_weight, cfg.abandon_weight, prior,
                            response_level=episode.response_level, used=episode.used)
        # praise of a whole answer spread over its chunks says that one of them helped, not that the top one did
        # (it was counted as a click on it); criticism of the answer says the top chunk did not help either
        praised_together = episode.response_level and np.count_nonzero(r > 0) > 1
        if ids and _discovers(cfg) and not praised_together \
                and (prior is None or not np.any(np.asarray(prior) != 0)):
            # the first feedback on an event: was its top chunk one the memory did not know for this
            # repeated question, and was it taken? That click rate sets how often discovery explores.
            asks = self._memory.asks(episode.query) - 1  # before the asking this feedback is on
            known = self._memory.known(episode.query) if self._discovery.due(asks) else {}
            if ids[0] not in known and self._discovery.eligible(known, asks):
                self._discovery.observe(bool(r[0] > 0))
        if ids and np.any(ev != 0):
            w = self._weights_of(episode.decision)
            rel = np.clip((X @ w) / score_scale(X), 0.0, 1.0)
            self._confidence.update(ids, ev, rel, timestamp=t)
            # Praise of the whole answer is shared among its chunks in the memory, which says what answers
            # this question; the confidence, a chunk's standing over all questions, takes it whole. With
            # each of ten chunks taking a whole thumbs up (2.5 clicks), 59-67 % of the chunks with a click's
            # worth of evidence for a cranfield question were not relevant.
            praise = shared_credit(ev, r)
            self._memory.update(episode.query, episode.query_embedding, ids, praise, timestamp=t)
        self._n_learned += 1
        self._explorer.step()
        if cfg.replay:
            # with the rewards as the policy took them: a reward of 5 (a rating scale logged as is) would
            # otherwise be replayed five times as often as a top-of-range one
            self._replay.add(_as_answered(dataclasses.replace(episode, chunk_rewards=r, reward=reward)))
            replays = self._weighted_learn and (cfg.replay_all or self.policy_name in REPLAY_SAFE)
            if replays and self._n_learned % cfg.replay_every == 0:
                # importance weights average 1 over the batch; one replay never counts for more than a fresh episode
                for old, iw in self._replay.sample_weighted():
                    self.policy.learn(old, max(-1.0, min(1.0, float(old.reward))),
                                      weight=min(1.0, cfg.replay_weight * iw))
        return self

    def predict_one(self, context: Context, k: int = 10) -> list[str]:
        """The ids of the ``k`` chunks the greedy policy would show for ``context``, best first (river's
        ``predict_one``): :meth:`rank` with no exploration, changing no state.

        >>> import numpy as np
        >>> from rlfb.policies.base import Context
        >>> learner = Learner(("bm25", "dense"), policy="thompson", seed=0)
        >>> ctx = Context("q", ("bm25", "dense"), ("a", "b", "c"), np.zeros((3, 2)),
        ...               np.array([[1.0, 0.0], [0.6, 0.6], [0.0, 0.9]]))
        >>> learner.predict_one(ctx, 2)
        ['b', 'a']
        """
        ranking = self.rank(context, k, explore=False, touch=False)
        return [context.candidate_ids[int(i)] for i in ranking.order]

    def learn_one(self, episode: Episode) -> Learner:
        """Learn one logged episode (river's ``learn_one``: :meth:`learn` by river's name; :meth:`partial_fit`
        replays many).

        >>> import numpy as np
        >>> from rlfb.policies.base import Context, Episode
        >>> learner = Learner(("bm25", "dense"), policy="thompson", seed=0)
        >>> ctx = Context("q", ("bm25", "dense"), ("a", "b", "c"), np.zeros((3, 2)),
        ...               np.array([[1.0, 0.0], [0.6, 0.6], [0.0, 0.9]]))
        >>> shown = learner.rank(ctx, 2, explore=False)
        >>> clicked_a = Episode("e1", "q", ("bm25", "dense"), shown.decision, ("b", "a"),
        ...                     ctx.normalized[shown.order], np.array([0.0, 0.4]), 0.4, timestamp=1.0)
        >>> learner.learn_one(clicked_a).n_learned
        1
        """
        return self.learn(episode)

    def partial_fit(self, episodes: Iterable[Episode]) -> Learner:
        """Learn from logged episodes in order (replaying a log, as MABWiser's ``partial_fit``).

        Every episode is checked before any is learned: a malformed one raises
        :class:`ValidationError` naming its index and event id, and changes nothing. The first
        episode of each event also counts as an asking of its question, as :meth:`rank` counts it
        online, so that the memory's ask counts and repeat discovery's statistics come out as if
        the log had been ranked and learned here, where each event's feedback came before the next
        retrieval: an asking is counted where its event's first episode stands in the log, so with
        feedback that came late (after later retrievals) the counts that discovery read at those
        retrievals differ from the live ones, as does what it then learned (an audit, 2026-12-05).
        """
        checked = []  # each episode with what _episode made of it, so that learning does not check it again
        dim: int | None = None  # the memory takes one embedding dimension: the log's must agree
        for i, ep in enumerate(episodes):
            try:
                if not isinstance(ep, Episode):
                    raise ValidationError(f"expected an Episode, got {type(ep).__name__}")
                parsed = self._episode(ep)
                checked.append((_keyed(ep), parsed))
                dim = _embedding_dim(ep.query_embedding, dim)
            except ValidationError as exc:
                raise ValidationError(f"episode {i} (event_id {getattr(ep, 'event_id', None)!r}): {exc}") from None
        asked: set[str] = set()
        for ep, parsed in checked:
            if ep.shown_ids and _discovers(self.config) and ep.event_id not in asked:
                asked.add(ep.event_id)
                self._memory.note_ask(ep.query)
            self._learn_checked(ep, *parsed)
        return self

    # ------------------------------------------------------------------ weights
    def weights(self, query_type: str | None = None) -> dict[str, float]:
        """The policy's greedy weights, for a query type or globally."""
        return dict(self.policy.weights(query_type))

    def set_weights(self, weights: Mapping[str, float] | Iterable[float]) -> Learner:
        """Set the policy's (default) weights; validated, NaN and negative weights are rejected."""
        if isinstance(weights, Iterable) and not isinstance(weights, (Mapping, Sequence, np.ndarray)):
            weights = list(weights)  # a generator, read once: checked, then handed on empty ("got 0 weights")
        weights_vector(weights, self.retrievers)
        setter = getattr(self.policy, "set_weights", None)
        if setter is None:
            raise ValidationError(f"policy {self.policy_name!r} cannot take new weights")
        setter(weights)
        return self

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything learned, plus settings and generator states, as JSON-safe data."""
        return {
            "format": STATE_FORMAT,
            "retrievers": list(self.retrievers),
            "seed": self.seed,
            "config": self.config.to_dict(),
            "policy": self.policy.state_dict(),
            "confidence": self._confidence.state_dict(),
            "memory": self._memory.state_dict(),
            "exploration": self._explorer.state_dict(),
            "discovery": self._discovery.state_dict(),
            "replay": self._replay.state_dict(),
            "guardrail": self._guardrail.state_dict(),
            "n_learned": self._n_learned,
            "now": float(self._now),
        }

    def load_state_dict(self, state: Mapping[str, Any], *, keep_random: bool = False) -> Learner:
        """Restore what :meth:`state_dict` learned (policy, confidences, memory, exploration, replay, ...).

        The settings stay this learner's own (its :class:`LearnerConfig`; a state of another
        chunk exploration is refused): two apps of other settings can share a store's snapshots.
        :meth:`from_state_dict` builds a learner with the saved settings. On any damage raise
        :class:`CorruptStateError` and change nothing. ``keep_random``: keep this learner's own random
        generators' states, not the saved ones (another process's snapshot: taking its generators put two
        workers' exploration in lockstep, whatever seed each was given).
        """
        own = [g.bit_generator.state for g in self._generators()] if keep_random else None
        if not isinstance(state, Mapping):
            raise CorruptStateError(f"learner state must be a mapping, got {type(state).__name__}")
        _check_finite(state)
        try:
            if state.get("format") != STATE_FORMAT:
                raise CorruptStateError(f"unknown learner state format {state.get('format')!r}")
            if tuple(state["retrievers"]) != self.retrievers:
                raise CorruptStateError(
                    f"state is for retrievers {state['retrievers']!r}, not {list(self.retrievers)!r}"
                )
            pstate = state["policy"]
            if not isinstance(pstate, Mapping) or pstate.get("name") != self.policy_name:
                name = pstate.get("name") if isinstance(pstate, Mapping) else None
                raise CorruptStateError(f"state is for policy {name!r}, not {self.policy_name!r}")
            parts = self.config._parts(self.seed)
            parts["confidence"].load_state_dict(state["confidence"])
            parts["memory"].load_state_dict(state["memory"])
            parts["explorer"].load_state_dict(state["exploration"])
            if "discovery" in state:  # states saved before discovery existed start it afresh
                parts["discovery"].load_state_dict(state["discovery"])
            parts["replay"].load_state_dict(state["replay"])
            held, _ = parts["replay"].held()
            other = next((e.retrievers for e, _, _ in held if tuple(e.retrievers) != self.retrievers), None)
            if other is not None:  # replayed later, each raised after the learning of its episode was committed
                raise CorruptStateError(f"the replay buffer holds an episode for retrievers {list(other)!r}, not "
                                        f"{list(self.retrievers)!r}")
            parts["guardrail"].load_state_dict(state["guardrail"])
            n_learned = saved_count("n_learned", state["n_learned"])  # not "5", nor beyond any real count
            now = float(state["now"])
            if n_learned < 0 or not math.isfinite(now) or now > time.time() + FUTURE_TOLERANCE:
                raise CorruptStateError("learner counters are out of range (or its clock far in the future)")
            backup = self.policy.state_dict()
            try:
                self.policy.load_state_dict(pstate)
            except Exception:
                self.policy.load_state_dict(backup)
                raise
        except CorruptStateError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
            raise CorruptStateError(f"cannot read the learner state: {exc!r}") from exc
        self._confidence = parts["confidence"]
        self._memory = parts["memory"]
        self._explorer = parts["explorer"]
        self._discovery = parts["discovery"]
        self._replay = parts["replay"]
        self._guardrail = parts["guardrail"]
        self._n_learned = n_learned
        self._now = now
        if own is not None:
            for generator, kept in zip(self._generators(), own, strict=True):
                generator.bit_generator.state = kept
        return self

    def reseed(self, salt: int) -> Learner:
        """Start the random generators afresh from this learner's seed and ``salt`` (each its own stream).

        A process that starts on a store's snapshot (a restart, another worker) draws from its seed and that
        snapshot's version: its own seed, so workers of other seeds do not explore in lockstep, and the version,
        so a restart does not draw again what the run before it drew.
        """
        for i, generator in enumerate(self._generators()):
            seq = np.random.SeedSequence([self.seed, int(salt), i])
            generator.bit_generator.state = np.random.default_rng(seq).bit_generator.state
        return self

    def _generators(self) -> list[np.random.Generator]:
        """The random generators of the policy, chunk exploration, discovery and replay, in that order."""
        parts = (self.policy, self._explorer, self._discovery, self._replay)
        return [g for g in (getattr(p, "_rng", None) for p in parts) if isinstance(g, np.random.Generator)]

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> Learner:
        """A new learner with the settings, policy and everything learned that ``state`` holds."""
        return cls.untrained_like(state).load_state_dict(state)

    @classmethod
    def untrained_like(cls, state: Mapping[str, Any]) -> Learner:
        """A new learner with the settings and policy hyperparameters ``state`` holds, and nothing learned."""
        _check_finite(state)
        try:
            pstate = state["policy"]
            params = dict(pstate["params"])
            retrievers = tuple(state["retrievers"])
            if "bounds" in params:  # an older default that pinned the weights is read as today's (saved_bounds)
                params["bounds"] = saved_bounds(tuple(params["bounds"]), len(retrievers))
            policy = make_policy(str(pstate["name"]), retrievers, **params, seed=pstate.get("seed"))
            learner = cls(
                retrievers,
                policy=policy,
                config=LearnerConfig.from_dict(state["config"]),
                seed=int(state["seed"]),
            )
        except CorruptStateError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise CorruptStateError(f"cannot rebuild a learner from this state: {exc!r}") from exc
        return learner

    def __repr__(self) -> str:
        w = ", ".join(f"{n}={v:.3f}" for n, v in self.weights().items())
        return f"Learner(policy={self.policy_name!r}, learned={self._n_learned}, weights: {w})"


def _as_answered(episode: Episode) -> Episode:
    """``episode`` as the policy learns it from praise or criticism of an answer: without the unused chunks ranked
    above the answer's last used one (a node a later step cut before the answer, never seen), which the
    policy's pairs (PDGD) and click evidence (thompson) read as passed over. Chunks below it stay, as shown.

    >>> from rlfb.policies.base import Decision
    >>> ep = Episode("e", "q", ("a",), Decision({"a": 1.0}), ("cut", "x", "y"), np.ones((3, 1)),
    ...              np.array([0.0, 1.0, 1.0]), 1.0, used=np.array([False, True, True]))
    >>> _as_answered(ep).shown_ids
    ('x', 'y')
    """
    used = episode.used
    if used is None or not episode.response_level:
        return episode
    used = np.asarray(used, dtype=bool)
    if not used.any():
        return episode
    keep = used | (np.arange(used.shape[0]) > int(np.flatnonzero(used)[-1]))
    return episode if keep.all() else episode.keeping(keep)


def _discovers(config: LearnerConfig) -> bool:
    """Whether repeat discovery is on: it works from the memory, and ``exploration="none"`` means none."""
    return config.memory_weight > 0 and config.discovery_rate > 0 and config.chunk_exploration != "none"


def _explored(decision: Decision, res: Any) -> Decision:
    """The decision with one more exploration step's propensity and flag folded in."""
    return dataclasses.replace(
        decision,
        propensity=float(decision.propensity) * float(res.propensity),
        explored=bool(decision.explored or res.explored),
    )
