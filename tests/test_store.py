"""FeedbackStore: events, feedback, rewards, validation, idempotency, strings, export, retention."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import stat
import sys
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
from _clock import NOW, Clock
from sqlite_utils import Database

from rlfb.errors import (
    CorruptStateError,
    DuplicateEventError,
    DuplicateIdError,
    FeedbackBeforeEventError,
    FutureTimestampError,
    IdempotencyConflictError,
    InvalidWeightsError,
    NonFiniteValueError,
    RatingOutOfRangeError,
    RlfbError,
    StoreClosedError,
    UnknownChunkError,
    UnknownEventError,
    UnknownSignalError,
    ValidationError,
)
from rlfb.policies.base import Decision
from rlfb.reward import RewardConfig, RewardFunction
from rlfb.store import MIGRATIONS, FeedbackRecord, FeedbackStore, Migrations, query_hash
from rlfb.types import Hit

from _clocked_store import clocked_store as _store
from _clocked_store import log_retrieval as _event

MIN = 60.0
HOUR = 3600.0
DAY = 86400.0


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fresh_store(clock):
    store = FeedbackStore(":memory:", clock=clock)
    yield store
    store.close()


def decision(**kw):
    return {"weights": {"bm25": 0.6, "dense": 0.4}, "arm": "a1", "propensity": 0.75, "explored": False,
            "policy": "fixed", **kw}


def chunks(*ids, **extra):
    return [
        {
            "chunk_id": cid,
            "rank": i + 1,
            "score": 1.0 / (i + 1),
            "scores": {"bm25": 10.0 - i, "dense": 0.9 - 0.1 * i},
            "normalized": {"bm25": 1.0 - 0.2 * i, "dense": 1.0 - 0.1 * i},
            "proposed_by": ["bm25"] if i % 2 else ["bm25", "dense"],
            **extra,
        }
        for i, cid in enumerate(ids)
    ]


def log(store, query="what causes the aurora", ids=("c1", "c2", "c3"), ts=NOW - 10 * MIN, **kw):
    dec, cs = kw.pop("decision", decision()), kw.pop("chunks", chunks(*ids))
    return store.log_event(query, dec, cs, timestamp=ts, **kw)


def rows(store):
    c = store.counts()
    return (c["events"], c["chunks"], c["feedback"], c["rewards"], c["policy_snapshots"])


# -- events --------------------------------------------------------------------------------
def test_log_event_round_trip(fresh_store):
    eid = fresh_store.log_event(
        "what causes the aurora",
        decision(explored=True),
        list(reversed(chunks("c1", "c2", "c3"))),  # given out of rank order
        session_id="s1",
        features={"length": 4.0, "has_digits": False},
        query_type="factoid",
        parent_id="chain-1",
        timestamp=NOW - 5,
        metadata={"k": 3, "tags": ["x"]},
    )
    ev = fresh_store.event(eid)
    assert len(eid) == 32 and eid == ev["id"] == ev["event_id"]
    assert NOW - 5 == ev["timestamp"]
    assert "what causes the aurora" == ev["query"]
    assert hashlib.sha256(b"what causes the aurora").hexdigest() == ev["query_hash"]
    assert ("s1", "chain-1", "factoid") == (ev["session_id"], ev["parent_id"], ev["query_type"])
    assert {"length": 4.0, "has_digits": False} == ev["features"]
    assert {"weights": {"bm25": 0.6, "dense": 0.4}, "arm": "a1", "propensity": 0.75, "explored": True,
            "policy": "fixed"} == ev["decision"]
    assert ["bm25", "dense"] == ev["retrievers"]
    assert {"k": 3, "tags": ["x"]} == ev["metadata"]
    assert ["c1", "c2", "c3"] == [c["chunk_id"] for c in ev["chunks"]]
    assert {"chunk_id": "c2", "rank": 2, "score": 0.5, "scores": {"bm25": 9.0, "dense": 0.8},
            "normalized": {"bm25": 0.8, "dense": 0.9}, "proposed_by": ["bm25"],
            "used": True} == ev["chunks"][1]
    assert fresh_store.has_event(eid) and not fresh_store.has_event("nope")


def test_log_event_accepts_decision_and_hit_objects(fresh_store):
    hits = [
        Hit("c1", "text", 0.9, 1, {"bm25": 3.0}, {"bm25": 1.0}, proposed_by=("bm25",)),
        Hit("c2", "text", 0.4, 2, {"bm25": 1.0}, {"bm25": 0.0}),
    ]
    eid = fresh_store.log_event("q", Decision({"bm25": 1.0}, arm="x", propensity=0.5, policy="ts"), hits,
                                event_id="run-7")
    ev = fresh_store.event("run-7")
    assert "run-7" == eid
    assert ("x", 0.5, "ts") == (ev["arm"], ev["propensity"], ev["policy"])
    assert [("c1", ["bm25"]), ("c2", [])] == [(c["chunk_id"], c["proposed_by"]) for c in ev["chunks"]]


def test_log_event_missing_scores_may_be_none(fresh_store):
    eid = log(fresh_store, chunks=[{"chunk_id": "c1", "rank": 1, "score": None, "scores": {"bm25": None}}])
    assert {"bm25": None} == fresh_store.event(eid)["chunks"][0]["scores"]


def test_unknown_event_is_named_error(fresh_store):
    with pytest.raises(UnknownEventError):
        fresh_store.event("nope")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"decision": decision(weights={"bm25": float("nan")})}, InvalidWeightsError),
        ({"decision": decision(weights={"bm25": -0.1})}, InvalidWeightsError),
        ({"decision": decision(weights={"bm25": "high"})}, InvalidWeightsError),
        ({"decision": {"arm": "a"}}, InvalidWeightsError),
        ({"decision": decision(propensity=0.0)}, ValidationError),
        ({"decision": decision(propensity=1.5)}, ValidationError),
        ({"decision": decision(propensity=float("nan"))}, NonFiniteValueError),
        ({"decision": decision(explored="yes")}, ValidationError),
        ({"chunks": [{"chunk_id": "c1", "rank": 1, "score": float("inf")}]}, NonFiniteValueError),
        ({"chunks": [{"chunk_id": "c1", "rank": 1, "scores": {"bm25": float("nan")}}]}, NonFiniteValueError),
        ({"chunks": [{"chunk_id": "c1", "rank": 1, "normalized": {"bm25": -math.inf}}]}, NonFiniteValueError),
        ({"chunks": chunks("c1", "c1")}, DuplicateIdError),
        ({"chunks": [{"chunk_id": "c1", "rank": 1}, {"chunk_id": "c2", "rank": 1}]}, ValidationError),
        ({"chunks": [{"chunk_id": "c1", "rank": 0}]}, ValidationError),
        ({"chunks": [{"chunk_id": 7, "rank": 1}]}, ValidationError),
        ({"chunks": "c1"}, ValidationError),
        ({"features": {"x": float("nan")}}, NonFiniteValueError),
        ({"metadata": {"x": [1.0, float("inf")]}}, NonFiniteValueError),
        ({"metadata": {"x": object()}}, ValidationError),
        ({"ts": NOW + HOUR}, FutureTimestampError),
        ({"ts": float("nan")}, NonFiniteValueError),
        ({"query": None}, ValidationError),
        ({"session_id": 5}, ValidationError),
        ({"event_id": ""}, ValidationError),
    ],
)
def test_log_event_bad_input_writes_nothing(fresh_store, kwargs, error):
    with pytest.raises(error):
        log(fresh_store, **kwargs)
    assert (0, 0, 0, 0, 0) == rows(fresh_store)


def test_a_decision_key_outside_what_a_decision_writes_is_refused(fresh_store):
    # unknown keys were ignored: a misspelt propensity logged the default 1.0 for an explored ranking
    typo = {"weights": {"bm25": 1.0}, "propensty": 0.05, "explord": True}
    with pytest.raises(ValidationError, match=r"unknown key\(s\) \['explord', 'propensty'\]"):
        log(fresh_store, decision=typo)
    with pytest.raises(ValidationError, match="propensty"):
        fresh_store.log_events([{"query": "q", "decision": typo, "chunks": chunks("a")}])
    with pytest.raises(ValidationError, match="unknown key"):
        log(fresh_store, decision={**decision(), 3: "x"})
    assert (0, 0, 0, 0, 0) == rows(fresh_store)
    sampled = Decision({"bm25": 1.0}, arm="pl", propensity=0.2, explored=True, policy="pl", ranking=(1, 0),
                       sampling_temperature=0.5)
    for d in (decision(), Decision({"bm25": 1.0}), sampled, sampled.to_dict()):
        eid = log(fresh_store, decision=d)
        log(fresh_store, decision=fresh_store.event(eid)["decision"])  # what the store gives back logs again
    assert fresh_store.event(eid)["decision"]["sampling_temperature"] == 0.5


def test_features_and_metadata_keys_that_are_not_str_are_refused(fresh_store):
    # JSON turned the keys into strings: {1: "a", "1": "b"} was stored as {"1": "b"}, "a" lost, None as "null"
    for kwargs, where in (
        ({"features": {1: "a", "1": "b"}}, r"features keys must be str, got int 1"),
        ({"metadata": {None: "a"}}, r"metadata keys must be str, got NoneType None"),
        ({"metadata": {"x": [1, {"y": {True: 2}}]}}, r"metadata\['x'\]\[1\]\['y'\] keys must be str"),
        ({"features": {"f": {2.5: 1.0}}}, r"features\['f'\] keys must be str"),
    ):
        with pytest.raises(ValidationError, match=where):
            log(fresh_store, **kwargs)
    assert (0, 0, 0, 0, 0) == rows(fresh_store)
    nested = {"source": {"tags": ["a", {"k": 1}], "page": 3}, "empty": {}}
    eid = log(fresh_store, features={"length": 4.0}, metadata=nested)
    assert fresh_store.event(eid)["metadata"] == nested and fresh_store.event(eid)["features"] == {"length": 4.0}


def test_log_event_duplicate_id_is_named_error(fresh_store):
    log(fresh_store, event_id="e1")
    with pytest.raises(DuplicateEventError):
        log(fresh_store, event_id="e1", ids=("x",))
    assert (1, 3) == rows(fresh_store)[:2]


def test_log_event_within_clock_skew_is_accepted(fresh_store):
    eid = log(fresh_store, ts=NOW + 200)
    assert NOW + 200 == fresh_store.event(eid)["timestamp"]


def test_log_events_is_all_or_nothing(fresh_store):
    good = {"query": "q1", "decision": decision(), "chunks": chunks("a"), "event_id": "e1"}
    bad = {"query": "q2", "decision": decision(weights={"bm25": math.inf}), "chunks": chunks("b")}
    with pytest.raises(InvalidWeightsError):
        fresh_store.log_events([good, bad])
    with pytest.raises(DuplicateEventError):
        fresh_store.log_events([good, {**good, "query": "again"}])
    assert (0, 0) == rows(fresh_store)[:2]
    # an event without its query, decision or chunks was a TypeError naming a private function
    with pytest.raises(ValidationError, match=r"event 1: missing argument\(s\) \['decision'\]"):
        fresh_store.log_events([good, {"query": "q2", "chunks": chunks("b")}])
    assert (0, 0) == rows(fresh_store)[:2]
    assert ["e1", "e2"] == fresh_store.log_events([good, {**good, "event_id": "e2"}])


def test_timestamps_accept_datetimes(fresh_store, clock):
    t = datetime(2023, 11, 14, 22, 0, tzinfo=timezone.utc)
    clock.t = t.timestamp() + 1800
    eid = log(fresh_store, ts=t)
    later = datetime(2023, 11, 14, 22, 30, tzinfo=timezone.utc)
    rec = fresh_store.record_feedback(eid, "thumbs_up", timestamp=later)
    assert t.timestamp() == fresh_store.event(eid)["timestamp"]
    assert 1800.0 == rec.delay and 0.5 == pytest.approx(rec.reward)


# -- feedback and rewards ------------------------------------------------------------------
def test_response_level_feedback_spreads_over_the_chunks(fresh_store):
    eid = log(fresh_store, ts=NOW - 30 * MIN)
    rec = fresh_store.record_feedback(eid, "thumbs_up", user_id="u1")
    assert isinstance(rec, FeedbackRecord)
    assert (eid, None, "thumbs_up", "explicit_positive") == (rec.event_id, rec.chunk_id, rec.signal, rec.kind)
    assert (1.0, 1800.0, True, False) == (rec.value, rec.delay, rec.in_window, rec.duplicate)
    assert 0.5 == pytest.approx(rec.reward)
    assert {"c1": 0.5, "c2": 0.5, "c3": 0.5} == pytest.approx(rec.chunk_rewards)
    assert (1, 3) == rows(fresh_store)[2:4]


def test_chunk_level_feedback_goes_to_its_chunk(fresh_store):
    eid = log(fresh_store, ts=NOW)
    rec = fresh_store.record_feedback(eid, "opened", chunk_id="c2")
    assert {"c2": 0.4} == rec.chunk_rewards
    assert 1 == rows(fresh_store)[3]


@pytest.mark.parametrize(
    ("kwargs", "value", "reward"),
    [
        ({"signal": "thumbs_down"}, -1.0, -0.5),
        ({"rating": 5}, 1.0, 0.5),
        ({"rating": 2}, -0.5, -0.25),
        ({"signal": "rating", "rating": 4}, 0.5, 0.25),
        ({"value": 0.6}, 0.6, 0.3),
        ({"signal": "score", "value": -0.2}, -0.2, -0.1),
        ({"signal": "reformulation"}, -0.2, -0.1),
        ({"signal": "new_topic"}, 0.0, 0.0),
    ],
)
def test_feedback_values_at_thirty_minutes(fresh_store, kwargs, value, reward):
    eid = log(fresh_store, ts=NOW - 30 * MIN)
    rec = fresh_store.record_feedback(eid, **kwargs)
    assert (value, reward) == pytest.approx((rec.value, rec.reward))


def test_event_reward_is_sum_of_signals_clipped(fresh_store):
    eid = log(fresh_store, ts=NOW - 30 * MIN)
    assert (0.0, {}) == fresh_store.event_reward(eid)
    fresh_store.record_feedback(eid, "thumbs_up")  # +0.5
    fresh_store.record_feedback(eid, "click", chunk_id="c1")  # +0.2 on c1
    reward, per_chunk = fresh_store.event_reward(eid)
    assert 0.7 == pytest.approx(reward)
    assert {"c1": 0.7, "c2": 0.5, "c3": 0.5} == pytest.approx(per_chunk)
    fresh_store.record_feedback(eid, "thumbs_up")  # the same user's thumb again: a repeat, learned once
    assert fresh_store.event_reward(eid) == (reward, per_chunk)
    assert fresh_store.event_reward(eid, repeats=True) == (1.0, {"c1": 1.0, "c2": 1.0, "c3": 1.0})
    fresh_store.record_feedback(eid, "thumbs_up", user_id="u2")  # +0.5 -> 1.2, clipped
    reward, per_chunk = fresh_store.event_reward(eid)
    assert 1.0 == reward and {"c1": 1.0, "c2": 1.0, "c3": 1.0} == per_chunk


def test_unused_chunks_get_no_share_of_response_level_feedback(fresh_store):
    cs = chunks("c1", "c2", "c3")
    cs[2]["used"] = False
    eid = log(fresh_store, chunks=cs, ts=NOW)
    assert {"c1": 1.0, "c2": 1.0} == fresh_store.record_feedback(eid, "thumbs_up").chunk_rewards
    assert {"c3": 0.4} == fresh_store.record_feedback(eid, "opened", chunk_id="c3").chunk_rewards
    assert [True, True, False] == [c["used"] for c in fresh_store.event(eid)["chunks"]]


def test_chunks_marked_unused_after_logging_get_no_share_of_later_response_level_feedback(fresh_store):
    eid = log(fresh_store, ts=NOW)
    first = fresh_store.record_feedback(eid, "thumbs_up")
    assert fresh_store.mark_unused(eid, ["c1"]) == 1
    assert fresh_store.mark_unused(eid, ["c1", "c3"]) == 1  # c1 was unused already
    assert [c["used"] for c in fresh_store.event(eid)["chunks"]] == [False, True, False]
    assert fresh_store.record_feedback(eid, "thumbs_up", user_id="u2").chunk_rewards == {"c2": 1.0}
    assert first.chunk_rewards == {"c1": 1.0, "c2": 1.0, "c3": 1.0}  # what was recorded before stays
    assert fresh_store.record_feedback(eid, "opened", chunk_id="c1").chunk_rewards == {"c1": 0.4}
    before = fresh_store.event(eid)
    for bad, error in [(("nope", ["c1"]), UnknownEventError), ((eid, ["c9"]), UnknownChunkError),
                       ((eid, "c1"), ValidationError), ((eid, [None]), ValidationError)]:
        with pytest.raises(error):
            fresh_store.mark_unused(*bad)
    assert fresh_store.event(eid) == before  # a refusal changes nothing


def test_event_without_chunks_still_records_its_reward(fresh_store):
    eid = log(fresh_store, ids=(), ts=NOW)
    rec = fresh_store.record_feedback(eid, "thumbs_down")
    assert ({}, -1.0) == (rec.chunk_rewards, rec.reward)
    assert 1 == rows(fresh_store)[3]
    assert (-1.0, {}) == fresh_store.event_reward(eid)


def test_split_spread_rule_from_the_reward_function(clock):
    store = FeedbackStore(reward=RewardFunction(RewardConfig(spread="split")), clock=clock)
    eid = log(store, ts=NOW)
    shares = store.record_feedback(eid, "thumbs_up").chunk_rewards
    assert {"c1": 1 / 3, "c2": 1 / 3, "c3": 1 / 3} == pytest.approx(shares)


def test_feedback_outside_attribution_window_is_stored_and_flagged(fresh_store):
    eid = log(fresh_store, ts=NOW - 25 * HOUR)
    rec = fresh_store.record_feedback(eid, "thumbs_up")
    assert (False, {}) == (rec.in_window, rec.chunk_rewards)
    assert 0.1 == pytest.approx(rec.reward)  # computed, kept for audit, not learned from
    assert (1, 0) == rows(fresh_store)[2:4]
    assert 1 == fresh_store.counts()["flagged"]
    assert (0.0, {}) == fresh_store.event_reward(eid)
    assert [False] == [f["in_window"] for f in fresh_store.feedback(eid)]


def test_attribution_window_is_a_setting(clock):
    store = FeedbackStore(attribution_window=HOUR, clock=clock)
    inside = log(store, ts=NOW - 59 * MIN)
    outside = log(store, ts=NOW - 61 * MIN)
    assert store.record_feedback(inside, "click").in_window
    assert not store.record_feedback(outside, "click").in_window


def test_feedback_exactly_at_the_end_of_the_attribution_window_is_in_the_window(tmp_path, clock):
    # with a strict bound, feedback arriving exactly 24 h after its retrieval was flagged and never learned
    with FeedbackStore(tmp_path / "fb.db", clock=clock) as store:
        edge = log(store, ts=NOW - store.attribution_window)
        rec = store.record_feedback(edge, "thumbs_up", timestamp=NOW)
        assert rec.delay == store.attribution_window and rec.in_window
        assert set(rec.chunk_rewards) == {"c1", "c2", "c3"} and store.counts()["flagged"] == 0
        past = log(store, ts=NOW - store.attribution_window - 1)
        assert not store.record_feedback(past, "thumbs_up", timestamp=NOW).in_window  # a second later: out


def test_feedback_inside_window_late_but_discounted(fresh_store):
    eid = log(fresh_store, ts=NOW - 23 * HOUR)
    rec = fresh_store.record_feedback(eid, "thumbs_up")
    assert rec.in_window and 0.1 == pytest.approx(rec.reward)
    assert {"c1": 0.1, "c2": 0.1, "c3": 0.1} == pytest.approx(rec.chunk_rewards)


# -- bad feedback: named error, nothing written ----------------------------------------------
BAD_FEEDBACK = [
    ({"event_id": "nope", "signal": "thumbs_up"}, UnknownEventError),
    ({"signal": "thumbs_up", "chunk_id": "c9"}, UnknownChunkError),
    ({"value": float("nan")}, NonFiniteValueError),
    ({"value": float("inf")}, NonFiniteValueError),
    ({"rating": float("-inf")}, NonFiniteValueError),
    ({"rating": 0}, RatingOutOfRangeError),
    ({"rating": 6}, RatingOutOfRangeError),
    ({"signal": "meh"}, UnknownSignalError),
    ({"signal": None}, ValidationError),
    ({"value": 2.0}, ValidationError),
    ({"signal": "thumbs_up", "value": 1.0}, ValidationError),
    ({"signal": "thumbs_up", "timestamp": NOW + 301}, FutureTimestampError),
    ({"signal": "thumbs_up", "timestamp": NOW - 2 * HOUR}, FeedbackBeforeEventError),
    ({"signal": "thumbs_up", "timestamp": float("nan")}, NonFiniteValueError),
    ({"signal": "thumbs_up", "user_id": 3}, ValidationError),
    ({"signal": "thumbs_up", "idempotency_key": ""}, ValidationError),
    ({"event_id": None, "signal": "thumbs_up"}, ValidationError),
]


@pytest.mark.parametrize(("kwargs", "error"), BAD_FEEDBACK)
def test_bad_feedback_raises_named_error_and_writes_nothing(fresh_store, kwargs, error):
    eid = log(fresh_store, ts=NOW - 10 * MIN)
    kwargs = {"event_id": eid, **kwargs}
    with pytest.raises(error):
        fresh_store.record_feedback(**kwargs)
    assert (1, 3, 0, 0) == rows(fresh_store)[:4]


@pytest.mark.parametrize(("kwargs", "error"), BAD_FEEDBACK)
def test_bad_item_in_a_batch_writes_nothing(fresh_store, kwargs, error):
    eid = log(fresh_store, ts=NOW - 10 * MIN)
    items = [{"event_id": eid, "signal": "thumbs_up"}, {"event_id": eid, **kwargs}]
    with pytest.raises(error, match="feedback item 1"):
        fresh_store.record_feedback_batch(items)
    assert (0, 0) == rows(fresh_store)[2:4]


def test_feedback_slightly_before_event_is_tolerated(fresh_store):
    eid = log(fresh_store, ts=NOW)
    rec = fresh_store.record_feedback(eid, "thumbs_up", timestamp=NOW - 100)
    assert (0.0, 1.0) == (rec.delay, rec.reward)


def test_clock_skew_is_a_setting(clock):
    store = FeedbackStore(clock_skew=0, clock=clock)
    eid = log(store, ts=NOW - 60)
    with pytest.raises(FutureTimestampError):
        store.record_feedback(eid, "thumbs_up", timestamp=NOW + 1)


def test_batch_records_in_order(fresh_store):
    e1, e2 = log(fresh_store, ts=NOW), log(fresh_store, ts=NOW - 30 * MIN, ids=("x",))
    recs = fresh_store.record_feedback_batch(
        [
            {"event_id": e1, "signal": "thumbs_up"},
            {"event_id": e2, "rating": 1},
            {"event_id": e1, "signal": "cited", "chunk_id": "c3", "comment": "in the answer"},
        ]
    )
    assert [(e1, 1.0), (e2, -0.5), (e1, 0.4)] == [(r.event_id, pytest.approx(r.reward)) for r in recs]
    assert [1, 2, 3] == [r.feedback_id for r in recs]
    assert (3, 5) == rows(fresh_store)[2:4]
    assert [] == fresh_store.record_feedback_batch([])


def test_batch_rejects_unknown_arguments(fresh_store):
    eid = log(fresh_store)
    with pytest.raises(ValidationError, match="unknown argument"):
        fresh_store.record_feedback_batch([{"event_id": eid, "signal": "thumbs_up", "weight": 2}])


# -- idempotency ---------------------------------------------------------------------------
def test_same_idempotency_key_is_stored_once(fresh_store):
    eid = log(fresh_store)
    first = fresh_store.record_feedback(eid, "thumbs_up", idempotency_key="req-1")
    second = fresh_store.record_feedback(eid, "thumbs_up", idempotency_key="req-1")
    assert (False, True) == (first.duplicate, second.duplicate)
    assert first.feedback_id == second.feedback_id
    assert (first.reward, first.chunk_rewards) == (second.reward, second.chunk_rewards)
    assert (1, 3) == rows(fresh_store)[2:4]


def test_same_idempotency_key_within_one_batch(fresh_store):
    eid = log(fresh_store)
    item = {"event_id": eid, "signal": "click", "chunk_id": "c1", "idempotency_key": "k"}
    recs = fresh_store.record_feedback_batch([item, item, item])
    assert [False, True, True] == [r.duplicate for r in recs]
    assert 1 == len({r.feedback_id for r in recs})
    assert (1, 1) == rows(fresh_store)[2:4]


def test_reusing_a_key_for_other_feedback_is_a_conflict(fresh_store):
    eid = log(fresh_store)
    fresh_store.record_feedback(eid, "thumbs_up", idempotency_key="k")
    with pytest.raises(IdempotencyConflictError):
        fresh_store.record_feedback(eid, "thumbs_down", idempotency_key="k")
    assert 1 == rows(fresh_store)[2]


def test_idempotency_survives_reopening(tmp_path, clock):
    path = tmp_path / "fb.db"
    with FeedbackStore(path, clock=clock) as store:
        eid = log(store)
        store.record_feedback(eid, "thumbs_up", idempotency_key="k")
    with FeedbackStore(path, clock=clock) as store:
        assert store.record_feedback(eid, "thumbs_up", idempotency_key="k").duplicate
        assert 1 == store.counts()["feedback"]


# -- strings stored verbatim -----------------------------------------------------------------
NASTY = [
    "'; DROP TABLE events; --",
    'Robert"); DROP TABLE feedback;--',
    "%_\\ LIKE ' OR 1=1 --",
    "?, :name, @x, $1",
    "nul\x00inside",
    "lone high \ud800 surrogate",
    "lone low \udcff surrogate",
    "\ud83d\ude00 pair as two code units",
    "emoji 😀 and 中文 and עברית",
    "\r\n\t\x0b\x1b[31m",
    "",
    "x" * 20_000,
]


@pytest.mark.parametrize("text", NASTY)
def test_strings_are_stored_verbatim(tmp_path, clock, text):
    path = tmp_path / "strings.db"
    ident = text or "empty"
    with FeedbackStore(path, clock=clock) as store:
        eid = store.log_event(
            text,
            decision(arm=text, policy=text, weights={ident: 1.0}),
            [{"chunk_id": ident, "rank": 1, "scores": {ident: 1.0}, "proposed_by": [text]},
             {"chunk_id": "plain", "rank": 2}],
            session_id=text,
            parent_id=text,
            query_type=text,
            event_id="ev:" + ident,
            features={ident: 1.0},
            metadata={ident: text},
            timestamp=NOW - 60,
        )
        rec = store.record_feedback(
            eid, "opened", chunk_id=ident, user_id=text, session_id=text, comment=text, key=text,
            idempotency_key="k:" + ident,
        )
        assert ({ident: pytest.approx(0.4 * (1 - 60 / 3600))}, eid) == (rec.chunk_rewards, "ev:" + ident)
        assert store.record_feedback(eid, "opened", chunk_id=ident, idempotency_key="k:" + ident).duplicate
    with FeedbackStore(path, clock=clock) as store:  # reopened: read back from disk
        ev = store.event("ev:" + ident)
        assert (text, text, text, text, text, text) == (
            ev["query"], ev["session_id"], ev["parent_id"], ev["query_type"], ev["arm"], ev["policy"])
        assert query_hash(text) == ev["query_hash"]
        assert {ident: 1.0} == ev["weights"] == ev["features"]
        assert {ident: text} == ev["metadata"]
        assert (ident, {ident: 1.0}, [text]) == (ev["chunks"][0]["chunk_id"], ev["chunks"][0]["scores"],
                                                 ev["chunks"][0]["proposed_by"])
        [fb] = store.feedback(eid)
        assert (ident, text, text, text, text, "k:" + ident) == (
            fb["chunk_id"], fb["user_id"], fb["session_id"], fb["comment"], fb["key"], fb["idempotency_key"])
        assert [ev["id"]] == [e["id"] for e in store.events_for_session(text)]
        assert [ev["id"]] == [e["id"] for e in store.children(text)]
        assert store.event_reward(eid)[1].keys() == {ident}
        out = tmp_path / "rows.jsonl"
        assert 2 == store.export_jsonl(out)
        first = json.loads(out.read_bytes().decode("utf-8").splitlines()[0])
        # JSON escapes lone surrogates; an adjacent high+low pair reads back as the character it encodes
        as_json = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        as_json_id = ident.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        got = (first["query"], first["chunk_id"], first["feedback"][0]["comment"])
        assert (as_json, as_json_id, as_json) == got
        assert "ok" == store.integrity_check()


def test_sql_metacharacters_did_not_touch_the_schema(tmp_path, clock):
    path = tmp_path / "fb.db"
    with FeedbackStore(path, clock=clock) as store:
        for text in NASTY:
            log(store, query=text)
    db = Database(path)
    assert {"events", "event_chunks", "feedback", "rewards", "policy_snapshots", "_migrations"} <= set(
        db.table_names())
    assert len(NASTY) == db["events"].count
    db.close()


# -- privacy -----------------------------------------------------------------------------------
def test_store_text_false_keeps_only_a_hash(tmp_path, clock):
    path = tmp_path / "private.db"
    secret = "my salary is 123456 and my SSN is 078-05-1120"
    with FeedbackStore(path, store_text=False, clock=clock) as store:
        eid = log(store, query=secret)
        ev = store.event(eid)
        assert ev["query"] is None and ev["query_hashed"]
        assert hashlib.sha256(secret.encode()).hexdigest() == ev["query_hash"]
        assert [None] == [r["query"] for r in store.export_rows()][:1]
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"078-05-1120" not in raw


# -- sessions and run trees ----------------------------------------------------------------------
def test_events_for_session_and_last_event(fresh_store):
    ids = [log(fresh_store, query=f"q{i}", ts=NOW - 100 + i, session_id="s") for i in range(5)]
    log(fresh_store, session_id="other")
    assert ids == [e["id"] for e in fresh_store.events_for_session("s")]
    assert ids[-2:] == [e["id"] for e in fresh_store.events_for_session("s", 2)]
    assert ids[-1] == fresh_store.last_event("s")["id"]
    assert fresh_store.last_event("none") is None
    assert [] == fresh_store.events_for_session("s", 1, with_chunks=False)[0].get("chunks", [])
    with pytest.raises(ValidationError):
        fresh_store.events_for_session("s", 0)


def test_children_descendants_and_resolve(fresh_store):
    a = log(fresh_store, event_id="A", parent_id="root", ts=NOW - 3)
    b = log(fresh_store, event_id="B", parent_id="A", ts=NOW - 2)
    c = log(fresh_store, event_id="C", parent_id="B", ts=NOW - 1)
    log(fresh_store, event_id="X", parent_id="elsewhere")
    assert ["A"] == [e["id"] for e in fresh_store.children("root")]
    assert [a, b, c] == [e["id"] for e in fresh_store.descendants("root")]
    assert [b, c] == [e["id"] for e in fresh_store.descendants("A")]
    assert [a, b, c] == fresh_store.resolve("root")
    assert ["B"] == fresh_store.resolve("B")
    assert [] == fresh_store.resolve("unknown")


def test_descendants_terminates_on_cycles(fresh_store):
    log(fresh_store, event_id="P", parent_id="Q")
    log(fresh_store, event_id="Q", parent_id="P")
    assert {"P", "Q"} == {e["id"] for e in fresh_store.descendants("P")}


# -- policy snapshots ----------------------------------------------------------------------------
def test_policy_snapshots(fresh_store, clock):
    assert fresh_store.load_policy_state() is None and 0 == fresh_store.state_version()
    v1 = fresh_store.save_policy_state({"alpha": [1.0, 2.0]}, {"bm25": 0.5, "dense": 0.5}, policy="thompson")
    clock.t += 10
    v2 = fresh_store.save_policy_state({"alpha": [2.0, 2.0]}, {"bm25": 0.7, "dense": 0.3}, policy="thompson")
    assert (1, 2, 2) == (v1, v2, fresh_store.state_version())
    assert {"state": {"alpha": [2.0, 2.0]}, "weights": {"bm25": 0.7, "dense": 0.3}, "version": 2,
            "updated_at": NOW + 10, "policy": "thompson"} == fresh_store.load_policy_state()
    history = fresh_store.policy_history()
    assert [{"bm25": 0.5, "dense": 0.5}, {"bm25": 0.7, "dense": 0.3}] == [h["weights"] for h in history]
    assert [2] == [h["version"] for h in fresh_store.policy_history(limit=1)]
    assert "state" in fresh_store.policy_history(with_state=True)[0]


def _state(retrievers, step=0.1):
    return {"retrievers": retrievers, "exploration": {"kind": "thompson"},
            "policy": {"name": "thompson", "params": {"step": step, "weights": {r: 1.0 for r in retrievers}}}}


def test_a_save_keeps_the_newest_snapshots_of_its_kind_only(clock):
    # every feedback appends a snapshot of the whole learned state (megabytes once much is learned), and none was
    # ever dropped without a retention: a soak test's file reached 4 GB after 10,000 retrievals
    store = FeedbackStore(":memory:", clock=clock, snapshots_kept=3)
    theirs = store.save_policy_state(_state(["bm25", "dense"]), {"bm25": 0.5, "dense": 0.5}, policy="thompson")
    other_step = store.save_policy_state(_state(["bm25"], step=0.2), {"bm25": 1.0}, policy="thompson")
    for _ in range(10):
        clock.t += 1
        newest = store.save_policy_state(_state(["bm25"]), {"bm25": 1.0}, policy="thompson")
    # hyperparameters compared by value, weights left out: the same kind
    same = store.save_policy_state({**_state(["bm25"]), "policy": {"name": "thompson", "params": {"step": 0.1}}},
                                   {"bm25": 1.0}, policy="thompson")
    versions = [h["version"] for h in store.policy_history()]
    assert versions == [theirs, other_step, newest - 1, newest, same]  # other kinds' are kept, however old
    assert store.state_version() == same
    paged_back = store.load_policy_state(before=theirs + 1)
    assert paged_back is not None and paged_back["version"] == theirs
    keep_all = FeedbackStore(":memory:", clock=clock, snapshots_kept=None)
    for _ in range(8):
        keep_all.save_policy_state(_state(["bm25"]), {"bm25": 1.0}, policy="thompson")
    assert keep_all.counts()["policy_snapshots"] == 8
    assert FeedbackStore(":memory:").snapshots_kept == 5


def test_a_save_and_its_trim_of_older_snapshots_are_one_transaction(tmp_path: Path) -> None:
    # the trim run apart from the save let another process's writer in between: the save raised a bare
    # "database is locked" after its snapshot had committed, and the older snapshot it should drop stayed
    path = tmp_path / "fb.db"
    store = FeedbackStore(path, busy_timeout=0.5, snapshots_kept=2)
    for n in range(2):
        store.save_policy_state({"n": n}, {"bm25": 1.0}, policy="fixed")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    refused = []

    def another_writer_at_the_trim(sql: str) -> None:
        if sql.startswith("DELETE FROM policy_snapshots"):
            try:
                other.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                refused.append(sql)

    store._conn.set_trace_callback(another_writer_at_the_trim)
    assert store.save_policy_state({"n": 2}, {"bm25": 1.0}, policy="fixed") == 3
    store._conn.set_trace_callback(None)
    assert refused and not other.in_transaction
    assert [h["version"] for h in store.policy_history()] == [2, 3]
    other.close()
    store.close()


@pytest.mark.parametrize("kept", [0, -1, 2.5, True, "5"])
def test_snapshots_kept_must_be_a_positive_int_or_none(kept):
    with pytest.raises(ValidationError, match="snapshots_kept"):
        FeedbackStore(":memory:", snapshots_kept=kept)


def test_the_store_limits_what_the_write_ahead_log_keeps_after_a_checkpoint(tmp_path):
    # no journal_size_limit: after one large transaction (a prune) the log stayed at 140 MB for good
    with FeedbackStore(tmp_path / "fb.db") as store:
        assert store._conn.execute("PRAGMA journal_size_limit").fetchone()[0] == 64 * 1024 * 1024


def test_nested_per_query_type_weights_are_accepted(fresh_store):
    fresh_store.save_policy_state({}, {"default": {"bm25": 1.0}, "code": {"bm25": 0.2, "dense": 0.8}})
    assert {"bm25": 0.2, "dense": 0.8} == fresh_store.load_policy_state()["weights"]["code"]


@pytest.mark.parametrize(
    ("state", "weights", "error"),
    [
        ({}, {"bm25": float("nan")}, InvalidWeightsError),
        ({}, {"bm25": -1.0}, InvalidWeightsError),
        ({}, {"bm25": None}, InvalidWeightsError),
        ({}, [0.5, 0.5], InvalidWeightsError),
        ({"x": object()}, {"bm25": 1.0}, ValidationError),
        ({"x": float("inf")}, {"bm25": 1.0}, NonFiniteValueError),
        ([1, 2], {"bm25": 1.0}, ValidationError),
    ],
)
def test_bad_policy_snapshot_writes_nothing(fresh_store, state, weights, error):
    with pytest.raises(error):
        fresh_store.save_policy_state(state, weights)
    assert 0 == fresh_store.state_version()


def test_state_version_is_seen_by_another_connection(tmp_path, clock):
    path = tmp_path / "fb.db"
    with FeedbackStore(path, clock=clock) as writer, FeedbackStore(path, clock=clock) as reader:
        assert 0 == reader.state_version()
        writer.save_policy_state({}, {"bm25": 1.0})
        assert 1 == reader.state_version()
        seen = reader.load_policy_state()
        assert seen is not None and {"bm25": 1.0} == seen["weights"]


# -- statistics ---------------------------------------------------------------------------------
def test_stats_counts_and_sliding_window(fresh_store):
    old = log(fresh_store, ts=NOW - 100 * DAY, decision=decision(arm="old"))
    fresh_store.record_feedback(old, "thumbs_down", timestamp=NOW - 100 * DAY)  # -1.0
    new1 = log(fresh_store, ts=NOW - 25 * HOUR, decision=decision(arm="a1", explored=True))
    new2 = log(fresh_store, ts=NOW - 2 * HOUR, ids=("z",), decision=decision(arm="a2"))
    log(fresh_store, ts=NOW - HOUR, decision=decision(arm="a1"))
    fresh_store.record_feedback(new1, "thumbs_up", timestamp=NOW - 25 * HOUR)  # +1.0
    fresh_store.record_feedback(new2, "thumbs_up", timestamp=NOW - 2 * HOUR + 30 * MIN)  # +0.5
    fresh_store.record_feedback(new2, "reformulation", timestamp=NOW - 2 * HOUR)  # -0.2
    fresh_store.record_feedback(new1, "click")  # 25 h later: outside the attribution window
    fresh_store.save_policy_state({}, {"bm25": 0.9, "dense": 0.1}, policy="fixed")

    s = fresh_store.stats()
    assert (4, 10, 5, 8, 1) == (s["events"], s["chunks"], s["feedback"], s["rewards"], s["flagged"])
    w = s["window"]
    assert 90 * DAY == w["seconds"]
    assert (3, 7, 4, 5, 1) == (w["events"], w["chunks"], w["feedback"], w["rewards"], w["flagged"])
    assert 2 == w["rewarded_events"]
    assert (1.0 + 0.3) / 2 == pytest.approx(s["mean_reward"]) == pytest.approx(w["mean_reward"])
    assert (1.0 + 0.5 - 0.2) / 3 == pytest.approx(w["mean_feedback_reward"])
    assert {"a1", "a2"} == set(w["by_arm"])
    assert {"events": 2, "explored": 1, "rewarded_events": 1, "mean_reward": 1.0} == w["by_arm"]["a1"]
    assert {"bm25": 0.9, "dense": 0.1} == s["weights"] and 1 == s["policy_version"]
    json.dumps(s)  # JSON-ready

    lifetime = fresh_store.stats(window=200 * DAY)["window"]
    assert (4, 3) == (lifetime["events"], lifetime["rewarded_events"])
    assert (1.0 + 0.3 - 1.0) / 3 == pytest.approx(lifetime["mean_reward"])


def test_stats_window_setting_and_empty_store(clock):
    store = FeedbackStore(stats_window=DAY, clock=clock)
    s = store.stats()
    assert (0, None, None) == (s["events"], s["mean_reward"], s["weights"])
    log(store, ts=NOW - 2 * DAY)
    assert (1, 0) == (store.stats()["events"], store.stats()["window"]["events"])


# -- export ---------------------------------------------------------------------------------------
def test_export_rows_join_events_chunks_and_feedback(fresh_store):
    e1 = log(fresh_store, ts=NOW - 30 * MIN, session_id="s")
    e2 = log(fresh_store, ids=(), ts=NOW - 20 * MIN)
    fresh_store.record_feedback(e1, "thumbs_up")  # +0.5 to each chunk
    fresh_store.record_feedback(e1, "opened", chunk_id="c2")  # +0.2 to c2
    out = list(fresh_store.export_rows())
    assert [(e1, "c1", 1), (e1, "c2", 2), (e1, "c3", 3), (e2, None, None)] == [
        (r["event_id"], r["chunk_id"], r["rank"]) for r in out]
    c1, c2, c3, empty = out
    assert (0.5, 0.7, 0.5) == pytest.approx((c1["chunk_reward"], c2["chunk_reward"], c3["chunk_reward"]))
    signals = [[f["signal"] for f in r["feedback"]] for r in (c1, c2)]
    assert [["thumbs_up"], ["thumbs_up", "opened"]] == signals
    assert [False, True] == [f["chunk_level"] for f in c2["feedback"]]
    assert 0.7 == pytest.approx(c1["event_reward"]) and 2 == c1["n_feedback"]
    assert {"bm25": 10.0, "dense": 0.9} == c1["scores"] and "s" == c1["session_id"]
    assert (None, 0, []) == (empty["event_reward"], empty["n_feedback"], empty["feedback"])


def test_export_pages_through_many_events(fresh_store):
    fresh_store.log_events(
        [
            {"query": f"q{i}", "decision": decision(), "chunks": chunks("a", "b"), "timestamp": NOW - i % 7}
            for i in range(1203)
        ]
    )
    out = list(fresh_store.export_rows(page=100))
    assert 2406 == len(out)
    assert 1203 == len({r["event_id"] for r in out})
    assert [r["timestamp"] for r in out] == sorted(r["timestamp"] for r in out)


def test_to_dataframe(fresh_store):
    e1 = log(fresh_store, ts=NOW - 30 * MIN)
    fresh_store.record_feedback(e1, "thumbs_down")
    df = fresh_store.to_dataframe()
    assert (3, True) == (len(df), {"event_id", "chunk_id", "chunk_reward", "weight.bm25", "score.dense",
                                   "norm.bm25"} <= set(df.columns))
    assert [-0.5, -0.5, -0.5] == pytest.approx(df["chunk_reward"].tolist())
    assert "weights" in fresh_store.to_dataframe(flatten=False).columns


def test_export_jsonl(fresh_store, tmp_path):
    e1 = log(fresh_store, ts=NOW - 30 * MIN)
    fresh_store.record_feedback(e1, rating=5)
    out = tmp_path / "export.jsonl"
    assert 3 == fresh_store.export_jsonl(out)
    lines = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    assert [0.5, 0.5, 0.5] == pytest.approx([line["chunk_reward"] for line in lines])
    assert [] == [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.skipif(os.name != "posix", reason="file modes and the umask are POSIX")
def test_export_jsonl_gives_the_file_the_mode_open_would(fresh_store, tmp_path):
    # written through mkstemp, every export was 0600 whatever the umask, and one over a 0644 file narrowed it
    log(fresh_store)
    old = os.umask(0o022)
    try:
        plain = tmp_path / "plain.txt"
        plain.write_text("x")  # what open() gives a new file under this umask
        out = tmp_path / "export.jsonl"
        fresh_store.export_jsonl(out)
        assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o644
        out.chmod(0o640)
        fresh_store.export_jsonl(out)  # over an existing file: its mode stays, as open() writing over it keeps it
        assert stat.S_IMODE(out.stat().st_mode) == 0o640
        os.umask(0o077)
        private = tmp_path / "private.jsonl"
        fresh_store.export_jsonl(private)
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    finally:
        os.umask(old)
    assert [] == [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


# -- retention ----------------------------------------------------------------------------------
def test_prune_deletes_old_rows_and_their_children(clock):
    store = FeedbackStore(retention=30 * DAY, clock=clock)
    old = log(store, ts=NOW - 40 * DAY)
    store.record_feedback(old, "thumbs_up", timestamp=NOW - 40 * DAY + 60)
    store.record_feedback(old, "opened", chunk_id="c1", timestamp=NOW - 40 * DAY + 60)
    new = log(store, ts=NOW - DAY, ids=("n1",))
    store.record_feedback(new, "thumbs_down", timestamp=NOW - DAY + 60)
    store.save_policy_state({}, {"bm25": 1.0}, timestamp=NOW - 50 * DAY)
    store.save_policy_state({}, {"bm25": 0.5}, timestamp=NOW - 45 * DAY)
    assert {"events": 1, "chunks": 3, "feedback": 2, "rewards": 4, "policy_snapshots": 1, "run_links": 0} \
        == store.prune()
    assert (1, 1, 1, 1, 1) == rows(store)
    assert not store.has_event(old) and store.has_event(new)
    kept = store.load_policy_state()
    assert kept is not None and {"bm25": 0.5} == kept["weights"]  # the newest snapshot is always kept
    assert "ok" == store.integrity_check()
    assert [] == list(store.db.query("PRAGMA foreign_key_check"))
    assert {"events": 0, "chunks": 0, "feedback": 0, "rewards": 0, "policy_snapshots": 0, "run_links": 0} \
        == store.prune()


def test_an_event_exactly_as_old_as_the_retention_keeps_its_chunks_feedback_and_rewards(tmp_path, clock):
    # the children's cutoff included the edge while the events' did not: the kept event lost its chunks,
    # feedback and rewards, an event that could no longer be rated or learned from
    with FeedbackStore(tmp_path / "fb.db", retention=30 * DAY, clock=clock) as store:
        edge = log(store, ts=NOW - 30 * DAY)
        store.record_feedback(edge, "thumbs_up", timestamp=NOW - 30 * DAY + 60)
        older = log(store, ts=NOW - 30 * DAY - 1, ids=("o1",))
        store.record_feedback(older, "thumbs_up", timestamp=NOW - 30 * DAY + 60)
        pruned = store.prune()
        assert (pruned["events"], pruned["chunks"], pruned["feedback"], pruned["rewards"]) == (1, 1, 1, 1)
        assert store.has_event(edge) and not store.has_event(older)
        assert [c["chunk_id"] for c in store.event(edge)["chunks"]] == ["c1", "c2", "c3"]
        assert len(store.feedback(edge)) == 1 and (1, 3, 1, 3) == rows(store)[:4]
        assert [] == list(store.db.query("PRAGMA foreign_key_check"))


def test_retention_prunes_when_the_store_opens(tmp_path, clock):
    path = tmp_path / "fb.db"
    with FeedbackStore(path, clock=clock) as store:
        old, new = log(store, ts=NOW - 10 * DAY), log(store, ts=NOW - DAY)
    with FeedbackStore(path, retention=5 * DAY, clock=clock) as store:
        assert not store.has_event(old) and store.has_event(new)


def test_prune_without_retention_keeps_everything(fresh_store):
    log(fresh_store, ts=NOW - 1000 * DAY)
    assert 0 == sum(fresh_store.prune().values())
    assert 1 == fresh_store.prune(retention=DAY)["events"]


def test_prune_refuses_a_now_in_the_future(clock):
    # now was read without the future check: a time in milliseconds put the cutoff far ahead and deleted every
    # live event, its feedback, the policy's only snapshot and the run links
    store = FeedbackStore(retention=30 * DAY, clock=clock)
    eid = log(store)
    store.record_feedback(eid, "thumbs_up", timestamp=NOW - MIN)
    store.save_policy_state({}, {"bm25": 1.0}, timestamp=NOW - MIN)
    store.link_runs([("retrieval-run", "chain-run")])
    before = store.counts()
    for now in (NOW * 1000, NOW + 301, datetime.fromtimestamp(NOW + HOUR, tz=timezone.utc)):
        with pytest.raises(FutureTimestampError, match="now"):
            store.prune(now=now)
    assert store.counts() == before and store.run_lineage("retrieval-run") == ["retrieval-run", "chain-run"]
    assert sum(store.prune(now=NOW + 300).values()) == 0  # within the clock-skew tolerance
    assert sum(store.prune(now=NOW - 100 * DAY).values()) == 0  # a past now prunes as of then
    clock.t = NOW + 40 * DAY  # time that has passed: what a later now stands for
    assert store.prune()["events"] == 1


# -- schema, pragmas, lifecycle -----------------------------------------------------------------
def test_file_store_runs_in_wal_mode_with_busy_timeout(tmp_path):
    with FeedbackStore(tmp_path / "fb.db", busy_timeout=12.5) as store:
        conn = store.db.conn
        assert "wal" == store.journal_mode == conn.execute("PRAGMA journal_mode").fetchone()[0]
        assert 12500 == conn.execute("PRAGMA busy_timeout").fetchone()[0]
        assert 1 == conn.execute("PRAGMA synchronous").fetchone()[0]  # NORMAL
        assert 1 == conn.execute("PRAGMA foreign_keys").fetchone()[0]
    with FeedbackStore(tmp_path / "full.db", synchronous="FULL") as store:
        assert 2 == store.db.conn.execute("PRAGMA synchronous").fetchone()[0]
    with pytest.raises(ValidationError):
        FeedbackStore(synchronous="sometimes")


def test_migrations_are_recorded_and_safe_to_rerun(tmp_path, clock):
    path = tmp_path / "fb.db"
    with FeedbackStore(path, clock=clock) as store:
        assert MIGRATIONS.names == store.migrations_applied == store.schema_migrations
        log(store)
    with FeedbackStore(path, clock=clock) as store:
        assert [] == store.migrations_applied
        assert MIGRATIONS.names == store.schema_migrations
        assert [] == MIGRATIONS.pending(store.db)
        assert [] == MIGRATIONS.apply(store.db)
        assert 1 == store.counts()["events"]
    db = Database(path)
    assert len(MIGRATIONS.names) == db["_migrations"].count
    db.close()


def test_a_new_migration_applies_once_and_a_failing_one_rolls_back(tmp_path):
    db = Database(tmp_path / "m.db")
    m = Migrations("test")

    @m()
    def first(db):
        db["a"].create({"id": int}, pk="id")

    assert ["first"] == m.apply(db)

    @m()
    def second(db):
        db["b"].create({"id": int}, pk="id")

    @m()
    def broken(db):
        db["c"].create({"id": int}, pk="id")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        m.apply(db)
    assert ["first"] == m.applied(db)
    assert not db["b"].exists() and not db["c"].exists()
    with pytest.raises(ValueError):
        m()(first)
    db.close()


@pytest.mark.parametrize(
    "kwargs",
    [{"attribution_window": 0}, {"stats_window": -1}, {"retention": 0}, {"clock_skew": -1},
     {"busy_timeout": float("nan")}, {"reward": "default"}],
)
def test_constructor_validates_settings(kwargs):
    with pytest.raises(ValidationError):
        FeedbackStore(**kwargs)


def test_closed_store_raises_named_error(clock):
    store = FeedbackStore(clock=clock)
    store.close()
    store.close()
    with pytest.raises(RlfbError, match="closed"):
        store.counts()


def test_feedback_record_is_frozen(fresh_store):
    rec = fresh_store.record_feedback(log(fresh_store), "thumbs_up")
    with pytest.raises(AttributeError):
        rec.reward = 0.0


def test_threads_share_one_store(tmp_path, clock):
    with FeedbackStore(tmp_path / "t.db", clock=clock) as store:
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(100):
                    eid = log(store, query=f"t{n}-{i}", ts=NOW - 60)
                    store.record_feedback(eid, "thumbs_up", idempotency_key=f"{n}-{i}")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [] == errors
        assert (400, 1200, 400, 1200) == rows(store)[:4]


def test_raw_sqlite_reads_see_plain_text_for_ordinary_strings(tmp_path, clock):
    path = tmp_path / "fb.db"
    with FeedbackStore(path, clock=clock) as store:
        log(store, query="plain text", event_id="e1")
    conn = sqlite3.connect(path)
    assert ("plain text", "text") == conn.execute("SELECT query, typeof(query) FROM events").fetchone()
    conn.close()


def test_a_damaged_file_is_a_named_error(tmp_path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not an sqlite file" * 100)
    with pytest.raises(CorruptStateError, match="garbage.db"):
        FeedbackStore(garbage)

    path = tmp_path / "fb.db"
    with FeedbackStore(path) as store:
        store.save_policy_state({"a": 1}, {"bm25": 1.0})
    with sqlite3.connect(path) as conn:  # damage a snapshot's JSON outside rlfb
        conn.execute("UPDATE policy_snapshots SET state = '{broken' WHERE version = 1")
    with FeedbackStore(path) as store, pytest.raises(CorruptStateError, match="snapshot 1"):
        store.load_policy_state()

    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE rewards")
    with pytest.raises(CorruptStateError, match="rewards"):
        FeedbackStore(path)
    assert not garbage.read_bytes().startswith(b"SQLite")  # nothing was written over the damaged file



# -- from an audit of the store ---------------------------------------------------------------------------
def test_prune_keeps_each_policys_newest_snapshot_and_drops_old_run_links(clock):
    # only the newest snapshot of the whole table was kept: another policy's later one took a policy's only
    # state, and a restarted learner started from nothing; run links were never pruned
    store = FeedbackStore(retention=30 * DAY, clock=clock)
    store.save_policy_state({"n": 1}, {"bm25": 0.7}, policy="thompson", timestamp=NOW - 60 * DAY)
    store.save_policy_state({"n": 0}, {"bm25": 0.5}, policy="thompson", timestamp=NOW - 59 * DAY)
    store.save_policy_state({"n": 2}, {"bm25": 0.4}, policy="gradient", timestamp=NOW - 50 * DAY)
    store.link_runs([("retrieval-run", "user-42-chain")])
    store.fail_run("failed-attempt")
    clock.t = NOW + 40 * DAY
    pruned = store.prune()
    assert pruned["policy_snapshots"] == 1 and pruned["run_links"] == 2  # the link and the failed run's mark
    assert not store.run_failed("failed-attempt")
    thompson = store.load_policy_state(policy="thompson")
    assert thompson is not None and thompson["weights"] == {"bm25": 0.5}
    gradient = store.load_policy_state(policy="gradient")
    assert gradient is not None and gradient["weights"] == {"bm25": 0.4}
    assert store.run_lineage("retrieval-run") == ["retrieval-run"]


def test_window_stats_take_each_events_whole_reward(clock):
    # only the feedback dated inside the window was summed: an event of before the window had its reward cut
    # in two and was counted as its arm's rewarded event, though not as its event
    store = FeedbackStore(clock=clock)
    since = NOW - 10 * DAY

    def event(arm, ts):
        return store.log_event("q", {"weights": {"bm25": 1.0}, "arm": arm, "propensity": 0.5},
                               [{"chunk_id": "c1"}], timestamp=ts)

    a = event("A", NOW - 100)
    store.record_feedback(a, "thumbs_up", timestamp=NOW - 100)
    b = event("B", since + 10)
    store.record_feedback(b, "thumbs_up", timestamp=since + 20)
    store.record_feedback(b, "thumbs_down", timestamp=since + 30)
    before = event("C", since - 10)
    store.record_feedback(before, "thumbs_up", timestamp=since - 5)
    store.record_feedback(before, "thumbs_down", timestamp=since + 5)
    window = store.stats(window=10 * DAY)["window"]
    assert window["rewarded_events"] == 2
    assert window["mean_reward"] == pytest.approx((1.0 + store.event_reward(b)[0]) / 2)
    assert "C" not in window["by_arm"]


def test_window_stats_with_a_past_now_leave_out_what_came_after_it(clock):
    # only ts >= since was asked: with a past now, the rows after it were counted in a window said to end there
    store = FeedbackStore(clock=clock)
    for eid, t, signal in (("old", 1000.0, "thumbs_up"), ("mid", 2500.0, "thumbs_up"),
                           ("later", 100_000.0, "thumbs_down")):
        clock.t = t
        store.log_event("q", {"weights": {"a": 1.0}, "arm": "x"}, [{"chunk_id": "c"}], event_id=eid, timestamp=t)
        store.record_feedback(eid, signal, timestamp=t)
    clock.t = 50_000.0
    store.record_feedback("mid", "thumbs_down")  # in its attribution window, but after the window's end
    clock.t = 200_000.0
    window = store.stats(2000, now=3000.0)["window"]
    # by hand over [1000, 3000]: the events old and mid, one thumbs_up each (reward 1.0, one reward row each)
    assert (window["since"], window["until"]) == (1000.0, 3000.0)
    assert {k: window[k] for k in ("events", "chunks", "feedback", "rewards", "flagged", "rewarded_events")} == {
        "events": 2, "chunks": 2, "feedback": 2, "rewards": 2, "flagged": 0, "rewarded_events": 2
    }
    assert window["mean_reward"] == 1.0 and window["mean_feedback_reward"] == 1.0
    assert window["by_arm"] == {"x": {"events": 2, "explored": 0, "rewarded_events": 2, "mean_reward": 1.0}}
    assert store.stats(200_000.0)["window"]["events"] == 3  # up to the clock, everything


def test_a_nested_exclusive_block_that_raises_keeps_none_of_its_writes(fresh_store):
    with fresh_store.exclusive():
        fresh_store.save_policy_state({}, {"bm25": 1.0})
        with pytest.raises(RuntimeError):
            with fresh_store.exclusive():
                fresh_store.save_policy_state({}, {"bm25": 0.5})
                raise RuntimeError("caught by the outer block")
    assert fresh_store.counts()["policy_snapshots"] == 1  # the inner block's snapshot was committed too


def test_a_closed_store_and_a_close_inside_exclusive_are_named_errors(fresh_store):
    with fresh_store.exclusive():
        with pytest.raises(RlfbError, match="inside its exclusive"):
            fresh_store.close()
        fresh_store.save_policy_state({}, {"bm25": 1.0})
    assert fresh_store.counts()["policy_snapshots"] == 1  # the block's writes were not dropped
    fresh_store.close()
    with pytest.raises(RlfbError, match="closed"):
        fresh_store.schema_migrations  # noqa: B018


def test_two_threads_exporting_to_one_file_both_succeed(tmp_path, fresh_store):
    from _threads import errors_in_threads

    for _ in range(50):
        log(fresh_store)
    assert errors_in_threads(lambda: fresh_store.export_jsonl(tmp_path / "out.jsonl"), 4) == []
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 150


def test_load_policy_state_pages_back_before_a_version(fresh_store) -> None:
    w = {"bm25": 0.5, "dense": 0.5}
    v1 = fresh_store.save_policy_state({"n": 1}, w, policy="thompson")
    fresh_store.save_policy_state({"n": 2}, w, policy="gradient")
    v3 = fresh_store.save_policy_state({"n": 3}, w, policy="thompson")
    assert fresh_store.load_policy_state(policy="thompson")["version"] == v3
    assert fresh_store.load_policy_state(policy="thompson", before=v3)["version"] == v1
    assert fresh_store.load_policy_state(before=v3)["state"] == {"n": 2}
    assert fresh_store.load_policy_state(policy="thompson", before=v1) is None
    with pytest.raises(ValidationError, match="before"):
        fresh_store.load_policy_state(before=-1)


def test_prune_reads_a_snapshot_stored_as_a_blob_as_json(fresh_store) -> None:
    # a state holding a lone surrogate is a BLOB: each was a kind of its own, so none was ever pruned
    w = {"bm25": 1.0}
    for i in range(5):
        fresh_store.save_policy_state({"memory": {"q": f"bad \ud800 {i}"}, "retrievers": ["bm25"]}, w,
                                      policy="thompson", timestamp=1_000.0 + i)
    assert fresh_store.db.execute("SELECT COUNT(*) FROM policy_snapshots WHERE typeof(state) = 'blob'"
                                  ).fetchone()[0] == 5
    assert fresh_store.prune(now=1_000.0 + 200 * 86400, retention=90 * 86400)["policy_snapshots"] == 4
    assert fresh_store.load_policy_state()["state"]["memory"]["q"] == "bad \ud800 4"


def test_a_store_dropped_without_close_closes_its_connection(tmp_path):
    # the connection stayed open until the interpreter tore it down: Python 3.13 warns of that (ResourceWarning,
    # an error under -W error), and the README's examples never call close()
    import gc

    store = FeedbackStore(str(tmp_path / "fb.db"))
    conn = store._conn
    del store
    gc.collect()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")
    again = FeedbackStore(str(tmp_path / "fb.db"))  # the file opens again; closing twice is harmless
    again.close()
    again.close()
    assert again.closed


def test_an_ensemble_dropped_without_close_closes_its_store(tmp_path):
    import gc

    from rlfb import FeedbackEnsemble

    ens = FeedbackEnsemble.from_texts(["tides and the moon", "magma and volcanoes"], retrievers=("bm25",),
                                      store=str(tmp_path / "fb.db"), policy="thompson")
    ens.feedback(ens.retrieve("moon", k=1).event_id, "explicit_positive")
    conn = ens.store._conn
    del ens
    gc.collect()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")


@pytest.mark.parametrize("tail", ["", "-wal", "-shm"])
def test_export_jsonl_refuses_the_stores_own_files(tmp_path, tail):
    # the library method (unlike the CLI) wrote its JSON lines over the live database: every row was lost
    path = tmp_path / "fb.db"
    with FeedbackStore(path) as s:
        s.log_event("q", {"weights": {"a": 1.0}}, [{"chunk_id": "c1"}], event_id="E1")
        s.record_feedback("E1", "thumbs_up")
        with pytest.raises(ValidationError, match="refusing to overwrite"):
            s.export_jsonl(f"{path}{tail}")
        for bad in (None, 1, ""):
            with pytest.raises(ValidationError, match="file path or a binary file object"):
                s.export_jsonl(bad)  # type: ignore[arg-type]
    with FeedbackStore(path) as s:
        assert s.counts()["feedback"] == 1
        assert s.export_jsonl(tmp_path / "out.jsonl") == 1


def test_export_jsonl_refuses_the_store_after_a_chdir_and_its_wal_through_a_link(tmp_path, monkeypatch):
    """Bug: the guard compared the store's path as given, read again at export: a store opened as ``fb.db``
    and exported after a chdir to ``../A/fb.db`` (itself) was written over, and the WAL of a store opened
    through a symbolic link, which SQLite keeps beside the link's target, was not taken for one of its files."""
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    monkeypatch.chdir(tmp_path / "A")
    with FeedbackStore("fb.db") as s:
        s.log_event("q", {"weights": {"a": 1.0}}, [{"chunk_id": "c1"}], event_id="E1")
        monkeypatch.chdir(tmp_path / "B")
        with pytest.raises(ValidationError, match="refusing to overwrite"):
            s.export_jsonl("../A/fb.db")
        with pytest.raises(ValidationError, match="refusing to overwrite"):
            s.export_jsonl("../A/fb.db-wal")
        assert s.export_jsonl("fb.db") == 1  # B/fb.db: another file, as the path now says
    with FeedbackStore(tmp_path / "A" / "fb.db") as s:
        assert s.counts()["events"] == 1
    (tmp_path / "real").mkdir()
    (tmp_path / "link.db").symlink_to(tmp_path / "real" / "t.db")
    with FeedbackStore(tmp_path / "link.db") as s:
        s.log_event("q", {"weights": {"a": 1.0}}, [{"chunk_id": "c1"}], event_id="E1")
        for tail in ("-wal", "-shm"):
            with pytest.raises(ValidationError, match="refusing to overwrite"):
                s.export_jsonl(tmp_path / "real" / f"t.db{tail}")
        assert s.counts()["events"] == 1


