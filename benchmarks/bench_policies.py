"""Cost of one decision and one update per policy, and convergence on the toy world.

Run from the repository root::

    python benchmarks/bench_policies.py            # full run
    python benchmarks/bench_policies.py --quick    # fewer repetitions

Part 1 times the normalisation of the candidates' raw scores plus ``Learner.rank``
(one decision: policy, confidence, memory, fusion, exploration), since the peer computes its
rank scores inside its timed call too, and ``Learner.learn`` (one update: policy, confidence,
memory, replay, guardrail) at 100 candidates and 3 retrievers, with the default
``LearnerConfig`` and a learner warmed up on 300 interactions. It reports the
median and 90th percentile over many repetitions; the target is under 1 ms each.

Its peer, timed in the same run on the same candidates: LangChain's ``EnsembleRetriever`` fusion with fixed
equal weights (``weighted_reciprocal_rank`` over the three retrievers' lists of 100 documents), which learns
nothing. It takes turns with the policy's decision on each repetition, and each policy's decision is printed as
a ratio of the peer's median over that policy's repetitions (the peer's line gives the median over all of
them, and the range of the policies' own).

Part 2 runs each learning policy on the toy world of the tests (type A: ``r0``
is the good retriever) with the weights-only configuration, and reports after
how many interactions its weights stay within 0.05 (max abs) of its final
weights (the mean of the last 200), as the median over seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _bench_args import plural, positive_int  # noqa: E402

from rlfb.fusion import normalize  # noqa: E402
from rlfb.learner import Learner, LearnerConfig  # noqa: E402
from rlfb.policies import POLICIES  # noqa: E402

from _toy_env import RETRIEVERS, ToyEnv, simulate  # noqa: E402

PLAIN = LearnerConfig(memory_weight=0.0, confidence_weight=0.0, exploration="none")


def langchain_fusion(env: ToyEnv) -> Callable[[int], object]:
    """LangChain's weighted RRF fusion with fixed equal weights, as a call on question ``q`` of ``env``: the
    three retrievers' ranked lists of its candidates given to ``EnsembleRetriever.weighted_reciprocal_rank``."""
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    class _Listed(BaseRetriever):  # never called: the fusion is timed on lists given to it
        def _get_relevant_documents(self, query: str, *, run_manager: object) -> list[Document]:
            return []

    fusion = EnsembleRetriever(retrievers=[_Listed() for _ in RETRIEVERS], weights=[1 / len(RETRIEVERS)] * 3,
                               id_key="chunk_id")
    lists = []
    for q in range(len(env.queries)):
        ctx = env.context(q)
        docs = [Document(page_content=c, metadata={"chunk_id": c}) for c in ctx.candidate_ids]
        lists.append([[docs[i] for i in np.argsort(-ctx.raw[:, j], kind="stable")] for j in range(len(RETRIEVERS))])
    return lambda q: fusion.weighted_reciprocal_rank(lists[q])


def time_policy(name: str, reps: int, seed: int = 0) -> tuple[dict[str, float], list[float]]:
    """The policy's decision and update, and the peer's fusion of the same candidates, taking turns on each
    repetition, so that a change of the machine's load falls on both: the policy's figures, and the peer's times
    (ms)."""
    env = ToyEnv(n_queries=50, n_candidates=100, seed=seed)
    learner = Learner(RETRIEVERS, name, LearnerConfig(), seed=seed)
    simulate(learner, env, 300, seed=seed)  # warm: memory, confidences and statistics are populated
    rng = np.random.default_rng(seed + 1)
    contexts = [env.context(q) for q in range(len(env.queries))]
    peer = langchain_fusion(env)
    rank_t, learn_t, rank_c, learn_c, peer_t = [], [], [], [], []
    for i in range(reps):
        q = i % len(contexts)
        t0 = time.perf_counter()
        peer(q)
        peer_t.append((time.perf_counter() - t0) * 1e3)
        c0, t0 = time.thread_time(), time.perf_counter()
        # normalised here, as FeedbackEnsemble.context does: the peer's call computes its rank scores itself
        ctx = dataclasses.replace(contexts[q], normalized=normalize(contexts[q].raw, "minmax"))
        ranking = learner.rank(ctx, 10)
        t1, c1 = time.perf_counter(), time.thread_time()
        ep = env.episode(q, ranking, rng, t=1e6 + i, event_id=f"b{i}")
        c2, t2 = time.thread_time(), time.perf_counter()
        learner.learn(ep)
        t3, c3 = time.perf_counter(), time.thread_time()
        rank_t.append((t1 - t0) * 1e3)
        learn_t.append((t3 - t2) * 1e3)
        rank_c.append((c1 - c0) * 1e3)
        learn_c.append((c3 - c2) * 1e3)
    figures = {
        "rank_median_ms": statistics.median(rank_t),
        "rank_p90_ms": float(np.percentile(rank_t, 90)),
        "rank_cpu_ms": statistics.median(rank_c),
        "learn_median_ms": statistics.median(learn_t),
        "learn_p90_ms": float(np.percentile(learn_t, 90)),
        "learn_cpu_ms": statistics.median(learn_c),
        "peer_median_ms": statistics.median(peer_t),
    }
    return figures, peer_t


