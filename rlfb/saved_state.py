"""Learned state written as JSON and read back, checked.

A snapshot is read from a file someone may have edited or damaged, so every field is checked on the way in and
a bad one raises :class:`~rlfb.errors.CorruptStateError` naming it; nothing is loaded half. Random generators'
states are written with their big integers as strings, as JSON numbers lose them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.hyperparameters import check_float, check_int

__all__ = [
    "MAX_COUNT", "rng_state", "set_rng_state", "float_list", "read_array", "saved_count", "saved_times",
    "read_count", "read_field", "read_number", "check_at_most",
]


#: The largest count a saved state may hold: 2**53, the largest of the integers a float holds exactly. Counts grow
#: by one an episode, so none comes near it; 10**400 in a damaged save was accepted, and the next update or ranking
#: that took it as a float raised a raw OverflowError.
MAX_COUNT = 2**53


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """The generator's state as JSON-safe data (big integers become strings)."""

    def enc(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: enc(v) for k, v in x.items()}
        if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            return str(int(x))
        return x

    return enc(rng.bit_generator.state)


def set_rng_state(rng: np.random.Generator, state: Mapping[str, Any]) -> None:
    """Restore a state produced by :func:`rng_state`."""

    def dec(x: Any) -> Any:
        if isinstance(x, Mapping):
            return {k: dec(v) for k, v in x.items()}
        if isinstance(x, str) and x.lstrip("-").isdigit():
            return int(x)
        return x

    try:
        rng.bit_generator.state = dec(state)
    except (TypeError, ValueError, KeyError) as exc:
        raise CorruptStateError(f"bad random generator state: {exc}") from exc


def float_list(x: Iterable[float]) -> list[float]:
    """Plain floats for JSON (NaN would not round-trip, so it is refused)."""
    out = [float(v) for v in x]
    if not all(math.isfinite(v) for v in out):
        raise ValidationError("state contains a non-finite number")
    return out


def read_array(state: Mapping[str, Any], key: str, length: int | None = None) -> np.ndarray:
    """Read a finite float list from a state dict, or raise :class:`CorruptStateError`."""
    try:
        arr = np.asarray(state[key], dtype=float)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptStateError(f"policy state field {key!r} is missing or not numeric") from exc
    if arr.ndim != 1 or (length is not None and arr.shape[0] != length):
        raise CorruptStateError(f"policy state field {key!r} has the wrong shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise CorruptStateError(f"policy state field {key!r} holds non-finite numbers")
    return arr


def saved_count(name: str, value: Any) -> int:
    """``value``, a count read from a saved state: an int (not a bool) in ``[0, MAX_COUNT]``, or raise
    :class:`CorruptStateError`.

    >>> saved_count("added", 12)
    12
    >>> saved_count("added", 10**400)
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: added must be in [0, 9007199254740992], got an int of 1329 bits
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_COUNT:  # repr() fails past 4300 digits
        raise CorruptStateError(f"{name} must be in [0, {MAX_COUNT}], got an int of {value.bit_length()} bits")
    try:
        return check_int(name, value, 0, MAX_COUNT)
    except ValidationError as exc:  # damaged saved state, not a bad argument
        raise CorruptStateError(str(exc)) from exc


def saved_times(what: str, times: Any) -> None:
    """Refuse saved clocks ``times`` (a number or an array) beyond the learner's own bound on the future (30
    days past this machine's clock), with :class:`CorruptStateError`: the clocks only move forward, so one such
    time made every later episode count as long past (weight about 0) and the policy stopped learning, for good.
    Times that are not finite are the caller's to refuse."""
    # the learner's bound; imported here, as learner_checks imports rlfb.policies, which imports this module
    from rlfb.learner_checks import _not_future

    arr = np.asarray(times, dtype=float)
    if arr.size:
        try:
            _not_future(what, float(np.max(arr)))
        except ValidationError as exc:
            raise CorruptStateError(f"saved state: {exc}") from exc


def read_count(state: Mapping[str, Any], key: str) -> int:
    """Read a non-negative int counter (at most :data:`MAX_COUNT`) from a state dict, or raise
    :class:`CorruptStateError`.

    ``int()`` took -5 (then ``sqrt(1 + n)`` failed at every retrieval), 2.7 and "5" alike.
    """
    try:
        value = state[key]
    except KeyError as exc:
        raise CorruptStateError(f"policy state field {key!r} is missing") from exc
    return saved_count(f"policy state field {key!r}", value)


def read_field(state: Mapping[str, Any], key: str, kind: type = object) -> Any:
    """``state[key]``, which must be a ``kind``, or raise :class:`CorruptStateError` naming the field.

    >>> read_field({"buffer": None}, "buffer", list)
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: policy state field 'buffer' must be a list, got NoneType
    """
    try:
        value = state[key]
    except KeyError:
        raise CorruptStateError(f"policy state field {key!r} is missing") from None
    if not isinstance(value, kind):
        raise CorruptStateError(f"policy state field {key!r} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def read_number(state: Mapping[str, Any], key: str, lo: float | None = None, hi: float | None = None) -> float:
    """Read a finite number in ``[lo, hi]`` from a state dict, or raise :class:`CorruptStateError`."""
    try:
        return check_float(f"policy state field {key!r}", state[key], lo, hi)
    except KeyError as exc:
        raise CorruptStateError(f"policy state field {key!r} is missing") from exc
    except ValidationError as exc:
        raise CorruptStateError(str(exc)) from exc


def check_at_most(what: str, value: Any, most: float) -> None:
    """Refuse ``value`` (a running sum, or an array of them) above ``most``, the most the updates that built it
    could have added, with :class:`CorruptStateError`; the slack is rounding in the running sums.

    >>> check_at_most("arm statistics for '*': their count", 1e300, 60.0)
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: arm statistics for '*': their count is 1e+300, more than the 60 its updates could add
    """
    top = float(np.max(value)) if np.size(value) else 0.0
    if not top <= most * (1.0 + 1e-9) + 1e-9:
        raise CorruptStateError(f"{what} is {top:g}, more than the {most:g} its updates could add")
