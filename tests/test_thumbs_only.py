"""Thompson's weights learn from users who only rate answers: praise spread alike over every shown chunk ranks
no arm above another, so it adds no click evidence (it opened the click gate on advantages of 0, which
stopped arm sampling, and the weights stayed at 0.50 after 3,000 thumbs where retriever A was right)."""

from __future__ import annotations

import numpy as np

from rlfb.learner import Learner
from rlfb.policies import ThompsonPolicy
from rlfb.policies.base import Context, Decision, Episode

RET = ("A", "B")


def _thumbs_world(learner: Learner, steps: int, seed: int) -> None:
    """A knows the relevant chunk, B is noise; the user rates the answer up when its top chunk is relevant."""
    rng = np.random.default_rng(seed)
    for t in range(steps):
        n, rel = 8, int(rng.integers(8))
        a = rng.random(n) * 0.5
        a[rel] = 1.0
        X = np.stack([a, rng.random(n)], axis=1)
        q = f"q{rng.integers(5000)}"
        ctx = Context(query=q, retrievers=RET, candidate_ids=tuple(f"{q}-{i}" for i in range(n)), raw=X.copy(),
                      normalized=X)
        ranking = learner.rank(ctx, 4)
        r = 1.0 if ranking.order[0] == rel else -1.0
        learner.learn(Episode(f"e{t}", q, RET, ranking.decision, tuple(ctx.candidate_ids[i] for i in ranking.order),
                              X[ranking.order], np.full(len(ranking.order), r), r, timestamp=1.7e9 + t,
                              feedback_time=1.7e9 + t, scores=ranking.fused[ranking.order]))


def test_answer_ratings_alone_move_thompsons_weights_towards_the_right_retriever() -> None:
    # the ignore: BasePolicy.load_state_dict returns BasePolicy, so to mypy no built-in policy is a Policy
    learner = Learner(RET, policy=ThompsonPolicy(list(RET), seed=0),
                      config={"memory_weight": 0.0})
    _thumbs_world(learner, 750, seed=10)
    assert learner.weights()["A"] > 0.6


def test_praise_of_every_shown_chunk_adds_no_click_evidence_but_a_click_does() -> None:
    policy = ThompsonPolicy(list(RET), seed=0)
    shown = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])

    def episode(rewards: list[float]) -> Episode:
        return Episode("e", "q", RET, Decision({"A": 0.5, "B": 0.5}, arm=policy.arm_names[0]), ("c0", "c1", "c2"),
                       shown, np.array(rewards), max(rewards), timestamp=1.7e9, feedback_time=1.7e9)

    for _ in range(30):
        policy.learn(episode([1.0, 1.0, 1.0]), 1.0)
    assert policy.state_dict()["state"]["clicks"] == {}
    policy.learn(episode([0.0, 0.4, 0.0]), 0.4)
    assert "*" in policy.state_dict()["state"]["clicks"]  # the global scope and the episode's query type


def test_the_guardrail_compares_no_orders_on_praise_of_every_shown_chunk() -> None:
    # each such episode added a difference of 0 between the learned and the default order, diluting the
    # differences that clicks show
    from rlfb.guardrail import Guardrail

    guard = Guardrail()
    shown = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    learned, default = np.array([0.9, 0.1]), np.array([0.5, 0.5])
    for _ in range(10):
        guard.observe(shown, np.array([1.0, 1.0, 1.0]), learned, default)
    assert guard.state_dict()["n"] == 0
    guard.observe(shown, np.array([0.0, 0.4, 0.0]), learned, default)
    assert guard.state_dict()["n"] == 1