def test_a_value_past_sqlites_length_limit_is_a_named_error_and_nothing_is_written(tmp_path):
    """Bug: a text past SQLite's length limit (a billion bytes by default; lowered here, so that the test does
    not build one) came out as a bare sqlite3.DataError, outside rlfb's named errors."""
    if sys.version_info < (3, 11):
        pytest.skip("Connection.setlimit, which lowers the limit, is Python 3.11's")
    with FeedbackStore(tmp_path / "fb.db") as s:
        eid = s.log_event("q", {"weights": {"a": 1.0}}, [{"chunk_id": "c1"}])
        s._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000)
        with pytest.raises(ValidationError, match="too large for feedback store .*nothing of this write"):
            s.record_feedback(eid, "thumbs_up", comment="x" * 2000)
        with pytest.raises(ValidationError, match="too large"):
            s.log_event("q" * 2000, {"weights": {"a": 1.0}}, [{"chunk_id": "c1"}])
        assert s.counts()["events"] == 1 and s.counts()["feedback"] == 0


def test_calls_that_write_nothing_still_refuse_a_closed_store(clock):
    """Bug: an empty batch, a prune without a retention and check_event_args answered a closed store as an
    open one ([] and zero counts), where every other call raises StoreClosedError."""
    store = FeedbackStore(clock=clock)
    store.close()
    for call in (lambda: store.log_events([]), lambda: store.record_feedback_batch([]), store.prune,
                 store.check_event_args):
        with pytest.raises(StoreClosedError):
            call()


