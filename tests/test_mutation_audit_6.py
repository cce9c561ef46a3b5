"""Behaviours a hand-made mutation audit of the ensemble, its corpus index, the snapshot sync, the run-id helpers,
BM25 and the retriever base found no test for. Each test names the bug it guards against.

Covered: a restart with the weights the store already holds writes no snapshot; a retrieval's result names the
question as asked when the store keeps only hashes; a retriever indexing other ids (with the same texts) is
refused; an infinite ``persist_interval`` writes only when forced, and ``MAX_UNSAVED`` unwritten episodes force a
write; ``key_or_score`` refuses a key and a score both positional; one store file under two spellings of its path
is one store, and its maker learns feedback given through the other; feedback on an external retrieval whose
source shares the ensemble's retriever name is not learned; an explicit ``ensembles`` entry wins over the
event's maker; an idempotency key given already ending in ``:<event id>`` is kept as given; ``learns_after_commit``
tells another connection from the same one; a BM25 update after a delete with ATIRE's IDF warns of nothing;
``ChunkTable.changed`` with one id both deleted and upserted; ``dense_retriever`` never takes SPLADE; and
``reused_rows`` trusts a table's recorded origin only for the table it came from.
"""

from __future__ import annotations

import math
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlfb import FeedbackEnsemble, ValidationError, snapshot_sync
from rlfb.retrievers.base import ChunkTable, dense_retriever
from rlfb.retrievers.bm25 import BM25Retriever
from rlfb.runs import key_or_score, learns_after_commit, log_external, record_run_feedback, same_store
from rlfb.store import FeedbackStore
from rlfb.types import make_chunks

TEXTS = [
    "tides are caused by the moon and the sun",
    "the aurora is caused by charged particles from the sun",
    "volcanoes erupt molten rock from the mantle",
    "sourdough bread rises with wild yeast",
]
IDS = ["tides", "aurora", "volcanoes", "bread"]


def _bm25(store: Any = None, **kwargs: Any) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=store, **kwargs)


def _click(ens: FeedbackEnsemble, query: str = "what causes the tides") -> str:
    r = ens.retrieve(query, k=2)
    ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    assert r.event_id is not None
    return r.event_id


# ---------------------------------------------------------------- ensemble
def test_a_restart_with_the_weights_the_store_holds_writes_no_snapshot(tmp_path: Path) -> None:
    """Bug: weights given at construction set (and written) again at every restart even where the store's snapshot
    holds them already: each restart wrote a snapshot of nothing new, which every other process then reloaded."""
    path = tmp_path / "f.db"
    first = _bm25(path, weights={"bm25": 1.0})
    _click(first)
    first.close()
    with FeedbackStore(path) as store:
        version = store.state_version()
    assert version > 0
    again = _bm25(path, weights={"bm25": 1.0})
    assert again.store.state_version() == version
    again.close()


def test_a_result_names_the_question_as_asked_when_the_store_keeps_only_hashes(tmp_path: Path) -> None:
    """Bug: the result took the question as the learner knows it, which with ``store_text=False`` is a hash: the
    caller got ``sha256:...`` back as the query it had asked."""
    ens = _bm25(FeedbackStore(tmp_path / "p.db", store_text=False))
    r = ens.retrieve("What causes the tides?", k=2)
    assert r.query == "What causes the tides?" and r.hits[0].chunk_id == "tides"
    ens.close()


def test_a_retriever_indexing_other_ids_with_the_same_texts_is_refused() -> None:
    """Bug: only the texts were compared, so a retriever indexed under other ids (the same texts) was taken, and
    its score vectors were read against ids it does not hold."""
    other = BM25Retriever().index(make_chunks(TEXTS, ids=[f"other-{i}" for i in IDS]))
    with pytest.raises(ValidationError, match="same order"):
        FeedbackEnsemble({"bm25": other}, make_chunks(TEXTS, ids=IDS))


