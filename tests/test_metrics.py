"""Parity of rlfb.metrics with trec_eval, through pytrec_eval and ir-measures, on the same runs."""

from __future__ import annotations

import random

import ir_measures
import numpy as np
import pytest
import pytrec_eval

from rlfb.errors import ValidationError
from rlfb.metrics import evaluate_run, mrr_at_k, ndcg_at_k, precision_at_k, recall_at_k, run_to_ranking
from rlfb.offline import trec_top


def _random_runs(seed: int = 3, n_queries: int = 40, n_docs: int = 60):
    rng = random.Random(seed)
    qrels, runs = {}, {}
    for q in range(n_queries):
        qid = f"q{q}"
        docs = [f"d{d}" for d in range(n_docs)]
        judged = rng.sample(docs, 12)
        qrels[qid] = {d: rng.choice([0, 1, 2, 3, 4]) for d in judged}
        if all(g == 0 for g in qrels[qid].values()):
            qrels[qid][judged[0]] = 2
        # distinct scores: trec_eval's tie-breaking is exercised separately below
        scores = rng.sample(range(10_000), n_docs)
        runs[qid] = {d: float(s) for d, s in zip(docs, scores, strict=True)}
    return qrels, runs


def test_parity_with_pytrec_eval() -> None:
    qrels, runs = _random_runs()
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "P.10", "recall.100", "recip_rank"})
    ref = evaluator.evaluate(runs)
    for q, run in runs.items():
        ranking = run_to_ranking(run)
        assert ndcg_at_k(ranking, qrels[q], 10) == pytest.approx(ref[q]["ndcg_cut_10"], abs=1e-9)
        assert precision_at_k(ranking, qrels[q], 10) == pytest.approx(ref[q]["P_10"], abs=1e-9)
        assert recall_at_k(ranking, qrels[q], 100) == pytest.approx(ref[q]["recall_100"], abs=1e-9)
        # recip_rank has no cut-off; with 60 docs, MRR@100 equals it
        assert mrr_at_k(ranking, qrels[q], 100) == pytest.approx(ref[q]["recip_rank"], abs=1e-9)


def test_parity_with_ir_measures_aggregates() -> None:
    qrels, runs = _random_runs(seed=11)
    measures = [ir_measures.nDCG @ 10, ir_measures.RR @ 10, ir_measures.P @ 10, ir_measures.R @ 100]
    ref = ir_measures.calc_aggregate(measures, qrels, runs)
    ours = evaluate_run({q: run_to_ranking(r) for q, r in runs.items()}, qrels)
    assert ours["ndcg@10"] == pytest.approx(ref[ir_measures.nDCG @ 10], abs=1e-9)
    assert ours["mrr@10"] == pytest.approx(ref[ir_measures.RR @ 10], abs=1e-9)
    assert ours["p@10"] == pytest.approx(ref[ir_measures.P @ 10], abs=1e-9)
    assert ours["recall@100"] == pytest.approx(ref[ir_measures.R @ 100], abs=1e-9)


def test_ties_are_broken_like_trec_eval() -> None:
    qrels = {"q": {"d2": 1}}
    run = {"q": {"d1": 1.0, "d2": 1.0, "d3": 1.0, "d10": 1.0}}
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)["q"]["recip_rank"]
    assert mrr_at_k(run_to_ranking(run["q"]), qrels["q"], 10) == pytest.approx(ref)


def test_hand_computed_values() -> None:
    qrel = {"a": 3, "b": 1}
    # DCG = 1/log2(2) + 3/log2(3); ideal = 3 + 1/log2(3)
    assert ndcg_at_k(["b", "a"], qrel, 10) == pytest.approx((1 + 3 / 1.5849625) / (3 + 1 / 1.5849625))
    assert ndcg_at_k(["x"], {"x": 0}, 10) == 0.0
    assert precision_at_k(["a", "x", "b"], qrel, 2) == 0.5
    assert mrr_at_k(["x", "y", "b"], qrel, 2) == 0.0


def test_bad_k() -> None:
    with pytest.raises(ValidationError):
        ndcg_at_k(["a"], {"a": 1}, 0)


