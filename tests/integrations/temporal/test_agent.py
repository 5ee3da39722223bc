"""guardstack on Temporal, against Temporal's own servers from their PyPI wheels.

* The time-skipping test server runs a turn with a rate-limited model (the retry
  waits the provider's 10 minutes as a durable timer, in virtual time), a hung
  tool cut at its budget with the seed's text, the reminder and a cap.
  Temporal's test server skips time only while no activity is running, so the
  hung tool's budget is a short real one; the hours are the backoff's.
* The dev server and two worker processes: the worker running a non-idempotent
  tool is killed mid-call; the turn completes on the other worker, every call is
  answered exactly once, and the tool ran once.

Temporal's client is asyncio-only, so these run on asyncio.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from guardstack.guards import GENTLE_TEXT, RepeatToolReminder, ToolCallLimit, ToolCallTimeoutPolicy
from guardstack.pipeline import (
    MODEL_RATE_LIMITED,
    TOOL_ABORTED,
    ConfigError,
    ModelError,
    ModelReply,
    ToolDefinition,
)
from guardstack.pipeline.session import ApprovalDecision, ToolCallEvent, ToolResultEvent
from guardstack.wrappers import Retry
from tests.integrations.temporal_agents import ConversationModel, ask

temporalio = pytest.importorskip("temporalio", reason="pip install 'guardstack[temporal]'")

from temporalio.testing import WorkflowEnvironment  # noqa: E402

from guardstack.integrations.temporal import Conversation, TemporalAgent, worker  # noqa: E402

ROOT = Path(__file__).parents[3]
BIN = Path(sys.executable).parent


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


async def never(arguments: Any, call: Any) -> str:
    await asyncio.sleep(10**6)
    return "never"


async def grep(arguments: Any, call: Any) -> str:
    return "src/app.py:3: TODO"


class RateLimitedOnce(ConversationModel):
    """Says "slow down, come back in 10 minutes" once, then follows its replies."""

    def __init__(self, replies: list[ModelReply]) -> None:
        super().__init__(replies)
        self.limited = False

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if not self.limited:
            self.limited = True
            raise ModelError("slow down", MODEL_RATE_LIMITED, retry_after_s=600)
        return await super().complete(messages, tools)


def turn_agent() -> TemporalAgent:
    return TemporalAgent(
        "turn",
        tools=[
            ToolDefinition("crawl", never, timeout_ms=1_500),
            ToolDefinition("grep", grep, timeout_ms=60_000),
        ],
        model=RateLimitedOnce(
            [ask("crawl", {"site": "a"})]
            + [ask("grep", {"q": "TODO"})] * 3
            + [ask("grep", {"q": f"page {n}"}) for n in range(10)]
        ),
        plugins=lambda: [
            Retry(stage="model", attempts=3, backoff_ms=1_000, max_backoff_ms=3_600_000),
            ToolCallTimeoutPolicy(),
            RepeatToolReminder(),
            ToolCallLimit(per_turn=6, on_exceeded="end_turn"),
        ],
    )


async def test_a_turn_on_the_time_skipping_server(anyio_backend: Any) -> None:
    server = BIN / "temporal-test-server"
    async with (
        await WorkflowEnvironment.start_time_skipping(test_server_existing_path=str(server)) as env,
        worker(env.client, "agents", [turn_agent()]),
    ):
        started_virtual = await env.get_current_time()
        started = time.monotonic()
        conversation = Conversation(env.client, "turn", "conversation-1", "agents")
        outcome = await conversation.prompt("Crawl the site, then find the TODOs")
        wall = time.monotonic() - started
        virtual = (await env.get_current_time()) - started_virtual
    assert outcome.reason == "blocked"  # the cap ended it
    assert outcome.error is not None
    assert outcome.error.startswith("tool call limit reached")
    messages = outcome.session().messages()
    tool_texts = [m["content"] for m in messages if m["role"] == "tool"]
    assert tool_texts[0] == "Error: tool call timed out after 1500ms"  # not an activity failure
    assert GENTLE_TEXT in [m["content"] for m in messages if m["role"] == "user"]
    assert virtual >= timedelta(minutes=10)  # the provider's retry-after, as a durable timer
    assert wall < 60
    events = outcome.session().events
    calls = [e.call_id for e in events if isinstance(e, ToolCallEvent)]
    results = [e.call_id for e in events if isinstance(e, ToolResultEvent)]
    assert calls == results  # every call answered once, in order


async def test_a_stack_the_engine_would_cut_or_retry_twice_is_refused(anyio_backend: Any) -> None:
    cut = attrs_evolve(turn_agent(), start_to_close_cap_ms=10_000)
    with pytest.raises(ConfigError, match="would cut tool 'grep'"):
        cut.check()
    twice = attrs_evolve(turn_agent(), activity_attempts=3)
    with pytest.raises(ConfigError, match="retry in two places"):
        twice.check()


def attrs_evolve(agent: TemporalAgent, **changes: Any) -> TemporalAgent:
    import attrs

    return attrs.evolve(agent, **changes)


# -- the dev server and two workers --------------------------------------------------------


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    return tmp_path


def start_worker(
    address: str, task_queue: str, marks: Path, agent: str = "deployer"
) -> subprocess.Popen[str]:
    environment = {**os.environ, "GUARDSTACK_TEMPORAL_MARKS": str(marks)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "guardstack.cli.main",
            "worker",
            f"tests.integrations.temporal_agents:{agent}",
            "--task-queue",
            task_queue,
            "--address",
            address,
            "--sticky-timeout",
            "1",
        ],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().startswith(f"worker ready: {agent} on")
    return process


async def test_a_worker_killed_mid_call_and_the_turn_completes_elsewhere(
    anyio_backend: Any, marks: Path
) -> None:
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        dev_server_extra_args=["--headless"],
        ip="127.0.0.1",
    ) as env:
        address = env.client.service_client.config.target_host
        workers = [start_worker(address, "deploys", marks) for _ in range(2)]
        try:
            conversation = Conversation(env.client, "deployer", "release-7", "deploys")
            turn = asyncio.create_task(conversation.prompt("Deploy the api"))
            deploy_log = marks / "deploy.log"
            started = time.monotonic()
            while not deploy_log.exists() and time.monotonic() - started < 30:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # another process writes it: nothing to wait on
            victim = int(deploy_log.read_text().split()[1])
            killed_at = time.monotonic() - started
            os.kill(victim, signal.SIGKILL)
            outcome = await asyncio.wait_for(turn, 60)
            completed_at = time.monotonic() - started
        finally:
            for process in workers:
                process.kill()
                process.wait()
                if process.stdout is not None:
                    process.stdout.close()
    survivor = next(p.pid for p in workers if p.pid != victim)
    assert outcome.reason == "completed"
    assert outcome.text == "done"
    results = {
        e.call_id: e.result for e in outcome.session().events if isinstance(e, ToolResultEvent)
    }
    calls = [e for e in outcome.session().events if isinstance(e, ToolCallEvent)]
    assert [c.name for c in calls] == ["deploy", "status"]
    assert len(results) == 2  # every call answered exactly once
    deploy_result = results[calls[0].call_id]
    assert deploy_result.code == TOOL_ABORTED  # lost with its worker, and never run again
    assert deploy_log.read_text().splitlines() == [f"started {victim}"]
    assert (marks / "status.log").read_text().splitlines() == [f"ran {survivor}"]
    print(f"killed at {killed_at:.1f}s, turn completed at {completed_at:.1f}s")


async def test_an_idempotent_tool_lost_with_its_worker_is_retried_on_another(
    anyio_backend: Any, marks: Path
) -> None:
    """A lost worker is a provider-side failure for ``Retry``: the idempotent tool runs
    again on the surviving worker (guardstack's own aborts are never retried)."""
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        dev_server_extra_args=["--headless"],
        ip="127.0.0.1",
    ) as env:
        address = env.client.service_client.config.target_host
        workers = [start_worker(address, "fetches", marks, "fetcher") for _ in range(2)]
        try:
            conversation = Conversation(env.client, "fetcher", "fetch-1", "fetches")
            turn = asyncio.create_task(conversation.prompt("Fetch it"))
            fetch_log = marks / "fetch.log"
            started = time.monotonic()
            while not fetch_log.exists() and time.monotonic() - started < 30:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # another process writes it: nothing to wait on
            victim = int(fetch_log.read_text().split()[1])
            os.kill(victim, signal.SIGKILL)
            outcome = await asyncio.wait_for(turn, 60)
        finally:
            for process in workers:
                process.kill()
                process.wait()
                if process.stdout is not None:
                    process.stdout.close()
    survivor = next(p.pid for p in workers if p.pid != victim)
    assert outcome.reason == "completed"
    [result] = [e.result for e in outcome.session().events if isinstance(e, ToolResultEvent)]
    assert result.content == "fetched"  # the retry's answer, from the surviving worker
    assert fetch_log.read_text().splitlines() == [f"started {victim}", f"started {survivor}"]


