"""What a :class:`~llamaindex_rlfb.events.FeedbackEventHandler` keeps while a store is locked: the writes its steps
make (a retrieval's or a response's log, the runs it links, the chunks a later step cut) that the store refused
with :class:`~rlfb.errors.StoreBusyError` once its ``busy_timeout`` ran out.

Until 2026-12-07 such a write was dropped with a logged warning (the dispatcher swallows a handler's errors, and
the user's query must not fail for a log): the query was never logged, and feedback on it said to attach the
handler before querying. Now each is kept, in order, and written before the handler's next write, before
feedback it takes, or when the process exits, whichever comes first; as the LangChain handler keeps its logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from rlfb._at_exit import run_at_exit, write_kept_of_this_process
from rlfb.errors import DuplicateEventError, StoreBusyError, StoreClosedError
from rlfb.runs import log_external, open_blocks, store_now

__all__ = ["KEPT", "KEPT_WRITES", "KEEPING", "Keeper", "drop_kept", "kept_log", "written", "write_kept",
           "write_kept_at_exit"]


class Keeper(Protocol):
    """What of a :class:`~llamaindex_rlfb.events.FeedbackEventHandler` (or one of its mixins) the kept writes use."""

    _store: Any
    _lock: threading.Lock
    _kept_lock: threading.Lock
    _unwritten: deque[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]


_log = logging.getLogger("llamaindex_rlfb.events")

#: Writes kept per handler at most; beyond it the oldest is dropped, with a logged warning (a store locked for
#: good would otherwise hold the process's memory).
KEPT_WRITES = 10_000

# Handlers holding writes their store refused, with the process that kept them: written when it exits. Filled on
# first use, not at import.
KEEPING: dict[int, tuple[int, Keeper]] = {}


class _Kept:
    """What a kept write returns in place of the store's answer: true, as a link or a log that was made."""

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<kept for a later write>"


KEPT = _Kept()


def written(handler: Keeper, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``write(*args, **kwargs)`` (a store's write), after the writes the handler kept; kept in turn where the store
    is locked (or where earlier writes are still kept, so that they stay in order), returning ``KEPT``.

    A log (``log_external`` with no ``timestamp``) is kept with the time it was first tried: the store's refusal
    comes ``busy_timeout`` later, and feedback's delay and recency discount count from the retrieval."""
    at = store_now(args[0]) if write is log_external and kwargs.get("timestamp") is None and args else None
    if handler._unwritten:
        try:
            write_kept(handler)
        except StoreBusyError:
            _keep(handler, write, args, kwargs, at)
            return KEPT
    try:
        return write(*args, **kwargs)
    except StoreBusyError:
        _keep(handler, write, args, kwargs, at)
        _log.warning("rlfb: the feedback store is locked; the handler keeps this write for its next one, its next "
                     "feedback or the process's exit", exc_info=True)
        return KEPT


def kept_log(handler: Keeper, store: Any, event_id: str) -> list[str] | None:
    """The chunk ids of a log of ``event_id`` in ``store`` that the handler keeps, in rank order; ``None`` where it
    keeps none. The steps read a log back (is this list one logged already?): a kept one is logged."""
    with handler._lock:
        for write, args, kwargs in reversed(handler._unwritten):
            if write is log_external and kwargs.get("event_id") == event_id and len(args) >= 3 and args[0] is store:
                return list(dict.fromkeys(str(cid) for cid, _ in args[2]))  # a chunk listed twice keeps its first
    return None


def _keep(handler: Keeper, write: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
          at: float | None) -> None:
    if at is not None:
        kwargs = {**kwargs, "timestamp": at}
    with handler._lock:
        handler._unwritten.append((write, args, kwargs))
        while len(handler._unwritten) > KEPT_WRITES:
            handler._unwritten.popleft()
            _log.warning("rlfb: more than %d writes kept while the feedback store was locked; the oldest is "
                         "dropped", KEPT_WRITES)
    if not KEEPING:
        _forget_in_forked_children()
    KEEPING[id(handler)] = (os.getpid(), handler)
    run_at_exit(write_kept_at_exit)


def drop_kept(handler: Keeper) -> int:
    """Forget what the handler kept (its store is closing); how many writes that was."""
    with handler._lock:
        n = len(handler._unwritten)
        handler._unwritten.clear()
    KEEPING.pop(id(handler), None)
    return n


def write_kept(handler: Keeper) -> None:
    """Write what the handler kept, oldest first; a locked store raises :class:`~rlfb.errors.StoreBusyError` and
    keeps the rest. One thread writes them at a time (another waits, then finds them written), holding the
    store's lock first, as every holder of both does: a thread inside the store's ``exclusive()`` whose write
    waited for this one, which waited for the store, hung both."""
    if not handler._unwritten:
        return
    with getattr(handler._store, "lock", contextlib.nullcontext()), handler._kept_lock:
        while True:
            with handler._lock:
                if not handler._unwritten:
                    KEEPING.pop(id(handler), None)
                    return
                entry = handler._unwritten[0]
            write, args, kwargs = entry
            try:
                with contextlib.suppress(DuplicateEventError):  # logged by another handler on the file meanwhile
                    write(*args, **kwargs)
                if open_blocks(handler._store) > 0:
                    # written inside the app's exclusive() block of this thread: its rollback undoes the write, so
                    # the entry is kept again then (callbacks run newest first: each goes back to the front)
                    handler._store.on_rollback(lambda e=entry: _put_back(handler, e))
            except StoreBusyError:
                raise
            except StoreClosedError:  # none of them can be written any more
                _log.warning("rlfb: %d write(s) kept while the feedback store was locked are lost: it was closed",
                             drop_kept(handler))
                return
            except Exception:  # the step that made it would have logged this, not raised it
                _log.warning("rlfb could not write a log kept while the feedback store was locked", exc_info=True)
            with handler._lock:
                if handler._unwritten and handler._unwritten[0] is entry:  # not dropped past the bound meanwhile
                    handler._unwritten.popleft()


def _put_back(handler: Keeper, entry: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]) -> None:
    with handler._lock:
        handler._unwritten.appendleft(entry)
    KEEPING[id(handler)] = (os.getpid(), handler)
    run_at_exit(write_kept_at_exit)


def write_kept_at_exit() -> None:
    """At exit: write what each handler of this process kept, warning where that fails (the store still locked,
    or closed already)."""
    write_kept_of_this_process(KEEPING, write_kept, lambda h: f"{len(h._unwritten)} log(s)")


_FORK_HOOK: list[bool] = []


def _forget_in_forked_children() -> None:
    """A forked child starts with none of its parent's kept writes (the parent writes them) and a fresh lock for
    them (one held at the fork by a parent's thread would never be let go in the child)."""
    if _FORK_HOOK or not hasattr(os, "register_at_fork"):
        return
    _FORK_HOOK.append(True)

    def after_in_child() -> None:
        for _, handler in list(KEEPING.values()):
            handler._unwritten.clear()
            handler._kept_lock = threading.Lock()
        KEEPING.clear()

    os.register_at_fork(after_in_child=after_in_child)
