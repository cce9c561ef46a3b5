"""One feedback store shared by several learners, processes and saves: nothing learned is lost.

Also the store's errors after it was opened: a file damaged since, or one that cannot be written,
raises a named rlfb error rather than SQLite's own.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from _clock import NOW, Clock

from rlfb import FeedbackEnsemble, snapshot_sync
from rlfb.errors import CorruptStateError, RatingOutOfRangeError, ReadOnlyStoreError, RlfbError, ValidationError
from rlfb.policies.base import same_hyperparameters
from rlfb.store import FeedbackStore
from rlfb.weight_config import import_weights

from _corpus import IDS, TEXTS
from _four_texts import bm25_ensemble as _bm25
from _four_texts import click_first_hit as _click
from _threads import errors_in_threads
from _warned import noted

N_FEEDBACK = 25


def _ensemble(store: Any, **kw: Any) -> FeedbackEnsemble:
    kw.setdefault("policy", "thompson")
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=store, **kw)


def _learn_in_process(path: str, tag: str, start: Any) -> None:
    # refresh_interval=0: each retrieval picks up the other process's newest weights, as a busy app would
    ens = _ensemble(path, refresh_interval=0)
    start.wait()
    for i in range(N_FEEDBACK):
        r = ens.retrieve(f"what causes the tides {tag} {i}", k=3)
        ens.feedback(r.event_id, "explicit_positive", chunk_id=r.hits[0].chunk_id)
    ens.close()


def test_two_processes_learning_on_one_store_lose_nothing(tmp_path: Path) -> None:
    # Each learns on top of the newest snapshot and saves, under the store's write lock: without it, both
    # started from one snapshot and the later save dropped the other's episodes (65 of 80 were kept).
    path = str(tmp_path / "fb.db")
    _ensemble(path).close()
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_learn_in_process, args=(path, tag, start)) for tag in "ab"]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    with FeedbackStore(path) as store:
        assert store.counts()["feedback"] == 2 * N_FEEDBACK
    fresh = _ensemble(path)
    assert fresh.learner.n_learned == 2 * N_FEEDBACK
    fresh.close()


@pytest.mark.parametrize("ends_with", ["flush", "close", "save", "set_weights"])
def test_learners_that_write_now_and_then_lose_nothing_of_each_other(tmp_path: Path, ends_with: str) -> None:
    # With persist_interval above 0 each wrote its own state when due, and then took the other's next snapshot
    # whole: whichever wrote last won (four processes at persist_interval=1.0 kept about a quarter of what they
    # learned). Two connections to one file stand for two processes; 3600 s: nothing is due after the first.
    path = str(tmp_path / "fb.db")
    a, b = (_ensemble(FeedbackStore(path), persist_interval=3600.0, refresh_interval=0.0) for _ in range(2))
    for i in range(6):
        for ens in (a, b):
            r = ens.retrieve(f"what causes the tides {i}", k=3)
            ens.feedback(r.event_id, "explicit_positive", chunk_id=r.hits[0].chunk_id)
    a.flush()  # b then learns its own episodes again on top of a's snapshot, and writes both
    if ends_with == "flush":
        b.flush()
    elif ends_with == "close":
        b.close()
    elif ends_with == "save":
        b.save(tmp_path / "saved")
    else:
        b.set_weights({"bm25": 1.0})
    snapshot = FeedbackStore(path).load_policy_state()
    assert snapshot is not None and snapshot["state"]["n_learned"] == 12
    assert _ensemble(path).learner.n_learned == 12
    a.refresh()
    assert a.learner.n_learned == 12  # and a reads b's, which holds its own


def test_learning_not_written_yet_is_written_when_the_script_exits(tmp_path: Path) -> None:
    # a script that ended without close() lost what it learned since its last snapshot: 49 of 50 feedbacks
    # at persist_interval=1.0
    path = tmp_path / "fb.db"
    code = f"""
from rlfb import FeedbackEnsemble
ens = FeedbackEnsemble.from_texts(["ocean tides follow the moon", "the aurora glows green"], retrievers=("bm25",),
                                  store={str(path)!r}, policy="thompson", persist_interval=3600.0)
for i in range(5):
    r = ens.retrieve(f"tides {{i}}", k=2)
    ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
print(ens.store.load_policy_state()["state"]["n_learned"])
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=tmp_path,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1" and "Warning" not in done.stderr  # only the first was due before exit
    snapshot = FeedbackStore(path).load_policy_state()
    assert snapshot is not None and snapshot["state"]["n_learned"] == 5


class _Boom(Exception):
    pass


@pytest.mark.parametrize("write", ["flush", "set_weights", "save"])
def test_a_write_undone_by_the_callers_block_leaves_the_learning_to_write_later(tmp_path: Path, write: str) -> None:
    # the learner's bookkeeping kept the undone snapshot's version, which SQLite then gave to the other's next
    # snapshot: that one was never read, and the next write dropped its learning (3 learned of 4 rows)
    path = str(tmp_path / "fb.db")
    sa = FeedbackStore(path)
    a, b = _ensemble(sa, persist_interval=3600.0, refresh_interval=0.0), _ensemble(path, refresh_interval=0.0)

    def feedback(ens: FeedbackEnsemble, q: str) -> None:
        r = ens.retrieve(q, k=3)
        ens.feedback(r.event_id, "explicit_positive", chunk_id=r.hits[0].chunk_id)

    feedback(a, "tides 1")
    feedback(a, "tides 2")  # not written: 3600 s
    with pytest.raises(_Boom), sa.exclusive():
        {"flush": a.flush, "set_weights": lambda: a.set_weights({"bm25": 1.0}),
         "save": lambda: a.save(tmp_path / "saved")}[write]()
        raise _Boom
    feedback(b, "tides 3")
    feedback(a, "tides 4")
    a.close()
    snapshot = FeedbackStore(path).load_policy_state()
    assert snapshot is not None and snapshot["state"]["n_learned"] == 4


def test_episodes_learned_again_on_anothers_snapshot_are_written_at_once(tmp_path: Path) -> None:
    # each further snapshot of a process writing after every feedback had them all learned again, under the
    # locks and in a retrieval's refresh: 1,000 unwritten episodes cost 0.6 s each time
    from rlfb.snapshot_sync import RELEARN_WRITE

    path = str(tmp_path / "fb.db")
    a = _ensemble(FeedbackStore(path), persist_interval=3600.0, refresh_interval=0.0)
    b = _ensemble(path, refresh_interval=0.0)
    for i in range(RELEARN_WRITE + 2):
        r = a.retrieve(f"tides {i}", k=3)
        a.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    assert len(a._unsaved) == RELEARN_WRITE + 1  # the first was written, as the first always is
    r = b.retrieve("aurora", k=3)
    b.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    a.refresh()
    assert a._unsaved == []
    snapshot = FeedbackStore(path).load_policy_state()
    assert snapshot is not None and snapshot["state"]["n_learned"] == RELEARN_WRITE + 3


