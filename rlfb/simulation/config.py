"""The settings of a simulation run (:class:`SimulationConfig`), all checked before a dataset is indexed, and the
names of the figures it reports."""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rlfb.defaults import LEARNING_POLICY
from rlfb.errors import ValidationError
from rlfb.simulation.users import CLICK_MODELS
from rlfb.types import validate_k

__all__ = ["SimulationConfig", "metric_name", "metric_keys", "clock_lead"]


def metric_name(k: int) -> str:
    """The name of the figures' metric in the JSON keys (``heldout_ndcg@10``, ...), which follows ``k``.

    >>> metric_name(10), metric_name(5)
    ('ndcg@10', 'ndcg@5')
    """
    return f"ndcg@{k}"


def metric_keys(k: int) -> tuple[str, str, str]:
    """The keys of the held-out, seen and online figures."""
    m = metric_name(k)
    return f"heldout_{m}", f"seen_{m}", f"online_{m}"


# the default lead covers the default late delay (2 days) with room to spare; it is also the lead of any run whose
# delays it covers, so the simulated clock, and every figure, stay as they were for those
_MIN_LEAD = 5 * 86400.0
# exponential delays longer than this many means are left to chance: e**-50 per signal, about 2e-22
_DELAY_TAIL = 50.0


def clock_lead(config: SimulationConfig) -> float:
    """Seconds between the stream's last question and now: every signal is due by then, late ones too."""
    return max(_MIN_LEAD, config.late_delay, _DELAY_TAIL * config.mean_delay)


