"""``FeedbackMemory``: chunk-level rewards remembered per query and carried to similar queries.

Fixed fusion weights can never learn which chunks answer which questions. The
memory can: it keeps, for every query that received feedback, the evidence
per chunk (a click is positive; a chunk that was read and passed over, shown
above a clicked one, is weakly negative; see
:func:`rlfb.credit.chunk_evidence`). Praise of a whole answer says
that one of its chunks helped, not which, so the learner gives the memory a
``1/n`` share of it for each of the answer's ``n`` chunks
(:func:`rlfb.credit.shared_credit`); a thumbs down counts whole for
each. For a new query it returns a
per-candidate score in [-1, 1]:

* **exact repeats** (the same normalised text, or an embedding with cosine
  similarity of at least ``exact_similarity``) contribute
  ``tanh(evidence / value_scale)``: one click (an implicit reward of 0.4) gives
  about +0.87, one skip about -0.6;
* **similar queries** (cosine at least ``similarity_threshold``, at most
  ``max_neighbors`` of them) contribute their own ``tanh`` scores weighted by
  ``(sim - threshold) / (1 - threshold)``, averaged, times ``transfer_weight``
  and times the transfer **gate**.

The gate exists because transfer helps on some collections and hurts on
others. With ``transfer_gate="adaptive"`` it is learned: each time feedback
arrives, before the memory takes it in, the memory predicts the shown chunks
from the *other* queries alone and checks the prediction against the
preferences the feedback revealed (a clicked chunk over a skipped one). The gate
opens, from 0, as the lower confidence bound of the share of correctly ordered
pairs rises above one half, and is fully open at ``gate_full`` (0.75). Weak or
misleading transfer therefore stays shut; a number in [0, 1] fixes the gate.

Lookups are vectorised: one matrix product over the stored query embeddings,
then a pass over the chunks of at most ``max_neighbors + 1`` entries.

>>> mem = FeedbackMemory()
>>> mem.update("What causes tides?", None, ["c1", "c2"], [-0.2, 0.4])
>>> mem.score("what causes tides", None, ["c2", "c1", "c3"]).round(2).tolist()
[0.87, -0.58, 0.0]
"""

from __future__ import annotations

import base64
import dataclasses
import heapq
import itertools
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np

from rlfb.blocks import decode_block, encode_block
from rlfb.decay import decay_factor
from rlfb.errors import CorruptStateError, NonFiniteValueError, ValidationError
from rlfb.hyperparameters import check_float, check_int, plain_numbers
from rlfb.relevance_feedback import similar_to_clicked
from rlfb.reward import finite_float
from rlfb.saved_state import saved_count, saved_times

__all__ = ["MemoryParams", "FeedbackMemory", "is_blank", "normalize_query", "naming_model", "without_embeddings",
           "knows_questions_by_text", "question_key", "keyed", "MAX_KEY_CHARS", "MAX_CHUNKS_PER_QUESTION"]

_SPACE = re.compile(r"\s+")
# sentence punctuation, quotes and brackets (also Spanish, full-width and CJK ones); not symbols that name
# things: "C++", "C#", "50%" and "$5" are other questions than "C", "50" and "5"
_ENDS = "\\s.,;:!?¿¡…\"'“”‘’«»„「」『』()\\[\\]{}（）【】。，；：！？、"
# at the start a lone dot before a letter is part of a name (".NET" is not "NET"); "..." or ". " is not
_LEAD = _ENDS.replace(".", "")
_EDGE = re.compile(f"^(?:[{_LEAD}]|\\.{{2,}}|\\.(?=\\s|$))+|[{_ENDS}]+$")


def normalize_query(query: str) -> str:
    """The key of an exact repeat: lower case, single spaces, no sentence punctuation, quotes or
    brackets at the ends. A query of punctuation alone keeps it ("???" is not "!!!").

    >>> normalize_query("  What causes   TIDES? ")
    'what causes tides'
    >>> normalize_query("¿Intro to C++?"), normalize_query("Intro to C#")
    ('intro to c++', 'intro to c#')
    >>> normalize_query(".NET?"), normalize_query("... and tides")
    ('.net', 'and tides')

    Text is NFC-normalised first, so an accent typed as a combining mark (as some keyboards and macOS
    file names give it) is the same question as one typed whole.
    """
    spaced = _SPACE.sub(" ", unicodedata.normalize("NFC", query).strip().lower())
    return _EDGE.sub("", spaced) or spaced


def is_blank(query: str) -> bool:
    """Whether a question has no letter or digit (empty, whitespace, punctuation alone): it names nothing, so
    the memory neither remembers nor recalls anything for it, and one blank question teaches no other.

    >>> is_blank("  ?? "), is_blank(""), is_blank("C++"), is_blank("¿qué?")
    (True, True, False, False)
    """
    return not any(ch.isalnum() for ch in query)


