"""The innermost dispatch step: whatever a tool does — returns text, a value, a
``ToolResult``, raises, is a plain function, or was cancelled before it started — the
call's answer is a ``ToolResult`` (both backends, virtual time)."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from guardstack.pipeline import (
    TOOL_FAILED,
    UNKNOWN_TOOL,
    ToolCall,
    ToolDefinition,
    ToolRegistry,
    ToolResult,
)


def _registry(function: Any, **declared: Any) -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(ToolDefinition("t", function, **declared))
    return registry


async def _answer(function: Any) -> ToolResult:
    outcome = await _registry(function).execute(ToolCall("t", {}, "c1"))
    return outcome.result


async def test_text_and_values_become_results() -> None:
    async def text(arguments: Any, call: Any) -> str:
        return "found"

    async def value(arguments: Any, call: Any) -> Any:
        return {"rows": [1, 2]}

    assert (await _answer(text)).content == "found"
    answered = await _answer(value)
    assert (answered.content, answered.value, answered.is_error) == (
        '{"rows": [1, 2]}',
        {"rows": [1, 2]},
        False,
    )


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        ({1, 2}, "returned a value that is not JSON-serialisable"),
        (float("nan"), "returned a value that is not JSON-serialisable"),
        (ToolResult(42), "returned a ToolResult whose content is not text: int"),  # type: ignore[arg-type]
    ],
)
async def test_a_value_that_is_no_result_is_the_tools_failure(returned: Any, said: str) -> None:
    async def tool(arguments: Any, call: Any) -> Any:
        return returned

    answered = await _answer(tool)
    assert answered.is_error
    assert answered.code == TOOL_FAILED
    assert said in answered.content


async def test_a_raising_tool_is_a_failure_naming_the_exception() -> None:
    async def tool(arguments: Any, call: Any) -> str:
        raise LookupError("no such row")

    answered = await _answer(tool)
    assert (answered.code, answered.error.name if answered.error else None) == (
        TOOL_FAILED,
        "LookupError",
    )
    assert "no such row" in answered.content


async def test_a_plain_function_runs_in_a_worker_thread() -> None:
    main = threading.get_ident()

    def tool(arguments: Any, call: Any) -> str:
        return "elsewhere" if threading.get_ident() != main else "on the loop"

    assert (await _answer(tool)).content == "elsewhere"


async def test_a_plain_function_that_returns_an_awaitable_is_told_to_be_async() -> None:
    async def later() -> str:
        return "x"

    def tool(arguments: Any, call: Any) -> Any:
        return later()

    answered = await _answer(tool)
    assert "is a plain function that returned an awaitable; declare it `async def`" in (
        answered.content
    )


async def test_an_unknown_tool_is_answered_without_running_anything() -> None:
    outcome = await ToolRegistry().execute(ToolCall("nope", {}, "c1"))
    assert outcome.result.code == UNKNOWN_TOOL
    assert 'unknown tool "nope"' in outcome.result.content


async def test_no_tool_starts_once_its_call_is_cancelled() -> None:
    started: list[str] = []

    async def tool(arguments: Any, call: Any) -> str:
        started.append("ran")
        return "ok"

    registry = _registry(tool)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await registry.execute(ToolCall("t", {}, "c1"))
    assert scope.cancelled_caught
    assert started == []
