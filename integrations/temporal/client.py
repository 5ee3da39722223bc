"""Running it: ``worker`` serves agents, ``Conversation`` starts and resumes turns,
``serve`` is ``guardstack worker``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import attrs

from guardstack.integrations._extras import require
from guardstack.integrations.temporal.activities import model_call, store_operation, tool_attempt
from guardstack.integrations.temporal.agent import AGENTS, OWNER, TemporalAgent
from guardstack.integrations.temporal.turn_workflow import TurnWorkflow
from guardstack.pipeline import (
    ConfigError,
    Session,
)
from guardstack.pipeline.approval import Decision, decision_from_dict, decision_to_dict

require("temporalio", "temporal")

from temporalio.client import (  # noqa: E402
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.service import RPCError  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

# -- workers and clients ------------------------------------------------------------------


@asynccontextmanager
async def worker(
    client: Client, task_queue: str, agents: Sequence[TemporalAgent], **options: Any
) -> AsyncIterator[Worker]:
    """A running Temporal worker for ``agents`` (checked first: a bad stack never starts)."""
    names = [agent.name for agent in agents]
    for agent in agents:
        agent.check()
        if names.count(agent.name) > 1:
            raise ConfigError(
                f"{OWNER}: two agents named {agent.name!r} for one worker; names pick the "
                "agent a turn runs, so each must be unique",
                key="agents",
                value=agent.name,
            )
        served = AGENTS.get((task_queue, agent.name))
        if served is not None and served is not agent:
            raise ConfigError(
                f"{OWNER}: another agent named {agent.name!r} is already served on task queue "
                f"{task_queue!r} in this process; use another name or queue",
                key="agents",
                value=agent.name,
            )
    for agent in agents:
        AGENTS[(task_queue, agent.name)] = agent
    running = Worker(
        client,
        task_queue=task_queue,
        workflows=[TurnWorkflow],
        activities=[tool_attempt, model_call, store_operation],
        **options,
    )
    try:
        async with running:
            yield running
    finally:
        for agent in agents:
            if AGENTS.get((task_queue, agent.name)) is agent:
                del AGENTS[(task_queue, agent.name)]


@attrs.frozen
class TurnOutcome:
    """What a turn ended with, and the conversation's log after it."""

    reason: str
    text: str
    error: str | None
    log: str

    def session(self) -> Session:
        return Session.from_jsonl(self.log)


class Conversation:
    """Start or continue a conversation by id: each prompt is one workflow, ``{id}/turn-{n}``."""

    def __init__(self, client: Client, agent: str, conversation_id: str, task_queue: str) -> None:
        self.client = client
        self.agent = agent
        self.conversation_id = conversation_id
        self.task_queue = task_queue
        self.turns = 0
        self.log: str | None = None
        #: The workflow id of a turn ``resume()`` found still running, if any.
        self.running: str | None = None

    async def resume(self) -> Conversation:
        """Pick up after the last finished turn recorded in Temporal, if any.

        Never waits for a turn still running: ``running`` then names its workflow id (its
        result is the next thing to wait for), and ``turns`` counts those before it.
        """
        self.running = None
        while True:
            handle = self.client.get_workflow_handle(self._workflow_id(self.turns + 1))
            try:
                described = await handle.describe()
            except RPCError:
                return self
            if described.status == WorkflowExecutionStatus.RUNNING:
                self.running = handle.id
                return self
            try:
                wire = await handle.result()
            except (RPCError, WorkflowFailureError):
                return self  # a turn that failed: nothing after it to continue from
            self.turns += 1
            self.log = wire["log"]

    def _workflow_id(self, turn: int) -> str:
        return f"{self.conversation_id}/turn-{turn}"

    async def pending(self) -> list[dict[str, Any]]:
        """The calls the running turn waits on a decision for (``[]`` if none)."""
        handle = self.client.get_workflow_handle(self._workflow_id(self.turns + 1))
        try:
            found: list[dict[str, Any]] = await handle.query("pending")
        except RPCError:
            return []
        return found

    async def decide(self, decisions: Mapping[str, Decision | Mapping[str, Any]]) -> None:
        """Send the running turn decisions by call id (``Approve()``, ``Reject(reason)``,
        ``Edit(arguments)`` or their dict form): it resumes when one it waits on comes."""
        handle = self.client.get_workflow_handle(self._workflow_id(self.turns + 1))
        wire = {
            call_id: decision_to_dict(decision_from_dict(decision, OWNER))
            for call_id, decision in decisions.items()
        }
        await handle.signal("decide", wire)

    async def prompt(self, text: str) -> TurnOutcome:
        """Run one turn; a turn paused for approval finishes once ``decide`` (from this
        client or any other) has decided what it waits on."""
        wire = await self.client.execute_workflow(
            TurnWorkflow.run,
            {
                "agent": self.agent,
                "conversation": self.conversation_id,
                "log": self.log,
                "prompt": text,
            },
            id=self._workflow_id(self.turns + 1),
            task_queue=self.task_queue,
        )
        self.turns += 1
        self.log = wire["log"]
        return TurnOutcome(wire["reason"], wire["text"], wire["error"], wire["log"])


async def serve(
    agents: Sequence[str],
    task_queue: str,
    *,
    address: str = "localhost:7233",
    namespace: str = "default",
    sticky_timeout_s: float = 10.0,
) -> None:
    """``guardstack worker``: import each ``module:function``, serve its agent until stopped."""
    import importlib

    made = []
    for reference in agents:
        module, _, attribute = reference.partition(":")
        if not module or not attribute:
            raise ConfigError(
                f"{OWNER}: {reference!r} is not module:function", key="agents", value=reference
            )
        agent = getattr(importlib.import_module(module), attribute)()
        if not isinstance(agent, TemporalAgent):
            raise ConfigError(
                f"{OWNER}: {reference} returned {agent!r}, not a TemporalAgent",
                key="agents",
                value=reference,
            )
        made.append(agent)
    client = await Client.connect(address, namespace=namespace)
    async with worker(
        client,
        task_queue,
        made,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky_timeout_s),
    ):
        names = ", ".join(agent.name for agent in made)
        print(f"worker ready: {names} on {task_queue} at {address}", flush=True)
        await asyncio.Event().wait()
