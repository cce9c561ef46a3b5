"""Implicit signals inferred from dwell, follow-ups, citations and opened chunks."""

from __future__ import annotations

import numpy as np
import pytest

from rlfb.errors import NonFiniteValueError, UnknownChunkError, ValidationError
from rlfb.implicit import ImplicitSignals, InferredSignal, tokenize
from rlfb.reward import RewardFunction
from rlfb.store import FeedbackStore, query_hash

NOW = 1_700_000_000.0


@pytest.fixture
def imp() -> ImplicitSignals:
    return ImplicitSignals()


# -- follow-up classification ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("previous", "query", "expected"),
    [
        ("what causes the aurora", "why does the aurora happen", "reformulation"),
        ("what causes the aurora", "what causes the aurora", "reformulation"),
        ("reset my password", "how do I reset a password", "reformulation"),
        ("what causes the aurora", "best pizza in naples", "new_topic"),
        # function words alone do not make a restatement
        ("how do I reset my password", "how do I change my email", "new_topic"),
        ("极光是什么原因造成的", "极光形成的原因", "reformulation"),
        ("极光是什么原因造成的", "北京烤鸭怎么做", "new_topic"),
        # particles and polite endings (は, なぜ, のですか) are no content: these are different questions
        ("猫はなぜ鳴くのですか", "空はなぜ青いのですか", "new_topic"),
        ("猫はなぜ鳴くのですか", "なぜ猫は鳴くの", "reformulation"),
        ("オーロラはなぜ光るのですか", "オーロラが光る理由", "reformulation"),  # a katakana word is content
        ("オーロラはなぜ光るのですか", "コーヒーはなぜ苦いのですか", "new_topic"),
        # Korean separates words by spaces: a shared ending syllable (니, 까) is no shared word
        ("비는 왜 옵니까", "하늘은 왜 파랗습니까", "new_topic"),
        ("비는 왜 옵니까", "왜 비는 옵니까", "reformulation"),
        ("why do cats meow", "why is the sky blue", "new_topic"),
    ],
)
def test_classify_followup_by_word_overlap(imp, previous, query, expected):
    assert imp.classify_followup(previous, query) == expected


def test_overlap_threshold_is_strict_and_a_setting():
    previous, query = "alpha beta gamma delta epsilon", "alpha beta zeta"  # 2 of 5 previous words = 0.4
    assert 0.4 == pytest.approx(ImplicitSignals().overlap(previous, query))
    assert "new_topic" == ImplicitSignals().classify_followup(previous, query)  # not above 0.4
    assert "reformulation" == ImplicitSignals(overlap_threshold=0.3).classify_followup(previous, query)


def test_overlap_of_stopword_only_query_falls_back_to_all_words(imp):
    assert "reformulation" == imp.classify_followup("how is it", "how is it")
    assert 0.0 == imp.overlap("", "anything")


def _fake_encoder(table: dict[str, list[float]]):
    calls = []

    def encode(texts):
        calls.append(list(texts))
        vecs = np.array([table[t] for t in texts], dtype=float)
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)

    encode.calls = calls  # type: ignore[attr-defined]
    return encode


def test_encoder_similarity_replaces_word_overlap():
    enc = _fake_encoder(
        {
            "northern lights cause": [1.0, 0.0, 0.0],
            "why is the sky glowing green at night": [0.9, 0.1, 0.0],  # cos ~ 0.994
            "northern lights hotels": [0.0, 1.0, 0.0],  # cos 0
        }
    )
    imp = ImplicitSignals(encode=enc)
    # no shared words, same meaning -> reformulation
    restated = imp.classify_followup("northern lights cause", "why is the sky glowing green at night")
    assert "reformulation" == restated
    # shared words, different meaning -> new topic
    assert "new_topic" == imp.classify_followup("northern lights cause", "northern lights hotels")
    assert enc.calls[0] == ["northern lights cause", "why is the sky glowing green at night"]


