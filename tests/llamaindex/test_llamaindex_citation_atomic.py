"""A click on a citation engine's source is stored on the response and copied onto the ranked node it was cut
from, in one transaction: a refusal of the copy (an idempotency conflict) used to leave the response's row
written (found while splitting events.py, 2026-12-06)."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.llms import MockLLM

from llamaindex_rlfb import FeedbackEventHandler, FeedbackFusionPostprocessor
from rlfb import IdempotencyConflictError


def test_a_refused_copy_of_a_citation_click_leaves_nothing_written(
    index: Any, make_ensemble: Any, tmp_path: Any
) -> None:
    from llama_index.core.query_engine import CitationQueryEngine

    handler = FeedbackEventHandler(store=tmp_path / "fb.db").attach()
    try:
        ens = make_ensemble(store=handler.store, policy="thompson")
        pp = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=2)
        engine = CitationQueryEngine.from_args(index, llm=MockLLM(), similarity_top_k=5, node_postprocessors=[pp])
        source = engine.query("moon tides").source_nodes[0].node
        qid = handler.last_query_id
        decided = next(e["id"] for e in handler.retrievals()
                       if e["metadata"]["component"] == "FeedbackFusionPostprocessor")
        # the key the copy is stored under, taken already by other feedback on the decision
        handler.store.record_feedback(decided, "thumbs_down", idempotency_key=f"k/ranked:{decided}")
        before = handler.store.counts()["feedback"]
        with pytest.raises(IdempotencyConflictError):
            handler.record_feedback(qid, signal="click", chunk_id=source.node_id, idempotency_key="k")
        assert handler.store.counts()["feedback"] == before  # the response's row was kept before
        # the same click with a fresh key is written on both
        records = handler.record_feedback(qid, signal="click", chunk_id=source.node_id, idempotency_key="k2")
        assert decided in {r.event_id for r in records} and len(records) == 2
    finally:
        handler.close()
