"""Sub-commands of the ``rlfb`` console script, one module each (see :mod:`rlfb.cli`)."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout, suppress
from pathlib import Path
from typing import Any, TextIO

from rlfb.files import refuse_overwriting_store, same_file

__all__ = ["prepare_output_dir", "prepare_output_file", "make_parent", "parent_made", "write_output", "same_file",
           "refuse_overwriting_store", "refuse_empty_store", "refuse_tableless_store", "store_file", "check_int",
           "check_output_name", "require_matplotlib", "reader_gone", "show_progress", "HelpFormatter", "STDOUT",
           "report_beside", "store_for_reading", "snapshot_version", "sqlite_tables", "names_stdout", "output_target"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default; not for flags, required options or a default of ``None``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def prepare_output_dir(folder: str | Path) -> Path:
    """Check now that ``folder`` can be made and written, so a bad ``--out`` fails before a long run.

    Nothing is created here (a command that fails later leaves no empty folders behind): the nearest
    folder that exists must be a writable folder. :func:`write_output` makes the folders when it writes.
    Raises ``OSError`` (``NotADirectoryError`` when ``folder`` is a regular file), which the CLI reports in one
    line.
    """
    path = Path(folder)
    if path.exists() and not path.is_dir():
        # "Not a directory", also for a file given as an output file's folder (--json notes.txt/run.json), where
        # "File exists" named no problem
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    probe = path.absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():  # a file where a folder on the way would go
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(probe))
    return path


def prepare_output_file(file: str | Path) -> Path:
    """Check output ``file``'s folder (see :func:`prepare_output_dir`); refuse a folder as the file.

    A name ending in a slash names a folder too: ``pathlib`` would drop the slash and write a file there.
    """
    if str(file).endswith(("/", os.sep)):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(file))
    path = Path(file)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    prepare_output_dir(path.parent)
    return path


def make_parent(file: str | Path) -> Path:
    """Create the folder of output ``file`` (checked before by :func:`prepare_output_file`); return the path."""
    path = Path(file)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def parent_made(file: str | Path) -> Iterator[Path]:
    """:func:`make_parent` for a block that writes ``file``: the folders it made are removed again (when still
    empty) if the block raises, so a command that fails leaves no empty folders behind."""
    path = Path(file)
    missing = []
    folder = path.parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    make_parent(path)
    try:
        yield path
    except BaseException:
        for made in missing:  # deepest first
            with suppress(OSError):  # not empty (another writer's file): left
                made.rmdir()
        raise


#: An output file named so is stdout, as in ``store export --jsonl -`` (``simulate --json -`` wrote a file named "-").
STDOUT = "-"


#: The names by which a process reaches its own standard output, whatever that is (a pipe, a file, a terminal).
_STDOUT_NAMES = frozenset({"/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})


def names_stdout(file: str | Path | None) -> bool:
    """Whether output ``file`` is this process's standard output: :data:`STDOUT`, one of its names
    (``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``), or a path to the file or pipe that ``sys.stdout``
    writes to (``--json out.json > out.json``).

    Such a name was written as a file: opened again, a redirected stdout was truncated under the report (the
    table lost) or replaced by a rename, and a pipe got the table, the JSON and a "wrote /dev/stdout" line mixed.
    ``/dev/null`` is not taken for stdout where stdout goes there too: what is written to it is thrown away,
    whoever writes it, and the report stays where it was.
    """
    if file is None:
        return False
    text = str(file)
    if text == STDOUT:
        return True
    here = os.path.normpath(os.path.abspath(text))
    if here in _STDOUT_NAMES or here == f"/proc/{os.getpid()}/fd/1":
        return True
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no descriptor (a StringIO, a test's capture), or closed
        return False
    try:
        there, ours = os.stat(text), os.fstat(fd)
        if (there.st_dev, there.st_ino) != (ours.st_dev, ours.st_ino):
            return False
        return not os.path.samestat(there, os.stat(os.devnull))
    except OSError:  # not there yet, or not to be looked at: a file of its own
        return False


def output_target(file: str | None) -> str | None:
    """Output ``file`` as a command writes it: :data:`STDOUT` where it names standard output
    (:func:`names_stdout`), so that ``--json /dev/stdout`` is ``--json -`` (the JSON alone on stdout, the report
    on stderr, no "wrote" line); any other name as given. Every command with an output file reads it through
    this, before it checks the name as a file's."""
    return STDOUT if names_stdout(file) else file


