"""Implicit feedback: signals inferred from what the user did next.

Rules (every threshold is a constructor argument):

* **Dwell.** The user stayed on the answer longer than ``dwell_threshold``
  seconds (60 by default) and asked nothing more: ``"dwell"`` (implicit positive).
* **Reformulation.** The next query in the same session restates the previous
  one: ``"reformulation"`` (implicit negative). Without an encoder, "restates"
  means that more than ``overlap_threshold`` (0.4) of the previous query's
  content words come back in the new one (a Chinese or Japanese Han character
  counts as a word; Japanese hiragana, mostly particles and endings, does not);
  with an ``encode`` function (a dense model), that the cosine similarity of
  the two queries is at least ``similarity_threshold`` (0.8).
* **New topic.** A follow-up that is not a reformulation is neutral: no signal.
* **Cited / opened.** A chunk the answer cited, or that the user opened, is
  positive for that chunk: ``"cited"`` / ``"opened"`` (implicit positive).

The signal names are aliases the :class:`rlfb.reward.RewardFunction` knows, so
:meth:`InferredSignal.as_feedback` can go straight to
:meth:`rlfb.store.FeedbackStore.record_feedback_batch`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rlfb.errors import UnknownChunkError, ValidationError
from rlfb.features import HAN
from rlfb.reward import finite_float
from rlfb.store.codec import query_hash  # the hash a store that keeps no text keeps

__all__ = ["ImplicitSignals", "InferredSignal", "DEFAULT_STOPWORDS", "tokenize", "infer_at"]

FollowUp = Literal["reformulation", "new_topic"]

# Small function-word lists; content words decide whether a query restates another.
DEFAULT_STOPWORDS: frozenset[str] = frozenset(
    """a an the and or but if of to in on at by for with from as is are was were be been being am
    do does did doing have has had i me my we our you your he she it its they them their this that
    these those what which who whom whose when where why how can could should would will shall may
    might must not no so than then there here about into over under again more most some any all
    just also too very please tell show give explain describe get find know want need s t
    的 了 吗 呢 吧 啊 是 在 和 与 及 我 你 他 她 它 们
    这 那 么 什 怎 如 何 请 一 个 有 就 也 都 还 要""".split()
)

# Kana runs (with the long-vowel mark "ー", which both scripts use) are words of their own: katakana
# writes loanwords (オーロラ), hiragana mostly particles and endings (は, なぜ, のですか).
_HIRAGANA = "\u3041-\u3096\u309d-\u309f\u30fc"
_KATAKANA = "\u30a1-\u30fa\u30fc-\u30ff"
# Chinese and Japanese have no spaces between words, so a Han character is one token; other
# letters and digits, Hangul included (Korean separates its words by spaces), group into words.
_TOKEN = re.compile(rf"[{HAN}]|[{_KATAKANA}]+|[{_HIRAGANA}]+|[^\W_{HAN}{_HIRAGANA}{_KATAKANA}]+")
_HIRAGANA_WORD = re.compile(rf"[{_HIRAGANA}]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens; each Han character is its own token, a kana run one token.

    >>> tokenize("What causes the Aurora?")
    ['what', 'causes', 'the', 'aurora']
    >>> tokenize("极光是什么")
    ['极', '光', '是', '什', '么']
    >>> tokenize("オーロラはなぜ光る")
    ['オーロラ', 'はなぜ', '光', 'る']
    """
    return _TOKEN.findall(text.lower())


