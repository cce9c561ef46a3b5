"""Repeat discovery: unknown chunks shown first for often-repeated questions, at a learned rate."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from rlfb.discovery import RepeatDiscovery
from rlfb.errors import CorruptStateError, ValidationError
from rlfb.exploration import ExplorationResult
from rlfb.learner import Learner, LearnerConfig
from rlfb.memory import FeedbackMemory
from rlfb.policies.base import Context, Episode

from _toy_env import RETRIEVERS, ToyEnv, simulate

IDS = ("good", "a", "b", "c", "d")
ORDER = np.array([0, 1, 2])  # what would be shown: good, a, b
RANKED = np.array([0, 3, 1, 2, 4])  # all candidates by fused score: c is the best one not shown


def _always(**kw) -> RepeatDiscovery:
    d = RepeatDiscovery(max_rate=1.0, seed=0, **kw)
    for _ in range(20):
        d.observe(True)
    return d


def _explore_good_on_top(d: RepeatDiscovery) -> ExplorationResult:
    # an eligible decision: "good" known good on top, asked three times before
    res = d.explore(ORDER, RANKED, IDS, {"good": 1.0}, asks=3)
    assert res is not None
    return res


def test_puts_the_best_unknown_chunk_first_with_its_propensity():
    d = _always()
    res = d.explore(ORDER, RANKED, IDS, {"good": 0.5, "a": -0.3}, asks=3)
    assert res is not None and res.explored
    assert [IDS[i] for i in res.order] == ["c", "good", "a"]  # same length, the rest shifted down
    assert res.propensity == pytest.approx(d.rate)


def test_not_eligible_without_repeats_or_a_known_good_chunk_on_top():
    d = _always()
    assert d.explore(ORDER, RANKED, IDS, {"good": 0.5}, asks=2) is None  # asked twice before
    assert d.explore(ORDER, RANKED, IDS, {"good": -0.1}, asks=5) is None  # nothing known to be good
    assert d.explore(ORDER, RANKED, IDS, {"a": 0.5}, asks=5) is None  # top is already not known good
    known_all = {c: 0.1 for c in IDS}
    assert d.explore(ORDER, RANKED, IDS, known_all, asks=5) is None  # nothing unknown left
    off = RepeatDiscovery(max_rate=0.0)
    assert off.explore(ORDER, RANKED, IDS, {"good": 0.5}, asks=5) is None


def test_rate_is_the_beta_one_one_mean_of_the_clicks_seen():
    # the estimate was (hits + 1) / (tries + 1): 1.0 before any feedback, and a third after two misses
    d = RepeatDiscovery(max_rate=1.0, scale=1.0, forget=1.0)
    assert d.rate == 0.5
    d.observe(False)
    d.observe(False)
    assert d.rate == 0.25
    d.observe(True)
    assert d.rate == 0.4


def test_rate_follows_the_click_rate_of_unknown_top_chunks():
    d = RepeatDiscovery(max_rate=0.5, scale=2.0)
    assert d.rate == 0.5  # Beta(1, 1): 2 x 1/2, at the cap
    for _ in range(40):
        d.observe(False)
    low = d.rate
    assert low < 0.1
    for _ in range(40):
        d.observe(True)
    assert d.rate > low and d.rate <= 0.5
    # when it does not explore, the decision's propensity is that of not exploring
    rng_d = RepeatDiscovery(max_rate=0.5, seed=3)
    for _ in range(200):
        rng_d.observe(False)
    outcomes = [_explore_good_on_top(rng_d) for _ in range(200)]
    stay = [r for r in outcomes if not r.explored]
    assert stay and all(r.propensity == pytest.approx(1.0 - rng_d.rate) for r in stay)
    assert all(r.order.tolist() == ORDER.tolist() for r in stay)
    assert 0 < sum(r.explored for r in outcomes) < 40


def test_state_round_trips_and_rejects_damage():
    d = RepeatDiscovery(seed=5)
    for clicked in (True, False, False, True, False):
        d.observe(clicked)
    state = json.loads(json.dumps(d.state_dict()))
    e = RepeatDiscovery(seed=99).load_state_dict(state)
    assert e.rate == d.rate
    a = [_explore_good_on_top(d).order.tolist() for _ in range(20)]
    b = [_explore_good_on_top(e).order.tolist() for _ in range(20)]
    assert a == b  # the generator's state travels too
    for bad in ({**state, "hits": 9.0}, {**state, "tries": float("nan")}, {**state, "kind": "epsilon"},
                {k: v for k, v in state.items() if k != "rng"}):
        with pytest.raises(CorruptStateError):
            RepeatDiscovery().load_state_dict(bad)


@pytest.mark.parametrize("kwargs", [{"max_rate": 1.5}, {"scale": 0.0}, {"min_asks": -1}, {"depth": 0},
                                    {"forget": 0.1}])
def test_bad_settings_raise(kwargs):
    with pytest.raises(ValidationError):
        RepeatDiscovery(**kwargs)


@pytest.mark.parametrize("seed", [1.5, -1, "0"])
def test_a_bad_seed_is_a_validation_error(seed):
    with pytest.raises(ValidationError, match="seed"):  # numpy's TypeError or ValueError before
        RepeatDiscovery(seed=seed)


def test_memory_counts_asks_and_keeps_them_in_its_state():
    mem = FeedbackMemory()
    assert mem.note_ask("Tides?") == 0 and mem.asks("tides") == 0  # not remembered: not counted
    mem.update("tides", None, ["c1", "c2"], [-0.3, 0.4])
    assert mem.note_ask("Tides?") == 0 and mem.note_ask("tides") == 1 and mem.asks("TIDES") == 2
    assert mem.known("tides") == {"c1": -0.3, "c2": 0.4} and mem.known("waves") == {}
    state = json.loads(json.dumps(mem.state_dict()))
    assert FeedbackMemory().load_state_dict(state).asks("tides") == 2
    # a state saved before asks were counted (and before the memory was saved column by column)
    old = {**{k: v for k, v in state.items() if k not in ("queries", "counts", "chunks", "values", "clock",
                                                          "embedded", "embeddings")},
           "entries": [{"q": "tides", "e": None, "v": {"c1": -0.3, "c2": 0.4}, "t": 0.0, "u": 1.0}]}
    assert FeedbackMemory().load_state_dict(old).asks("tides") == 0
    old["entries"][0]["a"] = -1.0
    with pytest.raises(CorruptStateError):
        FeedbackMemory().load_state_dict(old)
    clock = np.frombuffer(base64.b64decode(state["clock"]), dtype="<f8").copy()
    clock[2] = -1.0  # the asks column
    with pytest.raises(CorruptStateError):
        FeedbackMemory().load_state_dict({**state, "clock": base64.b64encode(clock.tobytes()).decode("ascii")})


def _known_relevant(learner: Learner, env: ToyEnv) -> float:
    counts = []
    for tq in env.queries:
        known = learner.memory.known(tq.text)
        counts.append(sum(1 for c, v in known.items() if v > 0 and tq.relevant[tq.ids.index(c)]))
    return float(np.mean(counts))


def test_repeated_questions_find_more_of_their_relevant_chunks():
    # 10 questions with 10 relevant chunks each, each asked about 40 times
    env = ToyEnv(seed=0, n_queries=10, n_relevant=10)
    runs = {}
    for rate in (0.0, 0.5):
        learner = Learner(RETRIEVERS, "fixed", LearnerConfig(discovery_rate=rate), seed=1)
        online = simulate(learner, env, 400, seed=3)
        greedy = np.mean([env.ndcg(q, learner.rank(env.context(q), 10, explore=False).order)
                          for q in range(len(env.queries))])
        runs[rate] = (_known_relevant(learner, env), greedy, np.mean(online))
    (k0, g0, o0), (k1, g1, o1) = runs[0.0], runs[0.5]
    assert k1 > k0 + 2.0, runs  # relevant chunks the memory knows per question: 4.6 without, 8.2 with
    assert g1 > g0 + 0.05, runs  # greedy nDCG@10 of the repeated questions: 0.73 -> 0.88
    assert o1 > o0 - 0.02, runs  # and what users saw on the way did not get worse


def test_discovery_backs_off_where_unknown_chunks_are_not_clicked():
    # one relevant chunk per question: once the memory shows it, nothing unknown is worth a click
    env = ToyEnv(seed=0, n_queries=10, n_relevant=1)
    learner = Learner(RETRIEVERS, "fixed", LearnerConfig(), seed=1)
    simulate(learner, env, 400, seed=3)
    assert learner.discovery.rate < 0.25
    # its state travels with the learner's
    state = json.loads(json.dumps(learner.state_dict()))
    assert Learner.from_state_dict(state).discovery.rate == learner.discovery.rate
    old = {k: v for k, v in state.items() if k != "discovery"}  # saved before discovery existed
    assert Learner.from_state_dict(old).discovery.rate == RepeatDiscovery().rate


def test_discovery_is_off_without_memory_or_exploration():
    env = ToyEnv(seed=0, n_queries=4, n_relevant=10)
    for config in (LearnerConfig(memory_weight=0.0), LearnerConfig(exploration="none")):
        learner = Learner(RETRIEVERS, "fixed", config, seed=1)
        simulate(learner, env, 100, seed=3, explore=True)
        assert learner.discovery.state_dict()["tries"] == 0.0
        if config.exploration == "none":  # every question is a repeat by now, and none is explored
            for q in range(len(env.queries)):
                greedy = learner.rank(env.context(q), 10, explore=False).order.tolist()
                for _ in range(10):
                    r = learner.rank(env.context(q), 10, explore=True)
                    assert not r.decision.explored and r.order.tolist() == greedy


def test_praise_of_the_whole_answer_is_not_a_click_on_its_top_chunk():
    # the discovery rate is the click rate of unknown top chunks; a thumbs up on the answer spreads its
    # reward over every chunk used, the top one too, and was counted as a click on it
    names = ("bm25", "dense")
    ids = ("good", "u1", "u2", "u3")
    scores = np.array([[0.9, 0.9], [0.8, 0.8], [0.7, 0.7], [0.6, 0.6]])
    learner = Learner(names, policy="fixed", config={"exploration": "epsilon", "epsilon": 0.0, "epsilon_min": 0.0})
    ctx = Context(query="q", retrievers=names, candidate_ids=ids, raw=scores, normalized=scores)

    def episode(eid: str, order: list[int], rewards: list[float], response_level: bool) -> Episode:
        return Episode(eid, "q", names, learner.rank(ctx, 4, explore=False).decision,
                       tuple(ids[i] for i in order), scores[order], np.array(rewards), max(rewards),
                       response_level=response_level)

    learner.learn(episode("e0", [0, 1, 2, 3], [0.4, 0.0, 0.0, 0.0], False))  # the memory knows "good"
    for _ in range(4):
        learner.rank(ctx, 4)
    before = learner.discovery.state_dict()
    # a thumbs up on an answer written from the top three, unknown u1 on top
    learner.learn(episode("e1", [1, 0, 2, 3], [1.0, 1.0, 1.0, 0.0], True))
    assert learner.discovery.state_dict() == before
    # the thumbs up taught the memory the answer's chunks: a click on u3, still unknown, on top is a click
    learner.learn(episode("e2", [3, 0, 1, 2], [0.4, 0.0, 0.0, 0.0], False))
    assert learner.discovery.state_dict() != before


def test_discovery_skips_a_chunk_the_memory_knows_to_be_bad_as_well_as_a_good_one() -> None:
    # "unknown" read as "no positive evidence": a chunk the users had passed over (negative evidence) was moved
    # to the top as a discovery
    discovery = RepeatDiscovery(max_rate=1.0, seed=0)
    for _ in range(8):
        discovery.observe(clicked=True)
    ids = ["good", "bad", "new"]
    moved = discovery.explore(np.array([0, 1, 2]), np.array([0, 1, 2]), ids, {"good": 0.8, "bad": -0.3}, asks=3)
    assert moved is not None and moved.explored
    assert ids[int(moved.order[0])] == "new"


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_a_question_with_only_zero_evidence_is_not_eligible_for_discovery() -> None:
    # Bug guarded: eligibility took evidence of 0 as something known to be good.
    assert RepeatDiscovery().eligible({"a": 0.0}, asks=5) is False


def test_discovery_looks_for_an_unknown_chunk_only_within_its_depth() -> None:
    # Bug guarded: discovery ignored depth and picked an unknown chunk from anywhere in the ranking.
    discovery = RepeatDiscovery(max_rate=1.0, depth=2, seed=0)
    for _ in range(20):
        discovery.observe(True)
    assert discovery.explore(np.array([0, 1]), np.array([0, 1, 2]), ["k", "k2", "u"], {"k": 0.8, "k2": 0.5},
                             asks=5) is None


def test_discovery_forgets_its_old_tries_as_well_as_its_old_hits() -> None:
    # Bug guarded: tries were never forgotten while hits were, so the rate could not recover from early misses.
    discovery = RepeatDiscovery(max_rate=1.0, forget=0.5)
    for _ in range(10):
        discovery.observe(False)
    for _ in range(10):
        discovery.observe(True)
    assert discovery.rate == 1.0
