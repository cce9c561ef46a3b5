"""What the LangChain handler kept while its store was locked is written when the process exits.

A retrieval log or a failed run's mark that found the store locked past ``busy_timeout`` is kept in memory and
written at the handler's next write; a process that made none (a script's last question, a worker shut down)
lost it, and feedback on that run later found nothing, or rated the failed run's question. Each test runs a
child interpreter, since only a real exit runs the hook.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from rlfb.store import FeedbackStore

HERE = Path(__file__).parent

CHILD = textwrap.dedent(
    """
    import sqlite3, sys, uuid, warnings
    sys.path[:0] = [{here!r}, {tests!r}]
    from langchain_community.retrievers import BM25Retriever
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough
    from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever
    from rlfb import FeedbackEnsemble, StoreBusyError
    from rlfb.store import FeedbackStore
    from _lc_corpus import IDS, TEXTS

    path, run_id, how, release = sys.argv[1], uuid.UUID(sys.argv[2]), sys.argv[3], sys.argv[4] == "release"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def locked_invoke(runnable, question, config):
        other.execute("BEGIN EXCLUSIVE")
        try:
            return runnable.invoke(question, config=config)
        finally:
            if release:
                other.execute("ROLLBACK")

    if how == "log":  # a plain retriever's log the locked store could not take
        handler = FeedbackCallbackHandler(FeedbackStore(path, busy_timeout=0.05))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            locked_invoke(RunnablePassthrough() | BM25Retriever.from_texts(TEXTS, ids=IDS, k=2), "molten magma",
                          {{"callbacks": [handler], "run_id": run_id}})
        assert any("could not log" in str(w.message) for w in caught), [str(w.message) for w in caught]
    else:  # a chain whose second retrieval found the store locked: the chain's failed mark is kept
        ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="gradient",
                                          store=FeedbackStore(path, busy_timeout=0.05))
        retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
        handler = FeedbackCallbackHandler.from_ensemble(ens)
        again = RunnableLambda(lambda docs, config: locked_invoke(retriever, "ocean tides", config))
        try:
            (retriever | again).invoke("molten magma", config={{"callbacks": [handler], "run_id": run_id}})
        except StoreBusyError:
            pass
        else:
            raise AssertionError("the locked store did not fail the chain")
        assert handler._unmarked, "the failed mark was written at once, not kept"
    print("kept", flush=True)
    # ends here, with no further write by the handler
    """
)


def run_child(tmp_path: Path, how: str, *, release: bool = True) -> tuple[Path, str, subprocess.CompletedProcess]:
    path = tmp_path / "fb.db"
    FeedbackStore(path).close()
    run_id = str(uuid.uuid4())
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(here=str(HERE), tests=str(HERE.parent)))
    done = subprocess.run([sys.executable, str(script), str(path), run_id, how, "release" if release else "hold"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0 and "kept" in done.stdout, done.stderr[-3000:]
    return path, run_id, done


def test_a_log_kept_while_the_store_was_locked_is_written_at_exit(tmp_path: Path) -> None:
    path, run_id, done = run_child(tmp_path, "log")
    with FeedbackStore(path) as store:
        (event_id,) = store.resolve_run(run_id)  # none before: lost at exit
        event = store.event(event_id)
        assert event["query"] == "molten magma" and event["parent_id"] == run_id
        assert [c["chunk_id"] for c in event["chunks"]]
    assert "not written at exit" not in done.stderr


def test_a_failed_mark_kept_while_the_store_was_locked_is_written_at_exit(tmp_path: Path) -> None:
    path, run_id, done = run_child(tmp_path, "mark")
    with FeedbackStore(path) as store:
        assert store.run_failed(run_id)  # so feedback on the chain's id passes its retrievals by
    assert "not written at exit" not in done.stderr


def test_what_cannot_be_written_at_exit_is_warned_of(tmp_path: Path) -> None:
    # the store still locked at exit (the other connection holds it to the end): a warning, not a traceback
    path, run_id, done = run_child(tmp_path, "log", release=False)
    assert "1 retrieval log(s) and 0 failed run mark(s) kept while the feedback store was locked were not " \
           "written at exit" in done.stderr
    assert "Traceback" not in done.stderr
    with FeedbackStore(path) as store:
        assert store.resolve_run(run_id) == [] and store.counts()["events"] == 0
