"""FeedbackEnsemble.save / load: settings and learning survive, damage is a named error, a failed save loses nothing."""

from __future__ import annotations

import datetime
import json
import math
import time
from typing import cast

import pytest
from _damage import unchecked

from rlfb import CorruptStateError, FeedbackEnsemble, ValidationError
from rlfb.learner import LearnerConfig
from rlfb.policies import make_policy
from rlfb.policies.base import MIN_PROPENSITY, Decision
from rlfb.retrievers import BM25Retriever, DenseRetriever
from rlfb.store import FeedbackStore
from rlfb.types import make_chunks

TEXTS = [
    f"document {i} about {w} and {v}"
    for i, (w, v) in enumerate(
        (a, b)
        for a in ("aurora", "tides", "volcano", "moon", "sun", "rock", "ocean", "storm")
        for b in ("physics", "geology", "weather", "light")
    )
]
IDS = [str(i) for i in range(len(TEXTS))]  # the chunk ids the tests name
QUERIES = ("aurora physics", "storm weather", "moon light", "rock geology")


def _teach(ens: FeedbackEnsemble, rounds: int, t0: float) -> float:
    """Clicks on the second hit of each query: feedback that moves weights, memory and confidence."""
    t = t0
    for i in range(rounds):
        for q in QUERIES:
            r = ens.retrieve(q, k=5, timestamp=t)
            ens.feedback(r.event_id, "click", chunk_id=r.chunk_ids[(i + 1) % 5], timestamp=t + 1)
            t += 2
    return t


def _without_event_ids(obj: object, also: tuple[str, ...] = ()) -> object:
    """A state with the (random) event ids of the two stores left out (the replay buffer's ``event_ids``, a dict
    per episode's ``event_id`` in states saved before 2026-12-05), and the keys ``also``."""
    if isinstance(obj, dict):
        return {k: _without_event_ids(v, also) for k, v in obj.items() if k not in ("event_id", "event_ids", *also)}
    if isinstance(obj, list):
        return [_without_event_ids(v, also) for v in obj]
    return obj


def _learned_only(obj: object) -> object:
    """:func:`_without_event_ids`, and without the random generators' states."""
    return _without_event_ids(obj, also=("rng",))


@pytest.mark.parametrize(
    ("policy", "options"),
    [("thompson", {}), ("gradient", {"learning_rate": 0.5, "temperature": 0.5})],
)
def test_load_keeps_the_learner_settings_and_keeps_learning_alike(tmp_path, policy, options) -> None:
    config = LearnerConfig(exploration="epsilon", memory_weight=0.5, confidence_weight=2.0, replay_every=5)
    t0 = time.time() - 100_000

    def build(store: str) -> FeedbackEnsemble:
        # non-default learner settings and policy hyperparameters, as a user would configure them
        return FeedbackEnsemble.from_texts(
            TEXTS,
            retrievers=("bm25",),
            store=FeedbackStore(store),
            policy=make_policy(policy, ("bm25",), seed=3, **options),
            learner_config=config,
            seed=3,
        )

    saved = build(str(tmp_path / "a.db"))
    t = _teach(saved, 3, t0)
    saved.save(tmp_path / "idx")
    loaded = FeedbackEnsemble.load(tmp_path / "idx", store=str(tmp_path / "b.db"))
    assert loaded.learner.config == saved.learner.config
    assert loaded.learner.policy.hyper == saved.learner.policy.hyper
    assert loaded.learner.state_dict() == saved.learner.state_dict()
    # both go on learning from the same feedback, and stay the same
    _teach(saved, 2, t)
    _teach(loaded, 2, t)
    assert _without_event_ids(loaded.learner.state_dict()) == _without_event_ids(saved.learner.state_dict())
    for q in QUERIES:
        assert loaded.retrieve(q, k=8, log=False).chunk_ids == saved.retrieve(q, k=8, log=False).chunk_ids


def test_damaged_saves_are_named_errors(tmp_path) -> None:
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",))
    root = tmp_path / "idx"
    ens.save(root)
    unchecked(root)  # what the content checks find (a save with checksums: test_saved_folder.py)
    config = json.loads((root / "ensemble.json").read_text())
    state = json.loads((root / "learner.json").read_text())
    damaged = [
        ("ensemble.json", json.dumps({**config, "format": 99}), "format"),
        ("ensemble.json", json.dumps({**config, "rrf_c": None}), "rrf_c"),
        ("learner.json", json.dumps({**state, "now": float("nan")}), "NaN"),
        ("learner.json", json.dumps({**state, "n_learned": 0}).replace(": 0,", ": 1e400,", 1), "non-finite"),
        # int() took it, and the memory's array then failed with numpy's ArrayMemoryError
        ("learner.json", json.dumps({**state, "memory": {**state["memory"], "dim": 10**12}}), "dim"),
    ]
    for name, text, words in damaged:
        original = (root / name).read_text()
        (root / name).write_text(text)
        with pytest.raises(CorruptStateError, match=words):
            FeedbackEnsemble.load(root)
        (root / name).write_text(original)
    FeedbackEnsemble.load(root)  # intact again


