"""AgentTool: a child agent inside its parent's budget and deadline (virtual time, both
backends) — the user reports' repro: a parent capped at $1.25 whose two children
would spend $2.00 between them."""

from __future__ import annotations

from typing import Any

import anyio

from guardstack.guards import TurnDeadline, UsageLimit
from guardstack.pipeline import (
    AGENT_STOPPED,
    TOOL_ABORTED,
    AgentTool,
    Harness,
    ModelReply,
    ToolCallRequest,
    ToolResultEvent,
    TurnEnd,
    Usage,
    tool,
)

PRICES = {"m": (0.0, 1.0)}  # $1 per million output tokens
QUARTER = Usage(0, 250_000)  # $0.25 a call


class Researcher:
    """Four model calls of $0.25 each (three searches, then the answer): $1.00 a task."""

    model = "m"

    async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
        done = sum(1 for m in messages if m["role"] == "tool")
        if done < 3:
            return ModelReply(
                tool_calls=[ToolCallRequest("search", {"q": str(done)})], usage=QUARTER, model="m"
            )
        return ModelReply(f"found it after {done} searches", usage=QUARTER, model="m")


class Planner:
    """Asks researcher one, then researcher two, then sums up (free calls, reported as
    such: a reply with no usage would be charged its reservation)."""

    model = "m"

    async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
        done = sum(1 for m in messages if m["role"] == "tool")
        if done < 2:
            return ModelReply(
                tool_calls=[ToolCallRequest(f"research_{done + 1}", {"task": "look"})],
                model="m",
                usage=Usage(),
            )
        return ModelReply("summary", model="m", usage=Usage())


@tool
async def search(q: str) -> str:
    """Search."""
    return f"results {q}"


def researcher() -> Harness:
    child = Harness(Researcher())
    child.tools.register(search)
    return child


def planner(*plugins: Any) -> Harness:
    parent = Harness(Planner())
    for n in (1, 2):
        parent.tools.register(
            AgentTool(f"research_{n}", researcher, description="Research a topic.")
        )
    for plugin in plugins:
        parent.plugin(plugin)
    return parent


async def test_children_spend_from_the_parents_cap_not_a_fresh_allowance() -> None:
    unbounded = planner().loop.create("free")
    result = await unbounded.prompt("plan")
    assert result.reason == "completed"
    assert result.usage == Usage(0, 2_000_000)  # $2.00: both children, rolled up

    capped = planner(UsageLimit(usd_per_session=1.25, prices=PRICES)).loop.create("capped")
    result = await capped.prompt("plan")
    spent = capped.usage.output_tokens / 1_000_000
    assert spent <= 1.25  # charged live: the cap stopped the second child mid-task
    assert spent == 1.25
    answers = [e.result for e in capped.session.events if isinstance(e, ToolResultEvent)]
    assert answers[0].content == "found it after 3 searches"
    assert answers[1].code == AGENT_STOPPED
    # the second child made one $0.25 call, then the parent's cap stopped it
    assert "stopped (blocked): usage-limit: this session cost $1.2500" in answers[1].content
    assert result.reason == "blocked"  # and the parent's own next call is refused


async def test_a_stalled_child_is_cut_at_the_parents_deadline() -> None:
    class Stalls:
        model = "m"

        async def complete(self, messages: Any, tools: Any) -> ModelReply:
            await anyio.sleep(3600)
            return ModelReply("never")

    def stalling() -> Harness:
        return Harness(Stalls())

    parent = Harness(Planner())
    parent.tools.register(AgentTool("research_1", stalling, description="Research."))
    parent.plugin(TurnDeadline(ms=2_000))
    agent = parent.loop.create("p")
    started = anyio.current_time()
    result = await agent.prompt("plan")
    took = anyio.current_time() - started
    assert result.reason == "deadline"
    assert took == 2.0  # the child had no deadline of its own: it got the parent's
    [answer] = [e.result for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert answer.code == TOOL_ABORTED
    assert [e.reason for e in agent.session.events if isinstance(e, TurnEnd)] == ["deadline"]


async def test_a_task_is_required() -> None:
    parent = Harness()
    definition = AgentTool("research", researcher, description="Research.")
    parent.tools.register(definition)
    from guardstack.pipeline import INVALID_ARGUMENTS, ToolCall

    outcome = await parent.tools.execute(ToolCall("research", {}, "c", conversation="x"))
    assert outcome.result.code == INVALID_ARGUMENTS
    assert definition.parameters["required"] == ["task"]