shipped: list[dict[str, Any]] = []


async def ship(arguments: Any, call: Any) -> str:
    shipped.append(dict(arguments))
    return f"shipped {arguments['version']}"


def approving_agent() -> TemporalAgent:
    from guardstack.guards import Approval

    return TemporalAgent(
        "approving",
        tools=[ToolDefinition("ship", ship, timeout_ms=60_000, destructive=True)],
        model=ConversationModel(
            [ask("ship", {"version": "1.2"}), ModelReply("shipped, as you approved")]
        ),
        plugins=lambda: [ToolCallTimeoutPolicy(), Approval()],
    )


async def test_a_turn_waits_durably_for_the_decide_signal(anyio_backend: Any) -> None:
    from guardstack.pipeline import Edit

    server = BIN / "temporal-test-server"
    shipped.clear()
    async with (
        await WorkflowEnvironment.start_time_skipping(test_server_existing_path=str(server)) as env,
        worker(env.client, "approvals", [approving_agent()]),
    ):
        started_virtual = await env.get_current_time()
        conversation = Conversation(env.client, "approving", "release-7", "approvals")
        # a wait on a signal has no timer to skip to: time moves only as this test says
        with env.auto_time_skipping_disabled():
            turn = asyncio.ensure_future(conversation.prompt("ship 1.2"))
            pending: list[dict[str, Any]] = []
            for _ in range(200):  # the workflow reaches the pause in real time
                pending = await conversation.pending()
                if pending:
                    break
                await asyncio.sleep(0.05)
            [waiting] = pending
            assert (waiting["tool"], waiting["arguments"]) == ("ship", {"version": "1.2"})
            await env.sleep(timedelta(hours=8))  # a person takes a working day to decide
            assert not turn.done()
            assert shipped == []
            decision = Edit({"version": "1.2.1"}, by="ops")
            await conversation.decide({waiting["call_id"]: decision})
            outcome = await turn
        virtual = (await env.get_current_time()) - started_virtual
    assert outcome.reason == "completed"
    assert outcome.text == "shipped, as you approved"
    assert shipped == [{"version": "1.2.1"}]  # the person's arguments
    assert virtual >= timedelta(hours=8)
    decided = [e for e in outcome.session().events if isinstance(e, ApprovalDecision)]
    assert [(e.decision, e.by) for e in decided] == [("edit", "ops")]
