"""Argument checks of the LangChain adapter: strict where the user passes a value, lenient on run data.

Pydantic's lax mode would read ``k=2.0`` as 2, ``explore="no"`` as ``False`` and
``k=True`` as 1, and wraps a validator's ``ValueError`` in its own error; these
checks run before pydantic does, so a bad option raises
:class:`rlfb.errors.ValidationError` as the core's own checks do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.runnables.config import var_child_runnable_config

from rlfb.errors import ValidationError
from rlfb.runs import finite_score, session_text
from rlfb.types import validate_flag, validate_k

# the adapters' shared rules live in the core: validate_k, validate_flag, session_text, finite_score
__all__ = ["positive_count", "flag", "session_text", "session_key", "SESSION_KEYS", "usable_score", "check_store",
           "check_ensemble", "with_configured_session"]

positive_count = validate_k
flag = validate_flag

#: Run metadata keys that name a conversation, first found first: rlfb's own, then those LangSmith groups a
#: thread's traces by (``thread_id``, ``conversation_id``), which an app that traces threads already sets
SESSION_KEYS = ("session_id", "thread_id", "conversation_id")


def session_key(metadata: Any) -> str | None:
    """The first of :data:`SESSION_KEYS` that run ``metadata`` holds, else ``None``.

    >>> session_key({"thread_id": "t-1", "user": "u"}), session_key({"user": "u"})
    ('thread_id', None)
    """
    return next((key for key in SESSION_KEYS if key in metadata), None)


def with_configured_session(metadata: Mapping[str, Any] | None, config: Mapping[str, Any] | None = None
                            ) -> Mapping[str, Any]:
    """Run ``metadata``, with the session of the run's ``configurable`` where the metadata names none: ``config``'s
    where given, else that of the chain running it (LangChain's ``var_child_runnable_config``).

    ``RunnableWithMessageHistory`` and LangGraph name a conversation in ``config["configurable"]``
    (``session_id``, ``thread_id``), which LangChain 1 no longer copies into run metadata: such a session was
    logged as none, and a restated follow-up was never a reformulation (an audit, 2026-12-06).

    >>> with_configured_session({"user": "u"}, {"configurable": {"session_id": "s1"}})
    {'user': 'u', 'session_id': 's1'}
    >>> with_configured_session({"thread_id": "t"}, {"configurable": {"session_id": "s1"}})  # metadata wins
    {'thread_id': 't'}
    """
    metadata = metadata or {}
    if session_key(metadata) is not None:
        return metadata
    if config is None:
        config = var_child_runnable_config.get()
    configurable = (config or {}).get("configurable") or {}
    key = session_key(configurable) if isinstance(configurable, Mapping) else None
    return metadata if key is None else {**metadata, key: configurable[key]}


def usable_score(value: Any) -> tuple[float | None, bool]:
    """``(score, usable)``: a finite float, or ``None`` with ``usable=False`` for a score that cannot be
    kept (:func:`rlfb.runs.finite_score`). ``None`` (no score) is usable."""
    score = finite_score(value)
    return score, value is None or score is not None


def check_store(store: Any) -> Any:
    """A :class:`rlfb.store.FeedbackStore` for ``store``: a path to open, or a store (anything with ``log_event``).

    The core's rule (:func:`rlfb.store.as_store`), with no store refused, so ``FeedbackCallbackHandler(5)``
    fails here, not at the first retrieval (whose error LangChain would only print).
    """
    from rlfb.store import as_store

    if store is None:
        raise ValidationError("store must be a FeedbackStore or a path to an SQLite file, got None")
    return as_store(store)


def check_ensemble(ensemble: Any) -> Any:
    """The :class:`rlfb.FeedbackEnsemble` given, or the one a retriever wraps; else :class:`ValidationError`."""
    from rlfb.ensemble import FeedbackEnsemble

    ensemble = getattr(ensemble, "ensemble", ensemble)  # the retriever itself is the natural thing to pass
    if not isinstance(ensemble, FeedbackEnsemble):
        raise ValidationError(f"the handler needs an rlfb FeedbackEnsemble or a retriever wrapping one, "
                              f"got {type(ensemble).__name__}")
    return ensemble