_FORKED = """
import multiprocessing as mp, os, sys
from rlfb import FeedbackEnsemble
from rlfb.store import FeedbackStore

TEXTS = ["ocean tides follow the moon", "the aurora glows green", "volcanoes erupt magma"]
KEEP = []


def build(path):
    return FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=path, policy="thompson",
                                       persist_interval=3600.0, refresh_interval=0.0)


def learn(ens, tag, n):
    for i in range(n):
        r = ens.retrieve(f"tides {tag} {i}", k=2)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)


def work(path, tag):
    KEEP.append(build(path))  # kept alive, never closed: the worker ends with os._exit
    learn(KEEP[-1], tag, 5)


if __name__ == "__main__":
    path = sys.argv[1]
    parent = build(path)
    learn(parent, "p", 3)
    pid = os.fork()
    if pid == 0:  # a forked child ending normally runs the exit hooks: not the parent's copy's
        sys.exit(0)
    os.waitpid(pid, 0)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=work, args=(path, t)) for t in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    print([p.exitcode for p in procs])
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_how_often_a_remembered_question_was_asked_survives_a_restart_and_another_writer(tmp_path: Path) -> None:
    # the counts repeat discovery reads were written only with feedback: a restart, or another process's
    # snapshot taken at a refresh, set a question asked ten times back to none
    question = "what causes the tides"
    first = _ensemble(tmp_path / "a.db")
    r = first.retrieve(question, k=3)
    first.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)  # now remembered
    for _ in range(10):
        first.retrieve(question, k=3)
    assert first.learner.memory.asks(question) == 10  # counted since its first feedback
    first.close()
    assert _ensemble(tmp_path / "a.db").learner.memory.asks(question) == 10
    path = tmp_path / "b.db"
    a, b = _ensemble(path, refresh_interval=0), _ensemble(path, refresh_interval=0)
    r = a.retrieve(question, k=3)
    a.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    for _ in range(10):
        a.retrieve(question, k=3)
    r = b.retrieve("volcano", k=3)  # the other writer: it takes a's snapshot (one ask), learns and writes
    b.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    a.retrieve("moon", k=3)  # a takes b's snapshot, and counts its own ten asks again on top
    assert a.learner.memory.asks(question) == 10
    a.flush()
    b.retrieve(question, k=3)
    assert b.learner.memory.asks(question) == 11


def test_workers_sharing_a_store_keep_their_own_random_draws(tmp_path: Path) -> None:
    # a snapshot carried its writer's random generators, and every reader took them: workers given seeds 0
    # and 1 showed the same explored rankings (20 of 20) once one had read the other's snapshot
    path = tmp_path / "f.db"
    a = _ensemble(path, seed=0)
    r = a.retrieve("tides", k=5)
    a.feedback(r.event_id, "click", chunk_id=r.hits[1].chunk_id)
    b = _ensemble(path, seed=1)
    assert b.learner.memory.known("tides")  # it took what a learned
    questions = [f"{w} {v}" for w in ("tides", "moon", "aurora", "rock", "storm") for v in ("sea", "light", "sky")]
    same = sum(a.retrieve(q, k=5).chunk_ids == b.retrieve(q, k=5).chunk_ids for q in questions)
    assert same < len(questions)


def test_a_restart_does_not_draw_again_what_the_run_before_it_drew(tmp_path: Path) -> None:
    # keeping its own generators, a restarted ensemble began from its seed's first states every time (the same
    # exploration coin flips after each restart); it starts from its seed and the snapshot's version
    def start() -> tuple[FeedbackEnsemble, list[Any]]:
        ens = _ensemble(tmp_path / "f.db")
        return ens, [g.bit_generator.state for g in ens.learner._generators()]

    states = []
    for i in range(3):
        ens, at_start = start()
        states.append(at_start)
        r = ens.retrieve(f"tides {i}", k=3)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
        ens.close()
    assert states[0] != states[1] != states[2] != states[0]
    again = _ensemble(tmp_path / "f.db")  # the same seed and snapshot: the same draws (reproducible)
    twin = _ensemble(tmp_path / "f.db")
    assert [g.bit_generator.state for g in again.learner._generators()] == [
        g.bit_generator.state for g in twin.learner._generators()]


@pytest.mark.parametrize("policy", ["fixed", "thompson", "gradient"])
def test_weights_given_to_a_new_ensemble_win_over_the_stores_and_the_same_ones_change_nothing(
    tmp_path: Path, policy: str
) -> None:
    # a redeploy with weights=0.9/0.1 on a store whose snapshot held 0.5/0.5 served 0.5/0.5 without a word
    def ensemble(weights: Any = None) -> FeedbackEnsemble:
        return _two(tmp_path, policy, weights)

    first = ensemble({"bm25": 0.5, "notes": 0.5})
    r = first.retrieve("tides", k=3)
    first.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    def policy_state(ens: FeedbackEnsemble) -> dict[str, Any]:  # what it learned, not its random state
        return {k: v for k, v in ens.learner.state_dict()["policy"].items() if k != "rng"}

    learned = policy_state(first)
    first.close()
    same = ensemble({"bm25": 0.5, "notes": 0.5})  # as at every restart: what it learned stays
    assert policy_state(same) == learned
    same.close()
    kept = ensemble()
    assert kept.weights == pytest.approx({"bm25": 0.5, "notes": 0.5})
    kept.close()
    moved = ensemble({"bm25": 0.9, "notes": 0.1})
    assert moved.weights == pytest.approx({"bm25": 0.9, "notes": 0.1})
    moved.close()
    assert ensemble().weights == pytest.approx({"bm25": 0.9, "notes": 0.1})  # written to the store


@pytest.mark.parametrize("policy", ["fixed", "thompson", "gradient"])
def test_weights_given_to_an_ensemble_on_a_new_store_are_written_there(tmp_path: Path, policy: str) -> None:
    # written only where they differed from a snapshot's: on a new store there was none, so a restart without
    # weights= served the defaults, and `rlfb weights show` found no weights, until the first feedback
    first = _two(tmp_path, policy, {"bm25": 0.8, "notes": 0.2})
    first.close()
    with FeedbackStore(tmp_path / "f.db") as store:
        snapshot = store.load_policy_state()
        assert snapshot is not None and snapshot["weights"] == pytest.approx({"bm25": 0.8, "notes": 0.2})
    again = _two(tmp_path, policy, None)
    assert again.weights == pytest.approx({"bm25": 0.8, "notes": 0.2})
    version = again.store.state_version()
    again.close()
    same = _two(tmp_path, policy, {"bm25": 0.8, "notes": 0.2})  # the same weights again: nothing new written
    assert same.store.state_version() == version
    same.close()


@pytest.mark.parametrize("policy", ["thompson", "gradient"])
def test_weights_given_beyond_a_policys_bounds_at_every_restart_leave_what_it_learned(
    tmp_path: Path, policy: str
) -> None:
    # compared as given (1.0/0.0), not as the policy clipped them, they differed from every snapshot's: each
    # restart set them again, and a gradient learner forgot the weights it had learned
    first = _two(tmp_path, policy, {"bm25": 1.0, "notes": 0.0})
    for i in range(30):
        r = first.retrieve(f"tides {i}", k=3)
        first.feedback(r.event_id, "click", chunk_id=r.hits[-1].chunk_id)
    learned = first.learner.state_dict()["policy"]
    first.close()
    again = _two(tmp_path, policy, {"bm25": 1.0, "notes": 0.0})
    assert {k: v for k, v in again.learner.state_dict()["policy"].items() if k != "rng"} == {
        k: v for k, v in learned.items() if k != "rng"}


def _two(tmp_path: Path, policy: str, weights: Any) -> FeedbackEnsemble:
    """BM25 and a search member over the same texts, on one store file."""
    from rlfb.members import SearchMember
    from rlfb.types import Chunk

    def notes(query: str, k: int) -> list[tuple[Chunk, float]]:
        return [(Chunk(i, t), 1.0 / (n + 1)) for n, (i, t) in enumerate(zip(IDS, TEXTS, strict=True))][:k]

    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), members=[SearchMember("notes", notes)],
                                       store=tmp_path / "f.db", policy=policy, weights=weights)


def _run_script(tmp_path: Path, text: str, path: Path) -> subprocess.CompletedProcess[str]:
    """``text`` run as a script of its own in ``tmp_path`` (this checkout importable), given the store ``path``."""
    script = tmp_path / "script.py"
    script.write_text(text, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, check=False,
                          cwd=tmp_path, env=env)


def _all_learned_after(tmp_path: Path, text: str, *, printed: str, feedback: int) -> None:
    """Run ``text`` (:func:`_run_script`): it prints ``printed`` and leaves ``feedback`` rows, each learned."""
    path = tmp_path / "fb.db"
    done = _run_script(tmp_path, text, path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == printed
    with FeedbackStore(path) as store:
        assert store.counts()["feedback"] == feedback
        snapshot = store.load_policy_state()
        assert snapshot is not None and snapshot["state"]["n_learned"] == feedback


def test_forked_processes_write_their_own_learning_at_exit_and_only_theirs(tmp_path: Path) -> None:
    # a multiprocessing worker ends with os._exit, which runs no atexit hook (4 learned of 240 rows); a forked
    # child that ends normally flushed its copy of the parent's learning, which the parent then wrote again
    _all_learned_after(tmp_path, _FORKED, printed="[0, 0]", feedback=13)


def test_set_weights_on_a_store_of_the_users_own_without_exclusive(tmp_path: Path) -> None:
    class OwnStore:  # what an ensemble asks of a store, and saving snapshots; no exclusive()
        store_text = True

        def __init__(self) -> None:
            self.snaps: list[dict[str, Any]] = []

        def log_event(self, query: str, decision: Any, chunks: Any, **kw: Any) -> str:
            return "e1"

        def state_version(self) -> int:
            return len(self.snaps)

        def load_policy_state(self, policy: str | None = None) -> dict[str, Any] | None:
            return self.snaps[-1] if self.snaps else None

        def save_policy_state(self, state: Any, weights: Any, *, policy: str | None = None) -> int:
            self.snaps.append({"version": len(self.snaps) + 1, "state": state, "weights": weights, "policy": policy})
            return len(self.snaps)

    ens = _ensemble(OwnStore(), policy="fixed")
    assert ens.set_weights({"bm25": 1.0}).weights == {"bm25": 1.0}
    assert ens.store.snaps[-1]["weights"] == {"bm25": 1.0}
    # a save loaded onto such a store is written to it (a bare AttributeError of the missing exclusive() before)
    ens.save(tmp_path / "saved")
    own = OwnStore()
    back = FeedbackEnsemble.load(tmp_path / "saved", store=own)
    assert back.weights == {"bm25": 1.0} and own.snaps[-1]["weights"] == {"bm25": 1.0}


def test_a_learner_that_reads_the_state_while_another_learns_waits_for_it(tmp_path: Path) -> None:
    # The interleaving the test above can only hope for, forced: `b` reads the shared state while `a` is
    # between reading it and saving what it learned. Under the store's write lock `b` cannot read until
    # `a` has saved (a's wait then times out); without it, whichever saved last dropped the other's episode.
    path = str(tmp_path / "fb.db")
    a, b = _ensemble(path, refresh_interval=0), _ensemble(path, refresh_interval=0)
    ra, rb = a.retrieve("what causes the tides", k=2), b.retrieve("aurora borealis", k=2)
    a_read, b_reads = threading.Event(), threading.Event()
    b_refresh, a_learn = b._refresh, a._learner.learn

    def refresh(**kw: Any) -> None:
        b_reads.set()
        b_refresh(**kw)

    def learn(episode: Any) -> Any:  # `a` has read the shared state: let `b` go, and wait for it to read too
        a_read.set()
        b_reads.wait(timeout=2.0)
        return a_learn(episode)

    b._refresh, a._learner.learn = refresh, learn  # type: ignore[method-assign]
    other = threading.Thread(target=lambda: (a_read.wait(), b.feedback(rb.event_id, "thumbs_up")))
    other.start()
    a.feedback(ra.event_id, "thumbs_up")
    other.join()
    fresh = _ensemble(path)
    assert fresh.learner.n_learned == 2
    for e in (a, b, fresh):
        e.close()


def test_exclusive_holds_other_writers_off_and_rolls_back_on_error(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    store = FeedbackStore(path)
    other = FeedbackStore(path, busy_timeout=0.05)
    with store.exclusive():
        store.save_policy_state({"n": 1}, {"bm25": 1.0})
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.save_policy_state({"n": 2}, {"bm25": 1.0})
        with store.exclusive():  # nested blocks share the outer transaction
            store.save_policy_state({"n": 3}, {"bm25": 1.0})
        with pytest.raises(ValidationError):  # a failed write inside undoes only itself
            store.save_policy_state({"n": 4}, {"bm25": float("nan")})
    assert [s["state"]["n"] for s in other.policy_history(with_state=True)] == [1, 3]
    with pytest.raises(KeyError), store.exclusive():
        store.save_policy_state({"n": 5}, {"bm25": 1.0})
        raise KeyError("boom")
    assert other.state_version() == 2  # the block's write was rolled back with it
    other.save_policy_state({"n": 6}, {"bm25": 1.0})  # and the lock is free again
    store.close()
    other.close()


def _pair(path: str, **params: Any) -> FeedbackEnsemble:
    from rlfb.policies import make_policy

    names = ("bm25", "dense")
    return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=names, store=path, refresh_interval=0,
                                       policy=make_policy("thompson", names, **params))


def test_same_policy_other_hyperparameters_keep_their_own_state(tmp_path: Path) -> None:
    # Two apps on one store, thompson with another step: arm tables of another shape. Each must go on
    # retrieving and learning on its own state, instead of refusing the other's snapshot as "malformed".
    path = str(tmp_path / "fb.db")
    fine, coarse = _pair(path), _pair(path, step=0.5)
    assert fine.learner.policy.n_arms != coarse.learner.policy.n_arms
    r = fine.retrieve("what causes the tides", k=2)
    fine.feedback(r.event_id, "thumbs_up")
    r = coarse.retrieve("what causes the tides", k=2)  # the store's newest snapshot is fine's
    record = coarse.feedback(r.event_id, "thumbs_up")
    assert not record.duplicate and coarse.learner.n_learned == 1  # learned, not a silent duplicate
    again = _pair(path, step=0.5)  # a new app like `coarse` builds on the store
    assert again.retrieve("aurora", k=1).hits and fine.retrieve("aurora", k=1).hits
    assert fine.learner.n_learned == 1  # and fine did not take coarse's state either
    for e in (fine, coarse, again):
        e.close()


def test_apps_of_other_chunk_explorations_keep_their_own_state(tmp_path: Path) -> None:
    # A live app (thompson chunk exploration) and an evaluation app (exploration="none") on one store:
    # the live one took the other's snapshot for its own and failed every retrieval and feedback.
    path = str(tmp_path / "fb.db")
    live = _ensemble(path, refresh_interval=0.0)
    evaluation = _ensemble(path, refresh_interval=0.0, learner_config={"exploration": "none"})
    r = evaluation.retrieve("what causes the tides", k=2)
    evaluation.feedback(r.event_id, "implicit_positive", chunk_id=r.hits[0].chunk_id)
    evaluation.flush()
    for _ in range(2):
        r = live.retrieve("aurora", k=2)
        assert r.hits
    live.feedback(r.event_id, "thumbs_up")
    assert live.learner.n_learned == 1 and evaluation.learner.n_learned == 1
    for e in (live, evaluation):
        e.close()


def test_an_app_restarted_after_another_explorations_snapshot_goes_on_from_its_own(tmp_path: Path) -> None:
    # the evaluation app's snapshot is the policy's newest; the restarted live app must not take it, nor start
    # from nothing: it pages back to its own
    path = str(tmp_path / "fb.db")
    live = _ensemble(path, refresh_interval=0.0)
    for q in ("aurora", "tides", "magma"):
        r = live.retrieve(q, k=2)
        live.feedback(r.event_id, "thumbs_up")
    live.close()
    evaluation = _ensemble(path, refresh_interval=0.0, learner_config={"exploration": "none"})
    r = evaluation.retrieve("what causes the tides", k=2)
    evaluation.feedback(r.event_id, "implicit_positive", chunk_id=r.hits[0].chunk_id)
    evaluation.close()
    again = _ensemble(path, refresh_interval=0.0)
    assert again.learner.n_learned == 3
    again.close()
    assert _ensemble(path, learner_config={"exploration": "none"}).learner.n_learned == 1


def test_no_exploration_refuses_another_kinds_state() -> None:
    from rlfb.exploration import NoExploration, ThompsonChunkExploration

    with pytest.raises(CorruptStateError, match="'thompson', not 'none'"):
        NoExploration().load_state_dict(ThompsonChunkExploration().state_dict())
    with pytest.raises(CorruptStateError):
        NoExploration().load_state_dict("none")  # type: ignore[arg-type]


def test_same_hyperparameters_ignores_weights_and_tuple_lists() -> None:
    assert same_hyperparameters({"step": 0.1, "bounds": (0.05, 0.95), "weights": {"a": 1.0}},
                                {"step": 0.1, "bounds": [0.05, 0.95], "weights": {"a": 0.3}})
    assert not same_hyperparameters({"step": 0.1}, {"step": 0.5})
    # a hyperparameter one side lacks was added since it was saved: not a mismatch (load_state_dict agrees)
    assert same_hyperparameters({"step": 0.1}, {"step": 0.1, "bounds": [0.0, 1.0]})


def test_a_snapshot_from_before_a_hyperparameter_existed_is_ours(tmp_path: Path) -> None:
    path = str(tmp_path / "fb.db")
    app = _pair(path)
    r = app.retrieve("what causes the tides", k=2)
    app.feedback(r.event_id, "thumbs_up")
    app.close()
    with FeedbackStore(path) as store:  # the newest snapshot, as an rlfb without `cf_gate_z` wrote it
        saved = store.load_policy_state()
        assert saved is not None
        state = json.loads(json.dumps(saved["state"]))
        del state["policy"]["params"]["cf_gate_z"]
        store.save_policy_state(state, saved["weights"], policy="thompson")
    again = _pair(path)
    assert again.retrieve("aurora", k=1).hits
    assert again.learner.n_learned == 1  # the old snapshot was loaded, not set aside as another kind's
    again.close()


def test_an_older_snapshot_without_a_policy_column_is_known_by_its_state(tmp_path: Path) -> None:
    path = str(tmp_path / "fb.db")
    other = _ensemble(path, policy="gradient", refresh_interval=0)
    r = other.retrieve("what causes the tides", k=2)
    other.feedback(r.event_id, "thumbs_up")
    other.close()
    with FeedbackStore(path) as store:  # the newest snapshot, as an rlfb before the policy column wrote it
        saved = store.load_policy_state()
        assert saved is not None
        store.save_policy_state(saved["state"], saved["weights"])
        snapshot = store.load_policy_state()
        assert snapshot is not None and snapshot["policy"] is None
    with pytest.warns(RuntimeWarning, match="holds 'gradient' learning"):  # known as gradient's by its state
        app = _ensemble(path, refresh_interval=0)  # thompson: the gradient state is another kind's, not loaded
    assert app.retrieve("aurora", k=1).hits
    assert app.learner.n_learned == 0
    app.close()


def test_weights_import_notes_a_state_of_other_hyperparameters(tmp_path: Path) -> None:
    path = str(tmp_path / "fb.db")
    fine = _pair(path)
    fine.flush()
    coarse = _pair(str(tmp_path / "other.db"), step=0.5)
    export = tmp_path / "coarse.json"
    state = coarse.learner.state_dict()
    export.write_text(json.dumps({"weights": coarse.weights, "state": state, "policy": "thompson"}))
    with FeedbackStore(path) as store:
        store.save_policy_state(fine.learner.state_dict(), fine.weights, policy="thompson")
        out = import_weights(store, export)
    assert any("hyperparameters differ" in n and "step 0.1 there, 0.5 here" in n for n in out["notes"])
    assert fine.retrieve("aurora", k=1).hits  # the running app keeps its own state, and works
    fine.close()
    coarse.close()


def test_saves_from_many_threads_leave_one_whole_save(tmp_path: Path) -> None:
    ens = _ensemble(None)
    root = tmp_path / "idx"

    def save() -> None:
        for _ in range(5):
            ens.save(root)

    assert errors_in_threads(save, 6) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no temporary folder left behind
    assert FeedbackEnsemble.load(root).retrieve("tides", k=1).hits


def test_a_store_damaged_after_opening_raises_corrupt_state(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    with FeedbackStore(path) as store:
        for i in range(400):
            store.log_event(f"query {i} " + "pad " * 20, {"weights": {"bm25": 1.0}}, event_id=f"e{i:04d}",
                            chunks=[{"chunk_id": f"c{j}", "score": 1.0} for j in range(5)])
        store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store = FeedbackStore(path)  # opens: the damage below is in pages the opening does not read
    pages = path.stat().st_size // 4096
    with open(path, "r+b") as f:  # every page but the first few (the header and schema), as by bit rot
        f.seek(4096 * 4)
        f.write(bytes(range(256)) * 16 * (pages - 4))
    with pytest.raises(CorruptStateError, match=r"fb\.db is damaged"):
        store.counts()
    with pytest.raises(CorruptStateError, match="damaged"):
        list(store.export_rows())
    report = store.integrity_check()
    assert report != "ok" and report  # what SQLite found, not an exception
    store.close()


def test_a_store_that_cannot_be_written_raises_read_only(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "fb.db")
    event = store.log_event("tides", {"weights": {"bm25": 1.0}}, chunks=[{"chunk_id": "c1", "score": 1.0}])
    store._conn.execute("PRAGMA query_only = ON")  # SQLite answers as for a read-only file (even to root)
    with pytest.raises(ReadOnlyStoreError, match="read-only"):
        store.record_feedback(event, "thumbs_up")
    with pytest.raises(ReadOnlyStoreError):
        store.save_policy_state({}, {"bm25": 1.0})
    assert isinstance(ReadOnlyStoreError("x"), (RlfbError, PermissionError))
    assert store.counts()["feedback"] == 0  # reading still works
    store.close()


def _as_unprivileged() -> list[str]:
    """A command prefix under which file modes hold; root ignores them unless it drops DAC override."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file modes do not bind root")
    caps = "-dac_override,-dac_read_search,-fowner"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}", "--"]


