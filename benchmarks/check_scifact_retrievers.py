"""Check the three retrievers against the reference nDCG@10 figures on BEIR SciFact.

Indexes ``title + " " + text`` of all 5,183 documents with each retriever, ranks
them for the 300 test queries and prints nDCG@10 (ir_measures) next to the
reference, with the time spent indexing (encoding) and querying.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/check_scifact_retrievers.py

By default the embedding cache is a fresh temporary folder, so the encode time
is a real one; pass ``--cache-dir`` to reuse encodings between runs. Exits with
status 1 when a figure misses its target.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlfb, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared argument types

from _bench_args import positive_int  # noqa: E402

# target: (low, high) bounds on nDCG@10, reference figure
TARGETS = {
    "bm25": ((0.64, 1.0), 0.652),
    "dense": ((0.640, 0.650), 0.645),
    "splade": ((0.634, 0.654), 0.644),
}


def load_beir(
    folder: Path, split: str = "test"
) -> tuple[list[tuple[str, str]], dict[str, str], list[tuple[str, str, int]]]:
    """``(doc_id, title + " " + text)`` pairs, ``{query_id: text}`` and ``(query, doc, grade)`` qrels."""
    docs = []
    with open(folder / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            docs.append((str(row["_id"]), f"{row.get('title', '')} {row.get('text', '')}"))
    queries = {}
    with open(folder / "queries.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            queries[str(row["_id"])] = row["text"]
    qrels = []
    with open(folder / "qrels" / f"{split}.tsv", encoding="utf-8") as fh:
        next(fh)  # header: query-id corpus-id score
        for line in fh:
            qid, did, rel = line.rstrip("\n").split("\t")
            qrels.append((qid, did, int(rel)))
    return docs, queries, qrels


def main(argv: list[str] | None = None) -> int:
    from rlfb.datasets import datasets_dir

    base = datasets_dir()  # RLFB_DATASETS, else the checkout's sibling ../shared/datasets
    default_data = base / "scifact" if base is not None else None
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=default_data, help="BEIR folder of SciFact")
    parser.add_argument("--retrievers", default="bm25,dense,splade",
                        help=f"comma-separated names, of {', '.join(TARGETS)} (default: %(default)s)")
    parser.add_argument(
        "--cache-dir", default=None, help="embedding cache (default: a fresh temporary folder)"
    )
    parser.add_argument("--dense-batch-size", type=positive_int, default=64,
                        help="documents per batch of the dense encoder (default: %(default)s)")
    parser.add_argument("--splade-batch-size", type=positive_int, default=32,
                        help="documents per batch of the SPLADE encoder (default: %(default)s)")
    parser.add_argument("--progress", action="store_true", help="show encoding progress bars")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.retrievers.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:  # checked before the collection is read (an unknown one was a KeyError after it)
        parser.error(f"unknown retriever {unknown[0]!r}; valid names: {', '.join(TARGETS)}" if unknown
                     else f"no retriever named; valid names: {', '.join(TARGETS)}")
    if args.data is None or not args.data.is_dir():
        parser.error(f"no SciFact folder at {args.data}: pass --data, or set RLFB_DATASETS to the folder that "
                     "holds the BEIR collections")

    import ir_measures

    from rlfb.errors import RlfbError
    from rlfb.retrievers import make_retriever
    from rlfb.types import make_chunks

    docs, queries, qrels_rows = load_beir(args.data)
    qids = sorted({q for q, _, _ in qrels_rows}, key=lambda q: (len(q), q))
    texts = [queries[q] for q in qids]
    chunks = make_chunks([t for _, t in docs], ids=[d for d, _ in docs])
    qrels = [ir_measures.Qrel(q, d, r) for q, d, r in qrels_rows]
    print(f"SciFact: {len(chunks)} documents, {len(qids)} test queries, {len(qrels)} qrels")

    cache_dir = args.cache_dir
    if cache_dir is None:  # a cache of this run only: removed when it ends
        cache_dir = tempfile.mkdtemp(prefix="rlfb-scifact-cache-")
        atexit.register(shutil.rmtree, cache_dir, True)
    kwargs = {
        "bm25": {},
        "dense": {"cache_dir": cache_dir, "batch_size": args.dense_batch_size},
        "splade": {"cache_dir": cache_dir, "batch_size": args.splade_batch_size},
    }
    failed = False
    print(f"{'retriever':<8} {'nDCG@10':>8} {'reference':>9} {'index/encode s':>15} {'query s':>8}  status")
    for name in names:
        try:
            retriever = make_retriever(name, **kwargs[name])
        except RlfbError as exc:
            parser.error(str(exc))
        start = time.perf_counter()
        retriever.index(chunks, show_progress=args.progress)
        index_s = time.perf_counter() - start
        start = time.perf_counter()
        results = retriever.search_batch(texts, k=100)
        query_s = time.perf_counter() - start
        run = [ir_measures.ScoredDoc(q, d, s) for q, hits in zip(qids, results, strict=True) for d, s in hits]
        ndcg = ir_measures.calc_aggregate([ir_measures.nDCG @ 10], qrels, run)[ir_measures.nDCG @ 10]
        (low, high), ref = TARGETS[name]
        ok = low <= ndcg <= high
        failed |= not ok
        status = "ok" if ok else "MISSED"
        print(f"{name:<8} {ndcg:>8.4f} {ref:>9.3f} {index_s:>15.1f} {query_s:>8.2f}  {status}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
