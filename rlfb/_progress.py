"""Progress bars for the CLI, notebooks and the simulator: tqdm's, without its notebook warning.

``tqdm.auto`` picks Jupyter's widget bar in a notebook and, where ``ipywidgets`` is not installed, warns
"IProgress not found" at every bar it makes, disabled ones included (all three notebooks printed it). So a
notebook without ``ipywidgets`` gets tqdm's text bar, as a terminal does; with it, the widget bar. A bar
that is off, or one outside a Jupyter kernel, is tqdm's text bar without looking for ``ipywidgets``: the
library's own encodings make a bar that is off at every cache miss, and looking imported ``ipywidgets`` and
``IPython`` (0.2 to 0.4 s) into a process that shows no bar (an audit, 2026-12-07).
"""

from __future__ import annotations

import functools
import sys
from typing import Any


@functools.cache
def _notebook_bar_class() -> Any:
    try:
        import ipywidgets  # noqa: F401 - only whether it is there
    except ImportError:
        from tqdm.std import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm


def progress(*args: Any, **kwargs: Any) -> Any:
    """A tqdm bar (the same arguments as ``tqdm.tqdm``): a widget in a notebook with ``ipywidgets``, else text.

    >>> list(progress([1, 2], disable=True))
    [1, 2]
    """
    if kwargs.get("disable") is True or "ipykernel" not in sys.modules:
        from tqdm.std import tqdm

        return tqdm(*args, **kwargs)
    return _notebook_bar_class()(*args, **kwargs)
