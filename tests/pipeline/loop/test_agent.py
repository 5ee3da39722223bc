"""``Agent``: one conversation's turns — one at a time, cancelled without raising, its
own model or the loop's, resumed from its log; and what it owns is not written from
outside (virtual time, both backends)."""

from __future__ import annotations

import anyio
import pytest

from guardstack.pipeline import (
    TOOL_ABORTED,
    AgentLoop,
    Harness,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    ToolRegistry,
    TurnEnd,
    TurnInProgressError,
)
from guardstack.pipeline.session import Session
from guardstack.pipeline.testing import Hang, ScriptedTool
from tests.helpers import calls, registry_with, results_by_id


def test_what_an_agent_owns_is_not_written_from_outside() -> None:
    agent = Harness(ScriptedModel([])).loop.create("a")
    for name, value in (("parent", None), ("depth", 2), ("turn_deadline", 1.0)):
        with pytest.raises(AttributeError):
            setattr(agent, name, value)
    assert not hasattr(agent, "tree_caps")  # the ancestors' caps are the tree's: tree.py


def test_an_agents_tenant_and_priority_are_set_at_create_and_a_later_write_warns() -> None:
    agent = Harness(ScriptedModel([])).loop.create("a", tenant="team-a", priority=2)
    request = ModelRequest(agent, [], [])
    assert (agent.tenant, request.owner, request.queue_priority) == ("team-a", "team-a", 2)
    with pytest.warns(DeprecationWarning, match=r"loop\.create\(\.\.\., tenant='team-b'\)"):
        agent.tenant = "team-b"
    with pytest.warns(DeprecationWarning, match=r"priority=5\)"):
        agent.priority = 5
    assert (request.owner, request.queue_priority) == ("team-b", 5)  # still written, until 0.3


async def test_agent_cancel_ends_the_turn_as_aborted_without_raising() -> None:
    registry = registry_with(ScriptedTool("hang", [Hang()]))
    agent = AgentLoop(registry, ScriptedModel([calls(("hang", {}))])).create("s")
    results = []

    async def run() -> None:
        results.append(await agent.prompt("go"))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await anyio.sleep(1)
        agent.cancel()
    assert [r.reason for r in results] == ["aborted"]
    assert results_by_id(agent.session)["call_1_1_0"].code == TOOL_ABORTED
    assert agent.session.messages()[-1]["role"] == "tool"


async def test_a_second_prompt_while_a_turn_runs_is_refused() -> None:
    agent = AgentLoop(
        registry_with(ScriptedTool("hang", [Hang()])), ScriptedModel([calls(("hang", {}))])
    ).create("s")
    async with anyio.create_task_group() as group:
        group.start_soon(agent.prompt, "first")
        await anyio.sleep(1)
        with pytest.raises(TurnInProgressError):
            await agent.prompt("second")
        agent.cancel()


async def test_agents_share_the_registry_and_may_have_their_own_model() -> None:
    tool = ScriptedTool("echo")
    shared = ScriptedModel([ModelReply("from shared")])
    own = ScriptedModel([calls(("echo", {})), ModelReply("from own")])
    loop = AgentLoop(registry_with(tool), shared)
    first, second = loop.create("one"), loop.create("two", model=own)
    assert first != second
    assert (await first.prompt("hi")).text == "from shared"
    assert (await second.prompt("hi")).text == "from own"
    assert [run.call.agent for run in tool.runs] == [second]


async def test_a_resumed_session_continues_its_turns_with_the_whole_history() -> None:
    first = ScriptedModel([ModelReply("one")])
    agent = AgentLoop(ToolRegistry(), first).create("s")
    await agent.prompt("first")
    restored = Session.from_jsonl(agent.session.to_jsonl())
    second = ScriptedModel([ModelReply("two")])
    resumed = AgentLoop(ToolRegistry(), second).create("s", session=restored)
    await resumed.prompt("second")
    assert second.requests[0] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
    ]
    ends = [e.turn for e in resumed.session.events if isinstance(e, TurnEnd)]
    assert ends == [1, 2]