def test_a_retrievers_copy_of_the_chunks_with_other_texts_is_damage(tmp_path) -> None:
    # the ids of each retriever's chunks.jsonl were checked against the ensemble's, not the texts: a save whose
    # copy differs loaded, and BM25 scored one text while the hit showed the other
    ens = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",))
    root = tmp_path / "idx"
    ens.save(root)
    copy = unchecked(root) / "retrievers" / "bm25" / "chunks.jsonl"
    rows = [json.loads(line) for line in copy.read_text().splitlines()]
    rows[1] = {**rows[1], "text": rows[1]["text"] + " changed"}
    copy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(CorruptStateError, match="retriever 'bm25' indexes another text for chunk '1'"):
        FeedbackEnsemble.load(root)
    # and a retriever given already indexed, on other texts under the same ids
    chunks = make_chunks(TEXTS, IDS)
    stale = BM25Retriever().index(make_chunks([*TEXTS[:2], "an older text", *TEXTS[3:]], IDS))
    with pytest.raises(ValidationError, match="retriever 'bm25' indexes another text for chunk '2'"):
        FeedbackEnsemble({"bm25": stale}, chunks)
    assert FeedbackEnsemble({"bm25": BM25Retriever().index(chunks)}, chunks).retrieve(TEXTS[2], k=1, log=False) \
        .hits[0].chunk_id == "2"


@pytest.mark.parametrize(
    ("store", "words"),
    [("missing/fb.db", "does not exist"), (".", "is a directory"), (123, "store must be a FeedbackStore")],
)
def test_a_bad_store_argument_to_load_is_the_callers_error_not_damage_to_the_save(tmp_path, store, words) -> None:
    # a CorruptStateError naming ensemble.json would send a user to delete a good save
    FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",)).save(tmp_path / "idx")
    arg = str(tmp_path / store) if isinstance(store, str) else store
    with pytest.raises(ValidationError, match=words) as caught:
        FeedbackEnsemble.load(tmp_path / "idx", store=arg)
    assert not isinstance(caught.value, CorruptStateError) and "ensemble.json" not in str(caught.value)
    with FeedbackEnsemble.load(tmp_path / "idx", store=str(tmp_path / "fb.db")) as ens:  # the save is intact
        assert len(ens) == len(TEXTS)


def test_a_load_that_fails_leaves_no_store_file_and_closes_a_store_it_opened(tmp_path, monkeypatch) -> None:
    FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",)).save(tmp_path / "idx")
    unchecked(tmp_path / "idx")  # its ensemble.json is edited below
    with pytest.raises(CorruptStateError):  # a mistyped folder: the store is not made before the save is read
        FeedbackEnsemble.load(tmp_path / "idxx", store=str(tmp_path / "fb.db"))
    assert not (tmp_path / "fb.db").exists()
    config = json.loads((tmp_path / "idx" / "ensemble.json").read_text())
    (tmp_path / "idx" / "ensemble.json").write_text(json.dumps({**config, "fusion": "max"}))  # found when built
    closed = []
    monkeypatch.setattr(FeedbackStore, "close", lambda self: closed.append(self.path))
    with pytest.raises(CorruptStateError, match="fusion"):
        FeedbackEnsemble.load(tmp_path / "idx", store=str(tmp_path / "fb.db"))
    assert closed == [str(tmp_path / "fb.db")]
    given = FeedbackStore(tmp_path / "given.db")
    with pytest.raises(CorruptStateError):
        FeedbackEnsemble.load(tmp_path / "idx", store=given)
    assert closed == [str(tmp_path / "fb.db")]  # a store the caller opened stays the caller's to close


@pytest.mark.parametrize(("persist", "refresh"), [(1.0, 30.0), (math.inf, math.inf), (0.0, 0.0)])
def test_load_brings_back_the_saved_intervals(tmp_path, persist, refresh) -> None:
    # they came back at the defaults (0.0 and 5.0): ensemble.json left them out
    ens = FeedbackEnsemble.from_texts(TEXTS[:4], retrievers=("bm25",), persist_interval=persist,
                                      refresh_interval=refresh)
    root = tmp_path / "idx"
    ens.save(root)
    json.loads((root / "ensemble.json").read_text(), parse_constant=_no_constant)  # infinity is JSON too
    loaded = FeedbackEnsemble.load(root)
    assert (loaded.persist_interval, loaded.refresh_interval) == (persist, refresh)
    overridden = FeedbackEnsemble.load(root, persist_interval=2.0, refresh_interval=3.0)  # explicit ones win
    assert (overridden.persist_interval, overridden.refresh_interval) == (2.0, 3.0)


