"""Feedback learned end to end: ``FeedbackEnsemble.feedback`` records, learns and writes a snapshot per call.

    python benchmarks/bench_feedback_learning.py [--feedback 300] [--chunks 2000]

``bench_feedback.py`` times the store's writes alone; this is what an app's thumbs cost with learning, with
the default ``persist_interval=0`` (a policy snapshot after every feedback) and with snapshots at most once a
second. BM25 only, so that no model encoding is timed. No framework learns from feedback to time against; the
ratio printed is against recording the same feedback in the store alone (``FeedbackStore.record_feedback``, in
the same run), which is what learning adds.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rlfb import FeedbackEnsemble


def rate(policy: str, n: int, chunks: int, persist_interval: float | None) -> float:
    """Feedback per second through ``ens.feedback``; ``persist_interval=None``: the store's
    ``record_feedback`` alone on the same events (nothing learned)."""
    texts = [f"doc {i} about topic {i % 17} and subject {i % 5}" for i in range(chunks)]
    with tempfile.TemporaryDirectory() as tmp:
        ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=str(Path(tmp) / "fb.db"),
                                          policy=policy, persist_interval=persist_interval or 0.0)
        events = [ens.retrieve(f"topic {i % 17} subject {i % 5}", k=10).event_id for i in range(n)]
        give = ens.store.record_feedback if persist_interval is None else ens.feedback
        start = time.perf_counter()
        for event in events:
            give(event, "thumbs_up")
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
        alone = rate(policy, args.feedback, args.chunks, None)
        print(f"{policy:<9} {every:6.0f} feedback/s with a snapshot each ({alone / every:5.1f}x slower than "
              f"recording alone), {throttled:6.0f}/s with one a second ({alone / throttled:4.1f}x); "
              f"recording alone {alone:6.0f}/s")


if __name__ == "__main__":
    main()
