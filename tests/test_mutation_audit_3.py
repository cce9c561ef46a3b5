"""Behaviours a hand-made mutation audit found no test for: guardrail, implicit signals, click evidence, query
features, candidates, relevance feedback, weight files, offline evaluation, members, blocks, the encoding cache,
saved folders, the simulation runner and the gradient and batch policies. Each test names the bug it guards
against."""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlfb import FeedbackEnsemble
from rlfb.blocks import decode_block, encode_block
from rlfb.errors import CorruptStateError, RlfbError, ValidationError
from rlfb.features import query_features, query_type
from rlfb.guardrail import Guardrail
from rlfb.implicit import ImplicitSignals
from rlfb.members import SearchMember
from rlfb.offline import trec_top
from rlfb.policies.base import Decision, Episode
from rlfb.policies.batch import BatchPolicy
from rlfb.policies.click_evidence import ClickEvidence
from rlfb.policies.gradient import GradientPolicy
from rlfb.relevance_feedback import similar_to_clicked
from rlfb.retrievers.cache import EmbeddingCache, SparseVector, prune_cache
from rlfb.saved_folder import saving_into
from rlfb.types import Chunk

# -- guardrail -----------------------------------------------------------------------------------------------

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


# -- implicit signals ----------------------------------------------------------------------------------------


def test_japanese_particles_do_not_count_as_content_words_of_a_restatement() -> None:
    """Bug guarded: hiragana runs (particles, endings) counted as content words and diluted the overlap."""
    assert ImplicitSignals().overlap("オーロラはなぜ光る", "オーロラが光る理由") == 1.0


# -- query features ------------------------------------------------------------------------------------------


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


# -- click evidence ------------------------------------------------------------------------------------------


def test_click_evidence_forgets_the_least_recently_used_question() -> None:
    """Bug guarded: at max_queries the most recently used question was forgotten, not the least."""
    ev = ClickEvidence(2, max_queries=2)
    for q in ("q1", "q2", "q1", "q3"):
        ev.update(np.array([0.5, 1.0]), q, 1.0, 1.0)
    assert ev.state_dict()["queries"] == ["q1", "q3"]


# -- relevance feedback --------------------------------------------------------------------------------------


def test_relevance_feedback_does_not_depend_on_how_much_evidence_there_is() -> None:
    """Bug guarded: the centroid was not normalised, so twice the evidence doubled the cosines and the
    MIN_SPREAD floor let near-duplicates drift apart."""
    vectors = np.array([[1.0, 0.0], [0.9995, 0.0316]])  # near-duplicates
    once = similar_to_clicked(vectors, np.array([1.0, 0.0]))
    np.testing.assert_allclose(similar_to_clicked(vectors, np.array([2.0, 0.0])), once, rtol=1e-12)


# -- offline evaluation --------------------------------------------------------------------------------------


def test_trec_top_ranks_a_nan_score_last() -> None:
    """Bug guarded: a NaN score taken as is made the cut at the depth drop a scored document."""
    assert trec_top(["a", "b", "c"], np.array([np.nan, 1.0, 0.5]), 2) == ["b", "c"]


# -- members -------------------------------------------------------------------------------------------------


def test_a_member_listing_a_chunk_twice_keeps_it_once_at_its_best_position() -> None:
    """Bug guarded: a chunk a member listed twice came back twice."""
    a, b = Chunk("a", "alpha"), Chunk("b", "beta")
    m = SearchMember("kb", lambda q, k: [(a, 0.9), (b, 0.5), (a, 0.1)])
    assert [(c.id, s) for c, s in m.search("q", 3)] == [("a", 0.9), ("b", 0.5)]


def test_a_member_whose_search_is_not_callable_is_refused_when_made() -> None:
    """Bug guarded: a member made with a search that is no function failed only at its first retrieval."""
    with pytest.raises(ValidationError, match="callable"):
        SearchMember("kb", [(Chunk("a", "alpha"), 1.0)])  # type: ignore[arg-type]


# -- blocks --------------------------------------------------------------------------------------------------


def test_a_block_with_a_character_outside_base64_is_damage() -> None:
    """Bug guarded: base64 decoded without validation skipped stray characters and read a damaged block."""
    text = encode_block([0.25, 0.5])
    with pytest.raises(CorruptStateError, match="damaged"):
        decode_block({"x": text[:4] + "!" + text[4:]}, "x", 2, owner="the test's")


# -- candidates ----------------------------------------------------------------------------------------------

