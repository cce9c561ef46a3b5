"""The rlfb adapters a :class:`~llamaindex_rlfb.events.FeedbackEventHandler` can teach: the registry of every
one alive in this process (weakly), and the ensemble and store an adapter holds."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

__all__ = ["remember_adapter", "live_adapters", "ensemble_of", "live_ensembles", "store_of"]

# Every rlfb adapter alive in this process (weakly), by id. A decision no handler saw being made (one logged
# before a restart) is learned by a live adapter whose store holds it and who made it (rlfb.runs.owns_event):
# until 2026-12-06 only one the handler had seen deciding in this process, so feedback on a query from before
# a restart, given before the postprocessor's first query, was stored and never learned.
_LIVE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_LIVE_LOCK = threading.Lock()


def remember_adapter(adapter: Any) -> None:
    """Note an rlfb adapter built in this process (weakly: the app keeps it alive, or not)."""
    with _LIVE_LOCK:
        _LIVE[id(adapter)] = adapter


def live_adapters() -> list[Any]:
    """The rlfb adapters alive in this process, the newest first."""
    with _LIVE_LOCK:
        return list(reversed(list(_LIVE.values())))


def ensemble_of(obj: Any) -> Any:
    """The :class:`rlfb.FeedbackEnsemble` of an adapter (or the ensemble itself)."""
    if obj is None:
        return None
    if hasattr(obj, "learner") and hasattr(obj, "feedback") and hasattr(obj, "retriever_names"):
        return obj
    return getattr(obj, "ensemble", None)


def live_ensembles(adapters: Sequence[Any]) -> list[Any]:
    """The ensembles of ``adapters`` (adapters or ensembles; ``None`` skipped) that have an open store, each
    once, in order."""
    out: dict[int, Any] = {}
    for a in adapters:
        ens = ensemble_of(a) if a is not None else None
        store = getattr(ens, "store", None)
        if ens is not None and store is not None and not getattr(store, "closed", False):
            out.setdefault(id(ens), ens)
    return list(out.values())


def store_of(obj: Any) -> Any:
    ens = ensemble_of(obj)
    # a self-indexing postprocessor builds its ensemble on its first call; its store is there from the start
    return getattr(obj, "store", None) if ens is None else ens.store
