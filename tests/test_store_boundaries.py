"""FeedbackStore at its boundary: bad paths, ids, batches, integers and clocks are named errors."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import pytest

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.store import FeedbackStore

NOW = 1_700_000_000.0
DECISION = {"weights": {"bm25": 0.5, "dense": 0.5}, "arm": "a", "propensity": 1.0, "explored": False}


def counts(store: FeedbackStore) -> tuple[int, ...]:
    c = store.counts()
    return c["events"], c["chunks"], c["feedback"], c["rewards"]


@pytest.fixture
def store():
    s = FeedbackStore(clock=lambda: NOW)
    s.log_event("q", DECISION, [{"chunk_id": "c1"}], event_id="e1", session_id="s1", timestamp=NOW - 60)
    yield s
    s.close()


# -- 1. paths ----------------------------------------------------------------------
@pytest.mark.parametrize("bad", [None, 5, 1.5, b"fb.db", ["fb.db"], object()])
def test_a_path_that_is_not_str_or_pathlike_is_rejected_without_a_stray_file(bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError, match="path must be"):
        FeedbackStore(bad)
    assert [] == os.listdir(tmp_path)


def test_a_directory_is_not_a_database_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError, match="is a directory") as info:
        FeedbackStore(tmp_path)
    assert str(tmp_path) in str(info.value)
    assert [] == os.listdir(tmp_path)


@pytest.mark.parametrize("rel", ["missing/fb.db", "missing/deeper/fb.db"])
def test_a_path_whose_folder_does_not_exist_is_named(rel, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError, match="folder") as info:
        FeedbackStore(tmp_path / rel)
    assert rel in str(info.value)
    assert [] == os.listdir(tmp_path)


def test_a_path_under_a_file_is_named(tmp_path):
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(ValidationError, match="plain.txt"):
        FeedbackStore(tmp_path / "plain.txt" / "fb.db")


def test_a_path_with_a_nul_character_is_rejected(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError, match="NUL"):
        FeedbackStore("fb\x00.db")
    assert [] == os.listdir(tmp_path)


class _FsPath:
    def __init__(self, p: str) -> None:
        self.p = p

    def __fspath__(self) -> str:
        return self.p


@pytest.mark.parametrize("make", [str, Path, _FsPath])
def test_valid_paths_still_open(make, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a path mistaken for its str() would land here, not in the repo
    target = tmp_path / "fb.db"
    with FeedbackStore(make(str(target)), clock=lambda: NOW) as s:
        s.log_event("q", DECISION, [], event_id="e1", timestamp=NOW)
        assert str(target) == s.path
    with FeedbackStore(target) as s:
        assert s.has_event("e1")
    assert {"fb.db"} == {f for f in os.listdir(tmp_path) if not f.endswith(("-wal", "-shm"))}


# "" (sqlite3's private temporary database) is refused since 2026-12-06: an unset setting lost every write at
# exit (tests/test_input_boundaries.py)
@pytest.mark.parametrize("memory", [":memory:", Path(":memory:")])
def test_in_memory_forms_still_work_and_write_nothing(memory, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with FeedbackStore(memory, clock=lambda: NOW) as s:
        s.log_event("q", DECISION, [], event_id="e1", timestamp=NOW)
        assert s.has_event("e1")
    assert [] == os.listdir(tmp_path)


# -- 2. ids --------------------------------------------------------------------------
ID_LOOKUPS = [
    ("has_event", "event_id"),
    ("event", "event_id"),
    ("feedback", "event_id"),
    ("event_reward", "event_id"),
    ("chunk_reward_sums", "event_id"),
    ("events_for_session", "session_id"),
    ("last_event", "session_id"),
    ("children", "parent_id"),
    ("descendants", "root_id"),
    ("resolve", "run_id"),
    ("resolve_run", "run_id"),
]


@pytest.mark.parametrize(("method", "name"), ID_LOOKUPS)
@pytest.mark.parametrize("bad", [5, None, b"e1", ("e1",)])
def test_a_non_str_id_is_a_validation_error_naming_the_argument(store, method, name, bad):
    with pytest.raises(ValidationError, match=name):
        getattr(store, method)(bad)


def test_record_feedback_with_a_non_str_event_id_writes_nothing(store):
    with pytest.raises(ValidationError, match="event_id"):
        store.record_feedback(5, "thumbs_up")
    assert (1, 1, 0, 0) == counts(store)


def test_str_ids_keep_their_answers(store):
    assert store.has_event("e1") and not store.has_event("nope") and not store.has_event("")
    assert ["e1"] == [e["id"] for e in store.events_for_session("s1")]
    assert [] == store.events_for_session("")  # an empty session id may be logged; looking it up is fine
    assert "e1" == store.last_event("s1")["id"]
    assert [] == store.children("") == store.descendants("x")
    assert ["e1"] == store.resolve("e1") == store.resolve_run("e1")


# -- 3. batches and integers -----------------------------------------------------------
@pytest.mark.parametrize("bad", [None, 5, "events", {"query": "q"}])
def test_log_events_needs_an_iterable_of_events(store, bad):
    with pytest.raises(ValidationError, match="events"):
        store.log_events(bad)
    assert (1, 1, 0, 0) == counts(store)


@pytest.mark.parametrize("bad", [None, 5, "items", {"event_id": "e1", "signal": "thumbs_up"}])
def test_record_feedback_batch_needs_an_iterable_of_items(store, bad):
    with pytest.raises(ValidationError, match="items"):
        store.record_feedback_batch(bad)
    assert (1, 1, 0, 0) == counts(store)


@pytest.mark.parametrize(
    "links",
    [[("a",)], [("a", "b", "c")], ["ab"], [5], [("a", "b"), ("c",)], None, ("run", "parent"), "ab"],
)
def test_link_runs_needs_pairs_and_writes_nothing(store, links):
    with pytest.raises(ValidationError, match="link"):
        store.link_runs(links)
    assert [] == store.resolve_run("a")
    assert 1 == store.link_runs([("a", "e1")])  # nothing of the bad batch was stored


@pytest.mark.parametrize("rank", [2**63, 2**70, -(2**70)])
def test_a_rank_beyond_sqlite_integer_is_a_validation_error(store, rank):
    with pytest.raises(ValidationError, match="rank"):
        store.log_event("q", DECISION, [{"chunk_id": "x", "rank": rank}])
    assert (1, 1, 0, 0) == counts(store)
    with pytest.raises(ValidationError, match="rank"):  # in a batch: the good event is not written either
        store.log_events(
            [
                {"query": "q", "decision": DECISION, "chunks": []},
                {"query": "q", "decision": DECISION, "chunks": [{"chunk_id": "x", "rank": rank}]},
            ]
        )
    assert (1, 1, 0, 0) == counts(store)


def test_the_largest_sqlite_integer_rank_is_kept(store):
    eid = store.log_event("q", DECISION, [{"chunk_id": "x", "rank": 2**63 - 1}])
    assert 2**63 - 1 == store.event(eid)["chunks"][0]["rank"]


@pytest.mark.parametrize("limit", [2**63, 2**70])
def test_a_limit_beyond_sqlite_integer_is_a_validation_error(store, limit):
    with pytest.raises(ValidationError, match="limit"):
        store.events_for_session("s1", limit)
    with pytest.raises(ValidationError, match="limit"):
        store.policy_history(limit)


@pytest.mark.parametrize("bad", [2**70, "3", 1.5, True])
def test_before_feedback_id_must_be_an_int(store, bad):
    with pytest.raises(ValidationError, match="before_feedback_id"):
        store.chunk_reward_sums("e1", before_feedback_id=bad)


# -- 4. the clock ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "value", ["x", None, float("nan"), float("inf"), True, 2**2000], ids=["str", "None", "nan", "inf", "bool", "huge"]
)
def test_a_clock_that_returns_no_finite_number_is_named(value):
    s = FeedbackStore(clock=lambda: value)
    with pytest.raises(ValidationError, match="clock"):
        s.log_event("q", DECISION, [])
    with pytest.raises(ValidationError, match="clock"):
        s.link_runs([("a", "b")])
    assert (0, 0, 0, 0) == counts(s) and [] == s.resolve_run("a")  # nothing written
    s.close()


def test_a_clock_that_is_not_callable_is_rejected():
    with pytest.raises(ValidationError, match="clock"):
        FeedbackStore(clock=NOW)  # type: ignore[arg-type]


def test_numeric_clocks_still_work():
    import numpy as np

    for clock in (lambda: NOW, lambda: int(NOW), lambda: np.float64(NOW)):
        with FeedbackStore(clock=clock) as s:
            eid = s.log_event("q", DECISION, [])
            assert NOW == s.event(eid)["timestamp"]


@pytest.mark.parametrize("weights", ["[1, 2]", "null", '{"bm25": "x"}', '{"bm25": NaN}', '{"bm25": -1}',
                                     '{"q": {"bm25": Infinity}}'])
def test_a_snapshot_with_damaged_weights_is_named_damage(tmp_path: Path, weights: str) -> None:
    """rlfb writes only checked weights, so a snapshot holding others was changed outside it: every
    reader (the ensemble's refresh, weights show) gets a CorruptStateError, not a raw error or NaN; stats,
    whose counts are sound whatever the snapshot holds, names it in ``snapshot_error``."""
    path = tmp_path / "fb.db"
    store = FeedbackStore(path)
    store.save_policy_state({}, {"bm25": 0.5, "dense": 0.5}, policy="thompson")
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE policy_snapshots SET weights = ?", (weights,))
    conn.close()
    store = FeedbackStore(path)
    for read in (store.load_policy_state, store.policy_history):
        with pytest.raises(CorruptStateError, match="policy snapshot 1 .* is damaged"):
            read()
    stats = store.stats()
    assert stats["weights"] is None and stats["policy_version"] == 1 and stats["policy"] == "thompson"
    assert re.search("policy snapshot 1 .* is damaged", stats["snapshot_error"])
    store.close()


def test_another_applications_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        conn.execute("INSERT INTO orders (total) VALUES (9.5)")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(CorruptStateError, match=r"not an rlfb feedback store.*orders"):
        FeedbackStore(path)
    assert path.read_bytes() == before  # no rlfb schema written into it
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    FeedbackStore(empty).close()  # an empty file is a new store


def test_one_rule_opens_a_given_store_for_the_core_and_both_adapters(tmp_path):
    """``as_store`` is the one definition: a path is opened, a store kept, anything else refused by name, alike
    by the ensemble, the LangChain handler and the LlamaIndex adapters (which need only ``log_event``)."""
    from langchain_rlfb._checks import check_store
    from llamaindex_rlfb._store import open_store as llamaindex_open_store
    from rlfb.ensemble import open_store as ensemble_open_store
    from rlfb.store import as_store

    class LogsOnly:  # what a handler calls; an ensemble needs the snapshot calls too
        def log_event(self, *args, **kwargs):
            return "e1"

    for opener in (as_store, check_store, lambda s: llamaindex_open_store(s, None), ensemble_open_store):
        opened = opener(tmp_path / "fb.db")
        assert isinstance(opened, FeedbackStore) and opened.path == str(tmp_path / "fb.db")
        assert opener(opened) is opened
        opened.close()
        with pytest.raises(ValidationError, match="store must be a FeedbackStore or a path to an SQLite file, got int"):
            opener(5)
    logs_only = LogsOnly()
    assert check_store(logs_only) is logs_only and llamaindex_open_store(logs_only, None) is logs_only
    with pytest.raises(ValidationError, match="got LogsOnly"):
        ensemble_open_store(logs_only)
    assert as_store(None) is None and ensemble_open_store(None) is None
    with pytest.raises(ValidationError, match="got None"):
        check_store(None)


def test_a_stores_query_text_mode_is_kept_by_the_file(tmp_path):
    # set per connection only, a restart that opened a store_text=False file by its path (store_text=True by
    # default) wrote query text into it and keyed the learner by the text: the memory's hashed keys were lost
    from rlfb import FeedbackEnsemble
    from rlfb.feedback_learning import learner_query

    path = tmp_path / "private.db"
    texts = ["ocean tides follow the moon", "the aurora glows green", "volcanoes erupt magma"]

    def ensemble(store):
        return FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), policy="thompson", store=store)

    first = ensemble(FeedbackStore(path, store_text=False))
    r = first.retrieve("what causes the tides", k=2)
    first.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)
    first.close()
    again = ensemble(path)  # by its path, as the README passes stores
    assert again.store.store_text is False
    assert again.learner.memory.known(learner_query(again.store, "what causes the tides"))  # what it learned
    again.retrieve("what causes the tides", k=2)
    again.close()
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT count(*) FROM events WHERE query IS NOT NULL").fetchone()[0] == 0
    raw.close()
    with pytest.raises(ValidationError, match="keeps no query text"):
        FeedbackStore(path, store_text=True)
    assert FeedbackStore(path, store_text=False).store_text is False
    with FeedbackStore(tmp_path / "text.db") as store:  # a new file keeps text, and says so from now on
        assert store.store_text is True
    with pytest.raises(ValidationError, match="keeps query text"):
        FeedbackStore(tmp_path / "text.db", store_text=False)


def test_a_store_made_before_its_mode_was_recorded_takes_its_newest_events(tmp_path):
    path = tmp_path / "old.db"
    with FeedbackStore(path, store_text=False) as store:
        store.log_event("secret question", {"weights": {"a": 1.0}}, [{"chunk_id": "c", "rank": 1}])
    raw = sqlite3.connect(path, isolation_level=None)  # as an rlfb without the settings table left it
    raw.execute("DROP TABLE settings")
    raw.execute("DELETE FROM _migrations WHERE name = 'm010_settings'")
    raw.close()
    with FeedbackStore(path) as store:
        assert store.store_text is False


def test_odd_paths_times_and_rating_ranges_are_named_errors(tmp_path):
    # each was a bare UnicodeEncodeError, IsADirectoryError or ZeroDivisionError, or passed unnoticed
    from rlfb.errors import NonFiniteValueError
    from rlfb.reward import RewardConfig

    with pytest.raises(ValidationError, match="cannot name a file"):
        FeedbackStore(str(tmp_path / "\ud800.db"))
    with FeedbackStore(tmp_path / "fb.db") as store:
        with pytest.raises(ValidationError, match="is a directory"):
            store.export_jsonl(tmp_path)
        with pytest.raises(NonFiniteValueError):
            store.prune(now=float("nan"))  # no retention: nothing to delete, but the time is still checked
    with pytest.raises(ValidationError, match="too close"):
        RewardConfig(rating_min=0, rating_max=5e-324)


def test_opening_a_store_whose_mode_is_recorded_takes_no_write_lock(tmp_path):
    # recording the mode wrote on every opening: a store opened while another connection held the write lock
    # (a long prune, a caller's exclusive() block) waited busy_timeout, then was refused
    path = tmp_path / "fb.db"
    FeedbackStore(path).close()
    with FeedbackStore(path) as holder, holder.exclusive():
        with FeedbackStore(path, busy_timeout=0.5) as again:
            assert again.store_text is True


def test_a_store_that_mixed_both_modes_before_they_were_recorded_keeps_no_text(tmp_path):
    # the newest event alone decided: a privacy app's file that a path-opener had written text into was
    # recorded as keeping text, and the privacy app was refused its own file
    path = tmp_path / "mixed.db"
    with FeedbackStore(path, store_text=False) as store:
        store.log_event("secret question", {"weights": {"a": 1.0}}, [{"chunk_id": "c", "rank": 1}])
    raw = sqlite3.connect(path, isolation_level=None)  # as a path-opener then wrote a text event into it
    raw.execute("DROP TABLE settings")
    raw.execute("DELETE FROM _migrations WHERE name = 'm010_settings'")
    row = raw.execute("SELECT * FROM events").fetchone()
    names = [d[0] for d in raw.execute("SELECT * FROM events").description]
    text_event = {**dict(zip(names, row, strict=True)), "id": "e2", "query": "plain text"}
    raw.execute(f"INSERT INTO events ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                [text_event[n] for n in names])
    raw.close()
    with FeedbackStore(path) as store:
        assert store.store_text is False
