"""``FeedbackStore.stats`` against figures computed here, row by row, from the file's own rows.

stats() reads its window figures in a few statements over scratch tables of its own (the repeats computed once,
the window's rewarded events), where it read them in single statements that each computed the repeats again: a
call took 18 s on a store of 1.5M events. The figures must be the same, to the last bit: each one is checked
against one computed from the raw rows with the rules stats() documents, on stores with repeats, several arms (and
none), feedback out of the attribution window and after the window's end, events before the window with feedback
inside it. Sums of floats depend on the order they are added in; the reference adds the rewards of each event in
the order of their ids, the events in the order of theirs and the feedback of the window in the order of their
timestamps, as stats() always has. With numbers that add up exactly in any order (the first tests) it adds them in
plain Python; with any numbers (discounted by their delay) it has SQLite add the values it picked, in that order, so
that SQLite's own way of adding (which newer versions changed) is the same on both sides.
"""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlfb.errors import CorruptStateError
from rlfb.reward import RewardConfig, RewardFunction
from rlfb.store import FeedbackStore, reports

DAY = 86400.0
NOW = 1_700_000_000.0
LO, HI = -1.0, 1.0  # the default clip

Adder = Callable[[list[float]], tuple[float | None, float | None]]  # values in order -> (sum, mean)


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _exact(values: list[float]) -> tuple[float | None, float | None]:
    """Sum and mean of numbers whose sum is exact in any order (multiples of 1/8): plain Python."""
    if not values:
        return None, None
    total = math.fsum(values)
    assert total == sum(values) == sum(reversed(values)), "the numbers of this store do not add up exactly"
    return total, total / len(values)


def _sqlite_adds(values: list[float]) -> tuple[float | None, float | None]:
    """SUM and AVG of ``values`` added by SQLite in the order given (a table read in the order written)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE TABLE v (x)")
        conn.executemany("INSERT INTO v (x) VALUES (?)", [(v,) for v in values])
        total, mean = conn.execute("SELECT SUM(x), AVG(x) FROM v").fetchone()
    finally:
        conn.close()
    return total, mean


def _rows(path: Path, table: str) -> list[dict[str, Any]]:
    """Every row of ``table``, read through a connection of this test's own."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY rowid")]  # noqa: S608 - constants
    finally:
        conn.close()


def _repeat_ids(feedback: list[dict[str, Any]]) -> set[int]:
    """The repeats, as FeedbackStore.repeats_latest defines them: an in-window row without an idempotency key
    that says what the latest earlier in-window row of its event, chunk, session, user and key said (same signal,
    raw value and value), that row without an idempotency key either."""
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    found = set()
    for f in sorted((f for f in feedback if f["in_window"] == 1), key=lambda f: f["id"]):
        who = (f["event_id"], f["chunk_id"], f["session_id"], f["user_id"], f["key"])
        prev = latest.get(who)
        if (prev is not None and f["idempotency_key"] is None and prev["idempotency_key"] is None
                and (prev["signal"], prev["raw_value"], prev["value"]) == (f["signal"], f["raw_value"], f["value"])):
            found.add(f["id"])
        latest[who] = f
    return found


