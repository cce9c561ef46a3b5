"""Cascade click models with explicit thumbs, reformulations and delays.

A cascade user scans the shown list top-down. At each position they click
with the probability of the chunk's relevance grade, and after a click they
stop with the stop probability of that grade. Grades are 0 to 4; binary
judgments map to 0 and 4, and the relevant grades of other scales spread evenly
over 1 to 4 (a top grade of 3 gives grades 1, 2.5 and 4, whose probabilities are
interpolated).

>>> user = SimulatedUser("perfect", explicit_rate=0.0, seed=1)
>>> inter = user.interact(["a", "b", "c"], {"b": 1})
>>> inter.clicked_ids
['b']
>>> [(f.signal, f.chunk_id) for f in inter.feedback]
[('implicit_positive', 'b')]
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rlfb.errors import ValidationError

__all__ = ["ClickModel", "CLICK_MODELS", "SimulatedFeedback", "Interaction", "SimulatedUser", "to_grade"]


@dataclass(frozen=True)
class ClickModel:
    """P(click) and P(stop after a click) for relevance grades 0 to 4."""

    name: str
    click: tuple[float, float, float, float, float]
    stop: tuple[float, float, float, float, float]

    def __post_init__(self) -> None:
        for what, probs in (("click", self.click), ("stop", self.stop)):
            if len(probs) != 5 or not all(0.0 <= p <= 1.0 for p in probs):
                raise ValidationError(f"{self.name}: {what} needs 5 probabilities in [0, 1], got {probs}")

    def p_click(self, grade: float) -> float:
        """P(click) at ``grade``, linear between the integer grades.

        >>> CLICK_MODELS["navigational"].p_click(4), CLICK_MODELS["navigational"].p_click(2.5)
        (0.95, 0.6)
        >>> CLICK_MODELS["perfect"].p_click(4.5), CLICK_MODELS["perfect"].p_click(-1)  # off the scale: its ends
        (1.0, 0.0)
        """
        return _at(self.click, grade)

    def p_stop(self, grade: float) -> float:
        """P(stop after a click) at ``grade``, linear between the integer grades."""
        return _at(self.stop, grade)


def _at(probs: Sequence[float], grade: float) -> float:
    # an integer grade reads its own entry exactly, so the standard scales draw the same clicks; a grade off the
    # 0-4 scale reads its end (above 4 indexed past the table)
    grade = min(4.0, max(0.0, float(grade)))
    lo = math.floor(grade)
    frac = grade - lo
    if frac <= 0.0:
        return probs[lo]
    return probs[lo] + frac * (probs[lo + 1] - probs[lo])


CLICK_MODELS: dict[str, ClickModel] = {
    "perfect": ClickModel("perfect", (0.0, 0.2, 0.4, 0.8, 1.0), (0.0, 0.0, 0.0, 0.0, 0.0)),
    "navigational": ClickModel("navigational", (0.05, 0.3, 0.5, 0.7, 0.95), (0.2, 0.3, 0.5, 0.7, 0.9)),
    "informational": ClickModel("informational", (0.4, 0.6, 0.7, 0.8, 0.9), (0.1, 0.2, 0.3, 0.4, 0.5)),
}


def to_grade(value: int, max_grade: int) -> float:
    """Map a qrel value to a grade in [0, 4]: 0 and below to 0, relevant ones 1 to ``max_grade`` evenly
    onto [1, 4] (binary judgments to 4); a value above ``max_grade`` counts as the top grade.

    Every scale keeps its spacing (no rounding or clamp that would merge two grades or skip one): a
    judged-relevant chunk is at least grade 1, on a scale finer than 0-4 too. 0-4 maps onto itself.
    :class:`ClickModel` interpolates between the integer grades.

    >>> to_grade(1, 1), to_grade(0, 1), to_grade(2, 4), to_grade(3, 2)
    (4.0, 0.0, 2.0, 4.0)
    >>> [to_grade(v, 3) for v in (1, 2, 3)]
    [1.0, 2.5, 4.0]
    """
    if value <= 0:
        return 0.0
    if max_grade <= 1:
        return 4.0
    return min(4.0, 1.0 + 3.0 * (value - 1) / (max_grade - 1))


@dataclass(frozen=True)
class SimulatedFeedback:
    """One piece of feedback and how long after the retrieval it arrives."""

    signal: str
    chunk_id: str | None
    delay: float


@dataclass(frozen=True)
class Interaction:
    clicked_ids: list[str]
    feedback: list[SimulatedFeedback] = field(default_factory=list)
    explicit: str | None = None
    reformulated: bool = False


class SimulatedUser:
    """A seeded cascade user who also gives thumbs and reformulates.

    Parameters
    ----------
    model
        ``"perfect"``, ``"navigational"``, ``"informational"`` or a :class:`ClickModel`.
    explicit_rate
        Probability of an explicit thumb on the answer: up when a relevant chunk
        is in the answer's top ``answer_k``, down otherwise.
    noise
        Probability that a thumb is flipped.
    reformulation_rate
        When nothing relevant is in the answer's top ``answer_k`` (3 by default),
        the probability of a restated follow-up question (an implicit negative
        on the whole answer).
    answer_k
        How many of the top chunks the answer is written from (at least 1).
    depth
        How many of the shown chunks the user scans for clicks (at least 1).
    mean_delay
        Mean of the exponential delay, in seconds, before feedback arrives (>= 0).
    late_rate
        Fraction of feedback that arrives after ``late_delay`` seconds (>= 0),
        outside a 24 h attribution window by default, to exercise the window.
    late_delay
        How late that feedback arrives, in seconds (two days by default).
    max_grade
        The collection's highest qrel value (at least 1); 1 means binary.
    seed
        Seed of the user's own ``random.Random``: the same seed gives the same clicks, thumbs and delays.
    """

    def __init__(
        self,
        model: str | ClickModel = "navigational",
        *,
        explicit_rate: float = 0.1,
        noise: float = 0.0,
        reformulation_rate: float = 0.5,
        answer_k: int = 3,
        depth: int = 10,
        mean_delay: float = 120.0,
        late_rate: float = 0.02,
        late_delay: float = 2 * 86400.0,
        max_grade: int = 1,
        seed: int = 0,
    ) -> None:
        if isinstance(model, str):
            try:
                model = CLICK_MODELS[model]
            except KeyError:
                raise ValidationError(f"unknown user {model!r}; choose one of {sorted(CLICK_MODELS)}") from None
        for name, p in (("explicit_rate", explicit_rate), ("noise", noise),
                        ("reformulation_rate", reformulation_rate), ("late_rate", late_rate)):
            if not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
                raise ValidationError(f"{name} must be a probability in [0, 1], got {p!r}")
        for name, v in (("mean_delay", mean_delay), ("late_delay", late_delay)):
            # a negative late delay had feedback arrive before the retrieval it rates
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
                raise ValidationError(f"{name} must be a finite number of seconds >= 0, got {v!r}")
        for name, n in (("answer_k", answer_k), ("depth", depth), ("max_grade", max_grade)):
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
                raise ValidationError(f"{name} must be an int >= 1, got {n!r}")
        self.model = model
        self.explicit_rate = explicit_rate
        self.noise = noise
        self.reformulation_rate = reformulation_rate
        self.answer_k = answer_k
        self.depth = depth
        self.mean_delay = mean_delay
        self.late_rate = late_rate
        self.late_delay = late_delay
        self.max_grade = max_grade
        self._rng = random.Random(seed)

    def _delay(self) -> float:
        if self._rng.random() < self.late_rate:
            return self.late_delay
        return self._rng.expovariate(1.0 / self.mean_delay) if self.mean_delay > 0 else 0.0

    def clicks(self, ranking: Sequence[str], qrel: Mapping[str, int]) -> list[str]:
        """The chunks a cascade user clicks on the top ``depth`` of ``ranking``."""
        clicked = []
        for chunk_id in ranking[: self.depth]:
            grade = to_grade(qrel.get(chunk_id, 0), self.max_grade)
            if self._rng.random() < self.model.p_click(grade):
                clicked.append(chunk_id)
                if self._rng.random() < self.model.p_stop(grade):
                    break
        return clicked

    def interact(self, ranking: Sequence[str], qrel: Mapping[str, int]) -> Interaction:
        """Simulate one user's reaction to a shown ranking."""
        clicked = self.clicks(ranking, qrel)
        feedback = [SimulatedFeedback("implicit_positive", c, self._delay()) for c in clicked]
        # the thumb and a restated question both judge the answer: the chunks it is written from
        answered = any(qrel.get(c, 0) > 0 for c in ranking[: self.answer_k])
        explicit = None
        if self._rng.random() < self.explicit_rate:
            good = not answered if self._rng.random() < self.noise else answered
            explicit = "explicit_positive" if good else "explicit_negative"
            feedback.append(SimulatedFeedback(explicit, None, self._delay()))
        reformulated = False
        if not answered and self._rng.random() < self.reformulation_rate:
            reformulated = True
            feedback.append(SimulatedFeedback("implicit_negative", None, self._delay()))
        return Interaction(clicked, feedback, explicit, reformulated)
