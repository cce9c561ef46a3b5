"""Warnings that name the app's own line, not rlfb's, a framework's, or a worker thread's."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import FrameType

#: rlfb and its adapters: a warning raised inside them names the first frame outside
_RLFB = ("rlfb", "langchain_rlfb", "llamaindex_rlfb")
#: The frameworks an app's call passes through before it reaches rlfb (LangChain's runnables and callback manager,
#: LlamaIndex's dispatcher, pydantic's validators): names only, nothing is imported. A warning passes them too, to
#: the app's call into the framework (an app's function the framework called is still the first frame outside)
_FRAMEWORKS = ("langchain_core", "langchain", "langchain_classic", "langgraph", "llama_index",
               "llama_index_instrumentation", "pydantic")
#: What starts a worker thread's stack: a warning whose first frame outside rlfb is one of these was given in a
#: thread an async call started (``ainvoke``, ``aretrieve``), which has no app frame above it
_THREADS = ("concurrent", "threading", "asyncio")

#: The app's line (file, line, module globals) of the async call whose worker thread runs now; a thread started by
#: ``asyncio.to_thread`` or LangChain's ``run_in_executor`` runs in a copy of the caller's context, so it sees it
_APP_LINE: ContextVar[tuple[str, int, dict[str, Any]] | None] = ContextVar("rlfb_app_line", default=None)


def _top(frame: FrameType) -> str:
    """The top-level name of the frame's module (``rlfb`` for ``rlfb.store.connection``)."""
    return str(frame.f_globals.get("__name__", "")).split(".", 1)[0]


def _first_outside(frame: FrameType | None, inside: tuple[str, ...]) -> tuple[FrameType | None, int]:
    """The first frame from ``frame`` down whose top-level module is not in ``inside``, and how many it passed."""
    passed = 0
    while frame is not None and _top(frame) in inside:
        frame, passed = frame.f_back, passed + 1
    return frame, passed


def warn_at_app(message: str, category: type[Warning] = UserWarning, also_inside: tuple[str, ...] = ()) -> None:
    """``warnings.warn(message, category)`` naming the app's line: the first frame whose module is outside rlfb,
    its adapters, the frameworks that call them (LangChain, LlamaIndex) and ``also_inside`` (top-level module
    names, such as ``contextlib``). A warning is reached through several layers (``FeedbackEnsemble.load``, a
    retry on a swapped folder, a LlamaIndex postprocessor building its ensemble lazily), so a fixed
    ``stacklevel`` named rlfb's own line, or a framework's. Given in a worker thread of an async call
    (``ainvoke``, ``aretrieve``; :func:`app_line_for_threads`), it names the line that awaited that call, where
    ``warnings.warn`` could only name the thread pool's module.

    (Tested through the warnings that use it: ``tests/test_warning_locations.py`` and the adapters'
    ``test_warning_locations_*.py``, which run each adapter warning through the async calls too.)
    """
    frame, passed = _first_outside(sys._getframe(1), _RLFB + _FRAMEWORKS + tuple(also_inside))
    app = _APP_LINE.get()
    in_worker = frame is None or _top(frame) in _THREADS
    if app is not None and in_worker:
        filename, lineno, module_globals = app
        # what warnings.warn does with a frame's globals, for a frame of another thread's stack
        warnings.warn_explicit(message, category, filename, lineno, module_globals.get("__name__", "<string>"),
                               module_globals.setdefault("__warningregistry__", {}), module_globals)
        return
    warnings.warn(message, category, stacklevel=2 + passed if frame is not None else 3)


