"""ConcurrencyLimit: a bulkhead that queues or refuses; on the model stage too."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from guardstack.pipeline import (
    TOOL_OVERLOADED,
    TOOL_TIMEOUT,
    Harness,
    ModelReply,
    ScriptedModel,
    ToolResult,
)
from guardstack.pipeline.testing import Reply, ScriptedTool
from guardstack.wrappers import (
    Chaos,
    ConcurrencyLimit,
    Hedge,
    Timeout,
)
from tests.helpers import call, harness_with, run


async def test_a_bulkhead_runs_at_most_n_queues_fifo_and_refuses_beyond_the_queue() -> None:
    slow = ScriptedTool("fetch", [Reply("done", after_ms=1000)])
    built = harness_with(slow)
    built.plugin(ConcurrencyLimit(2, queue=2))
    finished: list[tuple[int, float, str]] = []
    started = anyio.current_time()

    async def one(index: int) -> None:
        result = await built.tools.execute(call("fetch", {"i": index}))
        finished.append((index, anyio.current_time() - started, str(result.result.code)))

    async with anyio.create_task_group() as group:
        for index in range(5):
            group.start_soon(one, index)
            await wait_all_tasks_blocked()
    assert sorted(finished) == [
        (0, 1.0, "None"),
        (1, 1.0, "None"),
        (2, 2.0, "None"),
        (3, 2.0, "None"),
        (4, 0.0, TOOL_OVERLOADED),
    ]


async def fetch(built: Harness, index: int) -> None:
    await built.tools.execute(call("fetch", {"i": index}))


def index_of(asked: Any) -> Any:
    return asked.arguments["i"]


async def test_a_bulkhead_serves_its_queue_in_arrival_order() -> None:
    slow = ScriptedTool("fetch", [Reply("done", after_ms=1000)])
    built = harness_with(slow)
    built.plugin(ConcurrencyLimit(1, queue=3))
    started = anyio.current_time()
    async with anyio.create_task_group() as group:
        for index in range(4):
            group.start_soon(fetch, built, index)
            await wait_all_tasks_blocked()
    assert [(index_of(r.call), r.started - started) for r in slow.runs] == [
        (0, 0.0),
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
    ]


async def test_queue_time_counts_against_a_timeout_only_inside_it() -> None:
    slow = ScriptedTool("fetch", [Reply("done", after_ms=1000)])
    inside = harness_with(slow)
    inside.plugin(Timeout(ms=1_500))
    inside.plugin(ConcurrencyLimit(1, queue=1))
    outside = harness_with(ScriptedTool("fetch", [Reply("done", after_ms=1000)]))
    outside.plugin(ConcurrencyLimit(1, queue=1))
    outside.plugin(Timeout(ms=1_500))
    for built, expected in ((inside, [None, TOOL_TIMEOUT]), (outside, [None, None])):
        codes: list[str | None] = []

        async def one(built: Harness = built, codes: list[str | None] = codes) -> None:
            codes.append((await run(built, "fetch")).code)

        async with anyio.create_task_group() as group:
            group.start_soon(one)
            await wait_all_tasks_blocked()
            group.start_soon(one)
        assert codes == expected


async def test_a_queued_call_gives_up_after_queue_timeout_and_a_cancelled_one_leaves() -> None:
    slow = ScriptedTool("fetch", [Reply("done", after_ms=10_000)])
    built = harness_with(slow)
    built.plugin(ConcurrencyLimit(1, queue=2, queue_timeout_ms=500))
    results: list[ToolResult] = []

    async def one() -> None:
        results.append(await run(built, "fetch"))

    async with anyio.create_task_group() as group:
        group.start_soon(one)
        await wait_all_tasks_blocked()
        with anyio.move_on_after(0.1):
            await run(built, "fetch")  # cancelled while queued: leaves the queue
        group.start_soon(one)
    assert [str(r.code) for r in results] == [TOOL_OVERLOADED, "None"]
    assert "waited 500ms" in results[0].content
    assert len(slow.runs) == 1


async def test_model_stage_bulkhead_hedge_and_chaos() -> None:
    async def slow_then_fast(messages: Any) -> ModelReply:
        slow_then_fast.calls += 1  # type: ignore[attr-defined]
        await anyio.sleep(5.0 if slow_then_fast.calls == 1 else 0.1)  # type: ignore[attr-defined]
        return ModelReply(f"reply {slow_then_fast.calls}")  # type: ignore[attr-defined]

    slow_then_fast.calls = 0  # type: ignore[attr-defined]
    hedged = Harness(ScriptedModel([slow_then_fast, slow_then_fast]))
    hedged.plugin(Hedge(delay_ms=500, stage="model"))
    started = anyio.current_time()
    assert (await hedged.loop.create("s").prompt("hi")).text == "reply 2"
    assert anyio.current_time() - started == pytest.approx(0.6)

    async def busy(messages: Any) -> ModelReply:
        await anyio.sleep(1.0)
        return ModelReply("done")

    limited = Harness(ScriptedModel([busy, busy]))
    limited.plugin(ConcurrencyLimit(1, stage="model"))
    turns: list[Any] = []

    async def prompt(name: str) -> None:
        turns.append(await limited.loop.create(name).prompt("hi"))

    async with anyio.create_task_group() as group:
        group.start_soon(prompt, "a")
        group.start_soon(prompt, "b")
    assert sorted(str(turn.error).split(":")[:2] for turn in turns) == [
        ["ModelError", " MODEL_OVERLOADED"],
        ["None"],
    ]

    chaotic = Harness(ScriptedModel([ModelReply("never")]))
    chaotic.plugin(Chaos(rate=1.0, fault="fail:MODEL_RATE_LIMITED", stage="model"))
    turn = await chaotic.loop.create("s").prompt("hi")
    assert turn.error == "ModelError: MODEL_RATE_LIMITED: chaos: injected MODEL_RATE_LIMITED"