@dataclass(frozen=True)
class SimulationConfig:
    """Every setting of a simulation run; all of it is written to the JSON output."""

    policy: str = LEARNING_POLICY
    user: str = "navigational"
    interactions: int = 2000
    explicit_rate: float = 0.1
    noise: float = 0.0
    reformulation_rate: float = 0.5
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    checkpoints: int = 10
    k: int = 10
    retrievers: tuple[str, ...] = ("bm25", "dense", "splade")
    fusion: str = "minmax"
    memory: bool = True
    candidate_k: int = 100
    split: str = "test"
    stream_split: str = "train"  # streamed where the collection has it; the JSON says null where it has none
    max_heldout: int | None = None
    max_seen: int = 300
    grid_step: float = 0.1
    spacing: float = 60.0
    mean_delay: float = 120.0
    late_rate: float = 0.02
    late_delay: float = 2 * 86400.0
    answer_k: int = 3
    learner: Mapping[str, Any] = field(default_factory=dict)
    policy_options: Mapping[str, Any] = field(default_factory=dict)  # the policy's hyperparameters, by name

    def __post_init__(self) -> None:
        # every setting is checked here, before a dataset is indexed: a typo must not cost minutes of encoding
        from rlfb.fusion import check_fusion
        from rlfb.policies import check_policy_name
        from rlfb.retrievers import check_retriever_names

        if self.user not in CLICK_MODELS:
            raise ValidationError(f"unknown user {self.user!r}; choose one of {sorted(CLICK_MODELS)}")
        # by name only: each seed builds its own policy and retrievers from them, and the JSON output names them (a
        # policy object was one learner carried from seed to seed, its seeds not independent, and no JSON held it)
        if not isinstance(self.policy, str):
            raise ValidationError(f"policy must be a policy's name (its settings go in policy_options), got a "
                                  f"{type(self.policy).__name__}: each seed builds a policy of its own")
        check_policy_name(self.policy)
        if not self.retrievers:
            raise ValidationError("give at least one retriever")
        if isinstance(self.retrievers, str) or not all(isinstance(r, str) for r in self.retrievers):
            raise ValidationError(f"retrievers must be retriever names, got {self.retrievers!r}")
        check_retriever_names(list(self.retrievers))
        check_fusion(self.fusion)
        for name in ("explicit_rate", "noise", "reformulation_rate", "late_rate"):
            p = getattr(self, name)
            if isinstance(p, bool) or not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
                raise ValidationError(f"{name} must be a probability in [0, 1], got {p!r}")
        # max_seen 0 gave NaN seen figures, and a negative one a ValueError from random.sample mid-run
        sizes = ("interactions", "checkpoints", "max_seen", *(("max_heldout",) if self.max_heldout is not None else ()))
        for name in sizes:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
                raise ValidationError(f"{name} must be a positive int, got {v!r}")
            object.__setattr__(self, name, int(v))  # a numpy int, taken, is a plain one in the JSON output
        # a curve point per interaction is the most there can be (more marks round onto the same ones); clamped,
        # so that a huge count does not build a huge set of marks
        object.__setattr__(self, "checkpoints", min(self.checkpoints, self.interactions))
        validate_k(self.k)  # before the labels and answer_k's bound read it
        if not self.seeds:
            raise ValidationError("give at least one seed")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ValidationError(f"seeds must be non-negative ints, got {list(self.seeds)!r}")
        if len(set(self.seeds)) != len(self.seeds):
            # a seed run twice gives the same figures twice: an interval over them would claim a precision never
            # measured
            raise ValidationError(f"seeds must not repeat, got {list(self.seeds)!r}")
        if not isinstance(self.split, str) or not self.split:
            raise ValidationError(f"split must name a qrels file, got {self.split!r}")
        for name, low_open in (("mean_delay", False), ("late_delay", False), ("spacing", True)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (low_open and v == 0):
                bound = "positive" if low_open else "non-negative"
                raise ValidationError(f"{name} must be a finite {bound} number of seconds, got {v!r}")
        # the simulated clock runs in the past, ending early enough before now for every delay: it must not start
        # before 1970, where a timestamp would be negative
        span = self.interactions * self.spacing + clock_lead(self)
        if span >= time.time():
            raise ValidationError(
                f"interactions x spacing ({self.interactions} x {self.spacing:g}s) and the feedback delays "
                f"(late_delay {self.late_delay:g}s, mean_delay {self.mean_delay:g}s) span {span:.3g}s, more "
                "than the time since 1970 that the simulated clock runs in")
        if not (0 < self.grid_step <= 0.5) or abs(1 / self.grid_step - round(1 / self.grid_step)) > 1e-9:
            # the grid steps by 1/round(1/step): 0.3 searched thirds while the JSON said 0.3
            raise ValidationError(f"grid_step must be 1/m for a whole number m >= 2 (0.5, 0.25, 0.1, ...), "
                                  f"got {self.grid_step}")
        if not (isinstance(self.answer_k, int) and 1 <= self.answer_k <= self.k):
            raise ValidationError(f"answer_k must be an int in [1, k={self.k}], got {self.answer_k!r}")
        if not isinstance(self.learner, Mapping):
            raise ValidationError(f"learner must be a mapping, got {type(self.learner).__name__}")
        from rlfb.learner import LearnerConfig

        LearnerConfig.from_dict(dict(self.learner))  # a misspelt or bad setting fails here, before indexing
        # the memory is on or off by `memory` alone: a run labelled by one and run by the other misleads its table
        if "memory_weight" in self.learner and (not self.memory or self.learner["memory_weight"] == 0):
            raise ValidationError("the memory is turned off by --no-memory (memory=False), not by memory_weight; "
                                  f"got memory={self.memory} and memory_weight={self.learner['memory_weight']!r}")
        if not self.memory and self.learner.get("relevance_feedback_weight", 0) > 0:
            raise ValidationError("relevance_feedback_weight reads the feedback memory, which --no-memory turns off")
        if not isinstance(self.policy_options, Mapping):
            raise ValidationError(f"policy_options must be a mapping, got {type(self.policy_options).__name__}")
        if self.policy_options:
            if "seed" in self.policy_options:
                raise ValidationError("policy_options cannot set the seed: each run's seed comes from seeds")
            from rlfb.policies import make_policy

            # built once now, so that an option the policy does not take, or a bad value, fails before indexing
            make_policy(self.policy, list(self.retrievers), **dict(self.policy_options))

    def learner_config(self) -> dict[str, Any] | None:
        """The learner's settings as each seed's ensemble takes them (``None``: the defaults)."""
        cfg = dict(self.learner)
        if not self.memory:
            cfg["memory_weight"] = 0.0
        return cfg or None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seeds"] = list(self.seeds)
        d["retrievers"] = list(self.retrievers)
        d["learner"] = dict(self.learner)
        d["policy_options"] = dict(self.policy_options)
        return d
