"""Relevance feedback: candidates like the chunks clicked for a question rank higher when it is asked again
(``relevance_feedback_weight``, off by default)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import numpy as np
import pytest

from rlfb import FeedbackEnsemble
from rlfb.errors import ValidationError
from rlfb.learner import Learner, LearnerConfig
from rlfb.policies.base import Context, Episode
from rlfb.relevance_feedback import similar_to_clicked
from rlfb.retrievers import DenseRetriever

from _corpus import IDS, TEXTS

RETRIEVERS = ("bm25", "dense")
ON: dict[str, Any] = {"relevance_feedback_weight": 0.1}
IDS4 = ("clicked", "like_clicked", "other1", "other2")
# "like_clicked" points almost where "clicked" does; the others elsewhere
VECTORS = np.array([[1.0, 0.0, 0.0], [0.95, 0.31, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
# the retrievers rank the two unlike chunks first and the like one last
SCORES = np.array([[0.6, 0.6], [0.5, 0.5], [0.7, 0.7], [0.65, 0.65]])


def test_similarity_to_the_clicked_chunks_as_a_z_score():
    z = similar_to_clicked(VECTORS, np.array([1.0, 0.0, 0.0, 0.0]))
    assert z.mean() == pytest.approx(0.0, abs=1e-12) and z.std() == pytest.approx(1.0)
    assert z[1] > z[3] and z[1] > z[2]
    # negative evidence is not a centroid to move toward or away from
    np.testing.assert_array_equal(similar_to_clicked(VECTORS, np.array([0.0, -1.0, -1.0, 0.0])), np.zeros(4))
    # every candidate equally like the clicked ones (zero rows, one candidate): nothing to tell them apart
    np.testing.assert_array_equal(similar_to_clicked(np.zeros((3, 2)), np.ones(3)), np.zeros(3))
    np.testing.assert_array_equal(similar_to_clicked(VECTORS[:1], np.ones(1)), np.zeros(1))
    assert similar_to_clicked(np.zeros((0, 3)), np.zeros(0)).shape == (0,)


def _context(query: str = "q", vectors: np.ndarray | None = VECTORS) -> Context:
    return Context(query, RETRIEVERS, IDS4, SCORES, SCORES, candidate_embeddings=vectors)


def _after_a_click(config: LearnerConfig, ctx: Context) -> Learner:
    learner = Learner(RETRIEVERS, "fixed", config)
    r = learner.rank(ctx, 4, explore=False)
    shown = tuple(ctx.candidate_ids[i] for i in r.order)
    rewards = np.array([0.4 if c == "clicked" else 0.0 for c in shown])
    learner.learn(Episode("e", ctx.query, RETRIEVERS, r.decision, shown, ctx.normalized[r.order], rewards, 0.4))
    return learner


def _order(learner: Learner, ctx: Context) -> list[str]:
    return [ctx.candidate_ids[i] for i in learner.rank(ctx, 4, explore=False).order]


def test_a_chunk_like_the_clicked_one_rises_when_the_question_comes_again():
    cfg = LearnerConfig(exploration="none", confidence_weight=0.0, discovery_rate=0.0, **ON)
    ctx = _context()
    assert _order(Learner(RETRIEVERS, "fixed", cfg), ctx) == ["other1", "other2", "clicked", "like_clicked"]
    learner = _after_a_click(cfg, ctx)
    order = _order(learner, ctx)
    # the clicked chunk first (the memory), the one like it above the two passed over and the unread one
    assert order[:2] == ["clicked", "like_clicked"], order
    # without relevance feedback (the default) the memory lifts the clicked chunk alone
    without = _after_a_click(dataclasses.replace(cfg, relevance_feedback_weight=0.0), ctx)
    assert _order(without, ctx)[-1] == "like_clicked"
    assert LearnerConfig().relevance_feedback_weight == 0.0
    # a context without embeddings (a retriever set with no dense member) ranks as without
    assert _order(learner, _context(vectors=None)) == _order(without, ctx)
    # another question: nothing remembered for it, nothing moves
    assert _order(learner, _context("another question")) == ["other1", "other2", "clicked", "like_clicked"]
    # the memory off turns relevance feedback off with it
    off = _after_a_click(dataclasses.replace(cfg, memory_weight=0.0), ctx)
    assert _order(off, ctx) == ["other1", "other2", "clicked", "like_clicked"]


def test_a_candidate_without_an_embedding_is_neither_lifted_nor_pushed_down():
    # a chunk outside the index (a re-ranked node, a member's find) has a zero row: its similarity 0 was read as
    # far below the others', and a copy of the clicked chunk's text ranked under chunks about something else
    cfg = LearnerConfig(exploration="none", confidence_weight=0.0, discovery_rate=0.0, **ON)
    vectors = VECTORS.copy()
    vectors[1] = 0.0  # "like_clicked" given from outside the index
    ctx = _context(vectors=vectors)
    on = _after_a_click(cfg, ctx)
    off = _after_a_click(dataclasses.replace(cfg, relevance_feedback_weight=0.0), ctx)
    on_fused = on.rank(ctx, 4, explore=False).fused
    off_fused = off.rank(ctx, 4, explore=False).fused
    assert on_fused[1] == pytest.approx(off_fused[1])
    assert on_fused[0] > off_fused[0] and on_fused[2] < off_fused[2]  # the others still move


@pytest.mark.parametrize("vectors, message", [
    (np.ones((3, 3)), "one row for each of the 4 candidates"),
    (np.ones(4), "one row for each of the 4 candidates"),
    (np.full((4, 3), np.nan), "finite"),
    ([["a", "b"]] * 4, "matrix of numbers"),
])
def test_candidate_embeddings_are_checked(vectors, message):
    learner = Learner(RETRIEVERS, "fixed", LearnerConfig(**ON))
    with pytest.raises(ValidationError, match=message):
        learner.rank(_context(vectors=vectors), 4)


def test_the_setting_is_validated():
    with pytest.raises(ValidationError, match="relevance_feedback_weight"):
        LearnerConfig(relevance_feedback_weight=-0.1)
    assert LearnerConfig.from_dict({}).relevance_feedback_weight == LearnerConfig().relevance_feedback_weight


@pytest.fixture(scope="module")
def ens() -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS[:8], ids=IDS[:8], retrievers=RETRIEVERS, candidate_k=4,
                                       learner_config=ON)


def test_the_ensemble_gives_the_learner_the_dense_embeddings_of_the_candidates(ens: FeedbackEnsemble):
    ctx = ens.context("what causes aurora")
    dense = cast(DenseRetriever, ens.retrievers["dense"])
    rows = [dense.ids.index(c) for c in ctx.candidate_ids]
    np.testing.assert_array_equal(ctx.candidate_embeddings, dense.embeddings[rows])
    # a re-ranked chunk from outside the index, and one given with another text than the indexed one, have none
    from rlfb.types import Chunk

    given = [Chunk(IDS[0], TEXTS[0]), Chunk(IDS[1], "an edited text"), Chunk("outside", "not in the index")]
    re = ens.rerank_context("what causes aurora", given)
    assert re.candidate_embeddings is not None
    np.testing.assert_array_equal(re.candidate_embeddings[0], dense.embeddings[dense.ids.index(IDS[0])])
    assert not re.candidate_embeddings[1:].any()
    # without a dense retriever there are none, and none are gathered where the learner does not read them
    assert FeedbackEnsemble.from_texts(TEXTS[:8], ids=IDS[:8], retrievers=("bm25",), learner_config=ON) \
        .context("aurora").candidate_embeddings is None
    for off in ({}, {"memory_weight": 0.0, **ON}):
        plain = FeedbackEnsemble(ens.retrievers, ens.chunks, learner_config=off or None)
        assert plain.context("what causes aurora").candidate_embeddings is None


def test_contexts_kept_for_later_feedback_do_not_hold_the_embeddings(tmp_path):
    ens = FeedbackEnsemble.from_texts(TEXTS[:8], ids=IDS[:8], retrievers=RETRIEVERS, store=tmp_path / "fb.db",
                                      learner_config=ON)
    result = ens.retrieve("what causes aurora", k=2, explore=False)
    assert ens.context("what causes aurora").candidate_embeddings is not None
    assert result.event_id is not None
    kept = ens._contexts[result.event_id]
    assert kept.candidate_embeddings is None and kept.candidate_ids
    ens.feedback(result.event_id, "thumbs_up")  # learning from it needs none
    assert ens.learner.memory.known("what causes aurora")
    ens.close()


def test_negative_evidence_takes_no_part_in_the_clicked_centroid() -> None:
    # a negative weight pulled the centroid away from what was passed over, towards its opposite
    vectors = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    assert np.allclose(similar_to_clicked(vectors, np.array([1.0, -5.0, 0.0])),
                       similar_to_clicked(vectors, np.array([1.0, 0.0, 0.0])))
    assert similar_to_clicked(vectors, np.array([0.0, -1.0, 0.0])).tolist() == [0.0, 0.0, 0.0]


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_relevance_feedback_does_not_depend_on_how_much_evidence_there_is() -> None:
    """Bug guarded: the centroid was not normalised, so twice the evidence doubled the cosines and the
    MIN_SPREAD floor let near-duplicates drift apart."""
    vectors = np.array([[1.0, 0.0], [0.9995, 0.0316]])  # near-duplicates
    once = similar_to_clicked(vectors, np.array([1.0, 0.0]))
    np.testing.assert_allclose(similar_to_clicked(vectors, np.array([2.0, 0.0])), once, rtol=1e-12)
