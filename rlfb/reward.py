"""The reward function: feedback signals in, one scalar reward out.

A signal is a named kind of feedback (``"thumbs_up"``, ``"rating"``,
``"reformulation"``, ...). Every name resolves, through a dict registry, to one
of seven base kinds:

* ``explicit_positive``: ``+1.0`` (setting ``explicit_positive``)
* ``explicit_negative``: ``-1.0`` (``explicit_negative``)
* ``implicit_positive``: ``+0.4``, accepted range 0.3 to 0.5 (``implicit_positive``)
* ``implicit_negative``: ``-0.2``, accepted range -0.3 to -0.1 (``implicit_negative``)
* ``neutral``: ``0.0``, no feedback or a new-topic follow-up (``no_feedback``)
* ``rating``: ``1..5`` maps to ``(r - 3) / 2`` (``rating_min``, ``rating_max``)
* ``score``: a raw value in ``[-1, 1]``, LangSmith-style

Ratings and scores are scaled by the explicit values: ``+1`` maps to
``explicit_positive`` and ``-1`` to ``explicit_negative``.

Each signal is discounted by how late it arrived, ``max(floor, 1 - dt / horizon)``
with ``dt`` the seconds from the retrieval to the feedback (``floor=0.1``,
``horizon=3600`` by default), and the reward of an event is the sum of its
discounted signals clipped to ``[-1, 1]``. Every number is a field of
:class:`RewardConfig`.

Attribution (:meth:`RewardFunction.attribute`): chunk-level feedback goes to
its chunk only. Response-level feedback is spread over the chunks that were
retrieved and used, with the ``"full"`` rule by default: **each used chunk
receives the whole reward**. The response was judged as a whole, so each chunk
that went into it learns the sign and the size of that judgement; dividing by
the number of chunks (the ``"split"`` rule, also available) would make how
much a chunk learns depend on ``k``, so a chunk shown among ten would learn a
tenth of what it learns when shown among one. Learners that want a budget
that sums to the event reward should pick ``"split"``. (The learner's feedback
memory, which says which chunks answer a question, shares praise of a whole
answer among its chunks itself: :func:`rlfb.credit.shared_credit`.)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from types import MappingProxyType
from typing import Any, NamedTuple

from rlfb.errors import (
    FeedbackBeforeEventError,
    NonFiniteValueError,
    RatingOutOfRangeError,
    UnknownSignalError,
    ValidationError,
)
from rlfb.types import closest_hint

__all__ = [
    "BASE_SIGNALS",
    "NUMERIC_SIGNALS",
    "SIGNAL_ALIASES",
    "SPREAD_RULES",
    "RewardConfig",
    "RewardFunction",
    "Signal",
    "as_timestamp",
    "finite_float",
]

BASE_SIGNALS: tuple[str, ...] = (
    "explicit_positive",
    "explicit_negative",
    "implicit_positive",
    "implicit_negative",
    "neutral",
    "rating",
    "score",
)

#: Every signal name the reward function accepts, mapped to its base kind.
SIGNAL_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        **{base: base for base in BASE_SIGNALS},
        # explicit positive
        "thumbs_up": "explicit_positive",
        "upvote": "explicit_positive",
        "like": "explicit_positive",
        "helpful": "explicit_positive",
        "positive": "explicit_positive",
        "correct": "explicit_positive",
        # explicit negative
        "thumbs_down": "explicit_negative",
        "downvote": "explicit_negative",
        "dislike": "explicit_negative",
        "unhelpful": "explicit_negative",
        "negative": "explicit_negative",
        "wrong": "explicit_negative",
        # implicit positive: the user acted on the answer
        "click": "implicit_positive",
        "clicked": "implicit_positive",
        "cited": "implicit_positive",
        "opened": "implicit_positive",
        "dwell": "implicit_positive",
        "copied": "implicit_positive",
        "acted": "implicit_positive",
        # implicit negative: the user ignored it or asked again
        "reformulation": "implicit_negative",
        "reformulated": "implicit_negative",
        "ignored": "implicit_negative",
        "skipped": "implicit_negative",
        "abandoned": "implicit_negative",
        # neutral
        "none": "neutral",
        "no_feedback": "neutral",
        "new_topic": "neutral",
        # numeric
        "stars": "rating",
        "user_score": "score",
    }
)

#: How response-level reward is shared among the used chunks: ``rule(reward, n_chunks)``.
SPREAD_RULES: Mapping[str, Callable[[float, int], float]] = MappingProxyType(
    {
        "full": lambda reward, n: reward,
        "split": lambda reward, n: reward / n,
    }
)


def finite_float(x: Any, name: str = "value") -> float:
    """Return ``x`` as a finite float, or raise a named error.

    >>> finite_float(3)
    3.0
    >>> finite_float(float("nan"), "rating")
    Traceback (most recent call last):
    ...
    rlfb.errors.NonFiniteValueError: rating must be finite, got nan
    """
    try:
        if type(x) is float or type(x) is int:  # fast path; bool is a subclass of int, not int itself
            f = float(x)
        elif isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise ValidationError(f"{name} must be a real number, got {type(x).__name__} {x!r}")
        else:
            f = float(x)
    except OverflowError:  # an int beyond float range is as unusable as infinity (and too long to print)
        raise NonFiniteValueError(f"{name} must be finite, got an int beyond float range") from None
    if not math.isfinite(f):
        raise NonFiniteValueError(f"{name} must be finite, got {f!r}")
    return f


def check_not_before(at: float, event_time: float, clock_skew: float, what: str = "feedback") -> None:
    """Raise :class:`~rlfb.errors.FeedbackBeforeEventError` where feedback at ``at`` is stamped more than
    ``clock_skew`` seconds before its event (the store's check, and :meth:`RewardFunction.compute`'s).

    >>> check_not_before(100.0, 300.0, 300.0)
    >>> check_not_before(0.0, 1000.0, 300.0)
    Traceback (most recent call last):
    ...
    rlfb.errors.FeedbackBeforeEventError: feedback at 0.000 is 1000s before its event (tolerance 300s)
    """
    if at < event_time - clock_skew:
        raise FeedbackBeforeEventError(
            f"{what} at {at:.3f} is {event_time - at:.0f}s before its event (tolerance {clock_skew:g}s)"
        )


def as_timestamp(x: Any, name: str = "timestamp") -> float:
    """Return a unix timestamp (float seconds) from a number, a ``datetime`` or an ISO-8601 string.

    Naive datetimes follow Python's own convention (``datetime.timestamp``): local time.
    A time before 1970, in any form, or one a datetime cannot convert raises :class:`ValidationError`.

    >>> as_timestamp(1700000000)
    1700000000.0
    >>> from datetime import datetime, timezone
    >>> as_timestamp(datetime(2024, 1, 1, tzinfo=timezone.utc))
    1704067200.0
    >>> as_timestamp("2024-01-01T00:00:00+00:00")
    1704067200.0
    >>> as_timestamp(-5)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: timestamp must not be negative, got -5.0
    """
    if type(x) is float and 0.0 <= x < math.inf:  # fast path
        return x
    if isinstance(x, str):
        try:
            x = datetime.fromisoformat(_iso_text(x))
        except ValueError as exc:
            raise ValidationError(f"{name} is not an ISO-8601 time: {x!r}") from exc
    if isinstance(x, datetime):
        try:
            t = float(x.timestamp())
        except (OverflowError, ValueError, OSError) as exc:  # e.g. a naive year 1: no local-time offset exists
            raise ValidationError(f"{name} is out of range: {x.isoformat()}") from exc
    else:
        t = finite_float(x, name)
    if t < 0:  # numbers, datetimes and ISO strings alike: nothing before 1970
        raise ValidationError(f"{name} must not be negative, got {t!r}")
    return t


def _iso_text(text: str) -> str:
    """ISO-8601 text as ``datetime.fromisoformat`` reads it on every Python rlfb runs on: a UTC time ending
    in ``Z`` (JavaScript's ``toISOString()``, most web APIs) is written ``+00:00``, which Python 3.10 needs
    (3.11 reads both).

    >>> _iso_text("2024-01-01T00:00:00.123Z"), _iso_text("2024-01-01T00:00:00+02:00")
    ('2024-01-01T00:00:00.123+00:00', '2024-01-01T00:00:00+02:00')
    """
    return text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text


def _check_range(name: str, x: float, lo: float, hi: float) -> float:
    x = finite_float(x, name)
    if not lo <= x <= hi:
        raise ValidationError(f"{name} must lie in [{lo}, {hi}], got {x}")
    return x


class _ReadOnlyAliases(dict):
    """A frozen config's aliases: a dict that refuses changes, so that the config can still be copied,
    pickled and passed to ``dataclasses.asdict`` (a ``MappingProxyType`` could be none of these)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("RewardConfig.aliases cannot be changed: build a new RewardConfig")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]
    __ior__ = _refuse  # type: ignore[assignment]

    def __copy__(self) -> _ReadOnlyAliases:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _ReadOnlyAliases:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))


