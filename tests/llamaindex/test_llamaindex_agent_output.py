"""An agent's answer names the queries its tools ran, so one feedback on it rates them all.

``await agent.run(...)`` gives an ``AgentOutput``: ``handler.query_id_of`` of it was ``None``, and
``record_feedback()`` without an id asked for ``last_query_id`` read in the agent's own task, which an app cannot
do; each tool call's ``tool_output.raw_output`` was the only way in (an audit, 2026-12-06).
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.llms import ChatMessage, MessageRole, MockLLM
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import QueryEngineTool
from typing_extensions import assert_type

from llamaindex_rlfb import FeedbackEventHandler, FeedbackFusionPostprocessor
from rlfb.store import FeedbackRecord


def scripted(*questions: str) -> MockFunctionCallingLLM:
    """An LLM that calls the ``kb`` tool once for each of ``questions`` at once, then answers."""

    def reply(messages: list[ChatMessage], **_: Any) -> ChatMessage:
        if any(m.role == MessageRole.TOOL for m in messages):
            return ChatMessage(role=MessageRole.ASSISTANT, content="an answer")
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[
            ToolCallBlock(tool_call_id=f"c-{uuid4().hex}", tool_name="kb", tool_kwargs={"input": q})
            for q in questions])

    return MockFunctionCallingLLM(response_generator=reply)


@pytest.fixture
def handler(tmp_path: Any) -> Any:
    h = FeedbackEventHandler(store=tmp_path / "fb.db").attach()
    yield h
    h.close()


@pytest.mark.parametrize("questions", [("what causes the aurora",), ("what causes the aurora", "moon and tides")])
def test_feedback_on_an_agents_output_rates_every_query_its_tools_ran(
    index: Any, handler: FeedbackEventHandler, make_ensemble: Any, questions: tuple[str, ...]
) -> None:
    ens = make_ensemble(store=handler.store, policy="thompson")
    pp = FeedbackFusionPostprocessor.from_ensemble(ens, top_n=2)
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=4, node_postprocessors=[pp])
    agent = FunctionAgent(tools=[QueryEngineTool.from_defaults(engine, name="kb", description="the notes")],
                          llm=scripted(*questions))

    async def run() -> Any:  # a workflow starts inside a running loop
        return await agent.run(user_msg="tell me")

    output = asyncio.run(run())
    asked = [handler.query_id_of(call.tool_output.raw_output) for call in output.tool_calls]
    assert len(asked) == len(questions) and all(asked)
    qid = handler.query_id_of(output)  # None before
    assert qid is not None and handler.query_id_of(output) == qid  # the same run, asked again
    if len(questions) == 1:
        assert qid == asked[0]
    records = assert_type(handler.record_feedback(qid, score=1.0), list[FeedbackRecord])  # typed
    assert {r.event_id for r in records} >= {e["id"] for q in asked for e in handler.retrievals(q)}
    assert ens.learner.n_learned == len(questions)  # each tool query's rlfb decision learned
