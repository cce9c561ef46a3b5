"""Boundary inputs of the LlamaIndex adapter: strict options, and run data that cannot be used is dropped.

Options a user passes raise rlfb's ValidationError (never pydantic's, never
read loosely as ``bool("no")``); a session tag or a node score the store cannot
keep is left out, so the event handler (whose errors are only logged) still
logs the retrieval.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pydantic
import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llamaindex_rlfb import EVENT_ID_KEY, FeedbackEnsembleRetriever, FeedbackEventHandler, FeedbackFusionPostprocessor
from rlfb import NoStoreError, ValidationError
from rlfb.store import FeedbackStore

BAD_COUNTS = [0, -2, 2.0, True, "2", None]
BAD_FLAGS = ["no", "false", 0, 1, None]


def _nodes() -> list[TextNode]:
    return [TextNode(id_="a", text="the aurora is caused by the solar wind"),
            TextNode(id_="b", text="tides follow the moon"),
            TextNode(id_="c", text="volcanoes erupt molten rock")]


# ---------------------------------------------------------------------------------- FeedbackFusionPostprocessor
@pytest.mark.parametrize("top_n", BAD_COUNTS)
def test_postprocessor_top_n_raises_rlfbs_validation_error(top_n: Any) -> None:
    with pytest.raises(ValidationError, match="top_n must be a positive integer") as err:
        FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=top_n, nodes=_nodes())
    assert not isinstance(err.value, pydantic.ValidationError)


@pytest.mark.parametrize("explore", BAD_FLAGS)
def test_postprocessor_explore_must_be_a_bool(explore: Any) -> None:
    with pytest.raises(ValidationError, match="explore must be True or False"):
        FeedbackFusionPostprocessor(retrievers=("bm25",), explore=explore)


def test_postprocessor_from_ensemble_checks_too(make_ensemble: Any) -> None:
    with pytest.raises(ValidationError, match="top_n"):
        FeedbackFusionPostprocessor.from_ensemble(make_ensemble(), top_n=0)
    with pytest.raises(ValidationError, match="explore"):
        FeedbackFusionPostprocessor.from_ensemble(make_ensemble(), explore="no")  # type: ignore[arg-type]


def test_postprocessor_takes_numpy_integers_and_bools(tmp_path: Any) -> None:
    # numpy values on purpose: accepted, though annotated int and bool
    pp = FeedbackFusionPostprocessor(tmp_path / "fb.db", retrievers=("bm25",),
                                     top_n=np.int64(2),  # type: ignore[arg-type]
                                     explore=np.bool_(False), nodes=_nodes())  # type: ignore[arg-type]
    assert type(pp.top_n) is int and pp.top_n == 2 and pp.explore is False
    out = pp.postprocess_nodes([NodeWithScore(node=n) for n in _nodes()], query_str="what causes aurora")
    assert len(out) == 2
    again = FeedbackFusionPostprocessor.from_dict(pp.to_dict(), nodes=_nodes())  # the dump is plain JSON
    assert again.top_n == 2 and again.explore is False


def test_postprocessor_drops_a_session_tag_that_cannot_be_one() -> None:
    pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=1, nodes=_nodes())
    with instrument_tags({"session_id": ""}), pytest.warns(UserWarning, match="session_id"):
        [out] = pp.postprocess_nodes([NodeWithScore(node=n) for n in _nodes()], query_str="moon tides")
    assert pp.store.event(out.node.metadata[EVENT_ID_KEY])["session_id"] is None


# ---------------------------------------------------------------------------------- FeedbackEnsembleRetriever
@pytest.mark.parametrize("k", BAD_COUNTS)
def test_retriever_similarity_top_k_is_checked(make_ensemble: Any, k: Any) -> None:
    with pytest.raises(ValidationError, match="similarity_top_k must be a positive integer"):
        FeedbackEnsembleRetriever(make_ensemble(), similarity_top_k=k)
    with pytest.raises(ValidationError, match="similarity_top_k must be a positive integer"):
        FeedbackEnsembleRetriever.from_defaults(nodes=_nodes(), retrievers=("bm25",), similarity_top_k=k)


@pytest.mark.parametrize("explore", BAD_FLAGS)
def test_retriever_explore_must_be_a_bool(make_ensemble: Any, explore: Any) -> None:
    with pytest.raises(ValidationError, match="explore must be True or False"):
        FeedbackEnsembleRetriever(make_ensemble(), explore=explore)
    with pytest.raises(ValidationError, match="explore must be True or False"):
        FeedbackEnsembleRetriever.from_defaults(nodes=_nodes(), retrievers=("bm25",), explore=explore)


def test_retriever_takes_numpy_integers() -> None:
    r = FeedbackEnsembleRetriever.from_defaults(nodes=_nodes(), retrievers=("bm25",),  # numpy values on purpose
                                                similarity_top_k=np.int64(1), explore=np.bool_(True))  # type: ignore[arg-type]
    assert type(r.similarity_top_k) is int and r.explore is True
    assert [n.node.node_id for n in r.retrieve("what causes aurora")] == ["a"]


def test_feedback_with_a_misspelt_argument_names_the_closest_one() -> None:
    # was a bare ValidationError: neither the TypeError a misspelt keyword is elsewhere nor the closest name
    from rlfb import UnknownOptionError

    pp = FeedbackFusionPostprocessor(retrievers=("bm25",), top_n=1, nodes=_nodes())
    [out] = pp.postprocess_nodes([NodeWithScore(node=n) for n in _nodes()], query_str="moon tides")
    with FeedbackEventHandler(store=pp.store, ensemble=pp.ensemble) as handler:
        _Fixed([0.5]).retrieve("moon tides")
        for give in (lambda: pp.feedback(out.node.metadata[EVENT_ID_KEY], "thumbs_up", idempotency_ky="k"),
                     lambda: handler.record_feedback(score=1.0, idempotency_ky="k")):
            with pytest.raises(UnknownOptionError, match=r"'idempotency_ky' \(did you mean 'idempotency_key'\?\)"):
                give()
    assert pp.store.counts()["feedback"] == 0


# ---------------------------------------------------------------------------------- FeedbackEventHandler
class _Fixed(BaseRetriever):
    """Returns fixed nodes; their scores are assigned after construction, as a postprocessor may."""

    def __init__(self, scores: list[Any]) -> None:
        super().__init__()
        self.scores = scores

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        out = [NodeWithScore(node=n, score=0.0) for n in _nodes()[: len(self.scores)]]
        for n, s in zip(out, self.scores, strict=True):
            n.score = s  # NodeWithScore does not validate assignment
        return out


@pytest.mark.parametrize("session", ["", 1.5, object()])
def test_handler_logs_a_retrieval_whose_session_tag_cannot_be_one(session: Any) -> None:
    with FeedbackEventHandler(store=FeedbackStore()) as handler:
        with instrument_tags({"session_id": session}), pytest.warns(UserWarning, match="session_id"):
            _Fixed([0.5]).retrieve("moon tides")
        [event] = handler.retrievals()
        assert event["session_id"] is None and [c["chunk_id"] for c in event["chunks"]] == ["a"]
        assert handler.record_feedback(score=1.0)[0].event_id == event["id"]


def test_handler_keeps_an_int_session_tag_as_text() -> None:
    with FeedbackEventHandler(store=FeedbackStore()) as handler:
        with instrument_tags({"session_id": 7}):
            _Fixed([0.5]).retrieve("moon tides")
        assert handler.retrievals()[0]["session_id"] == "7"


def test_handler_logs_a_score_beyond_float_range_as_no_score() -> None:
    with FeedbackEventHandler(store=FeedbackStore()) as handler:
        _Fixed([0.75, 10**400, float("nan")]).retrieve("moon tides")
        [event] = handler.retrievals()
        assert [(c["chunk_id"], c["score"]) for c in event["chunks"]] == [("a", 0.75), ("b", None), ("c", None)]


def test_an_ensemble_without_a_store_is_refused_beside_a_handlers_own_store() -> None:
    # taken, feedback on its retrievals was stored in the handler's store and taught the ensemble nothing
    from llamaindex_rlfb import FeedbackEventHandler
    from rlfb import FeedbackEnsemble
    from rlfb.store import FeedbackStore

    no_store = FeedbackEnsemble.from_texts(["tides follow the moon", "the aurora glows"], retrievers=("bm25",))
    with pytest.raises(NoStoreError, match="the ensemble has no feedback store"):
        FeedbackEventHandler(FeedbackStore(), ensemble=no_store)
