"""A store whose file is deleted (``rm fb.db*``) or replaced while it is open: every later write went, without an
error, into the unlinked file and was lost when the process exited. Now each write is refused by name
(:class:`StoreFileGoneError`), and nothing of it is reported as stored."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rlfb import FeedbackEnsemble
from rlfb.errors import RlfbError, StoreFileGoneError
from rlfb.store import FeedbackStore
from rlfb.store.connection import Transactions

CHUNKS = [{"chunk_id": "a", "rank": 1, "score": 1.0}, {"chunk_id": "b", "rank": 2, "score": 0.5}]
DECISION = {"weights": {"bm25": 1.0}}


def _remove(path: Path) -> None:
    """``rm path*``: the file and its WAL side files."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _store_with_an_event(path: Path) -> tuple[FeedbackStore, str]:
    store = FeedbackStore(path)
    event_id = store.log_event("what is the sun", DECISION, CHUNKS, session_id="s")
    store.record_feedback(event_id, "thumbs_up")
    return store, event_id


def test_writes_to_a_deleted_store_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    store, event_id = _store_with_an_event(path)
    before = store.counts()
    _remove(path)
    assert not any(p.name.startswith("fb.db") for p in tmp_path.iterdir())

    with pytest.raises(StoreFileGoneError) as info:
        store.record_feedback(event_id, "thumbs_down")
    message = str(info.value)
    assert str(path) in message and "deleted" in message
    assert "nothing of this write was stored" in message and "open" in message
    assert isinstance(info.value, RlfbError) and isinstance(info.value, OSError)
    # every kind of write, a retrieval's log included
    with pytest.raises(StoreFileGoneError):
        store.log_event("again", DECISION, CHUNKS)
    with pytest.raises(StoreFileGoneError):
        store.record_feedback_batch([{"event_id": event_id, "signal": "thumbs_up"}])
    with pytest.raises(StoreFileGoneError):
        store.link_runs([("run", "parent")])
    with pytest.raises(StoreFileGoneError):
        store.save_policy_state({}, {"bm25": 1.0})
    # nothing of them stored, not even in the unlinked file the connection still reads (reads still answer)
    assert store.counts() == before
    assert [f["signal"] for f in store.feedback(event_id)] == ["thumbs_up"]
    assert not any(p.name.startswith("fb.db") for p in tmp_path.iterdir())
    store.close()

    # the way out the message gives: open the path again (a new, empty store there)
    with FeedbackStore(path) as again:
        new_id = again.log_event("what is the moon", DECISION, CHUNKS)
        again.record_feedback(new_id, "thumbs_up")
        assert again.counts()["feedback"] == 1