def write_output(file: str | Path, text: str, *, stdout: TextIO | None = None) -> None:
    """Write ``text`` to output ``file`` whole or not at all, making its folder first (and removing the
    folders made if the write fails), ending in a newline; :data:`STDOUT` (``-``) writes it to ``stdout`` (default
    ``sys.stdout``)."""
    from rlfb.files import write_text_atomically

    if str(file) == STDOUT:
        out = sys.stdout if stdout is None else stdout
        out.write(text + "\n")
        out.flush()
        return
    with parent_made(file) as path:
        write_text_atomically(path, text + "\n")  # a text file ends in a newline, as the stdout form does


@contextmanager
def report_beside(json_out: str | None) -> Iterator[TextIO]:
    """Yield the stream a command's JSON goes to when ``--json`` is :data:`STDOUT`; meanwhile its report (what it
    prints) goes to stderr, so that stdout holds the JSON alone. Otherwise nothing changes."""
    out = sys.stdout
    if json_out != STDOUT:
        yield out
        return
    with redirect_stdout(sys.stderr):
        yield out


@contextmanager
def store_for_reading(path: str | Path) -> Iterator[Any]:
    """The feedback store at ``path``, for a command that only reads it (``store stats``, ``store export``,
    ``weights show``, ``weights export``). One that cannot be written (a read-only file, or a folder a WAL-mode
    store cannot make its side files in: a backup on a read-only mount, a service account's store) is read from
    a copy in a temporary folder, with a note on stderr; opening it writable was refused, so it could not be
    looked at at all. So is one that opening would change: a store of an older rlfb, which opening upgrades, or
    one not in WAL mode. The copy is named by the store's own path in what the command prints and raises."""
    import tempfile

    from rlfb.errors import ReadOnlyStoreError, RlfbError
    from rlfb.store import FeedbackStore

    # opening a store writable brings it up to date: rlfb's newer schema steps, the switch to WAL mode. A look
    # must not do that (a backup looked at with a newer rlfb was upgraded, and an older one then refused it), so
    # such a store is read from an upgraded copy too
    why = _why_opening_writes(Path(path))
    store = None
    if why is None:
        try:
            store = FeedbackStore(path)
        except ReadOnlyStoreError:
            why = "cannot be written"
    if store is not None:
        with store:
            yield store
        return
    with tempfile.TemporaryDirectory(prefix="rlfb-read-") as tmp:
        copy = Path(tmp) / "store.db"
        _copy_store(Path(path), copy)
        print(f"rlfb: note: {path} {why}: reading a copy of it", file=sys.stderr)
        try:
            opened = FeedbackStore(copy)
        except RlfbError as exc:  # name the store, not the copy, which is gone when the message is read
            raise type(exc)(str(exc).replace(str(copy), str(path))) from exc
        with opened as store:
            store.path = store._tx.path = str(path)  # errors and reports name the store, not the copy
            yield store


def _why_opening_writes(path: Path) -> str | None:
    """Why opening the store at ``path`` writable would change the file (schema steps it lacks, another journal
    mode), read through a read-only connection; ``None`` where it would not, or where the file cannot be read
    so (the store's own opening then names what is wrong). A file of SQLite with no table at all is no store."""
    import sqlite3

    from sqlite_utils import Database

    from rlfb.store.migrations import MIGRATIONS

    conn = _read_only(path)
    if conn is None:
        return None
    try:
        db = Database(conn)
        tables = db.table_names()
        if not tables:
            raise _tableless(path)
        if MIGRATIONS.table not in tables:
            return None  # another application's database: the store's opening refuses it before any write
        pending = MIGRATIONS.pending(db)
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    if pending:
        return f"is a store of an older rlfb (schema steps {pending} to come), which opening it would upgrade"
    if mode != "wal":
        return f"is in {mode} journal mode, which opening it would switch to WAL"
    return None


