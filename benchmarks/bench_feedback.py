"""Feedback-ingestion throughput of FeedbackStore, on a WAL file in a temporary directory.

Measures, in one run:

* single  : ``record_feedback`` calls, one transaction each (the per-request path);
* batched : ``record_feedback_batch`` with ``--batch`` items per transaction.

Each mode runs in ``--rounds`` rounds (of equal size, or one more item in the last
ones where the count does not divide); the best and median wall-clock throughput
are printed, and events per CPU-second of this process, which other processes
sharing the machine do not distort.

Each event logs ``--k`` chunks; response-level feedback writes one reward row per chunk.
Events are logged up front (batched) and not timed; ``log_event`` throughput is reported too.

Usage::

    .venv/bin/python benchmarks/bench_feedback.py            # defaults: 5,000 single, 100,000 batched
    .venv/bin/python benchmarks/bench_feedback.py --json
    .venv/bin/python benchmarks/bench_feedback.py --synchronous FULL

Targets on 2 cores: >= 2,000 single/s, >= 20,000 batched/s.

No framework has a feedback store to time against. The peers timed in the same run are what an app would
write without one: each feedback inserted as a row, one transaction each, no checks and no reward rows, into a
WAL file of the same settings, by sqlite-utils (``Table.insert``, which also reads the schema three times a
call) and by a plain ``sqlite3`` ``INSERT`` (the floor); the single-feedback rate is printed as a ratio of
each. The rounds of the three single-feedback writers are interleaved, so that a change in the machine's load
falls on all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared argument types

from _bench_args import positive_int  # noqa: E402
from sqlite_utils import Database  # noqa: E402

from rlfb.store import FeedbackStore  # noqa: E402

SIGNALS = ("thumbs_up", "thumbs_down", "click", "reformulation", "dwell")


def _event(i: int, k: int, t: float) -> dict:
    return {
        "query": f"benchmark query {i} about topic {i % 97}",
        "decision": {
            "weights": {"bm25": 0.4, "dense": 0.4, "splade": 0.2},
            "arm": f"arm{i % 3}",
            "propensity": 0.8,
            "explored": i % 10 == 0,
            "policy": "bench",
        },
        "chunks": [
            {
                "chunk_id": f"doc{(i * 7 + j) % 10_000}",
                "rank": j + 1,
                "score": 1.0 / (j + 1),
                "scores": {"bm25": 12.5 - j, "dense": 0.8 - 0.05 * j, "splade": 20.0 - j},
                "normalized": {"bm25": 1.0 - 0.1 * j, "dense": 1.0 - 0.1 * j, "splade": 1.0 - 0.1 * j},
                "proposed_by": ["bm25", "dense"],
            }
            for j in range(k)
        ],
        "session_id": f"s{i % 500}",
        "features": {"length": 8.0, "digits": 0.0},
        "event_id": f"ev{i}",
        "timestamp": t,
    }


def _feedback(i: int, t: float) -> dict:
    return {"event_id": f"ev{i}", "signal": SIGNALS[i % len(SIGNALS)], "timestamp": t + 30.0}


def _rate(n: int, wall: float, cpu: float) -> tuple[float, float]:
    return n / wall, n / cpu if cpu > 0 else float("inf")


def _rounded(rate: float) -> float:
    """A rate as printed: whole numbers, but never rounded down to 0 (two decimals below 10/s)."""
    return round(rate) if rate >= 10 else round(rate, 2)


def _summary(rounds: list[tuple[float, float]]) -> dict:
    walls = sorted(w for w, _ in rounds)
    return {
        "best": _rounded(walls[-1]),
        "median": _rounded(statistics.median(walls)),
        "per_cpu_second": _rounded(statistics.median(c for _, c in rounds)),
    }


def _split(lo: int, n: int, rounds: int) -> list[range]:
    """``range(lo, lo + n)`` in ``rounds`` consecutive parts whose sizes differ by at most one: none dropped.

    >>> [len(r) for r in _split(0, 7, 3)], _split(5, 4, 2)
    ([2, 2, 3], [range(5, 7), range(7, 9)])
    """
    return [range(lo + n * r // rounds, lo + n * (r + 1) // rounds) for r in range(rounds)]


def _naive_store(path: str, synchronous: str) -> Database:
    """The peers' file: a table of feedback rows on a WAL file, autocommitting each insert."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    db = Database(conn)
    db.table("feedback").create({"id": int, "event_id": str, "signal": str, "timestamp": float}, pk="id")
    return db


def _timed(items: list[dict], write: Callable[[dict], object]) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    for item in items:
        write(item)
    return _rate(len(items), time.perf_counter() - start, time.process_time() - cpu)


