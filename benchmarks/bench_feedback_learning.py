"""Feedback learned end to end: ``FeedbackEnsemble.feedback`` records, learns and writes a snapshot per call.

    python benchmarks/bench_feedback_learning.py [--feedback 300] [--chunks 2000]

``bench_feedback.py`` times the store's writes alone; this is what an app's thumbs cost with learning, with
the default ``persist_interval=0`` (a policy snapshot after every feedback) and with snapshots at most once a
second. BM25 only, so that no model encoding is timed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rlfb import FeedbackEnsemble


def rate(policy: str, n: int, chunks: int, persist_interval: float) -> float:
    texts = [f"doc {i} about topic {i % 17} and subject {i % 5}" for i in range(chunks)]
    with tempfile.TemporaryDirectory() as tmp:
        ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=str(Path(tmp) / "fb.db"),
                                          policy=policy, persist_interval=persist_interval)
        events = [ens.retrieve(f"topic {i % 17} subject {i % 5}", k=10).event_id for i in range(n)]
        start = time.perf_counter()
        for event in events:
            ens.feedback(event, "thumbs_up")
        seconds = time.perf_counter() - start
        ens.store.close()
    return n / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--feedback", type=int, default=300, help="feedback calls timed per policy")
    parser.add_argument("--chunks", type=int, default=2000, help="chunks indexed")
    args = parser.parse_args()
    for policy in ("thompson", "gradient", "batch"):
        every = rate(policy, args.feedback, args.chunks, 0.0)
        throttled = rate(policy, args.feedback, args.chunks, 1.0)
        print(f"{policy:<9} {every:6.0f} feedback/s with a snapshot each, {throttled:6.0f}/s with one a second")


if __name__ == "__main__":
    main()
