"""FeedbackEnsembleRetriever: scored Documents, k per call, run id = event id, members, async, errors."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from langchain_community.retrievers import BM25Retriever
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore
from typing_extensions import assert_type

import langchain_rlfb
from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever, as_member, document_to_chunk
from rlfb import (
    DuplicateIdError,
    FeedbackEnsemble,
    NoStoreError,
    UnknownEventError,
    UnknownOptionError,
    UnknownSignalError,
    ValidationError,
)
from rlfb.members import SearchMember
from rlfb.runs import content_id
from rlfb.store import FeedbackRecord, FeedbackStore
from rlfb.types import Chunk

from _lc_corpus import IDS, TEXTS
from _threads import Gate


def test_all_is_explicit() -> None:
    expected = [
        "FeedbackEnsembleRetriever",
        "FeedbackCallbackHandler",
        "METADATA_KEYS",
        "as_member",
        "document_to_chunk",
        "hit_to_document",
    ]
    assert sorted(expected) == sorted(langchain_rlfb.__all__)
    for name in langchain_rlfb.__all__:
        assert getattr(langchain_rlfb, name) is not None


def test_is_a_langchain_retriever_overriding_only_the_two_hooks() -> None:
    assert issubclass(FeedbackEnsembleRetriever, BaseRetriever)
    own = {n for n in vars(FeedbackEnsembleRetriever) if n in vars(BaseRetriever)}
    assert {"_get_relevant_documents", "_aget_relevant_documents"} <= own
    assert not own & {"invoke", "ainvoke", "batch", "abatch", "stream", "astream"}


def test_documents_carry_chunk_id_scores_rank_and_event_id(make_ensemble: Any) -> None:
    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=3)
    run_id = uuid.uuid4()
    docs = retriever.invoke("what causes the aurora borealis", run_id=run_id)
    assert [d.metadata["rank"] for d in docs] == [1, 2, 3]
    assert docs[0].id == docs[0].metadata["chunk_id"] == "doc0"
    assert docs[0].page_content == TEXTS[0]
    fused = [d.metadata["score"] for d in docs]
    assert fused == sorted(fused, reverse=True)
    for d in docs:
        assert set(langchain_rlfb.METADATA_KEYS) <= set(d.metadata)
        assert set(d.metadata["scores"]) == {"bm25", "dense"}
        assert d.metadata["event_id"] == str(run_id)  # LangChain's run id is the event id
    event = ens.store.event(str(run_id))
    assert [c["chunk_id"] for c in event["chunks"]] == [d.id for d in docs]
    assert event["metadata"]["framework"] == "langchain"


def test_k_in_constructor_and_per_call_and_explore_flag(make_ensemble: Any) -> None:
    retriever = FeedbackEnsembleRetriever(ensemble=make_ensemble(), k=2)
    assert len(retriever.invoke("tides and the moon")) == 2
    assert len(retriever.invoke("tides and the moon", k=5)) == 5
    greedy = retriever.invoke("tides and the moon", k=4, explore=False)
    assert greedy[0].id in {"doc2", "doc9"}
    with pytest.raises(ValidationError):
        retriever.invoke("tides", k=0)
    with pytest.raises(TypeError, match="takes no option 'top_k'") as info:
        retriever.invoke("tides", top_k=3)  # a typo is an error, not silently ignored
    assert isinstance(info.value, UnknownOptionError) and isinstance(info.value, ValidationError)  # named now
    with pytest.raises(ValueError):
        FeedbackEnsembleRetriever(ensemble=make_ensemble(), k=0)


def test_log_false_evaluates_without_writing_to_the_store(tmp_path: Any, make_ensemble: Any) -> None:
    ens = make_ensemble(store=str(tmp_path / "fb.db"))
    retriever = FeedbackEnsembleRetriever(ensemble=ens, k=4, session_id="s1")
    want = [d.id for d in retriever.invoke("tides and the moon", explore=False)]
    before = ens.store.counts()
    got = retriever.invoke("tides and the moon", explore=False, log=False)  # per call
    assert [d.id for d in got] == want
    assert all(d.metadata["event_id"] is None for d in got)
    quiet = FeedbackEnsembleRetriever.from_ensemble(ens, k=4, log=False, explore=False, session_id="s1")
    assert asyncio.run(quiet.ainvoke("a restated query about tides and the moon"))  # no follow-up observed
    assert ens.store.counts() == before  # nothing written, not even a reformulation
    assert quiet.invoke("tides and the moon", log=True)[0].metadata["event_id"] is not None
    with pytest.raises(ValidationError, match="log"):
        retriever.invoke("tides", log="no")
    with pytest.raises(ValidationError, match="log"):  # checked also where nothing would be logged
        FeedbackEnsembleRetriever(ensemble=make_ensemble(store=None)).invoke("tides", log="no")
    with pytest.raises(ValidationError, match="log"):
        FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), log="no")  # type: ignore[arg-type]


def test_from_texts_and_from_documents(tmp_path: Any) -> None:
    r = FeedbackEnsembleRetriever.from_texts(
        TEXTS, ids=IDS, metadatas=[{"n": i} for i in range(len(TEXTS))], retrievers=("bm25",),
        store=str(tmp_path / "fb.db"), k=2,
    )
    docs = r.invoke("molten magma volcano")
    assert docs[0].id == "doc3" and docs[0].metadata["n"] == 3
    assert r.weights == {"bm25": 1.0}
    assert FeedbackStore(tmp_path / "fb.db").has_event(docs[0].metadata["event_id"])
    assert r.ensemble.learner.policy_name == "thompson"  # a drop-in retriever whose weights learn by default

    documents = [Document(page_content=t, id=i, metadata={"source": "kb"}) for t, i in zip(TEXTS, IDS, strict=True)]
    r2 = FeedbackEnsembleRetriever.from_documents(documents, retrievers=("bm25",), k=1)
    (doc,) = r2.invoke("titanium bolt XK-4471")
    assert doc.id == "doc4" and doc.metadata["source"] == "kb"
    assert doc.metadata["event_id"] is None  # no store: nothing logged
    assert r2.ensemble.learner.policy_name == "thompson"
    with pytest.raises(NoStoreError, match="the ensemble has no feedback store; build it with store="):
        r2.feedback("run-1", "thumbs_up")
    fixed = FeedbackEnsembleRetriever.from_documents(documents, retrievers=("bm25",), policy="fixed")
    assert fixed.ensemble.learner.policy_name == "fixed"


def test_default_retrievers_are_what_the_langchain_extra_installs_and_llamaindex_uses() -> None:
    # bm25 + dense + SPLADE before: the splade model is not in rlfb[langchain,dense], and a store learned
    # with three retrievers was not shared with the LlamaIndex adapter's bm25 + dense
    r = FeedbackEnsembleRetriever.from_texts(TEXTS[:3])
    assert r.ensemble.retriever_names == ("bm25", "dense")
    docs = [Document(page_content=t, id=i) for t, i in zip(TEXTS[:3], IDS[:3], strict=True)]
    assert FeedbackEnsembleRetriever.from_documents(docs).ensemble.retriever_names == ("bm25", "dense")


def test_from_documents_indexes_identical_id_less_documents_once() -> None:
    footer = "Copyright 2024 ACME, all rights reserved"
    documents = [
        Document(page_content=footer, metadata={"source": "a.pdf"}),
        Document(page_content=TEXTS[0], metadata={"source": "a.pdf"}),
        Document(page_content=footer, metadata={"source": "b.pdf"}),
    ]
    r = FeedbackEnsembleRetriever.from_documents(documents, retrievers=("bm25",), k=3)
    assert len(r.ensemble.chunks) == 2
    docs = r.invoke("copyright ACME")
    assert [d.metadata["source"] for d in docs if d.page_content == footer] == ["a.pdf"]  # the first kept
    # an id the user gave twice is an error naming both documents, not a silent drop
    twice = [Document(page_content="x", id="p1"), Document(page_content="y"), Document(page_content="z", id="p1")]
    with pytest.raises(DuplicateIdError, match="documents 0 and 2 both have the id 'p1'"):
        FeedbackEnsembleRetriever.from_documents(twice, retrievers=("bm25",))
    with pytest.raises(ValidationError, match=r"documents\[1\]: expected a LangChain Document"):
        FeedbackEnsembleRetriever.from_documents([documents[0], "text"], retrievers=("bm25",))  # type: ignore[list-item]


def test_document_to_chunk_ids() -> None:
    assert document_to_chunk(Document(page_content="a", id="x")).id == "x"
    assert document_to_chunk(Document(page_content="a", metadata={"chunk_id": "y"})).id == "y"
    # a loader's page id, shared by every chunk split from the page, is not a chunk id
    assert document_to_chunk(Document(page_content="a", metadata={"id": 7})).id == content_id("a")
    h1 = document_to_chunk(Document(page_content="same text")).id
    assert h1 == document_to_chunk(Document(page_content="same text")).id
    assert h1 != document_to_chunk(Document(page_content="other text")).id


def test_chunks_split_from_one_page_stay_apart(tmp_path: Any) -> None:
    # what a splitter gives for a Notion or Confluence page: every chunk carries the page's metadata["id"]
    page = [Document(page_content=t, metadata={"id": "page-1", "source": "notion"}) for t in TEXTS[:3]]
    retriever = FeedbackEnsembleRetriever.from_documents(page, retrievers=("bm25",), store=tmp_path / "fb.db", k=3)
    assert len(retriever.ensemble) == 3
    docs = retriever.invoke(TEXTS[1])
    assert docs[0].page_content == TEXTS[1] and docs[0].metadata["id"] == "page-1"
    assert len({d.id for d in docs}) == 3


def test_feedback_by_run_id_learns_and_weights_are_exposed(make_ensemble: Any) -> None:
    ens = make_ensemble(policy="gradient")
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=3)
    assert retriever.weights == {"bm25": 0.5, "dense": 0.5}
    docs = retriever.invoke("northern lights")
    (record,) = assert_type(  # typed: a typed app checks what it reads from the record
        retriever.feedback(docs[0].metadata["event_id"], score=1.0, key="user_score", comment="good"),
        list[FeedbackRecord],
    )
    assert record.value == 1.0 and record.reward > 0
    (record,) = retriever.feedback(docs[0].metadata["event_id"], "click", chunk_id=docs[1].id)
    assert set(record.chunk_rewards) == {docs[1].id}
    assert ens.store.load_policy_state() is not None  # the learner took the episode and saved its state
    rows = ens.store.feedback(docs[0].metadata["event_id"])
    assert rows[0]["key"] == "user_score" and rows[0]["comment"] == "good"
    with pytest.raises(UnknownEventError, match="no retrieval was logged under run id"):
        retriever.feedback(str(uuid.uuid4()), "thumbs_up")
    with pytest.raises(ValidationError):
        no_store = FeedbackEnsemble(ens.retrievers, ens.chunks)
        FeedbackEnsembleRetriever.from_ensemble(no_store).feedback("x", "like")


def test_session_followup_is_a_reformulation(make_ensemble: Any) -> None:
    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    config: RunnableConfig = {"metadata": {"session_id": "s1"}}
    first = retriever.invoke("what causes the aurora borealis", config=config)
    retriever.invoke("what really causes the aurora borealis lights", config=config)  # restated
    retriever.invoke("price of titanium bolts", config=config)  # a new topic: no signal
    first_id = first[0].metadata["event_id"]
    assert [f["signal"] for f in ens.store.feedback(first_id)] == ["reformulation"]
    assert ens.store.event(first_id)["session_id"] == "s1"
    assert sum(len(ens.store.feedback(e["id"])) for e in ens.store.events_for_session("s1")) == 1
    # the field gives the session when the run's metadata has none
    r2 = FeedbackEnsembleRetriever.from_ensemble(ens, k=1, session_id="s2")
    r2.invoke("glaciers carve valleys")
    assert ens.store.last_event("s2") is not None


def test_a_retrieval_that_fails_or_is_refused_records_no_reformulation(tmp_path: Any) -> None:
    # the follow-up was observed before the search: a member that timed out, or a run id given twice, left a
    # reformulation stored and learned on the session's previous retrieval, which the handler's path did not
    from langchain_core.runnables import RunnableLambda

    from rlfb import DuplicateEventError

    failing = {"on": False}

    def search(query: str) -> list[Document]:
        if failing["on"]:
            raise TimeoutError("vector DB timed out")
        return [Document(page_content=TEXTS[0], id=IDS[0])]

    retriever = FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), k=2,
                                                     members={"remote": RunnableLambda(search)},
                                                     store=str(tmp_path / "fb.db"))
    config: RunnableConfig = {"metadata": {"session_id": "s1"}}
    first = retriever.invoke("what causes the aurora borealis", config=config)[0].metadata["event_id"]
    failing["on"] = True
    with pytest.raises(TimeoutError):
        retriever.invoke("what really causes the aurora borealis lights", config=config)
    failing["on"] = False
    with pytest.raises(DuplicateEventError):
        retriever.invoke("what really causes the aurora borealis lights", config=config, run_id=uuid.UUID(first))
    store = retriever.ensemble.store
    assert store.feedback(first) == [] and store.counts()["events"] == 1
    retriever.invoke("what really causes the aurora borealis lights", config=config)  # now it is one
    assert [f["signal"] for f in store.feedback(first)] == ["reformulation"]


async def test_a_member_with_only_an_async_search_works_under_ainvoke() -> None:
    # ainvoke ran the whole ensemble in a thread, calling each member's sync invoke: a member whose search is a
    # coroutine (an async HTTP client) raised "Cannot invoke a coroutine function synchronously"
    from langchain_core.runnables import RunnableLambda

    running = 0
    together = 0

    async def remote(query: str) -> list[Document]:
        nonlocal running, together
        running += 1
        await asyncio.sleep(0.01)
        together = max(together, running)  # both members searched side by side, as EnsembleRetriever does
        running -= 1
        return [Document(page_content=TEXTS[0], id=IDS[0]), Document(page_content=TEXTS[1], id=IDS[1])]

    retriever = FeedbackEnsembleRetriever.from_retrievers(
        {"a": RunnableLambda(remote), "b": RunnableLambda(remote)}, k=2, explore=False)
    docs = await retriever.ainvoke("aurora")
    assert [d.id for d in docs] == [IDS[0], IDS[1]] and docs[0].metadata["proposed_by"] == ["a", "b"]
    assert together == 2
    with pytest.raises(TypeError, match="ainvoke"):
        retriever.invoke("aurora")  # the sync path calls invoke, as LangChain would


async def test_ainvoke_checks_its_arguments_before_searching_and_a_failing_member_stops_the_others() -> None:
    # ainvoke searched the members and then refused k=0; and a member that raised left the others running, to
    # end after the ensemble's run had ended
    from langchain_core.runnables import RunnableLambda

    calls: list[str] = []

    async def slow(query: str) -> list[Document]:
        calls.append("slow started")
        try:
            await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # winding down takes a while: ainvoke waits for it
            calls.append("slow cancelled")
            raise
        calls.append("slow ended")
        return [Document(page_content=TEXTS[0], id=IDS[0])]

    async def down(query: str) -> list[Document]:
        await asyncio.sleep(0.01)
        raise RuntimeError("member down")

    retriever = FeedbackEnsembleRetriever.from_retrievers(
        {"slow": RunnableLambda(slow), "down": RunnableLambda(down)}, store=FeedbackStore(), explore=False)
    for bad in ({"k": 0}, {"explore": "maybe"}):
        with pytest.raises(ValidationError):
            await retriever.ainvoke("aurora", **bad)
    assert calls == []
    with pytest.raises(RuntimeError, match="member down"):
        await retriever.ainvoke("aurora")
    assert calls == ["slow started", "slow cancelled"]  # ended before the error reached the caller
    await asyncio.sleep(0.6)
    assert calls == ["slow started", "slow cancelled"] and retriever.ensemble.store.counts()["events"] == 0


async def test_an_rlfb_retriever_called_inside_an_ainvoke_searches_its_own_members() -> None:
    # the documents ainvoke fetched were found by member name: an rlfb retriever called by a member, in the
    # worker thread, took the outer member of the same name's documents (for the outer query) as its own
    from langchain_core.runnables import RunnableLambda

    def web(tag: str) -> RunnableLambda:
        return RunnableLambda(lambda q: [Document(page_content=f"{tag} result for {q}", id=f"{tag}:{q}")])

    inner = FeedbackEnsembleRetriever.from_retrievers({"web": web("inner")}, k=1, explore=False)
    seen: list[str] = []

    def via_inner(query: str, k: int) -> list[tuple[Chunk, None]]:  # a plain search, run in ainvoke's thread
        docs = inner.invoke(f"{query} details")
        seen.extend(d.page_content for d in docs)
        return [(document_to_chunk(d), None) for d in docs]

    outer = FeedbackEnsembleRetriever.from_retrievers(
        {"web": web("outer"), "sub": SearchMember("sub", via_inner)}, k=2, explore=False)
    await outer.ainvoke("aurora")
    assert seen == ["inner result for aurora details"]


def test_restated_retrievals_inside_one_run_are_not_reformulations(make_ensemble: Any) -> None:
    # a multi-query retriever asks variants of one question in one run: each variant used to record an
    # implicit negative on the one before, as though the user had restated a failed question
    from langchain_core.runnables import RunnableLambda

    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    external = BM25Retriever.from_texts(TEXTS, ids=IDS, k=2)

    def variants(question: str, config: Any) -> list:
        return [*retriever.invoke(question, config=config),
                *retriever.invoke("what really causes the aurora borealis lights", config=config),
                *external.invoke("what truly causes aurora borealis lights", config=config)]  # the handler logs it

    session: RunnableConfig = {"metadata": {"session_id": "mq"}, "callbacks": [handler]}
    RunnableLambda(variants).invoke("what causes the aurora borealis", config=session)
    events = ens.store.events_for_session("mq")
    assert len(events) == 3 and not any(ens.store.feedback(e["id"]) for e in events)
    # the user restating the question in a new run is a follow-up, as before
    retriever.invoke("what is it that causes the aurora borealis", config={"metadata": {"session_id": "mq"}})
    assert [f["signal"] for f in ens.store.feedback(events[-1]["id"])] == ["reformulation"]


@pytest.mark.parametrize("own_retriever", [True, False], ids=["ensemble-retriever", "handler-logged"])
def test_an_agent_calling_its_retriever_tool_again_is_not_a_reformulation(
    make_ensemble: Any, own_retriever: bool
) -> None:
    # An agent's tool call sits under a tool run of its own, so the previous retrieval's parent is another
    # tool run of the same agent run: only the runs above both (linked by the handler) tell it is one turn.
    from langchain_core.runnables import RunnableLambda
    from langchain_core.tools import create_retriever_tool

    ens = make_ensemble()
    retriever = (FeedbackEnsembleRetriever.from_ensemble(ens, k=2) if own_retriever
                 else BM25Retriever.from_texts(TEXTS, ids=IDS, k=2))
    tool = create_retriever_tool(retriever, "search", "Search the notes.")
    handler = FeedbackCallbackHandler.from_ensemble(ens)

    def agent(question: str, config: Any) -> str:
        first = tool.invoke({"query": question}, config=config)
        return first + tool.invoke({"query": "what really causes the aurora borealis lights"}, config=config)

    turn: RunnableConfig = {"metadata": {"session_id": "agent"}, "callbacks": [handler]}
    RunnableLambda(agent).invoke("what causes the aurora borealis", config=turn)
    events = ens.store.events_for_session("agent")
    assert len(events) == 2 and not any(ens.store.feedback(e["id"]) for e in events)
    # the user restating the question in the next turn is a follow-up
    RunnableLambda(agent).invoke("what is it that causes the aurora borealis", config=turn)
    assert [f["signal"] for f in ens.store.feedback(events[-1]["id"])] == ["reformulation"]


def test_langchain_retrievers_and_vector_stores_as_members(make_ensemble: Any, embeddings: Any) -> None:
    bm25 = BM25Retriever.from_texts(TEXTS, ids=IDS, k=4)
    for d, i in zip(bm25.docs, IDS, strict=True):  # BM25Retriever keeps ids on its documents only when given
        d.id = i
    vs = InMemoryVectorStore(embeddings)
    vs.add_texts(TEXTS, ids=IDS)
    retriever = FeedbackEnsembleRetriever.from_retrievers(
        {"lc_bm25": bm25, "vs": vs.as_retriever()}, store=FeedbackStore(), k=3
    )
    assert retriever.weights == {"lc_bm25": 0.5, "vs": 0.5}
    assert retriever.ensemble.learner.policy_name == "thompson"  # "learns their weights" without policy=
    with pytest.warns(UserWarning, match="InMemoryVectorStore gives no relevance scores"):  # by rank, and says so
        docs = retriever.invoke("what causes the aurora borealis")
    assert docs[0].id in {"doc0", "doc1"}
    assert set(docs[0].metadata["scores"]) == {"lc_bm25", "vs"}
    assert docs[0].metadata["scores"]["vs"] is not None
    # under RRF every member is fused by rank: nothing to warn of (the README's migration from EnsembleRetriever)
    by_rank = FeedbackEnsembleRetriever.from_retrievers({"lc_bm25": bm25, "vs": vs}, fusion="rrf",
                                                        store=FeedbackStore(), k=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert by_rank.invoke("what causes the aurora borealis")[0].id in {"doc0", "doc1"}
    assert not [w for w in caught if "relevance scores" in str(w.message)]

    # members join rlfb's own retrievers: the same ids, so every chunk gets every score
    ens = FeedbackEnsemble(make_ensemble().retrievers, make_ensemble().chunks,
                           members=[as_member("vs", vs, scores="similarity")])
    mixed = FeedbackEnsembleRetriever.from_ensemble(ens, k=2).invoke("moon and tides")
    assert set(mixed[0].metadata["scores"]) == {"bm25", "dense", "vs"}
    assert mixed[0].metadata["scores"]["vs"] is not None

    with pytest.raises(ValidationError):
        as_member("x", object())
    with pytest.raises(ValidationError):
        as_member("x", SearchMember("y", lambda q, k: []))
    with pytest.raises(ValidationError):
        FeedbackEnsembleRetriever.from_retrievers({})


def test_member_runs_nest_under_the_ensemble_run_and_are_not_logged_twice(base_ensemble: Any) -> None:
    bm25 = BM25Retriever.from_texts(TEXTS, k=3)
    store = FeedbackStore()
    ens = FeedbackEnsemble(base_ensemble.retrievers, base_ensemble.chunks, members=[as_member("lc", bm25)],
                           store=store)
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    run_id = uuid.uuid4()
    FeedbackEnsembleRetriever.from_ensemble(ens).invoke("volcano lava", config={"callbacks": [handler]},
                                                        run_id=run_id)
    assert store.counts()["events"] == 1  # the member's own run is nested, not a second retrieval
    assert store.resolve_run(str(run_id)) == [str(run_id)]


def test_member_without_scores_is_fused_by_rank(make_ensemble: Any) -> None:
    def search(query: str, k: int) -> list[tuple[Chunk, None]]:
        return [(Chunk("outside", "a chunk only the member knows, about tides"), None),
                (Chunk("doc2", TEXTS[2]), None)]

    base = make_ensemble()
    ens = FeedbackEnsemble(base.retrievers, base.chunks, members=[SearchMember("kb", search)])
    docs = FeedbackEnsembleRetriever.from_ensemble(ens, k=len(TEXTS) + 1).invoke("tides")
    kb = {d.id: d.metadata["scores"]["kb"] for d in docs}
    assert kb["outside"] == pytest.approx(1 / 61) and kb["doc2"] == pytest.approx(1 / 62)
    assert sum(v is None for v in kb.values()) == len(TEXTS) - 1  # chunks the member did not return


def test_a_members_lone_hit_counts_for_more_than_what_it_did_not_return() -> None:
    # min-max took a member's one returned document for a constant column and gave it 0, as for the documents
    # it did not return: with 0.9 of the weight on that member, its only hit was ranked last
    from langchain_core.documents import Document
    from langchain_core.runnables import RunnableLambda

    docs = [Document(page_content=t, id=f"d{i}") for i, t in enumerate(TEXTS)]
    exact: RunnableLambda[str, list[Document]] = RunnableLambda(lambda q: [docs[-1]])
    broad: RunnableLambda[str, list[Document]] = RunnableLambda(lambda q: docs[:-1] + [docs[-1]])
    retriever = FeedbackEnsembleRetriever.from_retrievers({"exact": exact, "broad": broad}, policy="fixed",
                                                          weights={"exact": 0.9, "broad": 0.1}, k=len(docs))
    got = retriever.invoke("anything", explore=False)
    assert got[0].id == docs[-1].id and got[0].metadata["score"] == pytest.approx(0.9)


async def test_ainvoke_and_concurrent_abatch_log_every_event(make_ensemble: Any) -> None:
    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    run_id = uuid.uuid4()
    docs = await retriever.ainvoke("ocean tides", run_id=run_id, k=3)
    assert len(docs) == 3 and docs[0].metadata["event_id"] == str(run_id)
    queries = [f"{t} ({i})" for i, t in enumerate(["aurora", "tides", "volcano", "glacier", "stock market"])]
    config: RunnableConfig = {"max_concurrency": 3}
    batches = await asyncio.gather(*(retriever.abatch(queries, config=config) for _ in range(4)))
    event_ids = {d[0].metadata["event_id"] for batch in batches for d in batch}
    assert len(event_ids) == 20
    assert ens.store.counts()["events"] == 21
    assert all(ens.store.has_event(e) for e in event_ids)


def test_errors_propagate_and_log_nothing(make_ensemble: Any) -> None:
    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens)
    with pytest.raises(ValidationError):
        retriever.invoke(123)  # type: ignore[arg-type]
    assert ens.store.counts()["events"] == 0


def test_add_documents_and_delete_change_the_index_as_a_vector_store_would(tmp_path: Any) -> None:
    retriever = FeedbackEnsembleRetriever.from_documents(
        [Document(page_content=t, id=i) for i, t in zip(IDS, TEXTS, strict=True)],
        retrievers=("bm25",), store=tmp_path / "fb.db", k=1)
    penguin = Document(page_content="Penguins huddle together through the Antarctic winter.", metadata={"zoo": 1})
    assert retriever.add_documents([penguin], ids=["penguin"]) == ["penguin"]
    [doc] = retriever.invoke("penguins in the antarctic winter")
    assert (doc.id, doc.metadata["zoo"]) == ("penguin", 1)
    # a document without an id gets its content id, so adding it twice indexes it once
    note = Document(page_content="Koalas sleep in eucalyptus trees.")
    assert retriever.add_documents([note]) == retriever.add_documents([note])
    assert len(retriever.ensemble) == len(TEXTS) + 2
    # an id already indexed gets the new text
    retriever.add_documents([Document(page_content="Glaciers of ice carve valleys.", id=IDS[0])])
    assert retriever.invoke("glaciers carve valleys")[0].id == IDS[0]
    retriever.delete(["penguin"])
    assert retriever.invoke("penguins in the antarctic winter")[0].id != "penguin"
    with pytest.raises(ValidationError, match="2 documents but 1 ids"):
        retriever.add_documents([penguin, note], ids=["x"])
    with pytest.raises(DuplicateIdError):
        retriever.add_documents([penguin, penguin], ids=["x", "x"])


def test_add_documents_returns_one_id_per_document_given(make_ensemble: Any) -> None:
    # a repeated text without an id is indexed once, and the ids came back one short of the documents
    retriever = FeedbackEnsembleRetriever.from_ensemble(make_ensemble(), k=2)
    footer = Document(page_content="Legal notice: all rights reserved.")
    docs = [Document(page_content="Penguins huddle in the Antarctic winter."), footer, footer,
            Document(page_content="Koalas sleep in eucalyptus trees.")]
    ids = retriever.add_documents(docs)
    assert len(ids) == 4 and ids[1] == ids[2] and len(set(ids)) == 3


def test_a_misspelt_option_is_an_error_not_ignored(make_ensemble: Any) -> None:
    with pytest.raises(Exception, match="explor"):
        FeedbackEnsembleRetriever.from_ensemble(make_ensemble(), explor=False)


async def test_a_cancelled_ainvoke_logs_nothing_and_closes_the_handlers_run(make_ensemble: Any) -> None:
    # asyncio.wait_for timing out cancels ainvoke, which BaseRetriever.ainvoke does not report to the callbacks
    # (CancelledError is not an Exception); the worker thread goes on after the coroutine is gone
    # the member waits in its pool thread until released; called on the event loop's thread it fails instead
    slow = Gate(lambda query, k: [(Chunk("doc2", TEXTS[2]), None)])
    base = make_ensemble()
    ens = FeedbackEnsemble(base.retrievers, base.chunks, members=[SearchMember("kb", slow)], store=base.store)
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    handler = FeedbackCallbackHandler(base.store, ensemble=retriever)
    loop = asyncio.get_running_loop()
    workers = ThreadPoolExecutor(2)  # the retrieval, and the sync handler's error hook
    loop.set_default_executor(workers)  # LangChain's run_in_executor runs the retrieval here
    task = asyncio.create_task(retriever.ainvoke("tides", config={"callbacks": [handler],
                                                                   "metadata": {"session_id": "s"}}))
    while not slow.entered.is_set():  # the member is searching, in a pool thread
        if task.done():  # it failed before (the member refused the event loop's thread): say why
            task.result()
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    slow.opened.set()
    workers.shutdown(wait=True)  # the retrieval's thread has finished
    assert base.store.counts()["events"] == 0  # nobody saw a ranking: none is logged
    assert handler._retrievals == {} and handler._parents == {}
    docs = retriever.invoke("tides", config={"callbacks": [handler], "metadata": {"session_id": "s"}})
    assert docs and base.store.counts()["events"] == 1  # the next call is the session's first retrieval
    assert base.store.counts()["feedback"] == 0  # so it restates nothing


def test_nested_metadata_is_copied_in_and_out() -> None:
    # a shallow copy shared metadata["authors"]: appending to a returned Document's list changed the user's
    # own Document, the indexed chunk and every later result
    documents = [Document(page_content=t, id=i, metadata={"authors": ["ann"]}) for t, i in zip(TEXTS, IDS, strict=True)]
    r = FeedbackEnsembleRetriever.from_documents(documents, retrievers=("bm25",), k=1)
    (doc,) = r.invoke("titanium bolt XK-4471")
    doc.metadata["authors"].append("INJECTED")
    assert documents[4].metadata["authors"] == ["ann"]
    assert r.invoke("titanium bolt XK-4471")[0].metadata["authors"] == ["ann"]
    documents[4].metadata["authors"].append("LATER")
    assert r.invoke("titanium bolt XK-4471")[0].metadata["authors"] == ["ann"]


async def test_ainvoke_refuses_a_logged_run_id_before_searching_unless_it_logs_nothing() -> None:
    from langchain_core.runnables import RunnableLambda

    from rlfb import DuplicateEventError

    calls: list[str] = []

    async def remote(query: str) -> list[Document]:
        calls.append(query)
        return [Document(page_content=TEXTS[0], id=IDS[0])]

    retriever = FeedbackEnsembleRetriever.from_retrievers({"remote": RunnableLambda(remote)}, store=FeedbackStore(),
                                                          explore=False)
    run_id = uuid.uuid4()
    await retriever.ainvoke("aurora", run_id=run_id)
    calls.clear()
    with pytest.raises(DuplicateEventError):
        await retriever.ainvoke("aurora again", run_id=run_id)
    assert calls == []
    assert await retriever.ainvoke("aurora again", run_id=run_id, log=False)  # nothing to log: nothing refused


async def test_one_member_shared_by_an_outer_and_an_inner_retriever_is_searched_for_each_ones_query() -> None:
    # the documents ainvoke fetched are keyed by member and query: one runnable serving both retrievers gave
    # the inner one the outer query's documents
    from langchain_core.runnables import RunnableLambda

    web: RunnableLambda[str, list[Document]] = RunnableLambda(
        lambda q: [Document(page_content=f"result for {q}", id=f"web:{q}")])
    inner = FeedbackEnsembleRetriever.from_retrievers({"web": web}, k=1, explore=False)
    seen: list[str] = []

    def via_inner(query: str, k: int) -> list[tuple[Chunk, None]]:
        docs = inner.invoke(f"{query} details")
        seen.extend(d.page_content for d in docs)
        return [(document_to_chunk(d), None) for d in docs]

    outer = FeedbackEnsembleRetriever.from_retrievers({"web": web, "sub": SearchMember("sub", via_inner)}, k=2,
                                                      explore=False)
    await outer.ainvoke("aurora")
    assert seen == ["result for aurora details"]


def test_the_ensembles_implicit_signals_compare_follow_ups_with_the_dense_encoder(make_ensemble: Any) -> None:
    assert make_ensemble().implicit.encode is not None


@pytest.mark.parametrize("key", ["thread_id", "conversation_id"])
def test_a_langsmith_thread_id_is_the_session_for_the_retriever_and_the_handler(make_ensemble: Any, key: str) -> None:
    # only metadata["session_id"] was read: an app that groups its traces by LangSmith's thread_id saw no
    # reformulation recorded
    ens = make_ensemble()
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    config: RunnableConfig = {"metadata": {key: "t-1"}}
    first = retriever.invoke("what causes the aurora borealis", config=config)[0].metadata["event_id"]
    retriever.invoke("what really causes the aurora borealis lights", config=config)
    assert ens.store.event(first)["session_id"] == "t-1"
    assert [f["signal"] for f in ens.store.feedback(first)] == ["reformulation"]
    handler = FeedbackCallbackHandler(store=FeedbackStore())
    plain = BM25Retriever.from_documents([Document(page_content=t, id=i) for i, t in zip(IDS, TEXTS, strict=True)])
    run_id = uuid.uuid4()
    plain.invoke("tides", config={"callbacks": [handler], "metadata": {key: "t-2"}}, run_id=run_id)
    assert handler.store.event(str(run_id))["session_id"] == "t-2"


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def _members_in_opposite_orders() -> dict[str, Any]:
    """Two LangChain runnables that return the corpus's first five documents in opposite orders."""
    docs = [Document(page_content=t, id=i) for i, t in zip(IDS[:5], TEXTS[:5], strict=True)]
    return {"a": RunnableLambda(lambda q: list(docs)), "b": RunnableLambda(lambda q: docs[::-1])}


