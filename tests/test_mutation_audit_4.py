"""Behaviours a hand-made mutation audit of the learning core (learner, memory, discovery, confidence, exploration,
feedback_learning) found no test for. Each test names the bug it guards against."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlfb import FeedbackEnsemble
from rlfb.confidence import ChunkConfidence
from rlfb.discovery import RepeatDiscovery
from rlfb.exploration import EpsilonGreedyExploration, ThompsonChunkExploration
from rlfb.learner import Learner, LearnerConfig, _as_answered
from rlfb.memory import FeedbackMemory
from rlfb.policies.base import Context, Decision, Episode
from rlfb.store import FeedbackStore

R = ("bm25", "dense")
IDS = tuple(f"c{i}" for i in range(8))
NORMALIZED = np.linspace(1.0, 0.0, 8)[:, None] * np.ones((1, 2))  # c0 best, c7 worst, both retrievers agree


def _context(query: str = "q") -> Context:
    return Context(query, R, IDS, np.zeros((8, 2)), NORMALIZED)


def _episode(shown: tuple[str, ...], rewards: list[float], event_id: str = "e", *, query: str = "q",
             prior: np.ndarray | None = None, response_level: bool = True) -> Episode:
    return Episode(event_id, query, R, Decision({"bm25": 0.5, "dense": 0.5}), shown, np.ones((len(shown), 2)),
                   np.asarray(rewards, dtype=float), float(max(rewards)), prior_rewards=prior,
                   response_level=response_level)


def _primed() -> Learner:
    """A learner with discovery on that remembers a click on c0 for "q" asked three times, plus the asking
    the next feedback is on."""
    learner = Learner(R, "fixed", LearnerConfig(discovery_rate=1.0), seed=0)
    learner.learn(_episode(("c0",), [1.0], "e0"))
    for _ in range(4):
        learner.memory.note_ask("q")
    return learner


# -- learner: ranking ----------------------------------------------------------------------------------------


def test_repeat_discovery_first_explores_at_the_asking_after_min_asks_earlier_ones() -> None:
    # Bug guarded: rank counted the asking in progress as an earlier one, so discovery explored one asking early.
    cfg = LearnerConfig(discovery_rate=1.0, discovery_after=3, exploration="thompson", thompson_weight=0.0)
    learner = Learner(R, "fixed", cfg, seed=0)
    learner.learn(_episode(IDS[:3], [1.0, 0.0, 0.0]))
    learner._discovery._hits = learner._discovery._tries = 1000.0  # the discovery rate at its cap
    explored = [learner.rank(_context(), 3).decision.explored for _ in range(5)]
    assert explored == [False, False, False, True, True]


def test_repeat_discovery_leaves_a_ranking_sampled_by_the_gradient_policy_alone() -> None:
    # Bug guarded: discovery rewrote a PDGD sampled ranking, whose gradient assumes what it sampled was shown.
    learner = Learner(R, "gradient", LearnerConfig(discovery_rate=1.0), seed=0)
    learner.learn(_episode(("c0",), [1.0], "e0"))
    learner._discovery._hits = learner._discovery._tries = 1000.0
    for _ in range(4):
        learner.memory.note_ask("q")
    for _ in range(20):
        r = learner.rank(_context(), 3)
        assert r.decision.ranking is not None
        assert r.order.tolist() == list(r.decision.ranking[:3])


def test_feedback_is_asked_for_at_an_uncertainty_exactly_at_the_threshold() -> None:
    # Bug guarded: the ask threshold compared with > (nothing learned: uncertainty exactly 0.5 was not asked).
    assert Learner(R, "fixed", LearnerConfig(ask_threshold=0.5)).should_ask_for_feedback(_context(), 2) is True


# -- learner: learning ---------------------------------------------------------------------------------------


def test_praise_with_one_chunk_praised_still_counts_as_a_click_for_discovery() -> None:
    # Bug guarded: any praised chunk counted as praise of the whole answer spread, and discovery learned nothing.
    learner = _primed()
    tries = learner.discovery._tries
    learner.learn(_episode(("c5", "c0"), [1.0, 0.0], "e1"))
    assert learner.discovery._tries > tries


def test_later_feedback_on_an_event_is_not_counted_again_by_discovery() -> None:
    # Bug guarded: discovery counted each later change of feedback on an event as another try.
    learner = _primed()
    learner.learn(_episode(("c5", "c3"), [0.0, -1.0], "e1", response_level=False))
    tries = learner.discovery._tries
    learner.learn(_episode(("c5", "c3"), [1.0, 0.0], "e1", prior=np.array([0.0, -1.0]), response_level=False))
    assert learner.discovery._tries == tries


def test_a_chunks_confidence_gain_scales_with_its_retrieval_score() -> None:
    # Bug guarded: the confidence update ignored how well the retrievers scored the chunk (rel=None).
    initial = float(Learner(R, "fixed").confidence.confidence(["unseen"])[0])
    learner = Learner(R, "fixed")
    learner.learn(Episode("e", "q", R, Decision({"bm25": 0.5, "dense": 0.5}), ("hi", "lo"),
                          np.array([[1.0, 1.0], [0.1, 0.1]]), np.array([1.0, 1.0]), 1.0, response_level=False))
    hi, lo = learner.confidence.confidence(["hi", "lo"]) - initial
    assert lo > 0
    assert hi > 5 * lo


def test_epsilon_decays_with_the_episodes_a_learner_learns() -> None:
    # Bug guarded: learn no longer stepped the explorer, so epsilon never decayed.
    learner = Learner(R, "fixed", LearnerConfig(exploration="epsilon", epsilon_half_life=1), seed=0)
    for i in range(3):
        learner.learn(_episode(IDS[:2], [1.0, 0.0], f"e{i}", query=f"q{i}"))
    assert learner._explorer.epsilon < 0.1


def test_keep_random_keeps_the_learners_own_generator_state() -> None:
    # Bug guarded: load_state_dict(keep_random=True) took the saved generator states all the same.
    a = Learner(R, "gradient", seed=1)
    b = Learner(R, "gradient", seed=2)
    b.rank(_context(), 3)
    before = b.policy._rng.bit_generator.state
    b.load_state_dict(a.state_dict(), keep_random=True)
    assert b.policy._rng.bit_generator.state == before
    b.load_state_dict(a.state_dict())
    assert b.policy._rng.bit_generator.state == a.policy._rng.bit_generator.state != before


def test_an_answer_keeps_the_unused_chunks_between_its_used_ones() -> None:
    # Bug guarded: only unused chunks above the first used one were dropped, not those above the last used one.
    ep = Episode("e", "q", ("a",), Decision({"a": 1.0}), ("cut0", "x", "cut", "y"), np.ones((4, 1)),
                 np.array([0.0, 1.0, 0.0, 1.0]), 1.0, used=np.array([False, True, False, True]))
    assert _as_answered(ep).shown_ids == ("x", "y")


def test_partial_fit_counts_each_event_as_one_asking() -> None:
    # Bug guarded: partial_fit counted every episode as an asking, so an event's later feedback asked again.
    learner = Learner(R, "fixed", LearnerConfig(), seed=0)
    learner.partial_fit([_episode(IDS[:2], [1.0, 0.0], "e1"), _episode(IDS[:2], [1.0, 0.0], "e2"),
                         _episode(IDS[:2], [0.0, 1.0], "e2", prior=np.array([1.0, 0.0]))])
    # the first event's asking came before the question was remembered: only e2's counts
    assert learner.memory.asks("q") == 1


def test_the_learners_clock_does_not_go_back_for_a_late_episode() -> None:
    # Bug guarded: the learner's clock took each episode's time, so a late episode moved it back.
    learner = Learner(R, "fixed")
    learner.learn(dataclasses.replace(_episode(IDS[:2], [1.0, 0.0], "e1"), timestamp=2000.0))
    learner.learn(dataclasses.replace(_episode(IDS[:2], [1.0, 0.0], "e2"), timestamp=1000.0))
    assert learner.state_dict()["now"] == 2000.0


# -- memory --------------------------------------------------------------------------------------------------


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


# -- discovery -----------------------------------------------------------------------------------------------


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


# -- confidence ----------------------------------------------------------------------------------------------


def test_a_chunks_uncertainty_stays_at_most_one_above_a_confident_prior() -> None:
    # Bug guarded: uncertainty was not clipped, and a click on a chunk with a low prior mean read above 1.
    confidence = ChunkConfidence(prior_alpha=2.0, prior_beta=8.0)
    confidence.update(["a"], [1.0])
    assert 0.0 <= confidence.uncertainty(["a"])[0] <= 1.0


# -- exploration ---------------------------------------------------------------------------------------------


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


# -- feedback learning ---------------------------------------------------------------------------------------


def test_feedback_on_a_chunk_is_chunk_level_and_on_the_answer_response_level(tmp_path) -> None:
    # Bug guarded: response_level was inverted, so a chunk's thumbs down read as criticism of the whole answer.
    t0 = 1_000_000.0
    store = FeedbackStore(tmp_path / "feedback.db", clock=lambda: t0 + 10_000)
    ens = FeedbackEnsemble.from_texts(["aurora charged particles sun", "aurora lights north sky", "tides moon"],
                                      retrievers=("bm25",), store=store, policy="gradient")
    r = ens.retrieve("aurora", 2, explore=False, timestamp=t0)
    assert r.event_id is not None
    second = r.hits[1].chunk_id
    down = ens.feedback(r.event_id, "thumbs_down", chunk_id=second, timestamp=t0)
    assert ens.episode(r.event_id, down).response_level is False
    up = ens.feedback(r.event_id, "thumbs_up", timestamp=t0 + 1)
    assert ens.episode(r.event_id, up).response_level is True
