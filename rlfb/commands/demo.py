"""``rlfb demo``: the main job on the embedded default collection (generated, no download)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="retrieve, fuse and evaluate on the embedded demo collection")
    p.add_argument("--retrievers", default="bm25,dense,splade")
    p.add_argument("--devices", type=int, default=120, help="size of the generated collection (3 docs each)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default=None, help="folder for results.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlfb.demo_corpus import generate_demo_corpus
    from rlfb.ensemble import FeedbackEnsemble
    from rlfb.offline import evaluate_ensemble

    data = generate_demo_corpus(n_devices=args.devices, seed=args.seed)
    names = [n.strip() for n in args.retrievers.split(",") if n.strip()]
    qrels = data.split("test")
    print(f"demo collection: {len(data.corpus)} chunks, {len(data.queries)} questions (generated, seed {args.seed})")
    ens = FeedbackEnsemble.from_chunks(data.corpus, retrievers=names, fusion="rrf", show_progress=True)
    question = next(iter(data.queries.values()))
    print(f"\nexample: {question!r}")
    for hit in ens.retrieve(question, k=3, log=False).hits:
        parts = ", ".join(f"{n}={v:.3f}" for n, v in hit.scores.items())
        print(f"  {hit.rank}. [{hit.chunk_id}] fused={hit.score:.4f} ({parts})  {hit.text[:70]}...")
    results: dict[str, dict[str, float]] = {}
    for fusion in ("rrf", "minmax"):
        ens.fusion = fusion
        scores = evaluate_ensemble(ens, data.queries, qrels, measures=(("ndcg", 10),))
        results.update({n: v for n, v in scores.items() if n != "fused"})
        results[f"{fusion} (equal weights)"] = scores["fused"]
    print(f"\n{'run':<24}{'nDCG@10':>10}")
    for name, metrics in results.items():
        print(f"{name:<24}{metrics['ndcg@10']:>10.4f}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
        print(f"\nwrote {out / 'results.json'}")
    return 0
