"""The embedding cache's SQLite file: where it lives, its schema, opening and migrating it, what its errors mean.

What :mod:`rlfb.retrievers.cache` (each process's reads and writes) and :mod:`rlfb.retrievers.cache_admin`
(stats and pruning on request) share of the one file, so that the two cannot drift apart: the folder
(``$RLFB_CACHE_DIR``) and the bound (``$RLFB_CACHE_MAX_MB``), the connection's settings (WAL mode, a busy
timeout), telling a damaged file from a busy one or one that cannot be opened or written, and counting and
dropping entries by their last use.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from rlfb.errors import CorruptStateError, ValidationError

__all__ = ["default_cache_dir", "check_cache_dir", "default_max_mb"]

_FILE_NAME = "embeddings.sqlite"
# used_at (the last time an encoding was written or read, for pruning) came later as an added column, with
# the version kept at 1: an older rlfb reading or writing the same file still works (its writes count as
# unused since 1970, so they are pruned first)
_SCHEMA_VERSION = 1
_BUSY_MS = 60_000  # how long a connection waits for another's lock: opening, migrating, a document write
_SCHEMA = """
CREATE TABLE IF NOT EXISTS encodings (
    model_key TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    dim INTEGER NOT NULL,
    indices BLOB,
    vals BLOB NOT NULL,
    used_at INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (model_key, text_hash)
) WITHOUT ROWID
"""
# an entry's last use as pruning and the stats read it: a mark that is no whole number (rlfb writes whole seconds;
# text, or an infinite float, written by hand or by another program: SQLite keeps either in an INTEGER column)
# reads as never used, as an older rlfb's 0 does.
# Read as it is, text sorts after every number: such a row was never pruned, and the stats failed on it.
_USED_AT = "(CASE WHEN typeof(used_at) = 'integer' THEN used_at ELSE 0 END)"
# bytes an entry takes, as pruning counts them: its blobs and its key
_ENTRY_BYTES = "length(vals) + coalesce(length(indices), 0) + length(text_hash) + length(model_key)"
_WAL_KEEP_BYTES = 8 * 1024 * 1024
_PAGE_BYTES = 16384
# SQLite's integers are signed 64-bit: a bound or cutoff beyond them is clamped, which keeps its meaning
_SQLITE_MAX = 2**63 - 1
_SQLITE_MIN = -(2**63)
# what SQLite says of a file it cannot open or write (SQLITE_READONLY, _CANTOPEN, _FULL, _IOERR, _PERM), as
# the messages name them: sqlite_errorcode is Python 3.11 or later
_UNAVAILABLE = ("readonly", "unable to open", "disk is full", "disk i/o error", "permission denied")


def default_cache_dir() -> Path:
    """``$RLFB_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/rlfb`` (where that is an absolute path, as the XDG
    specification asks; Hugging Face's and matplotlib's caches follow it too), else ``~/.cache/rlfb``.
    Until 2026-12-06 ``XDG_CACHE_HOME`` was not read."""
    env = os.environ.get("RLFB_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache") / "rlfb"


def check_cache_dir(value: object) -> None:
    """Refuse an empty or blank ``cache_dir`` string: ``Path("")`` is the working directory, where the cache
    file would be written unasked (an empty ``$RLFB_CACHE_DIR`` means the default, and ``rlfb cache --dir ''``
    is refused).

    >>> check_cache_dir(" ")
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: cache_dir must name a folder, got ' ' (None uses the default folder, ...
    """
    if isinstance(value, str) and not value.strip():
        raise ValidationError(
            f"cache_dir must name a folder, got {value!r} (None uses the default folder, False no disk cache)"
        )


def _cache_folder(directory: str | Path | None) -> Path:
    """``directory`` as a folder (``~`` expanded), ``None`` as :func:`default_cache_dir`."""
    check_cache_dir(directory)
    return Path(directory).expanduser() if directory is not None else default_cache_dir()


def default_max_mb() -> float | None:
    """``$RLFB_CACHE_MAX_MB`` as a number of megabytes, or ``None`` (no bound) when unset or empty."""
    env = os.environ.get("RLFB_CACHE_MAX_MB", "").strip()
    if not env:
        return None
    try:
        value = float(env)
    except ValueError:
        raise ValidationError(f"RLFB_CACHE_MAX_MB must be a number of megabytes, got {env!r}") from None
    return _check_nonnegative("RLFB_CACHE_MAX_MB", value)


def _check_nonnegative(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValidationError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _bytes_of(mb: float) -> int:
    """``mb`` megabytes in bytes, clamped to SQLite's integers (more than any file can hold).

    >>> _bytes_of(1.5), _bytes_of(1e13) == _bytes_of(1e308) == 2**63 - 1
    (1572864, True)
    """
    n = mb * 1024 * 1024
    return _SQLITE_MAX if n >= _SQLITE_MAX else int(n)  # compared exactly; int(inf) would raise


def _cache_file(directory: str | Path | None) -> Path:
    return _cache_folder(directory) / _FILE_NAME


def _file_bytes(path: Path) -> int:
    """The cache file's size on disk, with its write-ahead log."""
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.is_file())


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` reports a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB), not a busy or read-only one.

    sqlite3 raises the plain :class:`sqlite3.DatabaseError` for exactly these; locks, I/O and
    full disks raise its subclass :class:`sqlite3.OperationalError`.
    """
    return type(exc) is sqlite3.DatabaseError


def _is_busy(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` reports a lock another connection held past the busy timeout.

    >>> _is_busy(sqlite3.OperationalError("database is locked")), _is_busy(sqlite3.OperationalError("no such table"))
    (True, False)
    """
    return isinstance(exc, sqlite3.OperationalError) and any(m in str(exc).lower() for m in ("locked", "busy"))


def _begin_waiting(conn: sqlite3.Connection, seconds: float) -> None:
    """``BEGIN IMMEDIATE``, waiting at most ``seconds`` for another connection's write lock (the caller puts the
    connection's own busy timeout back)."""
    conn.execute(f"PRAGMA busy_timeout={min(int(seconds * 1000), _BUSY_MS)}")
    conn.execute("BEGIN IMMEDIATE")


