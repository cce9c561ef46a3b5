"""Soak test: what a snapshot after every feedback costs as the learner learns more.

    python benchmarks/soak_feedback.py [--retrievals 10000] [--checkpoints 2500 5000 10000] [--chunks 5000]
                                       [--questions 20000] [--seed 0]

The setting of docs/limitations.md (the bullet "A snapshot after every feedback costs more
as the learner learns more"): thompson (the default policy), BM25 only, over ``--chunks`` synthetic chunks
(Zipf texts, ``synthetic_corpus`` of ``bench_retrieval.py``), with the default ``persist_interval=0`` (the
whole learned state written to the store after every feedback), in a temporary directory.

docs/limitations.md's "5,000 synthetic chunks, a Zipf stream of 20,000 questions ... drawn with probability
proportional to 1/rank^0.8 from the 20,000" is read here as: a pool of ``--questions`` 20,000 questions,
each 3 to 6 consecutive words of one chunk drawn uniformly from the 5,000 (so a chunk has about 4); the
pool is in a seeded random order, and each retrieval asks the question at rank r with probability
proportional to 1/r^0.8, so the popular questions come back often (what the learner's memory keeps) and
the tail is mostly asked once. Each retrieval is ``ens.retrieve(question, k=10)``; then, where the
question's own chunk is among the 10 shown, a click on it (``ens.feedback(event_id, "click",
chunk_id=...)``) with probability ``--click-shown``; where it is not, with probability ``--click-other`` a
click on a shown chunk drawn with probability proportional to 1/rank (position bias). The defaults give
about 45 % of retrievals a feedback (4,569 in 10,000 here; docs/limitations.md's earlier soak script, not
kept, gave 4,514); the count is printed.

At each checkpoint it prints, for the window since the previous one: the size of the learned state (the
``state`` column of the store's newest ``policy_snapshots`` row, in bytes, which is the JSON that
``learner.state_dict()`` encodes to; its largest parts beside it), the store's file size, the median and
90th percentile wall time of ``ens.feedback`` and its median CPU time (``time.process_time``: steadier on
a shared machine), and the median wall time of ``ens.retrieve``. A checkpoint before the first feedback says
that there is no snapshot yet.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlfb, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_retrieval's synthetic_corpus, the argument types

from _bench_args import positive_int  # noqa: E402
from bench_retrieval import synthetic_corpus  # noqa: E402

from rlfb import FeedbackEnsemble  # noqa: E402

MB = 1_000_000


def make_questions(texts: list[str], n: int, rng: random.Random) -> list[tuple[str, int]]:
    """``n`` questions, each 3 to 6 consecutive words of a chunk drawn uniformly, with that chunk's index."""
    questions = []
    for _ in range(n):
        chunk = rng.randrange(len(texts))
        words = texts[chunk].split()
        size = rng.randint(3, 6)
        start = rng.randrange(len(words) - size + 1)
        questions.append((" ".join(words[start:start + size]), chunk))
    return questions


def state_parts(path: Path) -> tuple[int, dict[str, int]] | None:
    """Bytes of the newest snapshot's state, and of each of its top-level parts (read on a connection of its own);
    ``None`` before the first snapshot (the first feedback writes it)."""
    conn = sqlite3.connect(path)
    try:
        newest = conn.execute("SELECT version, length(CAST(state AS BLOB)) FROM policy_snapshots "
                              "ORDER BY version DESC LIMIT 1").fetchone()
        if newest is None:
            return None
        version, total = newest
        parts = conn.execute("SELECT key, length(CAST(value AS BLOB)) FROM policy_snapshots, json_each(state) "
                             "WHERE version = ?", (version,)).fetchall()
    finally:
        conn.close()
    return int(total), {str(k): int(v or 0) for k, v in parts}


