"""Simulated users and the experiment runner (on the generated demo collection, BM25 + dense)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from rlfb.cli import main
from rlfb.demo_corpus import generate_demo_corpus
from rlfb.errors import ValidationError
from rlfb.simulation.runner import SimulationConfig, plot_curves, prepare, run_seed, simplex_grid, simulate
from rlfb.simulation.users import CLICK_MODELS, SimulatedUser, to_grade


def test_click_models_have_the_standard_parameters() -> None:
    assert CLICK_MODELS["navigational"].click == (0.05, 0.3, 0.5, 0.7, 0.95)
    assert CLICK_MODELS["navigational"].stop == (0.2, 0.3, 0.5, 0.7, 0.9)
    assert CLICK_MODELS["informational"].click == (0.4, 0.6, 0.7, 0.8, 0.9)
    assert CLICK_MODELS["perfect"].stop == (0.0,) * 5


def test_cascade_click_rates_match_the_model() -> None:
    user = SimulatedUser("navigational", explicit_rate=0.0, reformulation_rate=0.0, seed=3)
    n = 4000
    first = sum("r" in user.clicks(["r", "n"], {"r": 1}) for _ in range(n)) / n
    assert first == pytest.approx(0.95, abs=0.02)
    # after clicking a grade-4 chunk the user stops with p=0.9, so the next one is rarely reached
    both = sum(user.clicks(["r", "r2"], {"r": 1, "r2": 1}) == ["r", "r2"] for _ in range(n)) / n
    assert both == pytest.approx(0.95 * 0.1 * 0.95, abs=0.015)
    noise = sum(bool(user.clicks(["n"], {})) for _ in range(n)) / n
    assert noise == pytest.approx(0.05, abs=0.015)


def test_explicit_thumbs_reformulations_noise_and_delays() -> None:
    user = SimulatedUser("perfect", explicit_rate=1.0, reformulation_rate=1.0, mean_delay=100, late_rate=0.0, seed=0)
    good = user.interact(["r", "x"], {"r": 1})
    assert good.explicit == "explicit_positive" and not good.reformulated
    bad = user.interact(["x", "y", "z", "r"], {"r": 1})
    assert bad.explicit == "explicit_negative" and bad.reformulated
    assert {f.signal for f in bad.feedback} >= {"explicit_negative", "implicit_negative"}
    flipped = SimulatedUser("perfect", explicit_rate=1.0, noise=1.0, seed=0).interact(["r"], {"r": 1})
    assert flipped.explicit == "explicit_negative"
    delays = [f.delay for _ in range(2000) for f in user.interact(["r"], {"r": 1}).feedback]
    assert np.mean(delays) == pytest.approx(100, rel=0.1)
    late = SimulatedUser("perfect", explicit_rate=0.0, late_rate=1.0, late_delay=500.0, seed=0)
    assert {f.delay for f in late.interact(["r"], {"r": 1}).feedback} == {500.0}


def test_grades_and_validation() -> None:
    assert [to_grade(g, 4) for g in (0, 1, 2, 3, 4)] == [0, 1, 2, 3, 4]
    assert to_grade(1, 1) == 4
    with pytest.raises(ValidationError):
        SimulatedUser("clairvoyant")
    with pytest.raises(ValidationError):
        SimulatedUser(explicit_rate=1.5)
    with pytest.raises(ValidationError):
        SimulationConfig(user="nobody")


def test_the_config_takes_policies_and_retrievers_by_name_and_keeps_plain_json() -> None:
    # a policy object was one learner carried from seed to seed (seed 1 scored otherwise after seed 0 than
    # alone), and neither it nor a retriever object could be written to the JSON output
    from rlfb.policies import make_policy
    from rlfb.retrievers.bm25 import BM25Retriever

    with pytest.raises(ValidationError, match="policy's name"):
        SimulationConfig(policy=make_policy("thompson", ["bm25"]), retrievers=("bm25",))  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="retriever names"):
        SimulationConfig(retrievers=(BM25Retriever(),))  # type: ignore[arg-type]
    config = SimulationConfig(interactions=np.int64(20), checkpoints=np.int32(2),  # type: ignore[arg-type]
                              retrievers=("bm25",))
    assert json.loads(json.dumps(config.to_dict()))["interactions"] == 20


def test_grades_on_scales_that_do_not_divide_four_keep_their_spacing() -> None:
    # rounding mapped a 0-3 scale to grades 1, 3, 4 and a 0-5 one to 1, 2, 2, 3, 4
    assert [to_grade(v, 3) for v in (0, 1, 2, 3)] == [0.0, 1.0, 2.5, 4.0]
    assert len({to_grade(v, 5) for v in range(1, 6)}) == 5
    assert to_grade(1, 10) == 1.0  # judged relevant is at least grade 1
    nav = CLICK_MODELS["navigational"]
    assert [nav.p_click(g) for g in range(5)] == list(nav.click)  # integer grades read their own entry
    assert nav.p_click(8 / 3) == pytest.approx(0.5 + (2 / 3) * 0.2)
    assert nav.p_stop(4 / 3) == pytest.approx(0.3 + (1 / 3) * 0.2)
    # a grade-2-of-3 chunk is clicked between grade 1's and grade 3's rates
    user = SimulatedUser("navigational", explicit_rate=0.0, reformulation_rate=0.0, max_grade=3, seed=4)
    rates = [np.mean([bool(user.clicks(["r"], {"r": v})) for _ in range(4000)]) for v in (1, 2, 3)]
    assert rates[0] + 0.1 < rates[1] < rates[2] - 0.05
    assert rates[1] == pytest.approx(nav.p_click(2.5), abs=0.03)


def test_a_fine_scale_keeps_every_grade_apart_and_the_standard_scales_map_as_before() -> None:
    # a max(1, ...) clamp mapped grades 1 and 2 of a 0-10 scale both to 1.0
    ten = [to_grade(v, 10) for v in range(11)]
    assert ten[0] == 0.0 and ten[1] == 1.0 and ten[10] == 4.0
    assert np.allclose(np.diff(ten[1:]), 1 / 3)  # evenly spaced, none merged
    # 0-4 (cranfield) onto itself and binary to 0 and 4, exactly: the published figures rest on them
    assert [to_grade(v, 4) for v in range(5)] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert (to_grade(0, 1), to_grade(1, 1)) == (0.0, 4.0)
    assert to_grade(12, 10) == 4.0 and to_grade(-1, 10) == 0.0


def test_the_user_reads_down_to_the_last_position_of_its_depth() -> None:
    # the cascade stopped one position short: a relevant chunk shown last in the top `depth` was never clicked
    user = SimulatedUser("perfect", explicit_rate=0.0, reformulation_rate=0.0, depth=3, seed=0)
    assert user.clicks(["x", "y", "r"], {"r": 1}) == ["r"]  # a perfect user clicks grade 4 with p = 1
    assert user.clicks(["x", "y", "z", "r"], {"r": 1}) == []  # one past the depth is not read


def test_a_chunk_passed_over_never_ends_the_scan() -> None:
    # cascade: the stop probability is drawn after a click only; drawn after a chunk passed over too, the relevant
    # chunk below an irrelevant one was clicked 77 % of the time instead of 94 %
    user = SimulatedUser("navigational", explicit_rate=0.0, reformulation_rate=0.0, seed=3)
    nav = CLICK_MODELS["navigational"]
    rate = np.mean(["r" in user.clicks(["n", "r"], {"r": 1}) for _ in range(4000)])
    # reached unless a noise click on "n" (p 0.05) was followed by a stop (p 0.2); then clicked with p 0.95
    assert rate == pytest.approx((1 - nav.click[0] * nav.stop[0]) * nav.click[4], abs=0.02)


def test_the_answer_is_judged_on_its_top_answer_k_chunks_the_last_included() -> None:
    # a relevant chunk at rank answer_k is in the answer: a thumb up, and no restated question
    user = SimulatedUser("perfect", explicit_rate=1.0, reformulation_rate=1.0, answer_k=3, seed=0)
    shown = user.interact(["a", "b", "r", "d"], {"r": 1})
    assert shown.explicit == "explicit_positive" and not shown.reformulated
    below = user.interact(["a", "b", "d", "r"], {"r": 1})
    assert below.explicit == "explicit_negative" and below.reformulated


@pytest.mark.parametrize(("setting", "value"), [("late_delay", -1.0), ("late_delay", float("nan")),
                                                ("mean_delay", "1"), ("answer_k", 0), ("depth", -1),
                                                ("max_grade", 0), ("max_grade", 2.5), ("answer_k", True)])
def test_simulated_user_refuses_bad_settings(setting: str, value: object) -> None:
    # a negative late delay had feedback arrive before the retrieval it rates
    with pytest.raises(ValidationError, match=setting):
        SimulatedUser(**{setting: value})  # type: ignore[arg-type]


def test_the_thumb_and_the_reformulation_judge_the_same_answer() -> None:
    # the reformulation once looked at the top 3 whatever --answer-k was: a relevant chunk at rank 4 of a
    # five-chunk answer got a thumbs up and a restated question from the same user
    user = SimulatedUser("navigational", explicit_rate=1.0, reformulation_rate=1.0, answer_k=5, seed=0)
    for _ in range(50):
        inter = user.interact(["a", "b", "c", "d", "e", "f"], {"d": 1})
        assert inter.explicit == "explicit_positive" and not inter.reformulated
    short = SimulatedUser("navigational", explicit_rate=1.0, reformulation_rate=1.0, answer_k=2, seed=0)
    inter = short.interact(["a", "b", "c"], {"c": 1})
    assert inter.explicit == "explicit_negative" and inter.reformulated


def test_max_heldout_is_a_seeded_sample_not_the_first_ids() -> None:
    from types import SimpleNamespace

    from rlfb.simulation.runner import _split

    ids = [f"q{i:03d}" for i in range(200)]
    prep: Any = SimpleNamespace(stream_qrels=None, qrels={q: {"d": 1} for q in ids}, contexts=dict.fromkeys(ids),
                                dataset=SimpleNamespace(queries={q: f"question {q}?" for q in ids}))
    config = SimulationConfig(max_heldout=20)
    stream, heldout, _ = _split(prep, config, seed=0)
    _, all_heldout, _ = _split(prep, SimulationConfig(), seed=0)
    assert len(heldout) == 20 and set(heldout) <= set(all_heldout) and not set(heldout) & set(stream)
    assert heldout != all_heldout[:20]  # the first ids in order can follow topic or date
    assert heldout == sorted(heldout) and _split(prep, config, seed=0)[1] == heldout
    assert _split(prep, config, seed=1)[1] != heldout
    assert _split(prep, SimulationConfig(max_heldout=500), seed=0)[1] == all_heldout


def test_a_question_judged_in_both_splits_is_scored_with_the_held_out_splits_grades() -> None:
    # the stream split's judgments overwrote the test split's: a held-out question was scored against the
    # train qrels, not the ones the held-out figure claims to use
    from types import SimpleNamespace

    from rlfb.simulation.runner import _split

    texts = {"both": "what pulls the tides", "s1": "why do volcanoes erupt"}
    prep: Any = SimpleNamespace(stream_qrels={"both": {"d1": 1}, "s1": {"d3": 1}}, qrels={"both": {"d2": 2}},
                                contexts=dict.fromkeys(texts), dataset=SimpleNamespace(queries=texts))
    stream, heldout, judgments = _split(prep, SimulationConfig(), seed=0)
    assert heldout == ["both"] and stream == ["s1"]
    assert judgments["both"] == {"d2": 2} and judgments["s1"] == {"d3": 1}


def test_without_a_stream_split_each_seed_draws_its_own_halves() -> None:
    # the halves were shuffled with one fixed seed: every seed streamed and held out the very same questions,
    # so the spread over seeds left out which questions were held out
    from types import SimpleNamespace

    from rlfb.simulation.runner import _split

    ids = [f"q{i:02d}" for i in range(40)]
    prep: Any = SimpleNamespace(stream_qrels=None, qrels={q: {"d": 1} for q in ids}, contexts=dict.fromkeys(ids),
                                dataset=SimpleNamespace(queries={q: f"question {q}?" for q in ids}))
    halves = {seed: _split(prep, SimulationConfig(), seed=seed)[:2] for seed in range(3)}
    for stream, heldout in halves.values():
        assert len(stream) == len(heldout) == 20 and sorted(stream + heldout) == ids
    assert len({tuple(heldout) for _, heldout in halves.values()}) == 3
    assert _split(prep, SimulationConfig(), seed=1)[:2] == halves[1]  # and each is reproducible


def test_a_stream_question_worded_as_a_held_out_one_is_not_streamed() -> None:
    # scifact's train claim 1291 is test claim 1292, word for word: streamed, its feedback reached the held-out
    # one through the memory, which knows a question by its text, so "held-out" was not never asked
    from types import SimpleNamespace

    from rlfb.simulation.runner import _split

    texts = {"t1": "Obesity decreases life quality.", "t2": "Aspirin thins blood.",
             "s1": "obesity decreases life quality", "s2": "Statins lower cholesterol.", "s3": "Aspirin thins blood."}
    prep: Any = SimpleNamespace(stream_qrels={q: {"d": 1} for q in ("s1", "s2", "s3")},
                                qrels={"t1": {"d": 1}, "t2": {"d": 1}}, contexts=dict.fromkeys(texts),
                                dataset=SimpleNamespace(queries=texts))
    stream, heldout, _ = _split(prep, SimulationConfig(), seed=0)
    assert heldout == ["t1", "t2"] and stream == ["s2"]
    ids = [f"q{i}" for i in range(8)]  # seeded halves: a twin falling in the other half is not streamed either
    prep = SimpleNamespace(stream_qrels=None, qrels={q: {"d": 1} for q in ids}, contexts=dict.fromkeys(ids),
                           dataset=SimpleNamespace(queries={q: "the same question" for q in ids}))
    stream, heldout, _ = _split(prep, SimulationConfig(), seed=0)
    assert len(heldout) == 4 and stream == []


def test_a_stream_question_the_memory_takes_for_a_held_out_one_is_not_streamed() -> None:
    # the memory takes a question within cosine 0.995 of a remembered one for the same question (an exact
    # repeat, ungated): 14 of scifact's test claims had such a train claim ("X increases Y" / "X decreases Y")
    from types import SimpleNamespace

    import numpy as np

    from rlfb.memory import MemoryParams
    from rlfb.simulation.runner import _split

    rng = np.random.default_rng(0)
    base = rng.normal(size=(3, 16))
    twin = base[0] + 0.01 * rng.normal(size=16)  # cosine ~0.9998 with t1's
    emb = {"t1": base[0], "t2": base[1], "s1": twin, "s2": base[2], "s3": None}
    assert float(twin @ base[0] / np.linalg.norm(twin) / np.linalg.norm(base[0])) >= MemoryParams().exact_similarity
    texts = {q: f"question {q}" for q in emb}
    prep: Any = SimpleNamespace(stream_qrels={q: {"d": 1} for q in ("s1", "s2", "s3")},
                                qrels={"t1": {"d": 1}, "t2": {"d": 1}},
                                contexts={q: SimpleNamespace(query_embedding=e) for q, e in emb.items()},
                                dataset=SimpleNamespace(queries=texts))
    stream, heldout, _ = _split(prep, SimulationConfig(), seed=0)
    assert heldout == ["t1", "t2"] and stream == ["s2", "s3"]


def test_a_stream_left_empty_by_repeats_says_how_many_and_why() -> None:
    # it said "the dataset needs judged queries for both the stream and the held-out set", where the folder had
    # judged stream questions: each repeated a held-out one and was left out
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    base = rng.normal(size=(2, 16))
    emb = {"t1": base[0], "t2": base[1], "s1": base[0] + 0.01 * rng.normal(size=16), "s2": None}
    texts = {"t1": "question one", "t2": "question two", "s1": "question three", "s2": "Question two"}
    prep: Any = SimpleNamespace(stream_qrels={"s1": {"d": 1}, "s2": {"d": 1}}, qrels={"t1": {"d": 1}, "t2": {"d": 1}},
                                contexts={q: SimpleNamespace(query_embedding=e) for q, e in emb.items()},
                                dataset=SimpleNamespace(name="toy", queries=texts))
    with pytest.raises(ValidationError, match=r"^toy: all 2 stream questions of qrels/train.tsv were left out as "
                                              r"repeats of held-out questions of qrels/test.tsv \(1 with the same "
                                              r"text as one, 1 within cosine 0.995 of one's embedding\)"):
        run_seed(prep, SimulationConfig(), seed=0)
    ids = [f"q{i}" for i in range(6)]  # seeded halves, every question worded alike
    prep = SimpleNamespace(stream_qrels=None, qrels={q: {"d": 1} for q in ids}, contexts=dict.fromkeys(ids),
                           dataset=SimpleNamespace(name="toy", queries=dict.fromkeys(ids, "the same question")))
    with pytest.raises(ValidationError, match=r"all 3 stream questions \(a seeded half of qrels/test.tsv's\) were "
                                              r"left out .* \(3 with the same text as one\)"):
        run_seed(prep, SimulationConfig(), seed=0)


def test_the_demo_collection_asks_each_question_once_and_compares_each_device_with_another() -> None:
    # past 96 devices two shared a (function, material) pair: one paraphrase question described both and
    # judged one, and past 192 two questions read alike; at 7 devices a comparison note named its own device
    from rlfb.demo_corpus import MAX_DEVICES

    for n in (2, 7, 8, 50, MAX_DEVICES):
        data = generate_demo_corpus(n_devices=n, seed=3)
        assert len(set(data.queries.values())) == len(data.queries) == 2 * n
        for chunk in data.corpus:
            if chunk.metadata["kind"] == "comparison":
                own = data.corpus[data.corpus.index(chunk) - 2].metadata["device"]
                assert chunk.metadata["device"] != own
    for bad in (0, 1, MAX_DEVICES + 1, 2.0, True):
        with pytest.raises(ValidationError, match="n_devices"):
            generate_demo_corpus(n_devices=bad)  # type: ignore[arg-type]


def test_simplex_grid() -> None:
    grid = simplex_grid(3, 0.1)
    assert grid.shape == (66, 3)
    np.testing.assert_allclose(grid.sum(axis=1), 1.0)


def test_the_tuned_and_oracle_fixed_weights_can_be_equal_weights() -> None:
    # A 0.1-step grid over three retrievers lacks 1/3, 1/3, 1/3: on questions where only equal weights rank the
    # relevant chunk first, the "tuned" weights fell below equal weights on their own tuning questions.
    # Under min-max fusion relevant "r" scores 0.6 whatever the weights; each of "a", "b", "c" beats it
    # wherever its retriever weighs 0.4 or more, which every grid point gives one of them, and none does at
    # equal weights. (RRF ranks "r" first at some grid points too; min-max is searched first, so of the
    # systems that rank it first the equal min-max weights are chosen, and without them an RRF point was.)
    from types import SimpleNamespace

    from rlfb.fusion import rank_matrix
    from rlfb.simulation.baselines import Judge as _Judge
    from rlfb.simulation.baselines import fixed_baselines as _baselines

    ids = ("r", "a", "b", "c", "z")
    raw = np.array([[0.6, 0.6, 0.6], [1.0, 0.39, 0.39], [0.39, 1.0, 0.39], [0.39, 0.39, 1.0], [0.0, 0.0, 0.0]])
    names = ("bm25", "dense", "splade")
    ctx: Any = SimpleNamespace(candidate_ids=ids, raw=raw, ranks=rank_matrix(raw), retrievers=names)
    prep: Any = SimpleNamespace(contexts={"s": ctx, "h": ctx})
    judges = {q: _Judge(ctx, {"r": 1}, 10) for q in ("s", "h")}
    out = _baselines(prep, SimulationConfig(), ["s"], ["h"], judges, ["s"], {"s": 1})
    assert out["equal"]["heldout_ndcg@10"] == pytest.approx(1.0)
    for name in ("tuned_fixed", "oracle_fixed"):
        assert out[name]["heldout_ndcg@10"] == pytest.approx(1.0)
        assert out[name]["weights"] == pytest.approx(dict.fromkeys(names, 1 / 3)) and out[name]["fusion"] == "minmax"
    assert out["per_query_oracle"]["heldout_ndcg@10"] == pytest.approx(1.0)


@pytest.fixture(scope="module")
def small_run() -> tuple[SimulationConfig, dict, object]:
    data = generate_demo_corpus(n_devices=30, seed=2)
    config = SimulationConfig(policy="gradient", interactions=300, seeds=(0, 1), checkpoints=3,
                              retrievers=("bm25", "dense"))
    prep = prepare(data, config, show_progress=False)
    return config, simulate(data, config, show_progress=False, prepared=prep), prep


def test_the_questions_are_encoded_in_one_batch_before_their_contexts(monkeypatch) -> None:
    # each context encoded its question alone, about four times slower than a batch: minutes of a first run
    # on a collection of thousands of new questions
    from rlfb.retrievers.dense import DenseRetriever

    batches: list[int] = []
    encode = DenseRetriever.encode_queries

    def counted(self, queries, **kwargs):
        batches.append(len(queries))
        return encode(self, queries, **kwargs)

    monkeypatch.setattr(DenseRetriever, "encode_queries", counted)
    prep = prepare(generate_demo_corpus(n_devices=8, seed=3), SimulationConfig(retrievers=("bm25", "dense")))
    assert batches[0] == len(prep.contexts) > 1


def test_policy_options_reach_the_policy_with_the_runs_seed() -> None:
    # the policy's hyperparameters could not be set from a simulation: a figure measured with another gate had no
    # command to reproduce it
    from rlfb.commands.simulate import policy_options

    data = generate_demo_corpus(n_devices=8, seed=3)
    base: dict[str, Any] = dict(policy="thompson", interactions=150, seeds=(0, 1), checkpoints=2, retrievers=("bm25",))
    prep = prepare(data, SimulationConfig(**base))
    plain = simulate(data, SimulationConfig(**base), prepared=prep)
    as_default = simulate(data, SimulationConfig(**base, policy_options={"cf_min_questions": 1}), prepared=prep)
    assert as_default["final"] == plain["final"] and as_default["curve"] == plain["curve"]  # same seeds as by name
    other = simulate(data, SimulationConfig(**base, policy_options={"cf_gate_z": 0.0}), prepared=prep)
    assert other["config"]["policy_options"] == {"cf_gate_z": 0.0}
    assert other["config"]["policy_params"]["cf_gate_z"] == 0
    assert plain["config"]["policy_options"] == {}
    # a bare "unexpected keyword argument" named neither the closest option nor the others
    with pytest.raises(ValidationError, match="no option 'cf_min_question' \\(did you mean 'cf_min_questions'\\?\\); "
                                              "its options are \\['bandwidth'"):
        SimulationConfig(**base, policy_options={"cf_min_question": 10})
    with pytest.raises(ValidationError, match="cf_min_questions must be"):
        SimulationConfig(**base, policy_options={"cf_min_questions": 0})
    with pytest.raises(ValidationError, match="seed"):
        SimulationConfig(**base, policy_options={"seed": 3})
    # the learner's settings too (--learner-option), checked before indexing
    with pytest.raises(ValidationError, match="no option 'relevance_feedback'"):
        SimulationConfig(**base, learner={"relevance_feedback": 0.1})
    with pytest.raises(ValidationError, match="relevance_feedback_weight must be"):
        SimulationConfig(**base, learner={"relevance_feedback_weight": -1})
    # settings the run would ignore, or that contradict its memory flag (its table row says memory on or off)
    for memory, learner in ((False, {"memory_weight": 2.0}), (True, {"memory_weight": 0}),
                            (False, {"relevance_feedback_weight": 0.1})):
        with pytest.raises(ValidationError, match="--no-memory"):
            SimulationConfig(**base, memory=memory, learner=learner)
    assert SimulationConfig(**base, learner={"memory_weight": 2.0}).learner_config() == {"memory_weight": 2.0}
    assert SimulationConfig(**base, memory=False).learner_config() == {"memory_weight": 0.0}
    assert policy_options(["cf_gate_z=2", "exploration=epsilon"]) == {"cf_gate_z": 2, "exploration": "epsilon"}
    for bad in (["cf_gate_z"], ["=2"], ["a=1", "a=2"]):
        with pytest.raises(ValidationError, match="--policy-option"):
            policy_options(bad)


def test_relevance_feedback_runs_on_a_context_prepared_without_it() -> None:
    # contexts prepared for another run carried no candidate embeddings: relevance feedback was silently off
    data = generate_demo_corpus(n_devices=8, seed=3)
    base: dict[str, Any] = dict(policy="thompson", interactions=300, seeds=(0,), checkpoints=1,
                                retrievers=("bm25", "dense"))
    prep = prepare(data, SimulationConfig(**base))
    assert all(ctx.candidate_embeddings is None for ctx in prep.contexts.values())
    off = simulate(data, SimulationConfig(**base), prepared=prep)
    on = simulate(data, SimulationConfig(**base, learner={"relevance_feedback_weight": 0.5}), prepared=prep)
    assert all(ctx.candidate_embeddings is not None for ctx in prep.contexts.values())
    assert on["config"]["learner"]["relevance_feedback_weight"] == 0.5
    assert on["final"] != off["final"]
    # a run that does not read them is the same with them there
    assert simulate(data, SimulationConfig(**base), prepared=prep)["final"] == off["final"]


def test_result_has_the_documented_shape(small_run) -> None:
    config, result, _ = small_run
    for key in ("heldout_ndcg@10", "seen_ndcg@10", "online_ndcg@10"):
        entry = result["final"][key]
        assert entry["ci95"][0] <= entry["mean"] <= entry["ci95"][1]
    for name in ("rrf", "bm25", "dense", "equal", "tuned_fixed", "oracle_fixed", "per_query_oracle"):
        assert set(result["baselines"][name]) >= {"heldout_ndcg@10", "seen_ndcg@10"}
    assert [p["interactions"] for p in result["curve"]] == [0, 100, 200, 300]
    assert result["config"]["seeds"] == [0, 1] and result["config"]["policy"] == "gradient"
    # the policy's own hyperparameters and the RRF constant are settings too
    assert {"evidence_z", "window"} <= set(result["config"]["policy_params"]) and result["config"]["rrf_c"] == 60.0
    json.dumps(result)  # plain JSON
    b = result["baselines"]
    # an upper bound is an upper bound
    assert b["oracle_fixed"]["heldout_ndcg@10"]["mean"] >= b["rrf"]["heldout_ndcg@10"]["mean"] - 1e-12
    assert b["per_query_oracle"]["heldout_ndcg@10"]["mean"] >= b["oracle_fixed"]["heldout_ndcg@10"]["mean"] - 1e-12


def test_each_run_names_the_questions_it_streamed_held_out_and_asked(small_run) -> None:
    # only their counts were recorded: a script checking a figure had to rebuild the split from the code's rule
    config, result, prep = small_run
    for run in result["runs"]:
        ids = run["question_ids"]
        stream, heldout, asked = ids["stream"], ids["heldout"], ids["asked"]
        assert (len(stream), len(heldout)) == (run["stream_queries"], run["heldout_queries"])
        assert not set(stream) & set(heldout) and set(asked) <= set(stream) and len(asked) == run["distinct_asked"]
        assert sum(asked.values()) == config.interactions and all(q in prep.contexts for q in stream + heldout)
    # each seed draws its own halves, and a run recomputed from its seed names the same questions
    assert result["runs"][0]["question_ids"]["heldout"] != result["runs"][1]["question_ids"]["heldout"]
    assert run_seed(prep, config, 1)["question_ids"] == result["runs"][1]["question_ids"]


def test_the_held_out_figure_splits_by_what_the_stream_answered(small_run) -> None:
    # how much of a held-out gain is feedback on documents that answered a question asked in the stream
    _, result, _ = small_run
    overlap = result["heldout_overlap"]
    assert set(overlap) == {"shares_an_answer", "shares_none"}
    for run in result["runs"]:
        assert "heldout_overlap" not in run  # summarised above, once
    assert all(overlap[g][name]["n"] == 2 for g in overlap for name in ("learned", "equal", "rrf", "tuned_fixed"))
    config, _, prep = small_run
    run = run_seed(prep, config, 0)
    for name in ("learned", "equal", "rrf", "tuned_fixed"):
        parts = [(run["heldout_overlap"][g]["queries"], run["heldout_overlap"][g][name]) for g in overlap]
        whole = (run["final"] if name == "learned" else run["baselines"][name])["heldout_ndcg@10"]
        # the learned part is the final held-out figure's, the fixed ones the baselines': together the whole
        total = sum(n for n, _ in parts)
        assert sum(n * m for n, m in parts if n) / total == pytest.approx(whole, abs=1e-9)


def test_overlap_groups_held_out_queries_by_a_shared_relevant_document() -> None:
    import numpy as np

    from rlfb.simulation.runner import _overlap

    judgments = {"s1": {"a": 1, "b": 0}, "s2": {"c": 2}, "h1": {"a": 1}, "h2": {"b": 1}, "h3": {"c": 0, "d": 3}}
    out = _overlap(["h1", "h2", "h3"], ["s1", "s2"], judgments, {"learned": np.array([0.9, 0.2, 0.4])})
    # h1 shares "a" (relevant to s1); h2's "b" was judged not relevant for s1; h3's "c" is not relevant to h3
    assert out["shares_an_answer"] == {"queries": 1, "learned": 0.9}
    assert out["shares_none"] == {"queries": 2, "learned": pytest.approx(0.3)}


def test_feedback_memory_lifts_repeated_queries(small_run) -> None:
    """Each stream query is asked about 10 times: feedback memory must beat the static systems on them."""
    _, result, _ = small_run
    seen = result["final"]["seen_ndcg@10"]["mean"]
    b = result["baselines"]
    assert seen > max(b["rrf"]["seen_ndcg@10"]["mean"], b["equal"]["seen_ndcg@10"]["mean"]) + 0.05
    assert seen > b["oracle_fixed"]["seen_ndcg@10"]["mean"]
    assert result["curve"][0]["seen_ndcg@10"]["mean"] is None  # nothing seen before the first query


def test_same_seed_same_result(small_run) -> None:
    config, result, prep = small_run
    again = simulate(prep.dataset, config, show_progress=False, prepared=prep)
    assert again["final"] == result["final"] and again["curve"] == result["curve"]


def test_plot_is_written(small_run, tmp_path) -> None:
    _, result, _ = small_run
    plot_curves(result, str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_each_curve_is_drawn_against_the_baselines_figures_of_its_kind(small_run, tmp_path, monkeypatch) -> None:
    # the online curve was drawn on the seen panel, against the baselines' seen lines
    import matplotlib.axes

    # (and since RRF's and equal weights' seen and online figures are curves on each point's own questions,
    # those panels draw them as such, the tuned and oracle weights' final figures as lines)
    _, result, _ = small_run
    lines: dict[int, list[float]] = {}
    curves: dict[int, dict[str | None, list[float]]] = {}  # keyed by label: a curve may have none
    axhline, plot = matplotlib.axes.Axes.axhline, matplotlib.axes.Axes.plot

    def record(ax, y=0, *args, **kwargs):
        lines.setdefault(id(ax), []).append(y)
        return axhline(ax, y, *args, **kwargs)

    def record_plot(ax, x, y, *args, **kwargs):
        curves.setdefault(id(ax), {})[kwargs.get("label")] = list(y)
        return plot(ax, x, y, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", record)
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", record_plot)
    plot_curves(result, str(tmp_path / "curves.png"))
    panels = list(lines.values())
    drawn = list(curves.values())
    fixed = [n for n in ("tuned_fixed", "oracle_fixed") if n in result["baselines"]]
    keys = ("heldout_ndcg@10", "seen_ndcg@10", "online_ndcg@10")
    assert panels[0] == [result["baselines"][n][keys[0]]["mean"] for n in ("rrf", "equal", *fixed)]
    for panel, on_panel, key in zip(panels[1:], drawn[1:], keys[1:], strict=True):
        assert panel == [result["baselines"][n][key]["mean"] for n in fixed]
        for name in ("rrf", "equal"):
            along = [p["baselines"][name][key]["mean"] for p in result["curve"]]
            assert on_panel[name] == pytest.approx([np.nan if v is None else v for v in along], nan_ok=True)
            assert on_panel[name][-1] == pytest.approx(result["baselines"][name][key]["mean"], abs=1e-12)


def test_simulate_cli_on_the_demo_collection(tmp_path, capsys) -> None:
    out = tmp_path / "sim.json"
    code = main(["simulate", "--dataset", "demo", "--retrievers", "bm25", "--policy", "thompson",
                 "--interactions", "60", "--seeds", "1", "--checkpoints", "2", "--json", str(out),
                 "--plot", str(tmp_path / "sim.png"), "--quiet"])
    assert code == 0
    assert "learned (thompson)" in capsys.readouterr().out
    assert json.loads(out.read_text())["config"]["interactions"] == 60


def test_simulate_cli_passes_the_users_timing_settings(tmp_path) -> None:
    out = tmp_path / "sim.json"
    assert main(["simulate", "--dataset", "demo", "--retrievers", "bm25", "--policy", "fixed",
                 "--interactions", "30", "--seeds", "1", "--checkpoints", "1", "--json", str(out), "--quiet",
                 "--reformulation-rate", "0.25", "--mean-delay", "600", "--late-rate", "0.1",
                 "--late-delay", "90000", "--spacing", "15"]) == 0
    cfg = json.loads(out.read_text())["config"]
    assert (cfg["reformulation_rate"], cfg["mean_delay"], cfg["late_rate"], cfg["late_delay"], cfg["spacing"]) == (
        0.25, 600.0, 0.1, 90000.0, 15.0)
    assert cfg["dataset_path"] == "demo"
    for option, value in (("--spacing", "0"), ("--mean-delay", "-1"), ("--late-delay", "inf")):
        assert main(["simulate", "--dataset", "demo", option, value]) == 2  # refused before any indexing


def test_the_fixed_baselines_search_the_learners_own_fusion() -> None:
    """With z-score fusion the grid includes z-score weights: the oracle, chosen on the held-out queries
    from a grid that holds the learner's equal z-score weights, is never below a learner that keeps them."""
    data = generate_demo_corpus(n_devices=30, seed=2)
    config = SimulationConfig(
        policy="fixed", interactions=100, seeds=(0, 1), checkpoints=1, retrievers=("bm25", "dense"),
        fusion="zscore", memory=False, learner={"confidence_weight": 0.0, "exploration": "none"},
    )
    result = simulate(data, config, show_progress=False)
    oracle = result["baselines"]["oracle_fixed"]
    learned = [r["final"]["heldout_ndcg@10"] for r in result["runs"]]
    assert oracle["heldout_ndcg@10"]["mean"] >= float(np.mean(learned)) - 1e-12
    assert set(oracle["fusion"]) <= {"minmax", "rrf", "zscore"} and len(oracle["fusion"]) == 2
    # and the settings the config class does not hold are written out too
    cfg = result["config"]
    assert cfg["click_model"] == {"click": list(CLICK_MODELS["navigational"].click),
                                  "stop": list(CLICK_MODELS["navigational"].stop)}
    assert cfg["max_grade"] == 2 and cfg["attribution_window"] == 86400.0
    assert cfg["reward"]["horizon"] == 3600.0 and cfg["models"] == {"dense": "default"}
    # the demo collection has no train split: the JSON names none (it said "train"), and where the stream came from
    assert cfg["stream_split"] is None and cfg["stream_from"] == "a seeded half of split 'test'"