def test_a_save_without_intervals_or_with_damaged_ones(tmp_path) -> None:
    root = tmp_path / "idx"
    FeedbackEnsemble.from_texts(TEXTS[:4], retrievers=("bm25",), persist_interval=1.0).save(root)
    unchecked(root)  # older saves had no checksums either
    config = json.loads((root / "ensemble.json").read_text())
    old = {k: v for k, v in config.items() if k not in ("persist_interval", "refresh_interval")}
    (root / "ensemble.json").write_text(json.dumps(old))  # as saved before the intervals were
    loaded = FeedbackEnsemble.load(root)
    assert (loaded.persist_interval, loaded.refresh_interval) == (0.0, 5.0)
    for bad in (-1.0, "forever", None, True):
        (root / "ensemble.json").write_text(json.dumps({**config, "persist_interval": bad}))
        with pytest.raises(CorruptStateError, match="ensemble.json.*persist_interval"):
            FeedbackEnsemble.load(root)
        with pytest.raises(CorruptStateError, match="persist_interval"):  # also with other settings given
            FeedbackEnsemble.load(root, candidate_k=5)
        # the setting given explicitly wins, as every keyword does, over a damaged saved one too
        assert FeedbackEnsemble.load(root, persist_interval=2.0).persist_interval == 2.0


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


def test_a_failed_save_leaves_the_previous_one(tmp_path) -> None:
    ens = FeedbackEnsemble.from_texts(TEXTS[:4], IDS[:4], retrievers=("bm25",), metadatas=[{"n": i} for i in range(4)])
    root = tmp_path / "idx"
    ens.save(root)
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}
    dated = FeedbackEnsemble.from_texts(
        TEXTS[:4], retrievers=("bm25",), metadatas=[{"published": datetime.date(2024, 1, i + 1)} for i in range(4)]
    )
    assert dated.retrieve("aurora", k=1, log=False).hits[0].metadata["published"].year == 2024  # usable in memory
    with pytest.raises(ValidationError, match="JSON"):
        dated.save(root)
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()} == before
    hit = FeedbackEnsemble.load(root).retrieve("aurora", k=1, log=False).hits[0]
    assert hit.metadata == {"n": int(hit.chunk_id)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no half-written folder left beside it
    # a save replaces an earlier one, but never a folder that holds something else
    ens.save(root)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(ValidationError, match="not empty"):
        ens.save(other)
    assert (other / "todo.txt").read_text() == "keep me"


def test_a_store_without_query_text_keeps_questions_apart_and_out_of_the_state(tmp_path) -> None:
    t0 = time.time() - 10_000
    store = FeedbackStore(tmp_path / "f.db", store_text=False)
    ens = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",), store=store)
    r = ens.retrieve("aurora physics", k=5, timestamp=t0, explore=False)
    ens.feedback(r.event_id, "click", chunk_id="0", timestamp=t0 + 1)
    r = ens.retrieve("storm weather", k=5, timestamp=t0 + 2, explore=False)
    ens.feedback(r.event_id, "click", chunk_id="30", timestamp=t0 + 3)
    assert len(ens.learner.memory) == 2  # two questions, not one merged under an empty key
    storm = ens.retrieve("storm weather", k=32, explore=False, log=False)
    assert {h.chunk_id for h in storm.hits if h.memory} == {"30"}
    ens.flush()
    snapshot = json.dumps(store.load_policy_state())
    assert "aurora physics" not in snapshot and "storm weather" not in snapshot
    # after a restart the learner finds the same question again from the store's hash
    reopened = FeedbackStore(tmp_path / "f.db", store_text=False)
    again = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",), store=reopened)
    r = again.retrieve("storm weather", k=5, timestamp=t0 + 4, explore=False)
    again._contexts.clear()  # as if the process had restarted between the retrieval and its feedback
    again.feedback(r.event_id, "click", chunk_id="30", timestamp=t0 + 5)
    assert len(again.learner.memory) == 2


def test_learning_stays_with_its_text_when_the_texts_are_given_again_in_another_order(tmp_path) -> None:
    # ids were positions: a text added at the front on a restart handed each chunk's feedback memory and
    # confidence to its neighbour ("tides" scored for a question whose clicks went to "volcanoes")
    texts = ["Tides follow the pull of the moon.", "Volcanoes erupt molten rock.", "The aurora glows green."]
    path = tmp_path / "f.db"
    first = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=str(path))
    volcano = first.chunks.ids[1]
    for _ in range(3):
        r = first.retrieve("what erupts", k=3, explore=False)
        first.feedback(r.event_id, "click", chunk_id=volcano)
    first.close()
    again = FeedbackEnsemble.from_texts(["Glaciers carve valleys.", *texts], retrievers=("bm25",), store=str(path))
    hits = {h.text: h.memory for h in again.retrieve("what erupts", k=4, explore=False, log=False).hits}
    learned = hits["Volcanoes erupt molten rock."]
    assert learned is not None and learned > 0
    assert all(v is not None and v <= 0 for t, v in hits.items() if t != "Volcanoes erupt molten rock.")
    # a text given twice is two chunks, as before
    twice = FeedbackEnsemble.from_texts([texts[0], texts[0]], retrievers=("bm25",))
    assert len(set(twice.chunks.ids)) == 2


