"""Guards outside the agent loop: conversation keys, the anonymous conversation, reset, bounds."""

from __future__ import annotations

import gc

import pytest

from guardstack.guards import RepeatToolReminder, ToolCallLimit
from guardstack.guards.agent_state import MAX_CONVERSATIONS
from guardstack.pipeline import (
    TOOL_DENIED,
    GuardstackWarning,
    Harness,
    MemoryStore,
    ToolCall,
    ToolDefinition,
)
from guardstack.pipeline.testing import ScriptedTool


def guarded(*plugins: object) -> Harness:
    harness = Harness()
    ScriptedTool("search", ["hits"]).register(harness.tools)
    for plugin in plugins:
        harness.plugin(plugin)  # type: ignore[arg-type]
    return harness


def search(call_id: str, conversation: object = None) -> ToolCall:
    return ToolCall("search", {"q": "x"}, call_id, conversation=conversation)


async def test_calls_with_no_agent_and_no_conversation_are_one_conversation_with_a_warning() -> (
    None
):
    harness = guarded(ToolCallLimit(per_turn=2), RepeatToolReminder(thresholds=(2, 3)))
    codes, reminders = [], 0

    async def five_calls() -> None:
        nonlocal reminders
        for index in range(5):
            outcome = await harness.tools.execute(search(f"c{index}"))
            codes.append(outcome.result.code)
            reminders += len(outcome.contexts)

    with pytest.warns(GuardstackWarning, match="neither an agent nor a conversation") as caught:
        await five_calls()
    assert codes == [None, None, TOOL_DENIED, TOOL_DENIED, TOOL_DENIED]
    assert reminders == 2  # at the 2nd and 3rd identical calls
    assert len(caught) == 2  # once per guard, not once per call


async def test_conversation_keys_keep_state_apart_and_reset_starts_a_new_turn() -> None:
    limit = ToolCallLimit(per_turn=2)
    harness = guarded(limit)

    async def code(call_id: str, conversation: str) -> str | None:
        return (await harness.tools.execute(search(call_id, conversation))).result.code

    assert [await code(f"a{n}", "thread-a") for n in range(3)] == [None, None, TOOL_DENIED]
    assert [await code(f"b{n}", "thread-b") for n in range(2)] == [None, None]
    limit.reset("thread-a")
    assert await code("a3", "thread-a") is None
    assert await code("b2", "thread-b") == TOOL_DENIED


async def test_reset_reaches_every_harness_the_guard_is_applied_to() -> None:
    reminder = RepeatToolReminder(thresholds=(2, 3))
    first, second = guarded(reminder), guarded(reminder)
    for harness in (first, second):
        await harness.tools.execute(search("c1", "t"))
    reminder.reset("t")
    for harness in (first, second):
        outcome = await harness.tools.execute(search("c2", "t"))
        assert outcome.contexts == ()  # the chain started again


async def test_a_hundred_thousand_conversations_leave_bounded_state() -> None:
    limit = ToolCallLimit(per_turn=5)
    # the counts live in the harness's store, itself bounded (idle counters go first)
    harness = Harness(store=MemoryStore(max_keys=MAX_CONVERSATIONS))

    async def search_tool(arguments: object, call: object) -> str:
        return "hits"

    harness.tools.register(ToolDefinition("search", search_tool))
    harness.plugin(limit)
    gc.collect()
    before = len(gc.get_objects())
    for index in range(100_000):
        await harness.tools.execute(search(f"c{index}", f"conversation-{index}"))
    gc.collect()
    retained = len(gc.get_objects()) - before
    [state] = list(limit._resets._states)
    assert len(state) == MAX_CONVERSATIONS
    assert len(harness.store) <= MAX_CONVERSATIONS  # type: ignore[arg-type]
    # a few objects per remembered conversation — its turn token, its window in the
    # ledger (a counter, its key, its expiry) and the cap's note of it — none for the
    # 90,000 forgotten (their turns' windows closed as they went)
    assert retained < 6 * MAX_CONVERSATIONS
    # the most recent conversations are the ones remembered
    assert (await harness.tools.execute(search("again", "conversation-99999"))).result.code is None