@contextmanager
def app_line_for_threads() -> Iterator[None]:
    """Within the block, a worker thread started with a copy of this context (``asyncio.to_thread``, LangChain's
    ``run_in_executor``) gives its :func:`warn_at_app` warnings at the app's line that called in: the first frame
    outside rlfb, the frameworks and ``contextlib`` on the awaiting coroutines' stack, or, where the call is a task
    of its own (each step of a LangChain chain is one, and so is each call ``asyncio.gather`` runs), on the stack
    of the task awaiting it. A task nothing awaits yet (``create_task``, a ``TaskGroup``) has no such line: its
    thread's warnings name the thread pool's module, as ``warnings.warn`` does.
    """
    frame = _app_frame(sys._getframe(1), (*_RLFB, *_FRAMEWORKS, "contextlib"))
    token = _APP_LINE.set(None if frame is None else (frame.f_code.co_filename, frame.f_lineno, frame.f_globals))
    try:
        yield
    finally:
        _APP_LINE.reset(token)


def _app_frame(start: FrameType, inside: tuple[str, ...]) -> FrameType | None:
    """The first frame outside ``inside`` from ``start`` down, past the tasks the call runs in; ``None`` where
    there is none (an app's own task that calls rlfb from its outermost coroutine) or asyncio's innards changed."""
    # past rlfb and the frameworks, and past an asyncio coroutine that awaits the call in the caller's own task
    # (wait_for since Python 3.12), whose caller's coroutine lies right below it; the loop's own frames (not
    # coroutines) lead to the task path below
    frame: FrameType | None = start
    while frame is not None and (_top(frame) in inside or (_top(frame) == "asyncio" and _is_coroutine(frame))):
        frame = frame.f_back
    if frame is not None and _top(frame) not in _THREADS:
        return frame
    import asyncio  # only here: the core imports no asyncio for its synchronous calls

    try:
        task: Any = asyncio.current_task()
        for _ in range(32):  # tasks awaiting tasks: a chain of chains
            task = _awaiting_task(task, depth=4)
            if task is None:
                return None
            for frame in reversed(_awaiting_frames(task.get_coro())):
                if _top(frame) not in (*inside, *_THREADS):
                    return frame
    except Exception:  # asyncio's private fields read best-effort: a warning's line is no reason to fail a call
        return None
    return None


def _is_coroutine(frame: FrameType) -> bool:
    """Whether ``frame`` runs an ``async def`` function (an await in progress, not the event loop's machinery)."""
    import inspect

    return bool(frame.f_code.co_flags & inspect.CO_COROUTINE)


def _awaiting_frames(coro: Any) -> list[FrameType]:
    """The frames of a suspended coroutine and those it awaits, outermost first."""
    frames = []
    while coro is not None and getattr(coro, "cr_frame", None) is not None:
        frames.append(coro.cr_frame)
        coro = coro.cr_await
    return frames


def _awaiting_task(future: Any, depth: int) -> Any:
    """The task awaiting ``future``: the owner of the wake-up its ``await`` added to the future's callbacks, or,
    through a future of asyncio's own that waits on it (``gather``'s, ``wait_for``'s), the task awaiting that."""
    import asyncio

    callbacks = [callback for callback, _context in list(getattr(future, "_callbacks", None) or ())]
    for callback in callbacks:  # an await's own wake-up first: another callback's futures are a guess
        owner = getattr(callback, "__self__", None)
        if _is_task(owner):
            return owner
    for callback in callbacks if depth > 0 else ():
        held = [c.cell_contents for c in getattr(callback, "__closure__", None) or () if _filled(c)]
        for value in [*held, *getattr(callback, "args", ())]:
            if asyncio.isfuture(value) and value is not future:
                found = _awaiting_task(value, depth - 1)
                if found is not None:
                    return found
    return None


def _is_task(value: Any) -> bool:
    """Whether ``value`` is an asyncio task: the C one, or asyncio's pure-Python one, which is no subclass of it
    (a loop run by ``backports.asyncio.runner``, as pytest-asyncio does on Python 3.10, makes those: an
    ``isinstance`` of ``asyncio.Task`` passed them by, and the warning named the thread pool's module)."""
    import asyncio

    return asyncio.isfuture(value) and callable(getattr(value, "get_coro", None))


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True
