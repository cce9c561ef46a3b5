"""Fusion-weight policies on a deterministic toy world (see ``_toy_env.py``)."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import math
from collections.abc import Mapping
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest

from rlfb.errors import CorruptStateError, InvalidWeightsError, ValidationError
from rlfb.features import QUERY_TYPES, query_features, query_type
from rlfb.learner import Learner, LearnerConfig
from rlfb.policies import (
    POLICIES,
    BatchPolicy,
    EpsilonGreedyPolicy,
    FixedPolicy,
    GradientPolicy,
    ThompsonPolicy,
    make_policy,
)
from rlfb.policies.base import Context, Decision, Episode, Policy
from rlfb.policies.gradient import pdgd_debias_weights, pdgd_pairs, plackett_luce_log_prob
from rlfb.policies.simplex import project_simplex
from rlfb.policies.thompson import simplex_grid

from _toy_env import RETRIEVERS, ToyEnv, simulate

# weights only: no memory, no confidence, no chunk exploration
PLAIN = LearnerConfig(memory_weight=0.0, confidence_weight=0.0, exploration="none")
LEARNING = [
    ("batch", {}),
    ("thompson", {}),
    ("epsilon", {"epsilon": 0.3, "epsilon_decay": 1e6}),
    ("gradient", {}),
]


def _w(weights: Mapping[str, float]) -> np.ndarray:
    return np.array([weights[r] for r in RETRIEVERS])


def _episode(weights, shown, rewards, reward, *, arm=None, qtype="default", eid="e") -> Episode:
    shown = np.asarray(shown, dtype=float)
    return Episode(
        event_id=eid,
        query="q",
        retrievers=RETRIEVERS,
        decision=Decision(dict(zip(RETRIEVERS, weights, strict=True)), arm=arm),
        shown_ids=tuple(f"d{i}" for i in range(len(shown))),
        shown=shown,
        chunk_rewards=np.asarray(rewards, dtype=float),
        reward=reward,
        query_type=qtype,
    )


# ---------------------------------------------------------------------------- registry


def test_registry_names_and_errors():
    assert sorted(POLICIES) == ["batch", "epsilon", "fixed", "gradient", "thompson"]
    for name in POLICIES:
        p = make_policy(name, RETRIEVERS)
        assert isinstance(p, Policy) and p.name == name
    with pytest.raises(ValidationError, match="batch.*epsilon.*fixed.*gradient.*thompson"):
        make_policy("ucb", RETRIEVERS)
    with pytest.raises(ValidationError, match="retrievers"):
        make_policy(FixedPolicy(("a", "b")), RETRIEVERS)
    with pytest.raises(ValidationError, match="policy 'fixed' takes no option 'step'; its options are \\['seed', "
                                              "'weights'\\]"):
        make_policy("fixed", RETRIEVERS, step=0.1)


def test_fixed_policy_validates_and_keeps_weights():
    p = FixedPolicy(RETRIEVERS, {"r0": 2.0, "r1": 0.0, "r2": 2.0})
    assert p.weights() == {"r0": 0.5, "r1": 0.0, "r2": 0.5}
    # the ignore: FixedPolicy.decide is annotated to take a Context, though it never reads it
    assert p.decide(None).weights == p.weights() and not p.decide(None).explored  # type: ignore[arg-type]
    p.learn(_episode([0.5, 0, 0.5], [[1, 0, 0]], [1.0], 1.0), 1.0)
    assert p.weights() == {"r0": 0.5, "r1": 0.0, "r2": 0.5}
    assert FixedPolicy(RETRIEVERS).weights() == pytest.approx(dict.fromkeys(RETRIEVERS, 1 / 3))
    for bad in (
        {"r0": float("nan"), "r1": 1, "r2": 1},
        {"r0": -0.1, "r1": 1, "r2": 1},
        {"r0": 0, "r1": 0, "r2": 0},
        {"r0": 1, "r1": 1},
        {"r0": 1, "r1": 1, "r2": 1, "x": 1},
        [1.0, 2.0],
        {"r0": float("inf"), "r1": 1, "r2": 1},
    ):
        with pytest.raises(InvalidWeightsError):
            FixedPolicy(RETRIEVERS, bad)


def test_a_bandwidth_whose_square_is_zero_keeps_each_arm_its_own() -> None:
    # 1e-200 squared is 0: every kernel entry was 0/0, every posterior NaN, and the weights never moved
    assert np.array_equal(ThompsonPolicy(RETRIEVERS, bandwidth=1e-200)._K, np.eye(ThompsonPolicy(RETRIEVERS).n_arms))


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (BatchPolicy, {"batch_size": 0}),
        (BatchPolicy, {"learning_rate": -0.1}),
        (BatchPolicy, {"positive_threshold": -0.6, "negative_threshold": -0.5}),
        (BatchPolicy, {"bounds": (0.5, 0.4)}),
        (BatchPolicy, {"concentration": 0}),
        (ThompsonPolicy, {"step": 0.3}),
        (ThompsonPolicy, {"step": 0}),
        (ThompsonPolicy, {"exploration": "ucb"}),
        (ThompsonPolicy, {"epsilon": 1.5}),
        (ThompsonPolicy, {"epsilon": 0.1, "epsilon_min": 0.2}),
        (ThompsonPolicy, {"forget": 0.1}),
        (ThompsonPolicy, {"noise": 0}),
        (ThompsonPolicy, {"step": 0.01}),  # 5151 arms > max_arms
        (ThompsonPolicy, {"bandwidth": float("nan")}),
        (ThompsonPolicy, {"default_after": 10**400}),  # its own saved state was refused on load
        (GradientPolicy, {"temperature": 0}),
        (GradientPolicy, {"temperature": 5e-324}),  # the gradient sums went NaN: no state could be saved
        (GradientPolicy, {"learning_rate": float("inf")}),
        (GradientPolicy, {"shrinkage": -1}),
        (GradientPolicy, {"max_step": 0}),
        (GradientPolicy, {"bounds": (0.05,)}),
        (FixedPolicy, {"seed": -1}),
    ],
)
def test_bad_hyperparameters_raise(cls, kwargs):
    with pytest.raises(ValidationError):
        cls(RETRIEVERS, **kwargs)


def test_bad_retrievers_raise():
    for bad in ([], "r0", ["a", "a"], ["a", ""], [1, 2]):
        with pytest.raises(ValidationError):
            ThompsonPolicy(bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- features


def test_query_features_and_types():
    f = query_features('how do I fix "error E1234" in my_module?')
    assert f["has_code"] == f["has_quote"] == f["is_question"] == f["has_digits"] == 1.0
    assert query_type(f) == "medium|code"
    assert query_type(query_features("aurora")) == "short|keyword"
    assert query_type(query_features("why is the sky blue")) == "medium|question"
    assert query_type(query_features('"solar wind" particles')) == "short|quoted"
    assert query_type(query_features("is 'solar wind' the cause")) == "medium|quoted"
    # apostrophes quote nothing: a possessive and a contraction used to make this "quoted"
    assert query_type(query_features("why doesn't the kernel's scheduler preempt")) == "medium|question"
    assert query_type(query_features(" ".join(["word"] * 20))) == "long|keyword"
    assert query_type(query_features("")) == "short|keyword"
    assert len(QUERY_TYPES) == 12 and query_type(f) in QUERY_TYPES


def test_every_code_pattern_starts_at_an_anchor_so_a_long_word_stays_linear():
    # "\w+\(\)" (a call) had no anchor: tried from every character of a long word, each try running to its end,
    # a 64,000-character token took 7.7 s to classify and a 2,000,000-character one more than 13 minutes
    import re

    try:
        import re._parser as parser  # the standard library's own regex parser
    except ImportError:  # Python 3.10
        import sre_parse as parser

    from rlfb.features import _CODE

    (branch,) = parser.parse(_CODE.pattern, re.VERBOSE).data
    starts = [alternative.data[0][0] for alternative in branch[1][1]]
    assert all(op in (parser.AT, parser.IN, parser.LITERAL) for op in starts), starts
    for text in ("x" * 200_000, "x1" * 100_000, "(" * 200_000):
        assert query_features(text)["n_chars"] == len(text)
    assert query_features("then call()")["has_code"] == query_features("xcall()")["has_code"] == 1.0


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # a CJK sentence has no spaces: it was one or two tokens, so always "short|keyword"
        ("极光是什么原因造成的？为什么在高纬度地区更常见？", "medium|question"),
        ("オーロラはなぜ発生するのですか？", "medium|question"),
        ("极光", "short|keyword"),
        ("太阳风对地球磁场的影响", "medium|keyword"),
        ("오로라는 왜 발생합니까?", "short|question"),  # Korean words are separated by spaces already
        ("오로라는 왜 자주 발생합니까？", "medium|question"),
        ("ما سبب الشفق القطبي؟", "medium|question"),  # Arabic question mark
        ("what causes the aurora？", "medium|question"),  # full-width question mark
    ],
)
def test_query_types_of_cjk_and_other_scripts(query, expected):
    assert query_type(query_features(query)) == expected


def test_cjk_characters_count_as_about_one_word_per_two():
    assert 4.0 == query_features("极光 aurora 是什么")["n_tokens"]  # 极光, aurora, 是什么 (3 characters: 2 words)
    assert 2.0 == query_features("Aurora极光")["n_tokens"]


# ---------------------------------------------------------------------------- simplex and arms


def test_simplex_grid_and_projection():
    assert simplex_grid(3, 0.1).shape == (66, 3)
    assert simplex_grid(4, 0.25).shape == (math.comb(7, 3), 4)
    assert np.allclose(simplex_grid(5, 0.5).sum(axis=1), 1.0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        v = rng.normal(size=4) * 2
        w = project_simplex(v, 0.05, 0.95)
        assert w.sum() == pytest.approx(1.0) and w.min() >= 0.05 - 1e-12 and w.max() <= 0.95 + 1e-12
        # it is the Euclidean projection: no feasible point on a small grid is closer
        cands = [project_simplex(w + 0.01 * rng.normal(size=4), 0.05, 0.95) for _ in range(20)]
        assert all(np.linalg.norm(v - w) <= np.linalg.norm(v - c) + 1e-9 for c in cands)


def test_thompson_arms_are_bounded_and_start_at_default():
    p = ThompsonPolicy(RETRIEVERS)
    assert p.n_arms == 67 and p.arm_names[0] == "default"
    assert np.all(p._arms >= 0.05 - 1e-12) and np.all(p._arms <= 0.95 + 1e-12)
    assert np.allclose(p._arms.sum(axis=1), 1.0)
    assert _w(p.weights()) == pytest.approx(np.full(3, 1 / 3))
    assert p.decide(None, explore=False).arm == "default"
    four = ThompsonPolicy(("a", "b", "c", "d"), step=0.25)
    assert four.n_arms == math.comb(7, 3) + 1


# ---------------------------------------------------------------------------- learning the right way


@pytest.mark.parametrize(("name", "kwargs"), LEARNING)
@pytest.mark.parametrize(("world", "good", "bad"), [("A", "r0", "r2"), ("B", "r2", "r0")])
def test_each_policy_moves_its_weights_the_right_way(name, kwargs, world, good, bad):
    env = ToyEnv(seed=0)
    learner = Learner(RETRIEVERS, name, PLAIN, seed=1, **kwargs)
    n = 1000 if name in ("thompson", "gradient") else 1500
    simulate(learner, env, n, seed=2, types=(world,))
    w = learner.weights(world)
    assert w[good] > 1 / 3 + 0.05, w
    assert w[good] > w[bad] + 0.1, w
    assert sum(w.values()) == pytest.approx(1.0)
    assert min(w.values()) >= 0.05 - 1e-9 and max(w.values()) <= 0.95 + 1e-9
    # and the learned weights rank better than equal weights on that world's queries
    assert env.heldout_ndcg(w, world) > env.heldout_ndcg(dict.fromkeys(RETRIEVERS, 1 / 3), world)


def test_contextual_thompson_learns_different_weights_per_query_type():
    env = ToyEnv(seed=0)
    learner = Learner(RETRIEVERS, "thompson", PLAIN, seed=3)
    simulate(learner, env, 1500, seed=4)
    wa, wb = learner.weights("A"), learner.weights("B")
    assert max(wa, key=wa.__getitem__) == "r0" and max(wb, key=wb.__getitem__) == "r2"
    assert wa["r0"] - wb["r0"] > 0.3 and wb["r2"] - wa["r2"] > 0.3
    # a type never seen falls back to the global statistics
    assert learner.weights("never-seen") == learner.weights()


def test_a_query_type_of_few_questions_decides_with_the_global_click_evidence():
    # Four questions a type, each asked about 190 times: plenty of clicks, but a variance clustered by question
    # estimated from four clusters. With cf_min_questions above that, a type decides with the global evidence;
    # by default (1) it decides with its own.
    env = ToyEnv(n_queries=8, seed=0)
    few = Learner(RETRIEVERS, "thompson", PLAIN, seed=3, cf_min_questions=10)
    simulate(few, env, 1500, seed=4)
    assert few.weights("A") == few.weights("B") == few.weights()
    for trusted in (Learner(RETRIEVERS, "thompson", PLAIN, seed=3, cf_min_questions=4),
                    Learner(RETRIEVERS, "thompson", PLAIN, seed=3)):
        simulate(trusted, env, 1500, seed=4)
        assert trusted.weights("A") != trusted.weights("B")
    with pytest.raises(ValidationError, match="cf_min_questions"):
        Learner(RETRIEVERS, "thompson", cf_min_questions=0)
    with pytest.raises(ValidationError, match="must not exceed cf_max_queries"):
        Learner(RETRIEVERS, "thompson", cf_min_questions=50, cf_max_queries=20)


def test_evidence_gate_keeps_the_default_without_evidence():
    # Three worlds where every retriever is equally informative, two seeds each, the learner's default
    # settings: no weighting, global or per query type, may cost held-out nDCG. (With the memory and chunk
    # exploration off, thompson's weights do move on some seeds: over 3 worlds x 4 seeds, 12 of 36
    # weightings, 0.010 worse on average; so do epsilon's with the defaults, 0.016 worse on world 0 seed 0;
    # the README says so. This test once ran the memory-off set-up on one seed where nothing moved.)
    for env_seed in range(3):
        env = ToyEnv(seed=env_seed, best={"A": None, "B": None})
        for name, config in (("thompson", LearnerConfig()), ("gradient", PLAIN)):
            for seed in range(2):
                learner = Learner(RETRIEVERS, name, config, seed=seed)
                simulate(learner, env, 1000, seed=100 + seed)
                for qtype in (None, "A", "B"):
                    equal = env.heldout_ndcg(dict.fromkeys(RETRIEVERS, 1 / 3), qtype)
                    assert env.heldout_ndcg(learner.weights(qtype), qtype) > equal - 0.005, (name, env_seed, seed)


def test_thompson_default_moves_after_fifty_samples():
    # the bandit path: without click evidence, the default weights move towards the best arm
    env = ToyEnv(seed=0)
    learner = Learner(RETRIEVERS, ThompsonPolicy(RETRIEVERS, counterfactual=False, seed=1), PLAIN, seed=1)
    simulate(learner, env, 50, seed=2, types=("A",))
    assert learner.policy.default_weights == pytest.approx(np.full(3, 1 / 3))
    simulate(learner, env, 800, seed=3, types=("A",))
    d = learner.policy.default_weights
    assert d[0] > 1 / 3 + 0.1 and d[0] > d[2]


def _bandit_evidence(policy, n, arm_reward, default_reward, arm="0.6/0.2/0.2"):
    """``n`` rewards for one grid arm and ``n`` for the default, alternately."""
    w = list(map(float, arm.split("/")))
    for i in range(n):
        policy.learn(_episode(w, np.eye(3), [0, 0, 0], arm_reward, arm=arm, eid=f"a{i}"), arm_reward)
        policy.learn(_episode([1 / 3] * 3, np.eye(3), [0, 0, 0], default_reward, arm="default", eid=f"d{i}"),
                     default_reward)


def test_an_arm_replaces_the_default_only_once_it_has_min_samples():
    # the gate checked only the lower bound: with gate_z 0 a single reward made an arm the greedy weights
    p = ThompsonPolicy(RETRIEVERS, counterfactual=False, bandwidth=0.0, gate_z=0.0, min_samples=10.0)
    _bandit_evidence(p, 10, 1.0, -1.0)
    assert p.arm_stats()["0.6/0.2/0.2"]["n"] < 10 and _w(p.weights()) == pytest.approx(np.full(3, 1 / 3))
    _bandit_evidence(p, 1, 1.0, -1.0)
    assert p.arm_stats()["0.6/0.2/0.2"]["n"] >= 10 and _w(p.weights()).tolist() == [0.6, 0.2, 0.2]


def test_the_evidence_gate_corrects_its_z_for_the_number_of_arms():
    # z was the uncorrected 1.645, which the best of 66 arms no better than the default passes most of the time:
    # an advantage of 2.6 standard errors replaced the default weights
    p = ThompsonPolicy(RETRIEVERS, counterfactual=False, bandwidth=0.0, min_samples=0.0)
    uncorrected = ThompsonPolicy(RETRIEVERS, counterfactual=False, bandwidth=0.0, min_samples=0.0,
                                 gate_z=NormalDist().inv_cdf(0.95))
    for policy in (p, uncorrected):
        _bandit_evidence(policy, 6, 0.5, 0.0)
    stats = p.arm_stats()
    z = (stats["0.6/0.2/0.2"]["mean"] - stats["default"]["mean"]) / math.hypot(
        stats["0.6/0.2/0.2"]["sd"], stats["default"]["sd"])
    assert NormalDist().inv_cdf(0.95) < z < NormalDist().inv_cdf(1 - 0.05 / (p.n_arms - 1))
    assert _w(p.weights()) == pytest.approx(np.full(3, 1 / 3))
    assert _w(uncorrected.weights()).tolist() == [0.6, 0.2, 0.2]


def test_a_query_type_is_as_unsure_as_the_global_posterior_about_arms_it_has_not_seen():
    # the type's posterior variance left out the global prior's: one reward of the type made every arm far
    # from it look certain (sd about 0), so the type's gate and sampling trusted arms nobody had played
    p = ThompsonPolicy(RETRIEVERS, counterfactual=False, bandwidth=0.0)
    p.learn(_episode([1 / 3] * 3, np.eye(3), [0, 0, 0], 1.0, arm="default", qtype="x"), 1.0)
    far = p.arm_names[-1]
    assert p.arm_stats("x")[far]["n"] == 0.0
    assert p.arm_stats("x")[far]["sd"] == p.arm_stats(None)[far]["sd"] > 0.1


def test_epsilon_greedy_tuned_to_no_exploration_never_explores():
    # the guardrail's exploration multiplier was ignored: turned to 0 it still played a random arm one time in ten
    p = EpsilonGreedyPolicy(RETRIEVERS, seed=0).tune(exploration=0.0)
    decisions = [p.decide(None) for _ in range(200)]
    assert {(d.arm, d.explored, d.propensity) for d in decisions} == {("default", False, 1.0)}


def test_thompson_takes_a_reward_beyond_one_as_one():
    # learn did not clip: a reward of 3 went into the sums, and the state saved after it failed to load
    big, one = (ThompsonPolicy(RETRIEVERS, counterfactual=False, seed=0) for _ in range(2))
    big.learn(_episode([1 / 3] * 3, np.eye(3), [1, 0, 0], 3.0, arm="default"), 3.0)
    one.learn(_episode([1 / 3] * 3, np.eye(3), [1, 0, 0], 1.0, arm="default"), 1.0)
    assert big.state_dict()["state"]["stats"] == one.state_dict()["state"]["stats"]
    ThompsonPolicy(RETRIEVERS, counterfactual=False).load_state_dict(json.loads(json.dumps(big.state_dict())))


def test_thompson_tuned_to_a_learning_rate_of_zero_keeps_its_default_weights():
    # the default moved by default_step whatever the guardrail's learning-rate multiplier said
    def run(learning_rate):
        p = ThompsonPolicy(RETRIEVERS, counterfactual=False, default_after=0, gate_z=0.0, min_samples=0.0,
                           bandwidth=0.0).tune(learning_rate=learning_rate)
        _bandit_evidence(p, 20, 1.0, -1.0)
        return p.default_weights

    assert run(0.0).tolist() == [1 / 3] * 3
    assert run(1.0)[0] > 0.5


@pytest.mark.parametrize(("name", "kwargs"), [LEARNING[1], LEARNING[3], LEARNING[2]])
def test_policy_follows_drift(name, kwargs):
    before = ToyEnv(seed=0, best={"A": 0, "B": 0})
    after = ToyEnv(seed=0, best={"A": 2, "B": 2})
    learner = Learner(RETRIEVERS, name, PLAIN, seed=1, **kwargs)
    simulate(learner, before, 1000, seed=3)
    w1 = learner.weights()
    assert w1["r0"] > w1["r2"] + 0.1
    # Thompson and epsilon show their greedy weights once clicks score every arm, and that evidence leans towards
    # the weights shown, so it follows a reversed world more slowly (measured: about 2,000 episodes)
    simulate(learner, after, 2500 if name in ("thompson", "epsilon") else 1000, seed=4, t0=60_000.0)
    w2 = learner.weights()
    assert w2["r2"] > w2["r0"] + 0.1, (w1, w2)


def test_thompson_forgets_with_time():
    p = ThompsonPolicy(RETRIEVERS, half_life_days=1.0, forget=1.0)
    ep = _episode([1 / 3] * 3, [[1, 0, 0]], [1.0], 1.0, arm="default")
    p.learn(dataclass_replace(ep, timestamp=1000.0), 1.0)
    n0 = p._stats["*"][0, 0]
    p.learn(dataclass_replace(ep, timestamp=1000.0 + 86_400.0), 1.0)
    assert p._stats["*"][0, 0] == pytest.approx(n0 * 0.5 + 1.0)
    # a late reward for an old decision counts, discounted
    p.learn(dataclass_replace(ep, timestamp=1000.0), 1.0)
    assert p._stats["*"][0, 0] == pytest.approx(n0 * 0.5 + 1.0 + 0.5)


def dataclass_replace(ep, **kw):
    import dataclasses

    return dataclasses.replace(ep, **kw)


# ---------------------------------------------------------------------------- propensities


def test_epsilon_greedy_propensity_is_exact():
    p = EpsilonGreedyPolicy(RETRIEVERS, epsilon=0.2, epsilon_min=0.2, seed=0)
    seen: dict[bool, set[float]] = {}
    for _ in range(400):
        d = p.decide(None)
        seen.setdefault(d.arm == "default", set()).add(round(d.propensity, 12))
    eps, n = 0.2, p.n_arms
    assert seen[True] == {round(1 - eps + eps / n, 12)}
    assert seen[False] == {round(eps / n, 12)}


def test_propensity_of_weights_the_default_and_a_grid_arm_share_is_their_chance_together():
    # with two retrievers the default 0.5/0.5 is also a grid arm: the weights shown most of the time were
    # logged with the chance of one arm alone (0.0015 for weights shown 90 % of the time), which off-policy
    # estimates from the logs take at face value
    eps = 0.2
    p = EpsilonGreedyPolicy(("a", "b"), epsilon=eps, epsilon_min=eps, seed=0)
    n = p.n_arms
    decisions = [p.decide(None) for _ in range(2000)]
    equal = [d for d in decisions if d.weights == {"a": 0.5, "b": 0.5}]
    assert {round(d.propensity, 12) for d in equal} == {round(1 - eps + 2 * eps / n, 12)}
    assert len(equal) / len(decisions) == pytest.approx(1 - eps + 2 * eps / n, abs=0.03)
    assert not any(d.explored for d in equal)  # the grid arm of the greedy weights explores nothing
    t = ThompsonPolicy(("a", "b"), counterfactual=False, seed=0)
    drawn = [t.decide(None) for _ in range(300)]
    shown = sum(d.weights == {"a": 0.5, "b": 0.5} for d in drawn) / len(drawn)
    logged = np.mean([d.propensity for d in drawn if d.weights == {"a": 0.5, "b": 0.5}])
    assert logged == pytest.approx(shown, abs=0.05)  # the two arms' chance, not one's


def test_thompson_logs_each_arms_chance_not_three_times_it():
    # (hits + 1) / (draws + 1) over 32 draws logged about 0.045 for arms drawn 1.5 % of the time (67 arms, a
    # fresh posterior): summed over the arms, the logged chances made about 3
    t = ThompsonPolicy(RETRIEVERS, counterfactual=False, seed=0)
    drawn = [t.decide(None) for _ in range(3000)]
    logged: dict[str | None, list[float]] = {}
    for d in drawn:
        logged.setdefault(d.arm, []).append(d.propensity)
    grid = [a for a in logged if a != "default"]
    assert len(grid) > 50
    assert sum(np.mean(logged[a]) for a in grid) == pytest.approx(1 - t.hyper.baseline_share, abs=0.1)
    # and each arm's mean logged chance is how often it was shown (pooled over the grid arms, whose chances match)
    shown = sum(len(logged[a]) for a in grid) / len(drawn) / len(grid)
    assert np.mean([np.mean(logged[a]) for a in grid]) == pytest.approx(shown, rel=0.15)


def test_sampled_share_is_the_exact_chance_on_average():
    from scipy.stats import norm

    from rlfb.policies.thompson import sampled_share

    mean, sd = np.array([0.0, 0.3, 0.5, 1.0]), np.array([0.5, 0.4, 1.0, 0.2])
    x = np.linspace(-6, 7, 20001)
    pdf, cdf = norm.pdf((x[:, None] - mean) / sd) / sd, norm.cdf((x[:, None] - mean) / sd)
    # numpy 2 renamed it, and numpy 2.4 dropped the old name (the ignore); pyproject allows numpy 1.24, which has
    # only the old name (so the ignore may be unused)
    trapezoid = getattr(np, "trapezoid", None) or np.trapz  # type: ignore[attr-defined, unused-ignore]
    exact = [float(trapezoid(pdf[:, a] * np.prod(np.delete(cdf, a, axis=1), axis=1), x)) for a in range(4)]
    rng = np.random.default_rng(1)
    est = np.mean([[sampled_share(mean + sd * rng.standard_normal((32, 4)), mean, sd, np.arange(4) == a)
                    for a in range(4)] for _ in range(2000)], axis=0)
    assert est == pytest.approx(exact, abs=0.004)
    assert exact[0] < 0.05  # a rarely drawn arm, which the old count put at about (32 * 0.03 + 1) / 33
    both = sampled_share(mean + sd * rng.standard_normal((32, 4)), mean, sd, np.array([True, True, False, False]))
    assert 0.0 < both <= 1.0


def test_thompson_propensity_and_late_reward_credit_the_logged_arm():
    p = ThompsonPolicy(RETRIEVERS, seed=0)
    d = p.decide(Context("q", RETRIEVERS, (), np.zeros((0, 3)), np.zeros((0, 3))))
    assert 0.0 < d.propensity <= 1.0 and d.arm in p.arm_names
    arm = "0.9/0.05/0.05"
    p.learn(_episode([0.9, 0.05, 0.05], [[1, 0, 0]], [1.0], 1.0, arm=arm), 1.0)
    assert p._stats["*"][0, p._arm_index[arm]] == pytest.approx(1.0)
    # a decision logged without an arm is credited to the nearest arm by its weights
    p.learn(_episode([0.1, 0.1, 0.8], [[1, 0, 0]], [1.0], 1.0), 1.0)
    assert p._stats["*"][0, p._arm_index["0.1/0.1/0.8"]] == pytest.approx(1.0, rel=0.01)


def test_plackett_luce_ranking_and_propensity():
    p = GradientPolicy(RETRIEVERS, seed=0)
    env = ToyEnv(seed=0)
    ctx = dataclass_replace(env.context(0), k=5)
    d = p.decide(ctx)
    assert d.ranking is not None and len(d.ranking) == 5 and len(set(d.ranking)) == 5
    s = ctx.normalized @ _w(p.weights()) / (p.hyper.temperature * np.abs(ctx.normalized).max())
    assert d.propensity == pytest.approx(math.exp(plackett_luce_log_prob(s, np.array(d.ranking))))
    g = p.decide(ctx, explore=False)
    assert g.ranking is None and g.propensity == 1.0 and not g.explored
    # brute force: the probabilities of every top-2 of 3 items sum to one
    scores = np.array([0.3, -1.0, 2.0])
    tops = itertools.permutations(range(3), 2)
    total = sum(math.exp(plackett_luce_log_prob(scores, np.array(r))) for r in tops)
    assert total == pytest.approx(1.0)


def test_gradient_weights_set_stay_where_they_were_set():
    # set_weights (what `rlfb weights import` does) left the shrinkage target at equal weights, and
    # uninformative clicks pulled the imported 0.9/0.1 back to 1/3 each within about 50 of them
    p = GradientPolicy(RETRIEVERS, seed=0)
    p.set_weights([0.9, 0.05, 0.05])
    assert _w(p.weights()) == pytest.approx([0.9, 0.05, 0.05])
    assert p.default_weights.tolist() == _w(p.weights()).tolist()
    rng = np.random.default_rng(0)
    for i in range(200):
        rewards = np.zeros(10)
        rewards[rng.integers(10)] = 0.4
        p.learn(_episode(_w(p.weights()), rng.uniform(0, 1, (10, 3)), rewards, 0.4, eid=f"e{i}"), 0.4)
    assert _w(p.weights())[0] > 0.85


def test_gradient_first_click_does_not_move_the_weights():
    # after one gradient the spread is 0, so the evidence gate let the very first click through at a full step
    p = GradientPolicy(RETRIEVERS, seed=0)
    shown = [[1.0, 0.2, 0.0], [0.5, 0.5, 0.5], [0.1, 0.9, 0.2]]
    p.learn(_episode([1 / 3] * 3, shown, [0.0, 0.4, 0.0], 0.4), 0.4)
    assert _w(p.weights()) == pytest.approx(np.full(3, 1 / 3))
    # consistent clicks still move it once there are a few of them
    for i in range(10):
        p.learn(_episode([1 / 3] * 3, shown, [0.0, 0.0, 0.4], 0.4, eid=f"e{i}"), 0.4)
    assert not np.allclose(_w(p.weights()), 1 / 3)
    # and with evidence_z=0 (no gate) the first click moves it, as before
    q = GradientPolicy(RETRIEVERS, evidence_z=0.0, seed=0)
    q.learn(_episode([1 / 3] * 3, shown, [0.0, 0.4, 0.0], 0.4), 0.4)
    assert not np.allclose(_w(q.weights()), 1 / 3) and np.all(np.isfinite(_w(q.weights())))


def test_gradient_window_leaves_room_for_the_gate():
    # the effective count only approaches the window and the gate needs two gradients: window 1 never moved
    with pytest.raises(ValidationError, match="window"):
        GradientPolicy(RETRIEVERS, window=2.0)
    p = GradientPolicy(RETRIEVERS, window=3.0, seed=0)
    shown = [[1.0, 0.2, 0.0], [0.5, 0.5, 0.5], [0.1, 0.9, 0.2]]
    for i in range(30):
        p.learn(_episode([1 / 3] * 3, shown, [0.0, 0.0, 0.4], 0.4, eid=f"e{i}"), 0.4)
    assert not np.allclose(_w(p.weights()), 1 / 3)


# a click on the second chunk shown, which retriever r0 ranked first and r1 last
_CLICK_FOR_R0 = ([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], [0.0, 1.0])


def test_gradient_step_is_at_most_max_step():
    # the step was not bounded: at learning rate 10 one click moved the weights to the bounds
    p = GradientPolicy(RETRIEVERS, learning_rate=10.0, evidence_z=0.0, max_step=0.01, shrinkage=0.0)
    p.learn(_episode([1 / 3] * 3, *_CLICK_FOR_R0, 1.0), 1.0)
    w = _w(p.weights())
    assert np.linalg.norm(w - 1 / 3) == pytest.approx(0.01)
    assert w == pytest.approx([1 / 3 + 0.01 / math.sqrt(2), 1 / 3 - 0.01 / math.sqrt(2), 1 / 3])


def test_gradient_learning_rate_never_decays_below_min_learning_rate():
    # the floor was missing: after ten million updates the rate was 0.0002 and the policy had all but stopped
    p = GradientPolicy(RETRIEVERS, evidence_z=0.0, shrinkage=0.0, max_step=1.0)
    state = p.state_dict()
    state["n_updates"] = 1e7
    p.load_state_dict(state)
    p.learn(_episode([1 / 3] * 3, *_CLICK_FOR_R0, 1.0), 1.0)
    assert _w(p.weights()) == pytest.approx([1 / 3 + 0.005, 1 / 3 - 0.005, 1 / 3], abs=1e-12)


def test_a_weak_click_weighs_its_reward_times_a_full_click_in_the_gradient():
    # every click counted as a full one: a 0.4 click weighed as much as a reward of 1
    sums = {}
    for r in (0.4, 1.0):
        p = GradientPolicy(RETRIEVERS, seed=0)
        p.learn(_episode([1 / 3] * 3, _CLICK_FOR_R0[0], [0.0, r], r), r)
        sums[r] = np.array(p.state_dict()["state"]["grad_sums"][1])
    assert sums[1.0][0] > 0 and sums[0.4] == pytest.approx(0.4 * sums[1.0], abs=1e-15)


def test_gradient_evidence_gate_uses_the_unbiased_variance():
    # the biased variance (no n / (n - 1)) made one click among three episodes pass a gate of 1.1 standard errors
    def run(evidence_z):
        p = GradientPolicy(RETRIEVERS, evidence_z=evidence_z, seed=0)
        p.learn(_episode([1 / 3] * 3, *_CLICK_FOR_R0, 1.0), 1.0)
        tie = [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]  # every retriever scored the two alike: a gradient of 0
        for i in range(2):
            p.learn(_episode([1 / 3] * 3, tie, [0.0, 1.0], 1.0, eid=f"t{i}"), 1.0)
        return _w(p.weights())

    # a mean of g/3 against a standard error of about g/3: z = 1.1 keeps the weights, 0.9 moves them
    assert run(1.1).tolist() == [1 / 3] * 3
    assert run(0.9)[0] > 1 / 3


def test_pdgd_pairs_and_debias_weights_match_brute_force():
    pos, neg = pdgd_pairs(np.array([0.0, 0.5, 0.0, 0.5, 0.0, 0.0]))
    assert pos.tolist() == [1, 3] and neg.tolist() == [0, 2, 4]
    pos, neg = pdgd_pairs(np.array([0.0, 0.0, -1.0]))
    assert pos.size == 0 and neg.tolist() == [2]
    rng = np.random.default_rng(0)
    s = rng.normal(size=5)

    def prob(order):
        return math.exp(plackett_luce_log_prob(s[list(order)], np.arange(len(order))))

    rho = pdgd_debias_weights(s, np.array([3]), np.array([0, 4]))
    for j, n in enumerate([0, 4]):
        swapped = list(range(5))
        swapped[3], swapped[n] = swapped[n], swapped[3]
        pr, ps = prob(range(5)), prob(swapped)
        assert rho[0, j] == pytest.approx(ps / (pr + ps))


# ---------------------------------------------------------------------------- batch policy


def test_batch_direction_comes_from_logged_weights():
    rng = np.random.default_rng(0)
    p = BatchPolicy(RETRIEVERS, batch_size=50, seed=0)
    for i in range(50):
        wv = _w(p.decide(None).weights)
        reward = 0.7 + 0.3 * (wv[0] - 1 / 3) / 0.3 + 0.01 * rng.normal()  # better with more r0
        p.learn(_episode(wv, [[1, 0, 0]], [1.0], float(np.clip(reward, -1, 1)), eid=f"e{i}"), reward)
    w = _w(p.weights())
    assert w[0] > 1 / 3 + 0.02 and w.sum() == pytest.approx(1.0)

    # a middling batch (mean reward between -0.5 and 0.5) changes nothing
    q = BatchPolicy(RETRIEVERS, batch_size=10, seed=0)
    for i in range(10):
        q.learn(_episode(_w(q.decide(None).weights), [[1, 0, 0]], [1.0], 0.1 * (i % 2)), 0.1 * (i % 2))
    assert _w(q.weights()) == pytest.approx(np.full(3, 1 / 3))

    # a bad batch moves away from the weights that scored worst; no randomness is involved
    def bad_batch(seed):
        b = BatchPolicy(RETRIEVERS, batch_size=4, seed=seed)
        logged = [[0.6, 0.2, 0.2], [0.2, 0.6, 0.2], [0.2, 0.2, 0.6], [1 / 3, 1 / 3, 1 / 3]]
        for lw, r in zip(logged, [-1.0, -0.6, -0.6, -0.6], strict=True):
            b.learn(_episode(lw, [[1, 0, 0]], [0.0], r), r)
        return _w(b.weights())

    w1, w2 = bad_batch(0), bad_batch(99)
    assert w1[0] < 1 / 3 - 0.01 and np.allclose(w1, w2)


def test_a_batch_mean_of_exactly_a_threshold_does_not_move_the_weights():
    # the thresholds were exclusive: a batch averaging exactly 0.5 (or -0.5) moved the weights
    for rewards in ((1.0, 0.0), (-1.0, 0.0)):
        p = BatchPolicy(RETRIEVERS, batch_size=2, seed=0)
        for lw, r in zip(([0.8, 0.1, 0.1], [0.1, 0.1, 0.8]), rewards, strict=True):
            p.learn(_episode(lw, [[1, 0, 0]], [1.0], r), r)
        assert abs(p.state_dict()["state"]["last_mean"]) == 0.5
        assert _w(p.weights()).tolist() == [1 / 3] * 3


def test_a_replayed_event_counts_by_its_weight_in_the_batch_mean():
    # the batch mean ignored the weights: a replay of weight 0.01 cancelled a fresh reward of 1 and nothing moved
    p = BatchPolicy(RETRIEVERS, batch_size=2, seed=0)
    p.learn(_episode([0.8, 0.1, 0.1], [[1, 0, 0]], [1.0], 1.0), 1.0, weight=1.0)
    p.learn(_episode([0.1, 0.1, 0.8], [[1, 0, 0]], [1.0], -1.0), -1.0, weight=0.01)
    assert p.state_dict()["state"]["last_mean"] == pytest.approx(0.99 / 1.01)
    assert _w(p.weights())[0] > 1 / 3 + 0.02


def test_batch_perturbations_are_logged_with_their_probability():
    p = BatchPolicy(RETRIEVERS, seed=0)
    decisions = [p.decide(None) for _ in range(40)]
    d = next(d for d in decisions if d.explored)
    assert d.propensity == pytest.approx(1 / 4) and d.weights != p.weights()
    assert all(0 < x.propensity <= 1 for x in decisions)
    assert {x.arm for x in decisions} == {"current", "towards:r0", "towards:r1", "towards:r2"}
    assert abs(sum(d.weights.values()) - 1.0) < 1e-9
    assert not p.decide(None, explore=False).explored


def test_batch_actions_that_show_the_same_weights_log_their_summed_probability():
    # at a bound a step towards the retriever at 0.95 shows the current weights again: both were logged
    # with propensity 1/3 while those weights were shown two times in three
    p = BatchPolicy(["bm25", "dense"], seed=0)
    p.set_weights({"bm25": 0.95, "dense": 0.05})
    decisions = [p.decide(None) for _ in range(3000)]
    at_current = [d for d in decisions if abs(d.weights["bm25"] - 0.95) < 1e-9]
    assert all(d.propensity == pytest.approx(2 / 3) and not d.explored for d in at_current)
    assert {d.arm for d in at_current} == {"current"}  # drawn as "towards:bm25" too, shown and logged as one
    moved = [d for d in decisions if abs(d.weights["bm25"] - 0.95) >= 1e-9]
    assert all(d.propensity == pytest.approx(1 / 3) and d.explored for d in moved)
    assert len(at_current) / len(decisions) == pytest.approx(2 / 3, abs=0.03)
    # what is shown for a seed is what it was before: the draw is the same, only the logging merges actions
    assert [round(d.weights["bm25"], 4) for d in decisions[:8]] == [0.95, 0.6813, 0.6813] + [0.95] * 5


# ---------------------------------------------------------------------------- determinism and state


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_same_seed_same_decisions(name):
    env = ToyEnv(seed=0, n_queries=10)

    def run(seed):
        learner = Learner(RETRIEVERS, name, PLAIN, seed=seed)
        out = []
        rng = np.random.default_rng(0)
        for i in range(120):
            q = i % 10
            r = learner.rank(env.context(q), 5)
            out.append((tuple(r.order.tolist()), r.decision.arm, round(r.decision.propensity, 12),
                        tuple(sorted(r.decision.weights.items()))))
            learner.learn(env.episode(q, r, rng, t=float(i)))
        return out

    assert run(7) == run(7)
    if name != "fixed":
        assert run(7) != run(8)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_state_json_round_trip(name):
    env = ToyEnv(seed=0, n_queries=10)
    a = make_policy(name, RETRIEVERS, seed=3)
    rng = np.random.default_rng(1)
    learner = Learner(RETRIEVERS, a, PLAIN)
    simulate(learner, env, 80, seed=2)
    state = json.loads(json.dumps(a.state_dict(), allow_nan=False))
    b = make_policy(name, RETRIEVERS, seed=3).load_state_dict(state)
    for q in range(10):
        ctx = dataclass_replace(env.context(q), k=5)
        da, db = a.decide(ctx), b.decide(ctx)
        assert da == db
        assert a.weights("A") == b.weights("A")
    ep = env.episode(0, learner.rank(env.context(0), 5), rng)
    a.learn(ep, ep.reward)
    b.learn(ep, ep.reward)
    assert a.weights() == b.weights()


def test_policy_state_rejects_damage():
    p = ThompsonPolicy(RETRIEVERS)
    good = p.state_dict()
    for damage in (
        lambda s: s.update(name="gradient"),
        lambda s: s.update(retrievers=["x", "y", "z"]),
        lambda s: s["state"].update(default=[0.5, 0.5]),
        lambda s: s["state"].update(stats={"*": [[0.0] * 3] * 3}),
        lambda s: s["state"].pop("clock"),
        lambda s: s.update(rng={"bit_generator": "nope"}),
        lambda s: s.update(n_updates=float("nan")),
    ):
        s = json.loads(json.dumps(good))
        damage(s)
        with pytest.raises(CorruptStateError):
            ThompsonPolicy(RETRIEVERS).load_state_dict(s)
    with pytest.raises(CorruptStateError):
        GradientPolicy(RETRIEVERS).load_state_dict(
            {**GradientPolicy(RETRIEVERS).state_dict(), "state": {"weights": [1, 1, 1]}}
        )
    with pytest.raises(CorruptStateError):
        FixedPolicy(RETRIEVERS).load_state_dict(
            {**FixedPolicy(RETRIEVERS).state_dict(), "state": {"weights": [-1, 1, 1]}}
        )


# ---------------------------------------------------------------------------- from an audit of the policies
def test_plackett_luce_probability_when_the_first_items_dominate():
    # the remaining mass was the total less what came before, which cancels to 0 once the first items
    # dominate: every later step then had probability 1, and a 1e-8 ranking was logged with propensity 1
    scores = np.array([60.0, 0.0, 0.0, 0.0])
    for ranking in itertools.permutations(range(1, 4), 2):
        r = np.array([0, *ranking])
        assert math.exp(plackett_luce_log_prob(scores, r)) == pytest.approx(1 / 6, rel=1e-9)
    weak = np.array([40.0, 2.0, 1.0, 0.5])
    exact = 1.0 * math.exp(2.0) / (math.exp(2.0) + math.exp(1.0) + math.exp(0.5))
    assert math.exp(plackett_luce_log_prob(weak, np.array([0, 1]))) == pytest.approx(exact, rel=1e-9)


def _learned_state(cls):
    """A JSON round-tripped state of ``cls`` after a batch's worth of learning (a clock, counters, a move)."""
    p = cls(RETRIEVERS, seed=0, **({"batch_size": 2} if cls is BatchPolicy else {}))
    for i, reward in enumerate((1.0, -1.0, 1.0)):
        weights = (0.6, 0.2, 0.2) if reward > 0 else (0.2, 0.2, 0.6)
        ep = _episode(weights, np.eye(3), [reward, 0, 0], reward, eid=f"e{i}")
        p.learn(dataclass_replace(ep, timestamp=1_700_000_000.0 + i), reward)
    return p, json.loads(json.dumps(p.state_dict()))


