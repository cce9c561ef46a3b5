"""The online-learning experiment: a stream of simulated users, learning curves, and honest baselines.

For each seed, a fresh learner serves a stream of queries sampled with
repetition from the stream split; a cascade user reacts; feedback arrives
after a delay and is learned from through the real ensemble, store and
learner. At regular checkpoints the run measures:

* **held-out** nDCG@k (k = 10 by default) of the greedy policy (no exploration)
  on queries never asked in the stream;
* **seen** nDCG@k of the greedy policy on stream queries asked before, which
  shows what feedback memory gives to repeated questions;
* **online** nDCG@k of what users were actually shown, exploration included.

Baselines come from the same contexts in the same run: each retriever alone,
equal min-max weights, RRF, weights tuned by grid search on the stream queries
with full judgments, the oracle best fixed weights (grid search on the held-out
queries themselves) and the per-query oracle of fusion.

Retriever scores do not change while the policy learns, so each query's
:class:`~rlfb.policies.base.Context` is computed once and shared by every seed.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from rlfb._progress import progress
from rlfb.datasets import BeirDataset
from rlfb.errors import ValidationError
from rlfb.memory import MemoryParams, normalize_query
from rlfb.policies.base import Context
from rlfb.simulation.baselines import Judge, fixed_baselines, simplex_grid
from rlfb.simulation.config import SimulationConfig, metric_name
from rlfb.simulation.episodes import SeedStream
from rlfb.simulation.provenance import environment
from rlfb.simulation.results import iter_table, paired_differences, plot_curves, summarize
from rlfb.simulation.users import CLICK_MODELS, SimulatedUser

# the settings, the baselines and the summary live in modules of their own (rlfb.simulation.config,
# .baselines, .results); their public names are importable from here too, where scripts found them first
__all__ = ["SimulationConfig", "Prepared", "prepare", "simulate", "simplex_grid", "summarize", "plot_curves",
           "stream_seed", "users_scale", "metric_name", "iter_table", "paired_differences", "environment"]


@dataclass
class Prepared:
    """A dataset indexed once: the ensemble's retrievers and every query's context."""

    dataset: BeirDataset
    retrievers: dict[str, Any]
    chunks: Any
    contexts: dict[str, Context]
    qrels: dict[str, dict[str, int]]
    stream_qrels: dict[str, dict[str, int]] | None
    # the highest grade of the split the stream is drawn from (the stream split's, else the held-out split's);
    # each seed's users read :func:`users_scale`, of the questions that seed streams
    max_grade: int
    fusion: str
    candidate_k: int
    index_seconds: float
    context_seconds: float
    k: int | None = None  # what the contexts were made for (None: not recorded, so not checked)
    split: str | None = None
    stream_split: str | None = None
    digest: str | None = None  # the collection's (BeirDataset.digest), recorded in each run's settings

    def check_for(self, dataset: BeirDataset, config: SimulationConfig) -> None:
        """Raise :class:`ValidationError` where ``config`` (or ``dataset``) is not what this was prepared for:
        a run on it would use these retrievers, candidates and questions while its JSON named the config's."""
        names = [r if isinstance(r, str) else getattr(r, "name", repr(r)) for r in config.retrievers]
        given = {"dataset": dataset.name, "retrievers": names, "fusion": config.fusion,
                 "candidate_k": config.candidate_k, "k": config.k, "split": config.split,
                 "stream_split": config.stream_split}
        made = {"dataset": self.dataset.name, "retrievers": list(self.retrievers), "fusion": self.fusion,
                "candidate_k": self.candidate_k, "k": self.k, "split": self.split, "stream_split": self.stream_split}
        differ = [f"{key} {made[key]!r} (config: {given[key]!r})" for key in given
                  if made[key] is not None and made[key] != given[key]]
        if differ:
            raise ValidationError(f"prepared= was made for another run: {'; '.join(differ)}; prepare it with "
                                  "this config")


