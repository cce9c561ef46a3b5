"""What the learner takes from feedback that arrives one signal at a time; and policies that take
episodes, logged arms and saved states as they are."""

from __future__ import annotations

import json
from typing import Any, cast

import numpy as np
import pytest

from rlfb import FeedbackEnsemble, ValidationError
from rlfb.confidence import ChunkConfidence
from rlfb.errors import CorruptStateError
from rlfb.policies import FixedPolicy, ThompsonPolicy, make_policy
from rlfb.policies.base import Decision, Episode
from rlfb.store import FeedbackStore

from _corpus import IDS, TEXTS

T0 = 1_700_000_000.0
QUERY = "aurora charged particles"


def _run(seq: list[tuple[str, int | None]]) -> dict[str, float]:
    """The feedback memory of QUERY's three shown chunks after ``seq`` of (signal, shown index or None)."""
    store = FeedbackStore(clock=lambda: T0 + 100)
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=store, policy="gradient")
    r = ens.retrieve(QUERY, 3, explore=False, timestamp=T0)
    ids = [h.chunk_id for h in r.hits]
    for signal, i in seq:
        ens.feedback(r.event_id, signal, chunk_id=None if i is None else ids[i], timestamp=T0)
    known = ens.learner.memory.known(QUERY)
    return {c: round(known.get(c, 0.0), 9) for c in ids}


def test_a_negative_on_one_chunk_says_nothing_of_the_others() -> None:
    memory = _run([("thumbs_down", 1)])
    assert [v for v in memory.values() if v != 0] == [-1.0]
    assert sum(v != 0 for v in _run([("thumbs_down", None)]).values()) == 3  # on the answer: on each chunk


def test_opened_then_cited_in_two_calls_is_one_signal() -> None:
    store = FeedbackStore(clock=lambda: T0 + 100)
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=store, policy="gradient")
    r = ens.retrieve(QUERY, 3, explore=False, timestamp=T0, session_id="s")
    c = r.hits[1].chunk_id
    ens.observe("s", opened=[c], timestamp=T0 + 10)
    again = ens.observe("s", cited=[c], opened=[c], timestamp=T0 + 20)  # a UI reporting cumulatively
    assert [rec.duplicate for rec in again] == [True]
    assert store.counts()["feedback"] == 1


def test_confidence_refuses_non_finite_rewards_and_clocks() -> None:
    conf = ChunkConfidence()
    for kwargs in ({"rewards": [np.inf]}, {"rewards": [1.0], "relevance": [np.inf]},
                   {"rewards": [1.0], "timestamp": np.nan}):
        with pytest.raises(ValidationError):
            conf.update(["c"], **kwargs)
    state = conf.state_dict()
    with pytest.raises(CorruptStateError):
        ChunkConfidence().load_state_dict({**state, "now": float("inf")})


# -- policies -----------------------------------------------------------------------------------------------
def _episode(retrievers: tuple[str, ...], shown: Any, rewards: Any, prior: Any = None,
             weights: dict | None = None, arm: str | None = None) -> Episode:
    shown = np.asarray(shown, dtype=float)
    return Episode("e", "q", retrievers, Decision(weights or dict.fromkeys(retrievers, 1 / len(retrievers)), arm=arm),
                   tuple(f"c{i}" for i in range(len(shown))), shown, np.asarray(rewards, dtype=float), 0.4,
                   prior_rewards=None if prior is None else np.asarray(prior, dtype=float))


def test_pdgd_never_puts_a_chunk_clicked_before_on_the_losing_side() -> None:
    # chunk 0 (all "a") was clicked first; now chunk 1 (all "b") is: the pair (1 over 0) must not be learned
    shown = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]
    with_prior = make_policy("gradient", ("a", "b"), evidence_z=0.0)
    with_prior.learn(_episode(("a", "b"), shown, [0, 0.4, 0], prior=[0.4, 0, 0]), 0.4)
    only_next = make_policy("gradient", ("a", "b"), evidence_z=0.0)
    only_next.learn(_episode(("a", "b"), [[0.0, 1.0], [0.5, 0.5]], [0.4, 0]), 0.4)  # the one pair left: 1 over 2
    assert with_prior.weights() == pytest.approx(only_next.weights())


@pytest.mark.parametrize("bad", ["nan", "retrievers", "length"])
def test_pdgd_refuses_an_episode_it_cannot_read(bad: str) -> None:
    policy = make_policy("gradient", ("a", "b"))
    shown, rewards, retrievers = [[np.nan if bad == "nan" else 0.1, 0.2], [0.1, 0.9]], [0, 1], ("a", "b")
    if bad == "retrievers":
        retrievers = ("x", "y")
    if bad == "length":
        rewards = [0, 1, 0]
    with pytest.raises(ValidationError):
        policy.learn(_episode(retrievers, shown, rewards), 1.0)
    assert json.dumps(policy.state_dict())  # and its state still saves


def test_clipped_grid_points_are_one_arm_each() -> None:
    policy = cast(ThompsonPolicy, make_policy("epsilon", ("a", "b"), step=0.1, bounds=(0.2, 0.8)))
    assert len(set(policy.arm_names)) == len(policy.arm_names)
    weights = [tuple(np.round(policy._arms[i], 9)) for i in range(1, len(policy.arm_names))]
    assert len(set(weights)) == len(weights)


def test_a_logged_arm_name_counts_only_in_the_policy_retriever_order() -> None:
    policy = cast(ThompsonPolicy, make_policy("thompson", ("a", "b")))
    arm = "0.2/0.8"  # named in (b, a) order by another logger: weights a=0.8, b=0.2
    episode = _episode(("b", "a"), [[1.0, 0.0]], [1.0], weights={"b": 0.2, "a": 0.8}, arm=arm)
    counted = policy._arm_of(episode)
    assert counted is not None and policy.arm_names[counted] == "0.8/0.2"


def test_a_gate_of_zero_never_prefers_an_arm_of_unknown_spread() -> None:
    policy = cast(ThompsonPolicy, make_policy("thompson", ("a", "b"), cf_gate_z=0.0))
    adv = np.zeros(len(policy.arm_names))
    adv[1], adv[2] = -0.1, 0.3
    var = np.full(len(adv), 0.01)
    var[1] = np.inf
    assert policy._cf_gate(adv, var) == 2


def test_a_state_of_other_hyperparameters_is_refused_whole() -> None:
    saved = make_policy("gradient", ("a", "b"), bounds=(0.0, 1.0)).state_dict()
    policy = make_policy("gradient", ("a", "b"))
    before = policy.state_dict()
    with pytest.raises(CorruptStateError, match="hyperparameters"):
        policy.load_state_dict(saved)
    assert policy.state_dict() == before
    damaged = {**policy.state_dict(), "rng": {"bit_generator": "nope"}}
    with pytest.raises(CorruptStateError):
        policy.load_state_dict(damaged)
    assert policy.state_dict() == before  # nothing half-loaded


@pytest.mark.parametrize(("reward", "weight"), [(float("nan"), 1.0), (1.0, float("nan")), (1.0, -5.0)])
def test_fixed_policy_checks_what_it_learns_from(reward: float, weight: float) -> None:
    policy = cast(FixedPolicy, make_policy("fixed", ("a", "b")))
    with pytest.raises(ValidationError):
        policy.learn(_episode(("a", "b"), [[1.0, 0.0]], [1.0]), reward, weight=weight)