def test_fixed_equal_weights_score_as_the_equal_baseline_on_the_same_queries() -> None:
    """The baselines' seen and online figures are measured on the queries the learned ones are: a learner
    that keeps equal min-max weights, with no memory, confidence or exploration, scores exactly as
    the equal baseline, also when the seen figure samples the asked queries (max_seen)."""
    data = generate_demo_corpus(n_devices=30, seed=2)
    config = SimulationConfig(
        policy="fixed", interactions=200, seeds=(0,), checkpoints=2, retrievers=("bm25", "dense"), max_seen=7,
        memory=False, learner={"confidence_weight": 0.0, "exploration": "none"}, answer_k=5,
    )
    result = simulate(data, config, show_progress=False)
    for key in ("heldout_ndcg@10", "seen_ndcg@10", "online_ndcg@10"):
        assert result["final"][key]["mean"] == pytest.approx(result["baselines"]["equal"][key]["mean"], abs=1e-12)
    assert result["runs"][0]["distinct_asked"] > 7  # the seen figure was a sample
    # every setting is written out, the learner's as it ran
    cfg = result["config"]
    assert cfg["answer_k"] == 5 and cfg["late_rate"] == 0.02 and cfg["late_delay"] == 2 * 86400
    assert cfg["learner"]["exploration"] == "none" and cfg["learner"]["memory_weight"] == 0.0
    assert "discovery_rate" in cfg["learner"]  # a default the caller did not set
    assert cfg["learner_overrides"] == {"confidence_weight": 0.0, "exploration": "none"}