def _key(query: str) -> str | None:
    """The memory's key of a question, ``None`` for a blank one (:func:`is_blank`)."""
    return None if is_blank(query) else normalize_query(query)


@dataclass(frozen=True)
class MemoryParams:
    """Hyperparameters of :class:`FeedbackMemory` (validated).

    >>> MemoryParams(similarity_threshold=1.5)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: similarity_threshold must be in [0, 1), got 1.5
    """

    similarity_threshold: float = 0.8
    max_entries: int = 5000
    max_neighbors: int = 5
    value_scale: float = 0.3
    transfer_weight: float = 1.0
    transfer_gate: float | str = "adaptive"
    gate_full: float = 0.75
    gate_z: float = 1.0
    exact_similarity: float = 0.995
    max_value: float = 5.0
    half_life_days: float | None = 45.0

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_float("similarity_threshold", self.similarity_threshold, 0.0, 1.0, hi_open=True)
        check_int("max_entries", self.max_entries, 1, 10_000_000)
        check_int("max_neighbors", self.max_neighbors, 0, 1000)
        check_float("value_scale", self.value_scale, 0.0, None, lo_open=True)
        check_float("transfer_weight", self.transfer_weight, 0.0, 10.0)
        if isinstance(self.transfer_gate, str):
            if self.transfer_gate != "adaptive":
                raise ValidationError(
                    f"transfer_gate must be 'adaptive' or a number in [0, 1], got {self.transfer_gate!r}"
                )
        else:
            check_float("transfer_gate", self.transfer_gate, 0.0, 1.0)
        check_float("gate_full", self.gate_full, 0.5, 1.0, lo_open=True)
        check_float("gate_z", self.gate_z, 0.0, 10.0)
        check_float("exact_similarity", self.exact_similarity, 0.0, 1.0)
        if self.exact_similarity < self.similarity_threshold:
            raise ValidationError("exact_similarity must not be below similarity_threshold")
        check_float("max_value", self.max_value, 0.0, None, lo_open=True)
        if self.half_life_days is not None:
            check_float("half_life_days", self.half_life_days, 0.0, None, lo_open=True)


