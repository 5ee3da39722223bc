"""Small builders shared by the tests (not part of the public API)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guardstack.pipeline import ModelReply, ToolCall, ToolCallRequest, ToolRegistry
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