def prepare(dataset: BeirDataset, config: SimulationConfig, *, show_progress: bool = False) -> Prepared:
    """Index the corpus and compute the context of every judged query (cached embeddings make reruns fast)."""
    from rlfb.candidates import without_candidates
    from rlfb.ensemble import FeedbackEnsemble

    # the splits are checked before the corpus is indexed: a missing one must not cost minutes of encoding
    qrels = {q: dict(r) for q, r in dataset.split(config.split).items() if any(g > 0 for g in r.values())}
    stream_qrels = None
    if config.stream_split not in dataset.qrels and config.stream_split in dataset.splits_found:
        # streamed from a seeded half of the held-out split instead, without a word (a review, 2026-12-06)
        dataset.split(config.stream_split)  # the error: qrels/<stream split>.tsv was not loaded
    if config.stream_split in dataset.qrels and config.stream_split != config.split:
        stream_qrels = {
            q: dict(r) for q, r in dataset.split(config.stream_split).items() if any(g > 0 for g in r.values())
        }
    _check_judged(dataset, config, qrels, stream_qrels)
    wanted = [q for q in itertools.chain(qrels, stream_qrels or {}) if q in dataset.queries]
    t = time.perf_counter()
    ens = FeedbackEnsemble.from_chunks(
        dataset.corpus, retrievers=config.retrievers, fusion=config.fusion, candidate_k=config.candidate_k,
        show_progress=show_progress,
    )
    index_seconds = time.perf_counter() - t
    t = time.perf_counter()
    for r in ens.retrievers.values():
        encode = getattr(r, "encode_queries", None)  # dense and SPLADE: their query encodings are cached
        if encode is not None:
            # in batches, which fills the caches the contexts below read: one query at a time took about four
            # times as long (0.94 s against 0.23 s a long query on 2 cores), minutes on thousands of new questions
            encode([dataset.queries[q] for q in wanted], show_progress=show_progress)
    contexts = {}
    own = dataset.own_documents(wanted)  # ArguAna's and Quora's questions are documents of the corpus too
    for q in progress(wanted, desc="contexts", disable=not show_progress):
        contexts[q] = ens.context(dataset.queries[q], k=config.k)
        if q in own:
            contexts[q] = without_candidates(contexts[q], own[q], fusion=ens.fusion, rrf_c=ens.rrf_c)
    context_seconds = time.perf_counter() - t
    # the highest grade of the split the stream is drawn from; the users of each seed read their own stream's
    # (users_scale): without a stream split, half of this split is held out
    grades = [g for r in (qrels if stream_qrels is None else stream_qrels).values() for g in r.values()]
    return Prepared(
        dataset, dict(ens.retrievers), ens.chunks, contexts, qrels, stream_qrels, max(grades, default=1),
        config.fusion, config.candidate_k, index_seconds, context_seconds, config.k, config.split,
        config.stream_split, dataset.digest(splits=(config.split, config.stream_split)),
    )


def _check_judged(
    dataset: BeirDataset, config: SimulationConfig, qrels: Mapping[str, Mapping[str, int]],
    stream_qrels: Mapping[str, Mapping[str, int]] | None,
) -> None:
    """Raise :class:`ValidationError` unless the splits give questions (judged relevant, with a text) both to
    stream and to hold out, as :func:`_split` parts them; the error names the qrels file that gives none."""
    dataset.check_known_documents(config.split)  # qrels of another corpus: say so, not "judges no query"
    judged = [q for q in qrels if q in dataset.queries]
    if not judged:
        raise ValidationError(_judges_none(dataset, config.split, "the held-out questions come from it"))
    if stream_qrels is None:
        if len(judged) < 2:  # seeded halves of the held-out split's questions
            raise ValidationError(
                f"{dataset.name}: qrels/{config.split}.tsv judges only one query of queries.jsonl relevant to a "
                f"document; without a qrels/{config.stream_split}.tsv a seeded half of its queries is the stream and "
                "the other half held out, which needs judged queries for both the stream and the held-out set")
        return
    dataset.check_known_documents(config.stream_split)
    asked = [q for q in stream_qrels if q in dataset.queries]
    if not asked:
        # the generic "needs judged queries for both ..." below did not say which file, nor why
        raise ValidationError(_judges_none(
            dataset, config.stream_split, "the stream's questions come from it (without the file, a seeded half "
            f"of qrels/{config.split}.tsv's would be)"))
    enough = any(q not in qrels for q in asked)
    if not enough:  # the split has questions, every one held out (as _split parts them)
        what = f"all {len(asked)} judged queries" if len(asked) > 1 else "the one judged query"
        raise ValidationError(
            f"{dataset.name}: {what} of qrels/{config.stream_split}.tsv {'are' if len(asked) > 1 else 'is'} "
            f"judged in qrels/{config.split}.tsv too: a held-out question is never asked, so the stream has "
            "no question"
        )