def test_a_read_only_file_is_named_at_open(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    FeedbackStore(folder / "fb.db").close()
    (folder / "fb.db").chmod(0o444)
    folder.chmod(0o555)  # no WAL side files either
    code = (
        "import sys\n"
        "from rlfb.errors import ReadOnlyStoreError\n"
        "from rlfb.store import FeedbackStore\n"
        "try:\n"
        "    FeedbackStore(sys.argv[1])\n"
        "except ReadOnlyStoreError as exc:\n"
        "    print('ReadOnlyStoreError', exc)\n"
    )
    try:
        out = subprocess.run([*_as_unprivileged(), sys.executable, "-c", code, str(folder / "fb.db")],
                             capture_output=True, text=True, check=False)
    finally:
        folder.chmod(0o755)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ReadOnlyStoreError") and "is read-only" in out.stdout, out.stdout


def test_a_writable_file_in_a_folder_that_cannot_be_written_is_read_only_and_a_save_there_is_named(
    tmp_path: Path,
) -> None:
    # WAL's side files cannot be made beside the file: SQLite says "unable to open database file", which
    # was reported as damage to a good file; a save into the folder failed on an internal lock file's name
    folder = tmp_path / "ro"
    folder.mkdir()
    FeedbackStore(folder / "fb.db").close()
    folder.chmod(0o555)
    code = (
        "import sys\n"
        "from rlfb import FeedbackEnsemble\n"
        "from rlfb.errors import ReadOnlyFolderError, ReadOnlyStoreError\n"
        "from rlfb.store import FeedbackStore\n"
        "try:\n"
        "    FeedbackStore(sys.argv[1] + '/fb.db')\n"
        "except ReadOnlyStoreError as exc:\n"
        "    print('ReadOnlyStoreError', exc)\n"
        "ens = FeedbackEnsemble.from_texts(['tides moon', 'aurora sun'], retrievers=('bm25',))\n"
        "try:\n"
        "    ens.save(sys.argv[1] + '/model')\n"
        "except ReadOnlyFolderError as exc:\n"
        "    print('ReadOnlyFolderError', exc)\n"
    )
    try:
        out = subprocess.run([*_as_unprivileged(), sys.executable, "-c", code, str(folder)],
                             capture_output=True, text=True, check=False)
    finally:
        folder.chmod(0o755)
    assert out.returncode == 0, out.stderr
    store_line, save_line = out.stdout.splitlines()
    assert store_line.startswith("ReadOnlyStoreError") and "is read-only" in store_line, out.stdout
    assert save_line.startswith("ReadOnlyFolderError") and f"cannot save to {folder / 'model'}" in save_line
    assert ".lock-" not in save_line
    with FeedbackStore(folder / "fb.db") as store:
        assert store.integrity_check() == "ok"


@pytest.mark.parametrize("page", [0, -1, 2.5, "x", None, True])
def test_export_rows_refuses_a_bad_page_at_the_call(page: Any) -> None:
    with FeedbackStore() as store, pytest.raises(ValidationError, match="page must be an int"):
        store.export_rows(page=page)  # before the first row: a page of 0 used to export nothing


def test_a_rating_just_out_of_range_is_shown_as_given() -> None:
    with FeedbackStore() as store:
        event = store.log_event("tides", {"weights": {"bm25": 1.0}}, chunks=[{"chunk_id": "c1", "score": 1.0}])
        with pytest.raises(RatingOutOfRangeError, match=r"got 5\.0000001"):
            store.record_feedback(event, "rating", rating=5.0000001)
        with pytest.raises(ValidationError, match=r"got -1\.0000004"):
            store.record_feedback(event, "score", value=-1.0000004)


@pytest.mark.parametrize("fusion", [[], {}, 3])
def test_fusion_of_the_wrong_type_is_a_validation_error(fusion: Any, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="unknown fusion method"):
        _ensemble(None, fusion=fusion)
    _ensemble(None).save(tmp_path / "idx")
    config = json.loads((tmp_path / "idx" / "ensemble.json").read_text())
    (tmp_path / "idx" / "ensemble.json").write_text(json.dumps({**config, "fusion": fusion}))
    with pytest.raises(CorruptStateError):
        FeedbackEnsemble.load(tmp_path / "idx")


def test_a_second_store_on_the_file_inside_exclusive_is_a_named_error(tmp_path: Path) -> None:
    # a raw "database is locked" after busy_timeout, which did not say that the holder was this very thread
    from rlfb import StoreBusyError

    store = FeedbackStore(tmp_path / "fb.db")
    other = FeedbackStore(tmp_path / "fb.db", busy_timeout=0.05)
    with store.exclusive():
        with pytest.raises(StoreBusyError, match="another FeedbackStore on this file inside exclusive"):
            other.save_policy_state({"n": 1}, {"bm25": 1.0})
    other.save_policy_state({"n": 1}, {"bm25": 1.0})  # free again once the block ends
    for s in (store, other):
        s.close()


def test_prune_keeps_the_newest_snapshot_of_each_kind_of_ensemble(tmp_path: Path) -> None:
    # it kept each policy's newest: a thompson ensemble of other retrievers writing later took this one's only state

    path = str(tmp_path / "fb.db")
    alone = _ensemble(path)
    for q in ("aurora", "tides", "magma"):
        r = alone.retrieve(q, k=2)
        alone.feedback(r.event_id, "thumbs_up")
    alone.close()
    other = _ensemble(path, learner_config={"exploration": "none"})  # thompson as well
    r = other.retrieve("tides", k=2)
    other.feedback(r.event_id, "thumbs_up")
    other.close()
    store = FeedbackStore(path, clock=lambda: time.time() + 200 * 86400)  # prune refuses a now past the clock
    before = store.counts()["policy_snapshots"]
    deleted = store.prune(retention=90 * 86400)
    assert deleted["policy_snapshots"] == before - 2  # the newest of each of the two kinds stays
    store.close()
    assert _ensemble(path).learner.n_learned == 3


def test_an_app_without_a_snapshot_of_its_own_pages_back_once(tmp_path: Path) -> None:
    # it paged back through the whole history on every refresh, under both locks, each time the other app wrote
    path = str(tmp_path / "fb.db")
    live = _ensemble(path, refresh_interval=0.0)
    for i in range(12):
        r = live.retrieve(f"aurora {i}", k=2)
        live.feedback(r.event_id, "thumbs_up")
    evaluation = _ensemble(path, refresh_interval=0.0, learner_config={"exploration": "none"})
    reads: list[Any] = []
    real = evaluation.store.load_policy_state

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs.get("before"))
        return real(*args, **kwargs)

    evaluation.store.load_policy_state = counted
    for i in range(3):
        r = live.retrieve(f"tides {i}", k=2)
        live.feedback(r.event_id, "thumbs_up")  # a new snapshot of the other kind
        reads.clear()
        evaluation.retrieve("magma", k=2, log=False)
        assert len(reads) <= 3  # the newest, its policy's newest, and one step back: not all 13+
    assert evaluation.learner.n_learned == 0


