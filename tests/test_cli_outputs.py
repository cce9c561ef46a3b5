"""Output files of the CLI, as a CLI audit (2026-12-05) found them: the plot written in place, a named pipe or
``/dev/stdout`` replaced by a file, ``--json -`` writing a file named "-", a long legal name failing after the
work, a full disk naming no file, Ctrl-C ending in a traceback, ``demo --out ''`` writing into the current folder.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from test_cli_boundaries import TINY, make_store, one_error_line, write_beir

from rlfb.cli import main
from rlfb.files import write_atomically, write_text_atomically


def test_a_named_pipe_is_written_to_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_text_atomically(fifo, '{"a": 1}')
    reader.join(timeout=30)
    assert got == [b'{"a": 1}'] and fifo.is_fifo()


def test_a_link_is_written_through_and_a_long_name_is_written(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text_atomically(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    long = tmp_path / ("a" * 245 + ".json")  # the temporary name took ~40 more characters than the file system's 255
    write_text_atomically(long, "x")
    assert long.read_text() == "x" and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_failed_write_names_the_file_and_keeps_the_old_one(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    out.write_text("earlier")

    def full(fh: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a full disk raises it: no file name

    with pytest.raises(OSError, match="r.json") as caught:
        write_atomically(out, full)
    assert caught.value.errno == errno.ENOSPC and out.read_text() == "earlier"


def test_a_plot_that_fails_part_way_leaves_the_earlier_one_whole(tmp_path: Path, capsys,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    data = write_beir(tmp_path / "beir")
    plot = tmp_path / "p.png"
    assert main(["simulate", "--dataset", str(data), *TINY, "--plot", str(plot)]) == 0
    before = plot.read_bytes()

    def savefig(self: Figure, fname: object, **kwargs: object) -> None:
        fname.write(b"\x89PNG half an image")  # type: ignore[attr-defined]
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(Figure, "savefig", savefig)
    capsys.readouterr()
    assert main(["simulate", "--dataset", str(data), *TINY, "--plot", str(plot)]) == 2
    assert str(plot) in capsys.readouterr().err and plot.read_bytes() == before


@pytest.mark.parametrize("command", ["simulate", "evaluate"])
def test_json_dash_is_stdout_with_the_report_on_stderr(tmp_path: Path, capsys, command: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_beir(tmp_path / "beir")
    monkeypatch.chdir(tmp_path)
    extra = TINY if command == "simulate" else ["--retrievers", "bm25"]
    assert main([command, "--dataset", str(data), "--json", "-", *extra]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)  # the JSON alone
    assert ("final" in out) if command == "simulate" else ("fused" in out)
    assert "nDCG" in captured.err or "ndcg" in captured.err
    assert not (tmp_path / "-").exists()


def test_ctrl_c_is_one_line_and_status_130(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlfb.simulation.runner as runner

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "simulate", interrupted)
    data = write_beir(tmp_path / "beir")
    assert main(["simulate", "--dataset", str(data), *TINY]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "rlfb: interrupted"


def test_demo_with_an_empty_out_is_refused(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--out", "", "--quiet"]) == 2
    assert "--out needs a folder name" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_messages_name_the_option_and_the_bound(tmp_path: Path, capsys) -> None:
    db = make_store(tmp_path / "fb.db")
    assert main(["store", "stats", str(db), "--window-days", "1e308"]) == 2  # "window must be finite, got inf"
    # it said "must be a positive number of days", which 1e308 is: too large, since its seconds overflow
    assert "--window-days 1e+308 is too large: its seconds overflow" in one_error_line(capsys)
    data = write_beir(tmp_path / "beir")
    assert main(["simulate", "--dataset", str(data), *TINY, "--learner-option", "replay_every=0"]) == 2
    assert "replay_every must be at least 1, got 0" in one_error_line(capsys)  # "must be in [1, None]"
    # a mutation review (2026-12-07): each of these was still refused, by a later check whose message named no
    # option (--window-days 0: "window must be positive", after the store was opened), or named the wrong thing
    assert main(["store", "stats", str(db), "--window-days", "0"]) == 2
    assert "--window-days must be a positive number of days, got 0" in one_error_line(capsys)
    with pytest.raises(SystemExit) as exited:  # argparse's own refusal
        main(["weights", "show", str(db), "--version", "0"])
    assert exited.value.code == 2
    assert "a snapshot version is a whole number, 1 or more, got '0'" in capsys.readouterr().err
    assert main(["evaluate", "--dataset", str(data), "--retrievers", "bm25", "--weights", "1,5"]) == 2
    assert "--weights has 2 values for 1 retrievers ['bm25']" in one_error_line(capsys)


def test_a_store_that_cannot_be_written_is_inspected_from_a_copy(tmp_path: Path, capsys,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # a backup on a read-only mount: stats, weights and exports, which only read, failed as "read-only"
    import rlfb.store
    from rlfb.errors import ReadOnlyStoreError

    db = make_store(tmp_path / "fb.db")
    before = db.read_bytes()

    # root writes anywhere: the refusal SQLite gives a read-only mount, for this file (made before the patch below,
    # its base is the real store)
    class ReadOnlyHere(rlfb.store.FeedbackStore):
        def __init__(self, path: str | Path, *args: Any, **kwargs: Any) -> None:
            if Path(str(path)) == db:
                raise ReadOnlyStoreError(f"feedback store {db} is read-only: attempt to write a readonly database")
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(rlfb.store, "FeedbackStore", ReadOnlyHere)
    _every_reading_command_reads(db, tmp_path, capsys, note="reading a copy")
    capsys.readouterr()
    assert main(["weights", "import", str(db), str(tmp_path / "w.json")]) == 2  # a write is still refused
    assert "read-only" in one_error_line(capsys)
    assert db.read_bytes() == before


def _every_reading_command_reads(db: Path, tmp_path: Path, capsys, *, note: str) -> None:
    """stats, show and both exports of ``db`` succeed, stats naming the store itself and noting ``note``."""
    assert main(["store", "stats", str(db)]) == 0
    captured = capsys.readouterr()
    assert f"store            {db}" in captured.out and note in captured.err
    assert main(["weights", "show", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "gradient"
    assert main(["store", "export", str(db), "--jsonl", str(tmp_path / "out.jsonl")]) == 0
    assert main(["weights", "export", str(db), str(tmp_path / "w.json")]) == 0


def test_a_look_at_a_store_of_an_older_rlfb_leaves_the_file_as_it_was(tmp_path: Path, capsys) -> None:
    # stats, show and the exports brought such a store up to date (schema steps, WAL mode): a backup looked at
    # with a newer rlfb was upgraded, and an older rlfb then refused it as a newer one's
    import sqlite3

    db = make_store(tmp_path / "fb.db")
    with sqlite3.connect(db) as conn:  # as rlfb wrote it before its last schema steps
        conn.execute("DELETE FROM _migrations WHERE name IN ('m009_snapshot_kind', 'm010_settings', "
                     "'m011_snapshot_kinds', 'm012_feedback_learned', 'm013_feedback_held')")
        conn.execute("DROP INDEX idx_feedback_unlearned")
        conn.execute("DROP INDEX idx_feedback_held")
        conn.execute("ALTER TABLE feedback DROP COLUMN learned")
        conn.execute("DROP TABLE settings")
        conn.execute("DROP INDEX IF EXISTS idx_policy_snapshots_kind_version")
        conn.execute("ALTER TABLE policy_snapshots DROP COLUMN kind")
    conn.close()
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = db.read_bytes()
    _every_reading_command_reads(db, tmp_path, capsys, note="older rlfb")
    assert db.read_bytes() == before
    with sqlite3.connect(db) as conn:
        assert "settings" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    # one in another journal mode is read from a copy too, and a file of SQLite with no table is no store
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    from rlfb.store import FeedbackStore

    FeedbackStore(tmp_path / "fresh.db").close()
    with sqlite3.connect(tmp_path / "fresh.db") as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    before = (tmp_path / "fresh.db").read_bytes()
    assert main(["store", "stats", str(tmp_path / "fresh.db")]) == 0
    assert "journal mode" in capsys.readouterr().err
    assert (tmp_path / "fresh.db").read_bytes() == before
    blank = tmp_path / "blank.db"
    with sqlite3.connect(blank) as conn:
        conn.execute("PRAGMA user_version = 7")
    conn.close()
    before = blank.read_bytes()
    assert main(["store", "stats", str(blank)]) == 2
    assert "holds no tables" in one_error_line(capsys)
    assert blank.read_bytes() == before


def test_an_export_that_meets_a_damaged_row_names_the_store_the_column_and_the_event(tmp_path: Path,
                                                                                   capsys) -> None:
    import sqlite3

    from rlfb import FeedbackEnsemble

    db = tmp_path / "fb.db"
    with FeedbackEnsemble.from_texts(["tides follow the moon", "lava and ash"], retrievers=("bm25",),
                                     store=db) as ens:
        event_id = ens.retrieve("tides", k=2).event_id
    with sqlite3.connect(db) as conn:  # damaged outside rlfb
        conn.execute("UPDATE event_chunks SET scores = '{' WHERE rank = 1")
    assert main(["store", "export", str(db), "--jsonl", str(tmp_path / "out.jsonl")]) == 2
    line = one_error_line(capsys)
    assert event_id is not None
    assert f"cannot export {db}" in line and "event_chunks.scores of chunk" in line and event_id in line
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("column", ["events.query", "events.arm", "event_chunks.chunk_id"])
def test_text_damaged_outside_rlfb_is_a_named_error_not_a_traceback(tmp_path: Path, capsys, column: str) -> None:
    # bytes that are not UTF-8 in a text column raised UnicodeDecodeError out of export and stats
    import sqlite3

    from rlfb import FeedbackEnsemble

    db = tmp_path / "fb.db"
    with FeedbackEnsemble.from_texts(["tides follow the moon", "lava and ash"], retrievers=("bm25",),
                                     store=db) as ens:
        ens.retrieve("tides", k=2)
    table, name = column.split(".")
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE {table} SET {name} = X'FF00' WHERE rowid = (SELECT MIN(rowid) FROM {table})")
    conn.close()
    for command in (["store", "export", str(db), "--jsonl", str(tmp_path / "out.jsonl")], ["store", "stats", str(db)]):
        code = main(command)
        if code == 0:  # stats reads no query text nor chunk ids
            capsys.readouterr()
            continue
        assert code == 2
        assert "is not text rlfb wrote" in one_error_line(capsys)


def test_a_warning_is_one_line(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    # a damaged embedding cache warned in Python's two lines, with the library's source line
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "embeddings.sqlite").write_bytes(b"not a database at all" * 50)
    monkeypatch.setenv("RLFB_CACHE_DIR", str(cache))
    data = write_beir(tmp_path / "beir")
    assert main(["evaluate", "--dataset", str(data), "--retrievers", "bm25,dense"]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "embedding cache" in line or "embeddings.sqlite" in line]
    assert warned and all(line.startswith("rlfb: warning: ") for line in warned), err
    assert "conn = " not in err


@pytest.mark.skipif(os.name != "posix", reason="signals as POSIX shells see them")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_ends_the_script_by_sigint_so_a_shell_loop_stops_too(tmp_path: Path, sig: str) -> None:
    # returning 130 told bash the program handled the interrupt: a `for` loop of rlfb runs went on to the next.
    # SIGTERM (`timeout`, a service manager) killed it outright, an export's temporary file left behind: it now
    # ends as Ctrl-C does, by its own signal
    import signal
    import subprocess
    import sys

    signum = getattr(signal, sig)

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlfb", "demo", "--retrievers", "bm25", "--interactions", "200000", "--seeds", "1",
         "--out", str(tmp_path / "demo"), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("demo collection")  # running: interrupt it
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=600)  # a hung run fails the test rather than the whole suite
    assert proc.returncode == -signum, err
    assert err.strip().splitlines()[-1] == "rlfb: interrupted" and "Traceback" not in err
    assert not (tmp_path / "demo").exists()  # nothing half-written
    assert not list(tmp_path.glob(".rlfb-*"))


def test_a_write_into_a_missing_folder_names_the_file_asked_for(tmp_path: Path) -> None:
    # the error named the hidden temporary file beside it (".rlfb-0aa7….tmp")
    with pytest.raises(FileNotFoundError) as caught:
        write_text_atomically(tmp_path / "missing" / "out.json", "{}")
    assert caught.value.filename == str(tmp_path / "missing" / "out.json")


@pytest.mark.skipif(os.name != "posix", reason="signals as POSIX shells see them")
def test_what_was_printed_before_ctrl_c_reaches_a_pipe(tmp_path: Path) -> None:
    # ended by SIGINT, the process wrote out no buffer: a report printed into a pipe was lost
    import signal
    import subprocess
    import sys

    code = "import rlfb.cli as cli; cli.main = lambda: (print('report'), cli.INTERRUPTED)[1]; cli.console()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"})
    assert done.returncode == -signal.SIGINT and done.stdout == "report\n", done.stderr


def test_a_read_only_store_is_copied_whole_whatever_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a name that is not UTF-8 raised UnicodeEncodeError (a traceback), and "//tmp/..." read as a URI's authority
    import shutil

    from rlfb.commands import _copy_store
    from rlfb.store import FeedbackStore

    odd = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9 #1?.db"))
    with FeedbackStore(odd) as store:
        store.log_event("what causes tides", {"weights": {"bm25": 1.0}},
                        [{"chunk_id": "c1", "rank": 1, "score": 1.0, "scores": {"bm25": 1.0}}])
    monkeypatch.setattr(shutil, "copyfile", lambda *a, **k: pytest.fail("copied the file, not a backup"))
    for source in (odd, Path("/" + str(odd))):
        copy = tmp_path / f"copy{len(str(source))}.db"
        _copy_store(source, copy)
        with FeedbackStore(copy) as read:
            assert read.counts()["events"] == 1


def test_a_command_run_with_stdout_closed_prints_nowhere_without_a_traceback(tmp_path: Path) -> None:
    # `rlfb store stats FILE >&-` raised AttributeError ('NoneType' object has no attribute 'write')
    import subprocess
    import sys

    db = make_store(tmp_path / "fb.db")
    for command in (["store", "stats", str(db)], ["weights", "export", str(db), "-"]):
        done = subprocess.run(["sh", "-c", '"$0" -m rlfb "$@" >&-', sys.executable, *command],
                              capture_output=False, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_json_written_to_a_file_ends_in_a_newline_as_on_stdout(tmp_path: Path, capsys) -> None:
    """`weights export`'s file (and simulate's, evaluate's and demo's JSON) ended without one, unlike the same
    JSON printed to stdout: `cat` ran the shell's prompt onto its last line, and `wc -l` counted one less."""
    db = make_store(tmp_path / "fb.db")
    out = tmp_path / "w.json"
    assert main(["weights", "export", str(db), str(out)]) == 0
    assert main(["weights", "export", str(db), "-"]) == 0
    assert out.read_text(encoding="utf-8") == capsys.readouterr().out
    assert out.read_text(encoding="utf-8").endswith("}\n")


def test_an_export_written_over_a_file_is_whole_or_not_at_all_and_keeps_its_mode(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a mutation review (2026-12-07): the commands' JSON written in place, not beside and renamed over, left a
    # half-written file where the write failed; and a file renamed over without its mode made a private export
    # (chmod 600) readable by everyone
    db = make_store(tmp_path / "fb.db")
    out = tmp_path / "w.json"
    out.write_text("earlier")
    out.chmod(0o600)
    with monkeypatch.context() as m:
        def fail(src: object, dst: object) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        m.setattr(os, "replace", fail)  # the last step of a whole write: the rename over the old file
        assert main(["weights", "export", str(db), str(out)]) == 2
    assert "w.json" in one_error_line(capsys)
    assert out.read_text() == "earlier" and sorted(p.name for p in tmp_path.iterdir()) == ["fb.db", "w.json"]
    assert main(["weights", "export", str(db), str(out)]) == 0
    assert json.loads(out.read_text())["weights"] and out.stat().st_mode & 0o777 == 0o600