def store_bytes(path: Path) -> int:
    """The store's file with its write-ahead log."""
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def report(done: int, path: Path, fb_wall: list[float], fb_cpu: list[float], ret_wall: list[float]) -> None:
    snapshot = state_parts(path)
    if snapshot is None:
        state = "no snapshot yet"
    else:
        total, parts = snapshot
        big = sorted(parts.items(), key=lambda kv: -kv[1])[:4]
        state = f"state {total / MB:.2f} MB ({', '.join(f'{k} {v / MB:.2f}' for k, v in big)})"
    ms = 1000.0
    fb = (f"feedback median {statistics.median(fb_wall) * ms:.1f} ms, p90 {percentile(fb_wall, 90) * ms:.1f} ms, "
          f"CPU median {statistics.median(fb_cpu) * ms:.1f} ms (n={len(fb_wall)})") if fb_wall else "no feedback"
    print(f"after {done:>6,} retrievals: {state}; store file "
          f"{store_bytes(path) / MB:.1f} MB; {fb}; retrieval median {statistics.median(ret_wall) * ms:.2f} ms",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--retrievals", type=positive_int, default=10_000, help="retrievals in the stream")
    parser.add_argument("--checkpoints", type=positive_int, nargs="+", default=[2_500, 5_000, 10_000],
                        help="retrieval counts to report at (those past --retrievals are dropped; "
                             "--retrievals itself is always one)")
    parser.add_argument("--chunks", type=positive_int, default=5_000, help="synthetic chunks indexed")
    parser.add_argument("--questions", type=positive_int, default=20_000,
                        help="questions in the pool the stream draws from")
    parser.add_argument("--zipf", type=float, default=0.8, help="a question's popularity is 1/rank^zipf")
    parser.add_argument("--click-shown", type=float, default=0.55,
                        help="chance of a click on the question's chunk where it is shown")
    parser.add_argument("--click-other", type=float, default=0.25,
                        help="chance of a position-biased click on a shown chunk where the question's is not")
    parser.add_argument("--seed", type=int, default=0, help="seeds the corpus, questions, stream, clicks and ensemble")
    args = parser.parse_args()
    checkpoints = sorted({c for c in args.checkpoints if 0 < c < args.retrievals} | {args.retrievals})

    rng = random.Random(args.seed)
    texts = synthetic_corpus(args.chunks, seed=args.seed)
    ids = [f"c{i}" for i in range(args.chunks)]
    questions = make_questions(texts, args.questions, rng)
    popularity = [1.0 / (r + 1) ** args.zipf for r in range(len(questions))]
    stream = rng.choices(questions, weights=popularity, k=args.retrievals)
    position = [1.0 / r for r in range(1, 11)]

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "soak.db"
        start = time.perf_counter()
        ens = FeedbackEnsemble.from_texts(texts, ids, retrievers=("bm25",), store=str(path), policy="thompson",
                                          seed=args.seed)
        print(f"{args.chunks:,} chunks indexed in {time.perf_counter() - start:.1f} s; {len(questions):,} questions, "
              f"{len(set(stream)):,} distinct in a stream of {args.retrievals:,} (seed {args.seed})", flush=True)
        fb_wall: list[float] = []
        fb_cpu: list[float] = []
        ret_wall: list[float] = []
        feedbacks = own = 0
        for done, (question, chunk) in enumerate(stream, 1):
            t0 = time.perf_counter()
            result = ens.retrieve(question, k=10)
            ret_wall.append(time.perf_counter() - t0)
            shown = result.chunk_ids
            target = None
            if ids[chunk] in shown:
                target = ids[chunk] if rng.random() < args.click_shown else None
                own += target is not None
            elif shown and rng.random() < args.click_other:
                target = rng.choices(shown, weights=position[:len(shown)])[0]
            if target is not None:
                w0, c0 = time.perf_counter(), time.process_time()
                ens.feedback(result.event_id, "click", chunk_id=target)
                fb_cpu.append(time.process_time() - c0)
                fb_wall.append(time.perf_counter() - w0)
                feedbacks += 1
            if done in checkpoints:
                report(done, path, fb_wall, fb_cpu, ret_wall)
                fb_wall, fb_cpu, ret_wall = [], [], []
        ens.close()
    print(f"{feedbacks:,} feedbacks in {args.retrievals:,} retrievals ({feedbacks / args.retrievals:.0%}; "
          f"{own:,} on the question's own chunk); {time.perf_counter() - start:.0f} s in all")


if __name__ == "__main__":
    main()