def test_last_event_at_a_time_takes_the_newest_made_by_then_whatever_order_they_were_logged_in(fresh_store):
    later = log(fresh_store, query="tides", ts=NOW - 100, session_id="s")  # logged first, made later
    earlier = log(fresh_store, query="aurora", ts=NOW - 200, session_id="s")
    assert fresh_store.last_event("s", at=NOW - 90)["id"] == later
    assert fresh_store.last_event("s", at=NOW - 100)["id"] == later  # made at that very time: by then
    assert fresh_store.last_event("s", at=NOW - 150)["id"] == earlier
    assert fresh_store.last_event("s", at=datetime.fromtimestamp(NOW - 150, timezone.utc))["id"] == earlier
    assert fresh_store.last_event("s", at=NOW - 201) is None
    tie = log(fresh_store, query="tides again", ts=NOW - 100, session_id="s")
    assert fresh_store.last_event("s", at=NOW - 90)["id"] == tie  # same time: the one logged last


def test_a_run_id_in_another_spelling_of_a_logged_hex_event_id_finds_it(fresh_store):
    eid = log(fresh_store)  # rlfb's own event ids are uuid4 hex
    for spelling in (str(uuid.UUID(eid)), str(uuid.UUID(eid)).upper()):
        assert fresh_store.resolve_run(spelling) == [eid]
    assert fresh_store.resolve_run(str(uuid.uuid4())) == []


