"""rlfb.runs and the store's run links: external retrievals, feedback by (chain) run id, follow-ups."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rlfb import FeedbackEnsemble, UnknownChunkError, UnknownEventError, ValidationError
from rlfb.runs import (
    EXTERNAL_POLICY,
    content_id,
    key_or_score,
    learns_after_commit,
    log_external,
    observe_followup,
    owns_event,
    record_run_feedback,
    same_store,
    score_value,
)
from rlfb.store import FeedbackStore

from _four_texts import bm25_ensemble as _bm25

T0 = 1_000_000.0
SOON = T0 + 60  # a follow-up a minute after the retrieval at T0
DECISION = {"weights": {"bm25": 1.0}}


@pytest.fixture
def store() -> Iterator[FeedbackStore]:
    s = FeedbackStore()
    yield s
    s.close()


# ---------------------------------------------------------------- store: run links
def test_run_links_migration_is_applied(store: FeedbackStore) -> None:
    names = store.schema_migrations
    assert names[names.index("m006_run_links"):][:3] == ["m006_run_links", "m007_sampling_temperature",
                                                         "m008_failed_runs"]
    assert store.db["run_links"].exists() and store.db["failed_runs"].exists()


def test_a_failed_run_is_passed_by_for_feedback_but_kept_in_the_lineage(store: FeedbackStore) -> None:
    # a retry's first attempt: its retrieval must not be rated by feedback on the chain, nor judged by the
    # session's next retrieval (the second attempt), but the attempt is still a run of the chain
    store.log_event("q", DECISION, [{"chunk_id": "a"}], event_id="ret1", parent_id="attempt1", timestamp=T0)
    store.log_event("q", DECISION, [{"chunk_id": "b"}], event_id="ret2", parent_id="attempt2", timestamp=T0 + 1)
    store.link_runs([("attempt1", "retry"), ("attempt2", "retry"), ("retry", "chain")])
    assert store.resolve_run("chain") == ["ret1", "ret2"]
    assert store.fail_run("attempt1") and not store.fail_run("attempt1")  # marked once
    assert store.resolve_run("chain") == ["ret2"] and store.resolve_run("attempt1") == ["ret1"]
    assert store.run_lineage("attempt1") == ["attempt1", "retry", "chain"]
    assert store.run_failed("attempt1") and store.run_failed("ret1-child-of-nothing") is False
    store.link_runs([("inner", "attempt1")])
    assert store.run_failed("inner") and not store.run_failed("attempt2") and not store.run_failed("chain")
    assert store.fail_run("top-level-attempt") and store.run_failed("top-level-attempt")  # needs no link
    with pytest.raises(ValidationError):
        store.fail_run("")


def test_resolve_run_follows_links_down_to_nested_events(store: FeedbackStore) -> None:
    # top -> seq -> parallel -> retriever event; and a second retrieval directly under seq
    store.log_event("q1", DECISION, [{"chunk_id": "a"}], event_id="ret1", parent_id="parallel", timestamp=T0)
    store.log_event("q2", DECISION, [{"chunk_id": "b"}], event_id="ret2", parent_id="seq", timestamp=T0 + 1)
    assert store.resolve_run("top") == []  # without links, the chain's id finds nothing
    assert store.link_runs([("parallel", "seq"), ("seq", "top")]) == 2
    assert store.link_runs([("seq", "top"), ("seq", "elsewhere")]) == 0  # a run keeps its first parent
    assert store.resolve_run("top") == ["ret1", "ret2"]
    assert store.resolve_run("parallel") == ["ret1"]
    assert store.resolve_run("ret2") == ["ret2"]  # an event stands for itself
    assert store.resolve_run("unknown") == []


def test_resolve_run_survives_cycles_and_finds_linked_events(store: FeedbackStore) -> None:
    store.log_event("q", DECISION, [{"chunk_id": "a"}], event_id="ev", timestamp=T0)  # no parent_id
    store.link_runs([("ev", "chain"), ("chain", "root"), ("root", "chain")])
    assert store.resolve_run("root") == ["ev"]
    assert store.resolve_run("chain") == ["ev"]


def test_run_lineage_walks_up_the_links_and_stops_at_a_cycle(store: FeedbackStore) -> None:
    store.link_runs([("ret", "tool"), ("tool", "agent"), ("agent", "tool")])
    assert store.run_lineage("ret") == ["ret", "tool", "agent"]
    assert store.run_lineage("agent") == ["agent", "tool"]
    assert store.run_lineage("unknown") == ["unknown"]
    with pytest.raises(ValidationError):
        store.run_lineage(None)  # type: ignore[arg-type]


def test_run_links_persist_across_connections(tmp_path) -> None:
    path = tmp_path / "fb.db"
    with FeedbackStore(path) as s:
        s.log_event("q", DECISION, [{"chunk_id": "a"}], event_id="ev", parent_id="p", timestamp=T0)
        s.link_runs([("p", "top")])
    with FeedbackStore(path) as s:
        assert s.resolve_run("top") == ["ev"]


def test_link_runs_rejects_bad_ids(store: FeedbackStore) -> None:
    with pytest.raises(ValidationError):
        store.link_runs([("", "x")])
    with pytest.raises(ValidationError):
        store.link_runs([("x", None)])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        store.resolve_run("")
    assert store.link_runs([]) == 0


# ---------------------------------------------------------------- rlfb.runs
def test_log_external_marks_the_decision_and_dedupes(store: FeedbackStore) -> None:
    eid = log_external(store, "q", [("a", 2.0), ("b", float("nan")), ("a", 1.0), ("c", None)], source="vs",
                       event_id="run-1", parent_id="chain", session_id="s", timestamp=T0)
    event = store.event(eid)
    assert eid == "run-1" and event["policy"] == EXTERNAL_POLICY and event["weights"] == {"vs": 1.0}
    assert [(c["chunk_id"], c["rank"], c["score"]) for c in event["chunks"]] == [
        ("a", 1, 2.0), ("b", 2, None), ("c", 3, None)
    ]
    assert (event["parent_id"], event["session_id"]) == ("chain", "s")
    with pytest.raises(ValidationError):
        log_external(store, "q", [], source="")


def test_content_id_is_stable() -> None:
    assert content_id("x") == content_id("x") != content_id("y")
    assert content_id("\ud800 lone surrogate").startswith("sha256:")


@pytest.mark.parametrize(
    ("score", "scale", "value"),
    [(1, "unit", 1.0), (0, "unit", -1.0), (0.5, "unit", 0.0), (True, "unit", 1.0), (False, "unit", -1.0),
     (-1, "signed", -1.0), (0.25, "signed", 0.25), (False, "signed", -1.0), (True, "signed", 1.0),
     (np.False_, "unit", -1.0)],
)
def test_score_value(score: float, scale: str, value: float) -> None:
    assert score_value(score, scale) == value


@pytest.mark.parametrize(("score", "scale"), [(1.01, "unit"), (-0.5, "unit"), (2, "signed"),
                                              (float("inf"), "unit"), ("1", "unit"), (1, "percent")])
def test_bad_scores(score: object, scale: str) -> None:
    with pytest.raises(ValidationError):
        score_value(score, scale)  # type: ignore[arg-type]


@pytest.mark.parametrize("signal", ["rating", "stars", "thumbs_up"])
def test_a_score_with_a_signal_that_takes_no_score_is_refused(store: FeedbackStore, signal: str) -> None:
    # the score became a value in [-1, 1] that a rating signal read as stars: a thumbs up stored as one star
    log_external(store, "q", [("a", 1.0)], source="x", event_id="r1", timestamp=T0)
    with pytest.raises(ValidationError, match=f"signal {signal!r} takes"):
        record_run_feedback(store, "r1", score=1.0, signal=signal)
    assert store.feedback("r1") == []
    (rec,) = record_run_feedback(store, "r1", score=1.0, signal="score")
    assert rec.value == 1.0


def test_record_run_feedback_by_chain_id(store: FeedbackStore) -> None:
    log_external(store, "q1", [("a", 1.0), ("b", 0.5)], source="x", event_id="r1", parent_id="top",
                 timestamp=T0)
    log_external(store, "q2", [("c", 1.0)], source="y", event_id="r2", parent_id="top", timestamp=T0)
    records = record_run_feedback(store, "top", score=1, key="user_score", comment="ok", timestamp=T0 + 5,
                                  idempotency_key="k")
    assert [r.event_id for r in records] == ["r1", "r2"] and {r.value for r in records} == {1.0}
    assert [r.idempotency_key for r in records] == ["k:r1", "k:r2"]
    again = record_run_feedback(store, "top", score=1, timestamp=T0 + 5, idempotency_key="k")
    assert all(r.duplicate for r in again)
    (rec,) = record_run_feedback(store, "top", "click", chunk_id="c", timestamp=T0 + 6)
    assert rec.event_id == "r2" and rec.chunk_rewards == pytest.approx({"c": rec.reward})
    with pytest.raises(UnknownChunkError):
        record_run_feedback(store, "top", "click", chunk_id="zzz")
    with pytest.raises(UnknownEventError, match="no retrieval was logged under run id 'nope'"):
        record_run_feedback(store, "nope", "thumbs_up")
    with pytest.raises(ValidationError):
        record_run_feedback(store, "top", score=1, value=1.0)


@pytest.mark.parametrize(("given", "says"), [({"signal": "thumbsup"}, "unknown signal"),
                                             ({"rating": 0}, "rating"), ({"value": float("nan")}, "value")])
def test_a_bad_value_for_a_run_of_several_retrievals_is_named_without_a_batch_item(
    store: FeedbackStore, given: dict, says: str
) -> None:
    # a LlamaIndex query id stands for its retrieval and its re-ranking: the error began "feedback item 0: ",
    # which named an item of a batch the caller never made (a user's walkthrough, 2026-12-07)
    log_external(store, "q1", [("a", 1.0)], source="x", event_id="r1", parent_id="top", timestamp=T0)
    log_external(store, "q2", [("c", 1.0)], source="y", event_id="r2", parent_id="top", timestamp=T0)
    with pytest.raises(ValidationError, match=says) as info:
        record_run_feedback(store, "top", **given)
    assert "feedback item" not in str(info.value)
    assert store.feedback("r1") == store.feedback("r2") == []
    with pytest.raises(UnknownEventError, match="no retrieval was logged under run id 'nope'"):
        record_run_feedback(store, "nope", **given)  # an unknown run still says so first, as it did


def test_feedback_on_the_ensembles_own_events_is_learned() -> None:
    ens = FeedbackEnsemble.from_texts(["aurora lights", "ocean tides", "volcano lava"], retrievers=("bm25",),
                                      store=FeedbackStore(), policy="gradient")
    result = ens.retrieve("aurora", 2, event_id="mine")
    log_external(ens.store, "aurora", [("0", 1.0)], source="other", event_id="theirs")
    assert owns_event(ens, ens.store.event("mine")) and not owns_event(ens, ens.store.event("theirs"))
    assert not owns_event(None, ens.store.event("mine"))
    assert ens.store.load_policy_state() is None
    record_run_feedback(ens.store, "theirs", "thumbs_up", ensemble=ens)
    assert ens.store.load_policy_state() is None  # stored only: not this ensemble's decision
    assert result.event_id is not None
    record_run_feedback(ens.store, result.event_id, "thumbs_up", ensemble=ens)
    assert ens.store.load_policy_state() is not None


def test_observe_followup(store: FeedbackStore) -> None:
    assert observe_followup(store, "s", "anything", timestamp=SOON) == []  # no previous retrieval in the session
    log_external(store, "what causes the aurora", [("a", 1.0)], source="x", event_id="e1", session_id="s",
                 timestamp=T0)
    assert observe_followup(store, "s", "best pizza in naples", timestamp=SOON) == []  # a new topic
    (rec,) = observe_followup(store, "s", "why does the aurora happen", timestamp=SOON)
    assert (rec.event_id, rec.signal, rec.value) == ("e1", "reformulation", -0.2)
    (dup,) = observe_followup(store, "s", "why does the aurora happen", timestamp=SOON)
    assert dup.duplicate  # the same follow-up observed twice is recorded once
    with pytest.raises(ValidationError):
        observe_followup(store, "", "q")
    # asked again past the follow-up window (30 minutes): a new visit, not a judgment of the answer it got
    assert observe_followup(store, "s", "why does the aurora happen once more", timestamp=T0 + 3600) == []
    assert observe_followup(store, "s", "why does the aurora happen once more", timestamp=SOON)


def test_observe_followup_in_the_same_run_records_nothing(store: FeedbackStore) -> None:
    log_external(store, "what causes the aurora", [("a", 1.0)], source="x", event_id="e1", session_id="s",
                 parent_id="tool1", timestamp=T0)
    assert observe_followup(store, "s", "why does the aurora happen", run_ancestors=("tool1",), timestamp=SOON) == []
    # sibling tool runs: one turn only once the links say both sit under the agent's run
    store.link_runs([("tool2", "agent")])
    assert observe_followup(store, "s", "why does the aurora happen", run_ancestors=("tool2",), timestamp=SOON) != []
    store.link_runs([("tool1", "agent")])
    again = "why does the aurora happen again"
    assert observe_followup(store, "s", again, run_ancestors=("tool2",), timestamp=SOON) == []
    assert observe_followup(store, "s", again, run_ancestors=("other",), timestamp=SOON) != []


def test_a_restatement_does_not_judge_a_ranking_made_under_a_run_that_raised(tmp_path) -> None:
    # the failed attempt's ranking answered nobody, yet the next question was recorded as a reformulation on it
    with FeedbackStore(tmp_path / "fb.db") as store:
        for session, attempt in (("s1", "attempt1"), ("s2", "attempt2")):
            log_external(store, "what causes the aurora", [("a", 1.0)], source="x", event_id=f"{session}-ret",
                         session_id=session, parent_id=attempt, timestamp=T0)
        store.fail_run("attempt1")
        assert observe_followup(store, "s1", "why does the aurora happen", timestamp=SOON) == []
        assert store.feedback("s1-ret") == []
        # the same restatement after a ranking whose run went on is recorded
        (rec,) = observe_followup(store, "s2", "why does the aurora happen", timestamp=SOON)
        assert (rec.event_id, rec.signal) == ("s2-ret", "reformulation")


def test_a_store_of_before_failed_runs_is_migrated(tmp_path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    FeedbackStore(path).close()
    with sqlite3.connect(path) as raw:  # as rlfb left a store before the marks of failed runs
        raw.execute("DELETE FROM _migrations WHERE name = 'm008_failed_runs'")
        raw.execute("DROP TABLE failed_runs")
    with FeedbackStore(path) as store:
        assert store.migrations_applied == ["m008_failed_runs"]
        assert store.fail_run("attempt") and store.run_failed("attempt")


def test_observe_followup_takes_an_implicit_whose_infer_predates_the_follow_up_time(store: FeedbackStore) -> None:
    # infer(..., at=) broke a subclass or stand-in written against the old signature: a bare TypeError, which a
    # LangChain callback only prints
    from rlfb.implicit import ImplicitSignals

    class Older(ImplicitSignals):
        def infer(self, previous_event, query, dwell_seconds=None, cited=(), opened=()):  # type: ignore[override]
            return super().infer(previous_event, query, dwell_seconds, cited, opened)

    log_external(store, "what causes the aurora", [("a", 1.0)], source="x", event_id="e1", session_id="s",
                 timestamp=T0)
    (rec,) = observe_followup(store, "s", "why does the aurora happen", implicit=Older(), timestamp=SOON)
    assert rec.signal == "reformulation"


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_key_or_score_refuses_a_key_and_a_score_both_positional() -> None:
    """Bug: ``record_feedback(run_id, "user_score", 1.0)`` was taken (three positional arguments where the
    signature takes the run id and one key or score), silently, for a call LangSmith's API does not have."""
    with pytest.raises(ValidationError, match="positional"):
        key_or_score(("user_score", 1.0), None, None, "record_feedback")
    assert key_or_score((1.0,), "user_score", None, "record_feedback") == ("user_score", 1.0, None)


