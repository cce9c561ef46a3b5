"""What chunk exploration costs on questions asked for the first time, by fusion.

One ensemble per fusion, built once over a BEIR collection (the default ``fixed`` policy with a store in a
temporary folder, so Thompson chunk exploration is on, as it is for every policy while the feedback memory is),
serves each test question's top 10 twice: greedy (``explore=False``, not logged) and as a user would get it
(explored and logged). It prints the mean nDCG@10 of both, the cost, and how often the top chunk changed, for
min-max and RRF fusion measured in the same run; the cost under RRF is printed as a ratio of the cost under
min-max, the fusion the learning targets are measured with.

    RLFB_DATASETS=... HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/exploration_cost.py --dataset scifact \\
        --retrievers bm25,dense

Nothing is learned between questions (no feedback is given, so the feedback memory stays empty), so each
question is a first ask; only the ensemble's random stream runs on from one question to the next.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks' shared argument types

from _bench_args import positive_int  # noqa: E402


def first_ask_cost(dataset: object, retrievers: tuple[str, ...], fusion: str, store: Path, *,
                   max_queries: int | None = None, cache_dir: str | None = None) -> dict[str, float]:
    """Mean greedy and served nDCG@10, and the share of questions whose top chunk exploration changed."""
    from rlfb import FeedbackEnsemble
    from rlfb.datasets import BeirDataset
    from rlfb.metrics import ndcg_at_k

    assert isinstance(dataset, BeirDataset)
    qrels = dataset.split("test")
    qids = sorted(qrels)[:max_queries] if max_queries is not None else sorted(qrels)
    options = {r: {"cache_dir": cache_dir} for r in retrievers if r != "bm25" and cache_dir}
    ens = FeedbackEnsemble.from_chunks(dataset.corpus, retrievers=retrievers, fusion=fusion, store=store,
                                       retriever_options=options)
    greedy = served = changed = 0.0
    for q in qids:
        text = dataset.queries[q]
        g = ens.retrieve(text, k=10, explore=False, log=False).chunk_ids
        s = ens.retrieve(text, k=10).chunk_ids
        greedy += ndcg_at_k(g, qrels[q], 10)
        served += ndcg_at_k(s, qrels[q], 10)
        changed += g[0] != s[0]
    ens.close()
    n = len(qids)
    return {"greedy": greedy / n, "served": served / n, "top1_changed": changed / n, "queries": n}


def main(argv: list[str] | None = None) -> int:
    from rlfb.datasets import find_dataset, load_beir
    from rlfb.errors import RlfbError
    from rlfb.retrievers import check_retriever_names

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="scifact", help="a BEIR folder, or a name under RLFB_DATASETS")
    parser.add_argument("--retrievers", default="bm25", help="comma-separated names")
    parser.add_argument("--max-queries", type=positive_int, default=None,
                        help="the first N test questions only (default: all)")
    parser.add_argument("--cache-dir", default=None, help="embedding cache (default: the retrievers' own)")
    args = parser.parse_args(argv)
    retrievers = tuple(r.strip() for r in args.retrievers.split(",") if r.strip())
    try:  # an unknown retriever name or a missing folder: a usage error, not a traceback (checked before any
        # work; a failure in the run itself stays the error it is)
        check_retriever_names(retrievers)
        data = load_beir(find_dataset(args.dataset), splits=["test"])
    except RlfbError as exc:
        parser.error(str(exc))
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fusion in ("minmax", "rrf"):
            rows[fusion] = first_ask_cost(data, retrievers, fusion, Path(tmp) / f"{fusion}.db",
                                          max_queries=args.max_queries, cache_dir=args.cache_dir)
    print(f"{data.name}, {'+'.join(retrievers)}, {rows['minmax']['queries']} test questions asked once each")
    print(f"{'fusion':<7} {'greedy':>7} {'served':>7} {'cost':>7} {'top-1 changed':>14}")
    for fusion, r in rows.items():
        print(f"{fusion:<7} {r['greedy']:7.4f} {r['served']:7.4f} {r['greedy'] - r['served']:7.4f} "
              f"{r['top1_changed']:14.1%}")
    base = rows["minmax"]["greedy"] - rows["minmax"]["served"]
    cost = rows["rrf"]["greedy"] - rows["rrf"]["served"]
    ratio = f"{cost / base:.2f}x" if base > 0 else "n/a (no cost under min-max)"
    print(f"exploration's cost under RRF as a ratio of its cost under min-max: {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