@dataclass(frozen=True)
class RewardConfig:
    """Every number of the reward function.

    Parameters
    ----------
    explicit_positive, explicit_negative
        Values of an explicit thumbs up / down (``+1.0`` / ``-1.0``).
    implicit_positive
        Value of an implicit positive signal; must lie in ``[0.3, 0.5]``.
    implicit_negative
        Value of an implicit negative signal; must lie in ``[-0.3, -0.1]``.
    no_feedback
        Reward of an event without feedback, and value of a neutral signal.
    horizon, floor
        Recency discount ``max(floor, 1 - (dt - grace) / horizon)`` in seconds.
    grace
        Feedback within ``grace`` seconds gets full weight (0 by default, so the
        discount is exactly ``max(0.1, 1 - dt / 3600)``).
    clip_low, clip_high
        The summed reward is clipped to this interval.
    rating_min, rating_max
        The rating scale; its midpoint is neutral.
    spread
        How response-level reward is shared among chunks: ``"full"`` or ``"split"``.
    aliases
        Signal names of the app's own, each mapped to a base signal (``{"copied_answer": "implicit_positive"}``),
        beside the built-in ones; read-only once the config is built.

    >>> RewardConfig().implicit_positive
    0.4
    >>> RewardConfig(implicit_positive=0.9)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: implicit_positive must lie in [0.3, 0.5], got 0.9
    """

    explicit_positive: float = 1.0
    explicit_negative: float = -1.0
    implicit_positive: float = 0.4
    implicit_negative: float = -0.2
    no_feedback: float = 0.0
    horizon: float = 3600.0
    floor: float = 0.1
    grace: float = 0.0
    clip_low: float = -1.0
    clip_high: float = 1.0
    rating_min: float = 1.0
    rating_max: float = 5.0
    spread: str = "full"
    aliases: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.aliases, Mapping):
            raise ValidationError(f"aliases must map signal names to base signals, got {type(self.aliases).__name__}")
        object.__setattr__(self, "aliases", _ReadOnlyAliases(self.aliases))
        for name in _NUMBER_FIELDS:
            # kept as floats: an np.float32 floor came back from discount() and SQLite stored it as a
            # 4-byte BLOB, which SUM() then read as 0; a Fraction failed inside the insert
            object.__setattr__(self, name, finite_float(getattr(self, name), name))
        self._validate()

    def _validate(self) -> None:
        if finite_float(self.explicit_positive, "explicit_positive") <= 0:
            raise ValidationError(f"explicit_positive must be positive, got {self.explicit_positive}")
        if finite_float(self.explicit_negative, "explicit_negative") >= 0:
            raise ValidationError(f"explicit_negative must be negative, got {self.explicit_negative}")
        _check_range("implicit_positive", self.implicit_positive, 0.3, 0.5)
        _check_range("implicit_negative", self.implicit_negative, -0.3, -0.1)
        if finite_float(self.horizon, "horizon") <= 0:
            raise ValidationError(f"horizon must be positive, got {self.horizon}")
        _check_range("floor", self.floor, 0.0, 1.0)
        if finite_float(self.grace, "grace") < 0:
            raise ValidationError(f"grace must not be negative, got {self.grace}")
        if finite_float(self.clip_low, "clip_low") >= finite_float(self.clip_high, "clip_high"):
            raise ValidationError(f"clip_low ({self.clip_low}) must be below clip_high ({self.clip_high})")
        if not self.clip_low <= 0.0 <= self.clip_high:
            # [0.5, 0.9] made a thumbs down a reward of +0.5
            raise ValidationError(f"the clip interval [{self.clip_low}, {self.clip_high}] must hold 0, so that "
                                  "praise stays positive and criticism negative")
        for name in ("explicit_positive", "explicit_negative"):
            if abs(getattr(self, name)) > 1e6:  # two thumbs of 1e308 summed to infinity inside compute
                raise ValidationError(f"{name} must be at most 1e6 in size, got {getattr(self, name)}")
        _check_range("no_feedback", self.no_feedback, self.clip_low, self.clip_high)
        if finite_float(self.rating_min, "rating_min") >= finite_float(self.rating_max, "rating_max"):
            raise ValidationError(
                f"rating_min ({self.rating_min}) must be below rating_max ({self.rating_max})"
            )
        if not math.isfinite(self.rating_max - self.rating_min):  # +-1e308: every rating mapped to 0
            raise ValidationError(f"rating_min ({self.rating_min}) and rating_max ({self.rating_max}) are too far "
                                  "apart for a rating to be scaled between them")
        if not (self.rating_max - self.rating_min) / 2 > 0:  # 0 and 5e-324: the half range is 0, a ZeroDivisionError
            raise ValidationError(f"rating_min ({self.rating_min}) and rating_max ({self.rating_max}) are too "
                                  "close for a rating to be scaled between them")
        if not isinstance(self.spread, str) or self.spread not in SPREAD_RULES:
            raise ValidationError(f"spread must be one of {sorted(SPREAD_RULES)}, got {self.spread!r}")
        for alias, base in dict(self.aliases).items():
            if not isinstance(alias, str) or base not in BASE_SIGNALS:
                raise ValidationError(
                    f"alias {alias!r} must map a str to a base signal {BASE_SIGNALS}, got {base!r}"
                )
            if alias in BASE_SIGNALS and alias != base:
                raise ValidationError(f"alias {alias!r} would rename the base signal {alias!r} to {base!r}")


