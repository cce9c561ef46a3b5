"""Relevance feedback: chunks like the ones a user clicked for a question rank higher when it is asked again.

A cascade user reads from the top and usually stops at the first chunk that
answers; each asking of a question therefore shows the feedback memory about
one good chunk, and the question's other relevant chunks, unread, keep their
place. But relevant chunks of one question are much alike. Rocchio's relevance
feedback (1971) moves the question toward the chunks judged relevant; here,
over the candidates of a question asked before, each candidate is scored by
its cosine similarity to the centroid of the chunks the memory holds positive
evidence for (weighted by that evidence), standardised over the candidates.

Only positive evidence is used: chunks passed over are unlike the question in
ways a centroid of them does not capture (a negative term, tried as Rocchio's
``gamma``, cost cranfield more than it gave). The learner weighs it by
``LearnerConfig.relevance_feedback_weight``, off by default: at 0.1,
navigational user, thompson, about 3 asks of each stream question, seen-question
nDCG@10 rose 0.518 → 0.545 on cranfield and 0.524 → 0.547 on cisi (20 seeds),
but the weights learn from fewer clicks (README, "Relevance feedback").

>>> v = np.array([[1.0, 0.0], [0.9, 0.436], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
>>> similar_to_clicked(v, np.array([1.0, 0.0, 0.0, 0.0])).round(2).tolist()
[0.96, 0.71, -1.6, -0.06]
>>> similar_to_clicked(v, np.zeros(4)).tolist()  # nothing clicked: no change
[0.0, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

import numpy as np

__all__ = ["MIN_SPREAD", "similar_to_clicked"]


# The cosine spread below which differences between candidates are not blown up to a whole standard deviation:
# over the candidates of a scifact, cranfield or cisi question, the cosines to one relevant chunk spread by
# 0.085 at least (0.12-0.13 at the median), so this floor binds only on small pools (a re-ranker given a few
# nodes), where two near-duplicates of a clicked chunk would otherwise be one standard deviation apart.
MIN_SPREAD = 0.05


def similar_to_clicked(vectors: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Each row of ``vectors``' cosine similarity to the ``weights``-weighted centroid of the rows, as a z-score
    over the rows that have a vector (their spread taken as at least :data:`MIN_SPREAD`).

    ``vectors``: ``(n, dim)`` normalised embeddings of the candidates; a zero row is a candidate without one (a
    chunk outside the index, or given with another text than the indexed one), which gets 0: neither lifted
    nor pushed down. ``weights``: ``(n,)``, the positive evidence for each candidate (negative entries count as
    zero). All zeros where no candidate with a vector has positive weight.

    >>> a, b = [1.0, 0.0], [0.9995, 0.0316]
    >>> similar_to_clicked(np.array([a, b]), np.array([1.0, 0.0])).round(2).tolist()  # near-duplicates: near 0
    [0.01, -0.01]
    >>> similar_to_clicked(np.array([a, [0.0, 0.0], [0.0, 1.0]]), np.array([1.0, 0.0, 0.0])).round(2).tolist()
    [1.0, 0.0, -1.0]
    """
    V = np.asarray(vectors, dtype=np.float64)
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    n = w.shape[0]
    out = np.zeros(n)
    if n == 0:
        return out
    has = np.any(V != 0.0, axis=1)
    w = np.where(has, w, 0.0)
    if not np.any(w > 0) or int(has.sum()) < 2:
        return out
    centroid = w @ V
    norm = float(np.linalg.norm(centroid))
    if not np.isfinite(norm) or norm < 1e-12:
        return out
    sims = V[has] @ (centroid / norm)
    out[has] = (sims - sims.mean()) / max(float(sims.std()), MIN_SPREAD)
    return out
