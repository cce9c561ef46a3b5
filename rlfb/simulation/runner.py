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

import heapq
import itertools
import math
import numbers
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from rlfb._progress import progress
from rlfb.datasets import BeirDataset
from rlfb.defaults import LEARNING_POLICY
from rlfb.errors import ValidationError
from rlfb.fusion import normalize
from rlfb.memory import MemoryParams, normalize_query
from rlfb.policies.base import Context
from rlfb.simulation.users import CLICK_MODELS, SimulatedUser
from rlfb.types import validate_k

__all__ = ["SimulationConfig", "Prepared", "prepare", "simulate", "simplex_grid", "summarize", "plot_curves",
           "stream_seed", "metric_name"]


def metric_name(k: int) -> str:
    """The name of the figures' metric in the JSON keys (``heldout_ndcg@10``, ...), which follows ``k``.

    >>> metric_name(10), metric_name(5)
    ('ndcg@10', 'ndcg@5')
    """
    return f"ndcg@{k}"


def _metric_keys(k: int) -> tuple[str, str, str]:
    """The keys of the held-out, seen and online figures."""
    m = metric_name(k)
    return f"heldout_{m}", f"seen_{m}", f"online_{m}"


# the default lead covers the default late delay (2 days) with room to spare; it is also the lead of any run whose
# delays it covers, so the simulated clock, and every figure, stay as they were for those
_MIN_LEAD = 5 * 86400.0
# exponential delays longer than this many means are left to chance: e**-50 per signal, about 2e-22
_DELAY_TAIL = 50.0


def _clock_lead(config: SimulationConfig) -> float:
    """Seconds between the stream's last question and now: every signal is due by then, late ones too."""
    return max(_MIN_LEAD, config.late_delay, _DELAY_TAIL * config.mean_delay)


