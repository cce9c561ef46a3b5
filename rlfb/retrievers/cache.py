"""On-disk cache of text encodings, so that a restart does not re-encode a corpus.

One SQLite file (WAL mode, parameterised SQL only) holds the encodings of every
model, keyed by ``(model_key, sha256(text))``. A dense vector is stored as one
float32 blob; a sparse vector as an int32 blob of indices plus a float32 blob of
values (and the full dimension). Two processes may read and write the same file at once: SQLite's WAL
journal and a busy timeout serialise the writers.

The directory defaults to ``$RLFB_CACHE_DIR``, else ``~/.cache/rlfb``. The file grows with every
new text unless bounded: ``max_mb`` (default ``$RLFB_CACHE_MAX_MB``, unset: no bound) makes each
writing process drop the least recently used encodings once the file's entries pass it, and
:func:`prune_cache` does the same on request.

The cache holds nothing that cannot be encoded again: a damaged row is a miss, and a damaged
file warns once and is then passed by (lookups miss, writes are dropped), so indexing and
search go on; :func:`cache_stats` and :func:`prune_cache` name it in a :class:`CorruptStateError`.
A cache that cannot be written is passed by alike: a folder that cannot be made, or a file that
cannot be opened, warns once and is not used; a file that cannot be written (read-only, in a
read-only folder, a full disk) warns once, drops writes and is still read (in a folder that cannot
be written, opened read-only and immutable, since WAL mode needs its side files beside the file).
"""

from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rlfb.errors import CorruptStateError, ValidationError

__all__ = [
    "EmbeddingCache",
    "LRUCache",
    "SparseVector",
    "cached_encode",
    "open_side_caches",
    "default_cache_dir",
    "text_hash",
    "Encoding",
    "cache_stats",
    "prune_cache",
    "default_max_mb",
]


class SparseVector(NamedTuple):
    """A sparse encoding: term ids (int32), their weights (float32) and the full dimension."""

    indices: np.ndarray
    values: np.ndarray
    dim: int


#: a dense float32 vector or a :class:`SparseVector`
Encoding = np.ndarray | SparseVector

_FILE_NAME = "embeddings.sqlite"
# used_at (the last time an encoding was written or read, for pruning) came later as an added column, with
# the version kept at 1: an older rlfb reading or writing the same file still works (its writes count as
# unused since 1970, so they are pruned first)
_SCHEMA_VERSION = 1
_BUSY_MS = 60_000  # how long a connection waits for another's lock: opening, migrating, a document write
_BATCH = 500  # parameters per IN (...) clause, well under SQLite's limit
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
# A read marks its hits as used at most once a day: a write per lookup would make every read a write.
_TOUCH_EVERY = 86400
# bytes an entry takes, as pruning counts them: its blobs and its key
_ENTRY_BYTES = "length(vals) + coalesce(length(indices), 0) + length(text_hash) + length(model_key)"


# an automatic prune keeps this share of max_mb, so that the next writes do not prune again at once
_PRUNE_TO = 0.9
_WAL_KEEP_BYTES = 8 * 1024 * 1024
_PAGE_BYTES = 16384
# SQLite's integers are signed 64-bit: a bound or cutoff beyond them is clamped, which keeps its meaning
_SQLITE_MAX = 2**63 - 1
_SQLITE_MIN = -(2**63)
# files whose damage (or that they cannot be opened or written) has been reported in this process: one
# warning per file and kind, not per lookup
_WARNED: set[str] = set()
# what SQLite says of a file it cannot open or write (SQLITE_READONLY, _CANTOPEN, _FULL, _IOERR, _PERM), as
# the messages name them: sqlite_errorcode is Python 3.11 or later
_UNAVAILABLE = ("readonly", "unable to open", "disk is full", "disk i/o error", "permission denied")


