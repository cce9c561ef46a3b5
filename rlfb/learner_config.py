"""``LearnerConfig``: every setting of a :class:`~rlfb.learner.Learner`, a validated value object kept apart from
what the learner learns (its parts' hyperparameters, which it builds them from)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlfb.confidence import ChunkConfidence
from rlfb.discovery import RepeatDiscovery
from rlfb.errors import ValidationError
from rlfb.exploration import EXPLORATIONS, EpsilonGreedyExploration, NoExploration, ThompsonChunkExploration
from rlfb.guardrail import Guardrail
from rlfb.hyperparameters import check_float, check_int, plain_numbers
from rlfb.memory import FeedbackMemory
from rlfb.replay import PrioritizedReplay
from rlfb.types import check_known_options

__all__ = ["LearnerConfig", "part_seed"]

#: The learner's parts that draw random numbers, in the order their streams are numbered (the policy, the
#: first, draws from the learner's seed itself).
_SEEDED_PARTS = ("exploration", "replay", "discovery")


def part_seed(seed: int | None, part: str) -> int | None:
    """The seed of one of a learner's parts: a stream of its own, derived from the learner's ``seed``.

    Seeding the parts ``seed + 1``, ``+ 3`` and ``+ 4`` (until 2026-12-06) gave seed 0's chunk exploration the
    stream of seed 1's policy, so runs over nearby seeds shared streams; derived through ``SeedSequence``, they
    share none.

    >>> part_seed(0, "exploration") not in {part_seed(1, "exploration"), part_seed(0, "replay"), 0, 1}
    True
    >>> part_seed(None, "replay") is None
    True
    """
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, 1 + _SEEDED_PARTS.index(part)]).generate_state(1)[0])

#: The names the learner's parts validate under -> the LearnerConfig settings they come from.
_PART_SETTINGS = {
    "learning_rate": "confidence_learning_rate",
    "max_entries": "memory_max_entries",
    "max_neighbors": "memory_max_neighbors",
    "value_scale": "memory_value_scale",
    "capacity": "replay_capacity",
    "batch_size": "replay_batch_size",
    "half_life": "replay_half_life",
    "persist": "replay_persist",
    "beta": "replay_beta",
    "tolerance": "guardrail_tolerance",
    "min_episodes": "guardrail_min_episodes",
    "weight": "thompson_weight",
    "depth": "explore_depth",
    "min_position": "explore_min_position",
    "min_asks": "discovery_after",
}


@dataclass(frozen=True)
class LearnerConfig:
    """Settings of a :class:`~rlfb.learner.Learner` (validated on construction; every field has a default).

    Fusion features
        ``confidence_weight`` (0.05) and ``memory_weight`` (1.0) weigh the chunk
        confidence and the feedback memory in the fused score, relative to the
        score scale. ``memory_weight=0`` turns the memory off.
        ``relevance_feedback_weight`` (0: off; 0.1 is the measured setting),
        times ``memory_weight``, lifts, for a question asked before, the
        candidates most like the chunks the memory holds as good for it
        (:mod:`rlfb.relevance_feedback`; it needs the candidates' embeddings,
        which an ensemble with a dense retriever gives when it is on).
        Navigational user, thompson, at 0.1: seen-question nDCG@10 at about 3
        asks 0.518 → 0.545 on cranfield and 0.524 → 0.547 on cisi (20 seeds),
        online 0.02–0.05 higher. Off by default because the chunks it lifts
        are clicked for its sake, which tells the weights nothing: they move
        on fewer seeds (scifact 3 of 5 instead of 5), the LangChain run's do
        not move in 200 questions, and held-out nDCG@10 of a test-split-only
        scifact fell 0.014 (10 seeds). README, Results.
    Chunk exploration
        ``exploration``: ``"thompson"``, ``"epsilon"`` or ``"none"``; by default ``"thompson"`` (it explored
        best on cranfield) where the feedback memory is on and ``"none"`` where ``memory_weight=0``: without
        the memory what a swapped-in chunk teaches is the confidences' small prior, and it cost online
        nDCG@10 0.03–0.05 against the same learner not exploring chunks (navigational user, thompson, 5 seeds:
        scifact 0.666 → 0.735, cranfield 0.353 → 0.404, cisi 0.394 → 0.444; held-out 0.7208 → 0.7216,
        0.4178 → 0.4193, 0.4250 → 0.4213, within the seeds' noise). Given explicitly, it is kept;
        ``epsilon`` (0.1) decays by half every ``epsilon_half_life`` learned
        episodes down to ``epsilon_min``; a swapped-in chunk comes from the
        next ``explore_depth`` candidates into a slot from
        ``explore_min_position * k`` on. ``thompson_weight`` (0.4) sizes Thompson
        perturbations: chunk exploration also varies the shown chunks that
        the weights' click evidence is scored on (10 seeds, with a steady
        guardrail: held-out nDCG@10 +0.006 on scifact and cranfield against
        0.3, online about 0.02 lower; 0.5 costs more online and gains nothing).
    Discovery for repeated questions
        ``discovery_rate`` (0.5; 0 turns it off) caps how often a question
        asked at least ``discovery_after`` (3) times before, whose list would
        start with a chunk the memory knows to be good, is shown the best
        chunk the memory knows nothing about for it first
        (:class:`~rlfb.discovery.RepeatDiscovery`); how often is learned from
        the click rate of such chunks. Policies that sample whole rankings
        (``gradient``) are left alone. Navigational user, 5 seeds, thompson:
        seen-question nDCG@10 on cisi 0.540 → 0.578 (cranfield 0.577 → 0.584,
        scifact 0.838 → 0.842); after 2 asks instead of 3 cisi reaches 0.597, but
        it also changes the few thrice-asked questions of a 200-question run
        enough to undo a borderline weight move there.
    Evidence
        ``confidence_learning_rate`` (0.03, in [0.01, 0.05]); ``half_life_days``
        (45) forgetting of confidences and memory; ``skip_weight`` (0.3) the
        negative evidence for a chunk read and passed over (shown above a
        rewarded one); ``abandon_weight`` (0.5) times the episode's reward for
        every shown chunk the answer did not use, when nothing was rewarded and
        the reward is negative (-0.1 after a reformulation, -0.5 after a thumbs
        down). The chunks it used take the whole of such criticism from the
        store (-0.2 and -1.0 with the default reward settings): by default the
        answer uses every shown chunk, and ``abandon_weight`` has no effect.
    Memory
        ``similarity_threshold`` (0.8 cosine), ``memory_max_entries``,
        ``memory_max_neighbors``, ``memory_value_scale`` (3.0: about linear in
        the evidence over the first clicks and skips, so two skips undo one
        click rather than one skip burying a chunk), ``transfer_weight``
        and ``transfer_gate`` (``"adaptive"`` or a number in [0, 1]).
    Replay
        ``replay`` on/off, ``replay_capacity`` (10,000), ``replay_batch_size``
        (32), ``replay_every`` (50 episodes), ``replay_weight`` (0.25 of a fresh
        episode), ``replay_half_life``, ``replay_persist`` (episodes saved in
        the state), ``replay_beta`` (1: the importance-sampling exponent that
        undoes the ``|reward|`` priority, :mod:`rlfb.replay`; 0 turns it off),
        ``replay_all`` (also replay into bandit and batch
        policies, whose statistics would count a replay as new evidence; off).
    Guardrail
        ``guardrail`` on/off, ``guardrail_tolerance``, ``guardrail_min_episodes``.
    Active learning
        ``ask_threshold`` (0.5): :meth:`~rlfb.learner.Learner.should_ask_for_feedback` is true
        when the mean of the shown chunks' posterior uncertainty and the
        policy's uncertainty reaches it.

    >>> LearnerConfig(memory_weight=-1)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: memory_weight must be in [0, 10], got -1
    """

    confidence_weight: float = 0.05
    memory_weight: float = 1.0
    relevance_feedback_weight: float = 0.0
    exploration: str | None = None  # None: "thompson" with the memory on, "none" with it off (chunk_exploration)
    epsilon: float = 0.1
    epsilon_min: float = 0.02
    epsilon_half_life: float = 1000.0
    explore_depth: int = 50
    explore_min_position: float = 0.5
    thompson_weight: float = 0.4
    discovery_rate: float = 0.5
    discovery_after: int = 3
    confidence_learning_rate: float = 0.03
    half_life_days: float | None = 45.0
    skip_weight: float = 0.3
    abandon_weight: float = 0.5
    similarity_threshold: float = 0.8
    memory_max_entries: int = 5000
    memory_max_neighbors: int = 5
    memory_value_scale: float = 3.0
    transfer_weight: float = 1.0
    transfer_gate: float | str = "adaptive"
    replay: bool = True
    replay_capacity: int = 10_000
    replay_batch_size: int = 32
    replay_every: int = 50
    replay_weight: float = 0.25
    replay_half_life: float = 2000.0
    replay_persist: int = 200
    replay_beta: float = 1.0
    replay_all: bool = False
    guardrail: bool = True
    guardrail_tolerance: float = 0.01
    guardrail_min_episodes: int = 30
    ask_threshold: float = 0.5

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_float("confidence_weight", self.confidence_weight, 0.0, 10.0)
        check_float("memory_weight", self.memory_weight, 0.0, 10.0)
        check_float("relevance_feedback_weight", self.relevance_feedback_weight, 0.0, 10.0)
        # None (the default) stays None, resolved by chunk_exploration: written out as given, a config copied
        # with dataclasses.replace(..., memory_weight=0) or read back from to_dict() follows its own memory
        if self.exploration is not None and (not isinstance(self.exploration, str)
                                             or self.exploration not in EXPLORATIONS):
            raise ValidationError(
                f"exploration must be one of {sorted(EXPLORATIONS)} or None, got {self.exploration!r}"
            )
        # validated here too: the epsilon explorer that checks them is built only when chosen
        check_float("epsilon", self.epsilon, 0.0, 1.0)
        check_float("epsilon_min", self.epsilon_min, 0.0, 1.0)
        check_float("epsilon_half_life", self.epsilon_half_life, 0.0, None, lo_open=True)
        check_int("explore_depth", self.explore_depth, 1, 1_000_000)  # as the epsilon explorer checks them
        check_float("explore_min_position", self.explore_min_position, 0.0, 1.0)
        check_float("thompson_weight", self.thompson_weight, 0.0, 10.0)
        check_float("discovery_rate", self.discovery_rate, 0.0, 1.0)
        check_int("discovery_after", self.discovery_after, 0)
        check_float("skip_weight", self.skip_weight, 0.0, 1.0)
        check_float("abandon_weight", self.abandon_weight, 0.0, 1.0)
        check_int("replay_every", self.replay_every, 1)
        check_float("replay_weight", self.replay_weight, 0.0, 1.0)
        check_float("ask_threshold", self.ask_threshold, 0.0, 1.0)
        for name in ("replay", "replay_all", "guardrail"):
            if not isinstance(getattr(self, name), bool):
                raise ValidationError(f"{name} must be a bool, got {getattr(self, name)!r}")
        # the parts validate the rest; their messages are re-worded to name this config's settings
        try:
            self._parts(0)
        except ValidationError as exc:
            name, _, rest = str(exc).partition(" ")
            raise ValidationError(f"{_PART_SETTINGS.get(name, name)} {rest}") from None

    @property
    def chunk_exploration(self) -> str:
        """The chunk exploration a learner of these settings runs: ``exploration`` where given, else
        ``"thompson"`` with the memory on and ``"none"`` with it off.

        >>> LearnerConfig().chunk_exploration, LearnerConfig(memory_weight=0).chunk_exploration
        ('thompson', 'none')
        """
        if self.exploration is not None:
            return self.exploration
        return "thompson" if self.memory_weight > 0 else "none"

    def _parts(self, seed: int | None) -> dict[str, Any]:
        """The learner's parts, built from these settings; ``seed`` is the learner's, and each part that draws
        gets a stream of its own from it (:func:`part_seed`)."""
        explore_seed, replay_seed, discovery_seed = (part_seed(seed, part) for part in _SEEDED_PARTS)
        explorer: Any
        if self.chunk_exploration == "epsilon":
            explorer = EpsilonGreedyExploration(
                self.epsilon, epsilon_min=self.epsilon_min, half_life=self.epsilon_half_life,
                depth=self.explore_depth, min_position=self.explore_min_position, seed=explore_seed,
            )
        elif self.chunk_exploration == "thompson":
            explorer = ThompsonChunkExploration(self.thompson_weight, seed=explore_seed)
        else:
            explorer = NoExploration()
        return {
            "confidence": ChunkConfidence(self.confidence_learning_rate, half_life_days=self.half_life_days),
            "memory": FeedbackMemory(
                self.similarity_threshold, self.memory_max_entries, max_neighbors=self.memory_max_neighbors,
                value_scale=self.memory_value_scale, transfer_weight=self.transfer_weight,
                transfer_gate=self.transfer_gate, half_life_days=self.half_life_days,
            ),
            "explorer": explorer,
            "discovery": RepeatDiscovery(
                self.discovery_rate, min_asks=self.discovery_after, seed=discovery_seed
            ),
            "replay": PrioritizedReplay(
                self.replay_capacity, self.replay_batch_size, half_life=self.replay_half_life,
                persist=self.replay_persist, beta=self.replay_beta, seed=replay_seed,
            ),
            "guardrail": Guardrail(
                tolerance=self.guardrail_tolerance, min_episodes=self.guardrail_min_episodes
            ),
        }

    @property
    def reads_candidate_embeddings(self) -> bool:
        """Whether ranking reads the candidates' embeddings: relevance feedback is on (the memory off turns it
        off too). An ensemble gathers them only then."""
        return self.relevance_feedback_weight > 0 and self.memory_weight > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LearnerConfig:
        """Build from a dict; unknown keys raise :class:`ValidationError`."""
        check_known_options(d, [f.name for f in dataclasses.fields(cls)], "the learner config")
        return cls(**dict(d))
