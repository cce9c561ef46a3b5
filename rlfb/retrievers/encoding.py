"""``ModelEncoding``: what the dense and SPLADE retrievers share, a lazily loaded model and its caches.

Both encode texts with a sentence-transformers model that loads on the first text not in a cache;
documents go through the model's on-disk document cache, queries through an in-memory cache and the
on-disk query cache (unless ``cache_queries`` is off). Only the call of the model and what its output
becomes (a unit vector, a sparse row) differ: each retriever's ``_encode``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlfb.errors import ValidationError
from rlfb.retrievers.base import check_format_version, read_meta, saved_positive_int
from rlfb.retrievers.cache import EmbeddingCache, Encoding, LRUCache, cached_encode, check_cache_dir, open_side_caches
from rlfb.retrievers.models import LazyModel, saved_model, saved_settings

__all__ = ["ModelEncoding", "saved_arguments"]


class ModelEncoding:
    """A mixin for a retriever that encodes texts with a model: the model, its caches, cached encoding.

    The retriever calls :meth:`_init_encoding` in its constructor and defines ``_encode(texts, side)``
    (``side`` is ``"document"`` or ``"query"``); ``_accept`` refuses a cached encoding the retriever could
    not have written (it is encoded again).
    """

    name: str
    #: Keep query encodings in the on-disk cache (keyed by the query's sha256). An ensemble whose store keeps no
    #: query text (``store_text=False``) turns it off: an encoding can be read back into the question's words.
    cache_queries: bool = True
    _accept: Callable[[Encoding], bool] | None = None

    def _init_encoding(self, model: LazyModel, batch_size: object, cache_dir: str | Path | bool | None,
                       model_key: str | None, query_cache_size: int) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValidationError(f"batch_size must be a positive integer, got {batch_size!r}")
        check_cache_dir(cache_dir)  # here, not at the first encoding: "" would be the working directory
        self.batch_size = batch_size
        self.cache_dir = cache_dir
        self._model_key = model_key  # as given: saved, so that a load keys the cache as this retriever did
        self._model = model
        self._memory = LRUCache(query_cache_size)
        self._doc_cache: EmbeddingCache | None = None
        self._query_cache: EmbeddingCache | None = None
        self._caches_ready = False

    def _encode(self, texts: list[str], side: str) -> list[Any]:  # pragma: no cover - each retriever's own
        raise NotImplementedError

    @property
    def model(self) -> Any:
        """The model (loaded on first access)."""
        return self._model.get()

    @property
    def cache_key(self) -> str | None:
        """The key its encodings are cached under on disk (kind-prefixed); ``None`` for a model of unknown origin."""
        return self._model.key

    @property
    def model_name(self) -> str | None:
        """Name or path of the model; ``None`` for the bundled default."""
        return self._model.name

    def _caches(self) -> tuple[EmbeddingCache | None, EmbeddingCache | None]:
        if not self._caches_ready:
            self._doc_cache, self._query_cache = open_side_caches(self.cache_dir, self._model.key)
            self._caches_ready = True
        return self._doc_cache, self._query_cache

    def _model_call(self, side: str) -> Callable[..., Any]:
        """The model's encoder for ``side`` (``encode_document``, ``encode_query``, else ``encode``)."""
        model = self.model
        return getattr(model, f"encode_{side}", None) or model.encode

    def _cached_documents(self, texts: Sequence[str], *, show_progress: bool = False,
                          wait: float | None = None) -> list[Any]:
        """Document-side encodings of ``texts`` (checked already), through the disk cache."""
        disk, _ = self._caches()
        return cached_encode(texts, lambda b: self._encode(b, "document"), disk=disk, show_progress=show_progress,
                             desc=f"{self.name} documents", accept=self._accept, wait=wait)

    def _cached_queries(self, queries: Sequence[str], *, show_progress: bool = False) -> list[Any]:
        """Query-side encodings of ``queries`` (checked already), through the memory and the disk cache."""
        _, disk = self._caches()
        disk = disk if self.cache_queries else None  # off for a store that keeps no query text
        return cached_encode(queries, lambda b: self._encode(b, "query"), disk=disk, memory=self._memory,
                             show_progress=show_progress, desc=f"{self.name} queries", accept=self._accept)


def saved_arguments(path: Path, kind: str, format_version: int, default_batch_size: int, *, model: Any,
                    cache_dir: Any, device: Any, model_key: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A saved model retriever's ``meta.json`` (its kind and format version checked) and the constructor
    arguments it gives: the saved model unless ``model`` is given, the batch size, and the cache folder, device
    and model key it was built with, each unless given here (``AS_SAVED``: not given)."""
    meta = read_meta(path, kind)
    meta_file = path / "meta.json"
    check_format_version(meta, format_version, meta_file)
    batch_size = saved_positive_int(meta, "batch_size", default_batch_size, meta_file)
    model = saved_model(meta, model, path)
    cache_dir, device, model_key = saved_settings(
        meta, meta_file, cache_dir=cache_dir, device=device, model_key=model_key
    )
    return meta, {"model": model, "batch_size": batch_size, "cache_dir": cache_dir, "device": device,
                  "model_key": model_key}
