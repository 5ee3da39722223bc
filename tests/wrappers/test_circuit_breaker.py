"""CircuitBreaker: opens, answers at once, probes; on both backends in virtual time."""

from __future__ import annotations

import anyio

from guardstack.pipeline import (
    MODEL_UNAVAILABLE,
    TOOL_FAILED,
    TOOL_TIMEOUT,
    TOOL_UNAVAILABLE,
    Harness,
    ModelError,
    ScriptedModel,
    ToolResult,
)
from guardstack.pipeline.testing import Hang, Raise, Reply, ScriptedTool
from guardstack.wrappers import (
    CircuitBreaker,
    Timeout,
)
from tests.helpers import harness_with, run


async def test_a_breaker_opens_on_failures_and_answers_at_once_until_it_probes() -> None:
    dead = ScriptedTool("search", [Hang()], timeout_ms=2_000)
    built = harness_with(dead)
    built.plugin(CircuitBreaker(minimum_calls=3, failure_ratio=1.0, break_s=60))
    built.plugin(Timeout())
    for _ in range(3):
        assert (await run(built, "search")).code == TOOL_TIMEOUT
    started = anyio.current_time()
    refused = await run(built, "search")
    assert anyio.current_time() == started  # no budget waited out against a dead backend
    assert refused.code == TOOL_UNAVAILABLE
    assert refused.content.startswith('Error: tool "search" is unavailable')
    assert "Try again in 60s" in refused.content
    assert len(dead.runs) == 3
    await anyio.sleep(60)
    dead.steps = [Reply("back")]
    assert (await run(built, "search")).content == "back"  # the probe closes it
    assert (await run(built, "search")).content == "back"


async def test_a_failed_probe_opens_it_again_and_only_one_probe_runs() -> None:
    flaky = ScriptedTool("search", [Raise(RuntimeError("down"), after_ms=1000)])
    built = harness_with(flaky)
    built.plugin(CircuitBreaker(minimum_calls=1, break_s=10))
    assert (await run(built, "search")).code == TOOL_FAILED
    await anyio.sleep(10)
    results: list[ToolResult] = []

    async def one() -> None:
        results.append(await run(built, "search"))

    async with anyio.create_task_group() as group:
        group.start_soon(one)
        group.start_soon(one)
    assert sorted(str(r.code) for r in results) == [TOOL_FAILED, TOOL_UNAVAILABLE]
    assert "a test call" in next(r.content for r in results if r.code == TOOL_UNAVAILABLE)
    assert (await run(built, "search")).code == TOOL_UNAVAILABLE  # open again
    assert len(flaky.runs) == 2


async def test_the_window_forgets_old_failures_and_state_is_per_tool() -> None:
    bad = ScriptedTool("bad", [Raise(RuntimeError("x"))])
    good = ScriptedTool("good")
    built = harness_with(bad, good)
    built.plugin(CircuitBreaker(minimum_calls=2, window_s=5))
    await run(built, "bad")
    await anyio.sleep(6)
    await run(built, "bad")  # the first failure left the window: one call, not two
    assert (await run(built, "good")).content == "ok"
    assert (await run(built, "bad")).code == TOOL_FAILED  # two in the window now: opens
    assert (await run(built, "bad")).code == TOOL_UNAVAILABLE
    assert (await run(built, "good")).content == "ok"  # another tool's breaker is closed


async def test_a_model_breaker_raises_model_unavailable_with_retry_after() -> None:
    model = ScriptedModel([ModelError("down", MODEL_UNAVAILABLE)] * 3)
    built = Harness(model)
    built.plugin(CircuitBreaker(stage="model", minimum_calls=2, break_s=20))
    for _ in range(2):
        assert (await built.loop.create(f"s{_}").prompt("hi")).reason == "error"
    turn = await built.loop.create("s3").prompt("hi")
    assert turn.error is not None
    assert turn.error.startswith("ModelError: MODEL_UNAVAILABLE: model model is unavailable")
    assert model.remaining == 1  # never asked
