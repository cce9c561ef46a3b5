"""Behaviours a hand-made mutation audit of the reward function, fusion, the Thompson policy, the metrics and the
feedback store found no test for. Each test names the bug it guards against.

Covered: the clock-skew tolerance at its edge (reward and store), the configured ``no_feedback`` of an event
without signals, a custom alias overriding a built-in one, a missing normalised score in ``weighted_fusion``,
queries with empty qrels, trec_eval's tie order for ids that are prefixes of one another, idempotency keys
reused on another chunk or event, the per-feedback clip in the store, what counts as a repeat, the snapshot kinds
a prune keeps apart (retrievers) and merges (weights), the per-event clip of ``stats()["mean_reward"]``, and
Thompson's posterior (the prior mean, the kernel-shared variance), its gate (best mean among the arms that pass),
the two-click floor of the click evidence, the fixed default while it decides, and the click evidence's gains
(positive rewards only) and offsets (the logged fused scores').
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytrec_eval
from _clock import NOW, Clock

from rlfb.errors import FeedbackBeforeEventError, IdempotencyConflictError
from rlfb.fusion import weighted_fusion
from rlfb.metrics import evaluate_run, run_to_ranking
from rlfb.policies import ThompsonPolicy
from rlfb.policies.base import Decision, Episode
from rlfb.reward import RewardConfig, RewardFunction
from rlfb.store import FeedbackStore

DAY = 86400.0


def _store(**kwargs) -> FeedbackStore:
    return FeedbackStore(":memory:", clock=Clock(), **kwargs)


def _event(store: FeedbackStore, ts: float = NOW - 60, ids: tuple[str, ...] = ("c1", "c2"), **kwargs) -> str:
    return store.log_event("q", {"weights": {"bm25": 0.5, "dense": 0.5}, "arm": "a"},
                           [{"chunk_id": c} for c in ids], timestamp=ts, **kwargs)


# ---------------------------------------------------------------- reward
def test_feedback_before_its_event_is_tolerated_up_to_the_clock_skew_and_no_further() -> None:
    """A tolerance read as twice (or any more than) ``clock_skew`` took feedback stamped 301 s to 600 s before its
    event as undelayed; the existing tests sat far from the edge (1000 s, 3600 s)."""
    rf = RewardFunction()
    assert rf.compute(1000.0, [("click", 700.0)]) == pytest.approx(0.4)  # 300 s before: tolerated
    with pytest.raises(FeedbackBeforeEventError):
        rf.compute(1000.0, [("click", 699.0)])  # 301 s before
    store = _store()
    eid = _event(store, ts=NOW - 1000)
    assert store.record_feedback(eid, "thumbs_up", timestamp=NOW - 1300).delay == 0.0
    with pytest.raises(FeedbackBeforeEventError):
        store.record_feedback(eid, "thumbs_up", timestamp=NOW - 1301)


def test_an_event_without_signals_gets_the_configured_no_feedback() -> None:
    """``compute`` with no signals returned a literal 0.0: a ``no_feedback`` set to -0.1 (silence counted as mild
    disapproval) was ignored by every event without feedback."""
    assert RewardFunction(RewardConfig(no_feedback=-0.1)).compute(0, []) == -0.1
    assert RewardFunction(RewardConfig(no_feedback=0.05)).compute(0, []) == 0.05


def test_a_custom_alias_overrides_a_built_in_one() -> None:
    """Merged the other way round, the built-in aliases won: ``aliases={"click": "explicit_positive"}`` (an app
    where a click is a deliberate endorsement) was accepted and then silently valued as an implicit 0.4."""
    rf = RewardFunction(RewardConfig(aliases={"click": "explicit_positive"}))
    assert rf.resolve("click") == "explicit_positive"
    assert rf.signal_value("click") == 1.0
    assert RewardFunction().signal_value("click") == 0.4  # the default registry is untouched


# ---------------------------------------------------------------- fusion
def test_weighted_fusion_reads_a_missing_normalised_score_as_zero() -> None:
    """Without its ``nan_to_num``, one missing (NaN) normalised score made the candidate's fused score NaN, which
    sorts unpredictably: a candidate a member did not return gets nothing from it, not NaN."""
    fused = weighted_fusion(np.array([[np.nan, 1.0], [0.5, 0.0]]), [0.5, 0.5])
    assert fused.tolist() == [0.5, 0.25]


# ---------------------------------------------------------------- metrics
def test_a_query_whose_qrels_are_empty_is_not_judged() -> None:
    """A query with an empty qrel mapping has no judgments at all (unlike one judged only grade 0): counted as
    judged, it scored 0 and halved the mean here."""
    rankings = {"q1": ["a", "b"], "q2": ["c"]}
    assert evaluate_run(rankings, {"q1": {"a": 1}, "q2": {}}, [("mrr", 10), ("p", 1)]) == {"mrr@10": 1.0,
                                                                                         "p@1": 1.0}


def test_score_ties_between_ids_that_are_prefixes_of_one_another_follow_trec_eval() -> None:
    """trec_eval breaks a score tie by doc id in descending string order, so "ab" comes before "a". Negated
    character codes alone (without the end marker) put the shorter id first, and P@1 differed from trec_eval's."""
    run = {"a": 1.0, "ab": 1.0, "b": 0.5}
    assert run_to_ranking(run) == ["ab", "a", "b"]
    for relevant in ("a", "ab"):
        ours = evaluate_run({"q": run_to_ranking(run)}, {"q": {relevant: 1}}, [("p", 1)])["p@1"]
        theirs = pytrec_eval.RelevanceEvaluator({"q": {relevant: 1}}, {"P_1"}).evaluate({"q": run})["q"]["P_1"]
        assert ours == theirs


