"""CLI defects an audit of 2026-12-06 found: write commands and the cache commands on another program's SQLite
file, output an ASCII terminal cannot encode, and the hint of `weights export` where two kinds match."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli_output import one_error_line

from rlfb.cli import main
from rlfb.learner import Learner
from rlfb.store import FeedbackStore

ROOT = Path(__file__).resolve().parents[1]


def sqlite_file(path: Path, *statements: str, wal: bool = False) -> Path:
    """A SQLite file that is not rlfb's: ``statements`` run in it (none: a database with no tables)."""
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    if not statements:  # so that the file is not empty: SQLite writes its header
        conn.execute("PRAGMA user_version = 7")
    for sql in statements:
        conn.execute(sql)
    conn.commit()
    conn.close()
    return path


def weights_file(tmp_path: Path) -> Path:
    path = tmp_path / "w.json"
    path.write_text('{"bm25": 0.3, "dense": 0.7}', encoding="utf-8")
    return path


def save_kinds(path: Path, *kinds: tuple[tuple[str, ...], str]) -> Path:
    """A store holding one snapshot of each (retrievers, policy) kind, in that order."""
    with FeedbackStore(path) as store:
        for retrievers, policy in kinds:
            learner = Learner(retrievers, policy=policy)
            store.save_policy_state(learner.state_dict(), learner.weights(), policy=learner.policy_name,
                                    timestamp=time.time())
    return path


# -- 1. write commands on a SQLite file with no tables ----------------------------------------------------------
@pytest.mark.parametrize("wal", [False, True], ids=["rollback", "wal"])
@pytest.mark.parametrize("command", [["store", "drop-snapshot", "{db}", "1"], ["weights", "import", "{db}", "{w}"]],
                         ids=" ".join)
def test_a_write_command_refuses_a_sqlite_file_with_no_tables(tmp_path: Path, capsys, command: list[str],
                                                              wal: bool) -> None:
    # both wrote rlfb's schema into it (the import reported "imported as version 1"), where `store stats` refused it
    db = sqlite_file(tmp_path / "blank.db", wal=wal)
    before = db.read_bytes()
    w = weights_file(tmp_path)
    assert main([a.format(db=db, w=w) for a in command]) == 2
    assert one_error_line(capsys) == f"rlfb: error: {db} holds no tables: not an rlfb feedback store"
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blank.db", "w.json"]  # no side files left either
    # refused as before: another program's tables, an empty file (SQLite's empty database, not made a store), and
    # a path with no file (the README promises no new store from a write command)
    theirs = sqlite_file(tmp_path / "theirs.db", "CREATE TABLE notes (x)", "INSERT INTO notes VALUES (1)")
    empty = tmp_path / "empty.db"
    empty.touch()
    for other, error in ((theirs, "not an rlfb feedback store"), (empty, "is empty: not an rlfb feedback store"),
                         (tmp_path / "new.db", "no feedback store at")):
        was = other.read_bytes() if other.exists() else None
        assert main([a.format(db=other, w=w) for a in command]) == 2
        assert error in one_error_line(capsys)
        assert (other.read_bytes() if other.exists() else None) == was
    # and a store is written
    store = save_kinds(tmp_path / "fb.db", (("bm25", "dense"), "gradient"), (("bm25", "dense"), "gradient"))
    assert main([a.format(db=store, w=w) for a in command]) == 0
    done = capsys.readouterr()
    said, text = (done.out, "imported as version 3") if command[0] == "weights" else (done.err, "dropped policy")
    assert text in said


# -- 2. cache stats and prune on a file named like the cache ----------------------------------------------------
@pytest.mark.parametrize("action", [["stats"], ["stats", "--json"], ["prune", "--max-mb", "1"],
                                    ["prune", "--unused-days", "0"]], ids=" ".join)
def test_the_cache_commands_refuse_another_programs_file_and_leave_it(tmp_path: Path, capsys,
                                                                      action: list[str]) -> None:
    # stats and prune opened it as the cache: the encodings table and WAL mode were written into it
    file = sqlite_file(tmp_path / "embeddings.sqlite", "CREATE TABLE notes (x)", "INSERT INTO notes VALUES (1)")
    before = file.read_bytes()
    assert main(["cache", action[0], "--dir", str(tmp_path), *action[1:]]) == 2
    line = one_error_line(capsys)
    assert f"{file} is not an rlfb embedding cache" in line
    assert "other tables ['notes']" in line
    assert file.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["embeddings.sqlite"]