def _reference(path: Path, since: float, until: float, add: Adder) -> dict[str, Any]:
    """The counts and the window's figures of the store at ``path``, from its rows."""
    events, chunks = _rows(path, "events"), _rows(path, "event_chunks")
    feedback, rewards, snapshots = _rows(path, "feedback"), _rows(path, "rewards"), _rows(path, "policy_snapshots")

    def inside(row: dict[str, Any]) -> bool:
        return since <= row["ts"] <= until

    totals = {
        "events": len(events), "chunks": len(chunks), "feedback": len(feedback), "rewards": len(rewards),
        "flagged": sum(f["in_window"] == 0 for f in feedback),
        "unlearned": sum(f["learned"] is None for f in feedback),
        "held": sum(f["learned"] == 2 for f in feedback),
        "policy_snapshots": len(snapshots),
    }
    repeats = _repeat_ids(feedback)
    kept = [f for f in feedback if f["in_window"] == 1 and f["id"] not in repeats]
    in_events = [e for e in events if inside(e)]
    win: dict[str, Any] = {
        "seconds": until - since, "since": since, "until": until,
        "events": len(in_events),
        "chunks": sum(e["n_chunks"] for e in in_events),
        "feedback": sum(inside(f) for f in feedback),
        "rewards": sum(inside(r) for r in rewards),
        "flagged": sum(inside(f) and f["in_window"] == 0 for f in feedback),
    }
    # the window's kept feedback, in the order of their timestamps (ties: of their ids)
    win["mean_feedback_reward"] = add([f["reward"] for f in sorted(
        (f for f in kept if inside(f)), key=lambda f: (f["ts"], f["id"]))])[1]
    # each event of the window: its kept feedback given by until, added in the order of their ids, clipped
    per_event: dict[str, float] = {}
    arm_of = {e["id"]: e["arm"] for e in in_events}
    for eid in sorted(arm_of):
        mine = sorted((f for f in kept if f["event_id"] == eid and f["ts"] <= until), key=lambda f: f["id"])
        if mine:
            total = add([f["discounted"] for f in mine])[0]
            assert total is not None
            per_event[eid] = max(LO, min(HI, total))
    win["rewarded_events"] = len(per_event)
    win["mean_reward"] = add(list(per_event.values()))[1]
    arms = sorted({e["arm"] for e in in_events}, key=lambda a: (a is not None, a or ""))  # NULL first
    win["by_arm"] = {}
    for arm in arms:
        mine = [e for e in in_events if e["arm"] == arm]
        rewarded = [r for eid, r in per_event.items() if arm_of[eid] == arm]
        win["by_arm"][arm] = {
            "events": len(mine), "explored": sum(e["explored"] for e in mine),
            "rewarded_events": len(rewarded), "mean_reward": add(rewarded)[1],
        }
    return {**totals, "mean_reward": win["mean_reward"], "window": win}


def _figures(stats: dict[str, Any]) -> dict[str, Any]:
    """What _reference computes, of stats(), with by_arm as a list (its order is part of the output)."""
    out = {k: stats[k] for k in ("events", "chunks", "feedback", "rewards", "flagged", "unlearned", "held",
                                 "policy_snapshots", "mean_reward")}
    return {**out, "window": {**stats["window"], "by_arm": list(stats["window"]["by_arm"].items())}}


def _as_figures(ref: dict[str, Any]) -> dict[str, Any]:
    return {**ref, "window": {**ref["window"], "by_arm": list(ref["window"]["by_arm"].items())}}


