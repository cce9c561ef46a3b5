"""The fixed systems a run measures the learned one against, on the same contexts: each retriever alone, equal
min-max weights, RRF, weights tuned by grid search on the stream questions with full judgments, the oracle best
fixed weights (a grid search on the held-out questions themselves) and the per-query oracle of fusion."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfb.fusion import normalize
from rlfb.policies.base import Context
from rlfb.simulation.config import SimulationConfig, metric_keys

if TYPE_CHECKING:
    from rlfb.simulation.runner import Prepared

__all__ = ["simplex_grid", "Judge", "fixed_baselines", "untuned_ndcg", "UNTUNED"]


def simplex_grid(n: int, step: float = 0.1) -> np.ndarray:
    """Every weight vector on the simplex with the given step (66 points for n=3, step 0.1).

    >>> simplex_grid(2, 0.5).tolist()
    [[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]]
    """
    m = round(1 / step)
    points = [c for c in itertools.product(range(m + 1), repeat=n) if sum(c) == m]
    return np.array(points, dtype=np.float64) / m


class Judge:
    """nDCG@k of many rankings of one query's candidates at once (vectorised over weight vectors)."""

    def __init__(self, ctx: Context, qrel: Mapping[str, float], k: int) -> None:
        self.k = k
        self.gains = np.array([max(qrel.get(c, 0), 0) for c in ctx.candidate_ids], dtype=np.float64)
        # tied scores in trec_eval's order (document id descending), as rlfb.metrics ranks a run: in candidate
        # order, bm25 alone on cisi read 0.3409 where pytrec_eval gives 0.3422
        ids = list(ctx.candidate_ids)
        self.tie_order = np.array(sorted(range(len(ids)), key=ids.__getitem__, reverse=True), dtype=np.int64)
        ideal = sorted((g for g in qrel.values() if g > 0), reverse=True)[:k]
        self.disc = 1.0 / np.log2(np.arange(2, k + 2))
        self.ideal = float(np.dot(ideal, self.disc[: len(ideal)]))

    def ndcg(self, scores: np.ndarray) -> np.ndarray:
        """nDCG of ranking by each column of ``scores`` (n_candidates, m) -> (m,), ties as trec_eval breaks them."""
        if self.ideal == 0:
            return np.zeros(scores.shape[1])
        kk = min(self.k, scores.shape[0])
        order = self.tie_order[np.argsort(-scores[self.tie_order], axis=0, kind="stable")[:kk]]
        return (self.gains[order] * self.disc[:kk, None]).sum(axis=0) / self.ideal

    def ndcg_of(self, scores: np.ndarray) -> float:
        """nDCG of ranking by one score per candidate, ties as trec_eval breaks them (as :meth:`ndcg`)."""
        return float(self.ndcg(np.asarray(scores, dtype=np.float64)[:, None])[0])

    def ndcg_order(self, order: np.ndarray) -> float:
        """nDCG of the candidates in this order, as shown (no re-sorting)."""
        if self.ideal == 0:
            return 0.0
        kk = min(self.k, len(order))
        return float(np.dot(self.gains[np.asarray(order[:kk], dtype=np.int64)], self.disc[:kk]) / self.ideal)


