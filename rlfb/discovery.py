"""``RepeatDiscovery``: explore at the top of the list for questions that are asked again and again.

The feedback memory lifts the chunks users clicked for a question to the top
the next time it is asked. A cascade user reads from the top and, having found
an answer, usually stops; so once the memory knows one good chunk, the user
stops at it, and the question's other relevant chunks, a few places lower,
are never read. Chunk exploration that perturbs scores rarely lifts an
unknown chunk above a remembered one. For a question asked many times that is
a lasting loss: each relevant chunk found is worth something on every later
asking.

So, for a question asked at least ``min_asks`` times before (counted by the
memory) whose shown list starts with a chunk the memory knows to be good,
``RepeatDiscovery`` puts, with probability ``rate``, the best-scored
candidate the memory knows nothing about for this question at the top. The
user reads it first; a click adds it to what the memory knows, a pass reads
as a skip, and either way the next asking tries the next unknown chunk.

How often to do it is learned. ``rate`` is ``scale`` times the share of
such top-placed unknown chunks that were clicked (a Beta(1, 1) estimate over
the feedback seen, forgetting slowly), capped at ``max_rate``; ``scale`` is
above 1 because a chunk found is worth something on every later asking while
the detour costs once. Where questions have many relevant chunks (cisi: a
quarter of the unknown top chunks are clicked) it explores at the cap; where a
question has one or two relevant chunks and the memory already shows them
(scifact, cranfield: about one in seven) it explores about half as often, and
a user with a one-answer question is rarely made to read past a wrong chunk.
The propensity of every eligible decision is logged.

>>> d = RepeatDiscovery(max_rate=1.0, seed=0)
>>> for _ in range(8):
...     d.observe(clicked=True)  # top-placed unknown chunks were clicked: explore often
>>> round(d.rate, 2)  # 2 x 9/10, capped
1.0
>>> ids = ["known", "a", "b", "c"]
>>> res = d.explore(np.array([0, 1, 2]), np.array([0, 2, 1, 3]), ids, {"known": 0.8}, asks=3)
>>> [ids[i] for i in res.order], res.explored
(['b', 'known', 'a'], True)
>>> d.explore(np.array([0, 1, 2]), np.array([0, 2, 1, 3]), ids, {"known": 0.8}, asks=2) is None
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError
from rlfb.exploration import ExplorationResult
from rlfb.hyperparameters import check_float, check_int, plain_numbers
from rlfb.saved_state import MAX_COUNT, rng_state, set_rng_state

__all__ = ["DiscoveryParams", "RepeatDiscovery"]


@dataclass(frozen=True)
class DiscoveryParams:
    """Hyperparameters of :class:`RepeatDiscovery` (validated).

    >>> DiscoveryParams(max_rate=2.0)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: max_rate must be in [0, 1], got 2.0
    """

    max_rate: float = 0.5
    scale: float = 2.0
    min_asks: int = 3
    depth: int = 30
    forget: float = 0.999

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_float("max_rate", self.max_rate, 0.0, 1.0)
        check_float("scale", self.scale, 0.0, 100.0, lo_open=True)
        check_int("min_asks", self.min_asks, 0, 1_000_000)
        check_int("depth", self.depth, 1, 1_000_000)
        check_float("forget", self.forget, 0.5, 1.0)


class RepeatDiscovery:
    """Show an unknown chunk first, now and then, for often-repeated questions.

    Parameters
    ----------
    max_rate
        The most often an eligible decision explores (0 turns discovery off).
    scale
        How many times the click rate of top-placed unknown chunks the exploration rate is.
    min_asks
        How many times the question must have been asked before (with feedback
        remembered) for it to be eligible.
    depth
        How far down the fused ranking to look for a chunk the memory does not know.
    forget
        Per observation, the weight left on the earlier ones in the click-rate estimate.
    seed
        Seed of its own generator.
    """

    kind = "discovery"

    def __init__(
        self,
        max_rate: float = 0.5,
        *,
        scale: float = 2.0,
        min_asks: int = 3,
        depth: int = 30,
        forget: float = 0.999,
        seed: int | None = 0,
    ) -> None:
        self.hyper = DiscoveryParams(max_rate, scale, min_asks, depth, forget)
        self._rng = np.random.default_rng(None if seed is None else check_int("seed", seed, 0))
        self._tries = 0.0
        self._hits = 0.0

    @property
    def rate(self) -> float:
        """The probability that an eligible decision explores now."""
        p = self.hyper
        return min(p.max_rate, p.scale * (self._hits + 1.0) / (self._tries + 2.0))

    def due(self, asks: int) -> bool:
        """Whether a question asked this many times before is repeated enough to explore (cheap: no evidence)."""
        return self.hyper.max_rate > 0 and asks >= self.hyper.min_asks

    def eligible(self, known: Mapping[str, float], asks: int) -> bool:
        """Whether a question with this remembered evidence and this many earlier asks is explored."""
        return self.due(asks) and any(v > 0 for v in known.values())

    def explore(
        self,
        order: np.ndarray,
        ranked: np.ndarray,
        candidate_ids: Sequence[str],
        known: Mapping[str, float],
        asks: int,
    ) -> ExplorationResult | None:
        """Maybe put the best unknown chunk first; ``None`` when the decision is not eligible.

        ``order`` is what would be shown (candidate indices), ``ranked`` all
        candidates best first by fused score, ``known`` the memory's evidence
        per chunk for this very question, ``asks`` how often it was asked before.
        """
        if len(order) == 0 or not self.eligible(known, asks):
            return None
        if known.get(candidate_ids[int(order[0])], 0.0) <= 0:
            return None  # the top is already a chunk not known to be good: nothing to add
        pick = next((int(i) for i in ranked[: self.hyper.depth] if candidate_ids[int(i)] not in known), None)
        if pick is None:
            return None
        rate = self.rate
        if self._rng.random() >= rate:
            return ExplorationResult(np.asarray(order, dtype=np.int64), 1.0 - rate, False)
        rest = [int(i) for i in order if int(i) != pick]
        shown = np.asarray([pick, *rest][: len(order)], dtype=np.int64)
        return ExplorationResult(shown, rate, True)

    def observe(self, clicked: bool) -> None:
        """Count one question whose top chunk was unknown to the memory, and whether it was clicked."""
        f = self.hyper.forget
        self._tries = self._tries * f + 1.0
        self._hits = self._hits * f + (1.0 if clicked else 0.0)

    def params(self) -> dict[str, Any]:
        return asdict(self.hyper)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": self.params(), "tries": self._tries, "hits": self._hits,
                "rng": rng_state(self._rng)}

    def load_state_dict(self, state: Mapping[str, Any]) -> RepeatDiscovery:
        try:
            if state["kind"] != self.kind:
                raise CorruptStateError(f"discovery state is for {state['kind']!r}, not {self.kind!r}")
            tries, hits = float(state["tries"]), float(state["hits"])  # 10**400 raised a raw OverflowError here
            if not (np.isfinite(tries) and np.isfinite(hits) and 0 <= hits <= tries <= MAX_COUNT):
                raise CorruptStateError(f"discovery counts must be finite with 0 <= hits <= tries <= {MAX_COUNT}")
            # last, once the counts are known good: a refused state left the generator moved
            set_rng_state(self._rng, state["rng"])
        except CorruptStateError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise CorruptStateError(f"cannot read discovery state: {exc!r}") from exc
        self._tries, self._hits = tries, hits
        return self
