"""The store's connection to its file: opening it, SQLite's errors named, and the transactions every call runs in.

:func:`connect` and :func:`prepare` open a file as a feedback store (WAL, pragmas,
migrations, and the checks that it is rlfb's and whole); :class:`Transactions`
holds the one connection's lock, read and write transactions and ``exclusive()``
blocks. See :mod:`rlfb.store` for the concurrency and durability they give.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlite_utils import Database

from rlfb._caller import warn_at_app
from rlfb.errors import (
    CorruptStateError,
    ReadOnlyStoreError,
    RlfbError,
    StoreBusyError,
    StoreClosedError,
    StoreFileGoneError,
    StoreFullError,
    ValidationError,
)
from rlfb.store.migrations import MIGRATIONS, expected_columns

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_TABLES = frozenset(
    {"events", "event_chunks", "feedback", "rewards", "policy_snapshots", "run_links", "failed_runs", "settings"}
)
_WAL_SIZE_LIMIT = 64 * 1024 * 1024  # bytes; PRAGMA journal_size_limit
_MAX_BUSY_MS = 2**31 - 1  # SQLite's busy timeout is a C int of milliseconds


def _read_only(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_READONLY: the file, or the folder its WAL side files go in, cannot be written."""
    return isinstance(exc, sqlite3.OperationalError) and "readonly" in str(exc)


