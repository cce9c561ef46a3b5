"""Chunk confidence, feedback memory, replay, chunk exploration and the guardrail, one by one."""

from __future__ import annotations

import base64
import dataclasses
import json
import math

import numpy as np
import pytest

from rlfb.confidence import ChunkConfidence
from rlfb.credit import chunk_evidence, shared_credit
from rlfb.discovery import RepeatDiscovery
from rlfb.errors import CorruptStateError, NonFiniteValueError, ValidationError
from rlfb.exploration import EpsilonGreedyExploration, ThompsonChunkExploration
from rlfb.guardrail import Guardrail
from rlfb.memory import FeedbackMemory, normalize_query
from rlfb.policies.base import Decision, Episode
from rlfb.replay import PrioritizedReplay, episode_from_dict, episode_to_dict, inclusion_probabilities

DAY = 86_400.0


def _unit(v):
    v = np.asarray(v, dtype=float)
    return v / np.linalg.norm(v)


def _ep(eid, reward, *, t=0.0, n=2):
    return Episode(eid, f"query {eid}", ("a", "b"), Decision({"a": 0.5, "b": 0.5}, arm="default"),
                   tuple(f"c{i}" for i in range(n)), np.ones((n, 2)) * 0.5, np.full(n, reward), reward,
                   timestamp=t, query_embedding=np.ones(4, dtype=np.float32))


# ---------------------------------------------------------------------------- evidence


def test_chunk_evidence_reads_clicks_skips_and_abandonment():
    assert chunk_evidence(np.array([0.0, 0.4, 0.0, 0.0]), 0.4, 0.2, 0.1).tolist() == [-0.2, 0.4, 0.0, 0.0]
    assert chunk_evidence(np.array([0.0, 0.0]), -0.5, 0.2, 0.2).tolist() == [-0.1, -0.1]
    assert chunk_evidence(np.array([0.0, 0.0]), 0.0, 0.2, 0.1).tolist() == [0.0, 0.0]
    assert chunk_evidence(np.array([-1.0, 0.0, 1.0]), 0.0, 0.2, 0.1).tolist() == [-1.0, -0.2, 1.0]


def test_praise_of_a_whole_answer_is_shared_but_a_skip_beside_it_stays_whole():
    # every non-zero evidence was divided: a skipped chunk beside a thumbs up on two others counted -0.1, not -0.2
    assert shared_credit(np.array([-0.2, 1.0, 1.0]), np.array([0.0, 1.0, 1.0])).tolist() == [-0.2, 0.5, 0.5]


# ---------------------------------------------------------------------------- confidence


def test_confidence_updates_are_small_and_bounded():
    conf = ChunkConfidence(learning_rate=0.05, half_life_days=None)
    conf.update(["a", "b", "c"], [1.0, -1.0, 0.0], [1.0, 1.0, 1.0])
    assert conf.confidence(["a", "b", "c", "z"]).tolist() == pytest.approx([5.05, 4.95, 5.0, 5.0])
    assert len(conf) == 2  # a zero reward does not even create an entry
    for _ in range(500):
        conf.update(["a", "b"], [1.0, -1.0])
    assert conf.confidence(["a", "b"]).tolist() == [10.0, 1.0]
    assert conf.feature(["a", "b", "unseen"]).tolist() == [1.0, -1.0, 0.0]
    a, b = conf.posterior(["a", "b", "unseen"])
    assert a.tolist() == [502.0, 1.0, 1.0] and b.tolist() == [1.0, 502.0, 1.0]
    assert conf.uncertainty(["unseen"])[0] == 1.0 and conf.uncertainty(["a"])[0] < 0.1
    # relevance scales the step (reward x learning rate x relevance)
    c2 = ChunkConfidence(learning_rate=0.02)
    c2.update(["x"], [0.5], [0.5])
    assert c2.confidence(["x"])[0] == pytest.approx(5.0 + 0.5 * 0.02 * 0.5)


def test_confidence_relevance_outside_zero_to_one_counts_as_its_bound():
    # relevance was not clipped: a relevance of 3 tripled the step and a negative one turned praise into blame
    conf = ChunkConfidence(learning_rate=0.02)
    conf.update(["x", "y"], [1.0, 1.0], [3.0, -1.0])
    assert conf.confidence(["x", "y"]).tolist() == [5.0 + 0.02, 5.0]


@pytest.mark.parametrize("lr", [0.0, 0.009, 0.051, 1.0, float("nan")])
def test_confidence_learning_rate_is_validated(lr):
    with pytest.raises(ValidationError):
        ChunkConfidence(learning_rate=lr)


def test_confidence_bad_settings_and_inputs():
    with pytest.raises(ValidationError):
        ChunkConfidence(initial=11.0)
    with pytest.raises(ValidationError):
        ChunkConfidence(half_life_days=-1.0)
    conf = ChunkConfidence()
    with pytest.raises(ValidationError):
        conf.update(["a"], [1.0, 1.0])
    with pytest.raises(ValidationError):
        conf.update(["a"], [float("nan")])


def test_confidence_forgets_with_time():
    conf = ChunkConfidence(learning_rate=0.05, half_life_days=10.0)
    for _ in range(20):
        conf.update(["a"], [1.0], timestamp=1000.0)
    lifted = conf.confidence(["a"])[0] - 5.0
    conf.update(["b"], [1.0], timestamp=1000.0 + 10 * DAY)  # time moves on
    assert conf.confidence(["a"])[0] - 5.0 == pytest.approx(lifted / 2)
    a, _ = conf.posterior(["a"])
    assert a[0] == pytest.approx(1.0 + 20 / 2)


def test_confidence_takes_late_feedback_as_decayed_as_it_would_be_in_time_order():
    # feedback on a 90-day-old retrieval, learned after a newer one, counted whole: four times what it would
    # have counted in time order (a 45-day half-life)
    def learned(order):
        conf = ChunkConfidence(learning_rate=0.05, half_life_days=45.0)
        for t in order:
            conf.update(["a"], [1.0], timestamp=t)
        return conf.confidence(["a"])[0], conf.posterior(["a"])[0][0]

    in_order, late = learned([DAY, 91 * DAY]), learned([91 * DAY, DAY])
    assert late == pytest.approx(in_order)
    assert in_order[1] == pytest.approx(1.0 + 1.25)  # the prior's 1, the newer click's 1, the older's 1/4


def _confidence_rows(state):
    return np.frombuffer(base64.b64decode(state["rows"]), dtype="<f8").reshape(-1, 4)


def _with_rows(state, rows):
    return {**state, "rows": base64.b64encode(np.asarray(rows, dtype="<f8").tobytes()).decode("ascii")}


def test_confidence_state_round_trip_and_damage():
    conf = ChunkConfidence()
    conf.update(["a", "b"], [1.0, -0.5], [0.8, 0.3], timestamp=5.0)
    state = json.loads(json.dumps(conf.state_dict(), allow_nan=False))
    back = ChunkConfidence().load_state_dict(state)
    assert back.confidence(["a", "b"]).tolist() == conf.confidence(["a", "b"]).tolist()
    rows = _confidence_rows(state)
    damaged = [
        {**state, "ids": ["a", "a"]},
        _with_rows(state, np.where(np.arange(4) == 0, 50.0, rows)),  # a confidence out of range
        _with_rows(state, np.where(np.arange(4) == 1, 0.0, rows)),  # alpha 0
        _with_rows(state, np.where(np.arange(4) == 3, np.inf, rows)),
        _with_rows(state, rows[:1]),  # a row short of the ids
        _with_rows(state, np.append(rows.ravel(), 1.0)),  # not whole rows
        {**state, "rows": state["rows"][:-4]},  # base64 of a partial number
        {**state, "rows": "not base64!"},
        {**state, "rows": [1.0, 2.0]},
    ]
    for bad in damaged:
        fresh = ChunkConfidence()
        fresh.update(["c"], [1.0], timestamp=1.0)
        before = json.dumps(fresh.state_dict())
        with pytest.raises(CorruptStateError):
            fresh.load_state_dict(bad)
        assert json.dumps(fresh.state_dict()) == before


def test_confidence_state_is_one_block_that_round_trips_bit_for_bit_and_loads_the_layout_saved_before():
    rng = np.random.default_rng(0)
    conf = ChunkConfidence()
    for i in range(200):
        ids = [f"chunk-{j}" for j in rng.choice(300, size=5, replace=False)]
        conf.update(ids, rng.normal(0, 0.5, size=5) / 3, rng.random(5), timestamp=1e6 + i * 3600.0)
    state = json.loads(json.dumps(conf.state_dict(), allow_nan=False))
    n = len(state["ids"])
    assert set(state) == {"params", "now", "ids", "rows"} and _confidence_rows(state).shape == (n, 4)
    back = ChunkConfidence().load_state_dict(state)
    assert back.state_dict() == state
    ids = [*state["ids"], "never seen"]
    for read in (ChunkConfidence.confidence, ChunkConfidence.posterior):
        assert np.asarray(read(back, ids)).tobytes() == np.asarray(read(conf, ids)).tobytes()
    # the layout saved before 2026-12-05, a JSON list per column, loads as the same confidences
    rows = _confidence_rows(state)
    old = {k: v for k, v in state.items() if k != "rows"}
    old.update({k: rows[:, j].tolist() for j, k in enumerate(("confidence", "alpha", "beta", "time"))})
    assert ChunkConfidence().load_state_dict(json.loads(json.dumps(old))).state_dict() == state
    assert len(json.dumps(state)) < 0.75 * len(json.dumps(old))


# ---------------------------------------------------------------------------- memory