@pytest.mark.parametrize("policy", ["fixed", "thompson", "gradient"])
def test_weights_set_on_the_ensemble_are_written_to_the_store(tmp_path: Path, policy: str) -> None:
    # set on ens.learner (as load()'s error advised) they were never written: a restart, or the next snapshot
    # of another process sharing the store, brought 0.5/0.5 back
    path = str(tmp_path / "fb.db")
    a = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"), store=path, policy=policy,
                                    refresh_interval=0)
    b = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"), store=path, policy=policy,
                                    refresh_interval=0)
    a.set_weights({"bm25": 0.2, "dense": 0.8})
    assert b.weights == pytest.approx({"bm25": 0.2, "dense": 0.8})  # b picks them up
    a.close()
    b.close()
    again = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"), store=path, policy=policy)
    assert again.weights == pytest.approx({"bm25": 0.2, "dense": 0.8})
    with pytest.raises(ValidationError):
        again.set_weights({"bm25": float("nan"), "dense": 1.0})
    assert again.weights == pytest.approx({"bm25": 0.2, "dense": 0.8})
    again.close()


@pytest.mark.parametrize("shared_object", [True, False])
def test_feedback_given_to_another_ensemble_is_learned_by_the_one_that_made_the_decision(tmp_path: Path,
                                                                                          shared_object: bool) -> None:
    # two ensembles of the same retrievers over two corpora on one store: b.feedback(a's event) taught b a's
    # decision (its chunks are not even b's) and a nothing
    path = tmp_path / "fb.db"
    store_a = FeedbackStore(path)
    store_b = store_a if shared_object else FeedbackStore(path)
    a = FeedbackEnsemble.from_texts(["valve pressure manual", "pump manual", "seal manual"], ids=["A1", "A2", "A3"],
                                    retrievers=("bm25",), store=store_a, policy="thompson")
    b = FeedbackEnsemble.from_texts(["valve pressure faq", "pump faq", "seal faq"], ids=["B1", "B2", "B3"],
                                    retrievers=("bm25",), store=store_b, policy="thompson")
    r = a.retrieve("valve pressure", k=2)
    record = b.feedback(r.event_id, "explicit_positive")
    assert record.event_id == r.event_id
    assert a.learner.n_learned == 1 and b.learner.n_learned == 0