def test_similarity_threshold_is_a_setting():
    enc = _fake_encoder({"a": [1.0, 0.0], "b": [0.8, 0.6]})  # cos 0.8
    assert "reformulation" == ImplicitSignals(encode=enc, similarity_threshold=0.8).classify_followup(
        "a", "b"
    )
    assert "new_topic" == ImplicitSignals(encode=enc, similarity_threshold=0.85).classify_followup("a", "b")


def test_bad_encoder_output_is_a_named_error():
    with pytest.raises(ValidationError):
        ImplicitSignals(encode=lambda texts: np.zeros(3)).classify_followup("a", "b")
    with pytest.raises(ValidationError):
        ImplicitSignals(encode=lambda texts: np.full((2, 3), np.nan)).classify_followup("a", "b")


def test_classify_followup_is_pure(imp):
    args = ("what causes the aurora", "why does the aurora happen")
    assert imp.classify_followup(*args) == imp.classify_followup(*args)


def test_tokenize_splits_cjk_per_character():
    assert ["aurora", "极", "光", "2024"] == tokenize("Aurora极光 2024")


def test_tokenize_keeps_kana_runs_and_korean_words_whole():
    assert ["猫", "はなぜ", "鳴", "くのですか"] == tokenize("猫はなぜ鳴くのですか")
    assert ["オーロラ", "は", "光", "る"] == tokenize("オーロラは光る")
    assert ["하늘은", "왜", "파랗습니까"] == tokenize("하늘은 왜 파랗습니까")


def test_hiragana_only_questions_still_compare_their_words(imp):
    # with no other content the hiragana runs count, as function words do for "how is it"
    assert "reformulation" == imp.classify_followup("なぜですか", "なぜですか")
    assert "new_topic" == imp.classify_followup("なぜですか", "どこですか")


# -- dwell ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dwell", "followup", "expected"),
    [
        (61.0, False, "dwell"),
        (600.0, False, "dwell"),
        (60.0, False, None),
        (10.0, False, None),
        (61.0, True, None),
    ],
)
def test_from_dwell(imp, dwell, followup, expected):
    assert imp.from_dwell(dwell, had_followup=followup) == expected


def test_dwell_threshold_is_a_setting():
    assert "dwell" == ImplicitSignals(dwell_threshold=10.0).from_dwell(11.0, had_followup=False)


@pytest.mark.parametrize(("dwell", "error"), [(-1.0, ValidationError), (float("nan"), NonFiniteValueError)])
def test_from_dwell_rejects_bad_values(imp, dwell, error):
    with pytest.raises(error):
        imp.from_dwell(dwell, had_followup=False)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dwell_threshold": -1},
        {"overlap_threshold": 1.5},
        {"similarity_threshold": 2.0},
        {"overlap_threshold": float("nan")},
        {"encode": "not callable"},
    ],
)
def test_constructor_validates_settings(kwargs):
    with pytest.raises(ValidationError):
        ImplicitSignals(**kwargs)


@pytest.mark.parametrize("stopwords", ["the", b"the", 3])
def test_stopwords_must_be_a_collection_of_words(stopwords):
    # a plain string was read as its characters: frozenset({"t", "h", "e"})
    with pytest.raises(ValidationError, match="stopwords"):
        ImplicitSignals(stopwords=stopwords)


def test_stopwords_are_a_setting():
    assert {"alpha"} == ImplicitSignals(stopwords=["beta"])._content("alpha beta")


# -- infer ---------------------------------------------------------------------------------
EVENT = {
    "id": "e1",
    "query": "what causes the aurora",
    "query_hash": query_hash("what causes the aurora"),
    "chunks": [{"chunk_id": "c1"}, {"chunk_id": "c2"}, {"chunk_id": "c3"}],
}


def test_infer_reformulation(imp):
    [sig] = imp.infer(EVENT, "why does the aurora happen")
    assert ("e1", "reformulation", None) == (sig.event_id, sig.signal, sig.chunk_id)
    assert "overlap" in sig.reason


def test_infer_new_topic_is_neutral(imp):
    assert [] == imp.infer(EVENT, "best pizza in naples", dwell_seconds=300.0)