# ---------------------------------------------------------------- snapshot sync
def test_an_infinite_persist_interval_writes_only_when_forced(tmp_path: Path) -> None:
    """Bug: with ``persist_interval=inf`` the first feedback after a start wrote a snapshot (``now - -inf`` is
    ``inf``, which is not below ``inf``), though an infinite interval is to write only at flush, close and save."""
    ens = _bm25(tmp_path / "f.db", persist_interval=math.inf)
    before = ens.store.state_version()
    _click(ens)
    _click(ens, "aurora and the sun")
    assert ens.learner.n_learned == 2
    assert ens.store.state_version() == before
    ens.flush()
    assert ens.store.state_version() > before
    ens.close()


def test_max_unsaved_episodes_force_a_snapshot_before_the_interval(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: unwritten episodes were kept without bound under a long (or infinite) ``persist_interval``: every
    refresh that found another process's snapshot learned them all again, under the locks."""
    monkeypatch.setattr(snapshot_sync, "MAX_UNSAVED", 3)
    ens = _bm25(tmp_path / "f.db", persist_interval=math.inf)
    before = ens.store.state_version()
    for query in ("what causes the tides", "aurora and the sun"):
        _click(ens, query)
    assert ens.store.state_version() == before  # two of three: nothing written yet
    _click(ens, "volcanoes erupt")
    assert ens.learner.n_learned == 3 and ens.store.state_version() > before
    ens.close()


# ---------------------------------------------------------------- runs
def test_key_or_score_refuses_a_key_and_a_score_both_positional() -> None:
    """Bug: ``record_feedback(run_id, "user_score", 1.0)`` was taken (three positional arguments where the
    signature takes the run id and one key or score), silently, for a call LangSmith's API does not have."""
    with pytest.raises(ValidationError, match="positional"):
        key_or_score(("user_score", 1.0), None, None, "record_feedback")
    assert key_or_score((1.0,), "user_score", None, "record_feedback") == ("user_score", 1.0, None)


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


# ---------------------------------------------------------------- BM25 and the retriever base
def test_a_bm25_update_after_a_delete_with_atire_idf_warns_of_nothing() -> None:
    """Bug: the IDF of a term no chunk holds any more (its column is kept) computed from a document frequency of
    0: ATIRE's ``log(n / 0)`` raised a divide-by-zero ``RuntimeWarning`` at each update (unused, but in the log)."""
    r = BM25Retriever(method="atire").index(make_chunks(["alpha beta", "gamma delta", "alpha"], ids=["a", "g", "x"]))
    table = ChunkTable(make_chunks(["alpha beta", "alpha"], ids=["a", "x"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        up = r.updated(table)
    fresh = BM25Retriever(method="atire").index(table.chunks())
    np.testing.assert_allclose(up.score_all("alpha beta gamma"), fresh.score_all("alpha beta gamma"))


def test_a_chunk_table_change_that_deletes_and_upserts_one_id_keeps_the_upsert() -> None:
    """Bug: an upsert whose id is also deleted in the same change replaced the deleted row, and went with it."""
    t = ChunkTable(make_chunks(["a", "b"], ids=["x", "y"]))
    u = t.changed(make_chunks(["A"], ids=["x"]), deletes=["x"])
    assert (u.ids, u.texts) == (["y", "x"], ["b", "A"])


def test_dense_retriever_never_takes_splade() -> None:
    """Bug: SPLADE's encoder taken for the dense one: the memory and the reformulation check would compare
    sparse vocabulary vectors by cosine."""
    splade, dense = types.SimpleNamespace(name="splade"), types.SimpleNamespace(name="dense")
    assert dense_retriever({"splade": splade}) is None
    assert dense_retriever({"splade": splade, "dense": dense}) is dense


def test_a_bm25_update_trusts_a_tables_origin_only_for_the_table_it_came_from() -> None:
    """Bug: the rows a table made by ``other.changed(...)`` records as reused are rows of ``other``; trusted for any
    retriever's table, an index of other texts under the same ids reused its own counts for them."""
    r = BM25Retriever().index(make_chunks(["alpha", "beta", "gamma"], ids=["x", "y", "z"]))
    other = ChunkTable(make_chunks(["delta", "epsilon", "zeta"], ids=["x", "y", "z"]))
    new = other.changed(make_chunks(["eta"], ids=["w"]))
    up = r.updated(new)
    fresh = BM25Retriever().index(new.chunks())
    for query in ("delta epsilon", "alpha"):
        np.testing.assert_allclose(up.score_all(query), fresh.score_all(query))