def test_on_rollback_runs_for_the_writes_undone_only(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "fb.db")
    ran: list[str] = []
    with pytest.raises(RlfbError, match="exclusive"):
        store.on_rollback(lambda: ran.append("outside"))
    with store.exclusive():
        with pytest.raises(ValidationError, match="callable"):
            store.on_rollback("not callable")  # type: ignore[arg-type]
        store.on_rollback(lambda: ran.append("committed"))
    assert ran == []  # the outermost commit drops them
    with pytest.raises(KeyError), store.exclusive():
        store.on_rollback(lambda: ran.append("outer"))
        with store.exclusive():  # commits into the outer block: its rollback undoes these writes too
            store.on_rollback(lambda: ran.append("inner, committed"))
        with pytest.raises(ValueError), store.exclusive():  # undoes its own writes only, at once
            store.on_rollback(lambda: ran.append("inner, failed"))
            raise ValueError
        assert ran == ["inner, failed"]
        raise KeyError("boom")
    assert ran == ["inner, failed", "inner, committed", "outer"]  # newest first

    def broken() -> None:
        raise OSError("disk gone")

    with warnings.catch_warnings(record=True) as caught, pytest.raises(KeyError) as info, store.exclusive():
        warnings.simplefilter("always")
        store.on_rollback(lambda: ran.append("still run"))
        store.on_rollback(broken)
        raise KeyError("the block's own error")
    assert ran[-1] == "still run" and "disk gone" in noted(info.value, caught)
    store.close()


