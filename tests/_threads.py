"""Helpers for concurrency tests: run one function on several threads at once and collect what they raised;
hold a call in its worker thread while its async caller is cancelled."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def errors_in_threads(target: Callable[[], object], n: int) -> list[BaseException]:
    """Start ``n`` threads running ``target``, wait for all, and return the exceptions they raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - collected for the caller's assertion
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _on_event_loop() -> bool:
    """Whether this thread is running an event loop (a worker thread of ``asyncio.to_thread`` is not)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Gate:
    """Wraps ``fn``: each call says it has started, then waits in its thread until the test opens the gate.

    A call on a thread that runs an event loop fails at a closed gate instead: it would block the loop that
    the test opens the gate from.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        if not self.opened.is_set() and _on_event_loop():
            # an async path that called its sync one: waiting here would block the loop that must open the gate,
            # and the test would hang instead of failing (a mutation review, 2026-12-07)
            raise AssertionError(f"{getattr(self.fn, '__name__', self.fn)} was called on the event loop's own "
                                 "thread, not in a worker thread: the async path blocks the event loop")
        self.opened.wait()
        return self.fn(*args, **kwargs)


async def cancel_inside(call: Coroutine[Any, Any, Any], gate: Gate) -> None:
    """Run ``call`` (which reaches ``gate`` in an ``asyncio.to_thread`` worker), cancel it while the worker waits
    at the gate, as ``asyncio.wait_for`` timing out does, then open the gate and wait until the worker is done.
    """
    loop = asyncio.get_running_loop()
    workers = ThreadPoolExecutor(1)
    loop.set_default_executor(workers)  # where asyncio.to_thread runs the work
    task = asyncio.create_task(call)
    while not gate.entered.is_set():
        if task.done():  # it never reached the gate: its error, or say so, rather than wait forever
            task.result()
            raise AssertionError("the call finished without reaching the gate")
        await asyncio.sleep(0.01)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the call finished before it was cancelled")
    gate.opened.set()
    workers.shutdown(wait=True)  # the worker went on after the cancellation; now it has finished
    loop.set_default_executor(ThreadPoolExecutor(1))  # for the test's next async call
