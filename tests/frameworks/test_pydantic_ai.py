"""GuardstackToolset inside pydantic-ai's own agent graph, with its FunctionModel."""

from __future__ import annotations

import importlib
import itertools
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent, FunctionToolset, ModelRetry, RunContext
from pydantic_ai.exceptions import RunTimedOut
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from guardstack.guards import GENTLE_TEXT, ToolCallLimit, ToolCallTimeoutPolicy
from guardstack.integrations.pydantic_ai import GuardstackToolset
from guardstack.pipeline import Harness, TurnBlocked
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
    slow,
    todo,
    traced_harness,
)
from tests.wrappers.otel import SpanRig

_ids = itertools.count(1)


async def picky(query: str) -> str:
    """Asks for a better query (pydantic-ai's own retry signal)."""
    if query == "vague":
        raise ModelRetry("be more specific")
    return f"found {query}"


class Script:
    """A FunctionModel that asks for each step's tool calls, then answers "done"."""

    def __init__(self, *steps: list[tuple[str, dict[str, Any]]]) -> None:
        self._steps: Iterator[list[tuple[str, dict[str, Any]]]] = iter(steps)
        self.requests: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        step = next(self._steps, None)
        if step is None:
            return ModelResponse(parts=[TextPart("done")])
        parts = [ToolCallPart(name, args, f"{name}-{next(_ids)}") for name, args in step]
        return ModelResponse(parts=list(parts))

    def last_parts(self) -> list[Any]:
        """The parts of the last request the model was sent."""
        last = self.requests[-1][-1]
        assert isinstance(last, ModelRequest)
        return list(last.parts)


def agent(script: Script, built: Harness) -> Agent[None, str]:
    tools = FunctionToolset([search, todo, hang, picky, flaky])
    tools.add_function(slow, timeout=1.5)
    return Agent(FunctionModel(script), toolsets=[GuardstackToolset(tools, built)])


async def test_a_hung_tool_ends_at_its_declared_budget_with_the_seed_text() -> None:
    script = Script([("hang", {"query": "x"})])
    started = anyio.current_time()
    result = await agent(script, harness()).run("go")
    assert anyio.current_time() - started == pytest.approx(HANG_BUDGET_MS / 1000)
    [returned] = script.last_parts()
    assert isinstance(returned, ToolReturnPart)
    assert returned.outcome == "failed"
    assert returned.content == TIMEOUT_TEXT
    assert result.output == "done"


async def test_the_tools_own_timeout_becomes_the_budget_guardstack_owns() -> None:
    script = Script([("slow", {"query": "x"})])
    started = anyio.current_time()
    await agent(script, harness()).run("go")
    assert anyio.current_time() - started == pytest.approx(1.5)
    [returned] = script.last_parts()
    assert isinstance(returned, ToolReturnPart)
    assert returned.outcome == "failed"  # not pydantic-ai's retry prompt: the seed's text
    assert returned.content == "Error: tool call timed out after 1500ms"


async def test_pydantic_ai_signals_pass_through_unchanged() -> None:
    script = Script([("picky", {"query": "vague"})], [("picky", {"query": "exact"})])
    result = await agent(script, harness()).run("go")
    asked_again = script.requests[1][-1].parts[0]
    assert isinstance(asked_again, ToolReturnPart)
    assert asked_again.outcome == "retried"  # pydantic-ai's own retry prompt
    assert "be more specific" in str(asked_again.content)
    assert result.output == "done"


async def test_identical_calls_with_a_bookkeeping_tool_between_get_the_reminder() -> None:
    script = Script(
        [("search", {"query": "q", "page": 1})],
        [("todo", {"item": "remember"})],
        [("search", {"page": 1, "query": "q"})],
        [("search", {"query": "q", "page": 1})],
    )
    await agent(script, harness()).run("go")
    returned, reminder = script.last_parts()
    assert isinstance(returned, ToolReturnPart)
    assert returned.content == "results for q page 1"
    assert isinstance(reminder, UserPromptPart)  # a separate message after the result
    assert reminder.content == [GENTLE_TEXT]
    earlier = [part for request in script.requests[:-1] for part in request[-1].parts]
    assert [GENTLE_TEXT] not in [getattr(part, "content", None) for part in earlier]


