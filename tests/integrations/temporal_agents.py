"""Agents the Temporal tests' workers run (importable by worker subprocesses).

The model is a function of the conversation so far (how many tool results it has),
not a script with a position: any worker, in any process, answers the same.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.integrations.temporal import TemporalAgent
from guardstack.pipeline import ModelReply, ToolCallRequest, ToolDefinition
from guardstack.wrappers import Retry


def ask(name: str, arguments: dict[str, Any]) -> ModelReply:
    return ModelReply(tool_calls=[ToolCallRequest(name, arguments)])


class ConversationModel:
    """Replies by how many tool results the conversation holds: any process agrees."""

    model = "conversation-model"

    def __init__(self, replies: list[ModelReply]) -> None:
        self.replies = replies

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        answered = sum(1 for message in messages if message["role"] == "tool")
        return self.replies[min(answered, len(self.replies) - 1)]


# -- the kill test: a deploy that must not run twice, then a status check -----------------

MARKS = Path(os.environ.get("GUARDSTACK_TEMPORAL_MARKS", "."))


async def deploy(arguments: Any, call: Any) -> str:
    with (MARKS / "deploy.log").open("a") as log:
        log.write(f"started {os.getpid()}\n")
    await asyncio.sleep(5)  # the test kills this worker here
    with (MARKS / "deploy.log").open("a") as log:
        log.write(f"finished {os.getpid()}\n")
    return "deployed"


async def status(arguments: Any, call: Any) -> str:
    with (MARKS / "status.log").open("a") as log:
        log.write(f"ran {os.getpid()}\n")
    return "all green"


def deployer() -> TemporalAgent:
    return TemporalAgent(
        "deployer",
        tools=[
            ToolDefinition("deploy", deploy, timeout_ms=60_000, idempotent=False),
            ToolDefinition("status", status, timeout_ms=60_000, idempotent=True),
        ],
        model=ConversationModel(
            [
                ask("deploy", {"service": "api"}),
                ask("status", {"service": "api"}),
                ModelReply("done"),
            ]
        ),
        plugins=lambda: [Retry(attempts=2, backoff_ms=100), ToolCallTimeoutPolicy()],
        heartbeat_ms=2_000,
    )


# -- the retried kill test: an idempotent fetch, lost with its worker, run again ----------


async def fetch(arguments: Any, call: Any) -> str:
    log_path = MARKS / "fetch.log"
    with log_path.open("a") as log:
        log.write(f"started {os.getpid()}\n")
    if len(log_path.read_text().splitlines()) == 1:
        await asyncio.sleep(5)  # the first attempt: the test kills this worker here
    return "fetched"


def fetcher() -> TemporalAgent:
    return TemporalAgent(
        "fetcher",
        tools=[ToolDefinition("fetch", fetch, timeout_ms=60_000, idempotent=True)],
        model=ConversationModel(
            [ask("fetch", {"url": "https://example.test"}), ModelReply("done")]
        ),
        plugins=lambda: [
            Retry(attempts=2, backoff_ms=100, retry_on=("ABORTED",)),
            ToolCallTimeoutPolicy(),
        ],
        heartbeat_ms=2_000,
    )
