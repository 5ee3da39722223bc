"""RateLimit: a token bucket that waits or refuses."""

from __future__ import annotations

import anyio
import pytest

from guardstack.pipeline import (
    TOOL_RATE_LIMITED,
    Harness,
    ModelReply,
    ScriptedModel,
)
from guardstack.pipeline.testing import ScriptedTool
from guardstack.wrappers import (
    RateLimit,
    Retry,
)
from tests.helpers import harness_with, run


async def test_a_rate_limit_spaces_calls_after_its_burst() -> None:
    tool = ScriptedTool("api")
    built = harness_with(tool)
    built.plugin(RateLimit(per_second=2, burst=2))
    started = anyio.current_time()
    async with anyio.create_task_group() as group:
        for _ in range(5):
            group.start_soon(run, built, "api")
    assert sorted(run.started - started for run in tool.runs) == [0.0, 0.0, 0.5, 1.0, 1.5]


async def test_without_waiting_a_rate_limit_answers_rate_limited_with_the_wait() -> None:
    built = harness_with(ScriptedTool("api"))
    built.plugin(RateLimit(per_second=4, wait=False))
    assert (await run(built, "api")).content == "ok"
    refused = await run(built, "api")
    assert refused.code == TOOL_RATE_LIMITED
    assert refused.content == (
        'Error: tool "api" is rate limited (4 calls per second). Try again in 0.3s.'
    )
    await anyio.sleep(0.25)
    assert (await run(built, "api")).content == "ok"


async def test_a_model_rate_limit_raises_with_retry_after_for_a_retry_outside() -> None:
    model = ScriptedModel([ModelReply("one"), ModelReply("two")])
    built = Harness(model)
    built.plugin(Retry(stage="model", attempts=2, backoff_ms=0, jitter=False))
    built.plugin(RateLimit(stage="model", per_second=1, wait=False))
    agent = built.loop.create("s")
    await agent.prompt("a")
    started = anyio.current_time()
    turn = await agent.prompt("b")
    assert turn.text == "two"
    assert anyio.current_time() - started == pytest.approx(1.0)  # waited the retry-after
