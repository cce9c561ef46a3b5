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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.hyperparameters import check_float, check_int
from rlfb.policies.simplex import default_bounds, saved_bounds, validate_retrievers
from rlfb.saved_state import MAX_COUNT, read_number, rng_state, set_rng_state

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["BasePolicy", "Context", "Decision", "Episode", "Policy", "MIN_PROPENSITY", "same_hyperparameters"]

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
    # the RRF constant where ``normalized`` holds RRF scores (``fusion="rrf"``), None for a score-based
    # normalisation: RRF's scores at the top of a ranking are a few ten-thousandths apart, so the learner measures
    # its chunk exploration against their drop over the shown depth (rlfb.fusion.exploration_scale)
    rrf_c: float | None = None


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


class BasePolicy:
    """What every policy shares: retrievers, a seeded generator, tuning multipliers, ``partial_fit``.

    Subclasses set ``name`` and implement ``decide``, ``learn``, ``weights``
    and ``_state``/``_load_state``.
    """

    name = "base"
    #: the class of the policy's hyperparameters (its ``hyper``) that :meth:`from_params` takes; ``None`` where
    #: it takes none (a fixed policy's only setting is its weights)
    params_type: type[Any] | None = None

    def __init__(self, retrievers: Sequence[str], seed: int | None = 0) -> None:
        self.retrievers = validate_retrievers(retrievers)
        if seed is not None:
            seed = check_int("seed", seed, 0)  # a numpy integer as a plain one: its state is written as JSON
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._n_updates = 0.0
        self._lr_scale = 1.0
        self._explore_scale = 1.0

    def _bounds_or_default(self, bounds: tuple[float, float] | None) -> tuple[float, float]:
        """The bounds given, or where none were (``None``, the constructors' default) :func:`default_bounds` for
        this policy's number of retrievers: only the default adapts to ``n``. ``hyper.bounds``, and the saved
        ``params`` a learner is rebuilt from, hold the bounds in use."""
        return default_bounds(len(self.retrievers)) if bounds is None else bounds

    def _check_bounds_fit(self, bounds: tuple[float, float]) -> None:
        """Refuse bounds that leave ``n`` weights no room: an upper bound under ``1/n`` (no ``n`` weights under it
        sum to 1) or a lower bound at or over ``1/n`` (only ``1/n`` each do). The projection widened either to
        ``1/n``, so the policy kept equal weights for ever while its ``hyper.bounds`` said otherwise. The default
        lower bound stays under ``1/n`` (:func:`default_bounds`): only bounds given explicitly are refused."""
        n = len(self.retrievers)
        if n > 1 and bounds[1] * n < 1.0 - 1e-12:
            raise ValidationError(f"bounds {tuple(bounds)} cannot hold {n} weights summing to 1: the upper bound "
                                  f"must be at least 1/{n}")
        if n > 1 and bounds[0] * n >= 1.0 - 1e-12:
            raise ValidationError(f"bounds {tuple(bounds)} pin each of {n} weights at 1/{n}: the lower bound must "
                                  f"be under 1/{n} (leave bounds out for a default that fits {n} retrievers)")

    @classmethod
    def from_params(cls, retrievers: Sequence[str], params: Any,
                    weights: Mapping[str, float] | Sequence[float] | None = None, *, seed: int | None = 0) -> Self:
        """This policy with the hyperparameters of ``params``, a validated value object of its
        :attr:`params_type` (``ThompsonParams``, ``GradientParams``, ``BatchParams``), kept apart from any learned
        state as MABWiser keeps its learning policies: one value object can make the policies of many
        ensembles, and ``policy.hyper`` equals it. Its ``bounds`` are taken as given: the Params'
        default, ``(0.05, 0.95)``, fits fewer than 20 retrievers (the constructors' own default fits any number).

        >>> from rlfb.policies import ThompsonParams, ThompsonPolicy
        >>> params = ThompsonParams(step=0.25, cf_min_questions=10)
        >>> policy = ThompsonPolicy.from_params(["bm25", "dense"], params, seed=1)
        >>> policy.hyper == params, len(policy.arm_names)
        (True, 6)
        """
        if cls.params_type is None:
            raise ValidationError(f"{cls.__name__} takes no Params value object: give its settings to the constructor")
        if type(params) is not cls.params_type:
            raise ValidationError(f"{cls.__name__}.from_params takes a {cls.params_type.__name__}, "
                                  f"got {type(params).__name__}")
        settings = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
        make: Callable[..., Self] = cls  # a subclass's constructor, which takes the weights and these settings
        return make(retrievers, weights, seed=seed, **settings)

    # -- tuning by the guardrail
    def tune(self, *, learning_rate: float = 1.0, exploration: float = 1.0) -> Self:
        """Set the guardrail's multipliers on the learning rate and on exploration."""
        self._lr_scale = check_float("learning_rate multiplier", learning_rate, 0.0, 10.0)
        self._explore_scale = check_float("exploration multiplier", exploration, 0.0, 10.0)
        return self

    @property
    def n_updates(self) -> float:
        """The (replay-weighted) number of updates learned so far."""
        return self._n_updates

    def partial_fit(self, episodes: Iterable[Any]) -> Self:
        """Replay logged episodes through :meth:`learn`, each with its own reward."""
        for ep in episodes:
            self.learn(ep, ep.reward)  # type: ignore[attr-defined]
        return self

    def uncertainty(self, context: Any) -> float:
        """How unsure the policy is about its weights for this context, in [0, 1]."""
        return 0.0

    def params(self) -> dict[str, Any]:  # pragma: no cover - overridden
        return {}

    def _state(self) -> dict[str, Any]:  # pragma: no cover - overridden
        return {}

    def _load_state(self, state: Mapping[str, Any]) -> None:  # pragma: no cover - overridden
        return None

    def state_dict(self) -> dict[str, Any]:
        """Hyperparameters, learned state and the generator's state, JSON-safe."""
        return {
            "name": self.name,
            "retrievers": list(self.retrievers),
            "params": self.params(),
            "seed": self.seed,
            "n_updates": float(self._n_updates),
            "lr_scale": float(self._lr_scale),
            "explore_scale": float(self._explore_scale),
            "rng": rng_state(self._rng),
            "state": self._state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> Self:
        """Restore what :meth:`state_dict` saved; a mismatch or damage raises :class:`CorruptStateError`."""
        if not isinstance(state, Mapping):
            raise CorruptStateError(f"policy state must be a mapping, got {type(state).__name__}")
        try:
            if state.get("name") != self.name:
                raise CorruptStateError(f"state is for policy {state.get('name')!r}, not {self.name!r}")
            if tuple(state.get("retrievers", ())) != self.retrievers:
                raise CorruptStateError(
                    f"state is for retrievers {state.get('retrievers')!r}, not {list(self.retrievers)!r}"
                )
            # replay-weighted, so a float; at most MAX_COUNT: float(10**400) raised a raw OverflowError here
            n_updates = read_number(state, "n_updates", 0.0, float(MAX_COUNT))
            # the guardrail's multipliers, in [0, 10] as tune() sets them (1e300 loaded); absent in older states
            lr_scale = read_number({"lr_scale": 1.0, **state}, "lr_scale", 0.0, 10.0)
            explore_scale = read_number({"explore_scale": 1.0, **state}, "explore_scale", 0.0, 10.0)
            saved, ours = state.get("params"), self.params()
            if isinstance(saved, Mapping) and isinstance(saved.get("bounds"), list) and len(saved["bounds"]) == 2:
                # the old default that pinned the weights, as today's default (saved_bounds)
                saved = {**saved, "bounds": list(saved_bounds(tuple(saved["bounds"]), len(self.retrievers)))}
            # a parameter added since the save is not a mismatch (same_hyperparameters)
            if isinstance(saved, Mapping) and not same_hyperparameters(saved, ours):
                raise CorruptStateError(
                    f"state is for {self.name} hyperparameters {dict(saved)}, not {ours}: its learned "
                    "state does not fit this policy"
                )
            set_rng_state(np.random.default_rng(), state["rng"])  # checked before anything is changed
            backup = dict(vars(self))
            try:
                self._n_updates = n_updates  # what the learned sums are checked against (check_at_most)
                self._load_state(state["state"])
            except BaseException:
                # a field read after others were set (batch's weights before its counters) left a half-loaded
                # policy: put every attribute back as it was
                vars(self).clear()
                vars(self).update(backup)
                raise
            set_rng_state(self._rng, state["rng"])
        except CorruptStateError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise CorruptStateError(f"cannot read {self.name} policy state: {exc!r}") from exc
        self._n_updates = n_updates
        self._lr_scale = lr_scale
        self._explore_scale = explore_scale
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({list(self.retrievers)!r}, {args})"
