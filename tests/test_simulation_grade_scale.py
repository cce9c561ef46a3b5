"""The simulator's fixes from the audits of 2026-12-06: the users' grade scale comes from the stream's own
judgments, and a qrels file that gives a side of the run no question is named in the error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlfb.datasets import load_beir
from rlfb.errors import ValidationError
from rlfb.simulation import runner
from rlfb.simulation.runner import SimulationConfig, _parts, prepare, run_seed, users_scale
from rlfb.simulation.users import CLICK_MODELS, to_grade

WORDS = ["aurora sky", "moon tides", "lava ash", "ice valleys", "desert sand", "coral reef", "pine forest",
         "river delta"]
CONFIG = SimulationConfig(policy="fixed", interactions=5, seeds=(0,), checkpoints=1, retrievers=("bm25",))


def write_beir(root: Path, test: list[str], train: list[str] | None = None, *, queries: int = len(WORDS)) -> Path:
    """A tiny BEIR folder: document ``d<i>`` and query ``q<i>`` share the words ``WORDS[i]``; ``test`` and
    ``train`` are qrels lines (``query doc grade``, whitespace-separated)."""
    (root / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": w, "text": f"all about {w}"} for i, w in enumerate(WORDS)]
    asked = [{"_id": f"q{i}", "text": w} for i, w in enumerate(WORDS[:queries])]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in asked), encoding="utf-8")
    for split, lines in (("test", test), ("train", train)):
        if lines is not None:
            rows = ["query-id\tcorpus-id\tscore", *("\t".join(line.split()) for line in lines)]
            (root / "qrels" / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def test_the_users_scale_reads_the_stream_questions_judgments_only() -> None:
    judgments = {"s1": {"a": 1, "b": 0}, "s2": {"c": 2}, "h": {"a": 4}}
    assert users_scale(["s1", "s2"], judgments) == 2  # h's 4 is not the stream's
    assert users_scale(["s1"], judgments) == 1
    assert users_scale(["s2"], judgments) == 2  # one relevant value reads as binary: to_grade(2, 2) is the top
    assert to_grade(2, users_scale(["s2"], judgments)) == 4.0
    assert users_scale([], judgments) == 1 and users_scale(["z"], {"z": {"a": 0, "b": -1}}) == 1


def test_a_grade_only_the_held_out_half_judges_leaves_the_stream_users_clicks_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a train.tsv, a seeded half of test.tsv is the stream: a grade 3 judged only in the held-out half
    made every relevant stream chunk grade 1 of 1-3 (P(click) 0.3, not 0.95), so held-out judgments changed
    how the users clicked."""
    binary = [f"q{i} d{i} 1" for i in range(len(WORDS))]
    plain = prepare(load_beir(write_beir(tmp_path / "plain", binary)), CONFIG)
    graded = prepare(load_beir(write_beir(tmp_path / "graded", ["q0 d0 3", *binary[1:]])), CONFIG)
    seed = next(s for s in range(100) if "q0" in _parts(plain, CONFIG, s).heldout)  # the halves are seeded
    assert graded.max_grade == 3  # the split's: the held-out half's grade is in it
    parts = _parts(graded, CONFIG, seed)
    assert "q0" in parts.heldout and parts.stream
    assert users_scale(parts.stream, parts.judgments) == 1

    made: list[int] = []
    user = runner.SimulatedUser

    def recorded(*args, **kwargs):
        made.append(kwargs["max_grade"])
        return user(*args, **kwargs)

    monkeypatch.setattr(runner, "SimulatedUser", recorded)
    config = SimulationConfig(policy="fixed", interactions=5, seeds=(seed,), checkpoints=1, retrievers=("bm25",))
    runs = [run_seed(prep, config, seed) for prep in (graded, plain)]
    assert made == [1, 1] and [r["settings"]["max_grade"] for r in runs] == [1, 1]
    click = CLICK_MODELS["navigational"].p_click
    assert click(to_grade(1, made[0])) == click(4) == 0.95
    assert runs[0]["final"]["online_ndcg@10"] == runs[1]["final"]["online_ndcg@10"]


