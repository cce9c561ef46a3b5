"""On-disk cache of text encodings, so that a restart does not re-encode a corpus.

One SQLite file (WAL mode, parameterised SQL only) holds the encodings of every
model, keyed by ``(model_key, sha256(text))``. A dense vector is stored as one
float32 blob; a sparse vector as an int32 blob of indices plus a float32 blob of
values (and the full dimension). Two processes may read and write the same file at once: SQLite's WAL
journal and a busy timeout serialise the writers.

The directory defaults to ``$RLFB_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlfb``, else ``~/.cache/rlfb``
(:func:`~rlfb.retrievers.cache_file.default_cache_dir`). The file grows with every
new text unless bounded: ``max_mb`` (default ``$RLFB_CACHE_MAX_MB``, unset: no bound) makes each
writing process drop the least recently used encodings once the file's entries pass it, and
:func:`prune_cache` does the same on request.

The cache holds nothing that cannot be encoded again: a damaged row is a miss (a row whose last-use
mark alone is damaged is read, marked again, and counts as never used until then), and a damaged
file warns once and is then passed by (lookups miss, writes are dropped), so indexing and
search go on. A cache that cannot be written is passed by alike: a folder that cannot be made, or a file that
cannot be opened, warns once and is not used; a file that cannot be written (read-only, in a
read-only folder, a full disk) warns once, drops writes and is still read (in a folder that cannot
be written, opened read-only and immutable, since WAL mode needs its side files beside the file).

This module is the cache as retrieval uses it (:class:`EmbeddingCache`, :class:`LRUCache`,
:func:`cached_encode`). The file itself (its folder, schema, opening and migrating it, what its errors
mean) is :mod:`rlfb.retrievers.cache_file`; :func:`cache_stats` and :func:`prune_cache`, which name a damaged
file in a :class:`CorruptStateError`, are :mod:`rlfb.retrievers.cache_admin`; their public names are still
imported from here too.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from rlfb._caller import warn_at_app
from rlfb.errors import CorruptStateError, ValidationError
from rlfb.retrievers.cache_admin import cache_stats, prune_cache
from rlfb.retrievers.cache_file import (
    _BUSY_MS,
    _FILE_NAME,
    _USED_AT,
    _begin_waiting,
    _bytes_of,
    _cache_folder,
    _CacheUnavailable,
    _check_nonnegative,
    _drop_least_recent,
    _entry_bytes,
    _is_busy,
    _is_damage,
    _is_unavailable,
    _open,
    _open_read_only,
    _OtherSchema,
    _rollback,
    check_cache_dir,
    default_cache_dir,
    default_max_mb,
)
from rlfb.retrievers.cache_file import _cache_file as _cache_file  # where the file is, imported from here too

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

_BATCH = 500  # parameters per IN (...) clause, well under SQLite's limit
# A read marks its hits as used at most once a day: a write per lookup would make every read a write.
_TOUCH_EVERY = 86400
# an automatic prune keeps this share of max_mb, so that the next writes do not prune again at once
_PRUNE_TO = 0.9
# files whose damage (or that they cannot be opened or written) has been reported in this process: one
# warning per file and kind, not per lookup
_WARNED: set[str] = set()


def text_hash(text: str) -> str:
    """Hex sha256 of a text's UTF-8 bytes, the cache key of one text (a lone surrogate, which
    UTF-8 cannot encode, is hashed through ``surrogatepass`` rather than raising).

    >>> text_hash("abc")[:16]
    'ba7816bf8f01cfea'
    """
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


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
    >>> folder = tempfile.TemporaryDirectory()
    >>> cache = EmbeddingCache(folder.name, "toy-model")
    >>> cache.put_many({"h1": np.array([1.0, 2.0]), "h2": SparseVector(np.array([3]), np.array([0.5]), 10)})
    >>> got = cache.get_many(["h1", "h2", "missing"])
    >>> sorted(got), got["h1"].tolist(), got["h2"].indices.tolist(), got["h2"].dim
    (['h1', 'h2'], [1.0, 2.0], [3], 10)
    >>> cache.close()
    >>> folder.cleanup()
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
            # the app's line: a fixed level named a retriever's module (the cache is reached through several)
            warn_at_app(message, RuntimeWarning)

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
                    # a damaged last-use mark reads as never used (_USED_AT): marked again below, as a stale one is
                    rows = conn.execute(
                        f"SELECT text_hash, dim, indices, vals, {_USED_AT} FROM encodings "
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
        rows: list[tuple[str, str, int, bytes | None, bytes, int]] = []  # indices: None for a dense vector
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
            _drop_least_recent(conn, int(limit * _PRUNE_TO), first=[(r[0], r[1]) for r in rows])
            self._size = _entry_bytes(conn)

    def __len__(self) -> int:
        """Number of encodings stored under this cache's model key."""
        with self._lock:
            conn = self._connect()
            sql = "SELECT COUNT(*) FROM encodings WHERE model_key = ?"
            return int(conn.execute(sql, (self.model_key,)).fetchone()[0])

    def __repr__(self) -> str:
        return f"EmbeddingCache({str(self.directory)!r}, {self.model_key!r})"


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
