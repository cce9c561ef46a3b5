"""A store that keeps no query text (``store_text=False``): nothing derived from a question's text goes to disk.

An audit (2026-12-05) found the question in the embedding cache (a SPLADE encoding reads back as its words,
keyed by the sha256 the events keep), the memory's query embeddings in snapshots and saves, text-keyed state
loaded or imported into such a store, and old text events learned under their text.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from rlfb import FeedbackEnsemble, ValidationError
from rlfb.store import FeedbackStore

from _four_texts import bm25_ensemble as _bm25

TEXTS = ["The aurora is caused by charged particles from the sun.", "Tides follow the pull of the moon.",
         "Volcanoes erupt molten rock."]
SECRET = "ZEBRA-SECRET-4711 what causes the aurora"


def _ensemble(store: Any, **kwargs: Any) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25", "dense"), store=store, policy="thompson", **kwargs)


def _cached_queries(cache_dir: Path) -> int:
    with sqlite3.connect(cache_dir / "embeddings.sqlite") as conn:
        return conn.execute("SELECT COUNT(*) FROM encodings WHERE model_key LIKE '%|query'").fetchone()[0]


def test_no_query_encoding_nor_embedding_of_a_question_reaches_the_disk(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLFB_CACHE_DIR", str(tmp_path / "cache"))
    kept = _ensemble(FeedbackStore(tmp_path / "text.db"))
    kept.feedback(kept.retrieve("what causes the tides", k=2).event_id, "thumbs_up")
    assert _cached_queries(tmp_path / "cache") >= 1  # a store that keeps text: query encodings are cached
    before = _cached_queries(tmp_path / "cache")
    ens = _ensemble(FeedbackStore(tmp_path / "private.db", store_text=False))
    ens.feedback(ens.retrieve(SECRET, k=2).event_id, "thumbs_up")
    assert _cached_queries(tmp_path / "cache") == before
    ens.save(tmp_path / "saved")
    ens.close()
    newest = FeedbackStore(tmp_path / "private.db").load_policy_state()
    assert newest is not None
    snapshot = newest["state"]
    saved = json.loads((tmp_path / "saved" / "learner.json").read_text())
    for state in (snapshot, saved):
        assert state["memory"]["embeddings"] == "" and state["memory"]["queries"][0].startswith("sha256:")
    for path in [*tmp_path.rglob("*")]:
        if path.is_file():
            assert b"ZEBRA" not in path.read_bytes(), path


def test_text_keyed_state_is_not_loaded_or_imported_into_a_store_that_keeps_no_text(tmp_path: Path) -> None:
    from rlfb.weight_config import export_weights, import_weights

    dev = _ensemble(FeedbackStore(tmp_path / "dev.db"))
    dev.feedback(dev.retrieve(SECRET, k=2).event_id, "thumbs_up")
    dev.save(tmp_path / "model")
    export_weights(dev.store, tmp_path / "w.json", with_state=True)
    dev.close()
    with pytest.raises(ValidationError, match="knows questions by their text"):
        FeedbackEnsemble.load(tmp_path / "model", store=FeedbackStore(tmp_path / "p1.db", store_text=False))
    with FeedbackStore(tmp_path / "p2.db", store_text=False) as private, \
            pytest.raises(ValidationError, match="knows questions by their text"):
        import_weights(private, tmp_path / "w.json")
    for name in ("p1.db", "p2.db"):
        assert b"ZEBRA" not in (tmp_path / name).read_bytes()


def test_an_old_text_event_in_a_store_that_keeps_none_is_learned_by_its_hash(tmp_path: Path) -> None:
    # written with text before the file recorded its mode; feedback on it wrote the text into the snapshots
    path = tmp_path / "fb.db"

    def ensemble() -> FeedbackEnsemble:
        return FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=path, policy="thompson")

    with ensemble() as before:  # as the bug wrote it: a text event in what became a private file
        event_id = before.retrieve(SECRET, k=2).event_id
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("UPDATE settings SET value = 'false' WHERE key = 'store_text'")
    raw.close()
    ens = ensemble()
    assert ens.store.store_text is False
    ens.feedback(event_id, "thumbs_up")
    ens.close()
    with sqlite3.connect(path) as conn:
        (state,) = conn.execute("SELECT state FROM policy_snapshots ORDER BY version DESC LIMIT 1").fetchone()
    assert "ZEBRA" not in state


def test_a_llamaindex_handler_copies_a_decision_made_on_a_store_that_keeps_no_text(tmp_path: Path) -> None:
    # the copy took the learner's event query, None there: it failed, was only logged, and feedback by query
    # id never reached the learner
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.llms import MockLLM

    from llamaindex_rlfb import FeedbackEventHandler, FeedbackFusionPostprocessor

    index = VectorStoreIndex.from_documents([Document(text=t) for t in TEXTS], embed_model=MockEmbedding(embed_dim=8))
    learner_store = FeedbackStore(tmp_path / "learner.db", store_text=False)
    rerank = FeedbackFusionPostprocessor.from_index(index, store=learner_store, retrievers=("bm25",), top_n=2)
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=3, node_postprocessors=[rerank])
    handler = FeedbackEventHandler(store=str(tmp_path / "handler.db")).attach()
    try:
        engine.query("what causes the aurora")
        handler.record_feedback(handler.last_query_id, score=1.0)
    finally:
        handler.detach()
        handler.close()
    assert learner_store.counts()["feedback"] == 1


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_a_result_names_the_question_as_asked_when_the_store_keeps_only_hashes(tmp_path: Path) -> None:
    """Bug: the result took the question as the learner knows it, which with ``store_text=False`` is a hash: the
    caller got ``sha256:...`` back as the query it had asked."""
    ens = _bm25(FeedbackStore(tmp_path / "p.db", store_text=False))
    r = ens.retrieve("What causes the tides?", k=2)
    assert r.query == "What causes the tides?" and r.hits[0].chunk_id == "tides"
    ens.close()