@pytest.mark.parametrize("store_text", [True, False])
def test_a_blank_question_is_remembered_for_no_other_blank_one(tmp_path, store_text: bool) -> None:
    # every blank question ("", whitespace, punctuation alone) once shared one memory entry: a click given
    # after one user's empty search lifted that chunk for every later empty search of any user
    t0 = time.time() - 10_000
    path = tmp_path / "f.db"
    ens = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",),
                                      store=FeedbackStore(path, store_text=store_text))
    r = ens.retrieve("  ", k=5, timestamp=t0, explore=False)
    ens.feedback(r.event_id, "click", chunk_id=r.chunk_ids[-1], timestamp=t0 + 1)
    assert len(ens.learner.memory) == 0
    for blank in ("", "  ", "?!"):
        assert not any(h.memory for h in ens.retrieve(blank, k=32, explore=False, log=False).hits)
    # after a restart, the feedback learned from the logged event alone still keys no memory entry
    ens.close()
    again = FeedbackEnsemble.from_texts(TEXTS, IDS, retrievers=("bm25",),
                                        store=FeedbackStore(path, store_text=store_text))
    again.feedback(r.event_id, "click", chunk_id=r.chunk_ids[0], timestamp=t0 + 2)
    assert len(again.learner.memory) == 0
    # a question that names something is remembered as before
    r = again.retrieve("storm weather?", k=5, timestamp=t0 + 3, explore=False)
    again.feedback(r.event_id, "click", chunk_id="30", timestamp=t0 + 4)
    assert len(again.learner.memory) == 1


def test_a_propensity_too_small_for_a_float_is_logged_as_the_least_positive_one(tmp_path) -> None:
    assert Decision({"bm25": 1.0}, propensity=0.0).propensity == MIN_PROPENSITY
    assert Decision({"bm25": 1.0}, propensity=0.25).propensity == 0.25
    # a sampled ranking of 80 out of 300 chunks: its probability underflows to 0.0 in a float
    texts = [f"chunk {i} on topic {i % 17} with words {i % 5} {i % 7}" for i in range(300)]
    ens = FeedbackEnsemble.from_texts(
        texts, retrievers=("bm25",), policy="gradient", fusion="zscore", store=str(tmp_path / "f.db"), candidate_k=300
    )
    for q in ("topic 3 words", "chunk words 4", "topic 11", "words 2 6"):
        r = ens.retrieve(q, k=80)
        assert 0 < r.propensity <= 1 and r.event_id is not None


def test_save_reads_the_learner_under_the_lock_that_learning_holds(tmp_path, monkeypatch) -> None:
    # a save while feedback arrives once read the state as it changed: "dictionary changed size during
    # iteration", or half of one update; learning holds ens._lock, so the save must read under it too
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=FeedbackStore(), policy="thompson")
    _teach(ens, 2, time.time() - 100)
    read = ens.learner.state_dict
    held = []
    monkeypatch.setattr(ens.learner, "state_dict",
                        lambda: held.append(ens._lock._is_owned()) or read())  # type: ignore[func-returns-value, attr-defined]
    ens.save(tmp_path / "idx")
    assert held and all(held)


