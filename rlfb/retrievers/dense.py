"""Dense retrieval with sentence-transformers: cosine similarity of normalised embeddings.

Search is exact: one matrix product of the query embeddings with every
document embedding, then :func:`~rlfb.retrievers.base.top_k`. Document and
query embeddings are cached on disk (:class:`~rlfb.retrievers.cache.EmbeddingCache`),
query embeddings also in memory, so neither a restart nor a repeated query
re-encodes anything.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError
from rlfb.retrievers.base import (
    ARRAY_HEADER_ERRORS,
    ChunkTable,
    CorpusRetriever,
    array_problem,
    as_table,
    check_query,
    check_texts,
    kept_then_new,
    model_text,
    reused_rows,
)
from rlfb.retrievers.encoding import ModelEncoding, saved_arguments
from rlfb.retrievers.models import (
    AS_SAVED,
    AsSaved,
    LazyModel,
    default_dense_model,
    encoded_by_another_model,
    load_sentence_transformer,
    model_meta,
)
from rlfb.saved_folder import reads_whole
from rlfb.types import Chunk

__all__ = ["DenseRetriever"]

_FORMAT_VERSION = 1
# every vector is normalised before it is cached or saved, so a norm further than this from 1 is damage
# (float32 rounding leaves ~1e-7); 0 is allowed: a zero vector stays zero when normalised
_NORM_TOLERANCE = 1e-3
#: what ``np.load`` of a damaged ``embeddings.npy`` can raise (named here, annotated: mypy does not take a tuple
#: display with ``*`` in an ``except``)
_EMBEDDINGS_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, EOFError, *ARRAY_HEADER_ERRORS)


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0).astype(np.float32)


def _off_unit(norms: np.ndarray) -> np.ndarray:
    """Where ``norms`` are neither 1 (within :data:`_NORM_TOLERANCE`) nor 0: not a vector :func:`_normalise` made."""
    return (np.abs(norms - 1.0) > _NORM_TOLERANCE) & (norms != 0)


def _cacheable(vector: object) -> bool:
    """Whether a cached encoding can be a dense one this retriever wrote (1-D, unit norm or zero).

    A cached row is only checked to be finite: a damaged one of norm 1e18 would give
    cosine scores of 1e17 and win every query, so it is a miss and is encoded again.
    """
    if not isinstance(vector, np.ndarray) or vector.ndim != 1:
        return False
    v = vector.astype(np.float64)
    return not _off_unit(np.sqrt(v @ v))


def _check_embeddings(file: Path, embeddings: np.ndarray, n_docs: int) -> None:
    """Raise :class:`CorruptStateError` unless ``embeddings`` is a finite float matrix of unit rows, one per chunk.

    A NaN or infinite value would not fail anywhere: every score of its chunk would be NaN,
    ranked last and reported as no score, so the damage would go unseen; nor would a row of
    another norm (every row is saved normalised), whose cosine scores would be off scale and
    win or lose every query. Strings or integers would fail (or be taken as numbers) only at
    the conversion to float32.
    """
    if embeddings.ndim != 2 or embeddings.dtype.kind != "f":
        raise CorruptStateError(f"{file}: expected a 2-D float array, got a {embeddings.ndim}-D {embeddings.dtype} one")
    if embeddings.shape[0] != n_docs:
        raise CorruptStateError(f"{file}: {embeddings.shape[0]} embeddings for {n_docs} chunks")
    finite = np.isfinite(embeddings).all(axis=1)
    if not finite.all():
        rows = np.flatnonzero(~finite)
        raise CorruptStateError(f"{file}: rows {rows[:5].tolist()} ({rows.size} in all) hold NaN or infinite values")
    # row norms without a float64 copy of the whole index (four times its size at load)
    off = _off_unit(np.sqrt(np.einsum("ij,ij->i", embeddings, embeddings, dtype=np.float64)))
    if off.any():
        rows = np.flatnonzero(off)
        raise CorruptStateError(
            f"{file}: rows {rows[:5].tolist()} ({rows.size} in all) are not unit vectors, as every saved row is"
        )


class DenseRetriever(ModelEncoding, CorpusRetriever):
    """Cosine similarity over sentence-transformers embeddings.

    Parameters
    ----------
    model
        ``None`` for the bundled all-MiniLM-L6-v2 (works with ``HF_HUB_OFFLINE=1``),
        any sentence-transformers name or local path, or a loaded ``SentenceTransformer``
        (not saved by name: pass it again to :meth:`load`). Loaded lazily, on the first text
        that is not in the cache.
    batch_size
        Encoding batch size.
    cache_dir
        Folder of the embedding cache; ``None`` uses ``$RLFB_CACHE_DIR`` or
        ``~/.cache/rlfb``; ``False`` turns the disk cache off. An empty string is refused
        (it would be the working directory).
    device
        Torch device for a model loaded by name.
    model_key
        Cache key of the model; derived from the model's files when omitted. A model
        passed already loaded is disk-cached only under a key given here: its settings
        or weights may differ from the folder it came from.
    query_cache_size
        Query embeddings kept in memory.

    Notes
    -----
    Scores are cosine similarities in [-1, 1], computed in float32 and returned as float64.
    """

    name = "dense"
    #: it scores by a query embedding: the ensemble averages its scores over a question's embedding strings
    #: (LlamaIndex's ``custom_embedding_strs``) where some are given
    embeds_queries = True
    _accept = staticmethod(_cacheable)

    def __init__(
        self,
        model: Any = None,
        batch_size: int = 64,
        cache_dir: str | Path | bool | None = None,
        device: str | None = "cpu",
        *,
        model_key: str | None = None,
        query_cache_size: int = 10_000,
    ) -> None:
        self.device = device
        lazy = LazyModel(
            model, kind="dense", loader=load_sentence_transformer, default=default_dense_model, device=device,
            key=model_key,
        )
        self._init_encoding(lazy, batch_size, cache_dir, model_key, query_cache_size)
        self._table: ChunkTable | None = None
        self._embeddings: np.ndarray = np.zeros((0, 0), dtype=np.float32)

    @property
    def embeddings(self) -> np.ndarray:
        """Normalised document embeddings, ``(len(self), dim)`` float32, aligned with :attr:`ids`."""
        return self._embeddings

    def vectors(self, chunk_ids: Sequence[str]) -> np.ndarray:
        """The normalised embeddings of ``chunk_ids``, ``(len(chunk_ids), dim)`` float32, a zero row for an id
        that is not indexed."""
        row = self._require_table().row
        out = np.zeros((len(chunk_ids), self._embeddings.shape[1]), dtype=np.float32)
        at = [i for i, c in enumerate(chunk_ids) if c in row]
        if at:
            out[at] = self._embeddings[[row[chunk_ids[i]] for i in at]]
        return out

    def _encode(self, texts: list[str], side: str) -> list[np.ndarray]:
        out = self._model_call(side)(
            [model_text(t) for t in texts],
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return list(_normalise(out))

    def encode_documents(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """Normalised document-side embeddings of ``texts``, ``(n, dim)`` float32 (disk-cached)."""
        return self._stack(self._cached_documents(check_texts(texts), show_progress=show_progress))

    def encode_queries(self, queries: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """Normalised query-side embeddings, ``(n, dim)`` float32 (cached in memory and on disk)."""
        return self._stack(self._cached_queries(check_texts(queries, "queries"), show_progress=show_progress))

    def _stack(self, vectors: list[np.ndarray]) -> np.ndarray:
        if not vectors:
            dim = self._embeddings.shape[1] if self._embeddings.size else 0
            return np.zeros((0, dim), dtype=np.float32)
        dims = {v.shape[0] for v in vectors}
        if len(dims) != 1:
            raise CorruptStateError(
                f"embeddings of different sizes {sorted(dims)}: is the cache shared by two models?"
            )
        return np.vstack(vectors).astype(np.float32, copy=False)

    # -- Retriever ----------------------------------------------------------------------------------
    def index(self, chunks: Sequence[Chunk], *, show_progress: bool = False) -> DenseRetriever:
        """Embed ``chunks`` (texts already in the cache are not re-encoded) and return ``self``."""
        table = ChunkTable(chunks)
        self._embeddings = self.encode_documents(table.texts, show_progress=show_progress)
        self._table = table
        return self

    def updated(self, chunks: Sequence[Chunk] | ChunkTable, *, show_progress: bool = False) -> DenseRetriever:
        """A retriever over ``chunks`` that keeps this one's vectors of unchanged chunks; ``self`` is unchanged."""
        if self._table is None:
            return super().updated(chunks, show_progress=show_progress)  # indexed afresh
        table = as_table(chunks)
        src = reused_rows(self._table, table)
        kept, missing, _ = kept_then_new(src)
        fresh = self.encode_documents([table.texts[i] for i in missing], show_progress=show_progress)
        dim = self._embeddings.shape[1]
        if missing.size and fresh.shape[1] != dim:
            raise CorruptStateError(f"new embeddings have {fresh.shape[1]} dimensions, the index {dim}")
        embeddings = np.empty((len(table), dim), dtype=np.float32)
        if np.array_equal(src[kept], kept) and (kept.size == 0 or kept[-1] == kept.size - 1):
            embeddings[: kept.size] = self._embeddings[: kept.size]  # chunks appended: one block copy
        else:
            embeddings[kept] = self._embeddings[src[kept]]
        embeddings[missing] = fresh
        new = copy.copy(self)
        new._embeddings, new._table = embeddings, table
        return new

    def score_all_batch(self, queries: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """Cosine similarity of every chunk to each query, ``(len(queries), len(self))`` float64."""
        queries = check_texts(queries, "queries")
        table = self._require_table()
        if not queries:
            return np.zeros((0, len(table)), dtype=np.float64)
        q = self.encode_queries(queries, show_progress=show_progress)
        self._check_dim(q)
        return (q @ self._embeddings.T).astype(np.float64)

    def score_texts(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """Cosine similarity of ``query`` to texts outside the index (the texts are encoded as documents)."""
        query = check_query(query)
        texts = check_texts(texts)
        if not texts:
            return np.zeros(0, dtype=np.float64)
        docs = self._stack(self._cached_documents(texts, wait=0.0))  # a search's: it must not wait on the lock
        q = self.encode_queries([query])
        if docs.shape[1] != q.shape[1]:
            raise CorruptStateError(
                f"query embeddings have {q.shape[1]} dimensions, documents {docs.shape[1]}"
            )
        return (docs @ q[0]).astype(np.float64)

    def _check_dim(self, q: np.ndarray) -> None:
        if q.shape[1] != self._embeddings.shape[1]:
            raise CorruptStateError(
                f"query embeddings have {q.shape[1]} dimensions but the index {self._embeddings.shape[1]}: "
                "was it built with another model?"
            )

    # -- persistence --------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write ``embeddings.npy`` (no pickle), the chunks and ``meta.json`` (model name, not weights); whole or
        not at all (:meth:`CorpusRetriever._save_with`)."""
        self._require_table()
        self._save_with(
            path,
            lambda folder: np.save(folder / "embeddings.npy", self._embeddings, allow_pickle=False),
            {
                "format_version": _FORMAT_VERSION,
                **model_meta(self._model, self.cache_dir, self.device, self._model_key),
                "dim": int(self._embeddings.shape[1]),
                "batch_size": self.batch_size,
            },
        )

    @classmethod
    @reads_whole("meta.json")  # again if another process's save is swapped in meanwhile
    def load(
        cls,
        path: str | Path,
        *,
        model: Any = None,
        cache_dir: str | Path | bool | None | AsSaved = AS_SAVED,
        device: str | None | AsSaved = AS_SAVED,
        model_key: str | None = None,
    ) -> DenseRetriever:
        """Read an index written by :meth:`save`; ``model`` overrides the saved model name.

        The model itself is loaded only when a query needs encoding. An index built with a
        model passed in already loaded needs that model again as ``model``: the save names no
        model (the folder it was loaded from may hold other weights). ``cache_dir``, ``device``
        and ``model_key`` default to what the index was built with (the disk cache off or the
        default folder, the device, and a key the caller gave); a value given here overrides it.
        """
        path = Path(path)
        meta, arguments = saved_arguments(path, "dense", _FORMAT_VERSION, 64, model=model, cache_dir=cache_dir,
                                          device=device, model_key=model_key)
        meta_file = path / "meta.json"
        retriever = cls(**arguments)
        file = path / "embeddings.npy"
        try:
            embeddings = np.load(file, allow_pickle=False)
        except _EMBEDDINGS_ERRORS as exc:
            raise CorruptStateError(f"cannot read embeddings from {file}: {array_problem(exc)}") from exc
        table = ChunkTable.load(path)
        _check_embeddings(file, embeddings, len(table))
        if "dim" in meta and meta["dim"] != embeddings.shape[1]:
            # one of the two files was changed after the save: which one is right is unknown
            raise CorruptStateError(f"{meta_file}: dim is {meta['dim']!r}, {file} holds {embeddings.shape[1]}")
        if encoded_by_another_model(meta, retriever.cache_key, path):
            return retriever.index(table.chunks())
        retriever._embeddings = embeddings.astype(np.float32, copy=False)
        retriever._table = table
        return retriever

    def __repr__(self) -> str:
        return f"DenseRetriever(model={self._model.name or 'all-MiniLM-L6-v2'!r}, n_chunks={len(self)})"
