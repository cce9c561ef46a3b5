"""Ensembles over the shared test corpus on a store file, as the tests of feedback learned across restarts and
processes build them (a module of its own, so test files can import it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlfb import FeedbackEnsemble
from rlfb.store import FeedbackStore

from _corpus import IDS, TEXTS


def bm25_ensemble(path: Path, **kw: Any) -> FeedbackEnsemble:
    """A thompson ensemble of BM25 alone on the store file ``path``, looking at the store at every retrieval."""
    kw.setdefault("policy", "thompson")
    kw.setdefault("refresh_interval", 0.0)
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=str(path), **kw)


def retrieved_before_a_restart(path: Path, query: str = "what causes the tides") -> Any:
    """A retrieval logged by an ensemble that is gone since (a restart): no live ensemble made it."""
    made = bm25_ensemble(path)
    result = made.retrieve(query, k=3)
    made.close()
    return result


def newest_n_learned(path: Path) -> int:
    """How many episodes the store's newest snapshot has learned."""
    with FeedbackStore(path) as store:
        snapshot = store.load_policy_state()
    assert snapshot is not None
    return int(snapshot["state"]["n_learned"])