async def test_ainvoke_with_explore_false_does_not_explore() -> None:
    # ainvoke dropped explore=False (passed None, the default), so an evaluation run under async explored:
    # 29 of 30 such calls were logged as explored
    retriever = FeedbackEnsembleRetriever.from_retrievers(_members_in_opposite_orders(), store=FeedbackStore(), k=3)
    store = retriever.ensemble.store
    explored = []
    for i in range(30):
        docs = await retriever.ainvoke(f"question {i}", explore=False)
        explored.append(store.event(docs[0].metadata["event_id"])["explored"])
    assert not any(explored)
    exploring = [store.event((await retriever.ainvoke(f"question {i}"))[0].metadata["event_id"])["explored"]
                 for i in range(30)]
    assert any(exploring)  # the same calls without explore=False do explore: the check above can fail


def test_a_similarity_retrievers_search_kwargs_reach_its_vector_store() -> None:
    # as_member(vs.as_retriever(search_kwargs={"filter": ...})) dropped every search setting but k: documents
    # the filter excludes (another tenant's, another language's) were fused in
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    store.add_documents([Document(page_content=f"doc {i}", metadata={"lang": "en" if i % 2 else "de"}, id=f"d{i}")
                         for i in range(8)])
    member = as_member("vs", store.as_retriever(search_kwargs={"k": 3, "filter": lambda d: d.metadata["lang"] == "en"}),
                       scores="rank")
    found = member.function("doc", 6)
    assert found and all(chunk.metadata["lang"] == "en" for chunk, _ in found)
    unfiltered = as_member("vs", store.as_retriever(search_kwargs={"k": 3}), scores="rank").function("doc", 6)
    assert {chunk.metadata["lang"] for chunk, _ in unfiltered} == {"en", "de"}


