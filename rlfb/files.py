"""Output files written whole or not at all.

A file is written beside its target under a name of its own and renamed over it once complete
(``os.replace``, atomic on one file system), so a failure part way (a full disk, an error while the
rows are produced) leaves the earlier file as it was, never half of a new one. Used by ``rlfb store
export``, ``rlfb weights export``, the JSON of ``simulate``, ``evaluate`` and ``demo``.

>>> import tempfile, pathlib
>>> folder = tempfile.TemporaryDirectory()
>>> out = pathlib.Path(folder.name) / "w.json"
>>> write_text_atomically(out, '{"bm25": 1.0}')
>>> out.read_text()
'{"bm25": 1.0}'
>>> folder.cleanup()
"""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from rlfb.errors import ValidationError

__all__ = ["write_atomically", "write_text_atomically", "same_file", "refuse_overwriting_store", "folder_path",
           "path_text", "file_sha256"]

T = TypeVar("T")


def path_text(path: Any, what: str = "path", *, also: str = "") -> str:
    """``path`` (a ``str`` or ``os.PathLike``) as text, or a :class:`ValidationError`: where pathlib, sqlite3 or
    the file system would raise a bare ``TypeError`` (``None``), ``ValueError`` (a NUL character) or
    ``UnicodeEncodeError`` (a lone surrogate the file system cannot name). ``also`` names other forms the caller
    takes, for the error.

    >>> path_text(None)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: path must be a str or os.PathLike, got NoneType None
    """
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
        if isinstance(path, bytes):  # a PathLike may give bytes
            path = os.fsdecode(path)
    if not isinstance(path, str):
        raise ValidationError(
            f"{what} must be a str or os.PathLike{also}, got {type(path).__name__} {path!r:.80}"
        )
    if "\x00" in path:
        raise ValidationError(f"{what} {path!r} contains a NUL character")
    try:
        os.fsencode(path)
    except UnicodeEncodeError as exc:
        raise ValidationError(f"{what} {path!r} cannot name a file on this file system: {exc.reason}") from None
    return path


def folder_path(path: Any, what: str = "path") -> Path:
    """``path`` checked by :func:`path_text`, as a :class:`~pathlib.Path` (a save's or a load's folder)."""
    return Path(path_text(path, what))


def file_sha256(file: Path) -> bytes:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks (a model's weights or a saved index need not fit in
    memory twice)."""
    digest = hashlib.sha256()
    with open(file, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.digest()


def write_atomically(path: str | Path, write: Callable[[BinaryIO], T]) -> T:
    """Call ``write`` on a new file beside ``path``, then rename it over ``path``; return what it returned.

    The new file is created with mode 0o666, narrowed by the umask, as ``open()`` would make it (mkstemp's
    0o600 left every output readable by its owner alone, and reading the umask means setting it, process-wide);
    over an existing file it takes that file's mode. Its name is unique, so two writers to one target never
    share it, and short, so that any name the file system takes can be written. On any error it is removed and
    ``path`` is left as it was; an ``OSError`` of the write names ``path``.

    A symbolic link is written through: the file it names is replaced, not the link. Something that is not a
    regular file (a named pipe, ``/dev/stdout``, a terminal, ``/dev/null``) is written to directly, as
    ``open()`` would: renamed over, it was replaced by a file, and a pipe's reader got nothing.
    """
    target = Path(path)
    if target.is_dir():  # renamed over, a bare IsADirectoryError (the CLI named it; the library did not)
        raise ValidationError(f"{target} is a directory, not a file to write")
    try:
        mode: int | None = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    try:
        if mode is not None and not stat.S_ISREG(mode):
            with open(target, "wb") as fh:
                return write(fh)
        real = Path(os.path.realpath(target)) if target.is_symlink() else target
        return _write_beside(real, write)
    except OSError as exc:
        if exc.filename is None and exc.strerror:  # a full disk, a size limit: say which file
            raise OSError(exc.errno, exc.strerror, str(target)) from exc
        raise


def _write_beside(target: Path, write: Callable[[BinaryIO], T]) -> T:
    tmp = target.parent / f".rlfb-{uuid.uuid4().hex[:16]}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:  # a missing or read-only folder: named by the file asked for, not the temporary one
        raise OSError(exc.errno, exc.strerror, str(target)) from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            out = write(fh)
        try:  # over an existing file: keep its mode, as open() writing over it would
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        except FileNotFoundError:
            pass
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (:func:`write_atomically`)."""
    write_atomically(path, lambda fh: fh.write(text.encode("utf-8")))


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether paths ``a`` and ``b`` name one file: the same inode when both exist, else the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet: compare where it would be
        return Path(a).resolve() == Path(b).resolve()


def refuse_overwriting_store(out: str | Path, store: str | Path) -> None:
    """Raise :class:`ValidationError` when output ``out`` is the SQLite ``store`` or one of its side files.

    Writing an export over the store it reads from destroys the store ("file is not a database"
    afterwards), so this runs before anything is opened or written.
    """
    if same_file(out, store):
        raise ValidationError(f"the output {out} is the store {store} being read: refusing to overwrite it")
    # SQLite's own files beside it: beside the path as given, and beside the file a symbolic link names, where
    # SQLite puts them (the WAL of a store opened through a link lies beside its target)
    for side in (f"{base}{tail}" for base in dict.fromkeys((os.fspath(store), os.path.realpath(store)))
                 for tail in ("-wal", "-shm", "-journal")):
        if same_file(out, side):
            raise ValidationError(f"the output {out} is {side}, part of the store {store}: refusing to overwrite it")


def refuse_overwriting_dataset(out: str | Path, folder: str | Path, option: str) -> None:
    """Raise :class:`ValidationError` when output ``out`` (given as ``option``) is a file of the BEIR collection in
    ``folder`` (``corpus.jsonl``, ``queries.jsonl``, the qrels files, and their gzipped forms): ``--json
    DS/qrels/test.tsv`` ran, and the collection no longer loaded afterwards."""
    root = Path(folder)
    if not root.is_dir():
        return
    files = [root / f"{name}{gz}" for name in ("corpus.jsonl", "queries.jsonl") for gz in ("", ".gz")]
    qrels = [file for suffix in ("*.tsv", "*.tsv.gz") for file in sorted(root.glob(f"qrels/{suffix}"))]
    for read in (*files, *qrels):
        if read.exists() and same_file(out, read):
            raise ValidationError(f"{option} {out} is {read}, a file of the collection being read: "
                                  "refusing to overwrite it")