_NUMBER_FIELDS = tuple(f.name for f in fields(RewardConfig) if f.type in ("float", float))


class Signal(NamedTuple):
    """One feedback signal for :meth:`RewardFunction.compute`."""

    type: str
    timestamp: float | datetime
    value: float | None = None
    rating: float | None = None


def _shown(x: float) -> str:
    """``x`` as given: 6 as ``6``, 5.0000001 as ``5.0000001`` (``:g`` alone shows it as an in-range ``5``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


def _rating_value(cfg: RewardConfig, x: float) -> float:
    if not cfg.rating_min <= x <= cfg.rating_max:
        raise RatingOutOfRangeError(f"rating must lie in [{cfg.rating_min:g}, {cfg.rating_max:g}], got {_shown(x)}")
    mid = (cfg.rating_min + cfg.rating_max) / 2
    return _scale(cfg, (x - mid) / ((cfg.rating_max - cfg.rating_min) / 2))


def _score_value(cfg: RewardConfig, x: float) -> float:
    if not -1.0 <= x <= 1.0:
        raise ValidationError(f"score value must lie in [-1, 1], got {_shown(x)}")
    return _scale(cfg, x)


def _scale(cfg: RewardConfig, centred: float) -> float:
    return centred * cfg.explicit_positive if centred >= 0 else centred * -cfg.explicit_negative


# Base kind -> value(config, number). Kinds in NUMERIC_SIGNALS take a number; the others must not.
_VALUES: Mapping[str, Callable[[RewardConfig, float], float]] = MappingProxyType(
    {
        "explicit_positive": lambda cfg, _: cfg.explicit_positive,
        "explicit_negative": lambda cfg, _: cfg.explicit_negative,
        "implicit_positive": lambda cfg, _: cfg.implicit_positive,
        "implicit_negative": lambda cfg, _: cfg.implicit_negative,
        "neutral": lambda cfg, _: cfg.no_feedback,
        "rating": _rating_value,
        "score": _score_value,
    }
)
#: The base signals that take a number (``signal="rating", value=4``).
NUMERIC_SIGNALS = frozenset({"rating", "score"})


class RewardFunction:
    """Turns feedback signals into rewards, discounts them by delay and attributes them to chunks.

    >>> rf = RewardFunction()
    >>> rf.discount(1800)
    0.5
    >>> rf.signal_value("thumbs_up"), rf.signal_value(rating=4), rf.signal_value("click")
    (1.0, 0.5, 0.4)
    >>> rf.compute(0, [("explicit_positive", 1800), ("implicit_negative", 0)])
    0.3
    >>> rf.attribute(0.3, ["a", "b"])
    {'a': 0.3, 'b': 0.3}
    >>> rf.attribute(-1.0, ["a", "b"], target_chunk="b")
    {'b': -1.0}
    """

    def __init__(self, config: RewardConfig | None = None) -> None:
        if config is not None and not isinstance(config, RewardConfig):  # a dict failed later, AttributeError
            raise ValidationError(f"config must be a RewardConfig (RewardConfig(**settings)), got {config!r}")
        self.config = config if config is not None else RewardConfig()
        self._aliases: dict[str, str] = {**SIGNAL_ALIASES, **dict(self.config.aliases)}

    def __repr__(self) -> str:
        return f"RewardFunction({self.config!r})"

    # -- signals -------------------------------------------------------------------
    @property
    def signals(self) -> list[str]:
        """Every accepted signal name, sorted."""
        return sorted(self._aliases)

    def resolve(self, signal: str) -> str:
        """Map a signal name to its base kind, or raise :class:`UnknownSignalError` (with the closest known name).

        >>> RewardFunction().resolve("thumbs_down")
        'explicit_negative'
        >>> RewardFunction().resolve("thumbsup")
        Traceback (most recent call last):
        ...
        rlfb.errors.UnknownSignalError: unknown signal type 'thumbsup' (did you mean 'thumbs_up'?); known: ...
        """
        try:
            return self._aliases[signal]
        except (KeyError, TypeError):
            hint = closest_hint(signal, self.signals) if isinstance(signal, str) else ""
            raise UnknownSignalError(
                f"unknown signal type {signal!r}{hint}; known: {', '.join(self.signals)}"
            ) from None

    def normalize(
        self, signal: str | None = None, value: Any = None, rating: Any = None
    ) -> tuple[str, str, float | None, float]:
        """Validate one signal and return ``(name, base_kind, number, value)``.

        ``number`` is the rating or score given (``None`` for categorical
        signals); ``value`` the undiscounted reward value. With no ``signal``,
        ``rating=`` means ``"rating"`` and ``value=`` alone means ``"score"``.

        >>> RewardFunction().normalize(value=-0.5)
        ('score', 'score', -0.5, -0.5)
        """
        if signal is None:
            if rating is not None and value is not None:
                raise ValidationError("give either rating= or value=, not both")
            if rating is not None:
                signal = "rating"
            elif value is not None:
                signal = "score"
            else:
                raise ValidationError("feedback needs a signal, a rating or a value")
        if not isinstance(signal, str):
            # a number here is what a caller meant as the feedback's value (`feedback(event_id, 1.0)`)
            raise UnknownSignalError(f"signal must be a signal's name (a str), got {type(signal).__name__} "
                                     f"{signal!r}; give a number as value= (in [-1, 1]) or rating= (1 to 5)")
        base = self.resolve(signal)
        if base in NUMERIC_SIGNALS:
            if rating is not None and value is not None:
                raise ValidationError(f"signal {signal!r} takes one number: give rating= or value=, not both")
            number = rating if rating is not None else value
            if number is None:
                what = "rating=" if base == "rating" else "value="
                raise ValidationError(f"signal {signal!r} needs a number ({what})")
            x = finite_float(number, "rating" if rating is not None else "value")  # the argument the caller gave
            return signal, base, x, float(_VALUES[base](self.config, x))
        if value is not None or rating is not None:
            given = f"rating={rating!r}" if rating is not None else f"value={value!r}"  # as the caller gave it
            raise ValidationError(
                f"signal {signal!r} takes no number, got {given}; leave the signal out (rating= alone is a "
                "rating, value= alone a score), or give it alone"
            )
        return signal, base, None, float(_VALUES[base](self.config, 0.0))

    def signal_value(self, signal: str | None = None, value: Any = None, rating: Any = None) -> float:
        """The undiscounted value of one signal.

        >>> rf = RewardFunction()
        >>> [rf.signal_value(rating=r) for r in (1, 2, 3, 4, 5)]
        [-1.0, -0.5, 0.0, 0.5, 1.0]
        >>> rf.signal_value("reformulation")
        -0.2
        >>> rf.signal_value(rating=6)
        Traceback (most recent call last):
        ...
        rlfb.errors.RatingOutOfRangeError: rating must lie in [1, 5], got 6
        """
        return self.normalize(signal, value, rating)[3]

    # -- time ----------------------------------------------------------------------
    def discount(self, dt_seconds: float) -> float:
        """Recency discount ``max(floor, 1 - (dt - grace) / horizon)``; a negative ``dt`` counts as 0.

        >>> rf = RewardFunction()
        >>> [rf.discount(m * 60) for m in (0, 30, 90, 120)]
        [1.0, 0.5, 0.1, 0.1]
        """
        cfg = self.config
        dt = max(0.0, finite_float(dt_seconds, "dt_seconds"))
        if dt <= cfg.grace:
            return 1.0
        return max(cfg.floor, 1.0 - (dt - cfg.grace) / cfg.horizon)

    def clip(self, reward: float) -> float:
        """Clip to ``[clip_low, clip_high]``.

        >>> RewardFunction().clip(1.4)
        1.0
        """
        return min(self.config.clip_high, max(self.config.clip_low, finite_float(reward, "reward")))

    def discounted(self, value: float, dt_seconds: float) -> float:
        """``value * discount(dt)``, unclipped."""
        return finite_float(value, "value") * self.discount(dt_seconds)

    def compute(self, event_time: float | datetime, signals: Iterable[Any], *, clock_skew: float = 300.0) -> float:
        """Sum of the discounted signals of one event, clipped; no signals gives ``no_feedback``.

        Each signal is a :class:`Signal`, a ``(type, timestamp[, value[, rating]])``
        tuple or a mapping with ``signal`` (or ``type``), ``timestamp`` and
        optionally ``value`` / ``rating``. Each signal counts, a repeated one too (two clicks are two). A
        signal stamped more than ``clock_skew`` seconds (300, the store's tolerance) before the event is a
        :class:`~rlfb.errors.FeedbackBeforeEventError`, as the store refuses it (before 2026-12-05 it was
        taken as undelayed); one within it counts as undelayed.

        >>> rf = RewardFunction()
        >>> rf.compute(0, [])
        0.0
        >>> rf.compute(0, [("thumbs_up", 0), ("click", 60)])          # 1 + 0.4 * (1 - 60/3600), clipped
        1.0
        >>> rf.compute(0, [("thumbs_down", 0), ("reformulation", 0)])  # -1.2, clipped
        -1.0
        >>> round(rf.compute(0, [{"signal": "rating", "rating": 4, "timestamp": 1800}]), 6)
        0.25
        >>> rf.compute(1000, [("click", 0)])
        Traceback (most recent call last):
        ...
        rlfb.errors.FeedbackBeforeEventError: the click at 0.000 is 1000s before its event (tolerance 300s)
        """
        t0 = as_timestamp(event_time, "event_time")
        # infinity (math.inf) turns the check off
        if isinstance(clock_skew, bool) or not isinstance(clock_skew, numbers.Real) or not clock_skew >= 0:
            raise ValidationError(f"clock_skew must be a number of seconds, at least 0, got {clock_skew!r}")
        skew = float(clock_skew)
        items = [self._signal_tuple(s) for s in signals]
        if not items:
            return self.clip(self.config.no_feedback)
        total = 0.0
        for sig, ts, value, rating in items:
            v = self.signal_value(sig, value, rating)
            at = as_timestamp(ts)
            check_not_before(at, t0, skew, f"the {sig}")
            total += v * self.discount(at - t0)
        return self.clip(total)

    @staticmethod
    def _signal_tuple(s: Any) -> tuple[Any, Any, Any, Any]:
        if isinstance(s, Mapping):
            sig = s.get("signal", s.get("type"))
            return sig, s.get("timestamp"), s.get("value"), s.get("rating")
        if isinstance(s, Sequence) and not isinstance(s, str) and 2 <= len(s) <= 4:
            padded = tuple(s) + (None,) * (4 - len(s))
            return padded[0], padded[1], padded[2], padded[3]
        raise ValidationError(
            f"cannot read a signal from {s!r}; expected (type, timestamp[, value[, rating]])"
        )

    # -- attribution ---------------------------------------------------------------
    def attribute(
        self, reward: float, chunk_ids: Sequence[str], target_chunk: str | None = None
    ) -> dict[str, float]:
        """Share ``reward`` among chunks.

        Chunk-level feedback (``target_chunk`` given) goes to that chunk alone;
        membership is the caller's check (the store checks it against the
        event). Response-level feedback is spread over ``chunk_ids`` (the
        chunks that were retrieved and used) by the configured rule: ``"full"``
        gives each chunk the whole reward, ``"split"`` gives each ``reward / n``.

        >>> RewardFunction(RewardConfig(spread="split")).attribute(1.0, ["a", "b", "c", "d"])
        {'a': 0.25, 'b': 0.25, 'c': 0.25, 'd': 0.25}
        >>> RewardFunction().attribute(1.0, [])
        {}
        """
        r = finite_float(reward, "reward")
        if target_chunk is not None:
            return {target_chunk: r}
        ids = list(dict.fromkeys(chunk_ids))
        if not ids:
            return {}
        share = SPREAD_RULES[self.config.spread](r, len(ids))
        return {cid: share for cid in ids}