def _full(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_FULL: the disk (or a size limit) refused the write; nothing is wrong with the file."""
    return isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc)


def full_error(path: str, exc: sqlite3.DatabaseError) -> StoreFullError:
    return StoreFullError(f"feedback store {path}: the disk is full, nothing was written: {exc}")


def _locked(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_BUSY / SQLITE_LOCKED: another connection held the lock for the whole busy timeout."""
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


def busy_error(path: str, busy_timeout: float, exc: sqlite3.DatabaseError) -> StoreBusyError:
    """The :class:`StoreBusyError` for a lock another connection held past ``busy_timeout``."""
    return StoreBusyError(
        f"feedback store {path} stayed locked for its busy_timeout ({busy_timeout:g} s): "
        "another connection holds its write lock (another process, or another FeedbackStore on this "
        f"file inside exclusive() in this thread, which would wait on itself): {exc}"
    )


def connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """A new connection to ``path`` (autocommit: every transaction is begun explicitly)."""
    try:
        return sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    except sqlite3.OperationalError as exc:  # past _check_path: no permission, or a folder removed since
        folder = Path(path).parent
        if folder.is_dir() and not os.access(folder, os.W_OK):  # a new file in a read-only folder (or mount)
            raise ReadOnlyStoreError(f"{path} cannot be made: its folder {folder} cannot be written: {exc}") from exc
        raise ValidationError(f"cannot open path {path!r}: {exc}") from exc


def prepare(db: Database, path: str, *, memory: bool, synchronous: str, busy_timeout: float) -> tuple[str, list[str]]:
    """Set the connection up and bring the file's schema up to date; return the journal mode and the migrations run.

    Raises :class:`CorruptStateError` for another application's database, or a store whose tables or columns
    were dropped by hand; SQLite's own errors pass through, for :func:`opening_error` to name.
    """
    conn = db.conn
    # SQLite keeps milliseconds in a 32-bit int: beyond it (about 24.8 days, "wait as long as it takes") it
    # stored 0, no waiting at all
    conn.execute(f"PRAGMA busy_timeout = {min(int(busy_timeout * 1000), _MAX_BUSY_MS)}")
    theirs = sorted(set(db.table_names()) - {MIGRATIONS.table})
    ours = MIGRATIONS.table in db.table_names() and {"migration_set", "name"} <= {
        c.name for c in db[MIGRATIONS.table].columns
    }  # a table of that name with other columns is another tool's
    if theirs and not ours:
        # another application's database: writing rlfb's schema into it would change a file
        # that is not ours (and a look with `rlfb store stats` would do it too)
        raise CorruptStateError(
            f"{path} is not an rlfb feedback store: it holds other tables {theirs[:5]}; "
            "give rlfb a file of its own"
        )
    journal_mode = "memory" if memory else _enable_wal(conn, busy_timeout)
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = ON")
    # the write-ahead log is cut back to this size after a checkpoint: one large transaction (a prune)
    # left it at 140 MB for good
    conn.execute(f"PRAGMA journal_size_limit = {_WAL_SIZE_LIMIT}")
    newer = MIGRATIONS.unknown(db) if ours else []
    if newer:  # its schema may hold what this version would break (a constraint it does not know): refuse it whole
        raise CorruptStateError(
            f"{path} is a feedback store of a newer rlfb (schema steps {newer} are unknown to this version): "
            "open it with that version, or upgrade rlfb"
        )
    applied = MIGRATIONS.apply(db)
    missing = sorted(_TABLES.difference(db.table_names()))
    if missing:  # recorded as migrated, yet gone: dropped by hand
        raise CorruptStateError(f"{path} is a feedback store without its tables {missing}")
    # a column dropped by hand (its migration still recorded) failed later, at the first write or read
    # that named it, as a raw OperationalError: one PRAGMA table_info per table finds it now
    lacking = {
        table: sorted(cols.difference(c.name for c in db[table].columns))
        for table, cols in sorted(expected_columns().items()) if table in _TABLES
    }
    lacking = {table: cols for table, cols in lacking.items() if cols}
    if lacking:
        raise CorruptStateError(f"{path} is a feedback store whose tables lack the columns {lacking}")
    return journal_mode, applied


def _enable_wal(conn: sqlite3.Connection, busy_timeout: float) -> str:
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    deadline = time.monotonic() + busy_timeout
    while mode.lower() != "wal":
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            break
        except sqlite3.OperationalError as exc:  # another process is switching it: wait and retry
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    return str(mode).lower()


def opening_error(exc: sqlite3.DatabaseError, path: str, busy_timeout: float) -> Exception:
    """What opening a file raises for an error of SQLite's: busy, read-only, else damage."""
    if _locked(exc):  # another connection holds the file: not damage (a migration waits for the lock)
        return busy_error(path, busy_timeout, exc)
    if _read_only(exc) or _folder_read_only(exc, path):
        return ReadOnlyStoreError(
            f"{path} is read-only: rlfb writes to its feedback store (in WAL mode, also beside it): {exc}"
        )
    if _full(exc):  # a new store, or a migration, on a full disk: not damage
        return full_error(path, exc)
    return CorruptStateError(f"cannot open {path} as a feedback store: {exc}")


def _folder_read_only(exc: sqlite3.DatabaseError, path: str) -> bool:
    """SQLITE_CANTOPEN on a file that is there, in a folder that cannot be written: WAL's side files cannot be
    made beside it (a read-only mount, an immutable folder), which says nothing of damage to the file."""
    if not (isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc)):
        return False
    file = Path(path)
    return file.is_file() and os.access(file, os.R_OK) and not os.access(file.parent, os.W_OK)


