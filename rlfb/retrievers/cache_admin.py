"""Reports on the embedding cache's file and clean-ups on request: :func:`cache_stats` and :func:`prune_cache`.

What ``rlfb cache stats`` and ``rlfb cache prune`` run. Unlike :class:`~rlfb.retrievers.cache.EmbeddingCache`,
which passes a damaged file by, these name it in a :class:`CorruptStateError`: a report or a prune was asked
for, so the damage is the answer. A prune writes (and by default vacuums) the whole file; the bound a writing
process keeps by itself (``$RLFB_CACHE_MAX_MB``) is :class:`~rlfb.retrievers.cache.EmbeddingCache`'s.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.retrievers.cache_file import (
    _ENTRY_BYTES,
    _SQLITE_MIN,
    _USED_AT,
    _bytes_of,
    _cache_file,
    _CacheUnavailable,
    _check_nonnegative,
    _drop_least_recent,
    _entry_bytes,
    _file_bytes,
    _is_damage,
    _open,
    _open_read_only,
    _rollback,
)

__all__ = ["cache_stats", "check_prune_bounds", "prune_cache"]


def cache_stats(directory: str | Path | None = None) -> dict[str, Any]:
    """What the cache file holds: per model key, entries, bytes and last use; and its size on disk.

    ``directory`` defaults to :func:`default_cache_dir`. A missing file holds nothing
    (and is not made).

    >>> import tempfile
    >>> import numpy as np
    >>> from rlfb.retrievers.cache import EmbeddingCache
    >>> tmp = tempfile.TemporaryDirectory()
    >>> folder = tmp.name
    >>> cache = EmbeddingCache(folder, "toy|query")
    >>> cache.put_many({"h": np.zeros(4)})
    >>> [(m["model_key"], m["entries"], m["bytes"]) for m in cache_stats(folder)["models"]]
    [('toy|query', 1, 26)]
    >>> cache.close(); tmp.cleanup()
    """
    path = _cache_file(directory)
    out: dict[str, Any] = {"path": str(path), "file_bytes": _file_bytes(path), "models": []}
    if not path.is_file() or out["file_bytes"] == 0:  # an empty file is an empty database: opened, it got a schema
        return out
    with _report_connection(path, read_only=True) as conn:
        rows = conn.execute(
            f"SELECT model_key, COUNT(*), SUM({_ENTRY_BYTES}), MIN({_USED_AT}), MAX({_USED_AT}) "
            "FROM encodings GROUP BY model_key ORDER BY model_key"
        ).fetchall()
    out["models"] = [
        {"model_key": key, "entries": int(n), "bytes": int(size), "oldest_use": int(lo), "latest_use": int(hi)}
        for key, n, size, lo, hi in rows
    ]
    return out


def check_prune_bounds(max_mb: float | None, unused_days: float | None,
                       names: tuple[str, str] = ("max_mb", "unused_days")) -> None:
    """Refuse a bound :func:`prune_cache` cannot take (negative, not finite, not a number), named by ``names``:
    the command line names its options (``--max-mb``, ``--unused-days``)."""
    for name, value in zip(names, (max_mb, unused_days), strict=True):
        if value is not None:
            _check_nonnegative(name, value)


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
    >>> import numpy as np
    >>> from rlfb.retrievers.cache import EmbeddingCache
    >>> tmp = tempfile.TemporaryDirectory()
    >>> folder = tmp.name
    >>> cache = EmbeddingCache(folder, "toy|query")
    >>> cache.put_many({f"h{i}": np.zeros(256) for i in range(10)})
    >>> prune_cache(folder, max_mb=0.002)["removed"], len(cache)
    (8, 2)
    >>> cache.close(); tmp.cleanup()
    """
    if max_mb is None and unused_days is None:
        raise ValidationError("give max_mb, unused_days or both: what to prune")
    check_prune_bounds(max_mb, unused_days)
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
                removed += conn.execute(f"DELETE FROM encodings WHERE {_USED_AT} < ?", (cutoff,)).rowcount
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
