"""``PrioritizedReplay``: reuse the few episodes that carried a reward.

Most retrievals get no feedback, so the episodes that did are worth learning
from more than once. The buffer keeps the most recent ``capacity`` (10,000)
episodes with a non-zero reward and samples batches of ``batch_size`` (32 to
64) without replacement, with probability proportional to
``|reward| * 0.5 ** (age / half_life)``: larger rewards carry more information,
and old episodes describe a world that may have changed. ``age`` counts the
episodes added since. The learner replays them through the policy update with
a lower weight, so they are not counted as fresh evidence.

Episodes are stored as JSON-safe dicts (:func:`episode_to_dict`, without the
query embedding, which the policy update does not read), so the buffer's most
recent ``persist`` episodes survive a restart.

>>> import numpy as np
>>> from rlfb.policies.base import Decision, Episode
>>> buf = PrioritizedReplay(capacity=10, batch_size=2, seed=0)
>>> ep = Episode("e1", "q", ("a",), Decision({"a": 1.0}), ("c",), np.ones((1, 1)), np.ones(1), 1.0)
>>> empty = Episode("e2", "q", ("a",), Decision({"a": 1.0}), (), np.ones((0, 1)), np.ones(0), 0.0)
>>> buf.add(ep), buf.add(empty)
(True, False)
>>> [e.event_id for e in buf.sample()]
['e1']
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError
from rlfb.policies._util import check_float, check_int, plain_numbers, rng_state, set_rng_state
from rlfb.policies.base import Decision, Episode

__all__ = ["ReplayParams", "PrioritizedReplay", "episode_to_dict", "episode_from_dict"]


def _floats(x: Any) -> list[Any]:
    return np.asarray(x, dtype=float).tolist()


def episode_to_dict(ep: Episode, *, embedding: bool = True) -> dict[str, Any]:
    """A JSON-safe dict of an episode (arrays become lists); ``embedding=False`` drops the query embedding."""
    d = ep.decision
    return {
        "event_id": ep.event_id,
        "query": ep.query,
        "retrievers": list(ep.retrievers),
        "decision": {**d.to_dict(), "ranking": list(d.ranking) if d.ranking is not None else None},
        "shown_ids": list(ep.shown_ids),
        "shown": _floats(ep.shown),
        "chunk_rewards": _floats(ep.chunk_rewards),
        "reward": float(ep.reward),
        "query_type": ep.query_type,
        "features": {k: float(v) for k, v in dict(ep.features).items()},
        "timestamp": float(ep.timestamp),
        "feedback_time": float(ep.feedback_time),
        "query_embedding": (
            None if (ep.query_embedding is None or not embedding) else _floats(ep.query_embedding)
        ),
        "scores": None if getattr(ep, "scores", None) is None else _floats(ep.scores),
        # what earlier feedback on the same retrieval had given each chunk, and whether the reward was the
        # whole answer's: without them a replayed second click takes the first clicked chunk for a loser
        "prior_rewards": None if ep.prior_rewards is None else _floats(ep.prior_rewards),
        "response_level": bool(ep.response_level),
    }


def episode_from_dict(d: Mapping[str, Any]) -> Episode:
    """Rebuild an episode written by :func:`episode_to_dict`; damage raises :class:`CorruptStateError`."""
    try:
        dec = d["decision"]
        retrievers = tuple(str(r) for r in d["retrievers"])
        shown = np.asarray(d["shown"], dtype=float).reshape(-1, len(retrievers))
        rewards = np.asarray(d["chunk_rewards"], dtype=float)
        shown_ids = tuple(str(c) for c in d["shown_ids"])
        if shown.shape[0] != len(shown_ids) or rewards.shape != (len(shown_ids),):
            raise CorruptStateError("replayed episode has mismatched shown chunks and rewards")
        emb = d.get("query_embedding")
        scores = d.get("scores")
        prior = d.get("prior_rewards")  # absent from episodes saved before it was kept
        if prior is not None:
            prior = np.asarray(prior, dtype=float)
            if prior.shape != rewards.shape or not np.all(np.isfinite(prior)):
                raise CorruptStateError("replayed episode has prior rewards of another shape, or non-finite")
        ranking = dec.get("ranking")
        return Episode(
            event_id=str(d["event_id"]),
            query=str(d["query"]),
            retrievers=retrievers,
            decision=Decision(
                weights={str(k): float(v) for k, v in dict(dec["weights"]).items()},
                arm=dec.get("arm"),
                propensity=float(dec.get("propensity", 1.0)),
                explored=bool(dec.get("explored", False)),
                policy=str(dec.get("policy", "")),
                ranking=None if ranking is None else tuple(int(i) for i in ranking),
                sampling_temperature=dec.get("sampling_temperature"),
            ),
            shown_ids=shown_ids,
            shown=shown,
            chunk_rewards=rewards,
            reward=float(d["reward"]),
            query_type=str(d.get("query_type", "default")),
            features={str(k): float(v) for k, v in dict(d.get("features", {})).items()},
            timestamp=float(d.get("timestamp", 0.0)),
            feedback_time=float(d.get("feedback_time", 0.0)),
            query_embedding=None if emb is None else np.asarray(emb, dtype=np.float32),
            scores=None if scores is None else np.asarray(scores, dtype=float),
            prior_rewards=prior,
            response_level=bool(d.get("response_level", True)),  # the Episode default, as older saves read
        )
    except CorruptStateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptStateError(f"cannot rebuild a replayed episode: {exc!r}") from exc


@dataclass(frozen=True)
class ReplayParams:
    """Hyperparameters of :class:`PrioritizedReplay` (validated).

    >>> ReplayParams(batch_size=0)
    Traceback (most recent call last):
    ...
    rlfb.errors.ValidationError: batch_size must be in [1, 100000], got 0
    """

    capacity: int = 10_000
    batch_size: int = 32
    half_life: float = 2000.0
    persist: int = 200

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_int("capacity", self.capacity, 1, 10_000_000)
        check_int("batch_size", self.batch_size, 1, 100_000)
        check_float("half_life", self.half_life, 0.0, None, lo_open=True)
        check_int("persist", self.persist, 0, 10_000_000)


class PrioritizedReplay:
    """A bounded buffer of rewarded episodes, sampled by ``|reward|`` decayed with age.

    Parameters
    ----------
    capacity
        Episodes kept (the oldest leave first).
    batch_size
        Episodes per :meth:`sample` (the design says 32 to 64).
    half_life
        Age, in episodes added, at which an episode's priority halves.
    persist
        How many of the most recent episodes :meth:`state_dict` writes.
    seed
        Seed of its own generator.
    """

    def __init__(
        self,
        capacity: int = 10_000,
        batch_size: int = 32,
        *,
        half_life: float = 2000.0,
        persist: int = 200,
        seed: int | None = 0,
    ) -> None:
        self.hyper = ReplayParams(capacity, batch_size, half_life, persist)
        self._rng = np.random.default_rng(None if seed is None else check_int("seed", seed, 0))
        self._items: deque[tuple[Episode, float, int]] = deque(maxlen=self.hyper.capacity)
        self._added = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, episode: Episode) -> bool:
        """Keep the episode if its reward (or any chunk reward) is non-zero; returns whether it was kept.

        Its priority is the reward's magnitude, clipped to 1 as rewards are: two of 1e308 summed to an
        infinity, every priority became 0 and sampling failed.
        """
        r = float(episode.reward)
        cr = np.asarray(episode.chunk_rewards, dtype=float)
        mag = abs(r) if r != 0 else (float(np.max(np.abs(cr))) if cr.size else 0.0)
        if not math.isfinite(mag) or mag == 0:
            return False
        mag = min(1.0, mag)
        self._items.append((episode, mag, self._added))
        self._added += 1
        return True

    def priorities(self) -> np.ndarray:
        """Sampling probabilities of the stored episodes, oldest first."""
        if not self._items:
            return np.zeros(0)
        mags = np.fromiter((m for _, m, _ in self._items), dtype=float, count=len(self._items))
        n = len(self._items)
        ages = self._added - 1 - np.fromiter((i for _, _, i in self._items), dtype=float, count=n)
        pr = mags * 0.5 ** (ages / self.hyper.half_life)
        total = pr.sum()
        return pr / total if total > 0 else np.full(pr.shape, 1.0 / pr.size)

    def sample(self, n: int | None = None) -> list[Episode]:
        """Up to ``n`` (default ``batch_size``) distinct episodes, drawn by priority."""
        n = self.hyper.batch_size if n is None else check_int("n", n, 0)
        if not self._items or n == 0:
            return []
        p = self.priorities()
        n = min(n, int(np.count_nonzero(p)))
        idx = self._rng.choice(p.size, size=n, replace=False, p=p)
        return [self._items[int(i)][0] for i in idx]

    def held(self) -> tuple[tuple[Any, ...], int]:
        """Every episode held and the count added, for :meth:`restore_held` in this process (an undo): a
        :meth:`state_dict` keeps only the newest ``persist`` of them."""
        return tuple(self._items), self._added

    def restore_held(self, held: tuple[tuple[Any, ...], int]) -> None:
        """Put back what :meth:`held` returned (the episodes are immutable, so they are not copied)."""
        items, added = held
        self._items = deque(items, maxlen=self.hyper.capacity)
        self._added = added

    def state_dict(self) -> dict[str, Any]:
        keep = list(self._items)[-self.hyper.persist :] if self.hyper.persist else []
        return {
            "params": asdict(self.hyper),
            "added": self._added,
            "rng": rng_state(self._rng),
            # replays feed the policy update, which does not read the query embedding: leave it out
            "items": [{"episode": episode_to_dict(e, embedding=False), "mag": m, "i": i} for e, m, i in keep],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> PrioritizedReplay:
        try:
            items = [
                (episode_from_dict(it["episode"]), min(1.0, float(it["mag"])), int(it["i"])) for it in state["items"]
            ]
            added = int(state["added"])
            set_rng_state(self._rng, state["rng"])
        except CorruptStateError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStateError(f"cannot read the replay buffer: {exc!r}") from exc
        if any(not math.isfinite(m) or m <= 0 or i >= added for _, m, i in items):
            raise CorruptStateError("replay buffer entries are malformed")
        self._items = deque(items, maxlen=self.hyper.capacity)
        self._added = added
        return self
