"""Checks of what a :class:`~rlfb.learner.Learner` is given and of its saved state.

An episode's logged fields (times, features, scores, ids, the decision), a log's query embeddings, a context's
candidate embeddings and a policy's sampled ranking are checked before the learner takes them, and a saved
state for NaN or an infinity before it is loaded.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.policies.base import Context, Episode


def _check_finite(state: Mapping[str, Any]) -> None:
    """Refuse a state with NaN or an infinity: a saved state is always finite (the store refuses
    them), and one let in would make every later save fail."""
    bad = _non_finite(state)
    if bad is not None:
        raise CorruptStateError(f"learner state holds a non-finite number at {bad}")


def _non_finite(obj: Any, path: str = "state") -> str | None:
    """Where ``obj`` (JSON-like) holds NaN or an infinity, or ``None``.

    >>> _non_finite({"a": [1.0, float("nan")]})
    "state['a'][1]"
    """
    if isinstance(obj, float):
        return None if math.isfinite(obj) else path
    if isinstance(obj, Mapping):
        items: Any = obj.items()
    elif isinstance(obj, (list, tuple)):
        if obj and isinstance(obj[0], (float, list)):
            try:  # a vector or matrix of numbers (embeddings, replay rows): checked at numpy's speed
                if np.isfinite(np.asarray(obj, dtype=np.float64)).all():
                    return None
            except (TypeError, ValueError, OverflowError):
                pass  # ragged or mixed: look element by element
        items = enumerate(obj)
    else:
        return None
    for key, value in items:
        found = _non_finite(value, f"{path}[{key!r}]")
        if found is not None:
            return found
    return None


def _number(what: str, value: Any) -> None:
    """Refuse ``value`` unless it is a finite real number."""
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValidationError(f"{what} must be a number, got {value!r}")
    try:
        finite = math.isfinite(float(value))
    except OverflowError:  # an int beyond float range
        finite = False
    if not finite:
        raise ValidationError(f"{what} must be finite, got {value!r}")


#: How far past this machine's clock a logged or saved time may be: a time in milliseconds, as JavaScript's
#: Date.now() gives, is 50,000 years ahead, while the clock of the machine that logged it, or of this one, may
#: be days off (one that ran two days fast wrote snapshots that a bound of a day refused to load once corrected)
FUTURE_TOLERANCE = 30 * 86_400.0


def _not_future(what: str, t: float) -> None:
    """Refuse a time far in the future: the learner's clocks only move forward, so one such time would
    decay everything learned to nothing and weigh every later episode as long past, for good."""
    if t > time.time() + FUTURE_TOLERANCE:
        raise ValidationError(f"{what} {t!r} is more than 30 days in the future by this machine's clock: times "
                              "are seconds since the epoch (a time in milliseconds?)")


def _check_logged_fields(episode: Episode, n_shown: int) -> None:
    """Refuse an episode whose times, features, scores, prior rewards or decision are not finite numbers.

    They go into the replay buffer as they are, and the buffer is saved with the state: a NaN, an
    infinity or a value that is not a number would be learned and then make every later save fail.
    """
    _number("episode timestamp", episode.timestamp)
    _number("episode feedback_time", episode.feedback_time)
    for name in ("timestamp", "feedback_time"):
        _not_future(f"episode {name}", float(getattr(episode, name)))
    if not isinstance(episode.features, Mapping):
        raise ValidationError(f"episode features must be a mapping, got {type(episode.features).__name__}")
    for key, value in episode.features.items():
        if not isinstance(key, str):
            raise ValidationError(f"episode feature names must be strings, got {key!r}")
        _number(f"episode feature {key!r}", value)
    for name in ("scores", "prior_rewards"):
        values = getattr(episode, name)
        if values is None:
            continue
        try:
            arr = np.asarray(values, dtype=float)
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"episode {name} must be numbers: {exc}") from exc
        if arr.shape != (n_shown,):
            raise ValidationError(f"episode has {n_shown} shown chunks but {arr.shape} {name}")
        if not np.all(np.isfinite(arr)):
            raise ValidationError(f"episode {name} must be finite")
    # ids and names are saved as JSON strings: a UUID event id, an np.int64 arm or rank made every save fail
    if not isinstance(episode.event_id, str):
        raise ValidationError(f"episode event_id must be a str, got {type(episode.event_id).__name__}")
    if not isinstance(episode.query_type, str):  # a list failed inside the policy, after the learner's clock moved
        raise ValidationError(f"episode query_type must be a str, got {episode.query_type!r}")
    decision = episode.decision
    if decision.arm is not None and not isinstance(decision.arm, str):
        raise ValidationError(f"episode decision arm must be a str or None, got {decision.arm!r}")
    if not isinstance(decision.policy, str):
        raise ValidationError(f"episode decision policy must be a str, got {decision.policy!r}")
    ranking = decision.ranking
    if ranking is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ranking):
        raise ValidationError("episode decision ranking must list ints (candidate indices); NumPy ints "
                              "are not saved as JSON: convert them with int()")
    if ranking is not None and any(i < 0 for i in ranking):  # learned, then saved, then refused at every load
        raise ValidationError(f"episode decision ranking must list candidate indices (0 or more), got {ranking!r}")
    weights = getattr(decision, "weights", None)
    if not isinstance(weights, Mapping):
        raise ValidationError(f"episode decision weights must be a mapping, got {weights!r}")
    for key, value in weights.items():
        _number(f"episode decision weight {key!r}", value)
    _number("episode decision propensity", decision.propensity)
    if not 0.0 < float(decision.propensity) <= 1.0:  # a probability of the action taken, as the store logs it
        raise ValidationError(f"episode decision propensity must lie in (0, 1], got {decision.propensity!r}")
    if decision.sampling_temperature is not None:
        _number("episode decision sampling_temperature", decision.sampling_temperature)


def _embedding_dim(embedding: Any, dim: int | None) -> int | None:
    """The dimension of a log's query embeddings so far, with ``embedding`` taken in; another raises."""
    if embedding is None:
        return dim
    e = np.asarray(embedding, dtype=np.float32).ravel()
    if e.size == 0 or not np.all(np.isfinite(e)):  # the memory ignores such an embedding
        return dim
    if dim is not None and e.shape[0] != dim:
        raise ValidationError(f"query embedding has {e.shape[0]} dimensions, earlier ones in the log {dim}")
    return int(e.shape[0])

def _candidate_embeddings(context: Context, n: int) -> np.ndarray | None:
    """The context's candidate embeddings, checked: one finite row per candidate (``None`` where it has none)."""
    vectors = context.candidate_embeddings
    if vectors is None:
        return None
    try:
        V = np.asarray(vectors, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"context candidate_embeddings must be a matrix of numbers: {exc}") from exc
    if V.ndim != 2 or V.shape[0] != n:
        raise ValidationError(f"context candidate_embeddings must have one row for each of the {n} candidates, "
                              f"got shape {V.shape}")
    if not np.all(np.isfinite(V)):
        raise ValidationError("context candidate_embeddings must be finite")
    return V


def _valid_ranking(ranking: Sequence[int], n: int) -> bool:
    """Whether a policy's sampled ``ranking`` orders some of ``n`` candidates, each at most once (else the greedy
    order is served: a repeated place showed one chunk twice).

    >>> _valid_ranking((2, 0, 1), 3), _valid_ranking((0, 0, 1), 3), _valid_ranking((0, 3), 3)
    (True, False, False)
    """
    seen = set()
    for i in ranking:
        if not 0 <= int(i) < n or int(i) in seen:
            return False
        seen.add(int(i))
    return True
