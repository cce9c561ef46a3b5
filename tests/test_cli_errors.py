"""The ``rlfb`` CLI ends bad input with exit status 2 and one ``rlfb: error: ...`` line, never a traceback."""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

import pytest

from rlfb.cli import main
from rlfb.errors import CorruptStateError
from rlfb.store import FeedbackStore

CORPUS = [
    '{"_id": "d1", "title": "aurora", "text": "charged particles in the sky"}',
    '{"_id": "d2", "title": "tides", "text": "the moon pulls the sea"}',
    '{"_id": "d3", "title": "volcano", "text": "lava and ash"}',
]
QUERIES = ['{"_id": "q1", "text": "aurora sky"}', '{"_id": "q2", "text": "moon tides"}']
QRELS = ["query-id\tcorpus-id\tscore", "q1\td1\t1", "q2\td2\t1"]
SMALL_RUN = ["--retrievers", "bm25", "--interactions", "4", "--seeds", "1"]


def write_beir(root: Path, *, queries: bool = True, qrels: list[str] = QRELS) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    if queries:
        (root / "queries.jsonl").write_text("\n".join(QUERIES) + "\n", encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return root


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The captured stderr, checked to be exactly one ``rlfb: error:`` line."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlfb: error: "), err
    return lines[0]


@pytest.fixture
def garbage_db(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not an SQLite database\n" * 50)
    return path


@pytest.fixture
def good_db(tmp_path: Path) -> Path:
    path = tmp_path / "fb.db"
    from rlfb.learner import Learner

    learner = Learner(("bm25", "dense"), policy="fixed", weights={"bm25": 0.6, "dense": 0.4})
    with FeedbackStore(path) as store:  # a learner's state: one no learner can be rebuilt from is not exported
        store.save_policy_state(learner.state_dict(), learner.weights(), policy="fixed")
    return path


# -- weights ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("action", [["show"], ["show", "--json"], ["export", "OUT"], ["import", "OUT"]])
def test_weights_on_a_garbage_file(garbage_db: Path, tmp_path: Path, capsys, action: list[str]) -> None:
    before = garbage_db.read_bytes()
    if action[0] == "import":  # a good file, so that the store is what is refused (a bad file is refused first)
        (tmp_path / "w.json").write_text('{"bm25": 0.5, "dense": 0.5}', encoding="utf-8")
    argv = ["weights", action[0], str(garbage_db), *[str(tmp_path / "w.json") if a == "OUT" else a for a in action[1:]]]
    assert main(argv) == 2
    assert str(garbage_db) in one_error_line(capsys)
    assert garbage_db.read_bytes() == before  # the damaged file is left as it was


def test_weights_when_sqlite_itself_fails(garbage_db: Path, monkeypatch, capsys) -> None:
    """Whether FeedbackStore raises CorruptStateError or lets sqlite3.DatabaseError through, one line names the file."""
    import rlfb.store

    class RawSqliteStore:
        def __init__(self, path: object) -> None:
            raise sqlite3.DatabaseError("file is not a database")

    monkeypatch.setattr(rlfb.store, "FeedbackStore", RawSqliteStore)
    assert main(["weights", "show", str(garbage_db)]) == 2
    assert str(garbage_db) in one_error_line(capsys)


def test_weights_export_makes_a_missing_folder_as_store_export_does(good_db: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "no" / "such" / "dir" / "out.json"
    assert main(["weights", "export", str(good_db), str(out)]) == 0
    assert "weights" in json.loads(out.read_text(encoding="utf-8"))
    capsys.readouterr()
    for folder in (str(tmp_path), str(tmp_path / "new") + "/"):  # a folder named as the file is refused
        assert main(["weights", "export", str(good_db), folder]) == 2
        assert "Is a directory" in one_error_line(capsys)
    assert not (tmp_path / "new").exists()


# -- demo / simulate / evaluate: a bad output path -----------------------------------------------------
def test_demo_out_is_an_existing_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "results"
    out.write_text("keep me", encoding="utf-8")
    assert main(["demo", "--out", str(out), "--devices", "8", *SMALL_RUN]) == 2
    assert str(out) in one_error_line(capsys)
    assert capsys.readouterr().out == ""  # it failed before the run, not after it
    assert out.read_text(encoding="utf-8") == "keep me"


@pytest.mark.parametrize("name", ["results.json", "learning_curves.png"])
def test_demo_output_file_is_a_folder(tmp_path: Path, capsys, name: str) -> None:
    """A folder where demo would write one of its two files is refused before the run, not after it."""
    out = tmp_path / "demo"
    (out / name).mkdir(parents=True)
    assert main(["demo", "--out", str(out), "--devices", "8", *SMALL_RUN]) == 2
    assert str(out / name) in one_error_line(capsys)
    assert capsys.readouterr().out == ""  # it failed before the run, not after it
    assert sorted(p.name for p in out.iterdir()) == [name]  # no partial output beside it


def test_simulate_json_under_a_regular_file(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("keep me", encoding="utf-8")
    data = write_beir(tmp_path / "beir")
    argv = ["simulate", "--dataset", str(data), "--json", str(blocker / "x.json"), "--quiet", *SMALL_RUN]
    assert main(argv) == 2
    assert str(blocker) in one_error_line(capsys)
    assert blocker.read_text(encoding="utf-8") == "keep me"


def test_evaluate_json_is_a_folder(tmp_path: Path, capsys) -> None:
    data = write_beir(tmp_path / "beir")
    assert main(["evaluate", "--dataset", str(data), "--retrievers", "bm25", "--json", str(tmp_path)]) == 2
    assert str(tmp_path) in one_error_line(capsys)


# -- evaluate / simulate: qrels naming documents that are not in the corpus ----------------------------
@pytest.mark.parametrize("command", [["evaluate"], ["simulate", "--quiet", *SMALL_RUN[2:]]], ids=lambda c: c[0])
def test_qrels_of_another_corpus_are_refused(tmp_path: Path, capsys, command: list[str]) -> None:
    """Every relevant judgment names an unknown document: a data error, not a run with every metric 0."""
    data = write_beir(tmp_path / "beir", qrels=[QRELS[0], "q1\tD1\t1", "q2\tD2\t1", "q2\td3\t0"])
    assert main([command[0], "--dataset", str(data), "--retrievers", "bm25", *command[1:]]) == 2
    line = one_error_line(capsys)
    assert "none of the 2 relevant judgments of qrels/test.tsv names a document of corpus.jsonl" in line


@pytest.mark.parametrize("command", [["evaluate"], ["simulate", "--quiet", *SMALL_RUN[2:]]], ids=lambda c: c[0])
def test_judgments_of_unknown_documents_are_left_out_with_a_note(tmp_path: Path, capsys, command: list[str]) -> None:
    data = write_beir(tmp_path / "beir", qrels=[*QRELS, "q2\tD9\t1", "q1\tD8\t0"])
    assert main([command[0], "--dataset", str(data), "--retrievers", "bm25", *command[1:]]) == 0
    err = capsys.readouterr().err
    assert "rlfb: left out 1 relevant judgments of qrels/test.tsv naming documents not in corpus.jsonl" in err


def test_a_query_judged_relevant_only_to_unknown_documents_is_not_called_unjudged(tmp_path: Path, capsys) -> None:
    # it was reported as judged with "no document judged relevant", where its relevant documents are missing
    data = write_beir(tmp_path / "beir", qrels=[QRELS[0], QRELS[1], "q2\tD7\t2", "q2\tD8\t1"])
    assert main(["evaluate", "--dataset", str(data), "--retrievers", "bm25"]) == 0
    err = capsys.readouterr().err
    assert "left out 2 relevant judgments of qrels/test.tsv naming documents not in corpus.jsonl" in err
    assert "left out 1 judged queries of qrels/test.tsv with no document of corpus.jsonl judged relevant" in err


@pytest.mark.parametrize("train", [False, True], ids=["halves", "train split"])
def test_simulate_says_which_judged_queries_it_left_out_and_counts_them(tmp_path: Path, capsys, train: bool) -> None:
    """A judged query without a text, and one judged only irrelevant, were left out silently (evaluate said so)."""
    data = write_beir(tmp_path / "beir", qrels=[*QRELS, "q9\td1\t1", "q3\td3\t0"])
    with open(data / "queries.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"_id": "q3", "text": "volcano ash"}\n{"_id": "q4", "text": "lava"}\n')
    if train:
        (data / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq4\td3\t1\nq8\td1\t1\n")
    out = tmp_path / "sim.json"
    argv = ["simulate", "--dataset", str(data), "--retrievers", "bm25", "--quiet", *SMALL_RUN[2:], "--json", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "rlfb: left out 1 judged queries of qrels/test.tsv with no text in queries.jsonl" in err
    assert "rlfb: left out 1 judged queries of qrels/test.tsv with no document of corpus.jsonl judged relevant" in err
    assert ("rlfb: left out 1 judged queries of qrels/train.tsv with no text in queries.jsonl" in err) == train
    dropped = {"test": {"no_text": 1, "no_relevant": 1}}
    if train:
        dropped["train"] = {"no_text": 1, "no_relevant": 0}
    config = json.loads(out.read_text())["config"]
    assert config["dropped_queries"] == dropped
    # what the figures rest on besides settings and seeds: a learned figure moved between two sessions' machines
    import numpy as np

    assert config["environment"]["packages"]["numpy"] == np.__version__ and config["environment"]["python"]


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(2, "No such file or directory", "/proc/x.json"),
        PermissionError(13, "Permission denied", "/root/out.json"),
        sqlite3.DatabaseError("database disk image is malformed"),
        CorruptStateError("fb.db is not a readable feedback store"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_main_reports_os_sqlite_and_rlfb_errors_in_one_line(monkeypatch, capsys, exc: Exception) -> None:
    """An error raised late in a command (after the run, on writing) still ends in one line."""
    import rlfb.commands.simulate as simulate_command

    def fail(args: argparse.Namespace) -> int:
        raise exc

    monkeypatch.setattr(simulate_command, "run", fail)
    assert main(["simulate", "--dataset", "demo"]) == 2
    line = one_error_line(capsys)
    assert (exc.filename if isinstance(exc, OSError) else str(exc)) in line


# -- evaluate / simulate: a malformed BEIR folder ------------------------------------------------------
def test_evaluate_without_queries_file(tmp_path: Path, capsys) -> None:
    data = write_beir(tmp_path / "beir", queries=False)
    assert main(["evaluate", "--dataset", str(data), "--retrievers", "bm25"]) == 2
    assert "queries.jsonl" in one_error_line(capsys)


@pytest.mark.parametrize("command", [["evaluate"], ["simulate", "--quiet", *SMALL_RUN[2:]]], ids=lambda c: c[0])
def test_a_dataset_folder_that_does_not_exist_is_named_as_such(tmp_path: Path, capsys, monkeypatch,
                                                              command: list[str]) -> None:
    # it was "X is not a BEIR folder: corpus.jsonl is missing", as if the folder were there; `--dataset
    # $RLFB_DATASETS/scifact` with the setting unset reads /scifact, which that did not hint at
    def error_for(folder: Path) -> str:
        assert main([command[0], "--dataset", str(folder), "--retrievers", "bm25", *command[1:]]) == 2
        return one_error_line(capsys)

    monkeypatch.delenv("RLFB_DATASETS", raising=False)
    assert error_for(tmp_path / "absent") == f"rlfb: error: no such folder: {tmp_path / 'absent'}"
    deep = tmp_path / "nowhere" / "scifact"  # its parent is missing too: likely a setting that expanded to nothing
    assert error_for(deep) == (f"rlfb: error: no such folder: {deep} "
                               "(RLFB_DATASETS is not set; was the path written as $RLFB_DATASETS/...?)")
    monkeypatch.setenv("RLFB_DATASETS", str(tmp_path / "collections"))
    assert error_for(deep) == f"rlfb: error: no such folder: {deep}"  # set: not the cause
    (tmp_path / "empty").mkdir()  # a folder that is there but is not a BEIR folder keeps its message
    assert error_for(tmp_path / "empty") == f"rlfb: error: {tmp_path / 'empty'} is not a BEIR folder: " \
                                             "corpus.jsonl is missing"


def test_a_corpus_file_an_empty_path_and_an_empty_corpus_are_named_for_what_they_are(tmp_path: Path, capsys) -> None:
    # corpus.jsonl given for its folder read "X is not a BEIR folder: corpus.jsonl is missing", "" read as ".", and
    # an empty corpus.jsonl as judgments that name no document of it
    def error_for(folder: str) -> str:
        assert main(["evaluate", "--dataset", folder, "--retrievers", "bm25"]) == 2
        return one_error_line(capsys)

    data = write_beir(tmp_path / "beir")
    assert error_for(str(data / "corpus.jsonl")) == (
        f"rlfb: error: {data / 'corpus.jsonl'} is a file; give the BEIR folder that holds corpus.jsonl, such as {data}")
    assert error_for("") == "rlfb: error: no dataset folder given: the path is empty"
    (data / "corpus.jsonl").write_text("")
    assert error_for(str(data)) == f"rlfb: error: {data / 'corpus.jsonl'} holds no documents"


def test_a_corpus_with_its_text_in_other_fields_is_refused_naming_them(tmp_path: Path, capsys) -> None:
    # Pyserini's shape ("contents") was indexed as empty texts, and evaluated without a word (nDCG@10 0.005)
    data = write_beir(tmp_path / "beir")
    rows = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines()]
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": r["_id"], "contents": r["text"]}) + "\n"
                                               for r in rows))
    assert main(["evaluate", "--dataset", str(data), "--retrievers", "bm25"]) == 2
    line = one_error_line(capsys)
    assert f"none of its {len(rows)} documents has text in 'title' or 'text'" in line and "_id, contents" in line


def _tiny_under_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A collection ``tiny`` under ``$RLFB_DATASETS``, and a working folder of the command's where it is not."""
    collections = tmp_path / "collections"
    write_beir(collections / "tiny")
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    monkeypatch.setenv("RLFB_DATASETS", str(collections))
    return collections, run


@pytest.mark.parametrize("command", [["evaluate"], ["simulate", "--quiet", *SMALL_RUN[2:]]], ids=lambda c: c[0])
def test_a_collection_is_found_by_its_name_under_the_setting(tmp_path: Path, capsys, monkeypatch,
                                                             command: list[str]) -> None:
    # `--dataset cranfield` said "no such folder: cranfield" with RLFB_DATASETS set, where the benchmarks
    # and docs/experiments.md take a bare name; a folder of that name where the command runs still wins
    _, run = _tiny_under_the_setting(tmp_path, monkeypatch)
    assert main([command[0], "--dataset", "tiny", "--retrievers", "bm25", *command[1:]]) == 0
    printed = capsys.readouterr().out
    assert "tiny / test: 2 queries" in printed or "tiny: nDCG@10" in printed
    (run / "tiny").mkdir()  # here, but not a BEIR folder: taken as given, and refused as such
    assert main([command[0], "--dataset", "tiny", "--retrievers", "bm25", *command[1:]]) == 2
    assert one_error_line(capsys) == "rlfb: error: tiny is not a BEIR folder: corpus.jsonl is missing"
    monkeypatch.delenv("RLFB_DATASETS")
    (run / "tiny").rmdir()
    assert main([command[0], "--dataset", "tiny", "--retrievers", "bm25", *command[1:]]) == 2
    assert one_error_line(capsys).startswith("rlfb: error: no such folder: tiny (")  # and where else it looked


def test_a_path_that_reads_as_an_unset_setting_gets_the_hint(monkeypatch) -> None:
    from rlfb.datasets import _no_such_folder

    monkeypatch.delenv("RLFB_DATASETS", raising=False)
    assert _no_such_folder(Path("/scifact")).endswith("was the path written as $RLFB_DATASETS/...?)")
    # relative: not an expanded setting, but a bare name, looked for under the setting (or the checkout's folder)
    assert not _no_such_folder(Path("scifact")).endswith("was the path written as $RLFB_DATASETS/...?)")
    assert _no_such_folder(Path("results/scifact")) == "no such folder: results/scifact"


@pytest.mark.parametrize("bad_row", ["q2\td2\tabc", "q2\td2"])
def test_simulate_with_a_bad_qrels_row(tmp_path: Path, capsys, bad_row: str) -> None:
    data = write_beir(tmp_path / "beir", qrels=[*QRELS[:2], bad_row])
    assert main(["simulate", "--dataset", str(data), "--quiet", *SMALL_RUN]) == 2
    assert f"{data / 'qrels' / 'test.tsv'}:3" in one_error_line(capsys)


def test_simulate_records_the_folder_a_bare_collection_name_was_found_in(tmp_path: Path, monkeypatch) -> None:
    # config.dataset_path was the name resolved against the working folder (/run/tiny), which does not exist
    import json

    collections, _ = _tiny_under_the_setting(tmp_path, monkeypatch)
    out = tmp_path / "sim.json"
    assert main(["simulate", "--quiet", "--dataset", "tiny", *SMALL_RUN, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["dataset_path"] == str((collections / "tiny").resolve())


# -- errors name the option typed ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["evaluate", "--dataset", "DATA", "--retrievers", "bm25", "--k", "0"],
         "--k must be a positive integer, got 0"),
        (["cache", "prune", "--dir", "DIR", "--max-mb", "-1"], "--max-mb must be a finite number >= 0, got -1.0"),
        (["cache", "prune", "--dir", "DIR", "--unused-days", "nan"],
         "--unused-days must be a finite number >= 0, got nan"),
    ],
    ids=["evaluate-k", "prune-max-mb", "prune-unused-days"],
)
def test_a_bad_number_names_the_option_typed(tmp_path: Path, capsys, argv: list[str], expected: str) -> None:
    # they named the function's argument (`k must be a positive integer`, `max_mb must be ...`), which the
    # command line has no option of
    places = {"DATA": str(write_beir(tmp_path / "data")), "DIR": str(tmp_path)}
    assert main([places.get(a, a) for a in argv]) == 2
    assert one_error_line(capsys) == f"rlfb: error: {expected}"


def test_evaluate_notes_a_k_past_the_corpus(tmp_path: Path, capsys) -> None:
    # --k 1000000 ranked the whole corpus and printed P@1000000 as 0.0000, unremarked
    data = write_beir(tmp_path / "data")
    assert main(["evaluate", "--dataset", str(data), "--retrievers", "bm25", "--k", "1000000"]) == 0
    assert "note: --k 1000000 is more than the 3 documents of data's corpus" in capsys.readouterr().err
    assert main(["evaluate", "--dataset", str(data), "--retrievers", "bm25", "--k", "3"]) == 0  # the whole corpus
    assert "--k" not in capsys.readouterr().err
