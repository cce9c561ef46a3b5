"""Saved folders (an ensemble's, a retriever's) written whole and read whole.

:func:`saving_into` writes a save into a new folder beside its path and swaps it in with two renames (the old
folder aside, the new one in), so a failed save leaves the previous one as it was. :func:`reads_whole` makes a
load read one save from start to end: a save swapped in while it reads (another process saving to the same
path) makes it read again, and a save killed between its two renames is found and put back.

The folders beside the path are named ``.NAME.saving-TAG`` (a save being written) and ``.NAME.old-TAG`` (the
save it replaces, for the moment between the renames), the tag being ``HOST~PID~RANDOM``: a folder whose
process is gone on this machine is left over from a killed save.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from rlfb.errors import CorruptStateError, RlfbError, ValidationError

__all__ = ["saving_into", "reads_whole", "read_whole"]

T = TypeVar("T")

#: how many times a load reads a folder that another process's saves keep replacing before it gives up
READ_ATTEMPTS = 12
_FIRST_WAIT = 0.005  # seconds; doubled on each attempt, at most _MAX_WAIT
_MAX_WAIT = 0.25

# HOST~PID~RANDOM since 2026-12-05; PID-RANDOM before (no host: taken as this machine's)
_TAG = re.compile(r"^\.(?P<name>.+)\.(?P<kind>saving|old)-(?:(?P<host>.*)~)?(?P<pid>\d+)[-~](?P<rand>[0-9a-f]{12})$")


@contextmanager
def saving_into(root: Path, *, marker: str, what: str, names: frozenset[str]) -> Iterator[Path]:
    """A new folder beside ``root`` to write a save into, swapped in for ``root`` once the block completes.

    A save that fails part way (metadata JSON cannot hold, a full disk) so leaves the previous
    save in ``root`` as it was. ``root`` must be new, empty, or an earlier save (it holds
    ``marker``, and nothing but the ``names`` a save of this kind writes): it is replaced whole, so a
    folder holding anything else (a feedback store kept beside the model) is refused by name rather than
    lost. Folders left beside ``root`` by saves killed part way (their process gone) are removed after the swap.
    """
    if root.exists() and (not root.is_dir() or (any(root.iterdir()) and not (root / marker).exists())):
        raise ValidationError(f"{root} is not empty and holds no saved {what}: choose a new folder")
    others = sorted(p.name for p in root.iterdir() if p.name not in names) if root.is_dir() else []
    if others:
        raise ValidationError(
            f"{root} holds {others[:5]}, which are not part of a saved {what}: a save replaces the folder whole, "
            "so it would delete them; move them out, or save to another folder"
        )
    # names of this call's own: two saves at once (threads or processes) never share a folder
    tag = f"{_host()}~{os.getpid()}~{uuid.uuid4().hex[:12]}"
    tmp = root.with_name(f".{root.name}.saving-{tag}")
    old = root.with_name(f".{root.name}.old-{tag}")
    try:
        tmp.mkdir(parents=True)
        yield tmp
        wrote = sorted(p.name for p in tmp.iterdir() if p.name not in names)
        if wrote:  # the next save would refuse the folder: a name missing from its kind's list
            raise RlfbError(f"a {what} save wrote {wrote}, which its list of saved names lacks")
        if root.exists():
            root.rename(old)
        try:
            tmp.rename(root)
        except OSError as exc:  # another save swapped its folder in between our two renames
            if not root.exists() and old.exists():
                old.rename(root)
            raise RlfbError(f"another save to {root} ran at the same time; this one was not kept: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    for stale in _left_behind(root):  # root is a whole save now: what killed saves left is older
        shutil.rmtree(stale, ignore_errors=True)


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
            return read_whole(Path(path), lambda: load(cls, path, *args, **kwargs), marker=marker)

        return wrapper

    return decorate


def _identity(root: Path, marker: str) -> tuple[int, ...] | None:
    """What tells one save in ``root`` from the next (each is a new folder of new files); ``None`` when none is."""
    try:
        folder, file = os.stat(root), os.stat(root / marker)
    except OSError:
        return None
    return (folder.st_dev, folder.st_ino, file.st_ino, file.st_mtime_ns, file.st_size)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _beside(root: Path, kind: str) -> list[Path]:
    """The ``.NAME.{kind}-*`` folders beside ``root``, oldest first."""
    found = []
    try:
        siblings = list(root.parent.iterdir())
    except OSError:
        return []
    for path in siblings:
        m = _TAG.match(path.name)
        if m and m["name"] == root.name and m["kind"] == kind:
            try:
                found.append((path.stat().st_mtime_ns, path))
            except OSError:  # removed meanwhile
                continue
    return [p for _, p in sorted(found)]


def _gone(path: Path) -> bool:
    """Whether the process that named ``path`` has ended (known only for this machine's on POSIX)."""
    m = _TAG.match(path.name)
    if m is None or (m["host"] is not None and m["host"] != _host()) or os.name != "posix":
        return False  # on Windows os.kill(pid, 0) would end the process
    pid = int(m["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's: alive
        return False
    return False


def _left_behind(root: Path) -> list[Path]:
    return [p for kind in ("saving", "old") for p in _beside(root, kind) if _gone(p)]


def _being_swapped(root: Path, marker: str) -> bool:
    """Whether a live save's previous folder is beside a missing ``root`` (between its two renames)."""
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
    warnings.warn(
        f"rlfb: {root} was missing, a save there having been stopped between its two renames; "
        f"the save before it was put back from {behind[-1].name}",
        RuntimeWarning,
        stacklevel=3,
    )
    return True
