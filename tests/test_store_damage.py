"""A store damaged outside rlfb, and loose types at its boundary: named errors, nothing changed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from _damage import damage_newest_snapshot

from rlfb import FeedbackEnsemble
from rlfb.cli import main
from rlfb.errors import CorruptStateError, ValidationError
from rlfb.reward import RewardConfig
from rlfb.store import FeedbackStore

DEEP = "[" * 100_000 + "]" * 100_000  # json.loads recurses once per level


def _logged(path: Path) -> str:
    store = FeedbackStore(path)
    eid = store.log_event("q", {"weights": {"bm25": 1.0}}, [{"chunk_id": "a"}, {"chunk_id": "b"}])
    store.save_policy_state({}, {"bm25": 1.0})
    store.close()
    return eid


@pytest.mark.parametrize(("table", "column", "text"), [("events", "weights", "{bad"),
                                                       ("events", "features", DEEP),
                                                       ("event_chunks", "scores", "{bad")])
def test_a_damaged_json_column_is_a_corrupt_state_error(tmp_path: Path, capsys, table: str, column: str,
                                                        text: str) -> None:
    db = tmp_path / "fb.db"
    eid = _logged(db)
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE {table} SET {column} = ?", (text,))  # noqa: S608 - constants of the test
    store = FeedbackStore(db)
    with pytest.raises(CorruptStateError, match="damaged"):  # was a raw JSONDecodeError / RecursionError
        store.event(eid)
    with pytest.raises(CorruptStateError):
        list(store.export_rows())
    store.close()
    assert main(["store", "export", str(db), "--jsonl", str(tmp_path / "out.jsonl")]) == 2  # not a traceback
    assert "rlfb: error:" in capsys.readouterr().err
    # into folders that did not exist: they were made before the export and left behind, empty
    assert main(["store", "export", str(db), "--jsonl", str(tmp_path / "new" / "sub" / "out.jsonl")]) == 2
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(("table", "column", "value"), [("rewards", "reward", "abc"),
                                                        ("feedback", "discounted", "abc"),
                                                        ("feedback", "value", "x"),
                                                        ("feedback", "reward", 9e999)])
def test_a_damaged_reward_number_is_a_corrupt_state_error(tmp_path: Path, capsys, table: str, column: str,
                                                          value: object) -> None:
    # export failed with a raw TypeError from sum(); stats took the text as 0 in its averages, unsaid
    db = tmp_path / "fb.db"
    eid = _logged(db)
    with FeedbackStore(db) as store:
        store.record_feedback(eid, "thumbs_up")
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE id = 1", (value,))  # noqa: S608 - constants of the test
    store = FeedbackStore(db)
    with pytest.raises(CorruptStateError, match=f"{table} row 1 in .* is damaged: its {column} is"):
        list(store.export_rows())
    with pytest.raises(CorruptStateError, match=f"{table} row 1"):
        store.stats()
    store.close()
    capsys.readouterr()
    assert main(["store", "export", str(db), "--jsonl", "-"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("rlfb: error:") and f"{table} row 1" in err  # no row, no traceback
    assert main(["store", "stats", str(db)]) == 2
    assert f"{table} row 1" in capsys.readouterr().err


@pytest.mark.parametrize(("table", "column", "value"), [("event_chunks", "score", 9e999),
                                                        ("events", "propensity", 9e999),
                                                        ("event_chunks", "scores", '{"bm25": NaN}'),
                                                        ("events", "features", '{"n_tokens": Infinity}')])
def test_a_number_json_cannot_hold_in_an_event_is_named_by_the_export(tmp_path: Path, capsys, table: str,
                                                                      column: str, value: object) -> None:
    """Bug: NaN or infinity in an event's columns (written outside rlfb) came out of `store export` as a
    traceback from json.dumps, exit 1; now the export's named error, naming the event."""
    db = tmp_path / "fb.db"
    eid = _logged(db)
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE {table} SET {column} = ?", (value,))  # noqa: S608 - constants of the test
    with FeedbackStore(db) as store, pytest.raises(CorruptStateError,
                                                   match=f"cannot export .*event {eid!r} is damaged"):
        store.export_jsonl(tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()
    capsys.readouterr()
    assert main(["store", "export", str(db), "--jsonl", str(tmp_path / "out.jsonl")]) == 2
    one_line = capsys.readouterr().err.strip()
    assert one_line.startswith("rlfb: error: cannot export") and "\n" not in one_line


@pytest.mark.parametrize("state", ["5", "[1,2]", "null", '"text"'])
def test_a_snapshot_state_that_is_not_an_object_is_reported(tmp_path: Path, capsys, state: str) -> None:
    # show and export exited 0; export wrote "state": 5, which weights import then refused
    db = tmp_path / "fb.db"
    _logged(db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE policy_snapshots SET state = ?", (state,))
    out = tmp_path / "w.json"
    capsys.readouterr()
    for argv in (["weights", "show", str(db)], ["weights", "export", str(db), str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("rlfb: error: policy snapshot 1 in") and "not an object" in err
    assert not out.exists()
    assert main(["weights", "export", str(db), str(out), "--weights-only"]) == 0  # the weights are still sound
    exported = json.loads(out.read_text())
    assert exported["weights"] == {"bm25": 1.0} and "state" not in exported


@pytest.mark.parametrize(("table", "column"), [("events", "sampling_temperature"), ("feedback", "comment"),
                                               ("policy_snapshots", "policy")])
def test_a_store_missing_a_column_is_refused_at_open(tmp_path: Path, table: str, column: str) -> None:
    # its migration still recorded, the store opened, and the first retrieve (or feedback) that named the
    # column failed with a raw sqlite3.OperationalError
    db = tmp_path / "fb.db"
    _logged(db)
    conn = sqlite3.connect(db)
    conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")  # noqa: S608 - constants of the test
    conn.commit()
    conn.close()
    before = _dump(db)
    with pytest.raises(CorruptStateError, match=rf"fb.db is a feedback store whose tables lack the columns "
                                                rf"\{{'{table}': \['{column}'\]\}}"):
        FeedbackStore(db)
    with pytest.raises(CorruptStateError, match=column):
        FeedbackEnsemble.from_texts(["a b", "c d"], retrievers=("bm25",), store=str(db))
    assert _dump(db) == before  # its rows, WAL included (the main file's bytes would not show a write to the WAL)


def _dump(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def test_a_deeply_nested_snapshot_or_save_is_a_corrupt_state_error(tmp_path: Path) -> None:
    db = tmp_path / "fb.db"
    _logged(db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE policy_snapshots SET state = ?", (DEEP,))
    with pytest.raises(CorruptStateError, match="snapshot"):
        FeedbackStore(db).load_policy_state()
    FeedbackEnsemble.from_texts(["a b", "c d"], retrievers=("bm25",)).save(tmp_path / "idx")
    (tmp_path / "idx" / "learner.json").write_text(DEEP)
    with pytest.raises(CorruptStateError, match="Recursion"):
        FeedbackEnsemble.load(tmp_path / "idx")


def test_a_foreign_file_with_a_migrations_table_is_refused_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "theirs.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE _migrations (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("CREATE TABLE users (id INT)")
    before = db.read_bytes()
    with pytest.raises(CorruptStateError, match="not an rlfb feedback store"):
        FeedbackStore(db)
    with sqlite3.connect(db) as conn:  # it was switched to WAL, a lasting change, before being refused
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert db.read_bytes() == before


def test_flags_at_the_store_boundary_are_bools() -> None:
    with pytest.raises(ValidationError, match="store_text"):  # bool("no") kept the query text
        FeedbackStore(":memory:", store_text="no")  # type: ignore[arg-type]
    store = FeedbackStore(":memory:")
    with pytest.raises(ValidationError, match="used"):  # "no" counted as used
        store.log_event("q", {"weights": {"bm25": 1.0}}, [{"chunk_id": "a", "used": "no"}])
    assert store.counts()["events"] == 0
    eid = store.log_event("q", {"weights": {"bm25": 1.0}}, [{"chunk_id": "a", "used": False}, {"chunk_id": "b"}])
    assert [c["used"] for c in store.event(eid)["chunks"]] == [False, True]


@pytest.mark.parametrize("kwargs", [{"spread": []}, {"aliases": [1]}, {"aliases": "thumbs"}])
def test_reward_config_of_the_wrong_type_is_a_validation_error(kwargs: dict) -> None:
    with pytest.raises(ValidationError):  # a raw TypeError before
        RewardConfig(**kwargs)


def test_intact_json_columns_still_read(tmp_path: Path) -> None:
    db = tmp_path / "fb.db"
    eid = _logged(db)
    event = FeedbackStore(db).event(eid)
    assert event["weights"] == {"bm25": 1.0} and json.dumps(event)


def test_a_snapshot_no_learner_can_read_is_named_with_the_way_past_it(tmp_path):
    # "unknown learner state format None": no store, no version, no way on but editing the database by hand
    path = tmp_path / "fb.db"
    texts = ["tides follow the moon", "aurora glows", "volcano rock"]
    ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=str(path), policy="thompson")
    for _ in range(3):
        r = ens.retrieve("aurora", k=2)
        ens.feedback(r.event_id, "thumbs_up")
    ens.close()
    newest = damage_newest_snapshot(path)
    with pytest.raises(CorruptStateError, match=rf"snapshot {newest} in .*fb.db is damaged.*drop-snapshot"):
        FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=str(path), policy="thompson")
    with FeedbackStore(path) as store:
        assert store.drop_snapshot(newest) and not store.drop_snapshot(newest)
        with pytest.raises(ValidationError):
            store.drop_snapshot("3")  # type: ignore[arg-type]
    again = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=str(path), policy="thompson")
    assert again.learner.n_learned == 2 and again.store.counts()["feedback"] == 3


# -- found by an audit of the store (2026-12-05) -------------------------------------------------------------
def test_a_full_disk_is_named_not_called_damage(tmp_path: Path) -> None:
    # a full disk was "cannot open ... as a feedback store" (CorruptStateError) when opening, and a raw
    # sqlite3.OperationalError on a write
    from rlfb.errors import StoreFullError
    from rlfb.store.connection import opening_error

    full = sqlite3.OperationalError("database or disk is full")
    assert isinstance(opening_error(full, str(tmp_path / "f.db"), 1.0), StoreFullError)
    store = FeedbackStore(tmp_path / "f.db")
    conn = store._tx.conn
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")  # no page to grow
    with pytest.raises(StoreFullError, match="disk is full"):
        store.log_event("q", {"weights": {"bm25": 1.0}}, chunks=[{"chunk_id": "c" + "x" * 100_000}],
                        metadata={"big": "y" * 100_000})
    assert store.counts()["events"] == 0


def test_a_snapshot_whose_params_are_no_object_does_not_break_pruning(tmp_path: Path) -> None:
    # json_remove of a JSON string failed with "malformed JSON": every prune, and opening with a retention
    import time

    store = FeedbackStore(tmp_path / "f.db")
    for ts in (time.time() - 10 * 86400, time.time()):
        store.save_policy_state({"policy": {"name": "mine", "params": "v2"}}, {"a": 1.0}, policy="mine", timestamp=ts)
    store.prune(retention=2 * 86400)
    store.close()
    FeedbackStore(tmp_path / "f.db", retention=2 * 86400).close()


def test_a_busy_timeout_beyond_sqlites_int_still_waits(tmp_path: Path) -> None:
    # int(seconds * 1000) past 2**31 - 1 was stored by SQLite as 0: no waiting at all
    store = FeedbackStore(tmp_path / "f.db", busy_timeout=365 * 86400)
    assert store._tx.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2**31 - 1


def test_a_store_of_a_newer_schema_is_refused_by_name(tmp_path: Path) -> None:
    # it opened without a word, and a constraint the newer schema added failed at the first write, raw
    FeedbackStore(tmp_path / "f.db").close()
    with sqlite3.connect(tmp_path / "f.db") as conn:
        conn.execute("INSERT INTO _migrations VALUES ('rlfb.store', 'm999_later', 0.0)")
    with pytest.raises(CorruptStateError, match=r"newer rlfb .*m999_later"):
        FeedbackStore(tmp_path / "f.db")


@pytest.mark.parametrize("depth", [201, 1_500])
def test_metadata_nested_too_deeply_to_read_back_is_refused(tmp_path: Path, depth: int) -> None:
    # 950 levels were accepted, and read back as "damaged" from a deeper call stack; 1,500 a raw RecursionError
    deep: dict = {}
    for _ in range(depth - 1):
        deep = {"x": deep}
    store = FeedbackStore(tmp_path / "f.db")
    with pytest.raises(ValidationError, match="nested"):
        store.log_event("q", {"weights": {"bm25": 1.0}}, chunks=[], metadata=deep)
    assert store.counts()["events"] == 0
    state: dict = {}
    for _ in range(5_000):
        state = {"x": state}
    try:
        json.dumps(state)
    except RecursionError:  # json on Python 3.10-3.12: a raw RecursionError before, refused by name now
        with pytest.raises(ValidationError, match="nested too deeply"):
            store.save_policy_state(state, {"bm25": 1.0})
        assert store.counts()["policy_snapshots"] == 0
        return
    # Python 3.13's json nests this deep: stored, and read back whole (an older Python reading this store names
    # the snapshot damaged, as it does any snapshot it cannot read)
    store.save_policy_state(state, {"bm25": 1.0})
    back, depth = (store.load_policy_state() or {})["state"], 0
    while back:
        back, depth = back["x"], depth + 1
    assert depth == 5_000


def test_a_new_store_in_a_folder_that_cannot_be_written_is_read_only_not_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a ValidationError ("cannot open path"), the error for bad arguments; root writes anywhere, so the folder's
    # refusal is what SQLite and os.access are made to say here
    import os

    from rlfb.errors import ReadOnlyStoreError

    real_connect, real_access = sqlite3.connect, os.access

    def refused(path: str, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        if str(path).startswith(str(tmp_path)):
            raise sqlite3.OperationalError("unable to open database file")
        return real_connect(path, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", refused)
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real_access(p, mode))
    with pytest.raises(ReadOnlyStoreError, match="cannot be written"):
        FeedbackStore(tmp_path / "new.db")
