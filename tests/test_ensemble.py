"""FeedbackEnsemble: fused hits with every score, weights that change the ranking, persistence, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rlfb import (
    CorruptStateError,
    DuplicateIdError,
    EmptyCorpusError,
    FeedbackEnsemble,
    InvalidWeightsError,
    NoStoreError,
    ValidationError,
)
from rlfb.fusion import FUSION_METHODS
from rlfb.retrievers.bm25 import BM25Retriever
from rlfb.types import make_chunks

from _corpus import IDS as _ALL_IDS
from _corpus import TEXTS as _ALL_TEXTS

# the first eight chunks of the shared test corpus
TEXTS = _ALL_TEXTS[:8]
IDS = _ALL_IDS[:8]


@pytest.fixture(scope="module")
def ens() -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"), candidate_k=3)


def test_hits_carry_every_score(ens: FeedbackEnsemble) -> None:
    result = ens.retrieve("what causes aurora", k=3, log=False, explore=False)
    assert result.event_id is None
    assert [h.rank for h in result.hits] == [1, 2, 3]
    assert result.hits[0].chunk_id == "doc0"
    scores = [h.score for h in result.hits]
    assert scores == sorted(scores, reverse=True)
    for hit in result.hits:
        assert set(hit.scores) == {"bm25", "dense"} and set(hit.normalized) == {"bm25", "dense"}
        assert hit.text == TEXTS[IDS.index(hit.chunk_id)]
        assert hit.proposed_by and set(hit.proposed_by) <= {"bm25", "dense"}
        assert all(v is not None and math.isfinite(v) for v in hit.scores.values())


def test_union_is_scored_by_every_retriever(ens: FeedbackEnsemble) -> None:
    """A chunk that BM25 did not propose still gets BM25's real score, not zero."""
    ctx = ens.context("northern lights glow")
    bm25 = ens.retrievers["bm25"]
    dense = ens.retrievers["dense"]
    np.testing.assert_allclose(ctx.raw[:, 0], bm25.score("northern lights glow", list(ctx.candidate_ids)))
    np.testing.assert_allclose(ctx.raw[:, 1], dense.score("northern lights glow", list(ctx.candidate_ids)))
    assert len(ctx.candidate_ids) > ens.candidate_k  # the union of two top-3 lists that differ


@pytest.mark.parametrize("fusion", sorted(FUSION_METHODS))
def test_weights_change_the_ranking_in_every_fusion_mode(fusion: str) -> None:
    query = "titanium bolt glow of the aurora"

    def ranking(weights: list[float]) -> list[str]:
        e = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"), fusion=fusion,
                                        weights=weights)
        return e.retrieve(query, k=8, log=False, explore=False).chunk_ids

    lexical, semantic = ranking([0.95, 0.05]), ranking([0.05, 0.95])
    bm25_only = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",))
    bm25_top = bm25_only.retrieve(query, k=1, log=False, explore=False)
    assert lexical[0] == bm25_top.chunk_ids[0]
    assert lexical != semantic


def test_save_and_load_give_identical_results(ens: FeedbackEnsemble, tmp_path) -> None:
    ens.save(tmp_path / "idx")
    again = FeedbackEnsemble.load(tmp_path / "idx")
    for q in ["aurora", "XK-4471", "why do tides happen", "ice valleys"]:
        a, b = ens.retrieve(q, k=5, log=False, explore=False), again.retrieve(q, k=5, log=False, explore=False)
        assert a.chunk_ids == b.chunk_ids
        np.testing.assert_allclose([h.score for h in a.hits], [h.score for h in b.hits], rtol=1e-6)
    assert again.weights == ens.weights


def test_corrupt_saved_state_is_a_named_error(ens: FeedbackEnsemble, tmp_path) -> None:
    ens.save(tmp_path / "idx")
    (tmp_path / "idx" / "ensemble.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CorruptStateError):
        FeedbackEnsemble.load(tmp_path / "idx")


def test_bad_input_is_rejected_clearly(ens: FeedbackEnsemble) -> None:
    with pytest.raises(EmptyCorpusError):
        FeedbackEnsemble.from_texts([], retrievers=("bm25",))
    with pytest.raises(DuplicateIdError):
        FeedbackEnsemble.from_texts(["a", "b"], ids=["x", "x"], retrievers=("bm25",))
    for k in (0, -1, 1.5):
        with pytest.raises(ValidationError):
            ens.retrieve("aurora", k=k, log=False, explore=False)  # type: ignore[arg-type]
    with pytest.raises(InvalidWeightsError):
        FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25", "dense"), weights=[float("nan"), 1.0])
    with pytest.raises(InvalidWeightsError):
        FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25", "dense"), weights=[-1.0, 2.0])
    with pytest.raises(ValidationError, match="unknown fusion"):
        FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), fusion="borda")
    with pytest.raises(ValidationError):
        ens.retrieve(None, k=3)  # type: ignore[arg-type]
    with pytest.raises(NoStoreError, match="no feedback store"):
        ens.feedback("e1", "explicit_positive")


