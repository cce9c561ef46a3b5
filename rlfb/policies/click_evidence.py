"""``ClickEvidence``: every weight arm scored on every click, with a variance clustered by query.

A bandit learns about an arm only when it plays it, and on real collections the
best fixed weights are 0.01 to 0.04 nDCG@10 above equal weights: far too small
a difference to find by playing 66 arms in turn. A click says more than the
reward of the arm that was shown. Re-ranking the shown chunks by each arm's
weights (plus the memory's and confidence's offsets, which every arm shares)
gives each arm a utility on that click: the DCG of the clicked chunks in its
order. All arms are scored on the same clicks, so the advantage of an arm
over the default is a paired difference, with a small variance.

The estimate leans towards the weights that were shown: chunks never shown
cannot be clicked, and ties keep the shown order. It moves away from them only
when other weights would have put the clicked chunks higher.

Repeated questions are many clicks but one piece of evidence about which
weights generalise, so the variance of the mean advantage is clustered by
query (a sandwich estimator over per-query sums).

>>> ev = ClickEvidence(3)
>>> for q in range(30):
...     ev.update(np.array([0.5, 0.8, 0.4]) + 0.01 * (q % 3), f"q{q}", 1.0, 1.0)
>>> adv, var = ev.posterior()
>>> adv.round(3).tolist()
[0.0, 0.3, -0.1]
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfb.blocks import encode_block
from rlfb.errors import CorruptStateError, NonFiniteValueError
from rlfb.saved_state import float_list, saved_times

__all__ = ["ClickEvidence", "shown_utility"]


def shown_utility(gains: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Each column's DCG of ``gains`` after re-ranking the shown rows by that column's scores.

    ``gains`` (n_shown,) are non-negative, ``scores`` (n_shown, n_arms); ties keep
    the shown order. Normalised by the ideal DCG, so each value is in [0, 1].

    >>> shown_utility(np.array([0.0, 1.0]), np.array([[1.0, 0.0], [0.0, 1.0]])).round(3).tolist()
    [0.631, 1.0]
    """
    ranks = np.argsort(np.argsort(-scores, axis=0, kind="stable"), axis=0, kind="stable")
    disc = 1.0 / np.log2(ranks + 2.0)
    ideal = float(np.sort(gains)[::-1] @ (1.0 / np.log2(np.arange(gains.size) + 2.0)))
    return (gains @ disc) / ideal


def _block_rows(raw: Any, keys: list[str], places: list[Any], k: int) -> list[tuple[str, np.ndarray]]:
    """Each query's row of ``k + 1`` numbers, read from the base64 block ``raw`` at its place."""
    if not isinstance(raw, str):
        raise CorruptStateError("click evidence is malformed: its rows are not base64 text")
    block = np.frombuffer(base64.b64decode(raw, validate=True), dtype="<f8")
    ints = sorted(p for p in places if isinstance(p, int) and not isinstance(p, bool))
    if block.size != len(places) * (k + 1) or ints != list(range(len(places))):
        raise CorruptStateError("click evidence is malformed: its rows are not one per query")
    matrix = block.reshape(len(places), k + 1).astype(float)
    return [(key, matrix[p]) for key, p in zip(keys, places, strict=True)]


def _key(query: str) -> str:
    """A question's key here: its text in lower case with single spaces, or the learner's hash of a long one."""
    from rlfb.memory import question_key  # the memory imports the policies: not at import time

    return " ".join(question_key(query).lower().split())


def _rekeyed(rows: dict[str, int], q: np.ndarray) -> tuple[dict[str, int], np.ndarray]:
    """``rows`` and their sums ``q`` with a long question saved by its text (before 2026-12-05) keyed by the
    learner's hash; two spellings of one question that meet in one hash add up (the rows are sums), in the
    place of the more recently used."""
    from rlfb.memory import MAX_KEY_CHARS

    # an ASCII key's length is its normalised length; another may grow past the bound when normalised (NFC)
    if all(len(key) <= MAX_KEY_CHARS and key.isascii() for key in rows):
        return rows, q
    summed: dict[str, np.ndarray] = {}
    for key, place in rows.items():  # least recently used first
        new = _key(key)
        summed[new] = summed.pop(new, 0.0) + q[place]
    out = np.zeros((max(len(summed), 1), q.shape[1]))
    for i, row in enumerate(summed.values()):
        out[i] = row
    return {key: i for i, key in enumerate(summed)}, out