@pytest.mark.parametrize(("cls", "field", "value"), [
    (BatchPolicy, "n_batches", -5),  # sqrt(1 + n) then failed at every retrieval
    (BatchPolicy, "n_batches", 2.7),
    (BatchPolicy, "n_batches", "5"),
    (BatchPolicy, "n_batches", True),
    # int() took it, and uncertainty() then raised a raw OverflowError
    pytest.param(BatchPolicy, "n_batches", 10**400, id="BatchPolicy-n_batches-10**400"),
    (BatchPolicy, "n_moves", -1),
    (BatchPolicy, "n_moves", 7),  # more moves than batches
    (BatchPolicy, "last_mean", 1e999),
    (BatchPolicy, "last_mean", 3.0),
    (BatchPolicy, "default", [-1.0, 1.0, 1.0]),  # loaded, and the next save could not be rebuilt
    (BatchPolicy, "default", [0.5, 0.5, 0.5]),
    (BatchPolicy, "buffer", [[[0.2, 0.2, 0.6], 1.0, -1.0]]),  # a negative weight could make the batch mean NaN
    (BatchPolicy, "buffer", [[[0.2, 0.2, 0.6], 9.0, 1.0]]),
    (GradientPolicy, "n_pairs", 1e999),  # saving it then failed
    (GradientPolicy, "n_pairs", -1.0),
    (ThompsonPolicy, "clock", {"*": 1e999}),  # every later reward then counted infinitely late, weight 0
    (ThompsonPolicy, "clock", {"*": "5"}),
])
def test_damaged_policy_counters_are_corrupt_state(cls, field, value):
    src, state = _learned_state(cls)
    assert field in state["state"]
    state["state"][field] = value
    dst = cls(RETRIEVERS, seed=0, **({"batch_size": 2} if cls is BatchPolicy else {}))
    with pytest.raises(CorruptStateError, match="policy state|malformed|moves in only|simplex"):
        dst.load_state_dict(state)
    _, intact = _learned_state(cls)
    assert dst.load_state_dict(intact).weights() == src.weights()  # the intact state still loads


