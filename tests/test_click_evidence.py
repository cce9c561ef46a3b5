"""Counterfactual click evidence: every arm scored on every click, variance clustered by query."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlfb.errors import CorruptStateError, NonFiniteValueError
from rlfb.policies.base import Decision, Episode
from rlfb.policies.click_evidence import ClickEvidence, shown_utility
from rlfb.policies.thompson import ThompsonPolicy

NAMES = ("a", "b")


def _click_episode(query: str, rng: np.random.Generator) -> Episode:
    """Equal weights showed ten chunks; the clicked one is where retriever ``b`` scores highest."""
    X = rng.uniform(0.0, 1.0, (10, 2))
    order = np.argsort(-(X @ [0.5, 0.5]), kind="stable")
    X = X[order]
    rewards = np.zeros(10)
    rewards[int(np.argmax(X[:, 1]))] = 0.4
    return Episode(
        event_id=f"e-{query}", query=query, retrievers=NAMES,
        decision=Decision({"a": 0.5, "b": 0.5}, arm="default", propensity=1.0),
        shown_ids=tuple(f"{query}-{i}" for i in range(10)), shown=X, chunk_rewards=rewards, reward=0.4,
    )


def test_shown_utility_is_dcg_of_the_clicked_chunk_in_each_arms_order() -> None:
    scores = np.array([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9]])
    u = shown_utility(np.array([0.0, 0.0, 1.0]), scores)
    assert u.tolist() == pytest.approx([1 / np.log2(4), 1.0])


def test_clicks_from_many_questions_move_the_weights_towards_the_retriever_that_finds_them() -> None:
    rng = np.random.default_rng(0)
    policy = ThompsonPolicy(NAMES, step=0.1, seed=0)
    for i in range(300):
        policy.learn(_click_episode(f"question {i % 60}", rng), 0.4)
    w = policy.weights()
    assert w["b"] > 0.6, w
    # nothing else was clicked: with counterfactual=False the bandit alone would not have moved yet
    plain = ThompsonPolicy(NAMES, step=0.1, seed=0, counterfactual=False)
    for i in range(300):
        plain.learn(_click_episode(f"question {i % 60}", rng), 0.4)
    assert plain.weights()["b"] < w["b"]


def test_one_question_clicked_many_times_is_not_evidence_enough() -> None:
    rng = np.random.default_rng(1)
    policy = ThompsonPolicy(NAMES, step=0.1, seed=0)
    for _ in range(300):
        policy.learn(_click_episode("the same question", rng), 0.4)
    assert policy.weights() == pytest.approx({"a": 0.5, "b": 0.5})


def test_click_evidence_round_trips_through_json_and_rejects_corrupt_state() -> None:
    rng = np.random.default_rng(2)
    policy = ThompsonPolicy(NAMES, step=0.1, seed=0)
    for i in range(100):
        policy.learn(_click_episode(f"q{i % 20}", rng), 0.4)
    state = json.loads(json.dumps(policy.state_dict()))
    again = ThompsonPolicy(NAMES, step=0.1, seed=0).load_state_dict(state)
    assert again.weights() == policy.weights()
    bad = json.loads(json.dumps(state))
    bad["state"]["clicks"]["*"]["s"] = [1.0]
    with pytest.raises(CorruptStateError):
        ThompsonPolicy(NAMES, step=0.1, seed=0).load_state_dict(bad)
    # damage that had loaded as "no clicks yet", resetting the weights silently: a null in place of the
    # evidence, and a weight below its questions' (n = 0 read as no clicks, the gate shut)
    nulled = json.loads(json.dumps(state))
    nulled["state"]["clicks"] = None
    with pytest.raises(CorruptStateError, match="click evidence"):
        ThompsonPolicy(NAMES, step=0.1, seed=0).load_state_dict(nulled)
    emptied = json.loads(json.dumps(state))
    emptied["state"]["clicks"]["*"]["n"] = 0.0
    with pytest.raises(CorruptStateError, match="below its questions"):
        ThompsonPolicy(NAMES, step=0.1, seed=0).load_state_dict(emptied)
    older = json.loads(json.dumps(state))  # saved before clicks counted: no key at all, which still loads
    del older["state"]["clicks"]
    loaded = ThompsonPolicy(NAMES, step=0.1, seed=0).load_state_dict(older)
    assert loaded.weights() == {"a": 0.5, "b": 0.5}


def test_a_click_evidence_clock_far_in_the_future_is_refused() -> None:
    # a clock of 1e15 loaded, and every later click then counted as long past
    ev = ClickEvidence(3)
    before = json.dumps(ev.state_dict())
    with pytest.raises(CorruptStateError, match="future"):
        ev.load_state_dict({**ev.state_dict(), "clock": 1e15})
    assert json.dumps(ev.state_dict()) == before
    assert ev.load_state_dict({**ev.state_dict(), "clock": 1.7e9}).clock == 1.7e9


def test_a_reloaded_click_evidence_is_bit_for_bit_the_one_saved() -> None:
    # the save listed queries least recently used first and the load renumbered their rows in that order, so
    # the clustered variance summed them otherwise: 2e-18 apart, enough to flip an exact tie at the gate
    rng = np.random.default_rng(5)
    ev = ClickEvidence(66, max_queries=30)
    for _ in range(600):  # asked again out of row order, and evicted
        ev.update(rng.random(66) * rng.integers(0, 2), f"q{rng.integers(40)}", 1.0, 0.999)
    again = ClickEvidence(66, max_queries=30).load_state_dict(json.loads(json.dumps(ev.state_dict())))
    for a, b in zip(ev.posterior(), again.posterior(), strict=True):
        assert a.tobytes() == b.tobytes()
    # saves from before the rows were one base64 block: each query's row as a list, with its place (loads bit for
    # bit), or without (saved before places were kept: loads in the order saved)
    listed = {k: v for k, v in ev.state_dict().items() if k not in ("rows", "places")}
    listed["queries"] = [[key, ev._q[r].tolist(), r] for key, r in ev._rows.items()]
    again = ClickEvidence(66, max_queries=30).load_state_dict(json.loads(json.dumps(listed)))
    for a, b in zip(ev.posterior(), again.posterior(), strict=True):
        assert a.tobytes() == b.tobytes()
    oldest = {**listed, "queries": [item[:2] for item in listed["queries"]]}
    assert ClickEvidence(66, max_queries=30).load_state_dict(oldest).n_queries == ev.n_queries


def test_the_rows_are_saved_in_one_block_at_about_half_the_size() -> None:
    # each query's row was a JSON list of 67 floats, saved after every feedback: 36 MB at the caps of 13 query types
    import base64

    rng = np.random.default_rng(6)
    ev = ClickEvidence(66, max_queries=200)
    for i in range(200):
        ev.update(rng.random(66), f"q{i}", 1.0, 0.999)
    state = ev.state_dict()
    listed = {**state, "queries": [[key, ev._q[r].tolist(), r] for key, r in ev._rows.items()]}
    del listed["rows"], listed["places"]
    assert len(json.dumps(state)) < 0.6 * len(json.dumps(listed))
    for bad in ("not base64!", base64.b64encode(b"\0" * 8).decode()):  # damaged; one float for 200 rows
        with pytest.raises(CorruptStateError):
            ClickEvidence(66, max_queries=200).load_state_dict({**state, "rows": bad})
    with pytest.raises(CorruptStateError):  # two queries on one row
        ClickEvidence(66, max_queries=200).load_state_dict(
            {**state, "places": [0] * len(state["places"])})
    nan = np.frombuffer(base64.b64decode(state["rows"]), dtype="<f8").copy()
    nan[3] = np.nan
    with pytest.raises(CorruptStateError):
        ClickEvidence(66, max_queries=200).load_state_dict({**state, "rows": base64.b64encode(nan.tobytes()).decode()})


# click evidence saved by the code of 2026-12-04 (a [query, row] pair each): three questions, one forgotten, asked
# out of row order
_PAIRS = json.loads("""{"n": 5.217031, "s": [2.6085155, 3.5219793333333334], "clock": 0.0,
 "gone": [0.0, 0.007893632574529125], "queries": [["q3", 1], ["q1", 2], ["q0", 0]],
 "rows": "4ExMF2IV8j/2S7GQpif5P+BMTBdiFQJA7FG4HoXr2T82XrpJDALjP+xRuB6F6+k/zczMzMzM3D8AAAAAAADoP83MzMzMzOw/"}""")


def test_the_queries_are_saved_as_two_lists_and_the_layout_saved_before_loads() -> None:
    # a [query, row] pair per query was thousands of small lists, built and collected again after every feedback
    rng = np.random.default_rng(7)
    ev = ClickEvidence(66, max_queries=30)
    for _ in range(600):
        ev.update(rng.random(66) * rng.integers(0, 2), f"q{rng.integers(40)}", 1.0, 0.999)
    state = json.loads(json.dumps(ev.state_dict()))
    assert state["queries"] == list(ev._rows) and state["places"] == list(ev._rows.values())
    assert all(isinstance(x, str) for x in state["queries"]) and sorted(state["places"]) == list(range(30))
    again = ClickEvidence(66, max_queries=30).load_state_dict(state)
    assert list(again._rows.items()) == list(ev._rows.items()) and again.state_dict() == state
    for a, b in zip(ev.posterior(), again.posterior(), strict=True):
        assert a.tobytes() == b.tobytes()
    # the pairs of 2026-12-04 load to the same evidence, bit for bit, and save again as two lists
    old = ClickEvidence(2, max_queries=3).load_state_dict(json.loads(json.dumps(_PAIRS)))
    assert list(old._rows.items()) == [("q3", 1), ("q1", 2), ("q0", 0)]
    adv, var = old.posterior()
    assert adv.tolist() == [0.0, 0.17509265966281073] and [v.hex() for v in var.tolist()] == [
        "0x1.19799812dea11p-40", "0x1.a1cb9280be473p-10"]
    resaved = old.state_dict()
    assert resaved["queries"] == ["q3", "q1", "q0"] and resaved["places"] == [1, 2, 0]
    assert resaved["rows"] == _PAIRS["rows"]
    # a damaged one is refused and changes nothing
    for bad in ({"places": state["places"][:-1]}, {"places": [*state["places"][:-1], 30]},
                {"places": [True, *state["places"][1:]]}, {"places": None}, {"queries": state["queries"][:-1]},
                {"queries": [7, *state["queries"][1:]]}, {"queries": "q1"}, {"rows": 5},
                {"places": [state["places"][0], *state["places"][:-1]]}):
        before = json.dumps(old.state_dict())
        with pytest.raises(CorruptStateError):
            old.load_state_dict({**state, **bad})
        assert json.dumps(old.state_dict()) == before


def test_a_non_finite_row_is_refused_at_save() -> None:
    # the store refused it in JSON; in the base64 block it would be written, and every later load refused
    ev = ClickEvidence(2)
    ev.update(np.array([0.5, 1.0]), "tides", 1.0, 1.0)
    ev._q[0, 1] = np.inf
    with pytest.raises(NonFiniteValueError):
        ev.state_dict()


def test_forgotten_questions_keep_their_share_of_the_variance() -> None:
    ev = ClickEvidence(2, max_queries=3)
    for i in range(10):
        ev.update(np.array([0.5, 0.5 + 0.1 * (i % 2)]), f"q{i}", 1.0, 1.0)
    assert ev.n_queries == 3
    adv, var = ev.posterior()
    assert adv[1] == pytest.approx(0.05) and np.isfinite(var[1]) and var[1] > 0


def test_forgetting_the_past_alike_leaves_the_variance_of_the_advantage_as_it_was() -> None:
    # a forgotten question's share of the variance decayed by the decay, not its square as the kept questions'
    # squared residuals do: after every forgetting step the forgotten questions weighed more than the kept ones
    ev = ClickEvidence(2, max_queries=2)
    for query, utility in (("q1", [0.5, 1.0]), ("q2", [0.5, 0.0]), ("q3", [0.5, 0.7])):
        ev.update(np.array(utility), query, 1.0, 1.0)
    assert ev.n_queries == 2 and ev.state_dict()["gone"][1] > 0  # q1 was forgotten, its share kept
    adv, var = (x.copy() for x in ev.posterior())
    ev.update(np.array([0.5, 0.9]), "q3", 0.0, 0.5)  # the past halved, nothing new
    assert ev.posterior()[0].tolist() == adv.tolist() and ev.posterior()[1].tolist() == var.tolist()


def test_feedback_without_clicks_ages_the_click_evidence_until_the_gate_shuts_again() -> None:
    # a world that stops showing anything worth a click (thumbs down only) must not keep months-old click
    # evidence whole: it decays on the clock at every feedback, falls below cf_min_clicks, and the default
    # weights come back (an audit found them held at 0.05/0.95 through 400 days of thumbs down)
    policy = ThompsonPolicy(("bm25", "dense"), seed=0)
    X = np.array([[1.0, 0.0], [0.0, 1.0]])
    t0 = 1.7e9
    for i in range(40):
        policy.learn(Episode(f"e{i}", f"q{i}", ("bm25", "dense"), Decision({"bm25": 0.5, "dense": 0.5},
                                                                            arm="default"),
                             ("a", "b"), X, np.array([0.0, 0.4]), 0.4, timestamp=t0 + 60 * i), 0.4)
    moved = policy.decide(None, explore=False)
    assert moved.weights["dense"] > 0.9
    clicks = policy.state_dict()["state"]["clicks"]["*"]["n"]
    # 45 days of thumbs down: one half-life, and the evidence is below the gate's 20 clicks
    for i in range(45):
        policy.learn(Episode(f"n{i}", f"z{i}", ("bm25", "dense"), moved, ("a", "b"), X, np.array([-1.0, -1.0]),
                             -1.0, timestamp=t0 + 2400 + (i + 1) * 86_400), -1.0)
    aged = policy.state_dict()["state"]["clicks"]["*"]["n"]
    assert aged == pytest.approx(clicks * 0.5, rel=0.01)
    assert policy.decide(None, explore=False).weights == {"bm25": 0.5, "dense": 0.5}


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_click_evidence_forgets_the_least_recently_used_question() -> None:
    """Bug guarded: at max_queries the most recently used question was forgotten, not the least."""
    ev = ClickEvidence(2, max_queries=2)
    for q in ("q1", "q2", "q1", "q3"):
        ev.update(np.array([0.5, 1.0]), q, 1.0, 1.0)
    assert ev.state_dict()["queries"] == ["q1", "q3"]


TR = ("bm25", "dense", "splade")


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
