from __future__ import annotations

import numpy as np
import pytest

from rlfb.errors import InvalidWeightsError, ValidationError
from rlfb.fusion import (
    FUSION_METHODS,
    exploration_scale,
    fuse,
    minmax_normalize,
    normalize,
    rank_matrix,
    rrf_normalize,
    score_scale,
    validate_weights,
    weighted_fusion,
    weighted_rrf,
    zscore_normalize,
)

# candidate 0 is bm25's favourite, candidate 2 is dense's favourite
RAW = np.array([[12.0, 0.10], [6.0, 0.50], [1.0, 0.95], [3.0, 0.40]])


@pytest.mark.parametrize("method", sorted(FUSION_METHODS))
def test_weights_change_the_ranking_in_every_mode(method: str) -> None:
    towards_bm25 = np.argsort(-fuse(RAW, [0.9, 0.1], method), kind="stable")
    towards_dense = np.argsort(-fuse(RAW, [0.1, 0.9], method), kind="stable")
    assert towards_bm25[0] == 0
    assert towards_dense[0] == 2
    assert towards_bm25.tolist() != towards_dense.tolist()


def test_rrf_uses_the_weights_and_one_based_ranks() -> None:
    ranks = rank_matrix(RAW)
    assert ranks[:, 0].tolist() == [1, 2, 4, 3]
    fused = fuse(RAW, [0.75, 0.25], "rrf", c=60)
    expected = 0.75 / (60 + ranks[:, 0]) + 0.25 / (60 + ranks[:, 1])
    np.testing.assert_allclose(fused, expected)


def test_rrf_accepts_ranks_from_the_full_ranking() -> None:
    ranks = np.array([[1.0, 200.0], [150.0, 1.0]])
    out = normalize(np.zeros((2, 2)), "rrf", ranks=ranks, c=60)
    np.testing.assert_allclose(out, 1 / (60 + ranks))


@pytest.mark.parametrize("ranks", [[[1.0, 1.0]], [2.0], np.ones((4, 3))])
def test_rrf_refuses_ranks_of_another_shape_than_the_scores(ranks) -> None:
    # ranks of one row gave one fused score for four candidates; a flat list failed as a weights error
    with pytest.raises(ValidationError, match="shape"):
        fuse(RAW, [0.5, 0.5], "rrf", ranks=np.asarray(ranks))


