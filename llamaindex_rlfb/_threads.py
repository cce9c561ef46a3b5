"""Running the synchronous core from an async LlamaIndex hook."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from rlfb._caller import app_line_for_threads

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args, cancelled)`` in a worker thread, so the event loop stays free (numpy, SQLite block).

    A cancelled await (``asyncio.wait_for`` timing out) leaves the thread running: ``cancelled``, a
    :class:`threading.Event` set then, tells it to log nothing from there on.
    """
    cancelled = threading.Event()
    try:
        with app_line_for_threads():  # the thread's warnings name the app's await, not the thread pool
            return await asyncio.to_thread(fn, *args, cancelled)
    except asyncio.CancelledError:
        cancelled.set()
        raise
