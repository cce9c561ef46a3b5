"""BM25 over `bm25s <https://github.com/xhluca/bm25s>`_'s eager sparse index.

bm25s computes the BM25 weight of every (document, term) pair at index time
and stores them as a sparse documents x vocabulary matrix. Scoring a query is
then a sparse product of that matrix with the query's term counts, so a query
only touches the postings of its own terms.

Default tokenisation: NFC-normalised, lowercase ``\\w+`` tokens, no stemming, no stopwords.
"""

from __future__ import annotations

import copy
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.retrievers.base import (
    ARRAY_HEADER_ERRORS,
    NPZ_ERRORS,
    ChunkTable,
    CorpusRetriever,
    array_problem,
    as_table,
    check_query,
    check_texts,
    kept_then_new,
    read_meta,
    reused_rows,
)
from rlfb.saved_folder import reads_whole
from rlfb.types import Chunk, validate_flag

__all__ = ["BM25Retriever", "bm25_idf", "bm25_tfc", "regex_tokenizer", "METHODS"]

#: BM25 variants whose documents score zero for absent terms (the ones bm25s indexes without extra state)
METHODS = ("robertson", "lucene", "atire")
_FORMAT_VERSION = 1
_COUNTS_FILE = "term_counts.npz"  # optional: a save without it loads, and its first update tokenizes afresh
_DEFAULT_PATTERN = r"\w+"
#: what :meth:`BM25Retriever.load` takes for damage past the caller's own arguments (named here, annotated: mypy
#: does not take a tuple display with ``*`` in an ``except``)
_LOAD_ERRORS: tuple[type[BaseException], ...] = (
    OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, EOFError, *ARRAY_HEADER_ERRORS,
)


def regex_tokenizer(
    pattern: str = _DEFAULT_PATTERN, lowercase: bool = True, *, normalize_unicode: bool = True
) -> Callable[[str], list[str]]:
    """A tokenizer returning the whole matches of ``pattern`` (after NFC normalisation and lowercasing, by default).

    A pattern with groups still yields whole matches: ``re.findall`` would return the groups
    (tuples, or only the first group's text), which are not the tokens the pattern describes.
    NFC normalisation makes one word one token however its accents were typed: ``\\w`` does not
    match a combining accent, so a decomposed (NFD) "résumé" split into "re" and "sume".

    >>> regex_tokenizer()("Solar wind, AURORA!")
    ['solar', 'wind', 'aurora']
    >>> regex_tokenizer(r"([a-z]+)(?:-[a-z]+)*")("state-of-the-art retrieval")
    ['state-of-the-art', 'retrieval']
    >>> regex_tokenizer()("re\u0301sume\u0301") == regex_tokenizer()("r\u00e9sum\u00e9") == ["r\u00e9sum\u00e9"]
    True
    """
    regex = re.compile(pattern)
    whole: Callable[[str], list[str]] = regex.findall  # without groups findall gives whole matches, fastest
    if regex.groups:
        def whole(text: str) -> list[str]:
            return [m.group(0) for m in regex.finditer(text)]
    if normalize_unicode and lowercase:
        return lambda text: whole(unicodedata.normalize("NFC", text).lower())
    if normalize_unicode:
        return lambda text: whole(unicodedata.normalize("NFC", text))
    if lowercase:
        return lambda text: whole(text.lower())
    return whole


def _has_groups(pattern: str) -> bool:
    """Whether a saved pattern has groups (a pattern that does not compile is left to the load to refuse)."""
    try:
        return re.compile(pattern).groups > 0
    except re.error:
        return False