def test_minmax_and_zscore() -> None:
    mm = minmax_normalize(RAW)
    assert mm.min(axis=0).tolist() == [0, 0] and mm.max(axis=0).tolist() == [1, 1]
    z = zscore_normalize(RAW)
    np.testing.assert_allclose(z.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(z.std(axis=0), 1)


def test_constant_column_carries_no_information() -> None:
    raw = np.array([[1.0, 0.3], [1.0, 0.7]])
    assert minmax_normalize(raw)[:, 0].tolist() == [0, 0]
    assert zscore_normalize(raw)[:, 0].tolist() == [0, 0]


def test_inputs_are_not_modified() -> None:
    raw = RAW.copy()
    for method in FUSION_METHODS:
        fuse(raw, [0.5, 0.5], method)
    np.testing.assert_array_equal(raw, RAW)


@pytest.mark.parametrize(
    "weights",
    [[float("nan"), 1.0], [float("inf"), 1.0], [-0.1, 1.1], [0.0, 0.0], [], ["a", 1]],
)
def test_bad_weights_are_rejected(weights: list) -> None:
    with pytest.raises(InvalidWeightsError):
        validate_weights(weights)


def test_weights_mapping_must_name_the_retrievers() -> None:
    with pytest.raises(InvalidWeightsError, match="missing"):
        validate_weights({"bm25": 1.0}, ["bm25", "dense"])
    with pytest.raises(InvalidWeightsError, match="unknown"):
        validate_weights({"bm25": 1.0, "dense": 1.0, "colbert": 1.0}, ["bm25", "dense"])
    with pytest.raises(InvalidWeightsError):
        fuse(RAW, [1.0, 0.0, 0.0])


def test_weights_are_normalised() -> None:
    assert validate_weights([2, 2]).tolist() == [0.5, 0.5]


def test_bad_scores_and_methods() -> None:
    with pytest.raises(ValidationError):
        normalize(np.array([[np.inf]]), "minmax")
    with pytest.raises(ValidationError, match="unknown fusion method"):
        normalize(RAW, "borda")
    with pytest.raises(ValidationError):
        rrf_normalize(np.array([[0.0]]))


def test_weighted_rrf_matches_langchain_formula() -> None:
    fused = weighted_rrf([["a", "b", "c"], ["c", "a"]], [0.3, 0.7], c=60)
    assert fused["a"] == pytest.approx(0.3 / 61 + 0.7 / 62)
    assert fused["c"] == pytest.approx(0.3 / 63 + 0.7 / 61)
    assert list(fused)[0] == "c"


@pytest.mark.parametrize("method", sorted(FUSION_METHODS))
def test_missing_scores_get_nothing_from_that_member(method: str) -> None:
    """NaN marks a candidate a search-only member did not return."""
    raw = np.array([[3.0, np.nan], [2.0, 0.9], [1.0, 0.1]])
    out = normalize(raw, method)
    assert not np.isnan(out).any()
    # no better than the member's worst result: 0 for min-max and RRF, the lowest z-score for z-scores
    # (0 is a z-score's mean: a chunk the member did not return beat every below-average one it did)
    assert out[0, 1] == out[1:, 1].min() if method == "zscore" else out[0, 1] == 0.0
    present = normalize(raw[1:, 1:], method)
    if method == "rrf":  # ranks among the returned candidates: 1 and 2
        np.testing.assert_allclose(out[1:, 1], present[:, 0])
    else:
        assert out[1, 1] > out[2, 1]


@pytest.mark.parametrize("value", [0.1, 0.2, 0.3, 0.7, 1.1])
@pytest.mark.parametrize("n", [3, 7])
def test_a_constant_column_normalises_to_zero(value: float, n: int) -> None:
    # the mean's round-off left a std of 1e-17, which scaled every 0.1 in a column to -1 or +1
    for method in ("minmax", "zscore"):
        assert normalize(np.full((n, 1), value), method).tolist() == [[0.0]] * n


def test_tied_scores_share_a_rank_whatever_the_row_order() -> None:
    # BM25 gives 0 to every candidate without a query term: ranked by row, RRF credited the first row
    raw = np.array([[0.0, 0.50], [0.0, 0.51], [0.0, 0.52]])
    fused = fuse(raw, [1, 1], "rrf")
    assert fused.argsort().tolist() == [0, 1, 2]
    np.testing.assert_allclose(fuse(raw[::-1], [1, 1], "rrf"), fused[::-1])
    assert rank_matrix(raw)[:, 0].tolist() == [1.0, 1.0, 1.0]


def test_weighted_rrf_counts_a_repeated_id_once_and_checks_c() -> None:
    assert weighted_rrf([["a", "b", "a"], ["b"]], c=1) == weighted_rrf([["a", "b"], ["b"]], c=1)
    for c in (-1, -1.5, float("nan"), True):
        with pytest.raises(ValidationError, match="RRF constant"):
            weighted_rrf([["a"]], c=c)
    assert weighted_rrf([["a"]], c=np.int64(60)) == {"a": 1 / 61}  # type: ignore[arg-type]


@pytest.mark.parametrize("normalize", [minmax_normalize, zscore_normalize])
def test_scores_near_the_float_limit_keep_their_order(normalize) -> None:
    # their span (or variance) overflowed to infinity, which read as a constant column: best and worst tied
    huge = np.array([[1e308], [-1e308], [np.nan], [5e307]])
    out = normalize(huge).ravel()
    assert np.isfinite(out).all() and out[0] > out[3] > out[1]
    np.testing.assert_allclose(normalize(huge[[0, 1, 3]]), normalize(np.array([[10.0], [-10.0], [5.0]])))


def test_minmax_spans_the_scores_a_retriever_gave_not_its_missing_ones() -> None:
    # a missing score filled with 0 before the span was taken made 0 the floor: 0.7 of [0.7, 0.9] scored 0.78
    # instead of 0
    assert minmax_normalize(np.array([[0.7], [0.9], [np.nan]])).ravel().tolist() == [0.0, 1.0, 0.0]


def test_weights_of_a_score_matrix_as_a_mapping_are_refused() -> None:
    # the matrix's columns have no names: a mapping was taken in its own order, so {"dense": .8, "bm25": .2}
    # over columns (bm25, dense) weighed bm25 0.8
    with pytest.raises(InvalidWeightsError, match="column order"):
        fuse(RAW, {"dense": 0.8, "bm25": 0.2})  # type: ignore[arg-type]


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_weighted_fusion_reads_a_missing_normalised_score_as_zero() -> None:
    """Without its ``nan_to_num``, one missing (NaN) normalised score made the candidate's fused score NaN, which
    sorts unpredictably: a candidate a member did not return gets nothing from it, not NaN."""
    fused = weighted_fusion(np.array([[np.nan, 1.0], [0.5, 0.0]]), [0.5, 0.5])
    assert fused.tolist() == [0.5, 0.25]


def test_exploration_scale_is_the_rrf_drop_over_the_shown_depth_and_the_largest_score_otherwise() -> None:
    from rlfb.candidates import make_context

    ranks = rank_matrix(RAW)
    assert exploration_scale(score_scale(minmax_normalize(RAW)), 10) == 1.0
    assert exploration_scale(score_scale(zscore_normalize(RAW)), 10) == pytest.approx(
        float(np.abs(zscore_normalize(RAW)).max()))
    assert exploration_scale(score_scale(rrf_normalize(ranks)), 10, rrf_c=60.0) == pytest.approx(1 / 61 - 1 / 71)
    assert exploration_scale(score_scale(rrf_normalize(ranks, c=0.0)), 3, rrf_c=0.0) == pytest.approx(1 - 1 / 4)
    with pytest.raises(ValidationError):
        exploration_scale(1.0, 10, rrf_c=float("nan"))
    # the ensemble's contexts say which fusion made their scores
    for fusion, c in (("rrf", 60.0), ("minmax", None), ("zscore", None)):
        ctx = make_context("q", ["a", "b", "c", "d"], RAW, ranks, None, retrievers=("bm25", "dense"),
                           fusion=fusion, rrf_c=60.0, embed=lambda q: None)
        assert ctx.rrf_c == c