def _judges_none(dataset: BeirDataset, split: str, role: str) -> str:
    """The error for split ``split``, whose ``role`` in the run needs a question, judging no query of
    queries.jsonl relevant: which of its judged queries have no text, and which no relevant document."""
    dropped = dataset.dropped_queries(split)
    why = [f"{n} with {what}" for n, what in ((dropped["no_text"], "no text in queries.jsonl"),
                                              (dropped["no_relevant"], "no document of corpus.jsonl judged relevant"))
           if n]
    found = f"of its judged queries, {' and '.join(why)}" if why else "it judges no query at all"
    return (f"{dataset.name}: qrels/{split}.tsv judges no query of queries.jsonl relevant to any document "
            f"({found}), and {role}")


_STREAMS = ("queries", "user")


def stream_seed(seed: int, stream: str) -> int:
    """The seed of one of a run's random streams (which question comes next, what the user does).

    Each stream gets its own seed, derived from the run's: seeded alike, two ``random.Random``
    would draw the very same numbers, so the next question would follow the user's earlier clicks.
    The learner keeps ``seed`` itself.

    >>> stream_seed(0, "queries") != stream_seed(0, "user") != 0
    True
    """
    return int(np.random.SeedSequence([seed, _STREAMS.index(stream)]).generate_state(1)[0])


@dataclass(frozen=True)
class _Parts:
    """How :func:`_parts` divided the questions: ``stream`` and ``heldout`` ids, the ``judgments`` of both,
    and how many stream questions it left out as repeats of held-out ones (``same_text``: the same text as
    the memory normalises it; ``near``: an embedding within the memory's exact-repeat cosine)."""

    stream: list[str]
    heldout: list[str]
    judgments: dict[str, dict]
    same_text: int
    near: int


def _split(prep: Prepared, config: SimulationConfig, seed: int) -> tuple[list[str], list[str], dict[str, dict]]:
    """Stream and held-out query ids: the stream split where one exists, else seeded halves; a stream
    question with the text of a held-out one (as the memory normalises it) is left out of the stream."""
    parts = _parts(prep, config, seed)
    return parts.stream, parts.heldout, parts.judgments


def _parts(prep: Prepared, config: SimulationConfig, seed: int) -> _Parts:
    """:func:`_split`, with the count of the stream questions left out as repeats of held-out ones."""
    if prep.stream_qrels is not None:
        heldout = sorted(q for q in prep.qrels if q in prep.contexts)
        # a question judged in both splits is held out, never streamed: held-out means never asked
        stream = sorted(q for q in prep.stream_qrels if q in prep.contexts and q not in prep.qrels)
        judgments = {**prep.stream_qrels, **prep.qrels}
    else:
        ids = sorted(q for q in prep.qrels if q in prep.contexts)
        random.Random(1_000_003 + seed).shuffle(ids)
        half = len(ids) // 2
        stream, heldout = sorted(ids[:half]), sorted(ids[half:])
        judgments = dict(prep.qrels)
    if config.max_heldout is not None and config.max_heldout < len(heldout):
        # a seeded sample, not the first ids: ids sort by source order, which can follow topic or date
        heldout = sorted(random.Random(2_000_003 + seed).sample(heldout, config.max_heldout))
    # held-out means never asked, and the memory knows a question by its text, not its id: a stream question
    # worded as a held-out one (scifact's train claim 1291 is test claim 1292) would hand it its feedback
    held_texts = {normalize_query(prep.dataset.queries[q]) for q in heldout}
    asked = len(stream)
    stream = [q for q in stream if normalize_query(prep.dataset.queries[q]) not in held_texts]
    # ... and by its embedding: one as near as the memory takes for the same question (cosine 0.995, scifact's
    # "X increases Y" and "X decreases Y" claims) is an exact repeat to it, ungated
    near = _near_heldout(prep, stream, heldout, MemoryParams().exact_similarity)
    return _Parts([q for q in stream if q not in near], heldout, judgments, asked - len(stream), len(near))


def _all_repeats(prep: Prepared, config: SimulationConfig, parts: _Parts) -> str:
    """The error for a stream left empty by :func:`_parts` because each of its questions repeats a held-out one."""
    n = parts.same_text + parts.near
    source = (f"of qrels/{config.stream_split}.tsv" if prep.stream_qrels is not None
              else f"(a seeded half of qrels/{config.split}.tsv's)")
    what = f"all {n} stream questions {source} were" if n > 1 else f"the one stream question {source} was"
    how = [f"{parts.same_text} with the same text as one"] if parts.same_text else []
    if parts.near:
        how.append(f"{parts.near} within cosine {MemoryParams().exact_similarity} of one's embedding")
    return (f"{prep.dataset.name}: {what} left out as repeats of held-out questions of qrels/{config.split}.tsv "
            f"({', '.join(how)}): a held-out question is never asked, so the stream has no question left")