@pytest.mark.parametrize("cls", [BatchPolicy, GradientPolicy, ThompsonPolicy])
@pytest.mark.parametrize("value", [10**400, 2.0**54, True], ids=["10**400", "2**54", "True"])
def test_a_damaged_update_count_is_corrupt_state(cls, value):
    # float(10**400) raised a raw OverflowError out of load_state_dict
    src, state = _learned_state(cls)
    state["n_updates"] = value
    dst = cls(RETRIEVERS, seed=0, **({"batch_size": 2} if cls is BatchPolicy else {}))
    before = json.dumps(dst.state_dict())
    with pytest.raises(CorruptStateError, match="n_updates"):
        dst.load_state_dict(state)
    assert json.dumps(dst.state_dict()) == before


@pytest.mark.parametrize("cls", [BatchPolicy, GradientPolicy, ThompsonPolicy])
@pytest.mark.parametrize(("field", "value"), [
    ("lr_scale", 1e300), ("lr_scale", 10.5), ("explore_scale", 1e300), ("explore_scale", -1.0),
    ("explore_scale", "2"),
])
def test_a_guardrail_multiplier_beyond_what_tune_allows_is_corrupt_state(cls, field, value):
    # 1e300 loaded, while tune() allows at most 10
    src, state = _learned_state(cls)
    state[field] = value
    dst = cls(RETRIEVERS, seed=0, **({"batch_size": 2} if cls is BatchPolicy else {}))
    before = json.dumps(dst.state_dict())
    with pytest.raises(CorruptStateError, match=field):
        dst.load_state_dict(state)
    assert json.dumps(dst.state_dict()) == before
    state[field] = 10.0
    assert dst.load_state_dict(state).weights() == src.weights()


