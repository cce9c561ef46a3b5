"""The query ids a :class:`~llamaindex_rlfb.events.FeedbackEventHandler` hands out and reads back: the latest
one per thread and asyncio task, the one each response names, and the span each began with."""

from __future__ import annotations

import threading
import uuid
import weakref
from typing import TYPE_CHECKING, Any

from llama_index.core.instrumentation.span import active_span_id

from llamaindex_rlfb._spans import KEPT, task_key
from rlfb.errors import ValidationError

if TYPE_CHECKING:
    from collections import OrderedDict
    from contextvars import ContextVar

    from llamaindex_rlfb._spans import SpanParents

__all__ = ["QueryIds"]


class QueryIds:
    """The handler's query ids (a mixin of :class:`~llamaindex_rlfb.events.FeedbackEventHandler`, whose fields it
    reads)."""

    if TYPE_CHECKING:  # the handler's fields these methods read
        _store: Any
        _lock: threading.Lock
        _spans: SpanParents
        _last: ContextVar[tuple[str, int | None] | None]  # (latest query id, the task that set it)
        _thread_last: OrderedDict[int, tuple[str, int | None]]
        _span_of: OrderedDict[str, str]
        _responses: dict[int, tuple[weakref.ref[Any], str]]

    @property
    def last_query_id(self) -> str | None:
        """Id of the latest top-level query (or bare retrieval) in the current thread or asyncio task."""
        last = self._last.get()
        return None if last is None else last[0]

    def query_id_of(self, response: Any) -> str | None:
        """The query id of a ``response`` a query engine or a chat engine (``chat``, ``achat``, ``stream_chat``,
        ``astream_chat``) returned while this handler was attached, from any thread or task; ``None`` for one it
        did not see (which :meth:`record_feedback` refuses, rather than rate the latest query).

        :attr:`last_query_id` is per thread and asyncio task, so a query run through
        ``asyncio.to_thread`` or a worker pool is not the calling code's latest; the response it
        returned still names its query: ``handler.record_feedback(handler.query_id_of(response), score=1.0)``.
        A chat turn's response names what the turn retrieved (its retrieval's query id, or the run of the rlfb
        re-ranking of it; a turn that made several is their run under the turn's span id); until 2026-12-06 it
        named nothing. So does an agent's output (``AgentOutput``, what ``await agent.run(...)`` gives): the
        query its tool ran, or, where its tools ran several, a run made for the output above them all, so that
        one feedback on it rates every query its answer drew on (until 2026-12-06 it named nothing, and only each
        tool call's ``tool_output.raw_output`` did).
        """
        with self._lock:
            ref, qid = self._responses.get(id(response), (None, None))
        if ref is not None and ref() is response:
            return qid
        return self._agent_run_of(response)

    def _agent_run_of(self, output: Any) -> str | None:
        """The query id an agent's ``output`` stands for (:meth:`query_id_of`): its tool calls' responses
        (``tool_calls[i].tool_output.raw_output``) that name a query; several are linked below a run made for the
        output, remembered with it."""
        calls = getattr(output, "tool_calls", None)
        if not isinstance(calls, (list, tuple)) or not calls:
            return None
        asked = [self.query_id_of(getattr(getattr(call, "tool_output", None), "raw_output", None)) for call in calls]
        qids = list(dict.fromkeys(q for q in asked if q is not None))
        if len(qids) <= 1:
            return qids[0] if qids else None
        run = f"agent/{uuid.uuid4()}"
        self._store.link_runs([(q, run) for q in qids])
        self._remember_response(output, run)
        return run

    def _remember_response(self, response: Any, qid: str) -> None:
        """Let ``response`` name its query wherever it is read (:meth:`query_id_of`), as long as it lives."""
        key, responses = id(response), self._responses

        def gone(_: Any) -> None:  # the response was collected: its id may name another object next
            responses.pop(key, None)

        try:
            ref = weakref.ref(response, gone)
        except TypeError:  # a response no weak reference can name (a str from a custom engine)
            return
        with self._lock:
            responses[key] = (ref, qid)

    def _span_for(self, qid: str) -> str:
        """The span query id ``qid`` began with: a bare retrieval's, the one a re-ranking's run
        (``"<retrieval span id>/reranked/<event id>"``) re-ranked, or the query's own (its id is its span's)."""
        with self._lock:
            span = self._span_of.get(qid)
            base = qid.split("/", 1)[0]
            return span if span is not None else self._span_of.get(base, base)

    def _set_last(self, qid: str) -> None:
        self._spans.note_query(qid, active_span_id.get())  # a chat turn running now made it
        task = task_key()
        self._last.set((qid, task))  # and which task set it: a context copied into another task inherits it
        with self._lock:
            here = threading.get_ident()
            self._thread_last.pop(here, None)  # newest last: an app that starts a thread per request grew it unbounded
            self._thread_last[here] = (qid, task)
            while len(self._thread_last) > KEPT:
                self._thread_last.popitem(last=False)

    def _implied_query(self) -> str | None:
        """:attr:`last_query_id`, unless a later query of this thread ran in a task the caller never saw.

        ``asyncio.run(engine.aquery(...))`` and a notebook cell's ``await`` run the query in a
        task of their own, whose latest query the calling code never sees: its ``last_query_id``
        is an earlier query, and feedback meant for the later one would rate it. Rather than
        guess, that is an error asking for the id. A task that ran its own query (a web server's
        request) keeps it: another request's query, in a task of its own, is not its.
        """
        last = self._last.get()
        own, own_task = (None, None) if last is None else last
        here = task_key()
        if own is not None and own_task == here and here is not None:
            return own  # this very task ran it
        with self._lock:
            latest = self._thread_last.get(threading.get_ident())
        if latest is not None and latest[0] != own and latest[1] != here:
            raise ValidationError(
                f"the latest query in this thread ({latest[0]!r}) ran in an asyncio task of its own "
                f"(asyncio.run, a notebook cell's await), and this code's latest is {own!r}: pass the query id "
                "(handler.query_id_of(response), an agent's output included; handler.last_query_id read in that "
                "task; or a node's metadata['event_id'])"
            )
        return own

