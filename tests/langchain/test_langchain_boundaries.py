"""Boundary inputs of the LangChain adapter: run data that cannot be used is dropped, options are strict.

LangChain only prints a callback's exception, so the handler must log what it
can rather than raise; options a user passes raise rlfb's ValidationError
(never pydantic's, never read loosely as ``bool("no")``).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
import pydantic
import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig

from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever
from rlfb import ValidationError
from rlfb.store import FeedbackStore

from _lc_corpus import IDS, TEXTS


class Fixed(BaseRetriever):
    """Returns the documents it was given, whatever the query."""

    docs: list[Document]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self.docs


def _docs(*scores: Any) -> list[Document]:
    return [Document(page_content=f"text {i}", id=f"d{i}", metadata={"score": s}) for i, s in enumerate(scores)]


def _retrieve(handler: FeedbackCallbackHandler, docs: list[Document], metadata: dict[str, Any] | None = None) -> str:
    run_id = uuid.uuid4()
    Fixed(docs=docs).invoke("a query", config={"callbacks": [handler], "metadata": metadata or {}}, run_id=run_id)
    return str(run_id)


@pytest.fixture
def handler() -> FeedbackCallbackHandler:
    h = FeedbackCallbackHandler(FeedbackStore())
    h.raise_error = True  # a callback error would fail the test instead of being printed and swallowed
    return h


@pytest.mark.parametrize("session", ["", 1.5, True, object(), ["s"]])
def test_an_unusable_session_id_is_dropped_and_the_retrieval_logged(handler: Any, session: Any) -> None:
    with pytest.warns(UserWarning, match="session_id"):
        rid = _retrieve(handler, _docs(0.5), {"session_id": session})
    event = handler.store.event(rid)
    assert event["session_id"] is None and [c["chunk_id"] for c in event["chunks"]] == ["d0"]
    (record,) = handler.record_feedback(rid, score=1.0)  # feedback finds it (was UnknownEventError)
    assert record.event_id == rid


@pytest.mark.parametrize(("session", "stored"), [("s-1", "s-1"), (7, "7"), (np.int64(7), "7"),
                                                 (uuid.UUID(int=1), str(uuid.UUID(int=1)))])
def test_a_str_int_or_uuid_session_id_is_kept(handler: Any, session: Any, stored: str) -> None:
    rid = _retrieve(handler, _docs(0.5), {"session_id": session})
    assert handler.store.event(rid)["session_id"] == stored


@pytest.mark.parametrize("bad", [10**400, -(10**400), float("nan"), float("inf"), "0.9", True])
def test_an_unusable_document_score_is_logged_as_no_score(handler: Any, bad: Any) -> None:
    with pytest.warns(UserWarning, match="scores of 1 documents"):
        rid = _retrieve(handler, _docs(0.75, bad, None))
    chunks = handler.store.event(rid)["chunks"]
    assert [(c["chunk_id"], c["score"]) for c in chunks] == [("d0", 0.75), ("d1", None), ("d2", None)]
    assert handler.record_feedback(rid, score=0.0)[0].event_id == rid


def test_usable_scores_and_sessions_log_without_a_warning(handler: Any, recwarn: Any) -> None:
    rid = _retrieve(handler, _docs(1, np.float32(0.5), None, 10**30), {"session_id": "s"})
    assert [c["score"] for c in handler.store.event(rid)["chunks"]] == [1.0, 0.5, None, 1e30]
    assert not [w for w in recwarn if "rlfb" in str(w.message)]


@pytest.mark.parametrize("store", [5, 1.5, object(), ["fb.db"]])
def test_handler_store_must_be_a_path_or_a_store(store: Any) -> None:
    with pytest.raises(ValidationError, match="store must be a FeedbackStore or a path"):
        FeedbackCallbackHandler(store)


def test_handler_observe_followups_must_be_a_bool() -> None:
    with pytest.raises(ValidationError, match="observe_followups"):
        FeedbackCallbackHandler(FeedbackStore(), observe_followups="no")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- the retriever's options
def _from_texts(**kwargs: Any) -> FeedbackEnsembleRetriever:
    return FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=FeedbackStore(),
                                                **kwargs)


@pytest.fixture(scope="module")
def retriever() -> FeedbackEnsembleRetriever:
    return _from_texts(k=2)


@pytest.mark.parametrize("k", [0, -1, 2.0, True, "2", None])
def test_construction_k_raises_rlfbs_validation_error(k: Any) -> None:
    with pytest.raises(ValidationError, match="k must be a positive integer") as err:
        _from_texts(k=k)
    assert not isinstance(err.value, pydantic.ValidationError)


@pytest.mark.parametrize("k", [0, 2.0, True])
def test_every_constructor_checks_k(retriever: Any, k: Any) -> None:
    with pytest.raises(ValidationError, match="k must be"):
        FeedbackEnsembleRetriever(ensemble=retriever.ensemble, k=k)
    with pytest.raises(ValidationError, match="k must be"):
        FeedbackEnsembleRetriever.from_ensemble(retriever.ensemble, k=k)
    with pytest.raises(ValidationError, match="k must be"):
        FeedbackEnsembleRetriever.from_documents([Document("x", id="x")], retrievers=("bm25",), k=k)


@pytest.mark.parametrize("explore", ["no", "false", 0, 1, None])
def test_explore_must_be_a_bool(retriever: Any, explore: Any) -> None:
    with pytest.raises(ValidationError, match="explore must be True or False"):
        _from_texts(explore=explore)
    with pytest.raises(ValidationError, match="explore must be True or False"):
        FeedbackEnsembleRetriever(ensemble=retriever.ensemble, explore=explore)
    if explore is not None:  # None per call means "the retriever's own"
        with pytest.raises(ValidationError, match="explore must be True or False"):
            retriever.invoke("moon tides", explore=explore)


def test_a_misspelt_option_of_a_call_is_a_named_error(retriever: Any) -> None:
    # invoke passes its keyword arguments to _get_relevant_documents: a typo was a bare TypeError from inside
    # langchain_core
    with pytest.raises(ValidationError, match=r"takes no option 'explor' \(did you mean 'explore'\?\)"):
        retriever.invoke("moon tides", explor=False)
    with pytest.raises(ValidationError, match=r"takes no option 'lgo' \(did you mean 'log'\?\)"):
        asyncio.run(retriever.ainvoke("moon tides", lgo=False))
    assert retriever.invoke("moon tides", k=1, explore=False, log=False)
    assert retriever.invoke("moon tides", verbose=True)  # BaseRetriever.invoke reads it and passes it on too


def test_observe_followups_and_session_id_fields_are_checked(retriever: Any) -> None:
    with pytest.raises(ValidationError, match="observe_followups"):
        FeedbackEnsembleRetriever(ensemble=retriever.ensemble, observe_followups="yes")
    with pytest.raises(ValidationError, match="session_id"):
        FeedbackEnsembleRetriever(ensemble=retriever.ensemble, session_id="")


def test_numpy_integers_and_bools_are_accepted(retriever: Any) -> None:
    r = FeedbackEnsembleRetriever.from_ensemble(
        retriever.ensemble, k=np.int64(3), explore=np.bool_(False))  # type: ignore[arg-type]
    assert type(r.k) is int and r.k == 3 and r.explore is False
    assert len(r.invoke("moon tides", k=np.int32(1))) == 1
    assert len(r.invoke("moon tides", explore=np.bool_(True))) == 3
    with pytest.raises(ValidationError, match="k must be"):
        r.invoke("moon tides", k=1.0)


def test_run_metadata_session_that_cannot_be_one_is_dropped(retriever: Any) -> None:
    with pytest.warns(UserWarning, match="session_id"):
        (doc, *_) = retriever.invoke("moon tides", config={"metadata": {"session_id": ""}})
    assert retriever.ensemble.store.event(doc.metadata["event_id"])["session_id"] is None
    (doc, *_) = retriever.invoke("moon tides", config={"metadata": {"session_id": 42}})
    assert retriever.ensemble.store.event(doc.metadata["event_id"])["session_id"] == "42"


def test_feedback_errors_name_the_arguments_the_caller_gave(handler: Any) -> None:
    run_id = _retrieve(handler, _docs(0.9, 0.5))
    before = handler.store.counts()
    for kwargs, message in (({"score": 1.0, "rating": 4}, "give score= or rating=, not both"),  # named value= before
                            ({"value": float("nan")}, "^value must be finite"),  # "score must be finite" before
                            ({"rating": 9}, r"^rating must lie in \[1, 5\]")):  # "feedback item 0: ..." before
        with pytest.raises(ValidationError, match=message):
            handler.record_feedback(run_id, **kwargs)
    assert handler.store.counts() == before


def test_from_ensemble_takes_the_retriever_too() -> None:
    retriever = FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=FeedbackStore())
    handler = FeedbackCallbackHandler.from_ensemble(retriever)  # a raw AttributeError before
    assert handler.ensemble is retriever.ensemble and handler.store is retriever.ensemble.store
    with pytest.raises(ValidationError, match="FeedbackEnsemble"):
        FeedbackCallbackHandler.from_ensemble(object())


def test_a_misspelt_ensemble_option_is_a_named_error_before_indexing(monkeypatch) -> None:
    from langchain_community.retrievers import BM25Retriever as LCBM25

    from rlfb.retrievers import BM25Retriever

    indexed: list[int] = []
    monkeypatch.setattr(BM25Retriever, "index", lambda self, *a, **k: indexed.append(1))
    with pytest.raises(ValidationError, match="takes no option 'explor'"):
        FeedbackEnsembleRetriever.from_texts(TEXTS, retrievers=("bm25",), explor=False)
    with pytest.raises(ValidationError, match="takes no option 'explor'"):
        FeedbackEnsembleRetriever.from_documents([Document(page_content=t) for t in TEXTS], retrievers=("bm25",),
                                                 explor=False)
    assert indexed == []
    with pytest.raises(ValidationError, match="did you mean 'policy'"):
        FeedbackEnsembleRetriever.from_retrievers({"kw": LCBM25.from_texts(TEXTS)}, polciy="thompson")
    # a list of retrievers for the mapping said "a member needs a non-empty name"
    with pytest.raises(ValidationError, match="must map a name to each retriever.*unnamed BM25Retriever"):
        FeedbackEnsembleRetriever.from_retrievers([LCBM25.from_texts(TEXTS)])
    named = LCBM25.from_texts(TEXTS)
    named.name = "kw"  # a sequence of named ones is taken, by their names
    by_name = FeedbackEnsembleRetriever.from_retrievers([named])
    assert [m.name for m in by_name.ensemble.members] == ["kw"]


def test_a_retriever_is_shared_shallowly_and_refuses_a_deep_copy_by_name() -> None:
    import copy

    from rlfb import NotCopyableError

    retriever = FeedbackEnsembleRetriever.from_texts(TEXTS, retrievers=("bm25",), k=2)
    assert retriever.model_copy(update={"k": 3}).ensemble is retriever.ensemble  # with_config-style copies share
    with pytest.raises(NotCopyableError, match="live learner"):
        copy.deepcopy(retriever)


@pytest.mark.parametrize("made", ["from_ensemble", "from_store"])
def test_a_callback_handler_refuses_a_pickle_by_name_and_a_deep_copy_is_itself(made: str) -> None:
    # a bare "TypeError: cannot pickle '_thread.lock' object", where the README promises NotCopyableError; and
    # copy.deepcopy of a config holding the handler raised, where LangChain's tracers give themselves
    import copy
    import pickle

    from rlfb import NotCopyableError

    retriever = FeedbackEnsembleRetriever.from_texts(TEXTS, retrievers=("bm25",), store=FeedbackStore(), k=2)
    handler = (FeedbackCallbackHandler.from_ensemble(retriever) if made == "from_ensemble"
               else FeedbackCallbackHandler(retriever.ensemble.store))
    with pytest.raises(NotCopyableError, match="FeedbackCallbackHandler cannot be pickled"):
        pickle.dumps(handler)
    config = copy.deepcopy(RunnableConfig(callbacks=[handler], metadata={"session_id": "s"}))
    assert isinstance(config["callbacks"], list) and config["callbacks"][0] is handler
    run_id = uuid.uuid4()
    retriever.invoke("tides", config=config, run_id=run_id)
    assert handler.record_feedback(run_id, score=1.0)
    assert copy.copy(handler).store is handler.store  # a shallow copy shares it, as before


@pytest.mark.parametrize(("returned", "named"), [(["a"], "str"), (None, "NoneType"), ([None], "NoneType")])
def test_a_member_returning_no_documents_is_named(returned: Any, named: str) -> None:
    # a bare AttributeError ('str' object has no attribute 'metadata') or TypeError, naming no member
    from langchain_core.runnables import RunnableLambda

    retriever = FeedbackEnsembleRetriever.from_retrievers({"notes": RunnableLambda(lambda q: returned)})
    with pytest.raises(ValidationError, match=f"member 'notes' returned a {named}"):
        retriever.invoke("tides")


def test_fields_set_after_construction_are_checked_as_the_constructor_checks_them(tmp_path) -> None:
    # pydantic checks no assignment: k = "2" failed at the next invoke, observe_followups = "no" was read as
    # true, and session_id = uuid4(), which the constructor takes, failed every later invoke
    retriever = FeedbackEnsembleRetriever.from_texts(TEXTS, retrievers=("bm25",), k=2,
                                                     store=str(tmp_path / "f.db"))
    for field, value in (("k", "2"), ("explore", "no"), ("log", 1.5), ("observe_followups", "no"),
                         ("session_id", "")):
        with pytest.raises(ValidationError, match=field):
            setattr(retriever, field, value)
    assert (retriever.k, retriever.explore, retriever.log, retriever.observe_followups) == (2, True, True, True)
    session = uuid.uuid4()
    retriever.session_id = session  # type: ignore[assignment]
    assert retriever.session_id == str(session)
    docs = retriever.invoke("tides")
    assert len(docs) == 2 and retriever.ensemble.store.event(docs[0].metadata["event_id"])["session_id"] == str(session)
    retriever.session_id = None
    assert retriever.session_id is None


def test_feedback_on_a_run_id_given_in_a_retrievers_config_says_how_to_give_it(tmp_path) -> None:
    # LangChain's BaseRetriever takes its run id from the keyword only: the error says so
    from rlfb import UnknownEventError

    retriever = FeedbackEnsembleRetriever.from_texts(TEXTS, retrievers=("bm25",), store=str(tmp_path / "f.db"))
    given = uuid.uuid4()
    retriever.invoke("tides", config={"run_id": given})
    with pytest.raises(UnknownEventError, match=r"invoke\(query, run_id=\.\.\.\)"):
        retriever.feedback(given, "thumbs_up")
    retriever.invoke("tides", run_id=given)
    (record,) = retriever.feedback(given, "thumbs_up")
    assert record.event_id == str(given)


def test_feedback_with_an_unknown_argument_names_it(tmp_path) -> None:
    # a TypeError named record_run_feedback(), a function the caller never called; then a bare ValidationError,
    # neither the TypeError a misspelt keyword is elsewhere nor an UnknownOptionError with the closest name
    from rlfb import UnknownOptionError

    retriever = FeedbackEnsembleRetriever.from_texts(TEXTS, retrievers=("bm25",), store=str(tmp_path / "f.db"))
    run_id = uuid.uuid4()
    retriever.invoke("tides", run_id=run_id)
    handler = FeedbackCallbackHandler.from_ensemble(retriever)
    for give in (lambda: retriever.feedback(run_id, "thumbs_up", usr_id="u1"),
                 lambda: handler.record_feedback(run_id, score=1.0, usr_id="u1")):
        with pytest.raises(UnknownOptionError, match=r"no argument 'usr_id' \(did you mean 'user_id'\?\)") as info:
            give()
        assert isinstance(info.value, TypeError)
    assert retriever.ensemble.store.counts()["feedback"] == 0


def test_a_vector_store_without_relevance_scores_says_it_is_fused_by_rank() -> None:
    # LangChain's own InMemoryVectorStore has scores but no relevance-score function: "auto" fused it by rank
    # and said nothing
    import warnings

    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_rlfb import as_member

    vs = InMemoryVectorStore(DeterministicFakeEmbedding(size=32))
    vs.add_documents([Document(page_content=t, id=f"d{i}") for i, t in enumerate(["aurora sun", "tides", "lava"])])
    member = as_member("vs", vs.as_retriever())
    with pytest.warns(UserWarning, match="fused by rank.*scores='similarity'"):
        by_rank = [s for _, s in member.search("aurora", 3)]
    assert by_rank == pytest.approx([1 / 61, 1 / 62, 1 / 63])  # reciprocal ranks
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once a member
        member.search("tides", 3)
    scored = [s for _, s in as_member("vs", vs, scores="similarity").search("aurora", 3)]
    assert scored != pytest.approx(by_rank) and scored == sorted(scored, reverse=True)
