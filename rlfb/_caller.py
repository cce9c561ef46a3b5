"""The ``stacklevel`` that makes a warning name the app's own line, not rlfb's."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import FrameType

#: rlfb and its adapters: a warning raised inside them names the first frame outside
_RLFB = ("rlfb", "langchain_rlfb", "llamaindex_rlfb")


def caller_stacklevel(also_inside: tuple[str, ...] = ()) -> int:
    """The ``stacklevel`` for ``warnings.warn`` in the function that calls this: the first frame whose module is
    outside rlfb, its adapters and ``also_inside`` (top-level package names: a framework that called the
    adapter, such as ``llama_index``). A warning is reached through several layers (``FeedbackEnsemble.load``, a
    retry on a swapped folder, a LlamaIndex postprocessor), so a fixed level named rlfb's own line.

    (Tested through the warnings that use it: ``tests/test_retrievers.py``, ``tests/llamaindex``.)
    """
    inside = _RLFB + tuple(also_inside)
    frame: FrameType | None = sys._getframe(1)  # the function that warns: stacklevel 1
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".", 1)[0] in inside:
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2