@pytest.mark.parametrize("wal", [False, True], ids=["rollback", "wal"])
def test_a_cache_file_with_no_table_yet_or_empty_is_an_empty_cache(tmp_path: Path, capsys, wal: bool) -> None:
    # what an encoder stopped between setting WAL mode and making its table leaves (and goes on using), or an
    # empty file: no encodings, not another program's file
    def tableless(file: Path) -> None:  # a header, user_version 0 and no table
        sqlite_file(file, "CREATE TABLE t (x)", "DROP TABLE t", wal=wal)

    for folder, make in (("tableless", tableless), ("empty", lambda f: f.touch())):
        (tmp_path / folder).mkdir()
        make(tmp_path / folder / "embeddings.sqlite")
        assert main(["cache", "stats", "--dir", str(tmp_path / folder), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["models"] == []


def test_cache_stats_of_no_cache_says_so_and_makes_none(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    assert main(["cache", "stats", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{folder / 'embeddings.sqlite'}: no cache file yet")
    assert "(no encodings)" not in out
    assert list(folder.iterdir()) == []
    assert main(["cache", "prune", "--dir", str(folder), "--max-mb", "1"]) == 0
    assert list(folder.iterdir()) == []
    capsys.readouterr()
    # a cache is read and pruned as before
    import numpy as np

    from rlfb.retrievers.cache import EmbeddingCache

    EmbeddingCache(folder, "m").put_many({f"h{i}": np.zeros(8) for i in range(3)})
    assert main(["cache", "stats", "--dir", str(folder)]) == 0
    assert "m: 3 encodings" in capsys.readouterr().out
    assert main(["cache", "prune", "--dir", str(folder), "--max-mb", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 3


# -- 3. output an ASCII terminal cannot encode ------------------------------------------------------------------
def run_cli(cwd: Path, encoding: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m rlfb.cli ARGS`` with ``PYTHONIOENCODING=encoding``; its output read back as UTF-8."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "PYTHONIOENCODING": encoding,
           "RLFB_CACHE_DIR": str(cwd / "default-cache")}
    return subprocess.run([sys.executable, "-m", "rlfb.cli", *args], cwd=cwd, capture_output=True,
                          encoding="utf-8", env=env)


def test_a_path_an_ascii_terminal_cannot_encode_is_escaped_not_a_traceback(tmp_path: Path) -> None:
    # `cache stats` printed its path on stdout and ended in a UnicodeEncodeError traceback, status 1
    folder = tmp_path / "caché"
    folder.mkdir()
    done = run_cli(tmp_path, "ascii", "cache", "stats", "--dir", str(folder))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{tmp_path}/cach\\xe9/embeddings.sqlite: no cache file yet")
    assert done.stderr == ""
    # Python escapes stderr by itself: the error line naming a missing store, as before
    done = run_cli(tmp_path, "ascii", "store", "stats", str(tmp_path / "é.db"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"rlfb: error: no feedback store at {tmp_path}/\\xe9.db\n"
    # a UTF-8 terminal gets the characters themselves
    done = run_cli(tmp_path, "utf-8", "cache", "stats", "--dir", str(folder))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{folder}/embeddings.sqlite: ")


def test_only_a_strict_stream_is_made_to_escape_and_console_does_both(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rlfb import cli

    strict = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    cli._escape_unencodable(strict)
    strict.write("caf\u00e9")
    strict.flush()
    assert strict.buffer.getvalue() == b"caf\\xe9"
    raw = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="surrogateescape")
    cli._escape_unencodable(raw)
    assert raw.errors == "surrogateescape"  # a stream set otherwise keeps its setting
    cli._escape_unencodable(None)  # a closed descriptor (`>&-`): nothing to do
    # the script's two streams, whatever the command writes to
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "argv", ["rlfb", "store", "stats", "/nonexistent/\u00e9.db"])
    with pytest.raises(SystemExit) as ended:
        cli.console()
    assert ended.value.code == 2
    err.flush()
    assert err.buffer.getvalue() == b"rlfb: error: no feedback store at /nonexistent/\\xe9.db\n"
    assert out.errors == "backslashreplace"


@pytest.mark.parametrize("name", ["a b.db", "q?x=1.db", "h#1.db", "p%20c.db", "p%3Fd.db"])
def test_paths_a_sqlite_uri_would_misread_are_checked_as_themselves(tmp_path: Path, capsys, name: str) -> None:
    from rlfb.commands import refuse_tableless_store, sqlite_tables

    blank = sqlite_file(tmp_path / f"blank {name}")
    before = blank.read_bytes()
    assert sqlite_tables(blank) == []
    assert main(["weights", "import", str(blank), str(weights_file(tmp_path))]) == 2
    assert "holds no tables" in one_error_line(capsys)
    assert blank.read_bytes() == before
    store = save_kinds(tmp_path / name, (("bm25", "dense"), "gradient"))
    refuse_tableless_store(store)
    assert "policy_snapshots" in (sqlite_tables(store) or [])
    assert main(["weights", "import", str(store), str(weights_file(tmp_path))]) == 0
    assert "imported as version 2" in capsys.readouterr().out


def test_a_store_whose_tables_are_still_in_its_write_ahead_log_is_not_taken_for_a_blank_file(tmp_path: Path,
                                                                                              capsys) -> None:
    # read as immutable, the main file alone holds no table while another connection keeps the log unmerged
    from rlfb.commands import sqlite_tables

    path = tmp_path / "live.db"
    holder = sqlite3.connect(path)
    holder.execute("PRAGMA journal_mode = WAL")
    holder.execute("PRAGMA wal_autocheckpoint = 0")  # nothing merged into the main file while it is open
    held = FeedbackStore(path)
    try:
        learner = Learner(("bm25", "dense"), policy="gradient")
        held.save_policy_state(learner.state_dict(), learner.weights(), policy=learner.policy_name,
                               timestamp=time.time())
        assert Path(f"{path}-wal").exists()
        assert "policy_snapshots" in (sqlite_tables(path) or [])
        assert main(["weights", "import", str(path), str(weights_file(tmp_path))]) == 0
        assert "imported as version 2" in capsys.readouterr().out
    finally:
        held.close()
        holder.close()


def test_a_file_sqlite_cannot_read_is_left_to_the_stores_own_error(tmp_path: Path, capsys) -> None:
    from rlfb.commands import refuse_tableless_store, sqlite_tables

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all " * 200)
    assert sqlite_tables(junk) is None
    refuse_tableless_store(junk)  # not "holds no tables": SQLite cannot tell
    assert main(["weights", "import", str(junk), str(weights_file(tmp_path))]) == 2
    assert "holds no tables" not in one_error_line(capsys)


# -- 4. which option tells two kinds of ensemble apart ----------------------------------------------------------
def test_two_kinds_of_one_policy_are_told_apart_by_their_retrievers(tmp_path: Path, capsys) -> None:
    # "name one by its --version", where --retrievers picks one
    db = save_kinds(tmp_path / "fb.db", (("bm25", "dense"), "thompson"), (("bm25", "splade"), "thompson"))
    assert main(["weights", "export", str(db), "-", "--policy", "thompson"]) == 2
    line = one_error_line(capsys)
    assert "2 kinds of ensemble with this policy (" in line
    assert line.endswith("): name one with --retrievers or its --version")
    assert main(["weights", "export", str(db), "-", "--policy", "thompson", "--retrievers", "dense,bm25"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 1


def test_two_kinds_of_one_retrievers_are_told_apart_by_their_policy(tmp_path: Path, capsys) -> None:
    db = save_kinds(tmp_path / "fb.db", (("bm25", "dense"), "thompson"), (("bm25", "dense"), "gradient"))
    assert main(["weights", "export", str(db), "-", "--retrievers", "bm25,dense"]) == 2
    assert one_error_line(capsys).endswith("2 kinds of ensemble with these retrievers ("
                                           "version 2: policy gradient, bm25+dense; "
                                           "version 1: policy thompson, bm25+dense): "
                                           "name one with --policy or its --version")
    # named by nothing: the option that tells them apart, not --retrievers, which does not
    assert main(["weights", "export", str(db), "-"]) == 2
    assert one_error_line(capsys).endswith("name one with --policy or its --version")
    assert main(["weights", "export", str(db), "-", "--policy", "thompson"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 1


def test_kinds_of_other_retrievers_and_policies_name_both_options(tmp_path: Path, capsys) -> None:
    db = save_kinds(tmp_path / "fb.db", (("bm25", "dense"), "thompson"), (("bm25",), "gradient"))
    assert main(["weights", "export", str(db), "-"]) == 2
    assert one_error_line(capsys).endswith("name one with --retrievers, --policy or its --version")