@pytest.mark.parametrize("copies_first", [True, False])
def test_tied_scores_break_alike_for_the_learned_figures_and_the_baselines(copies_first: bool) -> None:
    """A learner that keeps BM25's scores scores as BM25 alone on a corpus where every answer has an exact
    copy under another id (tied scores): both are ranked by their scores with ties broken as trec_eval breaks
    them, whatever order the candidates came in (in candidate order the learned figure read 0.69 where BM25
    read 0.47)."""
    from dataclasses import replace

    from rlfb.types import Chunk

    data = generate_demo_corpus(n_devices=30, seed=2)
    copies = [Chunk("z" + c.id[1:].replace("-full", "-copy"), c.text, dict(c.metadata))
              for c in data.corpus if c.id.endswith("-full")]
    corpus = copies + list(data.corpus) if copies_first else list(data.corpus) + copies
    config = SimulationConfig(
        policy="fixed", interactions=20, seeds=(0,), checkpoints=1, retrievers=("bm25",), memory=False,
        learner={"confidence_weight": 0.0, "exploration": "none"},
    )
    result = simulate(replace(data, corpus=corpus), config, show_progress=False)
    for key in ("heldout_ndcg@10", "seen_ndcg@10"):
        assert result["final"][key]["mean"] == pytest.approx(result["baselines"]["bm25"][key]["mean"], abs=1e-12)


