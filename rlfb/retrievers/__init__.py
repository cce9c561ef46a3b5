"""Retrievers: BM25 (bm25s), dense (sentence-transformers) and SPLADE (``SparseEncoder``).

Every retriever scores the whole corpus for a query as one vector aligned with
its ``ids`` (see :mod:`rlfb.retrievers.base`). They are registered by name:

>>> sorted(RETRIEVERS)
['bm25', 'dense', 'splade']
>>> make_retriever("bm25", k1=1.2).k1
1.2

The classes are imported on first use, so ``import rlfb`` imports neither
bm25s nor torch.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.files import folder_path
from rlfb.retrievers.base import ChunkTable, CorpusRetriever, Retriever, load_meta, top_k
from rlfb.types import check_known_options, keyword_options

if TYPE_CHECKING:
    from rlfb.retrievers.bm25 import BM25Retriever
    from rlfb.retrievers.cache import EmbeddingCache
    from rlfb.retrievers.dense import DenseRetriever
    from rlfb.retrievers.splade import SpladeRetriever

__all__ = [
    "Retriever",
    "CorpusRetriever",
    "ChunkTable",
    "top_k",
    "BM25Retriever",
    "DenseRetriever",
    "SpladeRetriever",
    "EmbeddingCache",
    "RETRIEVERS",
    "retriever_names",
    "check_retriever_names",
    "make_retriever",
    "load_retriever",
]

# name -> (module, class); RETRIEVERS resolves these on first access
_REGISTRY: dict[str, tuple[str, str]] = {
    "bm25": ("rlfb.retrievers.bm25", "BM25Retriever"),
    "dense": ("rlfb.retrievers.dense", "DenseRetriever"),
    "splade": ("rlfb.retrievers.splade", "SpladeRetriever"),
}
_LAZY: dict[str, tuple[str, str]] = {cls: (mod, cls) for mod, cls in _REGISTRY.values()}
_LAZY["EmbeddingCache"] = ("rlfb.retrievers.cache", "EmbeddingCache")


def retriever_names() -> list[str]:
    """Names accepted by :func:`make_retriever`."""
    return list(_REGISTRY)


def check_retriever_names(names: Sequence[Any]) -> None:
    """Raise :class:`ValidationError` for the first of ``names`` that names no retriever, or names one again.

    Checked before anything is indexed: a name listed twice used to be refused only after the corpus was
    encoded for it.

    >>> check_retriever_names(["bm25", "dense"])
    >>> check_retriever_names(["dense", "dense"])
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: retriever 'dense' is listed twice
    """
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or name not in _REGISTRY:
            raise ValidationError(f"unknown retriever {name!r}; valid names: {', '.join(_REGISTRY)}")
        if name in seen:
            raise ValidationError(f"retriever {name!r} is listed twice")
        seen.add(name)


def _retriever_class(name: str) -> type[Any]:
    check_retriever_names([name])
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


def make_retriever(name: str, **kwargs: Any) -> Retriever:
    """A new, empty retriever of kind ``name`` (``"bm25"``, ``"dense"``, ``"splade"``).

    >>> make_retriever("colbert")
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: unknown retriever 'colbert'; valid names: bm25, dense, splade
    """
    cls = _retriever_class(name)
    known = keyword_options(cls.__init__)
    if known is not None:  # a bare TypeError ("unexpected keyword argument") escaped `except RlfbError`
        check_known_options(kwargs, known, f"the {name} retriever")
    return cls(**kwargs)  # type: ignore[no-any-return]


def load_retriever(path: str | Path, **kwargs: Any) -> Retriever:
    """Load a saved retriever of any kind: ``meta.json`` names the class; ``kwargs`` go to its ``load``.

    An argument that kind's ``load`` does not take is a :class:`ValidationError` (a BM25 index
    takes ``tokenizer``, a dense or SPLADE one ``model``, ``cache_dir``, ``device``, ``model_key``).
    """
    path = folder_path(path)
    kind = _read_kind(path)
    cls = _retriever_class(kind)
    try:
        inspect.signature(cls.load).bind(path, **kwargs)
    except TypeError as exc:
        raise ValidationError(f"cannot load the {kind} retriever in {path} with {sorted(kwargs)}: {exc}") from None
    return cls.load(path, **kwargs)  # type: ignore[no-any-return]


def _read_kind(path: Path) -> str:
    kind = load_meta(path).get("kind")
    if not isinstance(kind, str) or kind not in _REGISTRY:  # a list or dict there: unhashable, a TypeError
        raise CorruptStateError(
            f"{path / 'meta.json'} names retriever kind {kind!r}; known kinds: {', '.join(_REGISTRY)}"
        )
    return str(kind)


def __getattr__(name: str) -> Any:
    if name == "RETRIEVERS":
        registry = {key: _retriever_class(key) for key in _REGISTRY}
        globals()["RETRIEVERS"] = registry
        return registry
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
