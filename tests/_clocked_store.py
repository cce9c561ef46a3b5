"""An in-memory feedback store on the test clock (``_clock.py``), and a retrieval logged on it a minute before
``NOW``: what the reward and store tests of the mutation audits build on."""

from __future__ import annotations

from typing import Any

from _clock import NOW, Clock

from rlfb.store import FeedbackStore


def clocked_store(**kwargs: Any) -> FeedbackStore:
    """A store in memory whose clock reads ``NOW``; ``kwargs`` go to :class:`FeedbackStore`."""
    return FeedbackStore(":memory:", clock=Clock(), **kwargs)


def log_retrieval(store: FeedbackStore, ts: float = NOW - 60, ids: tuple[str, ...] = ("c1", "c2"),
                  **kwargs: Any) -> str:
    """Log question "q" shown with chunks ``ids`` (arm "a", equal bm25 and dense weights) at ``ts``; its event id."""
    return store.log_event("q", {"weights": {"bm25": 0.5, "dense": 0.5}, "arm": "a"},
                           [{"chunk_id": c} for c in ids], timestamp=ts, **kwargs)
