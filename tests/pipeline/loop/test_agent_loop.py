"""The agent loop: turns, steps, contexts, caps, parallel calls and cancellation."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from guardstack.pipeline import (
    INVALID_ARGUMENTS,
    TOOL_ABORTED,
    TOOL_ABORTED_BEFORE_DISPATCH,
    Accept,
    AgentLoop,
    AssistantMessage,
    ConfigError,
    ContextMessage,
    Harness,
    MessageSource,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolCallEvent,
    ToolCallRequest,
    ToolDefinition,
    ToolRegistry,
    ToolResult,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
)
from guardstack.pipeline.session import Session
from guardstack.pipeline.testing import Hang, Reply, ScriptedTool
from tests.helpers import calls, registry_with, results_by_id

NOTE = MessageSource("plugin", "note-taker")


def types_of(session: Session) -> list[str]:
    return [event.type for event in session.events]


def assert_every_call_answered_once(session: Session) -> None:
    called = [e.call_id for e in session.events if isinstance(e, ToolCallEvent)]
    answered = [e.call_id for e in session.events if isinstance(e, ToolResultEvent)]
    assert sorted(called) == sorted(answered)
    assert len(set(answered)) == len(answered)


async def test_one_turn_logs_every_event_in_order() -> None:
    model = ScriptedModel([calls(("echo", {"x": 1})), ModelReply("all done")])
    loop = AgentLoop(registry_with(ScriptedTool("echo", ["echoed"])), model)
    agent = loop.create("s")
    result = await agent.prompt("hello")
    assert (result.reason, result.text, result.steps) == ("completed", "all done", 2)
    assert types_of(agent.session) == [
        "turn/start",
        "user/message",
        "step/start",
        "assistant/message",
        "tool/call",
        "tool/result",
        "step/end",
        "step/start",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    user = agent.session.events[1]
    assert isinstance(user, UserMessage)
    assert (user.text, user.source) == ("hello", MessageSource("user"))
    end = agent.session.events[-1]
    assert isinstance(end, TurnEnd)
    assert end.reason == "completed"


async def test_every_request_is_the_log_rebuilt_in_openai_format() -> None:
    model = ScriptedModel([calls(("echo", {"x": 1})), ModelReply("done")])
    registry = registry_with(ScriptedTool("echo", ["echoed"]))
    agent = AgentLoop(registry, model).create("s")
    await agent.prompt("hi")
    assert model.requests[0] == [{"role": "user", "content": "hi"}]
    assert model.requests[1] == [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1_1_0",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"x": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1_1_0", "content": "echoed"},
    ]
    assert agent.session.messages()[-1] == {"role": "assistant", "content": "done"}
    assert model.tool_schemas[0] == registry.schemas()


async def test_contexts_follow_all_of_a_steps_results_with_their_source() -> None:
    async def note(call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        await call_next(call, result)
        return Accept(additional_contexts=[ContextMessage(f"noted {call.call_id}", NOTE)])

    registry = registry_with(ScriptedTool("a"), ScriptedTool("b"))
    registry.post_execute.use(note)
    model = ScriptedModel([calls(("a", {}), ("b", {})), ModelReply("ok")])
    agent = AgentLoop(registry, model).create("s")
    await agent.prompt("go")
    step_one = types_of(agent.session)[2:11]
    assert step_one == [
        "step/start",
        "assistant/message",
        "tool/call",
        "tool/result",
        "tool/call",
        "tool/result",
        "user/message",
        "user/message",
        "step/end",
    ]
    notes = [e for e in agent.session.events if isinstance(e, UserMessage) and e.source == NOTE]
    assert [n.text for n in notes] == ["noted call_1_1_0", "noted call_1_1_1"]
    assert model.requests[1][-2:] == [
        {"role": "user", "content": "noted call_1_1_0"},
        {"role": "user", "content": "noted call_1_1_1"},
    ]


async def test_max_steps_ends_the_turn_and_stops_asking_the_model() -> None:
    model = ScriptedModel([calls(("echo", {}))] * 10)
    agent = AgentLoop(registry_with(ScriptedTool("echo")), model, max_steps=3).create("s")
    result = await agent.prompt("loop forever")
    assert result.reason == "max-steps"
    assert len(model.requests) == 3
    assert_every_call_answered_once(agent.session)


async def test_a_model_that_raises_ends_the_turn_with_reason_error() -> None:
    model = ScriptedModel([ConnectionError("provider down")])
    agent = AgentLoop(ToolRegistry(), model).create("s")
    result = await agent.prompt("hi")
    assert result.reason == "error"
    assert result.error == "ConnectionError: provider down"
    end = agent.session.events[-1]
    assert isinstance(end, TurnEnd)
    assert (end.reason, end.error) == ("error", "ConnectionError: provider down")


async def test_a_model_returning_something_else_ends_the_turn_with_an_error() -> None:
    class Broken:
        async def complete(self, messages: Any, tools: Any) -> Any:
            return {"content": "a dict, not a ModelReply"}

    agent = AgentLoop(ToolRegistry(), Broken()).create("s")
    result = await agent.prompt("hi")
    assert result.reason == "error"
    assert result.error is not None
    assert result.error.startswith("TypeError: the model returned {'content'")


async def test_running_out_of_script_is_a_clear_error_not_a_hang() -> None:
    model = ScriptedModel([calls(("echo", {}))])
    agent = AgentLoop(registry_with(ScriptedTool("echo")), model).create("s")
    result = await agent.prompt("hi")
    assert result.reason == "error"
    assert result.error == (
        "ScriptExhaustedError: ScriptedModel has no reply for request 2: its script holds 1"
    )


async def test_prompt_submit_sees_and_may_rewrite_each_new_prompt() -> None:
    seen: list[str] = []
    model = ScriptedModel([ModelReply("a"), ModelReply("b")])
    loop = AgentLoop(ToolRegistry(), model)

    async def shout(agent: Any, text: str, call_next: Any) -> str:
        seen.append(text)
        rewritten: str = await call_next(agent, text.upper())
        return rewritten

    loop.prompt_submit.use(shout)
    agent = loop.create("s")
    await agent.prompt("one")
    await agent.prompt("two")
    assert seen == ["one", "two"]
    assert model.requests[1][0] == {"role": "user", "content": "ONE"}
    assert model.requests[1][-1] == {"role": "user", "content": "TWO"}


async def test_model_argument_text_is_parsed_kept_verbatim_and_bad_json_is_answered() -> None:
    tool = ScriptedTool("echo")
    model = ScriptedModel(
        [
            ModelReply(
                tool_calls=[
                    ToolCallRequest("echo", "", "empty"),
                    ToolCallRequest("echo", '{"a":1}', "compact"),
                    ToolCallRequest("echo", '{"a": tru', "broken"),
                ]
            ),
            ModelReply("ok"),
        ]
    )
    agent = AgentLoop(registry_with(tool), model).create("s")
    await agent.prompt("go")
    assert [run.call.arguments for run in tool.runs] == [{}, {"a": 1}]
    results = results_by_id(agent.session)
    assert results["broken"].code == INVALID_ARGUMENTS
    sent = model.requests[1][1]["tool_calls"]
    assert [c["function"]["arguments"] for c in sent] == ["", '{"a":1}', '{"a": tru']


async def test_parallel_calls_overlap_but_results_keep_the_models_order() -> None:
    tools = [
        ScriptedTool(name, [Reply(name, after_ms=delay * 1000)])
        for name, delay in (("slow", 3.0), ("medium", 2.0), ("fast", 1.0))
    ]
    post_order: list[str] = []

    async def record(call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        post_order.append(call.name)
        return await call_next(call, result)

    registry = registry_with(*tools)
    registry.post_execute.use(record)
    model = ScriptedModel([calls(("slow", {}), ("medium", {}), ("fast", {})), ModelReply("ok")])
    agent = AgentLoop(registry, model, max_parallel_tool_calls=3).create("s")
    started = anyio.current_time()
    await agent.prompt("go")
    assert anyio.current_time() - started == pytest.approx(3.0)
    assert [tool.runs[0].ended for tool in tools] == pytest.approx(
        [started + 3, started + 2, started + 1]
    )
    logged = [e.result.content for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert logged == ["slow", "medium", "fast"]
    assert post_order == ["slow", "medium", "fast"]


async def test_parallelism_is_bounded_by_max_parallel_tool_calls() -> None:
    tool = ScriptedTool("work", [Reply("done", after_ms=1000)])
    model = ScriptedModel([calls(*[("work", {"i": i}) for i in range(5)]), ModelReply("ok")])
    agent = AgentLoop(registry_with(tool), model, max_parallel_tool_calls=2).create("s")
    started = anyio.current_time()
    await agent.prompt("go")
    assert anyio.current_time() - started == pytest.approx(3.0)  # ceil(5 / 2) rounds


async def test_a_tool_may_run_its_own_agent_inside_a_parallel_step() -> None:
    registry = registry_with(ScriptedTool("leaf", ["leaf result"]))
    inner_model = ScriptedModel([calls(("leaf", {})), ModelReply("sub-agent done")])
    loop = AgentLoop(registry, ScriptedModel([]), max_parallel_tool_calls=2)
    sub_agents: list[Any] = []

    async def delegate(arguments: Any, call: ToolCall) -> str:
        sub_agent = loop.create("sub", model=inner_model)
        sub_agents.append(sub_agent)
        return (await sub_agent.prompt("do it")).text

    registry.register(ToolDefinition("delegate", delegate))
    model = ScriptedModel([calls(("delegate", {}), ("leaf", {})), ModelReply("ok")])
    agent = loop.create("main", model=model)
    await agent.prompt("go")
    assert [r.content for r in results_by_id(agent.session).values()] == [
        "sub-agent done",
        "leaf result",
    ]
    assert_every_call_answered_once(agent.session)
    assert next(iter(results_by_id(sub_agents[0].session).values())).content == "leaf result"


@pytest.mark.parametrize("parallel", [1, 3])
async def test_a_cancelled_turn_answers_every_call_and_re_raises(parallel: int) -> None:
    registry = registry_with(
        ScriptedTool("quick", [Reply("q", after_ms=500)]), ScriptedTool("hang", [Hang()])
    )
    model = ScriptedModel([calls(("quick", {}), ("hang", {}), ("quick", {}))])
    agent = AgentLoop(registry, model, max_parallel_tool_calls=parallel).create("s")
    with anyio.move_on_after(10) as scope:
        await agent.prompt("go")
        pytest.fail("prompt returned")
    assert scope.cancelled_caught
    results = results_by_id(agent.session)
    assert results["call_1_1_0"].content == "q"
    assert results["call_1_1_1"].code == TOOL_ABORTED
    assert results["call_1_1_1"].content == "Error: tool call aborted"
    expected_third = TOOL_ABORTED if parallel > 1 else TOOL_ABORTED_BEFORE_DISPATCH
    assert results["call_1_1_2"].code == expected_third
    assert_every_call_answered_once(agent.session)
    assert types_of(agent.session)[-2:] == ["step/end", "turn/end"]
    end = agent.session.events[-1]
    assert isinstance(end, TurnEnd)
    assert end.reason == "aborted"


@pytest.mark.parametrize("parallel", [1, 2])
async def test_a_tool_that_ignores_cancellation_is_waited_for_and_logged_aborted(
    parallel: int,
) -> None:
    stubborn = ScriptedTool(
        "stubborn", [Reply("finished anyway", after_ms=5000, ignore_cancel=True)]
    )
    model = ScriptedModel([calls(("stubborn", {}), ("stubborn", {}))])
    agent = AgentLoop(registry_with(stubborn), model, max_parallel_tool_calls=parallel).create("s")
    started = anyio.current_time()
    with anyio.move_on_after(1):
        await agent.prompt("go")
    assert anyio.current_time() - started == pytest.approx(5)  # never abandoned
    results = results_by_id(agent.session)
    assert results["call_1_1_0"].code == TOOL_ABORTED
    expected_second = TOOL_ABORTED if parallel > 1 else TOOL_ABORTED_BEFORE_DISPATCH
    assert results["call_1_1_1"].code == expected_second
    assert_every_call_answered_once(agent.session)


async def test_cancelling_while_the_model_thinks_leaves_no_dangling_call() -> None:
    async def think_forever(messages: Any) -> ModelReply:
        await anyio.sleep(math.inf)
        raise AssertionError

    agent = AgentLoop(ToolRegistry(), ScriptedModel([think_forever])).create("s")
    with anyio.move_on_after(1):
        await agent.prompt("go")
    assert types_of(agent.session) == [
        "turn/start",
        "user/message",
        "step/start",
        "step/end",
        "turn/end",
    ]


def test_creating_an_agent_without_any_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no model"):
        AgentLoop(ToolRegistry()).create("s")


@pytest.mark.parametrize("key", ["max_steps", "max_parallel_tool_calls"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_loop_limits_must_be_positive_integers(key: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match=key):
        AgentLoop(ToolRegistry(), **{key: bad})


async def test_unserialisable_arguments_from_a_model_keep_the_log_valid(tmp_path: Any) -> None:
    model = ScriptedModel([calls(("echo", {"s": {1, 2}})), ModelReply("ok")])
    agent = AgentLoop(registry_with(ScriptedTool("echo")), model).create("s")
    await agent.prompt("go")
    assert results_by_id(agent.session)["call_1_1_0"].code == INVALID_ARGUMENTS
    agent.session.save(tmp_path / "s.jsonl")
    loaded = Session.load(tmp_path / "s.jsonl")
    assert loaded.messages() == agent.session.messages()
    sent = model.requests[1][1]["tool_calls"][0]["function"]["arguments"]
    assert sent == '{"s": "<unserialisable set>"}'


async def test_harness_builds_a_working_loop() -> None:
    harness = Harness(model=ScriptedModel([ModelReply("hi there")]), max_steps=4)
    assert harness.loop.max_steps == 4
    agent = harness.loop.create("s")
    assert (await agent.prompt("hi")).text == "hi there"
    assistant = agent.session.events[3]
    assert isinstance(assistant, AssistantMessage)
    assert assistant.text == "hi there"


def _answering_hook(execute: Any) -> Any:
    async def answer(call: ToolCall) -> Any:
        from guardstack.pipeline import ToolOutcome

        return ToolOutcome(ToolResult(f"answered {call.call_id} by the hook"))

    return answer


def _twice_hook(execute: Any) -> Any:
    async def twice(call: ToolCall) -> Any:
        await execute(call)
        return await execute(call)

    return twice


@pytest.mark.parametrize("hook", [_answering_hook, _twice_hook])
@pytest.mark.parametrize("parallel", [1, 3])
async def test_an_instrument_hook_behaves_the_same_in_parallel_and_sequential_steps(
    hook: Any, parallel: int
) -> None:
    """A hook that answers itself or calls through twice: one call and one result each."""
    tool = ScriptedTool("echo", [Reply("e", after_ms=100)] * 6)
    registry = registry_with(tool)
    registry.instrument(hook)
    script = [calls(("echo", {"n": 1}), ("echo", {"n": 2}), ("echo", {"n": 3})), ModelReply("ok")]
    agent = AgentLoop(registry, ScriptedModel(script), max_parallel_tool_calls=parallel).create("s")
    with anyio.fail_after(5):
        turn = await agent.prompt("go")
    assert turn.reason == "completed"
    assert_every_call_answered_once(agent.session)
    events = [e for e in agent.session.events if isinstance(e, ToolCallEvent | ToolResultEvent)]
    ids = [(e.type, e.call_id) for e in events]
    for index, (kind, call_id) in enumerate(ids):
        if kind == "tool/result":  # never a result before its call
            assert ("tool/call", call_id) in ids[:index]
    results = [e.call_id for e in events if isinstance(e, ToolResultEvent)]
    assert results == sorted(results)  # the model's order
    expected_runs = 0 if hook is _answering_hook else 6
    assert len(tool.runs) == expected_runs


def test_an_agent_is_made_with_its_tenant_and_priority() -> None:
    """What admission layers and tenant windows read is the agent's from the start: no
    write from outside after ``create``."""
    from guardstack.pipeline import ConfigError, ModelRequest, ToolCall

    loop = Harness(ScriptedModel([])).loop
    agent = loop.create("s", tenant="team-a", priority=4)
    assert (agent.tenant, agent.priority) == ("team-a", 4)
    assert ToolCall("t", {}, "c", agent).owner == "team-a"
    assert ModelRequest(agent, [], []).queue_priority == 4
    plain = loop.create("p")
    assert (plain.tenant, plain.priority) == (None, 0)
    for bad in ({"tenant": ""}, {"tenant": 3}, {"priority": "high"}, {"priority": True}):
        with pytest.raises(ConfigError, match=r"AgentLoop\.create"):
            loop.create("x", **bad)
