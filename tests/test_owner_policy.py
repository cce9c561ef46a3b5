"""Apps of other policies on one store file learn apart: feedback on one app's decision is not learned by an app of
another policy with the same retrievers (an audit of 2026-12-06 found a gradient app learning a thompson app's)."""

from __future__ import annotations

from pathlib import Path

from rlfb import FeedbackEnsemble
from rlfb.runs import owns_event

TEXTS = ["solar wind drives the aurora", "the moon pulls the tides", "magma feeds volcanoes", "ice carves valleys",
         "sand dunes drift", "coral reefs grow slowly"]


def app(path: Path, policy: str) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), policy=policy, store=str(path))


def test_an_app_of_another_policy_does_not_learn_a_decision_it_did_not_make(tmp_path: Path) -> None:
    db = tmp_path / "fb.db"
    x = app(db, "thompson")
    events = [x.retrieve(q, k=3) for q in ("aurora", "tides", "volcanoes")]
    x.close()  # gone (a restart): no live maker to hand the feedback to
    y = app(db, "gradient")
    logged = y.store.event(events[0].event_id)
    assert logged["policy"] == "thompson" and not owns_event(y, logged)
    before = y.learner.n_learned
    records = [y.feedback(r.event_id, "implicit_positive", chunk_id=r.hits[0].chunk_id) for r in events]
    assert all(not r.duplicate for r in records) and y.store.counts()["feedback"] == 3  # stored, nothing lost
    assert y.learner.n_learned == before  # not learned from another policy's propensities
    mine = y.retrieve("valleys", k=3)
    y.feedback(mine.event_id, "implicit_positive", chunk_id=mine.hits[0].chunk_id)
    assert y.learner.n_learned == before + 1  # its own decisions as before
    y.close()


def test_a_live_app_of_the_policy_that_decided_learns_it_when_another_is_given_the_feedback(tmp_path: Path) -> None:
    db = tmp_path / "fb.db"
    x, y = app(db, "thompson"), app(db, "gradient")
    r = x.retrieve("aurora", k=3)
    y.feedback(r.event_id, "implicit_positive", chunk_id=r.hits[0].chunk_id)
    assert (x.learner.n_learned, y.learner.n_learned) == (1, 0)
    x.close()
    y.close()


def test_an_event_that_names_no_policy_is_matched_by_its_retrievers_as_before(tmp_path: Path) -> None:
    y = app(tmp_path / "fb.db", "gradient")
    assert owns_event(y, {"retrievers": ["bm25"], "policy": None})
    assert not owns_event(y, {"retrievers": ["bm25", "dense"], "policy": None})
    assert not owns_event(y, {"retrievers": ["bm25"], "policy": "thompson"})
    y.close()
