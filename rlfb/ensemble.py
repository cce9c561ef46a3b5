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

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, UnknownEventError, ValidationError
from rlfb.fusion import FUSION_METHODS, normalize
from rlfb.policies.base import Context, Decision, Episode, Policy
from rlfb.retrievers.base import ChunkTable, Retriever, top_k
from rlfb.types import Chunk, Hit, RetrievalResult, make_chunks, validate_k

__all__ = ["FeedbackEnsemble"]

_CONFIG_FILE = "ensemble.json"


class FeedbackEnsemble:
    """An ensemble of retrievers whose fusion weights and chunk confidences learn from feedback.

    Parameters
    ----------
    retrievers
        Indexed retrievers, as a mapping from name to retriever or as a
        sequence (each retriever's ``name`` is used). All must index the same ids.
    chunks
        The indexed chunks (texts and metadata for the hits).
    fusion
        Score normalisation before the weighted sum: ``"minmax"``, ``"zscore"`` or ``"rrf"``.
    policy
        A policy name (``"fixed"``, ``"batch"``, ``"thompson"``, ``"gradient"``) or a policy instance.
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
    """

    def __init__(
        self,
        retrievers: Mapping[str, Retriever] | Sequence[Retriever],
        chunks: Sequence[Chunk] | ChunkTable,
        *,
        fusion: str = "minmax",
        policy: str | Policy = "fixed",
        weights: Mapping[str, float] | Sequence[float] | None = None,
        store: Any = None,
        candidate_k: int = 100,
        rrf_c: float = 60.0,
        learner_config: Any = None,
        seed: int = 0,
        refresh_interval: float = 5.0,
    ) -> None:
        from rlfb.learner import Learner  # local: keeps `import rlfb` light

        self._retrievers: dict[str, Retriever] = _as_retriever_map(retrievers)
        self._table = chunks if isinstance(chunks, ChunkTable) else ChunkTable(chunks)
        for name, r in self._retrievers.items():
            if list(r.ids) != self._table.ids:
                raise ValidationError(f"retriever {name!r} does not index the ensemble's chunks in the same order")
        if fusion not in FUSION_METHODS:
            raise ValidationError(f"unknown fusion method {fusion!r}; choose one of {sorted(FUSION_METHODS)}")
        self.fusion = fusion
        self.candidate_k = validate_k(candidate_k, "candidate_k")
        self.rrf_c = float(rrf_c)
        self.seed = seed
        self.refresh_interval = float(refresh_interval)
        self._lock = threading.RLock()
        self._learner = Learner(
            self.retriever_names, policy=policy, weights=weights, config=learner_config, seed=seed
        )
        self._store = _open_store(store)
        self._state_version = 0
        self._last_refresh = 0.0
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
        for spec in retrievers:
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

    # ------------------------------------------------------------------ properties
    @property
    def retriever_names(self) -> tuple[str, ...]:
        return tuple(self._retrievers)

    @property
    def retrievers(self) -> Mapping[str, Retriever]:
        return dict(self._retrievers)

    @property
    def weights(self) -> dict[str, float]:
        """The current global fusion weights, as ``{retriever name: weight}``."""
        self._refresh()
        return self._learner.weights()

    def weights_for(self, query: str) -> dict[str, float]:
        """The weights the greedy policy would use for ``query``'s query type."""
        from rlfb.features import query_features, query_type

        self._refresh()
        return self._learner.weights(query_type(query_features(query)))

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
    def context(self, query: str, *, session_id: str | None = None, k: int = 0) -> Context:
        """Score ``query`` with every retriever over the candidate pool; no decision yet.

        The pool is the union of each retriever's best ``max(candidate_k, k)`` chunks.
        """
        if not isinstance(query, str):
            raise ValidationError(f"query must be a string, got {type(query).__name__}")
        from rlfb.features import query_features, query_type

        names = self.retriever_names
        full = [np.asarray(self._retrievers[n].score_all(query), dtype=np.float64) for n in names]
        k = min(max(self.candidate_k, k), len(self._table))
        tops = [top_k(s, k) for s in full]
        rows = np.unique(np.concatenate(tops))
        raw = np.stack([s[rows] for s in full], axis=1)
        ranks = np.zeros_like(raw)
        for j, (s, top) in enumerate(zip(full, tops)):
            # exact 1-based rank inside the retriever's own top list (rows is sorted, so searchsorted
            # finds each top row); candidates below that list keep their order after it
            ranks[np.searchsorted(rows, top), j] = np.arange(1, len(top) + 1)
            outside = np.flatnonzero(ranks[:, j] == 0)
            if outside.size:
                order = np.lexsort((outside, -s[rows[outside]]))
                ranks[outside[order], j] = len(top) + 1 + np.arange(outside.size)
        normalized = normalize(raw, self.fusion, ranks=ranks, c=self.rrf_c)
        feats = query_features(query)
        return Context(
            query=query,
            retrievers=names,
            candidate_ids=tuple(self._table.ids[int(r)] for r in rows),
            raw=raw,
            normalized=normalized,
            features=feats,
            query_type=query_type(feats),
            query_embedding=self._query_embedding(query),
            session_id=session_id,
            ranks=ranks,
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
    ) -> RetrievalResult:
        """Retrieve the ``k`` best chunks for ``query`` and log the event for later feedback.

        ``explore=False`` gives the greedy ranking (no exploration), which is
        what evaluation on held-out queries uses. With ``log=False`` nothing is
        written and ``event_id`` is ``None``.
        """
        validate_k(k)
        ctx = self.context(query, session_id=session_id, k=k)
        with self._lock:
            self._refresh()
            ranking = self._learner.rank(ctx, k, explore=explore)
            hits = self._hits(ctx, ranking)
            decision: Decision = ranking.decision
            logged_id = None
            if log and self._store is not None:
                logged_id = self._store.log_event(
                    query,
                    decision.to_dict(),
                    [_chunk_row(h) for h in hits],
                    session_id=session_id,
                    features=dict(ctx.features),
                    query_type=ctx.query_type,
                    event_id=event_id,
                    parent_id=parent_id,
                    metadata=dict(metadata or {}),
                )
                self._remember(logged_id, ctx)
        return RetrievalResult(
            query=query,
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
        return [self.retrieve(q, k, **kwargs) for q in queries]

    def _hits(self, ctx: Context, ranking: Any) -> list[Hit]:
        names = ctx.retrievers
        k = len(ranking.order)
        top_lists = {n: set(np.flatnonzero(ctx.ranks[:, j] <= self.candidate_k)) for j, n in enumerate(names)}
        hits = []
        for rank, idx in enumerate(ranking.order, start=1):
            idx = int(idx)
            cid = ctx.candidate_ids[idx]
            row = self._table.row[cid]
            hits.append(
                Hit(
                    chunk_id=cid,
                    text=self._table.texts[row],
                    score=float(ranking.fused[idx]),
                    rank=rank,
                    scores={n: float(ctx.raw[idx, j]) for j, n in enumerate(names)},
                    normalized={n: float(ctx.normalized[idx, j]) for j, n in enumerate(names)},
                    metadata=dict(self._table.metadatas[row]),
                    proposed_by=tuple(n for n in names if idx in top_lists[n]),
                    confidence=float(ranking.confidence[idx]) if ranking.confidence is not None else None,
                    memory=float(ranking.memory[idx]) if ranking.memory is not None else None,
                )
            )
            if rank >= k:
                break
        return hits

    def _query_embedding(self, query: str) -> np.ndarray | None:
        for r in self._retrievers.values():
            encode = getattr(r, "encode_queries", None)
            if encode is not None:
                return np.asarray(encode([query])[0], dtype=np.float32)
        return None

    def _remember(self, event_id: str, ctx: Context) -> None:
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
        stored and flagged but not learned from. Returns the store's
        :class:`~rlfb.store.FeedbackRecord`.
        """
        store = self._require_store()
        with self._lock:
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
            if record.duplicate or not record.in_window:
                return record
            self._refresh()
            self._learner.learn(self.episode(event_id, record))
            self._persist()
        return record

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
        """
        from rlfb.implicit import ImplicitSignals

        store = self._require_store()
        previous = store.last_event(session_id)
        if previous is None:
            return []
        if not hasattr(self, "_implicit"):
            encode = None
            for r in self._retrievers.values():
                encode = getattr(r, "encode_queries", None) or encode
            self._implicit = ImplicitSignals(encode=encode)
        records = []
        for sig in self._implicit.infer(previous, query, dwell_seconds=dwell_seconds, cited=cited, opened=opened):
            records.append(
                self.feedback(sig.event_id, sig.signal, chunk_id=sig.chunk_id, timestamp=timestamp,
                              session_id=session_id)
            )
        return records

    def episode(self, event_id: str, record: Any) -> Episode:
        """Rebuild the logged decision of ``event_id`` with the rewards of ``record``."""
        store = self._require_store()
        event = store.event(event_id)
        if event is None:
            raise UnknownEventError(f"no retrieval event {event_id!r}")
        names = self.retriever_names
        chunks = event["chunks"]
        shown_ids = tuple(c["chunk_id"] for c in chunks)
        shown = np.array(
            [[float(c["normalized"].get(n, 0.0)) for n in names] for c in chunks], dtype=np.float64
        ).reshape(len(chunks), len(names))
        chunk_rewards = np.array([float(record.chunk_rewards.get(c, 0.0)) for c in shown_ids])
        decision = event["decision"]
        ctx = self._contexts.get(event_id)
        embedding = ctx.query_embedding if ctx is not None else None
        if embedding is None and event.get("query") and not event.get("query_hashed"):
            embedding = self._query_embedding(event["query"])
        return Episode(
            event_id=event_id,
            query=event.get("query") or "",
            retrievers=names,
            decision=Decision(
                weights=decision.get("weights") or {},
                arm=decision.get("arm"),
                propensity=float(decision.get("propensity", 1.0)),
                explored=bool(decision.get("explored", False)),
                policy=decision.get("policy") or "",
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
        )

    def _require_store(self) -> Any:
        if self._store is None:
            raise ValidationError("this ensemble has no feedback store; pass store='feedback.db'")
        return self._store

    # ------------------------------------------------------------------ weight config centre
    def _persist(self) -> None:
        if self._store is None:
            return
        self._state_version = self._store.save_policy_state(
            self._learner.state_dict(), self._learner.weights(), policy=self._learner.policy_name
        )

    def _refresh(self, *, force: bool = False) -> None:
        """Pick up weights and policy state another process wrote to the store."""
        if self._store is None:
            return
        now = time.monotonic()
        if not force and now - self._last_refresh < self.refresh_interval:
            return
        self._last_refresh = now
        if self._store.state_version() <= self._state_version:
            return
        saved = self._store.load_policy_state()
        if saved is None:
            return
        with self._lock:
            if saved.get("policy") not in (None, self._learner.policy_name):
                return  # another policy wrote this store; keep ours rather than mis-read its state
            self._learner.load_state_dict(saved["state"])
            self._state_version = int(saved["version"])

    def refresh(self) -> dict[str, float]:
        """Reload weights from the store now; returns the current weights."""
        self._refresh(force=True)
        return self._learner.weights()

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write the index, retrievers and learner state to a directory (JSON, ``.npy``; never pickle)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self._table.save(root)
        for name, r in self._retrievers.items():
            r.save(root / "retrievers" / name)
        config = {
            "format": 1,
            "retrievers": list(self.retriever_names),
            "fusion": self.fusion,
            "candidate_k": self.candidate_k,
            "rrf_c": self.rrf_c,
            "seed": self.seed,
            "policy": self._learner.policy_name,
        }
        (root / _CONFIG_FILE).write_text(json.dumps(config, indent=2), encoding="utf-8")
        (root / "learner.json").write_text(json.dumps(self._learner.state_dict()), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path, *, store: Any = None, **kwargs: Any) -> FeedbackEnsemble:
        """Load what :meth:`save` wrote. A damaged file raises :class:`CorruptStateError`."""
        from rlfb.retrievers import load_retriever

        root = Path(path)
        try:
            config = json.loads((root / _CONFIG_FILE).read_text(encoding="utf-8"))
            state = json.loads((root / "learner.json").read_text(encoding="utf-8"))
            names = list(config["retrievers"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CorruptStateError(f"cannot read an ensemble from {root}: {exc}") from exc
        table = ChunkTable.load(root)
        retrievers = {n: load_retriever(root / "retrievers" / n) for n in names}
        options = {
            "fusion": config.get("fusion", "minmax"),
            "candidate_k": config.get("candidate_k", 100),
            "rrf_c": config.get("rrf_c", 60.0),
            "seed": config.get("seed", 0),
            "policy": config.get("policy", "fixed"),
        }
        options.update(kwargs)
        ens = cls(retrievers, table, store=store, **options)
        ens._learner.load_state_dict(state)
        return ens

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def __enter__(self) -> FeedbackEnsemble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        w = ", ".join(f"{n}={v:.3f}" for n, v in self.weights.items())
        return f"FeedbackEnsemble({len(self)} chunks, fusion={self.fusion!r}, weights: {w})"


def _as_retriever_map(retrievers: Mapping[str, Retriever] | Sequence[Retriever]) -> dict[str, Retriever]:
    if isinstance(retrievers, Mapping):
        out = dict(retrievers)
    else:
        out = {}
        for r in retrievers:
            if r.name in out:
                raise ValidationError(f"two retrievers are named {r.name!r}")
            out[r.name] = r
    if not out:
        raise ValidationError("an ensemble needs at least one retriever")
    return out


def _open_store(store: Any) -> Any:
    if store is None:
        return None
    if isinstance(store, (str, Path)):
        from rlfb.store import FeedbackStore

        return FeedbackStore(store)
    return store


def _chunk_row(hit: Hit) -> dict[str, Any]:
    return {
        "chunk_id": hit.chunk_id,
        "rank": hit.rank,
        "score": hit.score,
        "scores": dict(hit.scores),
        "normalized": dict(hit.normalized),
        "proposed_by": list(hit.proposed_by),
    }
