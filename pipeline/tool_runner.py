"""The innermost dispatch step: a tool's own call, in a worker thread for a plain
function, its result checked."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

import anyio.to_thread

from guardstack.pipeline.arguments import short_repr
from guardstack.pipeline.runtime import cancel_pending, deliver_pending
from guardstack.pipeline.values import (
    ToolCall,
    ToolDefinition,
    ToolResult,
    failed_result,
    failure_from_exception,
    unknown_tool_result,
)

logger = logging.getLogger("guardstack")


def call_in_thread(
    tool: ToolDefinition, arguments: Mapping[str, Any] | str, call: ToolCall
) -> object:
    value = tool.execute(arguments, call)  # type: ignore[arg-type]  # checked: a mapping
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()  # an un-awaited coroutine would warn when collected
        raise TypeError(
            f"tool {tool.name!r} is a plain function that returned an awaitable; "
            "declare it `async def`"
        )
    return value


def checked_result(result: object) -> ToolResult:
    if not isinstance(result, ToolResult):
        raise TypeError(f"dispatch returned {short_repr(result)}; expected a ToolResult")
    return result


class ToolRunner:
    """The innermost dispatch step, and the thread limiters of plain-function tools.

    Apart from the registry, so the dispatch stage's terminal (this object's bound
    ``run``) holds no reference back to the registry: a registry is freed when its
    last user lets go, without waiting for the cyclic garbage collector.
    """

    __slots__ = ("_limiters", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: One per anyio backend and tool name (bounded by the tools registered).
        self._limiters: dict[tuple[str, str], anyio.CapacityLimiter] = {}

    def _thread_limiter(self, tool: str) -> anyio.CapacityLimiter:
        key = (anyio.lowlevel.current_token().backend_class.__name__, tool)
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = self._limiters[key] = anyio.CapacityLimiter(self.limit)
        return limiter

    async def run(self, call: ToolCall) -> ToolResult:
        """The innermost dispatch step: run the tool, normalise whatever happens into a result."""
        tool = call.tool
        if tool is None:
            return unknown_tool_result(call.name)
        # No tool starts once its call is cancelled (or its deadline passed): the
        # cancellation is delivered here, and propagates.
        if cancel_pending():
            await deliver_pending()
        try:
            if tool.is_async:
                value = await tool.execute(call.arguments, call)  # type: ignore[arg-type,misc]
            else:
                value = await anyio.to_thread.run_sync(
                    call_in_thread,
                    tool,
                    call.arguments,
                    call,
                    limiter=self._thread_limiter(tool.name),
                )
        except Exception as error:
            logger.debug("tool %r raised", call.name, exc_info=True)
            return failure_from_exception(error)
        if type(value) is str:
            return ToolResult(value, False, None, value)
        if isinstance(value, ToolResult):
            problem = value.problem()
            if problem is None:
                return value
            return failed_result(
                f"tool {tool.name!r} returned a ToolResult whose {problem}", "TypeError"
            )
        try:
            return ToolResult.of(value)
        except (TypeError, ValueError, RecursionError) as error:
            return failure_from_exception(
                error, prefix=f"tool {tool.name!r} returned a value that is not JSON-serialisable: "
            )