TEXTS = ["the aurora is caused by solar wind", "tides follow the moon", "volcanoes erupt magma"]


def _bm25_ensemble(**kw: Any) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, ids=["a", "b", "c"], retrievers=("bm25",), **kw)


def test_rerank_keeps_the_first_chunk_given_under_a_repeated_id() -> None:
    """Bug guarded: of two chunks given under one id, the last one given was scored and returned."""
    chunks = [Chunk("x", "aurora and solar wind"), Chunk("x", "nothing alike")]
    hits = _bm25_ensemble().rerank("aurora", chunks, explore=False, log=False).hits
    assert [(h.chunk_id, h.text) for h in hits] == [("x", "aurora and solar wind")]


# -- the encoding cache --------------------------------------------------------------------------------------


def _set_row(folder: Path, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(folder / "embeddings.sqlite")
    with conn:
        conn.execute(sql, args)
    conn.close()


def test_a_cached_sparse_row_with_a_term_id_at_its_dimension_is_a_miss(tmp_path: Path) -> None:
    """Bug guarded: a term id equal to the dimension passed the bounds check of a cached row."""
    cache = EmbeddingCache(tmp_path, "toy|document", max_mb=100)
    cache.put_many({"inside": SparseVector(np.array([2]), np.array([0.5]), 3),
                    "outside": SparseVector(np.array([3]), np.array([0.5]), 3)})
    assert sorted(cache.get_many(["inside", "outside"])) == ["inside"]
    cache.close()


def test_prune_by_unused_days_counts_whole_days(tmp_path: Path) -> None:
    """Bug guarded: unused_days was read in the wrong unit, removing encodings used two hours ago."""
    cache = EmbeddingCache(tmp_path, "toy|document", max_mb=100)
    cache.put_many({"recent": np.zeros(4), "old": np.zeros(4)})
    cache.close()
    now = int(time.time())
    _set_row(tmp_path, "UPDATE encodings SET used_at = ? WHERE text_hash = 'recent'", now - 7200)
    _set_row(tmp_path, "UPDATE encodings SET used_at = ? WHERE text_hash = 'old'", now - 2 * 86400)
    assert prune_cache(tmp_path, unused_days=1)["removed"] == 1
    assert sorted(EmbeddingCache(tmp_path, "toy|document", max_mb=100).get_many(["recent", "old"])) == ["recent"]


# -- saved folders -------------------------------------------------------------------------------------------


def test_a_save_that_writes_a_name_its_kind_does_not_list_is_refused_and_not_swapped_in(tmp_path: Path) -> None:
    """Bug guarded: a save writing a file missing from its kind's list of names was kept, and every later save to
    the folder then refused it as holding something else."""
    root = tmp_path / "thing"
    with pytest.raises(RlfbError, match=r"wrote \['extra.txt'\], which its list of saved names lacks"):
        with saving_into(root, marker="thing.json", what="thing", names=frozenset({"thing.json"})) as tmp:
            (tmp / "thing.json").write_text("{}")
            (tmp / "extra.txt").write_text("not listed")
    assert not root.exists()


# -- the simulation runner -----------------------------------------------------------------------------------


def test_the_tuned_weights_are_chosen_on_the_stream_and_the_oracle_on_the_held_out_questions() -> None:
    """Bug guarded: the tuned baseline was chosen on the held-out questions, making it the oracle under a
    more modest name."""
    from types import SimpleNamespace

    from rlfb.simulation.baselines import Judge as _Judge
    from rlfb.simulation.baselines import fixed_baselines as _baselines
    from rlfb.simulation.runner import SimulationConfig

    # r1 puts d1 first, r2 puts d2 first; the stream question wants d1, the held-out one d2
    # stand-ins for a Context and a Prepared: only the fields read
    ctx: Any = SimpleNamespace(retrievers=("r1", "r2"), candidate_ids=("d1", "d2"),
                               raw=np.array([[1.0, 0.0], [0.0, 1.0]]), ranks=np.array([[1.0, 2.0], [2.0, 1.0]]))
    qrels = {"s": {"d1": 1}, "h": {"d2": 1}}
    prep: Any = SimpleNamespace(contexts={"s": ctx, "h": ctx})
    config = SimulationConfig(grid_step=0.5)
    judges = {q: _Judge(ctx, qrels[q], config.k) for q in qrels}
    result = _baselines(prep, config, ["s"], ["h"], judges, [], {"s": 1})
    assert result["tuned_fixed"]["weights"] == {"r1": 1.0, "r2": 0.0}
    assert result["oracle_fixed"]["weights"] == {"r1": 0.0, "r2": 1.0}


def test_each_seed_samples_its_own_max_heldout_questions_from_a_held_out_split() -> None:
    """Bug guarded: the max_heldout sample was drawn with one fixed seed, so every seed scored the same questions
    where a stream split fixes the held-out pool."""
    from types import SimpleNamespace

    from rlfb.simulation.runner import SimulationConfig, _split

    held = [f"t{i:02d}" for i in range(30)]
    texts = {q: f"question {q}?" for q in [*held, "s1", "s2"]}
    prep: Any = SimpleNamespace(stream_qrels={"s1": {"d": 1}, "s2": {"d": 1}}, qrels={q: {"d": 1} for q in held},
                                contexts=dict.fromkeys(texts), dataset=SimpleNamespace(queries=texts))
    config = SimulationConfig(max_heldout=5)
    samples = {tuple(_split(prep, config, seed=seed)[1]) for seed in range(3)}
    assert len(samples) == 3


# -- the gradient and batch policies -------------------------------------------------------------------------

RETRIEVERS3 = ("bm25", "dense", "splade")


def _episode(shown: list[list[float]], rewards: list[float], *, weights: tuple[float, ...] = (1 / 3,) * 3,
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
        p.learn(_episode([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], [0.0, r]), 1.0)
        sums.append(p.state_dict()["state"]["grad_sums"])
    assert sums[1] == sums[0]


def test_a_later_click_on_an_event_counts_only_its_own_pairs() -> None:
    """Bug guarded: a second click on an event counted the first click's pairs again (n_pairs twice as large)."""
    p = GradientPolicy(RETRIEVERS3, seed=0)
    shown = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    later = dataclasses.replace(_episode(shown, [0.0, 0.0, 1.0]), prior_rewards=np.array([0.0, 1.0, 0.0]))
    p.learn(later, 1.0)
    assert p.state_dict()["state"]["n_pairs"] == 1.0  # chunk 2 over chunk 0; chunk 1 was learned from before


def test_the_batch_policy_buffers_a_reward_beyond_one_as_one_and_its_state_still_loads() -> None:
    """Bug guarded: a reward of 5 was buffered as it came, and the saved state then failed to load."""
    p = BatchPolicy(RETRIEVERS3, batch_size=3, seed=0)
    p.learn(_episode([[1.0, 0.0, 0.0]], [5.0]), 5.0)
    state = p.state_dict()
    assert state["state"]["buffer"][0][1] == 1.0
    BatchPolicy(RETRIEVERS3, batch_size=3, seed=0).load_state_dict(state)


def _batch_after_one_batch(**kw: Any) -> BatchPolicy:
    """A batch policy after one batch: the event shown weights leaning to bm25 did better than the one leaning to
    dense, and the batch's mean reward (0.6) is past the positive threshold."""
    tune = kw.pop("tune", {})
    p = BatchPolicy(RETRIEVERS3, batch_size=2, seed=0, **kw).tune(**tune)
    p.learn(_episode([[1.0, 0.0, 0.0]], [1.0], weights=(0.6, 0.2, 0.2), eid="e1"), 1.0)
    p.learn(_episode([[1.0, 0.0, 0.0]], [0.2], weights=(0.2, 0.6, 0.2), eid="e2"), 0.2)
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


def test_a_guardrail_state_whose_mean_square_is_below_its_squared_mean_is_damage() -> None:
    """Each field was checked on its own: ema -0.5 with ema2 0 (a negative variance) loaded, and its standard
    error of 0 let the next episode move the multipliers on the mean alone."""
    from rlfb.errors import CorruptStateError
    from rlfb.guardrail import Guardrail

    state = Guardrail().state_dict()
    with pytest.raises(CorruptStateError, match="inconsistent"):
        Guardrail().load_state_dict({**state, "ema": -0.5, "ema2": 0.0, "n": 100})
    Guardrail().load_state_dict({**state, "ema": -0.5, "ema2": 0.25, "n": 100})  # every reward -0.5: sound


def test_trec_top_at_depth_zero_is_empty_and_a_negative_depth_is_named() -> None:
    from rlfb.errors import ValidationError
    from rlfb.offline import trec_top

    assert trec_top(["a", "b"], np.array([1.0, 0.5]), 0) == []
    with pytest.raises(ValidationError, match="depth"):
        trec_top(["a", "b"], np.array([1.0, 0.5]), -1)