def test_infer_long_dwell_without_followup_is_positive(imp):
    assert ["dwell"] == [s.signal for s in imp.infer(EVENT, None, dwell_seconds=90.0)]
    assert [] == imp.infer(EVENT, None, dwell_seconds=30.0)


def test_infer_cited_and_opened_chunks(imp):
    sigs = imp.infer(EVENT, None, cited=["c1"], opened=["c3", "c1"])
    assert [("cited", "c1"), ("opened", "c3")] == [(s.signal, s.chunk_id) for s in sigs]
    assert "cited and opened" in sigs[0].reason


@pytest.mark.parametrize("cited", [None, 3, "c1"])
def test_infer_refuses_cited_that_is_no_sequence_of_ids(imp, cited):
    with pytest.raises(ValidationError, match="cited must be a sequence of chunk ids"):
        imp.infer(EVENT, None, cited=cited)  # None was a bare TypeError


def test_infer_rejects_chunks_outside_the_event(imp):
    with pytest.raises(UnknownChunkError):
        imp.infer(EVENT, None, cited=["nope"])


def test_infer_with_only_a_query_hash_recognises_exact_repeats(imp):
    private = {**EVENT, "query": None}
    assert ["reformulation"] == [s.signal for s in imp.infer(private, "what causes the aurora")]
    assert [] == imp.infer(private, "why does the aurora happen")


def test_inferred_signals_carry_stable_idempotency_keys():
    s = InferredSignal("e1", "opened", "c2", "chunk opened")
    assert "implicit:e1:chunk:c2" == s.idempotency_key  # the chunk's, whichever signal names it
    assert InferredSignal("e1", "cited", "c2").idempotency_key == s.idempotency_key
    assert "implicit:e1:reformulation:" == InferredSignal("e1", "reformulation").idempotency_key
    assert {"event_id": "e1", "signal": "opened", "chunk_id": "c2"}.items() <= s.as_feedback().items()


def test_inferred_signals_are_known_to_the_reward_function(imp):
    rf = RewardFunction()
    sigs = imp.infer(EVENT, "why does the aurora happen", cited=["c2"]) + imp.infer(EVENT, None, 120.0)
    values = {s.signal: rf.signal_value(s.signal) for s in sigs}
    assert {"reformulation": -0.2, "cited": 0.4, "dwell": 0.4} == values


def test_infer_then_record_in_the_store_once(imp):
    store = FeedbackStore(clock=lambda: NOW)
    eid = store.log_event(
        "what causes the aurora",
        {"weights": {"bm25": 1.0}},
        [{"chunk_id": "c1", "rank": 1}, {"chunk_id": "c2", "rank": 2}],
        session_id="s",
        timestamp=NOW - 60,
    )
    previous = store.last_event("s")
    sigs = imp.infer(previous, "why does the aurora happen", cited=["c2"])
    items = [s.as_feedback(timestamp=NOW) for s in sigs]
    first = store.record_feedback_batch(items)
    again = store.record_feedback_batch(items)
    assert [False, False] == [r.duplicate for r in first]
    assert [True, True] == [r.duplicate for r in again]
    assert 2 == store.counts()["feedback"]
    reward, chunks = store.event_reward(eid)
    d = 1 - 60 / 3600
    assert reward == pytest.approx((-0.2 + 0.4) * d)
    assert chunks == pytest.approx({"c1": -0.2 * d, "c2": (-0.2 + 0.4) * d})
    store.close()


def test_a_question_asked_again_past_the_followup_window_is_no_reformulation():
    # a session id that is a user's id: asked again the next day, the question was learned as a restatement,
    # an implicit negative on the answer it got then, whatever that answer's thumbs up said
    event = {"id": "e1", "query": "what causes the aurora", "timestamp": 1000.0, "chunks": []}
    imp = ImplicitSignals()
    assert [s.signal for s in imp.infer(event, "what causes the aurora?", at=1000.0 + 600)] == ["reformulation"]
    assert imp.infer(event, "what causes the aurora?", at=1000.0 + 20 * 3600) == []
    assert [s.signal for s in imp.infer(event, "what causes the aurora?")] == ["reformulation"]  # no time: no window
    unlimited = ImplicitSignals(followup_window=None)
    assert [s.signal for s in unlimited.infer(event, "what causes the aurora?", at=1e9)] == ["reformulation"]
    for bad in (0, -1, float("nan"), "1h"):
        with pytest.raises(ValidationError):
            ImplicitSignals(followup_window=bad)  # type: ignore[arg-type]


