"""Lossless text and JSON for SQLite columns.

Every ``str`` round-trips exactly: one that UTF-8 cannot encode (a lone
surrogate) is stored as the BLOB of its ``surrogatepass`` bytes and decoded back
on read. JSON columns do the same with their text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, NonFiniteValueError, ValidationError


def _enc(s: str | None) -> str | bytes | None:
    """A str as SQLite can store it: itself, or the BLOB of its surrogatepass UTF-8 bytes."""
    if s is None or s.isascii():
        return s
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogatepass")
    return s


def _dec(v: Any) -> Any:
    """A stored str back: a BLOB is the surrogatepass UTF-8 of one (:func:`_enc`). One that is not was written
    outside rlfb, and raises :class:`CorruptStateError`, not a bare ``UnicodeDecodeError``.

    >>> _dec(b"\\xed\\xa0\\x80") == "\\ud800"
    True
    >>> _dec(b"\\xff\\x00")
    Traceback (most recent call last):
    rlfb.errors.CorruptStateError: a text value in the store is damaged: b'\\xff\\x00' is not text rlfb wrote
    """
    if not isinstance(v, bytes):
        return v
    try:
        return v.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise CorruptStateError(f"a text value in the store is damaged: {v[:40]!r} is not text rlfb wrote") from None


def _decode_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _dec(v) for k, v in row.items()}


def query_hash(text: str) -> str:
    """sha256 hex digest of a query (surrogate-safe); what ``store_text=False`` keeps.

    >>> query_hash("aurora")[:12]
    '9b89025ce7a6'
    """
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _json_default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


# Built once: json.dumps with non-default arguments builds a new encoder on every call.
_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_json_default)


def _dumps(obj: Any, name: str, *, str_keys: bool = False) -> str | bytes:
    """JSON text for a column: a str, or (with lone surrogates) the BLOB of its surrogatepass bytes.

    Lone surrogates are kept as raw characters, not ``\\uXXXX`` escapes: JSON
    would merge an escaped high+low pair into one character on the way back.
    With ``str_keys``, a mapping at any depth with a key that is not a str
    raises :class:`ValidationError`.
    """
    try:
        s = _JSON.encode(obj)
    except ValueError as exc:
        if "Circular" in str(exc):
            raise ValidationError(f"{name} contains a circular reference") from exc
        if "float" in str(exc):  # allow_nan=False: "Out of range float values are not JSON compliant"
            raise NonFiniteValueError(f"{name} contains NaN or infinity") from exc
        # an int of more digits than Python converts to text (10**5000) was named NaN or infinity
        raise ValidationError(f"{name} cannot be stored as JSON: {exc}") from exc
    except TypeError as exc:
        raise ValidationError(f"{name} is not JSON-serialisable: {exc}") from exc
    except RecursionError as exc:
        raise ValidationError(f"{name} is nested too deeply to store") from exc
    if str_keys:
        _check_str_keys(obj, name)
    return _enc(s)  # type: ignore[return-value]


#: the deepest nesting a caller's mapping (event metadata, features) may have: what is written must read back,
#: and json.loads recurses, so 950 levels accepted at a shallow call stack read back as "damaged" from a
#: framework's callback 100 frames deeper
MAX_DEPTH = 200


def _check_str_keys(obj: Any, name: str) -> None:
    """Refuse a key that is not a str, at any depth: JSON writes 1, None or True as "1", "null", "true", so
    the value reads back under another key, or is lost where a str key of that name is there too.

    Nesting deeper than :data:`MAX_DEPTH` is refused too. Called once the object encoded, so it holds no
    cycle; a stack, not recursion, for deep nesting.
    """
    stack: list[tuple[Any, str, int]] = [(obj, name, 1)]
    while stack:
        o, where, depth = stack.pop()
        if isinstance(o, (Mapping, list, tuple, set, frozenset)) and depth > MAX_DEPTH:
            raise ValidationError(f"{name} is nested deeper than {MAX_DEPTH} levels")
        if isinstance(o, Mapping):
            for k, v in o.items():
                if not isinstance(k, str):
                    raise ValidationError(f"{where} keys must be str, got {type(k).__name__} {k!r:.80}")
                stack.append((v, f"{where}[{k!r:.40}]", depth + 1))
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(o))


def _loads(s: Any, where: str = "") -> Any:
    """A JSON column's value; a column damaged outside rlfb is a :class:`CorruptStateError`, not a raw error,
    naming ``where`` it is (``events.metadata of event 'e1'``).

    >>> _loads('[1', "events.metadata of event 'e1'")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: a stored JSON column is damaged (events.metadata of event 'e1'): JSONDecodeError(...)
    """
    if s is None:
        return None
    try:
        return json.loads(_dec(s))
    except (ValueError, TypeError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        at = f" ({where})" if where else ""
        raise CorruptStateError(f"a stored JSON column is damaged{at}: {exc!r}"[:400]) from exc


def _jsonl(obj: Any) -> bytes:
    s = json.dumps(obj, ensure_ascii=False, allow_nan=False, default=_json_default)
    try:
        return s.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        s = json.dumps(obj, ensure_ascii=True, allow_nan=False, default=_json_default)
        return s.encode("ascii") + b"\n"
