"""``ChunkConfidence``: per-chunk confidence in [1, 10] and a Beta posterior per chunk.

As in the design we work from, each chunk's confidence starts at ``initial``
(5) and moves by ``reward * learning_rate * relevance`` after each rewarded
retrieval, clipped to ``[low, high]`` (1 to 10); the learning rate is kept
between 0.01 and 0.05 so that updates stay small and bounded. ``relevance`` is
the chunk's retrieval score in [0, 1].

Alongside it a Beta posterior per chunk counts successes (positive evidence)
and failures (negative evidence), for Thompson-sampled exploration over chunks
(:class:`rlfb.exploration.ThompsonChunkExploration`).

Both forget: with ``half_life_days`` set, a chunk's confidence decays back
towards ``initial`` and its Beta counts towards the prior, halving every half
life, so a drifting world is followed: with the default 45 days, evidence
from 90 days ago keeps a quarter of its weight (the feedback issue's 90-day
window, made smooth). Evidence is aged by the time of the retrieval it is on: feedback
on a retrieval older than the newest learned from counts as decayed as it would
have, learned in time order.

:meth:`ChunkConfidence.feature` is the confidence as a fusion feature: centred
so that an unseen chunk contributes 0, +1 at ``high`` and -1 at ``low``.

>>> conf = ChunkConfidence()
>>> conf.update(["a", "b"], [1.0, -1.0], [1.0, 0.5])
>>> conf.confidence(["a", "b", "unseen"]).round(3).tolist()
[5.03, 4.985, 5.0]
>>> conf.feature(["a", "unseen"]).round(4).tolist()
[0.006, 0.0]
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlfb.blocks import encode_block
from rlfb.decay import decay_factor
from rlfb.errors import CorruptStateError, NonFiniteValueError, ValidationError
from rlfb.hyperparameters import check_float, plain_numbers
from rlfb.reward import finite_float
from rlfb.saved_state import saved_times

__all__ = ["ConfidenceParams", "ChunkConfidence", "MAX_CHUNKS"]

#: Chunks that keep a confidence, at most: past it the least recently updated tenth is forgotten (they are
#: back at the prior, as a chunk never rated is). Without a bound every chunk ever rated stayed in the state
#: that each feedback writes: on a 50,000-chunk corpus about 2.8 new rows per feedback, and at 200,000 rows a
#: 14 MB snapshot and 177 ms a feedback. At this bound the confidences are about 3.5 MB of it.
MAX_CHUNKS = 50_000


@dataclass(frozen=True)
class ConfidenceParams:
    """Hyperparameters of :class:`ChunkConfidence` (validated).

    >>> ConfidenceParams(learning_rate=0.5)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: learning_rate must be in [0.01, 0.05], got 0.5
    """

    learning_rate: float = 0.03
    initial: float = 5.0
    low: float = 1.0
    high: float = 10.0
    half_life_days: float | None = 45.0
    prior_alpha: float = 1.0
    prior_beta: float = 1.0

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_float("learning_rate", self.learning_rate, 0.01, 0.05)
        check_float("low", self.low)
        check_float("high", self.high)
        check_float("initial", self.initial)
        if not self.low < self.initial < self.high:
            raise ValidationError(f"need low < initial < high, got {self.low}, {self.initial}, {self.high}")
        if self.half_life_days is not None:
            check_float("half_life_days", self.half_life_days, 0.0, None, lo_open=True)
        check_float("prior_alpha", self.prior_alpha, 0.0, None, lo_open=True)
        check_float("prior_beta", self.prior_beta, 0.0, None, lo_open=True)


class ChunkConfidence:
    """Confidence scores and Beta posteriors of chunks, updated from rewards.

    Parameters
    ----------
    learning_rate
        Step per unit of ``reward * relevance``; validated in [0.01, 0.05].
    initial, low, high
        Start value and bounds of a confidence (5, 1 and 10).
    half_life_days
        Forgetting: evidence halves every this many days (``None``: never forget).
    prior_alpha, prior_beta
        The Beta prior of an unseen chunk.
    """

    def __init__(
        self,
        learning_rate: float = 0.03,
        initial: float = 5.0,
        low: float = 1.0,
        high: float = 10.0,
        *,
        half_life_days: float | None = 45.0,
        prior_alpha: float = 1.0,
        prior_beta: float = 1.0,
    ) -> None:
        self.hyper = ConfidenceParams(
            learning_rate, initial, low, high, half_life_days, prior_alpha, prior_beta
        )
        self._index: dict[str, int] = {}
        self._ids: list[str] = []
        # declared as any float array: numpy's stubs of some versions (2.2, the last for Python 3.10) type
        # np.zeros(0) as one-dimensional, and a loaded state's arrays as of any shape
        self._conf: np.ndarray = np.zeros(0)
        self._alpha: np.ndarray = np.zeros(0)
        self._beta: np.ndarray = np.zeros(0)
        self._time: np.ndarray = np.zeros(0)
        self._now = 0.0

    def __len__(self) -> int:
        return len(self._ids)

    def known(self, chunk_ids: Sequence[str]) -> int:
        """How many of ``chunk_ids`` have a confidence learned from feedback.

        >>> conf = ChunkConfidence()
        >>> conf.update(["a"], [1.0])
        >>> conf.known(["a", "b"])
        1
        """
        return int(np.count_nonzero(self._rows(list(chunk_ids), create=False) >= 0))

    # ------------------------------------------------------------------ storage
    def _rows(self, chunk_ids: Sequence[str], create: bool) -> np.ndarray:
        idx = np.empty(len(chunk_ids), dtype=np.int64)
        for i, cid in enumerate(chunk_ids):
            j = self._index.get(cid)
            if j is None:
                if not create:
                    idx[i] = -1
                    continue
                j = len(self._ids)
                self._index[cid] = j
                self._ids.append(cid)
            idx[i] = j
        if create and len(self._ids) > self._conf.shape[0]:
            cap = max(64, 2 * len(self._ids))
            h = self.hyper
            self._conf = _grow(self._conf, cap, h.initial)
            self._alpha = _grow(self._alpha, cap, h.prior_alpha)
            self._beta = _grow(self._beta, cap, h.prior_beta)
            self._time = _grow(self._time, cap, 0.0)
        return idx

    def _decay(self, rows: np.ndarray, now: float) -> np.ndarray:
        """Forgetting factor of each row at time ``now`` (1 for rows never timed or when off)."""
        hl = self.hyper.half_life_days
        if hl is None or now <= 0:
            return np.ones(rows.shape[0])
        t = self._time[rows]
        dt = np.where(t > 0, np.maximum(now - t, 0.0), 0.0)
        return 0.5 ** (dt / (hl * 86_400.0))

    # ------------------------------------------------------------------ updating
    def update(
        self,
        chunk_ids: Sequence[str],
        rewards: Sequence[float] | np.ndarray,
        relevance: Sequence[float] | np.ndarray | None = None,
        *,
        timestamp: float = 0.0,
    ) -> None:
        """Move each chunk's confidence by ``reward * learning_rate * relevance`` and count its evidence.

        ``rewards`` are per-chunk evidence in [-1, 1] (zero leaves a chunk
        unchanged); ``relevance`` defaults to 1.
        """
        r = np.asarray(rewards, dtype=float)
        if r.shape != (len(chunk_ids),):
            raise ValidationError(f"got {len(chunk_ids)} chunk ids but {r.shape} rewards")
        rel = np.ones_like(r) if relevance is None else np.asarray(relevance, dtype=float)
        # checked before clipping: clipped, an infinite reward would pass as a full one
        if rel.shape != r.shape or not np.all(np.isfinite(r)) or not np.all(np.isfinite(rel)):
            raise ValidationError("rewards and relevance must be finite and of equal length")
        timestamp = finite_float(timestamp, "timestamp")  # an infinite clock would decay all it holds to 0
        r, rel = np.clip(r, -1.0, 1.0), np.clip(rel, 0.0, 1.0)
        keep = r != 0
        if not np.any(keep):
            return
        ids = [c for c, k in zip(chunk_ids, keep, strict=True) if k]
        r, rel = r[keep], rel[keep]
        rows = self._rows(ids, create=True)
        now = max(float(timestamp), self._now)
        self._now = now
        h = self.hyper
        f = self._decay(rows, now)
        conf = h.initial + (self._conf[rows] - h.initial) * f
        alpha = h.prior_alpha + (self._alpha[rows] - h.prior_alpha) * f
        beta = h.prior_beta + (self._beta[rows] - h.prior_beta) * f
        # a chunk listed twice gets both updates (np.add.at); feedback on a decision older than the clock (it
        # came late, or a log is replayed out of order) counts as decayed as it would be had it come in time
        late = decay_factor(now - timestamp, h.half_life_days) if timestamp > 0 else 1.0
        r = r * late
        delta = r * h.learning_rate * rel
        self._conf[rows] = conf
        self._alpha[rows] = alpha
        self._beta[rows] = beta
        np.add.at(self._conf, rows, delta)
        np.add.at(self._alpha, rows, np.maximum(r, 0.0))
        np.add.at(self._beta, rows, np.maximum(-r, 0.0))
        self._conf[rows] = np.clip(self._conf[rows], h.low, h.high)
        if now > 0:
            self._time[rows] = now
        if len(self._ids) > MAX_CHUNKS:
            self._forget_oldest(int(MAX_CHUNKS * 0.9))

    def _forget_oldest(self, keep_n: int) -> None:
        """Keep the ``keep_n`` chunks updated last (ties: those added last); the others go back to the prior."""
        n = len(self._ids)
        order = np.lexsort((-np.arange(n), -self._time[:n]))  # newest time first, then the latest added
        keep = np.sort(order[:keep_n])
        self._ids = [self._ids[i] for i in keep]
        self._index = {c: i for i, c in enumerate(self._ids)}
        self._conf, self._alpha = self._conf[keep].copy(), self._alpha[keep].copy()
        self._beta, self._time = self._beta[keep].copy(), self._time[keep].copy()

    # ------------------------------------------------------------------ reading
    def read(self, chunk_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each chunk's ``(confidence, alpha, beta)`` at once: what :meth:`confidence` and :meth:`posterior`
        give, read in one pass (a decision needs both for all its candidates)."""
        return self._read(chunk_ids)

    def _read(self, chunk_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h = self.hyper
        rows = self._rows(chunk_ids, create=False)
        seen = rows >= 0
        conf = np.full(len(chunk_ids), h.initial)
        alpha = np.full(len(chunk_ids), h.prior_alpha)
        beta = np.full(len(chunk_ids), h.prior_beta)
        if np.any(seen):
            r = rows[seen]
            f = self._decay(r, self._now)
            conf[seen] = h.initial + (self._conf[r] - h.initial) * f
            alpha[seen] = h.prior_alpha + (self._alpha[r] - h.prior_alpha) * f
            beta[seen] = h.prior_beta + (self._beta[r] - h.prior_beta) * f
        return conf, alpha, beta

    def confidence(self, chunk_ids: Sequence[str]) -> np.ndarray:
        """Each chunk's confidence in ``[low, high]``; ``initial`` for an unseen chunk."""
        return self._read(chunk_ids)[0]

    def feature(self, chunk_ids: Sequence[str]) -> np.ndarray:
        """Confidence as a fusion feature in [-1, 1], 0 for an unseen chunk."""
        return self.as_feature(self._read(chunk_ids)[0])

    def as_feature(self, confidence: np.ndarray) -> np.ndarray:
        """Map confidences in ``[low, high]`` to the centred feature (``initial`` -> 0)."""
        h = self.hyper
        c = np.asarray(confidence, dtype=float) - h.initial
        return np.where(c >= 0, c / (h.high - h.initial), c / (h.initial - h.low))

    def posterior(self, chunk_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Beta ``(alpha, beta)`` of each chunk (the prior for an unseen chunk)."""
        _, a, b = self._read(chunk_ids)
        return a, b

    def uncertainty(self, chunk_ids: Sequence[str]) -> np.ndarray:
        """Posterior standard deviation relative to the prior's, in (0, 1]."""
        return self.uncertainty_of(*self.posterior(chunk_ids))

    def uncertainty_of(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """:meth:`uncertainty` from posteriors already read (:meth:`read`)."""
        h = self.hyper
        sd = np.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))
        a0, b0 = h.prior_alpha, h.prior_beta
        sd0 = np.sqrt(a0 * b0 / ((a0 + b0) ** 2 * (a0 + b0 + 1)))
        return np.clip(sd / sd0, 0.0, 1.0)

    # ------------------------------------------------------------------ state
    def params(self) -> dict[str, Any]:
        return asdict(self.hyper)

    def state_dict(self) -> dict[str, Any]:
        n = len(self._ids)
        rows = np.stack([self._conf[:n], self._alpha[:n], self._beta[:n], self._time[:n]], axis=1)
        if not np.all(np.isfinite(rows)):  # the store refused it in JSON; hidden in the block it would be written
            raise NonFiniteValueError("chunk confidences hold a non-finite number")
        return {
            "params": self.params(),
            "now": float(self._now),
            "ids": list(self._ids),
            # per chunk, in the order of ids: confidence, alpha, beta and time, as one block of little-endian
            # float64: the same numbers to the last bit as a JSON list of each (the layout saved before 2026-12-05,
            # which still loads), at three quarters of the size and a tenth of the time to build and encode, which
            # every feedback pays by default
            "rows": encode_block(rows),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> ChunkConfidence:
        """Restore what :meth:`state_dict` saved, or the older layout (a JSON list per column); on any damage raise
        :class:`CorruptStateError` and change nothing."""
        try:
            ids = [str(x) for x in state["ids"]]
            now = float(state["now"])
            if "rows" in state:
                raw = state["rows"]
                if not isinstance(raw, str):
                    raise CorruptStateError("chunk confidences are malformed: their rows are not base64 text")
                block = np.frombuffer(base64.b64decode(raw, validate=True), dtype="<f8")
                if block.size != 4 * len(ids):
                    raise CorruptStateError("chunk confidences are malformed: their rows are not one per chunk")
                arrays = list(block.reshape(len(ids), 4).T.astype(float))
            else:  # saved before 2026-12-05: a JSON list per column
                arrays = [np.asarray(state[k], dtype=float) for k in ("confidence", "alpha", "beta", "time")]
        except CorruptStateError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # binascii.Error is a ValueError
            raise CorruptStateError(f"cannot read chunk confidences: {exc!r}") from exc
        if not math.isfinite(now):
            raise CorruptStateError(f"chunk confidences have a non-finite clock {now!r}")
        n = len(ids)
        if len(set(ids)) != n or any(a.shape != (n,) or not np.all(np.isfinite(a)) for a in arrays):
            raise CorruptStateError("chunk confidence arrays are malformed")
        conf, alpha, beta, times = arrays
        # a clock of 1e15 decayed every confidence to its prior and kept it so; a chunk's time of 1e15 never decayed
        saved_times("the chunk confidences' clock", np.append(times, now))
        h = self.hyper
        out_of_range = np.any(conf < h.low - 1e-9) or np.any(conf > h.high + 1e-9)
        if out_of_range or np.any(alpha <= 0) or np.any(beta <= 0):
            raise CorruptStateError("chunk confidences are out of range")
        self._ids = ids
        self._index = {c: i for i, c in enumerate(ids)}
        self._conf, self._alpha, self._beta, self._time = conf.copy(), alpha.copy(), beta.copy(), times.copy()
        self._now = now
        return self


def _grow(arr: np.ndarray, cap: int, fill: float) -> np.ndarray:
    out = np.full(cap, fill, dtype=float)
    out[: arr.shape[0]] = arr
    return out
