"""Opening the feedback store, and what a serialised adapter must be given again; nothing else lives here.

LlamaIndex rebuilds a component from its dump (``Cls.from_dict(obj.to_dict())``,
``model_validate``, unpickling) by calling its constructor with the dumped
fields. A store on an SQLite file travels as ``store_path``; an in-memory store,
a corpus or an ensemble cannot, so the dump names them in ``not_serialised`` and
the rebuild raises until they are passed again (``from_dict(data, index=index)``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from rlfb.errors import ValidationError
from rlfb.runs import same_store

__all__ = ["MEMORY", "open_store", "store_path_of", "check_given_again"]

#: The ``store_path`` of an in-memory store (it cannot be reopened).
MEMORY = ":memory:"


def store_path_of(store: Any) -> str:
    """The SQLite file of ``store`` as an absolute path, or :data:`MEMORY`.

    Absolute, so that a dump rebuilt from another working directory reopens this file, not a new empty one.
    """
    path = str(getattr(store, "path", "") or MEMORY)
    return MEMORY if path in (MEMORY, "") else os.path.abspath(path)


def open_store(store: Any, store_path: str | os.PathLike[str] | None) -> Any:
    """The :class:`rlfb.store.FeedbackStore` for ``store`` (a path, a store or ``None``) or ``store_path``.

    ``store_path`` is the dumped form of a store: the file to reopen. Given with
    ``store``, both must name the same file (a rebuild given ``store=`` for an
    in-memory store passes ``store_path=":memory:"`` along, which any store satisfies).
    Returns ``None`` when neither is given.
    """
    from rlfb.store import FeedbackStore, as_store

    if store_path is not None and not isinstance(store_path, (str, os.PathLike)):
        raise ValidationError(f"store_path must be a path, got {type(store_path).__name__}")
    store = as_store(store)
    if store_path is None or os.fspath(store_path) == MEMORY:
        return store
    if store is None:
        return FeedbackStore(os.fspath(store_path))
    if not same_store(store, store_path):
        raise ValidationError(
            f"store ({store_path_of(store)!r}) and store_path ({os.fspath(store_path)!r}) name different stores"
        )
    return store


def check_given_again(
    owner: str, not_serialised: Sequence[str], given: Mapping[str, bool], *, from_dict: bool = True
) -> None:
    """Raise :class:`ValidationError` naming each argument of ``not_serialised`` that is not ``given`` again.

    ``from_dict``: the error shows a ``from_dict`` rebuild (a LlamaIndex component) rather than ``Cls(**data)``.
    """
    if isinstance(not_serialised, str):
        raise ValidationError("not_serialised must be a list of argument names, not a str")
    unknown = [n for n in not_serialised if n not in given]
    if unknown:
        raise ValidationError(f"not_serialised names unknown arguments of {owner}: {unknown}")
    missing = [n for n in not_serialised if not given[n]]
    if missing:
        args = ", ".join(f"{n}=" for n in missing)
        rebuild = f"{owner}.from_dict(data, {missing[0]}=...)" if from_dict else f"{owner}(**data, {missing[0]}=...)"
        raise ValidationError(
            f"this {owner} was serialised without {', '.join(missing)} (an in-memory store, a corpus or an "
            f"object cannot be dumped): pass {args} again, e.g. {rebuild}"
        )