def test_the_online_figure_is_what_users_were_shown_exploration_included() -> None:
    """The online figure scores the rankings users saw: with a chunk swapped in on every retrieval it falls
    below the same weights' greedy figure, while the greedy held-out and seen figures stay equal to it
    (without exploration all three equal the baseline's: see the test above)."""
    data = generate_demo_corpus(n_devices=30, seed=2)
    config = SimulationConfig(
        policy="fixed", interactions=200, seeds=(0,), checkpoints=1, retrievers=("bm25", "dense"), memory=False,
        learner={"confidence_weight": 0.0, "exploration": "epsilon", "epsilon": 1.0, "epsilon_min": 1.0},
        answer_k=5,
    )
    result = simulate(data, config, show_progress=False)
    final, equal = result["final"], result["baselines"]["equal"]
    for key in ("heldout_ndcg@10", "seen_ndcg@10"):
        assert final[key]["mean"] == pytest.approx(equal[key]["mean"], abs=1e-12)
    assert final["online_ndcg@10"]["mean"] < equal["online_ndcg@10"]["mean"] - 1e-3


def test_a_question_judged_in_both_splits_is_held_out_and_never_streamed() -> None:
    """Held-out means never asked: where the stream split and the held-out split share a question id,
    the question is held out only."""
    from dataclasses import replace

    data = generate_demo_corpus(n_devices=30, seed=2)
    ids = sorted(data.qrels["test"])
    test = {q: data.qrels["test"][q] for q in ids[:30]}
    train = {q: data.qrels["test"][q] for q in ids[20:]}  # ten questions in both splits
    both = replace(data, qrels={"test": test, "train": train})
    config = SimulationConfig(policy="fixed", interactions=120, seeds=(0,), checkpoints=1, retrievers=("bm25",))
    result = simulate(both, config, show_progress=False)
    assert result["config"]["stream_split"] == "train" and result["config"]["stream_from"] == "split 'train'"
    run = result["runs"][0]
    assert run["heldout_queries"] == 30
    assert run["stream_queries"] == 30  # 40 train questions less the 10 held out
    assert run["distinct_asked"] <= 30