@pytest.mark.parametrize("persist_interval", [0.0, 3600.0])
def test_feedback_in_a_callers_block_that_rolls_back_is_not_learned(tmp_path: Path,
                                                                     persist_interval: float) -> None:
    # The feedback row and the snapshot are undone with the caller's block; the in-memory learner kept what it
    # learned, so the retry with the same idempotency key (no longer a duplicate) was learned a second time.
    path = str(tmp_path / "fb.db")
    ens = _ensemble(path, persist_interval=persist_interval)
    store = ens.store
    r = ens.retrieve("what causes the tides", k=3)
    ens.feedback(r.event_id, "explicit_positive", chunk_id=r.hits[1].chunk_id)  # something learned before
    before = json.dumps(ens.learner.state_dict(), sort_keys=True)
    version = store.state_version()
    with pytest.raises(RuntimeError), store.exclusive():
        ens.feedback(r.event_id, "thumbs_up", idempotency_key="K")
        ens.feedback(r.event_id, "explicit_negative", chunk_id=r.hits[0].chunk_id)
        assert ens.learner.n_learned == 3
        raise RuntimeError("the caller's own write failed")
    assert json.dumps(ens.learner.state_dict(), sort_keys=True) == before
    assert ens.learner.n_learned == 1 and store.state_version() == version
    record = ens.feedback(r.event_id, "thumbs_up", idempotency_key="K")  # the retry
    assert not record.duplicate and ens.learner.n_learned == 2
    ens.close()
    fresh = _ensemble(path)
    assert fresh.learner.n_learned == 2  # and the snapshot written after the rollback holds both
    fresh.close()