def _same(a: Any, b: Any) -> bool:
    """Equal, and of one type throughout (1 is not 1.0 here: a figure read back as another type differs)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _build(path: Path, rng: random.Random, *, n_events: int, n_feedback: int, values: Iterable[float],
           reward: RewardFunction | None = None, descending: int = 0) -> FeedbackStore:
    """A store of ``n_events`` retrievals over 200 days before NOW (logged in shuffled order: their ids, rows and
    timestamps in three orders), and about ``n_feedback`` feedback rows on them, recorded in shuffled order:
    repeats (a row sent again as it was), rows with idempotency keys, chunk-level rows, rows out of the
    attribution window (a day) and rows after the windows' ends. ``descending`` events get three or more rows
    recorded latest first (their ids and timestamps in opposite orders)."""
    clock = _Clock(NOW)
    store = FeedbackStore(path, clock=clock, reward=reward, attribution_window=DAY)
    arms = ["a", "b", "\u00e9t\u00e9", None]
    ids = [f"ev{i:05d}" for i in range(n_events)]
    rng.shuffle(ids)
    logged: list[tuple[str, float, int]] = []
    for eid in ids:
        ts = NOW - rng.uniform(3 * DAY, 200 * DAY)
        n_chunks = rng.randint(1, 3)
        decision: dict[str, Any] = {"weights": {"bm25": 1.0}, "explored": rng.random() < 0.3, "propensity": 0.5}
        arm = rng.choice(arms)
        if arm is not None:
            decision["arm"] = arm
        store.log_event("q", decision, [{"chunk_id": f"c{k}"} for k in range(n_chunks)], event_id=eid, timestamp=ts)
        logged.append((eid, ts, n_chunks))
    values = list(values)
    sent: list[dict[str, Any]] = []
    for n in range(n_feedback):
        eid, ts, n_chunks = rng.choice(logged)
        if sent and rng.random() < 0.25:  # the same feedback again: a double click, a retry without a key
            item = dict(rng.choice(sent))
        else:
            item = {"event_id": eid, "value": rng.choice(values),
                    "chunk_id": rng.choice([None, *(f"c{k}" for k in range(n_chunks))]),
                    "session_id": rng.choice([None, "s1"]), "user_id": rng.choice([None, "u1", "u2"]),
                    "key": rng.choice([None, None, "correctness"]),
                    # a day and a half: a third of them out of the attribution window
                    "timestamp": ts + rng.choice([0.0, rng.uniform(0, 1.5 * DAY)])}
            if rng.random() < 0.1:
                item["idempotency_key"] = f"k{n}"
            sent.append(item)
        store.record_feedback(**{k: v for k, v in item.items() if k != "event_id"}, event_id=item["event_id"])
    # at each window's edges: an event just before its start with feedback inside it, an event and feedback at
    # its start and at its end exactly (both included), feedback just after its end
    for i, (window, days_back) in enumerate(WINDOWS):
        until = NOW - days_back * DAY
        since = until - window
        if days_back > 250:
            continue  # left empty
        before = store.log_event("q", {"weights": {"bm25": 1.0}, "arm": "a"}, [{"chunk_id": "c0"}],
                                 event_id=f"edge{i}a", timestamp=since - 600.0)
        store.record_feedback(before, value=rng.choice(values), timestamp=since - 300.0)
        store.record_feedback(before, value=rng.choice(values), timestamp=since + 300.0)
        at = store.log_event("q", {"weights": {"bm25": 1.0}, "arm": "b"}, [{"chunk_id": "c0"}],
                             event_id=f"edge{i}b", timestamp=since)
        store.record_feedback(at, value=rng.choice(values), timestamp=since)
        if until > NOW - DAY:
            continue  # the clock's own now: nothing comes after it
        end = store.log_event("q", {"weights": {"bm25": 1.0}}, [{"chunk_id": "c0"}],
                              event_id=f"edge{i}c", timestamp=until - 600.0)
        store.record_feedback(end, value=rng.choice(values), timestamp=until)
        store.record_feedback(end, value=rng.choice(values), timestamp=until + 1.0)
        store.log_event("q", {"weights": {"bm25": 1.0}}, [{"chunk_id": "c0"}], event_id=f"edge{i}d", timestamp=until)
    for eid, ts, _ in logged[:descending]:
        for k in range(rng.randint(3, 5)):  # recorded latest first
            store.record_feedback(eid, value=rng.choice(values), timestamp=ts + 3600.0 - 600.0 * k)
    store.save_policy_state({}, {"bm25": 1.0})
    return store


# windows (seconds, days before NOW that it ends): the whole store, most of it, a short one, ones that end in the
# past (feedback after them left out), one of the retrievals' first days, one before every retrieval (nothing in it)
WINDOWS = [(400 * DAY, 0.0), (150 * DAY, 0.0), (10 * DAY, 0.0), (60 * DAY, 50.0), (2 * DAY, 120.0),
           (40 * DAY, 160.0), (30 * DAY, 300.0)]


@pytest.fixture(scope="module")
def exact_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FeedbackStore]:
    # a grace of three days: no discount, so the sums are the values sent, multiples of 1/8
    reward = RewardFunction(RewardConfig(grace=3 * DAY))
    values = [-1.0, -0.75, -0.5, -0.25, -0.125, 0.125, 0.25, 0.5, 0.75, 1.0]
    store = _build(tmp_path_factory.mktemp("exact") / "fb.db", random.Random(7), n_events=400, n_feedback=150,
                   values=values, reward=reward, descending=10)
    yield store
    store.close()


@pytest.fixture(scope="module")
def discounted_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FeedbackStore]:
    # discounted by their delays: sums that differ in their last bits when added in another order
    values = [-1.0, -0.8, -0.3, -0.1, 0.1, 0.2, 0.3, 0.4, 0.7, 1.0]
    store = _build(tmp_path_factory.mktemp("discounted") / "fb.db", random.Random(11), n_events=600,
                   n_feedback=150, values=values, descending=25)
    yield store
    store.close()


def _check(store: FeedbackStore, window: float, days_back: float, add: Adder) -> dict[str, Any]:
    until = NOW - days_back * DAY
    got = store.stats(window, now=until)
    ref = _as_figures(_reference(Path(store.path), until - window, until, add))
    assert _figures(got) == ref  # a readable diff first
    assert _same(_figures(got), ref)
    return ref


@pytest.mark.parametrize(("window", "days_back"), WINDOWS)
def test_the_figures_are_those_of_the_rows_added_up_here(exact_store: FeedbackStore, window: float,
                                                         days_back: float) -> None:
    ref = _check(exact_store, window, days_back, _exact)
    if days_back < 100:  # the store is of this test's making: repeats, flagged rows, several arms
        assert ref["window"]["rewarded_events"] > 0 and len(ref["window"]["by_arm"]) > 1


@pytest.mark.parametrize(("window", "days_back"), WINDOWS)
def test_the_figures_are_the_same_to_the_last_bit_in_the_order_they_were_added(
    discounted_store: FeedbackStore, window: float, days_back: float
) -> None:
    _check(discounted_store, window, days_back, _sqlite_adds)


def test_the_stores_of_these_tests_hold_what_the_figures_must_get_right(
    exact_store: FeedbackStore, discounted_store: FeedbackStore
) -> None:
    # repeats, flagged rows, rows with keys, events before the window with feedback inside it: else the tests
    # above would pass a rewrite that got them wrong
    for store in (exact_store, discounted_store):
        feedback = _rows(Path(store.path), "feedback")
        assert len(_repeat_ids(feedback)) >= 10
        assert sum(f["in_window"] == 0 for f in feedback) >= 10
        assert sum(f["idempotency_key"] is not None for f in feedback) >= 5
        events = {e["id"]: e["ts"] for e in _rows(Path(store.path), "events")}
        since = NOW - 150 * DAY
        assert any(events[f["event_id"]] < since <= f["ts"] for f in feedback)
    # the discounted store's sums differ when added in another order: within an event (by timestamp, not id)
    # and across events (the window's events in another order)
    feedback = _rows(Path(discounted_store.path), "feedback")
    kept = [f for f in feedback if f["in_window"] == 1 and f["id"] not in _repeat_ids(feedback)]
    by_event: dict[str, list[dict[str, Any]]] = {}
    for f in kept:
        by_event.setdefault(f["event_id"], []).append(f)
    differ = 0
    for rows in by_event.values():
        by_id = _sqlite_adds([f["discounted"] for f in sorted(rows, key=lambda f: f["id"])])[0]
        by_ts = _sqlite_adds([f["discounted"] for f in sorted(rows, key=lambda f: (f["ts"], f["id"]))])[0]
        differ += by_id != by_ts
    assert differ >= 1
    # every event and its feedback lie in a window of 1000 days: the events' rewards, in the order of their ids
    ref = _reference(Path(discounted_store.path), NOW - 1000 * DAY, NOW, _sqlite_adds)
    sums = [max(LO, min(HI, _sqlite_adds([f["discounted"] for f in rows])[0] or 0.0))
            for _, rows in sorted(by_event.items())]
    assert _sqlite_adds(sums)[1] == ref["mean_reward"]
    others = (sums[::-1], sums[1:] + sums[:1], sorted(sums), random.Random(0).sample(sums, len(sums)))
    assert any(_sqlite_adds(other)[1] != ref["mean_reward"] for other in others)


def test_both_ways_of_reading_the_rewarded_events_are_taken(exact_store: FeedbackStore,
                                                           discounted_store: FeedbackStore) -> None:
    # led by the feedback (a window of many more events than feedback rows) or by the window's events: each
    # window above is read one way; both ways are checked against the reference, on both stores
    for store in (exact_store, discounted_store):
        seen: list[str] = []
        store.db.conn.set_trace_callback(seen.append)
        try:
            for window, days_back in WINDOWS:
                store.stats(window, now=NOW - days_back * DAY)
        finally:
            store.db.conn.set_trace_callback(None)
        ran = [s for s in seen if s.startswith(f"INSERT INTO temp.{reports._PER_EVENT}")]
        assert len(ran) == len(WINDOWS)
        assert {"NOT INDEXED" in s for s in ran} == {True, False}


def test_an_empty_store(tmp_path: Path) -> None:
    with FeedbackStore(tmp_path / "fb.db", clock=_Clock(NOW)) as store:
        got = store.stats()
        ref = _as_figures(_reference(tmp_path / "fb.db", NOW - store.stats_window, NOW, _exact))
        assert _same(_figures(got), ref)
        assert got["window"]["by_arm"] == {} and got["mean_reward"] is None
        assert got["window"]["mean_feedback_reward"] is None and got["window"]["chunks"] == 0


def test_retrievals_without_feedback_and_feedback_all_out_of_the_window(tmp_path: Path) -> None:
    with FeedbackStore(tmp_path / "fb.db", clock=_Clock(NOW), attribution_window=DAY) as store:
        for i in range(5):
            eid = store.log_event("q", {"weights": {"bm25": 1.0}, "arm": "a"}, [{"chunk_id": "c"}],
                                  timestamp=NOW - 10 * DAY + i)
            if i % 2:
                store.record_feedback(eid, "thumbs_up", timestamp=NOW - 5 * DAY)  # flagged: out of the window
        got = store.stats()
        assert _same(_figures(got), _as_figures(_reference(tmp_path / "fb.db", NOW - 90 * DAY, NOW, _exact)))
        assert got["window"]["by_arm"] == {"a": {"events": 5, "explored": 0, "rewarded_events": 0,
                                                 "mean_reward": None}}


def test_a_damaged_number_is_named_and_no_scratch_table_is_left(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    store = _build(path, random.Random(3), n_events=20, n_feedback=20, values=[0.5])
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE feedback SET discounted = ? WHERE id = 3", ("abc",))
    with FeedbackStore(path) as store:
        with pytest.raises(CorruptStateError, match="feedback row 3"):
            store.stats()
        assert store.db.conn.execute("SELECT name FROM sqlite_temp_master").fetchall() == []


def test_the_scratch_tables_are_dropped_after_each_call_and_after_an_error(exact_store: FeedbackStore) -> None:
    conn = exact_store.db.conn
    temp = "SELECT name FROM sqlite_temp_master WHERE type = 'table' ORDER BY name"
    conn.execute("CREATE TEMP TABLE apps_own (x)")  # another temporary table on the connection: left as it is
    try:
        first = exact_store.stats(400 * DAY, now=NOW)
        assert conn.execute(temp).fetchall() == [("apps_own",)]
        assert exact_store.stats(400 * DAY, now=NOW) == first  # made again from nothing
        with pytest.raises(RuntimeError), exact_store._read() as c, reports._scratch(c):
            raise RuntimeError("cut short")
        assert conn.execute(temp).fetchall() == [("apps_own",)]
        with exact_store.exclusive():  # inside a write transaction of the caller's
            assert exact_store.stats(400 * DAY, now=NOW) == first
        assert conn.execute(temp).fetchall() == [("apps_own",)]
    finally:
        conn.execute("DROP TABLE temp.apps_own")


def test_the_scratch_tables_work_on_a_read_only_connection(exact_store: FeedbackStore) -> None:
    # the CLI reads a store it cannot write from a copy; a connection opened read-only has its TEMP schema all
    # the same, so the statements stats() makes its scratch tables with run there too
    conn = sqlite3.connect(f"file:{exact_store.path}?mode=ro", uri=True)
    try:
        with reports._scratch(conn):
            conn.execute(reports._BY_FEEDBACK, (LO, HI, NOW - 400 * DAY, NOW, NOW))
            n = conn.execute(f"SELECT COUNT(*) FROM temp.{reports._PER_EVENT}").fetchone()[0]
        assert n == exact_store.stats(400 * DAY, now=NOW)["window"]["rewarded_events"] > 0
        assert conn.execute("SELECT name FROM sqlite_temp_master").fetchall() == []
    finally:
        conn.close()