class _Starts(BaseCallbackHandler):
    """Records each retriever run's id and its parent's."""

    def __init__(self) -> None:
        self.runs: list[tuple[Any, Any]] = []

    def on_retriever_start(self, serialized: Any, query: str, *, run_id: Any, parent_run_id: Any = None,
                           **kwargs: Any) -> None:
        self.runs.append((run_id, parent_run_id))


async def test_member_runs_nest_under_the_ensembles_run_under_ainvoke_as_under_invoke() -> None:
    # under ainvoke the members were invoked without the callbacks: their runs vanished from traces
    retriever = FeedbackEnsembleRetriever.from_retrievers(
        {"a": FeedbackEnsembleRetriever.from_texts(TEXTS, IDS, retrievers=("bm25",), log=False)}, k=2)
    for call in ("invoke", "ainvoke"):
        seen = _Starts()
        top = uuid.uuid4()
        if call == "invoke":
            retriever.invoke("tides", config={"callbacks": [seen]}, run_id=top)
        else:
            await retriever.ainvoke("tides", config={"callbacks": [seen]}, run_id=top)
        assert seen.runs[0] == (top, None) and len(seen.runs) == 2, call
        assert seen.runs[1][1] == top, call  # the member's run is the ensemble run's child


def test_the_retrievers_feedback_reads_the_score_on_the_scale_given(make_ensemble: Callable[..., Any]) -> None:
    # score_scale was dropped on the way to the store: a neutral 0.0 on the signed scale was a thumbs down
    retriever = FeedbackEnsembleRetriever(ensemble=make_ensemble(), k=2)
    eid = retriever.invoke("tides")[0].metadata["event_id"]
    assert [r.reward for r in retriever.feedback(eid, score=0.0, score_scale="signed")] == [0.0]
    assert [r.reward for r in retriever.feedback(eid, score=0.0)] == [pytest.approx(-1.0, abs=1e-3)]  # a thumb down


