"""Agent guards (reduce waste) and caps (stop loss), each a self-contained plugin."""

from guards.agent_limit import AgentLimit
from guards.canonical import canonical_json
from guards.repeat_tool_reminder import DETAILED_TEMPLATE, GENTLE_TEXT, RepeatToolReminder
from guards.tool_call_limit import ToolCallLimit
from guards.tool_call_timeout_policy import ToolCallTimeoutPolicy

__all__ = [
    "DETAILED_TEMPLATE",
    "GENTLE_TEXT",
    "AgentLimit",
    "RepeatToolReminder",
    "ToolCallLimit",
    "ToolCallTimeoutPolicy",
    "canonical_json",
]