def test_memory_exact_repeat_and_negative_evidence():
    mem = FeedbackMemory()
    mem.update("What causes tides?", None, ["skip", "click", "below"], [-0.2, 0.4, 0.0])
    s = mem.score("what causes  TIDES", None, ["below", "click", "skip", "new"])
    assert s[1] == pytest.approx(np.tanh(0.4 / 0.3)) and s[2] == pytest.approx(np.tanh(-0.2 / 0.3))
    assert s[0] == 0.0 and s[3] == 0.0
    assert mem.has_exact("WHAT causes tides") and not mem.has_exact("tides")
    assert np.all(mem.score("something else", None, ["click"]) == 0)
    assert normalize_query("  Hello,   World!! ") == "hello, world"


def test_memory_keeps_questions_apart_that_differ_in_a_symbol_at_the_end():
    # every non-word character at the ends was stripped: feedback on "C++" was an exact repeat of "C" and "C#",
    # passed on at full strength with the transfer gate shut, and all punctuation-only queries were one
    mem = FeedbackMemory(transfer_gate=0.0)
    mem.update("Intro to C++", None, ["cpp", "c"], [0.4, -0.3])
    assert not mem.has_exact("Intro to C") and not mem.has_exact("Intro to C#")
    assert np.all(mem.score("Intro to C#", None, ["cpp", "c"]) == 0)
    assert mem.has_exact("¿intro to C++?") and mem.has_exact("«Intro to C++»")
    assert normalize_query("what is 50%?") == "what is 50%" and normalize_query("「极光」") == "极光"
    assert normalize_query("???") != normalize_query("!!!")


def test_a_question_is_one_key_however_its_accents_were_typed_and_a_leading_dot_names_a_thing():
    # an NFD question (accents as combining marks) had a key of its own, so its repeats found no feedback;
    # ".NET" lost its dot and became the question "NET"
    import unicodedata

    mem = FeedbackMemory()
    mem.update("Qu'est-ce que la marée ?", None, ["a"], [0.8])
    assert mem.known(unicodedata.normalize("NFD", "Qu'est-ce que la marée ?")) == {"a": 0.8}
    assert normalize_query(".NET?") == ".net" != normalize_query("NET?")
    assert normalize_query("... and the tides?") == normalize_query("and the tides")


def test_a_blank_question_is_neither_remembered_nor_recalled():
    # blank questions all had the key "" (and "???" one of its own): feedback on one was recalled for every
    # other, and a blank question's embedding found its neighbours' evidence too
    e = _unit([1, 0, 0, 0])
    mem = FeedbackMemory(transfer_gate=1.0)
    mem.update("tides", e, ["a", "b"], [0.8, -0.2])
    for blank in ("", "   ", "???", "¿?", " … "):
        mem.update(blank, e, ["c"], [0.8])
        assert not mem.has_exact(blank) and mem.known(blank) == {} and mem.asks(blank) == 0
        assert mem.note_ask(blank) == 0
        assert np.all(mem.score(blank, e, ["a", "b", "c"]) == 0)
        assert np.all(mem.transfer(blank, e, ["a", "b", "c"]) == 0)
    assert len(mem) == 1 and mem.known("tides") == {"a": 0.8, "b": -0.2}
    assert mem.score("tides!", e, ["a", "c"])[1] == 0.0


def test_memory_refuses_an_infinite_time():
    mem = FeedbackMemory()
    mem.update("tides", None, ["a"], [0.4], timestamp=1.7e9)
    with pytest.raises(ValidationError, match="finite"):
        mem.update("tides", None, ["a"], [0.4], timestamp=float("inf"))
    assert mem.known("tides") == {"a": 0.4}
    FeedbackMemory().load_state_dict(json.loads(json.dumps(mem.state_dict())))


@pytest.mark.parametrize("t", [float("inf"), float("nan"), "1.7e9", None])
def test_confidence_refuses_a_time_that_is_not_a_finite_number(t):
    # an infinite clock would decay every confidence to its prior; a string read as a float hid a caller's bug
    conf = ChunkConfidence()
    conf.update(["a"], [1.0], timestamp=1.7e9)
    before = conf.state_dict()
    with pytest.raises(ValidationError, match="timestamp"):
        conf.update(["a"], [1.0], timestamp=t)
    assert conf.state_dict() == before


def test_memory_transfer_by_similarity_with_a_fixed_gate():
    e1 = _unit([1, 0, 0, 0])
    close = _unit([1, 0.3, 0, 0])  # cosine about 0.96
    far = _unit([1, 1.2, 0, 0])  # cosine about 0.64
    mem = FeedbackMemory(similarity_threshold=0.8, transfer_gate=1.0)
    mem.update("q1", e1, ["a", "b"], [0.5, -0.2])
    s_close = mem.score("q2", close, ["a", "b"])
    assert s_close[0] > 0.3 and s_close[1] < 0
    gain = (float(close @ e1) - 0.8) / 0.2
    assert s_close[0] == pytest.approx(gain * np.tanh(0.5 / 0.3))
    assert np.all(mem.score("q3", far, ["a", "b"]) == 0)
    # an identical embedding counts as an exact repeat, whatever the gate
    shut = FeedbackMemory(transfer_gate=0.0)
    shut.update("q1", e1, ["a"], [0.5])
    assert shut.score("q1 reworded", e1, ["a"])[0] == pytest.approx(np.tanh(0.5 / 0.3))
    assert shut.score("q2", close, ["a"])[0] == 0.0
    with pytest.raises(ValidationError):
        mem.score("q", np.ones(3), ["a"])


def _feed_paraphrases(mem: FeedbackMemory, rng: np.random.Generator, n: int, helpful: bool, tag: str = "") -> None:
    """``n`` questions, each with a click, then a paraphrase of each whose click is on the same chunk (helpful)
    or on the other one (misleading)."""
    for i in range(n):
        base = _unit(rng.normal(size=8))
        para = _unit(base + 0.1 * rng.normal(size=8))
        good, bad = f"good{tag}{i}", f"bad{tag}{i}"
        mem.update(f"q{tag}{i}", base, [bad, good], [-0.2, 0.4])
        clicked, skipped = (good, bad) if helpful else (bad, good)
        mem.update(f"p{tag}{i}", para, [skipped, clicked], [-0.2, 0.4])


def test_adaptive_gate_opens_only_when_transfer_predicts_clicks():
    rng = np.random.default_rng(0)

    def run(helpful: bool) -> FeedbackMemory:
        mem = FeedbackMemory(similarity_threshold=0.8)
        assert mem.gate() == 0.0
        _feed_paraphrases(mem, rng, 150, helpful)
        return mem

    assert run(helpful=True).gate() == 1.0
    assert run(helpful=False).gate() == 0.0


def test_memory_evicts_the_least_recently_used_and_round_trips():
    mem = FeedbackMemory(max_entries=3)
    for i in range(3):
        mem.update(f"q{i}", _unit(np.eye(4)[i]), ["a"], [0.4], timestamp=10.0 + i)
    mem.score("q0", None, ["a"])  # a read is a use: q0 is now more recent than q2
    mem.update("q1", None, ["b"], [0.4])  # q1 used again
    mem.update("q3", _unit([0, 0, 0, 1]), ["c"], [0.4])
    assert len(mem) == 3 and not mem.has_exact("q2") and mem.has_exact("q0") and mem.has_exact("q1")
    assert mem.has_exact("q3")
    state = json.loads(json.dumps(mem.state_dict(), allow_nan=False))
    back = FeedbackMemory(max_entries=3).load_state_dict(state)
    for q, e in (("q1", None), ("q3", _unit([0, 0, 0, 1])), ("other", _unit([0, 0, 0, 1]))):
        assert back.score(q, e, ["a", "b", "c"]).tolist() == mem.score(q, e, ["a", "b", "c"]).tolist()
    bad = json.loads(json.dumps(state))
    bad["chunks"][0] = 7
    with pytest.raises(CorruptStateError):
        FeedbackMemory().load_state_dict(bad)
    bad = json.loads(json.dumps(state))
    bad["queries"][1] = bad["queries"][0]
    with pytest.raises(CorruptStateError, match="twice"):
        FeedbackMemory().load_state_dict(bad)


@pytest.mark.parametrize("dim", [10**12, 0, -4, 2.5, "4", True, 3])
def test_memory_refuses_a_damaged_dim_before_allocating(dim):
    # int(dim) took 10**12, and the array it sized failed with numpy's ArrayMemoryError; 3 is not the length
    # of the saved embedding
    mem = FeedbackMemory()
    mem.update("q0", _unit(np.eye(4)[0]), ["a"], [0.4])
    state = json.loads(json.dumps(mem.state_dict(), allow_nan=False))
    with pytest.raises(CorruptStateError, match="dim|wrong size"):
        FeedbackMemory().load_state_dict({**state, "dim": dim})
    # a memory whose embedded entries were all evicted keeps its dim
    without_entries = {**state, "queries": [], "counts": [], "chunks": [], "values": "", "clock": "", "embedded": [],
                       "embeddings": ""}
    assert FeedbackMemory().load_state_dict(without_entries).state_dict()["dim"] == 4
    if dim != 3:
        with pytest.raises(CorruptStateError, match="dim"):
            FeedbackMemory().load_state_dict({**without_entries, "dim": dim})


def test_memory_forgets_with_time():
    mem = FeedbackMemory(half_life_days=1.0)
    mem.update("q", None, ["a"], [0.3], timestamp=1000.0)
    fresh = mem.score("q", None, ["a"])[0]
    mem.update("other", None, ["b"], [0.3], timestamp=1000.0 + 2 * DAY)
    assert mem.score("q", None, ["a"])[0] == pytest.approx(np.tanh(np.arctanh(fresh) / 4))


