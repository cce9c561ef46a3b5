"""A real LCEL RAG chain (retriever | format | prompt | fake chat model | parser) with feedback by run id.

The Cranfield run puts 200 questions through the chain, with the feedback of a
simulated navigational user arriving late (a store clock that the test moves),
restated follow-ups in the same session, and feedback given on the chain's
top-level run id. It then compares the learned policy's greedy nDCG@10 on the
held-out questions with a fixed-weights RRF fusion of the same retrievers.
"""

from __future__ import annotations

import heapq
import random
import time
import uuid
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from langchain_rlfb import FeedbackCallbackHandler, FeedbackEnsembleRetriever
from rlfb import FeedbackEnsemble, UnknownEventError
from rlfb.datasets import load_beir
from rlfb.metrics import ndcg_at_k
from rlfb.simulation.users import SimulatedUser
from rlfb.store import FeedbackStore

PROMPT = ChatPromptTemplate.from_messages(
    [("system", "Answer the question using only this context:\n{context}"), ("human", "{question}")]
)


def format_docs(docs: list[Any]) -> str:
    return "\n\n".join(f"[{d.metadata['chunk_id']}] {d.page_content}" for d in docs)


def rag_chain(retriever: Any, llm: Any) -> Any:
    return (
        {"context": retriever | RunnableLambda(format_docs), "question": RunnablePassthrough()}
        | PROMPT
        | llm
        | StrOutputParser()
    )


def test_lcel_rag_chain_with_feedback_on_the_chain_run(make_ensemble: Any) -> None:
    ens = make_ensemble(policy="gradient")
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    seen: list[str] = []

    def remember(answer: str) -> str:
        seen.append(answer)
        return answer

    llm = FakeListChatModel(responses=["Charged particles from the sun."])
    chain = rag_chain(retriever, llm) | RunnableLambda(remember)
    top = uuid.uuid4()
    answer = chain.invoke(
        "what causes the aurora borealis",
        config={"callbacks": [handler], "run_id": top, "metadata": {"session_id": "u1"}},
    )
    assert answer == "Charged particles from the sun." == seen[0]
    (event,) = handler.retrievals(top)
    assert event["session_id"] == "u1" and [c["rank"] for c in event["chunks"]] == [1, 2]
    (record,) = handler.record_feedback(top, score=1.0, key="user_score", comment="spot on")
    assert record.event_id == event["id"] and record.reward > 0

    # a streaming fake model through the same chain
    stream_llm = GenericFakeChatModel(messages=iter([AIMessage(content="Tides follow the moon.")]))
    config = {"callbacks": [handler]}
    chunks = list(rag_chain(retriever, stream_llm).stream("why do tides happen", config=config))
    assert "".join(chunks) == "Tides follow the moon."
    assert ens.store.counts()["events"] == 2


def test_a_chain_run_above_the_parent_needs_the_handler_and_the_error_says_so(make_ensemble: Any) -> None:
    # The retriever logs only its parent run; the chain's own run id resolves through the handler's links
    ens = make_ensemble(policy="gradient")
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=2)
    chain = rag_chain(retriever, FakeListChatModel(responses=["an answer", "an answer"]))
    top = uuid.uuid4()
    chain.invoke("what causes the aurora borealis", config={"run_id": top})
    with pytest.raises(UnknownEventError, match="FeedbackCallbackHandler in the chain's callbacks"):
        retriever.feedback(top, score=1.0)
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    top = uuid.uuid4()
    chain.invoke("what causes the aurora borealis", config={"run_id": top, "callbacks": [handler]})
    (record,) = retriever.feedback(top, score=1.0)
    assert record.reward > 0


