"""What the store hands back: the feedback record, and rows decoded into plain dicts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rlfb.errors import RlfbError
from rlfb.store.checks import _check_weights
from rlfb.store.codec import _dec, _decode_row, _loads


@dataclass(frozen=True)
class FeedbackRecord:
    """What :meth:`FeedbackStore.record_feedback` stored.

    ``value`` is the signal's undiscounted value (``+1.0`` for a thumbs up,
    ``0.5`` for a 4-star rating), ``reward`` this signal's reward: the value
    times the recency ``discount``, clipped. The reward of the whole event (the
    sum of all its signals, clipped) is :meth:`FeedbackStore.event_reward`.
    ``chunk_rewards`` is this signal's reward attributed to each chunk
    (empty when ``in_window`` is false: the feedback is stored and flagged but
    not learned from). ``delay`` is the seconds from the retrieval to the
    feedback (0 if the feedback is slightly earlier, within the clock-skew
    tolerance). ``duplicate`` is true when an earlier call with the same
    idempotency key stored this feedback and this call wrote nothing.
    """

    feedback_id: int
    event_id: str
    chunk_id: str | None
    signal: str
    value: float
    reward: float
    chunk_rewards: dict[str, float]
    in_window: bool
    duplicate: bool
    delay: float
    timestamp: float = 0.0
    kind: str = ""
    discount: float = 1.0
    idempotency_key: str | None = None


@dataclass
class _Pending:
    event_id: str
    signal: str
    kind: str
    raw_value: float | None
    value: float
    chunk_id: str | None
    ts: float
    session_id: str | None
    user_id: str | None
    idempotency_key: str | None
    key: str | None
    comment: str | None


@dataclass
class _EventInfo:
    ts: float
    chunks: list[str] = field(default_factory=list)
    used: list[str] = field(default_factory=list)
    external: bool = False  # another engine's retrieval (rlfb.types.EXTERNAL_POLICY): no learner's decision


_EVENT_COLS = (
    "id, ts, query, query_hash, session_id, parent_id, query_type, features, weights, arm, policy, "
    "explored, propensity, metadata, n_chunks, chunk_ids, unused_ids, created_at, sampling_temperature"
)
_N_EVENT_COLS = len(_EVENT_COLS.split(","))
_FEEDBACK_PARAMS = frozenset(
    {
        "event_id",
        "signal",
        "value",
        "rating",
        "chunk_id",
        "timestamp",
        "session_id",
        "user_id",
        "idempotency_key",
        "comment",
        "key",
    }
)
_EVENT_PARAMS = frozenset(
    {
        "query",
        "decision",
        "chunks",
        "session_id",
        "features",
        "query_type",
        "event_id",
        "parent_id",
        "timestamp",
        "metadata",
    }
)
# the keys rlfb.policies.base.Decision.to_dict() writes: any other is a typo ("propensty") that would log a default
_DECISION_KEYS = frozenset({"weights", "arm", "propensity", "explored", "policy", "sampling_temperature"})


def _event_dict(r: Mapping[str, Any]) -> dict[str, Any]:
    def column(name: str) -> Any:  # a damaged one names itself and its event
        return _loads(r[name], f"events.{name} of event {_dec(r['id'])!r:.80}")

    weights = column("weights")
    d = {
        "id": _dec(r["id"]),
        "event_id": _dec(r["id"]),
        "timestamp": r["ts"],
        "query": _dec(r["query"]),
        "query_hash": r["query_hash"],
        "query_hashed": r["query"] is None,
        "session_id": _dec(r["session_id"]),
        "parent_id": _dec(r["parent_id"]),
        "query_type": _dec(r["query_type"]),
        "features": column("features") or {},
        "weights": weights,
        "retrievers": list(weights),
        "arm": _dec(r["arm"]),
        "policy": _dec(r["policy"]),
        "explored": bool(r["explored"]),
        "propensity": r["propensity"],
        "metadata": column("metadata"),
        "n_chunks": r["n_chunks"],
        "created_at": r["created_at"],
        "sampling_temperature": r["sampling_temperature"],
    }
    d["decision"] = {k: d[k] for k in ("weights", "arm", "propensity", "explored", "policy")}
    if d["sampling_temperature"] is not None:
        d["decision"]["sampling_temperature"] = d["sampling_temperature"]
    return d


def _chunk_dict(c: Mapping[str, Any]) -> dict[str, Any]:
    def column(name: str) -> Any:  # a damaged one names itself, its chunk and its event
        where = f"event_chunks.{name} of chunk {_dec(c['chunk_id'])!r:.80}"
        return _loads(c[name], where + (f" of event {_dec(c['event_id'])!r:.80}" if "event_id" in c.keys() else ""))

    return {
        "chunk_id": _dec(c["chunk_id"]),
        "rank": c["rank"],
        "score": c["score"],
        "scores": column("scores"),
        "normalized": column("normalized"),
        "proposed_by": column("proposed_by"),
        "used": bool(c["used"]),
    }


def _feedback_dict(f: Mapping[str, Any]) -> dict[str, Any]:
    d = _decode_row(f)
    d["timestamp"] = d.pop("ts")
    d["in_window"] = bool(d["in_window"])
    return d


def _snapshot_dict(r: Mapping[str, Any], with_state: bool) -> dict[str, Any]:
    d = {
        "version": r["version"],
        "updated_at": r["ts"],
        "policy": _dec(r["policy"]),
        # rlfb writes only checked weights: anything else was written outside it (raises, named as damage)
        "weights": _check_weights(_loads(r["weights"])),
    }
    if with_state:
        d["state"] = _loads(r["state"])
    return d


def _as_duplicate(rec: FeedbackRecord) -> FeedbackRecord:
    return replace(rec, duplicate=True, chunk_rewards=dict(rec.chunk_rewards))


def _prefixed(exc: RlfbError, prefix: str) -> RlfbError:
    """The same named error with ``prefix`` added to its message."""
    msg = str(exc)
    try:
        new = type(exc)(prefix + msg)
    except TypeError:  # pragma: no cover - every rlfb error takes one message
        return exc
    new.__dict__.update(exc.__dict__)  # what it names besides its message (an idempotency conflict's key)
    return new
