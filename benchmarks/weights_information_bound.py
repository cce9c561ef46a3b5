"""How well a grid search can choose fusion weights from what 2,000 interactions show, given perfect labels.

The evaluation issue asks the learned weights to come within 0.005 nDCG@10 of weights tuned on the
stream questions with their full judgments. This script bounds what the stream's feedback can tell
about the weights, generously: instead of clicks it hands the grid search the **true grade of every
chunk the user examined** (shown at or above the user's last click: all a cascade user's clicks can
speak for), or, more generously still, of **every chunk shown**, which no click feedback gives; or, in
the ``click rates`` rows, the cascade-corrected click rate of each chunk (clicks over the times it was
examined). The grid search then ranks every candidate with each of the 66 weight vectors (min-max
fusion, step 0.1), which no online learner sees, and keeps the best mean nDCG@10 over the stream
questions. The chosen weights are scored on the held-out questions with their full judgments, as the
simulator's ``tuned_fixed`` baseline is.

Two display policies decide which chunks are shown: ``equal`` (equal weights, what the learner shows
until its evidence gate opens) and ``uniform`` (a uniformly random weight vector every time, far more
exploration than any deployed system would afford). The stream, the split and the navigational user
are the simulator's, with the same seeds.

    RLFB_DATASETS=$(realpath ../shared/datasets) HF_HUB_OFFLINE=1 \
        .venv/bin/python benchmarks/weights_information_bound.py --dataset cranfield --seeds 10

Nothing here is used by rlfb; it measures the data, not the code (see docs/experiments.md).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlfb, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared argument types

from _bench_args import collection_folder, positive_int  # noqa: E402

from rlfb.datasets import load_beir  # noqa: E402
from rlfb.errors import RlfbError  # noqa: E402
from rlfb.fusion import normalize  # noqa: E402
from rlfb.simulation.baselines import Judge as _Judge  # noqa: E402
from rlfb.simulation.runner import Prepared, SimulationConfig, _split, prepare, simplex_grid, stream_seed, users_scale  # noqa: E402
from rlfb.simulation.users import SimulatedUser  # noqa: E402

K = 10


def mean_ndcg(prep: Prepared, scores: Mapping[str, np.ndarray], gains: Mapping[str, Mapping[str, float]],
              queries: list[str]) -> np.ndarray:
    """Mean nDCG@10 over ``queries`` of ranking by each column of ``scores[q]`` (one per weight vector).

    The simulator's own nDCG (``_Judge``, checked against pytrec_eval). A query without a positive gain
    scores 0 for every weight vector, which leaves the best one unchanged.
    """
    # float gains: click rates here
    return np.mean([_Judge(prep.contexts[q], gains[q], K).ndcg(scores[q])
                    for q in queries], axis=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="cranfield",
                        help="a folder name under $RLFB_DATASETS, or a path (default: %(default)s)")
    parser.add_argument("--seeds", type=positive_int, default=10,
                        help="seeds (splits and streams) the rows are the mean over (default: %(default)s)")
    parser.add_argument("--interactions", type=positive_int, default=2000,
                        help="interactions of each seed's stream (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        folder = collection_folder(args.dataset)
    except ValueError as exc:
        parser.error(str(exc))

    try:  # a collection rlfb cannot read, or settings the simulator refuses: a usage error, not a traceback
        config = SimulationConfig(policy="thompson", interactions=args.interactions)
        prep = prepare(load_beir(folder), config, show_progress=False)
    except RlfbError as exc:
        parser.error(str(exc))
    grid = np.vstack([np.full(3, 1 / 3), simplex_grid(3, 0.1)])  # row 0: exactly equal weights
    scores = {q: normalize(c.raw, "minmax") @ grid.T for q, c in prep.contexts.items()}  # (candidates, arms)

    rows: dict[str, list[float]] = {}
    for seed in range(args.seeds):
        stream, heldout, judgments = _split(prep, config, seed)
        full = {q: {c: float(g) for c, g in judgments[q].items() if g > 0} for q in judgments}
        held = mean_ndcg(prep, scores, full, heldout)
        tuned = int(mean_ndcg(prep, scores, full, stream).argmax())
        rows.setdefault("equal weights", []).append(held[0])
        rows.setdefault("tuned on full judgments", []).append(held[tuned])
        for display in ("equal", "uniform"):
            user = SimulatedUser("navigational", explicit_rate=0.0, max_grade=users_scale(stream, judgments),
                                 seed=stream_seed(seed, "user"))
            rng, arms = random.Random(stream_seed(seed, "queries")), np.random.default_rng(seed)
            clicks: dict[str, Counter[str]] = defaultdict(Counter)
            examined: dict[str, Counter[str]] = defaultdict(Counter)
            shown_all: dict[str, set[str]] = defaultdict(set)
            for _ in range(args.interactions):
                q = rng.choice(stream)
                arm = 0 if display == "equal" else int(arms.integers(len(grid)))
                top = np.argsort(-scores[q][:, arm], kind="stable")[:K]
                shown = [prep.contexts[q].candidate_ids[i] for i in top]
                clicked = user.clicks(shown, judgments[q])
                last = max((shown.index(c) for c in clicked), default=K - 1)  # cascade: read down to here
                examined[q].update(shown[: last + 1])
                shown_all[q].update(shown)
                clicks[q].update(clicked)

            true_examined = {q: {c: full[q][c] for c in examined[q] if c in full[q]} for q in stream}
            true_shown = {q: {c: full[q][c] for c in shown_all[q] if c in full[q]} for q in stream}
            # clicks per examination, shrunk towards the 0.05 of a non-relevant chunk; above it, scaled to [0, 1]
            rates = {q: {c: (n + 0.1) / (examined[q][c] + 2) for c, n in clicks[q].items()} for q in stream}
            click_rate = {q: {c: (r - 0.05) / 0.9 for c, r in rates[q].items() if r > 0.05} for q in stream}
            for name, gains in (("true grades of examined chunks", true_examined),
                                ("true grades of every shown chunk", true_shown), ("click rates", click_rate)):
                best = int(mean_ndcg(prep, scores, gains, stream).argmax())
                rows.setdefault(f"{name}, {display} shown", []).append(held[best])

    first = min(5, args.seeds)
    print(f"{folder.name}: held-out nDCG@10 of the weights each source of judgments picks, "
          f"{args.interactions} interactions; mean (and against tuned) over seeds 0-{first - 1} | 0-{args.seeds - 1}")
    tuned_held = np.array(rows["tuned on full judgments"])
    width = max(len(name) for name in rows)
    for name, vals in rows.items():
        v = np.array(vals)
        print(f"  {name:<{width}} {v[:first].mean():.4f} ({v[:first].mean() - tuned_held[:first].mean():+.4f})"
              f" | {v.mean():.4f} ({v.mean() - tuned_held.mean():+.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