@dataclass(frozen=True)
class SimulationConfig:
    """Every setting of a simulation run; all of it is written to the JSON output."""

    policy: str = LEARNING_POLICY
    user: str = "navigational"
    interactions: int = 2000
    explicit_rate: float = 0.1
    noise: float = 0.0
    reformulation_rate: float = 0.5
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    checkpoints: int = 10
    k: int = 10
    retrievers: tuple[str, ...] = ("bm25", "dense", "splade")
    fusion: str = "minmax"
    memory: bool = True
    candidate_k: int = 100
    split: str = "test"
    stream_split: str = "train"  # streamed where the collection has it; the JSON says null where it has none
    max_heldout: int | None = None
    max_seen: int = 300
    grid_step: float = 0.1
    spacing: float = 60.0
    mean_delay: float = 120.0
    late_rate: float = 0.02
    late_delay: float = 2 * 86400.0
    answer_k: int = 3
    learner: Mapping[str, Any] = field(default_factory=dict)
    policy_options: Mapping[str, Any] = field(default_factory=dict)  # the policy's hyperparameters, by name

    def __post_init__(self) -> None:
        # every setting is checked here, before a dataset is indexed: a typo must not cost minutes of encoding
        from rlfb.fusion import check_fusion
        from rlfb.policies import check_policy_name
        from rlfb.retrievers import check_retriever_names

        if self.user not in CLICK_MODELS:
            raise ValidationError(f"unknown user {self.user!r}; choose one of {sorted(CLICK_MODELS)}")
        if isinstance(self.policy, str):
            check_policy_name(self.policy)
        if not self.retrievers:
            raise ValidationError("give at least one retriever")
        check_retriever_names([r for r in self.retrievers if isinstance(r, str)])
        check_fusion(self.fusion)
        for name in ("explicit_rate", "noise", "reformulation_rate", "late_rate"):
            p = getattr(self, name)
            if isinstance(p, bool) or not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
                raise ValidationError(f"{name} must be a probability in [0, 1], got {p!r}")
        # max_seen 0 gave NaN seen figures, and a negative one a ValueError from random.sample mid-run
        sizes = ("interactions", "checkpoints", "max_seen", *(("max_heldout",) if self.max_heldout is not None else ()))
        for name in sizes:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
                raise ValidationError(f"{name} must be a positive int, got {v!r}")
        # a curve point per interaction is the most there can be (more marks round onto the same ones); clamped,
        # so that a huge count does not build a huge set of marks
        object.__setattr__(self, "checkpoints", min(self.checkpoints, self.interactions))
        validate_k(self.k)  # before the labels and answer_k's bound read it
        if not self.seeds:
            raise ValidationError("give at least one seed")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ValidationError(f"seeds must be non-negative ints, got {list(self.seeds)!r}")
        if len(set(self.seeds)) != len(self.seeds):
            # a seed run twice gives the same figures twice: an interval over them would claim a precision never
            # measured
            raise ValidationError(f"seeds must not repeat, got {list(self.seeds)!r}")
        if not isinstance(self.split, str) or not self.split:
            raise ValidationError(f"split must name a qrels file, got {self.split!r}")
        for name, low_open in (("mean_delay", False), ("late_delay", False), ("spacing", True)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (low_open and v == 0):
                bound = "positive" if low_open else "non-negative"
                raise ValidationError(f"{name} must be a finite {bound} number of seconds, got {v!r}")
        # the simulated clock runs in the past, ending early enough before now for every delay: it must not start
        # before 1970, where a timestamp would be negative
        span = self.interactions * self.spacing + _clock_lead(self)
        if span >= time.time():
            raise ValidationError(
                f"interactions x spacing ({self.interactions} x {self.spacing:g}s) and the feedback delays "
                f"(late_delay {self.late_delay:g}s, mean_delay {self.mean_delay:g}s) span {span:.3g}s, more "
                "than the time since 1970 that the simulated clock runs in")
        if not (0 < self.grid_step <= 0.5) or abs(1 / self.grid_step - round(1 / self.grid_step)) > 1e-9:
            # the grid steps by 1/round(1/step): 0.3 searched thirds while the JSON said 0.3
            raise ValidationError(f"grid_step must be 1/m for a whole number m >= 2 (0.5, 0.25, 0.1, ...), "
                                  f"got {self.grid_step}")
        if not (isinstance(self.answer_k, int) and 1 <= self.answer_k <= self.k):
            raise ValidationError(f"answer_k must be an int in [1, k={self.k}], got {self.answer_k!r}")
        if not isinstance(self.learner, Mapping):
            raise ValidationError(f"learner must be a mapping, got {type(self.learner).__name__}")
        from rlfb.learner import LearnerConfig

        LearnerConfig.from_dict(dict(self.learner))  # a misspelt or bad setting fails here, before indexing
        # the memory is on or off by `memory` alone: a run labelled by one and run by the other misleads its table
        if "memory_weight" in self.learner and (not self.memory or self.learner["memory_weight"] == 0):
            raise ValidationError("the memory is turned off by --no-memory (memory=False), not by memory_weight; "
                                  f"got memory={self.memory} and memory_weight={self.learner['memory_weight']!r}")
        if not self.memory and self.learner.get("relevance_feedback_weight", 0) > 0:
            raise ValidationError("relevance_feedback_weight reads the feedback memory, which --no-memory turns off")
        if not isinstance(self.policy_options, Mapping):
            raise ValidationError(f"policy_options must be a mapping, got {type(self.policy_options).__name__}")
        if self.policy_options:
            if "seed" in self.policy_options:
                raise ValidationError("policy_options cannot set the seed: each run's seed comes from seeds")
            if not isinstance(self.policy, str):
                raise ValidationError("policy options go to a policy given by name, not to an instance")
            from rlfb.policies import make_policy

            # built once now, so that an option the policy does not take, or a bad value, fails before indexing
            make_policy(self.policy, [str(r) for r in self.retrievers], **dict(self.policy_options))

    def learner_config(self) -> dict[str, Any] | None:
        """The learner's settings as each seed's ensemble takes them (``None``: the defaults)."""
        cfg = dict(self.learner)
        if not self.memory:
            cfg["memory_weight"] = 0.0
        return cfg or None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seeds"] = list(self.seeds)
        d["retrievers"] = list(self.retrievers)
        d["learner"] = dict(self.learner)
        d["policy_options"] = dict(self.policy_options)
        return d


@dataclass
class Prepared:
    """A dataset indexed once: the ensemble's retrievers and every query's context."""

    dataset: BeirDataset
    retrievers: dict[str, Any]
    chunks: Any
    contexts: dict[str, Context]
    qrels: dict[str, dict[str, int]]
    stream_qrels: dict[str, dict[str, int]] | None
    max_grade: int  # the highest grade of the stream's judgments, the scale the simulated users read
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
    from rlfb.ensemble import FeedbackEnsemble

    # the splits are checked before the corpus is indexed: a missing one must not cost minutes of encoding
    qrels = {q: dict(r) for q, r in dataset.split(config.split).items() if any(g > 0 for g in r.values())}
    stream_qrels = None
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
    for q in progress(wanted, desc="contexts", disable=not show_progress):
        contexts[q] = ens.context(dataset.queries[q], k=config.k)
    context_seconds = time.perf_counter() - t
    # the scale the simulated users read grades on is the stream's own: the users judge stream questions
    # only, and a graded held-out split must not change how they click on a binary stream split
    grades = [g for r in (qrels if stream_qrels is None else stream_qrels).values() for g in r.values()]
    return Prepared(
        dataset, dict(ens.retrievers), ens.chunks, contexts, qrels, stream_qrels, max(grades, default=1),
        config.fusion, config.candidate_k, index_seconds, context_seconds, config.k, config.split,
        config.stream_split, dataset.digest(),
    )


def _check_judged(
    dataset: BeirDataset, config: SimulationConfig, qrels: Mapping[str, Mapping[str, int]],
    stream_qrels: Mapping[str, Mapping[str, int]] | None,
) -> None:
    """Raise :class:`ValidationError` unless the splits give questions (judged relevant, with a text) both to
    stream and to hold out, as :func:`_split` parts them."""
    dataset.check_known_documents(config.split)  # qrels of another corpus: say so, not "judges no query"
    judged = [q for q in qrels if q in dataset.queries]
    if not judged:
        raise ValidationError(f"{dataset.name}: split {config.split!r} judges no query of queries.jsonl relevant "
                              "to any document")
    if stream_qrels is None:
        enough = len(judged) >= 2  # seeded halves of the held-out split's questions
    else:
        asked = [q for q in stream_qrels if q in dataset.queries]
        enough = any(q not in qrels for q in asked)
        if asked and not enough:  # the split has questions, every one held out (as _split parts them)
            what = f"all {len(asked)} judged queries" if len(asked) > 1 else "the one judged query"
            raise ValidationError(
                f"{dataset.name}: {what} of qrels/{config.stream_split}.tsv {'are' if len(asked) > 1 else 'is'} "
                f"judged in qrels/{config.split}.tsv too: a held-out question is never asked, so the stream has "
                "no question"
            )
    if not enough:
        raise ValidationError("the dataset needs judged queries for both the stream and the held-out set")


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


def simplex_grid(n: int, step: float = 0.1) -> np.ndarray:
    """Every weight vector on the simplex with the given step (66 points for n=3, step 0.1).

    >>> simplex_grid(2, 0.5).tolist()
    [[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]]
    """
    m = round(1 / step)
    points = [c for c in itertools.product(range(m + 1), repeat=n) if sum(c) == m]
    return np.array(points, dtype=np.float64) / m


class _Judge:
    """nDCG@k of many rankings of one query's candidates at once (vectorised over weight vectors)."""

    def __init__(self, ctx: Context, qrel: Mapping[str, int], k: int) -> None:
        self.k = k
        self.gains = np.array([max(qrel.get(c, 0), 0) for c in ctx.candidate_ids], dtype=np.float64)
        # tied scores in trec_eval's order (document id descending), as rlfb.metrics ranks a run: in candidate
        # order, bm25 alone on cisi read 0.3409 where pytrec_eval gives 0.3422
        ids = list(ctx.candidate_ids)
        self.tie_order = np.array(sorted(range(len(ids)), key=ids.__getitem__, reverse=True), dtype=np.int64)
        ideal = sorted((g for g in qrel.values() if g > 0), reverse=True)[:k]
        self.disc = 1.0 / np.log2(np.arange(2, k + 2))
        self.ideal = float(np.dot(ideal, self.disc[: len(ideal)]))

    def ndcg(self, scores: np.ndarray) -> np.ndarray:
        """nDCG of ranking by each column of ``scores`` (n_candidates, m) -> (m,), ties as trec_eval breaks them."""
        if self.ideal == 0:
            return np.zeros(scores.shape[1])
        kk = min(self.k, scores.shape[0])
        order = self.tie_order[np.argsort(-scores[self.tie_order], axis=0, kind="stable")[:kk]]
        return (self.gains[order] * self.disc[:kk, None]).sum(axis=0) / self.ideal

    def ndcg_order(self, order: np.ndarray) -> float:
        if self.ideal == 0:
            return 0.0
        kk = min(self.k, len(order))
        return float(np.dot(self.gains[np.asarray(order[:kk], dtype=np.int64)], self.disc[:kk]) / self.ideal)


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


def _baselines(
    prep: Prepared,
    config: SimulationConfig,
    stream: Sequence[str],
    heldout: Sequence[str],
    judges: Mapping[str, _Judge],
    seen_sample: Sequence[str],
    asked: Mapping[str, int],
    per_heldout: dict[str, np.ndarray] | None = None,
) -> dict[str, dict[str, float]]:
    """Every fixed system's figures, on the same queries as the learned ones: held-out on ``heldout``,
    seen on ``seen_sample`` (the stream queries the learned seen figure was measured on) and online
    over the stream as it was asked (each query weighted by its asks). Tuned weights are chosen on all
    of ``stream`` with full judgments. ``per_heldout``, if given, receives the per-query held-out nDCG of
    ``equal``, ``rrf``, ``tuned_fixed`` and ``oracle_fixed``."""
    names = list(prep.contexts[heldout[0]].retrievers)
    grid = simplex_grid(len(names), config.grid_step)
    equal = np.full(len(names), 1.0 / len(names))
    if not np.any(np.all(np.isclose(grid, equal), axis=1)):
        # equal weights, the learner's default, are a fixed system too: a grid of step 0.1 lacks them, and the
        # "tuned" weights fell below equal weights on their own tuning questions (cisi seeds 1 and 8)
        grid = np.vstack([grid, equal])
    # the grid searches min-max and RRF, and the learner's own fusion when it is another (z-score): a
    # tuned baseline must have had the learner's fusion to choose from
    modes = tuple(dict.fromkeys(("minmax", "rrf", config.fusion)))

    def per_query(qids: Sequence[str]) -> dict[str, np.ndarray]:
        out: dict[str, list] = {n: [] for n in names}
        out.update(equal=[], rrf=[], **{f"grid_{m}": [] for m in modes})
        for q in qids:
            ctx, judge = prep.contexts[q], judges[q]
            for j, n in enumerate(names):
                out[n].append(judge.ndcg(ctx.raw[:, [j]])[0])
            fused = {m: normalize(ctx.raw, m, ranks=ctx.ranks if m == "rrf" else None) for m in modes}
            out["equal"].append(judge.ndcg((fused["minmax"] @ equal)[:, None])[0])
            out["rrf"].append(judge.ndcg((fused["rrf"] @ equal)[:, None])[0])
            for m in modes:
                out[f"grid_{m}"].append(judge.ndcg(fused[m] @ grid.T))
        return {key: np.array(v) for key, v in out.items()}

    held = per_query(heldout)
    tune = per_query(stream)
    row = {q: i for i, q in enumerate(stream)}
    seen_rows = np.array([row[q] for q in seen_sample], dtype=np.int64)
    asks = np.array([asked.get(q, 0) for q in stream], dtype=float)
    share = asks / asks.sum() if asks.sum() > 0 else np.full(len(stream), 1.0 / len(stream))

    held_key, seen_key, online_key = _metric_keys(config.k)

    def figures(on_heldout: np.ndarray, on_stream: np.ndarray) -> dict[str, float]:
        """The three figures of one fixed system from its per-query nDCG on each query set."""
        return {
            held_key: float(on_heldout.mean()),
            seen_key: float(on_stream[seen_rows].mean()) if seen_rows.size else float("nan"),
            online_key: float(share @ on_stream),
        }

    result: dict[str, dict[str, Any]] = {key: figures(held[key], tune[key]) for key in [*names, "equal", "rrf"]}

    def best_fixed(chosen_on: dict[str, np.ndarray], name: str) -> dict[str, Any]:
        """The grid weights (any fusion mode) with the best mean on ``chosen_on``, scored on both sets."""
        mode, best = max(
            ((m, int(chosen_on[f"grid_{m}"].mean(axis=0).argmax())) for m in modes),
            key=lambda mb: chosen_on[f"grid_{mb[0]}"].mean(axis=0)[mb[1]],
        )
        if per_heldout is not None:
            per_heldout[name] = held[f"grid_{mode}"][:, best]
        return {
            **figures(held[f"grid_{mode}"][:, best], tune[f"grid_{mode}"][:, best]),
            "weights": dict(zip(names, grid[best].tolist(), strict=True)),
            "fusion": mode,
        }

    def per_query_oracle(d: dict[str, np.ndarray]) -> np.ndarray:
        return np.max([d[f"grid_{m}"].max(axis=1) for m in modes], axis=0)

    if per_heldout is not None:
        per_heldout.update(equal=held["equal"], rrf=held["rrf"])
    # tuned on the stream queries with full judgments: offline tuning
    result["tuned_fixed"] = best_fixed(tune, "tuned_fixed")
    result["oracle_fixed"] = best_fixed(held, "oracle_fixed")  # chosen on the held-out queries: an upper bound
    result["per_query_oracle"] = figures(per_query_oracle(held), per_query_oracle(tune))
    return result


def run_seed(
    prep: Prepared, config: SimulationConfig, seed: int, *, show_progress: bool = False
) -> dict[str, Any]:
    """One seed: the learning curve, the final figures and the baselines, as plain numbers."""
    from rlfb.ensemble import FeedbackEnsemble
    from rlfb.store import FeedbackStore

    parts = _parts(prep, config, seed)
    stream, heldout, judgments = parts.stream, parts.heldout, parts.judgments
    if not stream and parts.same_text + parts.near:  # the data has stream questions: say why none is asked
        raise ValidationError(_all_repeats(prep, config, parts))
    if not stream or not heldout:
        raise ValidationError("the dataset needs judged queries for both the stream and the held-out set")
    judges = {q: _Judge(prep.contexts[q], judgments[q], config.k) for q in set(stream) | set(heldout)}

    learner_cfg = config.learner_config()
    store = FeedbackStore(":memory:")
    policy: Any = config.policy
    if config.policy_options:  # with the seed the learner gives a policy it builds by name
        from rlfb.policies import make_policy

        policy = make_policy(config.policy, list(prep.retrievers), seed=seed, **dict(config.policy_options))
    ens = FeedbackEnsemble(
        prep.retrievers, prep.chunks, fusion=config.fusion, policy=policy, store=store,
        candidate_k=config.candidate_k, seed=seed, learner_config=learner_cfg,
        persist_interval=math.inf,  # one writer: snapshot at the end, not after every feedback
    )
    _add_candidate_vectors(prep, ens.learner.config)
    user = SimulatedUser(
        config.user, explicit_rate=config.explicit_rate, noise=config.noise,
        reformulation_rate=config.reformulation_rate, answer_k=config.answer_k, depth=config.k,
        mean_delay=config.mean_delay, late_rate=config.late_rate, late_delay=config.late_delay,
        max_grade=prep.max_grade, seed=stream_seed(seed, "user"),
    )
    rng = random.Random(stream_seed(seed, "queries"))
    # the simulated clock runs in the past, so that no feedback has a timestamp in the future: it ends a lead
    # before now that every delay fits in (a late signal's too), so all the feedback is delivered
    t0 = time.time() - config.interactions * config.spacing - _clock_lead(config)
    pending: list[tuple[float, int, str, str, str | None]] = []
    counter = itertools.count()
    marks = sorted({round(config.interactions * (i + 1) / config.checkpoints) for i in range(config.checkpoints)})
    asked: dict[str, int] = {}
    online: list[float] = []
    curve: list[dict[str, float]] = []
    seen_sample: list[str] = []  # the stream queries the latest seen figure was measured on
    n_feedback = n_flagged = 0

    def deliver(until: float) -> None:
        nonlocal n_feedback, n_flagged
        while pending and pending[0][0] <= until:
            arrival, _, event_id, signal, chunk_id = heapq.heappop(pending)
            record = ens.feedback(event_id, signal, chunk_id=chunk_id, timestamp=arrival)
            n_feedback += 1
            n_flagged += not record.in_window

    held_values: list[float] = []  # the latest held-out figure, per query

    def greedy(qids: Sequence[str], keep: list[float] | None = None) -> float:
        if not qids:
            return float("nan")
        # an evaluation: greedy, and read without touching the memory's entries, so it changes no state
        vals = [judges[q].ndcg_order(ens.learner.rank(prep.contexts[q], config.k, explore=False, touch=False).order)
                for q in qids]
        if keep is not None:
            keep[:] = vals
        return float(np.mean(vals))

    def checkpoint(n: int) -> None:
        seen = [q for q in asked]
        if len(seen) > config.max_seen:
            seen = random.Random(seed + n).sample(seen, config.max_seen)
        seen_sample[:] = seen
        held_key, seen_key, online_key = _metric_keys(config.k)
        curve.append({
            "interactions": n,
            held_key: greedy(heldout, held_values),
            seen_key: greedy(seen),
            online_key: float(np.mean(online)) if online else float("nan"),
        })

    checkpoint(0)
    started = time.perf_counter()
    bar = progress(range(config.interactions), desc=f"{config.policy} seed {seed}", disable=not show_progress,
               leave=False)
    for i in bar:
        now = t0 + i * config.spacing
        deliver(now)
        q = rng.choice(stream)
        ctx = prep.contexts[q]
        # the answer is written from the top answer_k chunks: a thumb or a restated question is about those
        result = ens.rank_context(ctx, config.k, explore=True, log=True, timestamp=now, used=config.answer_k)
        order = [ctx.candidate_ids.index(c) for c in result.chunk_ids] if result.hits else []
        online.append(judges[q].ndcg_order(np.asarray(order)))
        asked[q] = asked.get(q, 0) + 1
        for fb in user.interact(result.chunk_ids, judgments[q]).feedback:
            heapq.heappush(pending, (now + fb.delay, next(counter), result.event_id, fb.signal, fb.chunk_id))
        if i + 1 in marks:
            checkpoint(i + 1)
    learn_seconds = time.perf_counter() - started
    # what arrives after the stream ends, mostly outside the attribution window; all of it is due by now (the
    # clock's lead), so none is dropped: a signal still pending would be one the counts leave out
    deliver(math.inf)
    ens.flush()
    stats = store.counts() if hasattr(store, "counts") else {}
    settings = _run_settings(prep, config, ens)
    ens.close()
    final = dict(curve[-1])
    final.pop("interactions")
    per_heldout: dict[str, np.ndarray] = {"learned": np.asarray(held_values)}
    baselines = _baselines(prep, config, stream, heldout, judges, seen_sample, asked, per_heldout)
    return {
        "seed": seed,
        "final": final,
        "baselines": baselines,
        "heldout_overlap": _overlap(heldout, list(asked), judgments, per_heldout),
        "learner_config": ens.learner.config.to_dict(),
        "settings": settings,
        "curve": curve,
        "weights": ens.learner.weights(),
        "stream_queries": len(stream),
        # the stream questions left out as repeats of held-out ones, by text and by embedding: what the
        # held-out figure's "never asked" cost the stream
        "stream_left_out": {"same_text": parts.same_text, "near": parts.near},
        "heldout_queries": len(heldout),
        "distinct_asked": len(asked),
        "mean_times_asked": float(np.mean(list(asked.values()))),
        "feedback": n_feedback,
        "flagged_feedback": n_flagged,
        "store": stats,
        "seconds": learn_seconds,
    }


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


def _interval(values: Sequence[float], *, clip: bool = True) -> dict[str, Any]:
    """Mean and Student-t 95 % interval over seeds (NaN values left out), clipped to [0, 1], the range
    of every figure it summarises (with few seeds the t interval alone can pass 1); ``clip=False`` for
    differences of figures, which may be negative.

    >>> _interval([0.5])["ci95"]  # one seed gives no interval, not a zero-width one
    [None, None]
    >>> [round(v, 3) for v in _interval([0.4, 0.5, 0.6])["ci95"]]
    [0.252, 0.748]
    >>> [round(v, 3) for v in _interval([0.9, 1.0])["ci95"]]
    [0.315, 1.0]
    """
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=np.float64)
    if arr.size == 0:
        return {"mean": None, "ci95": [None, None], "n": 0}
    mean = float(arr.mean())
    if arr.size < 2:
        return {"mean": mean, "ci95": [None, None], "n": int(arr.size)}
    from scipy import stats

    half = float(stats.t.ppf(0.975, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
    lo, hi = mean - half, mean + half
    return {"mean": mean, "ci95": [max(0.0, lo), min(1.0, hi)] if clip else [lo, hi], "n": int(arr.size)}


def _run_settings(prep: Prepared, config: SimulationConfig, ens: Any) -> dict[str, Any]:
    """The settings a run used that ``SimulationConfig`` does not hold: the user's click model, the
    grades read from the data, the store's reward and window, the retrievers' models, the policy's
    hyperparameters (its gate, bounds, step, ...), the RRF constant, where the stream came from and the
    judged queries each split read left out (``dropped_queries``: split -> ``no_text``, ``no_relevant``,
    as :meth:`~rlfb.datasets.BeirDataset.dropped_queries` counts them). ``stream_split`` is ``None`` where
    no such split was read (the JSON's config takes it from here)."""
    model = CLICK_MODELS[config.user]
    # a model retriever's model: its name or path, "default" for the bundled one
    models = {name: r.model_name or "default" for name, r in prep.retrievers.items() if hasattr(r, "model_name")}
    reward = ens.store.reward.config
    params = getattr(ens.learner.policy, "params", None)
    splits = (config.split, config.stream_split) if prep.stream_qrels is not None else (config.split,)
    return {
        "click_model": {"click": list(model.click), "stop": list(model.stop)},
        "max_grade": prep.max_grade,
        "models": models,
        "attribution_window": ens.store.attribution_window,
        "reward": {f.name: getattr(reward, f.name) for f in fields(reward) if f.name != "aliases"},
        "policy_params": params() if callable(params) else None,
        "rrf_c": ens.rrf_c,
        # where the stream's questions came from: config's stream_split names the one wanted, which a
        # collection without it (cranfield, cisi) replaces by a seeded half of the held-out split
        "stream_from": (f"split {config.stream_split!r}" if prep.stream_qrels is not None
                        else f"a seeded half of split {config.split!r}"),
        # ... and the split itself only where it was read: "train" on a collection without one misled readers
        "stream_split": config.stream_split if prep.stream_qrels is not None else None,
        "dropped_queries": {split: prep.dataset.dropped_queries(split) for split in splits},
        "dataset_sha256": prep.digest,  # what a path alone does not tell: the data's content
    }


#: the packages whose arithmetic a run's figures rest on
_PACKAGES = ("rlfb", "numpy", "scipy", "torch", "sentence-transformers", "transformers", "bm25s")


def environment() -> dict[str, Any]:
    """What a run's figures rest on besides its settings and seeds: Python, the machine's processor, the
    packages' versions, the git commit of a checkout's code and the arithmetic's thread settings. The learned
    figures follow a chain of close decisions, which the last bits of a number can turn, and a run with them:
    the same code and seeds gave scifact thompson's held-out nDCG@10 0.7520 in one session and 0.7471 in the
    next, on another machine or package build (neither recorded then), the fixed systems the same to the
    fourth digit (README, Results).

    >>> env = environment()
    >>> sorted(env) == ["commit", "machine", "packages", "processor", "python", "threads", "uncommitted"]
    True
    """
    import os
    import platform
    import sys
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    # the threads that sum a dot product (their count can change its last bits), as this process has them
    torch = sys.modules.get("torch")  # only if loaded: a run of BM25 alone does not import it for this
    threads = {var: os.environ.get(var) for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    threads["torch"] = torch.get_num_threads() if torch is not None else None
    commit = _commit()
    return {"python": platform.python_version(), "machine": platform.machine(), "processor": _processor(),
            "packages": versions, "commit": commit, "threads": threads,
            "uncommitted": None if commit is None else _uncommitted()}


def _git(*args: str) -> list[str] | None:
    """The lines git prints for ``args`` in the checkout the rlfb source runs from (``[]`` where it prints
    nothing); ``None`` for an installed wheel, without git, or where git fails."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else None


def _commit() -> str | None:
    """The git commit of the rlfb source running, where it runs from a checkout (the version alone, 0.1.0,
    does not tell two sessions' code apart)."""
    head = _git("rev-parse", "HEAD")
    return head[0] if head else None


def _uncommitted() -> list[str] | None:
    """The package's files that differ from the commit of the checkout (changed, added, removed): a run of
    changed code is not that commit's. ``[]`` for a clean checkout; ``None`` where git fails (a failure must not
    read as a clean tree)."""
    changed = _git("diff", "--name-only", "HEAD", "--", "rlfb")
    added = _git("ls-files", "--others", "--exclude-standard", "--", "rlfb")
    if changed is None or added is None:
        return None
    return sorted({*changed, *added})


def _processor() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, where ``platform.processor()`` is often empty)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def summarize(runs: Sequence[Mapping[str, Any]], config: SimulationConfig, extra: Mapping[str, Any]) -> dict:
    """Mean and 95% interval over seeds, in the JSON shape scripts read.

    ``runs`` keeps each seed's own figures, scalars: ``final`` and ``baselines`` (name -> its held-out,
    seen and online figures, and a tuned system's weights and fusion), so that learned minus a baseline
    pairs by seed."""
    keys = _metric_keys(config.k)
    final = {k: _interval([r["final"][k] for r in runs]) for k in keys}
    baselines: dict[str, dict[str, Any]] = {}
    for name in runs[0]["baselines"]:
        entry = {k: _interval([r["baselines"][name][k] for r in runs]) for k in keys}
        if "weights" in runs[0]["baselines"][name]:
            entry["weights"] = [r["baselines"][name]["weights"] for r in runs]
            entry["fusion"] = [r["baselines"][name]["fusion"] for r in runs]
        baselines[name] = entry
    overlap = {
        group: {"queries": _interval([r["heldout_overlap"][group]["queries"] for r in runs])["mean"],
                **{name: _interval([r["heldout_overlap"][group][name] for r in runs])
                   for name in runs[0]["heldout_overlap"][group] if name != "queries"}}
        for group in runs[0]["heldout_overlap"]
    }
    curve = []
    for i, point in enumerate(runs[0]["curve"]):
        row: dict[str, Any] = {"interactions": point["interactions"]}
        for k in keys:
            row[k] = _interval([r["curve"][i][k] for r in runs])
        curve.append(row)
    return {
        "final": final,
        "baselines": baselines,
        "curve": curve,
        # held-out nDCG@k on the held-out queries that share a relevant document with the stream, and the rest
        "heldout_overlap": overlap,
        # every setting; "learner" as the learner ran (defaults filled in), "learner_overrides" as given
        "config": {**config.to_dict(), "learner": runs[0]["learner_config"], "learner_overrides": dict(config.learner),
                   **runs[0]["settings"], "environment": environment()},
        "weights": [r["weights"] for r in runs],
        "runs": [{k: v for k, v in r.items()
                  if k not in ("curve", "learner_config", "settings", "heldout_overlap")}
                 for r in runs],
        **dict(extra),
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


def iter_table(result: Mapping[str, Any]) -> Iterator[tuple[str, float | None, float | None, float | None]]:
    """Rows of (name, held-out, seen, online) means: the learned policy first, then the baselines."""
    keys = _metric_keys(result["config"]["k"])
    rows = [("learned (" + result["config"]["policy"] + ")", result["final"]), *result["baselines"].items()]
    for name, figures in rows:
        yield (name, *(figures[k]["mean"] if k in figures else None for k in keys))


def paired_differences(result: Mapping[str, Any], metric: str = "heldout") -> dict[str, dict[str, Any]]:
    """The learned policy's final figure minus each baseline's, seed by seed: mean and Student-t 95 % interval of
    the differences (``metric``: ``"heldout"``, ``"seen"`` or ``"online"``). Two intervals over few seeds can
    overlap where every seed's learned figure is above the baseline's; the paired one tells them apart.

    >>> result = {"config": {"k": 10}, "runs": [
    ...     {"final": {"heldout_ndcg@10": 0.80}, "baselines": {"rrf": {"heldout_ndcg@10": 0.70}}},
    ...     {"final": {"heldout_ndcg@10": 0.62}, "baselines": {"rrf": {"heldout_ndcg@10": 0.60}}},
    ...     {"final": {"heldout_ndcg@10": 0.75}, "baselines": {"rrf": {"heldout_ndcg@10": 0.70}}}]}
    >>> d = paired_differences(result)["rrf"]
    >>> round(d["mean"], 3), [round(v, 3) for v in d["ci95"]]
    (0.057, [-0.044, 0.157])
    """
    key = {"heldout": 0, "seen": 1, "online": 2}[metric]
    name = _metric_keys(result["config"]["k"])[key]
    runs = result.get("runs") or []
    out: dict[str, dict[str, Any]] = {}
    for baseline in (runs[0]["baselines"] if runs else {}):
        diffs = [run["final"][name] - run["baselines"][baseline][name] for run in runs
                 if run["final"].get(name) is not None and run["baselines"][baseline].get(name) is not None]
        interval = _interval(diffs, clip=False)  # a difference may be negative
        if interval["n"]:
            out[baseline] = interval
    return out


def plot_curves(result: Mapping[str, Any], path: str) -> None:
    """Learning curves (mean and 95% band over seeds) against the baselines' lines, written to ``path`` whole or
    not at all (:func:`rlfb.files.write_atomically`), in the format its suffix names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = result["config"]["k"]
    held_key, seen_key, online_key = _metric_keys(k)
    x = [p["interactions"] for p in result["curve"]]
    # each curve against the baselines' figure of the same kind: the online one (what users were shown, exploration
    # included) was drawn on the seen panel, against the baselines' seen lines
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), sharey=False)
    for ax, key, title, label in ((axes[0], held_key, "held-out queries", "learned (greedy)"),
                                  (axes[1], seen_key, "seen (repeated) queries", "learned (greedy)"),
                                  (axes[2], online_key, "online (what users were shown)", "learned (shown)")):
        # a missing value (nothing seen before the first query) is a gap in the curve
        mean = [_num(p[key]["mean"]) for p in result["curve"]]
        lo = [_num(p[key]["ci95"][0]) for p in result["curve"]]
        hi = [_num(p[key]["ci95"][1]) for p in result["curve"]]
        ax.plot(x, mean, "-", lw=2, label=label)
        seeds = len(result["config"].get("seeds") or [])
        # (one seed draws no band: its interval is None)
        ax.fill_between(x, lo, hi, alpha=0.2, label=f"95 % interval over {seeds} seeds" if seeds > 1 else None)
        for name, colour in (("rrf", "tab:red"), ("equal", "tab:orange"), ("tuned_fixed", "tab:green"),
                             ("oracle_fixed", "tab:purple")):
            if key in result["baselines"].get(name, {}):
                ax.axhline(result["baselines"][name][key]["mean"], ls="--", color=colour, lw=1, label=name)
        ax.set_title(f"{result.get('dataset', '')}: {title}")
        ax.set_xlabel("interactions")
        ax.set_ylabel(f"nDCG@{k}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    from rlfb.files import write_atomically

    # whole or not at all, as the JSON: saved in place, a full disk or Ctrl-C left a truncated image
    fmt = Path(path).suffix[1:].lower() or None
    try:
        write_atomically(path, lambda fh: fig.savefig(fh, format=fmt, dpi=110))
    finally:
        plt.close(fig)


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)
