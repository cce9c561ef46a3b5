"""The ensemble on odd input: what a hit says proposed it, empty members, huge weights, load overrides,
metadata JSON cannot hold, and corpus updates while other threads re-rank."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from rlfb import FeedbackEnsemble, InvalidWeightsError, ValidationError
from rlfb.errors import RlfbError
from rlfb.fusion import minmax_normalize, validate_weights
from rlfb.members import SearchMember
from rlfb.retrievers.bm25 import BM25Retriever
from rlfb.types import Chunk, make_chunks

TEXTS = ["the aurora is caused by solar wind", "tides follow the moon", "volcanoes erupt magma",
         "aurora borealis lights", "aurora seen in norway", "aurora over iceland"]


def _ens(**kw: Any) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, ids=[str(i) for i in range(len(TEXTS))], retrievers=("bm25",), **kw)


# -- proposed_by: the retrievers whose own top list held the chunk ------------------------------------------
def test_a_chunk_only_a_member_found_is_proposed_by_that_member_alone() -> None:
    kb = SearchMember("kb", lambda q, k: [(Chunk("outside", "aurora aurora aurora"), 3.0)])
    hits = _ens(members=[kb]).retrieve("aurora", k=3, explore=False, log=False).hits
    by_id = {h.chunk_id: h.proposed_by for h in hits}
    assert by_id["outside"] == ("kb",)  # bm25 only scored its text
    assert all(p == ("bm25",) for cid, p in by_id.items() if cid != "outside")


def test_every_hit_of_a_pool_deeper_than_candidate_k_was_proposed() -> None:
    # k > candidate_k: the pool is bm25's top k, so every hit came from its own list
    hits = _ens(candidate_k=2).retrieve("aurora", k=4, explore=False, log=False).hits
    assert len(hits) == 4 and all(h.proposed_by == ("bm25",) for h in hits)


def test_reranked_chunks_were_proposed_by_no_retriever() -> None:
    chunks = [Chunk("ext1", "aurora in a brochure"), Chunk("ext2", "nothing here"), Chunk("0", TEXTS[0])]
    hits = _ens().rerank("aurora", chunks, explore=False, log=False).hits
    assert [h.proposed_by for h in hits] == [(), (), ()]


def test_a_reranked_chunk_edited_since_it_was_indexed_is_scored_and_returned_by_its_new_text() -> None:
    # it was scored by the text indexed under its id, and its hit carried that old text and metadata, while the
    # caller passed the new one on to the LLM
    ens = _ens()
    edited = Chunk("0", "glaciers carve valleys", {"v": 2})
    hits = {h.chunk_id: h for h in ens.rerank("aurora solar wind", [edited, Chunk("3", TEXTS[3])],
                                              explore=False, log=False).hits}
    assert hits["0"].text == "glaciers carve valleys" and hits["0"].metadata == {"v": 2}
    assert hits["0"].scores == {"bm25": 0.0}  # as the same text outside the index scores
    assert [h.chunk_id for h in ens.rerank("aurora solar wind", [edited, Chunk("3", TEXTS[3])],
                                           explore=False, log=False).hits] == ["3", "0"]
    fresh = ens.rerank("aurora", [Chunk("elsewhere", "aurora over tromso")], explore=False, log=False).hits[0]
    moved = ens.rerank("aurora", [Chunk("5", "aurora over tromso")], explore=False, log=False).hits[0]
    assert moved.scores == fresh.scores and moved.text == "aurora over tromso"
    unchanged = ens.rerank("aurora", [Chunk("5", TEXTS[5], {"x": 1})], explore=False, log=False).hits[0]
    assert unchanged.text == TEXTS[5] and unchanged.metadata == {}  # the same text: the indexed chunk, by id
    assert ens.chunk("0").text == TEXTS[0]  # the index is not changed (add_chunks does that)


def test_rerank_context_then_rank_context_is_rerank_in_two_steps() -> None:
    # an adapter whose async call was cancelled during the scoring drops the re-ranking between the two steps
    chunks = [Chunk("ext1", "aurora in a brochure"), Chunk("0", TEXTS[0]), Chunk("ext1", "a repeat, not ranked")]
    ens = _ens(store=":memory:")
    whole = ens.rerank("aurora", chunks, 2, explore=False, log=False)
    ctx = ens.rerank_context("aurora", chunks)
    assert ctx.candidate_ids == ("ext1", "0") and ens.store.counts()["events"] == 0  # scored, nothing logged
    steps = ens.rank_context(ctx, 2, explore=False)
    assert [(h.chunk_id, h.text, h.score) for h in steps.hits] == [(h.chunk_id, h.text, h.score) for h in whole.hits]
    assert ens.store.counts()["events"] == 1
    with pytest.raises(ValidationError, match="at least one chunk"):
        ens.rerank_context("aurora", [])
    assert ens.rerank("aurora", []).hits == []  # rerank itself still takes an empty list
    with pytest.raises(ValidationError, match="k must be"):  # but not a k it would refuse with chunks
        ens.rerank("aurora", [], k=-1)


def test_retriever_options_that_name_no_retriever_built_by_name_are_refused() -> None:
    # they were ignored: a typo, or options for a retriever handed over as an instance, changed nothing
    from rlfb.retrievers import make_retriever

    with pytest.raises(ValidationError, match=r"retriever_options names \['bm52'\]"):
        FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), retriever_options={"bm52": {"k1": 1.2}})
    with pytest.raises(ValidationError, match=r"names \['bm25'\].*given as an instance"):
        FeedbackEnsemble.from_texts(TEXTS, retrievers=(make_retriever("bm25"),), retriever_options={"bm25": {}})
    with pytest.raises(ValidationError, match=r"retriever_options\['bm25'\] must be a mapping"):
        FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), retriever_options={"bm25": 1.2})
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), retriever_options={"bm25": {"k1": 0.9}})
    assert cast(BM25Retriever, ens.retrievers["bm25"]).k1 == 0.9


# -- empty and malformed member results ---------------------------------------------------------------------
@pytest.mark.parametrize("fusion", ["minmax", "zscore", "rrf"])
def test_a_member_only_ensemble_whose_member_finds_nothing_returns_nothing(fusion: str) -> None:
    ens = FeedbackEnsemble({}, members=[SearchMember("kb", lambda q, k: [])], fusion=fusion)
    assert ens.retrieve("anything", k=3, log=False).hits == []


def test_a_member_only_ensemble_saves_and_loads_with_what_it_learned(tmp_path: Path) -> None:
    # it indexes no chunks and saved none; the load took the empty chunks.jsonl for a damaged save
    a1, a2 = Chunk("a1", "aurora"), Chunk("a2", "tides")
    members = [SearchMember("kb", lambda q, k: [(a1, 0.9), (a2, 0.8)][:k]),
               SearchMember("web", lambda q, k: [(a2, 0.9), (a1, 0.8)][:k])]  # equal weights tie them
    ens = FeedbackEnsemble({}, members=members, policy="thompson", store=":memory:")
    r = ens.retrieve("aurora", k=2)
    ens.feedback(r.event_id, "click", chunk_id="a2")
    ens.save(tmp_path / "saved")
    again = FeedbackEnsemble.load(tmp_path / "saved", members=members)
    assert len(again) == 0 and again.retriever_names == ("kb", "web")
    assert again.learner.state_dict() == ens.learner.state_dict()
    shared = FeedbackEnsemble.load(tmp_path / "saved", members=members, store=ens.store)  # from the store's snapshot
    assert shared.learner.n_learned == ens.learner.n_learned == 1
    assert [h.chunk_id for h in shared.retrieve("aurora", k=2, log=False, explore=False).hits] == \
        [h.chunk_id for h in ens.retrieve("aurora", k=2, log=False, explore=False).hits] == ["a2", "a1"]


def test_an_emptied_chunks_file_of_a_corpus_save_is_still_damage(tmp_path: Path) -> None:
    from rlfb.errors import CorruptStateError

    _ens().save(tmp_path / "saved")
    (tmp_path / "saved" / "chunks.jsonl").write_text("")
    (tmp_path / "saved" / "checksums.json").unlink()  # the content checks alone
    with pytest.raises(CorruptStateError):
        FeedbackEnsemble.load(tmp_path / "saved")


def test_minmax_of_no_candidates_is_empty() -> None:
    assert minmax_normalize(np.zeros((0, 3))).shape == (0, 3)


@pytest.mark.parametrize("returned", [None, 3, "a string"])
def test_a_member_returning_no_sequence_is_a_validation_error(returned: Any) -> None:
    ens = _ens(members=[SearchMember("kb", lambda q, k: returned)])
    with pytest.raises(ValidationError, match="member 'kb' returned"):
        ens.retrieve("aurora", k=2, log=False)


@pytest.mark.parametrize("missing", [None, float("nan"), float("inf")])
def test_a_member_leaving_one_result_without_a_score_is_fused_by_rank(missing: Any) -> None:
    # a rank score (1/61) next to raw scores (0.8, 0.7) was fused as the member's worst, its first hit last
    found = [(Chunk("x1", "x"), missing), (Chunk("x2", "y"), 0.8), (Chunk("x3", "z"), 0.7)]
    assert [round(s, 5) for _, s in SearchMember("kb", lambda q, k: found).search("q", 3)] == \
        [round(1 / 61, 5), round(1 / 62, 5), round(1 / 63, 5)]
    ens = FeedbackEnsemble({}, members=[SearchMember("kb", lambda q, k: found)])
    assert [h.chunk_id for h in ens.retrieve("q", k=3, log=False).hits] == ["x1", "x2", "x3"]


@pytest.mark.parametrize("fusion", ["minmax", "zscore", "rrf"])
def test_fused_scores_do_not_depend_on_the_order_the_corpus_was_indexed_in(fusion: str) -> None:
    # no chunk holds a query term, so BM25 scores every candidate 0: RRF used to rank those zeros by row
    texts = ["tides follow the pull of the moon", "volcanoes erupt molten rock", "glaciers carve valleys",
             "bread rises because yeast makes gas"]
    rankings, scores = [], []
    for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
        members = [SearchMember("kb", lambda q, k: [(Chunk("t0", texts[0]), 0.9), (Chunk("t2", texts[2]), 0.4),
                                                     (Chunk("t1", texts[1]), 0.2)])]
        ens = FeedbackEnsemble.from_texts([texts[i] for i in order], ids=[f"t{i}" for i in order],
                                          retrievers=("bm25",), members=members, fusion=fusion)
        hits = ens.retrieve("lunar attraction", k=4, explore=False, log=False).hits
        rankings.append([h.chunk_id for h in hits])
        scores.append({h.chunk_id: h.score for h in hits})
    # the same fused score for each chunk (equal scores are then listed in index order, as anywhere)
    assert scores[0] == pytest.approx(scores[1])
    assert rankings[0][:2] == rankings[1][:2] == ["t0", "t2"]


# -- weights at the edge of float -------------------------------------------------------------------------
def test_huge_weights_normalise_without_overflow() -> None:
    assert validate_weights([1e308, 1e308]).tolist() == [0.5, 0.5]  # the sum would be inf, each share 0
    with pytest.raises(InvalidWeightsError):
        validate_weights([10**400, 1])  # an int beyond float range
    with pytest.raises(InvalidWeightsError):
        _ens(weights=[10**400])


def test_two_huge_policy_weights_stay_equal() -> None:
    from rlfb.policies.simplex import weights_vector

    assert weights_vector([1e308, 1e308], ("a", "b")).tolist() == [0.5, 0.5]
    with pytest.raises(InvalidWeightsError):
        weights_vector([10**400, 1], ("a", "b"))


# -- save and load ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override", [{"weights": [1.0]}, {"policy": "fixed"}, {"learner_config": None}])
def test_load_refuses_settings_the_saved_learner_would_overwrite(tmp_path: Path, override: dict) -> None:
    _ens(policy="thompson").save(tmp_path / "idx")
    with pytest.raises(ValidationError, match="brings back the saved learner"):
        FeedbackEnsemble.load(tmp_path / "idx", **override)
    assert FeedbackEnsemble.load(tmp_path / "idx", candidate_k=3).candidate_k == 3  # ensemble settings still can


def test_a_misspelt_load_option_lists_only_what_load_takes(tmp_path: Path) -> None:
    # the list named policy, weights and learner_config, which load refuses
    _ens(policy="thompson").save(tmp_path / "idx")
    with pytest.raises(ValidationError, match=r"load takes no option 'fusio' \(did you mean 'fusion'\?\)") as info:
        FeedbackEnsemble.load(tmp_path / "idx", fusio="rrf")
    assert not {"policy", "weights", "learner_config"} & set(str(info.value).split("'"))


def _cyclic() -> dict:
    meta: dict = {"a": 1}
    meta["self"] = meta
    return meta


@pytest.mark.parametrize(("meta", "message"), [({1: "a", "1": "b"}, "metadata key 1 is not a string"),
                                               ({"nested": [{2: "x"}]}, "metadata key 2 is not a string"),
                                               (None, "holds itself")])
def test_save_refuses_metadata_json_would_change(tmp_path: Path, meta: Any, message: str) -> None:
    good = _ens()
    good.save(tmp_path / "idx")
    bad = FeedbackEnsemble.from_chunks([Chunk("c", "aurora", _cyclic() if meta is None else meta)],
                                       retrievers=("bm25",))
    with pytest.raises(ValidationError, match=message):
        bad.save(tmp_path / "idx")
    assert len(FeedbackEnsemble.load(tmp_path / "idx")) == len(TEXTS)  # the earlier save is intact
    assert json.loads((tmp_path / "idx" / "ensemble.json").read_text())["retrievers"] == ["bm25"]


# -- corpus updates -----------------------------------------------------------------------------------------
def test_add_texts_of_nothing_or_a_generator() -> None:
    ens = _ens()
    assert ens.add_texts([]) == []
    # read once, ids included
    ids = ens.add_texts(t for t in ["glaciers carve valleys", "comets have tails"])
    assert len(ids) == 2 and len(ens) == len(TEXTS) + 2
    # ids are the texts' hashes, as from_texts gives them: a text added again is the same chunk, and a corpus
    # built again from its texts finds what was learned under those ids (random ids orphaned it)
    assert ens.add_texts(["comets have tails"]) == ids[1:] and len(ens) == len(TEXTS) + 2
    assert ids == [c.id for c in make_chunks(["glaciers carve valleys", "comets have tails"])]


def test_bm25_scores_stay_float_after_a_delete() -> None:
    bm25 = BM25Retriever().index(make_chunks(["the aurora glows", "tides follow the moon"], ids=["a", "t"]))
    table = bm25._table
    assert table is not None
    updated = bm25.updated(table.changed(deletes=["a"]))  # 'aurora' is now a term no chunk holds
    assert updated.score_all("aurora").dtype == np.float64
    assert updated.score_all_batch(["aurora"]).dtype == np.float64


def test_updates_while_other_threads_rerank_chunks_outside_the_index() -> None:
    # rerank remembers chunks outside the index while an update prunes the same record of them
    ens = _ens()
    for i in range(50_000):  # a long record, so that an update spends a while going through it
        ens._keep_extra(Chunk(f"seen-{i}", "aurora elsewhere"))
    stop = threading.Event()
    errors: list[BaseException] = []

    def rerank() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                ens.rerank("aurora", [Chunk(f"out-{threading.get_ident()}-{i}", "aurora outside")], log=False)
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    readers = [threading.Thread(target=rerank) for _ in range(3)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often, as on a busy many-core server
    for t in readers:
        t.start()
    try:
        for i in range(300):
            ens.add_texts([f"new chunk {i} about aurora"], ids=[f"n{i}"])
    finally:
        stop.set()
        for t in readers:
            t.join()
        sys.setswitchinterval(switch)
    assert errors == [] and len(ens) == len(TEXTS) + 300


def test_a_hit_takes_its_text_from_the_index_it_was_scored_on() -> None:
    # a corpus update between scoring and ranking replaced the chunk: text and score must still agree
    ens = FeedbackEnsemble.from_texts(["the aurora is caused by solar wind", "tides follow the moon"],
                                      ids=["0", "1"], retrievers=("bm25",))
    ctx = ens.context("aurora")
    ens.add_texts(["volcanoes erupt magma"], ids=["0"])
    hit = ens.rank_context(ctx, 1, explore=False, log=False).hits[0]
    score = hit.scores["bm25"]
    assert hit.chunk_id == "0" and score is not None and score > 0
    assert hit.text == "the aurora is caused by solar wind"
    fresh = ens.retrieve("volcanoes", k=1, explore=False, log=False).hits[0]  # new searches: the new text
    assert (fresh.chunk_id, fresh.text) == ("0", "volcanoes erupt magma")


def test_add_texts_of_no_texts_but_some_ids_is_an_error() -> None:
    from rlfb.errors import EmptyCorpusError

    with pytest.raises(EmptyCorpusError):
        _ens().add_texts([], ids=["x"])


def test_a_hits_nested_metadata_is_its_own() -> None:
    # appending to hit.metadata["authors"] changed the indexed chunk, so every later result, and the
    # caller's own mapping given at indexing
    given = [{"authors": ["ann"]}, {"authors": ["bob"]}]
    ens = FeedbackEnsemble.from_texts(["solar wind aurora", "sourdough bread"], metadatas=given, retrievers=("bm25",))
    hit = ens.retrieve("aurora", k=1, log=False).hits[0]
    hit.metadata["authors"].append("INJECTED")
    given[0]["authors"].append("LATER")
    assert ens.retrieve("aurora", k=1, log=False).hits[0].metadata["authors"] == ["ann"]
    assert ens.chunk(hit.chunk_id).metadata["authors"] == ["ann"]


@pytest.mark.parametrize("bad", [{"timestamp": 4e9}, {"event_id": "taken"}, {"metadata": {"when": object()}}])
def test_a_retrieval_refused_when_logged_leaves_the_learner_as_it_was(bad: dict) -> None:
    # it was ranked before the store refused it: the policy's random state, the exploration's and the memory's
    # count of asks had moved for a retrieval that never happened
    ens = FeedbackEnsemble.from_texts(["solar wind aurora", "sourdough bread", "moon tides"], retrievers=("bm25",),
                                      store=":memory:", policy="thompson", seed=0)
    ens.retrieve("aurora", k=2, event_id="taken")
    before = ens.learner.state_dict()
    with pytest.raises(RlfbError):
        ens.retrieve("aurora", k=2, **bad)
    assert ens.learner.state_dict() == before


def test_repr_reads_nothing_from_the_store(tmp_path) -> None:
    # it went through the weights property, which refreshes from the store: a repr in a debugger or a log line
    # could wait on a busy file, or fail on a closed one
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(tmp_path / "fb.db"), policy="thompson",
                                      refresh_interval=0.0)
    ens.store.close()
    assert repr(ens).startswith(f"FeedbackEnsemble({len(TEXTS)} chunks, fusion='minmax', weights: bm25=1.000")


@pytest.mark.parametrize(("option", "hint"), [("polciy", "did you mean 'policy'"), ("explor", "its options are")])
def test_a_misspelt_option_is_refused_before_anything_is_indexed(monkeypatch, option: str, hint: str) -> None:
    # it was a TypeError from __init__, raised after every chunk had been indexed (with dense: encoded)
    indexed: list[int] = []
    monkeypatch.setattr(BM25Retriever, "index", lambda self, *a, **k: indexed.append(1))
    with pytest.raises(ValidationError, match=f"takes no option '{option}'.*{hint}"):
        options: dict[str, Any] = {option: "thompson"}
        FeedbackEnsemble.from_texts(["tides follow the moon"], retrievers=("bm25",), **options)
    assert indexed == []


def test_an_ensemble_is_not_copied_or_pickled_but_refused_by_name(tmp_path: Path) -> None:
    # deepcopy and pickle failed with a bare TypeError on a lock (or a tokenizer); a shallow copy went through
    # and shared half of the learner's bookkeeping with the original
    import copy
    import pickle

    from rlfb import NotCopyableError

    ens = FeedbackEnsemble.from_texts(["tides follow the moon"], retrievers=("bm25",), store=str(tmp_path / "f.db"))
    for copier in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(NotCopyableError, match="save"):
            copier(ens)
    with pytest.raises(TypeError):  # what code catching a failed copy expects
        copy.deepcopy({"learner": ens})


def test_retrieve_batch_checks_every_query_before_it_logs_any(tmp_path: Path) -> None:
    # the first query was retrieved and logged, then the second raised
    ens = FeedbackEnsemble.from_texts(["tides follow the moon"], retrievers=("bm25",), store=str(tmp_path / "f.db"))
    with pytest.raises(ValidationError, match=r"queries\[1\]: query must be a string"):
        ens.retrieve_batch(["tides", 1])  # type: ignore[list-item]
    assert ens.store.counts()["events"] == 0
    assert len(ens.retrieve_batch(["tides", "moon"], k=1)) == 2


def test_a_subclass_takes_its_own_options_through_from_texts() -> None:
    # the check read FeedbackEnsemble's own constructor: a subclass's option was refused
    class Tagged(FeedbackEnsemble):
        def __init__(self, *args: Any, tag: str = "", **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.tag = tag

    class Strict(FeedbackEnsemble):
        def __init__(self, retrievers: Any, chunks: Any = None, *, tag: str = "") -> None:
            super().__init__(retrievers, chunks)
            self.tag = tag

    assert Tagged.from_texts(["tides"], retrievers=("bm25",), tag="x", seed=3).tag == "x"
    assert Strict.from_texts(["tides"], retrievers=("bm25",), tag="y").tag == "y"
    with pytest.raises(ValidationError, match="takes no option 'seed'"):
        Strict.from_texts(["tides"], retrievers=("bm25",), seed=3)


class _OddScores(BM25Retriever):
    """A custom corpus retriever whose scores hold a NaN or an inf."""

    def __init__(self, odd: float) -> None:
        super().__init__()
        self.odd = odd

    def score_all(self, query):
        out = np.array(super().score_all(query), dtype=float)
        out[0] = self.odd
        return out


@pytest.mark.parametrize("fusion", ["minmax", "zscore", "rrf"])
@pytest.mark.parametrize("odd", [float("nan"), float("inf"), float("-inf")])
def test_a_custom_retrievers_non_finite_score_is_one_named_error_under_every_fusion(fusion: str, odd: float) -> None:
    # min-max refused an inf and took a NaN for missing; RRF ranked an inf first and showed its score as None
    ens = FeedbackEnsemble.from_texts(["tides follow the moon", "lava and ash", "the moon and stars"],
                                      retrievers=(_OddScores(odd),), fusion=fusion)
    with pytest.raises(ValidationError, match="scored 'moon' .*must be finite"):
        ens.retrieve("moon", k=2, log=False)


@pytest.mark.parametrize("texts", [["", "  "], ["\n", "\t"]])
def test_a_corpus_of_blank_texts_is_refused(texts: list[str]) -> None:
    # every chunk scored 0 and ranked in corpus order, with no error
    from rlfb.errors import EmptyCorpusError

    with pytest.raises(EmptyCorpusError, match="all 2 chunk texts are empty or blank"):
        FeedbackEnsemble.from_texts(texts, retrievers=("bm25",))
    assert FeedbackEnsemble.from_texts(["", "the moon"], retrievers=("bm25",)).retrieve("moon", k=1, log=False) \
        .hits[0].text == "the moon"  # one blank chunk among others stays indexable


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_a_member_listing_a_chunk_twice_keeps_it_once_at_its_best_position() -> None:
    """Bug guarded: a chunk a member listed twice came back twice."""
    a, b = Chunk("a", "alpha"), Chunk("b", "beta")
    m = SearchMember("kb", lambda q, k: [(a, 0.9), (b, 0.5), (a, 0.1)])
    assert [(c.id, s) for c, s in m.search("q", 3)] == [("a", 0.9), ("b", 0.5)]


def test_a_member_whose_search_is_not_callable_is_refused_when_made() -> None:
    """Bug guarded: a member made with a search that is no function failed only at its first retrieval."""
    with pytest.raises(ValidationError, match="callable"):
        SearchMember("kb", [(Chunk("a", "alpha"), 1.0)])  # type: ignore[arg-type]


def _bm25_ensemble(**kw: Any) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS[:3], ids=["a", "b", "c"], retrievers=("bm25",), **kw)


def test_rerank_keeps_the_first_chunk_given_under_a_repeated_id() -> None:
    """Bug guarded: of two chunks given under one id, the last one given was scored and returned."""
    chunks = [Chunk("x", "aurora and solar wind"), Chunk("x", "nothing alike")]
    hits = _bm25_ensemble().rerank("aurora", chunks, explore=False, log=False).hits
    assert [(h.chunk_id, h.text) for h in hits] == [("x", "aurora and solar wind")]
