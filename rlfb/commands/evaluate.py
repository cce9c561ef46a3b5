"""``rlfb evaluate``: each retriever alone and their fusion, on a BEIR folder."""

from __future__ import annotations

import argparse
import json
import sys

from rlfb.commands import HelpFormatter, show_progress
from rlfb.errors import ValidationError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="nDCG@10, MRR@10, P@10 and Recall@100 of each retriever and the fusion",
                       formatter_class=HelpFormatter)
    p.add_argument("--dataset", required=True,
                   help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv), or a collection's name "
                        "under $RLFB_DATASETS")
    p.add_argument("--split", default="test", help="the qrels file to judge by: qrels/SPLIT.tsv")
    p.add_argument("--retrievers", default="bm25,dense,splade", help="comma-separated: bm25,dense,splade")
    p.add_argument("--fusion", default="rrf", choices=["rrf", "minmax", "zscore"], help="how the scores are fused")
    p.add_argument("--weights", default=None, help="comma-separated weights, one per retriever (default: equal)")
    p.add_argument("--k", type=int, default=10, help="cut-off shown for nDCG, MRR and P (Recall uses 100)")
    p.add_argument("--candidate-k", type=int, default=100,
                   help="each retriever's candidates for the fusion: the fused run ranks their pool")
    p.add_argument("--json", dest="json_out", default=None,
                   help="write the metrics here, keyed by run name; - (or /dev/stdout) writes them to stdout (the "
                        "report to stderr)")
    p.set_defaults(func=run)


def parse_weights(text: str | None, names: list[str]) -> list[float] | None:
    from rlfb.fusion import validate_weights  # here, not at import: `rlfb --help` stays light

    if text is None:
        return None
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValidationError(f"--weights must be comma-separated numbers, got {text!r}") from None
    if len(values) != len(names):
        raise ValidationError(f"--weights has {len(values)} values for {len(names)} retrievers {names}")
    validate_weights(values, names)  # NaN, negative or all-zero weights fail now, not after indexing
    return values


def check_retriever_names(names: list[str]) -> None:
    """Refuse an unknown ``--retrievers`` name before any retriever encodes the corpus."""
    from rlfb.retrievers import check_retriever_names as check_names

    if not names:
        raise ValidationError("--retrievers names no retriever")
    check_names(names)


def run(args: argparse.Namespace) -> int:
    from rlfb.commands import (
        STDOUT,
        check_int,
        check_not_folder,
        check_output_name,
        output_target,
        prepare_output_file,
        report_beside,
        write_output,
    )
    from rlfb.datasets import find_dataset, load_beir
    from rlfb.ensemble import FeedbackEnsemble
    from rlfb.files import refuse_overwriting_dataset
    from rlfb.offline import evaluate_ensemble
    from rlfb.types import validate_k

    k = validate_k(args.k, "--k")  # named as typed
    check_int("--candidate-k", args.candidate_k, 1)  # now, not after BM25 indexed the corpus
    names = [n.strip() for n in args.retrievers.split(",") if n.strip()]
    check_retriever_names(names)
    weights = parse_weights(args.weights, names)
    check_output_name("--json", args.json_out)
    # /dev/stdout is stdout, as "-" is: opened as a file, it truncated a redirected stdout under the report
    args.json_out = output_target(args.json_out)
    check_not_folder("--json", args.json_out)
    if args.json_out and args.json_out != STDOUT:  # a bad output path fails now, not after indexing and evaluation
        prepare_output_file(args.json_out)
        refuse_overwriting_dataset(args.json_out, find_dataset(args.dataset), "--json")
    data = load_beir(find_dataset(args.dataset), splits=[args.split])  # another split's damaged qrels stop nothing
    judged = data.split(args.split)
    data.check_known_documents(args.split)  # qrels of another corpus: every metric would be 0
    queries = data.split_queries(args.split)
    # measured over the queries with a text and a relevant document, as simulate does: a judged query without
    # a text scored 0 and halved every figure, and one judged only irrelevant scores 0 whatever is ranked
    qrels = {q: r for q, r in judged.items() if q in queries and any(g > 0 for g in r.values())}
    queries = {q: queries[q] for q in qrels}
    if not qrels:
        # no judged query to run: all-zero metrics over "0 queries" would read as a result (simulate refuses too)
        raise ValidationError(f"{args.dataset}: qrels/{args.split}.tsv judges no query of queries.jsonl "
                              "relevant to any document")
    for note in data.left_out_notes(args.split):
        print(note, file=sys.stderr)
    if k > len(data.corpus):  # said, not refused (trec_eval scores it so too): a --k typo reads as a result
        print(f"note: --k {k} is more than the {len(data.corpus)} documents of {data.name}'s corpus: each run ranks "
              f"all of them, and P@{k} counts the ranks past them as not relevant", file=sys.stderr)
    ens = FeedbackEnsemble.from_chunks(
        data.corpus, retrievers=names, fusion=args.fusion, weights=weights, show_progress=show_progress(False),
        candidate_k=args.candidate_k,
    )
    measures = (("ndcg", k), ("mrr", k), ("p", k), ("recall", 100))
    results = evaluate_ensemble(ens, queries, qrels, measures=measures, show_progress=show_progress(False), k=k,
                                left_out=data.own_documents(queries))
    cols = [f"{m}@{c}" for m, c in measures]
    with report_beside(args.json_out) as stdout:  # with --json -, the report goes to stderr
        print(f"{data.name} / {args.split}: {len(queries)} queries, {len(data.corpus)} documents, "
              f"fusion={args.fusion}, weights={ens.weights}")
        print(f"{'run':<10}" + "".join(f"{c:>12}" for c in cols))
        for name, metrics in results.items():
            print(f"{name:<10}" + "".join(f"{metrics[c]:>12.4f}" for c in cols))
    if args.json_out:
        write_output(args.json_out, json.dumps(results, indent=2), stdout=stdout)
    return 0
