"""Checks of the hyperparameters every learning part takes in its constructor.

Each returns the value as a plain Python number, or raises :class:`~rlfb.errors.ValidationError` naming the
setting, so that a bad setting fails where it is given, not at the first update.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rlfb.errors import ValidationError

__all__ = ["check_float", "check_int", "plain_numbers"]


def check_float(
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """Return ``value`` as a finite float inside the given range, or raise :class:`ValidationError`.

    >>> check_float("lr", 0.03, 0.01, 0.05)
    0.03
    >>> check_float("lr", 0.5, 0.01, 0.05)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: lr must be in [0.01, 0.05], got 0.5
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValidationError(f"{name} must be a number, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        raise ValidationError(f"{name} must be finite, got an int beyond float range") from None
    if not math.isfinite(v):
        raise ValidationError(f"{name} must be finite, got {value!r}")
    bad = (
        (lo is not None and (v < lo or (lo_open and v == lo)))
        or (hi is not None and (v > hi or (hi_open and v == hi)))
    )
    if bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise ValidationError(f"{name} must be in {left}{lo_s}, {hi_s}{right}, got {value!r}")
    return v


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """Return ``value`` as an int inside ``[lo, hi]``, or raise :class:`ValidationError`.

    >>> check_int("replay_every", 0, 1)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: replay_every must be at least 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValidationError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        if hi is None:  # "must be in [1, None]" named no bound
            raise ValidationError(f"{name} must be at least {lo}, got {value!r}")
        if lo is None:
            raise ValidationError(f"{name} must be at most {hi}, got {value!r}")
        raise ValidationError(f"{name} must be in [{lo}, {hi}], got {value!r}")
    return v


def plain_numbers(params: Any) -> None:
    """Replace NumPy scalars among a frozen dataclass's fields by Python numbers, so that its ``asdict``
    (a policy's ``params()``, a learner's config) is JSON: ``batch_size=np.int64(50)`` made every save fail."""
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if isinstance(value, np.generic):
            object.__setattr__(params, f.name, value.item())
