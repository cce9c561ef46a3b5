"""Run one function on several threads at once and collect what they raised (for concurrency tests)."""

from __future__ import annotations

import threading
from collections.abc import Callable


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
