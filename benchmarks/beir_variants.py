"""Build BEIR-shaped variants of the shared collections, to run ``rlfb simulate`` on shapes they lack.

The learning figures are also checked on BEIR collections that are not in ``$RLFB_DATASETS`` (nfcorpus,
trec-covid, arguana, ...). These variants mimic their shapes from cranfield, cisi and scifact, deterministically
(seed 7), into a folder of your choice (never the repository):

* ``cranfield_covid_like``: the 50 cranfield questions with the most relevant documents, grades 1-4 mapped
  to 1-2 (trec-covid's scale), up to 30 explicit grade-0 rows a question (half of them drawn from documents
  judged for other questions), a test split only;
* ``cisi_dev_split``: only ``qrels/dev.tsv``; six judged questions with every row at grade 0 and three
  judged ids that queries.jsonl lacks (run with ``--split dev``);
* ``scifact_test_only``: scifact without its train split (the simulator halves the test questions);
* ``cranfield_odd_ids``: 60 % of the documents (every judged one kept), ids with spaces, slashes, accents,
  CJK, quotes and a leading zero, empty or null titles and metadata, numeric query ids, CRLF qrels and five
  empty documents;
* ``cisi_long_queries`` (arguana-like): each question followed by the text of a document not relevant to it;
* ``cranfield_nfcorpus_splits``: train/dev/test splits (60/15/25 % of the questions), grades 1-2, five
  questions judged in train and test, four train questions repeated under new ids.

Then, for each::

    python benchmarks/beir_variants.py --out /tmp/variants
    rlfb simulate --dataset /tmp/variants/cranfield_covid_like --policy thompson --seeds 5 \\
        --json /tmp/variants/results/cranfield_covid_like_thompson.json
    python benchmarks/results_table.py --variants /tmp/variants/results

(``--split dev`` for ``cisi_dev_split``). The README gives what they measured (Results, "Other shapes of
collection"; the misses under "What is not there yet").
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Qrel = tuple[str, str, int]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _read_qrels(path: Path) -> list[Qrel]:
    with open(path, encoding="utf-8") as fh:
        return [(r[0], r[1], int(r[2])) for r in csv.reader(fh, delimiter="\t") if r and r[0] != "query-id"]


def _write_qrels(path: Path, rows: Iterable[Qrel], newline: str = "\n") -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(f"query-id\tcorpus-id\tscore{newline}")
        for q, doc, grade in rows:
            fh.write(f"{q}\t{doc}\t{grade}{newline}")


def _by_query(qrels: Iterable[Qrel]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for q, doc, grade in qrels:
        out.setdefault(q, {})[doc] = grade
    return out


def _two_grades(grade: int) -> int:
    return 2 if grade >= 3 else 1


def covid_like(src: Path, dst: Path, rng: random.Random) -> None:
    corpus = _read_jsonl(src / "cranfield/corpus.jsonl")
    qrels = _read_qrels(src / "cranfield/qrels/test.tsv")
    per_q = _by_query(qrels)
    keep = sorted(per_q, key=lambda q: (-sum(g > 0 for g in per_q[q].values()), int(q)))[:50]
    judged_any = sorted({doc for _, doc, _ in qrels})
    all_ids = [c["_id"] for c in corpus]
    rows = []
    for q in sorted(keep, key=int):
        rows += [(q, doc, _two_grades(g)) for doc, g in per_q[q].items()]
        zeros = rng.sample([d for d in judged_any if d not in per_q[q]], 15)
        zeros += rng.sample([d for d in all_ids if d not in per_q[q]], 15)
        rows += [(q, doc, 0) for doc in dict.fromkeys(zeros)]
    rng.shuffle(rows)
    shutil.copy(src / "cranfield/corpus.jsonl", dst / "corpus.jsonl")
    shutil.copy(src / "cranfield/queries.jsonl", dst / "queries.jsonl")
    _write_qrels(dst / "qrels/test.tsv", rows)


def dev_split(src: Path, dst: Path, rng: random.Random) -> None:
    qrels = _read_qrels(src / "cisi/qrels/test.tsv")
    zero = set(rng.sample(sorted({q for q, _, _ in qrels}, key=int), 6))
    rows = [(q, doc, 0 if q in zero else g) for q, doc, g in qrels]
    rows += [("9001", "1", 1), ("9001", "2", 1), ("9002", "3", 1), ("9003", "4", 1)]  # no such questions
    _write_qrels(dst / "qrels/dev.tsv", rows)
    shutil.copy(src / "cisi/corpus.jsonl", dst / "corpus.jsonl")
    shutil.copy(src / "cisi/queries.jsonl", dst / "queries.jsonl")


def test_only(src: Path, dst: Path, rng: random.Random) -> None:
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        shutil.copy(src / "scifact" / name, dst / name)


_ODD_IDS = ["doc {i}", "doc/{i}/v1", "dóc-{i}-ü", "文档{i}", "0{i}", "id#{i}?x=1", "{i}.0", "<{i}>", "d'{i}",
            "naïve {i} "]


def odd_ids(src: Path, dst: Path, rng: random.Random) -> None:
    corpus = _read_jsonl(src / "cranfield/corpus.jsonl")
    qrels = _read_qrels(src / "cranfield/qrels/test.tsv")
    judged = {doc for _, doc, _ in qrels}
    others = [c for c in corpus if c["_id"] not in judged]
    kept = judged | {c["_id"] for c in rng.sample(others, max(int(0.6 * len(corpus)) - len(judged), 0))}
    remap, rows = {}, []
    for c in corpus:
        if c["_id"] not in kept:
            continue
        i = int(c["_id"])
        remap[c["_id"]] = _ODD_IDS[i % len(_ODD_IDS)].format(i=i)
        row: dict[str, Any] = {"_id": remap[c["_id"]], "text": c["text"]}
        if i % 3 < 2:
            row["title"] = "" if i % 3 == 0 else None  # else no title key at all
        if i % 2 == 0:
            row["metadata"] = None
        rows.append(row)
    rows += [{"_id": f"empty {j}", "title": "", "text": ""} for j in range(5)]
    rng.shuffle(rows)
    _write_jsonl(dst / "corpus.jsonl", rows)
    queries = _read_jsonl(src / "cranfield/queries.jsonl")
    _write_jsonl(dst / "queries.jsonl", [{"_id": int(q["_id"]), "text": q["text"]} for q in queries])
    _write_qrels(dst / "qrels/test.tsv", [(q, remap[doc], g) for q, doc, g in qrels], newline="\r\n")


def long_queries(src: Path, dst: Path, rng: random.Random) -> None:
    corpus = _read_jsonl(src / "cisi/corpus.jsonl")
    relevant = _by_query(_read_qrels(src / "cisi/qrels/test.tsv"))
    queries = _read_jsonl(src / "cisi/queries.jsonl")
    for q in queries:
        noise = rng.choice([c for c in corpus if c["_id"] not in relevant.get(q["_id"], {})])
        q["text"] = f"{q['text']} {noise['text']}"
    _write_jsonl(dst / "queries.jsonl", queries)
    shutil.copy(src / "cisi/corpus.jsonl", dst / "corpus.jsonl")
    shutil.copy(src / "cisi/qrels/test.tsv", dst / "qrels/test.tsv")


def nfcorpus_splits(src: Path, dst: Path, rng: random.Random) -> None:
    per_q = _by_query(_read_qrels(src / "cranfield/qrels/test.tsv"))
    qids = sorted(per_q, key=int)
    rng.shuffle(qids)
    n = len(qids)
    train, dev, test = qids[: int(0.6 * n)], qids[int(0.6 * n): int(0.75 * n)], qids[int(0.75 * n):]
    queries = _read_jsonl(src / "cranfield/queries.jsonl")
    text = {q["_id"]: q["text"] for q in queries}
    repeats = [(q, f"{q}-dup") for q in train[:4]]
    queries += [{"_id": new, "text": text[q]} for q, new in repeats]

    def rows(pairs: Iterable[tuple[str, str]]) -> list[Qrel]:
        return [(name, doc, _two_grades(g)) for q, name in pairs for doc, g in per_q[q].items()]

    _write_qrels(dst / "qrels/train.tsv", rows([(q, q) for q in train + test[:5]] + repeats))
    _write_qrels(dst / "qrels/dev.tsv", rows((q, q) for q in dev))
    _write_qrels(dst / "qrels/test.tsv", rows((q, q) for q in test))
    _write_jsonl(dst / "queries.jsonl", queries)
    shutil.copy(src / "cranfield/corpus.jsonl", dst / "corpus.jsonl")


VARIANTS: dict[str, Callable[[Path, Path, random.Random], None]] = {
    "cranfield_covid_like": covid_like,
    "cisi_dev_split": dev_split,
    "scifact_test_only": test_only,
    "cranfield_odd_ids": odd_ids,
    "cisi_long_queries": long_queries,
    "cranfield_nfcorpus_splits": nfcorpus_splits,
}


def build(src: Path, out: Path, names: Iterable[str] = tuple(VARIANTS), seed: int = 7) -> list[Path]:
    """Write each named variant to ``out/NAME`` (replacing it) from the collections in ``src``."""
    built = []
    for name in names:
        dst = out / name
        shutil.rmtree(dst, ignore_errors=True)
        (dst / "qrels").mkdir(parents=True)
        VARIANTS[name](src, dst, random.Random(f"{seed}:{name}"))  # each its own stream: one can be built alone
        built.append(dst)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder to write the variants to")
    parser.add_argument("--datasets", type=Path, default=os.environ.get("RLFB_DATASETS"),
                        help="folder holding cranfield, cisi and scifact (default: $RLFB_DATASETS)")
    parser.add_argument("--only", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args(argv)
    if args.datasets is None or not (args.datasets / "cranfield" / "corpus.jsonl").is_file():
        print(f"no collections at {args.datasets}: give --datasets or set RLFB_DATASETS", file=sys.stderr)
        return 2
    for path in build(args.datasets, args.out, args.only):
        print(path, sorted(p.name for p in (path / "qrels").iterdir()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
