"""What a :class:`~langchain_rlfb.callbacks.FeedbackCallbackHandler` keeps while its store is locked: the marks of
runs that failed (``store.fail_run``) and the logs of retrievals the store could not take. They are written before
the handler next logs a retrieval or takes feedback, or when the process exits, whichever comes first.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from langchain_rlfb._runs import trim
from rlfb._at_exit import run_at_exit, write_kept_of_this_process
from rlfb._caller import warn_at_app
from rlfb.errors import (
    CorruptStateError,
    DuplicateEventError,
    RlfbError,
    StoreBusyError,
    StoreClosedError,
    UnknownChunkError,
    UnknownEventError,
    ValidationError,
)
from rlfb.runs import log_external, open_blocks, same_store

if TYPE_CHECKING:
    from langchain_rlfb.callbacks import FeedbackCallbackHandler

__all__ = ["KEEPING", "keep", "keep_until_written", "write_kept_at_exit", "mark_failed", "write_unmarked"]

# Handlers holding failed marks or retrieval logs kept while their store was locked, with the process that kept
# them: written when it exits, and held until then (a handler made per request, collected on its return, took
# them with it; so did a script that ended before its next write). Filled on first use, not at import.
KEEPING: dict[int, tuple[int, FeedbackCallbackHandler]] = {}


def keep_until_written(handler: FeedbackCallbackHandler) -> None:
    """``handler`` keeps marks or logs for a later write: write them at exit if nothing has by then."""
    KEEPING[id(handler)] = (os.getpid(), handler)
    run_at_exit(write_kept_at_exit)


def keep(handler: FeedbackCallbackHandler, kept: OrderedDict[str, Any], key: str, value: Any) -> None:
    """Keep ``key: value`` in the handler's table ``kept`` (bounded, as every table of the handler) for the next
    write, and have it written at exit if nothing has by then. Each is numbered as it is kept (a mark's value is
    its number, a retrieval's entry holds it as ``"seq"``): the two tables are written in the order they were
    kept in, as a free store would have taken them."""
    with handler._lock:
        seq = next(handler._kept_order)
        kept[key] = seq if value is None else {**value, "seq": seq}
        trim(kept)
    keep_until_written(handler)


def write_kept_at_exit() -> None:
    """At exit: write what each handler of this process kept while its store was locked, warning where that fails
    (the store still locked, or closed already)."""
    write_kept_of_this_process(
        KEEPING, write_unmarked,
        lambda h: f"{len(h._unlogged)} retrieval log(s) and {len(h._unmarked)} failed run mark(s)")


def mark_failed(handler: FeedbackCallbackHandler, rid: str, *, wait: bool = True) -> None:
    """``store.fail_run(rid)``, kept in memory for the next write where the store is locked (``wait=False``:
    known to be locked, so it is not tried now)."""
    if wait:
        try:
            handler.store.fail_run(rid)
            return
        except StoreBusyError:
            pass
    keep(handler, handler._unmarked, rid, None)


def write_unmarked(handler: FeedbackCallbackHandler) -> None:
    """Write the failed marks and the retrievals' logs kept while the store was locked (the handler's ``_unmarked``
    and ``_unlogged``); a busy store raises as the write that follows would, and keeps the rest. One thread
    writes them at a time, holding the store's lock (taken first, as by every holder of both). A closed store
    can take none of them: they are dropped, with one warning."""
    store = handler.store
    if not handler._unlogged and not handler._unmarked:
        return
    with getattr(store, "lock", contextlib.nullcontext()):
        try:
            # in the order they were kept, marks and logs alike: a kept follow-up check judges the session's runs as
            # they were when its retrieval ended (one that failed before it as failed, one that failed after it not)
            while _write_first(handler, partial(_log_kept, handler), lambda rid, _: store.fail_run(rid)):
                pass
        except StoreClosedError:
            with handler._lock:
                n, m = len(handler._unlogged), len(handler._unmarked)
                handler._unlogged.clear()
                handler._unmarked.clear()
            warn_at_app(f"rlfb: {n} retrieval log(s) and {m} failed run mark(s) kept while the feedback store was "
                        "locked are lost: the store was closed", RuntimeWarning)
    with handler._lock:
        if not handler._unlogged and not handler._unmarked:
            KEEPING.pop(id(handler), None)


def _log_kept(handler: FeedbackCallbackHandler, key: str, entry: dict[str, Any]) -> None:
    """A retrieval's kept writes: those before its log (links, a follow-up, unused marks), each taken out once
    written, then its log (none for a retrieval whose own writes alone were kept)."""
    before = entry["before"]
    while before:
        write, args, kwargs = before[0]
        try:
            with contextlib.suppress(DuplicateEventError):
                write(*args, **kwargs)
        except StoreBusyError:
            raise
        except RlfbError as exc:
            target = getattr(write, "__self__", args[0] if args else None)
            if not same_store(target, handler.store):
                # a learner's store on another file (its unused marks), closed, deleted or full since: that write is
                # lost, and the handler's own go on (kept first, it stopped every one of them)
                why = "that store was closed" if isinstance(exc, StoreClosedError) else f"that store refused it ({exc})"
                warn_at_app(f"rlfb: a write kept for a learner's feedback store is lost: {why}", RuntimeWarning)
            elif isinstance(exc, REFUSED):
                _lost(exc)
            else:
                raise
        before.pop(0)
    if entry["log"] is not None:
        try:
            with contextlib.suppress(DuplicateEventError):  # written by another handler on the file meanwhile
                log_external(handler.store, **entry["log"])
        except REFUSED as exc:
            _lost(exc)


#: What the store says of a kept write itself (its event gone, its arguments refused, a row damaged), which no
#: later try can change: such a write is dropped. A locked, full, read-only or vanished file raises on, and the
#: write stays kept for the next try, as it is while the file stays locked.
REFUSED = (ValidationError, UnknownEventError, UnknownChunkError, CorruptStateError)


def _lost(exc: Exception) -> None:
    """A kept write the store refuses for what it is (:data:`REFUSED`): dropped with a warning, since kept first it
    would stop every later write and feedback of the handler."""
    warn_at_app(f"rlfb: a write kept while the feedback store was locked is lost: the store refused it ({exc})",
                RuntimeWarning)


def _write_first(handler: FeedbackCallbackHandler, write_log: Callable[[str, Any], None],
                 write_mark: Callable[[str, Any], None]) -> bool:
    """Write the entry kept first of both tables (``_unlogged``, ``_unmarked``) and take it out; ``False`` where
    both are empty. Written inside the app's ``exclusive()`` block of this thread, an entry is kept again if that
    block rolls back (its rollback undoes the write; callbacks run newest first, so each goes back to the front of
    its table, in order, with its number)."""
    store = handler.store
    with handler._lock:
        firsts = [(_seq(value), kept, key, value, write)
                  for kept, write in ((handler._unlogged, write_log), (handler._unmarked, write_mark)) if kept
                  for key, value in [next(iter(kept.items()))]]
        if not firsts:
            return False
        _, kept, key, value, write = min(firsts, key=lambda first: first[0])
        whole = {**value, "before": list(value["before"])} if isinstance(value, dict) else value
    write(key, value)
    with handler._lock:
        kept.pop(key, None)
    if open_blocks(store) > 0:
        store.on_rollback(partial(_put_back, handler, kept, key, whole))
    return True


def _seq(value: Any) -> float:
    """The number an entry was kept under (:func:`keep`)."""
    number = value.get("seq") if isinstance(value, dict) else value
    return number if isinstance(number, int) else -1


def _put_back(handler: FeedbackCallbackHandler, kept: OrderedDict[str, Any], key: str, value: Any) -> None:
    with handler._lock:
        kept[key] = value
        kept.move_to_end(key, last=False)
    keep_until_written(handler)
