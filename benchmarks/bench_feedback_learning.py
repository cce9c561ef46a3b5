"""Feedback learned end to end: ``FeedbackEnsemble.feedback`` records, learns and writes a snapshot per call.

    python benchmarks/bench_feedback_learning.py [--feedback 300] [--throttled-feedback 3000] [--chunks 2000]

``bench_feedback.py`` times the store's writes alone; this is what an app's thumbs cost with learning, with
the default ``persist_interval=0`` (a policy snapshot after every feedback) and with snapshots at most once a
second (``persist_interval=1.0``: enough feedback is timed for the run to span seconds, each of which writes
one, and the seconds it spanned are printed). BM25 only, so that no model encoding is timed. No framework learns
from feedback to time against; the ratio printed is against recording the same feedback in the store alone
(``FeedbackStore.record_feedback``, in the same run), which is what learning adds. Each mode runs
``--repeats`` times, the modes interleaved, and the median rate is printed. Where the once-a-second runs span
less than a second (a small ``--throttled-feedback``), each wrote one snapshot at most and a warning says so.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlfb, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared argument types

from _bench_args import positive_int  # noqa: E402

from rlfb import FeedbackEnsemble  # noqa: E402


def rate(policy: str, n: int, chunks: int, persist_interval: float | None) -> tuple[float, float]:
    """Feedback per second through ``ens.feedback``, and the seconds timed; ``persist_interval=None``: the
    store's ``record_feedback`` alone on the same events (nothing learned)."""
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
        ens.close()  # writes what persist_interval held back, untimed (closing the store alone left it unwritten)
    return n / seconds, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--feedback", type=positive_int, default=300, help="feedback calls timed per policy and mode")
    parser.add_argument("--throttled-feedback", type=positive_int, default=3000,
                        help="feedback calls timed with persist_interval=1.0 (a run of seconds, not a fraction)")
    parser.add_argument("--chunks", type=positive_int, default=2000, help="chunks indexed")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs of each mode; the median is printed")
    args = parser.parse_args()
    for policy in ("thompson", "gradient", "batch"):
        runs: dict[str, list[tuple[float, float]]] = {"every": [], "alone": [], "throttled": [], "alone_long": []}
        for _ in range(args.repeats):  # interleaved: a change of load falls on every mode
            runs["every"].append(rate(policy, args.feedback, args.chunks, 0.0))
            runs["alone"].append(rate(policy, args.feedback, args.chunks, None))
            # each learning mode against recording as many feedbacks: a longer run's store is larger
            runs["throttled"].append(rate(policy, args.throttled_feedback, args.chunks, 1.0))
            runs["alone_long"].append(rate(policy, args.throttled_feedback, args.chunks, None))
        every, alone, throttled, alone_long = (statistics.median(r for r, _ in runs[m]) for m in runs)
        spanned = statistics.median(s for _, s in runs["throttled"])
        print(f"{policy:<9} {every:6.0f} feedback/s with a snapshot each ({alone / every:5.1f}x slower than "
              f"recording {args.feedback} alone, {alone:6.0f}/s), {throttled:6.0f}/s with one a second over "
              f"{spanned:.1f} s ({alone_long / throttled:4.1f}x recording {args.throttled_feedback} alone, "
              f"{alone_long:6.0f}/s)", flush=True)
        if spanned < 1.0:  # one snapshot at most in each: not what "once a second" means in a longer run
            print(f"warning: {policy}'s once-a-second runs spanned {spanned:.2f} s, under a second, so each wrote "
                  f"one snapshot at most: raise --throttled-feedback (now {args.throttled_feedback}) for a run of "
                  "seconds", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
