"""Agent guards (reduce waste) and caps (stop loss), each a self-contained plugin."""

from guardstack.guards.agent_limit import AgentLimit
from guardstack.guards.canonical import canonical_json
from guardstack.guards.repeat_tool_reminder import (
    DETAILED_TEMPLATE,
    GENTLE_TEXT,
    RepeatToolReminder,
)
from guardstack.guards.tool_call_limit import ToolCallLimit
from guardstack.guards.tool_call_timeout_policy import ToolCallTimeoutPolicy

__all__ = [
    "DETAILED_TEMPLATE",
    "GENTLE_TEXT",
    "AgentLimit",
    "RepeatToolReminder",
    "ToolCallLimit",
    "ToolCallTimeoutPolicy",
    "canonical_json",
]
