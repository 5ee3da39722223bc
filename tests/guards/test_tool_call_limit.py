"""``ToolCallLimit`` stops loss: tool calls per turn and per tool."""

from __future__ import annotations

from typing import Any

import pytest

from guardstack.guards import ToolCallLimit
from guardstack.pipeline import (
    TOOL_DENIED,
    AgentLimitExceeded,
    ConfigError,
    Harness,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolResultEvent,
    TurnEnd,
)
from guardstack.pipeline.testing import Reply, ScriptedTool
from tests.helpers import calls


def results(harness_agent: Any) -> list[tuple[str, str | None]]:
    return [
        (e.call_id, e.result.code)
        for e in harness_agent.session.events
        if isinstance(e, ToolResultEvent)
    ]


async def test_over_the_per_turn_limit_calls_are_denied_with_a_reason_the_model_reads() -> None:
    tool = ScriptedTool("grep")
    model = ScriptedModel(
        [
            calls(("grep", {"i": 1}), ("grep", {"i": 2})),
            calls(("grep", {"i": 3})),
            ModelReply("answer"),
        ]
    )
    harness = Harness(model=model)
    tool.register(harness.tools)
    harness.plugin(ToolCallLimit(per_turn=2))
    agent = harness.loop.create("a")
    result = await agent.prompt("go")
    assert result.reason == "completed"
    assert len(tool.runs) == 2
    assert [code for _, code in results(agent)] == [None, None, TOOL_DENIED]
    denial = model.requests[2][-1]["content"]
    assert denial == (
        "Error: tool call limit reached: this turn already made 2 tool calls and "
        "the limit is 2 per turn. Do not call more tools; answer with what you have."
    )


async def test_per_tool_limits_count_each_tool_separately() -> None:
    model = ScriptedModel(
        [calls(("a", {}), ("a", {}), ("b", {}), ("b", {}), ("a", {})), ModelReply("ok")]
    )
    harness = Harness(model=model)
    for name in "ab":
        ScriptedTool(name).register(harness.tools)
    harness.plugin(ToolCallLimit(per_tool={"a": 1, "b": 2}))
    agent = harness.loop.create("x")
    await agent.prompt("go")
    assert [code for _, code in results(agent)] == [None, TOOL_DENIED, None, None, TOOL_DENIED]
    assert (
        '"a" was already called 1 times this turn and the limit is 1'
        in (model.requests[1][3]["content"])
    )


async def test_end_turn_ends_the_turn_blocked_after_the_step() -> None:
    model = ScriptedModel([calls(("grep", {}), ("grep", {}), ("grep", {})), ModelReply("never")])
    harness = Harness(model=model)
    ScriptedTool("grep").register(harness.tools)
    harness.plugin(ToolCallLimit(per_turn=1, on_exceeded="end_turn"))
    agent = harness.loop.create("a")
    result = await agent.prompt("go")
    assert result.reason == "blocked"
    assert len(model.requests) == 1
    assert [code for _, code in results(agent)] == [None, TOOL_DENIED, TOOL_DENIED]
    end = agent.session.events[-1]
    assert isinstance(end, TurnEnd)
    assert end.reason == "blocked"


async def test_counts_are_per_agent_and_reset_by_each_new_prompt() -> None:
    script = [calls(("t", {})), calls(("t", {})), ModelReply("done")]
    harness = Harness(model=ScriptedModel(script * 2))
    ScriptedTool("t").register(harness.tools)
    harness.plugin(ToolCallLimit(per_turn=1))
    first = harness.loop.create("one")
    second = harness.loop.create("two", model=ScriptedModel(script))
    await first.prompt("turn 1")
    await second.prompt("turn 1")
    await first.prompt("turn 2")
    assert [code for _, code in results(first)] == [None, TOOL_DENIED, None, TOOL_DENIED]
    assert [code for _, code in results(second)] == [None, TOOL_DENIED]


async def test_the_count_is_exact_under_parallel_calls() -> None:
    tool = ScriptedTool("work", [Reply("done", after_ms=1000)])
    model = ScriptedModel([calls(*[("work", {"i": i}) for i in range(6)]), ModelReply("ok")])
    harness = Harness(model=model, max_parallel_tool_calls=4)
    tool.register(harness.tools)
    harness.plugin(ToolCallLimit(per_turn=3))
    agent = harness.loop.create("a")
    await agent.prompt("go")
    assert [code for _, code in results(agent)] == [None] * 3 + [TOOL_DENIED] * 3
    assert sorted(run.call.arguments["i"] for run in tool.runs) == [0, 1, 2]  # type: ignore[index]


async def test_calls_with_a_conversation_but_no_agent_are_capped_too() -> None:
    harness = Harness()
    ScriptedTool("t").register(harness.tools)
    harness.plugin(ToolCallLimit(per_turn=1))
    codes = [
        (await harness.tools.execute(ToolCall("t", {}, "c", conversation="thread"))).result.code
        for _ in range(3)
    ]
    assert codes == [None, "TOOL_DENIED", "TOOL_DENIED"]


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({}, "per_turn"),
        ({"per_turn": 0}, "per_turn"),
        ({"per_tool": -1}, "per_tool"),
        ({"per_tool": {"a": 0}}, "per_tool.a"),
        ({"per_tool": "3"}, "per_tool"),
        ({"per_turn": 1, "on_exceeded": "explode"}, "on_exceeded"),
    ],
)
def test_bad_limits_fail_loud(config: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        ToolCallLimit(**config)
    assert raised.value.key == key
    assert "tool-call-limit" in str(raised.value)


def test_caps_load_from_configuration() -> None:
    harness = Harness(model=ScriptedModel([]))
    harness.load(
        [
            {"name": "tool-call-limit", "config": {"perTurn": 5, "onExceeded": "end_turn"}},
            {"name": "agent-limit", "config": {"maxAgents": 1}},
        ]
    )
    harness.loop.create("only")
    with pytest.raises(AgentLimitExceeded):
        harness.loop.create("another")


async def test_one_tool_call_limit_applied_to_two_harnesses_counts_each_separately() -> None:
    limit = ToolCallLimit(per_turn=1)
    denials = []
    for _ in range(2):
        model = ScriptedModel([calls(("echo", {}), ("echo", {"n": 2})), ModelReply("done")])
        harness = Harness(model=model)
        ScriptedTool("echo").register(harness.tools)
        harness.plugin(limit)
        agent = harness.loop.create("s")
        await agent.prompt("go")
        denials.append(
            [
                e.result.code
                for e in agent.session.events
                if isinstance(e, ToolResultEvent) and e.result.is_error
            ]
        )
    assert denials == [[TOOL_DENIED], [TOOL_DENIED]]