@pytest.mark.parametrize("store_text", [True, False])
def test_the_settings_migration_reads_whether_an_older_store_kept_text_from_its_events(tmp_path, store_text) -> None:
    # the migration that records store_text for a store made before settings existed: no test ran it on a store
    # that already held events, and a swapped answer would have a hashed store read as one keeping text
    path = tmp_path / "older.db"
    store = FeedbackStore(path, store_text=store_text)
    store.log_event("what causes tides", {"weights": {"bm25": 1.0}}, [{"chunk_id": "c1", "rank": 1, "score": 1.0}])
    store.close()
    with sqlite3.connect(path) as conn:  # as rlfb wrote it before that migration
        conn.execute("DELETE FROM _migrations WHERE name = 'm010_settings'")
        conn.execute("DROP TABLE settings")
    conn.close()
    with FeedbackStore(path) as again:
        assert again.store_text is store_text


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_an_idempotency_key_reused_on_another_chunk_conflicts() -> None:
    """The conflict check did not compare the chunk: a key reused for a click on another chunk of the same
    retrieval returned the first record as a duplicate, and the second chunk's click was silently lost."""
    store = _store()
    eid = _event(store)
    store.record_feedback(eid, "click", chunk_id="c1", idempotency_key="K")
    with pytest.raises(IdempotencyConflictError):
        store.record_feedback(eid, "click", chunk_id="c2", idempotency_key="K")
    with pytest.raises(IdempotencyConflictError):
        store.record_feedback(eid, "click", idempotency_key="K")  # response-level is another chunk too
    assert store.counts()["feedback"] == 1


