"""Hedge: a second attempt after a delay, the loser cancelled."""

from __future__ import annotations

import anyio
import attrs
import pytest

from guardstack.pipeline import (
    ConfigError,
    Harness,
)
from guardstack.pipeline.testing import Raise, Reply, ScriptedTool
from guardstack.wrappers import (
    Hedge,
)
from tests.helpers import harness_with, run


async def test_a_hedge_starts_another_attempt_and_cancels_the_loser() -> None:
    tool = ScriptedTool("read", [Reply("slow", after_ms=5000), Reply("fast", after_ms=100)])
    built = harness_with(tool)
    built.plugin(Hedge(delay_ms=200))
    started = anyio.current_time()
    assert (await run(built, "read")).content == "fast"
    assert anyio.current_time() - started == pytest.approx(0.3)
    assert [r.outcome for r in tool.runs] == ["cancelled", "returned"]
    assert all(r.ended is not None for r in tool.runs)  # nothing left running
    assert [r.call.attempt for r in tool.runs] == [1, 1]  # Retry's number, untouched
    assert [r.call.hedge for r in tool.runs] == [0, 1]


async def test_a_non_idempotent_tool_is_never_hedged_and_naming_one_is_refused() -> None:
    tool = ScriptedTool("pay", [Reply("paid", after_ms=5000)])
    built = Harness()
    built.tools.register(attrs.evolve(tool.definition, idempotent=False))
    built.plugin(Hedge(delay_ms=100))
    assert (await run(built, "pay")).content == "paid"
    assert len(tool.runs) == 1
    with pytest.raises(ConfigError, match='"pay" is declared idempotent=False'):
        built.plugin(Hedge(delay_ms=100, tools=["pay"]))


async def test_a_hedge_that_fails_starts_the_next_at_once_and_the_last_failure_wins() -> None:
    tool = ScriptedTool("read", [Raise(RuntimeError("one")), Raise(RuntimeError("two"))])
    built = harness_with(tool)
    built.plugin(Hedge(delay_ms=1_000, max_hedges=1))
    started = anyio.current_time()
    result = await run(built, "read")
    assert anyio.current_time() == started
    assert result.content == "Error: two"
    assert len(tool.runs) == 2
