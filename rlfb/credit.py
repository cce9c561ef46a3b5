"""How one feedback's rewards are read as evidence about each chunk shown.

A cascade user reads top-down, so a chunk passed over above a click is read as skipped; praise of a whole answer
is shared among the chunks it was written from; gains that are all alike rank nothing.
"""

from __future__ import annotations

import numpy as np

__all__ = ["chunk_evidence", "shared_credit", "ranks_nothing"]


def chunk_evidence(
    rewards: np.ndarray,
    episode_reward: float,
    skip_weight: float,
    abandon_weight: float,
    prior: np.ndarray | None = None,
    *,
    response_level: bool = True,
    used: np.ndarray | None = None,
) -> np.ndarray:
    """Per-shown-chunk evidence for confidences and memory, from one piece of feedback.

    A rewarded chunk keeps its reward. An unrewarded chunk shown above a
    positive one was read and passed over (a cascade user reads top-down):
    it gets ``-skip_weight``. When nothing was rewarded and a response-level
    reward is negative, every shown chunk gets ``abandon_weight * reward``
    (a reformulation, -0.2, is weaker evidence than a thumbs down, -1); a
    negative on one chunk (``response_level=False``) says nothing of the others.

    Feedback on one event arrives one signal at a time. ``prior`` holds the
    rewards earlier feedback on the same event gave each shown chunk: a chunk
    rewarded before is never read as skipped, and chunks above an earlier
    click were already counted as skipped then, so they are not counted twice.
    A chunk above an earlier click, counted as skipped then, keeps that skip
    when it is clicked later, so its evidence depends on the order the two
    clicks arrive in (see docs/limitations.md).

    >>> chunk_evidence(np.array([0.0, 0.4, 0.0]), 0.4, 0.2, 0.5).tolist()
    [-0.2, 0.4, 0.0]
    >>> chunk_evidence(np.array([0.0, 0.0]), -1.0, 0.2, 0.5).tolist()
    [-0.5, -0.5]
    >>> chunk_evidence(np.array([0.0, -1.0]), -1.0, 0.2, 0.5, response_level=False).tolist()
    [0.0, -1.0]

    ``used`` marks the chunks the answer was written from (``None``: all): praise of the answer reads none
    of the others as passed over (a chunk a later step cut before the answer was never seen), so a thumbs
    up spread over ranks 2 and 3 does not count an unused rank 1 as skipped.

    >>> chunk_evidence(np.array([0.0, 1.0, 1.0]), 1.0, 0.2, 0.5, used=np.array([False, True, True])).tolist()
    [0.0, 1.0, 1.0]

    A second click at rank 4, after a first at rank 2: only rank 3 is newly skipped.

    >>> chunk_evidence(np.array([0.0, 0.0, 0.0, 0.4]), 0.4, 0.2, 0.5, prior=np.array([0.0, 0.4, 0.0, 0.0])).tolist()
    [0.0, 0.0, -0.2, 0.4]
    """
    r = np.asarray(rewards, dtype=float).copy()
    before = np.zeros_like(r) if prior is None else np.asarray(prior, dtype=float)
    total = before + r
    pos = np.flatnonzero(total > 0)
    if pos.size:
        earlier = np.flatnonzero(before > 0)
        start = int(earlier[-1]) if earlier.size else 0
        skipped = np.zeros(r.shape[0], dtype=bool)
        skipped[start : int(pos[-1])] = True
        if response_level and used is not None:
            skipped &= np.asarray(used, dtype=bool)
        r[skipped & (total == 0)] = -skip_weight
    elif response_level and episode_reward < 0:
        r[r == 0] = abandon_weight * max(-1.0, episode_reward)
    return r


def shared_credit(evidence: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    """``evidence`` with the praise of a whole response shared among the chunks it went to.

    One signal that rewards several chunks at once (a thumbs up or a rating on
    the answer, spread over the chunks that were used) says that at least one of
    them helped, not that each did, so each gets ``1/n`` of its positive
    evidence. A click rewards one chunk, and criticism of the answer (nothing in
    it helped) holds for each chunk: both are left whole.

    >>> shared_credit(np.array([1.0, 1.0, 1.0, 1.0]), np.array([1.0, 1.0, 1.0, 1.0])).tolist()
    [0.25, 0.25, 0.25, 0.25]
    >>> shared_credit(np.array([-0.3, 0.4, 0.0]), np.array([0.0, 0.4, 0.0])).tolist()
    [-0.3, 0.4, 0.0]
    >>> shared_credit(np.array([-1.0, -1.0]), np.array([-1.0, -1.0])).tolist()
    [-1.0, -1.0]
    """
    ev = np.asarray(evidence, dtype=float)
    n = int(np.count_nonzero(np.asarray(rewards, dtype=float) > 0))
    if n <= 1:
        return ev
    return np.where(ev > 0, ev / n, ev)


def ranks_nothing(gains: np.ndarray) -> bool:
    """Whether ``gains`` (one per shown chunk) are all alike: praise of an answer spread over every shown chunk,
    under which no order of those chunks is better than another, so a comparison of rankings learns nothing.

    >>> ranks_nothing(np.array([0.25, 0.25, 0.25])), ranks_nothing(np.array([0.0, 0.4, 0.0]))
    (True, False)
    """
    g = np.asarray(gains, dtype=float)
    return g.size > 0 and bool(np.all(g == g[0]))