def test_an_exclusive_block_on_a_deleted_store_is_undone_whole(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    store, event_id = _store_with_an_event(path)
    undone: list[str] = []
    with pytest.raises(StoreFileGoneError):
        with store.exclusive():
            store.on_rollback(lambda: undone.append("outer"))
            store.record_feedback(event_id, "thumbs_down")
            _remove(path)  # deleted while the block holds the write lock
            with store.exclusive():
                store.on_rollback(lambda: undone.append("inner"))
                store.record_feedback(event_id, "thumbs_up", chunk_id="a")
    assert undone == ["inner", "outer"]  # the learner's take-backs run
    assert store.counts()["feedback"] == 1
    # deleted before the block: refused too
    with pytest.raises(StoreFileGoneError):
        with store.exclusive():
            store.record_feedback(event_id, "thumbs_down")
    assert store.counts()["feedback"] == 1
    store.close()


def test_a_store_replaced_by_another_at_its_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    store, event_id = _store_with_an_event(path)
    other_path = tmp_path / "other.db"
    with FeedbackStore(other_path) as other:
        other.log_event("another store's event", DECISION, CHUNKS)
    _remove(path)
    shutil.copyfile(other_path, path)  # rm fb.db*; cp other.db fb.db

    with pytest.raises(StoreFileGoneError) as info:
        store.record_feedback(event_id, "thumbs_down")
    assert str(path) in str(info.value) and "replaced" in str(info.value)
    with pytest.raises(StoreFileGoneError):
        store.log_event("again", DECISION, CHUNKS)
    store.close()
    with FeedbackStore(path) as now:  # the file put there is as it was put
        assert now.counts()["events"] == 1 and now.counts()["feedback"] == 0

    # replaced by a rename over it (os.replace), the store's own side files left beside it
    store, event_id = _store_with_an_event(tmp_path / "fb2.db")
    shutil.copyfile(other_path, tmp_path / "new.db")
    os.replace(tmp_path / "new.db", tmp_path / "fb2.db")
    with pytest.raises(StoreFileGoneError):
        store.record_feedback(event_id, "thumbs_down")
    store.close()


def test_a_store_whose_file_stays_put_is_unaffected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = FeedbackStore("fb.db")  # a relative path: SQLite resolved it at open, a later chdir changes nothing
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    ids = [store.log_event(f"q{i}", DECISION, CHUNKS) for i in range(5)]
    for event_id in ids:
        store.record_feedback(event_id, "thumbs_up")
    with store.exclusive():
        store.record_feedback(ids[0], "thumbs_down")
    store.prune(retention=10 * 86400 * 365)
    assert store.counts()["feedback"] == 6
    store.close()
    with FeedbackStore(tmp_path / "fb.db") as again:
        assert again.counts()["feedback"] == 6


def test_the_check_runs_once_per_outermost_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    check = Transactions.check_file

    def counted(self: Transactions) -> None:
        calls.append(self.path)
        check(self)

    store, event_id = _store_with_an_event(tmp_path / "fb.db")
    monkeypatch.setattr(Transactions, "check_file", counted)
    store.record_feedback(event_id, "thumbs_down")
    assert len(calls) == 1
    calls.clear()
    with store.exclusive():
        store.record_feedback(event_id, "thumbs_up")
        with store.exclusive():
            store.log_event("inside", DECISION, CHUNKS)
        store.link_runs([("run", "parent")])
    assert len(calls) == 1
    calls.clear()
    store.counts()
    store.event(event_id)
    assert calls == []  # reads do not look: the unlinked file still answers them with what it holds
    store.close()


def test_a_store_read_from_a_copy_checks_the_copy_not_the_name_it_shows(tmp_path: Path) -> None:
    # `rlfb store stats` of a read-only store opens a copy and names the original in what it prints and raises
    original = tmp_path / "fb.db"
    _store_with_an_event(original)[0].close()
    copy = tmp_path / "copy.db"
    shutil.copyfile(original, copy)
    store = FeedbackStore(copy)
    store.path = store._tx.path = str(original)
    event_id = store.log_event("q", DECISION, CHUNKS)  # the copy is still there: written
    _remove(copy)
    with pytest.raises(StoreFileGoneError) as info:
        store.record_feedback(event_id, "thumbs_up")
    assert str(original) in str(info.value)
    store.close()


@pytest.mark.parametrize("path", [":memory:"])  # "" is refused since 2026-12-06 (tests/test_input_boundaries.py)
def test_an_in_memory_store_is_unaffected(path: str) -> None:
    with FeedbackStore(path) as store:
        event_id = store.log_event("q", DECISION, CHUNKS)
        store.record_feedback(event_id, "thumbs_up")
        with store.exclusive():
            store.record_feedback(event_id, "thumbs_down")
        assert store.counts()["feedback"] == 2


def test_an_ensemble_on_a_deleted_store_names_it(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    ens = FeedbackEnsemble.from_texts(["the sun is a star", "tides follow the moon", "volcanoes erupt"],
                                      retrievers=("bm25",), store=str(path), seed=0)
    result = ens.retrieve("sun", k=2)
    _remove(path)
    with pytest.raises(StoreFileGoneError):
        ens.feedback(result.event_id, "thumbs_up")
    with pytest.raises(StoreFileGoneError):  # the retrieval's log
        ens.retrieve("moon", k=2)
    assert ens.store.counts()["feedback"] == 0
    ens.store.close()