def test_the_simulators_vectorised_ndcg_matches_pytrec_eval() -> None:
    """Every simulate figure comes from the runner's own vectorised nDCG@10: it must be trec_eval's."""
    from types import SimpleNamespace

    import numpy as np

    from rlfb.simulation.baselines import Judge as _Judge

    qrels, runs = _random_runs(seed=5)
    rng = random.Random(5)
    candidates_of = {q: rng.sample(sorted(run), 25) for q, run in runs.items()}  # relevant docs left out too
    cut = {q: {d: runs[q][d] for d in candidates_of[q]} for q in runs}
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(cut)
    for q, ids in candidates_of.items():
        judge = _Judge(SimpleNamespace(candidate_ids=tuple(ids)), qrels[q], 10)  # type: ignore[arg-type]
        scores = np.array([cut[q][d] for d in ids])
        assert judge.ndcg(scores[:, None])[0] == pytest.approx(ref[q]["ndcg_cut_10"], abs=1e-9)
        assert judge.ndcg_order(np.argsort(-scores)) == pytest.approx(ref[q]["ndcg_cut_10"], abs=1e-9)


def test_the_simulators_ndcg_breaks_tied_scores_as_trec_eval_does() -> None:
    # tied scores were taken in candidate order, trec_eval's are by document id, descending: bm25 alone on cisi
    # read 0.3409 held-out where pytrec_eval gives 0.3422
    from types import SimpleNamespace

    import numpy as np

    from rlfb.simulation.baselines import Judge as _Judge

    rng = random.Random(11)
    for trial in range(200):
        ids = rng.sample([f"d{i:02d}" for i in range(40)], 25)
        qrel = {d: rng.choice([0, 1, 2, 3]) for d in rng.sample(ids, 8)}
        qrel.setdefault(ids[0], 1)
        scores = np.array([float(rng.randint(0, 3)) for _ in ids])  # few values: many ties
        ref = pytrec_eval.RelevanceEvaluator({"q": qrel}, {"ndcg_cut.10"}).evaluate(
            {"q": {d: s for d, s in zip(ids, scores, strict=True)}})
        judge = _Judge(SimpleNamespace(candidate_ids=tuple(ids)), qrel, 10)  # type: ignore[arg-type]
        assert judge.ndcg(scores[:, None])[0] == pytest.approx(ref["q"]["ndcg_cut_10"], abs=1e-9), trial


def test_a_query_judged_only_irrelevant_counts_as_zero_like_trec_eval() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 0}}
    run = {"q1": {"a": 2.0, "b": 1.0}, "q2": {"a": 2.0, "b": 1.0}}
    ref = ir_measures.calc_aggregate([ir_measures.nDCG @ 10, ir_measures.P @ 10], qrels, run)
    ours = evaluate_run({q: run_to_ranking(r) for q, r in run.items()}, qrels, [("ndcg", 10), ("p", 10)])
    assert ours["ndcg@10"] == pytest.approx(ref[ir_measures.nDCG @ 10])
    assert ours["p@10"] == pytest.approx(ref[ir_measures.P @ 10])
    assert ours["ndcg@10"] == pytest.approx(0.5)  # it used to leave q2 out: 1.0


@pytest.mark.parametrize("metric", [ndcg_at_k, recall_at_k, precision_at_k, mrr_at_k])
def test_a_ranking_listing_a_document_twice_is_an_error(metric) -> None:
    with pytest.raises(ValidationError, match="'a' is listed twice"):
        metric(["a", "b", "a"], {"a": 1}, 10)  # nDCG was 2.13 and recall 2.0
    assert metric(["a", "b", "a"], {"a": 1}, 2) == metric(["a", "b"], {"a": 1}, 2)  # below the cut-off: unseen


@pytest.mark.parametrize("fusion", ["minmax", "rrf"])
def test_evaluate_ensemble_breaks_score_ties_like_trec_eval(fusion: str) -> None:
    """``rlfb evaluate``'s runs broke ties by corpus order (top_k), so its metrics differed from pytrec_eval's."""
    from rlfb import FeedbackEnsemble
    from rlfb.offline import evaluate_ensemble

    texts = ["apple"] * 5 + ["apple pear"] * 4 + ["banana"] * 3  # two groups of tied BM25 scores
    ids = ["d0", "d1", "d2", "d3", "d4", "e0", "e1", "e2", "e3", "f0", "f1", "f2"]
    ens = FeedbackEnsemble.from_texts(texts, ids=ids, retrievers=("bm25",), fusion=fusion)
    qrels = {"a": {"d0": 1, "d4": 2}, "p": {"e0": 1, "d1": 1}}
    queries = {"a": "apple", "p": "pear"}
    measures = [("ndcg", 10), ("mrr", 10), ("p", 3), ("recall", 10)]
    got = evaluate_ensemble(ens, queries, qrels, measures=measures)
    scores = ens.retrievers["bm25"].score_all_batch(list(queries.values()))
    run = {q: {d: float(s) for d, s in zip(ids, row, strict=True)} for q, row in zip(queries, scores, strict=True)}
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recip_rank", "P.3", "recall.10"}).evaluate(run)
    for ours, theirs in (("ndcg@10", "ndcg_cut_10"), ("mrr@10", "recip_rank"), ("p@3", "P_3"),
                         ("recall@10", "recall_10")):
        assert got["bm25"][ours] == pytest.approx(sum(r[theirs] for r in ref.values()) / 2, abs=1e-9), ours
    if fusion == "minmax":  # one retriever: the fused scores tie where BM25's do
        assert got["fused"] == pytest.approx(got["bm25"], abs=1e-9)