def test_a_damaged_learner_json_is_an_error_also_when_the_store_is_ahead(tmp_path) -> None:
    db = tmp_path / "fb.db"
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(db), policy="thompson")
    t = _teach(ens, 1, time.time() - 100)
    ens.save(tmp_path / "idx")
    _teach(ens, 1, t)  # the store learns on after the save
    ens.close()
    path = tmp_path / "idx" / "learner.json"
    state = json.loads(path.read_text())
    for damage, words in (({"n_learned": -5}, "n_learned"), ({"n_learned": True}, "n_learned"),
                          ({"memory": {"junk": 1}}, "memory")):
        path.write_text(json.dumps({**state, **damage}))
        for store in (None, str(db)):  # a negative count once lost to any store's and loaded as untrained
            with pytest.raises(CorruptStateError, match=words):
                FeedbackEnsemble.load(tmp_path / "idx", store=store)
    path.write_text(json.dumps(state))
    assert FeedbackEnsemble.load(tmp_path / "idx", store=str(db)).learner.n_learned == 8  # the store's, ahead


def test_a_snapshot_of_another_dense_models_memory_is_not_taken(tmp_path, monkeypatch) -> None:
    # the same retriever names, a new dense model of another dimension on the same store: its memory
    # would make every retrieval fail on the dimension, so the snapshot is set aside as another policy's
    import numpy as np

    texts = TEXTS[:6]
    db = str(tmp_path / "fb.db")
    old = FeedbackEnsemble.from_texts(texts, retrievers=("bm25", "dense"), store=db, policy="thompson")
    r = old.retrieve("aurora physics", k=2)
    old.feedback(r.event_id, "thumbs_up")
    old.close()
    narrow = FeedbackEnsemble._dense_encoder

    def wide(self):  # stands in for a 768-dimension model
        enc = narrow(self)
        return lambda qs: np.hstack([enc(qs), enc(qs)]) / np.sqrt(2)

    monkeypatch.setattr(FeedbackEnsemble, "_dense_encoder", wide)
    new = FeedbackEnsemble.from_texts(texts, retrievers=("bm25", "dense"), store=db, policy="thompson")
    assert new.learner.n_learned == 0
    r = new.retrieve("aurora physics", k=2)  # raised "query embedding has 768 dimensions" before
    new.feedback(r.event_id, "thumbs_up")
    assert new.learner.n_learned == 1


def test_a_snapshot_of_another_dense_model_of_the_same_dimension_is_not_taken_whole(tmp_path) -> None:
    # a snapshot learned with another dense model of the same dimension was taken as this ensemble's: its
    # memory's query embeddings, another model's, were compared with this model's by cosine
    from rlfb.retrievers.bm25 import BM25Retriever
    from rlfb.retrievers.dense import DenseRetriever
    from rlfb.store import FeedbackStore
    from rlfb.weight_config import import_weights

    texts = TEXTS[:6]
    db = str(tmp_path / "fb.db")

    def build(model_key: str) -> FeedbackEnsemble:  # the bundled model under two names: two models to rlfb
        return FeedbackEnsemble.from_texts(texts, retrievers=(BM25Retriever(), DenseRetriever(model_key=model_key)),
                                           store=db, policy="thompson")

    old = build("model-a")
    r = old.retrieve("aurora physics", k=2)
    old.feedback(r.event_id, "thumbs_up")
    old.close()
    with FeedbackStore(db) as store:
        saved = store.load_policy_state(policy="thompson")
    assert saved is not None
    assert saved["state"]["memory"]["model"] == "dense:model-a"
    # a new model with no snapshot of its own starts from the old one's, without its query embeddings
    new = build("model-b")
    memory = new.learner.state_dict()["memory"]
    assert new.learner.n_learned == 1 and memory["dim"] is None
    assert memory["queries"] and memory["embedded"] == [] and memory["embeddings"] == ""
    r = new.retrieve("tides and the moon", k=2)
    new.feedback(r.event_id, "thumbs_up")
    new.feedback(new.retrieve("aurora physics", k=2).event_id, "thumbs_up")
    new.close()
    # from then on each model's snapshots are its own: the old model's app goes on from its own
    again = build("model-a")
    assert again.learner.n_learned == 1
    assert again.learner.state_dict()["memory"]["dim"] is not None
    assert build("model-b").learner.n_learned == 3
    # an export imported again keeps naming its model
    (tmp_path / "w.json").write_text(json.dumps({"weights": saved["weights"], "state": saved["state"]}))
    with FeedbackStore(db) as store:
        import_weights(store, tmp_path / "w.json")
        snapshot = store.load_policy_state(policy="thompson")
        assert snapshot is not None and snapshot["state"]["memory"]["model"] == "dense:model-a"
    # a damaged snapshot of another model is no state to start from: a new model starts afresh, as before
    with FeedbackStore(db) as store:
        store.save_policy_state({**saved["state"], "memory": {**saved["state"]["memory"], "entries": [7]}},
                                saved["weights"], policy="thompson")
    assert build("model-d").learner.n_learned == 0
    # a snapshot that names no model (saved before models were named) is taken by any, embeddings and all
    del saved["state"]["memory"]["model"]
    with FeedbackStore(db) as store:
        store.save_policy_state(saved["state"], saved["weights"], policy="thompson")
    assert build("model-c").learner.state_dict()["memory"]["dim"] is not None