def _near_heldout(prep: Prepared, stream: Sequence[str], heldout: Sequence[str], threshold: float) -> set[str]:
    """The stream queries whose embedding has a cosine of at least ``threshold`` with a held-out query's."""
    def unit(qids: Sequence[str]) -> tuple[list[str], np.ndarray]:
        embedding = {q: getattr(prep.contexts[q], "query_embedding", None) for q in qids}  # None: no dense model
        ids = [q for q in qids if embedding[q] is not None]
        if not ids:
            return [], np.zeros((0, 0))
        m = np.stack([np.asarray(embedding[q], dtype=np.float64).ravel() for q in ids])
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        return ids, m / np.where(norms > 0, norms, 1.0)

    ids, s = unit(stream)
    _, h = unit(heldout)
    if not ids or not h.size:
        return set()
    return {q for q, best in zip(ids, (s @ h.T).max(axis=1), strict=True) if best >= threshold}


def users_scale(stream: Iterable[str], judgments: Mapping[str, Mapping[str, int]]) -> int:
    """The grade scale the simulated users read (``SimulatedUser``'s ``max_grade``): the highest relevance
    grade that the judgments of the stream's questions give; 1 (binary) where they give none.

    The users are asked the stream's questions only, so nothing of the held-out questions' judgments feeds
    how they click (without a stream split, a grade only the held-out half judged changed every stream
    grade). Only the top grade matters (:func:`~rlfb.simulation.users.to_grade`), so the stream need not
    judge every grade of the scale; a stream that judges a single relevant value, whatever it is, reads as
    binary, every relevant chunk at the top grade: no held-out judgment is taken to set it lower. On
    scifact, cranfield and cisi every seed's stream judges the split's top grade, so their scale is the
    split's, as before.

    >>> users_scale(["s"], {"s": {"a": 1, "b": 2}, "h": {"a": 3}}), users_scale(["s"], {"s": {"a": 2}})
    (2, 2)
    """
    return max((g for q in stream for g in judgments[q].values() if g > 0), default=1)


def run_seed(
    prep: Prepared, config: SimulationConfig, seed: int, *, show_progress: bool = False
) -> dict[str, Any]:
    """One seed: the learning curve, the final figures and the baselines, as plain numbers."""
    parts = _parts(prep, config, seed)
    stream, heldout, judgments = parts.stream, parts.heldout, parts.judgments
    if not stream and parts.same_text + parts.near:  # the data has stream questions: say why none is asked
        raise ValidationError(_all_repeats(prep, config, parts))
    if not stream or not heldout:
        raise ValidationError("the dataset needs judged queries for both the stream and the held-out set")
    judges = {q: Judge(prep.contexts[q], judgments[q], config.k) for q in set(stream) | set(heldout)}
    scale = users_scale(stream, judgments)
    ens = _learner(prep, config, seed)
    user = SimulatedUser(
        config.user, explicit_rate=config.explicit_rate, noise=config.noise,
        reformulation_rate=config.reformulation_rate, answer_k=config.answer_k, depth=config.k,
        mean_delay=config.mean_delay, late_rate=config.late_rate, late_delay=config.late_delay,
        max_grade=scale, seed=stream_seed(seed, "user"),
    )
    run = SeedStream(prep, config, seed, ens, user, random.Random(stream_seed(seed, "queries")), stream, heldout,
                     judges, judgments)
    run.run(show_progress=show_progress)
    ens.flush()
    store = ens.store
    stats = store.counts() if hasattr(store, "counts") else {}
    settings = _run_settings(prep, config, ens, scale)
    ens.close()
    final = {k: v for k, v in run.curve[-1].items() if k not in ("interactions", "baselines")}
    per_heldout: dict[str, np.ndarray] = {"learned": np.asarray(run.held_values)}
    asked = run.asked
    baselines = fixed_baselines(prep, config, stream, heldout, judges, run.seen_sample, asked, per_heldout)
    return {
        "seed": seed,
        "final": final,
        "baselines": baselines,
        "heldout_overlap": _overlap(heldout, list(asked), judgments, per_heldout),
        "seen_by_asks": _by_asks(run.seen_sample, run.seen_values, asked, run.untuned),
        "learner_config": ens.learner.config.to_dict(),
        "settings": settings,
        "curve": run.curve,
        "weights": ens.learner.weights(),
        "stream_queries": len(stream),
        # the stream questions left out as repeats of held-out ones, by text and by embedding: what the
        # held-out figure's "never asked" cost the stream
        "stream_left_out": {"same_text": parts.same_text, "near": parts.near},
        "heldout_queries": len(heldout),
        # which questions this seed streamed, held out and asked (how often), so that a script can check a
        # figure on its own questions: until 2026-12-06 only the counts were recorded, and the split had to be
        # rebuilt from the code's rule
        "question_ids": {"stream": list(stream), "heldout": list(heldout),
                         "asked": {q: int(n) for q, n in sorted(asked.items())}},
        "distinct_asked": len(asked),
        "mean_times_asked": float(np.mean(list(asked.values()))),
        "feedback": run.n_feedback,
        "flagged_feedback": run.n_flagged,
        "store": stats,
        "seconds": run.seconds,
    }


