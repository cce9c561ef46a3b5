"""What the public calls return, for the type checker as well as at run time.

``make lint`` type-checks this file: each ``assert_type`` fails it if a public return type becomes ``Any`` or
another type again (``FeedbackEnsemble.feedback`` returned ``Any``, so a typed app's ``record.reward`` was never
checked), and each ``isinstance`` fails the test if the call returns something else than its annotation says.
"""

from __future__ import annotations

from pathlib import Path

from typing_extensions import assert_type

from rlfb import FeedbackEnsemble
from rlfb.learner import Learner
from rlfb.store import FeedbackRecord

from _corpus import IDS, TEXTS


def test_feedback_returns_the_stored_record(tmp_path: Path) -> None:
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=tmp_path / "fb.db",
                                      policy="thompson")
    res = ens.retrieve("what causes tides", k=3)
    record = assert_type(ens.feedback(res.event_id, "explicit_positive"), FeedbackRecord)
    assert isinstance(record, FeedbackRecord) and record.event_id == res.event_id and record.reward > 0
    assert ens.store is not None and ens.store.feedback(res.event_id)[0]["id"] == record.feedback_id


def test_observe_returns_one_record_per_signal(tmp_path: Path) -> None:
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=tmp_path / "fb.db",
                                      policy="thompson")
    res = ens.retrieve("what causes tides", k=3, session_id="s1")
    records = assert_type(ens.observe("s1", cited=[res.hits[0].chunk_id]), list[FeedbackRecord])
    assert len(records) == 1 and isinstance(records[0], FeedbackRecord)
    assert records[0].chunk_id == res.hits[0].chunk_id


def test_learner_is_typed() -> None:
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="thompson")
    learner = assert_type(ens.learner, Learner)
    assert isinstance(learner, Learner) and learner.n_learned == 0