def _file_identity(file: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of ``file``, or ``None`` where it cannot be looked at."""
    try:
        st = os.stat(file)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def integrity_check(tx: Transactions) -> str:
    """``PRAGMA integrity_check`` on the store's connection: ``"ok"``, or what SQLite found wrong."""
    with tx.lock:
        conn = tx.check_open()
        try:
            return "\n".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check"))
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:
                raise
            return str(exc)  # too damaged for the check itself to finish


class Transactions:
    """A store's one connection: whether it is open, and its transactions, each holding the store's lock.

    :meth:`read` is one snapshot; :meth:`write` one ``BEGIN IMMEDIATE`` transaction, or a savepoint inside
    an :meth:`exclusive` block, which holds the write lock for the whole block (nested blocks are savepoints
    of it) and runs its :meth:`on_rollback` callbacks if it is undone. ``finalizer`` closes the connection,
    once: at :meth:`close`, or when the store it is keyed to is collected unclosed.

    ``file`` is the file the connection opened (``None`` in memory); ``path`` names the store in errors (a
    store read from a copy names the original). Each outermost write transaction checks, just before its
    COMMIT, that ``file`` still names the file opened (:meth:`check_file`): one deleted or replaced under the
    open connection took every later write into the unlinked file, lost when the process exited.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        lock: threading.RLock,
        path: str,
        busy_timeout: float,
        finalizer: weakref.finalize,
        *,
        file: str | None = None,
    ) -> None:
        self.conn = conn
        self.lock = lock
        self.path = path
        self.busy_timeout = busy_timeout
        self._finalizer = finalizer
        self.closed = False
        # the file opened, as absolute path (SQLite resolved a relative one at open: a later chdir must not
        # move it) and (st_dev, st_ino); None: nothing to check (in memory, or a file that could not be looked at)
        self.file = None if file is None else os.path.abspath(file)
        self._identity = None if self.file is None else _file_identity(self.file)
        self.depth = 0  # of exclusive() blocks on this connection
        self._undo: list[list[Callable[[], None]]] = []  # per open exclusive() block: on_rollback callbacks

    def close(self) -> None:
        """Close the connection (idempotent); not inside :meth:`exclusive`, whose writes it would drop."""
        with self.lock:
            if self.depth:
                raise RlfbError("cannot close a FeedbackStore inside its exclusive() block: its writes would be lost")
            if not self.closed:
                self.closed = True
                self._finalizer()  # closes the connection, once

    def check_open(self) -> sqlite3.Connection:
        if self.closed:
            raise StoreClosedError()
        return self.conn

    def check_file(self) -> None:
        """Raise :class:`StoreFileGoneError` if the store's path no longer names the file the connection opened.

        One ``os.stat``. A file deleted (``rm fb.db*``) or replaced while open still takes SQLite's writes, into
        the unlinked inode, lost at exit with no error; a path that cannot be looked at now (its folder made
        unreadable) passes, since the file may well be there and SQLite's own errors name what is wrong.
        """
        if self.file is None or self._identity is None:
            return
        try:
            st = os.stat(self.file)
        except (FileNotFoundError, NotADirectoryError):
            what = "deleted"
        except OSError:
            return
        else:
            if (st.st_dev, st.st_ino) == self._identity:
                return
            what = "replaced by another file"
        raise StoreFileGoneError(
            f"feedback store {self.path} was {what} while this FeedbackStore had it open: nothing of this write "
            "was stored (it would have gone to the file opened, which the path no longer names, and been lost); "
            f"close this store and open {self.path} again, or restart the process"
        )

    @contextmanager
    def sql_errors(self) -> Iterator[None]:
        """Name SQLite's errors about the file: damage after opening, or a file that cannot be written."""
        try:
            yield
        except StoreBusyError:
            raise  # named already, by the store it is about (another store's, inside an exclusive() block of this one)
        except sqlite3.DataError as exc:  # a text or blob past SQLite's length limit (a billion bytes by default)
            raise ValidationError(
                f"a value is too large for feedback store {self.path} ({exc}): nothing of this write was stored"
            ) from exc
        except sqlite3.DatabaseError as exc:
            if _read_only(exc):
                raise ReadOnlyStoreError(f"feedback store {self.path} is read-only: {exc}") from exc
            if _full(exc):
                raise full_error(self.path, exc) from exc
            if type(exc) is sqlite3.DatabaseError:  # SQLITE_CORRUPT / SQLITE_NOTADB, not a constraint or lock
                raise CorruptStateError(f"feedback store {self.path} is damaged: {exc}") from exc
            if _locked(exc):
                raise busy_error(self.path, self.busy_timeout, exc) from exc
            raise

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        with self.lock, self.sql_errors():
            conn = self.check_open()
            if self.depth:
                # inside exclusive(): the write lock is held already; a savepoint undoes only this write
                conn.execute("SAVEPOINT rlfb_write")
                try:
                    yield conn
                except BaseException:
                    # on some errors (a full disk) SQLite rolls the whole transaction back itself: the savepoint
                    # is gone, and undoing it raised "no such savepoint", which hid the error (a full disk during
                    # feedback came out as that OperationalError, not a StoreFullError)
                    if conn.in_transaction:
                        conn.execute("ROLLBACK TO rlfb_write")
                        conn.execute("RELEASE rlfb_write")
                    raise
                conn.execute("RELEASE rlfb_write")
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                # once per outermost transaction (an exclusive() block's too; its writes are savepoints), at its
                # end: a file deleted while this one waited for the lock, or while it ran, is caught as well
                self.check_file()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query inside sees one snapshot."""
        with self.lock, self.sql_errors():
            conn = self.check_open()
            if conn.in_transaction:
                yield conn
                return
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The write lock held for the whole block: see :meth:`rlfb.store.FeedbackStore.exclusive`."""
        with self.lock:
            self._undo.append([])
            try:
                # the outermost block is one write transaction (BEGIN IMMEDIATE ... COMMIT or ROLLBACK); the
                # writes inside, and nested blocks, are savepoints of it: a nested block that raises undoes its
                # own writes even when the outer block catches the error (it used to join the transaction and
                # commit them)
                with self.write():
                    self.depth += 1
                    try:
                        yield
                    finally:
                        self.depth -= 1
            except BaseException as exc:
                self._run_undo(self._undo.pop(), exc)
                raise
            undo = self._undo.pop()
            if self._undo:  # committed into the enclosing block, whose rollback undoes these writes too
                self._undo[-1].extend(undo)

    def on_rollback(self, undo: Callable[[], None]) -> None:
        """Register ``undo`` with the innermost open :meth:`exclusive` block."""
        if not callable(undo):
            raise ValidationError(f"on_rollback takes a callable, got {type(undo).__name__}")
        with self.lock:
            if not self.depth:
                raise RlfbError("on_rollback is only meaningful inside an exclusive() block")
            self._undo[-1].append(undo)

    @staticmethod
    def _run_undo(undo: list[Callable[[], None]], exc: BaseException) -> None:
        for fn in reversed(undo):
            try:
                fn()
            except Exception as err:  # the block's own error is what the caller must see; keep this one beside it
                note = f"and an on_rollback callback failed: {err!r}"
                add_note = getattr(exc, "add_note", None)  # Python 3.11+; on 3.10 a warning says it instead
                if add_note is not None:
                    add_note(note)
                else:
                    # the app's with-block, past the context managers (stacklevel=2 named this module)
                    warn_at_app(note, RuntimeWarning, also_inside=("contextlib",))


def settled_store_text(tx: Transactions, given: bool | None, path: str) -> bool:
    """Whether the file keeps query text: as recorded in it, or ``given`` (``None``: ``True``) recorded now for a
    file that records none yet. ``given`` otherwise than recorded is a :class:`ValidationError`: query text
    written into a store that keeps none, or hashed keys the learner does not find, would follow."""
    query = "SELECT value FROM settings WHERE key = 'store_text'"
    with tx.read() as conn:  # recorded already (every file but a new one): no write lock to wait for
        row = conn.execute(query).fetchone()
    if row is None:
        with tx.write() as conn:  # another opener may record it first: theirs stands
            wanted = "true" if given in (None, True) else "false"
            conn.execute("INSERT OR IGNORE INTO settings (key, value) VALUES ('store_text', ?)", [wanted])
            row = conn.execute(query).fetchone()
    keeps = row[0] == "true"
    if given is not None and given != keeps:
        raise ValidationError(
            f"{path} keeps {'query text' if keeps else 'no query text (only its sha256)'}: open it with "
            f"store_text={keeps} or leave store_text out; a store's mode is set when it is made"
        )
    return keeps
