"""Forgetting by age: how much a reward or a running sum counts after time has passed (a half-life in days).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["DAY", "decay_factor", "clock_decay", "episode_time"]


DAY = 86_400.0


def decay_factor(dt_seconds: float, half_life_days: float | None) -> float:
    """``0.5 ** (dt / half_life)``; 1.0 when forgetting is off or no time passed."""
    if half_life_days is None or dt_seconds <= 0:
        return 1.0
    return float(0.5 ** (dt_seconds / (half_life_days * DAY)))


def clock_decay(last: float, t: float, half_life_days: float | None) -> tuple[float, float, float]:
    """How a running sum kept on a clock ``last`` takes an observation made at time ``t``.

    Returns ``(past, weight, clock)``: the factor for what was summed so far, the
    factor for the new observation (one older than the clock, a late reward for
    an old decision, counts less) and the new clock. ``t <= 0`` means no time.

    >>> clock_decay(86_400.0, 2 * 86_400.0, 1.0)
    (0.5, 1.0, 172800.0)
    >>> clock_decay(2 * 86_400.0, 86_400.0, 1.0)
    (1.0, 0.5, 172800.0)

    A clock not started yet (``last`` 0: what was summed carried no time) keeps its sum whole:

    >>> clock_decay(0.0, 1.7e9, 45.0)
    (1.0, 1.0, 1700000000.0)
    """
    if t <= 0:
        return 1.0, 1.0, last
    if t > last:
        return (decay_factor(t - last, half_life_days) if last > 0 else 1.0), 1.0, t
    return 1.0, decay_factor(last - t, half_life_days), last


def episode_time(episode: Any) -> float:
    """The time an episode describes: its decision time, else its feedback time (0 if neither).

    >>> from types import SimpleNamespace as Ep
    >>> episode_time(Ep(timestamp=7.0, feedback_time=9.0)), episode_time(Ep(timestamp=0.0, feedback_time=9.0))
    (7.0, 9.0)
    >>> episode_time(Ep(timestamp=float("nan")))
    0.0
    """
    t = float(getattr(episode, "timestamp", 0.0) or 0.0)
    if t <= 0:
        t = float(getattr(episode, "feedback_time", 0.0) or 0.0)
    return t if math.isfinite(t) else 0.0
