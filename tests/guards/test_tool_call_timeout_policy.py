"""The tool-call timeout policy: the tool's own budget, attributed from the scope."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.from_thread
import pytest

from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.pipeline import (
    TOOL_TIMEOUT,
    UNKNOWN_TOOL,
    AgentLoop,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolDefinition,
    ToolRegistry,
    ToolResult,
    ToolResultEvent,
    timeout_result,
)
from guardstack.pipeline.testing import Hang, Reply, ScriptedTool
from guardstack.wrappers import Timeout
from tests.helpers import call, calls, registry_with

SEED_TIMEOUT = {
    "isError": True,
    "error": {
        "message": "tool call timed out after 250ms",
        "info": {"name": "ToolTimeoutError", "code": "TOOL_TIMEOUT"},
    },
    "content": "Error: tool call timed out after 250ms",
}


def with_policy(*tools: ScriptedTool) -> ToolRegistry:
    registry = registry_with(*tools)
    registry.dispatch.use(ToolCallTimeoutPolicy())
    return registry


async def test_a_hung_call_ends_at_the_tools_own_budget_with_the_seeds_error() -> None:
    registry = with_policy(ScriptedTool("web_fetch", [Hang()], timeout_ms=250))
    started = anyio.current_time()
    outcome = await registry.execute(call("web_fetch"))
    assert anyio.current_time() - started == pytest.approx(0.25)
    assert outcome.result.to_dict() == SEED_TIMEOUT


async def test_a_call_within_its_budget_is_untouched() -> None:
    tool = ScriptedTool("web_fetch", [Reply({"page": "body"}, after_ms=200)], timeout_ms=250)
    outcome = await with_policy(tool).execute(call("web_fetch"))
    assert outcome.result == ToolResult('{"page": "body"}')


async def test_a_tool_without_a_budget_passes_through_however_long_it_takes() -> None:
    tool = ScriptedTool("grep", [Reply("found", after_ms=3_600_000)])
    seen: list[ToolCall] = []

    async def inner(tool_call: ToolCall, call_next: Any) -> ToolResult:
        seen.append(tool_call)
        result: ToolResult = await call_next(tool_call)
        return result

    registry = with_policy(tool)
    registry.dispatch.use(inner)
    original = call("grep")
    outcome = await registry.execute(original)
    assert outcome.result.content == "found"
    assert seen[0].arguments is original.arguments


async def test_an_unknown_tool_passes_through_to_the_unknown_tool_result() -> None:
    outcome = await with_policy().execute(call("nope"))
    assert outcome.result.code == UNKNOWN_TOOL


async def test_whatever_the_tool_does_when_cancelled_the_result_is_the_timeout() -> None:
    async def own_abort(arguments: Any, tool_call: ToolCall) -> ToolResult:
        try:
            await anyio.sleep(10)
        except anyio.get_cancelled_exc_class():
            return ToolResult.failure("aborted by signal", name="AbortError", code="WEB_ABORTED")
        return ToolResult("finished")

    async def raise_instead(arguments: Any, tool_call: ToolCall) -> str:
        try:
            await anyio.sleep(10)
        except anyio.get_cancelled_exc_class():
            raise RuntimeError("connection reset") from None
        return "finished"

    registry = ToolRegistry()
    registry.register(ToolDefinition("own_abort", own_abort, timeout_ms=250))
    registry.register(ToolDefinition("raise_instead", raise_instead, timeout_ms=250))
    registry.dispatch.use(ToolCallTimeoutPolicy())
    for name in ("own_abort", "raise_instead"):
        outcome = await registry.execute(call(name))
        assert outcome.result.to_dict() == SEED_TIMEOUT, name


async def test_a_tool_that_ignores_cancellation_is_waited_for_then_still_times_out() -> None:
    tool = ScriptedTool(
        "stubborn", [Reply("late result", after_ms=2000, ignore_cancel=True)], timeout_ms=250
    )
    started = anyio.current_time()
    outcome = await with_policy(tool).execute(call("stubborn"))
    assert anyio.current_time() - started == pytest.approx(2.0)  # never abandoned
    assert tool.runs[0].outcome == "returned"
    assert outcome.result.to_dict() == SEED_TIMEOUT  # the late result stays out


async def test_the_callers_cancel_is_never_relabelled_as_a_timeout() -> None:
    registry = with_policy(ScriptedTool("web_fetch", [Hang()], timeout_ms=250))
    outcomes = []
    with anyio.move_on_after(0.1) as scope:
        outcomes.append(await registry.execute(call("web_fetch")))
    assert scope.cancelled_caught
    assert outcomes == []


async def test_an_outer_deadline_is_not_the_policys_to_claim() -> None:
    registry = registry_with(ScriptedTool("web_fetch", [Hang()], timeout_ms=250))
    registry.dispatch.use(Timeout(ms=100, code="TOTAL_TIMEOUT"))
    registry.dispatch.use(ToolCallTimeoutPolicy())
    outcome = await registry.execute(call("web_fetch"))
    assert outcome.result == timeout_result(100, "TOTAL_TIMEOUT")


async def test_a_thread_tool_that_checks_for_cancellation_stops_at_the_budget() -> None:
    stopped = threading.Event()

    def poll(arguments: Any, tool_call: ToolCall) -> str:
        try:
            while True:
                anyio.from_thread.check_cancelled()
        finally:
            stopped.set()

    registry = ToolRegistry()
    registry.register(ToolDefinition("poll", poll, timeout_ms=300))
    registry.dispatch.use(ToolCallTimeoutPolicy())
    outcome = await registry.execute(call("poll"))
    assert outcome.result == timeout_result(300, TOOL_TIMEOUT)
    assert stopped.is_set()


async def test_a_thread_tool_that_cannot_be_cancelled_is_waited_for() -> None:
    release = threading.Event()
    finished = threading.Event()

    def uncancellable(arguments: Any, tool_call: ToolCall) -> str:
        release.wait()
        finished.set()
        return "late"

    registry = ToolRegistry()
    registry.register(ToolDefinition("uncancellable", uncancellable, timeout_ms=300))
    registry.dispatch.use(ToolCallTimeoutPolicy())
    outcomes = []

    async def run() -> None:
        outcomes.append(await registry.execute(call("uncancellable")))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await anyio.sleep(5)  # far past the budget: the policy is still waiting
        assert outcomes == []
        release.set()
    assert finished.is_set()
    assert outcomes[0].result == timeout_result(300, TOOL_TIMEOUT)


async def test_in_a_loop_the_model_reads_the_timeout_and_post_execute_saw_it() -> None:
    seen: list[str | None] = []

    async def post(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        seen.append(result.code)
        return await call_next(tool_call, result)

    registry = with_policy(ScriptedTool("web_fetch", [Hang()], timeout_ms=250))
    registry.post_execute.use(post)
    model = ScriptedModel([calls(("web_fetch", {"url": "x"})), ModelReply("gave up")])
    agent = AgentLoop(registry, model).create("s")
    await agent.prompt("fetch")
    assert seen == [TOOL_TIMEOUT]
    assert model.requests[1][-1]["content"] == "Error: tool call timed out after 250ms"
    logged = [e.result for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert logged[0].to_dict() == SEED_TIMEOUT


async def test_a_stubborn_tool_outliving_the_callers_cancel_is_not_a_timeout_result() -> None:
    tool = ScriptedTool(
        "stubborn", [Reply("late", after_ms=2000, ignore_cancel=True)], timeout_ms=250
    )
    registry = with_policy(tool)
    outcomes = []
    with anyio.move_on_after(1.0) as scope:  # the caller gives up after the budget fired
        outcomes.append(await registry.execute(call("stubborn")))
    assert scope.cancelled_caught
    assert outcomes == []
    assert tool.runs[0].outcome == "returned"
