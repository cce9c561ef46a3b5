"""A deterministic toy world for the learner tests and benchmarks.

Three retrievers and two query types: for type ``A`` retriever ``r0`` ranks
the relevant chunks high, for type ``B`` retriever ``r2`` does (``best``
changes that); ``r1`` is weakly informative for both and the remaining one is
noise. Users are cascade-like and seeded: they read top-down, click a
relevant chunk with probability 0.9 (stopping afterwards with probability
0.7) and a non-relevant one with probability 0.05. A clicked chunk gets a
chunk reward of 0.5; the episode's reward is the discounted gain of the
first relevant click (1 at rank 1), or -0.2 when nothing relevant was clicked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rlfb.policies.base import Context, Episode

RETRIEVERS = ("r0", "r1", "r2")


@dataclass
class ToyQuery:
    text: str
    qtype: str
    ids: tuple[str, ...]
    normalized: np.ndarray
    relevant: np.ndarray  # bool per candidate
    embedding: np.ndarray


class ToyEnv:
    def __init__(
        self,
        n_queries: int = 40,
        n_candidates: int = 60,
        n_relevant: int = 3,
        *,
        best: Mapping[str, int | None] | None = None,
        seed: int = 0,
        dim: int = 16,
    ) -> None:
        best = dict(best or {"A": 0, "B": 2})
        rng = np.random.default_rng(seed)
        self.queries: list[ToyQuery] = []
        for q in range(n_queries):
            qtype = "A" if q % 2 == 0 else "B"
            rel = np.zeros(n_candidates, dtype=bool)
            rel[rng.choice(n_candidates, n_relevant, replace=False)] = True
            N = np.empty((n_candidates, 3))
            good = best[qtype]
            for j in range(3):
                if good is None:  # a null world: every retriever equally (weakly) informative
                    lo_rel, hi_rel = 0.2, 0.9
                elif j == good:
                    lo_rel, hi_rel = 0.55, 1.0
                elif j == 1:
                    lo_rel, hi_rel = 0.2, 0.9
                else:
                    lo_rel, hi_rel = 0.0, 0.8
                rel_scores = rng.uniform(lo_rel, hi_rel, n_candidates)
                N[:, j] = np.where(rel, rel_scores, rng.uniform(0.0, 0.8, n_candidates))
            emb = rng.standard_normal(dim)
            self.queries.append(
                ToyQuery(
                    text=f"query {q} {'what is' if qtype == 'B' else 'code'}",
                    qtype=qtype,
                    ids=tuple(f"q{q}-d{i}" for i in range(n_candidates)),
                    normalized=N,
                    relevant=rel,
                    embedding=emb / np.linalg.norm(emb),
                )
            )

    def context(self, q: int) -> Context:
        tq = self.queries[q]
        return Context(
            query=tq.text,
            retrievers=RETRIEVERS,
            candidate_ids=tq.ids,
            raw=tq.normalized,
            normalized=tq.normalized,
            features={},
            query_type=tq.qtype,
            query_embedding=tq.embedding,
        )

    def clicks(self, q: int, order: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        rel = self.queries[q].relevant[order]
        out = np.zeros(len(order))
        for i, r in enumerate(rel):
            if rng.random() < (0.9 if r else 0.05):
                out[i] = 0.5
                if r and rng.random() < 0.7:
                    break
        return out

    def episode(
        self, q: int, ranking, rng: np.random.Generator, t: float = 0.0, event_id: str = "e"
    ) -> Episode:
        tq = self.queries[q]
        order = np.asarray(ranking.order)
        clicks = self.clicks(q, order, rng)
        rel_clicked = np.flatnonzero((clicks > 0) & tq.relevant[order])
        reward = float(1.0 / np.log2(rel_clicked[0] + 2)) if rel_clicked.size else -0.2
        return Episode(
            event_id=event_id,
            query=tq.text,
            retrievers=RETRIEVERS,
            decision=ranking.decision,
            shown_ids=tuple(tq.ids[int(i)] for i in order),
            shown=tq.normalized[order],
            chunk_rewards=clicks,
            reward=reward,
            query_type=tq.qtype,
            timestamp=t,
            feedback_time=t,
            query_embedding=tq.embedding,
        )

    def ndcg(self, q: int, order: np.ndarray, k: int = 10) -> float:
        rel = self.queries[q].relevant
        gains = rel[np.asarray(order)[:k]].astype(float)
        disc = 1.0 / np.log2(np.arange(2, gains.shape[0] + 2))
        ideal = np.sort(rel.astype(float))[::-1][:k]
        return float(gains @ disc / (ideal @ disc[: ideal.shape[0]]))

    def heldout_ndcg(self, weights: Mapping[str, float], qtype: str | None = None, k: int = 10) -> float:
        w = np.array([weights[r] for r in RETRIEVERS])
        vals = []
        for q, tq in enumerate(self.queries):
            if qtype is not None and tq.qtype != qtype:
                continue
            vals.append(self.ndcg(q, np.argsort(-(tq.normalized @ w), kind="stable"), k))
        return float(np.mean(vals))


def simulate(learner, env: ToyEnv, n: int, *, seed: int = 0, k: int = 10, explore: bool = True,
             types: tuple[str, ...] | None = None, t0: float = 0.0, dt: float = 60.0,
             trace: list | None = None) -> list[float]:
    """Run ``n`` interactions; returns the online nDCG@k of each shown list."""
    rng = np.random.default_rng(seed)
    qs = [q for q, tq in enumerate(env.queries) if types is None or tq.qtype in types]
    out = []
    for i in range(n):
        q = qs[int(rng.integers(len(qs)))]
        ranking = learner.rank(env.context(q), k, explore=explore)
        out.append(env.ndcg(q, ranking.order, k))
        t = t0 + dt * (i + 1)
        learner.learn(env.episode(q, ranking, rng, t=t, event_id=f"e{i}"))
        if trace is not None:
            trace.append(learner.weights())
    return out
