"""Four one-line texts (tides, aurora, volcanoes, bread), a BM25-only ensemble over them, and a click on its best
hit: what the ensemble, snapshot and run-id tests of the mutation audits build on."""

from __future__ import annotations

from typing import Any

from rlfb import FeedbackEnsemble

TEXTS = [
    "tides are caused by the moon and the sun",
    "the aurora is caused by charged particles from the sun",
    "volcanoes erupt molten rock from the mantle",
    "sourdough bread rises with wild yeast",
]
IDS = ["tides", "aurora", "volcanoes", "bread"]


def bm25_ensemble(store: Any = None, **kwargs: Any) -> FeedbackEnsemble:
    """An ensemble of BM25 alone over :data:`TEXTS` under :data:`IDS`, on ``store``."""
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=store, **kwargs)


def click_first_hit(ens: FeedbackEnsemble, query: str = "what causes the tides") -> str:
    """Retrieve two hits for ``query`` and click the first; the retrieval's event id."""
    r = ens.retrieve(query, k=2)
    ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    assert r.event_id is not None
    return r.event_id
