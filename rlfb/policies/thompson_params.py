"""``ThompsonParams``: the hyperparameters of :class:`~rlfb.policies.thompson.ThompsonPolicy`, a validated
value object (what each one does: the module docstring of :mod:`rlfb.policies.thompson`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlfb.errors import ValidationError
from rlfb.hyperparameters import check_float, check_int, plain_numbers
from rlfb.policies.simplex import check_bounds

__all__ = ["ThompsonParams"]

EXPLORATIONS = ("thompson", "epsilon")


@dataclass(frozen=True)
class ThompsonParams:
    """Hyperparameters of :class:`ThompsonPolicy` (validated on construction).

    >>> ThompsonParams(step=0.3)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: step must divide 1 into a whole number of parts, got 0.3
    """

    step: float = 0.1
    exploration: str = "thompson"
    epsilon: float = 0.1
    epsilon_min: float = 0.01
    epsilon_decay: float = 500.0
    baseline_share: float = 0.1
    prior_strength: float = 2.0
    type_prior: float = 20.0
    bandwidth: float = 0.1
    noise: float = 0.5
    gate_z: float | None = None
    min_samples: float = 10.0
    default_after: int = 50
    default_step: float = 0.05
    forget: float = 0.999
    half_life_days: float | None = 45.0
    contextual: bool = True
    propensity_draws: int = 32
    bounds: tuple[float, float] = (0.05, 0.95)  # the policy passes default_bounds(n) where none are given
    max_arms: int = 5000
    counterfactual: bool = True
    cf_min_clicks: float = 20.0
    cf_min_questions: int = 1
    cf_gate_z: float = 1.5
    cf_max_queries: int = 2000

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        step = check_float("step", self.step, 0.0, 1.0, lo_open=True)
        parts = 1.0 / step  # inf for a step of 1e-320, which round() cannot take
        if not math.isfinite(parts) or abs(round(parts) * step - 1.0) > 1e-9:
            raise ValidationError(f"step must divide 1 into a whole number of parts, got {self.step!r}")
        if self.exploration not in EXPLORATIONS:
            raise ValidationError(f"exploration must be one of {EXPLORATIONS}, got {self.exploration!r}")
        check_float("epsilon", self.epsilon, 0.0, 1.0)
        check_float("epsilon_min", self.epsilon_min, 0.0, 1.0)
        if self.epsilon_min > self.epsilon:
            raise ValidationError("epsilon_min must not exceed epsilon")
        check_float("epsilon_decay", self.epsilon_decay, 0.0, None, lo_open=True)
        check_float("baseline_share", self.baseline_share, 0.0, 1.0)
        check_float("prior_strength", self.prior_strength, 0.0, None, lo_open=True)
        check_float("type_prior", self.type_prior, 0.0, None)
        check_float("bandwidth", self.bandwidth, 0.0, 1.0)
        check_float("noise", self.noise, 0.0, 10.0, lo_open=True)
        if self.gate_z is not None:
            check_float("gate_z", self.gate_z, 0.0, 10.0)
        check_float("min_samples", self.min_samples, 0.0, None)
        check_int("default_after", self.default_after, 0, 2**53)  # 10**400 made its own saved state unloadable
        check_float("default_step", self.default_step, 0.0, 1.0)
        check_float("forget", self.forget, 0.5, 1.0)
        if self.half_life_days is not None:
            check_float("half_life_days", self.half_life_days, 0.0, None, lo_open=True)
        if not isinstance(self.contextual, bool):
            raise ValidationError(f"contextual must be a bool, got {self.contextual!r}")
        check_int("propensity_draws", self.propensity_draws, 1, 100_000)
        object.__setattr__(self, "bounds", check_bounds(self.bounds))
        check_int("max_arms", self.max_arms, 2, 1_000_000)
        if not isinstance(self.counterfactual, bool):
            raise ValidationError(f"counterfactual must be a bool, got {self.counterfactual!r}")
        check_float("cf_min_clicks", self.cf_min_clicks, 0.0, None)
        check_int("cf_min_questions", self.cf_min_questions, 1, 1_000_000)
        check_float("cf_gate_z", self.cf_gate_z, 0.0, 10.0)
        check_int("cf_max_queries", self.cf_max_queries, 2, 1_000_000)
        if self.cf_min_questions > self.cf_max_queries:  # the evidence forgets questions past cf_max_queries
            raise ValidationError(f"cf_min_questions ({self.cf_min_questions}) must not exceed cf_max_queries "
                                  f"({self.cf_max_queries}): no query type could hold that many questions")