# ---------------------------------------------------------------- store: idempotency
def test_an_idempotency_key_reused_on_another_chunk_conflicts() -> None:
    """The conflict check did not compare the chunk: a key reused for a click on another chunk of the same
    retrieval returned the first record as a duplicate, and the second chunk's click was silently lost."""
    store = _store()
    eid = _event(store)
    store.record_feedback(eid, "click", chunk_id="c1", idempotency_key="K")
    with pytest.raises(IdempotencyConflictError):
        store.record_feedback(eid, "click", chunk_id="c2", idempotency_key="K")
    with pytest.raises(IdempotencyConflictError):
        store.record_feedback(eid, "click", idempotency_key="K")  # response-level is another chunk too
    assert store.counts()["feedback"] == 1


def test_an_idempotency_key_reused_on_another_event_conflicts() -> None:
    """The conflict check did not compare the event: a key reused for the same signal on another retrieval
    returned the first record (of the first event) as a duplicate, and the second event got no feedback."""
    store = _store()
    e1, e2 = _event(store), _event(store)
    store.record_feedback(e1, "thumbs_up", idempotency_key="K")
    with pytest.raises(IdempotencyConflictError):
        store.record_feedback(e2, "thumbs_up", idempotency_key="K")
    assert store.feedback(e2) == []


# ---------------------------------------------------------------- store: rewards
def test_each_feedback_reward_is_clipped_to_the_configured_range() -> None:
    """The store clips each feedback's discounted value to ``[clip_low, clip_high]`` before attributing it; without
    the clip a narrowed range (or an explicit value beyond it) reached the reward rows and the learner whole."""
    store = _store(reward=RewardFunction(RewardConfig(clip_low=-0.5, clip_high=0.5)))
    eid = _event(store)
    rec = store.record_feedback(eid, "thumbs_up", timestamp=NOW - 60)
    assert rec.reward == 0.5 and rec.chunk_rewards == {"c1": 0.5, "c2": 0.5}
    neg = store.record_feedback(eid, "thumbs_down", chunk_id="c2", timestamp=NOW - 60)
    assert neg.reward == -0.5 and neg.chunk_rewards == {"c2": -0.5}
    assert store.chunk_reward_sums(eid) == {"c1": 0.5, "c2": 0.0}


