"""``FeedbackEnsemble``: retrieve with several retrievers, fuse with learned weights, learn from feedback.

The class holds the ensemble's state, its locks and its public API; each concept's work is in a module of its
own that it delegates to: :mod:`rlfb.candidates` (the candidate pool, its context and the hits),
:mod:`rlfb.corpus_index` (indexing and corpus updates), :mod:`rlfb.feedback_learning` (what a retrieval logs,
and feedback on it learned by its maker), :mod:`rlfb.snapshot_sync` (the learner's state in step with the
store's snapshots) and :mod:`rlfb.ensemble_folder` (:meth:`~FeedbackEnsemble.save` and
:meth:`~FeedbackEnsemble.load`).

>>> from rlfb import FeedbackEnsemble
>>> ens = FeedbackEnsemble.from_texts(
...     ["the aurora is caused by charged particles from the sun",
...      "tides are caused by the moon", "volcanoes erupt molten rock"],
...     ids=["aurora", "tides", "volcanoes"], retrievers=("bm25",))
>>> result = ens.retrieve("what causes the aurora", k=2)
>>> result.hits[0].chunk_id, result.hits[0].rank
('aurora', 1)
>>> ens.weights
{'bm25': 1.0}
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfb.candidates import (
    add_member_candidates,
    candidate_vectors,
    check_embedding_strs,
    check_query,
    check_rerank_chunks,
    make_context,
    make_hits,
    pool_rows,
    rerank_scores,
)
from rlfb.corpus_index import checked_chunks, checked_ids, index_with, indexed_table, rebuilt, removal, retriever_map
from rlfb.ensemble_folder import load_ensemble, save_ensemble
from rlfb.errors import EmptyCorpusError, NoStoreError, NotCopyableError, UnknownChunkError, ValidationError
from rlfb.feedback_learning import QUERY_KEY as QUERY_KEY  # importable from here, as it always was
from rlfb.feedback_learning import catch_up as catch_up_feedback
from rlfb.feedback_learning import (
    learn_record,
    learner_query,
    log_retrieval,
    metadata_to_log,
    rebuild_episode,
    record_and_learn,
    record_implicit,
)
from rlfb.fusion import check_fusion, rank_matrix
from rlfb.members import SearchMember
from rlfb.policies.base import Context, Decision, Episode, Policy
from rlfb.retrievers.base import ChunkTable, Retriever, dense_retriever
from rlfb.runs import hashes_queries, in_callers_block, remember_maker, store_lock
from rlfb.snapshot_sync import (
    _UNKNOWN,
    asked,
    forget,
    learned,
    persist_state,
    refresh_state,
    undo_on_rollback,
    write_unsaved,
)
from rlfb.types import (
    Chunk,
    Hit,
    RetrievalResult,
    check_known_options,
    keyword_options,
    make_chunks,
    text_list,
    validate_flag,
    validate_k,
    validate_seconds,
)

if TYPE_CHECKING:
    from typing_extensions import Self

    from rlfb.implicit import ImplicitSignals
    from rlfb.learner import Learner
    from rlfb.store.records import FeedbackRecord

__all__ = ["FeedbackEnsemble"]


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
        The policy's default weights (for ``fixed``, the weights; validated: finite, non-negative). Given,
        they win over other default weights in the store's snapshot, and are written there as
        :meth:`set_weights` writes them; not given, the store's are kept.
    store
        A :class:`rlfb.store.FeedbackStore`, a path to an SQLite file, or ``None`` (no logging).
    candidate_k
        How many of each retriever's best chunks enter the candidate pool. Every
        candidate is scored by every retriever, so a chunk absent from one list
        still gets that retriever's real score instead of zero.
    rrf_c
        RRF's constant ``c`` in ``1 / (c + rank)``, for ``fusion="rrf"`` and for a search member's hits
        that come without a score (60, as LangChain's ``EnsembleRetriever`` and the RRF paper take it).
    learner_config
        A :class:`rlfb.learner_config.LearnerConfig` or a dict of its options (feedback memory, chunk
        confidence, exploration, replay, guardrail); a misspelt name is an
        :class:`~rlfb.errors.UnknownOptionError`.
    seed
        Seeds the learner's random streams (exploration, Thompson sampling), so a run is reproducible.
    refresh_interval
        Seconds between checks for weights that another process wrote to the store.
    persist_interval
        Least seconds between two snapshots of the learner's state in the store;
        0 (the default) writes one after every feedback. State not yet written is
        flushed by :meth:`flush`, :meth:`save`, :meth:`close` and at the interpreter's
        exit; until then its episodes are kept and learned again on top of any newer
        snapshot another process writes, so that neither's learning is lost; the feedback rows it holds are
        marked "held" in the store, and a process killed before it writes them leaves them to the next
        ensemble of their kind to start. A snapshot is the
        whole learned state, which grows with what is learned (0.6 MB after 5,000
        retrievals of BM25 alone in the README's soak test, 0.84 MB after 10,000), so
        each feedback costs more as it grows: under heavy traffic give 1.0 or more.
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

        self._retrievers: dict[str, Retriever] = retriever_map(retrievers, allow_empty=bool(members))
        self._members: dict[str, SearchMember] = {}
        for m in members:
            if m.name in self._retrievers or m.name in self._members:
                raise ValidationError(f"two retrievers or members are named {m.name!r}")
            self._members[m.name] = m
        self._table = indexed_table(chunks, self._retrievers)
        self._extra: OrderedDict[str, Chunk] = OrderedDict()  # chunks members found outside the index
        self._extra_size = 100_000
        # the table each live context was scored against: its hits take their texts from it, not from a
        # table a corpus update swapped in since (weak: a context let go takes its entry with it)
        self._scored_on: weakref.WeakKeyDictionary[Context, ChunkTable] = weakref.WeakKeyDictionary()
        # chunks given to rerank under an indexed id with another text (edited since): their hits carry them
        self._given_on: weakref.WeakKeyDictionary[Context, dict[str, Chunk]] = weakref.WeakKeyDictionary()
        self.fusion, self.candidate_k, self.rrf_c, self.refresh_interval, self.persist_interval = _scalar_settings(
            fusion, candidate_k, rrf_c, refresh_interval, persist_interval
        )
        # never written nor read yet: the first of each is due at once. 0.0 read as "at the clock's start", and
        # time.monotonic() counts from boot, so within persist_interval of a boot nothing was written at all
        self._last_persist = -math.inf
        self._dirty = False
        # episodes learned since the last snapshot this ensemble wrote: learned again on top of a newer snapshot
        # another process wrote meanwhile (rlfb.snapshot_sync.take_newer), so that neither's learning is lost
        self._unsaved: list[Any] = []
        self._unsaved_asks: dict[str, int] = {}  # remembered questions asked since the last snapshot, by count
        # feedback rows committed through another store handle whose learning here then failed (a busy or full
        # store): learned at this ensemble's next feedback, a retry with the same idempotency key included
        # (rlfb.feedback_learning.learn_pending)
        self._unlearned: dict[int, Any] = {}
        # the newest feedback row looked at for learning it owed (rlfb.feedback_learning.catch_up): rows stored and
        # not learned (a process killed before it learned them, stored alone), learned at the first retrieval
        # or feedback and at each refresh after it
        self._caught_up = 0
        # feedback rows learned here and not yet written in a snapshot (persist_interval above 0), by id, with their
        # episodes: marked "held" in the store, and learned once the snapshot that writes them marks them
        # (rlfb.snapshot_sync.persist_state); another ensemble that starts meanwhile may take them, as it takes
        # those of a process killed before its snapshot, and then they are left out here (take_newer)
        self._held: dict[int, Any] = {}
        self._take_held = True  # the looks from this ensemble's start take held rows too, until one comes up short
        self._caught_up_once = self._catching_up = self._catch_up_warned = False
        self._holding_snapshots = False  # a batch of rows owed writes one snapshot after it
        self._owed_more = False  # the last look found a whole batch owed: more may be, looked for at once
        # before the first snapshot, the learner's state that the unsaved learning went on top of: what a rolled
        # back feedback is learned again on (rlfb.snapshot_sync.learn_again_on_rollback)
        self._rollback_base: tuple[Any, int, Any] | None = None
        self._lock = threading.RLock()
        self._update_lock = threading.Lock()  # one corpus update at a time; searches go on meanwhile
        self._save_lock = threading.Lock()  # one save at a time; retrieval and feedback go on meanwhile
        # saves in the order their learner states were read, and the newest written to each folder: a save whose
        # state is older than the one another thread has written there since writes nothing (save_ensemble)
        self._save_seq = 0
        self._saved_seq: dict[str, int] = {}
        self._query_dim_cache: Any = _UNKNOWN
        self._other_models_asked = False  # other_models_snapshot: a first start takes another model's state once
        self._exploration_noted = False  # note_default_exploration: warned once
        self._policy_noted = False  # note_other_policy: asked in the constructor only
        self._learner = Learner(
            self.retriever_names, policy=policy, weights=weights, config=learner_config, seed=seed
        )
        self.seed = self._learner.seed  # checked, and a plain int (a numpy one could not be saved as JSON)
        # the weights given, as the policy took them (clipped to its bounds); a policy of the user's without
        # set_weights keeps what its state says
        takes = weights is not None and getattr(self._learner.policy, "set_weights", None) is not None
        given = self._learner._default_weights().copy() if takes else None
        self._store = open_store(store)
        if hashes_queries(self._store):
            # a store that keeps no query text: nor do the retrievers' disk caches keep its query encodings
            # (a SPLADE encoding reads back as the question's words, keyed by the sha256 the events keep)
            for r in self._retrievers.values():
                if hasattr(r, "cache_queries"):
                    r.cache_queries = False
        self._state_version = 0  # the newest snapshot read or written
        self._own_version = 0  # the newest snapshot of this ensemble's own state read or written
        self._last_refresh = -math.inf
        self._implicit: Any = None  # ImplicitSignals, built by observe()
        self._contexts: OrderedDict[str, Context] = OrderedDict()  # recent contexts, for fast episodes
        self._context_cache_size = 10_000
        if self._store is not None:
            # no catching up yet: FeedbackEnsemble.load may still replace the learner's state with the save's
            self._refresh(force=True, catch_up=False)
            # compared as the policy took them (clipped to its bounds): weights given beyond them differ from
            # any snapshot's, and a gradient learner set again on every restart would forget what it learned
            if weights is not None and given is not None and (
                    self._own_version == 0 or not np.array_equal(self._learner._default_weights(), given)):
                # the weights given are this app's choice (a redeploy with new weights): the store's snapshot,
                # taken whole above, had put the old ones back without a word. Written as set_weights writes them,
                # on a store with no snapshot of this ensemble's kind too: until 2026-12-06 they were not, so a
                # restart without weights= (or `rlfb weights show`) found none until the first feedback
                self.set_weights(weights)
        # the note that this ensemble starts afresh is for its first look at the store alone: later, another app's
        # snapshot is no reason to think it was restarted with the wrong policy
        self._policy_noted = True

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
    ) -> Self:
        """Index ``chunks`` with each named retriever (or given, unindexed retriever instance); ``kwargs`` go to
        :class:`FeedbackEnsemble` (an option it does not take is a :class:`ValidationError`, before any indexing)."""
        check_options(kwargs, cls)
        table = ChunkTable(chunks)
        if len(table) and not any(t.strip() for t in table.texts):
            # every chunk scored 0 and ranked in corpus order, with no error: a BEIR corpus whose text is in a
            # field the loader does not read ("contents") was indexed so, and evaluated to nDCG 0.005
            raise EmptyCorpusError(f"all {len(table)} chunk texts are empty or blank: nothing to index")
        return cls(index_with(table, retrievers, dict(retriever_options or {}), show_progress), table, **kwargs)

    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        retrievers: Sequence[str | Retriever] = ("bm25", "dense", "splade"),
        **kwargs: Any,
    ) -> Self:
        """Build an ensemble over raw texts; ids default to a hash of each text (:func:`rlfb.types.content_ids`)."""
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
        chunks = checked_chunks(chunks)
        if not chunks:
            return []
        with self._update_lock:
            self._reindex(self._table.changed(chunks), show_progress=show_progress)
        return [c.id for c in chunks]

    def add_texts(
        self,
        texts: Iterable[str],
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        show_progress: bool = False,
    ) -> list[str]:
        """:meth:`add_chunks` from raw texts; ``ids`` default to a hash of each text, as :meth:`from_texts` gives
        them (:func:`rlfb.types.content_ids`), so a text added again is the chunk it was, not a second copy, and a
        corpus built again with :meth:`from_texts` finds what was learned about it (until 2026-12-05 they were
        random). As in :meth:`from_texts`, a text given twice in one call is two chunks (the second id ends in
        ``#2``); added again in a later call, it is the chunk it was, with the metadata given last. Give ``ids`` to
        keep copies of one text from different sources apart.

        >>> ens = FeedbackEnsemble.from_texts(["tides follow the moon"], retrievers=("bm25",))
        >>> ens.add_texts(["geysers erupt"]) == ens.add_texts(["geysers erupt"]), len(ens)
        (True, 2)
        """
        if not isinstance(texts, str):
            texts = text_list(texts)  # a generator is read once, for the ids and the chunks alike
            if not texts and (ids is None or len(ids) == 0) and (metadatas is None or len(metadatas) == 0):
                return []  # nothing to index, as add_chunks([]); ids without texts fail in make_chunks
        return self.add_chunks(make_chunks(texts, ids, metadatas), show_progress=show_progress)

    def delete_chunks(self, chunk_ids: Iterable[str], *, show_progress: bool = False) -> None:
        """Remove chunks from the index (updating each retriever as :meth:`add_chunks` does).

        An id that is not indexed raises :class:`~rlfb.errors.UnknownChunkError` and
        nothing is removed. Feedback on earlier retrievals that showed a removed chunk
        is still accepted and learned from.
        """
        gone = checked_ids(chunk_ids)
        if not gone:
            return
        with self._update_lock:
            changed, removed = removal(self._table, gone)
            self._reindex(changed, show_progress=show_progress, gone=removed)

    def _reindex(self, table: ChunkTable, *, show_progress: bool, gone: Sequence[Chunk] = ()) -> None:
        """Index ``table`` with a copy of each corpus retriever, then swap table and retrievers at once.

        The copies are built without the ensemble's lock, so searches (and feedback) go on with
        the old pair meanwhile; ``gone`` (deleted chunks) stay nameable by in-flight results.
        """
        built = rebuilt(self._retrievers, table, show_progress)
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
    def members(self) -> tuple[SearchMember, ...]:
        """The search-only members, in the order of :attr:`retriever_names`."""
        return tuple(self._members.values())

    @property
    def retrievers(self) -> Mapping[str, Retriever]:
        """The corpus retrievers by name (a copy: the ensemble's own table is not changed through it)."""
        return dict(self._retrievers)

    @property
    def weights(self) -> dict[str, float]:
        """The current global fusion weights, as ``{retriever name: weight}``."""
        self._refresh()
        return self._learner.weights()

    def set_weights(self, weights: Mapping[str, float] | Iterable[float]) -> Self:
        """Set the policy's (default) fusion weights and write them to the store now.

        Validated as the learner's ``set_weights`` is (NaN, negative or all-zero weights are refused).
        Set on ``ens.learner`` itself they were not written: the next snapshot another process wrote,
        or a restart, brought the old weights back.

        >>> ens = FeedbackEnsemble.from_texts(["solar wind", "sourdough"], retrievers=("bm25",), policy="fixed")
        >>> ens.set_weights({"bm25": 1.0}).weights
        {'bm25': 1.0}
        """
        # one write transaction from reading the newest state to writing the new weights (a store of the user's
        # own without exclusive() as before); inside a caller's block that rolls back, the learner goes back too
        exclusive = getattr(self._store, "exclusive", None)
        with self._guarded(), exclusive() if exclusive is not None else nullcontext() as store:
            if store is not None and in_callers_block(store):
                undo_on_rollback(self, store)
            # onto the newest state: the new weights must not be overwritten by it
            self._refresh(force=True, catch_up=False)
            self._learner.set_weights(weights)
            self._persist(force=True)
        return self

    def weights_for(self, query: str) -> dict[str, float]:
        """The weights the greedy policy would use for ``query``'s query type."""
        from rlfb.features import query_features, query_type

        self._refresh()
        return self._learner.weights(query_type(query_features(check_query(query))))

    @property
    def learner(self) -> Learner:
        """The :class:`~rlfb.learner.Learner` that decides and learns (its state is the newest this process
        read; :attr:`weights` reads the store's first)."""
        return self._learner

    @property
    def store(self) -> Any:
        """The :class:`~rlfb.store.FeedbackStore` retrievals are logged to and feedback is read from, or ``None``."""
        return self._store

    @property
    def chunks(self) -> ChunkTable:
        """The indexed chunks, by id and in index order."""
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
        query = check_query(query)
        strs = check_embedding_strs(embedding_strs)
        depth = max(self.candidate_k, k)
        table, retrievers = self._index()  # one consistent pair, even while add_chunks swaps them
        pool = pool_rows(query, depth, table, retrievers, strs)
        if self._members:
            pool = add_member_candidates(query, depth, pool, table, retrievers, self._members, rrf_c=self.rrf_c,
                                         keep_extra=self._keep_extra, embedding_strs=strs)
        ids, raw, ranks, proposed = pool
        ctx = self._make_context(query, ids, raw, ranks, session_id, proposed, self._vectors(retrievers, ids))
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

    def _keep_extra(self, chunk: Chunk) -> None:
        """Remember a chunk found outside the index, so that hits and feedback can name it (bounded)."""
        with self._lock:  # searches call this while a corpus update prunes the same dict
            self._extra[chunk.id] = chunk
            self._extra.move_to_end(chunk.id)
            while len(self._extra) > self._extra_size:
                self._extra.popitem(last=False)

    def _for_learner(self, ctx: Context) -> Context:
        """``ctx`` with the question as the learner knows it (:func:`rlfb.feedback_learning.learner_query`)."""
        key = learner_query(self._store, ctx.query)
        return ctx if key == ctx.query else dataclasses.replace(ctx, query=key)

    def _vectors(
        self, retrievers: Mapping[str, Retriever], ids: Sequence[str], edited: Collection[str] = ()
    ) -> np.ndarray | None:
        """The candidates' dense embeddings where the learner's relevance feedback reads them, else ``None``
        (a gather of 100 x 384 floats a question, and 150 kB a kept context, for nothing)."""
        return candidate_vectors(retrievers, ids, edited) if self.learner.config.reads_candidate_embeddings else None

    def _make_context(
        self, query: str, ids: Sequence[str], raw: np.ndarray, ranks: np.ndarray, session_id: str | None,
        proposed: np.ndarray | None = None, vectors: np.ndarray | None = None,
    ) -> Context:
        return make_context(query, ids, raw, ranks, session_id, proposed, retrievers=self.retriever_names,
                            fusion=self.fusion, rrf_c=self.rrf_c, embed=self._query_embedding,
                            candidate_embeddings=vectors)

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
        written and ``event_id`` is ``None``; a retrieval not logged (``log=False``, or an ensemble without a
        store) is not explored either, since no feedback can reach it. ``timestamp`` (unix seconds)
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
        query = check_query(query)
        chunks = check_rerank_chunks(chunks)
        strs = check_embedding_strs(embedding_strs)
        if k is not None:
            k = validate_k(k)  # before the scoring, which is the slow part; and an empty list took any k
        if not chunks:
            return RetrievalResult(query=query, hits=[], weights=self.weights)
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
        query = check_query(query)
        strs = check_embedding_strs(embedding_strs)
        chunks = check_rerank_chunks(chunks)
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
        raw, edited = rerank_scores(query, chunks, table, retrievers, len(self._members), strs, self._keep_extra)
        # no retriever proposed these chunks: the caller did
        ids = [c.id for c in chunks]
        ctx = self._make_context(query, ids, raw, rank_matrix(raw), session_id, np.zeros(raw.shape, dtype=bool),
                                 self._vectors(retrievers, ids, edited))
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
            if logging:  # the store checks the event's arguments before ranking: see metadata_to_log
                logged_meta = metadata_to_log(self._store, ctx, learner_ctx.query, event_id=event_id,
                                              parent_id=parent_id, metadata=metadata, timestamp=timestamp)
            # a ranking not logged (an evaluation: no feedback can reach it) does not count as a use of the
            # memory's entries, which keeps them from eviction
            # exploring a list no feedback can reach (not logged: log=False, or no store) only costs its reader
            ranking = self._learner.rank(learner_ctx, k, explore=explore and logging, touch=log)
            if ranking.asked:  # written with the next snapshot (repeat discovery reads the counts)
                asked(self, learner_ctx.query)
            hits = self._hits(ctx, ranking)
            decision: Decision = ranking.decision
            logged_id = None
            if logging:
                logged_id = log_retrieval(self._store, ctx, decision, hits, used, event_id=event_id,
                                          parent_id=parent_id, metadata=logged_meta, timestamp=timestamp)
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
        """:meth:`retrieve` for each query, in order; every query is checked before any is retrieved (and logged)."""
        if isinstance(queries, str):  # iterating it would retrieve once per character
            raise ValidationError("queries must be a sequence of strings, not one string: use retrieve()")
        if isinstance(queries, Mapping) or not isinstance(queries, Iterable):  # a dict's keys, or a bare TypeError
            raise ValidationError(f"queries must be a sequence of strings, got {type(queries).__name__}")
        if kwargs.get("event_id") is not None:  # one id for every retrieval: the second was refused, the first logged
            raise ValidationError("event_id names one retrieval: retrieve_batch cannot take one; use retrieve()")
        checked = []
        for i, q in enumerate(queries):
            try:
                checked.append(check_query(q))
            except ValidationError as exc:
                raise ValidationError(f"queries[{i}]: {exc}") from None
        return [self.retrieve(q, k, **kwargs) for q in checked]

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
        return make_hits(ctx, ranking, table=self._scored_on.get(ctx), given=self._given_on.get(ctx) or {},
                         chunk=self.chunk, candidate_k=self.candidate_k)

    @property
    def implicit(self) -> ImplicitSignals:
        """How :meth:`observe` (and the LangChain retriever and handler made from this ensemble) read implicit
        signals: by default :class:`~rlfb.implicit.ImplicitSignals` comparing follow-ups with the dense
        retriever's encoder where there is one. Set it to change the follow-up window or the dwell
        threshold, ``ens.implicit = ImplicitSignals(followup_window=600, encode=ens.implicit.encode)``;
        it is not saved."""
        from rlfb.implicit import ImplicitSignals  # not at import: it brings the store's codec

        if self._implicit is None:  # built on first use: it holds the dense model's encoder, if any
            self._implicit = ImplicitSignals(encode=self._dense_encoder())
        return self._implicit

    @implicit.setter
    def implicit(self, value: ImplicitSignals) -> None:
        from rlfb.implicit import ImplicitSignals

        if not isinstance(value, ImplicitSignals):
            raise ValidationError(f"implicit must be an rlfb.implicit.ImplicitSignals, got {type(value).__name__}")
        self._implicit = value

    def _dense_encoder(self) -> Any:
        """The dense retriever's query encoder (normalised vectors), or ``None`` without one.

        SPLADE also encodes queries, but into sparse vocabulary vectors, which the
        memory and the reformulation check cannot compare by cosine.
        """
        return getattr(self._dense_retriever(), "encode_queries", None)

    def _dense_retriever(self) -> Retriever | None:
        """The corpus retriever named ``dense`` (whose query embeddings the memory keeps), or ``None``."""
        return dense_retriever(self._retrievers)

    def _query_embedding(self, query: str) -> np.ndarray | None:
        encode = self._dense_encoder()
        return None if encode is None else np.asarray(encode([query])[0], dtype=np.float32)

    def _remember(self, event_id: str, ctx: Context) -> None:
        remember_maker(event_id, self)  # feedback given through another learner's adapter comes back here
        # learning from the event needs no chunk embeddings (150 kB a context of 100 candidates): kept, 10,000
        # remembered contexts would hold 1.5 GB
        kept = ctx if ctx.candidate_embeddings is None else dataclasses.replace(ctx, candidate_embeddings=None)
        self._contexts[event_id] = kept
        if len(self._contexts) > self._context_cache_size:
            self._contexts.popitem(last=False)

    # ------------------------------------------------------------------ feedback
    def feedback(
        self,
        event_id: str | None,
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
    ) -> FeedbackRecord:
        """Record feedback on a logged retrieval and learn from it.

        Give a ``signal`` (``"explicit_positive"``, ``"implicit_negative"``,
        ...), a ``rating`` from 1 to 5, or a raw ``value`` in [-1, 1]. With
        ``chunk_id`` the feedback is about that chunk; otherwise it is spread
        over the retrieved chunks. Feedback outside the attribution window is
        stored and flagged but not learned from, and so is feedback on a
        retrieval this ensemble did not make (:func:`rlfb.runs.owns_event`);
        a retrieval another live ensemble of this process logged on this store
        is learned by that one (:func:`rlfb.runs.maker_of`).
        ``event_id`` is the retrieval's :attr:`~rlfb.RetrievalResult.event_id`,
        as it is (``None``, a retrieval that was not logged, is a
        :class:`~rlfb.errors.ValidationError` that says so).
        Returns the store's :class:`~rlfb.store.FeedbackRecord`.
        """
        return record_and_learn(self, event_id, signal, value=value, rating=rating, chunk_id=chunk_id,
                                timestamp=timestamp, session_id=session_id, user_id=user_id,
                                idempotency_key=idempotency_key, comment=comment, key=key)

    def _learn(self, record: Any, event: Mapping[str, Any] | None = None, *, undo: bool = False) -> None:
        """Learn from a stored feedback record (:func:`rlfb.feedback_learning.learn_record`); ``event``: its logged
        event, when already read. :func:`rlfb.runs.record_run_feedback` calls it on each event's maker."""
        learn_record(self, record, event, undo=undo)

    def observe(
        self,
        session_id: str,
        query: str | None = None,
        *,
        dwell_seconds: float | None = None,
        cited: Sequence[str] = (),
        opened: Sequence[str] = (),
        timestamp: float | None = None,
    ) -> list[FeedbackRecord]:
        """Infer implicit feedback on the session's latest retrieval and learn from it.

        ``query`` is the user's follow-up: a restatement of the previous query
        is a negative reformulation, a new topic is neutral. ``dwell_seconds``
        over the threshold with no follow-up is positive; ``cited`` and
        ``opened`` chunks are positive for those chunks.

        Call it *before* retrieving for the follow-up in the same session: the session's latest
        retrieval is the one judged, so called after, the follow-up would be compared with itself
        and judged a restatement of itself. With ``timestamp`` (a log replayed, events from a client's
        queue) the one judged is the session's latest retrieval made by then, and a time past the store's
        clock is a :class:`~rlfb.errors.FutureTimestampError`. The signals are kept and learned together or
        not at all: one refused (an idempotency conflict, a busy store) takes back those before it. The
        arguments are checked also when the session has no retrieval yet (nothing to judge: ``[]``).
        """
        return record_implicit(self, session_id, query, dwell_seconds=dwell_seconds, cited=cited, opened=opened,
                               timestamp=timestamp)

    def episode(self, event_id: str, record: Any, *, event: Mapping[str, Any] | None = None) -> Episode:
        """Rebuild the logged decision of ``event_id`` with the rewards of ``record``.

        ``prior_rewards`` are what earlier feedback on the event gave each shown
        chunk, unclipped. ``event`` is the logged event, when already read.
        """
        return rebuild_episode(self._require_store(), event_id, record, event, names=self.retriever_names,
                               contexts=self._contexts, embed=self._query_embedding)

    def _require_store(self) -> Any:
        if self._store is None:
            raise NoStoreError()
        return self._store

    # ------------------------------------------------------------------ weight config centre
    # _persist and _refresh read the clock here and hand it on: the snapshot bookkeeping (rlfb.snapshot_sync)
    # takes the time it is given, and a test stands a clock of its own in for this module's `time`
    def _persist(self, *, force: bool = False) -> None:
        """Write the learner's state as a snapshot when due (:func:`~rlfb.snapshot_sync.persist_state`)."""
        persist_state(self, time.monotonic(), force=force)

    def _learned(self, episode: Episode) -> None:
        """The learner learned ``episode``: keep it until written, and write a snapshot when due
        (:func:`~rlfb.snapshot_sync.learned`)."""
        learned(self, episode, time.monotonic())

    def flush(self) -> None:
        """Write the learner's state to the store now if feedback changed it since the last snapshot (or
        remembered questions were asked again: repeat discovery reads how often)."""
        with self._guarded():
            if self._dirty or self._unsaved_asks:
                write_unsaved(self, time.monotonic())

    def _refresh(self, *, force: bool = False, catch_up: bool = True) -> None:
        """Pick up weights and policy state another process wrote to the store
        (:func:`~rlfb.snapshot_sync.refresh_state`), and, with ``catch_up``, learn the feedback stored on this
        ensemble's decisions that no learner has taken (:func:`~rlfb.feedback_learning.catch_up`)."""
        looked = refresh_state(self, time.monotonic(), force=force)
        if catch_up and (looked or self._owed_more or not self._caught_up_once):
            catch_up_feedback(self)

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
        save_ensemble(self, path)

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        store: Any = None,
        retriever_options: Mapping[str, Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> Self:
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
        from as much feedback as the save or more (other processes went on learning, or set weights), the
        store's state is kept: loading an older save never rolls the store back. Otherwise the save's state
        is written to the store at once, for the other processes on it. Search members are not saved: pass the
        same ``members=`` again. A damaged file raises :class:`CorruptStateError`.
        """
        return load_ensemble(cls, path, store=store, retriever_options=retriever_options, kwargs=kwargs)

    def close(self) -> None:
        """Flush the learner's state and close the store, also one handed in (``store=FeedbackStore(...)``):
        the store's closing is what tells other code of this process that the ensemble is gone (feedback on its
        retrievals is then learned by an ensemble opened again on the file). Where ensembles or handlers share
        one store object, :meth:`flush` each and close the store once, at the end."""
        if self._store is not None:
            # one hold of both locks: a feedback another thread's call learned between the flush and the close
            # stayed held in the store, its learning unwritten (a thread audit, 2026-12-07)
            with self._guarded():
                self.flush()
                self._store.close()
        forget(self)  # nor held for the exit hook: clean, yet registered after a caller's block rolled back

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __copy__(self) -> FeedbackEnsemble:
        return self.__deepcopy__({})  # a shallow copy would share half of the learner's bookkeeping

    def __deepcopy__(self, memo: dict[int, Any]) -> FeedbackEnsemble:
        # a copy would be a second learner on the same store and models, learning apart from this one (the
        # locks, the open connection and the loaded models cannot be copied anyway: a bare TypeError before)
        raise NotCopyableError(
            "a FeedbackEnsemble cannot be copied: it is a live learner bound to its store; pass the same object "
            "to share it, or ens.save(folder) and FeedbackEnsemble.load(folder, store=...) for another one"
        )

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise NotCopyableError(
            "a FeedbackEnsemble cannot be pickled (it holds locks, a store connection and models): "
            "ens.save(folder) and FeedbackEnsemble.load(folder, store=...) carry it to another process"
        )

    def __repr__(self) -> str:
        # the weights in memory: a repr (a debugger, a log line) must not read, or write, the store
        w = ", ".join(f"{n}={v:.3f}" for n, v in self._learner.weights().items())
        return f"FeedbackEnsemble({len(self)} chunks, fusion={self.fusion!r}, weights: {w})"


def check_options(kwargs: Mapping[str, Any], cls: type | None = None, *, leave_out: Sequence[str] = (),
                  owner: str | None = None) -> None:
    """Refuse options :class:`FeedbackEnsemble` (or its subclass ``cls``) does not take now, not after the whole
    corpus was encoded. A constructor that takes ``**kwargs`` takes them all. ``leave_out``: options the caller
    (``load``) does not take either, named ``owner`` in the error.

    >>> check_options({"polciy": "thompson"})
    Traceback (most recent call last):
    ...
    rlfb.errors.UnknownOptionError: FeedbackEnsemble takes no option 'polciy' (did you mean 'policy'?); ...
    """
    # read off the class (a subclass's own __init__), as inspect.signature reads it
    known = keyword_options((cls or FeedbackEnsemble).__init__,  # type: ignore[misc]
                            leave_out=("retrievers", "chunks", *leave_out))
    if known is not None:
        check_known_options(kwargs, known, owner or (cls or FeedbackEnsemble).__name__)


def _scalar_settings(
    fusion: str, candidate_k: int, rrf_c: float, refresh_interval: float, persist_interval: float
) -> tuple[str, int, float, float, float]:
    """The ensemble's plain settings, checked."""
    fusion, candidate_k = check_fusion(fusion), validate_k(candidate_k, "candidate_k")
    if isinstance(rrf_c, bool) or not isinstance(rrf_c, (int, float)) or not 0 < rrf_c < math.inf:
        raise ValidationError(f"rrf_c must be a positive finite number, got {rrf_c!r}")
    return (fusion, candidate_k, float(rrf_c), validate_seconds(refresh_interval, "refresh_interval"),
            validate_seconds(persist_interval, "persist_interval"))


def check_settings(retrievers: Sequence[str | Retriever], **options: Any) -> None:
    """Refuse now what :meth:`FeedbackEnsemble.from_chunks` would refuse of ``retrievers`` and ``options`` (its
    keyword arguments) once the corpus is there: for an adapter that builds the ensemble at its first query,
    a misspelt policy or a NaN weight is an error at construction, not inside a live query engine.

    >>> check_settings(["bm25"], policy="thompsen")
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: unknown policy 'thompsen'; ...
    """
    from rlfb.corpus_index import check_retriever_options
    from rlfb.learner import Learner
    from rlfb.retrievers import check_retriever_names

    # the options only from_chunks takes (retriever_options, show_progress) go to it, the rest to the ensemble
    own = {n for n, p in inspect.signature(FeedbackEnsemble.from_chunks).parameters.items() if p.kind is p.KEYWORD_ONLY}
    check_options({k: v for k, v in options.items() if k not in own})
    specs = [retrievers] if isinstance(retrievers, str) else list(retrievers)
    check_retriever_names([s for s in specs if isinstance(s, str)])
    check_retriever_options(specs, options.get("retriever_options") or {})
    defaults = {n: p.default for n, p in inspect.signature(FeedbackEnsemble.__init__).parameters.items()}
    _scalar_settings(*(options.get(n, defaults[n])
                       for n in ("fusion", "candidate_k", "rrf_c", "refresh_interval", "persist_interval")))
    policy = options.get("policy", defaults["policy"])
    if isinstance(policy, str):  # a policy instance is checked when the ensemble is built: weights would set it
        # what the learner checks as names: a retriever instance without a name is named in its error
        names: list[Any] = [s if isinstance(s, str) else getattr(s, "name", s) for s in specs]
        names += [getattr(m, "name", m) for m in options.get("members") or ()]
        Learner(names, policy=policy, weights=options.get("weights"), config=options.get("learner_config"),
                seed=options.get("seed", defaults["seed"]))


def open_store(store: Any) -> Any:
    """``store`` as an ensemble keeps it (:func:`rlfb.store.as_store`, with the calls an ensemble makes)."""
    from rlfb.store import ENSEMBLE_STORE_METHODS, as_store

    return as_store(store, methods=ENSEMBLE_STORE_METHODS)
