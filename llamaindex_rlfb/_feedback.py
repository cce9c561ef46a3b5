"""Feedback from the LlamaIndex adapters' own ``feedback`` methods, with errors that speak LlamaIndex."""

from __future__ import annotations

from typing import Any

from rlfb.errors import UnknownEventError
from rlfb.runs import record_run_feedback

__all__ = ["adapter_feedback"]


def adapter_feedback(store: Any, event_id: Any, signal: str | None, *, ensemble: Any, **fields: Any) -> list[Any]:
    """:func:`rlfb.runs.record_run_feedback` on ``store``; an unknown id names what a LlamaIndex app passes."""
    try:
        return record_run_feedback(store, event_id, signal, ensemble=ensemble, **fields)
    except UnknownEventError:
        # the core's message names LangChain's retriever and callback handler, which this app has neither of
        raise UnknownEventError(
            f"nothing was logged under {str(event_id)!r}, nor under a query below it; pass a node's "
            "metadata['event_id'] from this adapter's output, or a query id (handler.last_query_id, with a "
            "FeedbackEventHandler attached while querying), and check that the adapter logs (log=True) to "
            "this store"
        ) from None