def test_each_run_says_how_many_stream_questions_were_left_out_as_repeats() -> None:
    # the JSON said how many questions were streamed, not how many the held-out set cost the stream
    from dataclasses import replace

    data = generate_demo_corpus(n_devices=30, seed=2)
    ids = sorted(data.qrels["test"])
    queries = {**data.queries, ids[20]: data.queries[ids[0]]}  # a train question worded as a test one
    split = replace(data, queries=queries, qrels={"test": {q: data.qrels["test"][q] for q in ids[:20]},
                                                  "train": {q: data.qrels["test"][q] for q in ids[20:]}})
    config = SimulationConfig(policy="fixed", interactions=10, seeds=(0,), checkpoints=1, retrievers=("bm25",))
    result = simulate(split, config)
    run = result["runs"][0]
    assert run["stream_left_out"] == {"same_text": 1, "near": 0}  # BM25 alone: no embedding to be near by
    assert run["stream_queries"] == len(ids) - 21
    # and which data the figures come from, which a folder's path alone does not say
    assert result["config"]["dataset_sha256"] == split.digest() != data.digest()


def test_the_users_read_grades_on_the_stream_splits_own_scale() -> None:
    """Binary stream judgments are grade 4 whatever the held-out split's scale: a graded test split made a
    relevant train chunk grade 1 (P(click) 0.3 instead of 0.95), so held-out judgments changed the feedback."""
    from dataclasses import replace

    data = generate_demo_corpus(n_devices=30, seed=2)
    ids = sorted(data.qrels["test"])
    test = {q: {d: 3 for d in data.qrels["test"][q]} for q in ids[:20]}  # graded 3
    train = {q: {d: 1 for d in data.qrels["test"][q]} for q in ids[20:]}  # binary
    config = SimulationConfig(policy="fixed", interactions=10, seeds=(0,), checkpoints=1, retrievers=("bm25",))
    prep = prepare(replace(data, qrels={"test": test, "train": train}), config)
    assert prep.max_grade == 1
    # without a stream split of its own the stream is half of the split, read on the split's scale
    assert prepare(replace(data, qrels={"test": test}), config).max_grade == 3


def test_each_seeds_baselines_are_kept_in_its_run() -> None:
    """Learned minus a baseline pairs by seed: each run held its learned figures, the baselines only their
    means over seeds."""
    data = generate_demo_corpus(n_devices=10, seed=2)
    config = SimulationConfig(policy="fixed", interactions=40, seeds=(0, 1), checkpoints=1, retrievers=("bm25",))
    result = simulate(data, config, show_progress=False)
    runs = result["runs"]
    assert all(set(r["baselines"]) == set(result["baselines"]) for r in runs)
    for name, summary in result["baselines"].items():
        for key in ("heldout_ndcg@10", "seen_ndcg@10", "online_ndcg@10"):
            per_seed = [r["baselines"][name][key] for r in runs]
            assert all(isinstance(v, float) for v in per_seed)
            assert summary[key]["mean"] == float(np.mean(per_seed))  # the very figures the mean is of
        if "weights" in summary:
            assert [r["baselines"][name]["weights"] for r in runs] == summary["weights"]
    json.dumps(result["runs"], allow_nan=False)  # plain numbers, written as the JSON writes them


def test_the_question_stream_and_the_user_draw_from_streams_of_their_own() -> None:
    # Both were once seeded with the run's seed: two random.Random of one seed draw the same numbers,
    # so which question came next followed what the user had clicked (correlation 0.77 over seeds).
    import random

    from rlfb.simulation.runner import stream_seed

    firsts = np.array([[random.Random(stream_seed(s, name)).random() for name in ("queries", "user")]
                       for s in range(2000)])
    assert abs(np.corrcoef(firsts.T)[0, 1]) < 0.1
    assert stream_seed(3, "user") == stream_seed(3, "user")  # reproducible from the seed
    with pytest.raises(ValidationError, match="non-negative"):
        SimulationConfig(seeds=(-1,))