def test_evaluate_ensemble_cuts_ties_at_the_depth_in_trec_order() -> None:
    """Documents tying with the last one of a run compete for its place as trec_eval orders them, not by file order."""
    from rlfb import FeedbackEnsemble
    from rlfb.offline import evaluate_ensemble

    ids = ["d0", "d1", "d2", "d3", "d4", "x"]
    ens = FeedbackEnsemble.from_texts(["apple"] * 5 + ["pear"], ids=ids, retrievers=("bm25",), fusion="minmax")
    got = evaluate_ensemble(ens, {"q": "apple"}, {"q": {"d4": 1}}, depth=2, measures=[("recall", 2)], k=2)
    assert got["bm25"]["recall@2"] == 1.0  # trec order: d4, d3, d2, d1, d0 (it took d0, d1)
    assert got["fused"]["recall@2"] == 1.0


def test_a_nan_score_is_refused_not_left_to_scramble_the_order() -> None:
    # NaN compares false both ways: {a: 1, n: nan, b: 3, c: 2} came out as a, n, b, c (b scored best)
    with pytest.raises(ValidationError, match="NaN"):
        run_to_ranking({"a": 1.0, "n": float("nan"), "b": 3.0, "c": 2.0})
    assert run_to_ranking({"a": 1.0, "n": float("-inf"), "b": 3.0, "c": 2.0}) == ["b", "c", "a", "n"]


@pytest.mark.parametrize("ranking", [{"b": 0.1, "c": 0.2, "a": 0.9}, "bca"])
def test_evaluate_run_refuses_a_ranking_that_is_not_a_list_of_doc_ids(ranking) -> None:
    # a pytrec_eval-style {doc: score} run was read as its keys in insertion order: mrr 0.33 where it is 1.0
    with pytest.raises(ValidationError, match="run_to_ranking"):
        evaluate_run({"q": ranking}, {"q": {"a": 1}})
    assert evaluate_run({"q": run_to_ranking({"b": 0.1, "c": 0.2, "a": 0.9})}, {"q": {"a": 1}},
                        [("mrr", 10)]) == {"mrr@10": 1.0}


@pytest.mark.parametrize("measures", [[("map", 10)], [("ndcg", 0)]])
def test_evaluate_run_refuses_a_bad_measure_even_with_no_query_judged(measures) -> None:
    # an unknown name raised a bare KeyError, and ndcg@0 passed unseen when no query was judged
    for qrels in ({"q": {"a": 1}}, {}):
        with pytest.raises(ValidationError):
            evaluate_run({"q": ["a"]}, qrels, measures)


def test_a_judged_query_missing_from_the_run_scores_zero() -> None:
    # trec_eval's -c: a judged query the run has no ranking for counts as 0, not as absent (skipping it would
    # raise every mean by the queries a system failed to answer)
    assert evaluate_run({"q1": ["a"]}, {"q1": {"a": 1}, "q2": {"b": 1}}, [("p", 1)]) == {"p@1": 0.5}


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_trec_top_ranks_a_nan_score_last() -> None:
    """Bug guarded: a NaN score taken as is made the cut at the depth drop a scored document."""
    assert trec_top(["a", "b", "c"], np.array([np.nan, 1.0, 0.5]), 2) == ["b", "c"]


def test_trec_top_at_depth_zero_is_empty_and_a_negative_depth_is_named() -> None:
    from rlfb.errors import ValidationError
    from rlfb.offline import trec_top

    assert trec_top(["a", "b"], np.array([1.0, 0.5]), 0) == []
    with pytest.raises(ValidationError, match="depth"):
        trec_top(["a", "b"], np.array([1.0, 0.5]), -1)


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