def test_an_idempotency_key_reused_on_another_event_conflicts() -> None:
    """The conflict check did not compare the event: a key reused for the same signal on another retrieval
    returned the first record (of the first event) as a duplicate, and the second event got no feedback."""
    store = _store()
    e1, e2 = _event(store), _event(store)
    store.record_feedback(e1, "thumbs_up", idempotency_key="K")
    with pytest.raises(IdempotencyConflictError):
        store.record_feedback(e2, "thumbs_up", idempotency_key="K")
    assert store.feedback(e2) == []


def test_each_feedback_reward_is_clipped_to_the_configured_range() -> None:
    """The store clips each feedback's discounted value to ``[clip_low, clip_high]`` before attributing it; without
    the clip a narrowed range (or an explicit value beyond it) reached the reward rows and the learner whole."""
    store = _store(reward=RewardFunction(RewardConfig(clip_low=-0.5, clip_high=0.5)))
    eid = _event(store)
    rec = store.record_feedback(eid, "thumbs_up", timestamp=NOW - 60)
    assert rec.reward == 0.5 and rec.chunk_rewards == {"c1": 0.5, "c2": 0.5}
    neg = store.record_feedback(eid, "thumbs_down", chunk_id="c2", timestamp=NOW - 60)
    assert neg.reward == -0.5 and neg.chunk_rewards == {"c2": -0.5}
    assert store.chunk_reward_sums(eid) == {"c1": 0.5, "c2": 0.0}


