"""A corpus that changes: add, replace and delete chunks without losing what the ensemble learned."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from rlfb import FeedbackEnsemble, UnknownChunkError, ValidationError
from rlfb.retrievers.bm25 import BM25Retriever
from rlfb.types import Chunk, make_chunks

from _corpus import IDS, TEXTS

NEW_TEXT = "Penguins huddle together to survive the Antarctic winter."


@pytest.fixture()
def ens(tmp_path) -> Iterator[FeedbackEnsemble]:
    e = FeedbackEnsemble.from_texts(TEXTS[:6], ids=IDS[:6], retrievers=("bm25", "dense"),
                                    store=tmp_path / "fb.db", policy="thompson", seed=3)
    yield e
    e.close()


def _top(e: FeedbackEnsemble, query: str, k: int = 1) -> list[str]:
    return [h.chunk_id for h in e.retrieve(query, k=k, log=False, explore=False).hits]


def test_added_chunks_are_retrieved_by_every_retriever_and_saved(ens, tmp_path) -> None:
    assert _top(ens, "penguins antarctic winter") != ["penguin"]
    assert ens.add_chunks(make_chunks([NEW_TEXT], ids=["penguin"], metadatas=[{"src": "zoo"}])) == ["penguin"]
    assert len(ens) == 7 and ens.chunks.ids == [*IDS[:6], "penguin"]
    for name, r in ens.retrievers.items():
        assert r.ids == ens.chunks.ids, name
        assert r.search("penguins huddle in the antarctic winter", 1)[0][0] == "penguin", name
    hit = ens.retrieve("penguins antarctic winter", k=1, log=False, explore=False).hits[0]
    assert (hit.chunk_id, hit.metadata, hit.text) == ("penguin", {"src": "zoo"}, NEW_TEXT)
    ens.save(tmp_path / "saved")
    back = FeedbackEnsemble.load(tmp_path / "saved")
    assert back.chunks.ids == ens.chunks.ids and _top(back, "penguins antarctic winter") == ["penguin"]


def test_an_indexed_id_gets_the_new_text(ens) -> None:
    ens.add_texts([NEW_TEXT], ids=[IDS[3]])  # doc3 was about volcanoes
    assert len(ens) == 6 and ens.chunk(IDS[3]).text == NEW_TEXT
    assert _top(ens, "penguins antarctic winter") == [IDS[3]]
    assert IDS[3] not in _top(ens, "volcano magma erupts", k=2)


def test_add_texts_without_ids_gets_new_unique_ids(ens) -> None:
    ids = ens.add_texts([NEW_TEXT, "Koalas sleep most of the day in eucalyptus trees."])
    assert len(set(ids)) == 2 and not set(ids) & set(IDS) and len(ens) == 8
    assert _top(ens, "koalas sleeping in eucalyptus") == [ids[1]]


def test_what_was_learned_carries_over_and_old_events_still_take_feedback(ens) -> None:
    first = ens.retrieve("northern lights glow", k=3)
    ens.feedback(first.event_id, "thumbs_up", chunk_id=first.hits[1].chunk_id)
    weights, state = ens.weights, ens.learner.state_dict()
    ens.add_texts([NEW_TEXT], ids=["penguin"])
    assert ens.weights == weights and ens.learner.state_dict() == state
    # feedback on a retrieval logged before the corpus changed is accepted and learned from
    record = ens.feedback(first.event_id, "thumbs_down", chunk_id=first.hits[0].chunk_id)
    assert not record.duplicate and ens.learner.state_dict() != state


def test_deleted_chunks_are_gone_but_late_feedback_on_them_is_learned(ens) -> None:
    shown = ens.retrieve("what causes the aurora", k=2)
    gone = shown.hits[0].chunk_id
    state = ens.learner.state_dict()
    ens.delete_chunks([gone])
    assert gone not in ens.chunks.ids and len(ens) == 5
    assert all(gone not in [c for c, _ in r.search("aurora solar wind", 5)] for r in ens.retrievers.values())
    assert gone not in _top(ens, "what causes the aurora", k=5)
    assert ens.chunk(gone).id == gone  # an earlier result can still name it
    ens.feedback(shown.event_id, "thumbs_up", chunk_id=gone)
    assert ens.learner.state_dict() != state
    ens.add_texts([TEXTS[0]], ids=[gone])  # and it can come back
    assert _top(ens, "what causes the aurora") == [gone]


def test_bad_updates_change_nothing(ens) -> None:
    before = list(ens.chunks.ids)
    with pytest.raises(UnknownChunkError, match="nope"):
        ens.delete_chunks([IDS[0], "nope"])
    with pytest.raises(ValidationError, match="every indexed chunk"):
        ens.delete_chunks(IDS[:6])
    with pytest.raises(ValidationError, match="not one string"):
        ens.delete_chunks(IDS[0])
    with pytest.raises(ValidationError, match="duplicate"):
        ens.add_chunks([Chunk("x", "a"), Chunk("x", "b")])
    with pytest.raises(ValidationError, match="Chunk objects"):
        ens.add_chunks(["just a text"])
    assert ens.chunks.ids == before and ens.add_chunks([]) == [] and ens.delete_chunks([]) is None
    assert all(r.ids == before for r in ens.retrievers.values())


class _FailsUpdate(BM25Retriever):
    def updated(self, chunks, *, show_progress=False):
        raise OSError("disk full")


def test_a_failed_reindex_leaves_the_old_index_in_place() -> None:
    bm25 = _FailsUpdate()
    e = FeedbackEnsemble.from_chunks(make_chunks(TEXTS[:6], IDS[:6]), retrievers=("dense", bm25))
    with pytest.raises(OSError, match="disk full"):
        e.add_texts([NEW_TEXT], ids=["penguin"])
    assert e.chunks.ids == IDS[:6] and all(r.ids == IDS[:6] for r in e.retrievers.values())
    assert _top(e, "what causes the aurora") == [IDS[0]]


def test_a_member_only_ensemble_has_nothing_to_index() -> None:
    from rlfb.members import SearchMember

    e = FeedbackEnsemble({}, members=[SearchMember("web", lambda q, k: [(Chunk("w", "web page"), 1.0)])])
    with pytest.raises(ValidationError, match="no corpus retrievers"):
        e.add_texts(["a"], ids=["a"])


def test_retrieval_stays_consistent_while_the_corpus_changes() -> None:
    """Searches running while chunks are added and deleted see one whole index: every hit carries its own
    chunk's scores (the dense score, which no other chunk changes, is the one of the hit's text)."""
    query = "moon tides and aurora"
    e = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"))
    extra = [f"note {i}: {TEXTS[(3 * i) % len(TEXTS)]}" for i in range(15)]  # each scores unlike its neighbours
    dense = dict(zip(TEXTS + extra, e.retrievers["dense"].score_texts(query, TEXTS + extra), strict=True))
    errors: list[BaseException] = []
    stop = threading.Event()

    def search() -> None:
        try:
            while not stop.is_set():
                for hit in e.retrieve(query, k=8, log=False).hits:
                    assert hit.scores["dense"] == pytest.approx(dense[hit.text], abs=1e-5), hit.chunk_id
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=search)
    worker.start()
    try:
        for i in range(15):
            e.add_texts([extra[i]], ids=[f"extra{i}"])
            if i % 3 == 2:  # shifts the rows of the chunks after it
                e.delete_chunks([f"extra{i - 2}"])
    finally:
        stop.set()
        worker.join()
    assert not errors, errors
    assert len(e) == len(TEXTS) + 10


def test_only_new_texts_are_encoded(tmp_path, monkeypatch) -> None:
    from rlfb.retrievers.dense import DenseRetriever

    dense = DenseRetriever(cache_dir=tmp_path / "cache")
    e = FeedbackEnsemble.from_chunks(make_chunks(TEXTS[:6], IDS[:6]), retrievers=(dense,))
    encoded: list[str] = []
    real = dense._encode

    def spy(texts: list[str], side: str):
        encoded.extend(texts)
        return real(texts, side)

    monkeypatch.setattr(dense, "_encode", spy)  # the re-indexed copy encodes through it too
    e.add_texts([NEW_TEXT, TEXTS[0]], ids=["penguin", "aurora-again"])
    assert encoded == [NEW_TEXT]
    assert _top(e, "penguins antarctic winter") == ["penguin"]


class _SlowIndex(BM25Retriever):
    """Blocks its re-index until told to go on, so a test can search in the middle of one."""

    started = threading.Event()
    go_on = threading.Event()

    def updated(self, chunks, *, show_progress=False):
        self.started.set()
        assert self.go_on.wait(60)
        return super().updated(chunks, show_progress=show_progress)


def test_searches_and_feedback_go_on_with_the_old_index_during_a_reindex(tmp_path) -> None:
    e = FeedbackEnsemble.from_chunks(make_chunks(TEXTS, IDS), retrievers=(_SlowIndex(),), store=tmp_path / "f.db")
    adding = threading.Thread(target=e.add_texts, args=([NEW_TEXT],), kwargs={"ids": ["penguin"]})
    adding.start()
    try:
        assert _SlowIndex.started.wait(60)
        result = e.retrieve("penguins antarctic winter", k=1)  # would wait for the lock if the update held it
        e.feedback(result.event_id, "thumbs_up")
        assert len(e) == len(TEXTS) and result.hits[0].chunk_id != "penguin"
    finally:
        _SlowIndex.go_on.set()
        adding.join()
    assert _top(e, "penguins antarctic winter") == ["penguin"]
    e.close()


def test_a_changed_table_knows_its_reused_rows_without_holding_on_to_the_old_table() -> None:
    import gc
    import weakref

    import numpy as np

    from rlfb.retrievers.base import ChunkTable, reused_rows

    old = ChunkTable(make_chunks(TEXTS[:6], IDS[:6]))
    upserts = make_chunks(["rewritten", TEXTS[2], "brand new"], ids=[IDS[1], IDS[2], "n1"])
    new = old.changed(upserts, deletes=[IDS[0], IDS[4]])
    assert new.ids == [IDS[1], IDS[2], IDS[3], IDS[5], "n1"] and new.texts[0] == "rewritten"
    assert old.ids == IDS[:6] and old.texts == TEXTS[:6]  # the old table is as it was
    # the remembered rows equal what comparing ids and texts finds (an unchanged text upserted is reused)
    slow = reused_rows(old, ChunkTable(new.chunks()))
    np.testing.assert_array_equal(reused_rows(old, new), slow)
    assert slow.tolist() == [-1, 2, 3, 5, -1]
    with pytest.raises(UnknownChunkError):
        old.changed(deletes=["nope"])
    with pytest.raises(ValidationError, match="repeat"):
        old.changed(make_chunks(["a", "b"], ids=["x", "y"]) + make_chunks(["c"], ids=["x"]))
    gone = weakref.ref(old)
    del old
    gc.collect()
    assert gone() is None  # a long chain of updates keeps only the latest table
