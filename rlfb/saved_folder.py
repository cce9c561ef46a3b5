"""Saved folders (an ensemble's, a retriever's) written whole and read whole.

:func:`saving_into` writes a save into a new folder beside its path and swaps it in with two renames (the old
folder aside, the new one in), so a failed save leaves the previous one as it was. :func:`reads_whole` makes a
load read one save from start to end: a save swapped in while it reads (another process saving to the same
path) makes it read again, and a save killed between its two renames is found and put back.

The folders beside the path are named ``.NAME.saving-TAG`` (a save being written) and ``.NAME.old-TAG`` (the
save it replaces, for the moment between the renames). On POSIX a save holds an exclusive ``flock`` on the file
``.NAME.lock-TAG`` from start to end: a folder whose lock can be taken is left over from a killed save (the
kernel lets a lock go with its process, in any PID namespace), and one without such a file (a save of rlfb before
2026-12-05, or on Windows) is never touched.

Each save ends with ``checksums.json``: the SHA-256 of every file it wrote (a save nested in it, a retriever's in
an ensemble's, by its own ``checksums.json``), so a load finds a file damaged in a way its checks of the content
cannot see (a byte flipped inside a saved array) and names it. Saves written before the checksums (2026-12-05)
have none and load unchecked, as before.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from rlfb._caller import warn_at_app
from rlfb.errors import CorruptStateError, ReadOnlyFolderError, RlfbError, ValidationError
from rlfb.files import file_sha256, folder_path

__all__ = ["saving_into", "reads_whole", "read_whole", "check_checksums", "CHECKSUMS"]

T = TypeVar("T")

#: how many times a load reads a folder that another process's saves keep replacing before it gives up
READ_ATTEMPTS = 12
_FIRST_WAIT = 0.005  # seconds; doubled on each attempt, at most _MAX_WAIT
_MAX_WAIT = 0.25

# HOST~PID~RANDOM since 2026-12-05 (PID-RANDOM before, with no lock file: never touched)
_TAG = re.compile(r"^\.(?P<name>.+)\.(?P<kind>saving|old|lock)-(?P<tag>(?:.*~)?\d+[-~][0-9a-f]{12})$")
#: the file a save writes last: the SHA-256 of every other file it wrote
CHECKSUMS = "checksums.json"
#: what a file browser leaves in a folder it showed (macOS, Windows): a save replaces them with the folder
_OS_NOTES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})


@contextmanager
def saving_into(root: Path, *, marker: str, what: str, names: frozenset[str]) -> Iterator[Path]:
    """A new folder beside ``root`` to write a save into, swapped in for ``root`` once the block completes.

    A save that fails part way (metadata JSON cannot hold, a full disk) so leaves the previous
    save in ``root`` as it was. ``root`` must be new, empty, or an earlier save (it holds
    ``marker``, and nothing but the ``names`` a save of this kind writes, or a file browser's notes): it is
    replaced whole, so a folder holding anything else (a feedback store kept beside the model) is refused by
    name rather than lost. Folders left beside ``root`` by saves killed part way are removed after the swap.
    """
    present = _listing(root)
    if present is not None:
        if present - _OS_NOTES and marker not in present:  # a new folder a file browser has shown is still new
            raise ValidationError(f"{root} is not empty and holds no saved {what}: choose a new folder")
        others = sorted(present - names - _OS_NOTES - {CHECKSUMS})
        if others:
            raise ValidationError(
                f"{root} holds {others[:5]}, which are not part of a saved {what}: a save replaces the folder "
                "whole, so it would delete them; move them out, or save to another folder"
            )
    # names of this call's own: two saves at once (threads or processes) never share a folder
    tag = f"{_host()}~{os.getpid()}~{uuid.uuid4().hex[:12]}"
    tmp = root.with_name(f".{root.name}.saving-{tag}")
    old = root.with_name(f".{root.name}.old-{tag}")
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        lock = _hold(root.with_name(f".{root.name}.lock-{tag}"))  # this save is alive while it is held
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            # the folder that could not take a new entry (the lock file's, or one mkdir could not make there),
            # not the lock file's internal name
            folder = Path(exc.filename).parent if exc.filename else root.parent
            error = ReadOnlyFolderError(f"cannot save to {root}: {folder} cannot be written ({exc.strerror})")
            error.errno = exc.errno
            raise error from exc
        raise
    try:
        tmp.mkdir()
        yield tmp
        wrote = sorted(p.name for p in tmp.iterdir() if p.name not in names)
        if wrote:  # the next save would refuse the folder: a name missing from its kind's list
            raise RlfbError(f"a {what} save wrote {wrote}, which its list of saved names lacks")
        _write_checksums(tmp)
        try:
            if root.exists():
                root.rename(old)
            tmp.rename(root)
        except OSError as exc:  # another save swapped its folder in between our two renames
            if not root.exists() and old.exists():
                old.rename(root)
            raise RlfbError(f"another save to {root} ran at the same time; this one was not kept: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        _release(lock)
    for stale in _left_behind(root):  # root is a whole save now: what killed saves left is older
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with suppress(OSError):
                stale.unlink()


def read_whole(root: Path, read: Callable[[], T], *, marker: str) -> T:
    """``read()`` of the save in ``root`` (a folder :func:`saving_into` wrote, holding ``marker``), read again if
    another save is swapped in while it reads.

    A read that fails with :class:`CorruptStateError` while the folder stayed the same save is damage, and
    raised as it is. A folder missing because a save is between its two renames is waited for; one missing
    because a save was killed there is put back from the ``.NAME.old-*`` folder it left (with a warning).
    """
    error: CorruptStateError | None = None
    for attempt in range(READ_ATTEMPTS):
        before = _identity(root, marker)
        if before is None and _put_back(root, marker):
            continue
        try:
            out = read()
            # after the read, whose own checks name what they find more precisely; this finds what they cannot
            check_checksums(root)
        except CorruptStateError as exc:
            after = _identity(root, marker)
            if after == before and (before is not None or not _being_swapped(root, marker)):
                raise
            error = exc
        else:
            if _identity(root, marker) == before:
                return out
            error = None
        time.sleep(min(_MAX_WAIT, _FIRST_WAIT * 2**attempt))
    missing = _identity(root, marker) is None
    behind = [p for p in _beside(root, "old") if (p / marker).exists()]
    if missing and behind:
        raise CorruptStateError(
            f"{root} is missing: a save there was stopped between its two renames, and the save before it "
            f"is {behind[-1]}: rename it back to {root.name}"
        ) from error
    raise CorruptStateError(
        f"{root} was replaced by another save {READ_ATTEMPTS} times while it was read: load it when no "
        "process is saving to it"
    ) from error


def reads_whole(marker: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a ``load(cls, path, ...)`` so that it is :func:`read_whole` of ``path`` (``marker`` its file)."""

    def decorate(load: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(load)
        def wrapper(cls: Any, path: str | Path, *args: Any, **kwargs: Any) -> T:
            path = folder_path(path)  # None, a NUL or a lone surrogate: a named error, not pathlib's bare one
            return read_whole(path, lambda: load(cls, path, *args, **kwargs), marker=marker)

        return wrapper

    return decorate


def check_checksums(root: Path) -> None:
    """Check each file the save in ``root`` lists in its ``checksums.json`` against its SHA-256.

    A file missing, or changed since the save, is a :class:`CorruptStateError` naming it; a save without
    ``checksums.json`` (written before the checksums, 2026-12-05) is not checked.
    """
    file = root / CHECKSUMS
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CorruptStateError(f"cannot read {file}: {exc}") from exc
    try:
        listed = json.loads(raw)["sha256"]
        if not isinstance(listed, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) for k, v in listed.items()
        ):
            raise ValueError("'sha256' must map file names to SHA-256 digests")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CorruptStateError(f"{file} is damaged: {type(exc).__name__}: {exc}"[:500]) from exc
    for name, digest in sorted(listed.items()):
        # names as a save writes them: "/"-separated parts, none empty, "." or "..", none holding a drive or a
        # backslash (on Windows "C:x" or "\\x" is not absolute, and would still reach outside the save)
        parts = name.split("/")
        if any(p in ("", ".", "..") or "\\" in p or ":" in p for p in parts):
            raise CorruptStateError(f"{file} lists {name!r}, which is not a file inside the save")
        try:
            found = file_sha256(root / name).hex()
        except FileNotFoundError:
            raise CorruptStateError(f"{root / name} is missing from the save ({CHECKSUMS} lists it)") from None
        except OSError as exc:
            raise CorruptStateError(f"cannot read {root / name}: {exc}") from exc
        if found != digest:
            lists = ", ".join(str(f) for f in _lists_covering(root))
            raise CorruptStateError(
                f"{root / name} has changed since it was saved (its SHA-256 is not the one {CHECKSUMS} lists): "
                "the save is damaged; save again from a live ensemble, or restore a copy. A file edited on "
                f"purpose: remove {lists} to load the folder unchecked"
            )


def _lists_covering(root: Path) -> list[Path]:
    """``root``'s ``checksums.json`` and those of the saves it is nested in (a retriever's folder inside an
    ensemble's lists its own list's digest): each must go for an edited file to load."""
    found = [root / CHECKSUMS]
    for folder in list(root.parents)[:2]:  # an ensemble's retriever sits at ENSEMBLE/retrievers/NAME
        if (folder / CHECKSUMS).is_file():
            found.append(folder / CHECKSUMS)
    return found


def _write_checksums(folder: Path) -> None:
    """Write ``folder``'s ``checksums.json`` (last: a save's other files are all written)."""
    listed = {path.relative_to(folder).as_posix(): file_sha256(path).hex() for path in _covered(folder, top=folder)}
    (folder / CHECKSUMS).write_text(json.dumps({"sha256": listed}, indent=1, sort_keys=True), encoding="utf-8")


def _covered(folder: Path, *, top: Path) -> Iterator[Path]:
    """The files under ``folder`` that ``top``'s checksums list: a folder that is a save of its own (it has
    ``checksums.json``) by that file alone, whose own list covers the rest."""
    for path in sorted(folder.iterdir()):
        if path.is_dir():
            if (path / CHECKSUMS).is_file():
                yield path / CHECKSUMS
            else:
                yield from _covered(path, top=top)
        elif not (folder == top and path.name == CHECKSUMS):
            yield path


def _identity(root: Path, marker: str) -> tuple[int, ...] | None:
    """What tells one save in ``root`` from the next (each is a new folder of new files); ``None`` when none is."""
    try:
        folder, file = os.stat(root), os.stat(root / marker)
    except OSError:
        return None
    return (folder.st_dev, folder.st_ino, file.st_ino, file.st_mtime_ns, file.st_size)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _listing(root: Path) -> set[str] | None:
    """The names in the folder ``root``; ``None`` where there is none (read once: another save may swap it)."""
    try:
        return {p.name for p in root.iterdir()}
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise ValidationError(f"{root} is a file, not a folder a save can replace") from None


def _hold(path: Path) -> tuple[int, Path] | None:
    """Create ``path`` and hold an exclusive lock on it (POSIX; ``None`` elsewhere, where nothing is locked)."""
    try:
        import fcntl
    except ImportError:  # Windows: no leftovers are ever taken for a killed save's
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a name of our own: taken at once
    except OSError:  # a file system without locks (some network mounts): save unlocked, as on Windows
        os.close(fd)
        with suppress(OSError):
            path.unlink()
        return None
    return fd, path


def _release(lock: tuple[int, Path] | None) -> None:
    """Remove the lock file, then let the lock go (never a moment when the file is there and not held)."""
    if lock is None:
        return
    fd, path = lock
    with suppress(OSError):
        path.unlink()
    os.close(fd)


def _beside(root: Path, *kinds: str) -> list[Path]:
    """The ``.NAME.{kind}-*`` entries beside ``root`` of each of ``kinds`` in turn, oldest first within a kind
    (the folder is listed once)."""
    found = []
    try:
        siblings = list(root.parent.iterdir())
    except OSError:
        return []
    for path in siblings:
        m = _TAG.match(path.name)
        if m and m["name"] == root.name and m["kind"] in kinds:
            try:
                found.append((kinds.index(m["kind"]), path.stat().st_mtime_ns, path))
            except OSError:  # removed meanwhile
                continue
    return [p for _, _, p in sorted(found)]


def _gone(path: Path) -> bool:
    """Whether the save that named ``path`` (a ``.NAME.saving-``, ``.old-`` or ``.lock-`` entry) has ended: its lock
    file is there and its lock can be taken. Without a lock file (an older rlfb's save, Windows) it is not known."""
    m = _TAG.match(path.name)
    if m is None:
        return False
    try:
        import fcntl
    except ImportError:
        return False
    lock = path.with_name(f".{m['name']}.lock-{m['tag']}")
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: that save is running
        return False
    finally:
        os.close(fd)
    return True


def _left_behind(root: Path) -> list[Path]:
    """Folders and lock files of killed saves beside ``root`` (the lock files last)."""
    return [p for p in _beside(root, "saving", "old", "lock") if _gone(p)]


def _being_swapped(root: Path, marker: str) -> bool:
    """Whether a save's previous folder, its saver not known to be gone, is beside a missing ``root``."""
    return any((p / marker).exists() and not _gone(p) for p in _beside(root, "old"))


def _put_back(root: Path, marker: str) -> bool:
    """Put the newest save a killed save moved aside back at a missing ``root``; whether one was."""
    behind = [p for p in _beside(root, "old") if (p / marker).exists() and _gone(p)]
    if not behind:
        return False
    try:
        behind[-1].rename(root)
    except OSError:  # another load put it back first, or a save wrote root meanwhile
        return root.exists()
    warn_at_app(
        f"rlfb: {root} was missing, a save there having been stopped between its two renames; "
        f"the save before it was put back from {behind[-1].name}",
        RuntimeWarning,  # the app's load (stacklevel=3 named ensemble_folder.py)
    )
    return True