@pytest.mark.parametrize(("row", "value"), [(1, 1e308), (1, -1e308), (2, 1e308), (2, -1e-3)])
def test_thompson_arm_statistics_out_of_range_are_corrupt_state(row, value):
    # a reward sum of 1e308 loaded and gave the arm a posterior mean of 7e306: rewards lie in [-1, 1], so an arm's
    # sum and sum of squares are at most its count
    src, state = _learned_state(ThompsonPolicy)
    stats = state["state"]["stats"]["*"]
    arm = int(np.argmax(stats[0]))
    assert stats[0][arm] > 0
    stats[row][arm] = value
    dst = ThompsonPolicy(RETRIEVERS, seed=0)
    before = json.dumps(dst.state_dict())
    with pytest.raises(CorruptStateError, match="arm statistics"):
        dst.load_state_dict(state)
    assert json.dumps(dst.state_dict()) == before
    stats[row][arm] = 0.0
    ThompsonPolicy(RETRIEVERS, seed=0).load_state_dict(state)  # in range: loads


@pytest.mark.parametrize(("cls", "field"), [(BatchPolicy, "n_batches"), (GradientPolicy, "n_pairs")])
def test_a_state_refused_late_leaves_the_policy_as_it_was(cls, field):
    src = cls(RETRIEVERS, seed=0).set_weights(dict(zip(RETRIEVERS, (0.8, 0.1, 0.1), strict=True)))
    state = json.loads(json.dumps(src.state_dict()))
    state["state"][field] = "not a number"
    dst = cls(RETRIEVERS, seed=0)
    before = dst.weights()
    with pytest.raises(CorruptStateError):
        dst.load_state_dict(state)
    assert dst.weights() == before  # the weights had been replaced before the counter was read