def test_feedback_later_than_the_clocks_end_is_delivered_too(monkeypatch) -> None:
    """With a late delay of a week every late signal used to fall after the simulated clock's end and was
    dropped: no late feedback arrived and none was flagged."""
    import rlfb.simulation.runner as runner

    generated: list[float] = []

    class Counting(SimulatedUser):
        def interact(self, ranking, qrel):
            inter = super().interact(ranking, qrel)
            generated.extend(f.delay for f in inter.feedback)
            return inter

    monkeypatch.setattr(runner, "SimulatedUser", Counting)
    data = generate_demo_corpus(n_devices=10, seed=2)
    week = 7 * 86400.0
    config = SimulationConfig(policy="fixed", interactions=80, seeds=(0,), checkpoints=1, retrievers=("bm25",),
                              late_rate=0.3, late_delay=week, explicit_rate=0.5)
    run = simulate(data, config, show_progress=False)["runs"][0]
    late = sum(d == week for d in generated)
    assert late > 5
    assert run["feedback"] == len(generated)
    assert run["flagged_feedback"] == late  # outside the 24 h window; the others arrive within minutes


@pytest.mark.parametrize("k", [5, 10])
def test_the_figures_are_named_by_their_cut_off(capsys, tmp_path, k: int) -> None:
    # k=5 was labelled ndcg@10 in the JSON keys, the table and the plot
    from rlfb.commands.simulate import print_table
    from rlfb.simulation.results import iter_table

    data = generate_demo_corpus(n_devices=10, seed=2)
    config = SimulationConfig(policy="fixed", interactions=40, seeds=(0,), checkpoints=2, retrievers=("bm25",),
                              k=k)
    result = simulate(data, config, show_progress=False)
    keys = {f"heldout_ndcg@{k}", f"seen_ndcg@{k}", f"online_ndcg@{k}"}
    assert set(result["final"]) == keys and set(result["runs"][0]["final"]) == keys
    assert all(set(p) == {"interactions", "baselines", *keys} for p in result["curve"])
    assert all(set(b) == keys - {f"heldout_ndcg@{k}"} for p in result["curve"] for b in p["baselines"].values())
    assert all(keys <= set(b) for b in result["baselines"].values())
    assert all(row[1] is not None for row in iter_table(result))
    print_table(result)
    assert f": nDCG@{k}, mean over" in capsys.readouterr().out
    plot_curves(result, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").is_file()


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_the_cut_off_is_checked_itself(k: object) -> None:
    # k=0 was reported as "answer_k must be an int in [1, k=0]"
    with pytest.raises(ValidationError, match="^k must be a positive integer"):
        SimulationConfig(k=k)  # type: ignore[arg-type]


@pytest.mark.parametrize(("settings", "message"), [
    ({"seeds": (0, 0, 1)}, "seeds must not repeat"),
    ({"spacing": 1e9}, "time since 1970"),
    ({"late_delay": 1e10}, "time since 1970"),
    ({"checkpoints": 2.0}, "checkpoints must be a positive int"),
    ({"interactions": 0}, "interactions must be a positive int"),
    ({"max_seen": 0}, "max_seen must be a positive int"),  # NaN seen figures
    ({"max_seen": -3}, "max_seen must be a positive int"),  # a ValueError mid-run
    ({"max_heldout": 0}, "max_heldout must be a positive int"),
    ({"grid_step": 0.3}, "grid_step must be 1/m"),  # it searched thirds while the JSON said 0.3
    ({"grid_step": 0.15}, "grid_step must be 1/m"),
])
def test_simulation_config_refuses(settings: dict, message: str) -> None:
    # a repeated seed gave a zero-width interval claiming n=3; a huge spacing failed after indexing with
    # "timestamp must not be negative"
    with pytest.raises(ValidationError, match=message):
        SimulationConfig(**settings)


def test_grid_steps_that_divide_one_are_taken() -> None:
    for step in (0.5, 0.25, 0.2, 0.1, 0.05, 1 / 3):
        assert SimulationConfig(grid_step=step).grid_step == step


def test_the_library_shows_no_progress_bars_unless_asked(capfd) -> None:
    # prepare, run_seed and simulate drew tqdm bars on stderr by default; only the CLI turned them off
    data = generate_demo_corpus(n_devices=10, seed=2)
    run = SimulationConfig(policy="fixed", interactions=5, seeds=(0,), retrievers=("bm25",))
    simulate(data, run)
    assert capfd.readouterr().err == ""
    simulate(data, run, show_progress=True)
    assert "fixed seed 0" in capfd.readouterr().err


def test_checkpoints_beyond_one_per_interaction_are_clamped() -> None:
    # a billion checkpoints built a billion marks (minutes) for the curve points the interactions allow
    config = SimulationConfig(interactions=20, checkpoints=10**9)
    assert config.checkpoints == 20
    data = generate_demo_corpus(n_devices=10, seed=2)
    run = SimulationConfig(policy="fixed", interactions=6, checkpoints=10**9, seeds=(0,), retrievers=("bm25",))
    assert [p["interactions"] for p in simulate(data, run, show_progress=False)["curve"]] == list(range(7))


def test_a_missing_split_fails_before_the_corpus_is_indexed(monkeypatch) -> None:
    from dataclasses import replace

    from rlfb.ensemble import FeedbackEnsemble

    def no_indexing(*args, **kwargs):  # reaching here would cost the corpus's encoding
        raise AssertionError("the corpus was indexed before the split was checked")

    data = generate_demo_corpus(n_devices=10, seed=2)
    dev_only = replace(data, qrels={"dev": data.qrels["test"]})
    textless = replace(data, qrels={"test": {"nowhere": {"d1-full": 1}}})
    one = replace(data, qrels={"test": dict(list(data.qrels["test"].items())[:1])})
    monkeypatch.setattr(FeedbackEnsemble, "from_chunks", no_indexing)
    with pytest.raises(ValidationError, match="split must name"):
        SimulationConfig(split="")
    with pytest.raises(ValidationError, match="no split 'test'"):
        prepare(dev_only, SimulationConfig(retrievers=("bm25",)), show_progress=False)
    with pytest.raises(ValidationError, match="judges no query"):
        prepare(textless, SimulationConfig(retrievers=("bm25",)), show_progress=False)
    with pytest.raises(ValidationError, match="both the stream and the held-out set"):
        prepare(one, SimulationConfig(retrievers=("bm25",)), show_progress=False)


def test_prepared_for_another_run_is_refused() -> None:
    # a run given contexts prepared with three retrievers and 100 candidates, and a config naming BM25 alone and
    # 5, ran on the three and 100 while its JSON named BM25 and 5
    from dataclasses import replace

    data = generate_demo_corpus(n_devices=6, seed=1)
    config = SimulationConfig(policy="fixed", interactions=5, seeds=(0,), checkpoints=1, retrievers=("bm25",))
    prep = prepare(data, config)
    for change, words in (({"candidate_k": 5}, "candidate_k 100"), ({"fusion": "zscore"}, "fusion 'minmax'"),
                          ({"k": 5}, "k 10")):
        with pytest.raises(ValidationError, match=words):
            simulate(data, replace(config, **change), prepared=prep)
    assert simulate(data, config, prepared=prep)["config"]["retrievers"] == ["bm25"]


def test_the_run_splits_held_out_queries_by_the_questions_it_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # it passed every stream question to the split, asked or not
    import rlfb.simulation.runner as runner

    seen: list[list[str]] = []
    split = runner._overlap

    def recording(heldout, asked, *a):
        seen.append(list(asked))
        return split(heldout, asked, *a)

    monkeypatch.setattr(runner, "_overlap", recording)
    config = SimulationConfig(policy="fixed", interactions=6, seeds=(0,), checkpoints=1, retrievers=("bm25",))
    result = simulate(generate_demo_corpus(n_devices=10, seed=2), config)
    (asked,) = seen
    run = result["runs"][0]
    assert len(asked) == len(set(asked)) == run["distinct_asked"] < run["stream_queries"]


def test_heldout_overlap_counts_the_questions_the_stream_asked() -> None:
    # every stream question counted, asked or not: after 300 scifact interactions 186 held-out claims
    # "shared an answer" with the stream, 73 of them with a claim it had asked
    from rlfb.simulation.runner import _overlap

    judgments = {"h1": {"d1": 1}, "h2": {"d2": 1}, "s1": {"d1": 1}, "s2": {"d2": 1}}
    per_heldout = {"learned": np.array([0.9, 0.1])}
    split = _overlap(["h1", "h2"], ["s1"], judgments, per_heldout)  # s2 is a stream question never asked
    assert split["shares_an_answer"] == {"queries": 1, "learned": 0.9}
    assert split["shares_none"] == {"queries": 1, "learned": 0.1}


def test_the_table_gives_the_learned_figures_interval_and_its_paired_differences(capsys) -> None:
    # it printed means alone: on the demo the learned held-out interval overlapped the oracle weights' one, while
    # every seed's learned figure was above it; the paired differences are what says so
    from rlfb.commands.simulate import print_table
    from rlfb.simulation.results import paired_differences

    data = generate_demo_corpus(n_devices=10, seed=2)
    config = SimulationConfig(policy="fixed", interactions=30, seeds=(0, 1, 2), checkpoints=1, retrievers=("bm25",))
    result = simulate(data, config, show_progress=False)
    diffs = paired_differences(result)
    for name, d in diffs.items():
        each = [r["final"]["heldout_ndcg@10"] - r["baselines"][name]["heldout_ndcg@10"] for r in result["runs"]]
        assert d["mean"] == pytest.approx(np.mean(each)) and d["n"] == 3
        assert d["ci95"][0] <= d["mean"] <= d["ci95"][1]
    print_table(result)
    out = capsys.readouterr().out
    assert "held-out, learned: 95 % interval over seeds [" in out
    assert f"  rrf{'':<19}{diffs['rrf']['mean']:+10.4f}   95 % interval [" in out


def test_the_environment_names_the_packages_files_that_differ_from_the_commit(monkeypatch) -> None:
    # a run of changed code recorded the commit alone, as if it were that commit's
    from rlfb.simulation import provenance as runner

    diff = ("diff", "--name-only", "HEAD", "--", "rlfb")
    others = ("ls-files", "--others", "--exclude-standard", "--", "rlfb")
    answers: dict[tuple[str, ...], list[str] | None] = {
        ("rev-parse", "HEAD"): ["2fbee23"], diff: ["rlfb/fusion.py"], others: ["rlfb/new_policy.py"]}
    monkeypatch.setattr(runner, "_git", lambda *args: answers.get(args))
    env = runner.environment()
    assert env["commit"] == "2fbee23" and env["uncommitted"] == ["rlfb/fusion.py", "rlfb/new_policy.py"]
    answers.update({diff: [], others: []})  # a clean tree
    assert runner.environment()["uncommitted"] == []
    answers[diff] = None  # git failing is not a clean tree
    assert runner.environment()["uncommitted"] is None
    answers.clear()  # an installed wheel: no checkout to ask
    assert runner.environment()["commit"] is None and runner.environment()["uncommitted"] is None


def test_each_curve_point_gives_rrf_and_equal_weights_on_its_own_questions() -> None:
    """The plot drew the whole seen curve against RRF's figure on the final checkpoint's questions, where an
    early point's questions are fewer and others: each point now carries RRF's and equal weights' seen and
    online figures on its own questions, and the last point's are the final baselines'."""
    from rlfb.simulation.results import summarize

    data = generate_demo_corpus(n_devices=30, seed=2)
    config = SimulationConfig(policy="thompson", interactions=90, seeds=(0, 1), checkpoints=3, retrievers=("bm25",),
                              max_seen=25)
    prep = prepare(data, config)
    runs = [run_seed(prep, config, seed) for seed in config.seeds]
    for run in runs:
        first, *_, last = run["curve"]
        assert all(np.isnan(first["baselines"][n][k]) for n in ("rrf", "equal")
                   for k in ("seen_ndcg@10", "online_ndcg@10"))  # nothing asked yet
        for name in ("rrf", "equal"):
            for key in ("seen_ndcg@10", "online_ndcg@10"):
                assert last["baselines"][name][key] == pytest.approx(run["baselines"][name][key], abs=1e-12)
    # an early point's questions are not the last point's: its figures are its own (here they differ)
    early = [run["curve"][1]["baselines"]["rrf"]["seen_ndcg@10"] for run in runs]
    assert early != [run["baselines"]["rrf"]["seen_ndcg@10"] for run in runs]
    summary = summarize(runs, config, {})
    point = summary["curve"][1]["baselines"]["rrf"]["seen_ndcg@10"]
    assert point["mean"] == pytest.approx(float(np.mean(early)), abs=1e-12) and point["n"] == 2
    assert "baselines" not in runs[0]["final"]


def test_the_seen_figure_is_given_by_how_often_its_questions_were_asked() -> None:
    """The seen figure averages questions asked once with questions asked many times; seen_by_asks takes it
    apart, and its groups put together give the seen figure (learned and RRF's) back."""
    from rlfb.simulation.results import summarize

    data = generate_demo_corpus(n_devices=30, seed=2)
    config = SimulationConfig(policy="thompson", interactions=80, seeds=(0, 1), checkpoints=2, retrievers=("bm25",))
    prep = prepare(data, config)
    runs = [run_seed(prep, config, seed) for seed in config.seeds]
    for run in runs:
        groups = run["seen_by_asks"]
        exact = ("1", "2", "3", "4-5", "6+")
        total = sum(groups[g]["queries"] for g in exact)
        assert total == run["distinct_asked"] and total > 0  # every seen question (fewer than max_seen) once
        assert groups["3+"]["queries"] == sum(groups[g]["queries"] for g in ("3", "4-5", "6+"))
        for name, figure in (("learned", run["final"]["seen_ndcg@10"]),
                             ("rrf", run["baselines"]["rrf"]["seen_ndcg@10"])):
            put_together = sum(groups[g]["queries"] * groups[g][name] for g in exact if groups[g]["queries"]) / total
            assert put_together == pytest.approx(figure, abs=1e-12)
        assert any(groups[g]["queries"] for g in ("1", "2")) and any(groups[g]["queries"] for g in ("4-5", "6+"))
    summary = summarize(runs, config, {})
    three = summary["seen_by_asks"]["3+"]
    lifts = [r["seen_by_asks"]["3+"]["learned"] - r["seen_by_asks"]["3+"]["rrf"] for r in runs]
    assert three["learned_minus_rrf"]["mean"] == pytest.approx(float(np.mean(lifts)), abs=1e-12)
    assert "seen_by_asks" not in summary["runs"][0]


def test_the_table_prints_the_seen_lift_by_times_asked(capsys) -> None:
    from rlfb.commands.simulate import print_table

    config = SimulationConfig(policy="thompson", interactions=80, seeds=(0, 1), checkpoints=2, retrievers=("bm25",))
    result = simulate(generate_demo_corpus(n_devices=30, seed=2), config, show_progress=False)
    print_table(result)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("seen, learned minus RRF"))
    lift = result["seen_by_asks"]["1"]["learned_minus_rrf"]["mean"]
    assert f"1: {lift:+.3f} (" in line and "3+:" in line
    del result["seen_by_asks"]  # an output of before: no line, no error
    print_table(result)
    assert "by times asked" not in capsys.readouterr().out


