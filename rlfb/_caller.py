"""The ``stacklevel`` that makes a warning name the app's own line, not rlfb's."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import FrameType

#: rlfb and its adapters: a warning raised inside them names the first frame outside
_RLFB = ("rlfb", "langchain_rlfb", "llamaindex_rlfb")
#: The frameworks an app's call passes through before it reaches rlfb (LangChain's runnables and callback manager,
#: LlamaIndex's dispatcher, pydantic's validators): names only, nothing is imported. A warning passes them too, to
#: the app's call into the framework (an app's function the framework called is still the first frame outside)
_FRAMEWORKS = ("langchain_core", "langchain", "langchain_classic", "langgraph", "llama_index",
               "llama_index_instrumentation", "pydantic")


def caller_stacklevel(also_inside: tuple[str, ...] = ()) -> int:
    """The ``stacklevel`` for ``warnings.warn`` in the function that calls this: the first frame whose module is
    outside rlfb, its adapters, the frameworks that call them (LangChain, LlamaIndex) and ``also_inside``
    (top-level module names, such as ``contextlib``). A warning is reached through several layers
    (``FeedbackEnsemble.load``, a retry on a swapped folder, a LlamaIndex postprocessor building its ensemble
    lazily), so a fixed level named rlfb's own line, or a framework's. A call run in an executor thread
    (``ainvoke``, ``aretrieve``) has no app frame above it: its warnings name the thread's module.

    (Tested through the warnings that use it: ``tests/test_warning_locations.py`` and the adapters'
    ``test_warning_locations_*.py``.)
    """
    inside = _RLFB + _FRAMEWORKS + tuple(also_inside)
    frame: FrameType | None = sys._getframe(1)  # the function that warns: stacklevel 1
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".", 1)[0] in inside:
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2
