"""Turn `rlfb simulate --json` outputs into the README's results table.

    python benchmarks/results_table.py RESULTS_DIR

reads RESULTS_DIR/DATASET_POLICY.json for DATASET in scifact, cranfield, cisi and POLICY in thompson,
gradient, batch and thompson_nomem (thompson with ``--no-memory``); the baselines come from the first file
of each collection. A second table splits the thompson runs' held-out figure between the held-out queries
that share a relevant document with a stream query and those that share none.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def fmt(entry: dict) -> str:
    return "–" if entry is None or entry.get("mean") is None else f"{entry['mean']:.3f}"


def main(folder: str) -> None:
    root = Path(folder)
    print("| collection | system | held-out | seen | online |")
    print("|---|---|---|---|---|")
    for ds in ("scifact", "cranfield", "cisi"):
        first = None
        for policy in ("thompson", "gradient", "batch", "thompson_nomem"):
            path = root / f"{ds}_{policy}.json"
            if not path.is_file():
                continue
            r = json.loads(path.read_text())
            first = first or r
            f = r["final"]
            label = "thompson, memory off" if policy == "thompson_nomem" else policy
            print(f"| {ds} | **{label}** | {fmt(f['heldout_ndcg@10'])} | {fmt(f['seen_ndcg@10'])} "
                  f"| {fmt(f['online_ndcg@10'])} |")
        if first is None:
            continue
        for name in ("bm25", "dense", "splade", "equal", "rrf", "tuned_fixed", "oracle_fixed", "per_query_oracle"):
            b = first["baselines"][name]
            print(f"| {ds} | {name} | {fmt(b['heldout_ndcg@10'])} | {fmt(b['seen_ndcg@10'])} "
                  f"| {fmt(b.get('online_ndcg@10'))} |")
    print()
    print("| collection | held-out queries | count | thompson | equal | rrf | tuned_fixed |")
    print("|---|---|---|---|---|---|---|")
    for ds in ("scifact", "cranfield", "cisi"):
        path = root / f"{ds}_thompson.json"
        if not path.is_file():
            continue
        overlap = json.loads(path.read_text()).get("heldout_overlap") or {}  # absent from older outputs
        for group, label in (("shares_an_answer", "sharing a relevant document with the stream"),
                             ("shares_none", "sharing none")):
            g = overlap.get(group)
            if g is None:
                continue
            print(f"| {ds} | {label} | {g['queries']:.1f} | {fmt(g['learned'])} | {fmt(g['equal'])} "
                  f"| {fmt(g['rrf'])} | {fmt(g['tuned_fixed'])} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("folder", nargs="?", default="out/results",
                        help="folder of DATASET_POLICY.json files written by rlfb simulate --json")
    args = parser.parse_args()
    if not Path(args.folder).is_dir():
        parser.error(f"no such folder: {args.folder}")
    main(args.folder)
