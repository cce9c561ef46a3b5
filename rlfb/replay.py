"""``PrioritizedReplay``: reuse the few episodes that carried a reward.

Most retrievals get no feedback, so the episodes that did are worth learning
from more than once. The buffer keeps the most recent ``capacity`` (10,000)
episodes with a non-zero reward and samples batches of ``batch_size`` (32 to
64) without replacement, with probability proportional to
``|reward| * 0.5 ** (age / half_life)``: larger rewards carry more information,
and old episodes describe a world that may have changed. ``age`` counts the
episodes added since. The learner replays them through the policy update with
a lower weight, so they are not counted as fresh evidence.

Sampling by ``|reward|`` makes an episode of a strong reward weigh more in
the replayed updates than in the data. ``beta`` (1, the default; 0 turns it
off) corrects that with importance-sampling weights, as prioritised experience
replay does (Schaul et al., 2016): :meth:`PrioritizedReplay.sample_weighted`
weighs each episode drawn by ``|reward| ** -beta``, self-normalised so that a
batch's weights average 1. Schaul et al. divide by the largest weight instead,
so that weights only scale updates down; here the smallest reward held, a
reformulation decayed to a tenth (0.02), would then leave a thumbs up replayed
at 2 % of its weight, and replay as a whole at a few per cent of its strength.
The age decay is left uncorrected: favouring recent episodes is the point of it.

The buffer's most recent ``persist`` episodes survive a restart: its state
holds them column by column (without the query embedding, which the policy
update does not read), their texts and ids as JSON lists and their numbers as
base64 blocks of little-endian float64. :func:`episode_to_dict` writes one
episode as a JSON-safe dict.

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

import itertools
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlfb.blocks import decode_block, encode_block
from rlfb.errors import CorruptStateError, NonFiniteValueError
from rlfb.hyperparameters import check_float, check_int, plain_numbers
from rlfb.policies.base import Decision, Episode
from rlfb.saved_state import rng_state, saved_count, set_rng_state

__all__ = [
    "ReplayParams", "PrioritizedReplay", "episode_to_dict", "episode_from_dict", "episode_columns",
    "episodes_from_columns", "MAX_SHOWN",
]

#: The most shown chunks a kept episode keeps, its first: more than any reader reads. One retrieval of a whole
#: corpus (50,000 chunks) with a thumbs on its answer was kept whole, 3.5 MB of every snapshot until 200 newer
#: episodes pushed it out.
MAX_SHOWN = 100


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
        if not (np.all(np.isfinite(shown)) and np.all(np.isfinite(rewards))):
            # a null read as NaN: the state loaded, and then every save refused it
            raise CorruptStateError("replayed episode has a non-finite shown score or reward")
        emb = d.get("query_embedding")
        scores = d.get("scores")
        if scores is not None:
            scores = np.asarray(scores, dtype=float)
            if scores.shape != rewards.shape or not np.all(np.isfinite(scores)):
                # before 2026-12-02 an episode's logged scores could cover every candidate, not the shown chunks
                # alone: left out (the policies re-rank from the shown scores then), or the store's next save
                # was one that no process could load
                scores = None
        prior = d.get("prior_rewards")  # absent from episodes saved before it was kept
        if prior is not None:
            prior = np.asarray(prior, dtype=float)
            if prior.shape != rewards.shape or not np.all(np.isfinite(prior)):
                raise CorruptStateError("replayed episode has prior rewards of another shape, or non-finite")
        ranking = dec.get("ranking")
        if ranking is not None:
            ranking = tuple(int(i) for i in ranking)
            if any(i < 0 for i in ranking):
                raise CorruptStateError("replayed episode has a ranking with a negative place")
        temperature = dec.get("sampling_temperature")
        if temperature is not None:
            if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
                    not math.isfinite(temperature):
                raise CorruptStateError("replayed episode has a sampling temperature that is not a finite number")
            temperature = float(temperature)
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
                ranking=ranking,
                sampling_temperature=temperature,
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
            scores=scores,
            prior_rewards=prior,
            response_level=bool(d.get("response_level", True)),  # the Episode default, as older saves read
        )
    except CorruptStateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
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
    beta: float = 1.0

    def __post_init__(self) -> None:
        plain_numbers(self)  # NumPy scalars as Python numbers: params() and the saved state are JSON
        check_int("capacity", self.capacity, 1, 10_000_000)
        check_int("batch_size", self.batch_size, 1, 100_000)
        check_float("half_life", self.half_life, 0.0, None, lo_open=True)
        check_int("persist", self.persist, 0, 10_000_000)
        check_float("beta", self.beta, 0.0, 1.0)


def inclusion_probabilities(p: np.ndarray, n: int) -> np.ndarray:
    """The chance of each item to be in a sample of ``n`` drawn in proportion to ``p``: ``min(1, c * p)``, with
    ``c`` such that the chances sum to ``n`` (items ``c * p`` would put above 1 are certain).

    >>> inclusion_probabilities(np.array([0.6, 0.2, 0.1, 0.1]), 2).round(3).tolist()
    [1.0, 0.5, 0.25, 0.25]
    """
    p = np.asarray(p, dtype=float)
    incl = np.zeros(p.shape)
    certain = np.zeros(p.shape, dtype=bool)
    for _ in range(p.size + 1):  # each pass makes one item or more certain, or ends
        rest = n - int(certain.sum())
        mass = float(p[~certain].sum())
        incl = np.where(certain, 1.0, p * (rest / mass) if mass > 0 else 0.0)
        over = ~certain & (incl >= 1.0)
        if not over.any():
            break
        certain |= over
    return np.minimum(incl, 1.0)


def _systematic_pps(p: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` distinct indices of items with ``p > 0``, item ``i`` drawn with chance exactly
    :func:`inclusion_probabilities` ``(p, n)[i]`` (systematic sampling over a random order), and those chances."""
    incl = inclusion_probabilities(p, n)
    order = rng.permutation(p.size)
    edges = np.cumsum(incl[order])
    # the last edge is n up to rounding: the last item that can be drawn takes the interval's end, so that a
    # point past a rounded-down edge neither falls off the end nor lands on an item of chance 0
    edges[int(np.flatnonzero(incl[order] > 0)[-1]):] = np.inf
    # n points one apart from a uniform start; an item whose chance interval holds one is drawn (at most one,
    # since no chance exceeds 1)
    points = rng.random() + np.arange(n)
    return order[np.searchsorted(edges, points, side="right")], incl


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
    beta
        Importance-sampling exponent of :meth:`sample_weighted`'s weights, in [0, 1]: 1 (the default) undoes the
        ``|reward|`` priority in full, 0 weighs every replay alike (as before 2026-12-06).
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
        beta: float = 1.0,
        seed: int | None = 0,
    ) -> None:
        self.hyper = ReplayParams(capacity, batch_size, half_life, persist, beta)
        self._rng = np.random.default_rng(None if seed is None else check_int("seed", seed, 0))
        self._items: deque[tuple[Episode, float, int]] = deque(maxlen=self.hyper.capacity)
        self._added = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, episode: Episode) -> bool:
        """Keep the episode if its reward (or any chunk reward) is non-zero; returns whether it was kept.

        Only its first :data:`MAX_SHOWN` shown chunks are kept.

        Its priority is the reward's magnitude, clipped to 1 as rewards are: two of 1e308 summed to an
        infinity, every priority became 0 and sampling failed.
        """
        r = float(episode.reward)
        cr = np.asarray(episode.chunk_rewards, dtype=float)
        mag = abs(r) if r != 0 else (float(np.max(np.abs(cr))) if cr.size else 0.0)
        if not math.isfinite(mag) or mag == 0:
            return False
        mag = min(1.0, mag)
        if len(episode.shown_ids) > MAX_SHOWN:
            episode = episode.keeping(np.arange(len(episode.shown_ids)) < MAX_SHOWN)
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
        return [ep for ep, _, _, _ in self._draw(n)]

    def sample_weighted(self, n: int | None = None) -> list[tuple[Episode, float]]:
        """As :meth:`sample` (the same draws), each episode with its importance-sampling weight.

        The weight undoes the share of the episode's chance of being drawn that its reward's size gave (a
        ``beta``-th of it) and keeps the age decay's: the age-decayed priority times ``|reward| ** -beta``, over
        the chance that the episode is in the batch (its inclusion probability, which :meth:`sample` draws by
        exactly). In a large buffer that chance is in proportion to the priority, and the weight to
        ``|reward| ** -beta``; where the batch takes nearly every episode held, each is in it whatever its
        reward, and the weights follow the age decay alone (until 2026-12-06 they were ``|reward| ** -beta``
        there too: three episodes held, a reformulation replayed at five times a thumbs up). The weights are
        self-normalised, averaging 1 over the batch, so that a batch weighs as much in all as one without the
        correction. With ``beta`` 0 every weight is 1.

        >>> from rlfb.policies.base import Decision, Episode
        >>> buf = PrioritizedReplay(capacity=10, batch_size=2, beta=1.0, seed=0)
        >>> for i, r in enumerate((1.0, 0.25)):
        ...     _ = buf.add(Episode(f"e{i}", "q", ("a",), Decision({"a": 1.0}), ("c",), np.ones((1, 1)),
        ...                         np.ones(1), r))
        >>> sorted((e.event_id, round(w, 4)) for e, w in buf.sample_weighted())  # both drawn: by age alone
        [('e0', 0.9998), ('e1', 1.0002)]
        >>> buf = PrioritizedReplay(capacity=10, batch_size=1, beta=1.0, seed=0)
        >>> for i, r in enumerate((1.0, 0.25)):
        ...     _ = buf.add(Episode(f"e{i}", "q", ("a",), Decision({"a": 1.0}), ("c",), np.ones((1, 1)),
        ...                         np.ones(1), r))
        >>> [(e.event_id, w) for e, w in buf.sample_weighted()]  # one of the two: a batch of one weighs 1
        [('e0', 1.0)]
        """
        drawn = self._draw(n)
        if self.hyper.beta == 0 or not drawn:
            return [(ep, 1.0) for ep, _, _, _ in drawn]
        w = np.array([pr * mag ** -self.hyper.beta / incl for _, mag, pr, incl in drawn])
        w *= len(w) / w.sum()
        return [(ep, float(x)) for (ep, _, _, _), x in zip(drawn, w, strict=True)]

    def _draw(self, n: int | None) -> list[tuple[Episode, float, float, float]]:
        """Up to ``n`` (default ``batch_size``) distinct held episodes, each with its ``|reward|``, priority and
        inclusion probability: drawn by priority without replacement, by systematic sampling in a random order,
        whose inclusion probabilities are known exactly (``min(1, c * priority)``, summing to the batch size)."""
        n = self.hyper.batch_size if n is None else check_int("n", n, 0)
        if not self._items or n == 0:
            return []
        p = self.priorities()
        idx, incl = _systematic_pps(p, min(n, int(np.count_nonzero(p))), self._rng)
        return [(*self._items[int(i)][:2], float(p[i]), float(incl[i])) for i in idx]

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
        """The buffer's settings, counter and generator, and its newest ``persist`` episodes column by column (see
        :func:`episode_columns`; a non-finite number raises :class:`NonFiniteValueError`).

        >>> buf = PrioritizedReplay(capacity=10, batch_size=2, seed=0)
        >>> buf.add(Episode("e1", "q", ("a",), Decision({"a": 1.0}), ("c",), np.ones((1, 1)), np.ones(1), 1.0))
        True
        >>> state = buf.state_dict()
        >>> state["episodes"]["event_ids"], state["episodes"]["shown_ids"], state["episodes"]["shown"]
        (['e1'], ['c'], 'AAAAAAAA8D8=')
        >>> [e.event_id for e in PrioritizedReplay().load_state_dict(state).sample()]
        ['e1']
        """
        keep = list(self._items)[-self.hyper.persist :] if self.hyper.persist else []
        return {
            "params": asdict(self.hyper),
            "added": self._added,
            "rng": rng_state(self._rng),
            # replays feed the policy update, which does not read the query embedding: leave it out
            "episodes": episode_columns([e for e, _, _ in keep], [m for _, m, _ in keep], [i for _, _, i in keep]),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> PrioritizedReplay:
        """Restore what :meth:`state_dict` saved, or the layout saved before 2026-12-05 (a dict per episode); on
        any damage raise :class:`CorruptStateError` and change nothing."""
        try:
            if "episodes" in state:
                items = episodes_from_columns(state["episodes"], self.hyper.capacity)
            else:  # saved before 2026-12-05: a dict per episode, its numbers JSON lists
                items = [
                    (episode_from_dict(it["episode"]), float(it["mag"]), int(it["i"])) for it in state["items"]
                ]
            # a long question of a state saved before it was known by its hash (2026-12-05) is re-keyed
            items = [(_keyed(e), min(1.0, m), i) for e, m, i in items]
            added = saved_count("the replay buffer's count of episodes added", state["added"])
            # counts below 0 loaded here and were refused once saved again in columns
            if any(not math.isfinite(m) or m <= 0 or not 0 <= i < added for _, m, i in items):
                raise CorruptStateError("replay buffer entries are malformed")
            # last, once all else is known good: a refused state left the generator moved (found by the tests of
            # the column layout)
            set_rng_state(self._rng, state["rng"])
        except CorruptStateError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise CorruptStateError(f"cannot read the replay buffer: {exc!r}") from exc
        self._items = deque(items, maxlen=self.hyper.capacity)
        self._added = added
        return self


def _keyed(episode: Episode) -> Episode:
    from rlfb.memory import keyed  # the memory imports the policies, which import this module

    return keyed(episode)


# ---------------------------------------------------------------------------- the saved columns

# the numbers of each episode in the "numbers" block, in this order
_NUMBERS = ("reward", "timestamp", "feedback_time", "propensity", "mag")


def episode_columns(episodes: list[Episode], mags: list[float], added: list[int]) -> dict[str, Any]:
    """Episodes (without their query embeddings), each with its replay priority ``mags`` and the count ``added``
    before it, as JSON-safe columns: texts, ids and flags as JSON lists, one entry per episode (the shown chunk ids
    of all of them in one list, with ``counts`` per episode); every number as a base64 block of little-endian
    float64, the same to the last bit. A set of names (retrievers, weight or feature keys) is written once in
    ``names`` and referred to by its place. Raises :class:`NonFiniteValueError` for a non-finite number: the
    store refused it in JSON, and hidden in a block it would be written, and every later load refuse it.

    The layout saved before 2026-12-05 had a dict per episode (:func:`episode_to_dict`), its numbers JSON lists:
    0.27 MB for 200 episodes, rebuilt and encoded after every feedback.
    """
    names: dict[tuple[str, ...], int] = {}

    def place(keys: Any) -> int:
        return names.setdefault(tuple(keys), len(names))

    decisions = [e.decision for e in episodes]
    scored = [j for j, e in enumerate(episodes) if e.scores is not None]
    with_prior = [j for j, e in enumerate(episodes) if e.prior_rewards is not None]
    tempered = [j for j, d in enumerate(decisions) if d.sampling_temperature is not None]
    rankings = [d.ranking for d in decisions]

    def block(arrays: Any) -> np.ndarray:
        parts = [np.asarray(a, dtype=np.float64).ravel() for a in arrays]
        return np.concatenate(parts) if parts else np.zeros(0)

    blocks = {
        "numbers": np.array([[e.reward, e.timestamp, e.feedback_time, d.propensity, m]
                             for e, d, m in zip(episodes, decisions, mags, strict=True)], dtype=np.float64),
        "weights": np.fromiter(itertools.chain.from_iterable(dict(d.weights).values() for d in decisions),
                               dtype=np.float64),
        "features": np.fromiter(itertools.chain.from_iterable(dict(e.features).values() for e in episodes),
                                dtype=np.float64),
        "shown": block(e.shown for e in episodes),
        "chunk_rewards": block(e.chunk_rewards for e in episodes),
        "scores": block(episodes[j].scores for j in scored),
        "prior_rewards": block(episodes[j].prior_rewards for j in with_prior),
        "temperatures": np.array([decisions[j].sampling_temperature for j in tempered], dtype=np.float64),
    }
    for key, arr in blocks.items():
        if not np.all(np.isfinite(arr)):
            raise NonFiniteValueError(f"a replayed episode holds a non-finite number ({key})")
    out: dict[str, Any] = {
        "event_ids": [str(e.event_id) for e in episodes],
        "queries": [str(e.query) for e in episodes],
        "query_types": [str(e.query_type) for e in episodes],
        "retrievers": [place(e.retrievers) for e in episodes],
        "weight_keys": [place(dict(d.weights)) for d in decisions],
        "feature_keys": [place(dict(e.features)) for e in episodes],
        "arms": [None if d.arm is None else str(d.arm) for d in decisions],
        "policies": [str(d.policy) for d in decisions],
        "explored": [bool(d.explored) for d in decisions],
        "response_level": [bool(e.response_level) for e in episodes],
        "added": list(added),
        "counts": [len(e.shown_ids) for e in episodes],
        "shown_ids": [str(c) for e in episodes for c in e.shown_ids],
        # each episode's sampled ranking: its length (-1 for none), then all of them in one list
        "ranking_lengths": [-1 if r is None else len(r) for r in rankings],
        "rankings": [int(i) for r in rankings if r is not None for i in r],
        "scored": scored,
        "with_prior": with_prior,
        "tempered": tempered,
    }
    out["names"] = [[str(x) for x in t] for t in names]
    out.update({key: encode_block(arr) for key, arr in blocks.items()})
    return out


def _strings(cols: Mapping[str, Any], key: str, n: int | None, *, none: bool = False) -> list[Any]:
    v = cols[key]
    if (not isinstance(v, list) or (n is not None and len(v) != n)
            or not all(isinstance(x, str) or (none and x is None) for x in v)):
        raise CorruptStateError(f"the replay buffer's {key} are malformed")
    return v


def _ints(cols: Mapping[str, Any], key: str, n: int | None, lo: int = 0, hi: int | None = None) -> list[int]:
    v = cols[key]
    if (not isinstance(v, list) or (n is not None and len(v) != n)
            or not all(type(x) is int and x >= lo and (hi is None or x < hi) for x in v)):
        raise CorruptStateError(f"the replay buffer's {key} are malformed")
    return v


def _subset(cols: Mapping[str, Any], key: str, n: int) -> list[int]:
    """Episode numbers in increasing order, each below ``n``."""
    v = _ints(cols, key, None, 0, n)
    if any(a >= b for a, b in itertools.pairwise(v)):
        raise CorruptStateError(f"the replay buffer's {key} are malformed")
    return v


_OWNER = "the replay buffer's"  # what a damaged block's error names


def _starts(lengths: list[int]) -> list[int]:
    return [0, *itertools.accumulate(lengths)]


def _pieces(block: np.ndarray, which: list[int], counts: list[int]) -> dict[int, np.ndarray]:
    """Episode ``j`` in ``which`` -> its ``counts[j]`` numbers of ``block``, which holds them one after the other."""
    at = _starts([counts[j] for j in which])
    return {j: block[at[k]:at[k + 1]] for k, j in enumerate(which)}


def episodes_from_columns(cols: Mapping[str, Any], limit: int | None = None) -> list[tuple[Episode, float, int]]:
    """The episodes, priorities and counts :func:`episode_columns` wrote, checked: damage raises
    :class:`CorruptStateError`. ``limit``: the most episodes a buffer holds (its capacity); of more, the newest
    ``limit`` are built (a learner of a smaller capacity shares another's snapshots, as its memory does)."""
    if not isinstance(cols, Mapping):
        raise CorruptStateError("the replay buffer's episodes are not a mapping")
    event_ids = _strings(cols, "event_ids", None)
    n = len(event_ids)
    queries, query_types = _strings(cols, "queries", n), _strings(cols, "query_types", n)
    arms, policies = _strings(cols, "arms", n, none=True), _strings(cols, "policies", n)
    names = cols["names"]
    if not isinstance(names, list) or not all(
            isinstance(t, list) and all(isinstance(x, str) for x in t) for t in names):
        raise CorruptStateError("the replay buffer's names are malformed")
    # one tuple per entry, shared by the episodes that name it: built per episode, 16,000 episodes naming one
    # entry of 5,000 names took 642 MB before a block was checked
    tables = [tuple(t) for t in names]
    twice = {j for j, t in enumerate(tables) if len(set(t)) != len(t)}
    retrievers = [tables[j] for j in _ints(cols, "retrievers", n, 0, len(names))]
    weight_places = _ints(cols, "weight_keys", n, 0, len(names))
    feature_places = _ints(cols, "feature_keys", n, 0, len(names))
    if twice & {*weight_places, *feature_places}:
        raise CorruptStateError("the replay buffer names a weight or feature twice for one episode")
    weight_keys = [tables[j] for j in weight_places]
    feature_keys = [tables[j] for j in feature_places]
    flags = {}
    for key in ("explored", "response_level"):
        v = cols[key]
        if not isinstance(v, list) or len(v) != n or not all(isinstance(x, bool) for x in v):
            raise CorruptStateError(f"the replay buffer's {key} are malformed")
        flags[key] = v
    added = _ints(cols, "added", n)
    counts = _ints(cols, "counts", n)
    shown_ids = _strings(cols, "shown_ids", sum(counts))
    lengths = _ints(cols, "ranking_lengths", n, -1)
    flat_rankings = _ints(cols, "rankings", sum(x for x in lengths if x > 0))
    scored, with_prior, tempered = (_subset(cols, k, n) for k in ("scored", "with_prior", "tempered"))

    def block(key: str, size: int) -> np.ndarray:
        return decode_block(cols, key, size, owner=_OWNER)

    numbers = block("numbers", len(_NUMBERS) * n).reshape(n, len(_NUMBERS)).tolist()
    weights = block("weights", sum(map(len, weight_keys))).tolist()
    features = block("features", sum(map(len, feature_keys))).tolist()
    shown = block("shown", sum(c * len(r) for c, r in zip(counts, retrievers, strict=True)))
    rewards = block("chunk_rewards", sum(counts))
    scores = block("scores", sum(counts[j] for j in scored))
    prior = block("prior_rewards", sum(counts[j] for j in with_prior))
    temps = block("temperatures", len(tempered)).tolist()

    id_at, shown_at = _starts(counts), _starts([c * len(r) for c, r in zip(counts, retrievers, strict=True)])
    w_at, f_at = _starts(list(map(len, weight_keys))), _starts(list(map(len, feature_keys)))
    r_at = _starts([max(x, 0) for x in lengths])
    score_of, prior_of = _pieces(scores, scored, counts), _pieces(prior, with_prior, counts)
    temp_of = dict(zip(tempered, temps, strict=True))
    out = []
    for j in range(n if limit is None else max(0, n - limit), n):
        a, b = id_at[j], id_at[j + 1]
        reward, timestamp, feedback_time, propensity, mag = numbers[j]
        ep = Episode(
            event_id=event_ids[j],
            query=queries[j],
            retrievers=retrievers[j],
            decision=Decision(
                weights=dict(zip(weight_keys[j], weights[w_at[j]:w_at[j + 1]], strict=True)),
                arm=arms[j],
                propensity=propensity,
                explored=flags["explored"][j],
                policy=policies[j],
                ranking=None if lengths[j] < 0 else tuple(flat_rankings[r_at[j]:r_at[j + 1]]),
                sampling_temperature=temp_of.get(j),
            ),
            shown_ids=tuple(shown_ids[a:b]),
            shown=shown[shown_at[j]:shown_at[j + 1]].reshape(b - a, len(retrievers[j])),
            chunk_rewards=rewards[a:b],
            reward=reward,
            query_type=query_types[j],
            features=dict(zip(feature_keys[j], features[f_at[j]:f_at[j + 1]], strict=True)),
            timestamp=timestamp,
            feedback_time=feedback_time,
            query_embedding=None,
            scores=score_of.get(j),
            prior_rewards=prior_of.get(j),
            response_level=flags["response_level"][j],
        )
        out.append((ep, mag, added[j]))
    return out