def test_a_new_rating_of_the_same_retrieval_is_no_repeat() -> None:
    """A repeat says again what the latest feedback said: the same signal *and* the same number. Comparing the
    signal alone took a rating of 2 after a rating of 5 (a user changing their mind) for a double click, and the
    learner and ``event_reward`` dropped it."""
    store = _store()
    eid = _event(store)
    store.record_feedback(eid, value=0.25, session_id="s", timestamp=NOW - 60)
    second = store.record_feedback(eid, value=0.5, session_id="s", timestamp=NOW - 60)
    again = store.record_feedback(eid, value=0.5, session_id="s", timestamp=NOW - 60)
    assert not store.repeats_latest(second)
    assert store.repeats_latest(again)  # the same number again is one
    assert store.event_reward(eid)[0] == pytest.approx(0.75)


def test_window_mean_reward_clips_each_events_reward() -> None:
    """``stats()["mean_reward"]`` is the mean of each event's reward, the sum of its discounted signals clipped
    as ``event_reward`` clips it: unclipped, a thumbs up with a click reported 1.4."""
    store = _store()
    eid = _event(store)
    store.record_feedback(eid, "thumbs_up", timestamp=NOW - 60)
    store.record_feedback(eid, "click", timestamp=NOW - 60)
    window = store.stats()["window"]
    assert store.event_reward(eid)[0] == 1.0
    assert window["mean_reward"] == 1.0 and window["by_arm"]["a"]["mean_reward"] == 1.0
