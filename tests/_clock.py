"""A settable clock for stores and learners under test (``FeedbackStore(..., clock=Clock())``)."""

from __future__ import annotations

NOW = 1_700_000_000.0  # 2023-11-14: a fixed "now", in seconds since the epoch


class Clock:
    """Returns ``t``; tests move it by assigning ``clock.t``."""

    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
