"""A query that is a document of the corpus too (ArguAna, Quora) is not ranked its own answer.

In those collections every question is also a document, under the same id and with the same text; it matches
itself best, which is not the task, and BEIR leaves it out of the question's results (``ignore_identical_ids``;
BM25 on ArguAna 31.5 -> 41.4 nDCG@10 with it). rlfb ranked it first for every such question, in ``rlfb
evaluate``, in what the simulated users were shown and in every baseline (an audit of 2026-12-06 measured fused
nDCG@10 0.343 where 0.452 was right), without a word.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlfb import FeedbackEnsemble
from rlfb.candidates import make_context, without_candidates
from rlfb.cli import main
from rlfb.datasets import load_beir
from rlfb.offline import evaluate_ensemble
from rlfb.simulation.runner import SimulationConfig, prepare

ARGUMENTS = {
    "a1": "Tides follow the moon and the sun across the ocean",
    "a2": "Lava cools into basalt rock near the volcano",
    "a3": "Glaciers carve valleys of ice over many centuries",
}
# each argument's counter-argument, the relevant document, shares some of its words
COUNTERS = {
    "c1": "The moon alone does not explain ocean tides",
    "c2": "Basalt forms from lava only at some volcano sites",
    "c3": "Valleys of ice are carved by rivers as much as glaciers",
}


def write_arguana_like(root: Path, *, spacing: str = " ") -> Path:
    """Questions that are documents too (``a1``-``a3``: same id, same text but for case and spacing), plus a
    question ``3`` whose id names a document of other text, as cranfield's numbers do."""
    (root / "qrels").mkdir(parents=True)
    docs = [{"_id": i, "title": "", "text": t} for i, t in ARGUMENTS.items()]
    docs += [{"_id": i, "title": "counter", "text": t} for i, t in COUNTERS.items()]
    docs.append({"_id": "3", "title": "dunes", "text": "a survey of desert sand dunes"})
    queries = [{"_id": i, "text": t.upper().replace(" ", spacing)} for i, t in ARGUMENTS.items()]
    queries.append({"_id": "3", "text": "desert sand dunes"})
    qrels = ["query-id\tcorpus-id\tscore", "a1\tc1\t1", "a2\tc2\t1", "a3\tc3\t1", "3\t3\t1"]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return root


def test_a_query_that_is_a_document_is_known_by_id_and_text(tmp_path: Path) -> None:
    data = load_beir(write_arguana_like(tmp_path / "c", spacing="  "))
    assert data.query_documents == {"a1", "a2", "a3"}  # not "3": its document has another text
    assert data.own_documents(["a1", "3", "c1"]) == {"a1": frozenset({"a1"})}
    assert any("each of 3 judged queries" in note and "as BEIR does" in note for note in data.left_out_notes())


@pytest.mark.parametrize("name", ["cranfield", "cisi", "scifact"])
def test_no_query_of_the_shared_collections_is_its_own_document(name: str, request: pytest.FixtureRequest) -> None:
    # cranfield's and cisi's query ids are numbers that name documents too: those are other texts, and stay ranked
    data = load_beir(request.getfixturevalue(f"{name}_path"))
    assert data.query_documents == frozenset()
    if name != "scifact":
        assert set(data.queries) & {c.id for c in data.corpus}


def test_leaving_a_candidate_out_closes_up_each_retrievers_ranks() -> None:
    raw = np.array([[5.0, 0.2], [9.0, 0.9], [5.0, 0.1], [1.0, 0.5]])
    ranks = np.array([[2.0, 2.0], [1.0, 1.0], [2.0, 3.0], [4.0, np.nan]])  # b and c tie at 2 in the first
    ctx = make_context("q", ["b", "self", "c", "d"], raw, ranks, None, retrievers=("x", "y"), fusion="rrf",
                       rrf_c=60.0, embed=lambda q: None)
    out = without_candidates(ctx, {"self"}, fusion="rrf", rrf_c=60.0)
    assert out.candidate_ids == ("b", "c", "d")
    np.testing.assert_array_equal(out.ranks, [[1.0, 1.0], [1.0, 2.0], [3.0, np.nan]])
    np.testing.assert_allclose(out.normalized[0], [1 / 61, 1 / 61])
    assert out.normalized[2, 1] == 0.0  # no rank there: no RRF score, as before
    tied = without_candidates(ctx, {"b"}, fusion="rrf", rrf_c=60.0)
    assert tied.ranks is not None
    np.testing.assert_array_equal(tied.ranks[:, 0], [1.0, 2.0, 3.0])  # c keeps the place it shared with b
    assert without_candidates(ctx, {"zzz"}, fusion="rrf", rrf_c=60.0) is ctx


