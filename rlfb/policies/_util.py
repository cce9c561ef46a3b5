"""Shared helpers of the learner: weight vectors, the bounded simplex, validation, RNG state.

Private to rlfb: the public names live in :mod:`rlfb.policies` and :mod:`rlfb.learner`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, InvalidWeightsError, ValidationError

__all__ = [
    "BasePolicy",
    "DEFAULT_BOUNDS",
    "check_bounds",
    "check_float",
    "check_within_bounds",
    "check_int",
    "clock_decay",
    "chunk_evidence",
    "decay_factor",
    "default_bounds",
    "saved_bounds",
    "episode_time",
    "logged_weights",
    "pdgd_pairs",
    "project_simplex",
    "ranks_nothing",
    "rng_state",
    "score_scale",
    "set_rng_state",
    "shared_credit",
    "validate_retrievers",
    "weights_dict",
    "weights_vector",
]

DAY = 86_400.0


# --------------------------------------------------------------------------- validation


def check_float(
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """Return ``value`` as a finite float inside the given range, or raise :class:`ValidationError`.

    >>> check_float("lr", 0.03, 0.01, 0.05)
    0.03
    >>> check_float("lr", 0.5, 0.01, 0.05)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: lr must be in [0.01, 0.05], got 0.5
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValidationError(f"{name} must be a number, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        raise ValidationError(f"{name} must be finite, got an int beyond float range") from None
    if not math.isfinite(v):
        raise ValidationError(f"{name} must be finite, got {value!r}")
    bad = (
        (lo is not None and (v < lo or (lo_open and v == lo)))
        or (hi is not None and (v > hi or (hi_open and v == hi)))
    )
    if bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise ValidationError(f"{name} must be in {left}{lo_s}, {hi_s}{right}, got {value!r}")
    return v


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """Return ``value`` as an int inside ``[lo, hi]``, or raise :class:`ValidationError`.

    >>> check_int("replay_every", 0, 1)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: replay_every must be at least 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValidationError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        if hi is None:  # "must be in [1, None]" named no bound
            raise ValidationError(f"{name} must be at least {lo}, got {value!r}")
        if lo is None:
            raise ValidationError(f"{name} must be at most {hi}, got {value!r}")
        raise ValidationError(f"{name} must be in [{lo}, {hi}], got {value!r}")
    return v


def plain_numbers(params: Any) -> None:
    """Replace NumPy scalars among a frozen dataclass's fields by Python numbers, so that its ``asdict``
    (a policy's ``params()``, a learner's config) is JSON: ``batch_size=np.int64(50)`` made every save fail."""
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if isinstance(value, np.generic):
            object.__setattr__(params, f.name, value.item())


def check_bounds(bounds: Any) -> tuple[float, float]:
    """Validate ``(low, high)`` weight bounds with ``0 <= low < high <= 1``."""
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise ValidationError(f"bounds must be a (low, high) pair, got {bounds!r}") from None
    lo = check_float("bounds[0]", lo, 0.0, 1.0)
    hi = check_float("bounds[1]", hi, 0.0, 1.0)
    if lo >= hi:
        raise ValidationError(f"bounds must have low < high, got {bounds!r}")
    return lo, hi


#: The weight bounds of a policy given none, up to 19 retrievers (:func:`default_bounds`).
DEFAULT_BOUNDS = (0.05, 0.95)


def default_bounds(n: int) -> tuple[float, float]:
    """The weight bounds of a policy over ``n`` retrievers that was given none: :data:`DEFAULT_BOUNDS` while its
    lower bound leaves ``n`` weights room to move (up to 19 retrievers), else a lower bound of ``0.5/n``. A lower
    bound of ``1/n`` or more pins every weight at ``1/n``, as 0.05 did from 20 retrievers on. Below 20 the
    bounds stay what earlier versions saved, so that their snapshots are still of the same kind.

    >>> default_bounds(3), default_bounds(19), default_bounds(20)
    ((0.05, 0.95), (0.05, 0.95), (0.025, 0.95))
    """
    lo, hi = DEFAULT_BOUNDS
    return (lo, hi) if lo * n < 1.0 - 1e-12 else (0.5 / n, hi)


def saved_bounds(bounds: tuple[float, float], n: int) -> tuple[float, float]:
    """Bounds as a saved state's hyperparameters give them, to rebuild its policy with: :data:`DEFAULT_BOUNDS`
    that pin ``n`` weights at ``1/n`` (the default of 20 or more retrievers in earlier versions, which the policies
    now refuse) read as :func:`default_bounds`; such a state's weights are ``1/n`` each, within those too.

    >>> saved_bounds((0.05, 0.95), 3), saved_bounds((0.05, 0.95), 20), saved_bounds((0.0, 1.0), 20)
    ((0.05, 0.95), (0.025, 0.95), (0.0, 1.0))
    """
    pins = tuple(bounds) == DEFAULT_BOUNDS and DEFAULT_BOUNDS[0] * n >= 1.0 - 1e-12
    return default_bounds(n) if pins else tuple(bounds)  # type: ignore[return-value]


def validate_retrievers(retrievers: Any) -> tuple[str, ...]:
    """Return the retriever names as a tuple; they must be distinct non-empty strings.

    >>> validate_retrievers(["bm25", "dense"])
    ('bm25', 'dense')
    """
    if isinstance(retrievers, str):
        raise ValidationError("retrievers must be a sequence of names, not one string")
    try:
        names = tuple(retrievers)
    except TypeError:
        raise ValidationError(f"retrievers must be a sequence of names, got {retrievers!r}") from None
    if not names:
        raise ValidationError("at least one retriever is needed")
    for n in names:
        if not isinstance(n, str) or not n:
            raise ValidationError(f"retriever names must be non-empty strings, got {n!r}")
    if len(set(names)) != len(names):
        raise ValidationError(f"retriever names must be distinct, got {names!r}")
    return names


def weights_vector(
    weights: Mapping[str, float] | Sequence[float] | np.ndarray | None,
    retrievers: Sequence[str],
) -> np.ndarray:
    """Validate weights and return them as a normalised vector in retriever order.

    ``None`` means equal weights. A mapping must name exactly the retrievers.
    NaN, infinite or negative weights, and an all-zero vector, raise
    :class:`InvalidWeightsError`.

    >>> weights_vector({"a": 2, "b": 2}, ["a", "b"]).tolist()
    [0.5, 0.5]
    >>> weights_vector({"a": -1, "b": 2}, ["a", "b"])
    Traceback (most recent call last):
    ...
    rlfb.errors.InvalidWeightsError: weights must be non-negative, got {'a': -1, 'b': 2}
    """
    n = len(retrievers)
    if weights is None:
        return np.full(n, 1.0 / n)
    if isinstance(weights, Mapping):
        keys = set(weights)
        if keys != set(retrievers):
            missing = sorted(set(retrievers) - keys)
            extra = sorted(keys - set(retrievers))
            raise InvalidWeightsError(
                f"weights must name exactly the retrievers {list(retrievers)}; "
                f"missing {missing}, unknown {extra}"
            )
        raw = [weights[r] for r in retrievers]
    else:
        if isinstance(weights, (str, bytes)):
            raise InvalidWeightsError(f"weights must be numbers, got {weights!r}")
        if isinstance(weights, np.ndarray):
            raw = list(np.asarray(weights, dtype=object).ravel())
        elif isinstance(weights, Iterable):
            raw = list(weights)
        else:  # one number: list() of it was a bare TypeError ("'float' object is not iterable")
            raise InvalidWeightsError(f"weights must be a mapping or a sequence of {n} numbers, got {weights!r}")
        if len(raw) != n:
            raise InvalidWeightsError(f"expected {n} weights for {list(retrievers)}, got {len(raw)}")
    vals = []
    for x in raw:
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
            raise InvalidWeightsError(f"weights must be numbers, got {weights!r}")
        try:
            vals.append(float(x))
        except OverflowError:  # an int beyond float range
            raise InvalidWeightsError(f"weights must be finite, got {weights!r}") from None
    vec = np.asarray(vals, dtype=float)
    if not np.all(np.isfinite(vec)):
        raise InvalidWeightsError(f"weights must be finite, got {weights!r}")
    if np.any(vec < 0):
        raise InvalidWeightsError(f"weights must be non-negative, got {weights!r}")
    if not vec.any():
        raise InvalidWeightsError(f"weights must not all be zero, got {weights!r}")
    vec = vec / vec.max()  # first: two weights of 1e308 would sum to inf, and every share to 0
    return vec / vec.sum()


def weights_dict(vec: np.ndarray, retrievers: Sequence[str]) -> dict[str, float]:
    """Return a ``{retriever: weight}`` dict of plain floats."""
    return {r: float(w) for r, w in zip(retrievers, vec, strict=True)}


def logged_weights(weights: Mapping[str, float], retrievers: Sequence[str]) -> np.ndarray:
    """The weights a logged decision used, as a vector; validated like user weights."""
    return weights_vector(dict(weights), retrievers)


def project_simplex(v: np.ndarray, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{w : sum(w) = 1, lo <= w <= hi}``.

    This is "clip to the bounds and renormalise" done exactly: the result is
    ``clip(v - theta, lo, hi)`` for the shift ``theta`` that makes it sum to one.
    When the bounds cannot hold for ``n`` weights they are widened to ``1/n``: then every
    weight is ``1/n``. The policies refuse such bounds (``BasePolicy._check_bounds_fit``),
    and their default lower bound stays under ``1/n`` (:func:`default_bounds`).

    >>> project_simplex(np.array([1.0, 0.0, 0.0]), 0.05, 0.95).round(3).tolist()
    [0.9, 0.05, 0.05]
    """
    v = np.asarray(v, dtype=float)
    n = v.shape[0]
    if n == 1:
        return np.ones(1)
    lo = min(lo, 1.0 / n)
    hi = max(hi, 1.0 / n)
    # g(theta) = sum(clip(v - theta, lo, hi)) is piecewise linear and non-increasing.
    bps = np.sort(np.concatenate([v - lo, v - hi]))
    g = np.clip(v[None, :] - bps[:, None], lo, hi).sum(axis=1)  # non-increasing in bps
    # find consecutive breakpoints with g[i] >= 1 >= g[i+1]
    idx = int(np.searchsorted(-g, -1.0, side="left"))
    if idx <= 0:
        theta = bps[0]
    elif idx >= len(bps):
        theta = bps[-1]
    else:
        g0, g1 = g[idx - 1], g[idx]
        t0, t1 = bps[idx - 1], bps[idx]
        theta = t0 if g0 == g1 else t0 + (g0 - 1.0) * (t1 - t0) / (g0 - g1)
    w = np.clip(v - theta, lo, hi)
    s = w.sum()
    return w / s if s > 0 else np.full(n, 1.0 / n)


def score_scale(matrix: np.ndarray) -> float:
    """The scale of a normalised score matrix: its largest absolute value (1.0 when empty or zero).

    Min-max scores have a scale near 1, RRF scores near ``1/61``; dividing by
    the scale makes temperatures and feature weights mean the same under each.
    """
    if matrix.size == 0:
        return 1.0
    m = float(np.max(np.abs(matrix)))
    return m if m > 1e-12 and math.isfinite(m) else 1.0


def decay_factor(dt_seconds: float, half_life_days: float | None) -> float:
    """``0.5 ** (dt / half_life)``; 1.0 when forgetting is off or no time passed."""
    if half_life_days is None or dt_seconds <= 0:
        return 1.0
    return float(0.5 ** (dt_seconds / (half_life_days * DAY)))


def clock_decay(last: float, t: float, half_life_days: float | None) -> tuple[float, float, float]:
    """How a running sum kept on a clock ``last`` takes an observation made at time ``t``.

    Returns ``(past, weight, clock)``: the factor for what was summed so far, the
    factor for the new observation (one older than the clock, a late reward for
    an old decision, counts less) and the new clock. ``t <= 0`` means no time.

    >>> clock_decay(86_400.0, 2 * 86_400.0, 1.0)
    (0.5, 1.0, 172800.0)
    >>> clock_decay(2 * 86_400.0, 86_400.0, 1.0)
    (1.0, 0.5, 172800.0)
    """
    if t <= 0:
        return 1.0, 1.0, last
    if t > last:
        return (decay_factor(t - last, half_life_days) if last > 0 else 1.0), 1.0, t
    return 1.0, decay_factor(last - t, half_life_days), last


def episode_time(episode: Any) -> float:
    """The time an episode describes: its decision time, else its feedback time (0 if neither)."""
    t = float(getattr(episode, "timestamp", 0.0) or 0.0)
    if t <= 0:
        t = float(getattr(episode, "feedback_time", 0.0) or 0.0)
    return t if math.isfinite(t) else 0.0


# --------------------------------------------------------------------------- click inference


def pdgd_pairs(rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PDGD's inferred preferences over a shown list, best first.

    A chunk with a positive reward (a click) is preferred over every
    unrewarded chunk shown above the last positive one and over the first
    unrewarded chunk right below it (Oosterhuis and de Rijke, 2018). Chunks
    with a negative reward are always on the losing side. Returns the
    positions of the preferred and the dispreferred chunks.

    >>> pos, neg = pdgd_pairs(np.array([0.0, 1.0, 0.0, 0.0]))
    >>> pos.tolist(), neg.tolist()
    ([1], [0, 2])
    """
    r = np.asarray(rewards, dtype=float)
    pos = np.flatnonzero(r > 0)
    if pos.size == 0:
        return pos, np.flatnonzero(r < 0)
    last = int(pos[-1])
    cutoff = min(last + 2, r.shape[0])
    region = np.zeros(r.shape[0], dtype=bool)
    region[:cutoff] = True
    neg = np.flatnonzero((region & (r <= 0)) | (r < 0))
    return pos, neg


def chunk_evidence(
    rewards: np.ndarray,
    episode_reward: float,
    skip_weight: float,
    abandon_weight: float,
    prior: np.ndarray | None = None,
    *,
    response_level: bool = True,
    used: np.ndarray | None = None,
) -> np.ndarray:
    """Per-shown-chunk evidence for confidences and memory, from one piece of feedback.

    A rewarded chunk keeps its reward. An unrewarded chunk shown above a
    positive one was read and passed over (a cascade user reads top-down):
    it gets ``-skip_weight``. When nothing was rewarded and a response-level
    reward is negative, every shown chunk gets ``abandon_weight * reward``
    (a reformulation, -0.2, is weaker evidence than a thumbs down, -1); a
    negative on one chunk (``response_level=False``) says nothing of the others.

    Feedback on one event arrives one signal at a time. ``prior`` holds the
    rewards earlier feedback on the same event gave each shown chunk: a chunk
    rewarded before is never read as skipped, and chunks above an earlier
    click were already counted as skipped then, so they are not counted twice.
    A chunk above an earlier click, counted as skipped then, keeps that skip
    when it is clicked later, so its evidence depends on the order the two
    clicks arrive in (see docs/limitations.md).

    >>> chunk_evidence(np.array([0.0, 0.4, 0.0]), 0.4, 0.2, 0.5).tolist()
    [-0.2, 0.4, 0.0]
    >>> chunk_evidence(np.array([0.0, 0.0]), -1.0, 0.2, 0.5).tolist()
    [-0.5, -0.5]
    >>> chunk_evidence(np.array([0.0, -1.0]), -1.0, 0.2, 0.5, response_level=False).tolist()
    [0.0, -1.0]

    ``used`` marks the chunks the answer was written from (``None``: all): praise of the answer reads none
    of the others as passed over (a chunk a later step cut before the answer was never seen), so a thumbs
    up spread over ranks 2 and 3 does not count an unused rank 1 as skipped.

    >>> chunk_evidence(np.array([0.0, 1.0, 1.0]), 1.0, 0.2, 0.5, used=np.array([False, True, True])).tolist()
    [0.0, 1.0, 1.0]

    A second click at rank 4, after a first at rank 2: only rank 3 is newly skipped.

    >>> chunk_evidence(np.array([0.0, 0.0, 0.0, 0.4]), 0.4, 0.2, 0.5, prior=np.array([0.0, 0.4, 0.0, 0.0])).tolist()
    [0.0, 0.0, -0.2, 0.4]
    """
    r = np.asarray(rewards, dtype=float).copy()
    before = np.zeros_like(r) if prior is None else np.asarray(prior, dtype=float)
    total = before + r
    pos = np.flatnonzero(total > 0)
    if pos.size:
        earlier = np.flatnonzero(before > 0)
        start = int(earlier[-1]) if earlier.size else 0
        skipped = np.zeros(r.shape[0], dtype=bool)
        skipped[start : int(pos[-1])] = True
        if response_level and used is not None:
            skipped &= np.asarray(used, dtype=bool)
        r[skipped & (total == 0)] = -skip_weight
    elif response_level and episode_reward < 0:
        r[r == 0] = abandon_weight * max(-1.0, episode_reward)
    return r


def ranks_nothing(gains: np.ndarray) -> bool:
    """Whether ``gains`` (one per shown chunk) are all alike: praise of an answer spread over every shown chunk,
    under which no order of those chunks is better than another, so a comparison of rankings learns nothing.

    >>> ranks_nothing(np.array([0.25, 0.25, 0.25])), ranks_nothing(np.array([0.0, 0.4, 0.0]))
    (True, False)
    """
    g = np.asarray(gains, dtype=float)
    return g.size > 0 and bool(np.all(g == g[0]))


def shared_credit(evidence: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    """``evidence`` with the praise of a whole response shared among the chunks it went to.

    One signal that rewards several chunks at once (a thumbs up or a rating on
    the answer, spread over the chunks that were used) says that at least one of
    them helped, not that each did, so each gets ``1/n`` of its positive
    evidence. A click rewards one chunk, and criticism of the answer (nothing in
    it helped) holds for each chunk: both are left whole.

    >>> shared_credit(np.array([1.0, 1.0, 1.0, 1.0]), np.array([1.0, 1.0, 1.0, 1.0])).tolist()
    [0.25, 0.25, 0.25, 0.25]
    >>> shared_credit(np.array([-0.3, 0.4, 0.0]), np.array([0.0, 0.4, 0.0])).tolist()
    [-0.3, 0.4, 0.0]
    >>> shared_credit(np.array([-1.0, -1.0]), np.array([-1.0, -1.0])).tolist()
    [-1.0, -1.0]
    """
    ev = np.asarray(evidence, dtype=float)
    n = int(np.count_nonzero(np.asarray(rewards, dtype=float) > 0))
    if n <= 1:
        return ev
    return np.where(ev > 0, ev / n, ev)


# --------------------------------------------------------------------------- RNG state


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """The generator's state as JSON-safe data (big integers become strings)."""

    def enc(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: enc(v) for k, v in x.items()}
        if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            return str(int(x))
        return x

    return enc(rng.bit_generator.state)


def set_rng_state(rng: np.random.Generator, state: Mapping[str, Any]) -> None:
    """Restore a state produced by :func:`rng_state`."""

    def dec(x: Any) -> Any:
        if isinstance(x, Mapping):
            return {k: dec(v) for k, v in x.items()}
        if isinstance(x, str) and x.lstrip("-").isdigit():
            return int(x)
        return x

    try:
        rng.bit_generator.state = dec(state)
    except (TypeError, ValueError, KeyError) as exc:
        raise CorruptStateError(f"bad random generator state: {exc}") from exc


def float_list(x: Iterable[float]) -> list[float]:
    """Plain floats for JSON (NaN would not round-trip, so it is refused)."""
    out = [float(v) for v in x]
    if not all(math.isfinite(v) for v in out):
        raise ValidationError("state contains a non-finite number")
    return out


def read_array(state: Mapping[str, Any], key: str, length: int | None = None) -> np.ndarray:
    """Read a finite float list from a state dict, or raise :class:`CorruptStateError`."""
    try:
        arr = np.asarray(state[key], dtype=float)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptStateError(f"policy state field {key!r} is missing or not numeric") from exc
    if arr.ndim != 1 or (length is not None and arr.shape[0] != length):
        raise CorruptStateError(f"policy state field {key!r} has the wrong shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise CorruptStateError(f"policy state field {key!r} holds non-finite numbers")
    return arr


#: The largest count a saved state may hold: 2**53, the largest of the integers a float holds exactly. Counts grow
#: by one an episode, so none comes near it; 10**400 in a damaged save was accepted, and the next update or ranking
#: that took it as a float raised a raw OverflowError.
MAX_COUNT = 2**53


def saved_count(name: str, value: Any) -> int:
    """``value``, a count read from a saved state: an int (not a bool) in ``[0, MAX_COUNT]``, or raise
    :class:`CorruptStateError`.

    >>> saved_count("added", 12)
    12
    >>> saved_count("added", 10**400)
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: added must be in [0, 9007199254740992], got an int of 1329 bits
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_COUNT:  # repr() fails past 4300 digits
        raise CorruptStateError(f"{name} must be in [0, {MAX_COUNT}], got an int of {value.bit_length()} bits")
    try:
        return check_int(name, value, 0, MAX_COUNT)
    except ValidationError as exc:  # damaged saved state, not a bad argument
        raise CorruptStateError(str(exc)) from exc


def saved_times(what: str, times: Any) -> None:
    """Refuse saved clocks ``times`` (a number or an array) beyond the learner's own bound on the future (30
    days past this machine's clock), with :class:`CorruptStateError`: the clocks only move forward, so one such
    time made every later episode count as long past (weight about 0) and the policy stopped learning, for good.
    Times that are not finite are the caller's to refuse."""
    from rlfb.learner_checks import _not_future  # the learner's bound; imported here, as rlfb.policies loads first

    arr = np.asarray(times, dtype=float)
    if arr.size:
        try:
            _not_future(what, float(np.max(arr)))
        except ValidationError as exc:
            raise CorruptStateError(f"saved state: {exc}") from exc


def read_count(state: Mapping[str, Any], key: str) -> int:
    """Read a non-negative int counter (at most :data:`MAX_COUNT`) from a state dict, or raise
    :class:`CorruptStateError`.

    ``int()`` took -5 (then ``sqrt(1 + n)`` failed at every retrieval), 2.7 and "5" alike.
    """
    try:
        value = state[key]
    except KeyError as exc:
        raise CorruptStateError(f"policy state field {key!r} is missing") from exc
    return saved_count(f"policy state field {key!r}", value)


def read_field(state: Mapping[str, Any], key: str, kind: type = object) -> Any:
    """``state[key]``, which must be a ``kind``, or raise :class:`CorruptStateError` naming the field.

    >>> read_field({"buffer": None}, "buffer", list)
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: policy state field 'buffer' must be a list, got NoneType
    """
    try:
        value = state[key]
    except KeyError:
        raise CorruptStateError(f"policy state field {key!r} is missing") from None
    if not isinstance(value, kind):
        raise CorruptStateError(f"policy state field {key!r} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def check_at_most(what: str, value: Any, most: float) -> None:
    """Refuse ``value`` (a running sum, or an array of them) above ``most``, the most the updates that built it
    could have added, with :class:`CorruptStateError`; the slack is rounding in the running sums.

    >>> check_at_most("arm statistics for '*': their count", 1e300, 60.0)
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: arm statistics for '*': their count is 1e+300, more than the 60 its updates could add
    """
    top = float(np.max(value)) if np.size(value) else 0.0
    if not top <= most * (1.0 + 1e-9) + 1e-9:
        raise CorruptStateError(f"{what} is {top:g}, more than the {most:g} its updates could add")


def check_within_bounds(key: str, weights: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """``weights``, read from the policy state field ``key``, or :class:`CorruptStateError` where one lies outside
    ``bounds`` as :func:`project_simplex` applies them (widened to ``1/n``) by more than float round-off: a policy
    projects every weight it keeps within them, so one outside was written by hand, and was served as it was.

    >>> check_within_bounds("weights", np.array([0.99, 0.01]), (0.05, 0.95))
    Traceback (most recent call last):
    ...
    rlfb.errors.CorruptStateError: policy state field 'weights' holds weights outside the policy's bounds ...
    """
    n = weights.shape[0]
    lo, hi = min(bounds[0], 1.0 / n), max(bounds[1], 1.0 / n)
    if np.any(weights < lo - 1e-9) or np.any(weights > hi + 1e-9):
        raise CorruptStateError(f"policy state field {key!r} holds weights outside the policy's bounds "
                                f"[{lo:g}, {hi:g}]: {weights.tolist()}")
    return weights


def check_simplex(what: str, weights: np.ndarray) -> np.ndarray:
    """``weights``, or :class:`CorruptStateError` where they are not on the simplex (non-negative, summing to 1),
    as every policy keeps and logs its weights."""
    if np.any(weights < 0) or abs(float(weights.sum()) - 1.0) > 1e-6:
        raise CorruptStateError(f"{what} are not on the simplex: {weights.tolist()}")
    return weights


def read_number(state: Mapping[str, Any], key: str, lo: float | None = None, hi: float | None = None) -> float:
    """Read a finite number in ``[lo, hi]`` from a state dict, or raise :class:`CorruptStateError`."""
    try:
        return check_float(f"policy state field {key!r}", state[key], lo, hi)
    except KeyError as exc:
        raise CorruptStateError(f"policy state field {key!r} is missing") from exc
    except ValidationError as exc:
        raise CorruptStateError(str(exc)) from exc


# --------------------------------------------------------------------------- base policy


class BasePolicy:
    """What every policy shares: retrievers, a seeded generator, tuning multipliers, ``partial_fit``.

    Subclasses set ``name`` and implement ``decide``, ``learn``, ``weights``
    and ``_state``/``_load_state``.
    """

    name = "base"

    def __init__(self, retrievers: Sequence[str], seed: int | None = 0) -> None:
        self.retrievers = validate_retrievers(retrievers)
        if seed is not None:
            seed = check_int("seed", seed, 0)  # a numpy integer as a plain one: its state is written as JSON
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._n_updates = 0.0
        self._lr_scale = 1.0
        self._explore_scale = 1.0

    def _bounds_or_default(self, bounds: tuple[float, float] | None) -> tuple[float, float]:
        """The bounds given, or where none were (``None``, the constructors' default) :func:`default_bounds` for
        this policy's number of retrievers: only the default adapts to ``n``. ``hyper.bounds``, and the saved
        ``params`` a learner is rebuilt from, hold the bounds in use."""
        return default_bounds(len(self.retrievers)) if bounds is None else bounds

    def _check_bounds_fit(self, bounds: tuple[float, float]) -> None:
        """Refuse bounds that leave ``n`` weights no room: an upper bound under ``1/n`` (no ``n`` weights under it
        sum to 1) or a lower bound at or over ``1/n`` (only ``1/n`` each do). The projection widened either to
        ``1/n``, so the policy kept equal weights for ever while its ``hyper.bounds`` said otherwise. The default
        lower bound stays under ``1/n`` (:func:`default_bounds`): only bounds given explicitly are refused."""
        n = len(self.retrievers)
        if n > 1 and bounds[1] * n < 1.0 - 1e-12:
            raise ValidationError(f"bounds {tuple(bounds)} cannot hold {n} weights summing to 1: the upper bound "
                                  f"must be at least 1/{n}")
        if n > 1 and bounds[0] * n >= 1.0 - 1e-12:
            raise ValidationError(f"bounds {tuple(bounds)} pin each of {n} weights at 1/{n}: the lower bound must "
                                  f"be under 1/{n} (leave bounds out for a default that fits {n} retrievers)")

    # -- tuning by the guardrail
    def tune(self, *, learning_rate: float = 1.0, exploration: float = 1.0) -> BasePolicy:
        """Set the guardrail's multipliers on the learning rate and on exploration."""
        self._lr_scale = check_float("learning_rate multiplier", learning_rate, 0.0, 10.0)
        self._explore_scale = check_float("exploration multiplier", exploration, 0.0, 10.0)
        return self

    @property
    def n_updates(self) -> float:
        """The (replay-weighted) number of updates learned so far."""
        return self._n_updates

    def partial_fit(self, episodes: Iterable[Any]) -> BasePolicy:
        """Replay logged episodes through :meth:`learn`, each with its own reward."""
        for ep in episodes:
            self.learn(ep, ep.reward)  # type: ignore[attr-defined]
        return self

    def uncertainty(self, context: Any) -> float:
        """How unsure the policy is about its weights for this context, in [0, 1]."""
        return 0.0

    def params(self) -> dict[str, Any]:  # pragma: no cover - overridden
        return {}

    def _state(self) -> dict[str, Any]:  # pragma: no cover - overridden
        return {}

    def _load_state(self, state: Mapping[str, Any]) -> None:  # pragma: no cover - overridden
        return None

    def state_dict(self) -> dict[str, Any]:
        """Hyperparameters, learned state and the generator's state, JSON-safe."""
        return {
            "name": self.name,
            "retrievers": list(self.retrievers),
            "params": self.params(),
            "seed": self.seed,
            "n_updates": float(self._n_updates),
            "lr_scale": float(self._lr_scale),
            "explore_scale": float(self._explore_scale),
            "rng": rng_state(self._rng),
            "state": self._state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> BasePolicy:
        """Restore what :meth:`state_dict` saved; a mismatch or damage raises :class:`CorruptStateError`."""
        if not isinstance(state, Mapping):
            raise CorruptStateError(f"policy state must be a mapping, got {type(state).__name__}")
        try:
            if state.get("name") != self.name:
                raise CorruptStateError(f"state is for policy {state.get('name')!r}, not {self.name!r}")
            if tuple(state.get("retrievers", ())) != self.retrievers:
                raise CorruptStateError(
                    f"state is for retrievers {state.get('retrievers')!r}, not {list(self.retrievers)!r}"
                )
            # replay-weighted, so a float; at most MAX_COUNT: float(10**400) raised a raw OverflowError here
            n_updates = read_number(state, "n_updates", 0.0, float(MAX_COUNT))
            # the guardrail's multipliers, in [0, 10] as tune() sets them (1e300 loaded); absent in older states
            lr_scale = read_number({"lr_scale": 1.0, **state}, "lr_scale", 0.0, 10.0)
            explore_scale = read_number({"explore_scale": 1.0, **state}, "explore_scale", 0.0, 10.0)
            saved, ours = state.get("params"), self.params()
            if isinstance(saved, Mapping) and isinstance(saved.get("bounds"), list) and len(saved["bounds"]) == 2:
                # the old default that pinned the weights, as today's default (saved_bounds)
                saved = {**saved, "bounds": list(saved_bounds(tuple(saved["bounds"]), len(self.retrievers)))}
            if isinstance(saved, Mapping):
                from rlfb.policies.base import same_hyperparameters  # base imports this module

                if not same_hyperparameters(saved, ours):  # a parameter added since the save is not a mismatch
                    raise CorruptStateError(
                        f"state is for {self.name} hyperparameters {dict(saved)}, not {ours}: its learned "
                        "state does not fit this policy"
                    )
            set_rng_state(np.random.default_rng(), state["rng"])  # checked before anything is changed
            backup = dict(vars(self))
            try:
                self._n_updates = n_updates  # what the learned sums are checked against (check_at_most)
                self._load_state(state["state"])
            except BaseException:
                # a field read after others were set (batch's weights before its counters) left a half-loaded
                # policy: put every attribute back as it was
                vars(self).clear()
                vars(self).update(backup)
                raise
            set_rng_state(self._rng, state["rng"])
        except CorruptStateError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise CorruptStateError(f"cannot read {self.name} policy state: {exc!r}") from exc
        self._n_updates = n_updates
        self._lr_scale = lr_scale
        self._explore_scale = explore_scale
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({list(self.retrievers)!r}, {args})"