# ---------------------------------------------------------------------------- saved states in proportion
# A field dropped from a saved state, or one out of proportion with what the policy learned, loaded: a query type's
# arm statistics or clock, a batch buffer emptied, gradient sums of 1e300, negative clocks. Each is refused, naming
# the field; every state a policy saves still loads (the round trips first).


def _saved(name: str, n: int = 60, **kwargs):
    """A policy after ``n`` toy episodes through a learner (two query types, timestamps, gradient's replays at
    weight 0.25), and its state as JSON gives it back."""
    policy = make_policy(name, RETRIEVERS, seed=0, **kwargs)
    simulate(Learner(RETRIEVERS, policy, LearnerConfig(replay_every=10)), ToyEnv(seed=1, n_queries=10), n, seed=1,
             t0=1_700_000_000.0)
    return policy, json.loads(json.dumps(policy.state_dict(), allow_nan=False))


def _loads_as_saved(name: str, policy, state, **kwargs) -> None:
    again = make_policy(name, RETRIEVERS, seed=0, **kwargs).load_state_dict(state)
    assert json.dumps(again.state_dict()) == json.dumps(policy.state_dict())


@pytest.mark.parametrize(("name", "n", "kwargs"), [
    *[(name, 80, {}) for name in sorted(POLICIES)],
    ("batch", 23, {}),  # no batch yet: every event still in the buffer
    ("batch", 50, {"batch_size": 25}),  # a batch just learned: the buffer empty
    ("batch", 61, {"batch_size": 7}),
    ("thompson", 40, {"half_life_days": None, "forget": 1.0}),
    ("thompson", 40, {"contextual": False}),
    ("gradient", 120, {"window": 3.0}),
])
def test_a_state_a_policy_learned_loads_as_it_was_saved(name, n, kwargs):
    policy, state = _saved(name, n, **kwargs)
    _loads_as_saved(name, policy, state, **kwargs)


@pytest.mark.parametrize("name", ["batch", "epsilon", "gradient", "thompson"])
def test_a_state_learned_at_any_weight_and_time_loads_as_it_was_saved(name):
    # the bounds the sums are checked against hold for every weight learn() takes, untimed and late episodes, query
    # types that come and go, and logged weights it cannot read
    rng = np.random.default_rng(5)
    kwargs = {"batch_size": 3} if name == "batch" else {}
    policy = make_policy(name, RETRIEVERS, seed=0, **kwargs)
    assert isinstance(policy, (BatchPolicy, GradientPolicy, ThompsonPolicy))  # whose learn() takes a weight
    for i in range(150):
        n = int(rng.integers(1, 12))
        rewards = np.zeros(n)
        rewards[rng.integers(n, size=int(rng.integers(0, 3)))] = rng.uniform(-1.5, 1.5)
        logged = rng.random(3) if i % 9 else [float("nan"), 1.0, 1.0]
        ep = _episode(logged, rng.random((n, 3)) * 10.0 ** rng.uniform(-2, 2), rewards, float(rng.uniform(-1, 1)),
                      qtype=str(rng.choice(["A", "B", "", "*"])), eid=f"e{i}")  # "*" names thompson's global scope
        t = 0.0 if i % 4 == 0 else 1_700_000_000.0 + rng.uniform(-1e6, 1e6)
        policy.learn(dataclass_replace(ep, timestamp=t), ep.reward, weight=float(rng.choice([1.0, 0.25, 1e-9, 7.5])))
    _loads_as_saved(name, policy, json.loads(json.dumps(policy.state_dict(), allow_nan=False)), **kwargs)


