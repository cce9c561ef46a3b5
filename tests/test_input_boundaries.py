"""Bad input found by a boundary audit (2026-12-06, twenty-first session): each is refused by name before
anything is written, where it was taken wrongly (a mapping of texts, an empty store path, a misspelt chunk-row
key) or failed deep inside (a chunk of the wrong types, a generator of weights, a mistyped event id read back)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from rlfb import Chunk, FeedbackEnsemble, FeedbackStore, SearchMember
from rlfb.errors import NonFiniteValueError, UnknownEventError, ValidationError

TEXTS = ["geysers erupt hot water", "rain falls from clouds", "the aurora follows the solar wind"]


def _ens(**kwargs: Any) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), **kwargs)


def test_a_mapping_of_texts_is_refused_not_indexed_by_its_keys() -> None:
    texts = {"doc-1": "Geysers erupt hot water", "doc-2": "Rain falls"}
    with pytest.raises(ValidationError, match="not a mapping.*texts=list"):
        FeedbackEnsemble.from_texts(texts, retrievers=("bm25",))  # type: ignore[arg-type]
    ens = _ens()
    with pytest.raises(ValidationError, match="not a mapping"):
        ens.add_texts(texts)
    with pytest.raises(ValidationError, match="ids must be a sequence of strings, not a mapping"):
        ens.add_texts(["a new text"], ids={"x": 1})  # type: ignore[arg-type]
    assert len(ens) == len(TEXTS) and "doc-1" not in {c.text for c in ens.chunks.chunks()}
    # the shape it names works
    built = FeedbackEnsemble.from_texts(list(texts.values()), ids=list(texts), retrievers=("bm25",))
    assert {c.id: c.text for c in built.chunks.chunks()} == texts


def test_an_empty_store_path_is_refused_not_a_throwaway_database(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="database path is empty"):
        FeedbackStore("")
    with pytest.raises(ValidationError, match="database path is empty"):
        _ens(store="")
    assert FeedbackStore(":memory:").counts()["events"] == 0  # the named in-memory form still works


@pytest.mark.parametrize(
    ("chunk", "match"),
    [
        (Chunk("x", "tides", [1]), "metadata of type list"),  # type: ignore[arg-type]
        (Chunk(["a"], "tides"), "id must be a non-empty string"),  # type: ignore[arg-type]
        (Chunk("x", 7), "text of type int"),  # type: ignore[arg-type]
    ],
)
def test_a_chunk_of_the_wrong_types_is_named_in_rerank_and_from_a_member(chunk: Chunk, match: str) -> None:
    ens = _ens()
    with pytest.raises(ValidationError, match="rerank: .*" + match):
        ens.rerank("aurora", [chunk])
    member = SearchMember("web", lambda query, k: [(chunk, 1.0)])
    with pytest.raises(ValidationError, match="member 'web': .*" + match):
        member.search("aurora", 3)


def test_a_misspelt_chunk_row_key_is_refused_and_nothing_is_logged() -> None:
    store = FeedbackStore(":memory:")
    decision = {"weights": {"bm25": 1.0}}
    with pytest.raises(ValidationError, match=r"unknown key\(s\) \['usd'\]"):
        store.log_event("q", decision, [{"chunk_id": "a", "rank": 1, "usd": False}, {"chunk_id": "b", "rank": 2}])
    assert store.counts()["events"] == 0
    # what the store gives back for a chunk is a row it takes again
    eid = store.log_event("q", decision, [{"chunk_id": "a", "rank": 1, "used": False}])
    again = store.log_event("q", decision, store.event(eid)["chunks"])
    assert store.event(again)["chunks"] == store.event(eid)["chunks"]


def test_proposed_by_is_read_once_and_a_number_is_named() -> None:
    store = FeedbackStore(":memory:")
    decision = {"weights": {"bm25": 1.0}}
    eid = store.log_event("q", decision, [{"chunk_id": "a", "proposed_by": (x for x in ["bm25", "dense"])}])
    assert store.event(eid)["chunks"][0]["proposed_by"] == ["bm25", "dense"]  # it was stored []
    with pytest.raises(ValidationError, match="proposed_by must be a sequence"):
        store.log_event("q", decision, [{"chunk_id": "a", "proposed_by": 5}])  # a bare TypeError before


def test_set_weights_takes_a_generator() -> None:
    ens = _ens(policy="fixed")
    # "expected 1 weights, got 0" before (a generator, read once)
    assert ens.set_weights(w for w in [2.0]).weights == {"bm25": 1.0}
    ens.learner.set_weights(w for w in [1.0])
    assert ens.learner.weights() == {"bm25": 1.0}


def test_reading_feedback_of_an_unknown_event_is_named() -> None:
    store = FeedbackStore(":memory:")
    with pytest.raises(UnknownEventError, match="nope"):
        store.feedback("nope")  # [] before, read as "no feedback yet"
    with pytest.raises(UnknownEventError, match="nope"):
        store.chunk_reward_sums("nope")  # {} before
    eid = store.log_event("q", {"weights": {"bm25": 1.0}}, [{"chunk_id": "a"}])
    assert store.feedback(eid) == [] and store.chunk_reward_sums(eid) == {}  # a logged event without feedback


def test_feedback_on_a_retrieval_that_was_not_logged_says_so() -> None:
    # RetrievalResult.event_id is None for a retrieval that was not logged; feedback took only a str, so the
    # README's own ens.feedback(res.event_id, ...) failed a user's type check, and None at run time got "must be a
    # non-empty str, got NoneType None", which named no cause
    ens = _ens(store=FeedbackStore(":memory:"))
    res = ens.retrieve("aurora", k=2, log=False)
    assert res.event_id is None
    for call in (lambda: ens.feedback(res.event_id, "click"), lambda: ens.store.record_feedback(res.event_id, "click"),
                 lambda: ens.store.event(res.event_id), lambda: ens.store.feedback(res.event_id),
                 lambda: ens.store.event_reward(res.event_id)):
        with pytest.raises(ValidationError, match=r"event_id is None: the retrieval was not logged \(retrieve"):
            call()
    assert ens.store.counts()["feedback"] == 0 and ens.learner.n_learned == 0


def test_an_integer_too_long_for_text_is_not_called_nan() -> None:
    store = FeedbackStore(":memory:")
    with pytest.raises(ValidationError, match="cannot be stored as JSON") as info:
        store.log_event("q", {"weights": {"bm25": 1.0}}, [{"chunk_id": "a"}], metadata={"n": 10**5000})
    assert not isinstance(info.value, NonFiniteValueError)
    with pytest.raises(NonFiniteValueError):
        store.log_event("q", {"weights": {"bm25": 1.0}}, [{"chunk_id": "a"}], metadata={"n": float("nan")})
    assert store.counts()["events"] == 0


def test_an_export_path_with_a_nul_character_is_named(tmp_path: Path) -> None:
    store = FeedbackStore(":memory:")
    with pytest.raises(ValidationError, match="NUL character"):
        store.export_jsonl("a\x00b")  # a bare ValueError from os.path.samefile before


def test_a_bare_store_write_is_documented_as_unlearned(tmp_path: Path) -> None:
    # FeedbackStore.record_feedback only stores (its docstring says so); record_run_feedback is learned by the
    # live ensemble that made the retrieval, which then learns the row stored alone too (it is owed: until a later
    # audit of 2026-12-06, run feedback left such rows to the next retrieval)
    from rlfb.runs import record_run_feedback

    path = str(tmp_path / "fb.db")
    ens = _ens(store=path)
    first, second = ens.retrieve("aurora solar", k=2), ens.retrieve("geysers", k=2)
    FeedbackStore(path).record_feedback(first.event_id, "thumbs_up")
    assert ens.learner.n_learned == 0
    assert second.event_id is not None
    record_run_feedback(FeedbackStore(path), second.event_id, "thumbs_up")
    assert ens.learner.n_learned == 2
    assert "stores it only" in FeedbackStore.record_feedback.__doc__
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM feedback").fetchone()[0] == 2


@pytest.mark.parametrize(
    ("metadata", "match"),
    [({"n": 10**5000}, "integer of more digits"), ("deep", "nested deeper than 200 levels")],
)
def test_metadata_a_save_cannot_write_is_named_not_a_bare_error(tmp_path: Path, metadata: Any, match: str) -> None:
    if metadata == "deep":  # json.dumps and the check itself raised RecursionError at about 990 and 3,000 levels
        inner: dict[str, Any] = {}
        metadata = inner
        for _ in range(3000):
            inner["a"] = {}
            inner = inner["a"]
    ens = FeedbackEnsemble.from_texts(["tides follow the moon"], metadatas=[metadata], retrievers=("bm25",))
    with pytest.raises(ValidationError, match=match):
        ens.save(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()


def _nested(levels: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    inner = out
    for _ in range(levels - 1):
        inner["a"] = {}
        inner = inner["a"]
    return out


def test_chunk_metadata_nesting_is_refused_just_past_its_bound(tmp_path: Path) -> None:
    from rlfb.store.codec import MAX_DEPTH

    FeedbackEnsemble.from_texts(["tides"], metadatas=[_nested(MAX_DEPTH)], retrievers=("bm25",)).save(
        tmp_path / "at")
    with pytest.raises(ValidationError, match="nested deeper"):
        FeedbackEnsemble.from_texts(["tides"], metadatas=[_nested(MAX_DEPTH + 1)], retrievers=("bm25",)).save(
            tmp_path / "past")


def test_a_chunk_of_an_empty_id_is_named() -> None:
    with pytest.raises(ValidationError, match="id must be a non-empty string"):
        _ens().rerank("aurora", [Chunk("", "tides")])


def test_feedback_through_a_learner_on_another_file_is_learned_where_the_event_is_not(tmp_path: Path) -> None:
    # record_run_feedback(A, ..., ensemble=ens_on_B) whose decision A logged: the learner read the earlier
    # feedback of the event from its own store B, which never saw it; an UnknownEventError after the row was
    # committed in A (a retry with the idempotency key was then a duplicate, never learned)
    import gc

    from rlfb.runs import record_run_feedback

    a, b = FeedbackStore(tmp_path / "a.db"), FeedbackStore(tmp_path / "b.db")
    maker = FeedbackEnsemble.from_texts(TEXTS, ids=["a", "b", "c"], retrievers=("bm25",), policy="gradient", store=a)
    event_id = maker.retrieve("aurora").event_id
    assert event_id is not None
    del maker
    gc.collect()  # the ensemble that made it is gone: the one given learns it
    other = FeedbackEnsemble.from_texts(TEXTS, ids=["a", "b", "c"], retrievers=("bm25",), policy="gradient", store=b)
    records = record_run_feedback(a, event_id, "thumbs_up", ensemble=other, idempotency_key="k")
    assert [r.event_id for r in records] == [event_id] and other.learner.n_learned == 1
    assert a.counts()["feedback"] == 1
