"""Which queries and retrievals are open in this thread or asyncio task, the span each recent span ran under,
and the query ids each open chat turn made (its response names them when its span exits).

The stacks are context variables shared by every
:class:`~llamaindex_rlfb.events.FeedbackEventHandler`: a query id is
LlamaIndex's span id, the same whichever handler sees it.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler

from llamaindex_rlfb._checks import session_text
from rlfb._caller import warn_at_app

__all__ = [
    "KEPT",
    "QUERIES",
    "RETRIEVALS",
    "SpanParents",
    "current_query_id",
    "current_session",
    "current_tags",
    "pop",
    "push",
    "span_of",
    "task_key",
]

# Shared by every handler: the query id is LlamaIndex's span id, the same whichever handler sees it.
QUERIES: ContextVar[tuple[str, ...]] = ContextVar("rlfb_llamaindex_open_queries", default=())
RETRIEVALS: ContextVar[tuple[str, ...]] = ContextVar("rlfb_llamaindex_open_retrievals", default=())
#: How many recent entries each of a handler's memories keeps: the spans whose parent is remembered and the open
#: chat turns here, and the handler's queries, learner decisions and what it logged under them
KEPT = 10_000


def current_query_id() -> str | None:
    """The id of the innermost query running in this thread or task (``None`` outside one, or unobserved)."""
    open_queries = QUERIES.get()
    return open_queries[-1] if open_queries else None


def current_tags() -> dict[str, Any]:
    """LlamaIndex's active instrument tags (``instrument_tags({...})``), where a session id may ride."""
    from llama_index.core.instrumentation.dispatcher import active_instrument_tags

    return dict(active_instrument_tags.get() or {})


def current_session() -> str | None:
    """The ``session_id`` instrument tag as a session id; ``None`` without one, or when it cannot be one.

    A tag that cannot be a session id (``""``, a float, an object: see
    :func:`~llamaindex_rlfb._checks.session_text`) is dropped with a warning,
    not raised: tags reach every component of the query, and an error in an
    event handler is swallowed, so raising would lose the retrieval.
    """
    value = current_tags().get("session_id")
    session = None if value is None else session_text(value)
    if value is not None and session is None:
        # the app's query or retrieve, past LlamaIndex's dispatcher (stacklevel=2 named the adapter's module)
        warn_at_app(f"ignoring the session_id tag {value!r}: not a non-empty str, int or UUID")
    return session


#: the engine calls a user's question runs as (a span's method name): a top-level one that raises after the
#: latest query started is the user's next question, which gave no answer to rate
_TURNS = frozenset({"chat", "achat", "stream_chat", "astream_chat", "query", "aquery", "retrieve", "aretrieve"})
#: a chat engine's turn (a span's method name): it emits no QueryStartEvent nor QueryEndEvent, so the response it
#: returns is told its query ids when its span exits (the exit carries the result)
_CHATS = frozenset({"chat", "achat", "stream_chat", "astream_chat"})


def _method(span: str) -> str:
    """``"chat"`` from a span id like ``"ContextChatEngine.chat-<uuid>"``."""
    return span.split("-", 1)[0].rsplit(".", 1)[-1]


class SpanParents(BaseSpanHandler[Any]):
    """Remembers the span each recent span ran under (bounded), so that a span dropped by an error is known to
    have been above a retrieval: a chat engine's turn raising after its retrieval ended. It keeps no spans open."""

    _parents: Any = PrivateAttr(default_factory=OrderedDict)
    _started: Any = PrivateAttr(default_factory=OrderedDict)  # span -> the order it started in
    _count: Any = PrivateAttr(default_factory=itertools.count)
    _turns: Any = PrivateAttr(default_factory=OrderedDict)  # open chat turn's span -> query ids made under it
    _on_turn: Any = PrivateAttr(default=None)  # weak method: called with (turn span, its query ids, its result)

    def on_turn_end(self, callback: Callable[[str, list[str], Any], None]) -> None:
        """Call ``callback(turn, query_ids, result)`` (a bound method, kept weakly) when a chat turn under
        which queries were noted (:meth:`note_query`) returns ``result``."""
        self._on_turn = weakref.WeakMethod(callback)  # type: ignore[arg-type]

    def note_query(self, qid: str, span: str | None) -> None:
        """Note that query id ``qid`` was made in ``span``: each chat turn that span ran under made it."""
        with self.lock:
            seen = 0
            while span is not None and seen < 1_000:
                if _method(span) in _CHATS:
                    made = self._turns.setdefault(span, [])
                    if qid not in made:
                        made.append(qid)
                    while len(self._turns) > KEPT:  # a turn that never ended (its span was lost)
                        self._turns.popitem(last=False)
                span = self._parents.get(span)
                seen += 1

    @classmethod
    def class_name(cls) -> str:
        return "RlfbSpanParents"

    def new_span(self, id_: str, bound_args: Any, instance: Any = None, parent_span_id: str | None = None,
                 tags: Any = None, **kwargs: Any) -> None:
        with self.lock:
            self._parents[id_] = parent_span_id
            self._started[id_] = next(self._count)
            if len(self._parents) > KEPT:
                self._parents.popitem(last=False)
                self._started.popitem(last=False)
        return None

    def prepare_to_exit_span(self, id_: str, bound_args: Any, instance: Any = None, result: Any = None,
                             **kwargs: Any) -> None:
        with self.lock:
            made = self._turns.pop(id_, None)
        callback = None if self._on_turn is None else self._on_turn()
        if made and callback is not None and result is not None:
            callback(id_, made, result)
        return None

    def prepare_to_drop_span(self, id_: str, bound_args: Any, instance: Any = None, err: Any = None,
                             **kwargs: Any) -> None:
        with self.lock:
            self._turns.pop(id_, None)  # a turn that raised returned no response to name its queries
        return None

    def turn_after(self, span: str, since: str | None) -> bool:
        """Whether ``span`` is a top-level call of an engine (a chat turn, a query, a retrieval: a span of
        nothing else) that started after span ``since``: the user's next question, whatever it raised at."""
        method = _method(span)
        with self.lock:
            if method not in _TURNS or span not in self._parents or self._parents[span] is not None:
                return False
            start, before = self._started.get(span), self._started.get(since) if since is not None else None
        return start is not None and before is not None and start > before

    def above(self, span: str | None, ancestor: str) -> bool:
        """Whether ``ancestor`` is a span ``span`` ran under."""
        with self.lock:
            seen = 0
            while span is not None and seen < 1_000:  # a cycle never, but bounded all the same
                span = self._parents.get(span)
                if span == ancestor:
                    return True
                seen += 1
        return False


def span_of(event: BaseEvent) -> str:
    return event.span_id or event.id_


def push(var: ContextVar[tuple[str, ...]], item: str) -> None:
    stack = var.get()
    if not stack or stack[-1] != item:  # two handlers see the same event: push once
        var.set(stack + (item,))


def pop(var: ContextVar[tuple[str, ...]], item: str | None) -> None:
    stack = var.get()
    if item in stack:
        var.set(tuple(s for s in stack if s != item))


def task_key() -> int | None:
    """The caller's asyncio task (by id), or ``None`` for plain sync code."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        return None
    return None if task is None else id(task)
