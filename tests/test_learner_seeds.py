"""A learner's random streams: one per part, none shared with a learner of another seed."""

from __future__ import annotations

import numpy as np
import pytest

from rlfb.learner import Learner
from rlfb.learner_config import part_seed


def _states(learner: Learner) -> list[int]:
    return [int(g.bit_generator.state["state"]["state"]) for g in learner._generators()]


@pytest.mark.parametrize("policy", ["thompson", "gradient", "batch"])
def test_no_two_learners_of_nearby_seeds_share_a_stream(policy: str) -> None:
    # parts seeded seed + 1, + 3 and + 4 gave seed 0's chunk exploration the stream of seed 1's policy
    learners = [Learner(("bm25", "dense"), policy=policy, seed=s) for s in range(10)]
    states = [state for learner in learners for state in _states(learner)]
    assert len(_states(learners[0])) == 4  # the policy, chunk exploration, discovery and replay
    assert len(set(states)) == len(states)


def test_a_part_draws_the_same_stream_for_the_same_seed() -> None:
    a, b = (Learner(("bm25", "dense"), seed=3) for _ in range(2))
    assert _states(a) == _states(b)
    assert part_seed(3, "replay") == part_seed(3, "replay") != part_seed(4, "replay")


def test_a_loaded_state_keeps_the_streams_of_the_learner_it_was_saved_from() -> None:
    a = Learner(("bm25", "dense"), seed=2)
    b = Learner(("bm25", "dense"), seed=2).load_state_dict(a.state_dict())
    assert [g.random() for g in a._generators()] == [g.random() for g in b._generators()]


def test_an_unknown_part_is_refused() -> None:
    with pytest.raises(ValueError):
        part_seed(0, "policy")
    seed = part_seed(0, "exploration")
    assert seed is not None and np.iinfo(np.uint32).max >= seed >= 0


def test_a_numpy_integer_seed_is_kept_as_a_plain_int_and_saves(tmp_path) -> None:
    # kept as given, it failed every save with a raw "int64 is not JSON serializable"
    import json

    from rlfb import FeedbackEnsemble
    from rlfb.policies import make_policy

    assert json.dumps(Learner(("bm25", "dense"), seed=np.int64(3)).state_dict())  # type: ignore[arg-type]
    assert json.dumps(make_policy("thompson", ["bm25", "dense"], seed=np.int64(3)).state_dict())
    ens = FeedbackEnsemble.from_texts(["aurora borealis", "tides and the moon"], retrievers=("bm25",),
                                      seed=np.int64(1), store=":memory:")
    ens.feedback(ens.retrieve("aurora").event_id, "thumbs_up")
    ens.save(tmp_path / "saved")
    assert type(ens.seed) is int and FeedbackEnsemble.load(tmp_path / "saved").seed == 1