def test_a_dense_model_that_cannot_be_named_names_none_and_learning_goes_on(tmp_path, monkeypatch) -> None:
    # naming the model hashes its folder; a corpus read from the cache alone whose model was since uninstalled
    # cannot be named, and the snapshot after each feedback must not fail on it
    from rlfb.errors import ModelNotFoundError
    from rlfb.retrievers.dense import DenseRetriever
    from rlfb.store import FeedbackStore

    db = str(tmp_path / "fb.db")
    ens = FeedbackEnsemble.from_texts(TEXTS[:6], retrievers=("bm25", "dense"), store=db, policy="thompson")

    def missing(self):
        raise ModelNotFoundError("the default dense model all-MiniLM-L6-v2 is not installed")

    monkeypatch.setattr(DenseRetriever, "cache_key", property(missing))
    r = ens.retrieve("aurora physics", k=2)
    ens.feedback(r.event_id, "thumbs_up")
    with FeedbackStore(db) as store:
        snapshot = store.load_policy_state(policy="thompson")
        assert snapshot is not None and "model" not in snapshot["state"]["memory"]


def test_a_policy_keeps_its_learning_when_another_policy_wrote_the_store_since(tmp_path) -> None:
    # the newest snapshot alone was read: after one feedback under another policy (a changed default,
    # or a second app on the file), switching back started from nothing although its snapshots were there
    db = str(tmp_path / "fb.db")
    thompson = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=db, policy="thompson")
    t = _teach(thompson, 3, time.time() - 1000)
    learned = thompson.learner.state_dict()
    thompson.close()
    with pytest.warns(RuntimeWarning, match="holds 'thompson' learning"):  # a second app, or a changed default
        gradient = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=db, policy="gradient")
    assert gradient.learner.n_learned == 0  # not thompson's state
    t = _teach(gradient, 1, t)
    again = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=db, policy="thompson")
    assert again.learner.n_learned == 12
    # what was learned; the random generators are each process's own (started from its seed)
    assert _learned_only(again.learner.state_dict()) == _learned_only(learned)
    # two apps on one file, each learning in turn, pick up their own policy's newest state
    twin = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=db, policy="thompson", refresh_interval=0)
    _teach(again, 1, t)
    _teach(gradient, 1, t + 100)
    assert twin.refresh() == again.weights and twin.learner.n_learned == 16
    assert gradient.learner.n_learned == 8


def test_reading_the_weights_while_feedback_arrives_keeps_that_feedback(tmp_path) -> None:
    # the weights property read the store's snapshot outside the locks and loaded it after feedback had been
    # learned meanwhile: that learning was overwritten, and with persist_interval > 0 never saved
    import threading

    texts = ["ocean tides follow the moon", "the aurora glows green", "volcanoes erupt magma", "glaciers carve"]
    db = str(tmp_path / "fb.db")
    ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=db, policy="thompson",
                                      refresh_interval=0.0, persist_interval=3600.0)
    other = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=db, policy="thompson")
    for e, q in ((ens, "glacier"), (other, "aurora")):  # the store moves past ens's own snapshot
        r = e.retrieve(q, k=2)
        e.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    read = ens.store.load_policy_state
    reached, release = threading.Event(), threading.Event()

    def held(*args, **kwargs):
        out = read(*args, **kwargs)
        if threading.current_thread().name == "reader":
            reached.set()
            release.wait(30)
        return out

    ens.store.load_policy_state = held
    reader = threading.Thread(target=lambda: ens.weights, name="reader")
    reader.start()
    assert reached.wait(30)

    def give() -> None:
        r = ens.retrieve("tides moon", k=2)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)

    giver = threading.Thread(target=give)
    giver.start()
    giver.join(1.0)  # the old code learned here, between the reader's read and its load
    release.set()
    reader.join()
    giver.join()
    assert ens.learner.n_learned == 3 and ens.learner.memory.has_exact("tides moon")


