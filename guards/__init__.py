"""Agent guards (reduce waste) and caps (stop loss), each a self-contained plugin."""

from guardstack.guards.agent_limit import AgentLimit
from guardstack.guards.approval import Approval
from guardstack.guards.budget_notice import BudgetNotice
from guardstack.guards.canonical import canonical_json
from guardstack.guards.loop_detector import DETECTED_EVENT, Detection, LoopDetector
from guardstack.guards.model_call_limit import ModelCallLimit
from guardstack.guards.repeat_tool_reminder import (
    DETAILED_TEMPLATE,
    GENTLE_TEXT,
    RepeatToolReminder,
)
from guardstack.guards.tool_call_limit import ToolCallLimit
from guardstack.guards.tool_call_timeout_policy import ToolCallTimeoutPolicy
from guardstack.guards.turn_deadline import TurnDeadline
from guardstack.guards.usage_limit import UsageLimit

__all__ = [
    "DETAILED_TEMPLATE",
    "DETECTED_EVENT",
    "GENTLE_TEXT",
    "AgentLimit",
    "Approval",
    "BudgetNotice",
    "Detection",
    "LoopDetector",
    "ModelCallLimit",
    "RepeatToolReminder",
    "ToolCallLimit",
    "ToolCallTimeoutPolicy",
    "TurnDeadline",
    "UsageLimit",
    "canonical_json",
]
