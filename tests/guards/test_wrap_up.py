"""Caps that wrap up: at the limit, one last model call without tools, then ``blocked``
with that answer — inside the limit, once a turn, logged whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guardstack.guards import ModelCallLimit, ToolCallLimit, UsageLimit
from guardstack.pipeline import (
    ConfigError,
    Harness,
    ModelReply,
    ScriptedModel,
    Session,
    ToolCallRequest,
    Usage,
)
from guardstack.pipeline.testing import ScriptedTool

LAST = "I read three files; the fix in b.py is left to do. Run the tests next."


def looping(count: int, usage: Usage | None = None) -> list[Any]:
    return [
        ModelReply(tool_calls=(ToolCallRequest("look", {"n": index}),), usage=usage)
        for index in range(count)
    ]


def logged(agent: Any) -> list[Any]:
    """The agent's log, untyped: the tests read each kind's own fields."""
    return list(agent.session.events)


def harness_with(model: ScriptedModel, *plugins: object) -> Harness:
    harness = Harness(model)
    ScriptedTool("look", ["seen"] * 50).register(harness.tools)
    for plugin in plugins:
        harness.plugin(plugin)  # type: ignore[arg-type]
    return harness


def asked_to_wrap_up(messages: list[dict[str, Any]]) -> bool:
    last = messages[-1]
    return last["role"] == "user" and "say what you did, what is left" in str(last["content"])


def answering_the_wrap_up(messages: list[dict[str, Any]]) -> ModelReply:
    assert asked_to_wrap_up(messages)
    return ModelReply(LAST, usage=Usage(100, 40))


def working(usage: Usage, count: int = 20) -> list[Any]:
    """A model that keeps calling ``look`` until it is asked to wrap up."""

    def step(messages: list[dict[str, Any]]) -> ModelReply:
        if asked_to_wrap_up(messages):
            return ModelReply(LAST, usage=Usage(usage.input_tokens, 40))
        return ModelReply(tool_calls=(ToolCallRequest("look", {}),), usage=usage)

    return [step] * count


async def test_a_model_call_limit_that_wraps_up_keeps_its_last_call_for_an_answer() -> None:
    model = ScriptedModel([*looping(3), answering_the_wrap_up])
    harness = harness_with(model, ModelCallLimit(per_turn=4, on_limit="wrap_up"))
    agent = harness.loop.create("s")
    result = await agent.prompt("fix the bug")
    assert result.reason == "blocked"
    assert result.text == LAST
    assert result.error == (
        "model-call-limit: this turn made 3 model calls and the limit is 4 per turn"
    )
    # four calls in all, the limit: the last offered no tools
    assert len(model.requests) == 4
    assert [len(tools) for tools in model.tool_schemas] == [1, 1, 1, 0]
    # the log holds the note and the answer; the next turn's request rebuilds from it
    events = logged(agent)
    note = [e for e in events if e.type == "user/message" and e.source.plugin == "wrap-up"]
    assert len(note) == 1
    assert "Do not call tools" in note[0].text
    assert events[-3].type == "assistant/message"
    assert events[-3].text == LAST
    assert events[-1].reason == "blocked"
    assert agent.turn_model_calls == 4
    messages = agent.session.messages()
    assert messages[-1] == {"role": "assistant", "content": LAST}


async def test_a_wrap_up_answer_that_still_asks_for_tools_runs_none(tmp_path: Path) -> None:
    stubborn = ModelReply("one more look", tool_calls=(ToolCallRequest("look", {"n": 9}),))
    model = ScriptedModel([*looping(1), stubborn])
    harness = harness_with(model, ModelCallLimit(per_turn=2, on_limit="wrap_up"))
    agent = harness.loop.create("s")
    result = await agent.prompt("go")
    assert (result.reason, result.text) == ("blocked", "one more look")
    assert sum(e.type == "tool/call" for e in logged(agent)) == 1
    agent.session.save(tmp_path / "s.jsonl")  # still a valid log: it loads, and rebuilds
    assert Session.load(tmp_path / "s.jsonl").messages()[-1]["content"] == "one more look"


async def test_past_its_allowance_a_wrap_up_stops_as_before() -> None:
    # a session limit: the first turn wraps up, the next has nothing kept aside
    model = ScriptedModel([*looping(1), answering_the_wrap_up, ModelReply("never sent")])
    harness = harness_with(model, ModelCallLimit(per_session=2, on_limit="wrap_up"))
    agent = harness.loop.create("s")
    assert (await agent.prompt("one")).text == LAST
    second = await agent.prompt("two")
    assert second.reason == "blocked"
    assert second.error == (
        "model-call-limit: this session made 2 model calls and the limit is 2 per session"
    )
    assert len(model.requests) == 2


async def test_a_usage_limit_that_wraps_up_answers_inside_its_limit() -> None:
    # each looping call uses 1,500 tokens; 1,000 of the 6,000 are kept aside
    model = ScriptedModel(working(Usage(1_000, 500)))
    limit = UsageLimit(tokens_per_turn=6_000, on_limit="wrap_up", estimate_output_tokens=500)
    harness = harness_with(model, limit)
    agent = harness.loop.create("s")
    result = await agent.prompt("go")
    assert (result.reason, result.text) == ("blocked", LAST)
    assert "usage-limit: this turn used" in str(result.error)
    assert [len(tools) for tools in model.tool_schemas][-1] == 0
    assert result.usage.total_tokens <= 6_000


async def test_a_usage_limit_without_room_for_the_wrap_up_stops() -> None:
    # the wrap-up's own estimate (its history plus 1,000 out) does not fit: a hard stop
    model = ScriptedModel(working(Usage(1_900, 500)))
    limit = UsageLimit(tokens_per_turn=3_000, on_limit="wrap_up", estimate_output_tokens=500)
    harness = harness_with(model, limit)
    agent = harness.loop.create("s")
    result = await agent.prompt("go")
    assert result.reason == "blocked"
    assert all(len(tools) == 1 for tools in model.tool_schemas)
    assert result.usage.total_tokens <= 3_000


async def test_a_dollar_limit_keeps_its_wrap_up_at_the_highest_output_price() -> None:
    prices = {"cheap": (1.0, 2.0), "dear": (10.0, 40.0)}
    limit = UsageLimit(usd_per_session=0.10, prices=prices, on_limit="wrap_up", wrap_up_tokens=500)
    # 500 tokens at $40 a million: $0.02 kept aside; each call costs $0.0180
    model = ScriptedModel(working(Usage(1_000, 200)), model="dear")
    harness = harness_with(model, limit)
    agent = harness.loop.create("s")
    result = await agent.prompt("go")
    assert (result.reason, result.text) == ("blocked", LAST)
    spent = sum(
        10 * e.usage.input_tokens / 1e6 + 40 * e.usage.output_tokens / 1e6
        for e in logged(agent)
        if e.type == "assistant/message" and e.usage is not None
    )
    assert spent <= 0.10


async def test_a_tool_call_limit_that_wraps_up_denies_then_asks_for_the_last_answer() -> None:
    model = ScriptedModel([*looping(3), answering_the_wrap_up, ModelReply("next turn")])
    harness = harness_with(model, ToolCallLimit(per_turn=2, on_limit="wrap_up"))
    agent = harness.loop.create("s")
    result = await agent.prompt("go")
    assert (result.reason, result.text) == ("blocked", LAST)
    assert str(result.error).startswith("tool call limit reached")
    results = [e for e in logged(agent) if e.type == "tool/result"]
    assert [r.result.code for r in results] == [None, None, "TOOL_DENIED"]
    assert [len(tools) for tools in model.tool_schemas] == [1, 1, 1, 0]
    # the next turn starts afresh, with its tools
    assert (await agent.prompt("again")).text == "next turn"
    assert len(model.tool_schemas[-1]) == 1


async def test_a_tool_call_limit_in_shadow_never_wraps_up() -> None:
    model = ScriptedModel([*looping(3), ModelReply("done")])
    limit = ToolCallLimit(per_turn=1, on_limit="wrap_up", shadow=True)
    agent = harness_with(model, limit).loop.create("s")
    result = await agent.prompt("go")
    assert (result.reason, result.text) == ("completed", "done")


@pytest.mark.parametrize(
    ("plugin", "config"),
    [
        ("model-call-limit", {"per_turn": 3, "on_limit": "wrap"}),
        ("usage-limit", {"tokens_per_turn": 10, "on_limit": "soft"}),
        ("tool-call-limit", {"per_turn": 3, "on_limit": True}),
    ],
)
def test_a_bad_on_limit_is_named(plugin: str, config: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "stack.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"plugins": [{"name": plugin, "config": config}]}), "utf-8")
    with pytest.raises(ConfigError) as raised:
        Harness().load(path)
    message = str(raised.value)
    assert "on_limit" in message
    assert "'stop' or 'wrap_up'" in message
    assert plugin in message


@settings(max_examples=60, deadline=None)
@given(
    per_turn=st.integers(1, 6),
    loops=st.integers(0, 10),
    on_limit=st.sampled_from(["stop", "wrap_up"]),
)
def test_a_model_call_limit_never_passes_its_limit_whichever_way_it_ends(
    per_turn: int, loops: int, on_limit: Any
) -> None:
    """Whatever the model does, the turn makes at most ``per_turn`` calls; one that
    wraps up ends with the answer to a request that offered no tools."""
    import anyio

    asked = [0]

    def answer(messages: list[dict[str, Any]]) -> ModelReply:
        """``loops`` calls of ``look``, then done; the wrap-up answered whenever asked."""
        if asked_to_wrap_up(messages):
            return ModelReply(LAST)
        asked[0] += 1
        if asked[0] <= loops:
            return ModelReply(tool_calls=(ToolCallRequest("look", {}),))
        return ModelReply("done")

    model = ScriptedModel([answer] * 20)
    limit = ModelCallLimit(per_turn=per_turn, on_limit=on_limit)
    agent = harness_with(model, limit).loop.create("s")
    result = anyio.run(agent.prompt, "go")
    assert len(model.requests) <= per_turn
    if result.reason == "completed":
        assert loops < per_turn - (on_limit == "wrap_up") or loops < per_turn
        assert all(len(tools) == 1 for tools in model.tool_schemas)
    else:
        assert result.reason == "blocked"
        wrapped = on_limit == "wrap_up"
        assert (result.text == LAST) is wrapped
        assert (len(model.tool_schemas[-1]) == 0) is wrapped