def run(n_single: int, n_batched: int, batch: int, k: int, synchronous: str, rounds: int) -> dict:
    """Ingest in ``rounds`` rounds per mode (their sizes differ by at most one; every item is ingested); report
    best and median wall throughput. ``n_single`` and ``n_batched`` are at least ``rounds``, every count at least 1.

    The machine may be shared: wall throughput then depends on what else runs.
    ``per_cpu_second`` (events per second of this process's CPU time) does not.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.db")
        t0 = time.time() - 3600
        n_events = n_single + n_batched
        peer = _naive_store(os.path.join(tmp, "naive.db"), synchronous)
        plain = _naive_store(os.path.join(tmp, "plain.db"), synchronous).conn

        def plain_insert(item: dict) -> None:
            plain.execute("INSERT INTO feedback (event_id, signal, timestamp) VALUES (?, ?, ?)",
                          (item["event_id"], item["signal"], item["timestamp"]))

        with FeedbackStore(path, synchronous=synchronous) as store:
            start, cpu = time.perf_counter(), time.process_time()
            for lo in range(0, n_events, 1000):
                store.log_events([_event(i, k, t0) for i in range(lo, min(lo + 1000, n_events))])
            log_batched = _rate(n_events, time.perf_counter() - start, time.process_time() - cpu)

            single_rounds, peer_rounds, plain_rounds = [], [], []
            for part in _split(0, n_single, rounds):
                items = [_feedback(i, t0) for i in part]
                single_rounds.append(_timed(items, lambda item: store.record_feedback(**item)))
                peer_rounds.append(_timed(items, peer.table("feedback").insert))
                plain_rounds.append(_timed(items, plain_insert))
            peer.conn.close()
            plain.close()

            batched_rounds = []
            for part in _split(n_single, n_batched, rounds):
                items = [_feedback(i, t0) for i in part]
                start, cpu = time.perf_counter(), time.process_time()
                for lo in range(0, len(items), batch):
                    store.record_feedback_batch(items[lo : lo + batch])
                wall, used = time.perf_counter() - start, time.process_time() - cpu
                batched_rounds.append(_rate(len(items), wall, used))

            n_log = min(2000, n_single)
            start, cpu = time.perf_counter(), time.process_time()
            for i in range(n_events, n_events + n_log):
                store.log_event(**_event(i, k, t0))
            log_single = _rate(n_log, time.perf_counter() - start, time.process_time() - cpu)

            counts = store.counts()
            ok = store.integrity_check()
    return {
        "synchronous": synchronous,
        "chunks_per_event": k,
        "batch_size": batch,
        "rounds": rounds,
        "feedback_single_per_s": _summary(single_rounds),
        "feedback_batched_per_s": _summary(batched_rounds),
        "naive_insert_single_per_s": _summary(peer_rounds),
        "plain_insert_single_per_s": _summary(plain_rounds),
        "log_event_single_per_s": _summary([log_single]),
        "log_events_batched_per_s": _summary([log_batched]),
        # from the unrounded medians: rlfb's single-feedback rate as a ratio of each peer's
        "single_vs_naive_insert": round(statistics.median(w for w, _ in single_rounds)
                                        / statistics.median(w for w, _ in peer_rounds), 4),
        "single_vs_plain_insert": round(statistics.median(w for w, _ in single_rounds)
                                        / statistics.median(w for w, _ in plain_rounds), 4),
        "rows": counts,
        "integrity": ok,
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--single", type=positive_int, default=5_000,
                   help="record_feedback calls (one transaction each), at least --rounds")
    p.add_argument("--batched", type=positive_int, default=100_000,
                   help="feedback items ingested in batches, at least --rounds")
    p.add_argument("--batch", type=positive_int, default=1_000, help="items per record_feedback_batch call")
    p.add_argument("--k", type=positive_int, default=5, help="chunks per event")
    p.add_argument("--synchronous", default="NORMAL", choices=["NORMAL", "FULL"])
    p.add_argument("--rounds", type=positive_int, default=5, help="rounds per mode (best and median are reported)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    for name in ("single", "batched"):  # a round of none timed nothing: it printed 0/s
        if getattr(args, name) < args.rounds:
            p.error(f"--{name} {getattr(args, name)} is fewer than --rounds {args.rounds}: every round needs "
                    "at least one feedback")
    res = run(args.single, args.batched, args.batch, args.k, args.synchronous, args.rounds)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"FeedbackStore ingestion (WAL, synchronous={res['synchronous']}, k={res['chunks_per_event']}, "
          f"{res['cpus']} CPUs, load average {res['load_average']})")
    print(f"{'':20}{'best/s':>10}{'median/s':>10}{'per CPU-s':>11}")
    rows = [
        ("feedback, single", res["feedback_single_per_s"], "target >= 2,000"),
        ("feedback, batched", res["feedback_batched_per_s"],
         f"batches of {res['batch_size']}; target >= 20,000"),
        ("log_event, single", res["log_event_single_per_s"], ""),
        ("log_events, batch", res["log_events_batched_per_s"], "batches of 1000"),
    ]
    for name, fig, note in rows:
        print(f"  {name:<18}{fig['best']:>10,}{fig['median']:>10,}{fig['per_cpu_second']:>11,}   {note}")
    for name, key, what in (("peer: sqlite-utils", "naive_insert", "Table.insert"),
                            ("peer: sqlite3", "plain_insert", "a plain INSERT")):
        fig, ratio = res[f"{key}_single_per_s"], res[f"single_vs_{key}"]
        print(f"  {name:<18}{fig['best']:>10,}{fig['median']:>10,}{fig['per_cpu_second']:>11,}   "
              f"{what}, no checks, no reward rows; rlfb single feedback runs at {ratio:.2f}x its rate")
    print(f"  rows {res['rows']}, integrity {res['integrity']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
