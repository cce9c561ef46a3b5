"""One seed's stream of simulated interactions, as :func:`rlfb.simulation.runner.run_seed` runs it: each question
asked, ranked with exploration and logged through the real ensemble, the user's feedback delivered at its arrival
time, and the learning curve's figures (held-out, seen, online) at each checkpoint."""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfb._progress import progress
from rlfb.simulation.baselines import Judge, untuned_ndcg
from rlfb.simulation.config import SimulationConfig, clock_lead, metric_keys
from rlfb.simulation.users import SimulatedUser

if TYPE_CHECKING:
    from rlfb.ensemble import FeedbackEnsemble
    from rlfb.simulation.runner import Prepared

__all__ = ["SeedStream"]


class SeedStream:
    """The stream of one seed: ``run()`` asks ``config.interactions`` questions drawn by ``rng`` from
    ``stream``, and measures the curve; what it measured is in its attributes afterwards.

    ``curve``: the checkpoints' figures, each with RRF's and equal weights' on its own questions;
    ``held_values`` and ``seen_values``: the last checkpoint's figure per held-out question and per question
    of ``seen_sample``; ``asked``: how often each stream question was asked; ``n_feedback`` and ``n_flagged``:
    the feedback delivered, and how much of it fell outside the attribution window; ``seconds``: the stream's
    time, checkpoints included.
    """

    def __init__(self, prep: Prepared, config: SimulationConfig, seed: int, ens: FeedbackEnsemble,
                 user: SimulatedUser, rng: random.Random, stream: Sequence[str], heldout: Sequence[str],
                 judges: Mapping[str, Judge], judgments: Mapping[str, Mapping[str, int]]) -> None:
        self.prep, self.config, self.seed, self.ens, self.user, self.rng = prep, config, seed, ens, user, rng
        self.stream, self.heldout, self.judges, self.judgments = stream, heldout, judges, judgments
        # the simulated clock runs in the past, so that no feedback has a timestamp in the future: it ends a lead
        # before now that every delay fits in (a late signal's too), so all the feedback is delivered
        self.t0 = time.time() - config.interactions * config.spacing - clock_lead(config)
        self.pending: list[tuple[float, int, str, str, str | None]] = []
        self._order = itertools.count()  # ties of arrival time delivered in the order they were given
        self.marks = sorted({round(config.interactions * (i + 1) / config.checkpoints)
                             for i in range(config.checkpoints)})
        self.asked: dict[str, int] = {}
        self.online: list[float] = []
        # RRF's and equal weights' nDCG on each stream question: each checkpoint gives their seen and online
        # figures on its own questions, which the curve is read against (the final baselines' are the last
        # sample's only)
        self.untuned = untuned_ndcg(prep, stream, judges)
        self.untuned_online: dict[str, list[float]] = {name: [] for name in self.untuned}
        self.curve: list[dict[str, Any]] = []  # figures, and under "baselines" each baseline's
        self.seen_sample: list[str] = []  # the stream queries the latest seen figure was measured on
        self.held_values: list[float] = []  # the latest held-out figure, per query
        self.seen_values: list[float] = []  # ... and the latest seen figure, per query of seen_sample
        self.n_feedback = self.n_flagged = 0
        self.seconds = 0.0

    def run(self, *, show_progress: bool = False) -> None:
        """Ask the whole stream, with a checkpoint before it and at each mark; then deliver what is still on its
        way (all of it is due by now, the clock's lead: a signal still pending would be one the counts leave
        out)."""
        self.checkpoint(0)
        started = time.perf_counter()
        bar = progress(range(self.config.interactions), desc=f"{self.config.policy} seed {self.seed}",
                       disable=not show_progress, leave=False)
        for i in bar:
            self.ask(i)
            if i + 1 in self.marks:
                self.checkpoint(i + 1)
        self.seconds = time.perf_counter() - started
        # what arrives after the stream ends, mostly outside the attribution window
        self.deliver(math.inf)

    def ask(self, i: int) -> None:
        """The ``i``-th interaction: feedback due by now delivered, a question drawn and answered with
        exploration, what was shown scored, and the user's feedback queued for its arrival."""
        config = self.config
        now = self.t0 + i * config.spacing
        self.deliver(now)
        q = self.rng.choice(self.stream)
        ctx = self.prep.contexts[q]
        # the answer is written from the top answer_k chunks: a thumb or a restated question is about those
        result = self.ens.rank_context(ctx, config.k, explore=True, log=True, timestamp=now, used=config.answer_k)
        order = [ctx.candidate_ids.index(c) for c in result.chunk_ids] if result.hits else []
        self.online.append(self.judges[q].ndcg_order(np.asarray(order)))
        for name, by_query in self.untuned.items():
            self.untuned_online[name].append(by_query[q])
        self.asked[q] = self.asked.get(q, 0) + 1
        assert result.event_id is not None  # logged: this ensemble has a store, and log=True
        for fb in self.user.interact(result.chunk_ids, self.judgments[q]).feedback:
            heapq.heappush(self.pending, (now + fb.delay, next(self._order), result.event_id, fb.signal,
                                          fb.chunk_id))

    def deliver(self, until: float) -> None:
        """Give the ensemble every queued feedback that has arrived by ``until``, in arrival order."""
        while self.pending and self.pending[0][0] <= until:
            arrival, _, event_id, signal, chunk_id = heapq.heappop(self.pending)
            record = self.ens.feedback(event_id, signal, chunk_id=chunk_id, timestamp=arrival)
            self.n_feedback += 1
            self.n_flagged += not record.in_window

    def greedy(self, qids: Sequence[str], keep: list[float] | None = None) -> float:
        """Mean nDCG of the greedy rankings of ``qids`` (NaN for none); each question's in ``keep`` if given."""
        if not qids:
            return float("nan")
        # an evaluation: greedy, and read without touching the memory's entries, so it changes no state. The
        # greedy ranking is the fused scores' order; it is scored by those scores with ties broken as trec_eval
        # breaks them, as every baseline is (in the learner's candidate order, a duplicate chunk ranked above
        # its copy by pool order, not by id: on the demo collection with its answers copied, 0.69 against BM25's
        # 0.47 for the same scores)
        k = self.config.k
        vals = [self.judges[q].ndcg_of(self.ens.learner.rank(self.prep.contexts[q], k, explore=False,
                                                             touch=False).fused)
                for q in qids]
        if keep is not None:
            keep[:] = vals
        return float(np.mean(vals))

    def checkpoint(self, n: int) -> None:
        """The curve's point after ``n`` interactions: held-out, seen (on at most ``max_seen`` of the questions
        asked so far, a sample seeded by ``seed + n``) and online, with RRF's and equal weights' beside them."""
        seen = list(self.asked)
        if len(seen) > self.config.max_seen:
            seen = random.Random(self.seed + n).sample(seen, self.config.max_seen)
        self.seen_sample[:] = seen
        held_key, seen_key, online_key = metric_keys(self.config.k)
        online = self.online
        self.curve.append({
            "interactions": n,
            held_key: self.greedy(self.heldout, self.held_values),
            seen_key: self.greedy(seen, self.seen_values),
            online_key: float(np.mean(online)) if online else float("nan"),
            "baselines": {name: {
                seen_key: float(np.mean([by_query[q] for q in seen])) if seen else float("nan"),
                online_key: float(np.mean(self.untuned_online[name])) if online else float("nan"),
            } for name, by_query in self.untuned.items()},
        })