def test_the_retrievers_feedback_takes_a_number_second_as_the_score_as_the_handler_does(
    make_ensemble: Callable[..., Any],
) -> None:
    # retriever.feedback(run_id, 1.0) was an UnknownSignalError ("signal must be a str"), where the handler's
    # record_feedback(run_id, 1.0) takes LangSmith's score second
    retriever = FeedbackEnsembleRetriever(ensemble=make_ensemble(), k=2)
    handler = FeedbackCallbackHandler.from_ensemble(retriever)
    eid = retriever.invoke("tides")[0].metadata["event_id"]
    (by_retriever,) = retriever.feedback(eid, 1.0)
    (by_handler,) = handler.record_feedback(eid, 1.0, idempotency_key="h")
    assert by_retriever.value == by_handler.value == 1.0
    assert [r.value for r in retriever.feedback(eid, 0, idempotency_key="down")] == [-1.0]  # a 0 is a thumb down
    with pytest.raises(ValidationError, match="give the score once"):
        retriever.feedback(eid, 1.0, score=0.0)
    # LangSmith's key second, with a score: the error says where the key goes
    with pytest.raises(UnknownSignalError, match="a LangSmith key goes as key='correctness'"):
        retriever.feedback(eid, "correctness", score=1.0)
    retriever.feedback(eid, score=1.0, key="correctness", idempotency_key="k")
    assert [row["key"] for row in retriever.ensemble.store.feedback(eid)] == [None, None, None, "correctness"]


def test_feedback_after_a_restart_is_learned_by_the_retriever_given_it(tmp_path: Any) -> None:
    # the retriever's feedback named no ensemble: learned only where the one that made the retrieval still lived
    # in the process, and after a restart stored and not learned (a mutation review, 2026-12-07)
    import gc

    path = str(tmp_path / "fb.db")

    def started() -> FeedbackEnsembleRetriever:
        return FeedbackEnsembleRetriever.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), store=path, k=2,
                                                    explore=False)

    before = started()
    event_id = before.invoke("what causes the aurora")[0].metadata["event_id"]
    before.ensemble.close()
    del before
    gc.collect()
    after = started()  # the restart
    (record,) = after.feedback(event_id, 1.0)
    assert not record.duplicate and after.ensemble.learner.n_learned == 1
    after.ensemble.close()