@dataclass(frozen=True)
class InferredSignal:
    """One signal inferred from behaviour, attached to a logged event (and optionally one chunk)."""

    event_id: str
    signal: str
    chunk_id: str | None = None
    reason: str = ""

    @property
    def idempotency_key(self) -> str:
        """Stable key, so running inference twice over the same behaviour records the signal once.

        A chunk's key does not name the signal: a chunk opened in one call and cited (or cited and
        opened) in a later one is one piece of evidence, recorded once.
        """
        if self.chunk_id is not None:
            return f"implicit:{self.event_id}:chunk:{self.chunk_id}"
        return f"implicit:{self.event_id}:{self.signal}:"

    def as_feedback(self, **extra: Any) -> dict[str, Any]:
        """Keyword arguments for ``FeedbackStore.record_feedback`` (``extra`` adds e.g. ``timestamp``).

        >>> InferredSignal("e1", "cited", "c2").as_feedback()["idempotency_key"]
        'implicit:e1:chunk:c2'
        """
        return {
            "event_id": self.event_id,
            "signal": self.signal,
            "chunk_id": self.chunk_id,
            "idempotency_key": self.idempotency_key,
            "comment": self.reason or None,
            **extra,
        }


class ImplicitSignals:
    """Infers feedback from dwell time, follow-up queries, citations and opened chunks.

    Parameters
    ----------
    dwell_threshold
        Seconds on the answer, with no follow-up, above which the answer counts as accepted.
    overlap_threshold
        Share of the previous query's content words that must reappear (strictly
        more than this) for a follow-up to count as a reformulation.
    similarity_threshold
        Cosine similarity at or above which a follow-up is a reformulation, used
        instead of word overlap when ``encode`` is given.
    encode
        Optional dense model: ``encode(list_of_texts) -> (n, d)`` array of unit vectors.
    stopwords
        Words ignored by the overlap rule (a collection of words, not one string). Runs of
        Japanese hiragana are ignored too: they are mostly particles and endings.
    followup_window
        Seconds after the previous retrieval within which a restatement is a reformulation (30 minutes);
        later, a question asked again is a new visit, not a judgment of the answer it got before
        (``None``: no limit). It applies where :meth:`infer` is told when the follow-up came (``at``).

    >>> imp = ImplicitSignals()
    >>> imp.classify_followup("what causes the aurora", "why does the aurora happen")
    'reformulation'
    >>> imp.classify_followup("what causes the aurora", "best pizza in naples")
    'new_topic'
    >>> imp.from_dwell(75.0, had_followup=False)
    'dwell'
    >>> imp.from_dwell(75.0, had_followup=True) is None
    True
    """

    def __init__(
        self,
        dwell_threshold: float = 60.0,
        overlap_threshold: float = 0.4,
        similarity_threshold: float = 0.8,
        encode: Callable[[list[str]], np.ndarray] | None = None,
        stopwords: Iterable[str] | None = None,
        followup_window: float | None = 1800.0,
    ) -> None:
        # a session id that is a user's id judged a question asked again a day later as a restatement of the
        # answer it got then, whatever that answer's thumbs up said
        self.followup_window = None if followup_window is None else finite_float(followup_window, "followup_window")
        if self.followup_window is not None and self.followup_window <= 0:
            raise ValidationError(f"followup_window must be positive or None, got {followup_window}")
        self.dwell_threshold = finite_float(dwell_threshold, "dwell_threshold")
        if self.dwell_threshold < 0:
            raise ValidationError(f"dwell_threshold must not be negative, got {dwell_threshold}")
        self.overlap_threshold = finite_float(overlap_threshold, "overlap_threshold")
        if not 0.0 <= self.overlap_threshold <= 1.0:
            raise ValidationError(f"overlap_threshold must lie in [0, 1], got {overlap_threshold}")
        self.similarity_threshold = finite_float(similarity_threshold, "similarity_threshold")
        if not -1.0 <= self.similarity_threshold <= 1.0:
            raise ValidationError(f"similarity_threshold must lie in [-1, 1], got {similarity_threshold}")
        if encode is not None and not callable(encode):
            raise ValidationError("encode must be callable: encode(list[str]) -> np.ndarray")
        self.encode = encode
        if stopwords is not None and (isinstance(stopwords, (str, bytes)) or not isinstance(stopwords, Iterable)):
            # a plain string would silently become the set of its characters
            raise ValidationError(
                f"stopwords must be a collection of words, got {type(stopwords).__name__} {stopwords!r:.60}"
            )
        self.stopwords = frozenset(DEFAULT_STOPWORDS if stopwords is None else stopwords)

    def __repr__(self) -> str:
        return (
            f"ImplicitSignals(dwell_threshold={self.dwell_threshold}, "
            f"overlap_threshold={self.overlap_threshold}, "
            f"similarity_threshold={self.similarity_threshold}, encode={'yes' if self.encode else None})"
        )

    # -- follow-ups ----------------------------------------------------------------
    def _content(self, text: str) -> set[str]:
        tokens = tokenize(text)
        content = {t for t in tokens if t not in self.stopwords and not _HIRAGANA_WORD.fullmatch(t)}
        return content or set(tokens)

    def overlap(self, previous_query: str, query: str) -> float:
        """Share of the previous query's content words found in ``query`` (0 when it has none).

        >>> ImplicitSignals().overlap("reset my password", "how to reset a password")
        1.0
        """
        prev = self._content(_check_text(previous_query, "previous_query"))
        if not prev:
            return 0.0
        return len(prev & self._content(_check_text(query, "query"))) / len(prev)

    def similarity(self, previous_query: str, query: str) -> float:
        """Cosine similarity of the two queries under ``encode`` (vectors re-normalised defensively)."""
        if self.encode is None:
            raise ValidationError("similarity needs an encode function")
        vecs = np.asarray(
            self.encode([_check_text(previous_query, "previous_query"), _check_text(query, "query")]),
            dtype=np.float64,
        )
        if vecs.ndim != 2 or vecs.shape[0] != 2:
            raise ValidationError(f"encode must return a (2, d) array for two texts, got shape {vecs.shape}")
        if not np.all(np.isfinite(vecs)):
            raise ValidationError("encode returned non-finite values")
        norms = np.linalg.norm(vecs, axis=1)
        if np.any(norms == 0):
            return 0.0
        return float(np.dot(vecs[0], vecs[1]) / (norms[0] * norms[1]))

    def followup_score(self, previous_query: str, query: str) -> tuple[float, float, str]:
        """``(score, threshold, measure)`` that :meth:`classify_followup` decides on."""
        if self.encode is not None:
            return self.similarity(previous_query, query), self.similarity_threshold, "similarity"
        return self.overlap(previous_query, query), self.overlap_threshold, "overlap"

    def classify_followup(self, previous_query: str, query: str) -> FollowUp:
        """``"reformulation"`` if ``query`` restates ``previous_query``, else ``"new_topic"``. Pure."""
        score, threshold, measure = self.followup_score(previous_query, query)
        restated = score >= threshold if measure == "similarity" else score > threshold
        return "reformulation" if restated else "new_topic"

    def _past_window(self, previous_event: Mapping[str, Any], at: float | None) -> bool:
        """Whether a follow-up at ``at`` came past :attr:`followup_window` after ``previous_event``."""
        since = previous_event.get("timestamp")
        if at is None or self.followup_window is None or not isinstance(since, (int, float)):
            return False
        return at - float(since) > self.followup_window

    # -- dwell ---------------------------------------------------------------------
    def from_dwell(self, dwell_seconds: float, had_followup: bool) -> str | None:
        """``"dwell"`` (implicit positive) when the user stayed over the threshold and asked nothing more."""
        dwell = finite_float(dwell_seconds, "dwell_seconds")
        if dwell < 0:
            raise ValidationError(f"dwell_seconds must not be negative, got {dwell_seconds}")
        if had_followup or dwell <= self.dwell_threshold:
            return None
        return "dwell"

    # -- all together --------------------------------------------------------------
    def infer(
        self,
        previous_event: Mapping[str, Any],
        query: str | None,
        dwell_seconds: float | None = None,
        cited: Sequence[str] = (),
        opened: Sequence[str] = (),
        *,
        at: float | None = None,
    ) -> list[InferredSignal]:
        """Signals for ``previous_event`` (a dict as ``FeedbackStore.event`` returns it).

        ``query`` is the next query in the same session, or ``None`` if there was
        none; ``at`` (unix seconds) when it came: past ``followup_window`` after the previous
        retrieval's ``timestamp`` it is a new visit, and no reformulation. When the store kept only a hash
        of the previous query (``store_text=False``), only an exact repeat can be recognised. Chunk ids
        in ``cited`` / ``opened`` must belong to the event when its ``chunks``
        are given (:class:`UnknownChunkError` otherwise); a chunk both cited and
        opened yields one signal.

        >>> event = {"id": "e1", "query": "what causes the aurora", "chunks": [{"chunk_id": "c1"}]}
        >>> [s.signal for s in ImplicitSignals().infer(event, "why does the aurora happen")]
        ['reformulation']
        >>> [(s.signal, s.chunk_id) for s in ImplicitSignals().infer(event, None, 90.0, cited=["c1"])]
        [('dwell', None), ('cited', 'c1')]
        """
        event_id = previous_event.get("id", previous_event.get("event_id"))
        if not isinstance(event_id, str):
            raise ValidationError("previous_event needs an 'id'")
        out: list[InferredSignal] = []
        if at is not None:
            at = finite_float(at, "at")
        if query is not None:
            _check_text(query, "query")
        if query is not None and not self._past_window(previous_event, at):
            previous = previous_event.get("query")
            if isinstance(previous, str):
                score, threshold, measure = self.followup_score(previous, query)
                if self.classify_followup(previous, query) == "reformulation":
                    out.append(
                        InferredSignal(
                            event_id,
                            "reformulation",
                            reason=f"follow-up restates the query "
                            f"({measure} {score:.2f}, threshold {threshold:g})",
                        )
                    )
            elif previous_event.get("query_hash") == query_hash(query):
                out.append(
                    InferredSignal(event_id, "reformulation", reason="follow-up repeats the query (hash)")
                )
        if dwell_seconds is not None:
            sig = self.from_dwell(dwell_seconds, had_followup=query is not None)
            if sig is not None:
                out.append(
                    InferredSignal(
                        event_id,
                        sig,
                        reason=f"dwell {float(dwell_seconds):g}s > {self.dwell_threshold:g}s, no follow-up",
                    )
                )
        known = None
        if previous_event.get("chunks") is not None:
            known = {c["chunk_id"] for c in previous_event["chunks"]}
        seen: dict[str, InferredSignal] = {}
        for signal, ids in (("cited", cited), ("opened", opened)):
            if isinstance(ids, str) or not isinstance(ids, Iterable):
                raise ValidationError(f"{signal} must be a sequence of chunk ids, got {type(ids).__name__} {ids!r:.60}")
            for cid in ids:
                if known is not None and cid not in known:
                    raise UnknownChunkError(f"chunk {cid!r} was not part of event {event_id!r}")
                if cid in seen:
                    prev = seen[cid]
                    seen[cid] = InferredSignal(event_id, prev.signal, cid, f"{prev.reason} and {signal}")
                else:
                    seen[cid] = InferredSignal(event_id, signal, cid, f"chunk {signal}")
        out.extend(seen.values())
        return out


def _check_text(text: Any, name: str) -> str:
    if not isinstance(text, str):
        raise ValidationError(f"{name} must be a str, got {type(text).__name__}")
    return text


def infer_at(implicit: Any, previous_event: Mapping[str, Any], query: str | None, *, at: float | None,
             **kwargs: Any) -> list[InferredSignal]:
    """``implicit.infer(previous_event, query, **kwargs, at=at)``; without ``at`` for an ``infer`` that takes none
    (a subclass or stand-in written before it was added: a bare ``TypeError`` then, which a LangChain callback
    only prints, so reformulations stopped being recorded unsaid)."""
    params: Iterable[inspect.Parameter]
    try:
        params = inspect.signature(implicit.infer).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: give it what it always took
        params = ()
    takes_at = any(p.name == "at" or p.kind is p.VAR_KEYWORD for p in params)
    return implicit.infer(previous_event, query, **kwargs, **({"at": at} if takes_at else {}))