def test_evaluation_leaves_each_querys_own_document_out_of_every_run(tmp_path: Path) -> None:
    data = load_beir(write_arguana_like(tmp_path / "c"))
    ens = FeedbackEnsemble.from_chunks(data.corpus, retrievers=("bm25",))
    queries = data.split_queries()
    qrels = {q: dict(r) for q, r in data.split().items()}
    measures = [("mrr", 10)]
    kept = evaluate_ensemble(ens, queries, qrels, measures=measures)
    fair = evaluate_ensemble(ens, queries, qrels, measures=measures, left_out=data.own_documents(queries))
    # each argument found itself first, its counter-argument second: MRR 0.5 on those three
    assert kept["bm25"]["mrr@10"] == pytest.approx((3 * 0.5 + 1.0) / 4)
    assert fair["bm25"]["mrr@10"] == fair["fused"]["mrr@10"] == 1.0


def test_the_simulator_never_shows_a_query_its_own_document(tmp_path: Path) -> None:
    data = load_beir(write_arguana_like(tmp_path / "c"))
    config = SimulationConfig(policy="fixed", interactions=5, seeds=(0,), checkpoints=1, retrievers=("bm25",))
    prep = prepare(data, config)
    for q in ("a1", "a2", "a3"):
        ctx = prep.contexts[q]
        assert q not in ctx.candidate_ids and ctx.candidate_ids[int(np.argmax(ctx.normalized[:, 0]))] == "c" + q[1]
    assert "3" in prep.contexts["3"].candidate_ids  # a query id naming a document of other text is kept


def test_the_cli_says_so_and_the_json_counts_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = write_arguana_like(tmp_path / "c")
    out = tmp_path / "ev.json"
    assert main(["evaluate", "--dataset", str(root), "--retrievers", "bm25", "--json", str(out)]) == 0
    assert "each of 3 judged queries" in capsys.readouterr().err
    assert json.loads(out.read_text())["bm25"]["mrr@10"] == 1.0
    sim = tmp_path / "sim.json"
    assert main(["simulate", "--dataset", str(root), "--retrievers", "bm25", "--policy", "fixed", "--interactions",
                 "4", "--seeds", "1", "--quiet", "--json", str(sim)]) == 0
    config = json.loads(sim.read_text())["config"]
    assert config["own_documents_left_out"] == {"test": 3} and config["unknown_judgments"] == {"test": 0}


def test_a_query_that_is_its_documents_title_and_text_is_known_as_that_document(tmp_path: Path) -> None:
    # a mutation review (2026-12-07): compared with the document's text alone, a question that repeats its
    # title and text together was not known as its own document, which then ranked for it
    (tmp_path / "qrels").mkdir()
    docs = [{"_id": "1", "title": "Coffee is good", "text": "for you"}, {"_id": "2", "title": "", "text": "tea"}]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "1", "text": "coffee is good  for you"}) + "\n",
                                            encoding="utf-8")
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\t2\t1\n", encoding="utf-8")
    assert load_beir(tmp_path).query_documents == {"1"}


def test_a_left_out_document_does_not_shorten_a_retrievers_run() -> None:
    # a mutation review (2026-12-07): a retriever's run cut at its depth before a question's own document was taken
    # out of it came one document short, which lowered its recall (BEIR's ignore_identical_ids)
    from _four_texts import bm25_ensemble

    out = evaluate_ensemble(bm25_ensemble(), {"q": "the sun and the moon"}, {"q": {"aurora": 1, "volcanoes": 1}},
                            depth=2, measures=(("recall", 2),), left_out={"q": ["tides"]})
    assert out["bm25"]["recall@2"] == 1.0