class ClickEvidence:
    """Running sums of arm utilities, overall and per query (least recently used queries forgotten).

    Arm 0 is the default the advantages are measured against.
    """

    def __init__(self, n_arms: int, max_queries: int = 2000) -> None:
        self.n_arms = n_arms
        self.max_queries = max_queries
        self.n = 0.0
        self.clock = 0.0
        # any float arrays, not the one-dimensional type numpy 2.2's stubs (Python 3.10's) give np.zeros(n)
        self._s: np.ndarray = np.zeros(n_arms)
        self._rows: dict[str, int] = {}  # query -> row, least recently used first
        self._q: np.ndarray = np.zeros((0, n_arms + 1))  # per query: summed utilities, then the summed weight
        self._gone: np.ndarray = np.zeros(n_arms)  # variance terms of the queries forgotten to stay in bounds
        self._posterior: tuple[np.ndarray, np.ndarray] | None = None  # until the next update

    @property
    def n_queries(self) -> int:
        return len(self._rows)

    def _advantage(self) -> np.ndarray:
        mean = self._s / max(self.n, 1e-12)
        return mean - mean[0]

    def _row(self, query: str) -> int:
        key = _key(query)
        row = self._rows.pop(key, None)
        if row is None:
            if len(self._rows) >= self.max_queries:
                row = self._rows.pop(next(iter(self._rows)))
                old = self._q[row]
                # the forgotten query keeps its share of the variance, as measured now
                self._gone += ((old[:-1] - old[0]) - old[-1] * self._advantage()) ** 2
                self._q[row] = 0.0
            else:
                row = len(self._rows)
                if row >= self._q.shape[0]:
                    grown = np.zeros((max(16, 2 * row), self.n_arms + 1))
                    grown[: self._q.shape[0]] = self._q
                    self._q = grown
        self._rows[key] = row  # (re)inserted last: most recently used
        return row

    def update(self, utility: np.ndarray, query: str, weight: float, decay: float) -> None:
        """Add one click's arm utilities with ``weight``, after decaying the past by ``decay``."""
        self._posterior = None
        self.n = self.n * decay + weight
        self._s = self._s * decay + weight * utility
        self._q *= decay
        self._gone *= decay * decay
        row = self._row(query)
        self._q[row, :-1] += weight * utility
        self._q[row, -1] += weight

    def decay(self, factor: float) -> None:
        """Decay everything summed so far by ``factor``, with no click added: time passing without clicks.

        The advantages and their variance do not change (both sums shrink alike); the weight ``n`` does, so
        evidence that stops being renewed falls back below the gate.
        """
        if factor == 1.0:
            return
        self._posterior = None
        self.n *= factor
        self._s = self._s * factor
        self._q *= factor
        self._gone *= factor * factor

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean advantage of every arm over arm 0, and the clustered variance of that mean (read-only).

        Cached until the next update: policies ask for it on every decision.
        """
        if self._posterior is None:
            self._posterior = self._compute_posterior()
        return self._posterior

    def _compute_posterior(self) -> tuple[np.ndarray, np.ndarray]:
        adv = self._advantage()
        q = self._q[: len(self._rows)]
        resid = (q[:, :-1] - q[:, :1]) - q[:, -1:] * adv[None, :]
        m = q.shape[0] + (1 if np.any(self._gone > 0) else 0)
        if m < 2:  # one question says nothing about how the weights generalise
            var = np.full(self.n_arms, np.inf)
        else:
            var = (np.sum(resid**2, axis=0) + self._gone) * (m / (m - 1.0)) / max(self.n * self.n, 1e-12)
            var = np.maximum(var, 1e-8)
        adv[0], var[0] = 0.0, 1e-12
        adv.setflags(write=False)
        var.setflags(write=False)
        return adv, var

    def state_dict(self) -> dict[str, Any]:
        """The sums as JSON-safe data: the queries (least recently used first) and each one's row as two JSON lists,
        the rows as one base64 block of little-endian float64, in row order. A non-finite number raises
        :class:`NonFiniteValueError`: the store refused it in JSON, and hidden in the block it would be written,
        and every later load refuse it.

        >>> ev = ClickEvidence(2)
        >>> ev.update(np.array([0.5, 1.0]), "Tides?", 1.0, 1.0)
        >>> state = ev.state_dict()
        >>> state["queries"], state["places"], state["rows"]
        (['tides?'], [0], 'AAAAAAAA4D8AAAAAAADwPwAAAAAAAPA/')
        """
        rows = self._q[: len(self._rows)]
        if not np.all(np.isfinite(rows)):
            raise NonFiniteValueError("click evidence holds a non-finite number")
        return {
            "n": float(self.n),
            "s": float_list(self._s),
            "clock": float(self.clock),
            "gone": float_list(self._gone),
            # the queries, least recently used first, and each one's row: the clustered variance sums the rows in
            # row order, and a reload that put them in the order of use summed them otherwise, a few last bits
            # apart. Two lists, not a [query, row] pair each (the layout saved before 2026-12-05, which still
            # loads): thousands of small lists, built and collected again after every feedback
            "queries": list(self._rows),
            "places": list(self._rows.values()),
            # the rows themselves as little-endian float64 bytes, in row order: the same numbers to the last bit,
            # at about half the size of a JSON list of each (36 MB of JSON at the caps of 13 query types, written
            # after every feedback) and a fraction of the time to write and read
            "rows": encode_block(rows),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> ClickEvidence:
        k = self.n_arms
        try:
            n, clock = float(state["n"]), float(state["clock"])
            s = np.asarray(state["s"], dtype=float)
            gone = np.asarray(state["gone"], dtype=float)
            if "places" in state:  # the queries and their rows as two lists, the rows in one base64 block
                keys, places = state["queries"], state["places"]
                if (not isinstance(keys, list) or not isinstance(places, list) or len(keys) != len(places)
                        or not all(isinstance(key, str) for key in keys)):
                    raise CorruptStateError("click evidence is malformed: its queries and their rows differ")
                entries = _block_rows(state["rows"], keys, places, k)
            elif "rows" in state:  # saved on 2026-12-04: each query [key, row], the rows in one base64 block
                places = [item[1] for item in state["queries"]]
                entries = _block_rows(state["rows"], [str(item[0]) for item in state["queries"]], places, k)
            else:  # saved before 2026-12-04: each query [key, its row as a list, row]
                entries = [(str(item[0]), np.asarray(item[1], dtype=float)) for item in state["queries"]]
                # where each query's row was (older saves have none: then in the order saved)
                places = [item[2] if len(item) > 2 else None for item in state["queries"]]
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, binascii.Error) as exc:
            raise CorruptStateError(f"click evidence is malformed: {exc!r}") from exc
        if sorted(p for p in places if isinstance(p, int) and not isinstance(p, bool)) != list(range(len(places))):
            places = list(range(len(entries)))
        q = np.zeros((max(len(entries), 1), k + 1))
        for place, (_, row) in zip(places, entries, strict=True):
            if row.shape != (k + 1,):
                raise CorruptStateError("click evidence is malformed: a query row has the wrong size")
            q[place] = row
        rows = {key: place for place, (key, _) in zip(places, entries, strict=True)}
        if (s.shape != (k,) or gone.shape != (k,) or len(rows) != len(entries)
                or not all(np.all(np.isfinite(a)) for a in (s, gone, q))
                or not np.isfinite(n) or n < 0 or not np.isfinite(clock)):
            raise CorruptStateError("click evidence is malformed")
        # n sums every click's weight, the rows those of the questions kept (forgotten ones only add to n): an n
        # below the rows' sum, or a negative weight, is damage, which read as fewer clicks than were learned
        weights = q[:, -1]
        if np.any(weights < 0) or n < weights.sum() * (1.0 - 1e-9) - 1e-9:
            raise CorruptStateError(f"click evidence is malformed: its weight {n:g} is below its questions' "
                                    f"{weights.sum():g}")
        # every click adds its weight times each arm's utility, a DCG ratio in [0, 1], to the arms' sums and to its
        # question's row, and the forgotten questions' squares to gone: a sum past its weight (1e300 read as an
        # advantage that opened the gate at once) or below 0 was never learned; no time is clock 0, never below
        slack = 1e-9 * n + 1e-12  # rounding in the running sums
        out = {"clock": clock < 0, "gone": np.any(gone < 0), "s": np.any(s < 0) or np.any(s > n + slack),
               "rows": np.any(q[:, :-1] < 0) or np.any(q[:, :-1] > q[:, -1:] * (1.0 + 1e-9) + 1e-12)}
        if any(out.values()):
            raise CorruptStateError(f"click evidence is malformed: {', '.join(k for k, v in out.items() if v)} out "
                                    "of range (a clock is at least 0, the sums between 0 and their weight)")
        saved_times("the click evidence's clock", clock)  # 1e15 weighed every later click as long past
        rows, q = _rekeyed(rows, q)
        self.n, self.clock, self._s, self._gone, self._rows, self._q = n, clock, s, gone, rows, q
        self._posterior = None
        return self