def test_k_larger_than_corpus_returns_everything(ens: FeedbackEnsemble) -> None:
    assert len(ens.retrieve("aurora", k=50, log=False, explore=False).hits) == len(TEXTS)


def test_weights_mapping(ens: FeedbackEnsemble) -> None:
    assert ens.weights == pytest.approx({"bm25": 0.5, "dense": 0.5})
    e = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25", "dense"), weights={"bm25": 3, "dense": 1})
    assert e.weights == pytest.approx({"bm25": 0.75, "dense": 0.25})


def test_feedback_and_observe_without_a_dense_retriever() -> None:
    """SPLADE encodes queries into sparse vectors: memory and reformulation checks must not use them."""
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "splade"), store=":memory:",
                                      policy="thompson")
    r = ens.retrieve("what causes the aurora", k=3, session_id="s1")
    assert ens.feedback(r.event_id, "implicit_positive", chunk_id=r.hits[0].chunk_id).reward > 0
    (reformulation,) = ens.observe("s1", "what causes the aurora borealis", dwell_seconds=3)
    assert reformulation.signal == "reformulation" and reformulation.reward < 0
    assert ens.observe("s1", "what causes the aurora borealis", dwell_seconds=3)[0].duplicate  # recorded once


def test_bad_member_results_and_metadata_are_named_errors() -> None:
    from rlfb.members import SearchMember
    from rlfb.types import Chunk

    good = Chunk("w1", "web page about the aurora")
    for bad in ([good], [(good, "high")], [(good, 0.5, "extra")], [("w1", 0.5)]):
        member = SearchMember("web", lambda q, k, bad=bad: bad)  # type: ignore[misc]
        with pytest.raises(ValidationError, match="member 'web'"):
            member.search("aurora", 5)
    member = SearchMember("web", lambda q, k: [(good, None), (Chunk("w2", "tides"), float("nan"))])
    assert [s for _, s in member.search("aurora", 5)] == [1 / 61, 1 / 62]  # no score: fused by rank
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=":memory:")
    with pytest.raises(ValidationError, match="metadata must be a mapping"):
        ens.retrieve("aurora", k=2, metadata=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="rrf_c"):
        FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), rrf_c="x")


def test_rank_context_used_spreads_praise_of_the_answer_over_the_chunks_it_was_written_from() -> None:
    from rlfb.store import FeedbackStore

    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=FeedbackStore())
    ctx = ens.context("the aurora and the moon tides", k=5)
    r = ens.rank_context(ctx, 5, explore=False, used=2)
    record = ens.feedback(r.event_id, "thumbs_up")
    assert set(record.chunk_rewards) == set(r.chunk_ids[:2])  # not the three chunks the answer did not use
    everything = ens.rank_context(ctx, 5, explore=False)  # None: every chunk shown was used
    assert set(ens.feedback(everything.event_id, "thumbs_up").chunk_rewards) == set(everything.chunk_ids)
    with pytest.raises(ValidationError, match="used"):
        ens.rank_context(ctx, 5, used=0)


def test_embedding_strs_average_the_dense_scores_only(tmp_path) -> None:
    ens = FeedbackEnsemble.from_texts(
        ["tides follow the moon", "the aurora glows green", "volcanoes erupt magma"], ids=["t", "a", "v"],
        retrievers=("bm25", "dense"), candidate_k=3)
    strs = ("the moon pulls the sea", "what causes tides")
    ctx = ens.context("what causes tides", embedding_strs=strs)
    cols = {n: j for j, n in enumerate(ens.retriever_names)}
    dense, bm25 = ens.retrievers["dense"], ens.retrievers["bm25"]
    want = np.mean([dense.score(s, list(ctx.candidate_ids)) for s in strs], axis=0)
    np.testing.assert_allclose(ctx.raw[:, cols["dense"]], want)
    np.testing.assert_allclose(ctx.raw[:, cols["bm25"]], bm25.score("what causes tides", list(ctx.candidate_ids)))
    assert ctx.query == "what causes tides"
    for none in ([], ["", "  "]):  # none given, or only blank ones (an LLM's empty answer): the question itself
        plain = ens.context("what causes tides", embedding_strs=none)
        alone = dense.score("what causes tides", list(plain.candidate_ids))
        np.testing.assert_allclose(plain.raw[:, cols["dense"]], alone)
    for bad in ("one string", [3], ["ok", None]):
        with pytest.raises(ValidationError, match="embedding_strs"):
            ens.retrieve("tides", embedding_strs=bad)  # type: ignore[arg-type]