def bm25_idf(df: np.ndarray, n_docs: int, method: str) -> np.ndarray:
    """Inverse document frequency of terms seen in ``df`` of ``n_docs`` documents.

    The variants follow Kamphuis et al. (ECIR 2020) as bm25s implements them;
    ``robertson`` is floored at zero, as in bm25s.

    >>> bm25_idf(np.array([1, 5]), 10, "lucene").round(3).tolist()
    [1.992, 0.693]
    """
    df = np.asarray(df, dtype=np.float64)
    if method == "robertson":
        return np.log(np.maximum((n_docs - df + 0.5) / (df + 0.5), 1.0))
    if method == "lucene":
        return np.log1p((n_docs - df + 0.5) / (df + 0.5))
    if method == "atire":
        return np.log(n_docs / df)
    raise ValidationError(f"unknown BM25 idf method {method!r}; choose from {METHODS}")


def bm25_tfc(
    tf: np.ndarray, doc_len: np.ndarray, avg_len: float, k1: float, b: float, method: str
) -> np.ndarray:
    """Term-frequency component of BM25 (Kamphuis et al., ECIR 2020); 0 where ``tf`` is 0.

    An absent term contributes nothing, as in the index (which stores only present terms):
    the formula alone would give 0/0 = NaN there when the length norm is 0 (``k1=0``, or
    ``b=1`` and an empty text).

    >>> float(bm25_tfc(np.array(2.0), np.array(10.0), 10.0, 1.5, 0.75, "atire"))
    1.4285714285714286
    >>> bm25_tfc(np.array([0.0, 3.0]), np.array([0.0, 3.0]), 2.0, 0.0, 0.75, "lucene").tolist()
    [0.0, 1.0]
    """
    tf = np.asarray(tf, dtype=np.float64)
    norm = k1 * (1.0 - b + b * np.asarray(doc_len, dtype=np.float64) / avg_len)
    with np.errstate(invalid="ignore", divide="ignore"):  # the 0/0 cells are replaced below
        if method in ("robertson", "lucene"):
            tfc = tf / (norm + tf)
        elif method == "atire":
            tfc = tf * (k1 + 1.0) / (tf + norm)
        else:
            raise ValidationError(f"unknown BM25 method {method!r}; choose from {METHODS}")
    return np.where(tf == 0, 0.0, tfc)