@pytest.mark.parametrize("name", ["thompson", "epsilon"])
def test_a_query_type_named_as_the_global_scope_is_learned_once(name):
    # an episode of query type "*" (a caller's log_event(query_type="*")) was learned into the global scope twice:
    # its counts ran to twice the updates, and the check of them refused the policy's own saved state
    policy = make_policy(name, RETRIEVERS, seed=0, forget=1.0, half_life_days=None)
    for i in range(5):
        policy.learn(_episode([0.3, 0.3, 0.4], np.eye(3)[[0, 1, 2, 0]], np.array([1.0, 0, 0, 0]), 1.0,
                              qtype="*", eid=f"e{i}"), 1.0)
    state = json.loads(json.dumps(policy.state_dict()))
    assert sorted(state["state"]["stats"]) == ["*"]
    assert np.asarray(state["state"]["stats"]["*"])[0].sum() == pytest.approx(5.0)
    _loads_as_saved(name, policy, state, forget=1.0, half_life_days=None)
    # a state saved while it was learned twice still loads
    doubled = json.loads(json.dumps(state))
    doubled["state"]["stats"]["*"] = (np.asarray(doubled["state"]["stats"]["*"]) * 2).tolist()
    make_policy(name, RETRIEVERS, seed=0, forget=1.0, half_life_days=None).load_state_dict(doubled)


def _click_rows(ev, change):
    """``ev`` (a saved click evidence) with ``change`` applied to its rows (one per question: utilities, weight)."""
    from rlfb.blocks import encode_block

    rows = np.frombuffer(base64.b64decode(ev["rows"]), dtype="<f8").reshape(len(ev["queries"]), -1).copy()
    change(rows)
    ev["rows"] = encode_block(rows)


def _first_arm(stats):
    return int(np.argmax(stats[0]))


DAMAGE = {
    "thompson": [
        ("stats-null", lambda s: s.update(stats=None), "'stats' must be a Mapping"),
        ("clock-dropped", lambda s: s.pop("clock"), "'clock' is missing"),
        ("type-stats-dropped", lambda s: s["stats"].pop("A"), r"for \['A'\] but no arm statistics"),
        ("global-stats-dropped", lambda s: s["stats"].pop("*"), r"for \['\*'\] but no arm statistics"),
        ("global-scope-dropped", lambda s: [s[f].pop("*") for f in ("stats", "clock", "clicks")], "none global"),
        ("type-clock-dropped", lambda s: s["clock"].pop("A"), "click evidence of 'A' has a clock"),
        ("global-clock-dropped", lambda s: s["clock"].pop("*"), "past its global clock"),
        ("clock-negative", lambda s: s["clock"].update({"B": -5.0}), r"clock\[B\]"),
        ("arm-count-1e300", lambda s: s["stats"]["*"][0].__setitem__(_first_arm(s["stats"]["*"]), 1e300),
         r"arm statistics for '\*': their count"),
        ("click-clock-negative", lambda s: s["clicks"]["A"].update(clock=-1.0), "clock out of range"),
        ("click-weight-1e300", lambda s: s["clicks"]["*"].update(n=1e300), r"click evidence of '\*': its weight"),
        ("click-sums-1e300", lambda s: s["clicks"]["*"].update(s=[1e300] * len(s["clicks"]["*"]["s"])),
         "s out of range"),
        ("click-sums-negative", lambda s: s["clicks"]["*"]["s"].__setitem__(1, -0.5), "s out of range"),
        ("click-gone-negative", lambda s: s["clicks"]["*"]["gone"].__setitem__(1, -0.5), "gone out of range"),
        ("click-row-past-its-weight", lambda s: _click_rows(s["clicks"]["*"], lambda r: r.__setitem__((0, 1), 1e300)),
         "rows out of range"),
    ],
    "gradient": [
        ("sums-dropped", lambda s: s.pop("grad_sums"), "'grad_sums' is missing"),
        ("sums-null", lambda s: s.update(grad_sums=None), "'grad_sums' must be a list"),
        ("sums-short", lambda s: s["grad_sums"].pop(), "'grad_sums' must hold a count"),
        ("count-negative", lambda s: s["grad_sums"].__setitem__(0, -1.0), r"'grad_sums\[0\]'"),
        ("count-1e300", lambda s: s["grad_sums"].__setitem__(0, 1e300), r"'grad_sums\[0\]'"),
        ("sum-1e300", lambda s: s["grad_sums"][1].__setitem__(0, 1e300), r"'grad_sums\[1\]'"),
        ("sum-wrong-length", lambda s: s["grad_sums"][1].pop(), r"'grad_sums\[1\]' has the wrong shape"),
        ("squares-1e300", lambda s: s["grad_sums"][2].__setitem__(0, 1e300), r"'grad_sums\[2\]'"),
        ("squares-zeroed", lambda s: s["grad_sums"].__setitem__(2, [0.0, 0.0, 0.0]), "'grad_sums' is malformed"),
        ("pairs-1e300", lambda s: s.update(n_pairs=1e300), "'n_pairs'"),
    ],
    "batch": [
        ("buffer-null", lambda s: s.update(buffer=None), "'buffer' must be a list"),
        ("buffer-emptied", lambda s: s.update(buffer=[]), "'buffer' holds events of weight 0, but 23"),
        ("buffer-halved", lambda s: s.update(buffer=s["buffer"][:10]), "'buffer' holds events of weight 10, but 23"),
        ("buffer-overfull", lambda s: s.update(buffer=s["buffer"] * 3), "'buffer' holds 69 events"),
        ("buffer-heavier", lambda s: s["buffer"][0].__setitem__(2, 100.0), "'buffer': its events' weight"),
        ("buffer-event-short", lambda s: s["buffer"][0].pop(), "'buffer': event 0 is malformed"),
        ("buffer-weights-off-simplex", lambda s: s["buffer"][0].__setitem__(0, [5.0, 0.0, 0.0]),
         "'buffer': event 0's weights are not on the simplex"),
    ],
}


@pytest.mark.parametrize(("name", "damage", "match"), [
    pytest.param(name, damage, match, id=f"{name}-{label}")
    for name, cases in DAMAGE.items() for label, damage, match in cases
])
def test_a_saved_state_out_of_proportion_is_corrupt_state_naming_the_field(name, damage, match):
    policy, state = _saved(name, 23 if name == "batch" else 60)  # 23 events: no batch yet
    if name == "thompson":
        assert set(state["state"]["stats"]) == set(state["state"]["clicks"]) == {"*", "A", "B"}
    intact = json.loads(json.dumps(state))
    damage(state["state"])
    dst = make_policy(name, RETRIEVERS, seed=0)
    before = json.dumps(dst.state_dict())
    with pytest.raises(CorruptStateError, match=match):
        dst.load_state_dict(state)
    assert json.dumps(dst.state_dict()) == before  # nothing of the damaged state was taken
    _loads_as_saved(name, policy, intact)


def test_a_batch_buffer_emptied_by_its_batch_still_loads():
    # after a batch the buffer is empty: only before the first batch must it hold all that was learned
    policy, state = _saved("batch", 50, batch_size=25)
    assert state["state"]["buffer"] == [] and state["state"]["n_batches"] == 2
    _loads_as_saved("batch", policy, state, batch_size=25)


def test_thompson_tuned_to_no_exploration_shows_its_gated_arm():
    # it still drew the default at baseline_share and otherwise the ungated argmax of the posterior mean
    p = ThompsonPolicy(RETRIEVERS, counterfactual=False, default_after=10**6, seed=0)
    rng = np.random.default_rng(0)
    arm = p.arm_names[3]
    w = list(map(float, arm.split("/")))
    for _ in range(30):  # a little evidence for one arm, not enough for the gate
        ep = _episode(w, np.eye(3), [0, 0, 0], float(rng.normal(0.1, 0.5)), arm=arm)
        p.learn(ep, ep.reward)
    p.tune(exploration=0.0)
    ctx = ToyEnv(seed=0).context(0)
    greedy = p.decide(ctx, explore=False).arm
    decisions = [p.decide(ctx) for _ in range(50)]
    assert {(d.arm, d.explored, d.propensity) for d in decisions} == {(greedy, False, 1.0)}


def test_an_episode_logged_in_another_retriever_order_credits_the_arm_it_showed():
    # the learner hands episodes over in its own order, so the arm's name (written in the logging order)
    # was trusted and the mirror-image arm credited
    logged = tuple(reversed(RETRIEVERS))
    weights = dict(zip(logged, (0.2, 0.2, 0.6), strict=True))  # in our order: 0.6/0.2/0.2
    arm = "/".join(f"{weights[r]:g}" for r in logged)
    learner = Learner(RETRIEVERS, "thompson", PLAIN, seed=0, counterfactual=False)
    episode = Episode("e1", "q", logged, Decision(weights, arm=arm), ("a", "b", "c"),
                      np.eye(3), np.array([1.0, 0.0, 0.0]), 1.0)
    learner.learn(episode)
    stats = learner.policy._stats["*"][0]
    credited = learner.policy._arms[int(np.argmax(stats))]
    assert dict(zip(RETRIEVERS, credited.round(3), strict=True)) == {r: weights[r] for r in RETRIEVERS}


# ---------------------------------------------------------------------------- hyperparameters as written


def test_a_number_written_another_way_is_the_same_hyperparameter():
    # window=100 and window=100.0 were two kinds of policy: the state of one did not load into the other,
    # and a reopened ensemble set its own snapshot aside and started afresh
    saved = GradientPolicy(RETRIEVERS, window=100).state_dict()
    GradientPolicy(RETRIEVERS, window=100.0).load_state_dict(json.loads(json.dumps(saved)))
    ThompsonPolicy(RETRIEVERS, noise=1).load_state_dict(ThompsonPolicy(RETRIEVERS, noise=1.0).state_dict())


def test_numpy_hyperparameters_give_a_json_state():
    # batch_size=np.int64(50) was kept as given: every state_dict() failed json.dumps, and every save with it
    # the ignores: numpy scalars where the annotations say int and float, on purpose
    for policy in (BatchPolicy(RETRIEVERS,
                               batch_size=np.int64(50), learning_rate=np.float32(0.05)),  # type: ignore[arg-type]
                   GradientPolicy(RETRIEVERS, window=np.int64(100)),  # type: ignore[arg-type]
                   ThompsonPolicy(RETRIEVERS, noise=np.float64(1))):
        json.dumps(policy.state_dict())
    config = LearnerConfig(skip_weight=np.float32(0.3))  # type: ignore[arg-type]
    json.dumps(Learner(RETRIEVERS, config=config).state_dict())


