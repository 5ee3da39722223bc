"""GuardstackMiddleware inside LangChain v1's own agent loop (``create_agent``)."""

from __future__ import annotations

import importlib
import itertools
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ToolCallLimitMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from guardstack.guards import GENTLE_TEXT
from guardstack.integrations.langchain import GuardstackMiddleware
from guardstack.pipeline import Harness
from tests.frameworks.scenario import (
    ATTEMPTS,
    FLAKY_TREE,
    HANG_BUDGET_MS,
    TIMEOUT_TEXT,
    flaky,
    hang,
    harness,
    layer_tree,
    search,
    todo,
    traced_harness,
)
from tests.wrappers.otel import SpanRig


class ScriptedChat(GenericFakeChatModel):
    """LangChain's fake chat model, recording what it was sent, with tools bound as is."""

    requests: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.requests.append(list(messages))
        return super()._generate(messages, *args, **kwargs)

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        return self._generate(messages, *args, **kwargs)


def asks(*calls: tuple[str, dict[str, Any]], text: str = "") -> AIMessage:
    return AIMessage(
        content=text,
        tool_calls=[
            {"name": name, "args": args, "id": f"{name}-{next(_ids)}"} for name, args in calls
        ],
    )


def script(*replies: AIMessage) -> Iterator[AIMessage]:
    yield from replies
    yield AIMessage(content="done")


@tool
async def broken(query: str) -> str:
    """Always raises."""
    raise RuntimeError("disk on fire")


_ids = itertools.count(1)


def agent(model: ScriptedChat, built: Harness, *middleware: AgentMiddleware[Any, Any, Any]) -> Any:
    listed = list(middleware) or [GuardstackMiddleware(built)]
    return create_agent(
        model,
        tools=[tool(search), tool(todo), tool(hang), broken, tool(flaky)],
        middleware=listed,
        checkpointer=InMemorySaver(),
    )


async def run(graph: Any, text: str, thread: str = "t1") -> list[BaseMessage]:
    state = await graph.ainvoke(
        {"messages": [HumanMessage(text)]}, {"configurable": {"thread_id": thread}}
    )
    return list(state["messages"])


