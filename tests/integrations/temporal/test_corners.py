"""Temporal's corners: hostile replies, a cancelled turn, resume while a turn runs, a tool's
BaseException, agents that share a name — on the time-skipping server from its wheel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.pipeline import (
    TOOL_FAILED,
    UNKNOWN_TOOL,
    ConfigError,
    ModelReply,
    ToolCallRequest,
    ToolDefinition,
)
from guardstack.pipeline.session import ToolResultEvent
from tests.integrations.temporal_agents import ConversationModel, ask

temporalio = pytest.importorskip("temporalio", reason="pip install 'guardstack[temporal]'")

from temporalio.client import Client  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from guardstack.integrations.temporal import Conversation, TemporalAgent, worker  # noqa: E402
from tests.integrations.temporal.test_agent import BIN  # noqa: E402


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


class Stop(BaseException):
    """Not an Exception."""


async def stops(arguments: Any, call: Any) -> str:
    raise Stop


async def slow(arguments: Any, call: Any) -> str:
    await asyncio.sleep(30)
    return "slow"


async def look(arguments: Any, call: Any) -> str:
    return "seen"


def agent(name: str, replies: list[ModelReply]) -> TemporalAgent:
    return TemporalAgent(
        name,
        tools=[
            ToolDefinition("stops", stops),
            ToolDefinition("slow", slow, timeout_ms=60_000),
            ToolDefinition("look", look),
        ],
        model=ConversationModel(replies),
        plugins=lambda: [ToolCallTimeoutPolicy()],
    )


@asynccontextmanager
async def served(*agents: TemporalAgent) -> AsyncIterator[Client]:
    server = Path(BIN) / "temporal-test-server"
    async with (
        await WorkflowEnvironment.start_time_skipping(test_server_existing_path=str(server)) as env,
        worker(env.client, "corners", list(agents)),
    ):
        yield env.client


async def test_temporal_corners(anyio_backend: Any) -> None:
    hostile = ModelReply(tool_calls=[ToolCallRequest(None, {}, 7), ToolCallRequest(42, {})])
    async with served(
        agent("hostile", [hostile, ModelReply("done")]),
        agent("stopper", [ask("stops", {}), ModelReply("done")]),
        agent("slowpoke", [ask("slow", {}), ModelReply("done")]),
    ) as client:
        # A reply naming no tool (or a number) is answered and logged as text: the next
        # turn's workflow loads the log instead of failing forever.
        talk = Conversation(client, "hostile", "hostile-1", "corners")
        assert (await talk.prompt("go")).reason == "completed"
        assert (await talk.prompt("again")).reason == "completed"
        codes = [
            e.result.code
            for e in (await talk.prompt("once more")).session().events
            if isinstance(e, ToolResultEvent)
        ]
        assert codes[:2] == [UNKNOWN_TOOL, UNKNOWN_TOOL]

        # A tool raising a BaseException in its activity failed; the worker was not lost.
        stopper = Conversation(client, "stopper", "stopper-1", "corners")
        outcome = await stopper.prompt("go")
        [result] = [e.result for e in outcome.session().events if isinstance(e, ToolResultEvent)]
        assert result.code == TOOL_FAILED

        # Cancelled mid-tool from the client: the turn ends aborted with its log whole, and
        # the conversation goes on from it (the prompt is not lost).
        slowpoke = Conversation(client, "slowpoke", "slow-1", "corners")
        running = asyncio.ensure_future(slowpoke.prompt("wait for it"))
        await asyncio.sleep(0.5)
        later = await Conversation(client, "slowpoke", "slow-1", "corners").resume()
        assert (later.turns, later.running) == (0, "slow-1/turn-1")  # never waited for it
        await client.get_workflow_handle("slow-1/turn-1").cancel()
        aborted = await running
        assert aborted.reason == "aborted"
        assert "wait for it" in [m["content"] for m in aborted.session().messages()]
        resumed = await Conversation(client, "slowpoke", "slow-1", "corners").resume()
        assert resumed.turns == 1
        assert resumed.log == aborted.log


async def test_one_worker_refuses_two_agents_with_one_name(anyio_backend: Any) -> None:
    with pytest.raises(ConfigError, match="two agents named 'twin'"):
        async with served(agent("twin", [ModelReply("a")]), agent("twin", [ModelReply("b")])):
            pass