def test_memory_takes_late_feedback_as_decayed_as_it_would_be_in_time_order():
    def remembered(order):
        mem = FeedbackMemory(half_life_days=1.0)
        for t in order:
            mem.update("q", None, ["a"], [0.3], timestamp=t)
        return mem.score("q", None, ["a"])[0]

    in_order = remembered([1000.0, 1000.0 + 2 * DAY])
    assert remembered([1000.0 + 2 * DAY, 1000.0]) == pytest.approx(in_order)
    assert in_order < remembered([1000.0 + 2 * DAY, 1000.0 + 2 * DAY])  # the older evidence counts a quarter


@pytest.mark.parametrize(
    "kwargs",
    [{"similarity_threshold": -0.1}, {"max_entries": 0}, {"value_scale": 0}, {"transfer_gate": "on"},
     {"transfer_gate": -0.5}, {"gate_full": 0.5}, {"exact_similarity": 0.5}],
)
def test_bad_memory_settings_raise(kwargs):
    with pytest.raises(ValidationError):
        FeedbackMemory(**kwargs)


def test_negative_evidence_on_a_chunk_stops_at_minus_max_value():
    # only the positive side was capped: thirty thumbs down left the chunk at -30, six times as far from neutral
    # as any amount of praise (+5) could take it
    mem = FeedbackMemory()
    for _ in range(30):
        mem.update("tides", None, ["c1"], [-1.0])
    assert mem.known("tides") == {"c1": -5.0}


def test_the_transfer_gate_opens_only_as_far_as_the_lower_bound_of_its_agreement_allows():
    # the gate used the agreement rate itself: two agreeing observations (3/4 with the prior) opened it fully
    mem = FeedbackMemory()
    state = mem.state_dict()
    state["gate_counts"] = [2.0, 0.0]
    phat = 3 / 4
    lcb = phat - math.sqrt(phat * (1 - phat) / 4)
    assert FeedbackMemory().load_state_dict(state).gate() == pytest.approx((lcb - 0.5) / 0.25)


def test_a_long_helpful_history_does_not_keep_the_gate_open_once_transfer_misleads():
    # the agreement count did not decay: 2000 helpful paraphrases outweighed for good the 1000 misleading ones
    # that followed, and the gate stayed open on transfer that now pointed at the wrong chunks
    rng = np.random.default_rng(0)
    mem = FeedbackMemory(similarity_threshold=0.8)
    _feed_paraphrases(mem, rng, 2000, True, "h")
    assert mem.gate() == 1.0
    _feed_paraphrases(mem, rng, 1000, False, "m")
    assert mem.gate() == 0.0


# ---------------------------------------------------------------------------- replay


def test_replay_keeps_rewarded_episodes_within_capacity():
    buf = PrioritizedReplay(capacity=5, batch_size=3, seed=0)
    assert not buf.add(_ep("zero", 0.0))
    for i in range(8):
        assert buf.add(_ep(f"e{i}", 0.5))
    assert len(buf) == 5
    batch = buf.sample()
    assert len(batch) == 3 and len({e.event_id for e in batch}) == 3
    assert {e.event_id for e in batch} <= {f"e{i}" for i in range(3, 8)}


def test_replay_priority_is_abs_reward_decayed_with_age():
    buf = PrioritizedReplay(capacity=100, batch_size=1, half_life=2.0, seed=0)
    buf.add(_ep("old-big", -1.0))
    buf.add(_ep("mid", 0.25))
    buf.add(_ep("new-small", 0.5))
    raw = np.array([1.0 * 0.5 ** (2 / 2), 0.25 * 0.5 ** (1 / 2), 0.5])
    assert buf.priorities() == pytest.approx(raw / raw.sum())
    counts = {"old-big": 0, "mid": 0, "new-small": 0}
    for _ in range(3000):
        counts[buf.sample()[0].event_id] += 1
    freq = np.array([counts["old-big"], counts["mid"], counts["new-small"]]) / 3000
    assert freq == pytest.approx(raw / raw.sum(), abs=0.03)


def test_importance_weights_undo_the_reward_priority_by_beta_and_leave_the_draws_alone():
    rewards = (1.0, -0.2, 0.5, 0.1, -0.8, 0.4, 0.3, 1.0)

    def filled(beta, n=1):
        buf = PrioritizedReplay(capacity=500, batch_size=6, half_life=3.0 * n, beta=beta, seed=4)
        for i, r in enumerate(rewards * n):
            buf.add(_ep(f"e{i}", r))
        return buf

    for n in (1, 40):  # 8 episodes held (a batch takes most), and 320
        mags = {f"e{i}": abs(r) for i, r in enumerate(rewards * n)}
        plain = filled(0.0, n).sample()
        for beta in (0.0, 0.5, 1.0):
            buf = filled(beta, n)
            p = dict(zip([f"e{i}" for i in range(len(buf))], buf.priorities(), strict=True))
            incl = dict(zip(p, inclusion_probabilities(np.array(list(p.values())), 6), strict=True))
            drawn = buf.sample_weighted()
            assert [e.event_id for e, _ in drawn] == [e.event_id for e in plain]  # the same draws
            # the priority less a beta-th of its |reward| share, over the chance to be drawn; averaging 1
            raw = np.array([p[e.event_id] * mags[e.event_id] ** -beta / incl[e.event_id] for e, _ in drawn])
            if beta == 0:  # no correction: every replay alike
                raw = np.ones(len(drawn))
            assert [w for _, w in drawn] == pytest.approx(raw * len(raw) / raw.sum())
            if n == 40 and beta == 1.0:  # a large buffer: chance in proportion to priority, weight to 1/|reward|
                inv = np.array([1 / mags[e.event_id] for e, _ in drawn])
                assert [w for _, w in drawn] == pytest.approx(inv * len(inv) / inv.sum())
    # a buffer the batch takes whole: every episode is drawn whatever its reward, so the weights follow the age
    # decay alone (they were |reward| ** -1: a reward of 0.2 replayed at five times a thumbs up)
    buf = PrioritizedReplay(capacity=50, batch_size=32, beta=1.0, seed=0)
    for i, r in enumerate((1.0, 0.4, 0.2)):
        buf.add(_ep(f"e{i}", r))
    assert [w for _, w in buf.sample_weighted()] == pytest.approx([1.0, 1.0, 1.0], abs=0.001)
    with pytest.raises(ValidationError, match="beta must be in"):
        PrioritizedReplay(beta=1.5)


def test_replay_draws_each_episode_with_its_inclusion_probability():
    buf = PrioritizedReplay(capacity=10, batch_size=2, half_life=1e9, seed=1)
    for name, r in (("a", 0.6), ("b", 0.2), ("c", 0.1), ("d", 0.1)):
        buf.add(_ep(name, r))
    expected = inclusion_probabilities(buf.priorities(), 2)
    assert expected.round(3).tolist() == [1.0, 0.5, 0.25, 0.25]
    counts = dict.fromkeys("abcd", 0)
    for _ in range(4000):
        batch = buf.sample()
        assert len({e.event_id for e in batch}) == 2
        for e in batch:
            counts[e.event_id] += 1
    assert np.array(list(counts.values())) / 4000 == pytest.approx(expected, abs=0.03)


def test_systematic_draws_are_distinct_and_never_an_item_of_chance_zero():
    from rlfb.replay import _systematic_pps

    rng = np.random.default_rng(0)
    for _ in range(2000):
        size = int(rng.integers(1, 30))
        p = rng.random(size) ** 3
        p[rng.random(size) < 0.2] = 0.0
        if p.sum() == 0:
            continue
        p /= p.sum()
        n = int(rng.integers(1, np.count_nonzero(p) + 1))
        idx, _ = _systematic_pps(p, n, rng)
        assert len(set(idx.tolist())) == n and np.all(p[idx] > 0)


def test_replay_priorities_stay_a_distribution_for_huge_rewards():
    # two rewards of 1e308 summed to an infinity: every priority became 0 and sample() raised
    buf = PrioritizedReplay(capacity=10, batch_size=2, seed=0)
    assert buf.add(_ep("a", 1e308)) and buf.add(_ep("b", 1e308))
    assert np.allclose(buf.priorities().sum(), 1.0) and len(buf.sample()) == 2


def test_replay_is_seeded_and_round_trips():
    def filled(seed):
        buf = PrioritizedReplay(capacity=50, batch_size=4, seed=seed)
        for i in range(20):
            buf.add(_ep(f"e{i}", 0.1 + 0.04 * i, t=float(i)))
        return buf

    a, b = filled(1), filled(1)
    assert [e.event_id for e in a.sample()] == [e.event_id for e in b.sample()]
    state = json.loads(json.dumps(a.state_dict(), allow_nan=False))
    c = PrioritizedReplay(capacity=50, batch_size=4, seed=9).load_state_dict(state)
    assert [e.event_id for e in a.sample()] == [e.event_id for e in c.sample()]
    ep = _ep("x", 0.3)
    back = episode_from_dict(json.loads(json.dumps(episode_to_dict(ep))))
    assert back.event_id == "x" and back.decision == ep.decision and np.array_equal(back.shown, ep.shown)
    with pytest.raises(CorruptStateError):
        episode_from_dict({"event_id": "x"})
    with pytest.raises(ValidationError):
        PrioritizedReplay(batch_size=0)


