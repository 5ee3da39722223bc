"""Fallback: another answer on a failure, and the health-aware list of targets."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from guardstack.pipeline import (
    MODEL_RATE_LIMITED,
    TOOL_FAILED,
    TOOL_UNAVAILABLE,
    ConfigError,
    Harness,
    ModelError,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolDefinition,
)
from guardstack.pipeline.testing import Hang, Raise, ScriptedTool
from guardstack.wrappers import (
    CircuitBreaker,
    Fallback,
    Retry,
    Timeout,
)
from tests.helpers import call, harness_with, run


async def test_a_fallback_tool_answers_with_the_same_arguments() -> None:
    primary = ScriptedTool("search", [Hang()], timeout_ms=100)
    backup = ScriptedTool("search_mirror", ["mirror says hi"])
    built = harness_with(primary, backup)
    built.plugin(Fallback("search_mirror"))
    built.plugin(Timeout())
    result = await built.tools.execute(call("search", {"q": "x"}))
    assert result.result.content == "mirror says hi"
    assert backup.calls[0].arguments == {"q": "x"}


async def test_fallback_outside_a_retry_runs_once_inside_it_after_each_attempt() -> None:
    calls: list[str] = []

    async def cached(arguments: Any, call: Any) -> str:
        calls.append("fallback")
        return "cached"

    for inside, expected in ((False, 1), (True, 1)):
        calls.clear()
        tool = ScriptedTool("search", [Raise(RuntimeError("x"))])
        built = harness_with(tool)
        layers: list[Any] = [
            Retry(attempts=3, retry_on=(TOOL_FAILED,), backoff_ms=0),
            Fallback(cached),
        ]
        for layer in layers if inside else reversed(layers):
            built.plugin(layer)
        assert (await run(built, "search")).content == "cached"
        assert len(calls) == expected
        # inside: the first fallback succeeds, so the retry stops after one attempt
        assert len(tool.runs) == (1 if inside else 3)


async def test_a_model_fallback_asks_another_model() -> None:
    primary = ScriptedModel([ModelError("busy", MODEL_RATE_LIMITED)])
    backup = ScriptedModel([ModelReply("from the backup")])
    built = Harness(primary)
    built.plugin(Fallback(backup, stage="model"))
    turn = await built.loop.create("s").prompt("hi")
    assert turn.text == "from the backup"
    assert backup.requests[0] == [{"role": "user", "content": "hi"}]


async def test_a_fallback_to_a_named_upstream_outside_the_model_proxy_fails_saying_so() -> None:
    primary = ScriptedModel([ModelError("busy", MODEL_RATE_LIMITED)])
    built = Harness(primary)
    built.plugin(Fallback({"upstream": "backup"}, stage="model"))
    turn = await built.loop.create("s").prompt("hi")
    assert turn.reason == "error"
    assert "MODEL_FAILED: fallback: to={upstream: 'backup'} answers only behind guardstack " in (
        str(turn.error)
    )


def health_rig(wait_ms: int | None = None) -> tuple[Harness, dict[str, int]]:
    """``search`` fails; ``mirror-a`` fails too; ``mirror-b`` answers. A breaker (each
    opens on its first failure for 10 s) inside the fallback."""
    runs: dict[str, int] = {}

    def tool(name: str, fails: bool) -> ToolDefinition:
        async def run(arguments: Any, call: ToolCall) -> str:
            runs[name] = runs.get(name, 0) + 1
            if fails:
                raise RuntimeError(f"{name} is down")
            return f"{name} answered"

        return ToolDefinition(name, run)

    harness = Harness()
    for name, fails in (("search", True), ("mirror-a", True), ("mirror-b", False)):
        harness.tools.register(tool(name, fails))
    harness.plugin(Fallback(to=["mirror-a", "mirror-b"], wait_ms=wait_ms))
    harness.plugin(CircuitBreaker(minimum_calls=1, failure_ratio=1.0, break_s=10))
    return harness, runs


async def test_a_fallback_skips_a_target_whose_breaker_is_open() -> None:
    harness, runs = health_rig()
    first = await harness.tools.execute(ToolCall("search", {}, "c1"))
    assert first.result.content == "mirror-b answered"  # a failed, then b
    assert runs == {"search": 1, "mirror-a": 1, "mirror-b": 1}
    second = await harness.tools.execute(ToolCall("search", {}, "c2"))
    assert second.result.content == "mirror-b answered"
    assert runs["mirror-a"] == 1  # open: skipped, never tried again
    await harness.control.isolate("mirror-b")  # an operator holds it open too
    third = await harness.tools.execute(ToolCall("search", {}, "c3"))
    assert third.result.code == TOOL_UNAVAILABLE
    assert "every fallback (mirror-a, mirror-b)" in third.result.content
    assert third.result.error is not None
    assert 0 < (third.result.error.retry_after_s or 0) <= 10  # mirror-a's break


async def test_when_every_target_is_open_it_waits_for_the_earliest_within_wait_ms() -> None:
    harness, runs = health_rig(wait_ms=15_000)
    await harness.tools.execute(ToolCall("search", {}, "c1"))  # opens search and mirror-a
    await harness.control.isolate("mirror-b")
    started = anyio.current_time()
    answered = await harness.tools.execute(ToolCall("search", {}, "c2"))
    # mirror-a half-opened at 10 s: its probe was this call, and it failed again
    assert anyio.current_time() - started == pytest.approx(10.0)
    assert runs["mirror-a"] == 2
    assert answered.result.code in (TOOL_FAILED, TOOL_UNAVAILABLE)


def test_a_fallback_list_is_checked_target_by_target() -> None:
    with pytest.raises(ConfigError):
        Fallback(to=[])
    with pytest.raises(ConfigError):
        Fallback(to=["ok", 5])  # type: ignore[list-item]  # checked at run time