def test_a_follow_up_exactly_at_the_end_of_the_window_is_still_a_reformulation():
    # the window was open only below 1800 s: a restatement half an hour to the second later was dropped
    event = {"id": "e1", "query": "what causes the aurora", "timestamp": 1000.0}
    imp = ImplicitSignals()
    assert imp.followup_window == 1800.0
    assert [s.signal for s in imp.infer(event, "why does the aurora happen", at=1000.0 + 1800)] == ["reformulation"]
    assert imp.infer(event, "why does the aurora happen", at=1000.0 + 1800.5) == []


def test_observe_a_day_later_records_no_reformulation(tmp_path):
    import time

    from rlfb import FeedbackEnsemble

    ens = FeedbackEnsemble.from_texts(["The aurora is caused by charged particles from the sun.",
                                       "Tides follow the pull of the moon."], retrievers=("bm25",),
                                      store=str(tmp_path / "f.db"), policy="thompson")
    t0 = time.time() - 20 * 3600
    r = ens.retrieve("What causes the aurora?", k=1, session_id="user-42", timestamp=t0)
    ens.feedback(r.event_id, "thumbs_up", timestamp=t0 + 30)
    assert ens.observe("user-42", "What causes the aurora?") == []
    assert [x.signal for x in ens.observe("user-42", "What causes the aurora?", timestamp=t0 + 60)] == ["reformulation"]


def test_observe_at_a_given_time_judges_the_retrieval_made_by_then(tmp_path):
    # the session's newest retrieval was judged whatever the follow-up's time: replayed from a log, a restated
    # question was compared with a later one and dropped, and a dwell went to a retrieval made after it
    import time

    from rlfb import FeedbackEnsemble

    ens = FeedbackEnsemble.from_texts(["The aurora is caused by charged particles from the sun.",
                                       "Tides follow the pull of the moon.", "Volcanoes erupt molten rock."],
                                      retrievers=("bm25",), store=str(tmp_path / "f.db"), policy="thompson")
    t0 = time.time() - 7200
    aurora = ens.retrieve("what causes the aurora", k=2, session_id="s", timestamp=t0).event_id
    ens.retrieve("why do volcanoes erupt", k=2, session_id="s", timestamp=t0 + 1200)
    restated = ens.observe("s", "what causes the aurora borealis", timestamp=t0 + 60)
    assert [(x.event_id, x.signal) for x in restated] == [(aurora, "reformulation")]
    dwelt = ens.observe("s", dwell_seconds=120, timestamp=t0 + 1000)
    assert [(x.event_id, x.signal, x.delay) for x in dwelt] == [(aurora, "dwell", 1000.0)]
    # logged out of time order (a replay): the one made by then, not the one logged last
    ens.retrieve("how do tides work", k=2, session_id="s2", timestamp=t0 + 3000)
    later_logged = ens.retrieve("what causes the aurora", k=2, session_id="s2", timestamp=t0 + 2000).event_id
    assert [x.event_id for x in ens.observe("s2", "what causes the aurora borealis", timestamp=t0 + 2100)] \
        == [later_logged]
    assert ens.store.last_event("s", at=t0 - 1) is None
    assert ens.store.last_event("s")["query"] == "why do volcanoes erupt"  # no time given: the latest