async def test_a_cap_that_ends_the_turn_stops_a_looping_model() -> None:
    script = Script(*([("search", {"query": f"attempt {n}"})] for n in range(50)))
    with pytest.raises(TurnBlocked, match="tool call limit reached"):
        await agent(script, harness(cap=3)).run("loop")
    assert len(script.requests) == 4  # three calls ran; the fourth ended the run


async def test_the_conversation_id_is_the_conversation_and_each_run_a_new_turn() -> None:
    built = harness()
    same = ("search", {"query": "q"})
    first = Script([same], [same])
    await agent(first, built).run("one", conversation_id="thread-a")
    second = Script([same], [same])
    await agent(second, built).run("two", conversation_id="thread-a")
    assert not any(isinstance(part, UserPromptPart) for part in second.last_parts())
    third = Script([same], [same], [same])
    await agent(third, built).run("three")  # its own conversation
    assert isinstance(third.last_parts()[-1], UserPromptPart)


async def test_each_call_gets_a_span_tree_with_one_span_per_layer() -> None:
    rig = SpanRig()
    ATTEMPTS.clear()
    script = Script([("flaky", {"query": "x"})])
    await agent(script, traced_harness(rig)).run("go")
    [returned] = script.last_parts()
    assert returned.content == "answered"
    assert layer_tree(rig.spans) == [FLAKY_TREE]


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)
    monkeypatch.delitem(sys.modules, "guardstack.integrations.pydantic_ai")
    with pytest.raises(ImportError, match=r"pip install 'guardstack\[pydantic-ai\]'"):
        importlib.import_module("guardstack.integrations.pydantic_ai")


def in_task(script: Script) -> Any:
    """The script as an async model function: pydantic-ai runs a plain one in a worker
    thread, which the virtual clock does not wait for while a deadline is pending."""

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return script(messages, info)

    return answer


async def test_a_sub_agent_run_spends_from_the_calling_run_and_inherits_its_deadline() -> None:
    built = Harness()
    built.plugin(ToolCallTimeoutPolicy())
    built.plugin(ToolCallLimit(per_turn=3))
    searched: list[float | None] = []

    async def lookup(ctx: RunContext[None], query: str) -> str:
        """Look something up."""
        searched.append(ctx.remaining_time())
        return "found"

    async def ponder(query: str) -> str:
        """Think for a long time."""
        await anyio.sleep(3600)
        return "never"

    child_tools = GuardstackToolset(FunctionToolset([lookup, ponder]), built)
    researcher = Agent(
        FunctionModel(in_task(Script(*([[("lookup", {"query": str(n)})] for n in range(5)])))),
        toolsets=[child_tools],
    )
    stalled = Agent(
        FunctionModel(in_task(Script([("ponder", {"query": "x"})]))), toolsets=[child_tools]
    )

    answers: list[str] = []

    async def delegate(task: str) -> str:
        """Hand a task to the researcher."""
        chosen = stalled if task == "stall" else researcher
        try:
            answers.append((await chosen.run(task)).output)
        except RunTimedOut:
            answers.append("the sub-agent ran out of time")
        return answers[-1]

    parent_tools = GuardstackToolset(
        FunctionToolset([delegate]), built, timeouts_ms={"delegate": 10_000}
    )
    parent = Agent(
        FunctionModel(in_task(Script([("delegate", {"task": "research"})]))),
        toolsets=[parent_tools],
    )
    await parent.run("go")
    # the parent's run may make 3 guarded calls: its delegate and two of the child's lookups
    assert len(searched) == 2
    # the child saw the delegate call's 10 s budget as its own run deadline
    assert all(left is not None and 9.0 < left <= 10.0 for left in searched)

    parent = Agent(
        FunctionModel(in_task(Script([("delegate", {"task": "stall"})]))),
        toolsets=[parent_tools],
    )
    started = anyio.current_time()
    await parent.run("go")
    assert anyio.current_time() - started == pytest.approx(10.0, abs=0.01)
    # ended by pydantic-ai's own RunTimedOut at the inherited deadline, not a cancel
    assert answers[-1] == "the sub-agent ran out of time"