def _read_only(path: Path, *, immutable: bool = False) -> Any:
    """A read-only ``sqlite3`` connection to the file at ``path`` (``immutable``: read as a file no one writes,
    which makes no side files), or ``None`` where SQLite cannot open it so."""
    import sqlite3

    try:
        return sqlite3.connect(f"file:{_uri_path(path)}?mode=ro{'&immutable=1' if immutable else ''}", uri=True)
    except sqlite3.Error:
        return None


def _uri_path(path: Path) -> str:
    """``path`` for a ``file:`` URI: its own bytes, quoted (a name that is not UTF-8 has no str to quote), with
    one leading slash, as "//tmp" would read as a URI's authority."""
    from urllib.parse import quote

    return "/" + quote(os.fsencode(path.absolute())).lstrip("/")


def _copy_store(path: Path, copy: Path) -> None:
    """A consistent copy of the SQLite file at ``path``: SQLite's online backup through a read-only connection,
    which reads one snapshot while another process may be writing (copying the file and its write-ahead log one
    after the other could take them either side of a checkpoint). Where SQLite cannot open it read-only (a
    WAL-mode file without its shared-memory file, in a folder where none can be made), no process can be writing
    it: the file and its log are copied as they are."""
    import shutil
    import sqlite3

    try:
        src = sqlite3.connect(f"file:{_uri_path(path)}?mode=ro", uri=True)
        try:
            dst = sqlite3.connect(copy)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
        return
    except sqlite3.Error:
        copy.unlink(missing_ok=True)
    shutil.copyfile(path, copy)
    if Path(f"{path}-wal").is_file():  # what was written since the last checkpoint
        shutil.copyfile(f"{path}-wal", f"{copy}-wal")


def refuse_empty_store(path: str | Path) -> None:
    """Raise :class:`ValidationError` when the store file at ``path`` is empty (0 bytes).

    SQLite takes an empty file for an empty database, and opening it as a store writes the schema in:
    a command that only looks at a store must not change the file.
    """
    from rlfb.errors import ValidationError

    if Path(path).stat().st_size == 0:
        raise ValidationError(f"{path} is empty: not an rlfb feedback store")


def sqlite_tables(path: str | Path) -> list[str] | None:
    """The names of the tables in the SQLite file at ``path``, read without changing anything; ``None`` where
    SQLite cannot read it so (not a database, damaged, a WAL-mode file whose side files cannot be made): the
    caller's own opening then names what is wrong.

    Where no write-ahead log lies beside the file, the file holds the whole database and is read as immutable,
    which leaves no ``-wal`` and ``-shm`` files behind beside a file that turns out not to be ours."""
    import sqlite3

    conn = _read_only(Path(path), immutable=not Path(f"{path}-wal").exists())
    if conn is None:
        return None
    try:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = ? ORDER BY name", ("table",)).fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return [str(name) for (name,) in rows]


def _tableless(path: str | Path) -> Exception:
    """The error for a SQLite file with no table at all: what the commands that read and that write a store say."""
    from rlfb.errors import ValidationError

    return ValidationError(f"{path} holds no tables: not an rlfb feedback store")


def refuse_tableless_store(path: str | Path) -> None:
    """Raise :class:`ValidationError` when ``path`` is a SQLite file with no table at all, as the commands that
    read a store refuse it: opening it as a store writes rlfb's schema into another program's (empty) database.
    A file with other tables is refused by the store's own opening, before any write."""
    if sqlite_tables(path) == []:
        raise _tableless(path)


#: How long a command waits for another process to write the schema into a store it is creating.
STORE_SETTLE_SECONDS = 1.0