def _varied_episodes(n=40, seed=0):
    """Episodes with every optional part on some and off others: rankings, temperatures, scores, prior rewards,
    features, arms, no shown chunks at all, a negative zero."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(0, 5))
        retrievers = ("bm25", "dense") if i % 7 else ("bm25", "dense", "splade")
        weights = dict(zip(retrievers, rng.dirichlet(np.ones(len(retrievers))).tolist(), strict=True))
        shown = rng.normal(size=(k, len(retrievers)))
        if k:
            shown[0, 0] = -0.0
        out.append(Episode(
            f"event {i}", f"question {i % 9} é", retrievers,
            Decision(weights, arm=None if i % 3 else f"arm{i}", propensity=float(rng.random()) / 7,
                     explored=bool(i % 2), policy=("gradient", "thompson", "fixed")[i % 3],
                     ranking=tuple(int(x) for x in rng.permutation(k)) if i % 4 == 0 else None,
                     sampling_temperature=float(rng.random()) if i % 5 == 0 else None),
            tuple(f"chunk-{i}-{j}" for j in range(k)), shown, rng.normal(size=k) / 3, 0.1 + i / 41,
            query_type=("default", "how-to")[i % 2], features={"length": float(i) / 3, "idf": 1 / 9} if i % 2 else {},
            timestamp=1.7e9 + i / 3, feedback_time=1.7e9 + i / 7 + 60,
            scores=rng.normal(size=k) if i % 3 == 0 else None,
            prior_rewards=rng.normal(size=k) if i % 2 == 0 else None, response_level=bool(i % 3)))
    return out


def _filled_replay(episodes, seed=1, **kwargs):
    buf = PrioritizedReplay(capacity=100, batch_size=4, seed=seed, **kwargs)
    for ep in episodes:
        buf.add(ep)
    return buf


def _same_episode(a, b):
    """Every field of two episodes alike, to the last bit (a float's repr in JSON round-trips it exactly)."""
    assert json.dumps(episode_to_dict(a, embedding=False)) == json.dumps(episode_to_dict(b, embedding=False))
    for name in ("shown", "chunk_rewards", "scores", "prior_rewards"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None)
        if x is not None:
            assert np.asarray(x).dtype == y.dtype == np.float64 and np.asarray(x).shape == y.shape
            assert _bits(x) == _bits(y)
    assert list(a.decision.weights) == list(b.decision.weights) and list(a.features) == list(b.features)
    assert b.query_embedding is None


def _same_replay(a, b):
    assert a.held()[1] == b.held()[1] and len(a) == len(b)
    for (ea, ma, ia), (eb, mb, ib) in zip(a.held()[0], b.held()[0], strict=True):
        _same_episode(ea, eb)
        assert _bits(ma) == _bits(mb) and ia == ib
    assert _bits(a.priorities()) == _bits(b.priorities())


def test_replay_state_is_columns_with_its_numbers_in_base64_and_round_trips_bit_for_bit():
    episodes = _varied_episodes()
    buf = _filled_replay(episodes)
    state = json.loads(json.dumps(buf.state_dict(), allow_nan=False))
    cols = state["episodes"]
    assert "items" not in state and cols["event_ids"] == [e.event_id for e in episodes]
    # no list or dict per episode: the shown chunks of all of them in one list, their numbers in blocks
    assert cols["shown_ids"] == [c for e in episodes for c in e.shown_ids]
    assert cols["counts"] == [len(e.shown_ids) for e in episodes]
    assert base64.b64decode(cols["shown"]) == b"".join(_bits(e.shown) for e in episodes)
    assert base64.b64decode(cols["chunk_rewards"]) == b"".join(_bits(e.chunk_rewards) for e in episodes)
    assert all(not isinstance(v, dict) for v in cols.values())
    assert all(not isinstance(x, (list, dict)) for k, v in cols.items() if k != "names" for x in v
               if isinstance(v, list))
    back = PrioritizedReplay(capacity=100, batch_size=4, seed=9).load_state_dict(state)
    _same_replay(buf, back)
    assert back.state_dict() == state
    # and it goes on the same: the same samples, the same next episode kept
    assert [e.event_id for e in buf.sample()] == [e.event_id for e in back.sample()]
    for b in (buf, back):
        b.add(episodes[3])
    _same_replay(buf, back)
    assert json.dumps(back.state_dict()) == json.dumps(buf.state_dict())
    # an empty buffer too
    empty = PrioritizedReplay().state_dict()
    assert len(PrioritizedReplay().load_state_dict(json.loads(json.dumps(empty)))) == 0


def test_replay_state_is_smaller_than_a_dict_per_episode():
    buf = _filled_replay(_varied_episodes(n=100))
    state = buf.state_dict()
    old = {**{k: v for k, v in state.items() if k != "episodes"},
           "items": [{"episode": episode_to_dict(e, embedding=False), "mag": m, "i": i} for e, m, i in buf.held()[0]]}
    assert len(json.dumps(state)) < 0.75 * len(json.dumps(old))
    _same_replay(buf, PrioritizedReplay(capacity=100, batch_size=4).load_state_dict(json.loads(json.dumps(old))))


# a replay buffer saved by the code of 2026-12-04 (a dict per episode): two episodes, one with every optional part
_OLD_REPLAY = json.loads("""{"params": {"capacity": 10, "batch_size": 2, "half_life": 2000.0, "persist": 200},
"added": 2, "rng": {"bit_generator": "PCG64", "state": {"state": "323726261719206589602543583274561722519",
"inc": "222003063171874261427395693950637096479"}, "has_uint32": "0", "uinteger": "0"},
"items": [{"episode": {"event_id": "e1", "query": "what causes tides", "retrievers": ["bm25",
"dense"], "decision": {"weights": {"bm25": 0.25, "dense": 0.75}, "arm": "w3", "propensity": 0.30000000000000004,
"explored": true, "policy": "gradient", "sampling_temperature": 0.3, "ranking": [1,
0, 2]}, "shown_ids": ["c1", "c2", "c3"], "shown": [[0.1, 0.3333333333333333], [-0.0,
0.5], [1.0, 0.2857142857142857]], "chunk_rewards": [0.0, 0.4, -0.0], "reward": 0.4,
"query_type": "question", "features": {"length": 3.0, "idf": 0.1111111111111111},
"timestamp": 1700000000.1, "feedback_time": 1700000060.7, "query_embedding": null,
"scores": [0.9, 0.7, 0.1], "prior_rewards": [0.0, 0.2, 0.0], "response_level": false},
"mag": 0.4, "i": 0}, {"episode": {"event_id": "e2", "query": "tides", "retrievers": ["bm25",
"dense"], "decision": {"weights": {"bm25": 0.5, "dense": 0.5}, "arm": null, "propensity": 1.0,
"explored": false, "policy": "fixed", "ranking": null}, "shown_ids": ["c2"], "shown": [[0.6,
0.7]], "chunk_rewards": [-1.0], "reward": -1.0, "query_type": "default", "features": {},
"timestamp": 0.0, "feedback_time": 0.0, "query_embedding": null, "scores": null, "prior_rewards": null,
"response_level": true}, "mag": 1.0, "i": 1}]}""")


def test_replay_loads_the_layout_saved_before():
    old = PrioritizedReplay(capacity=10, batch_size=2).load_state_dict(json.loads(json.dumps(_OLD_REPLAY)))
    (e1, m1, i1), (e2, m2, i2) = old.held()[0]
    assert (m1, i1, m2, i2) == (0.4, 0, 1.0, 1) and old.held()[1] == 2
    assert e1.decision == Decision({"bm25": 0.25, "dense": 0.75}, arm="w3", propensity=0.1 + 0.2, explored=True,
                                   policy="gradient", ranking=(1, 0, 2), sampling_temperature=0.3)
    assert _bits(e1.shown) == _bits([[0.1, 1 / 3], [-0.0, 0.5], [1.0, 2 / 7]]) and e1.shown_ids == ("c1", "c2", "c3")
    assert _bits(e1.chunk_rewards) == _bits([0.0, 0.4, -0.0]) and _bits(e1.scores) == _bits([0.9, 0.7, 0.1])
    assert _bits(e1.prior_rewards) == _bits([0.0, 0.2, 0.0]) and e1.response_level is False
    assert e1.features == {"length": 3.0, "idf": 1 / 9} and e1.query_type == "question"
    assert (e1.timestamp, e1.feedback_time) == (1.7e9 + 0.1, 1.7e9 + 60.7)
    assert e2.decision == Decision({"bm25": 0.5, "dense": 0.5}) and e2.scores is None and e2.prior_rewards is None
    state = old.state_dict()  # saved again, column by column: the same buffer
    assert "items" not in state and state["episodes"]["event_ids"] == ["e1", "e2"]
    back = PrioritizedReplay(capacity=10, batch_size=2).load_state_dict(json.loads(json.dumps(state)))
    _same_replay(old, back)
    assert [e.event_id for e in old.sample(2)] == [e.event_id for e in back.sample(2)]


def _old_replay_with(change):
    state = json.loads(json.dumps(_OLD_REPLAY))
    change(state["items"][0])
    return state


def test_an_older_replay_that_loads_is_one_that_saves_and_loads_again():
    # a review found old-layout episodes that loaded, and then made a snapshot no process could load (or none
    # at all): logged scores of every candidate, not the shown chunks alone (saved before 2026-12-02), a
    # negative count or ranking place, a null read as NaN, a sampling temperature that is not a number
    def all_candidates(item):
        item["episode"]["scores"] = [0.9, 0.7, 0.1, 0.05, 0.01]

    buf = PrioritizedReplay(capacity=10, batch_size=2).load_state_dict(_old_replay_with(all_candidates))
    assert buf.held()[0][0][0].scores is None  # left out: the policies re-rank from the shown scores then
    back = PrioritizedReplay(capacity=10, batch_size=2).load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert [e.event_id for e, _, _ in back.held()[0]] == ["e1", "e2"]

    def negative_count(item):
        item["i"] = -1

    def negative_place(item):
        item["episode"]["decision"]["ranking"] = [1, -1, 2]

    def null_shown(item):
        item["episode"]["shown"][0][0] = None

    def null_reward(item):
        item["episode"]["chunk_rewards"][1] = None

    def word_temperature(item):
        item["episode"]["decision"]["sampling_temperature"] = "warm"

    for damage in (negative_count, negative_place, null_shown, null_reward, word_temperature):
        fresh = PrioritizedReplay(capacity=10, batch_size=2)
        before = fresh.state_dict()
        with pytest.raises(CorruptStateError):
            fresh.load_state_dict(_old_replay_with(damage))
        assert fresh.state_dict() == before


def test_a_replay_state_of_more_episodes_than_the_capacity_keeps_the_newest():
    # it was refused whole, though a learner's settings are its own and its memory trims to its own cap
    buf = PrioritizedReplay(capacity=10, batch_size=2).load_state_dict(json.loads(json.dumps(_OLD_REPLAY)))
    state = json.loads(json.dumps(buf.state_dict()))
    assert len(buf) >= 2
    small = PrioritizedReplay(capacity=1, batch_size=1).load_state_dict(state)
    assert len(small) == 1 and small.held()[0][0][0].event_id == buf.held()[0][-1][0].event_id


def test_a_saved_replay_keeps_its_newest_episodes():
    # the oldest `persist` were written: a reloaded learner replayed its stalest feedback and lost the latest
    buf = PrioritizedReplay(capacity=10, persist=2)
    for i in range(5):
        buf.add(_ep(f"e{i}", 0.5))
    state = json.loads(json.dumps(buf.state_dict()))
    assert state["episodes"]["event_ids"] == ["e3", "e4"]
    back = PrioritizedReplay(capacity=10).load_state_dict(state)
    assert [e.event_id for e, _, _ in back.held()[0]] == ["e3", "e4"] and back.held()[1] == 5


def test_a_saved_replay_entry_numbered_at_the_buffers_count_is_refused():
    # the check allowed an entry numbered at the count itself (one added after it), and its age came out as -1
    buf = PrioritizedReplay(capacity=10)
    buf.add(_ep("e0", 0.5))
    state = json.loads(json.dumps(buf.state_dict()))
    assert state["added"] == 1 and state["episodes"]["added"] == [0]
    state["episodes"]["added"] = [1]
    with pytest.raises(CorruptStateError):
        PrioritizedReplay(capacity=10).load_state_dict(state)


def test_a_number_beyond_float_range_in_a_saved_part_is_a_named_error():
    mem = FeedbackMemory()
    mem.update("tides", None, ["c1"], [0.4])
    state = json.loads(json.dumps(mem.state_dict()))
    state["gate_counts"] = [10**400, 0]
    with pytest.raises(CorruptStateError):
        FeedbackMemory().load_state_dict(state)


def _block(values, dtype="<f8"):
    return base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode("ascii")


def _reblocked(key, change, dtype="<f8"):
    def damage(s):
        arr = np.frombuffer(base64.b64decode(s[key]), dtype=dtype).copy()
        s[key] = _block(change(arr), dtype)
    return damage


@pytest.mark.parametrize("damage", [
    lambda s: s.update(shown="not base64!"),
    lambda s: s.update(shown=s["shown"][:-4]),  # base64 of a partial number
    lambda s: s.update(numbers=base64.b64encode(base64.b64decode(s["numbers"])[:-3]).decode("ascii")),
    lambda s: s.update(chunk_rewards=7),
    _reblocked("shown", lambda a: a[:-1]),  # a number short
    _reblocked("chunk_rewards", lambda a: np.append(a, 0.5)),  # one too many
    _reblocked("scores", lambda a: a[:-1]),
    _reblocked("prior_rewards", lambda a: np.append(a, 0.5)),
    _reblocked("weights", lambda a: a[:-1]),
    _reblocked("features", lambda a: np.append(a, 0.5)),
    _reblocked("temperatures", lambda a: a[:-1]),
    _reblocked("numbers", lambda a: _set(a, 2, np.nan)),
    _reblocked("shown", lambda a: _set(a, 0, np.inf)),
    _reblocked("numbers", lambda a: _set(a, 4, -1.0)),  # a negative priority
    _reblocked("numbers", lambda a: _set(a, 4, 0.0)),
    lambda s: s["shown_ids"].append("one more id"),  # ids and their counts differ
    lambda s: s["shown_ids"].pop(),
    lambda s: s["shown_ids"].__setitem__(0, 7),
    lambda s: s["counts"].pop(),  # an episode without its count
    lambda s: s["counts"].__setitem__(1, -1),
    lambda s: s["counts"].__setitem__(1, True),
    lambda s: s["counts"].__setitem__(1, 1.0),
    lambda s: s.update(counts=None),
    lambda s: s["event_ids"].append("one more episode"),
    lambda s: s["queries"].__setitem__(0, 5),
    lambda s: s["arms"].__setitem__(0, 5),
    lambda s: s["explored"].__setitem__(0, 1),
    lambda s: s["response_level"].pop(),
    lambda s: s["retrievers"].__setitem__(0, 99),  # no such names
    lambda s: s["weight_keys"].__setitem__(0, -1),
    lambda s: s["names"].__setitem__(0, ["bm25", "bm25"]),  # a weight named twice
    lambda s: s["names"].__setitem__(0, "bm25"),
    lambda s: s["added"].__setitem__(0, 10_000),  # added after the buffer's count
    lambda s: s["added"].__setitem__(0, "0"),
    lambda s: s["ranking_lengths"].__setitem__(0, -2),
    lambda s: s["rankings"].pop(),
    lambda s: s["scored"].reverse(),
    lambda s: s["with_prior"].append(10_000),  # no such episode
    lambda s: s["tempered"].__setitem__(0, True),
    lambda s: s.pop("scored"),
    lambda s: s.update(event_ids="e1"),
])
def test_replay_refuses_a_damaged_state_and_changes_nothing(damage):
    state = json.loads(json.dumps(_filled_replay(_varied_episodes()).state_dict()))
    damage(state["episodes"])
    buf, twin = (_filled_replay(_varied_episodes(n=12, seed=3), seed=5) for _ in range(2))
    before = json.dumps(buf.state_dict())
    with pytest.raises(CorruptStateError):
        buf.load_state_dict(state)
    assert json.dumps(buf.state_dict()) == before
    _same_replay(buf, twin)
    assert [e.event_id for e in buf.sample()] == [e.event_id for e in twin.sample()]


@pytest.mark.parametrize("change", [
    lambda e: dataclasses.replace(e, features={"length": float("nan")}),
    lambda e: dataclasses.replace(e, scores=np.array([np.inf, 0.0, 0.0])),
    lambda e: dataclasses.replace(e, timestamp=float("inf")),
    lambda e: dataclasses.replace(e, decision=dataclasses.replace(e.decision, weights={"bm25": np.nan, "dense": 1})),
])
def test_replay_state_refuses_a_non_finite_number(change):
    # the store refused it in the JSON; in a base64 block it would be written, and every later load refused
    ep = PrioritizedReplay().load_state_dict(_OLD_REPLAY).held()[0][0][0]
    buf = PrioritizedReplay()
    buf.add(change(ep))
    with pytest.raises(NonFiniteValueError):
        buf.state_dict()


# ---------------------------------------------------------------------------- chunk exploration


def test_epsilon_greedy_exploration_propensities_and_decay():
    ex = EpsilonGreedyExploration(epsilon=0.1, epsilon_min=0.02, half_life=100, depth=20, seed=0)
    ranked = np.arange(100)
    explored = 0
    for _ in range(2000):
        res = ex.explore(ranked, 10)
        assert len(set(res.order.tolist())) == 10
        assert res.order[:5].tolist() == list(range(5))  # the top half is never touched
        if res.explored:
            explored += 1
            assert res.propensity == pytest.approx(0.1 / (5 * 20))
            assert len(set(res.order.tolist()) - set(range(10))) == 1
        else:
            assert res.propensity == pytest.approx(0.9)
    assert 0.07 < explored / 2000 < 0.13
    ex.step(100)
    assert ex.epsilon == pytest.approx(0.05)
    ex.step(10_000)
    assert ex.epsilon == 0.02
    # nothing to swap in
    assert not ex.explore(np.arange(5), 10).explored
    with pytest.raises(ValidationError):
        EpsilonGreedyExploration(epsilon=0.1, epsilon_min=0.5)


def test_thompson_chunk_exploration_moves_uncertain_chunks():
    ex = ThompsonChunkExploration(weight=1.0, seed=0)
    fused = np.linspace(1.0, 0.0, 30)
    ranked = np.argsort(-fused)
    alpha = np.ones(30)
    beta = np.ones(30)
    sure_a = np.full(30, 50_000.0)
    sure_b = np.full(30, 50_000.0)
    moved = sum(ex.explore(ranked, 5, fused=fused, alpha=alpha, beta=beta).explored for _ in range(50))
    still = sum(ex.explore(ranked, 5, fused=fused, alpha=sure_a, beta=sure_b).explored for _ in range(50))
    assert moved > 25 and still == 0
    res = ex.explore(ranked, 5, fused=fused, alpha=alpha, beta=beta)
    assert 0 < res.propensity <= 1 and res.order.shape == (5,)


def test_thompson_chunk_noise_is_centred_on_each_posterior_mean():
    # the noise was centred on beta / (alpha + beta): a chunk surely bad was lifted by the weight and one surely
    # good pushed down by it, so two certain posteriors swapped the fused order
    ex = ThompsonChunkExploration(weight=10.0, seed=0)
    res = ex.explore(np.array([0, 1]), 2, fused=np.array([0.1, 0.0]), alpha=np.array([1.0, 1000.0]),
                     beta=np.array([1000.0, 1.0]))
    assert res.order.tolist() == [0, 1] and not res.explored and res.propensity == 1.0


@pytest.mark.parametrize("make", [
    lambda: EpsilonGreedyExploration(seed=-1), lambda: ThompsonChunkExploration(seed=-1),
    lambda: EpsilonGreedyExploration(seed=1.5), lambda: PrioritizedReplay(seed=-1),  # type: ignore[arg-type]
    lambda: Guardrail(lr_bounds=0.5), lambda: Guardrail(explore_bounds=(1.0,)),  # type: ignore[arg-type]
])
def test_bad_settings_are_validation_errors(make):
    # were numpy's ValueError and TypeError, or a TypeError from unpacking
    with pytest.raises(ValidationError):
        make()


@pytest.mark.parametrize("cls", [EpsilonGreedyExploration, ThompsonChunkExploration])
@pytest.mark.parametrize("t", [float("nan"), float("inf"), -1.0])
def test_exploration_state_with_a_bad_counter_is_refused_and_changes_nothing(cls, t):
    # thompson's took t=nan and kept it
    ex = cls(seed=0)
    ex.step(3)
    other = cls(seed=5).state_dict()
    before = ex.state_dict()
    with pytest.raises(CorruptStateError, match="counter"):
        ex.load_state_dict({**other, "t": t})
    assert ex.state_dict() == before


def test_guardrail_state_with_an_infinite_count_is_corrupt():
    state = Guardrail().state_dict()
    with pytest.raises(CorruptStateError):  # was a raw OverflowError
        Guardrail().load_state_dict({**state, "n": float("inf")})


@pytest.mark.parametrize("make", [
    lambda: (EpsilonGreedyExploration(seed=0), EpsilonGreedyExploration(seed=5).state_dict(), "t"),
    lambda: (ThompsonChunkExploration(seed=0), ThompsonChunkExploration(seed=5).state_dict(), "t"),
    lambda: (RepeatDiscovery(seed=0), RepeatDiscovery(seed=5).state_dict(), "tries"),
    lambda: (Guardrail(), Guardrail().state_dict(), "n"),
    lambda: (FeedbackMemory(), FeedbackMemory().state_dict(), "counter"),
    lambda: (PrioritizedReplay(), PrioritizedReplay(seed=5).state_dict(), "added"),
])
@pytest.mark.parametrize("value", [10**400, 2**54, -1], ids=["10**400", "2**54", "-1"])
def test_a_count_beyond_any_real_one_is_refused_and_changes_nothing(make, value):
    # 10**400 raised a raw OverflowError (explorers, discovery) or loaded (the rest), and the next update that took
    # it as a float raised one; discovery took the generator's state before it refused the counts
    part, other, key = make()
    before = json.dumps(part.state_dict())
    with pytest.raises(CorruptStateError):
        part.load_state_dict({**other, key: value})
    assert json.dumps(part.state_dict()) == before


# ---------------------------------------------------------------------------- guardrail


def test_guardrail_tunes_learning_rate_and_exploration_within_bounds():
    shown = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    clicked_second = np.array([0.0, 1.0, 0.0])
    worse, better, default = np.array([0.9, 0.1]), np.array([0.1, 0.9]), np.array([0.5, 0.5])
    g = Guardrail(min_episodes=5)
    for _ in range(200):
        lr, ex = g.observe(shown, clicked_second, worse, default)
    assert g.lift < -0.01 and (lr, ex) == (0.1, 3.0)
    for _ in range(400):
        lr, ex = g.observe(shown, clicked_second, better, default)
    assert g.lift > 0.01 and (lr, ex) == (2.0, 0.5)
    # the same weights as the default: no difference, multipliers hold still
    h = Guardrail(min_episodes=0)
    for _ in range(50):
        assert h.observe(shown, clicked_second, default, default) == (1.0, 1.0)
    # no rewarded chunk: nothing to compare
    assert Guardrail().observe(shown, np.zeros(3), worse, default) == (1.0, 1.0)
    state = json.loads(json.dumps(g.state_dict()))
    assert Guardrail(min_episodes=5).load_state_dict(state).multipliers == g.multipliers
    with pytest.raises(CorruptStateError):
        Guardrail().load_state_dict({**state, "lr": 100.0})
    with pytest.raises(ValidationError):
        Guardrail(lr_bounds=(2.0, 3.0))


def test_guardrail_does_not_act_on_noise():
    # learned and default weights put different chunks first, and users click either one as often:
    # a mean difference of zero, with per-episode differences of +-0.37. A rolling mean over about 40
    # of them crosses a tolerance of 0.01 all the time; the guardrail must not take that for a signal.
    shown = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    learned, default = np.array([0.9, 0.1]), np.array([0.1, 0.9])
    rng = np.random.default_rng(0)
    g = Guardrail()
    moved = []
    for _ in range(2000):
        clicks = np.array([1.0, 0.0, 0.0]) if rng.random() < 0.5 else np.array([0.0, 1.0, 0.0])
        lr, ex = g.observe(shown, clicks, learned, default)
        moved.append(max(abs(np.log(lr)), abs(np.log(ex))))
    # (before: the exploration multiplier spent hundreds of episodes at its bound of 3)
    assert max(moved) < np.log(1.5) and np.mean(np.array(moved) > 0) < 0.05
    assert 0.9 < lr < 1.1 and 0.9 < ex < 1.1
    # a real degradation of the same noise level is still acted on
    for _ in range(300):
        clicks = np.array([1.0, 0.0, 0.0]) if rng.random() < 0.2 else np.array([0.0, 1.0, 0.0])
        lr, ex = g.observe(shown, clicks, learned, default)
    assert g.lift < -0.1 and ex == 3.0 and lr == 0.1


def test_memory_a_read_counts_as_a_use_after_the_last_update():
    # a read was stamped with the last update's tick, tied with it, and argmin evicted the entry just read
    m = FeedbackMemory(max_entries=2)
    m.update("alpha", None, ["a"], [1.0])
    m.update("beta", None, ["b"], [1.0])
    m.score("alpha", None, ["a"])
    m.update("gamma", None, ["g"], [1.0])
    assert (m.has_exact("alpha"), m.has_exact("beta"), m.has_exact("gamma")) == (True, False, True)


def test_memory_loaded_from_a_larger_one_keeps_its_own_bound():
    big = FeedbackMemory(max_entries=10)
    for q in ("one", "two", "three", "four", "five"):
        big.update(q, None, ["c"], [1.0])
    big.score("two", None, ["c"])  # the most recently used, with "five"
    small = FeedbackMemory(max_entries=2).load_state_dict(json.loads(json.dumps(big.state_dict())))
    assert len(small) == 2 and small.has_exact("two") and small.has_exact("five")
    small.update("six", None, ["c"], [1.0])
    assert len(small) == 2  # it held all five for good


# ---------------------------------------------------------------------------- the memory's saved state

# a memory's state as saved before 2026-12-05 (a dict per question, its evidence a JSON number per chunk), written
# by that version: FeedbackMemory(), then update("What causes tides?", [1, 0], ["c1", "c2"], [-0.2, 0.4], t=1000),
# update("tides and the moon", [0.6, 0.8], ["c2", "c3"], [0.4, 0.1], t=2000), update("no embedding", None,
# ["c3"], [-0.1], t=3000) and note_ask("tides and the moon")
_OLD_LAYOUT = json.loads("""{"params": {"similarity_threshold": 0.8, "max_entries": 5000, "max_neighbors": 5,
 "value_scale": 0.3, "transfer_weight": 1.0, "transfer_gate": "adaptive", "gate_full": 0.75, "gate_z": 1.0,
 "exact_similarity": 0.995, "max_value": 5.0, "half_life_days": 45.0}, "dim": 2, "counter": 3, "now": 3000.0,
 "gate_counts": [0.0, 0.0], "entries": [
 {"q": "what causes tides", "e": "AACAPwAAAAA=", "v": {"c1": -0.2, "c2": 0.4}, "t": 1000.0, "u": 1.0, "a": 0.0},
 {"q": "tides and the moon", "e": "mpkZP83MTD8=", "v": {"c2": 0.4, "c3": 0.1}, "t": 2000.0, "u": 2.0, "a": 1.0},
 {"q": "no embedding", "e": null, "v": {"c3": -0.1}, "t": 3000.0, "u": 3.0, "a": 0.0}]}""")


def _old_layout(state):
    """``state`` (:meth:`FeedbackMemory.state_dict`) as the layout before 2026-12-05 wrote it."""
    values = np.frombuffer(base64.b64decode(state["values"]), dtype="<f8").tolist()
    clock = np.frombuffer(base64.b64decode(state["clock"]), dtype="<f8").reshape(-1, 3).tolist()
    emb = np.frombuffer(base64.b64decode(state["embeddings"]), dtype="<f4").reshape(len(state["embedded"]), -1)
    embedded = {i: base64.b64encode(e.tobytes()).decode("ascii")
                for i, e in zip(state["embedded"], emb, strict=True)}
    entries, start = [], 0
    for i, (q, n) in enumerate(zip(state["queries"], state["counts"], strict=True)):
        t, u, a = clock[i]
        vals = dict(zip(state["chunks"][start:start + n], values[start:start + n], strict=True))
        entries.append({"q": q, "e": embedded.get(i), "v": vals, "t": t, "u": u, "a": a})
        start += n
    columns = ("queries", "counts", "chunks", "values", "clock", "embedded", "embeddings")
    return {**{k: v for k, v in state.items() if k not in columns}, "entries": entries}


def _learned_memory(n_queries=60, seed=0):
    """A memory of many questions, some with query embeddings, evidence decayed over weeks, one entry evicted,
    and values with every last bit set (thirds, tiny ones, a negative zero)."""
    rng = np.random.default_rng(seed)
    mem = FeedbackMemory(max_entries=n_queries - 1, similarity_threshold=0.5, transfer_gate=1.0)
    for i in range(n_queries + n_queries // 3):  # each question once, then a third of them again
        q = i if i < n_queries else 3 * (i - n_queries) + 1
        ids = [f"chunk-{j}" for j in rng.choice(40, size=int(rng.integers(1, 9)), replace=False)]
        ev = rng.normal(0.0, 0.3, size=len(ids)) / 3.0
        ev[0] = 1e-300 if i % 7 == 0 else ev[0]
        emb = None if q % 3 == 0 else _unit(rng.normal(size=8) + np.eye(8)[q % 8] * 3)
        mem.update(f"Question {q}?", emb, ids, ev, timestamp=1e6 + i * DAY)
    mem._values[1]["negative zero"] = -0.0  # no update writes one; the layout keeps its sign all the same
    return mem


def _bits(x):
    return np.asarray(x, dtype=np.float64).tobytes()


def _same_memory(a, b):
    """Every query's scores, known evidence and asks, bit for bit."""
    ids = [f"chunk-{j}" for j in range(40)] + ["negative zero"]
    rng = np.random.default_rng(1)
    for q in [*a._keys, "never asked"]:
        emb = _unit(rng.normal(size=8))
        for e in (None, emb):
            assert _bits(a.score(q, e, ids, touch=False)) == _bits(b.score(q, e, ids, touch=False))
        assert list(a.known(q)) == list(b.known(q)) and _bits(list(a.known(q).values())) == _bits(
            list(b.known(q).values()))
        assert a.asks(q) == b.asks(q)
    assert a.gate() == b.gate() and len(a) == len(b)


def test_memory_state_is_columns_with_its_numbers_in_base64_and_round_trips_bit_for_bit():
    mem = _learned_memory()
    state = json.loads(json.dumps(mem.state_dict(), allow_nan=False))
    assert "entries" not in state and len(state["queries"]) == len(mem) == 59
    flat = [v for vals in mem._values for v in vals.values()]
    assert state["counts"] == [len(vals) for vals in mem._values]
    assert state["chunks"] == [c for vals in mem._values for c in vals]
    assert np.frombuffer(base64.b64decode(state["values"]), dtype="<f8").tobytes() == _bits(flat)
    assert state["embedded"] == np.flatnonzero(mem._has_emb[: len(mem)]).tolist() and state["embedded"]
    back = FeedbackMemory(max_entries=59, similarity_threshold=0.5, transfer_gate=1.0).load_state_dict(state)
    assert back.state_dict() == state
    assert math.copysign(1.0, back._values[1]["negative zero"]) == -1.0
    _same_memory(mem, back)
    # and it goes on learning the same: the next update and eviction alike
    for m in (mem, back):
        m.update("a new question", _unit(np.ones(8)), ["chunk-1", "chunk-2"], [0.4, -0.2], timestamp=1e6 + 90 * DAY)
    _same_memory(mem, back)
    assert json.dumps(back.state_dict()) == json.dumps(mem.state_dict())


def test_memory_state_is_smaller_than_a_dict_per_question():
    mem = _learned_memory(n_queries=200)
    state = mem.state_dict()
    new, old = len(json.dumps(state)), len(json.dumps(_old_layout(state)))
    assert new < 0.75 * old, (new, old)


def test_memory_loads_the_layout_saved_before():
    old = FeedbackMemory().load_state_dict(json.loads(json.dumps(_OLD_LAYOUT)))
    assert old.known("What causes tides?") == {"c1": -0.2 * 0.5 ** (2000 / (45 * DAY)), "c2": 0.4 * 0.5 ** (
        2000 / (45 * DAY))}
    assert old.asks("tides and the moon") == 1 and old.has_exact("no embedding")
    decayed = 0.1 * 0.5 ** (1000 / (45 * DAY))
    assert old.score("tides and the moon", [0.6, 0.8], ["c3"]).tolist() == pytest.approx([np.tanh(decayed / 0.3)])
    state = old.state_dict()  # saved again, column by column: the same memory
    assert state["queries"] == ["what causes tides", "tides and the moon", "no embedding"]
    assert state["embedded"] == [0, 1] and state["dim"] == 2
    _same_memory_small = FeedbackMemory().load_state_dict(state)
    for q, e in (("what causes tides", [1.0, 0.0]), ("tides and the moon", [0.6, 0.8]), ("no embedding", None),
                 ("tides", [0.8, 0.6])):
        ids = ["c1", "c2", "c3"]
        assert _bits(_same_memory_small.score(q, e, ids, touch=False)) == _bits(old.score(q, e, ids, touch=False))
    # a larger one, converted to the old layout: loads as the memory it was
    mem = _learned_memory()
    back = FeedbackMemory(max_entries=59, similarity_threshold=0.5, transfer_gate=1.0).load_state_dict(
        json.loads(json.dumps(_old_layout(mem.state_dict()))))
    _same_memory(mem, back)
    assert back.state_dict() == mem.state_dict()


def _twice(s):
    i = next(i for i, n in enumerate(s["counts"]) if n > 1)  # a question of two chunks or more
    start = sum(s["counts"][:i])
    s["chunks"][start + 1] = s["chunks"][start]  # a chunk twice for one question


def _one_more_chunk(s):
    s["chunks"].append("one more id")
    s["counts"][-1] += 1


def _set(arr, i, v):
    arr[i] = v
    return arr


@pytest.mark.parametrize("damage", [
    lambda s: s.update(values="not base64!"),
    lambda s: s.update(values=s["values"][:-4]),  # base64 of a partial number
    lambda s: s.update(values=base64.b64encode(base64.b64decode(s["values"])[:-3]).decode("ascii")),
    lambda s: s.update(values=7),
    _reblocked("values", lambda a: a[:-1]),  # a value short of the chunk ids
    _reblocked("values", lambda a: np.append(a, 0.5)),  # one too many
    _reblocked("values", lambda a: _set(a, 3, np.nan)),
    _reblocked("values", lambda a: _set(a, 0, np.inf)),
    _one_more_chunk,  # ids and values counts differ
    lambda s: s["chunks"].append("one more id"),  # ids and their counts differ
    lambda s: s["chunks"].pop(),
    _twice,
    lambda s: s["counts"].pop(),  # a question without its count
    lambda s: s["counts"].__setitem__(0, -1),
    lambda s: s["counts"].__setitem__(0, True),
    lambda s: s["counts"].__setitem__(0, 1.0),
    lambda s: s.update(counts=None),
    lambda s: s["chunks"].__setitem__(0, 7),
    lambda s: s["queries"].append("one more question"),
    lambda s: s["queries"].__setitem__(0, 5),
    lambda s: s.update(chunks="c1"),
    _reblocked("clock", lambda a: a[:-1]),
    _reblocked("clock", lambda a: _set(a, 4, np.inf)),
    _reblocked("clock", lambda a: _set(a, 5, -2.0)),  # negative asks
    lambda s: s.update(clock="@@@@"),
    lambda s: s.update(embeddings="not base64!"),
    _reblocked("embeddings", lambda a: a[:-1], "<f4"),
    _reblocked("embeddings", lambda a: _set(a, 0, np.nan), "<f4"),
    lambda s: s["embedded"].append(10_000),  # no such question
    lambda s: s["embedded"].reverse(),
    lambda s: s["embedded"].__setitem__(0, True),
    lambda s: s.update(embedded=s["embedded"][1:]),  # an embedding too many
    lambda s: s.update(dim=None),  # embeddings without a dimension
    lambda s: s.pop("clock"),
])
def test_memory_refuses_a_damaged_state_and_changes_nothing(damage):
    state = json.loads(json.dumps(_learned_memory().state_dict()))
    damage(state)
    mem = _learned_memory(n_queries=20, seed=3)  # a memory of its own, which must stay as it was
    before = json.dumps(mem.state_dict())
    twin = _learned_memory(n_queries=20, seed=3)
    with pytest.raises(CorruptStateError):
        mem.load_state_dict(state)
    assert json.dumps(mem.state_dict()) == before
    _same_memory(mem, twin)


def test_memory_state_refuses_a_non_finite_value():
    # the store refused it in the JSON; in a base64 block it would be written, and every later load refused
    mem = FeedbackMemory()
    mem.update("tides", None, ["c1"], [0.4])
    mem._values[0]["c1"] = float("nan")
    with pytest.raises(NonFiniteValueError):
        mem.state_dict()


def test_chunk_confidences_are_bounded_and_forget_the_least_recently_updated(monkeypatch) -> None:
    # every chunk ever rated kept a row in the state each feedback writes: 200,000 rows made a 14 MB snapshot
    import rlfb.confidence as confidence

    monkeypatch.setattr(confidence, "MAX_CHUNKS", 100)
    c = confidence.ChunkConfidence()
    for i in range(150):
        c.update([f"c{i}"], [1.0], timestamp=1000.0 + i)
    assert len(c) <= 100
    assert c.confidence(["c149"])[0] > 5.0  # the newest kept
    assert c.confidence(["c0"])[0] == 5.0  # the oldest back at the prior
    state = c.state_dict()
    again = confidence.ChunkConfidence().load_state_dict(state)
    np.testing.assert_array_equal(again.confidence([f"c{i}" for i in range(150)]),
                                  c.confidence([f"c{i}" for i in range(150)]))


def test_feedback_without_a_time_after_timed_feedback_counts_whole():
    # "no time" (0) is not "the oldest time": decayed by the whole clock, it would count nothing
    conf, alone = ChunkConfidence(learning_rate=0.05), ChunkConfidence(learning_rate=0.05)
    conf.update(["x"], [1.0], timestamp=1.7e9)
    conf.update(["y"], [1.0])
    alone.update(["y"], [1.0])
    assert conf.confidence(["y"])[0] == pytest.approx(alone.confidence(["y"])[0])
    mem, fresh = FeedbackMemory(), FeedbackMemory()
    mem.update("q", None, ["x"], [0.3], timestamp=1.7e9)
    mem.update("q", None, ["y"], [0.3])
    fresh.update("q", None, ["y"], [0.3])
    assert mem.score("q", None, ["y"])[0] == pytest.approx(fresh.score("q", None, ["y"])[0])


def test_a_question_found_by_its_embedding_as_an_exact_repeat_counts_once() -> None:
    # a remembered question within the exact-repeat cosine was counted as the exact repeat and again as a
    # similar question's transfer: another wording of it scored its chunks higher than the question itself
    embedding = np.array([1.0, 0.0, 0.0])
    for gate in (1.0, 0.5):
        memory = FeedbackMemory(transfer_gate=gate, transfer_weight=0.5)
        memory.update("what causes tides", embedding, ["c1", "c2"], [0.4, -0.2])
        by_text = memory.score("what causes tides", embedding, ["c1", "c2"], touch=False)
        assert np.allclose(memory.score("why do tides happen", embedding, ["c1", "c2"], touch=False), by_text)


def test_a_short_question_padded_with_spaces_keeps_its_text_as_its_key() -> None:
    # the key is hashed by the normalised question's length, not the raw one: padding made a short question
    # a hashed one, and its memory unreadable by text
    from rlfb.memory import HASHED_KEY, MAX_KEY_CHARS, question_key

    padded = "what causes" + " " * (MAX_KEY_CHARS + 10) + "tides?"
    assert not question_key(padded).startswith(HASHED_KEY) and question_key(padded) == padded


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


# the guardrail
SHOWN = np.array([[1.0, 0.0], [0.0, 1.0]])  # two chunks, each scored by one retriever alone
# the second chunk rewarded: the learned weights rank it second, the default first (nDCG 0.631 against 1)
WORSE = (np.array([0.0, 1.0]), np.array([1.0, 0.0]), np.array([0.0, 1.0]))
SAME = (np.array([0.0, 1.0]), np.array([0.5, 0.5]), np.array([0.5, 0.5]))  # learned weights equal the default


def test_the_guardrail_eases_its_multipliers_back_to_one_and_not_past_it() -> None:
    """Bug guarded: easing back multiplied a learning rate below 1 past 1 (0.9 x 1.25 = 1.125)."""
    g = Guardrail(min_episodes=0, factor=1.25)
    state = g.state_dict()
    state.update(lr=0.9, explore=1.1)
    g.load_state_dict(state)
    assert g.observe(SHOWN, *SAME) == (1.0, 1.0)


def test_the_guardrail_does_not_act_on_two_episodes_that_disagree() -> None:
    """Bug guarded: the standard error took a full window's effective count from the first episode on, so one worse
    episode and one equal one already read as sure evidence."""
    g = Guardrail(min_episodes=2)
    g.observe(SHOWN, *WORSE)
    assert g.observe(SHOWN, *SAME) == (1.0, 1.0)


def test_a_disliked_chunk_counts_as_no_gain_in_the_guardrails_comparison() -> None:
    """Bug guarded: a negative chunk reward entered the nDCG as a negative gain, and the difference left [-1, 1]."""
    g = Guardrail(min_episodes=1000)
    g.observe(SHOWN, np.array([-1.0, 1.0]), WORSE[1], WORSE[2])
    assert g.lift == pytest.approx(1.0 / np.log2(3) - 1.0)


def test_a_guardrail_state_whose_mean_square_is_below_its_squared_mean_is_damage() -> None:
    """Each field was checked on its own: ema -0.5 with ema2 0 (a negative variance) loaded, and its standard
    error of 0 let the next episode move the multipliers on the mean alone."""
    from rlfb.errors import CorruptStateError
    from rlfb.guardrail import Guardrail

    state = Guardrail().state_dict()
    with pytest.raises(CorruptStateError, match="inconsistent"):
        Guardrail().load_state_dict({**state, "ema": -0.5, "ema2": 0.0, "n": 100})
    Guardrail().load_state_dict({**state, "ema": -0.5, "ema2": 0.25, "n": 100})  # every reward -0.5: sound


# memory
def test_a_question_at_exactly_the_exact_similarity_counts_as_the_same_question() -> None:
    # Bug guarded: exact_similarity compared with >, so an identical embedding under other words was only a neighbour.
    memory = FeedbackMemory(similarity_threshold=0.5, exact_similarity=1.0)
    memory.update("first wording", [1.0, 0.0], ["c1"], [0.4])
    assert memory.score("another wording", [1.0, 0.0], ["c1"])[0] > 0.5


def test_transfer_reads_at_most_max_neighbors_similar_questions() -> None:
    # Bug guarded: the max_neighbors cap was not applied, and less similar questions added their evidence too.
    memory = FeedbackMemory(similarity_threshold=0.5, max_neighbors=1, transfer_gate=1.0)
    memory.update("n1", [1.0, 0.5], ["good"], [0.4])
    memory.update("n2", [1.0, 0.9], ["bad"], [0.4])
    scores = memory.score("query", [1.0, 0.0], ["good", "bad"])
    assert scores[0] > 0
    assert scores[1] == 0


def test_agreeing_neighbours_do_not_add_up_past_one_questions_evidence() -> None:
    # Bug guarded: transfer was not normalised by the neighbours' summed gains, so three neighbours counted thrice.
    memory = FeedbackMemory(similarity_threshold=0.5, transfer_gate=1.0)
    for query, embedding in (("n1", [1.0, 0.3]), ("n2", [1.0, -0.3]), ("n3", [1.0, 0.31])):
        memory.update(query, embedding, ["c"], [0.1])
    one = FeedbackMemory(similarity_threshold=0.5, transfer_gate=1.0)
    one.update("n1", [1.0, 0.0], ["c"], [0.1])
    assert memory.score("q", [1.0, 0.0], ["c"])[0] <= one.score("n1", [1.0, 0.0], ["c"])[0] + 1e-9


def test_an_evicted_questions_ask_count_is_not_inherited_by_its_replacement() -> None:
    # Bug guarded: eviction reset a row's values but not its ask count, which the next question took over.
    memory = FeedbackMemory(max_entries=1)
    memory.update("old", None, ["c1"], [0.4])
    for _ in range(5):
        memory.note_ask("old")
    memory.update("new", None, ["c2"], [0.4])
    assert memory.asks("new") == 0


def test_a_question_without_an_embedding_is_no_neighbour_of_one_with() -> None:
    # Bug guarded: similarity ignored whether a row had an embedding, so a reused row kept its evicted one's.
    memory = FeedbackMemory(similarity_threshold=0.5, max_entries=1, transfer_gate=1.0)
    memory.update("old", [1.0, 0.0], ["c1"], [0.4])
    memory.update("new", None, ["c2"], [0.4])
    assert memory.score("query", [1.0, 0.0], ["c2"])[0] == 0.0


# confidence
def test_a_chunks_uncertainty_stays_at_most_one_above_a_confident_prior() -> None:
    # Bug guarded: uncertainty was not clipped, and a click on a chunk with a low prior mean read above 1.
    confidence = ChunkConfidence(prior_alpha=2.0, prior_beta=8.0)
    confidence.update(["a"], [1.0])
    assert 0.0 <= confidence.uncertainty(["a"])[0] <= 1.0


# chunk exploration
def test_thompson_exploration_propensity_is_smoothed_over_its_draws() -> None:
    # Bug guarded: the propensity was hits / draws (at least 1 / draws), not (hits + 1) / (draws + 1).
    explorer = ThompsonChunkExploration(weight=10.0, draws=4, seed=0)
    ones = np.ones(6)
    r = explorer.explore(np.arange(6), 2, fused=np.zeros(6), alpha=ones, beta=ones)
    assert r.propensity < 1.0
    assert r.propensity * 5 == pytest.approx(round(r.propensity * 5))


def test_epsilon_exploration_is_off_when_the_guardrail_scales_it_to_zero() -> None:
    # Bug guarded: epsilon ignored its scale, so a guardrail that turned exploration off did not.
    r = EpsilonGreedyExploration(epsilon=0.1, seed=0).explore(np.arange(20), 5, scale=0.0)
    assert r.propensity == 1.0
    assert r.explored is False


def test_memory_neighbours_tied_at_the_cut_are_the_earliest_remembered():
    # argpartition chose among tied neighbours by its own (CPU-dependent, in NumPy 2) order: here it took the
    # sixth question over the fifth, both 0.9 from the new one
    sims = [0.7, 0.9, 0.9, 0.7, 0.9, 0.9, 0.7, 0.8, 0.8, 0.7, 0.9, 0.9, 0.7, 0.7, 0.7, 0.9, 0.7, 0.8, 0.9, 0.9, 0.7,
            0.7, 0.8, 0.9, 0.8, 0.7, 0.8, 0.8, 0.7, 0.8, 0.9, 0.9, 0.7, 0.8, 0.9, 0.7, 0.7, 0.7, 0.7, 0.9, 0.7, 0.7,
            0.7, 0.7, 0.9, 0.7, 0.9, 0.8, 0.9, 0.8, 0.9, 0.9, 0.7, 0.8]
    mem = FeedbackMemory(max_neighbors=3, transfer_gate=1.0, similarity_threshold=0.5)
    for i, s in enumerate(sims):
        mem.update(f"question {i}", np.array([s, np.sqrt(1.0 - s * s), 0.0]), [f"c{i}"], [0.8])
    out = mem.transfer("another question", np.array([1.0, 0.0, 0.0]), [f"c{i}" for i in range(len(sims))])
    assert np.flatnonzero(out).tolist() == [1, 2, 4]
