"""The reward function against hand-computed values."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from _clock import NOW

from rlfb.errors import (
    FeedbackBeforeEventError,
    NonFiniteValueError,
    RatingOutOfRangeError,
    UnknownSignalError,
    ValidationError,
)
from rlfb.reward import BASE_SIGNALS, SIGNAL_ALIASES, RewardConfig, RewardFunction, Signal

from _clocked_store import clocked_store as _store
from _clocked_store import log_retrieval as _event

MIN = 60.0


@pytest.fixture
def rf() -> RewardFunction:
    return RewardFunction()


# -- recency discount: max(0.1, 1 - dt / 3600) ----------------------------------------
@pytest.mark.parametrize(
    ("minutes", "expected"),
    [
        (0, 1.0),  # immediate: full weight
        (30, 0.5),  # 1 - 1800/3600
        (45, 0.25),  # 1 - 2700/3600
        (54, 0.1),  # 1 - 3240/3600 = 0.1, exactly at the floor
        (90, 0.1),  # 1 - 5400/3600 = -0.5 -> floor 0.1
        (120, 0.1),  # 2 h -> floor
        (24 * 60, 0.1),
    ],
)
def test_discount_hand_values(rf, minutes, expected):
    assert rf.discount(minutes * MIN) == pytest.approx(expected)


def test_discount_negative_delay_is_full_weight(rf):
    assert 1.0 == rf.discount(-5.0)


def test_discount_is_a_setting():
    rf = RewardFunction(RewardConfig(horizon=7200.0, floor=0.2))
    assert [0.75, 0.5, 0.2] == pytest.approx([rf.discount(x) for x in (1800, 3600, 10_000)])


def test_grace_period_gives_full_weight_then_decays():
    rf = RewardFunction(RewardConfig(grace=300.0))
    assert 1.0 == rf.discount(300.0)
    assert 0.5 == pytest.approx(rf.discount(300.0 + 1800.0))


def test_discount_rejects_nan(rf):
    with pytest.raises(NonFiniteValueError):
        rf.discount(float("nan"))


# -- signal values ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("signal", "expected"),
    [
        ("explicit_positive", 1.0),
        ("explicit_negative", -1.0),
        ("implicit_positive", 0.4),
        ("implicit_negative", -0.2),
        ("neutral", 0.0),
        ("thumbs_up", 1.0),
        ("thumbs_down", -1.0),
        ("click", 0.4),
        ("cited", 0.4),
        ("opened", 0.4),
        ("dwell", 0.4),
        ("reformulation", -0.2),
        ("new_topic", 0.0),
    ],
)
def test_signal_values(rf, signal, expected):
    assert rf.signal_value(signal) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("rating", "expected"), [(1, -1.0), (2, -0.5), (3, 0.0), (4, 0.5), (5, 1.0), (4.5, 0.75)]
)
def test_rating_scale(rf, rating, expected):
    assert rf.signal_value(rating=rating) == pytest.approx(expected)
    assert rf.signal_value("rating", rating=rating) == pytest.approx(expected)


def test_rating_is_scaled_by_the_explicit_values():
    rf = RewardFunction(RewardConfig(explicit_positive=0.8, explicit_negative=-0.6))
    assert [-0.6, -0.3, 0.0, 0.4, 0.8] == pytest.approx([rf.signal_value(rating=r) for r in range(1, 6)])


@pytest.mark.parametrize("value", [-1.0, -0.25, 0.0, 0.7, 1.0])
def test_score_is_a_raw_value(rf, value):
    assert rf.signal_value(value=value) == pytest.approx(value)
    assert rf.signal_value("score", value=value) == pytest.approx(value)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"signal": "meh"}, UnknownSignalError),
        ({"signal": 3}, UnknownSignalError),
        ({"rating": 0}, RatingOutOfRangeError),
        ({"rating": 6}, RatingOutOfRangeError),
        ({"rating": 5.01}, RatingOutOfRangeError),
        ({"rating": float("nan")}, NonFiniteValueError),
        ({"value": float("inf")}, NonFiniteValueError),
        ({"value": float("-inf")}, NonFiniteValueError),
        ({"value": 1.5}, ValidationError),
        ({"value": "0.5"}, ValidationError),
        ({"rating": True}, ValidationError),
        ({"signal": "thumbs_up", "value": 1.0}, ValidationError),
        ({"signal": "rating"}, ValidationError),
        ({"rating": 4, "value": 0.5}, ValidationError),
        ({}, ValidationError),
    ],
)
def test_bad_signals_raise_named_errors(rf, kwargs, error):
    with pytest.raises(error):
        rf.signal_value(**kwargs)


def test_every_alias_resolves_to_a_base_kind(rf):
    assert set(SIGNAL_ALIASES.values()) <= set(BASE_SIGNALS)
    for name in SIGNAL_ALIASES:
        assert rf.resolve(name) in BASE_SIGNALS


def test_custom_aliases_extend_the_registry():
    rf = RewardFunction(RewardConfig(aliases={"bookmark": "implicit_positive"}))
    assert 0.4 == rf.signal_value("bookmark")
    with pytest.raises(ValidationError):
        RewardConfig(aliases={"bookmark": "very_positive"})


# -- compute: the sum of discounted signals, clipped -------------------------------------
def test_compute_no_feedback_is_zero(rf):
    assert 0.0 == rf.compute(0.0, [])


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        ([("thumbs_up", 0)], 1.0),
        ([("thumbs_up", 30 * MIN)], 0.5),
        ([("thumbs_up", 90 * MIN)], 0.1),
        ([("thumbs_up", 120 * MIN)], 0.1),
        ([("thumbs_down", 30 * MIN)], -0.5),
        ([("click", 30 * MIN)], 0.2),  # 0.4 * 0.5
        ([("reformulation", 0)], -0.2),
        ([("reformulation", 2 * 3600)], -0.02),  # -0.2 * 0.1
    ],
)
def test_compute_single_signal(rf, signals, expected):
    assert rf.compute(0.0, signals) == pytest.approx(expected)


def test_compute_clips_to_plus_minus_one(rf):
    assert 1.0 == rf.compute(0.0, [("thumbs_up", 0), ("click", 0)])  # 1.4 -> 1.0
    assert -1.0 == rf.compute(0.0, [("thumbs_down", 0), ("thumbs_down", 0)])  # -2.0 -> -1.0
    assert -1.0 == rf.compute(0.0, [("thumbs_down", 0), ("reformulation", 60)])  # -1.19667 -> -1.0


def test_compute_mixed_signals(rf):
    # thumbs up after 30 min: +1.0 * 0.5 = 0.5
    # reformulation at once:   -0.2 * 1.0 = -0.2
    # click after 15 min:      +0.4 * 0.75 = 0.3
    # rating 2 after 2 h:      -0.5 * 0.1 = -0.05
    signals = [
        ("thumbs_up", 30 * MIN),
        ("reformulation", 0),
        Signal("click", 15 * MIN),
        {"signal": "rating", "rating": 2, "timestamp": 2 * 3600},
    ]
    assert rf.compute(0.0, signals) == pytest.approx(0.55)


def test_compute_offsets_from_the_event_time_and_accepts_datetimes(rf):
    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    assert rf.compute(t0, [("thumbs_up", t0 + timedelta(minutes=30))]) == pytest.approx(0.5)
    assert rf.compute(1000.0, [("thumbs_up", 1000.0 + 30 * MIN)]) == pytest.approx(0.5)


def test_compute_clip_bounds_are_settings():
    rf = RewardFunction(RewardConfig(clip_low=-0.5, clip_high=0.5))
    assert 0.5 == rf.compute(0.0, [("thumbs_up", 0)])
    assert -0.5 == rf.compute(0.0, [("thumbs_down", 0)])


def test_compute_rejects_unreadable_signals(rf):
    with pytest.raises(ValidationError):
        rf.compute(0.0, ["thumbs_up"])


# -- attribution --------------------------------------------------------------------------
def test_attribute_chunk_level_goes_to_its_chunk(rf):
    assert {"b": -1.0} == rf.attribute(-1.0, ["a", "b", "c"], target_chunk="b")


def test_attribute_response_level_full_share_to_each_chunk(rf):
    assert {"a": 0.5, "b": 0.5, "c": 0.5} == rf.attribute(0.5, ["a", "b", "c"])


def test_attribute_split_rule_divides():
    rf = RewardFunction(RewardConfig(spread="split"))
    shares = rf.attribute(0.6, ["a", "b", "c"])
    assert shares == pytest.approx({"a": 0.2, "b": 0.2, "c": 0.2})
    assert math.isclose(sum(shares.values()), 0.6)


def test_attribute_deduplicates_and_handles_no_chunks(rf):
    assert {"a": 1.0, "b": 1.0} == rf.attribute(1.0, ["a", "b", "a"])
    assert {} == rf.attribute(1.0, [])


def test_split_attribution_counts_a_chunk_listed_twice_once():
    # the repeated id was counted in n: ["a", "b", "a"] gave each a third, and the shares summed to 2/3
    shares = RewardFunction(RewardConfig(spread="split")).attribute(1.0, ["a", "b", "a"])
    assert shares == {"a": 0.5, "b": 0.5}


# -- configuration ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"implicit_positive": 0.29},
        {"implicit_positive": 0.51},
        {"implicit_negative": -0.05},
        {"implicit_negative": -0.35},
        {"explicit_positive": 0.0},
        {"explicit_negative": 0.5},
        {"horizon": 0.0},
        {"horizon": float("inf")},
        {"floor": 1.5},
        {"floor": -0.1},
        {"grace": -1.0},
        {"clip_low": 1.0, "clip_high": -1.0},
        {"clip_low": 0.5, "clip_high": 0.9, "no_feedback": 0.6},  # a thumbs down became +0.5
        {"clip_low": -0.9, "clip_high": -0.1, "no_feedback": -0.5},
        {"explicit_positive": 1e308},  # two thumbs summed to infinity inside compute
        {"explicit_negative": -1e7},
        {"rating_min": -1e308, "rating_max": 1e308},  # the half range was infinite: every rating 0
        {"no_feedback": 2.0},
        {"rating_min": 5, "rating_max": 1},
        {"spread": "proportional"},
        {"implicit_positive": float("nan")},
    ],
)
def test_config_rejects_out_of_range_settings(kwargs):
    with pytest.raises(ValidationError):
        RewardConfig(**kwargs)


@pytest.mark.parametrize("value", [0.3, 0.4, 0.5])
def test_config_accepts_implicit_positive_range(value):
    assert RewardFunction(RewardConfig(implicit_positive=value)).signal_value("click") == value


@pytest.mark.parametrize("value", [-0.1, -0.2, -0.3])
def test_config_accepts_implicit_negative_range(value):
    assert RewardFunction(RewardConfig(implicit_negative=value)).signal_value("reformulation") == value


def test_config_is_frozen_and_hashable():
    cfg = RewardConfig()
    with pytest.raises(AttributeError):
        cfg.floor = 0.5  # type: ignore[misc]
    assert hash(cfg) == hash(RewardConfig())


def test_config_numbers_are_kept_as_floats():
    # an np.float32 floor came back from discount() and SQLite stored it as a 4-byte BLOB that SUM() read as 0
    from fractions import Fraction

    cfg = RewardConfig(floor=np.float32(0.1), horizon=Fraction(3600), grace=np.int64(0))  # type: ignore[arg-type]
    assert all(type(getattr(cfg, f)) is float for f in ("floor", "horizon", "grace"))
    assert type(RewardFunction(cfg).discount(7200)) is float


def test_an_alias_may_not_rename_a_base_signal():
    with pytest.raises(ValidationError, match="would rename the base signal 'rating'"):
        RewardConfig(aliases={"rating": "explicit_positive"})
    assert RewardConfig(aliases={"rating": "rating"}).aliases == {"rating": "rating"}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1", None, True])
def test_clip_and_discounted_refuse_what_is_no_number(rf, bad):
    with pytest.raises(ValidationError):
        rf.clip(bad)  # clip(nan) was -1.0
    with pytest.raises(ValidationError):
        rf.discounted(bad, 0.0)  # discounted(nan, 0) was nan


def test_a_reward_config_can_be_copied_and_turned_into_a_dict():
    # its aliases were a MappingProxyType: deepcopy, pickle and dataclasses.asdict all raised TypeError
    import copy
    import dataclasses
    import pickle

    config = RewardConfig(aliases={"upvote": "explicit_positive"})
    assert copy.deepcopy(config) == config and pickle.loads(pickle.dumps(config)) == config
    assert dataclasses.asdict(config)["aliases"] == {"upvote": "explicit_positive"}
    with pytest.raises(TypeError):
        config.aliases["downvote"] = "explicit_negative"  # type: ignore[index]  # still frozen
    assert dict(config.aliases) == {"upvote": "explicit_positive"}


def test_a_rating_at_the_middle_of_a_custom_scale_is_neutral():
    # the midpoint was fixed at 3, the middle of 1..5: on a 0..10 scale a 5 read as praise (0.4) and a 0 as -0.6
    rf = RewardFunction(RewardConfig(rating_min=0, rating_max=10))
    assert [rf.signal_value(rating=r) for r in (0, 5, 10)] == [-1.0, 0.0, 1.0]


def test_an_events_reward_is_clipped_once_at_the_end_whatever_the_order() -> None:
    # clipped after each signal, two thumbs up then one down gave 0.0, and the other order -1.0
    rf = RewardFunction()
    signals = [("thumbs_up", 0), ("thumbs_up", 0), ("thumbs_down", 0)]
    assert rf.compute(0, signals) == 1.0
    assert rf.compute(0, signals[::-1]) == rf.compute(0, signals)


def test_compute_refuses_a_signal_stamped_before_its_event_as_the_store_does() -> None:
    """``compute`` took a signal stamped an hour before its event as undelayed (discount 1), where the store
    refuses it as FeedbackBeforeEventError."""
    rf = RewardFunction()
    with pytest.raises(FeedbackBeforeEventError, match="thumbs_up.*3600s before its event"):
        rf.compute(3600.0, [("thumbs_up", 0.0)])
    assert rf.compute(3600.0, [("thumbs_up", 3400.0)]) == 1.0  # within the 300 s tolerance: undelayed
    with pytest.raises(FeedbackBeforeEventError):
        rf.compute(3600.0, [("thumbs_up", 3400.0)], clock_skew=60)
    assert rf.compute(3600.0, [("thumbs_up", 0.0)], clock_skew=3600) == 1.0
    assert rf.compute(3600.0, [("thumbs_up", 0.0)], clock_skew=math.inf) == 1.0  # the check off
    for bad in (-1, float("nan"), "300", True):
        with pytest.raises(ValidationError, match="clock_skew"):
            rf.compute(0.0, [], clock_skew=bad)  # type: ignore[arg-type]


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_feedback_before_its_event_is_tolerated_up_to_the_clock_skew_and_no_further() -> None:
    """A tolerance read as twice (or any more than) ``clock_skew`` took feedback stamped 301 s to 600 s before its
    event as undelayed; the existing tests sat far from the edge (1000 s, 3600 s)."""
    rf = RewardFunction()
    assert rf.compute(1000.0, [("click", 700.0)]) == pytest.approx(0.4)  # 300 s before: tolerated
    with pytest.raises(FeedbackBeforeEventError):
        rf.compute(1000.0, [("click", 699.0)])  # 301 s before
    store = _store()
    eid = _event(store, ts=NOW - 1000)
    assert store.record_feedback(eid, "thumbs_up", timestamp=NOW - 1300).delay == 0.0
    with pytest.raises(FeedbackBeforeEventError):
        store.record_feedback(eid, "thumbs_up", timestamp=NOW - 1301)


def test_an_event_without_signals_gets_the_configured_no_feedback() -> None:
    """``compute`` with no signals returned a literal 0.0: a ``no_feedback`` set to -0.1 (silence counted as mild
    disapproval) was ignored by every event without feedback."""
    assert RewardFunction(RewardConfig(no_feedback=-0.1)).compute(0, []) == -0.1
    assert RewardFunction(RewardConfig(no_feedback=0.05)).compute(0, []) == 0.05


def test_a_custom_alias_overrides_a_built_in_one() -> None:
    """Merged the other way round, the built-in aliases won: ``aliases={"click": "explicit_positive"}`` (an app
    where a click is a deliberate endorsement) was accepted and then silently valued as an implicit 0.4."""
    rf = RewardFunction(RewardConfig(aliases={"click": "explicit_positive"}))
    assert rf.resolve("click") == "explicit_positive"
    assert rf.signal_value("click") == 1.0
    assert RewardFunction().signal_value("click") == 0.4  # the default registry is untouched


def test_a_misplaced_number_is_named_as_the_caller_gave_it(rf):
    # feedback(event_id, 1.0) said only "signal must be a str"; a rating beside a signal that takes no number
    # was called a value ("takes no value"), which the caller never gave
    with pytest.raises(UnknownSignalError, match=r"got float 1\.0; give a number as value= .* or rating="):
        rf.signal_value(1.0)
    with pytest.raises(ValidationError, match="signal 'thumbs_up' takes no number, got rating=2;"):
        rf.signal_value("thumbs_up", rating=2)
    # the number was left out of the message ("got value=;" read as an empty value)
    with pytest.raises(ValidationError, match=r"signal 'thumbs_up' takes no number, got value=-1\.0;"):
        rf.signal_value("thumbs_up", value=-1.0)


def test_an_iso_time_ending_in_z_is_utc_on_every_supported_python():
    """Bug: ``datetime.fromisoformat`` of Python 3.10 (which rlfb supports) refuses a trailing ``Z``, the form
    JavaScript's ``toISOString()`` and most web APIs send: feedback timed so was refused there."""
    from rlfb.reward import _iso_text, as_timestamp

    assert _iso_text("2025-01-01T00:00:00.123Z") == "2025-01-01T00:00:00.123+00:00"
    assert _iso_text("2025-01-01T00:00:00z") == "2025-01-01T00:00:00+00:00"
    assert _iso_text("2025-01-01T00:00:00+02:00") == "2025-01-01T00:00:00+02:00"
    assert as_timestamp("2025-01-01T00:00:00Z") == as_timestamp("2025-01-01T00:00:00+00:00") == 1735689600.0
    with pytest.raises(ValidationError, match="not an ISO-8601 time: 'Z'"):
        as_timestamp("Z")