def test_the_summary_gives_each_seeds_scale_where_the_seeds_differ() -> None:
    from rlfb.simulation.results import _users_scales

    def runs(*scales: int) -> list[dict]:
        return [{"settings": {"max_grade": s}} for s in scales]

    assert _users_scales(runs(4, 4)) == {"max_grade": 4}
    assert _users_scales(runs(4, 3)) == {"max_grade": [4, 3]}
    assert _users_scales([{"settings": {}}]) == {}


@pytest.mark.parametrize(("train", "why"), [
    (["q4 d4 0", "q5 d5 0"], r"\(of its judged queries, 2 with no document of corpus.jsonl judged relevant\)"),
    (["q20 d4 1", "q21 d5 1"], r"\(of its judged queries, 2 with no text in queries.jsonl\)"),
    (["q4 d4 0", "q21 d5 2"], r"\(of its judged queries, 1 with no text in queries.jsonl and 1 with no document "
                              r"of corpus.jsonl judged relevant\)"),
    ([], r"\(it judges no query at all\)"),
])
def test_a_train_split_that_judges_nothing_relevant_is_named(tmp_path: Path, train: list[str], why: str) -> None:
    # it ended in the generic "the dataset needs judged queries for both the stream and the held-out set"
    data = load_beir(write_beir(tmp_path / "beir", ["q0 d0 1", "q1 d1 1"], train))
    with pytest.raises(ValidationError, match=r"^beir: qrels/train.tsv judges no query of queries.jsonl relevant to "
                                              rf"any document {why}, and the stream's questions come from it \("
                                              r"without the file, a seeded half of qrels/test.tsv's would be\)$"):
        prepare(data, CONFIG)


def test_a_held_out_split_that_judges_nothing_relevant_is_named(tmp_path: Path) -> None:
    data = load_beir(write_beir(tmp_path / "beir", ["q0 d0 0", "q30 d1 1"], ["q4 d4 1", "q5 d5 1"]))
    with pytest.raises(ValidationError, match=r"^beir: qrels/test.tsv judges no query of queries.jsonl relevant to "
                                              r"any document \(of its judged queries, 1 with no text in queries.jsonl "
                                              r"and 1 with no document of corpus.jsonl judged relevant\), and the "
                                              r"held-out questions come from it$"):
        prepare(data, CONFIG)


def test_one_judged_query_without_a_train_split_names_the_file(tmp_path: Path) -> None:
    data = load_beir(write_beir(tmp_path / "beir", ["q0 d0 1", "q1 d1 0"]))
    with pytest.raises(ValidationError, match=r"^beir: qrels/test.tsv judges only one query .* without a "
                                              r"qrels/train.tsv a seeded half .* both the stream and the held-out"):
        prepare(data, CONFIG)


def test_a_run_whose_seeds_stream_other_top_grades_gives_each_seeds_scale(tmp_path: Path) -> None:
    from rlfb.simulation.runner import simulate

    binary = [f"q{i} d{i} 1" for i in range(len(WORDS))]
    graded = prepare(load_beir(write_beir(tmp_path / "graded", ["q0 d0 3", *binary[1:]])), CONFIG)
    held = next(s for s in range(100) if "q0" in _parts(graded, CONFIG, s).heldout)
    streamed = next(s for s in range(100) if "q0" in _parts(graded, CONFIG, s).stream)
    config = SimulationConfig(policy="fixed", interactions=5, seeds=(held, streamed), checkpoints=1,
                              retrievers=("bm25",))
    out = simulate(graded.dataset, config, prepared=graded)
    assert out["config"]["max_grade"] == [1, 3]


def test_a_train_split_of_another_corpus_is_named_as_such(tmp_path: Path) -> None:
    # every relevant judgment of train.tsv names a document corpus.jsonl lacks: say so, not "judges no query"
    data = load_beir(write_beir(tmp_path / "beir", ["q0 d0 1", "q1 d1 1"], ["q4 x4 1", "q5 x5 1"]))
    with pytest.raises(ValidationError, match=r"^beir: none of the 2 relevant judgments of qrels/train.tsv names a "
                                              r"document of corpus.jsonl \(such as .x4. and .x5.\)$"):
        prepare(data, CONFIG)