def test_a_follow_up_time_in_milliseconds_is_refused_not_taken_for_a_new_visit(tmp_path):
    import time

    from rlfb import FeedbackEnsemble
    from rlfb.errors import FutureTimestampError

    ens = FeedbackEnsemble.from_texts(["The aurora is caused by charged particles from the sun.",
                                       "Tides follow the pull of the moon."], retrievers=("bm25",),
                                      store=str(tmp_path / "f.db"), policy="thompson")
    t0 = time.time() - 600
    ens.retrieve("what causes the aurora", k=1, session_id="s", timestamp=t0)
    for session in ("s", "fresh"):  # a session with nothing to judge checks its arguments all the same
        with pytest.raises(FutureTimestampError):
            ens.observe(session, "what causes the aurora borealis", timestamp=(t0 + 60) * 1000)
    assert ens.store.counts()["feedback"] == 0


def test_the_follow_up_window_is_set_on_the_ensemble_and_read_by_its_langchain_retriever(tmp_path):
    # the README offered ImplicitSignals(followup_window=...) but only the LangChain handler took one: observe
    # and the retriever kept 30 minutes, but through a private attribute
    import time

    from rlfb import FeedbackEnsemble

    ens = FeedbackEnsemble.from_texts(["The aurora is caused by charged particles from the sun.",
                                       "Tides follow the pull of the moon."], retrievers=("bm25",),
                                      store=str(tmp_path / "f.db"), policy="thompson")
    assert ens.implicit.followup_window == 1800.0
    with pytest.raises(ValidationError, match="ImplicitSignals"):
        ens.implicit = {"followup_window": 60}  # type: ignore[assignment]
    ens.implicit = ImplicitSignals(followup_window=60.0)
    t0 = time.time() - 600
    ens.retrieve("what causes the aurora", k=1, session_id="s", timestamp=t0)
    assert ens.observe("s", "what causes the aurora borealis", timestamp=t0 + 120) == []  # past 60 s
    pytest.importorskip("langchain_core")
    from langchain_core.runnables import RunnableConfig

    from langchain_rlfb import FeedbackEnsembleRetriever

    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=1)
    config: RunnableConfig = {"metadata": {"session_id": "lc"}}
    first = retriever.invoke("what causes the aurora", config=config)[0].metadata["event_id"]
    ens.implicit = ImplicitSignals(followup_window=1e-6)  # no follow-up comes within a microsecond
    retriever.invoke("what causes the aurora borealis", config=config)
    assert ens.store.feedback(first) == []


def test_observe_without_a_time_judges_by_the_stores_clock_and_a_time_ahead_of_it_is_refused(tmp_path):
    import time

    from rlfb import FeedbackEnsemble
    from rlfb.errors import FutureTimestampError
    from rlfb.runs import observe_followup
    from rlfb.store import FeedbackStore

    then = time.time() - 10 * 86_400
    store = FeedbackStore(str(tmp_path / "f.db"), clock=lambda: then)  # a store whose clock is ten days back
    ens = FeedbackEnsemble.from_texts(["The aurora is caused by charged particles from the sun.",
                                       "Tides follow the pull of the moon."], retrievers=("bm25",),
                                      store=store, policy="thompson")
    ens.retrieve("what causes the aurora", k=1, session_id="s")
    # judged by the store's clock (a minute later by it), not this machine's, which is ten days on
    assert [x.signal for x in ens.observe("s", "what causes the aurora borealis")] == ["reformulation"]
    with pytest.raises(FutureTimestampError):  # an hour past the store's clock: beyond its 300 s of skew
        ens.observe("s", "what causes the aurora lights", timestamp=then + 3600)

    class OwnStore:  # a store of the user's own, whose last_event takes no time
        def __init__(self, inner):
            self.inner = inner

        def last_event(self, session_id):
            return self.inner.last_event(session_id)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    ens.retrieve("why do tides rise", k=1, session_id="own")
    records = observe_followup(OwnStore(store), "own", "why do the tides rise", ensemble=ens, timestamp=then + 60)
    assert [r.signal for r in records] == ["reformulation"]


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_japanese_particles_do_not_count_as_content_words_of_a_restatement() -> None:
    """Bug guarded: hiragana runs (particles, endings) counted as content words and diluted the overlap."""
    assert ImplicitSignals().overlap("オーロラはなぜ光る", "オーロラが光る理由") == 1.0
