"""A store's file held by another connection, as SQLite sees another process writing to it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """The store's file held by another connection (another process writing), as SQLite sees it."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # let go in a callback's thread
    other.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()
