"""rlfb.runs and the store's run links: external retrievals, feedback by (chain) run id, follow-ups."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rlfb import FeedbackEnsemble, UnknownChunkError, UnknownEventError, ValidationError
from rlfb.runs import (
    EXTERNAL_POLICY,
    content_id,
    log_external,
    observe_followup,
    owns_event,
    record_run_feedback,
    score_value,
)
from rlfb.store import FeedbackStore

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