@pytest.mark.parametrize("cls", [ThompsonPolicy, GradientPolicy, BatchPolicy])
def test_an_upper_bound_no_weights_can_sum_under_is_refused(cls):
    # (0, 0.2) for three retrievers was widened to 1/3 without a word: the weights stayed equal for ever
    with pytest.raises(ValidationError, match="upper bound"):
        cls(RETRIEVERS, bounds=(0.0, 0.2))
    cls(RETRIEVERS, bounds=(0.0, 1 / 3))


def test_gradient_counts_an_episode_of_one_shown_chunk():
    p = GradientPolicy(RETRIEVERS)
    one = Episode("e", "q", RETRIEVERS, Decision(p.weights()), ("a",), np.ones((1, len(RETRIEVERS))),
                  np.array([0.4]), 0.4)
    p.learn(one, 0.4)
    assert p.n_updates == 1.0


def test_thompson_refuses_a_chunk_reward_that_is_not_finite() -> None:
    # one NaN made every arm's click evidence NaN for good, and no state could be saved again
    policy = ThompsonPolicy(RETRIEVERS, seed=0)
    before = json.dumps(policy.state_dict(), sort_keys=True)
    ep = _episode((1 / 3, 1 / 3, 1 / 3), np.eye(3), [np.nan, 1.0, 0.0], 1.0, arm="default")
    with pytest.raises(ValidationError, match="finite"):
        policy.learn(ep, 1.0)
    assert json.dumps(policy.state_dict(), sort_keys=True) == before


def test_pdgd_with_a_learning_rate_of_zero_does_not_learn() -> None:
    # the rate used never fell below min_learning_rate's default 0.005: learning_rate=0 still moved the weights
    policy = GradientPolicy(RETRIEVERS, learning_rate=0.0, evidence_z=0.0, seed=0)
    env = ToyEnv(seed=0)
    # the ignore: BasePolicy.load_state_dict returns BasePolicy, so to mypy no built-in policy is a Policy
    learner = Learner(RETRIEVERS, policy=policy)
    simulate(learner, env, 200, seed=1)
    assert learner.weights() == pytest.approx(dict.fromkeys(RETRIEVERS, 1 / 3))


@pytest.mark.parametrize(("make", "name"), [
    (lambda: GradientPolicy(RETRIEVERS, lr_decay=10**400), "lr_decay"),
    (lambda: ThompsonPolicy(RETRIEVERS, prior_strength=10**400), "prior_strength"),
    (lambda: ThompsonPolicy(RETRIEVERS, step=1e-320), "step"),
])
def test_a_setting_beyond_float_range_is_a_validation_error(make, name) -> None:
    # float(10**400) raised a bare OverflowError, and a step of 1e-320 one from round(inf)
    with pytest.raises(ValidationError, match=name):
        make()


def test_thompson_arm_names_stay_apart_on_a_fine_grid() -> None:
    # names had three significant digits: at step 0.0005, 446 arms shared a name, merged in logs and reports
    policy = ThompsonPolicy(("a", "b"), step=0.0005, seed=0)
    assert len(set(policy.arm_names)) == len(policy.arm_names)
    # the default grid's names are as before (logged arms keep their names)
    assert ThompsonPolicy(RETRIEVERS, seed=0).arm_names[1:4] == ("0.05/0.05/0.9", "0.05/0.075/0.875",
                                                                 "0.05/0.175/0.775")


@pytest.mark.parametrize("normalized", [np.full((3, 3), np.nan), np.ones((3, 2)), None])
def test_pdgd_refuses_a_context_it_cannot_rank(normalized) -> None:
    # NaN scores sampled a ranking with a made-up propensity of 1.0; another shape or None raised from NumPy
    policy = GradientPolicy(RETRIEVERS, seed=0)
    ctx = Context("q", RETRIEVERS, ("a", "b", "c"), np.ones((3, 3)), normalized)
    with pytest.raises(ValidationError, match="context"):
        policy.decide(ctx, explore=True)


def test_chunk_exploration_that_reorders_the_greedy_set_is_logged_as_explored() -> None:
    # it compared sets: with no more candidates than k every draw shows the greedy set, and a reordered list
    # was logged as not explored
    from rlfb.exploration import ThompsonChunkExploration

    ex = ThompsonChunkExploration(weight=0.4, seed=1)
    fused = np.array([1.0, 0.9, 0.8, 0.7, 0.6])
    flags = []
    for _ in range(200):
        r = ex.explore(np.arange(5), 10, fused=fused, alpha=np.ones(5), beta=np.ones(5))
        assert r.explored == (r.order.tolist() != [0, 1, 2, 3, 4])
        flags.append(r.explored)
    assert any(flags) and not all(flags)


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


# query features
def test_one_letter_capitals_are_not_counted_as_all_capital_tokens() -> None:
    """Bug guarded: "I" and "A" counted as all-capital (acronym) tokens in upper_ratio."""
    assert query_features("What is a UNIX pipe and can I use it")["upper_ratio"] == pytest.approx(0.1)


def test_a_capitalised_question_word_makes_a_question_without_a_question_mark() -> None:
    """Bug guarded: the leading question word was compared without lower-casing it."""
    assert query_features("How do tides work")["is_question"] == 1.0


def test_twelve_tokens_are_medium_and_thirteen_long() -> None:
    """Bug guarded: the medium bucket's bound was exclusive, so a 12-token query was long."""
    assert query_type(query_features(" ".join(["tide"] * 12))) == "medium|keyword"
    assert query_type(query_features(" ".join(["tide"] * 13))) == "long|keyword"


# the gradient and batch policies
RETRIEVERS3 = ("bm25", "dense", "splade")


def _episode3(shown: list[list[float]], rewards: list[float], *, weights: tuple[float, ...] = (1 / 3,) * 3,
             eid: str = "e") -> Episode:
    return Episode(event_id=eid, query="q", retrievers=RETRIEVERS3,
                   decision=Decision(dict(zip(RETRIEVERS3, weights, strict=True)), arm=None),
                   shown_ids=tuple(f"d{i}" for i in range(len(shown))), shown=np.asarray(shown, dtype=float),
                   chunk_rewards=np.asarray(rewards, dtype=float), reward=max(rewards))


def test_a_chunk_reward_beyond_one_weighs_as_a_full_click_in_the_gradient() -> None:
    """Bug guarded: a chunk reward of 3 (an explicit rating's) weighed three full clicks in the PDGD gradient."""
    sums = []
    for r in (1.0, 3.0):
        p = GradientPolicy(RETRIEVERS3, seed=0)
        p.learn(_episode3([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], [0.0, r]), 1.0)
        sums.append(p.state_dict()["state"]["grad_sums"])
    assert sums[1] == sums[0]


def test_a_later_click_on_an_event_counts_only_its_own_pairs() -> None:
    """Bug guarded: a second click on an event counted the first click's pairs again (n_pairs twice as large)."""
    p = GradientPolicy(RETRIEVERS3, seed=0)
    shown = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    later = dataclasses.replace(_episode3(shown, [0.0, 0.0, 1.0]), prior_rewards=np.array([0.0, 1.0, 0.0]))
    p.learn(later, 1.0)
    assert p.state_dict()["state"]["n_pairs"] == 1.0  # chunk 2 over chunk 0; chunk 1 was learned from before


def test_the_batch_policy_buffers_a_reward_beyond_one_as_one_and_its_state_still_loads() -> None:
    """Bug guarded: a reward of 5 was buffered as it came, and the saved state then failed to load."""
    p = BatchPolicy(RETRIEVERS3, batch_size=3, seed=0)
    p.learn(_episode3([[1.0, 0.0, 0.0]], [5.0]), 5.0)
    state = p.state_dict()
    assert state["state"]["buffer"][0][1] == 1.0
    BatchPolicy(RETRIEVERS3, batch_size=3, seed=0).load_state_dict(state)


def _batch_after_one_batch(**kw: Any) -> BatchPolicy:
    """A batch policy after one batch: the event shown weights leaning to bm25 did better than the one leaning to
    dense, and the batch's mean reward (0.6) is past the positive threshold."""
    tune = kw.pop("tune", {})
    p = BatchPolicy(RETRIEVERS3, batch_size=2, seed=0, **kw).tune(**tune)
    p.learn(_episode3([[1.0, 0.0, 0.0]], [1.0], weights=(0.6, 0.2, 0.2), eid="e1"), 1.0)
    p.learn(_episode3([[1.0, 0.0, 0.0]], [0.2], weights=(0.2, 0.6, 0.2), eid="e2"), 0.2)
    return p


def test_the_guardrails_learning_rate_multiplier_scales_the_batch_step() -> None:
    """Bug guarded: the batch policy ignored the guardrail's learning-rate multiplier (0 still moved the weights)."""
    assert _batch_after_one_batch().weights()["bm25"] > 1 / 3
    assert _batch_after_one_batch(tune={"learning_rate": 0.0}).weights() == pytest.approx(dict.fromkeys(RETRIEVERS3,
                                                                                                      1 / 3))


def test_a_batch_step_is_at_most_max_step() -> None:
    """Bug guarded: the batch step was not bounded by max_step."""
    p = _batch_after_one_batch(learning_rate=1.0, max_step=0.01)
    w = np.array([p.weights()[n] for n in RETRIEVERS3])
    assert 0.0 < np.linalg.norm(w - 1 / 3) <= 0.01 + 1e-12


def test_the_guardrails_exploration_multiplier_widens_the_batch_policys_perturbations() -> None:
    """Bug guarded: the step towards a retriever ignored the exploration multiplier (4 / sqrt(concentration))."""
    # a step of 4 / sqrt(200 / 2) = 0.4
    p = BatchPolicy(RETRIEVERS3, seed=0).tune(exploration=2.0)
    shown = [p.decide(None) for _ in range(40)]
    explored = [max(d.weights.values()) for d in shown if d.explored]
    assert explored and explored == pytest.approx([1 / 3 + 0.4 * 2 / 3] * len(explored))


# thompson: the posterior and its gate
TR = ("bm25", "dense", "splade")


def _thompson_episode(weights: tuple[float, ...], reward: float = 1.0, qtype: str = "default") -> Episode:
    return Episode(event_id="e", query="q", retrievers=TR, decision=Decision(dict(zip(TR, weights, strict=True))),
                   shown_ids=("d0",), shown=np.ones((1, 3)), chunk_rewards=np.array([reward]), reward=reward,
                   query_type=qtype)


def _plain_thompson(**kwargs) -> ThompsonPolicy:
    # no forgetting, no clock, no click evidence: the posterior of the module docstring, exactly
    return ThompsonPolicy(TR, counterfactual=False, forget=1.0, half_life_days=None, prior_strength=2.0, **kwargs)


