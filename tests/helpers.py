"""Small builders shared by the tests (not part of the public API)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from guardstack.pipeline import (
    Harness,
    ModelReply,
    ToolCall,
    ToolCallRequest,
    ToolRegistry,
    ToolResult,
    ToolResultEvent,
)
from guardstack.pipeline.session import Session
from guardstack.pipeline.testing import ScriptedTool

if TYPE_CHECKING:
    from tests.integrations.fault_link import LoopThread


def call(
    name: str = "echo",
    arguments: Mapping[str, Any] | str | None = None,
    call_id: str = "call-1",
    **fields: Any,
) -> ToolCall:
    return ToolCall(name, {} if arguments is None else arguments, call_id, **fields)


def calls(*requests: tuple[str, Mapping[str, Any] | str]) -> ModelReply:
    """A model reply asking for the given (name, arguments) tool calls."""
    return ModelReply(tool_calls=tuple(ToolCallRequest(name, args) for name, args in requests))


def registry_with(*tools: ScriptedTool) -> ToolRegistry:
    registry = ToolRegistry()
    for tool in tools:
        tool.register(registry)
    return registry


def harness_with(*tools: ScriptedTool) -> Harness:
    """A harness whose registry holds ``tools``."""
    built = Harness()
    for tool in tools:
        tool.register(built.tools)
    return built


async def run(built: Harness, name: str, **arguments: Any) -> ToolResult:
    """The result of one call of ``name`` through ``built``'s tool stages."""
    return (await built.tools.execute(call(name, arguments))).result


def results_by_id(session: Session) -> dict[str, ToolResult]:
    return {e.call_id: e.result for e in session.events if isinstance(e, ToolResultEvent)}


@functools.cache
def thread_loop() -> LoopThread:
    """The session's one event loop in a daemon thread, for synchronous code (a hypothesis
    state machine's rules) running coroutines against a store whose connections must stay
    on one loop between calls; made when first asked for."""
    from tests.integrations.fault_link import LoopThread

    return LoopThread()
