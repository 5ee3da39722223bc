"""guard_tools inside the OpenAI Agents SDK's own runner, with the SDK's ScriptedModel."""

from __future__ import annotations

import importlib
import itertools
import sys
from typing import Any

import anyio
import pytest
from agents import Agent, FunctionTool, RunConfig, Runner, WebSearchTool, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool import Tool

from guardstack.guards import GENTLE_TEXT
from guardstack.integrations.openai_agents import RunBlocked, guard_tools
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


TOOLS: list[Tool] = [
    function_tool(search),
    function_tool(todo),
    function_tool(hang),
    function_tool(slow, timeout=1.5),
    function_tool(flaky),
]


def calls(*requests: tuple[str, dict[str, Any]]) -> list[Any]:
    return [
        function_call(name, arguments, call_id=f"{name}-{next(_ids)}")
        for name, arguments in requests
    ]


def model(*steps: list[Any]) -> ScriptedModel:
    return ScriptedModel([*steps, [assistant_message("done")]])


async def run(scripted: ScriptedModel, built: Harness, group: str | None = None) -> Any:
    agent = Agent(name="tester", tools=guard_tools(TOOLS, built), model=scripted)
    config = RunConfig(tracing_disabled=True, group_id=group)
    return await Runner.run(agent, "go", run_config=config)


def outputs(scripted: ScriptedModel) -> list[Any]:
    """Every tool output the model was sent, in order, as the last request holds them."""
    last = scripted.calls[-1].input
    return [item["output"] for item in last if item.get("type") == "function_call_output"]


def texts(output: Any) -> list[str]:
    if isinstance(output, str):
        return [output]
    return [part["text"] for part in output]


async def test_a_hung_tool_ends_at_its_declared_budget_with_the_seed_text() -> None:
    scripted = model(calls(("hang", {"query": "x"})))
    started = anyio.current_time()
    result = await run(scripted, harness())
    assert anyio.current_time() - started == pytest.approx(HANG_BUDGET_MS / 1000)
    assert outputs(scripted) == [TIMEOUT_TEXT]
    assert result.final_output == "done"


async def test_the_sdk_timeout_becomes_the_budget_guardstack_owns() -> None:
    scripted = model(calls(("slow", {"query": "x"})))
    started = anyio.current_time()
    await run(scripted, harness())
    assert anyio.current_time() - started == pytest.approx(1.5)
    assert outputs(scripted) == ["Error: tool call timed out after 1500ms"]
    guarded = {tool.name: tool for tool in guard_tools(TOOLS, harness())}
    assert isinstance(guarded["slow"], FunctionTool)
    assert guarded["slow"].timeout_seconds is None  # guardstack owns it now


async def test_identical_calls_with_a_bookkeeping_tool_between_get_the_reminder() -> None:
    scripted = model(
        calls(("search", {"query": "q", "page": 1})),
        calls(("todo", {"item": "remember"})),
        calls(("search", {"page": 1, "query": "q"})),
        calls(("search", {"query": "q", "page": 1})),
    )
    await run(scripted, harness())
    sent = [texts(output) for output in outputs(scripted)]
    assert sent[:3] == [["results for q page 1"], ["noted"], ["results for q page 1"]]
    assert sent[3] == ["results for q page 1", GENTLE_TEXT]  # the reminder, after the result


async def test_a_cap_that_ends_the_turn_stops_a_looping_model() -> None:
    looping = ScriptedModel([calls(("search", {"query": f"attempt {n}"})) for n in range(50)])
    with pytest.raises(RunBlocked, match="tool call limit reached") as raised:
        await run(looping, harness(cap=3))
    assert isinstance(raised.value, TurnBlocked)
    assert len(looping.calls) == 4  # three calls ran; the fourth ended the run


async def test_the_group_is_the_conversation_and_each_run_a_new_turn() -> None:
    built = harness()
    same = ("search", {"query": "q"})
    first = model(calls(same), calls(same))
    second = model(calls(same), calls(same))
    await run(first, built, group="thread-a")
    await run(second, built, group="thread-a")  # four identical calls in the group…
    assert all(GENTLE_TEXT not in texts(output) for output in outputs(second))  # …two per run
    third = model(calls(same), calls(same), calls(same))
    await run(third, built)  # no group: the run is its own conversation
    assert texts(outputs(third)[-1]) == ["results for q page 1", GENTLE_TEXT]


async def test_each_call_gets_a_span_tree_with_one_span_per_layer() -> None:
    rig = SpanRig()
    ATTEMPTS.clear()
    scripted = model(calls(("flaky", {"query": "x"})))
    await run(scripted, traced_harness(rig))
    assert outputs(scripted) == ["answered"]
    assert layer_tree(rig.spans) == [FLAKY_TREE]


def test_a_hosted_tool_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="WebSearchTool"):
        guard_tools([WebSearchTool()], harness())


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "agents", None)
    monkeypatch.delitem(sys.modules, "guardstack.integrations.openai_agents")
    with pytest.raises(ImportError, match=r"pip install 'guardstack\[openai-agents\]'"):
        importlib.import_module("guardstack.integrations.openai_agents")


async def test_two_runs_of_one_conversation_at_once_keep_their_own_turns() -> None:
    """Each run's calls count against its own per-turn cap: neither resets the other's."""
    built = harness(cap=2)
    scripts = [
        ScriptedModel([calls(("search", {"query": f"{who} {n}"})) for n in range(5)])
        for who in ("a", "b")
    ]
    stopped: list[str] = []

    async def one(scripted: ScriptedModel) -> None:
        try:
            await run(scripted, built, group="one-thread")
        except RunBlocked as blocked:
            stopped.append(str(blocked))

    async with anyio.create_task_group() as group:
        for scripted in scripts:
            group.start_soon(one, scripted)
    assert len(stopped) == 2  # both runs hit their own cap ...
    assert [len(scripted.calls) for scripted in scripts] == [3, 3]  # ... after 2 calls each