def default_cache_dir() -> Path:
    """``$RLFB_CACHE_DIR`` if set, else ``~/.cache/rlfb``."""
    env = os.environ.get("RLFB_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rlfb"


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


def text_hash(text: str) -> str:
    """Hex sha256 of a text's UTF-8 bytes, the cache key of one text (a lone surrogate, which
    UTF-8 cannot encode, is hashed through ``surrogatepass`` rather than raising).

    >>> text_hash("abc")[:16]
    'ba7816bf8f01cfea'
    """
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


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


def _decode_row(dim: object, idx: object, vals: object) -> Encoding | None:
    """One stored row as an encoding, or ``None`` where the row is damaged.

    A cache holds nothing that cannot be made again, so a damaged row is a miss, not an error.
    Each check stands in front of a failure or a silent wrong score: ``np.frombuffer`` raises on
    a blob whose length is no multiple of 4 bytes; a NaN or infinite value would make every score
    it enters NaN (reported as no score); a sparse row's term ids must fit its dimension and pair
    up with its values. SQLite types are loose, so a blob may come back as text and a dimension
    as a float: those are damage too.

    >>> _decode_row(2, None, np.array([1.0, 2.0], dtype=np.float32).tobytes()).tolist()
    [1.0, 2.0]
    >>> _decode_row(2, None, b"12345") is None, _decode_row(1, None, np.float32("nan").tobytes()) is None
    (True, True)
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
        return None
    if not isinstance(vals, bytes) or len(vals) % 4:
        return None
    values = np.frombuffer(vals, dtype=np.float32)
    if not np.isfinite(values).all():
        return None
    if idx is None:  # dense: one value per dimension
        return values.copy() if values.shape[0] == dim else None
    if not isinstance(idx, bytes) or len(idx) != len(vals):  # int32 and float32: as many bytes as each other
        return None
    indices = np.frombuffer(idx, dtype=np.int32)
    if indices.size and (indices.min() < 0 or indices.max() >= dim):
        return None
    return SparseVector(indices.copy(), values.copy(), dim)


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back an open transaction; a rollback that fails too must not hide the error that led to it."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.DatabaseError:
            pass


class EmbeddingCache:
    """Encodings of one model, persisted in SQLite.

    Parameters
    ----------
    directory
        Folder of the cache file; ``None`` uses :func:`default_cache_dir`.
    model_key
        Identifies the model *and* the encoding mode (for example document or
        query side); encodings are only shared between equal keys.
    max_mb
        Bound on the entries of the whole file (every model's), in MB: once this
        object's writes take them past it, the least recently used encodings are
        removed down to 90 % of it (a batch larger than that is written only as far as
        it fits). ``None`` reads ``$RLFB_CACHE_MAX_MB``; unset
        there too, nothing is removed. Freed pages are reused by later writes
        rather than returned to the file system (``rlfb cache prune`` vacuums).
        The size is counted exactly when the bound may be passed; writes by other
        processes in between are seen at that count.
    write_wait
        Seconds a write waits for another process's write lock (a ``rlfb cache
        prune`` vacuuming, another process's batch) before it is dropped: what is
        not stored is encoded again when next needed. The query-side cache of a
        retriever waits 0 s, so a search never stalls on the cache; lookups never
        wait either (their used-marks are dropped while the file is busy).

    Examples
    --------
    >>> import tempfile
    >>> cache = EmbeddingCache(tempfile.mkdtemp(), "toy-model")
    >>> cache.put_many({"h1": np.array([1.0, 2.0]), "h2": SparseVector(np.array([3]), np.array([0.5]), 10)})
    >>> got = cache.get_many(["h1", "h2", "missing"])
    >>> sorted(got), got["h1"].tolist(), got["h2"].indices.tolist(), got["h2"].dim
    (['h1', 'h2'], [1.0, 2.0], [3], 10)
    >>> cache.close()
    """

    def __init__(self, directory: str | Path | None, model_key: str, *, max_mb: float | None = None,
                 write_wait: float = 60.0) -> None:
        if not isinstance(model_key, str) or not model_key:
            raise ValidationError("model_key must be a non-empty string")
        # how long a write waits for another process's write lock (a prune's VACUUM) before it is dropped: the
        # query side's is 0, as a search must not stall on the cache
        self.write_wait = _check_nonnegative("write_wait", write_wait)
        self.directory = _cache_folder(directory)
        self.path = self.directory / _FILE_NAME
        self.model_key = model_key
        self.max_mb = default_max_mb() if max_mb is None else _check_nonnegative("max_mb", max_mb)
        self._size: int | None = None  # the file's entry bytes at the last count, plus this object's writes since
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        # the file was found damaged, or cannot be opened: lookups miss and writes are dropped from then on
        self._damaged = False
        self._read_only = False  # the file cannot be written: writes are dropped from then on, lookups still read

    # -- connection -------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        # a connection must not cross a fork: reopen in a child process
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        self._conn, self._pid = _open(self.path), os.getpid()
        return self._conn

    def close(self) -> None:
        """Close the connection; the cache reopens on next use."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    # -- access -----------------------------------------------------------------------------------
    def _give_up(self, exc: sqlite3.DatabaseError) -> None:
        """Go on without the file after ``exc`` showed it damaged; warn once per file and process.

        The cache holds nothing that cannot be encoded again, so its damage must not stop
        indexing or search: they go on as without a disk cache.
        """
        self._damaged = True
        self._warn_once(
            "damaged",
            f"the embedding cache {self.path} is damaged ({exc}): going on without it, encoding "
            "texts afresh. It holds only encodings that can be made again, so it is safe to delete.",
        )

    def _go_without(self, exc: Exception, *, readable: bool) -> None:
        """Go on without writing the file (and without reading it unless ``readable``) after ``exc`` showed
        that it cannot be opened or written; warn once per file and process.

        The cache is optional, so a read-only file or folder, a full disk or a folder that cannot be made
        must not stop indexing or search: what cannot be stored is encoded again when next needed.
        """
        reason = exc.__cause__ if isinstance(exc, _CacheUnavailable) and exc.__cause__ else exc  # it names the path
        if readable:
            self._read_only = True
        else:
            self._damaged = True
        self._warn_once(
            "unwritable" if readable else "unavailable",
            f"the embedding cache {self.path} cannot be {'written' if readable else 'used'} ({reason}): going on "
            + ("reading it but storing no new encodings" if readable else "without it, encoding texts afresh")
            + " (set cache_dir to a folder that can be written, or False to use no disk cache).",
        )

    def _warn_once(self, kind: str, message: str) -> None:
        key = f"{kind}:{self.path}"
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _usable(self) -> sqlite3.Connection | None:
        """The connection, under the lock; ``None`` once the file is known damaged, also when it is damaged
        past opening (a header that is no database): that is :meth:`_give_up` as well; and when it cannot be
        opened (:meth:`_go_without`), or is of another schema version (a newer rlfb's)."""
        if self._damaged:
            return None
        try:
            return self._connect()
        except _CacheUnavailable as exc:
            try:  # a whole cache in a folder that cannot be written (a read-only mount) is still read
                self._conn, self._pid = _open_read_only(self.path), os.getpid()
            except (_CacheUnavailable, CorruptStateError):
                self._go_without(exc, readable=False)
                return None
            self._go_without(exc, readable=True)
            return self._conn
        except _OtherSchema as exc:
            # a newer rlfb's file (one process of an upgrade beside one not yet upgraded): it holds nothing that
            # cannot be encoded again, so going on without it beats refusing every index and search
            self._damaged = True
            self._warn_once("other schema", f"the embedding cache {exc}: going on without it, encoding texts "
                                            "afresh (upgrade this rlfb, or give it a cache_dir of its own)")
            return None
        except CorruptStateError as exc:
            cause = exc.__cause__
            if isinstance(cause, sqlite3.DatabaseError) and _is_damage(cause):
                self._give_up(cause)
                return None
            raise

    def get_many(self, hashes: Iterable[str]) -> dict[str, Encoding]:
        """Cached encodings of ``hashes``; missing hashes are simply absent from the result.

        Hits not marked as used for a day are marked now, so that :func:`prune_cache`
        removes what has gone unused longest. A damaged file (SQLite reports it malformed)
        warns once and answers every lookup with nothing from then on.
        """
        wanted = list(dict.fromkeys(hashes))
        out: dict[str, Encoding] = {}
        if not wanted:
            return out
        now = int(time.time())
        stale: list[str] = []
        with self._lock:
            conn = self._usable()
            if conn is None:
                return out
            try:
                for start in range(0, len(wanted), _BATCH):
                    part = wanted[start : start + _BATCH]
                    marks = ",".join("?" * len(part))
                    rows = conn.execute(
                        f"SELECT text_hash, dim, indices, vals, used_at FROM encodings "
                        f"WHERE model_key = ? AND text_hash IN ({marks})",
                        [self.model_key, *part],
                    ).fetchall()
                    for h, dim, idx, vals, used_at in rows:
                        enc = _decode_row(dim, idx, vals)
                        if enc is None:
                            continue  # damaged row: treat as a miss (the text is encoded again and the row rewritten)
                        out[h] = enc
                        if used_at < now - _TOUCH_EVERY:
                            stale.append(h)
                if stale:
                    self._touch(conn, stale, now)
            except sqlite3.DatabaseError as exc:
                _rollback(conn)  # the marks' transaction, if the damage showed there
                if _is_damage(exc):
                    self._give_up(exc)
                elif _is_unavailable(exc):  # an I/O error reading it
                    self._go_without(exc, readable=False)
                else:
                    raise
                return {}
        return out

    def _touch(self, conn: sqlite3.Connection, hashes: list[str], now: int) -> None:
        """Mark ``hashes`` as used at ``now``: best effort, since a read must not fail, nor wait, for it (it
        waited up to a minute for another process's write lock)."""
        try:
            _begin_waiting(conn, 0.0)
            for start in range(0, len(hashes), _BATCH):
                part = hashes[start : start + _BATCH]
                marks = ",".join("?" * len(part))
                conn.execute(
                    f"UPDATE encodings SET used_at = ? WHERE model_key = ? AND text_hash IN ({marks})",
                    [now, self.model_key, *part],
                )
            conn.execute("COMMIT")
        except sqlite3.OperationalError:  # a read-only or busy file: the marks wait for the next read
            _rollback(conn)
        finally:
            conn.execute(f"PRAGMA busy_timeout={_BUSY_MS}")

    def put_many(self, items: Mapping[str, Encoding] | Sequence[tuple[str, Encoding]], *,
                 wait: float | None = None) -> None:
        """Store encodings, ``{hash: vector}`` or ``{hash: SparseVector}``, in one transaction.

        Into a damaged file nothing is written: the first write that finds it so warns
        (once per file and process), and this cache drops writes from then on. So it does
        when the file cannot be written (read-only, a full disk), reading it still. ``wait`` (default
        :attr:`write_wait`) is how long it waits for another process's write lock before it drops them.
        """
        pairs = items.items() if isinstance(items, Mapping) else items
        now = int(time.time())
        rows = []
        for h, enc in pairs:
            if isinstance(enc, SparseVector):
                idx = np.ascontiguousarray(enc.indices, dtype=np.int32)
                vals = np.ascontiguousarray(enc.values, dtype=np.float32)
                if idx.shape != vals.shape:
                    raise ValidationError(
                        f"sparse encoding {h!r}: {idx.shape[0]} indices, {vals.shape[0]} values"
                    )
                rows.append((self.model_key, h, int(enc.dim), idx.tobytes(), vals.tobytes(), now))
            elif isinstance(enc, tuple):
                raise ValidationError(f"encoding {h!r} is a plain tuple, not a SparseVector")
            else:
                vec = np.ascontiguousarray(enc, dtype=np.float32).ravel()
                rows.append((self.model_key, h, int(vec.shape[0]), None, vec.tobytes(), now))
        if self.max_mb is not None:
            rows = _within(rows, int(_bytes_of(self.max_mb) * _PRUNE_TO))
        if not rows:
            return
        with self._lock:
            conn = None if self._read_only else self._usable()
            if conn is None:
                return
            try:
                _begin_waiting(conn, self.write_wait if wait is None else _check_nonnegative("wait", wait))
                conn.executemany(
                    "INSERT OR REPLACE INTO encodings (model_key, text_hash, dim, indices, vals, used_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    rows,
                )
                if self.max_mb is not None:
                    self._keep_bound(conn, rows)
                conn.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                _rollback(conn)
                if _is_damage(exc):
                    self._give_up(exc)
                elif _is_unavailable(exc):
                    self._go_without(exc, readable=True)
                elif not _is_busy(exc):  # busy past write_wait: dropped, encoded again when next needed
                    raise
            except BaseException:
                _rollback(conn)
                raise
            finally:
                conn.execute(f"PRAGMA busy_timeout={_BUSY_MS}")

    def _keep_bound(self, conn: sqlite3.Connection, rows: list[tuple]) -> None:
        """Inside the write's transaction: past ``max_mb``, drop the least recently used to 90 % of it.

        Counting the file's entries is a scan, so it is done only when this object's running
        estimate (the last count plus what it wrote since; a replaced row is counted twice, which
        errs towards counting) passes the bound.
        """
        assert self.max_mb is not None
        limit = _bytes_of(self.max_mb)
        written = sum(map(_row_bytes, rows))
        if self._size is not None and self._size + written <= limit:
            self._size += written
            return
        self._size = _entry_bytes(conn)
        if self._size > limit:
            _drop_least_recent(conn, int(limit * _PRUNE_TO))
            self._size = _entry_bytes(conn)

    def __len__(self) -> int:
        """Number of encodings stored under this cache's model key."""
        with self._lock:
            conn = self._connect()
            sql = "SELECT COUNT(*) FROM encodings WHERE model_key = ?"
            return int(conn.execute(sql, (self.model_key,)).fetchone()[0])

    def __repr__(self) -> str:
        return f"EmbeddingCache({str(self.directory)!r}, {self.model_key!r})"


def cache_stats(directory: str | Path | None = None) -> dict[str, Any]:
    """What the cache file holds: per model key, entries, bytes and last use; and its size on disk.

    ``directory`` defaults to :func:`default_cache_dir`. A missing file holds nothing
    (and is not made).

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> EmbeddingCache(folder, "toy|query").put_many({"h": np.zeros(4)})
    >>> [(m["model_key"], m["entries"], m["bytes"]) for m in cache_stats(folder)["models"]]
    [('toy|query', 1, 26)]
    """
    path = _cache_file(directory)
    out: dict[str, Any] = {"path": str(path), "file_bytes": _file_bytes(path), "models": []}
    if not path.is_file() or out["file_bytes"] == 0:  # an empty file is an empty database: opened, it got a schema
        return out
    with _report_connection(path, read_only=True) as conn:
        rows = conn.execute(
            f"SELECT model_key, COUNT(*), SUM({_ENTRY_BYTES}), MIN(used_at), MAX(used_at) "
            "FROM encodings GROUP BY model_key ORDER BY model_key"
        ).fetchall()
    out["models"] = [
        {"model_key": key, "entries": int(n), "bytes": int(size), "oldest_use": int(lo), "latest_use": int(hi)}
        for key, n, size, lo, hi in rows
    ]
    return out


def prune_cache(
    directory: str | Path | None = None,
    *,
    max_mb: float | None = None,
    unused_days: float | None = None,
    vacuum: bool = True,
) -> dict[str, Any]:
    """Remove encodings: those unused for ``unused_days``, then the least recently used beyond ``max_mb``.

    "Used" is the last write, or the last read (marked at most once a day). The
    size counts every model's entries (blobs and keys), as :func:`cache_stats`
    does. ``vacuum`` then gives the freed pages back to the file system (also pages freed
    earlier, once they are a tenth of the file). Returns
    the entries removed and the sizes before and after. Anything removed is
    encoded again when next needed; nothing else is lost.

    >>> import tempfile, time
    >>> folder = tempfile.mkdtemp()
    >>> cache = EmbeddingCache(folder, "toy|query")
    >>> cache.put_many({f"h{i}": np.zeros(256) for i in range(10)})
    >>> prune_cache(folder, max_mb=0.002)["removed"], len(cache)
    (8, 2)
    """
    if max_mb is None and unused_days is None:
        raise ValidationError("give max_mb, unused_days or both: what to prune")
    for name, value in (("max_mb", max_mb), ("unused_days", unused_days)):
        if value is not None:
            _check_nonnegative(name, value)
    path = _cache_file(directory)
    before = _file_bytes(path)
    if not path.is_file():
        return {"path": str(path), "removed": 0, "bytes_before": 0, "bytes_after": 0,
                "file_bytes_before": before, "file_bytes_after": before}
    with _report_connection(path) as conn:
        bytes_before = _entry_bytes(conn)
        removed = 0
        conn.execute("BEGIN IMMEDIATE")
        try:
            if unused_days is not None:
                # clamped: a cutoff before SQLite's smallest integer removes nothing, as its day count means
                cutoff = time.time() - unused_days * 86400
                cutoff = _SQLITE_MIN if cutoff <= _SQLITE_MIN else int(cutoff)
                removed += conn.execute("DELETE FROM encodings WHERE used_at < ?", (cutoff,)).rowcount
            if max_mb is not None:
                removed += _drop_least_recent(conn, _bytes_of(max_mb))
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        # also when this prune removed nothing: pages freed by RLFB_CACHE_MAX_MB's trimming are given back here,
        # once they are worth rewriting the whole file for (a tenth of it)
        if vacuum and (removed or _free_bytes(conn) >= 0.1 * _file_bytes(path)):
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        bytes_after = _entry_bytes(conn)
    return {"path": str(path), "removed": removed, "bytes_before": bytes_before, "bytes_after": bytes_after,
            "file_bytes_before": before, "file_bytes_after": _file_bytes(path)}


def _free_bytes(conn: sqlite3.Connection) -> int:
    """The bytes of the file's free pages."""
    pages = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    return pages * int(conn.execute("PRAGMA page_size").fetchone()[0])


@contextmanager
def _report_connection(path: Path, *, read_only: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection to the cache file for :func:`cache_stats` and :func:`prune_cache`, closed after; damage
    SQLite finds in the file is a :class:`CorruptStateError` naming it. With ``read_only``, a file whose
    folder cannot be written is opened read-only (stats); a prune needs to write and fails as before."""
    try:
        conn = _open(path)
    except _CacheUnavailable:
        if not (read_only and path.is_file()):
            raise
        conn = _open_read_only(path)
    try:
        yield conn
    except sqlite3.DatabaseError as exc:
        if not _is_damage(exc):
            raise
        raise _damaged_file(path, exc) from exc
    finally:
        conn.close()


def _damaged_file(path: Path, exc: sqlite3.DatabaseError) -> CorruptStateError:
    return CorruptStateError(
        f"the embedding cache {path} is damaged ({exc}); it holds only encodings that can be made again, "
        "so delete it and rlfb makes a new one"
    )


def _row_bytes(row: tuple) -> int:
    """The bytes of one row :meth:`EmbeddingCache.put_many` writes, counted as :data:`_ENTRY_BYTES` counts them."""
    return len(row[0]) + len(row[1]) + len(row[4]) + (len(row[3]) if row[3] is not None else 0)


def _within(rows: list[tuple], keep_bytes: int) -> list[tuple]:
    """The first of ``rows`` that fit in ``keep_bytes``: a batch larger than the bound is not written whole only to
    be dropped again in the same transaction, which grew the file and its write-ahead log past the bound (one
    31 MB batch under a 5 MB bound left a 93 MB file and a 94 MB log)."""
    total = 0
    for i, row in enumerate(rows):
        total += _row_bytes(row)
        if total > keep_bytes:
            return rows[:i]
    return rows


def _entry_bytes(conn: sqlite3.Connection) -> int:
    """Bytes of every model's entries in the file, counted as :func:`cache_stats` counts them."""
    return int(conn.execute(f"SELECT COALESCE(SUM({_ENTRY_BYTES}), 0) FROM encodings").fetchone()[0])


def _drop_least_recent(conn: sqlite3.Connection, keep_bytes: int) -> int:
    """Delete the least recently used entries beyond the newest ``keep_bytes``; returns how many."""
    # newest first: what keeps within the limit stays, the rest goes
    victims = conn.execute(
        f"SELECT model_key, text_hash FROM (SELECT model_key, text_hash, SUM({_ENTRY_BYTES}) OVER "
        "(ORDER BY used_at DESC, model_key, text_hash ROWS UNBOUNDED PRECEDING) AS running "
        "FROM encodings) WHERE running > ?",
        (keep_bytes,),
    ).fetchall()
    conn.executemany("DELETE FROM encodings WHERE model_key = ? AND text_hash = ?", victims)
    return len(victims)


def _cache_file(directory: str | Path | None) -> Path:
    return _cache_folder(directory) / _FILE_NAME


def _file_bytes(path: Path) -> int:
    """The cache file's size on disk, with its write-ahead log."""
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.is_file())


class LRUCache:
    """A small in-memory least-recently-used map (query encodings of one process).

    >>> lru = LRUCache(2)
    >>> lru.put("a", 1); lru.put("b", 2); _ = lru.get("a"); lru.put("c", 3)
    >>> sorted(lru.keys())
    ['a', 'c']
    """

    def __init__(self, maxsize: int = 10_000) -> None:
        self.maxsize = int(maxsize)
        self._data: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> object | None:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: str, value: object) -> None:
        if self.maxsize <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._data)

    def __len__(self) -> int:
        return len(self._data)


