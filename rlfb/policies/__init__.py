"""Fusion-weight policies: what weights to fuse the retrievers with, and how to learn them.

Each policy is river-like and small: ``decide(context) -> Decision``,
``learn(episode, reward) -> self``, ``weights(query_type)``, and
``state_dict()``/``load_state_dict()`` as JSON (never pickle).
Hyperparameters are constructor arguments, held in a validated frozen
dataclass (``policy.hyper``); learned state is private; each policy owns a
seeded ``numpy`` generator.

========== ===================================================================
name       policy
========== ===================================================================
fixed      static weights (equal by default): the equal min-max and RRF baselines
batch      the design's 50-event batch updater over logged weights
thompson   contextual Thompson sampling over a simplex grid, behind an evidence gate
epsilon    the same bandit with decaying epsilon-greedy exploration
gradient   PDGD: Plackett-Luce exploration, debiased pairwise updates
========== ===================================================================

>>> make_policy("thompson", ["bm25", "dense"]).name
'thompson'
>>> make_policy("nope", ["bm25"])
Traceback (most recent call last):
...
rlfb.errors.ValidationError: unknown policy 'nope'; choose one of ['batch', 'epsilon', 'fixed', ...]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlfb.errors import ValidationError
from rlfb.policies.base import Context, Decision, Episode, Policy
from rlfb.policies.batch import BatchParams, BatchPolicy
from rlfb.policies.fixed import FixedParams, FixedPolicy
from rlfb.policies.gradient import GradientParams, GradientPolicy
from rlfb.policies.thompson import EpsilonGreedyPolicy, ThompsonParams, ThompsonPolicy
from rlfb.types import check_choice, check_known_options, keyword_options

__all__ = [
    "POLICIES",
    "make_policy",
    "check_policy_name",
    "Context",
    "Decision",
    "Episode",
    "Policy",
    "FixedPolicy",
    "FixedParams",
    "BatchPolicy",
    "BatchParams",
    "ThompsonPolicy",
    "ThompsonParams",
    "EpsilonGreedyPolicy",
    "GradientPolicy",
    "GradientParams",
]

#: Policy name -> class.
POLICIES: dict[str, type[Any]] = {
    "fixed": FixedPolicy,
    "batch": BatchPolicy,
    "thompson": ThompsonPolicy,
    "epsilon": EpsilonGreedyPolicy,
    "gradient": GradientPolicy,
}


def check_policy_name(name: str) -> str:
    """``name`` if it names a policy, else :class:`ValidationError`.

    >>> check_policy_name("thompson")
    'thompson'
    """
    return check_choice(name, POLICIES, "policy")


def make_policy(policy: str | Policy, retrievers: Sequence[str], **kwargs: Any) -> Policy:
    """A policy by name (built with ``retrievers`` and ``kwargs``), or a given instance, checked.

    An instance must be for the same retrievers, in the same order.
    """
    if isinstance(policy, str):
        cls = POLICIES[check_policy_name(policy)]
        known = keyword_options(cls.__init__, leave_out=("retrievers",))
        if known is not None:
            check_known_options(kwargs, known, f"policy {policy!r}")
        try:
            return cls(retrievers, **kwargs)
        except TypeError as exc:  # an option this policy does not take
            raise ValidationError(f"bad options for policy {policy!r}: {exc}") from exc
    if not isinstance(policy, Policy):
        raise ValidationError(f"policy must be a name or a Policy instance, got {type(policy).__name__}")
    have = tuple(getattr(policy, "retrievers", tuple(retrievers)))
    if have != tuple(retrievers):
        raise ValidationError(f"policy is for retrievers {list(have)}, not {list(retrievers)}")
    return policy