def test_embedding_strs_score_a_members_chunks_as_the_pooled_ones() -> None:
    # a chunk only a member found was scored against the question: one dense column of two scales
    from rlfb.members import SearchMember
    from rlfb.types import Chunk

    texts = ["tides follow the moon", "the aurora glows green", "volcanoes erupt magma"]
    member = SearchMember("kb", lambda q, k: [(Chunk("v", texts[2]), 1.0), (Chunk("out", "the sea rises"), 0.5)])
    ens = FeedbackEnsemble.from_texts(texts, ids=["t", "a", "v"], retrievers=("bm25", "dense"), candidate_k=1,
                                      members=[member])
    strs = ("the moon pulls the sea", "what causes tides")
    ctx = ens.context("what causes tides", embedding_strs=strs)
    dense, col = ens.retrievers["dense"], list(ctx.retrievers).index("dense")
    for i, cid in enumerate(ctx.candidate_ids):
        want = (np.mean([dense.score(s, [cid])[0] for s in strs]) if cid != "out"
                else np.mean([dense.score_texts(s, ["the sea rises"])[0] for s in strs]))
        assert ctx.raw[i, col] == pytest.approx(want), cid


def test_a_retrieval_no_feedback_can_reach_is_not_explored(tmp_path) -> None:
    # an ensemble without a store (or log=False) explored all the same: the top chunk changed in about half of
    # the calls, and thompson showed a sampled weight arm, for a reader whose feedback could teach nothing
    words = "apple banana cherry date elder fig grape honey iris jade kiwi lemon mango".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, size=8)) for _ in range(60)]
    for store in (None, tmp_path / "fb.db"):
        ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), policy="thompson", fusion="rrf", store=store)
        greedy = ens.retrieve("apple banana cherry", k=10, explore=False, log=False)
        unlogged = [ens.retrieve("apple banana cherry", k=10, log=store is None) for _ in range(30)]
        assert all(r.chunk_ids == greedy.chunk_ids and not r.explored for r in unlogged)
        assert all(r.weights == greedy.weights for r in unlogged)
        if store is not None:  # logged, the same retrieval explores
            logged = [ens.retrieve("apple banana cherry", k=10) for _ in range(30)]
            assert any(r.explored for r in logged) and any(r.chunk_ids != greedy.chunk_ids for r in logged)
        ens.close()


def test_a_chunk_bm25_scored_zero_is_not_proposed_by_it() -> None:
    # BM25's top list pads with chunks sharing no word with the question; they were logged as proposed by it
    texts = ["the aurora glows green over the pole"] + [f"note {i} on tides and volcanoes" for i in range(20)]
    ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",))
    hits = ens.retrieve("aurora", k=5).hits
    top = hits[0].scores["bm25"]
    assert hits[0].proposed_by == ("bm25",) and top is not None and top > 0
    assert all(h.proposed_by == () and h.scores["bm25"] == 0 for h in hits[1:])


def test_an_unlogged_greedy_ranking_changes_no_learned_state(tmp_path) -> None:
    # an evaluation's ranking (log=False, explore=False) stamped the feedback memory's entries as used, so
    # measuring the learner moved their eviction order and clock
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="thompson", store=tmp_path / "fb.db")
    first = ens.retrieve("moon tides", k=3, explore=False)
    ens.feedback(first.event_id, "click", chunk_id=first.hits[0].chunk_id)
    assert ens.learner.memory.known("moon tides")  # the memory has an entry for the question

    def state() -> str:
        return json.dumps(ens.learner.state_dict(), sort_keys=True, default=str)

    before = state()
    for _ in range(3):
        assert ens.retrieve("moon tides", k=3, explore=False, log=False).event_id is None
    assert state() == before
    ens.retrieve("moon tides", k=3, explore=False)  # a ranking a user is shown does count as a use
    assert state() != before
    ens.close()


def test_a_chunk_only_a_member_found_ranks_below_every_pooled_candidate_in_a_corpus_retrievers_column() -> None:
    # a member's chunk outside the index took rank 1 in BM25's column (its rank tail lost the pool's offset),
    # so RRF gave it BM25's top rank as well as the member's
    from rlfb.members import SearchMember
    from rlfb.types import Chunk

    outside = Chunk("web1", "tides tides tides moon sea")
    member = SearchMember("web", lambda q, k: [(outside, 1.0)])
    ens = FeedbackEnsemble.from_texts(["tides follow the moon", "the moon pulls the sea", "tides rise twice a day",
                                       "volcanoes erupt lava"], ids=["a", "b", "c", "d"], retrievers=("bm25",),
                                      members=[member], fusion="rrf")
    ctx = ens.context("tides moon")
    i = list(ctx.candidate_ids).index("web1")
    col = list(ctx.retrievers).index("bm25")
    others = [j for j in range(len(ctx.candidate_ids)) if j != i]
    assert ctx.ranks is not None
    assert ctx.ranks[i, col] > ctx.ranks[others, col].max()


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_a_retriever_indexing_other_ids_with_the_same_texts_is_refused() -> None:
    """Bug: only the texts were compared, so a retriever indexed under other ids (the same texts) was taken, and
    its score vectors were read against ids it does not hold."""
    other = BM25Retriever().index(make_chunks(TEXTS, ids=[f"other-{i}" for i in IDS]))
    with pytest.raises(ValidationError, match="same order"):
        FeedbackEnsemble({"bm25": other}, make_chunks(TEXTS, ids=IDS))