def convergence(name: str, n: int, seeds: list[int], **kwargs) -> tuple[int, dict[str, float]]:
    steps, finals = [], []
    for seed in seeds:
        env = ToyEnv(seed=0)
        learner = Learner(RETRIEVERS, name, PLAIN, seed=seed, **kwargs)
        trace: list[dict[str, float]] = []
        simulate(learner, env, n, seed=seed + 100, types=("A",), trace=trace)
        W = np.array([[w[r] for r in RETRIEVERS] for w in trace])
        final = W[-200:].mean(axis=0)
        far = np.flatnonzero(np.abs(W - final).max(axis=1) > 0.05)
        steps.append(0 if far.size == 0 else int(far[-1]) + 1)
        finals.append(final)
    final = np.mean(finals, axis=0)
    return int(statistics.median(steps)), dict(zip(RETRIEVERS, final.round(2).tolist(), strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and seeds")
    ap.add_argument("--reps", type=positive_int, default=None,
                    help="repetitions of each timed call (3000; 500 --quick)")
    ap.add_argument("--interactions", type=positive_int, default=3000, help="interactions of each convergence run")
    ap.add_argument("--seeds", type=positive_int, default=None, help="convergence seeds (5; 2 --quick)")
    args = ap.parse_args()
    reps = args.reps if args.reps is not None else (500 if args.quick else 3000)
    print(f"Per-call cost at 100 candidates, 3 retrievers, default LearnerConfig ({reps} repetitions)")
    print("(wall-clock median and 90th percentile; CPU: median thread CPU time, which a busy machine inflates less)")
    print(f"{'policy':<10} {'rank median':>12} {'rank p90':>10} {'rank CPU':>10} "
          f"{'learn median':>13} {'learn p90':>10} {'learn CPU':>10} {'rank / LangChain':>17}")
    peer_all: list[float] = []
    peer_each: list[float] = []
    for name in sorted(POLICIES):
        r, peer_times = time_policy(name, reps)
        peer_all += peer_times
        peer_each.append(r["peer_median_ms"])
        print(f"{name:<10} {r['rank_median_ms']:>10.3f}ms {r['rank_p90_ms']:>8.3f}ms {r['rank_cpu_ms']:>8.3f}ms "
              f"{r['learn_median_ms']:>11.3f}ms {r['learn_p90_ms']:>8.3f}ms {r['learn_cpu_ms']:>8.3f}ms "
              f"{r['rank_median_ms'] / r['peer_median_ms']:>16.2f}x")
    print(f"peer: LangChain EnsembleRetriever.weighted_reciprocal_rank, fixed equal weights, same candidates, taking "
          f"turns with each policy: {statistics.median(peer_all):.3f}ms median ({min(peer_each):.3f}-"
          f"{max(peer_each):.3f}ms within each policy's run, which its ratio is against; a decision ranks with "
          "memory, confidence and exploration too; the fusion learns nothing)")

    seeds = list(range(args.seeds if args.seeds is not None else (2 if args.quick else 5)))
    n = args.interactions
    print()
    print(f"Convergence on the toy world, type A (r0 is good), weights only, {n} interactions, "
          f"median over {plural(len(seeds), 'seed')}")
    print(f"{'policy':<10} {'interactions to stay within 0.05 of final':>42}   final weights (r0, r1, r2)")
    runs: tuple[tuple[str, dict[str, float]], ...] = (
        ("batch", {}),
        ("thompson", {}),
        ("epsilon", {}),
        ("epsilon", {"epsilon": 0.3, "epsilon_decay": 1e6}),
        ("gradient", {}),
    )
    for name, kw in runs:
        steps, final = convergence(name, n, seeds, **kw)
        label = name + ("*" if kw else "")
        print(f"{label:<10} {steps:>42d}   {final}")
    print("* epsilon=0.3, not decaying; the row above it has the defaults (0.1, decaying). Every click")
    print("  scores all 66 weight arms (click evidence), so both move towards the good retriever, r0.")


if __name__ == "__main__":
    main()