class FeedbackMemory:
    """Per-query chunk evidence, recalled for exact repeats and, gated, for similar queries.

    Parameters
    ----------
    similarity_threshold
        Cosine similarity of query embeddings above which evidence transfers.
    max_entries
        Queries remembered; the least recently used is forgotten first.
    max_neighbors, value_scale, transfer_weight, transfer_gate, gate_full, gate_z, exact_similarity,
    max_value, half_life_days
        See :class:`MemoryParams` and the module docstring.
    """

    def __init__(
        self,
        similarity_threshold: float = 0.8,
        max_entries: int = 5000,
        *,
        max_neighbors: int = 5,
        value_scale: float = 0.3,
        transfer_weight: float = 1.0,
        transfer_gate: float | str = "adaptive",
        gate_full: float = 0.75,
        gate_z: float = 1.0,
        exact_similarity: float = 0.995,
        max_value: float = 5.0,
        half_life_days: float | None = 45.0,
    ) -> None:
        self.hyper = MemoryParams(
            similarity_threshold, max_entries, max_neighbors, value_scale, transfer_weight, transfer_gate,
            gate_full, gate_z, exact_similarity, max_value, half_life_days,
        )
        self._keys: list[str] = []
        self._key_index: dict[str, int] = {}
        self._values: list[dict[str, float]] = []
        self._dim: int | None = None
        self._emb = np.zeros((0, 0), dtype=np.float32)
        self._has_emb = np.zeros(0, dtype=bool)
        self._time = np.zeros(0)
        self._touch = np.zeros(0)
        self._asks = np.zeros(0)  # askings of each remembered query since its first feedback
        self._counter = 0
        self._now = 0.0
        self._conc = 0.0
        self._disc = 0.0

    def __len__(self) -> int:
        return len(self._keys)

    # ------------------------------------------------------------------ helpers
    def check_embedding(self, embedding: Any) -> None:
        """Raise :class:`ValidationError` where :meth:`update` would refuse ``embedding`` (another
        dimension than the remembered ones); changes nothing."""
        self._embedding(embedding)

    def _embedding(self, embedding: Any) -> np.ndarray | None:
        if embedding is None:
            return None
        try:
            e = np.asarray(embedding, dtype=np.float32).ravel()
        except (TypeError, ValueError) as exc:  # not numbers at all; ranking with one raised a bare ValueError
            raise ValidationError(f"query embedding must be a vector of numbers: {exc}") from exc
        if e.size == 0 or not np.all(np.isfinite(e)):
            return None
        if self._dim is not None and e.shape[0] != self._dim:
            raise ValidationError(
                f"query embedding has {e.shape[0]} dimensions, the memory holds {self._dim}"
            )
        norm = float(np.linalg.norm(e))
        return e / norm if norm > 0 else None

    def _decay(self, rows: np.ndarray) -> np.ndarray:
        hl = self.hyper.half_life_days
        if hl is None or self._now <= 0 or rows.size == 0:
            return np.ones(rows.shape[0])
        t = self._time[rows]
        dt = np.where(t > 0, np.maximum(self._now - t, 0.0), 0.0)
        return 0.5 ** (dt / (hl * 86_400.0))

    def _neighbors(
        self, key: str, e: np.ndarray | None, *, include_exact: bool = True
    ) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Exact-repeat rows, and similar rows with their transfer gains."""
        p = self.hyper
        exact_row = self._key_index.get(key)
        exact = [exact_row] if (exact_row is not None and include_exact) else []
        m = len(self._keys)
        if e is None or self._dim is None or m == 0:
            return exact, np.zeros(0, dtype=np.int64), np.zeros(0)
        sims = self._emb[:m] @ e
        sims = np.where(self._has_emb[:m], sims, -1.0)
        if exact_row is not None:
            sims[exact_row] = -1.0
        if include_exact:
            same = np.flatnonzero(sims >= p.exact_similarity)
            exact.extend(int(i) for i in same)
            sims[same] = -1.0
        else:
            sims[sims >= p.exact_similarity] = -1.0
        cand = np.flatnonzero(sims >= p.similarity_threshold)
        if cand.size > p.max_neighbors:
            if p.max_neighbors == 0:
                cand = cand[:0]
            else:
                # a stable sort, so that tied neighbours (two questions of one embedding) are the same on every
                # machine: argpartition's choice among ties depends on the CPU's SIMD code (NumPy 2)
                cand = cand[np.sort(np.argsort(-sims[cand], kind="stable")[: p.max_neighbors])]
        gains = (sims[cand] - p.similarity_threshold) / (1.0 - p.similarity_threshold)
        return exact, cand.astype(np.int64), gains

    def _accumulate(self, rows: Sequence[int] | np.ndarray, gains: Sequence[float] | np.ndarray,
                    pos: Mapping[str, int], n: int, squash_each: bool) -> np.ndarray:
        out = np.zeros(n)
        if len(rows) == 0:
            return out
        rows_arr = np.asarray(rows, dtype=np.int64)
        decay = self._decay(rows_arr)
        scale = self.hyper.value_scale
        for row, g, f in zip(rows_arr, gains, decay, strict=True):
            vals = self._values[int(row)]
            items: Iterable[tuple[int | None, float | None]]
            if len(vals) <= n:
                items = ((pos.get(c), v) for c, v in vals.items())
            else:
                items = ((i, vals.get(c)) for c, i in pos.items())
            for i, v in items:
                if i is None or v is None:
                    continue
                out[i] += g * (math.tanh(v * f / scale) if squash_each else v * f)
        return out

    # ------------------------------------------------------------------ reading
    def gate(self) -> float:
        """The current transfer gate in [0, 1]."""
        p = self.hyper
        if not isinstance(p.transfer_gate, str):
            return float(p.transfer_gate)
        n = self._conc + self._disc
        phat = (self._conc + 1.0) / (n + 2.0)
        lcb = phat - p.gate_z * math.sqrt(phat * (1.0 - phat) / (n + 2.0))
        return float(min(1.0, max(0.0, (lcb - 0.5) / (p.gate_full - 0.5))))

    def transfer(self, query: str, embedding: Any, candidate_ids: Sequence[str]) -> np.ndarray:
        """The un-gated transfer score from similar queries only (exact repeats excluded), in [-1, 1]."""
        key = _key(query)
        if key is None:
            return np.zeros(len(candidate_ids))
        e = self._embedding(embedding)
        _, rows, gains = self._neighbors(key, e, include_exact=False)
        pos = {c: i for i, c in enumerate(candidate_ids)}
        acc = self._accumulate(rows, gains, pos, len(candidate_ids), squash_each=True)
        return acc / max(1.0, float(np.sum(gains)))

    def score(self, query: str, embedding: Any, candidate_ids: Sequence[str], *, touch: bool = True) -> np.ndarray:
        """Per-candidate memory score in [-1, 1] (0 where nothing is remembered).

        ``touch``: count the read as a use of the entries read, which keeps them from eviction longest; an
        evaluation's ranking (``Learner.rank(..., touch=False)``) reads without it and changes nothing.
        """
        n = len(candidate_ids)
        key = _key(query)
        if not self._keys or n == 0 or key is None:
            return np.zeros(n)
        p = self.hyper
        e = self._embedding(embedding)
        exact, rows, gains = self._neighbors(key, e)
        pos = {c: i for i, c in enumerate(candidate_ids)}
        out = np.tanh(self._accumulate(exact, [1.0] * len(exact), pos, n, squash_each=False) / p.value_scale)
        g = self.gate() * p.transfer_weight
        if rows.size and g > 0:
            acc = self._accumulate(rows, gains, pos, n, squash_each=True)
            out = out + g * acc / max(1.0, float(np.sum(gains)))
        if exact and touch:
            # a clock tick of its own: stamped with the last update's tick, a read tied with that update
            # and the eviction's argmin could drop the entry just read
            self._counter += 1
            self._touch[np.asarray(exact)] = self._counter
        return np.clip(out, -1.0, 1.0)

    def has_exact(self, query: str) -> bool:
        """Whether feedback on this exact (normalised) query is remembered."""
        key = _key(query)
        return key is not None and key in self._key_index

    def known(self, query: str) -> dict[str, float]:
        """The evidence remembered per chunk for this exact (normalised) query; empty if none.

        >>> mem = FeedbackMemory()
        >>> mem.update("tides", None, ["c1", "c2"], [-0.2, 0.4])
        >>> mem.known("Tides?")
        {'c1': -0.2, 'c2': 0.4}
        """
        row = self._row(query)
        if row is None:
            return {}
        f = float(self._decay(np.asarray([row]))[0])
        return {c: v * f for c, v in self._values[row].items()}

    def relevance_feedback(self, query: str, candidate_ids: Sequence[str], embeddings: np.ndarray) -> np.ndarray:
        """Each candidate's likeness to the chunks remembered as good for this exact question (a z-score over the
        candidates, :func:`rlfb.relevance_feedback.similar_to_clicked`); zeros where none is remembered.

        ``embeddings`` are the candidates' normalised embeddings, one row each. A chunk's weight is its
        evidence squashed as :meth:`score` squashes it, so one lucky click does not outweigh three.

        >>> mem = FeedbackMemory()
        >>> mem.update("tides", None, ["c1"], [0.4])
        >>> v = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> mem.relevance_feedback("Tides?", ["c1", "c2", "c3"], v).round(2).tolist()
        [0.93, 0.46, -1.39]
        """
        known = self.known(query)
        n = len(candidate_ids)
        if not known or n == 0:
            return np.zeros(n)
        ev = np.fromiter((known.get(c, 0.0) for c in candidate_ids), dtype=np.float64, count=n)
        return similar_to_clicked(embeddings, np.tanh(np.maximum(ev, 0.0) / self.hyper.value_scale))

    def _row(self, query: str) -> int | None:
        key = _key(query)
        return None if key is None else self._key_index.get(key)

    def asks(self, query: str) -> int:
        """How often this exact query was asked (:meth:`note_ask`) since its first feedback."""
        row = self._row(query)
        return 0 if row is None else int(self._asks[row])

    def note_ask(self, query: str) -> int:
        """Count one more asking of a remembered query; returns the count before it (0 if not remembered)."""
        before = self.ask(query)
        return 0 if before is None else before

    def ask(self, query: str) -> int | None:
        """:meth:`note_ask`, returning ``None`` for a query not remembered (whose asking is not counted)."""
        row = self._row(query)
        if row is None:
            return None
        before = int(self._asks[row])
        self._asks[row] += 1.0
        return before

    # ------------------------------------------------------------------ updating
    def _observe_transfer(
        self, query: str, e: np.ndarray | None, shown_ids: Sequence[str], ev: np.ndarray
    ) -> None:
        pos = np.flatnonzero(ev > 0)
        neg = np.flatnonzero(ev < 0)
        if pos.size == 0 or neg.size == 0 or e is None:
            return
        t = self.transfer(query, e, shown_ids)
        d = t[pos][:, None] - t[neg][None, :]
        informative = np.abs(d) > 1e-9
        k = int(informative.sum())
        if k == 0:
            return
        self._conc = 0.999 * self._conc + float(np.sum(d > 1e-9)) / k
        self._disc = 0.999 * self._disc + float(np.sum(d < -1e-9)) / k

    def _new_row(self, key: str) -> int:
        p = self.hyper
        m = len(self._keys)
        if m >= p.max_entries:
            row = int(np.argmin(self._touch[:m]))
            del self._key_index[self._keys[row]]
            self._keys[row] = key
            self._values[row] = {}
            self._has_emb[row] = False
            self._time[row] = 0.0
            self._asks[row] = 0.0
        else:
            row = m
            self._keys.append(key)
            self._values.append({})
            if row >= self._time.shape[0]:
                cap = min(p.max_entries, max(64, 2 * (row + 1)))
                self._time = _grow1(self._time, cap)
                self._touch = _grow1(self._touch, cap)
                self._asks = _grow1(self._asks, cap)
                self._has_emb = _grow1(self._has_emb, cap)
                if self._dim is not None:
                    grown = np.zeros((cap, self._dim), dtype=np.float32)
                    grown[: self._emb.shape[0]] = self._emb
                    self._emb = grown
        self._key_index[key] = row
        return row

    def update(
        self,
        query: str,
        embedding: Any,
        shown_ids: Sequence[str],
        evidence: Sequence[float] | np.ndarray,
        *,
        timestamp: float = 0.0,
    ) -> None:
        """Remember the per-chunk evidence of one feedback on ``query``, given at ``timestamp``, the time of
        the retrieval it is on (evidence older than the newest remembered counts decayed by its age)."""
        ev = np.asarray(evidence, dtype=float)
        if ev.shape != (len(shown_ids),) or not np.all(np.isfinite(ev)):
            raise ValidationError(f"got {len(shown_ids)} shown chunks but evidence of shape {ev.shape}")
        timestamp = finite_float(timestamp, "timestamp")  # an infinite clock would decay all it holds to 0
        key = _key(query)
        if key is None or not np.any(ev != 0):
            return
        e = self._embedding(embedding)
        self._now = max(self._now, float(timestamp))
        if isinstance(self.hyper.transfer_gate, str):
            self._observe_transfer(query, e, shown_ids, ev)
        row = self._key_index.get(key)
        if row is None:
            row = self._new_row(key)
        if e is not None:
            if self._dim is None:
                self._dim = int(e.shape[0])
                self._emb = np.zeros((self._time.shape[0], self._dim), dtype=np.float32)
            self._emb[row] = e
            self._has_emb[row] = True
        f = float(self._decay(np.asarray([row]))[0])
        vals = self._values[row]
        if f < 1.0:
            for c in vals:
                vals[c] *= f
        cap = self.hyper.max_value
        # evidence on a decision older than the clock (late feedback, a log replayed out of order) counts as
        # decayed as it would be had it come in time
        if timestamp > 0:
            ev = ev * decay_factor(self._now - timestamp, self.hyper.half_life_days)
        for c, v in zip(shown_ids, ev, strict=True):
            if v != 0:
                vals[c] = max(-cap, min(cap, vals.get(c, 0.0) + float(v)))
        if len(vals) > MAX_CHUNKS_PER_QUESTION:
            self._values[row] = _strongest(vals)
        if self._now > 0:
            self._time[row] = self._now
        self._counter += 1
        self._touch[row] = self._counter

    # ------------------------------------------------------------------ state
    def params(self) -> dict[str, Any]:
        return asdict(self.hyper)

    def state_dict(self) -> dict[str, Any]:
        """The memory as JSON-safe data, column by column, in row order: the remembered questions' texts, how many
        chunks each has evidence on, and those chunks' ids, one question after the other, as JSON lists; their
        evidence, clocks and query embeddings as base64 blocks of little-endian float64 (float32 for the
        embeddings). The same numbers to the last bit as a dict per question with a JSON number per chunk (the
        layout saved before 2026-12-05, which still loads), at 70 % of the size and a fifth of the time to build
        and encode, which every feedback pays by default.

        >>> mem = FeedbackMemory()
        >>> mem.update("tides", None, ["c1", "c2"], [-0.2, 0.4])
        >>> state = mem.state_dict()
        >>> state["queries"], state["counts"], state["chunks"], state["values"]
        (['tides'], [2], ['c1', 'c2'], 'mpmZmZmZyb+amZmZmZnZPw==')
        >>> FeedbackMemory().load_state_dict(state).known("tides")
        {'c1': -0.2, 'c2': 0.4}
        """
        m = len(self._keys)
        values = self._values[:m]
        flat = np.fromiter(itertools.chain.from_iterable(map(dict.values, values)), dtype=np.float64,
                           count=sum(map(len, values)))
        # a non-finite value is refused here as the store refused it in JSON: hidden in the block, it would be
        # written, and every later load of the snapshot would refuse it
        if not np.all(np.isfinite(flat)):
            raise NonFiniteValueError("the feedback memory holds a non-finite value")
        embedded = np.flatnonzero(self._has_emb[:m]) if self._dim is not None else np.zeros(0, dtype=np.int64)
        return {
            "params": self.params(),
            "dim": self._dim,
            "counter": self._counter,
            "now": float(self._now),
            "gate_counts": [float(self._conc), float(self._disc)],
            "queries": list(self._keys),
            # the chunk ids of every question, one question after the other, and how many each has: one list, not
            # a list per question (thousands of them, built and collected again after every feedback)
            "counts": list(map(len, values)),
            "chunks": list(itertools.chain.from_iterable(values)),
            "values": encode_block(flat),
            # per question: the time of its latest feedback, of its latest use (eviction order), and its askings
            "clock": encode_block(np.stack([self._time[:m], self._touch[:m], self._asks[:m]], axis=1)),
            # the questions with a query embedding, and those embeddings in that order
            "embedded": embedded.tolist(),
            "embeddings": encode_block(self._emb[embedded] if embedded.size else np.zeros(0), "<f4"),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> FeedbackMemory:
        """Restore what :meth:`state_dict` saved, or the older layout (a dict per question); on any damage raise
        :class:`CorruptStateError` and change nothing."""
        try:
            dim = state["dim"]
            if dim is not None:
                # checked before anything is allocated: int() took 10**12, and the (entries x dim) array then
                # failed with numpy's ArrayMemoryError. Each saved embedding must also have this length (below)
                try:
                    dim = check_int("the feedback memory's dim", dim, 1, _MAX_DIM)
                except ValidationError as exc:
                    raise CorruptStateError(str(exc)) from exc
            conc, disc = (float(x) for x in state["gate_counts"])
            counter = saved_count("the feedback memory's counter", state["counter"])
            now = float(state["now"])
            if "entries" in state:  # saved before 2026-12-05: a dict per question
                keys, values, embs, has, times, touch, asks = _read_entries(state["entries"], dim)
            else:
                keys, values, embs, has, times, touch, asks = _read_columns(state, dim)
        except CorruptStateError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:  # binascii.Error is a ValueError
            raise CorruptStateError(f"cannot read the feedback memory: {exc!r}") from exc
        if len(set(keys)) != len(keys):
            raise CorruptStateError("the feedback memory holds a query twice")
        # a state saved before long questions were known by their hash (2026-12-05): its long keys re-keyed, or
        # their evidence went unfound and their text stayed in every snapshot. A rolling upgrade can leave one
        # question under its text and its hash both (an older process learned it again by its text): of the two,
        # the more recently used is kept, with the askings of both, or every later load refused the state
        keys = [question_key(k) for k in keys]
        if len(set(keys)) != len(keys):
            latest: dict[str, int] = {}
            total: dict[str, float] = {}
            for i, k in enumerate(keys):
                if k not in latest or touch[i] >= touch[latest[k]]:
                    latest[k] = i
                total[k] = total.get(k, 0.0) + asks[i]
            kept = sorted(latest.values())
            # the cast: mypy types a comprehension over the seven columns as one list of their union
            keys, values, embs, has, times, touch, asks = cast(_Columns, tuple(
                [col[i] for i in kept] for col in (keys, values, embs, has, times, touch, asks)))
            asks = [total[k] for k in keys]
        if (not all(math.isfinite(x) for x in (conc, disc, now, *times, *touch, *asks)) or conc < 0 or disc < 0
                or any(a < 0 for a in asks)):
            raise CorruptStateError("the feedback memory holds non-finite or negative counters")
        # a clock of 1e15 decayed every value to nothing and kept it so; a question's time of 1e15 never decayed
        saved_times("the feedback memory's clock", [now, *times])
        if len(keys) > self.hyper.max_entries:
            # a snapshot of a memory with a larger max_entries (another app on the store): keep the most
            # recently used, or this memory would hold more than its bound for good
            kept = sorted(np.argsort(np.asarray(touch), kind="stable")[-self.hyper.max_entries:].tolist())
            # the cast: mypy types a comprehension over the seven columns as one list of their union
            keys, values, embs, has, times, touch, asks = cast(_Columns, tuple(
                [col[i] for i in kept] for col in (keys, values, embs, has, times, touch, asks)))
        # a snapshot written before the bound (or by an app with a larger one): bounded as feedback bounds it
        values = [_strongest(v) if len(v) > MAX_CHUNKS_PER_QUESTION else v for v in values]
        m = len(keys)
        cap = max(m, 1)
        self._keys = keys
        self._key_index = {k: i for i, k in enumerate(keys)}
        self._values = values
        self._dim = dim
        self._emb = np.zeros((cap, dim or 0), dtype=np.float32)
        for i, v in enumerate(embs):
            if v is not None:
                self._emb[i] = v
        self._has_emb = np.zeros(cap, dtype=bool)
        self._has_emb[:m] = has
        self._time = np.zeros(cap)
        self._time[:m] = times
        self._touch = np.zeros(cap)
        self._touch[:m] = touch
        self._asks = np.zeros(cap)
        self._asks[:m] = asks
        self._counter, self._now, self._conc, self._disc = counter, now, conc, disc
        return self


_Columns = tuple[list[str], list[dict[str, float]], list[Any], list[bool], list[float], list[float], list[float]]


_OWNER = "the feedback memory's"  # what a damaged block's error names


def _read_columns(state: Mapping[str, Any], dim: int | None) -> _Columns:
    """The columns :meth:`FeedbackMemory.state_dict` writes, checked."""
    keys, counts, chunks = state["queries"], state["counts"], state["chunks"]
    if (not isinstance(keys, list) or not isinstance(counts, list) or not isinstance(chunks, list)
            or len(counts) != len(keys) or not all(isinstance(q, str) for q in keys)
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts)
            or sum(counts) != len(chunks) or not all(isinstance(c, str) for c in chunks)):
        raise CorruptStateError("the feedback memory's questions and chunk ids are malformed")
    m = len(keys)
    flat = decode_block(state, "values", len(chunks), owner=_OWNER).tolist()
    values, start = [], 0
    for n in counts:
        vals = dict(zip(chunks[start:start + n], flat[start:start + n], strict=True))
        if len(vals) != n:
            raise CorruptStateError("the feedback memory holds a chunk twice for one question")
        values.append(vals)
        start += n
    clock = decode_block(state, "clock", 3 * m, owner=_OWNER).reshape(m, 3)
    embedded = state["embedded"]
    if (not isinstance(embedded, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in embedded)
            or embedded != sorted(set(embedded)) or (embedded and not 0 <= embedded[0] <= embedded[-1] < m)):
        raise CorruptStateError("the feedback memory's embedded questions are malformed")
    if embedded and dim is None:
        raise CorruptStateError("a stored query embedding has the wrong size")
    emb = decode_block(state, "embeddings", len(embedded) * (dim or 0), owner=_OWNER, dtype="<f4")
    emb = emb.reshape(len(embedded), dim or 0)
    embs: list[Any] = [None] * m
    has = [False] * m
    for j, i in enumerate(embedded):
        embs[i], has[i] = emb[j], True
    return (list(keys), values, embs, has, clock[:, 0].tolist(), clock[:, 1].tolist(), clock[:, 2].tolist())


def _read_entries(entries: Any, dim: int | None) -> _Columns:
    """The layout saved before 2026-12-05 (a dict per question, its evidence a JSON number per chunk), checked."""
    keys: list[str] = []
    values: list[dict[str, float]] = []
    embs: list[Any] = []  # None for a question without an embedding
    has: list[bool] = []
    times: list[float] = []
    touch: list[float] = []
    asks: list[float] = []
    for ent in list(entries):
        keys.append(str(ent["q"]))
        vals = {str(c): float(v) for c, v in dict(ent["v"]).items()}
        if not all(math.isfinite(v) for v in vals.values()):
            raise CorruptStateError("memory values must be finite")
        values.append(vals)
        raw = ent["e"]
        if raw is None:
            embs.append(None)
            has.append(False)
        else:
            vec = np.frombuffer(base64.b64decode(raw, validate=True), dtype="<f4")
            if dim is None or vec.shape[0] != dim or not np.all(np.isfinite(vec)):
                raise CorruptStateError("a stored query embedding has the wrong size")
            embs.append(vec.astype(np.float32))
            has.append(True)
        times.append(float(ent["t"]))
        touch.append(float(ent["u"]))
        asks.append(float(ent.get("a", 0.0)))  # states saved before asks were counted load with 0
    return keys, values, embs, has, times, touch, asks


# the largest query-embedding dimension a saved memory may declare: eight times the widest text embedding models'
# (4,096 to 8,192), so a real one always loads, while a damaged 10**12 is refused before it sizes an array
_MAX_DIM = 65_536


def naming_model(learner_state: dict[str, Any], model: str | None) -> dict[str, Any]:
    """``learner_state`` (a learner's ``state_dict()``), its memory naming the dense model its query embeddings are
    of, in place and returned; as it was where ``model`` is ``None`` or there is no memory. The learner does not
    keep the name: whoever saves the state adds it, so that a snapshot of another model's memory is known.

    >>> naming_model({"memory": {"dim": 2}}, "dense:a")
    {'memory': {'dim': 2, 'model': 'dense:a'}}
    """
    memory = learner_state.get("memory")
    if isinstance(memory, dict) and model is not None:
        memory["model"] = model
    return learner_state


#: The prefix of the learner's key for a question known by a hash: one a store keeps only hashed
#: (:func:`rlfb.feedback_learning.learner_query`), or a long one (:func:`question_key`).
HASHED_KEY = "sha256:"

#: Past this many characters (normalised) the learner knows a question by the sha256 of its normalised text
#: (:func:`question_key`): the memory, the click evidence of its query type and of all, and the replay each keep
#: the key, so a chat history of 2 KB as the question was kept whole four times in every snapshot.
MAX_KEY_CHARS = 512


#: The most chunks one question's entry keeps evidence on, the strongest (:func:`_strongest`): one retrieval of a
#: whole corpus with a thumbs on its answer gave a question evidence on every chunk (50,020 in an audit), and every
#: later feedback took 112 ms instead of 2. A question asked 100 times, ten chunks shown each, has at most 1,000.
MAX_CHUNKS_PER_QUESTION = 1000


def question_key(query: str) -> str:
    """What the learner knows a question by: its text, or, past :data:`MAX_KEY_CHARS` characters normalised,
    :data:`HASHED_KEY` and the sha256 of its normalised text (the same question however it is spaced or
    capitalised, as the memory takes the text). Short questions keep their text, as the memory takes it.

    >>> question_key("What causes tides?")
    'What causes tides?'
    >>> key = question_key("Tides and " + "the moon and the sun " * 30)
    >>> key.startswith(HASHED_KEY), len(key), key == question_key("TIDES  and " + "The moon  and the sun " * 30)
    (True, 71, True)
    """
    normal = normalize_query(query)  # by its normalised length: two spellings of one question get one key
    if len(normal) <= MAX_KEY_CHARS:
        return query
    from rlfb.store.codec import query_hash  # one hash of a question's text, as the store's

    return HASHED_KEY + query_hash(normal)


def keyed(item: Any) -> Any:
    """A context or episode (anything with a ``query``) with its question as the learner keeps it
    (:func:`question_key`: a long one by its hash), so that no part of the learned state keeps a long question's
    text."""
    key = question_key(item.query)
    return item if key == item.query else dataclasses.replace(item, query=key)


def knows_questions_by_text(state: Any) -> bool:
    """Whether a saved memory's state (or a learner state holding one) keys a question by its text, not by the
    hash a store that keeps no query text uses (:data:`HASHED_KEY`): loading it into such a store would write the texts.

    >>> knows_questions_by_text({"memory": {"queries": ["sha256:ab", ""]}})
    False
    >>> knows_questions_by_text({"queries": ["what causes tides"]})
    True
    """
    if not isinstance(state, Mapping):
        return False
    memory = state.get("memory", state)
    if not isinstance(memory, Mapping):
        return False
    keys = memory.get("queries")
    if keys is None and isinstance(memory.get("entries"), list):  # the layout before 2026-12-05
        keys = [e.get("q") for e in memory["entries"] if isinstance(e, Mapping)]
    return any(isinstance(k, str) and k and not k.startswith(HASHED_KEY) for k in keys or ())


def without_embeddings(state: Mapping[str, Any]) -> dict[str, Any]:
    """A saved memory's state with no query embeddings (nor their dimension and model): its evidence stays with
    each question's text, and is recalled for repeats only until new embeddings come.

    >>> without_embeddings({"dim": 2, "model": "dense:a", "queries": ["tides"], "embedded": [0],
    ...                     "embeddings": "AAAAAAAAAAA="})
    {'dim': None, 'queries': ['tides'], 'embedded': [], 'embeddings': ''}

    A state saved before 2026-12-05 (a dict per question) keeps its layout:

    >>> without_embeddings({"dim": 2, "model": "dense:a", "entries": [{"q": "tides", "e": "AAAAAAAAAAA="}]})
    {'dim': None, 'entries': [{'q': 'tides', 'e': None}]}
    """
    out = {k: v for k, v in state.items() if k != "model"}
    out["dim"] = None
    if "entries" in state:
        out["entries"] = [{**dict(e), "e": None} for e in state["entries"]]
    else:
        out["embedded"], out["embeddings"] = [], ""
    return out


def _strongest(values: dict[str, float], limit: int = MAX_CHUNKS_PER_QUESTION) -> dict[str, float]:
    """The ``limit`` chunks with the strongest evidence, in the order they came (the earlier first among ties).

    >>> _strongest({"a": 0.1, "b": -0.5, "c": 0.05, "d": 0.5, "e": -0.1}, 3)
    {'a': 0.1, 'b': -0.5, 'd': 0.5}
    """
    kept = set(heapq.nlargest(limit, values, key=lambda c: abs(values[c])))
    return {c: v for c, v in values.items() if c in kept}


def _grow1(arr: np.ndarray, cap: int) -> np.ndarray:
    out = np.zeros(cap, dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out