class BM25Retriever(CorpusRetriever):
    """Okapi BM25 over bm25s.

    Parameters
    ----------
    k1, b
        BM25 saturation and length normalisation.
    method
        Term-frequency variant: ``"lucene"`` (default), ``"robertson"`` or ``"atire"``.
    tokenizer
        A regex pattern (its whole matches are the tokens, groups or not; saved with the index) or a
        callable ``str -> list[str]`` (not saved: pass it again to :meth:`load`, or through
        ``FeedbackEnsemble.load(path, retriever_options={"bm25": {"tokenizer": ...}})``).
    idf_method
        IDF variant; ``None`` uses ``method``. ``method="atire", idf_method="robertson"``
        reproduces ``rank_bm25.BM25Okapi`` (with its ``epsilon=0``).
    lowercase
        Lowercase texts before matching a pattern tokenizer.
    normalize_unicode
        NFC-normalise texts before matching a pattern tokenizer (saved with the index), so that a word
        matches whether its accents were typed composed or decomposed: ``\\w+`` stops at a combining
        accent. An index saved by an older rlfb, which did not normalise, loads without it. Words of scripts
        whose vowel signs stay combining marks in NFC (Devanagari, Tamil) still split at those signs under
        the default pattern; pass a ``tokenizer`` pattern or callable of your own for them. A callable
        tokenizer is used as given, not normalised.

    Examples
    --------
    >>> from rlfb.types import make_chunks
    >>> bm25 = BM25Retriever().index(make_chunks(
    ...     ["the aurora and the solar wind", "baking sourdough bread", "solar panels on roofs"],
    ...     ids=["aurora", "bread", "panels"]))
    >>> bm25.search("what causes an aurora?", k=1)
    [('aurora', 0.334...)]
    >>> bm25.score_all("solar wind").round(3).tolist()
    [0.495, 0.0, 0.195]
    >>> bm25.score_texts("solar wind", ["solar wind", "the aurora and the solar wind"]).round(3).tolist()
    [0.766, 0.495]
    """

    name = "bm25"

    def __init__(
        self,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        tokenizer: str | Callable[[str], list[str]] = _DEFAULT_PATTERN,
        *,
        idf_method: str | None = None,
        lowercase: bool = True,
        normalize_unicode: bool = True,
    ) -> None:
        if not (isinstance(k1, (int, float)) and math.isfinite(k1) and k1 >= 0):
            raise ValidationError(f"k1 must be a finite number >= 0, got {k1!r}")
        if not (isinstance(b, (int, float)) and 0.0 <= b <= 1.0):
            raise ValidationError(f"b must be in [0, 1], got {b!r}")
        if method not in METHODS:
            raise ValidationError(f"unknown BM25 method {method!r}; choose from {METHODS}")
        if idf_method is not None and idf_method not in METHODS:
            raise ValidationError(f"unknown BM25 idf method {idf_method!r}; choose from {METHODS}")
        normalize_unicode = validate_flag(normalize_unicode, "normalize_unicode")
        if isinstance(tokenizer, str):
            try:
                self._tokenize = regex_tokenizer(tokenizer, lowercase, normalize_unicode=normalize_unicode)
            except re.error as exc:
                raise ValidationError(f"invalid tokenizer pattern {tokenizer!r}: {exc}") from exc
        elif callable(tokenizer):
            self._tokenize = tokenizer
        else:
            raise ValidationError("tokenizer must be a regex pattern or a callable str -> list[str]")
        self.k1 = float(k1)
        self.b = float(b)
        self.method = method
        self.idf_method = idf_method or method
        self.tokenizer = tokenizer
        self.lowercase = bool(lowercase)
        self.normalize_unicode = normalize_unicode
        self._table: ChunkTable | None = None
        self._bm25: Any = None  # bm25s.BM25
        self._vocab: dict[str, int] = {}
        self._matrix_t: Any = None  # scipy CSR, vocabulary x documents
        self._idf_outside: np.ndarray = np.zeros(0)  # the IDF score_texts uses: no term at zero
        self._idf_unseen = 0.0
        self._avg_len = 0.0
        self._counts: Any = None  # scipy CSR, documents x vocabulary term counts, kept for updated()

    # -- indexing -----------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[str]:
        """The tokens this retriever sees in ``text``."""
        return list(self._tokenize(text))

    def index(self, chunks: Sequence[Chunk], *, show_progress: bool = False) -> BM25Retriever:
        """Build the index over ``chunks`` (replacing any previous one) and return ``self``."""
        import bm25s

        table = ChunkTable(chunks)
        corpus_tokens = [self.tokenize(t) for t in table.texts]
        vocab: dict[str, int] = {}
        token_ids = [[vocab.setdefault(tok, len(vocab)) for tok in toks] for toks in corpus_tokens]
        if not vocab:  # bm25s needs one term; a never-matching placeholder keeps every score at 0
            vocab[""] = 0
        model = bm25s.BM25(
            k1=self.k1,
            b=self.b,
            method=self.method,
            idf_method=self.idf_method,
            dtype="float64",
            backend="numpy",
        )
        with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 length norm when every text is empty
            model.scores = model.build_index_from_ids(
                unique_token_ids=list(range(len(vocab))),
                corpus_token_ids=token_ids,
                show_progress=show_progress,
            )
        model.vocab_dict = vocab
        model.unique_token_ids_set = set(vocab.values())
        self._bm25 = model
        self._table = table
        self._avg_len = float(np.mean([len(t) for t in token_ids])) if token_ids else 0.0
        self._counts = _term_counts(token_ids, len(vocab))
        self._finish()
        return self

    def updated(self, chunks: Sequence[Chunk] | ChunkTable, *, show_progress: bool = False) -> BM25Retriever:
        """A retriever over ``chunks`` that tokenizes only new or changed texts; ``self`` is unchanged.

        The term counts of unchanged chunks are reused and every BM25 weight is computed
        again from them (IDF and average length change with the corpus), with
        :func:`bm25_idf` and :func:`bm25_tfc` over the sparse matrix: the same scores as
        :meth:`index` on the same chunks. :meth:`save` writes the counts too; an index
        saved without them (by rlfb before they were saved) is indexed afresh.
        """
        import scipy.sparse as sp

        if self._counts is None or self._table is None:
            return super().updated(chunks, show_progress=show_progress)  # indexed afresh
        table = as_table(chunks)
        src = reused_rows(self._table, table)
        kept, missing, order = kept_then_new(src)
        vocab = dict(self._vocab)  # new terms extend a copy; terms no chunk holds any more keep their column
        token_ids = [[vocab.setdefault(tok, len(vocab)) for tok in self.tokenize(table.texts[i])] for i in missing]
        old = self._counts[src[kept]]
        old.resize((kept.size, len(vocab)))
        stacked = sp.vstack([old, _term_counts(token_ids, len(vocab))], format="csr")  # kept rows, then new
        new = copy.copy(self)
        new._build(stacked[order], vocab, table)
        return new

    def _build(self, counts: Any, vocab: dict[str, int], table: ChunkTable) -> None:
        """The bm25s arrays from documents x vocabulary term counts, vectorised."""
        import bm25s

        n_docs = counts.shape[0]
        doc_len = np.asarray(counts.sum(axis=1), dtype=np.float64).ravel()
        avg_len = float(doc_len.mean()) if n_docs else 0.0
        by_term = counts.tocsc()
        by_term.sort_indices()
        df = np.diff(by_term.indptr)
        term = np.repeat(np.arange(len(vocab)), df)
        with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 length norm when every text is empty
            tfc = bm25_tfc(by_term.data, doc_len[by_term.indices], avg_len, self.k1, self.b, self.method)
        weights = bm25_idf(np.maximum(df, 1), n_docs, self.idf_method)[term] * tfc
        model = bm25s.BM25(k1=self.k1, b=self.b, method=self.method, idf_method=self.idf_method,
                           dtype="float64", backend="numpy")
        model.scores = {"data": weights.astype(np.float64), "indices": by_term.indices.astype(np.int32),
                        "indptr": by_term.indptr.astype(np.int64), "num_docs": n_docs}
        model.vocab_dict = vocab
        model.unique_token_ids_set = set(vocab.values())
        model.nonoccurrence_array = None  # as bm25s leaves it for these methods (absent terms score zero)
        self._bm25, self._table, self._avg_len, self._counts = model, table, avg_len, counts
        self._finish()

    def _finish(self) -> None:
        """Derive the query-time structures from the bm25s arrays."""
        import scipy.sparse as sp

        scores = self._bm25.scores
        n_docs, n_vocab = int(scores["num_docs"]), len(self._bm25.vocab_dict)
        data = np.asarray(scores["data"], dtype=np.float64)
        indices = np.asarray(scores["indices"])
        indptr = np.asarray(scores["indptr"])
        if indptr.shape[0] != n_vocab + 1:
            raise CorruptStateError(f"BM25 index has {indptr.shape[0] - 1} term columns but {n_vocab} terms")
        # bm25s stores documents x vocabulary in CSC; its transpose is vocabulary x documents in CSR
        self._matrix_t = sp.csr_matrix((data, indices, indptr), shape=(n_vocab, n_docs))
        self._vocab = self._bm25.vocab_dict
        df = np.diff(indptr)
        # a text outside the index may hold words no indexed chunk does (any more): each counts as the index's
        # rarest, in one chunk of the index, so a new chunk's own words (a product code, a new name) still match
        self._idf_outside = bm25_idf(np.maximum(df, 1), max(n_docs, 1), self.idf_method)
        self._idf_unseen = float(bm25_idf(np.ones(1), max(n_docs, 1), self.idf_method)[0])

    # -- scoring ------------------------------------------------------------------------------------
    def _query_matrix(self, queries: list[str]) -> Any:
        import scipy.sparse as sp

        rows, cols = [], []
        for i, q in enumerate(queries):
            ids = [self._vocab[t] for t in self.tokenize(check_query(q)) if t in self._vocab]
            rows.extend([i] * len(ids))
            cols.extend(ids)
        data = np.ones(len(cols), dtype=np.float64)
        # duplicates are summed: a repeated query term counts twice, as in rank_bm25 and bm25s
        return sp.csr_matrix((data, (rows, cols)), shape=(len(queries), len(self._vocab)))

    def score_all_batch(self, queries: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """BM25 scores of every chunk for each query, shape ``(len(queries), len(self))``, float64."""
        queries = check_texts(queries, "queries")
        table = self._require_table()
        if not queries:
            return np.zeros((0, len(table)), dtype=np.float64)
        n_docs = len(table)
        if len(queries) == 1:  # the common case: sum the query terms' postings (bm25s's eager scoring)
            return self._score_postings(queries[0], n_docs)[None, :]
        product = self._query_matrix(queries) @ self._matrix_t  # only the postings of query terms
        return np.asarray(product.toarray(), dtype=np.float64)

    def _score_postings(self, query: str, n_docs: int) -> np.ndarray:
        """One query's scores: its terms' rows of the vocabulary x documents matrix, summed by bincount.

        A repeated query term counts twice, as in the batched product, rank_bm25 and bm25s.
        """
        m = self._matrix_t
        rows = [self._vocab[t] for t in self.tokenize(check_query(query)) if t in self._vocab]
        if not rows:
            return np.zeros(n_docs, dtype=np.float64)
        spans = [(m.indptr[r], m.indptr[r + 1]) for r in rows]
        docs = np.concatenate([m.indices[a:b] for a, b in spans])
        weights = np.concatenate([m.data[a:b] for a, b in spans]).astype(np.float64)
        # float64 even when every row is empty (a term deleted chunks held): bincount would give int64
        return np.bincount(docs, weights=weights, minlength=n_docs).astype(np.float64, copy=False)

    def score_texts(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """BM25 scores of texts outside the index, with the index's IDF and average length.

        A text equal to an indexed chunk's text gets that chunk's score. A query word no indexed chunk holds
        (a new product code in a chunk added since) is taken to be in one chunk of the index, as rare as its
        rarest words, so that a text holding it scores by it; a text's score does not depend on the others.
        """
        query = check_query(query)
        texts = check_texts(texts)
        self._require_table()
        q_counts = Counter(self.tokenize(query))
        if not texts:
            return np.zeros(0, dtype=np.float64)
        terms = list(q_counts)
        tokenized = [Counter(self.tokenize(t)) for t in texts]
        doc_len = np.array([sum(c.values()) for c in tokenized], dtype=np.float64)
        if not terms:
            return np.zeros(len(texts), dtype=np.float64)
        tf = np.array([[c.get(term, 0) for term in terms] for c in tokenized], dtype=np.float64)
        idf = np.array([self._idf_unseen if t not in self._vocab else self._idf_outside[self._vocab[t]]
                        for t in terms], dtype=np.float64)
        weight = np.array([q_counts[t] for t in terms], dtype=np.float64)
        avg = self._avg_len if self._avg_len > 0 else 1.0
        tfc = bm25_tfc(tf, doc_len[:, None], avg, self.k1, self.b, self.method)
        return (tfc * idf) @ weight

    # -- persistence --------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the bm25s arrays (``.npy``, JSON vocabulary, no pickle), the term counts that
        :meth:`updated` reuses (``term_counts.npz``), chunks and ``meta.json``; whole or not at all
        (:meth:`CorpusRetriever._save_with`)."""
        table = self._require_table()

        def write_index(folder: Path) -> None:
            self._bm25.save(folder / "bm25s", allow_pickle=False, show_progress=False)
            if self._counts is not None:  # loaded from a save without counts: none are written
                c = self._counts
                np.savez(folder / _COUNTS_FILE, data=c.data, indices=c.indices, indptr=c.indptr,
                         shape=np.array(c.shape, dtype=np.int64))

        self._save_with(path, write_index, {
            "format_version": _FORMAT_VERSION,
            "k1": self.k1,
            "b": self.b,
            "method": self.method,
            "idf_method": self.idf_method,
            "tokenizer": self.tokenizer if isinstance(self.tokenizer, str) else None,
            "lowercase": self.lowercase,
            "unicode_nfc": self.normalize_unicode,
            "whole_matches": True,  # a pattern's tokens are its whole matches (older saves: its groups)
            "avg_doc_len": self._avg_len,
            "n_docs": len(table),
        })

    @classmethod
    @reads_whole("meta.json")  # again if another process's save is swapped in meanwhile
    def load(cls, path: str | Path, *, tokenizer: Callable[[str], list[str]] | None = None) -> BM25Retriever:
        """Read an index written by :meth:`save`.

        ``tokenizer`` is required when the index was built with a callable tokenizer.
        Any damaged or inconsistent file raises :class:`CorruptStateError` naming it.
        """
        path = Path(path)
        if tokenizer is not None and not callable(tokenizer):
            raise ValidationError(f"tokenizer must be a callable str -> list[str], got {type(tokenizer).__name__}")
        meta = read_meta(path, "bm25")
        if not isinstance(meta.get("tokenizer", 0), (str, type(None))):
            # every save writes the key (null for a callable tokenizer): missing or of another type, it was damaged
            raise CorruptStateError(f"{path / 'meta.json'}: 'tokenizer' must be a pattern or null, "
                                    f"got {meta.get('tokenizer', 'nothing')!r}")
        if meta["tokenizer"] is None and tokenizer is None:
            raise ValidationError(
                f"{path} was indexed with a custom tokenizer: pass it as load(path, tokenizer=...), or for an "
                "ensemble FeedbackEnsemble.load(path, retriever_options={'bm25': {'tokenizer': ...}})"
            )
        pattern = meta.get("tokenizer")
        if tokenizer is None and isinstance(pattern, str) and not meta.get("whole_matches", False) \
                and _has_groups(pattern):
            # indexed before a grouped pattern's tokens were its whole matches: its terms are the groups' texts,
            # which queries tokenised now would no longer meet
            raise ValidationError(
                f"{path} was indexed by an older rlfb that took the groups of the pattern {pattern!r} as its "
                "tokens: build the index again from its chunks"
            )
        # past the caller's own arguments everything comes from the files, so any failure means damage
        try:
            return cls._load_checked(path, meta, tokenizer)
        except CorruptStateError:
            raise
        except _LOAD_ERRORS as exc:
            raise CorruptStateError(f"cannot read the BM25 index in {path}: {array_problem(exc)}") from exc

    @classmethod
    def _load_checked(
        cls, path: Path, meta: dict[str, Any], tokenizer: Callable[[str], list[str]] | None
    ) -> BM25Retriever:
        """:meth:`load` without the error translation: check every saved value before using it."""
        import bm25s

        meta_file = path / "meta.json"
        version = meta.get("format_version")
        if not _is_int(version) or version != _FORMAT_VERSION:
            raise CorruptStateError(
                f"{meta_file}: unknown BM25 format_version {version!r}; this rlfb reads {_FORMAT_VERSION}"
            )
        for key in ("k1", "b", "avg_doc_len"):
            value = meta.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise CorruptStateError(f"{meta_file}: {key} must be a finite number, got {value!r}")
        for key, default in (("lowercase", True), ("unicode_nfc", False)):
            if not isinstance(meta.get(key, default), bool):
                raise CorruptStateError(f"{meta_file}: {key} must be true or false, got {meta[key]!r}")
        if meta["avg_doc_len"] < 0:
            raise CorruptStateError(f"{meta_file}: avg_doc_len must be >= 0, got {meta['avg_doc_len']!r}")
        try:
            self = cls(
                k1=meta["k1"],
                b=meta["b"],
                method=meta["method"],
                idf_method=meta["idf_method"],
                tokenizer=tokenizer if tokenizer is not None else meta["tokenizer"],
                lowercase=meta.get("lowercase", True),
                # an index saved before texts were normalised keeps tokenising as it was built
                normalize_unicode=meta.get("unicode_nfc", False),
            )
        except ValidationError as exc:  # the settings came from the file, not from the caller
            raise CorruptStateError(f"{meta_file}: {exc}") from exc
        model = bm25s.BM25.load(path / "bm25s", allow_pickle=False, show_progress=False)
        params_file = path / "bm25s" / "params.index.json"
        saved = (model.k1, model.b, model.method, model.idf_method)
        if saved != (self.k1, self.b, self.method, self.idf_method):
            # the weights were computed with the settings in params; scoring new texts uses meta's
            raise CorruptStateError(
                f"{params_file} (k1, b, method, idf_method) = {saved} disagrees with {meta_file}"
            )
        table = ChunkTable.load(path)
        num_docs = model.scores["num_docs"]
        if not _is_int(num_docs) or num_docs != len(table):
            raise CorruptStateError(f"{params_file}: the BM25 index has {num_docs!r} documents for {len(table)} chunks")
        if meta.get("n_docs", len(table)) != len(table):
            raise CorruptStateError(f"{meta_file}: n_docs is {meta['n_docs']!r} for {len(table)} chunks")
        _check_index(path / "bm25s", model.scores, model.vocab_dict, len(table))
        self._bm25, self._table = model, table
        self._avg_len = float(meta["avg_doc_len"])
        self._finish()
        self._counts = _load_counts(path / _COUNTS_FILE, np.diff(self._matrix_t.indptr), self._avg_len)
        return self

    def __repr__(self) -> str:
        return f"BM25Retriever(k1={self.k1}, b={self.b}, method={self.method!r}, n_chunks={len(self)})"


def _term_counts(token_ids: list[list[int]], n_vocab: int) -> Any:
    """Documents x vocabulary CSR matrix of term counts (int32)."""
    import scipy.sparse as sp

    lengths = np.fromiter((len(t) for t in token_ids), dtype=np.int64, count=len(token_ids))
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.fromiter((i for toks in token_ids for i in toks), dtype=np.int32, count=int(indptr[-1]))
    counts = sp.csr_matrix((np.ones(indices.size, dtype=np.int32), indices, indptr),
                           shape=(len(token_ids), n_vocab))
    counts.sum_duplicates()
    return counts


def _load_counts(file: Path, df: np.ndarray, avg_len: float) -> Any:
    """The documents x vocabulary term counts saved beside an index, or ``None`` where there are none.

    Counts that do not belong to the index (another shape, other document frequencies or another
    average length) raise :class:`CorruptStateError`: an update built on them would score wrongly.
    """
    import scipy.sparse as sp

    if not file.exists():
        return None
    try:
        with np.load(file, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in ("data", "indices", "indptr", "shape")}
    except NPZ_ERRORS as exc:
        raise CorruptStateError(f"{file}: cannot read the term counts: {array_problem(exc)}") from exc
    data, indices, indptr, shape = (arrays[n] for n in ("data", "indices", "indptr", "shape"))
    n_vocab = df.shape[0]
    if any(a.ndim != 1 or a.dtype.kind not in "iu" for a in arrays.values()) or shape.shape != (2,):
        raise CorruptStateError(f"{file}: expected 1-D integer arrays data, indices, indptr and a 2-long shape")
    n_docs = int(shape[0])
    if int(shape[1]) != n_vocab or indptr.shape[0] != n_docs + 1:
        raise CorruptStateError(f"{file}: counts of shape {tuple(shape.tolist())} for {n_vocab} terms")
    if indptr[0] != 0 or indptr[-1] != indices.shape[0] or np.any(np.diff(indptr) < 0) or \
            data.shape != indices.shape:
        raise CorruptStateError(f"{file}: row pointers must rise from 0 to the {indices.shape[0]} counts")
    if indices.size and (indices.min() < 0 or indices.max() >= n_vocab or data.min() <= 0):
        raise CorruptStateError(f"{file}: term numbers must be in [0, {n_vocab}) and counts > 0")
    counts = sp.csr_matrix((data.astype(np.int32), indices.astype(np.int32), indptr.astype(np.int64)),
                           shape=(n_docs, n_vocab))
    counts.sum_duplicates()
    lengths = np.asarray(counts.sum(axis=1)).ravel()
    mean_len = float(lengths.mean()) if n_docs else 0.0
    if not np.array_equal(np.bincount(counts.indices, minlength=n_vocab), df) or \
            not math.isclose(mean_len, avg_len, rel_tol=1e-9, abs_tol=1e-9):
        raise CorruptStateError(f"{file}: the term counts do not match the BM25 index beside them")
    return counts


def _is_int(value: object) -> bool:
    """True for a JSON integer (``bool`` is an ``int`` in Python but not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_index(folder: Path, scores: dict[str, Any], vocab: object, n_docs: int) -> None:
    """Raise :class:`CorruptStateError` unless bm25s's arrays form a valid vocabulary x documents CSR matrix.

    scipy accepts out-of-range or unsorted pointers only to fail later (or score wrongly), so the
    structure is checked here, with whole-array numpy operations: no loop over postings.
    """
    files = {name: folder / f"{name}.csc.index.npy" for name in ("data", "indices", "indptr")}
    arrays = {name: scores[name] for name in files}
    kinds = {"data": "f", "indices": "iu", "indptr": "iu"}
    for name, arr in arrays.items():
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype.kind not in kinds[name]:
            what = f"a {arr.ndim}-D {arr.dtype} array" if isinstance(arr, np.ndarray) else type(arr).__name__
            expected = "float" if name == "data" else "integer"
            raise CorruptStateError(f"{files[name]}: expected a 1-D {expected} array, got {what}")
    data, indices, indptr = arrays["data"], arrays["indices"], arrays["indptr"]
    vocab_file = folder / "vocab.index.json"
    if not isinstance(vocab, dict) or not vocab:
        raise CorruptStateError(f"{vocab_file}: expected a non-empty JSON object of term -> id")
    n_vocab = len(vocab)
    # a bool among ints makes an int array (True as 1), which then failed every query holding the term
    if any(isinstance(v, bool) or not isinstance(v, int) for v in vocab.values()):
        raise CorruptStateError(f"{vocab_file}: term ids must be integers")
    ids = np.array(list(vocab.values()))
    if ids.dtype.kind not in "iu":
        raise CorruptStateError(f"{vocab_file}: term ids must be integers")
    if ids.min() < 0 or ids.max() >= n_vocab or np.unique(ids).size != n_vocab:
        # a permutation of 0..n_vocab-1: each term owns exactly one row of the matrix
        raise CorruptStateError(f"{vocab_file}: term ids must be distinct and in [0, {n_vocab})")
    if indptr.shape[0] != n_vocab + 1:
        raise CorruptStateError(f"{files['indptr']}: {indptr.shape[0] - 1} term columns for {n_vocab} terms")
    if indptr[0] != 0 or indptr[-1] != indices.shape[0] or np.any(np.diff(indptr) < 0):
        raise CorruptStateError(
            f"{files['indptr']}: pointers must rise from 0 to the {indices.shape[0]} postings"
        )
    if data.shape[0] != indices.shape[0]:
        raise CorruptStateError(f"{files['data']}: {data.shape[0]} weights for {indices.shape[0]} postings")
    if indices.size and (indices.min() < 0 or indices.max() >= n_docs):
        raise CorruptStateError(f"{files['indices']}: document numbers must be in [0, {n_docs})")
    if not np.all(np.isfinite(data)) or np.any(data < 0):
        raise CorruptStateError(f"{files['data']}: BM25 weights must be finite and >= 0")
