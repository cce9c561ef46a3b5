"""The ensemble at its boundaries: shared stores, loads over a live store, damaged rows, odd input."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlfb import CorruptStateError, FeedbackEnsemble, ValidationError
from rlfb.members import SearchMember
from rlfb.retrievers.base import model_text
from rlfb.store import FeedbackStore
from rlfb.types import Chunk, make_chunks

from _corpus import IDS, TEXTS


def _bm25(store: Any = None, **kwargs: Any) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=store, policy="thompson",
                                       **kwargs)


def _learn(ens: FeedbackEnsemble, n: int) -> None:
    for i in range(n):
        r = ens.retrieve(f"what causes tides {i}", k=3)
        ens.feedback(r.event_id, "explicit_positive", chunk_id=r.hits[0].chunk_id)


# -- one store, several ensembles ----------------------------------------------------------------------
def test_ensembles_of_other_retrievers_share_a_store_without_breaking_each_other(tmp_path: Path) -> None:
    """Each keeps its own state: a snapshot of another retriever set is skipped, as one of another policy is."""
    db = tmp_path / "fb.db"
    both = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"), store=db, policy="thompson",
                                       refresh_interval=0)
    alone = _bm25(db, refresh_interval=0)
    _learn(both, 2)
    _learn(alone, 2)  # reading the other's snapshot raised CorruptStateError, after storing the feedback
    _learn(both, 1)
    assert alone.learner.n_learned == 2 and both.learner.n_learned == 3
    assert alone.retrieve("tides", k=1).hits and set(alone.weights) == {"bm25"}
    # a new one goes on from its own newest snapshot, paging back past both's later one (it started afresh)
    assert _bm25(db).learner.n_learned == 2
    assert FeedbackStore(db).counts()["feedback"] == 5  # each feedback stored once


def test_loading_an_older_save_does_not_roll_the_live_store_back(tmp_path: Path) -> None:
    db = tmp_path / "fb.db"
    ens = _bm25(db)
    _learn(ens, 3)
    ens.save(tmp_path / "saved")
    _learn(ens, 7)
    ens.close()
    back = FeedbackEnsemble.load(tmp_path / "saved", store=db)
    assert back.learner.n_learned == 10  # the store learned more since the save: its state is kept
    _learn(back, 1)
    assert _bm25(db).learner.n_learned == 11
    fresh = FeedbackEnsemble.load(tmp_path / "saved", store=tmp_path / "new.db")
    assert fresh.learner.n_learned == 3  # a store with less (here nothing) takes the save's state


def test_a_save_that_wins_over_a_live_store_is_written_to_it_and_weights_set_since_are_kept(tmp_path: Path) -> None:
    # the save's state stayed in the loading process alone: the next snapshot another worker wrote replaced it
    # (40 episodes, then 4), and a restart never saw it; weights set on the store after the save (learned from
    # no feedback, so counted as no more learned) were rolled back by the load, then written over by it
    trained = _bm25(tmp_path / "train.db")
    _learn(trained, 6)
    trained.save(tmp_path / "saved")
    trained.close()
    live = tmp_path / "live.db"
    other = _bm25(live, seed=1, refresh_interval=0)
    _learn(other, 2)
    loaded = FeedbackEnsemble.load(tmp_path / "saved", store=live, refresh_interval=0)
    assert loaded.learner.n_learned == 6
    _learn(other, 1)  # on top of the save's state, now the store's
    assert other.learner.n_learned == 7 and loaded.refresh() and loaded.learner.n_learned == 7
    assert _bm25(live).learner.n_learned == 7
    for ens in (other, loaded):
        ens.close()

    fixed = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"), policy="fixed",
                                        store=tmp_path / "w.db")
    fixed.save(tmp_path / "fixed")
    fixed.set_weights({"bm25": 0.9, "dense": 0.1})
    fixed.close()
    back = FeedbackEnsemble.load(tmp_path / "fixed", store=tmp_path / "w.db")
    assert back.weights == pytest.approx({"bm25": 0.9, "dense": 0.1})
    back.close()
    with FeedbackStore(tmp_path / "w.db") as store:
        snapshot = store.load_policy_state()
        assert snapshot is not None and snapshot["weights"] == pytest.approx({"bm25": 0.9, "dense": 0.1})


def test_a_save_with_members_asks_for_them_on_load(tmp_path: Path) -> None:
    member = SearchMember("web", lambda q, k: [(Chunk("w1", "tides on the web"), 1.0)])
    FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), members=[member]).save(tmp_path / "s")
    with pytest.raises(ValidationError, match="members="):
        FeedbackEnsemble.load(tmp_path / "s")
    assert "web" in FeedbackEnsemble.load(tmp_path / "s", members=[member]).weights


# -- damaged rows and files ----------------------------------------------------------------------------
@pytest.mark.parametrize("sql, stored", [
    ("UPDATE event_chunks SET normalized = 'zz'", 1),  # the feedback itself can be checked and kept
    ("UPDATE events SET weights = 'zz'", 1),
    ("UPDATE events SET features = '[1'", 1),
    ("UPDATE events SET ts = 'abc'", 0),  # the feedback cannot be checked against the event: refused
    ("UPDATE events SET chunk_ids = '{'", 0),
])
def test_feedback_on_a_damaged_event_row_is_a_named_error_not_a_raw_one(tmp_path: Path, sql: str,
                                                                        stored: int) -> None:
    db = tmp_path / "fb.db"
    ens = _bm25(db)
    r = ens.retrieve("tides and the moon", k=3)
    with sqlite3.connect(db) as conn:
        conn.execute(sql)
    conn.close()
    before = ens.learner.n_learned
    with pytest.raises(CorruptStateError, match="damaged"):
        ens.feedback(r.event_id, "explicit_positive", idempotency_key="k1")
    assert ens.learner.n_learned == before
    assert FeedbackStore(db).counts()["feedback"] == stored


def test_lone_surrogates_save_load_and_encode(tmp_path: Path) -> None:
    """Python strings may hold them, UTF-8 may not: the save escapes them, the models get a stand-in."""
    ens = FeedbackEnsemble.from_texts(["\ud800 tides", "café"], ids=["\udc00", "b"],
                                      metadatas=[{"o": "\ud800"}, None], retrievers=("bm25",))
    ens.save(tmp_path / "s")
    back = FeedbackEnsemble.load(tmp_path / "s")
    assert back.chunks.ids == ["\udc00", "b"] and back.chunk("\udc00").metadata == {"o": "\ud800"}
    assert back.chunk("b").text == "café" and "café" in (tmp_path / "s" / "chunks.jsonl").read_text("utf-8")
    assert model_text("a \udc00 b") == "a ? b"
    dense = FeedbackEnsemble.from_texts(["a \udc00 tides text", "volcanoes"], ["0", "1"], retrievers=("dense",))
    assert dense.retrieve("\ud800 tides", k=1, log=False).hits[0].chunk_id == "0"


# -- bad input at the door -----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{"store": 5}, {"refresh_interval": "x"}, {"refresh_interval": float("nan")},
                                    {"persist_interval": -1}, {"persist_interval": True}])
def test_bad_ensemble_settings_are_validation_errors(kwargs: dict) -> None:
    with pytest.raises(ValidationError):
        _bm25(**kwargs)


def test_bad_inputs_get_named_errors_and_change_nothing(tmp_path: Path) -> None:
    ens = _bm25(tmp_path / "fb.db")
    with pytest.raises(ValidationError, match="query"):
        ens.weights_for(None)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="one string"):
        ens.retrieve_batch("abc")  # would have logged one retrieval per character
    for bad in ("no", 1, None):
        with pytest.raises(ValidationError, match="explore"):
            ens.retrieve("tides", explore=bad)  # type: ignore[arg-type]
    for bad in (None, 5, "doc1"):
        with pytest.raises(ValidationError):
            ens.delete_chunks(bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="strings"):
        ens.delete_chunks([7])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        ens.rerank("tides", None)  # type: ignore[arg-type]
    assert FeedbackStore(tmp_path / "fb.db").counts()["events"] == 0 and len(ens) == len(TEXTS)
    # numpy integers are integers (the ignore: retrieve's k is annotated int)
    assert len(ens.retrieve("tides", k=np.int64(2), log=False).hits) == 2  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs, match", [
    ({"ids": "ab"}, "one string"),
    ({"ids": [7, 8]}, "strings"),
    ({"ids": ["a", None]}, "strings"),
    ({"metadatas": ["abc", None]}, "mapping"),
    ({"metadatas": [[1, 2], None]}, "mapping"),
    ({"metadatas": {"a": 1}}, "one mapping"),
])
def test_make_chunks_refuses_what_it_would_silently_change(kwargs: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        make_chunks(["x", "y"], **kwargs)


def test_one_retriever_name_is_one_name() -> None:
    assert FeedbackEnsemble.from_texts(TEXTS, retrievers="bm25").retriever_names == ("bm25",)


def test_the_package_exports_what_the_readme_uses_and_stays_light_to_import() -> None:
    # FeedbackStore, SearchMember and ReadOnlyStoreError, which the README uses, were not importable from rlfb
    import subprocess
    import sys

    import rlfb

    for name in rlfb.__all__:
        assert getattr(rlfb, name) is not None, name
    assert {"FeedbackStore", "SearchMember", "ReadOnlyStoreError", "RatingOutOfRangeError"} <= set(rlfb.__all__)
    assert issubclass(rlfb.ReadOnlyStoreError, rlfb.RlfbError)
    # dir() lists every public name, the lazily loaded store included (it did not), and loads nothing
    code = ("import sys, rlfb; names = dir(rlfb); "
            "print('rlfb.store' in sys.modules, 'torch' in sys.modules, set(rlfb.__all__) <= set(names))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True"]


def test_a_store_of_the_users_own_without_a_lock_still_works() -> None:
    # the store's lock, taken before the ensemble's, was read from every store: one of the user's own
    # (log_event, state_version, load_policy_state) raised AttributeError on the first retrieval
    from rlfb import FeedbackEnsemble

    class MyStore:
        store_text = True

        def __init__(self) -> None:
            self.events: list[str] = []

        def log_event(self, query: str, decision: object, chunks: object, **kwargs: object) -> str:
            self.events.append(query)
            return f"e{len(self.events)}"

        def state_version(self) -> int:
            return 0

        def load_policy_state(self, policy: str | None = None) -> None:
            return None

    ens = FeedbackEnsemble.from_texts(["alpha beta", "gamma delta", "beta gamma"], retrievers=("bm25",),
                                      store=MyStore())
    assert ens.retrieve("beta", k=2).event_id == "e1"


@pytest.mark.parametrize(("package", "framework", "extra"), [("langchain_rlfb", "langchain_core", "langchain"),
                                                             ("llamaindex_rlfb", "llama_index", "llamaindex")])
def test_an_adapter_without_its_framework_names_the_extra_to_install(package: str, framework: str,
                                                                     extra: str) -> None:
    # a core-only install gave a bare "No module named 'langchain_core'", with no word of rlfb's extras
    import subprocess
    import sys

    code = (f"import sys; sys.modules[{framework!r}] = None\n"  # as if the framework were not installed
            f"try:\n    import {package}\nexcept ModuleNotFoundError as exc:\n    print(exc.name); print(exc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    name, message = out.split("\n", 1)
    assert name.split(".")[0] == framework
    assert f'pip install "rlfb[{extra}]"' in message


def test_save_load_and_retrieve_batch_refuse_bad_arguments_by_name(tmp_path: Path) -> None:
    # each was a bare TypeError, ValueError or UnicodeEncodeError; retrieve_batch(event_id=) logged the first
    # retrieval before refusing the second, and a member's int score beyond float range was an OverflowError
    from rlfb.errors import NonFiniteValueError
    from rlfb.runs import score_value

    ens = _bm25(tmp_path / "fb.db")
    for path, words in ((None, "got NoneType"), (5, "got int"), ("x\x00", "NUL"), ("\ud800", "cannot name a file")):
        with pytest.raises(ValidationError, match=words):
            ens.save(path)  # type: ignore[arg-type]
    ens.save(tmp_path / "saved")
    with pytest.raises(ValidationError, match="takes no option 'bogus'"):
        FeedbackEnsemble.load(tmp_path / "saved", bogus=1)
    with pytest.raises(ValidationError, match="members must be a list"):
        FeedbackEnsemble.load(tmp_path / "saved", members=5)
    with pytest.raises(ValidationError, match="got NoneType"):
        FeedbackEnsemble.load(None)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="event_id names one retrieval"):
        ens.retrieve_batch(["tides", "aurora"], k=1, event_id="X")
    assert not ens.store.has_event("X")
    for queries in (5, {"tides": 1}):
        with pytest.raises(ValidationError, match="queries must be a sequence"):
            ens.retrieve_batch(queries)  # type: ignore[arg-type]
    for score, words in ((10**400, "beyond float range"), ("1.0", "each result must be")):
        member = SearchMember("web", lambda q, k, s=score: [(Chunk("w", "tides on the web"), s)])  # type: ignore[misc]
        with pytest.raises(ValidationError, match=words):
            FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), members=[member]).retrieve("tides")
    with pytest.raises(NonFiniteValueError, match="beyond float range"):
        score_value(10**400)


def test_an_empty_chunk_id_is_refused_where_chunks_are_indexed() -> None:
    # indexed, logged and rated, it was refused by mark_unused (which the LlamaIndex handler calls when a later
    # step cuts nodes), so a chunk could be learned about but not marked
    with pytest.raises(ValidationError, match="chunk ids must not be empty"):
        FeedbackEnsemble.from_texts(["aurora", "tides"], ids=["", "b"], retrievers=("bm25",))
    with pytest.raises(ValidationError, match="chunk ids must not be empty"):
        FeedbackEnsemble.from_chunks([Chunk("", "aurora"), Chunk("b", "tides")], retrievers=("bm25",))
