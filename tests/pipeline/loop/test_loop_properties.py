"""Properties of the loop over random scripts: the log is the truth, and it stays whole."""

from __future__ import annotations

import zlib
from typing import Any

import anyio
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import (
    Accept,
    AgentLoop,
    ContextMessage,
    MessageSource,
    ModelReply,
    ScriptedModel,
    Session,
    ToolCall,
    ToolCallEvent,
    ToolCallRequest,
    ToolResult,
    ToolResultEvent,
    UserMessage,
)
from guardstack.pipeline.testing import Hang, Raise, Reply, ScriptedTool
from tests.helpers import registry_with

TOOLS = ("ok", "slow", "boom", "hang", "unknown")
NOTE = MessageSource("plugin", "random-notes")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
requests = st.tuples(
    st.sampled_from(TOOLS),
    st.dictionaries(st.text(max_size=4), json_values, max_size=3) | st.just("{broken json"),
)
scripts = st.lists(st.lists(requests, min_size=1, max_size=4), max_size=5)


def assert_log_is_whole(session: Session) -> None:
    called = [e.call_id for e in session.events if isinstance(e, ToolCallEvent)]
    answered = [e.call_id for e in session.events if isinstance(e, ToolResultEvent)]
    assert sorted(called) == sorted(answered)
    assert len(set(answered)) == len(answered)
    # A context never lands between two tool results of a step.
    in_contexts = False
    for event in session.events:
        if event.type == "step/start":
            in_contexts = False
        elif isinstance(event, UserMessage) and event.source == NOTE:
            in_contexts = True
        elif isinstance(event, ToolResultEvent):
            assert not in_contexts, "a context landed between two tool results"


@given(
    script=scripts,
    parallel=st.sampled_from([1, 2, 4]),
    notes=st.integers(0, 2**16),
    cancel_after=st.none() | st.floats(0.1, 20),
)
async def test_requests_are_the_log_and_the_log_stays_whole(
    script: list[list[tuple[str, Any]]], parallel: int, notes: int, cancel_after: float | None
) -> None:
    registry = registry_with(
        ScriptedTool("ok", ["fine"]),
        ScriptedTool("slow", [Reply("late", after_ms=2000)]),
        ScriptedTool("boom", [Raise(RuntimeError("tool broke"), after_ms=500)]),
        ScriptedTool("hang", [Hang()]),
    )

    async def random_notes(call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        decision = await call_next(call, result)
        count = zlib.crc32(f"{notes}:{call.call_id}".encode()) % 3
        extra = [ContextMessage(f"note {call.call_id} #{i}", NOTE) for i in range(count)]
        return Accept(additional_contexts=[*decision.additional_contexts, *extra])

    registry.post_execute.use(random_notes)
    snapshots: list[list[dict[str, Any]]] = []
    agent_box: list[Any] = []

    def step(reply: ModelReply) -> Any:
        def answer(messages: list[dict[str, Any]]) -> ModelReply:
            snapshots.append(agent_box[0].session.rebuild_messages())
            return reply

        return answer

    replies = [
        step(
            ModelReply(
                f"step {index}",
                tuple(
                    ToolCallRequest(name, arguments, f"c{index}-{position}")
                    for position, (name, arguments) in enumerate(step_calls)
                ),
            )
        )
        for index, step_calls in enumerate(script)
    ]
    model = ScriptedModel([*replies, step(ModelReply("final"))])
    agent = AgentLoop(registry, model, max_parallel_tool_calls=parallel).create("s")
    agent_box.append(agent)

    has_hang = any(name == "hang" for step_calls in script for name, _ in step_calls)
    with anyio.move_on_after(cancel_after if cancel_after is not None else 1000):
        await agent.prompt("start")
    if not has_hang and cancel_after is None:
        assert agent.session.events[-1].type == "turn/end"
        assert agent.session.events[-1].reason == "completed"  # type: ignore[union-attr]

    assert model.requests == snapshots
    # the incrementally built request is the log rebuilt from scratch
    assert agent.session.messages() == agent.session.rebuild_messages()
    assert_log_is_whole(agent.session)
    assert agent.session.events[-1].type == "turn/end"
    restored = Session.from_jsonl(agent.session.to_jsonl())
    assert list(restored.events) == list(agent.session.events)
    assert restored.messages() == agent.session.messages()