def answered(messages: list[BaseMessage]) -> bool:
    """Every tool call of every assistant message has exactly one tool message."""
    asked = [str(c["id"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    results = [str(m.tool_call_id) for m in messages if isinstance(m, ToolMessage)]
    return sorted(asked) == sorted(results)


async def test_a_hung_tool_ends_at_its_declared_budget_with_the_seed_text() -> None:
    model = ScriptedChat(messages=script(asks(("hang", {"query": "x"}))))
    graph = agent(model, harness())
    started = anyio.current_time()
    messages = await run(graph, "find x")
    assert anyio.current_time() - started == pytest.approx(HANG_BUDGET_MS / 1000)
    [result] = [m for m in messages if isinstance(m, ToolMessage)]
    assert result.content == TIMEOUT_TEXT
    assert result.status == "error"
    assert model.requests[1][-1].content == TIMEOUT_TEXT  # what the model read next
    assert messages[-1].content == "done"


async def test_a_langchain_tool_error_is_a_result_the_model_reads() -> None:
    model = ScriptedChat(messages=script(asks(("broken", {"query": "x"}))))
    messages = await run(agent(model, harness()), "go")
    [result] = [m for m in messages if isinstance(m, ToolMessage)]
    assert result.status == "error"
    assert "disk on fire" in str(result.content)
    assert messages[-1].content == "done"


async def test_identical_calls_with_a_bookkeeping_tool_between_get_the_reminder() -> None:
    model = ScriptedChat(
        messages=script(
            asks(("search", {"query": "q", "page": 1})),
            asks(("todo", {"item": "remember"})),
            asks(("search", {"page": 1, "query": "q"})),
            asks(("search", {"query": "q", "page": 1})),
        )
    )
    messages = await run(agent(model, harness()), "look it up")
    reminders = [m for m in messages if isinstance(m, HumanMessage) and m.content == GENTLE_TEXT]
    assert len(reminders) == 1
    position = messages.index(reminders[0])
    assert isinstance(messages[position - 1], ToolMessage)  # right after the third result
    assert messages[position + 1].content == "done"
    assert model.requests[-1][-1].content == GENTLE_TEXT
    assert reminders[0].response_metadata["guardstack"]["plugin"] == "repeat-tool-reminder"


async def test_reminders_of_a_parallel_step_follow_all_its_results_in_call_order() -> None:
    triple = asks(("search", {"query": "a"}), ("search", {"query": "a"}), ("todo", {"item": "x"}))
    model = ScriptedChat(messages=script(triple, asks(("search", {"query": "a"}))))
    messages = await run(agent(model, harness()), "go")
    kinds = [type(m).__name__ for m in messages]
    assert kinds == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "ToolMessage",
        "ToolMessage",
        "AIMessage",
        "ToolMessage",
        "HumanMessage",
        "AIMessage",
    ]
    assert messages[7].content == GENTLE_TEXT
    assert answered(messages)


async def test_a_cap_that_ends_the_turn_ends_a_looping_run() -> None:
    looping = [asks(("search", {"query": f"attempt {n}"})) for n in range(50)]
    model = ScriptedChat(messages=iter(looping))
    messages = await run(agent(model, harness(cap=3)), "loop")
    assert len(model.requests) == 4  # three calls, the fourth denied, no fifth request
    final = messages[-1]
    assert isinstance(final, AIMessage)
    assert str(final.content).startswith("Stopped: tool call limit reached")
    denied = [m for m in messages if isinstance(m, ToolMessage)][-1]
    assert denied.status == "error"
    assert answered(messages)


async def test_the_thread_is_the_conversation_and_each_run_a_new_turn() -> None:
    built = harness()
    same = ("search", {"query": "q"})
    model = ScriptedChat(
        messages=iter(
            [
                asks(same),
                asks(same),
                AIMessage(content="first run done"),
                asks(same),
                asks(same),
                AIMessage(content="second run done"),
                asks(same),
                asks(same),
                asks(same),
                AIMessage(content="other thread done"),
            ]
        )
    )
    graph = agent(model, built)
    first = await run(graph, "one", thread="a")
    second = await run(graph, "two", thread="a")  # four identical calls in the thread…
    other = await run(graph, "three", thread="b")
    assert GENTLE_TEXT not in [m.content for m in first + second]  # …but two per run
    assert [m.content for m in other].count(GENTLE_TEXT) == 1


async def test_each_call_gets_a_span_tree_with_one_span_per_layer() -> None:
    rig = SpanRig()
    ATTEMPTS.clear()
    model = ScriptedChat(messages=script(asks(("flaky", {"query": "x"}))))
    messages = await run(agent(model, traced_harness(rig)), "go")
    assert [m.content for m in messages if isinstance(m, ToolMessage)] == ["answered"]
    assert layer_tree(rig.spans) == [FLAKY_TREE]


async def test_middleware_before_it_wraps_the_call_and_after_it_each_attempt() -> None:
    seen: list[str] = []

    class Recording(AgentMiddleware[Any, Any, Any]):
        def __init__(self, label: str) -> None:
            super().__init__()
            self.label = label

        @property
        def name(self) -> str:
            return self.label

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            seen.append(self.label)
            return await handler(request)

    ATTEMPTS.clear()
    rig = SpanRig()
    built = traced_harness(rig)
    model = ScriptedChat(messages=script(asks(("flaky", {"query": "x"}))))
    graph = agent(model, built, Recording("outside"), GuardstackMiddleware(built), Recording("in"))
    await run(graph, "go")
    assert seen == ["outside", "in", "in"]  # guardstack's retry re-ran what is inside it


async def test_it_works_beside_langchains_own_middleware() -> None:
    model = ScriptedChat(messages=iter([asks(("search", {"query": "q"})) for _ in range(10)]))
    limit = ToolCallLimitMiddleware(run_limit=3, exit_behavior="end")
    built = harness()
    messages = await run(agent(model, built, limit, GuardstackMiddleware(built)), "go")
    assert [m.content for m in messages].count(GENTLE_TEXT) == 1  # guardstack's, at the third
    assert "limit" in str(messages[-1].content)  # LangChain's cap ended the run
    assert answered(messages)


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langchain.agents.middleware", None)
    monkeypatch.delitem(sys.modules, "guardstack.integrations.langchain")
    with pytest.raises(ImportError, match=r"pip install 'guardstack\[langchain\]'"):
        importlib.import_module("guardstack.integrations.langchain")


async def test_two_runs_of_one_thread_at_once_keep_their_own_turns() -> None:
    """One middleware, two runs on the same thread at once: each has its own per-turn cap."""
    middleware = GuardstackMiddleware(harness(cap=2))
    models = [
        ScriptedChat(messages=iter([asks(("search", {"query": f"{who} {n}"})) for n in range(9)]))
        for who in ("a", "b")
    ]
    finals: list[BaseMessage] = []

    async def one(model: ScriptedChat) -> None:
        finals.append((await run(agent(model, Harness(), middleware), "loop", "shared"))[-1])

    async with anyio.create_task_group() as group:
        for model in models:
            group.start_soon(one, model)
    assert [len(model.requests) for model in models] == [3, 3]  # two calls each, then stopped
    assert all(str(final.content).startswith("Stopped: tool call limit") for final in finals)


async def test_a_call_that_needs_approval_pauses_the_thread_with_langgraphs_interrupt() -> None:
    from langgraph.types import Command

    from guardstack.guards import Approval, ToolCallLimit

    deployed: list[dict[str, Any]] = []

    @tool
    async def deploy(target: str) -> str:
        """Deploy the service."""
        deployed.append({"target": target})
        return f"deployed to {target}"

    built = Harness()
    built.plugin(ToolCallLimit(per_turn=1))  # before Approval: it decides first, once
    built.plugin(Approval(require=("deploy",)))

    def agent_for(model: ScriptedChat) -> Any:
        return create_agent(
            model,
            [deploy],
            middleware=[GuardstackMiddleware(built)],
            checkpointer=InMemorySaver(),
        )

    model = ScriptedChat(messages=script(asks(("deploy", {"target": "prod"}))))
    agent = agent_for(model)
    config = {"configurable": {"thread_id": "t1"}}
    paused = await agent.ainvoke({"messages": [HumanMessage("ship it")]}, config)
    [interrupted] = paused["__interrupt__"]
    assert interrupted.value["guardstack"] == "approval"
    assert (interrupted.value["tool"], interrupted.value["arguments"]) == (
        "deploy",
        {"target": "prod"},
    )
    assert deployed == []
    done = await agent.ainvoke(Command(resume={"type": "approve", "by": "ops"}), config)
    assert deployed == [{"target": "prod"}]  # not refused: the cap counted the call once
    tool_messages = [m for m in done["messages"] if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_messages] == ["deployed to prod"]
    assert done["messages"][-1].content == "done"

    model = ScriptedChat(messages=script(asks(("deploy", {"target": "prod"}))))
    agent = agent_for(model)
    config = {"configurable": {"thread_id": "t2"}}
    await agent.ainvoke({"messages": [HumanMessage("ship it")]}, config)
    done = await agent.ainvoke(Command(resume={"type": "reject", "reason": "frozen"}), config)
    [answer] = [m for m in done["messages"] if isinstance(m, ToolMessage)]
    assert answer.content == "Error: rejected: frozen"
    assert answer.status == "error"
    assert deployed == [{"target": "prod"}]  # the rejected call never ran