def test_a_rolled_back_feedback_leaves_the_whole_replay_buffer(tmp_path: Path) -> None:
    # the learner was restored from a state copy, of whose replay buffer a save keeps the newest replay_persist:
    # a rollback in a long-running app dropped up to 9,800 replayed episodes
    ens = _ensemble(str(tmp_path / "fb.db"), policy="gradient", learner_config={"replay_persist": 3})
    for i in range(8):
        r = ens.retrieve(f"what causes the tides {i}", k=3)
        ens.feedback(r.event_id, "explicit_positive", chunk_id=r.hits[0].chunk_id)
    held = len(ens.learner.replay)
    assert held > 3
    with pytest.raises(RuntimeError), ens.store.exclusive():
        ens.feedback(r.event_id, "thumbs_up")
        raise RuntimeError("the caller's own write failed")
    assert len(ens.learner.replay) == held
    ens.close()


def test_prune_keeps_the_newest_snapshot_of_each_dense_model(tmp_path: Path) -> None:
    # two dense models of one dimension are two kinds of ensemble (their memories' embeddings are not
    # comparable): pruning kept one snapshot for both, and the other model's app lost its only state

    path = str(tmp_path / "fb.db")
    with FeedbackStore(path) as store:
        for model in ("dense:a", "dense:a", "dense:b"):
            state = {"retrievers": ["bm25", "dense"], "memory": {"dim": 4, "model": model}}
            store.save_policy_state(state, {"bm25": 0.5, "dense": 0.5}, policy="thompson")
    store = FeedbackStore(path, clock=lambda: time.time() + 200 * 86400)
    assert store.prune(retention=90 * 86400)["policy_snapshots"] == 1
    models = {s["state"]["memory"]["model"] for s in store.policy_history(with_state=True)}
    store.close()
    assert models == {"dense:a", "dense:b"}


_LOCAL = """
import multiprocessing as mp, sys
from rlfb import FeedbackEnsemble

TEXTS = ["ocean tides follow the moon", "the aurora glows green", "volcanoes erupt magma"]


def main(path, tag, n):
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=path, policy="thompson",
                                      persist_interval=3600.0)
    for i in range(n):
        r = ens.retrieve(f"tides {tag} {i}", k=2)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)


if __name__ == "__main__":
    main(sys.argv[1], "m", 7)  # its ensemble, local to main(), is unreachable once main returns
    worker = mp.get_context("spawn").Process(target=main, args=(sys.argv[1], "w", 4))
    worker.start()
    worker.join()
    print(worker.exitcode)
"""


def test_an_ensemble_local_to_a_function_is_written_at_exit(tmp_path: Path) -> None:
    # held weakly, an ensemble local to main() or to a worker's target was collected when the function
    # returned, before the exit hooks ran, and its unwritten learning went with it (1 of 30 feedbacks learned)
    _all_learned_after(tmp_path, _LOCAL, printed="0", feedback=11)


def test_a_restart_after_another_app_wrote_last_draws_anew(tmp_path: Path) -> None:
    # the restart marked the other app's newest snapshot as seen before asking whether this was its first
    # snapshot: it never reseeded, and drew the seed's first random numbers again at every restart
    def ensemble(policy: str, store: Any = tmp_path / "f.db") -> FeedbackEnsemble:
        return FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy=policy, store=store, seed=0)

    def draws(ens: FeedbackEnsemble) -> list[Any]:
        return [g.bit_generator.state["state"]["state"] for g in ens.learner._generators()]

    fresh = draws(ensemble("thompson", None))
    for policy in ("thompson", "gradient"):
        with warnings.catch_warnings():  # gradient starts afresh where thompson learned, and says so
            warnings.simplefilter("ignore", RuntimeWarning)
            ens = ensemble(policy)
        r = ens.retrieve("tides", k=3)
        ens.feedback(r.event_id, "thumbs_up")
        ens.close()
        again = ensemble("thompson")
        assert draws(again) != fresh, f"a restart after {policy} wrote last"
        again.close()


def test_ensembles_dropped_with_only_asks_unwritten_are_not_held(tmp_path: Path) -> None:
    # held strongly whenever a remembered question was asked (even at persist_interval=0), an ensemble built per
    # request and never closed was kept with its connection: 200 requests, 401 more open file descriptors
    import gc
    import weakref

    from rlfb import snapshot_sync

    path = tmp_path / "f.db"
    with FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=path) as ens:
        r = ens.retrieve("tides", k=2)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    refs = []
    for _ in range(5):
        ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=path)
        ens.retrieve("tides", k=2)  # a remembered question: its ask is unwritten
        assert ens._unsaved_asks and ens in snapshot_sync._UNWRITTEN
        refs.append(weakref.ref(ens))
        del ens
    gc.collect()
    assert all(ref() is None for ref in refs)


_ROLLED_BACK = """
import sys
from rlfb import FeedbackEnsemble

ens = FeedbackEnsemble.from_texts(["solar wind aurora", "sourdough bread", "tides moon"], retrievers=("bm25",),
                                  store=sys.argv[1], persist_interval=1e9, policy="thompson")
for q in ("aurora", "bread"):
    ens.feedback(ens.retrieve(q).event_id, "thumbs_up")
try:
    with ens.store.exclusive():
        ens.flush()
        raise RuntimeError("the caller's block fails")
except RuntimeError:
    pass
"""


def test_learning_a_rolled_back_flush_left_unwritten_is_written_at_exit(tmp_path: Path) -> None:
    # the flush unpinned it; the rollback made it unwritten again, but nothing registered it for the exit hook
    path = tmp_path / "fb.db"
    done = _run_script(tmp_path, _ROLLED_BACK, path)
    assert done.returncode == 0, done.stderr
    with FeedbackStore(path) as store:
        snapshot = store.load_policy_state()
        assert snapshot is not None and snapshot["state"]["n_learned"] == 2


def test_a_store_written_while_the_clock_ran_two_days_fast_still_opens_and_learns_once_it_is_corrected(tmp_path):
    # the learner refused times more than a day past this machine's clock: its snapshots, stamped by the fast
    # clock, were "damaged" once the clock was put right, and the store could not be opened but by dropping them
    path = str(tmp_path / "fb.db")
    fast = FeedbackStore(path, clock=lambda: time.time() + 2 * 86_400)
    ens = _ensemble(fast)
    r = ens.retrieve("what causes the tides", k=3)
    ens.feedback(r.event_id, "explicit_positive", chunk_id=r.hits[0].chunk_id)  # was refused too: a pinned clock
    ens.close()
    fast.close()
    ens = _ensemble(path)  # the clock put right
    assert ens.learner.n_learned == 1
    r = ens.retrieve("what causes the tides", k=3)
    ens.feedback(r.event_id, "explicit_positive", chunk_id=r.hits[0].chunk_id)
    assert ens.learner.n_learned == 2
    ens.close()