def test_a_store_without_text_knows_a_repeat_by_its_normalised_text_across_a_restart(tmp_path) -> None:
    # the learner keyed a hashed question by the sha256 of its raw text: "What causes tides?" and
    # "what causes tides" were two questions to the memory, where with the text kept they are one
    from rlfb.store import FeedbackStore

    texts = ["Tides are caused by the gravity of the moon.", "The aurora glows green over the pole.",
             "Volcanoes erupt when magma rises.", "The moon orbits the earth every month."]
    path = tmp_path / "fb.db"

    def ensemble() -> FeedbackEnsemble:
        return FeedbackEnsemble.from_texts(texts, ["0", "1", "2", "3"], retrievers=("bm25",), policy="thompson",
                                           store=FeedbackStore(path, store_text=False))

    first = ensemble()
    event = first.retrieve("What causes tides?", k=3, explore=False).event_id
    first.close()
    again = ensemble()  # a restart: the feedback is learned from the logged event alone
    again.feedback(event, "implicit_positive", chunk_id="0")
    for repeat in ("What causes tides?", "what causes tides", "What causes  TIDES"):
        hits = again.retrieve(repeat, k=3, explore=False, log=False).hits
        memory = next(h.memory for h in hits if h.chunk_id == "0")
        assert memory is not None and memory > 0, repeat
    assert b"tides" not in path.read_bytes().lower()


def _split_lower(text: str) -> list[str]:
    return text.lower().split()


def test_load_passes_retriever_options_to_each_retriever(tmp_path) -> None:
    """An ensemble whose BM25 had a custom tokenizer saved but could never load: load() took no tokenizer."""
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=[BM25Retriever(tokenizer=_split_lower)])
    ens.save(tmp_path / "idx")
    with pytest.raises(ValidationError, match=r"retriever_options=\{'bm25': \{'tokenizer'"):
        FeedbackEnsemble.load(tmp_path / "idx")
    loaded = FeedbackEnsemble.load(tmp_path / "idx", retriever_options={"bm25": {"tokenizer": _split_lower}})
    for q in QUERIES:
        assert loaded.retrieve(q, k=8, log=False).chunk_ids == ens.retrieve(q, k=8, log=False).chunk_ids
    for bad, words in [({"dense": {}}, "dense"), ({"bm25": {"model": "x"}}, "model"), ({"bm25": 3}, "mapping"),
                       (["bm25"], "map")]:
        with pytest.raises(ValidationError, match=words):
            FeedbackEnsemble.load(tmp_path / "idx", retriever_options=bad)  # type: ignore[arg-type]


def test_a_dense_retriever_built_without_disk_cache_loads_without_it(tmp_path, monkeypatch) -> None:
    """cache_dir=False was not saved: the loaded ensemble wrote its encodings to the default cache folder."""
    cache = tmp_path / "default-cache"
    monkeypatch.setenv("RLFB_CACHE_DIR", str(cache))
    ens = FeedbackEnsemble.from_texts(TEXTS[:6], retrievers=("bm25", "dense"),
                                      retriever_options={"dense": {"cache_dir": False}})
    ens.retrieve("aurora light", k=2, log=False)
    ens.save(tmp_path / "idx")
    loaded = FeedbackEnsemble.load(tmp_path / "idx")
    assert cast(DenseRetriever, loaded.retrievers["dense"]).cache_dir is False
    assert loaded.retrieve("a question never seen", k=2, log=False).chunk_ids
    assert not cache.exists()
    # a setting given for one retriever overrides the saved one
    on = FeedbackEnsemble.load(tmp_path / "idx", retriever_options={"dense": {"cache_dir": None}})
    on.retrieve("another new question", k=2, log=False)
    assert (cache / "embeddings.sqlite").is_file()


def test_the_first_snapshot_is_written_however_recently_the_machine_booted(tmp_path, monkeypatch) -> None:
    # the last snapshot's time started at 0.0 on time.monotonic()'s clock, which counts from boot: within
    # persist_interval of a boot no feedback was written (a reader saw none), nor did a refresh read any
    import types

    import rlfb.ensemble

    clock = types.SimpleNamespace(monotonic=lambda: 5.0, time=time.time, perf_counter=time.perf_counter)
    monkeypatch.setattr(rlfb.ensemble, "time", clock)
    texts = ["ocean tides follow the moon", "the aurora glows green", "volcanoes erupt magma"]
    db = str(tmp_path / "fb.db")
    ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=db, policy="thompson",
                                      persist_interval=3600.0, refresh_interval=60.0)
    r = ens.retrieve("tides", k=2)
    ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    assert FeedbackStore(db).state_version() == 1  # written at once: the first snapshot is always due
    other = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=db, policy="thompson",
                                        refresh_interval=60.0)
    assert other.learner.n_learned == 1
    r = ens.retrieve("aurora", k=2)
    ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    assert FeedbackStore(db).state_version() == 1  # the next one waits for persist_interval
    ens.flush()
    assert FeedbackStore(db).state_version() == 2