def test_a_new_rating_of_the_same_retrieval_is_no_repeat() -> None:
    """A repeat says again what the latest feedback said: the same signal *and* the same number. Comparing the
    signal alone took a rating of 2 after a rating of 5 (a user changing their mind) for a double click, and the
    learner and ``event_reward`` dropped it."""
    store = _store()
    eid = _event(store)
    store.record_feedback(eid, value=0.25, session_id="s", timestamp=NOW - 60)
    second = store.record_feedback(eid, value=0.5, session_id="s", timestamp=NOW - 60)
    again = store.record_feedback(eid, value=0.5, session_id="s", timestamp=NOW - 60)
    assert not store.repeats_latest(second)
    assert store.repeats_latest(again)  # the same number again is one
    assert store.event_reward(eid)[0] == pytest.approx(0.75)


def test_window_mean_reward_clips_each_events_reward() -> None:
    """``stats()["mean_reward"]`` is the mean of each event's reward, the sum of its discounted signals clipped
    as ``event_reward`` clips it: unclipped, a thumbs up with a click reported 1.4."""
    store = _store()
    eid = _event(store)
    store.record_feedback(eid, "thumbs_up", timestamp=NOW - 60)
    store.record_feedback(eid, "click", timestamp=NOW - 60)
    window = store.stats()["window"]
    assert store.event_reward(eid)[0] == 1.0
    assert window["mean_reward"] == 1.0 and window["by_arm"]["a"]["mean_reward"] == 1.0


# ---------------------------------------------------------------- store: snapshot kinds
def _state(retrievers: list[str], weights: dict[str, float]) -> dict:
    return {"retrievers": retrievers, "exploration": {"kind": "none"},
            "policy": {"name": "thompson", "params": {"step": 0.1, "weights": weights}}}


def test_prune_keeps_the_newest_snapshot_of_each_set_of_retrievers() -> None:
    """Two apps with other retrievers share a store and a policy. Read without the retrievers, their snapshots
    were one kind: a prune kept only the newer app's and took the other's only state."""
    store = FeedbackStore(":memory:", clock=Clock(), retention=30 * DAY, snapshots_kept=None)
    store.save_policy_state(_state(["bm25"], {"bm25": 1.0}), {"bm25": 1.0}, policy="thompson",
                            timestamp=NOW - 60 * DAY)
    store.save_policy_state(_state(["bm25", "dense"], {"bm25": 0.5, "dense": 0.5}), {"bm25": 0.5, "dense": 0.5},
                            policy="thompson", timestamp=NOW - 59 * DAY)
    assert len(store.newest_snapshots()) == 2
    assert store.prune()["policy_snapshots"] == 0
    assert store.counts()["policy_snapshots"] == 2


def test_prune_takes_a_kinds_older_snapshots_whatever_weights_they_hold() -> None:
    """The weights in a policy's params are what it learned, not a hyperparameter: read with them, every snapshot
    of a learning policy was a kind of its own, and a prune (and ``newest_snapshots``) kept them all."""
    store = FeedbackStore(":memory:", clock=Clock(), retention=30 * DAY, snapshots_kept=None)
    for i, w in enumerate((0.2, 0.4, 0.6)):
        store.save_policy_state(_state(["bm25", "dense"], {"bm25": w, "dense": 1 - w}),
                                {"bm25": w, "dense": 1 - w}, policy="thompson", timestamp=NOW - (60 - i) * DAY)
    assert len(store.newest_snapshots()) == 1
    assert store.prune()["policy_snapshots"] == 2
    snapshot = store.load_policy_state()
    assert snapshot is not None and snapshot["weights"] == pytest.approx({"bm25": 0.6, "dense": 0.4})


# ---------------------------------------------------------------- thompson: the posterior
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


def test_thompson_keeps_sampling_arms_after_a_single_click_whatever_cf_min_clicks() -> None:
    """Click evidence decides only from two clicks on (``max(cf_min_clicks, 2)``): one click gives no variance to
    gate with. With ``cf_min_clicks=0`` taken as it is, the first click switched arm sampling off for good."""
    p = ThompsonPolicy(TR, cf_min_clicks=0.0, seed=0)
    shown = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    click = Episode(event_id="e", query="q", retrievers=TR, decision=Decision(dict.fromkeys(TR, 1 / 3)),
                    shown_ids=("d0", "d1", "d2"), shown=shown, chunk_rewards=np.array([0.0, 1.0, 0.0]), reward=1.0)
    p.learn(click, 1.0)
    decisions = [p.decide(None) for _ in range(20)]
    assert any(dec.explored for dec in decisions) and any(dec.propensity < 1.0 for dec in decisions)