def test_thompson_arms_shrink_towards_the_global_mean_reward() -> None:
    """Each arm's posterior mean is ``(s + k0 * mu0) / (n + k0)``, ``mu0 = S / (N + 1)`` the global mean: an
    untried arm starts at what arms earn on average. With the prior mean read as 0 (or left out of the played
    arm's mean) every untried arm looked worse than the played one and a played arm's mean came out low."""
    p = _plain_thompson(bandwidth=0.0)
    for _ in range(10):
        p.learn(_thompson_episode((0.8, 0.1, 0.1)), 1.0)
    stats = p.arm_stats()
    mu0 = 10 / 11
    assert stats["0.8/0.1/0.1"]["mean"] == pytest.approx((10 + 2 * mu0) / 12)
    assert stats["default"]["mean"] == pytest.approx(mu0)
    assert stats["0.1/0.1/0.8"]["mean"] == pytest.approx(mu0)


def test_thompson_neighbours_variance_counts_shared_evidence_at_its_squared_kernel_weight() -> None:
    """A neighbour that borrows ``n`` samples at kernel weight ``k`` has variance ``sigma2 (k^2 n + k0) /
    (k n + k0)^2``: the borrowed samples are correlated, so they narrow it less than ``k n`` samples of its own
    would. Using ``k n`` in the numerator made neighbours as sure as if they had been played."""
    h, k0, n = 0.1, 2.0, 10
    p = _plain_thompson(bandwidth=h)
    for _ in range(n):
        p.learn(_thompson_episode((0.8, 0.1, 0.1)), 1.0)
    stats = p.arm_stats()
    k = math.exp(-0.02 / (2 * h * h))  # squared distance from 0.8/0.1/0.1 to 0.7/0.2/0.1
    ratio = (stats["0.7/0.2/0.1"]["sd"] / stats["0.8/0.1/0.1"]["sd"]) ** 2
    assert ratio == pytest.approx((k * k * n + k0) * (n + k0) / (k * n + k0) ** 2)


def test_thompson_gate_plays_the_best_mean_among_the_arms_that_pass() -> None:
    """Among the arms whose advantage over the default passes the gate, the greedy arm is the one with the highest
    posterior mean (the gate decides *whether* to leave the default, not *where to*). Taking the best lower bound
    instead preferred an arm sampled often with a lower mean reward."""
    p = _plain_thompson(bandwidth=0.0, gate_z=10.0, min_samples=0.0, default_step=0.0)
    for _ in range(40):
        p.learn(_thompson_episode((1 / 3, 1 / 3, 1 / 3)), 0.0)  # the default arm
        p.learn(_thompson_episode((0.8, 0.1, 0.1)), 0.5)
    for _ in range(3):
        p.learn(_thompson_episode((0.1, 0.1, 0.8)), 1.0)
    stats = p.arm_stats()
    d, often, rare = stats["default"], stats["0.8/0.1/0.1"], stats["0.1/0.1/0.8"]

    def lcb(a: dict[str, float]) -> float:
        return a["mean"] - d["mean"] - 10.0 * math.sqrt(a["sd"] ** 2 + d["sd"] ** 2)

    assert 0 < lcb(rare) < lcb(often) and rare["mean"] > often["mean"]  # both pass; rare is better, less sure
    assert p.weights() == pytest.approx(dict(zip(TR, (0.1, 0.1, 0.8), strict=True)))


@pytest.mark.parametrize("weights", [(-1.0, 2.0), (float("nan"), 1.0), (0.5, 0.6), (), (0.0, 0.0), ("a", "b"),
                                     ((0.5, 0.5),)])
def test_fixed_params_refuse_weights_a_fixed_policy_would_refuse(weights: Any) -> None:
    # exported and said to be validated, FixedParams took (-1.0, nan) unchecked
    from rlfb.policies.fixed import FixedParams, FixedPolicy

    with pytest.raises(InvalidWeightsError, match="FixedParams weights"):
        FixedParams(weights)
    assert FixedPolicy(["a", "b", "c"], [1, 1, 2]).hyper == FixedParams((0.25, 0.25, 0.5))


@pytest.mark.parametrize("name", ["thompson", "gradient", "batch"])
def test_a_policys_hyperparameters_are_its_params_value_object(name: str) -> None:
    # each policy lists its hyperparameters in its signature and again in its Params: one added to either alone
    # would be taken and never validated, or validated and never reachable
    import inspect

    from rlfb.policies import BatchParams, BatchPolicy, GradientParams, GradientPolicy, ThompsonParams, ThompsonPolicy

    policy: type[Any]
    params: type[Any]
    policy, params = {"thompson": (ThompsonPolicy, ThompsonParams), "gradient": (GradientPolicy, GradientParams),
                      "batch": (BatchPolicy, BatchParams)}[name]
    signature = {n: p.default for n, p in inspect.signature(policy.__init__).parameters.items()
                 if n not in ("self", "retrievers", "weights", "seed")}
    fields = {f.name: f.default for f in dataclasses.fields(params)}
    assert signature.keys() == fields.keys()
    assert isinstance(policy(["bm25", "dense"]).hyper, params)
    assert {n: v for n, v in signature.items() if v is not None} == {
        n: v for n, v in fields.items() if signature[n] is not None}


@pytest.mark.parametrize("name", ["thompson", "epsilon", "gradient", "batch"])
def test_a_policy_is_made_from_its_params_value_object(name: str) -> None:
    # MABWiser keeps a learning policy's settings as a value object apart from its learned state: one Params
    # makes the policy of many ensembles, and gives the same policy as its settings given one by one
    from rlfb.policies import (
        BatchParams,
        BatchPolicy,
        EpsilonGreedyPolicy,
        GradientParams,
        GradientPolicy,
        ThompsonParams,
        ThompsonPolicy,
    )

    policy: type[Any]
    params: Any
    policy, params = {
        "thompson": (ThompsonPolicy, ThompsonParams(step=0.25, cf_min_questions=10, bounds=(0.1, 0.9))),
        "epsilon": (EpsilonGreedyPolicy, ThompsonParams(exploration="epsilon", epsilon=0.3)),
        "gradient": (GradientPolicy, GradientParams(learning_rate=0.2, temperature=0.5)),
        "batch": (BatchPolicy, BatchParams(batch_size=7, learning_rate=0.2)),
    }[name]
    made = policy.from_params(["bm25", "dense", "splade"], params, [1, 2, 1], seed=3)
    assert type(made) is policy and made.hyper == params and made.seed == 3
    given = policy(["bm25", "dense", "splade"], [1, 2, 1], seed=3,
                   **{f.name: getattr(params, f.name) for f in dataclasses.fields(params)})
    assert made.state_dict() == given.state_dict()


def test_from_params_refuses_another_policys_params_and_a_fixed_policy() -> None:
    from rlfb.policies import (
        EpsilonGreedyPolicy,
        FixedParams,
        FixedPolicy,
        GradientParams,
        ThompsonParams,
        ThompsonPolicy,
    )

    with pytest.raises(ValidationError, match="ThompsonPolicy.from_params takes a ThompsonParams, got GradientParams"):
        ThompsonPolicy.from_params(["a", "b"], GradientParams())
    with pytest.raises(ValidationError, match="FixedPolicy takes no Params"):
        FixedPolicy.from_params(["a", "b"], FixedParams((0.5, 0.5)))
    # the Params' default exploration is Thompson sampling: an epsilon-greedy policy was made to explore by it
    with pytest.raises(ValidationError, match="EpsilonGreedyPolicy explores by epsilon, got ThompsonParams with "
                                              "exploration='thompson'"):
        EpsilonGreedyPolicy.from_params(["a", "b"], ThompsonParams())
    # ... which its constructor still takes, so that a state saved that way loads back
    saved = EpsilonGreedyPolicy(["a", "b"], exploration="thompson", step=0.5)
    rebuilt = Learner.from_state_dict(Learner(["a", "b"], policy=saved).state_dict())
    assert rebuilt.policy.hyper == saved.hyper and rebuilt.policy.name == "epsilon"


# -- found by a mutation review (2026-12-07): each fails with the bug its comment names ----------------------------
def _click_on_second(decision: Decision, *, t: float = 0.0, n: int = 2) -> Episode:
    X = np.array([[1.0, 0.0], [0.6, 0.7], [0.5, 0.5]])[:n]
    return Episode("e", "q", ("a", "b"), decision, ("x", "y", "z")[:n], X, np.eye(n)[1], 1.0, timestamp=t)


def test_thompsons_click_evidence_takes_a_late_click_as_aged() -> None:
    # a click on a decision two half-lives older than the clock was added at full weight, where the arm counts,
    # the memory and the chunk confidences age it
    from rlfb.decay import DAY

    p = ThompsonPolicy(["a", "b"], step=0.5, seed=0, half_life_days=45.0)
    d = p.decide(None, explore=False)
    p.learn(_click_on_second(d, t=1000 * DAY), 1.0)
    p.learn(_click_on_second(d, t=910 * DAY), 1.0)
    assert p.state_dict()["state"]["clicks"]["*"]["n"] == pytest.approx(1.0 + 0.25 * p.hyper.forget, abs=0.01)


def test_a_gradient_step_is_in_proportion_to_its_episodes_weight() -> None:
    # a replayed episode, learned at a fraction of its weight, moved the weights as far as a fresh one
    def step(weight: float) -> float:
        p = GradientPolicy(["a", "b"], seed=0)
        for _ in range(10):
            p.learn(_click_on_second(Decision(p.weights()), n=3), 1.0)
        before = p.weights()["a"]
        p.learn(_click_on_second(Decision(p.weights()), n=3), 1.0, weight=weight)
        return p.weights()["a"] - before

    full, tenth = step(1.0), step(0.1)
    assert full * tenth > 0 and abs(tenth) < 0.25 * abs(full)  # the evidence it adds is a tenth, as its step


def test_a_fixed_policy_counts_what_it_learns() -> None:
    # its weights do not move, but `n_updates` (and the snapshot's count) stayed 0
    p = FixedPolicy(["a", "b"])
    p.learn(_click_on_second(Decision({"a": 0.5, "b": 0.5})), 1.0)
    p.learn(_click_on_second(Decision({"a": 0.5, "b": 0.5})), 1.0, weight=0.5)
    assert p.n_updates == 1.5 and p.state_dict()["n_updates"] == 1.5


def test_digits_alone_make_a_code_query() -> None:
    # a mutation review (2026-12-07): read from identifiers alone, "code" (digits or identifiers) lost the questions
    # with a number and no identifier, whose contextual statistics then went to the keyword bucket
    f = query_features("apollo 11 landing")
    assert f["has_code"] == 0.0 and f["has_digits"] == 1.0
    assert query_type(f) == "short|code"
