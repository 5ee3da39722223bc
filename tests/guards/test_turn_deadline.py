"""TurnDeadline: one time budget for the whole turn, in virtual time, on both backends."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from guardstack.guards import ToolCallTimeoutPolicy, TurnDeadline
from guardstack.pipeline import (
    TOOL_ABORTED,
    TOOL_TIMEOUT,
    ConfigError,
    Harness,
    ModelReply,
    ScriptedModel,
    Session,
    ToolCallRequest,
    ToolDefinition,
    ToolResultEvent,
    TurnEnd,
)
from guardstack.wrappers import Retry


def ask(name: str) -> ModelReply:
    return ModelReply(tool_calls=[ToolCallRequest(name, {})])


async def hang(arguments: Any, call: Any) -> str:
    await anyio.sleep(3600)
    return "never"


async def quick(arguments: Any, call: Any) -> str:
    await anyio.sleep(1)
    return "done"


def harness(model: Any, *plugins: Any) -> Harness:
    built = Harness(model)
    built.tools.register(ToolDefinition("hang", hang))
    built.tools.register(ToolDefinition("quick", quick, timeout_ms=2_000))
    for plugin in plugins:
        built.plugin(plugin)
    return built


async def test_a_stalled_call_is_cut_at_the_turns_deadline_and_the_next_turn_is_valid() -> None:
    model = ScriptedModel([ask("quick"), ask("hang"), ModelReply("second turn fine")])
    agent = harness(model, TurnDeadline(ms=5_000)).loop.create("s")
    started = anyio.current_time()
    result = await agent.prompt("go")
    took = anyio.current_time() - started
    assert result.reason == "deadline"
    assert result.error == "turn-deadline: the turn's 5000 ms ran out"
    assert result.steps == 2
    assert took == pytest.approx(5.0)  # the hung call was cut at the deadline, not at 3600 s
    results = [e.result for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert results[0].content == "done"
    assert results[1].code == TOOL_ABORTED
    ends = [e for e in agent.session.events if isinstance(e, TurnEnd)]
    assert ends[-1].reason == "deadline"
    again = await agent.prompt("and now?")  # the log is whole: the next turn's request is valid
    assert again.reason == "completed"
    assert again.text == "second turn fine"
    loaded = Session.from_jsonl(agent.session.to_jsonl())  # and it loads
    assert [e.reason for e in loaded.events if isinstance(e, TurnEnd)] == ["deadline", "completed"]


async def test_a_tools_own_budget_still_applies_when_shorter() -> None:
    async def slow(arguments: Any, call: Any) -> str:
        await anyio.sleep(10)
        return "late"

    model = ScriptedModel([ask("slow"), ModelReply("the tool timed out")])
    built = harness(model, TurnDeadline(ms=60_000), ToolCallTimeoutPolicy())
    built.tools.register(ToolDefinition("slow", slow, timeout_ms=1_000))
    agent = built.loop.create("s")
    result = await agent.prompt("go")
    assert result.reason == "completed"
    [answer] = [e.result for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert answer.code == TOOL_TIMEOUT


async def test_a_retry_that_respects_deadlines_sees_the_turns() -> None:
    async def failing(arguments: Any, call: Any) -> str:
        await anyio.sleep(2)
        raise TimeoutError("upstream")

    model = ScriptedModel([ask("flaky"), ModelReply("gave up")])
    built = Harness(model)
    built.tools.register(ToolDefinition("flaky", failing, timeout_ms=3_000))
    built.plugin(TurnDeadline(ms=5_000))
    built.plugin(Retry(attempts=5, backoff_ms=100, respect_deadline=True, retry_on=["TOOL_FAILED"]))
    agent = built.loop.create("s")
    result = await agent.prompt("go")
    assert result.reason == "completed"  # the retry stopped itself before the deadline
    [answer] = [e.result for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert "left of the deadline" in answer.content


async def test_each_turn_gets_the_whole_budget_again_and_an_outside_cancel_is_aborted() -> None:
    model = ScriptedModel([ask("quick"), ModelReply("one"), ask("quick"), ModelReply("two")])
    agent = harness(model, TurnDeadline(ms=1_500)).loop.create("s")
    assert (await agent.prompt("a")).reason == "completed"  # 1 s of a 1.5 s budget
    assert (await agent.prompt("b")).reason == "completed"  # and again: it is per turn
    model = ScriptedModel([ask("hang")])
    agent = harness(model, TurnDeadline(ms=10_000)).loop.create("s2")
    async with anyio.create_task_group() as group:

        async def run() -> None:
            result = await agent.prompt("go")
            assert result.reason == "aborted"

        group.start_soon(run)
        await anyio.sleep(1)
        agent.cancel()
    ends = [e for e in agent.session.events if isinstance(e, TurnEnd)]
    assert ends[-1].reason == "aborted"


def test_bad_config_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"turn-deadline.*ms"):
        TurnDeadline(ms=0)
    harness_ = Harness()
    harness_.load([{"name": "turn-deadline", "config": {"ms": 30_000}}])
    assert "turn-deadline" in harness_.describe()