def test_an_ensemble_learning_on_a_file_keeps_a_few_snapshots_and_restarts_from_its_newest(tmp_path) -> None:
    # a snapshot of the whole learned state after every feedback, none ever dropped: the file grew by a state per
    # feedback (4 GB after 10,000 retrievals in a soak test, the state having grown to 1.4 MB)
    path = tmp_path / "fb.db"
    texts = ["tides and the moon", "magma and volcanoes", "aurora and the sun", "rain and clouds"]
    ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=str(path), policy="thompson")
    for i in range(20):
        res = ens.retrieve(["moon", "magma", "aurora", "rain"][i % 4], k=2)
        ens.feedback(res.event_id, "implicit_positive", chunk_id=res.hits[0].chunk_id)
    learned = ens.learner.n_learned
    assert learned == 20 and ens.store.counts()["policy_snapshots"] <= 5
    ens.close()
    again = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), store=str(path), policy="thompson")
    again.retrieve("moon", k=1)  # reads the store's newest snapshot of its kind
    assert again.learner.n_learned == learned
    again.close()


def test_a_save_inside_exclusive_and_another_threads_save_both_finish(tmp_path) -> None:
    # the other thread's save held the save lock and waited for the store's lock, which this thread's block
    # held while its own save waited for the save lock: both waited for ever
    import threading

    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(tmp_path / "f.db"), policy="thompson")
    _teach(ens, 1, time.time() - 100)
    in_block, errors = threading.Event(), []

    def saving_inside_the_block() -> None:
        try:
            with ens.store.exclusive():
                in_block.set()
                time.sleep(0.3)  # the other save starts meanwhile and waits for the store
                ens.save(tmp_path / "inside")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def saving_outside() -> None:
        in_block.wait()
        try:
            ens.save(tmp_path / "outside")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=f, daemon=True) for f in (saving_inside_the_block, saving_outside)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)  # not a speed limit: a deadlock never ends
    assert not any(t.is_alive() for t in threads) and errors == []
    assert FeedbackEnsemble.load(tmp_path / "inside").learner.n_learned == 4
    assert FeedbackEnsemble.load(tmp_path / "outside").learner.n_learned == 4


def test_a_save_loaded_onto_a_new_store_keeps_its_learning_after_a_restart(tmp_path) -> None:
    # a mutation review (2026-12-07): the load wrote nothing of the save's learning to a new store (the
    # `_dirty = True; flush()` after load_state_dict dropped): an ensemble opened on that store after a restart
    # started from nothing, n_learned 0 instead of the save's
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(tmp_path / "a.db"), policy="thompson")
    _teach(ens, 2, time.time() - 1000)
    ens.save(tmp_path / "idx")
    saved = ens.learner
    assert saved.n_learned == 8
    loaded = FeedbackEnsemble.load(tmp_path / "idx", store=str(tmp_path / "b.db"))
    assert loaded.store.state_version() >= 1  # the save's state is the store's at once
    loaded.close()
    again = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(tmp_path / "b.db"), policy="thompson")
    assert again.learner.n_learned == saved.n_learned
    assert again.weights == pytest.approx(saved.weights())
    assert _learned_only(again.learner.state_dict()) == _learned_only(saved.state_dict())
    again.close()
    ens.close()


def test_loading_a_save_keeps_weights_set_on_its_store_since_the_save(tmp_path) -> None:
    # a mutation review (2026-12-07): the store kept only when it had learned from MORE feedback than the save
    # (> for >=): weights set after the save, which learn from nothing, were rolled back to the save's by a load
    texts = TEXTS[:6]
    db = str(tmp_path / "fb.db")
    ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25", "dense"), store=db, policy="thompson")
    for q in QUERIES:
        r = ens.retrieve(q, k=3)
        ens.feedback(r.event_id, "click", chunk_id=r.chunk_ids[1])
    ens.save(tmp_path / "idx")
    saved_weights = ens.weights
    chosen = {"bm25": 0.9, "dense": 0.1}
    assert saved_weights != pytest.approx(chosen)
    ens.set_weights(chosen)
    assert ens.weights == pytest.approx(chosen) and ens.learner.n_learned == len(QUERIES)
    ens.close()
    with FeedbackStore(db) as store:
        version = store.state_version()
    loaded = FeedbackEnsemble.load(tmp_path / "idx", store=db)
    assert loaded.learner.n_learned == len(QUERIES)
    assert loaded.weights == pytest.approx(chosen)  # the store's, not the save's
    assert loaded.store.state_version() == version  # and no snapshot of the save's state written over them
    loaded.close()