def _is_unavailable(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` reports a file that cannot be opened or written (read-only, a full disk), not a damaged,
    busy one or wrong SQL.

    >>> _is_unavailable(sqlite3.OperationalError("attempt to write a readonly database"))
    True
    >>> _is_unavailable(sqlite3.OperationalError("database is locked"))
    False
    """
    return isinstance(exc, sqlite3.OperationalError) and any(m in str(exc).lower() for m in _UNAVAILABLE)


class _CacheUnavailable(OSError):
    """The cache file cannot be opened: its folder cannot be made, or SQLite cannot open the file."""


def _open(path: Path) -> sqlite3.Connection:
    """A connection to the cache file at ``path`` (made if missing), in WAL mode, schema up to date.

    A file that cannot be opened raises :class:`_CacheUnavailable` naming it, one that is damaged or of
    another schema :class:`CorruptStateError`.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _CacheUnavailable(f"cannot make the embedding cache's folder {path.parent}: {exc}") from exc
    try:
        conn = sqlite3.connect(path, timeout=_BUSY_MS / 1000, check_same_thread=False, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
        # the write-ahead log is cut back to this after each checkpoint: one large batch left it as large for good
        conn.execute(f"PRAGMA journal_size_limit={_WAL_KEEP_BYTES}")
        conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_KEEP_BYTES // _PAGE_BYTES}")  # as often as with 4 KB pages
        # a new file's pages (an existing file's stay as they are): a row of a WITHOUT ROWID table is kept
        # whole in its page only up to about a quarter of the page, so with 4 KB pages each 1.5 KB vector
        # of MiniLM took a page of its own and the file was three times its entries
        conn.execute(f"PRAGMA page_size={_PAGE_BYTES}")
        for attempt in range(100):
            try:
                # switching a new file to WAL needs an exclusive lock and can report "locked" at once,
                # without waiting, when another process is setting up the same file: retry it
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                version = _migrate(conn)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or attempt == 99:
                    raise
                time.sleep(0.01 * (attempt + 1))
        if version != _SCHEMA_VERSION:
            conn.close()
            raise _OtherSchema(f"{path} has cache schema {version}, expected {_SCHEMA_VERSION}")
    except sqlite3.DatabaseError as exc:
        if _is_unavailable(exc):  # a read-only folder, a full disk: nothing is wrong with the file
            raise _CacheUnavailable(f"cannot open the embedding cache {path}: {exc}") from exc
        raise CorruptStateError(f"cannot open embedding cache {path}: {exc}") from exc
    return conn


def _open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to an existing cache file whose folder cannot be written (a read-only mount):
    WAL mode needs its side files made beside the file, so the usual connection fails there. Opened as
    immutable, it reads what the file holds (not a write-ahead log another process left behind). A file
    that is no cache of this schema raises as :func:`_open` does."""
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro&immutable=1", uri=True,
                               check_same_thread=False, isolation_level=None)
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        if _is_unavailable(exc):
            raise _CacheUnavailable(f"cannot open the embedding cache {path}: {exc}") from exc
        raise CorruptStateError(f"cannot open embedding cache {path}: {exc}") from exc
    if version != _SCHEMA_VERSION:
        conn.close()
        raise _OtherSchema(f"{path} has cache schema {version}, expected {_SCHEMA_VERSION}")
    return conn


class _OtherSchema(CorruptStateError):
    """A cache file of another schema (a newer rlfb's): passed by, as a damaged one is; never written."""


def _migrate(conn: sqlite3.Connection) -> int:
    """Create the table, or add what an older file lacks; returns the schema version.

    Safe to rerun, and to race: the check and the change run under one write lock,
    so of two processes opening an old file one adds the column and the other sees it
    done. A newer schema is left alone (the caller names it).
    """
    def state() -> tuple[int, bool]:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(encodings)")}
        return int(conn.execute("PRAGMA user_version").fetchone()[0]), "used_at" in columns

    def due(version: int, tracked: bool) -> bool:  # a new file, or one written before use was tracked
        return version == 0 or (version == _SCHEMA_VERSION and not tracked)

    version, tracked = state()
    if not due(version, tracked):
        return version
    conn.execute("BEGIN IMMEDIATE")
    try:
        version, tracked = state()  # another process may have done it meanwhile
        if due(version, tracked):
            conn.execute(_SCHEMA)  # a new file: the table, used_at included
            if not state()[1]:  # written before use was tracked: unused since 1970, as far as we know
                conn.execute("ALTER TABLE encodings ADD COLUMN used_at INTEGER NOT NULL DEFAULT 0")
            conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
            version = _SCHEMA_VERSION
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return version


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back an open transaction; a rollback that fails too must not hide the error that led to it."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.DatabaseError:
            pass


def _entry_bytes(conn: sqlite3.Connection) -> int:
    """Bytes of every model's entries in the file, counted as :func:`cache_stats` counts them."""
    return int(conn.execute(f"SELECT COALESCE(SUM({_ENTRY_BYTES}), 0) FROM encodings").fetchone()[0])


def _drop_least_recent(conn: sqlite3.Connection, keep_bytes: int,
                       first: Iterable[tuple[str, str]] = ()) -> int:
    """Delete the least recently used entries beyond the newest ``keep_bytes``; returns how many.

    ``first``, ``(model_key, text_hash)`` keys, count as newer than every other entry: a batch just written,
    whose ``used_at`` (whole seconds) ties with what was written earlier in the same second. Without them ties
    go by key, and a bounded cache's writes in quick succession dropped the batch each had just written.
    """
    first = list(first)
    if first:
        # a temporary table of this connection, emptied before it returns: a batch may hold more keys than an
        # IN list takes
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS rlfb_written_first (model_key TEXT NOT NULL, "
                     "text_hash TEXT NOT NULL, PRIMARY KEY (model_key, text_hash)) WITHOUT ROWID")
        conn.executemany("INSERT OR IGNORE INTO temp.rlfb_written_first VALUES (?, ?)", first)
    fresh = ("EXISTS (SELECT 1 FROM temp.rlfb_written_first f WHERE f.model_key = encodings.model_key "
             "AND f.text_hash = encodings.text_hash)" if first else "0")
    try:
        # newest first: what keeps within the limit stays, the rest goes
        victims = conn.execute(
            f"SELECT model_key, text_hash FROM (SELECT model_key, text_hash, SUM({_ENTRY_BYTES}) OVER "
            f"(ORDER BY {fresh} DESC, {_USED_AT} DESC, model_key, text_hash ROWS UNBOUNDED PRECEDING) AS running "
            "FROM encodings) WHERE running > ?",
            (keep_bytes,),
        ).fetchall()
    finally:
        if first:
            conn.execute("DELETE FROM temp.rlfb_written_first")
    conn.executemany("DELETE FROM encodings WHERE model_key = ? AND text_hash = ?", victims)
    return len(victims)