class _Clock:
    """The store's clock, moved by the simulation so that feedback can arrive late."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


N_QUESTIONS = 200
SEED = 0
POLICY = "thompson"


@pytest.fixture(scope="module")
def cranfield_run(cranfield_path: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """200 Cranfield questions through the chain with a simulated user's feedback; then held-out nDCG@10."""
    data = load_beir(cranfield_path)
    qrels = data.split("test")
    queries = data.split_queries("test")
    qids = list(queries)
    random.Random(SEED).shuffle(qids)
    stream, held_out = qids[: len(qids) // 2], qids[len(qids) // 2:]

    base = FeedbackEnsemble.from_chunks(data.corpus, retrievers=("bm25", "dense"))
    t0 = time.time() - 10 * 86400
    clock = _Clock(t0)
    store = FeedbackStore(tmp_path_factory.mktemp("cranfield") / "feedback.db", clock=clock)
    ens = FeedbackEnsemble(base.retrievers, base.chunks, policy=POLICY, store=store, seed=SEED)
    start = dict(ens.weights)
    retriever = FeedbackEnsembleRetriever.from_ensemble(ens, k=10)
    handler = FeedbackCallbackHandler.from_ensemble(ens)
    chain = rag_chain(retriever, FakeListChatModel(responses=["(an answer)"]))
    user = SimulatedUser("navigational", explicit_rate=0.1, max_grade=4, seed=SEED)
    rng = random.Random(SEED + 1)

    pending: list[tuple[float, int, str, str, str | None]] = []  # (arrival, seq, run id, signal, chunk)
    seq = 0

    def deliver(until: float) -> None:
        while pending and pending[0][0] <= until:
            arrival, _, run_id, signal, chunk_id = heapq.heappop(pending)
            handler.record_feedback(run_id, signal=signal, chunk_id=chunk_id, timestamp=arrival)

    followup: tuple[str, str] | None = None  # (query id, session) of a question the user restates
    n_sessions = 0
    for i in range(N_QUESTIONS):
        clock.now = t0 + i * 120.0
        deliver(clock.now)
        if followup is not None:
            qid, session = followup
        else:
            qid, session = rng.choice(stream), f"session-{n_sessions}"
            n_sessions += 1
        top = str(uuid.uuid4())  # the application holds the top-level run id, not the retriever's
        chain.invoke(queries[qid], config={"callbacks": [handler], "run_id": top,
                                           "metadata": {"session_id": session}})
        (event,) = handler.retrievals(top)
        interaction = user.interact([c["chunk_id"] for c in event["chunks"]], qrels[qid])
        for fb in interaction.feedback:
            if fb.signal == "implicit_negative":  # the reformulation: recorded from the session instead
                continue
            heapq.heappush(pending, (clock.now + fb.delay, seq, top, fb.signal, fb.chunk_id))
            seq += 1
        followup = (qid, session) if interaction.reformulated and followup is None else None
    clock.now = t0 + N_QUESTIONS * 120.0 + 3 * 86400  # the late feedback arrives, outside the window
    deliver(clock.now)

    rrf = FeedbackEnsemble(base.retrievers, base.chunks, fusion="rrf")

    def mean_ndcg(e: FeedbackEnsemble) -> float:
        runs = [e.retrieve(queries[q], 10, explore=False, log=False).chunk_ids for q in held_out]
        return sum(ndcg_at_k(r, qrels[q], 10) for r, q in zip(runs, held_out, strict=True)) / len(held_out)

    sql = "SELECT COUNT(*) FROM feedback WHERE signal = 'reformulation'"
    out = {
        "counts": store.counts(),
        "reformulations": store.db.execute(sql).fetchone()[0],
        "start": start,
        "weights": ens.weights,
        "learned": mean_ndcg(ens),
        "rrf": mean_ndcg(rrf),
        # thompson keeps weights per query type (falling back to the global ones): the weights that rank
        # each held-out question are its type's
        "weights_used": {q: ens.weights_for(queries[q]) for q in held_out},
    }
    moved = sum(_moved(start, w) for w in out["weights_used"].values())
    print(f"\n{POLICY}, {N_QUESTIONS} questions: held-out nDCG@10 learned {out['learned']:.4f} vs RRF "
          f"{out['rrf']:.4f}; global weights {start} -> {out['weights']}; {moved} of {len(held_out)} held-out "
          f"questions ranked with moved weights; {out['counts']}; {out['reformulations']} reformulations")
    return out


@pytest.mark.slow
@pytest.mark.datasets
def test_cranfield_loop_logs_the_chain_and_its_feedback(cranfield_run: dict[str, Any]) -> None:
    counts = cranfield_run["counts"]
    assert counts["events"] == N_QUESTIONS
    assert counts["feedback"] > N_QUESTIONS / 2 and counts["flagged"] > 0  # late feedback is flagged
    assert cranfield_run["reformulations"] > 0


@pytest.mark.slow
@pytest.mark.datasets
def test_cranfield_learned_policy_is_not_below_rrf(
    cranfield_run: dict[str, Any], record_property: Any
) -> None:
    record_property("ndcg10_learned", round(cranfield_run["learned"], 4))
    record_property("ndcg10_rrf", round(cranfield_run["rrf"], 4))
    assert cranfield_run["learned"] >= cranfield_run["rrf"]


@pytest.mark.slow
@pytest.mark.datasets
def test_cranfield_weights_change(cranfield_run: dict[str, Any]) -> None:
    # The weights that rank some held-out questions moved, as the LlamaIndex run checks. Until 2026-12-06 this
    # asked the global weights to move: they did on seed 0 by its random streams (on 3 of seeds 0-7), and on 1
    # of 8 once the learner's parts stopped sharing streams across seeds, where the weights that rank the
    # held-out questions moved on all 8 (README, "The adapters on cranfield").
    start, used = cranfield_run["start"], cranfield_run["weights_used"].values()
    assert any(_moved(start, w) for w in used), (
        f"the {POLICY} policy ranked every held-out question with its starting weights {start} after "
        f"{N_QUESTIONS} questions"
    )


def _moved(start: dict[str, float], weights: dict[str, float]) -> bool:
    """A visible move (0.02 in total over the retrievers), not a rounding-level one."""
    return sum(abs(weights[name] - start[name]) for name in start) >= 0.02