def _learner(prep: Prepared, config: SimulationConfig, seed: int) -> Any:
    """A fresh ensemble for one seed, on an in-memory store: the config's policy (built by name with the seed
    where it has options), fusion, candidates and learner settings, over the prepared retrievers."""
    from rlfb.ensemble import FeedbackEnsemble
    from rlfb.store import FeedbackStore

    policy: Any = config.policy
    if config.policy_options:  # with the seed the learner gives a policy it builds by name
        from rlfb.policies import make_policy

        policy = make_policy(config.policy, list(prep.retrievers), seed=seed, **dict(config.policy_options))
    ens = FeedbackEnsemble(
        prep.retrievers, prep.chunks, fusion=config.fusion, policy=policy, store=FeedbackStore(":memory:"),
        candidate_k=config.candidate_k, seed=seed, learner_config=config.learner_config(),
        persist_interval=math.inf,  # one writer: snapshot at the end, not after every feedback
    )
    _add_candidate_vectors(prep, ens.learner.config)
    return ens


def _add_candidate_vectors(prep: Prepared, learner_config: Any) -> None:
    """Give the prepared contexts the candidates' embeddings where this learner's relevance feedback reads them
    (once; a context without them would leave it silently off). Learners that do not read them ignore them."""
    from rlfb.candidates import candidate_vectors

    if not learner_config.reads_candidate_embeddings:
        return
    for q, ctx in prep.contexts.items():
        if ctx.candidate_embeddings is None:
            vectors = candidate_vectors(prep.retrievers, ctx.candidate_ids)
            if vectors is None:  # no dense retriever: nothing to read
                return
            prep.contexts[q] = replace(ctx, candidate_embeddings=vectors)


