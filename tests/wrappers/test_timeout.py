"""Timeout: a fixed or declared budget; each instance owns its code."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from guardstack.pipeline import (
    TOOL_FAILED,
    TOOL_TIMEOUT,
    ConfigError,
    ToolDefinition,
    ToolRegistry,
    ToolResult,
    timeout_result,
)
from guardstack.pipeline.testing import Hang, Reply, ScriptedTool
from guardstack.wrappers import Timeout
from tests.helpers import call, registry_with


async def test_a_fixed_budget_times_out_with_the_layers_code() -> None:
    registry = registry_with(ScriptedTool("t", [Hang()]))
    registry.dispatch.use(Timeout(ms=40, code="MY_TIMEOUT"))
    started = anyio.current_time()
    outcome = await registry.execute(call("t"))
    assert anyio.current_time() - started == pytest.approx(0.04)
    assert outcome.result == timeout_result(40, "MY_TIMEOUT")
    assert outcome.result.content == "Error: tool call timed out after 40ms"


async def test_no_ms_uses_the_tools_declared_budget_or_passes_through() -> None:
    registry = registry_with(
        ScriptedTool("budgeted", [Hang()], timeout_ms=70),
        ScriptedTool("free", [Reply("done", after_s=100)]),
    )
    registry.dispatch.use(Timeout())
    assert (await registry.execute(call("budgeted"))).result == timeout_result(70, TOOL_TIMEOUT)
    assert (await registry.execute(call("free"))).result == ToolResult("done")


async def test_nested_timeouts_report_whichever_fired() -> None:
    for outer, inner, expected in ((100, 30, "INNER"), (30, 100, "OUTER")):
        registry = registry_with(ScriptedTool("t", [Hang()]))
        registry.dispatch.use(Timeout(ms=outer, code="OUTER"))
        registry.dispatch.use(Timeout(ms=inner, code="INNER"))
        outcome = await registry.execute(call("t"))
        assert outcome.result.code == expected
        assert outcome.result.content == f"Error: tool call timed out after {min(outer, inner)}ms"


@pytest.mark.parametrize(
    ("key", "value"), [("ms", 0), ("ms", 2.5), ("ms", True), ("code", ""), ("code", 5)]
)
def test_bad_timeout_configuration_fails_loud(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        Timeout(**{key: value})
    assert raised.value.key == key
    assert repr(value) in str(raised.value)


async def test_a_layer_returning_none_inside_a_timeout_is_not_a_timeout() -> None:
    """Judged by the scope, not the result: a broken layer is a TOOL_FAILED at t=0."""

    async def returns_none(tool_call: Any, call_next: Any) -> Any:
        return None

    registry = registry_with(ScriptedTool("echo"))
    registry.dispatch.use(Timeout(ms=1000))
    registry.dispatch.use(returns_none)
    started = anyio.current_time()
    outcome = await registry.execute(call("echo"))
    assert anyio.current_time() == started
    assert outcome.result.code == TOOL_FAILED
    assert "timed out" not in outcome.result.content


async def test_an_uncancellable_sync_tool_overrunning_its_budget_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The model's text stays the seed's; the operator gets a warning with the real time."""
    import threading

    release = threading.Event()

    def blocking(arguments: Any, tool_call: Any) -> str:
        release.wait(5)
        return "late"

    registry = ToolRegistry()
    registry.register(ToolDefinition("blocking", blocking, timeout_ms=200))
    registry.dispatch.use(Timeout())

    async def release_later() -> None:
        await anyio.sleep(1.0)
        release.set()

    with caplog.at_level("WARNING", logger="guardstack"):
        async with anyio.create_task_group() as group:
            group.start_soon(release_later)
            outcome = await registry.execute(call("blocking"))
    assert outcome.result.content == "Error: tool call timed out after 200ms"
    warning = " ".join(record.getMessage() for record in caplog.records)
    assert 'tool "blocking" ignored cancellation: budget 200ms, ran' in warning