def test_thompson_default_stays_put_while_click_evidence_decides() -> None:
    """With click evidence the greedy arm is chosen against a *fixed* default, its bound 0. Moving the default
    towards the arm posterior's best as well (``default_after``, here 0) shifted the baseline every advantage is
    measured from, and the weights drifted on rewards the click evidence had already weighed."""
    p = ThompsonPolicy(TR, cf_min_clicks=2.0, default_after=0, gate_z=0.0, min_samples=0.0, bandwidth=0.0,
                       forget=1.0, half_life_days=None, seed=0)
    shown = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    settled = None
    for i in range(30):
        if i == 3:  # two clicks in (episodes 0 and 2): the click evidence decides from here on
            settled = p.default_weights
        good = i % 2 == 0
        w = (0.8, 0.1, 0.1) if good else (1 / 3, 1 / 3, 1 / 3)
        rewards = np.array([1.0, 0.0, 0.0]) if good else np.zeros(3)
        p.learn(Episode(event_id=f"e{i}", query=f"q{i}", retrievers=TR,
                        decision=Decision(dict(zip(TR, w, strict=True))), shown_ids=("d0", "d1", "d2"),
                        shown=shown, chunk_rewards=rewards, reward=float(rewards.max())), float(rewards.max()))
    assert p.default_weights == pytest.approx(settled)


def test_thompson_click_evidence_ignores_negative_chunk_rewards() -> None:
    """Only positively rewarded chunks are relevant to the click evidence (gains clipped to [0, 1]): a thumbs down
    on one chunk says the answer was bad, not which weights would have ranked a good chunk higher. Read as a
    negative gain it pushed every arm's DCG outside [0, 1] and moved the evidence."""
    shown = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])

    def learned(rewards: list[float]) -> dict:
        p = ThompsonPolicy(TR, seed=0)
        for i in range(3):
            ep = Episode(event_id=f"e{i}", query=f"q{i}", retrievers=TR, decision=Decision(dict.fromkeys(TR, 1 / 3)),
                         shown_ids=("d0", "d1", "d2"), shown=shown, chunk_rewards=np.array(rewards), reward=1.0)
            p.learn(ep, 1.0)
        return p.state_dict()["state"]["clicks"]

    assert learned([1.0, -1.0, 0.0]) == learned([1.0, 0.0, 0.0])


def test_thompson_click_evidence_keeps_the_logged_offsets_of_the_fused_scores() -> None:
    """Each arm re-ranks the shown chunks by its weights *plus* the offsets (feedback memory, confidence) the
    logged fused scores held: a chunk the memory put on top stays on top under every arm and earns none of them
    credit. Re-ranked by the weights alone, a click the memory won was credited to whichever arm ranks that
    chunk's retriever first."""
    w = (1 / 3, 1 / 3, 1 / 3)

    def learned(shown: np.ndarray, scores: np.ndarray | None) -> dict:
        p = ThompsonPolicy(TR, seed=0)
        for i in range(3):
            p.learn(Episode(event_id=f"e{i}", query=f"q{i}", retrievers=TR,
                            decision=Decision(dict(zip(TR, w, strict=True))), shown_ids=("d0", "d1", "d2"),
                            shown=shown, chunk_rewards=np.array([0.0, 1.0, 0.0]), reward=1.0, scores=scores), 1.0)
        return p.state_dict()["state"]["clicks"]

    eye = np.eye(3)
    memory_won = learned(eye, eye @ np.array(w) + np.array([0.0, 10.0, 0.0]))  # the memory lifted d1 to the top
    every_arm_agrees = learned(np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]), None)
    assert memory_won == every_arm_agrees