def open_side_caches(
    cache_dir: str | Path | bool | None, model_key: str | None
) -> tuple[EmbeddingCache | None, EmbeddingCache | None]:
    """The document-side and query-side caches of one model (``(None, None)`` when caching is off).

    ``cache_dir`` is a folder, ``None``/``True`` for :func:`default_cache_dir`, or
    ``False`` to disable; a ``None`` ``model_key`` (a model of unknown origin) also disables.
    An empty or blank string is a :class:`ValidationError` (see :func:`check_cache_dir`).
    """
    check_cache_dir(cache_dir)
    if cache_dir is False or model_key is None:
        return None, None
    directory = None if cache_dir is None or cache_dir is True else cache_dir
    return (EmbeddingCache(directory, model_key + "|document"),
            EmbeddingCache(directory, model_key + "|query", write_wait=0.0))


def cached_encode(
    texts: Sequence[str],
    encode: Callable[[list[str]], Sequence[Encoding]],
    disk: EmbeddingCache | None = None,
    memory: LRUCache | None = None,
    *,
    chunk_size: int = 512,
    show_progress: bool = False,
    desc: str = "encoding",
    accept: Callable[[Encoding], bool] | None = None,
    wait: float | None = None,
) -> list[Encoding]:
    """Encodings of ``texts``, calling ``encode`` only for texts found in neither cache.

    Each distinct missing text is encoded once. Missing texts are encoded
    longest first (less padding), ``chunk_size`` at a time, and each chunk is
    written to ``disk`` as soon as it is done, so an interrupted run resumes
    where it stopped. The result is aligned with ``texts``. A disk hit that
    ``accept`` refuses (one ``encode`` could not have made) is a miss: encoded
    again, and its row rewritten. ``wait`` is how long a write to ``disk`` waits for
    another process's lock (default: the cache's ``write_wait``).

    >>> calls = []
    >>> def enc(batch):
    ...     calls.append(list(batch))
    ...     return [np.array([float(len(t))]) for t in batch]
    >>> lru = LRUCache()
    >>> [v.tolist() for v in cached_encode(["ab", "c", "ab"], enc, memory=lru)]
    [[2.0], [1.0], [2.0]]
    >>> _ = cached_encode(["c"], enc, memory=lru)
    >>> calls
    [['ab', 'c']]
    """
    hashes = [text_hash(t) for t in texts]
    found: dict[str, Encoding] = {}
    if memory is not None:
        for h in dict.fromkeys(hashes):
            hit = memory.get(h)
            if hit is not None:
                found[h] = hit  # type: ignore[assignment]
    if disk is not None:
        rest = [h for h in dict.fromkeys(hashes) if h not in found]
        if rest:
            from_disk = disk.get_many(rest)
            if accept is not None:
                from_disk = {h: enc for h, enc in from_disk.items() if accept(enc)}
            found.update(from_disk)
            if memory is not None:
                for h, enc in from_disk.items():
                    memory.put(h, enc)
    missing: dict[str, str] = {}
    for h, t in zip(hashes, texts, strict=True):
        if h not in found and h not in missing:
            missing[h] = t
    if missing:
        from rlfb._progress import progress

        todo = sorted(missing.items(), key=lambda item: -len(item[1]))
        with progress(total=len(todo), desc=desc, unit="text", disable=not show_progress) as bar:
            for start in range(0, len(todo), max(1, chunk_size)):
                part = todo[start : start + max(1, chunk_size)]
                new = list(encode([t for _, t in part]))
                if len(new) != len(part):
                    raise RuntimeError(f"encoder returned {len(new)} encodings for {len(part)} texts")
                fresh = {h: enc for (h, _), enc in zip(part, new, strict=True)}
                if disk is not None:
                    disk.put_many(fresh, wait=wait)
                if memory is not None:
                    for h, enc in fresh.items():
                        memory.put(h, enc)
                found.update(fresh)
                bar.update(len(part))
    return [found[h] for h in hashes]
