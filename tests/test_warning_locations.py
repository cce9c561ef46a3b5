"""Every warning of the core names the app's line (``warnings.warn``'s ``stacklevel``), not a line inside rlfb.

A fixed ``stacklevel`` named rlfb's own modules where a warning is reached through several layers
(``FeedbackEnsemble.load``, a retrieval's catch-up, a retriever's embedding cache, a store's ``exclusive``
block): each test here triggers one warning through the public API and checks the file it names is this one.
The adapters' warnings: ``tests/langchain`` and ``tests/llamaindex`` (``test_warning_locations_*.py``).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlfb import FeedbackEnsemble
from rlfb.retrievers import DenseRetriever
from rlfb.store import FeedbackStore
from rlfb.types import make_chunks

from _warned import disk_full_once, named_files

TEXTS = ["ocean tides follow the moon", "the aurora glows green", "volcanoes erupt magma"]
IDS = ["tides", "aurora", "volcano"]


class FakeModel:
    """A sentence-transformers stand-in (ones for every text): a dense retriever without loading a model."""

    def encode(self, texts: list[str], **kwargs: Any) -> np.ndarray:
        return np.ones((len(texts), 4), dtype=np.float32)


@pytest.mark.skipif(os.name != "posix", reason="a killed save's process is told apart on POSIX only")
def test_a_save_put_back_at_load_names_the_load(tmp_path: Path) -> None:
    # stacklevel=3 named rlfb/ensemble_folder.py
    root = tmp_path / "ens"
    FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), seed=7).save(root)
    tag = "host~99999999~0123456789ab"  # a process id above Linux's largest: a killed save's
    root.rename(root.with_name(f".{root.name}.old-{tag}"))
    root.with_name(f".{root.name}.lock-{tag}").write_bytes(b"")
    with pytest.warns(RuntimeWarning, match="put back") as caught:
        FeedbackEnsemble.load(root)
    assert named_files(caught, "put back") == [__file__]


def test_feedback_that_could_not_be_learned_at_a_retrieval_names_the_retrieval(tmp_path: Path) -> None:
    # stacklevel=3 named rlfb/ensemble.py
    path = tmp_path / "fb.db"
    before = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",), store=path)
    event_id = before.retrieve("aurora", k=2).event_id
    before.close()
    with FeedbackStore(path) as store:
        store.record_feedback(event_id, "thumbs_up")  # stored, learned by no ensemble yet
    ens = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",), store=path, refresh_interval=3600.0)
    disk_full_once(ens)
    with pytest.warns(RuntimeWarning, match="could not be learned now") as caught:
        ens.retrieve("aurora", k=2, log=False)
    assert named_files(caught, "could not be learned now") == [__file__]
    ens.close()


def test_an_embedding_cache_that_cannot_be_used_names_the_indexing(tmp_path: Path) -> None:
    # stacklevel=4 named rlfb/retrievers/base.py
    (tmp_path / "afile").write_text("a file, not a folder")
    retriever = DenseRetriever(model=FakeModel(), cache_dir=tmp_path / "afile" / "sub", model_key="fake")
    with pytest.warns(RuntimeWarning, match="embedding cache .* cannot be used") as caught:
        retriever.index(make_chunks(TEXTS))
    assert named_files(caught, "embedding cache") == [__file__]


def test_an_index_loaded_under_another_model_key_names_the_load(tmp_path: Path) -> None:
    DenseRetriever(model=FakeModel(), cache_dir=False, model_key="one").index(make_chunks(TEXTS)).save(tmp_path / "i")
    with pytest.warns(RuntimeWarning, match="encoded by another model") as caught:
        DenseRetriever.load(tmp_path / "i", model=FakeModel(), model_key="two")
    assert named_files(caught, "encoded by another model") == [__file__]


def test_an_on_rollback_callback_that_fails_names_the_apps_block() -> None:
    # the warning is Python 3.10's (3.11+ adds a note to the block's error): an error with no add_note here;
    # stacklevel=2 named rlfb/store/connection.py
    class NoNotes(Exception):
        add_note = None  # type: ignore[assignment,unused-ignore]  # as an exception of Python 3.10 has none

    def undo() -> None:
        raise ValueError("undo failed")

    store = FeedbackStore()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(NoNotes):
            with store.exclusive():
                store.on_rollback(undo)
                raise NoNotes("the block failed")
    assert named_files(caught, "on_rollback callback failed") == [__file__]
    store.close()


async def test_the_task_awaiting_a_call_is_found_when_it_is_asyncios_pure_python_task() -> None:
    """Bug: only the C ``asyncio.Task`` counted as a task. A loop run by ``backports.asyncio.runner`` (pytest-asyncio
    on Python 3.10) makes asyncio's pure-Python tasks, no subclass of it: a warning given in the worker thread of an
    ``ainvoke`` in a chain, under ``asyncio.gather`` or ``wait_for`` named the thread pool's module there."""
    import asyncio

    from rlfb._caller import _awaiting_task

    py_task = getattr(asyncio.tasks, "_PyTask", None)
    if py_task is None:  # an interpreter without the pure-Python task: nothing of this to check
        pytest.skip("asyncio.tasks._PyTask is not there")
    release = asyncio.Event()

    async def call() -> None:
        await release.wait()

    inner = asyncio.ensure_future(call())

    async def app() -> None:
        await inner

    outer = py_task(app(), loop=asyncio.get_running_loop())
    for _ in range(3):  # the outer task starts, and waits on the inner one
        await asyncio.sleep(0)
    assert not isinstance(outer, asyncio.Task)  # what the check passed by
    assert _awaiting_task(inner, depth=4) is outer
    release.set()
    await outer
