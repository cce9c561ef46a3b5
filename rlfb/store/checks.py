"""Validation of what callers hand the store: clear, named errors at the boundary."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from rlfb.errors import InvalidWeightsError, ValidationError
from rlfb.files import path_text
from rlfb.reward import finite_float

_IN_CHUNK = 500  # ids per "IN (...)" query, well under SQLite's parameter limit
_MAX_INT = 2**63 - 1  # SQLite's INTEGER is 64-bit signed; a larger Python int raises OverflowError there
_MEMORY = (":memory:",)  # sqlite3's in-memory database ("", its private temporary one, is refused)


def _opt_str(x: Any, name: str) -> str | None:
    if x is None:
        return None
    if not isinstance(x, str):
        raise ValidationError(f"{name} must be a str or None, got {type(x).__name__} {x!r}")
    return x


def _req_str(x: Any, name: str) -> str:
    return _check_id(x, name)


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


def _check_id(x: Any, name: str, *, allow_empty: bool = False) -> str:
    """An id argument of a lookup or write: a str (non-empty unless ``allow_empty``).

    Checked before it reaches :func:`~rlfb.store.codec._enc`, which assumes a str.
    ``allow_empty`` is for ids that may be stored empty (a session or parent id)
    and for questions whose answer for "" is simply "no" (:meth:`has_event`).
    """
    if isinstance(x, str) and (x or allow_empty):
        return x
    kind = "a str" if allow_empty else "a non-empty str"
    raise ValidationError(f"{name} must be {kind}, got {type(x).__name__} {x!r}")


def _check_event_id(event_id: Any) -> str:
    """An event id argument. ``None``, the ``event_id`` of a retrieval that was not logged, is refused with a
    word on why there is none: the bare type error sent users looking for a bug in their own id handling."""
    if event_id is None:
        raise ValidationError(
            "event_id is None: the retrieval was not logged (retrieve(..., log=False), or an ensemble without a "
            "store), so there is no event to give feedback on or to read"
        )
    return _check_id(event_id, "event_id")


def _check_int(x: Any, name: str, minimum: int = 1) -> int:
    """An int SQLite can store: from ``minimum`` to 2**63 - 1 (not a bool, not a float)."""
    # the cast: typeshed gives numbers.Integral only __lt__/__le__, so ``minimum <= x`` does not type-check there
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or not minimum <= cast(int, x) <= _MAX_INT:
        raise ValidationError(f"{name} must be an int from {minimum} to 2**63 - 1, got {x!r}")
    return int(x)


def _check_limit(limit: Any) -> int:
    return _check_int(limit, "limit")


def _items(items: Any, name: str, what: str) -> Iterable[Any]:
    """A batch argument: an iterable of items, not None, a str or one lone item (a mapping)."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise ValidationError(f"{name} must be an iterable of {what}, got {type(items).__name__} {items!r:.80}")
    return items


def _check_path(path: Any) -> str:
    """The database path as a str: an in-memory form, or a file whose folder exists.

    Anything but a str or os.PathLike is refused (:func:`rlfb.files.path_text`): ``str(None)`` would open a
    file named ``None`` in the working directory.
    """
    path = path_text(path, also=" (or ':memory:')")
    if path == "":
        # sqlite3's private temporary database: an unset setting (os.environ.get("DB", "")) lost every write at exit
        raise ValidationError("the database path is empty: name a file, or ':memory:' for a store that lives only "
                              "as long as the process")
    if path in _MEMORY:
        return path
    # sqlite3 says only "unable to open database file" for these; name the path and the reason
    if os.path.isdir(path):
        raise ValidationError(f"path {path!r} is a directory, not a database file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValidationError(f"the folder of path {path!r} does not exist (or is not a folder)")
    return path
