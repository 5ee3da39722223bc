"""Small builders shared by the tests (not part of the public API)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Coroutine, Mapping
from typing import Any

import anyio

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


class ThreadLoop:
    """One event loop in a daemon thread, for synchronous code (a hypothesis state
    machine's rules) that runs coroutines against a store whose connections must stay
    on one loop between calls. A daemon thread: nothing waits for it at exit."""

    def __init__(self) -> None:
        self.portal: Any = None
        ready = threading.Event()

        def run() -> None:
            async def main() -> None:
                from anyio.from_thread import BlockingPortal

                async with BlockingPortal() as portal:
                    self.portal = portal
                    ready.set()
                    await portal.sleep_until_stopped()

            anyio.run(main)

        threading.Thread(target=run, daemon=True).start()
        ready.wait()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        async def awaited() -> Any:
            return await coroutine

        return self.portal.call(awaited)


@functools.cache
def thread_loop() -> ThreadLoop:
    """The session's one ``ThreadLoop``, made when first asked for."""
    return ThreadLoop()