def _overlap(heldout: Sequence[str], asked: Sequence[str], judgments: Mapping[str, Mapping[str, int]],
             per_heldout: Mapping[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Held-out nDCG of the learned and some fixed systems on the held-out queries that share a relevant
    document with a question the stream asked, and on those that share none: what the memory can carry over
    to a new question is the feedback on documents that answered an asked one. (Until 2026-12-05 every
    stream question counted, asked or not: after 300 scifact interactions 186 held-out claims shared one,
    73 with an asked claim.)"""
    answered = {d for q in asked for d, g in judgments[q].items() if g > 0}
    shared = np.array([any(g > 0 and d in answered for d, g in judgments[q].items()) for q in heldout])
    out: dict[str, dict[str, float]] = {}
    for group, mask in (("shares_an_answer", shared), ("shares_none", ~shared)):
        out[group] = {"queries": int(mask.sum()),
                      **{name: float(v[mask].mean()) if mask.any() else float("nan")
                         for name, v in per_heldout.items()}}
    return out


#: how :func:`_by_asks` groups the seen questions by the times they were asked: exactly, and at least 3
ASK_GROUPS: dict[str, Callable[[int], bool]] = {
    "1": lambda n: n == 1, "2": lambda n: n == 2, "3": lambda n: n == 3, "4-5": lambda n: 4 <= n <= 5,
    "6+": lambda n: n >= 6, "3+": lambda n: n >= 3,
}


def _by_asks(seen: Sequence[str], values: Sequence[float], asked: Mapping[str, int],
             untuned: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """The final seen figure by how often its questions were asked (:data:`ASK_GROUPS`): how many, the learned
    nDCG, and RRF's and equal weights' on the same questions. The seen figure averages questions asked once with
    questions asked many times; what the memory gives a question asked three times is read here."""
    def mean(xs: list[float]) -> float:
        return float(np.mean(xs)) if xs else float("nan")

    out: dict[str, dict[str, float]] = {}
    for group, within in ASK_GROUPS.items():
        rows = [i for i, q in enumerate(seen) if within(asked[q])]
        out[group] = {"queries": len(rows), "learned": mean([values[i] for i in rows]),
                      **{name: mean([by_query[seen[i]] for i in rows]) for name, by_query in untuned.items()}}
    return out


def _run_settings(prep: Prepared, config: SimulationConfig, ens: Any, max_grade: int) -> dict[str, Any]:
    """The settings a run used that ``SimulationConfig`` does not hold: the user's click model, the
    grade scale its users read (``max_grade``, :func:`users_scale`), the store's reward and window, the
    retrievers' models, the policy's hyperparameters (its gate, bounds, step, ...), the RRF constant, where
    the stream came from and the
    judged queries each split read left out (``dropped_queries``: split -> ``no_text``, ``no_relevant``,
    as :meth:`~rlfb.datasets.BeirDataset.dropped_queries` counts them), the relevant judgments naming no
    document of the corpus (``unknown_judgments``) and the judged queries whose own document their rankings
    leave out (``own_documents_left_out``), by split. ``stream_split`` is ``None`` where
    no such split was read (the JSON's config takes it from here)."""
    model = CLICK_MODELS[config.user]
    # a model retriever's model: its name or path, "default" for the bundled one
    models = {name: r.model_name or "default" for name, r in prep.retrievers.items() if hasattr(r, "model_name")}
    reward = ens.store.reward.config
    params = getattr(ens.learner.policy, "params", None)
    splits = (config.split, config.stream_split) if prep.stream_qrels is not None else (config.split,)
    return {
        "click_model": {"click": list(model.click), "stop": list(model.stop)},
        "max_grade": max_grade,
        "models": models,
        "attribution_window": ens.store.attribution_window,
        "reward": {f.name: getattr(reward, f.name) for f in fields(reward) if f.name != "aliases"},
        "policy_params": params() if callable(params) else None,
        # the learner's chunk exploration as it ran (its settings say null where it follows the memory)
        "chunk_exploration": ens.learner.config.chunk_exploration,
        "rrf_c": ens.rrf_c,
        # where the stream's questions came from: config's stream_split names the one wanted, which a
        # collection without it (cranfield, cisi) replaces by a seeded half of the held-out split
        "stream_from": (f"split {config.stream_split!r}" if prep.stream_qrels is not None
                        else f"a seeded half of split {config.split!r}"),
        # ... and the split itself only where it was read: "train" on a collection without one misled readers
        "stream_split": config.stream_split if prep.stream_qrels is not None else None,
        "dropped_queries": {split: prep.dataset.dropped_queries(split) for split in splits},
        # relevant judgments left out for naming no document of the corpus (they lower no figure here, where
        # BEIR's pytrec_eval counts them in the ideal ranking), and the judged queries whose own document each
        # ranking leaves out (ArguAna, Quora)
        "unknown_judgments": {split: prep.dataset.unknown_judgments.get(split, 0) for split in splits},
        "own_documents_left_out": {split: len(prep.dataset.own_documents(prep.dataset.asked_queries(split)))
                                   for split in splits},
        "dataset_sha256": prep.digest,  # what a path alone does not tell: the data's content
    }


def simulate(
    dataset: BeirDataset,
    config: SimulationConfig,
    *,
    show_progress: bool = False,
    prepared: Prepared | None = None,
    on_seed: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every seed and summarise; ``prepared`` reuses an index and contexts across calls."""
    if prepared is not None:
        prepared.check_for(dataset, config)
    prep = prepared or prepare(dataset, config, show_progress=show_progress)
    runs = []
    t = time.perf_counter()
    for seed in progress(config.seeds, desc="seeds", disable=not show_progress):
        run = run_seed(prep, config, seed, show_progress=show_progress)
        runs.append(run)
        if on_seed is not None:
            on_seed(run)
    return summarize(runs, config, {
        "dataset": dataset.name,
        "timing": {
            "index_seconds": prep.index_seconds,
            "context_seconds": prep.context_seconds,
            "simulation_seconds": time.perf_counter() - t,
            "seconds_per_seed": [r["seconds"] for r in runs],
        },
    })
