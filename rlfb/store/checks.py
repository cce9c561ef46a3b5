"""Validation of what callers hand the store: clear, named errors at the boundary."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rlfb.errors import InvalidWeightsError, ValidationError
from rlfb.reward import finite_float

_IN_CHUNK = 500  # ids per "IN (...)" query, well under SQLite's parameter limit


def _opt_str(x: Any, name: str) -> str | None:
    if x is None:
        return None
    if not isinstance(x, str):
        raise ValidationError(f"{name} must be a str or None, got {type(x).__name__} {x!r}")
    return x


def _req_str(x: Any, name: str) -> str:
    if not isinstance(x, str) or not x:
        raise ValidationError(f"{name} must be a non-empty str, got {x!r}")
    return x


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if type(obj) is dict or isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _number_map(m: Any, name: str) -> dict[str, float | None]:
    """A mapping of retriever name -> finite float (or None for "not scored")."""
    if m is None:
        return {}
    if type(m) is not dict and not isinstance(m, Mapping):
        raise ValidationError(f"{name} must be a mapping of retriever name to number, got {type(m).__name__}")
    out: dict[str, float | None] = {}
    for k, v in m.items():
        if type(k) is not str:
            raise ValidationError(f"{name} keys must be str, got {k!r}")
        if v is None or (type(v) is float and math.isfinite(v)):
            out[k] = v
        else:
            out[k] = finite_float(v, f"{name}[{k!r}]")
    return out


def _check_weights(w: Any, name: str = "weights") -> dict[str, Any]:
    """Flat (``{retriever: w}``) or one level nested (``{query_type: {retriever: w}}``), finite, >= 0."""
    if not isinstance(w, Mapping):
        raise InvalidWeightsError(
            f"{name} must be a mapping of retriever name to weight, got {type(w).__name__}"
        )
    out: dict[str, Any] = {}
    for k, v in w.items():
        if not isinstance(k, str):
            raise InvalidWeightsError(f"{name} keys must be str, got {k!r}")
        if isinstance(v, Mapping) and name == "weights":
            out[k] = _check_weights(v, f"weights[{k!r}]")
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise InvalidWeightsError(f"{name}[{k!r}] must be a number, got {v!r}")
        f = float(v)
        if not math.isfinite(f):
            raise InvalidWeightsError(f"{name}[{k!r}] must be finite, got {f!r}")
        if f < 0:
            raise InvalidWeightsError(f"{name}[{k!r}] must not be negative, got {f!r}")
        out[k] = f
    return out


def _positive(x: Any, name: str, allow_none: bool = False) -> float | None:
    if x is None and allow_none:
        return None
    f = finite_float(x, name)
    if f <= 0:
        raise ValidationError(f"{name} must be positive, got {f}")
    return f


def _batches(seq: Sequence[Any], n: int = _IN_CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _check_event_id(event_id: Any) -> str:
    if not isinstance(event_id, str) or not event_id:
        raise ValidationError(f"event_id must be a non-empty str, got {event_id!r}")
    return event_id


def _check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1:
        raise ValidationError(f"limit must be a positive int, got {limit!r}")
    return int(limit)