def test_a_lift_by_times_asked_over_fewer_seeds_says_how_many_and_a_run_of_other_settings_is_named(capsys) -> None:
    """Bugs: a group of the seen lift that some seeds had no question in was a mean over the others (one seed
    of two) printed as the others were; and the table named a run of any settings ``learned (thompson)``, the
    default system's name, where ``results_table.py`` named it ``thompson_nomem``."""
    from rlfb.commands.simulate import print_table

    config = SimulationConfig(policy="thompson", interactions=80, seeds=(0, 1), checkpoints=2, retrievers=("bm25",),
                              memory=False)
    result = simulate(generate_demo_corpus(n_devices=30, seed=2), config, show_progress=False)
    group = result["seen_by_asks"]["1"]
    group["learned_minus_rrf"]["n"] = 1  # as where only one seed asked a question once
    print_table(result)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("seen, learned minus RRF"))
    assert f"1: {group['learned_minus_rrf']['mean']:+.3f} ({group['queries']:.1f}, 1 of 2 seeds)" in line
    assert "2 seeds)" not in line.split("1 of 2 seeds")[1]  # the groups every seed has say nothing more
    assert "learned (thompson_nomem)" in out


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_the_tuned_weights_are_chosen_on_the_stream_and_the_oracle_on_the_held_out_questions() -> None:
    """Bug guarded: the tuned baseline was chosen on the held-out questions, making it the oracle under a
    more modest name."""
    from types import SimpleNamespace

    from rlfb.simulation.baselines import Judge as _Judge
    from rlfb.simulation.baselines import fixed_baselines as _baselines
    from rlfb.simulation.runner import SimulationConfig

    # r1 puts d1 first, r2 puts d2 first; the stream question wants d1, the held-out one d2
    # stand-ins for a Context and a Prepared: only the fields read
    ctx: Any = SimpleNamespace(retrievers=("r1", "r2"), candidate_ids=("d1", "d2"),
                               raw=np.array([[1.0, 0.0], [0.0, 1.0]]), ranks=np.array([[1.0, 2.0], [2.0, 1.0]]))
    qrels = {"s": {"d1": 1}, "h": {"d2": 1}}
    prep: Any = SimpleNamespace(contexts={"s": ctx, "h": ctx})
    config = SimulationConfig(grid_step=0.5)
    judges = {q: _Judge(ctx, qrels[q], config.k) for q in qrels}
    result = _baselines(prep, config, ["s"], ["h"], judges, [], {"s": 1})
    assert result["tuned_fixed"]["weights"] == {"r1": 1.0, "r2": 0.0}
    assert result["oracle_fixed"]["weights"] == {"r1": 0.0, "r2": 1.0}