def store_file(path: str) -> str:
    """The path to open the store file a command names by: refused when empty (:func:`refuse_empty_store`) or a
    SQLite file with no tables (:func:`refuse_tableless_store`), and a file named ``:memory:`` as ``./:memory:``,
    which the store would take for an in-memory database (an import into it reported success and wrote
    nothing).

    An app creating its store makes the file (0 bytes) before it writes the schema in, so a command run at that
    moment (a monitoring job as the app starts) looks again for up to :data:`STORE_SETTLE_SECONDS` before it
    refuses the file: until 2026-12-07 it called a store being created "not an rlfb feedback store"."""
    import time

    from rlfb.errors import ValidationError

    deadline = time.monotonic() + STORE_SETTLE_SECONDS
    while True:
        try:
            refuse_empty_store(path)
            refuse_tableless_store(path)
            break
        except ValidationError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
    return f"./{path}" if path == ":memory:" else path


def show_progress(quiet: bool) -> bool:
    """Whether a command draws progress bars: not with ``--quiet``, and not where stderr is not a terminal
    (a log file, a pipe, CI), which the bars' redraws would fill with lines; tqdm's ``disable=None`` rule."""
    if quiet:
        return False
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no stderr (pythonw), or a closed one
        return False


def check_int(option: str, value: int | None, low: int, high: int | None = None) -> None:
    """Raise :class:`ValidationError` unless ``value`` (``None``: not given) lies in ``[low, high]``.

    The CLI checks counts itself: a negative one would otherwise reach Python slices and ranges
    (``--max-heldout -1`` evaluated all but one query) and a huge one builds huge tuples.

    >>> check_int("--seeds", 1000, 1, 1000)  # both bounds are allowed
    >>> check_int("--seeds", 1001, 1, 1000)
    Traceback (most recent call last):
    rlfb.errors.ValidationError: --seeds must be between 1 and 1000, got 1001
    """
    from rlfb.errors import ValidationError

    if value is None or (low <= value and (high is None or value <= high)):
        return
    bound = f"at least {low}" if high is None else f"between {low} and {high}"
    raise ValidationError(f"{option} must be {bound}, got {value}")


def snapshot_version(text: str) -> int | None:
    """A snapshot's version written as a whole number, else ``None``: ASCII digits only, since ``int()`` takes
    ``"3_0"`` and ``" 3"``.

    >>> snapshot_version("12"), snapshot_version("3_0"), snapshot_version(" 3")
    (12, None, None)
    """
    return int(text) if text.isascii() and text.isdigit() else None


def check_output_name(option: str, value: str | None, what: str = "file") -> None:
    """Raise :class:`ValidationError` for an empty output name (``--json ''``), which would be silently skipped
    (``what`` it names: a ``"file"`` or a ``"folder"``)."""
    from rlfb.errors import ValidationError

    if value is not None and not value.strip():
        raise ValidationError(f"{option} needs a {what} name, got {value!r}")


def check_not_folder(option: str, value: str | None) -> None:
    """Raise :class:`ValidationError` now where a file's name given to ``option`` is an existing folder: the write
    failed only when the run was over, as "Is a directory", naming no option."""
    from rlfb.errors import ValidationError

    if value is not None and value != STDOUT and os.path.isdir(value):
        raise ValidationError(f"{option} {value}: that is a folder; give the name of a file to write in it")


def require_matplotlib(option: str) -> None:
    """Raise :class:`RlfbError` now when ``option`` (a plot) needs matplotlib and it is not installed."""
    import importlib.util

    from rlfb.errors import RlfbError

    if importlib.util.find_spec("matplotlib") is None:
        raise RlfbError(f"{option} draws with matplotlib, which is not installed: pip install 'rlfb[eval]'")


def reader_gone() -> None:
    """Point stdout at devnull after the reader of its pipe stopped early (``rlfb ... | head``).

    Not an error, as for any Unix filter; but stdout is closed on its side, and Python's flush at exit
    would fail again without this.
    """
    import sys

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