def fixed_baselines(
    prep: Prepared,
    config: SimulationConfig,
    stream: Sequence[str],
    heldout: Sequence[str],
    judges: Mapping[str, Judge],
    seen_sample: Sequence[str],
    asked: Mapping[str, int],
    per_heldout: dict[str, np.ndarray] | None = None,
) -> dict[str, dict[str, float]]:
    """Every fixed system's figures, on the same queries as the learned ones: held-out on ``heldout``,
    seen on ``seen_sample`` (the stream queries the learned seen figure was measured on) and online
    over the stream as it was asked (each query weighted by its asks). Tuned weights are chosen on all
    of ``stream`` with full judgments. ``per_heldout``, if given, receives the per-query held-out nDCG of
    ``equal``, ``rrf``, ``tuned_fixed`` and ``oracle_fixed``."""
    names = list(prep.contexts[heldout[0]].retrievers)
    grid = simplex_grid(len(names), config.grid_step)
    equal = np.full(len(names), 1.0 / len(names))
    if not np.any(np.all(np.isclose(grid, equal), axis=1)):
        # equal weights, the learner's default, are a fixed system too: a grid of step 0.1 lacks them, and the
        # "tuned" weights fell below equal weights on their own tuning questions (cisi seeds 1 and 8)
        grid = np.vstack([grid, equal])
    # the grid searches min-max and RRF, and the learner's own fusion when it is another (z-score): a
    # tuned baseline must have had the learner's fusion to choose from
    modes = tuple(dict.fromkeys(("minmax", "rrf", config.fusion)))

    def per_query(qids: Sequence[str]) -> dict[str, np.ndarray]:
        out: dict[str, list] = {n: [] for n in names}
        out.update(equal=[], rrf=[], **{f"grid_{m}": [] for m in modes})
        for q in qids:
            ctx, judge = prep.contexts[q], judges[q]
            for j, n in enumerate(names):
                out[n].append(judge.ndcg(ctx.raw[:, [j]])[0])
            fused = {m: normalize(ctx.raw, m, ranks=ctx.ranks if m == "rrf" else None) for m in modes}
            for name, value in _untuned(judge, fused["minmax"], fused["rrf"]).items():
                out[name].append(value)
            for m in modes:
                out[f"grid_{m}"].append(judge.ndcg(fused[m] @ grid.T))
        return {key: np.array(v) for key, v in out.items()}

    held = per_query(heldout)
    tune = per_query(stream)
    row = {q: i for i, q in enumerate(stream)}
    seen_rows = np.array([row[q] for q in seen_sample], dtype=np.int64)
    asks = np.array([asked.get(q, 0) for q in stream], dtype=float)
    share = asks / asks.sum() if asks.sum() > 0 else np.full(len(stream), 1.0 / len(stream))

    held_key, seen_key, online_key = metric_keys(config.k)

    def figures(on_heldout: np.ndarray, on_stream: np.ndarray) -> dict[str, float]:
        """The three figures of one fixed system from its per-query nDCG on each query set."""
        return {
            held_key: float(on_heldout.mean()),
            seen_key: float(on_stream[seen_rows].mean()) if seen_rows.size else float("nan"),
            online_key: float(share @ on_stream),
        }

    result: dict[str, dict[str, Any]] = {key: figures(held[key], tune[key]) for key in [*names, "equal", "rrf"]}

    def best_fixed(chosen_on: dict[str, np.ndarray], name: str) -> dict[str, Any]:
        """The grid weights (any fusion mode) with the best mean on ``chosen_on``, scored on both sets."""
        mode, best = max(
            ((m, int(chosen_on[f"grid_{m}"].mean(axis=0).argmax())) for m in modes),
            key=lambda mb: chosen_on[f"grid_{mb[0]}"].mean(axis=0)[mb[1]],
        )
        if per_heldout is not None:
            per_heldout[name] = held[f"grid_{mode}"][:, best]
        return {
            **figures(held[f"grid_{mode}"][:, best], tune[f"grid_{mode}"][:, best]),
            "weights": dict(zip(names, grid[best].tolist(), strict=True)),
            "fusion": mode,
        }

    def per_query_oracle(d: dict[str, np.ndarray]) -> np.ndarray:
        return np.max([d[f"grid_{m}"].max(axis=1) for m in modes], axis=0)

    if per_heldout is not None:
        per_heldout.update(equal=held["equal"], rrf=held["rrf"])
    # tuned on the stream queries with full judgments: offline tuning
    result["tuned_fixed"] = best_fixed(tune, "tuned_fixed")
    result["oracle_fixed"] = best_fixed(held, "oracle_fixed")  # chosen on the held-out queries: an upper bound
    result["per_query_oracle"] = figures(per_query_oracle(held), per_query_oracle(tune))
    return result


#: the fixed systems that need no tuning, whose seen and online figures every checkpoint of a run measures too,
#: on the questions of that checkpoint (the learned curve's own)
UNTUNED = ("rrf", "equal")


def untuned_ndcg(prep: Prepared, qids: Sequence[str], judges: Mapping[str, Judge]) -> dict[str, dict[str, float]]:
    """Each of :data:`UNTUNED`'s nDCG@k on each of ``qids``, as :func:`fixed_baselines` scores them."""
    out: dict[str, dict[str, float]] = {name: {} for name in UNTUNED}
    for q in qids:
        ctx = prep.contexts[q]
        untuned = _untuned(judges[q], normalize(ctx.raw, "minmax"), normalize(ctx.raw, "rrf", ranks=ctx.ranks))
        for name, value in untuned.items():
            out[name][q] = value
    return out


def _untuned(judge: Judge, minmax: np.ndarray, rrf: np.ndarray) -> dict[str, float]:
    """Equal weights' and RRF's nDCG@k of one question, from its candidates' min-max and RRF scores."""
    equal = np.full(minmax.shape[1], 1.0 / minmax.shape[1])
    return {"equal": float(judge.ndcg((minmax @ equal)[:, None])[0]),
            "rrf": float(judge.ndcg((rrf @ equal)[:, None])[0])}
