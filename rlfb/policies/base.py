"""The policy contract: what a fusion-weight policy sees, decides and learns from.

A policy is river-like and small: hyperparameters are constructor arguments,
learned state is private, randomness comes from its own seeded generator
(``numpy.random.default_rng``, whose state is saved with the rest), and state
round-trips through JSON (never pickle).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Context", "Decision", "Episode", "Policy", "MIN_PROPENSITY", "same_hyperparameters"]

#: the smallest propensity a decision logs (the least positive normal float)
MIN_PROPENSITY = sys.float_info.min


@dataclass(frozen=True, eq=False)
class Context:
    """Everything known at decision time about one query.

    ``raw`` and ``normalized`` are ``(n_candidates, n_retrievers)`` arrays whose
    columns follow ``retrievers`` and whose rows follow ``candidate_ids``.
    """

    query: str
    retrievers: tuple[str, ...]
    candidate_ids: tuple[str, ...]
    raw: np.ndarray
    normalized: np.ndarray
    features: Mapping[str, float] = field(default_factory=dict)
    query_type: str = "default"
    query_embedding: np.ndarray | None = None
    session_id: str | None = None
    # Set by the Learner before it asks the policy: how many chunks will be shown,
    # and the per-candidate part of the fused score that does not depend on the
    # weights (confidence and feedback memory), so that a policy sampling a whole
    # ranking samples it over the same scores the learner ranks by.
    k: int = 10
    offsets: np.ndarray | None = None
    ranks: np.ndarray | None = None  # 1-based rank of each candidate in each retriever's own ranking
    proposed: np.ndarray | None = None  # bool: the candidate was in that retriever's own top list
    # (n_candidates, dim) normalised chunk embeddings, a zero row for a chunk without one: the learner scores
    # candidates by their likeness to chunks clicked for the question before (rlfb.relevance_feedback)
    candidate_embeddings: np.ndarray | None = None


@dataclass(frozen=True)
class Decision:
    """What a policy chose: weights over retrievers, the arm, and how likely that choice was.

    ``propensity`` is the probability that the policy would take this action;
    off-policy evaluation needs it. ``ranking`` is set only by policies that
    sample a whole ranking (a Plackett-Luce policy); it lists candidate indices.
    ``sampling_temperature`` is the Plackett-Luce temperature (in score units,
    the guardrail's exploration multiplier included) that ranking was drawn
    with, so that a reward arriving after the guardrail has moved is debiased
    under the distribution the ranking came from; ``None`` where nothing was
    sampled or a decision was logged without it.
    """

    weights: Mapping[str, float]
    arm: str | None = None
    propensity: float = 1.0
    explored: bool = False
    policy: str = "fixed"
    ranking: tuple[int, ...] | None = None
    sampling_temperature: float | None = None

    def __post_init__(self) -> None:
        # A sampled ranking's probability can underflow to 0.0; the action was taken, so it is positive.
        if 0.0 <= self.propensity < MIN_PROPENSITY:
            object.__setattr__(self, "propensity", MIN_PROPENSITY)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "weights": dict(self.weights),
            "arm": self.arm,
            "propensity": float(self.propensity),
            "explored": bool(self.explored),
            "policy": self.policy,
        }
        if self.sampling_temperature is not None:  # only a sampled ranking has one: other decisions log as before
            d["sampling_temperature"] = float(self.sampling_temperature)
        return d


@dataclass(frozen=True, eq=False)
class Episode:
    """One logged decision together with the reward that feedback assigned to it.

    Built from what the store logged at decision time, so a reward that arrives
    hours later updates the decision that was actually made. ``shown`` is the
    ``(n_shown, n_retrievers)`` normalised score matrix of the shown chunks in
    shown order; ``chunk_rewards`` the reward attributed to each of them.
    """

    event_id: str
    query: str
    retrievers: tuple[str, ...]
    decision: Decision
    shown_ids: tuple[str, ...]
    shown: np.ndarray
    chunk_rewards: np.ndarray
    reward: float
    query_type: str = "default"
    features: Mapping[str, float] = field(default_factory=dict)
    timestamp: float = 0.0
    feedback_time: float = 0.0
    query_embedding: np.ndarray | None = None
    # The fused scores of the shown chunks as logged (optional). A Plackett-Luce
    # policy uses them to recompute the probability of the ranking it showed.
    scores: np.ndarray | None = None
    # rewards each shown chunk had from earlier feedback on the same event, so that a second click
    # does not read the first clicked chunk as skipped
    prior_rewards: np.ndarray | None = None
    # the feedback judged the whole answer (a thumbs down on it), not one chunk: only then does a
    # negative reward say something about the chunks it did not name
    response_level: bool = True
    # which shown chunks the answer was written from (None: all of them, as logged with used=True): praise
    # of the answer reads no chunk the answer did not use as passed over (a node a later step cut)
    used: np.ndarray | None = None

    def keeping(self, keep: np.ndarray) -> Episode:
        """This episode with only the shown chunks ``keep`` (booleans, one per shown chunk) marks, in order.

        >>> ep = Episode("e", "q", ("a",), Decision({"a": 1.0}), ("x", "y", "z"), np.ones((3, 1)), np.arange(3.0), 1.0)
        >>> ep.keeping(np.array([True, False, True])).shown_ids
        ('x', 'z')
        """
        keep = np.asarray(keep, dtype=bool)

        def kept(values: Any) -> Any:
            return None if values is None else np.asarray(values)[keep]

        return dataclasses.replace(
            self, shown_ids=tuple(c for c, k in zip(self.shown_ids, keep, strict=True) if k),
            shown=np.asarray(self.shown)[keep], chunk_rewards=np.asarray(self.chunk_rewards)[keep],
            scores=kept(self.scores), prior_rewards=kept(self.prior_rewards), used=kept(self.used),
        )


@runtime_checkable
class Policy(Protocol):
    """A fusion-weight policy."""

    name: str

    def decide(self, context: Context, *, explore: bool = True) -> Decision: ...

    def learn(self, episode: Episode, reward: float) -> Policy: ...

    def weights(self, query_type: str | None = None) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> Policy: ...


def same_hyperparameters(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two policies' ``params()`` agree on the keys both have, as JSON (a saved tuple comes back as a list).

    The weights are left out: they are what ``set_weights`` and ``rlfb weights import`` change,
    while the rest (``step``, ``bounds``, ...) fixes the shape of what the policy learns. A key only
    one side has is a hyperparameter added since the other was saved, not a mismatch: the ensemble
    (which snapshots are its own) and ``load_state_dict`` (which states load) decide alike.

    >>> same_hyperparameters({"step": 0.1, "bounds": (0.05, 0.95), "weights": {"bm25": 1.0}},
    ...                      {"step": 0.1, "bounds": [0.05, 0.95], "weights": {"bm25": 0.5}})
    True
    >>> same_hyperparameters({"step": 0.1}, {"step": 0.5})
    False
    >>> same_hyperparameters({"step": 0.1}, {"step": 0.1, "added_later": 3})
    True

    Numbers compare by value, however they were written (``100``, ``100.0``, ``np.int64(100)``): a
    policy built with ``window=100.0`` did not know its own state saved with ``window=100``.

    >>> same_hyperparameters({"window": 100}, {"window": np.float64(100.0)})
    True
    """
    shared = [k for k in a if k in b and k != "weights"]

    def canonical(p: Mapping[str, Any]) -> str:
        return json.dumps({k: _by_value(p[k]) for k in shared}, sort_keys=True, default=str)

    return canonical(a) == canonical(b)


def _by_value(value: Any) -> Any:
    """``value`` with every number a float (bools and strings kept), tuples as lists, for comparison."""
    if isinstance(value, (bool, np.bool_)) or value is None or isinstance(value, str):
        return bool(value) if isinstance(value, np.bool_) else value
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _by_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_by_value(v) for v in value]
    return value
