"""``FeedbackEnsemble``: retrieve with several retrievers, fuse with learned weights, learn from feedback.

>>> from rlfb import FeedbackEnsemble
>>> ens = FeedbackEnsemble.from_texts(
...     ["the aurora is caused by charged particles from the sun",
...      "tides are caused by the moon", "volcanoes erupt molten rock"],
...     retrievers=("bm25",))
>>> result = ens.retrieve("what causes the aurora", k=2)
>>> result.hits[0].chunk_id, result.hits[0].rank
('0', 1)
>>> ens.weights
{'bm25': 1.0}
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rlfb.errors import (
    CorruptStateError,
    ModelNotFoundError,
    RlfbError,
    UnknownChunkError,
    UnknownEventError,
    ValidationError,
)
from rlfb.fusion import check_fusion, normalize, rank_matrix, shared_ranks
from rlfb.members import SearchMember
from rlfb.memory import naming_model, without_embeddings
from rlfb.policies.base import Context, Decision, Episode, Policy
from rlfb.retrievers.base import ChunkTable, Retriever, saving_into, top_k
from rlfb.runs import in_callers_block, maker_of, owns_event, remember_maker, store_lock
from rlfb.snapshot_kind import SnapshotKind
from rlfb.types import Chunk, Hit, RetrievalResult, copy_metadata, make_chunks, validate_flag, validate_k

__all__ = ["FeedbackEnsemble"]

_CONFIG_FILE = "ensemble.json"
_FORMAT = 1
_UNKNOWN = object()  # a cached value not computed yet (None is an answer)
_HASHED = "sha256:"  # prefix of the learner's key for a question the store keeps only hashed
#: The event metadata key of the learner's key for a question, logged where the store keeps no text.
QUERY_KEY = "rlfb_query_key"


class FeedbackEnsemble:
    """An ensemble of retrievers whose fusion weights and chunk confidences learn from feedback.

    Parameters
    ----------
    retrievers
        Indexed retrievers, as a mapping from name to retriever or as a
        sequence (each retriever's ``name`` is used). All must index the same ids.
    chunks
        The indexed chunks (texts and metadata for the hits).
    members
        Search-only members (:class:`rlfb.members.SearchMember`): any search
        engine whose results join the candidate pool and get a weight of their own.
    fusion
        Score normalisation before the weighted sum: ``"minmax"``, ``"zscore"`` or ``"rrf"``.
    policy
        A policy name (``"fixed"``, ``"batch"``, ``"thompson"``, ``"epsilon"``, ``"gradient"``) or a policy instance.
    weights
        Initial weights for the ``fixed`` policy (validated: finite, non-negative).
    store
        A :class:`rlfb.store.FeedbackStore`, a path to an SQLite file, or ``None`` (no logging).
    candidate_k
        How many of each retriever's best chunks enter the candidate pool. Every
        candidate is scored by every retriever, so a chunk absent from one list
        still gets that retriever's real score instead of zero.
    refresh_interval
        Seconds between checks for weights that another process wrote to the store.
    persist_interval
        Least seconds between two snapshots of the learner's state in the store;
        0 (the default) writes one after every feedback. State not yet written is
        flushed by :meth:`flush`, :meth:`save` and :meth:`close`. A snapshot is the
        whole learned state, which grows with what is learned (about 1 MB after
        5,000 retrievals of BM25 alone), so each feedback costs more as it grows:
        under heavy traffic give 1.0 or more.
    """

    def __init__(
        self,
        retrievers: Mapping[str, Retriever] | Sequence[Retriever],
        chunks: Sequence[Chunk] | ChunkTable | None = None,
        *,
        members: Sequence[SearchMember] = (),
        fusion: str = "minmax",
        policy: str | Policy = "fixed",
        weights: Mapping[str, float] | Sequence[float] | None = None,
        store: Any = None,
        candidate_k: int = 100,
        rrf_c: float = 60.0,
        learner_config: Any = None,
        seed: int = 0,
        refresh_interval: float = 5.0,
        persist_interval: float = 0.0,
    ) -> None:
        from rlfb.learner import Learner  # local: keeps `import rlfb` light

        self._retrievers: dict[str, Retriever] = _as_retriever_map(retrievers, allow_empty=bool(members))
        self._members: dict[str, SearchMember] = {}
        for m in members:
            if m.name in self._retrievers or m.name in self._members:
                raise ValidationError(f"two retrievers or members are named {m.name!r}")
            self._members[m.name] = m
        if isinstance(chunks, ChunkTable):
            self._table = chunks
        elif chunks is None and not self._retrievers:
            self._table = ChunkTable.empty()
        elif chunks is None:
            raise ValidationError("pass the indexed chunks together with the corpus retrievers")
        else:
            self._table = ChunkTable(chunks)
        self._extra: OrderedDict[str, Chunk] = OrderedDict()  # chunks members found outside the index
        self._extra_size = 100_000
        # the table each live context was scored against: its hits take their texts from it, not from a
        # table a corpus update swapped in since (weak: a context let go takes its entry with it)
        self._scored_on: weakref.WeakKeyDictionary[Context, ChunkTable] = weakref.WeakKeyDictionary()
        # chunks given to rerank under an indexed id with another text (edited since): their hits carry them
        self._given_on: weakref.WeakKeyDictionary[Context, dict[str, Chunk]] = weakref.WeakKeyDictionary()
        for name, r in self._retrievers.items():
            if list(r.ids) != self._table.ids:
                raise ValidationError(f"retriever {name!r} does not index the ensemble's chunks in the same order")
        self.fusion = check_fusion(fusion)
        self.candidate_k = validate_k(candidate_k, "candidate_k")
        if isinstance(rrf_c, bool) or not isinstance(rrf_c, (int, float)) or not 0 < rrf_c < math.inf:
            raise ValidationError(f"rrf_c must be a positive finite number, got {rrf_c!r}")
        self.rrf_c = float(rrf_c)
        self.seed = seed
        self.refresh_interval = _seconds(refresh_interval, "refresh_interval")
        self.persist_interval = _seconds(persist_interval, "persist_interval")
        # never written nor read yet: the first of each is due at once. 0.0 read as "at the clock's start", and
        # time.monotonic() counts from boot, so within persist_interval of a boot nothing was written at all
        self._last_persist = -math.inf
        self._dirty = False
        self._lock = threading.RLock()
        self._update_lock = threading.Lock()  # one corpus update at a time; searches go on meanwhile
        self._save_lock = threading.Lock()  # one save at a time; retrieval and feedback go on meanwhile
        self._query_dim_cache: Any = _UNKNOWN
        self._other_models_asked = False  # _other_models_snapshot: a first start takes another model's state once
        self._learner = Learner(
            self.retriever_names, policy=policy, weights=weights, config=learner_config, seed=seed
        )
        self._store = _open_store(store)
        self._state_version = 0  # the newest snapshot read or written
        self._own_version = 0  # the newest snapshot of this ensemble's own state read or written
        self._last_refresh = -math.inf
        self._implicit: Any = None  # ImplicitSignals, built by observe()
        self._contexts: OrderedDict[str, Context] = OrderedDict()  # recent contexts, for fast episodes
        self._context_cache_size = 10_000
        if self._store is not None:
            self._refresh(force=True)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_chunks(
        cls,
        chunks: Sequence[Chunk],
        *,
        retrievers: Sequence[str | Retriever] = ("bm25", "dense", "splade"),
        retriever_options: Mapping[str, Mapping[str, Any]] | None = None,
        show_progress: bool = False,
        **kwargs: Any,
    ) -> FeedbackEnsemble:
        """Index ``chunks`` with each named retriever (or given, unindexed retriever instance)."""
        from rlfb.retrievers import make_retriever

        table = ChunkTable(chunks)
        options = dict(retriever_options or {})
        built: dict[str, Retriever] = {}
        for spec in [retrievers] if isinstance(retrievers, str) else retrievers:  # "bm25" is one name
            r = make_retriever(spec, **options.get(spec, {})) if isinstance(spec, str) else spec
            if r.name in built:
                raise ValidationError(f"retriever {r.name!r} is listed twice")
            r.index(table.chunks(), show_progress=show_progress)
            built[r.name] = r
        return cls(built, table, **kwargs)

    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        retrievers: Sequence[str | Retriever] = ("bm25", "dense", "splade"),
        **kwargs: Any,
    ) -> FeedbackEnsemble:
        """Build an ensemble over raw texts; ids default to ``"0"``, ``"1"``, ..."""
        return cls.from_chunks(make_chunks(texts, ids, metadatas), retrievers=retrievers, **kwargs)

    # ------------------------------------------------------------------ a changing corpus
    def add_chunks(self, chunks: Sequence[Chunk], *, show_progress: bool = False) -> list[str]:
        """Index ``chunks``: new ids are added, ids already indexed get the new text and metadata.

        Each corpus retriever builds an updated copy of itself (``updated``), reusing what
        it computed for unchanged chunks: BM25 tokenizes only new or changed texts and
        recomputes its weights from the term counts it kept; dense and SPLADE keep their
        vectors and encode only new or changed texts. Retrieval and feedback go on with
        the old index until the new one is complete, and a failure leaves the old one in
        place. What the ensemble learned is keyed by chunk id and carries over: a chunk
        whose text changes keeps its confidence, so give a rewritten chunk a new id to
        start it afresh. Returns the ids.

        >>> ens = FeedbackEnsemble.from_texts(["tides follow the moon"], retrievers=("bm25",))
        >>> ens.add_chunks(make_chunks(["the aurora glows green"], ids=["aurora"]))
        ['aurora']
        >>> len(ens), ens.retrieve("aurora", k=1, log=False).hits[0].chunk_id
        (2, 'aurora')
        """
        chunks = list(chunks)
        if not chunks:
            return []
        for c in chunks:
            if not isinstance(c, Chunk):
                raise ValidationError(f"add_chunks takes Chunk objects, got {type(c).__name__}")
        # validates, rejects repeated ids
        chunks = make_chunks([c.text for c in chunks], [c.id for c in chunks], [c.metadata for c in chunks])
        with self._update_lock:
            self._reindex(self._table.changed(chunks), show_progress=show_progress)
        return [c.id for c in chunks]

    def add_texts(
        self,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        show_progress: bool = False,
    ) -> list[str]:
        """:meth:`add_chunks` from raw texts; ``ids`` default to new random ones (uuid4 hex)."""
        if not isinstance(texts, str):
            texts = list(texts)  # a generator is read once, for the ids and the chunks alike
            if not texts and (ids is None or len(ids) == 0) and (metadatas is None or len(metadatas) == 0):
                return []  # nothing to index, as add_chunks([]); ids without texts fail in make_chunks
        if ids is None and not isinstance(texts, str):
            ids = [uuid.uuid4().hex for _ in texts]
        return self.add_chunks(make_chunks(texts, ids, metadatas), show_progress=show_progress)

    def delete_chunks(self, chunk_ids: Iterable[str], *, show_progress: bool = False) -> None:
        """Remove chunks from the index (updating each retriever as :meth:`add_chunks` does).

        An id that is not indexed raises :class:`~rlfb.errors.UnknownChunkError` and
        nothing is removed. Feedback on earlier retrievals that showed a removed chunk
        is still accepted and learned from.
        """
        if isinstance(chunk_ids, str):
            raise ValidationError("chunk_ids must be a sequence of ids, not one string")
        if not isinstance(chunk_ids, Iterable):
            raise ValidationError(f"chunk_ids must be a sequence of ids, got {type(chunk_ids).__name__}")
        ids = list(chunk_ids)
        for c in ids:
            if not isinstance(c, str):
                raise ValidationError(f"chunk ids are strings, got {type(c).__name__} {c!r}")
        gone = set(ids)
        if not gone:
            return
        with self._update_lock:
            table = self._table
            rows = table.rows(sorted(gone))  # names the first unknown id
            if len(gone) == len(table):
                raise ValidationError("cannot delete every indexed chunk: the ensemble would have nothing to search")
            changed = table.changed(deletes=sorted(gone))
            self._reindex(changed, show_progress=show_progress, gone=[table.chunk(int(r)) for r in rows])

    def _reindex(self, table: ChunkTable, *, show_progress: bool, gone: Sequence[Chunk] = ()) -> None:
        """Index ``table`` with a copy of each corpus retriever, then swap table and retrievers at once.

        The copies are built without the ensemble's lock, so searches (and feedback) go on with
        the old pair meanwhile; ``gone`` (deleted chunks) stay nameable by in-flight results.
        """
        if not self._retrievers:
            raise ValidationError("this ensemble has no corpus retrievers to index chunks with")
        built = {name: _updated(r, table, show_progress) for name, r in self._retrievers.items()}
        for name, r in built.items():
            if list(r.ids) != table.ids:
                raise ValidationError(f"retriever {name!r} did not index the chunks in the order given")
        with self._lock:
            self._table, self._retrievers = table, built
            for c in gone:
                self._keep_extra(c)
            for cid in [c for c in self._extra if c in table.row]:  # indexed now: no longer outside
                del self._extra[cid]

    # ------------------------------------------------------------------ properties
    @property
    def retriever_names(self) -> tuple[str, ...]:
        """Corpus retrievers, then members: the columns of the score matrices and the weights' keys."""
        return tuple(self._retrievers) + tuple(self._members)

    @property
    def retrievers(self) -> Mapping[str, Retriever]:
        return dict(self._retrievers)

    @property
    def weights(self) -> dict[str, float]:
        """The current global fusion weights, as ``{retriever name: weight}``."""
        self._refresh()
        return self._learner.weights()

    def set_weights(self, weights: Mapping[str, float] | Sequence[float]) -> FeedbackEnsemble:
        """Set the policy's (default) fusion weights and write them to the store now.

        Validated as the learner's ``set_weights`` is (NaN, negative or all-zero weights are refused).
        Set on ``ens.learner`` itself they were not written: the next snapshot another process wrote,
        or a restart, brought the old weights back.

        >>> ens = FeedbackEnsemble.from_texts(["solar wind", "sourdough"], retrievers=("bm25",), policy="fixed")
        >>> ens.set_weights({"bm25": 1.0}).weights
        {'bm25': 1.0}
        """
        with self._guarded():
            self._refresh(force=True)  # onto the newest state: the new weights must not be overwritten by it
            self._learner.set_weights(weights)
            self._persist(force=True)
        return self

    def weights_for(self, query: str) -> dict[str, float]:
        """The weights the greedy policy would use for ``query``'s query type."""
        from rlfb.features import query_features, query_type

        self._refresh()
        return self._learner.weights(query_type(query_features(_check_query(query))))

    @property
    def learner(self) -> Any:
        return self._learner

    @property
    def store(self) -> Any:
        return self._store

    @property
    def chunks(self) -> ChunkTable:
        return self._table

    def __len__(self) -> int:
        return len(self._table)

    # ------------------------------------------------------------------ retrieval
    def context(
        self, query: str, *, session_id: str | None = None, k: int = 0, embedding_strs: Sequence[str] | None = None
    ) -> Context:
        """Score ``query`` with every retriever over the candidate pool; no decision yet.

        The pool is the union of each corpus retriever's best ``max(candidate_k, k)``
        chunks and of each member's results. Every candidate is scored by every
        corpus retriever (chunks a member found outside the index are scored
        from their text); a member scores only what it returned.

        ``embedding_strs``: texts that stand for the question where it is embedded, as LlamaIndex's
        ``QueryBundle.custom_embedding_strs`` (a HyDE transform's hypothetical answer): a retriever that
        embeds queries (``embeds_queries``, the dense one) scores each chunk by its mean similarity to them,
        which ranks as LlamaIndex's averaged query embedding does; the others, and the learner, take ``query``.
        """
        query = _check_query(query)
        strs = _check_embedding_strs(embedding_strs)
        depth = max(self.candidate_k, k)
        table, retrievers = self._index()  # one consistent pair, even while add_chunks swaps them
        full = [_scores(r, query, strs, lambda r, q: r.score_all(q)) for r in retrievers.values()]
        n_docs = len(table)
        tops = [top_k(s, min(depth, n_docs)) for s in full]
        rows = np.unique(np.concatenate(tops)) if tops else np.zeros(0, dtype=np.int64)
        ids = [table.ids[int(r)] for r in rows]
        raw = np.stack([s[rows] for s in full], axis=1) if full else np.zeros((len(rows), 0))
        ranks = np.zeros_like(raw)
        proposed = np.zeros(raw.shape, dtype=bool)  # in the retriever's own top list (a pool of depth k)
        for j, (s, top) in enumerate(zip(full, tops, strict=True)):
            at = np.searchsorted(rows, top)  # rows is sorted, so this finds each top row
            proposed[at, j] = True
            # the 1-based rank inside the retriever's own top list, then candidates below that list in
            # their order after it; tied scores share a rank (BM25's zeros are not ranked by corpus position)
            outside = np.setdiff1d(np.arange(len(rows)), at, assume_unique=True)
            outside = outside[np.argsort(-s[rows[outside]], kind="stable")]
            order = np.concatenate([at, outside])
            ranks[order, j] = shared_ranks(s[rows[order]])
        if self._members:
            ids, raw, ranks, proposed = self._add_member_candidates(
                query, depth, ids, raw, ranks, proposed, table, retrievers, strs
            )
        ctx = self._make_context(query, ids, raw, ranks, session_id, proposed)
        self._scored_on[ctx] = table
        return ctx

    @contextmanager
    def _guarded(self) -> Iterator[None]:
        """The store's lock, then this ensemble's: every block that touches the store under ours takes both.

        One order everywhere: a caller inside ``store.exclusive()`` (which holds the store's lock) calling
        :meth:`feedback` while another thread gave feedback used to wait on each other for ever.
        """
        with store_lock(self._store), self._lock:
            yield

    def _index(self) -> tuple[ChunkTable, dict[str, Retriever]]:
        with self._lock:
            return self._table, self._retrievers

    def _add_member_candidates(
        self,
        query: str,
        depth: int,
        ids: list[str],
        raw: np.ndarray,
        ranks: np.ndarray,
        proposed: np.ndarray,
        table: ChunkTable,
        retrievers: Mapping[str, Retriever],
        embedding_strs: tuple[str, ...] = (),
    ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        results = [m.search(query, depth, c=self.rrf_c) for m in self._members.values()]
        known = set(ids)
        new: list[Chunk] = []
        for found in results:
            for chunk, _ in found:
                if chunk.id not in known:
                    known.add(chunk.id)
                    new.append(chunk)
                    if chunk.id not in table.row:
                        self._keep_extra(chunk)
        if new:
            # scored as the pooled candidates are: a dense column of two scales would mis-rank in any fusion
            corpus = self._score_chunks(query, new, table, retrievers, embedding_strs)
            raw = np.vstack([raw, corpus])
            # below every ranked candidate, in score order
            tail = rank_matrix(corpus) + (ranks.max(axis=0) if ranks.size else 0)
            ranks = np.vstack([ranks, tail])
            proposed = np.vstack([proposed, np.zeros((len(new), proposed.shape[1]), dtype=bool)])  # scored only
            ids = ids + [c.id for c in new]
        position = {cid: i for i, cid in enumerate(ids)}
        member_cols = np.full((len(ids), len(results)), np.nan)
        for j, found in enumerate(results):
            for chunk, score in found:
                member_cols[position[chunk.id], j] = score
        return (ids, np.hstack([raw, member_cols]), np.hstack([ranks, rank_matrix(member_cols)]),
                np.hstack([proposed, ~np.isnan(member_cols)]))

    def _keep_extra(self, chunk: Chunk) -> None:
        """Remember a chunk found outside the index, so that hits and feedback can name it (bounded)."""
        with self._lock:  # searches call this while a corpus update prunes the same dict
            self._extra[chunk.id] = chunk
            self._extra.move_to_end(chunk.id)
            while len(self._extra) > self._extra_size:
                self._extra.popitem(last=False)

    def _score_chunks(
        self, query: str, chunks: Sequence[Chunk], table: ChunkTable, retrievers: Mapping[str, Retriever],
        embedding_strs: tuple[str, ...] = (), by_text: Collection[str] = (),
    ) -> np.ndarray:
        """Raw scores of ``chunks`` by each corpus retriever: indexed ids by id, others (and the ids in
        ``by_text``) by their text."""
        out = np.zeros((len(chunks), len(retrievers)))
        at_inside = [i for i, c in enumerate(chunks) if c.id in table.row and c.id not in by_text]
        at_outside = [i for i, c in enumerate(chunks) if c.id not in table.row or c.id in by_text]
        ids = [chunks[i].id for i in at_inside]
        texts = [chunks[i].text for i in at_outside]
        for j, r in enumerate(retrievers.values()):
            if ids:
                out[at_inside, j] = _scores(r, query, embedding_strs, lambda r, q: r.score(q, ids))
            if texts:
                out[at_outside, j] = _scores(r, query, embedding_strs, lambda r, q: r.score_texts(q, texts))
        return out

    def _learner_query(self, query: str) -> str:
        """What the learner knows a question by: its text, or, with a store that keeps no text
        (``store_text=False``), the sha256 of its normalised text, logged with the event
        (:data:`QUERY_KEY`), so that no query text reaches the learner's saved state and a
        rebuilt episode finds the same question after a restart."""
        if self._store is not None and not self._store.store_text:
            from rlfb.memory import normalize_query
            from rlfb.store import query_hash

            # of the normalised text, as the memory keys a question it knows by its text: a hash of the
            # raw text took "What causes tides?" and "what causes tides" for two questions
            return _HASHED + query_hash(normalize_query(query))
        return query

    def _for_learner(self, ctx: Context) -> Context:
        key = self._learner_query(ctx.query)
        return ctx if key == ctx.query else dataclasses.replace(ctx, query=key)

    def _make_context(
        self, query: str, ids: Sequence[str], raw: np.ndarray, ranks: np.ndarray, session_id: str | None,
        proposed: np.ndarray | None = None,
    ) -> Context:
        from rlfb.features import query_features, query_type

        feats = query_features(query)
        return Context(
            query=query,
            retrievers=self.retriever_names,
            candidate_ids=tuple(ids),
            raw=raw,
            normalized=normalize(raw, self.fusion, ranks=ranks, c=self.rrf_c),
            features=feats,
            query_type=query_type(feats),
            query_embedding=self._query_embedding(query),
            session_id=session_id,
            ranks=ranks,
            proposed=proposed,
        )

    def retrieve(
        self,
        query: str,
        k: int = 5,
        *,
        session_id: str | None = None,
        explore: bool = True,
        log: bool = True,
        event_id: str | None = None,
        parent_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        timestamp: float | None = None,
        embedding_strs: Sequence[str] | None = None,
    ) -> RetrievalResult:
        """Retrieve the ``k`` best chunks for ``query`` and log the event for later feedback.

        ``explore=False`` gives the greedy ranking (no exploration), which is
        what evaluation on held-out queries uses. With ``log=False`` nothing is
        written and ``event_id`` is ``None``. ``timestamp`` (unix seconds)
        overrides the clock, for replaying logs and simulations. ``embedding_strs``: see :meth:`context`.
        """
        validate_k(k)
        ctx = self.context(query, session_id=session_id, k=k, embedding_strs=embedding_strs)
        return self.rank_context(ctx, k, explore=explore, log=log, event_id=event_id, parent_id=parent_id,
                            metadata=metadata, timestamp=timestamp)

    def rerank(
        self,
        query: str,
        chunks: Sequence[Chunk],
        k: int | None = None,
        *,
        session_id: str | None = None,
        explore: bool = True,
        log: bool = True,
        event_id: str | None = None,
        parent_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        timestamp: float | None = None,
        embedding_strs: Sequence[str] | None = None,
    ) -> RetrievalResult:
        """Re-rank chunks that another retriever found, with the learned weights, and log the event.

        Each chunk is scored by every corpus retriever: by id when it is in the
        index with this text, otherwise from its text. A chunk whose id is indexed
        with another text (edited since it was indexed) is scored from the text
        given, and its hit carries that text and metadata: what the caller passes
        on is what was ranked. It keeps its id, so the feedback it gets stays with
        the chunk's history. An empty list gives an empty result (nothing is
        logged). ``k`` defaults to all of them. ``embedding_strs``: see :meth:`context`.
        """
        query = _check_query(query)
        chunks = _check_rerank_chunks(chunks)
        strs = _check_embedding_strs(embedding_strs)
        if not chunks:
            return RetrievalResult(query=query, hits=[], weights=self.weights)
        if k is not None:
            k = validate_k(k)  # before the scoring, which is the slow part
        ctx = self._rerank_context(query, chunks, session_id, strs)
        n = len(ctx.candidate_ids)  # a chunk id given twice is ranked once
        return self.rank_context(ctx, n if k is None else min(k, n), explore=explore, log=log, event_id=event_id,
                                 parent_id=parent_id, metadata=metadata, timestamp=timestamp)

    def rerank_context(
        self,
        query: str,
        chunks: Sequence[Chunk],
        *,
        session_id: str | None = None,
        embedding_strs: Sequence[str] | None = None,
    ) -> Context:
        """Score chunks as :meth:`rerank` does, with no decision yet: rank it with :meth:`rank_context`.

        :meth:`rerank` in two steps, as :meth:`context` is :meth:`retrieve`'s first: a caller can drop a
        re-ranking between them (an adapter whose async call was cancelled while the chunks were scored)
        without logging it. Its candidates are the chunks, in order, each id once; an empty list is an error.
        """
        query = _check_query(query)
        strs = _check_embedding_strs(embedding_strs)
        chunks = _check_rerank_chunks(chunks)
        if not chunks:
            raise ValidationError("rerank_context needs at least one chunk")
        return self._rerank_context(query, chunks, session_id, strs)

    def _rerank_context(
        self, query: str, chunks: list[Chunk], session_id: str | None, strs: tuple[str, ...]
    ) -> Context:
        """:meth:`rerank_context` on arguments already checked (``chunks`` non-empty, each id once)."""
        if not self._retrievers:
            raise ValidationError("rerank needs at least one corpus retriever to score the chunks")
        table, retrievers = self._index()
        edited: dict[str, Chunk] = {}
        for c in chunks:
            row = table.row.get(c.id)
            if row is None:
                self._keep_extra(c)
            elif table.texts[row] != c.text:
                # scored by id, it would be ranked (and its scores reported) by a text the caller no longer has
                edited[c.id] = c
        raw = self._score_chunks(query, chunks, table, retrievers, strs, by_text=edited)
        if self._members:  # members did not see these chunks: they contribute nothing
            raw = np.hstack([raw, np.full((len(chunks), len(self._members)), np.nan)])
        # no retriever proposed these chunks: the caller did
        ctx = self._make_context(query, [c.id for c in chunks], raw, rank_matrix(raw), session_id,
                                 np.zeros(raw.shape, dtype=bool))
        self._scored_on[ctx] = table
        if edited:
            self._given_on[ctx] = edited
        return ctx

    def rank_context(
        self,
        ctx: Context,
        k: int,
        *,
        explore: bool = True,
        log: bool = True,
        event_id: str | None = None,
        parent_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        timestamp: float | None = None,
        used: int | None = None,
    ) -> RetrievalResult:
        """Decide, rank and log for a context from :meth:`context`.

        Retriever scores do not change while the policy learns, so simulations
        compute each query's context once and call this for every interaction.
        ``used``: the answer is written from the top ``used`` chunks only, so
        feedback on the answer is spread over those (``None``: every chunk).
        """
        validate_k(k)
        if used is not None:
            validate_k(used, "used")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ValidationError(f"metadata must be a mapping, got {type(metadata).__name__}")
        validate_flag(explore, "explore")  # "no" is truthy: it would explore
        validate_flag(log, "log")
        with self._guarded():
            self._refresh()
            learner_ctx = self._for_learner(ctx)
            logging = log and self._store is not None
            if logging:
                logged_metadata = _logged_metadata(metadata, ctx.query, learner_ctx.query)
                # before ranking: a retrieval refused only when logged (a future timestamp, an id already
                # logged) had moved the policy's random state and the memory's count of asks all the same
                check = getattr(self._store, "check_event_args", None)  # a store of the user's own may lack it
                if check is not None:
                    check(event_id=event_id, session_id=ctx.session_id, parent_id=parent_id, timestamp=timestamp,
                          metadata=logged_metadata)
            # a ranking not logged (an evaluation: no feedback can reach it) does not count as a use of the
            # memory's entries, which keeps them from eviction
            ranking = self._learner.rank(learner_ctx, k, explore=explore, touch=log)
            hits = self._hits(ctx, ranking)
            decision: Decision = ranking.decision
            logged_id = None
            if logging:
                logged_id = self._store.log_event(
                    ctx.query,
                    decision.to_dict(),
                    [_chunk_row(h, used) for h in hits],
                    session_id=ctx.session_id,
                    features=dict(ctx.features),
                    query_type=ctx.query_type,
                    event_id=event_id,
                    parent_id=parent_id,
                    metadata=logged_metadata,
                    timestamp=timestamp,
                )
                self._remember(logged_id, ctx)
        return RetrievalResult(
            query=ctx.query,
            hits=hits,
            weights=dict(decision.weights),
            event_id=logged_id,
            arm=decision.arm,
            propensity=decision.propensity,
            explored=decision.explored,
            ask_for_feedback=bool(ranking.ask_for_feedback),
        )

    def retrieve_batch(self, queries: Iterable[str], k: int = 5, **kwargs: Any) -> list[RetrievalResult]:
        """:meth:`retrieve` for each query, in order."""
        if isinstance(queries, str):  # iterating it would retrieve once per character
            raise ValidationError("queries must be a sequence of strings, not one string: use retrieve()")
        return [self.retrieve(q, k, **kwargs) for q in queries]

    def chunk(self, chunk_id: str) -> Chunk:
        """The indexed (or member-found, or lately deleted) chunk with this id."""
        table = self._table  # read once: add_chunks may swap in a new table between two reads
        row = table.row.get(chunk_id)
        if row is not None:
            return table.chunk(row)
        try:
            return self._extra[chunk_id]
        except KeyError:
            raise UnknownChunkError(f"chunk id {chunk_id!r} is not known to this ensemble") from None

    def _hits(self, ctx: Context, ranking: Any) -> list[Hit]:
        names = ctx.retrievers
        # which retrievers' own top lists held each candidate; a context built elsewhere may lack the mask
        proposed = ctx.proposed if ctx.proposed is not None else ctx.ranks <= self.candidate_k
        table = self._scored_on.get(ctx)
        given = self._given_on.get(ctx) or {}
        hits = []
        for rank, idx in enumerate(ranking.order, start=1):
            idx = int(idx)
            chunk = given.get(ctx.candidate_ids[idx])
            if chunk is None:
                row = None if table is None else table.row.get(ctx.candidate_ids[idx])
                chunk = self.chunk(ctx.candidate_ids[idx]) if row is None else table.chunk(row)
            hits.append(
                Hit(
                    chunk_id=chunk.id,
                    text=chunk.text,
                    score=float(ranking.fused[idx]),
                    rank=rank,
                    scores={n: _finite_or_none(ctx.raw[idx, j]) for j, n in enumerate(names)},
                    normalized={n: float(ctx.normalized[idx, j]) for j, n in enumerate(names)},
                    metadata=copy_metadata(chunk.metadata),  # a caller changing it must not change the index
                    proposed_by=tuple(n for j, n in enumerate(names) if proposed[idx, j]),
                    confidence=float(ranking.confidence[idx]) if ranking.confidence is not None else None,
                    memory=float(ranking.memory[idx]) if ranking.memory is not None else None,
                )
            )
        return hits

    def _dense_encoder(self) -> Any:
        """The dense retriever's query encoder (normalised vectors), or ``None`` without one.

        SPLADE also encodes queries, but into sparse vocabulary vectors, which the
        memory and the reformulation check cannot compare by cosine.
        """
        return getattr(self._dense_retriever(), "encode_queries", None)

    def _dense_retriever(self) -> Retriever | None:
        """The corpus retriever named ``dense`` (whose query embeddings the memory keeps), or ``None``."""
        return next((r for r in self._retrievers.values() if getattr(r, "name", None) == "dense"), None)

    def _query_embedding(self, query: str) -> np.ndarray | None:
        encode = self._dense_encoder()
        return None if encode is None else np.asarray(encode([query])[0], dtype=np.float32)

    def _remember(self, event_id: str, ctx: Context) -> None:
        remember_maker(event_id, self)  # feedback given through another learner's adapter comes back here
        self._contexts[event_id] = ctx
        if len(self._contexts) > self._context_cache_size:
            self._contexts.popitem(last=False)

    # ------------------------------------------------------------------ feedback
    def feedback(
        self,
        event_id: str,
        signal: str | None = None,
        *,
        value: float | None = None,
        rating: float | None = None,
        chunk_id: str | None = None,
        timestamp: float | None = None,
        session_id: str | None = None,
        user_id: str | None = None,
        idempotency_key: str | None = None,
        comment: str | None = None,
        key: str | None = None,
    ) -> Any:
        """Record feedback on a logged retrieval and learn from it.

        Give a ``signal`` (``"explicit_positive"``, ``"implicit_negative"``,
        ...), a ``rating`` from 1 to 5, or a raw ``value`` in [-1, 1]. With
        ``chunk_id`` the feedback is about that chunk; otherwise it is spread
        over the retrieved chunks. Feedback outside the attribution window is
        stored and flagged but not learned from, and so is feedback on a
        retrieval this ensemble did not make (:func:`rlfb.runs.owns_event`);
        a retrieval another live ensemble of this process logged on this store
        is learned by that one (:func:`rlfb.runs.maker_of`).
        Returns the store's :class:`~rlfb.store.FeedbackRecord`.
        """
        store = self._require_store()
        damaged = None
        # one transaction: when learning fails (another process held the write lock too long), the feedback
        # is not kept either, so a retry with the same idempotency key records it and learns it; kept but
        # unlearned, the retry was a duplicate and was never learned
        with self._guarded(), store.exclusive():
            record = store.record_feedback(
                event_id,
                signal,
                value=value,
                rating=rating,
                chunk_id=chunk_id,
                timestamp=timestamp,
                session_id=session_id,
                user_id=user_id,
                idempotency_key=idempotency_key,
                comment=comment,
                key=key,
            )
            # two ensembles of the same retrievers on one store: the one that made the decision learns it
            maker = maker_of(record.event_id, store)
            learner: FeedbackEnsemble = self if maker is None else maker
            together = learner.store is store
            if together:
                damaged = learner._learn_keeping(record, undo=in_callers_block(store))
        if not together:  # its own connection to this file waits for this one's write lock
            damaged = learner._learn_keeping(record)
        if damaged is not None:
            raise damaged
        return record

    def _learn_keeping(self, record: Any, *, undo: bool = False) -> CorruptStateError | None:
        """:meth:`_learn`; a damaged logged row of the event is returned, not raised: the feedback is kept."""
        try:
            self._learn(record, undo=undo)
        except CorruptStateError as exc:
            return exc
        return None

    def _learn(self, record: Any, event: Mapping[str, Any] | None = None, *, undo: bool = False) -> None:
        """Learn from a stored feedback record, unless it is a retry, out of window, or on another's retrieval.

        ``undo``: the record was written inside a caller's ``store.exclusive()`` block, which may still roll
        it back; the learning is then taken back with it (:meth:`_undo_on_rollback`).
        """
        if record.duplicate or not record.in_window:
            return
        with self._guarded():
            try:
                event = self._require_store().event(record.event_id) if event is None else event
                if event is None or not owns_event(self, event):
                    return  # another engine's decision (log_external): its propensities are not ours to learn from
                episode = self.episode(record.event_id, record, event=event)
            except RlfbError:
                raise
            except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
                # the feedback is stored (nothing lost); only the logged retrieval is unreadable
                raise CorruptStateError(
                    f"feedback {getattr(record, 'feedback_id', '?')} on event {record.event_id!r} is stored, but "
                    f"the event's logged row is damaged, so it is not learned from: {exc!r}"
                ) from exc
            # learn on top of the newest shared state, holding the store's write lock from reading it to
            # saving the result: another process learning meanwhile would otherwise start from the same
            # snapshot, and whichever saved last would drop the other's learning
            with self._require_store().exclusive() as store:
                if undo:
                    self._undo_on_rollback(store)
                self._refresh(force=True)
                self._learner.learn(episode)
                self._persist()

    def _undo_on_rollback(self, store: Any) -> None:
        """Before learning inside ``store.exclusive()``: take the learning back if the block's writes are undone.

        A caller's own block around :meth:`feedback` that then fails rolls the feedback row and the snapshot
        back; the in-memory learner kept what it learned, so a retry with the same idempotency key learned
        it twice. A copy of the learner's state is taken first, not the last snapshot: retrievals since then
        changed it too (the memory's count of asks, the random state). The copy costs about as much as a
        snapshot, so it is taken only inside a caller's block; the replay buffer, of which a snapshot keeps the
        newest ``replay_persist`` episodes, is kept whole beside it.
        """
        on_rollback = getattr(store, "on_rollback", None)
        if on_rollback is None:  # a store of the user's own, without rollback callbacks
            return
        marks = (self._own_version, self._state_version, self._dirty, self._last_persist)
        state, replay = self._learner.state_dict(), self._learner.replay.held()
        on_rollback(lambda: self._take_back(state, replay, marks))

    def _take_back(self, state: Mapping[str, Any], replay: Any, marks: tuple[int, int, bool, float]) -> None:
        """Restore the learner, and its snapshot bookkeeping, as :meth:`_undo_on_rollback` found them."""
        with self._guarded():
            self._learner.load_state_dict(state)
            self._learner.replay.restore_held(replay)
            self._own_version, self._state_version, self._dirty, self._last_persist = marks

    def observe(
        self,
        session_id: str,
        query: str | None = None,
        *,
        dwell_seconds: float | None = None,
        cited: Sequence[str] = (),
        opened: Sequence[str] = (),
        timestamp: float | None = None,
    ) -> list[Any]:
        """Infer implicit feedback on the session's latest retrieval and learn from it.

        ``query`` is the user's follow-up: a restatement of the previous query
        is a negative reformulation, a new topic is neutral. ``dwell_seconds``
        over the threshold with no follow-up is positive; ``cited`` and
        ``opened`` chunks are positive for those chunks.

        Call it *before* retrieving for the follow-up in the same session: the session's latest
        retrieval is the one judged, so called after, the follow-up would be compared with itself
        and judged a restatement of itself.
        """
        from rlfb.implicit import ImplicitSignals

        store = self._require_store()
        previous = store.last_event(session_id)
        if previous is None:
            return []
        if self._implicit is None:  # built on first use: it holds the dense model's encoder, if any
            self._implicit = ImplicitSignals(encode=self._dense_encoder())
        records = []
        for sig in self._implicit.infer(previous, query, dwell_seconds=dwell_seconds, cited=cited, opened=opened):
            records.append(
                self.feedback(sig.event_id, sig.signal, chunk_id=sig.chunk_id, timestamp=timestamp,
                              session_id=session_id, idempotency_key=sig.idempotency_key,
                              comment=sig.reason or None)
            )
        return records

    def episode(self, event_id: str, record: Any, *, event: Mapping[str, Any] | None = None) -> Episode:
        """Rebuild the logged decision of ``event_id`` with the rewards of ``record``.

        ``prior_rewards`` are what earlier feedback on the event gave each shown
        chunk, unclipped. ``event`` is the logged event, when already read.
        """
        store = self._require_store()
        event = store.event(event_id) if event is None else event
        if event is None:
            raise UnknownEventError(f"no retrieval event {event_id!r}")
        names = self.retriever_names
        chunks = event["chunks"]
        shown_ids = tuple(c["chunk_id"] for c in chunks)
        shown = np.array(
            [[_as_float(c["normalized"].get(n)) for n in names] for c in chunks], dtype=np.float64
        ).reshape(len(chunks), len(names))
        chunk_rewards = np.array([float(record.chunk_rewards.get(c, 0.0)) for c in shown_ids])
        # the fused scores as shown (weights plus memory and confidence): policies re-rank with them
        logged = np.array([np.nan if c.get("score") is None else c["score"] for c in chunks], dtype=np.float64)
        scores = logged if logged.size and np.all(np.isfinite(logged)) else None
        # unclipped: a chunk's clipped total minus this record hides earlier rewards once the sum hits the clip
        earlier = store.chunk_reward_sums(event_id, before_feedback_id=getattr(record, "feedback_id", None))
        prior = np.array([earlier.get(c, 0.0) for c in shown_ids], dtype=np.float64)
        decision = event["decision"]
        ctx = self._contexts.get(event_id)
        embedding = ctx.query_embedding if ctx is not None else None
        if embedding is None and event.get("query") and not event.get("query_hashed"):
            embedding = self._query_embedding(event["query"])
        if ctx is not None:
            query = self._learner_query(ctx.query)
        elif event.get("query_hashed"):
            # the learner's key as logged (a hash of the normalised text); events logged before it was kept
            # are known by the hash of their raw text
            query = (event.get("metadata") or {}).get(QUERY_KEY) or _HASHED + event["query_hash"]
        else:
            query = event.get("query") or ""
        return Episode(
            event_id=event_id,
            query=query,
            retrievers=names,
            decision=Decision(
                weights=decision.get("weights") or {},
                arm=decision.get("arm"),
                propensity=float(decision.get("propensity", 1.0)),
                explored=bool(decision.get("explored", False)),
                policy=decision.get("policy") or "",
                sampling_temperature=decision.get("sampling_temperature"),
            ),
            shown_ids=shown_ids,
            shown=shown,
            chunk_rewards=chunk_rewards,
            reward=float(record.reward),
            query_type=event.get("query_type") or "default",
            features=event.get("features") or {},
            timestamp=float(event["timestamp"]),
            feedback_time=float(record.timestamp) if hasattr(record, "timestamp") else time.time(),
            query_embedding=embedding,
            prior_rewards=prior,
            response_level=getattr(record, "chunk_id", None) is None,
            scores=scores,
        )

    def _require_store(self) -> Any:
        if self._store is None:
            raise ValidationError("this ensemble has no feedback store; pass store='feedback.db'")
        return self._store

    # ------------------------------------------------------------------ weight config centre
    def _persist(self, *, force: bool = False) -> None:
        if self._store is None:
            return
        now = time.monotonic()
        self._dirty = True
        if not force and not self._persist_due(now):
            return
        self._state_version = self._own_version = self._store.save_policy_state(
            self._state_to_save(), self._learner.weights(), policy=self._learner.policy_name
        )
        self._last_persist = now
        self._dirty = False

    def _persist_due(self, now: float) -> bool:
        """Whether a snapshot is due at ``now`` (monotonic): ``persist_interval`` after the last, or none was
        written yet; an infinite interval writes only when forced (flush, close, save)."""
        return self.persist_interval < math.inf and now - self._last_persist >= self.persist_interval

    def flush(self) -> None:
        """Write the learner's state to the store now if feedback changed it since the last snapshot."""
        with self._guarded():
            if self._dirty:
                self._persist(force=True)

    def _refresh(self, *, force: bool = False) -> None:
        """Pick up weights and policy state another process wrote to the store."""
        if self._store is None:
            return
        now = time.monotonic()
        if not force and now - self._last_refresh < self.refresh_interval:
            return
        self._last_refresh = now
        # check, read and load under both locks: feedback learned between a read made outside them and the
        # load was thrown away (the weights property refreshes from any thread)
        with self._guarded():
            self._load_newer(now)

    def _load_newer(self, now: float) -> None:
        """The body of :meth:`_refresh`, under both locks."""
        if self._dirty:
            # never drop local learning that is not written yet: write it (when due) instead of reading
            if self._persist_due(now):
                self._persist(force=True)
            return
        if self._store.state_version() <= self._state_version:
            return
        saved = self._store.load_policy_state()
        if saved is None:
            return
        newest = int(saved["version"])
        if not self._is_ours(saved):
            # another policy, or an ensemble of other retrievers, wrote this store last: do not mis-read
            # its state, nor read that snapshot again; but this policy's own newest snapshot under it
            # (a store shared by two apps, or a policy switched and switched back) is still ours
            # snapshots up to the newest already seen were searched before: page back only through the new ones
            seen, self._state_version = self._state_version, newest
            saved = self._own_snapshot(after=max(self._own_version, seen))
            if saved is None and self._own_version == 0:
                saved = self._other_models_snapshot()
            if saved is None:
                return
        self._learner.load_state_dict(saved["state"])
        self._own_version = int(saved["version"])
        self._state_version = max(newest, self._own_version)

    def _own_snapshot(self, after: int) -> Mapping[str, Any] | None:
        """The store's newest snapshot that is this ensemble's own (:meth:`_is_ours`) and newer than version
        ``after``; ``None`` if there is none, or from a store that cannot tell.

        Snapshots of this policy are read newest first: another app of the same policy with other settings
        (hyperparameters, chunk exploration) may have written since, and this app's own older state, not a
        fresh learner, is what it goes on from after a restart.
        """
        name = self._learner.policy_name
        try:
            saved = self._store.load_policy_state(policy=name)
            while saved is not None and int(saved["version"]) > after:
                if self._is_ours(saved):
                    return saved
                saved = self._store.load_policy_state(policy=name, before=int(saved["version"]))
        except TypeError:  # a store of the user's own, whose load_policy_state takes no policy (or no before)
            pass
        return None

    def _other_models_snapshot(self) -> Mapping[str, Any] | None:
        """For an ensemble with no snapshot of its own, asked once: this policy's newest snapshot if it is of its
        kind but for the dense model, with the memory's query embeddings left out (another model's), or ``None``.

        A new dense model (another version of its package changes its cache key too) thus starts from what was
        learned with the old one: the weights, confidences and the memory of each question asked, by its text;
        only the similarity to other questions is learned again. Once it has saved a snapshot of its own, the
        old model's (an app still running it) are another kind's again.
        """
        # asked once, of this policy's newest snapshot alone: not paged back through the history on every
        # refresh, nor taken from an app still running the old model once this one has begun
        model = None if self._other_models_asked else self._dense_model_key()
        self._other_models_asked = True
        if model is None:
            return None
        try:
            saved = self._store.load_policy_state(policy=self._learner.policy_name)
        except TypeError:  # a store of the user's own, whose load_policy_state takes no policy
            return None
        theirs = SnapshotKind.of(saved)
        if saved is None or theirs.model is None:
            return None
        ours = SnapshotKind.of_learner(self._learner, dim=self._query_dim() if theirs.dim is not None else None,
                                       model=model)
        if set(theirs.differences(ours)) != {"model"}:
            return None
        state = dict(saved["state"])
        try:
            state["memory"] = without_embeddings(state["memory"])
        except (TypeError, ValueError, AttributeError):  # a damaged memory: not a state to start from
            return None
        return {**saved, "state": state}

    def _is_ours(self, saved: Mapping[str, Any]) -> bool:
        """Whether a store snapshot is of this ensemble's kind (:class:`~rlfb.snapshot_kind.SnapshotKind`).

        Not ours: another policy; other retrievers; the same policy with other hyperparameters
        (another ``step``, other bounds; the weights may differ), whose learned state has another
        shape; another chunk exploration (``LearnerConfig.exploration``: an evaluation app with
        ``exploration="none"`` beside the live one), whose explorer state would not load; a memory of
        another dense model's embeddings (a model upgrade on the same store): of another dimension, with
        which every retrieval would fail, or of another model named in the snapshot (its cache key), whose
        similarities mean nothing to this one (but see :meth:`_other_models_snapshot`, for a first start).
        Older snapshots name neither policy nor retrievers; a
        damaged one is read (and refused) by ``load_state_dict``.
        """
        theirs = SnapshotKind.of(saved)
        # the query dimension costs an embedding the first time: only asked for when the snapshot names one
        ours = SnapshotKind.of_learner(self._learner, dim=self._query_dim() if theirs.dim is not None else None,
                                       model=self._dense_model_key() if theirs.model is not None else None)
        return not theirs.differences(ours)

    def _dense_model_key(self) -> str | None:
        """The dense retriever's model as its encodings are cached (``None``: no dense retriever, or a model handed
        over already loaded, whose origin is unknown)."""
        try:
            key = getattr(self._dense_retriever(), "cache_key", None)
        except ModelNotFoundError:  # a corpus read from the cache alone, the model since uninstalled: name none
            return None
        return key if isinstance(key, str) else None

    def _state_to_save(self) -> dict[str, Any]:
        """The learner's state, its memory naming the dense model its query embeddings are of: a snapshot of
        another model's memory is then set aside (:meth:`_is_ours`) even when the two share a dimension."""
        return naming_model(self._learner.state_dict(), self._dense_model_key())

    def _query_dim(self) -> int | None:
        """The dimension of this ensemble's query embeddings (``None`` without a dense retriever)."""
        if self._query_dim_cache is _UNKNOWN:
            e = self._query_embedding("dimension")
            self._query_dim_cache = None if e is None else int(e.shape[0])
        return self._query_dim_cache

    def refresh(self) -> dict[str, float]:
        """Reload weights from the store now; returns the current weights."""
        self._refresh(force=True)
        return self._learner.weights()

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write the index, retrievers and learner state to a directory (JSON, ``.npy``; never pickle).

        Everything is written to a new folder beside ``path`` first and swapped in only when
        complete, so a save that fails (chunk metadata that JSON cannot hold, a full disk) leaves
        the previous save as it was. ``path`` must be new, empty, or an earlier save.
        """
        with self._save_lock:
            self.flush()
            table, retrievers = self._index()
            config = {
                "format": _FORMAT,
                "retrievers": list(retrievers),
                "members": list(self._members),  # callables are not saved: pass members= to load()
                "fusion": self.fusion,
                "candidate_k": self.candidate_k,
                "rrf_c": self.rrf_c,
                "seed": self.seed,
                "policy": self._learner.policy_name,
                "refresh_interval": _interval_json(self.refresh_interval),
                "persist_interval": _interval_json(self.persist_interval),
            }
            with saving_into(Path(path), marker=_CONFIG_FILE, what="ensemble") as tmp:
                table.save(tmp)  # metadata JSON cannot hold is a ValidationError naming the chunk
                for name, r in retrievers.items():
                    r.save(tmp / "retrievers" / name)
                (tmp / _CONFIG_FILE).write_text(json.dumps(config, indent=2, allow_nan=False), encoding="utf-8")
                # learning holds self._lock: read (and encode) the state under it, or a save made while
                # feedback arrives sees dicts change size mid-read, or half of one update
                with self._lock:
                    state = json.dumps(self._state_to_save(), allow_nan=False)
                (tmp / "learner.json").write_text(state, encoding="utf-8")

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        store: Any = None,
        retriever_options: Mapping[str, Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> FeedbackEnsemble:
        """Load what :meth:`save` wrote: the index, the settings, the learner's settings and all it learned.

        ``retriever_options`` maps a saved retriever's name to keyword arguments of its ``load``:
        what a save cannot hold, such as a BM25 ``tokenizer`` callable or a dense or SPLADE
        ``model`` passed in already loaded (``{"bm25": {"tokenizer": fn}}``), or a setting to
        change (``{"dense": {"device": "cuda"}}``). A retriever's disk-cache switch, device and
        ``model_key`` otherwise come back as saved. ``kwargs`` override the saved ensemble
        settings (``fusion``, ``candidate_k``, ``persist_interval``, ``refresh_interval``, ...); the
        learner comes back with the policy, hyperparameters, weights and learner settings it was
        saved with (``policy=``, ``learner_config=`` or ``weights=`` is a :class:`ValidationError`).
        With a ``store`` whose newest snapshot is of the same policy and retrievers and has learned
        from more feedback than the save (other processes went on learning), the store's state is kept:
        loading an older save never rolls the store back. Search members are not saved: pass the
        same ``members=`` again. A damaged file raises :class:`CorruptStateError`.
        """
        from rlfb.learner import Learner
        from rlfb.retrievers import load_retriever

        root = Path(path)
        learned = sorted({"policy", "learner_config", "weights"} & set(kwargs))
        if learned:  # the saved learner state would overwrite them: refuse rather than drop them unsaid
            raise ValidationError(
                f"load() brings back the saved learner, so it takes no {learned}: set weights afterwards with "
                "ens.set_weights(...), or build a new ensemble for another policy"
            )
        try:
            config = json.loads((root / _CONFIG_FILE).read_text(encoding="utf-8"), parse_constant=_no_constant)
            state = json.loads((root / "learner.json").read_text(encoding="utf-8"), parse_constant=_no_constant)
            if not isinstance(config, dict):
                raise CorruptStateError(f"{root / _CONFIG_FILE} holds a {type(config).__name__}, not settings")
            if config.get("format") != _FORMAT:
                raise CorruptStateError(f"{root / _CONFIG_FILE}: unknown format {config.get('format')!r}")
            names = [str(n) for n in config["retrievers"]]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: nested too deep
            raise CorruptStateError(f"cannot read an ensemble from {root}: {exc!r}"[:500]) from exc
        saved_members = config.get("members") or []
        given = {m.name for m in kwargs.get("members", ()) if isinstance(m, SearchMember)}
        if isinstance(saved_members, list) and not set(map(str, saved_members)) <= given:
            raise ValidationError(
                f"{root} was saved with the search members {saved_members!r}: pass them again, "
                "load(path, members=[SearchMember(name, search_fn), ...])"
            )
        if retriever_options is not None and not isinstance(retriever_options, Mapping):
            raise ValidationError("retriever_options must map retriever names to mappings of load() arguments")
        options_of = dict(retriever_options or {})
        unknown = sorted(map(str, set(options_of) - set(names)))
        if unknown:
            raise ValidationError(f"retriever_options names {unknown}, but {root} holds the retrievers {names}")
        for name, opts in options_of.items():
            if not isinstance(opts, Mapping) or not all(isinstance(k, str) for k in opts):
                raise ValidationError(f"retriever_options[{name!r}] must be a mapping of load() arguments by name")
        table = ChunkTable.load(root)
        retrievers = {n: load_retriever(root / "retrievers" / n, **options_of.get(n, {})) for n in names}
        learner = Learner.untrained_like(state)  # settings and hyperparameters as saved; state loads below
        saved_count = _n_learned(state, root)
        try:
            # the whole state is checked now, before a store is opened: also when the store turns out
            # to be ahead of this save and keeps its own state, a damaged learner.json is an error
            Learner.untrained_like(state).load_state_dict(state)
        except CorruptStateError as exc:
            raise CorruptStateError(f"{root / 'learner.json'}: {exc}") from exc
        options = {
            "fusion": config.get("fusion", "minmax"),
            "candidate_k": config.get("candidate_k", 100),
            "rrf_c": config.get("rrf_c", 60.0),
            "seed": config.get("seed", 0),
            "policy": learner.policy,
            "learner_config": learner.config,
        }
        for name in ("refresh_interval", "persist_interval"):  # older saves have neither: the defaults
            if name in config and name not in kwargs:  # one given explicitly wins, a damaged saved one too
                options[name] = _interval_from_json(config[name], name, root / _CONFIG_FILE)
        options.update(kwargs)
        try:
            ens = cls(retrievers, table, store=store, **options)
        except ValidationError as exc:
            if kwargs:  # the caller's own settings may be what is wrong
                raise
            raise CorruptStateError(f"{root / _CONFIG_FILE}: {exc}") from exc
        if ens._learner.n_learned > saved_count:
            # the store already holds this policy's state, learned from more feedback than the
            # save: the store is the live record (other processes may have learned since the save),
            # so the save must not roll it back
            return ens
        ens._learner.load_state_dict(state)
        return ens

    def close(self) -> None:
        """Flush the learner's state and close the store."""
        if self._store is not None:
            self.flush()
            self._store.close()

    def __enter__(self) -> FeedbackEnsemble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        w = ", ".join(f"{n}={v:.3f}" for n, v in self.weights.items())
        return f"FeedbackEnsemble({len(self)} chunks, fusion={self.fusion!r}, weights: {w})"


def _updated(r: Retriever, table: ChunkTable, show_progress: bool) -> Retriever:
    """``r.updated(table)`` (which reuses unchanged chunks' work), else a copy of ``r`` indexed afresh."""
    update = getattr(r, "updated", None)
    if update is None:  # a retriever of the user's own that only follows the Retriever protocol
        return copy.copy(r).index(table.chunks(), show_progress=show_progress)
    return update(table, show_progress=show_progress)


def _as_retriever_map(
    retrievers: Mapping[str, Retriever] | Sequence[Retriever], *, allow_empty: bool = False
) -> dict[str, Retriever]:
    if isinstance(retrievers, Mapping):
        out = dict(retrievers)
    else:
        out = {}
        for r in retrievers:
            if r.name in out:
                raise ValidationError(f"two retrievers are named {r.name!r}")
            out[r.name] = r
    if not out and not allow_empty:
        raise ValidationError("an ensemble needs at least one retriever or member")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a saved state may hold")


def _open_store(store: Any) -> Any:
    if store is None:
        return None
    if isinstance(store, (str, os.PathLike)):
        from rlfb.store import FeedbackStore

        return FeedbackStore(store)
    if not all(callable(getattr(store, name, None)) for name in ("log_event", "state_version", "load_policy_state")):
        raise ValidationError(f"store must be a FeedbackStore, a path to an SQLite file or None, got {store!r}")
    return store


def _seconds(value: object, name: str) -> float:
    """A number of seconds >= 0; infinity means never (simulations never write snapshots)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:  # NaN fails >= too
        raise ValidationError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _interval_json(seconds: float) -> float | str:
    """An interval as JSON holds it: infinity ("writes only when forced") is the string ``"inf"``, as JSON has none."""
    return "inf" if seconds == math.inf else seconds


def _interval_from_json(value: object, name: str, file: Path) -> float:
    """A saved interval back in seconds; a damaged one is a :class:`CorruptStateError` naming the file."""
    if value == "inf":
        return math.inf
    try:
        return _seconds(value, name)
    except ValidationError as exc:  # damaged saved settings, not the caller's argument
        raise CorruptStateError(f"{file}: {exc}") from exc


def _logged_metadata(metadata: Mapping[str, Any] | None, query: str, key: str) -> dict[str, Any]:
    """An event's metadata; where the learner knows the question by a key other than its text (a store
    that keeps no text), plus that key, so that an episode rebuilt after a restart finds the question the
    memory knows (a hash, no text)."""
    out = dict(metadata or {})
    if key != query:
        out[QUERY_KEY] = key
    return out


def _n_learned(state: Any, root: Path) -> int:
    """How many episodes a saved learner state has learned from."""
    count = state.get("n_learned") if isinstance(state, Mapping) else None
    # a negative count would always lose to the store's and skip this save's state unsaid
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise CorruptStateError(f"{root / 'learner.json'}: n_learned must be a count of episodes, got {count!r}")
    return count


def _check_embedding_strs(strs: Sequence[str] | None) -> tuple[str, ...]:
    """The texts to embed in place of the question (``()``: the question itself).

    Blank ones are left out, not refused: a HyDE transform passes its LLM's answer on as it is, and
    LlamaIndex's own retrievers take an empty one.
    """
    if strs is None:
        return ()
    if isinstance(strs, (str, bytes)) or not isinstance(strs, Iterable):
        raise ValidationError(f"embedding_strs must be a sequence of strings, got {type(strs).__name__}")
    out = tuple(strs)
    for s in out:
        if not isinstance(s, str):
            raise ValidationError(f"embedding_strs must hold strings, got {s!r}")
    return tuple(s for s in out if s.strip())


def _scores(
    r: Retriever, query: str, embedding_strs: tuple[str, ...], score: Callable[[Retriever, str], Any]
) -> np.ndarray:
    """``score(r, query)`` as float64; for a retriever that embeds queries, the mean over ``embedding_strs``
    where there are any (normalised embeddings: the mean similarity is the averaged embedding's, scaled)."""
    if embedding_strs and getattr(r, "embeds_queries", False):
        return np.mean([np.asarray(score(r, s), dtype=np.float64) for s in embedding_strs], axis=0)
    return np.asarray(score(r, query), dtype=np.float64)


def _check_rerank_chunks(chunks: Any) -> list[Chunk]:
    """``chunks`` to re-rank as a list, each id once (the first chunk given with it); else ValidationError."""
    if chunks is None or isinstance(chunks, (str, Chunk)) or not isinstance(chunks, Iterable):
        raise ValidationError(f"chunks must be a sequence of Chunk objects, got {type(chunks).__name__}")
    unique: dict[str, Chunk] = {}
    for c in chunks:
        if not isinstance(c, Chunk):
            raise ValidationError(f"rerank takes Chunk objects, got {type(c).__name__}")
        unique.setdefault(c.id, c)
    return list(unique.values())


def _check_query(query: object) -> str:
    if not isinstance(query, str):
        raise ValidationError(f"query must be a string, got {type(query).__name__}")
    return query


def _as_float(value: Any) -> float:
    """A logged score as a float; a missing one (None or NaN) counts as 0."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return out if math.isfinite(out) else 0.0


def _finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _chunk_row(hit: Hit, used: int | None = None) -> dict[str, Any]:
    return {
        "chunk_id": hit.chunk_id,
        "rank": hit.rank,
        "score": hit.score,
        "scores": dict(hit.scores),
        "normalized": dict(hit.normalized),
        "proposed_by": list(hit.proposed_by),
        "used": used is None or hit.rank <= used,
    }