def test_two_files_opened_under_one_relative_name_are_two_stores(tmp_path: Path, monkeypatch) -> None:
    """Bug: a store's relative path was resolved when compared, not when opened: ``fb.db`` opened in A and
    ``fb.db`` opened in B after a chdir were taken for one database."""
    for name in ("A", "B"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "A")
    with FeedbackStore("fb.db") as a:
        monkeypatch.chdir(tmp_path / "B")
        with FeedbackStore("fb.db") as b:
            assert not same_store(a, b)
            assert same_store(a, tmp_path / "A" / "fb.db") and same_store(b, "fb.db")


def test_one_store_file_under_two_spellings_is_one_store_and_its_maker_learns(tmp_path: Path) -> None:
    """Bug: store paths compared as written: the file reached through a symlink (or ``dir/../f.db``) was taken
    for another database, so feedback recorded through it was not learned by the ensemble that made the
    decision on the same file."""
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    real, linked = tmp_path / "data" / "f.db", tmp_path / "link" / "f.db"
    assert same_store(str(real), str(linked))
    assert same_store(str(real), str(tmp_path / "data" / "sub" / ".." / "f.db"))
    ens = _bm25(FeedbackStore(real))
    r = ens.retrieve("what causes the tides", k=2)
    assert r.event_id is not None
    with FeedbackStore(linked) as other:
        record_run_feedback(other, r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    assert ens.learner.n_learned == 1
    ens.close()


def test_feedback_on_an_external_retrieval_named_like_the_ensembles_retriever_is_not_learned(
    tmp_path: Path,
) -> None:
    """Bug: an event ``log_external`` logged with ``source="bm25"`` names the retrievers a BM25-only ensemble has,
    so without the check of its policy the ensemble learned another engine's ranking as its own decision."""
    store = FeedbackStore(tmp_path / "f.db")
    ens = _bm25(store)
    eid = log_external(store, "what causes the tides", [("tides", 3.0), ("aurora", 1.0)], source="bm25")
    ens.feedback(eid, "click", chunk_id="tides")
    record_run_feedback(store, eid, "thumbs_up", ensemble=ens)
    assert len(store.feedback(eid)) == 2  # stored, both
    assert ens.learner.n_learned == 0  # learned, neither
    ens.close()


def test_an_explicit_ensembles_entry_wins_over_the_events_maker(tmp_path: Path) -> None:
    """Bug: the live maker of an event was asked before the ``ensembles`` mapping the caller passed, so an adapter
    naming the learner of each of its events had its choice overridden."""
    store = FeedbackStore(tmp_path / "f.db")
    maker, named = _bm25(store), _bm25(store)
    r = maker.retrieve("what causes the tides", k=2)
    assert r.event_id is not None
    record_run_feedback(store, r.event_id, "click", chunk_id=r.hits[0].chunk_id, ensembles={r.event_id: named})
    assert (named.learner.n_learned, maker.learner.n_learned) == (1, 0)
    maker.close()
    named.close()


def test_an_idempotency_key_given_with_its_event_suffix_is_kept_as_given(tmp_path: Path) -> None:
    """Bug: a key already ending in ``:<event id>`` got the suffix a second time (``k:e1:e1``), so a retry that
    gave the bare key (``k``, made ``k:e1``) was not a duplicate: the feedback was stored, and learned, twice."""
    store = FeedbackStore(tmp_path / "f.db")
    eid = log_external(store, "q", [("a", 1.0)], source="web")
    record_run_feedback(store, eid, "click", chunk_id="a", idempotency_key=f"k:{eid}")
    again = record_run_feedback(store, eid, "click", chunk_id="a", idempotency_key="k")
    assert [f["idempotency_key"] for f in store.feedback(eid)] == [f"k:{eid}"]
    assert again[0].duplicate
    store.close()


def test_learns_after_commit_tells_another_connection_from_the_same_one(tmp_path: Path) -> None:
    """Bug: the comparison inverted, a handler holding its own connection to the learner's file recorded and
    learned in one transaction, and the learner waited on the handler's write lock (``StoreBusyError``); the
    learner's own store object was committed first for nothing."""
    path = tmp_path / "f.db"
    ens = _bm25(FeedbackStore(path))
    r = ens.retrieve("what causes the tides", k=2)
    with FeedbackStore(path) as other:
        assert learns_after_commit(other, r.event_id) is True
    assert learns_after_commit(ens.store, r.event_id) is False
    ens.close()
