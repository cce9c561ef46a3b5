"""Bounds on what one question adds to the learned state, found by an audit at scale (2026-12-05).

A long question (a chat history sent as the query) is known to the learner by its hash, not its text: its text
was kept whole up to four times in every snapshot (the memory, the click evidence of its query type and of all,
the replay), and 2,500 questions of 2 KB made a 12 MB snapshot. And a whole corpus retrieved with a thumbs on its
answer gave one memory entry 50,020 chunks, and every later feedback took 112 ms instead of 2: an entry keeps
evidence on at most ``MAX_CHUNKS_PER_QUESTION`` chunks, and the replay the first ``MAX_SHOWN`` shown chunks of an
episode.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from rlfb import FeedbackEnsemble
from rlfb.blocks import encode_block
from rlfb.memory import (
    HASHED_KEY,
    MAX_CHUNKS_PER_QUESTION,
    MAX_KEY_CHARS,
    FeedbackMemory,
    normalize_query,
    question_key,
)
from rlfb.replay import MAX_SHOWN

TEXTS = ["The aurora is caused by charged particles from the sun.", "Tides follow the pull of the moon.",
         "Volcanoes erupt molten rock.", "Glaciers carve valleys over thousands of years."]
LONG = "Earlier in this chat we spoke about ZEBRA-HISTORY. " * 40 + "So what pulls the tides?"


def _ensemble(path: Path) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=path, policy="thompson", seed=0)


def _latest_state(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        (state,) = conn.execute("SELECT state FROM policy_snapshots ORDER BY version DESC LIMIT 1").fetchone()
    return state


def test_a_long_question_is_learned_and_recalled_by_its_hash_and_its_text_is_in_no_snapshot(tmp_path: Path) -> None:
    assert len(LONG) > MAX_KEY_CHARS
    path = tmp_path / "fb.db"
    with _ensemble(path) as ens:
        hits = ens.retrieve(LONG, k=4)
        tides = next(h for h in hits.hits if "Tides" in h.text)
        ens.feedback(hits.event_id, "click", chunk_id=tides.chunk_id)
        # the same question spaced and capitalised otherwise is the same question to the memory
        again = ens.retrieve(LONG.upper().replace(". ", ".  "), k=4)
        memory = again.hits[0].memory
        assert again.hits[0].chunk_id == tides.chunk_id and memory is not None and memory > 0
        ens.feedback(again.event_id, "thumbs_up")
    state = _latest_state(path)
    assert "ZEBRA" not in state and HASHED_KEY in state
    # the events keep the question (a store that keeps text), and the key the learner knew it by
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM events WHERE query LIKE '%ZEBRA%'").fetchone()[0] == 2


def test_feedback_after_a_restart_finds_the_long_question_the_memory_knows(tmp_path: Path) -> None:
    path = tmp_path / "fb.db"
    with _ensemble(path) as ens:
        hits = ens.retrieve(LONG, k=4)
        first = ens.retrieve(LONG, k=4)  # asked twice before any feedback
    tides = next(h for h in hits.hits if "Tides" in h.text)
    with _ensemble(path) as ens:  # a new process: the episodes are rebuilt from the logged events
        ens.feedback(hits.event_id, "click", chunk_id=tides.chunk_id)
        ens.feedback(first.event_id, "click", chunk_id=tides.chunk_id)
        assert list(ens.learner.memory.known(question_key(LONG))) == [tides.chunk_id]
        assert ens.retrieve(LONG, k=4).hits[0].chunk_id == tides.chunk_id
    assert "ZEBRA" not in _latest_state(path)


def test_short_questions_keep_their_text() -> None:
    text = "x" * MAX_KEY_CHARS
    assert question_key(text) == text
    assert question_key(text + "y").startswith(HASHED_KEY)
    assert question_key(question_key(text + "y")) == question_key(text + "y")  # a key is its own key


def test_one_questions_entry_keeps_the_strongest_evidence_up_to_its_bound() -> None:
    n = MAX_CHUNKS_PER_QUESTION + 500
    ids = [f"c{i}" for i in range(n)]
    mem = FeedbackMemory()
    # a whole list criticised, then one chunk clicked: the click and the strongest criticism stay
    mem.update("tides", None, ids, [-0.1 - i / n for i in range(n)], timestamp=1.0)
    mem.update("tides", None, ["c0"], [2.0], timestamp=2.0)
    known = mem.known("tides")
    assert len(known) == MAX_CHUNKS_PER_QUESTION
    assert known["c0"] > 0 and f"c{n - 1}" in known and "c1" not in known
    # a snapshot holding more (saved before the bound) is bounded as it is read
    state = mem.state_dict()
    state["counts"] = [n]
    state["chunks"] = ids
    state["values"] = encode_block(np.full(n, -0.5))
    again = FeedbackMemory().load_state_dict(state)
    assert list(again.known("tides")) == ids[:MAX_CHUNKS_PER_QUESTION]


def test_a_whole_corpus_retrieved_and_criticised_fills_one_entry_only_to_its_bound(tmp_path: Path) -> None:
    texts = [f"note {i} about tides and the moon, page {i}" for i in range(MAX_CHUNKS_PER_QUESTION + 200)]
    ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=tmp_path / "fb.db", policy="thompson")
    hits = ens.retrieve("tides and the moon", k=len(texts))
    assert len(hits) == len(texts)
    ens.feedback(hits.event_id, "thumbs_down")
    assert len(ens.learner.memory.known("tides and the moon")) == MAX_CHUNKS_PER_QUESTION
    # and the replay keeps the episode's first shown chunks only, in the order shown
    (episode,) = ens.learner.replay.sample()
    assert episode.shown_ids == tuple(hits.chunk_ids[:MAX_SHOWN]) and episode.shown.shape == (MAX_SHOWN, 1)
    assert episode.scores is not None and episode.chunk_rewards.shape == episode.scores.shape == (MAX_SHOWN,)
    ens.close()


def test_a_state_saved_with_a_long_question_by_its_text_is_read_with_it_keyed_by_its_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a snapshot written before long questions were hashed: loaded as it was, its evidence went unfound (looked up
    # by the hash) and its text stayed in every later snapshot
    import rlfb.feedback_learning
    import rlfb.learner
    import rlfb.policies.click_evidence as click_evidence

    with monkeypatch.context() as old:  # rlfb as it was: every question known by its text
        old.setattr(rlfb.learner, "_keyed", lambda item: item)
        old.setattr(rlfb.feedback_learning, "question_key", lambda q: q)
        old.setattr(click_evidence, "_key", lambda q: " ".join(q.lower().split()))
        with _ensemble(tmp_path / "fb.db") as ens:
            hits = ens.retrieve(LONG, k=4)
            tides = next(h for h in hits.hits if "Tides" in h.text)
            ens.feedback(hits.event_id, "click", chunk_id=tides.chunk_id)
    assert "ZEBRA" in _latest_state(tmp_path / "fb.db")
    with _ensemble(tmp_path / "fb.db") as ens:  # this rlfb reads it
        assert list(ens.learner.memory.known(question_key(LONG))) == [tides.chunk_id]
        again = ens.retrieve(LONG, k=4)
        memory = again.hits[0].memory
        assert again.hits[0].chunk_id == tides.chunk_id and memory is not None and memory > 0
        ens.feedback(again.event_id, "thumbs_up")
    assert "ZEBRA" not in _latest_state(tmp_path / "fb.db")


def test_two_spellings_of_one_long_question_saved_apart_add_up_when_read() -> None:
    # saved by their text, "…tides?" and "…tides" were two questions of the click evidence; one hash now
    from rlfb.policies.click_evidence import ClickEvidence

    ev = ClickEvidence(2)
    old = " ".join  # the key as it was: lower case, single spaces
    ev._rows = {old(LONG.lower().split()): 0, old((LONG + "?").lower().split()): 1, "short one": 2}
    ev._q = np.array([[0.5, 1.0, 1.0], [0.25, 0.5, 2.0], [1.0, 0.0, 1.0]])
    ev.n, ev._s = 4.0, np.array([1.75, 1.5])
    again = ClickEvidence(2).load_state_dict(ev.state_dict())
    assert again.n_queries == 2
    state = again.state_dict()
    # in the place of the more recently used of the two: before "short one", used after both
    assert state["queries"] == [question_key(LONG), "short one"]
    merged = ClickEvidence(2)
    merged._rows, merged._q = {question_key(LONG): 0, "short one": 1}, np.array([[0.75, 1.5, 3.0], [1.0, 0.0, 1.0]])
    merged.n, merged._s = 4.0, np.array([1.75, 1.5])
    assert np.allclose(again.posterior()[0], merged.posterior()[0])
    assert np.allclose(again.posterior()[1], merged.posterior()[1])


def test_a_question_saved_under_its_text_and_its_hash_both_is_read_once() -> None:
    # a rolling upgrade: a new process learned it by its hash, an older one again by its text; the state loaded
    # with one key twice, and every snapshot after it was refused ("holds a query twice")
    text_keyed, hash_keyed = FeedbackMemory(), FeedbackMemory()
    normal = normalize_query(LONG)  # as the memory keyed it by its text
    text_keyed.update(normal, None, ["old"], [0.4], timestamp=1.0)
    text_keyed.note_ask(normal)
    hash_keyed.update(question_key(LONG), None, ["new"], [0.4], timestamp=2.0)
    b = hash_keyed.state_dict()
    both = {**b, "queries": [normal, question_key(LONG)], "counts": [1, 1], "chunks": ["old", "new"],
            "values": encode_block(np.array([0.4, 0.4])),
            "clock": encode_block(np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))}
    mem = FeedbackMemory().load_state_dict(both)
    assert len(mem) == 1 and mem.known(question_key(LONG)) == {"new": 0.4}  # the more recently used
    assert mem.asks(question_key(LONG)) == 1  # the askings of both
    FeedbackMemory().load_state_dict(mem.state_dict())  # and it saves a state that loads


def test_a_short_key_that_grows_past_the_bound_when_normalised_is_re_keyed() -> None:
    # the click evidence measured the saved key's raw length, the learner the normalised one: "\u0958" is two
    # characters in NFC, so 300 of them (600 normalised) stayed keyed by their text and went unfound
    from rlfb.policies.click_evidence import ClickEvidence

    grows = "\u0958" * 300
    ev = ClickEvidence(2)
    ev._rows, ev._q = {grows: 0, "other": 1}, np.array([[0.5, 1.0, 1.0], [1.0, 0.0, 1.0]])
    ev.n, ev._s = 2.0, np.array([1.5, 1.0])
    again = ClickEvidence(2).load_state_dict(ev.state_dict())
    assert again.state_dict()["queries"] == [question_key(grows), "other"]