def test_a_memory_off_app_of_before_the_exploration_default_is_told_how_to_keep_its_learning(tmp_path) -> None:
    """With the memory off, chunk exploration became "none" by default (it was "thompson"): the store's
    learning of such an app is another kind's, and a new ensemble of the same settings started afresh unsaid."""
    db = str(tmp_path / "fb.db")
    before = {"memory_weight": 0.0, "exploration": "thompson"}  # what memory_weight=0 ran with before
    old = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",), store=db, learner_config=before)
    for q in ("aurora", "tides", "volcano"):
        old.feedback(old.retrieve(q, k=3).event_id, "thumbs_up")
    learned = old.learner.n_learned
    old.close()
    with pytest.warns(RuntimeWarning, match="'exploration': 'thompson'") as caught:
        fresh = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",), store=db,
                                            learner_config={"memory_weight": 0.0})
    assert [w.filename for w in caught if "'exploration'" in str(w.message)] == [__file__]  # not snapshot_sync.py
    assert fresh.learner.n_learned == 0
    fresh.close()
    kept = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",), store=db, learner_config=before)
    assert kept.learner.n_learned == learned == 3  # what the warning says to do
    kept.close()


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


# snapshot kinds
DAY = 86400.0


def _state(retrievers: list[str], weights: dict[str, float]) -> dict:
    return {"retrievers": retrievers, "exploration": {"kind": "none"},
            "policy": {"name": "thompson", "params": {"step": 0.1, "weights": weights}}}


def test_prune_keeps_the_newest_snapshot_of_each_set_of_retrievers() -> None:
    """Two apps with other retrievers share a store and a policy. Read without the retrievers, their snapshots
    were one kind: a prune kept only the newer app's and took the other's only state."""
    store = FeedbackStore(":memory:", clock=Clock(), retention=30 * DAY, snapshots_kept=None)
    store.save_policy_state(_state(["bm25"], {"bm25": 1.0}), {"bm25": 1.0}, policy="thompson",
                            timestamp=NOW - 60 * DAY)
    store.save_policy_state(_state(["bm25", "dense"], {"bm25": 0.5, "dense": 0.5}), {"bm25": 0.5, "dense": 0.5},
                            policy="thompson", timestamp=NOW - 59 * DAY)
    assert len(store.newest_snapshots()) == 2
    assert store.prune()["policy_snapshots"] == 0
    assert store.counts()["policy_snapshots"] == 2


def test_prune_takes_a_kinds_older_snapshots_whatever_weights_they_hold() -> None:
    """The weights in a policy's params are what it learned, not a hyperparameter: read with them, every snapshot
    of a learning policy was a kind of its own, and a prune (and ``newest_snapshots``) kept them all."""
    store = FeedbackStore(":memory:", clock=Clock(), retention=30 * DAY, snapshots_kept=None)
    for i, w in enumerate((0.2, 0.4, 0.6)):
        store.save_policy_state(_state(["bm25", "dense"], {"bm25": w, "dense": 1 - w}),
                                {"bm25": w, "dense": 1 - w}, policy="thompson", timestamp=NOW - (60 - i) * DAY)
    assert len(store.newest_snapshots()) == 1
    assert store.prune()["policy_snapshots"] == 2
    snapshot = store.load_policy_state()
    assert snapshot is not None and snapshot["weights"] == pytest.approx({"bm25": 0.6, "dense": 0.4})


# weights given again, and when learning is written
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


# -- a restart with another policy ---------------------------------------------------------------------------
def test_a_restart_without_the_policy_it_learned_with_warns_that_it_starts_afresh(tmp_path: Path) -> None:
    """FeedbackEnsemble's default policy is ``fixed``: an app restarted without its ``policy="thompson"`` found
    none of its learning and said nothing (a user's walkthrough, 2026-12-07)."""
    from _corpus import IDS, TEXTS

    db = tmp_path / "fb.db"
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=db, policy="thompson")
    for _ in range(3):
        r = ens.retrieve("what causes tides", k=3)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[-1].chunk_id)
    ens.close()
    with pytest.warns(RuntimeWarning, match=r"holds 'thompson' learning .* runs 'fixed'.* policy='thompson'") as said:
        plain = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=db)
    assert [w.filename for w in said if "starts afresh" in str(w.message)] == [__file__]  # the app's line
    assert plain.learner.n_learned == 0
    with warnings.catch_warnings(record=True) as caught:  # once: not again at each retrieval
        warnings.simplefilter("always")
        plain.retrieve("what causes tides", k=3)
        again = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=db, policy="thompson")
        other = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25", "dense"), store=db)
    assert not [w for w in caught if "learning" in str(w.message)]  # its own policy, or other retrievers: silent
    assert again.learner.n_learned == 3 and other.learner.n_learned == 0
    for e in (plain, again, other):
        e.close()


def test_no_note_of_starting_afresh_where_an_ensemble_does_not(tmp_path: Path) -> None:
    """A review of the note above: a save loaded onto a store where another policy wrote last (its learning comes
    from the save), an app running before another policy's app wrote, and an app whose policy has learning of
    another kind there (another note's case) were each told that they start afresh and should switch policy."""
    from _corpus import IDS, TEXTS

    def teach(ens: FeedbackEnsemble) -> None:
        r = ens.retrieve("what causes tides", k=3)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)

    db = tmp_path / "fb.db"
    saved = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=tmp_path / "own.db",
                                        policy="thompson")
    teach(saved)
    saved.save(tmp_path / "idx")
    saved.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        running = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=db)  # fixed, fresh store
        writer = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=db, policy="gradient",
                                             refresh_interval=0)
        teach(writer)
        running.refresh()
        running.retrieve("what causes tides", k=3)
        loaded = FeedbackEnsemble.load(tmp_path / "idx", store=db)  # thompson, gradient's snapshot newest
        tuned = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=db, policy="thompson",
                                            learner_config={"memory_weight": 0.0})  # loaded's learning: other kind
    assert not [w for w in caught if "starts afresh; pass policy" in str(w.message)]
    assert loaded.learner.n_learned == 1
    for e in (running, writer, loaded, tuned):
        e.close()


def test_nothing_is_taken_again_when_no_other_writer_wrote(tmp_path: Path) -> None:
    # a mutation review (2026-12-07): "newer" read as "as new or newer" reloaded this ensemble's own newest snapshot
    # and learned its unwritten episodes again on top of it at every look at the store, though nobody else wrote
    ens = _ensemble(str(tmp_path / "fb.db"), persist_interval=math.inf)
    for _ in range(3):
        _click(ens)
    ens.flush()  # written: the store's newest is this ensemble's own
    for _ in range(3):
        _click(ens)  # learned, not written
    before = ens.learner.state_dict()
    assert snapshot_sync.take_newer(ens) == 0
    assert ens.learner.state_dict() == before
    ens.close()