def test_each_seed_samples_its_own_max_heldout_questions_from_a_held_out_split() -> None:
    """Bug guarded: the max_heldout sample was drawn with one fixed seed, so every seed scored the same questions
    where a stream split fixes the held-out pool."""
    from types import SimpleNamespace

    from rlfb.simulation.runner import SimulationConfig, _split

    held = [f"t{i:02d}" for i in range(30)]
    texts = {q: f"question {q}?" for q in [*held, "s1", "s2"]}
    prep: Any = SimpleNamespace(stream_qrels={"s1": {"d": 1}, "s2": {"d": 1}}, qrels={q: {"d": 1} for q in held},
                                contexts=dict.fromkeys(texts), dataset=SimpleNamespace(queries=texts))
    config = SimulationConfig(max_heldout=5)
    samples = {tuple(_split(prep, config, seed=seed)[1]) for seed in range(3)}
    assert len(samples) == 3


# -- found by a mutation review of the simulator (2026-12-07): each fails with the bug its comment names -------------
def test_the_lift_by_times_asked_is_over_rrf_and_each_retriever_scores_its_own_column(small_run) -> None:
    # `learned_minus_rrf` taken from equal weights, or every "retriever alone" row scored from the first
    # retriever's column, changed printed figures and no test saw it
    _, result, _ = small_run
    groups = result["seen_by_asks"]
    measured = [g for g in groups.values() if g["learned"]["mean"] is not None and g["rrf"]["mean"] is not None]
    assert measured
    for group in measured:
        lift = group["learned"]["mean"] - group["rrf"]["mean"]  # paired by seed: the mean of the differences
        assert group["learned_minus_rrf"]["mean"] == pytest.approx(lift, abs=1e-12)
        if group["equal"]["mean"] != pytest.approx(group["rrf"]["mean"], abs=1e-9):
            assert group["learned_minus_rrf"]["mean"] != pytest.approx(group["learned"]["mean"]
                                                                      - group["equal"]["mean"], abs=1e-9)
    b = result["baselines"]
    assert b["bm25"]["heldout_ndcg@10"]["mean"] != pytest.approx(b["dense"]["heldout_ndcg@10"]["mean"], abs=1e-9)


def test_a_checkpoint_changes_nothing_the_run_does_after_it(small_run) -> None:
    # ranked with exploration on (a mutation review, 2026-12-07), a checkpoint drew from the learner's random
    # streams: the run after it, and so every final figure, depended on how many checkpoints were asked for
    from dataclasses import replace

    config, _, prep = small_run
    once, often = (run_seed(prep, replace(config, checkpoints=n), 0) for n in (1, 6))
    assert once["final"] == often["final"] and once["weights"] == often["weights"]


def _with_train_split(n_train: int) -> Any:
    """The demo collection with a stream split of its own: ``n_train`` train questions, the rest held out."""
    from dataclasses import replace

    data = generate_demo_corpus(n_devices=20, seed=2)
    ids = sorted(data.qrels["test"])
    return replace(data, qrels={"test": {q: data.qrels["test"][q] for q in ids[n_train:]},
                                "train": {q: data.qrels["test"][q] for q in ids[:n_train]}})


def test_each_seed_asks_its_own_question_sequence_from_a_fixed_stream() -> None:
    # the question stream seeded with a constant (a mutation review, 2026-12-07): with a stream split every
    # seed asked the very same questions in the same order, and the spread over seeds left that out
    data = _with_train_split(12)
    config = SimulationConfig(policy="fixed", interactions=30, seeds=(0, 1, 2), checkpoints=1, retrievers=("bm25",),
                              reformulation_rate=0.0)
    runs = simulate(data, config, show_progress=False)["runs"]
    assert len({tuple(r["question_ids"]["stream"]) for r in runs}) == 1  # one stream for every seed ...
    assert len({tuple(r["question_ids"]["asked"].items()) for r in runs}) == 3  # ... asked its own way


def test_each_seed_meets_a_simulated_user_of_its_own() -> None:
    # the user seeded with a constant (a mutation review, 2026-12-07): where the rankings do not depend on the
    # seed, every seed clicked and thumbed alike. One stream question and fixed weights with no exploration
    # show the same rankings to every seed, so only the user's own draws can tell the seeds apart.
    data = _with_train_split(1)
    config = SimulationConfig(policy="fixed", interactions=40, seeds=(0, 1, 2), checkpoints=1, retrievers=("bm25",),
                              explicit_rate=0.5, memory=False,
                              learner={"confidence_weight": 0.0, "exploration": "none"})
    runs = simulate(data, config, show_progress=False)["runs"]
    assert all(r["question_ids"]["asked"] == runs[0]["question_ids"]["asked"] for r in runs)  # the same questions
    assert len({json.dumps(r["store"], sort_keys=True) for r in runs}) == 3, [r["store"] for r in runs]


def test_a_question_judged_in_both_splits_is_never_streamed_when_max_heldout_leaves_it_out() -> None:
    # the stream took every judged train question but those whose text a held-out one has (a mutation review,
    # 2026-12-07): a question judged in both splits that the max_heldout sample left out was streamed, so a
    # question of the held-out split was asked
    from types import SimpleNamespace

    from rlfb.simulation.runner import _split

    held = [f"t{i:02d}" for i in range(20)]
    texts = {q: f"question {q}?" for q in [*held, "s1"]}
    prep: Any = SimpleNamespace(stream_qrels={"s1": {"d": 1}, "t00": {"d": 1}}, qrels={q: {"d": 1} for q in held},
                                contexts=dict.fromkeys(texts), dataset=SimpleNamespace(queries=texts))
    splits = [_split(prep, SimulationConfig(max_heldout=3), seed=seed)[:2] for seed in range(10)]
    assert any("t00" not in heldout for _, heldout in splits)  # the sample left it out of some seeds' held-out set
    assert all(stream == ["s1"] for stream, _ in splits)


def test_the_per_query_oracle_searches_every_fusion_the_grid_does() -> None:
    # the per-query oracle searched min-max fusion alone (a mutation review, 2026-12-07). Here RRF ranks both
    # relevant chunks first, and no min-max weighting does: each retriever ranks one relevant chunk first and
    # the other last, behind an irrelevant chunk that the other retriever scores 0.5.
    from types import SimpleNamespace

    from rlfb.fusion import rank_matrix
    from rlfb.simulation.baselines import Judge as _Judge
    from rlfb.simulation.baselines import fixed_baselines as _baselines

    ids = ("rel1", "rel2", "x", "y")
    raw = np.array([[1.0, 0.0], [0.0, 1.0], [0.99, 0.5], [0.5, 0.99]])
    ctx: Any = SimpleNamespace(candidate_ids=ids, raw=raw, ranks=rank_matrix(raw), retrievers=("r1", "r2"))
    prep: Any = SimpleNamespace(contexts={"s": ctx, "h": ctx})
    judges = {q: _Judge(ctx, {"rel1": 1, "rel2": 1}, 10) for q in ("s", "h")}
    out = _baselines(prep, SimulationConfig(), ["s"], ["h"], judges, ["s"], {"s": 1})
    assert out["rrf"]["heldout_ndcg@10"] == pytest.approx(1.0)
    assert out["equal"]["heldout_ndcg@10"] < 0.9  # min-max at equal weights ranks x and y first
    for key in ("heldout_ndcg@10", "seen_ndcg@10", "online_ndcg@10"):
        assert out["per_query_oracle"][key] == pytest.approx(1.0)
        for name in ("rrf", "equal", "r1", "r2", "tuned_fixed", "oracle_fixed"):
            assert out["per_query_oracle"][key] >= out[name][key] - 1e-12


def test_each_simulate_option_reaches_the_runs_config(tmp_path) -> None:
    # a mutation review (2026-12-07): --no-memory wired to memory=True ran with the memory on, and the JSON said so
    # while the command line had asked for it off; no test gave the option
    out = tmp_path / "sim.json"
    assert main(["simulate", "--dataset", "demo", "--retrievers", "bm25", "--policy", "gradient", "--no-memory",
                 "--user", "informational", "--explicit-rate", "0.3", "--noise", "0.05", "--fusion", "rrf",
                 "--answer-k", "5", "--max-heldout", "6", "--interactions", "20", "--seeds", "2", "--checkpoints", "1",
                 "--json", str(out), "--quiet"]) == 0
    cfg = json.loads(out.read_text())["config"]
    assert (cfg["memory"], cfg["policy"], cfg["user"], cfg["explicit_rate"], cfg["noise"], cfg["fusion"],
            cfg["answer_k"], cfg["max_heldout"], cfg["interactions"], cfg["seeds"], cfg["checkpoints"],
            cfg["retrievers"]) == (False, "gradient", "informational", 0.3, 0.05, "rrf", 5, 6, 20, [0, 1], 1, ["bm25"])
