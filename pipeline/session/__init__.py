"""The append-only session log, and the model request it rebuilds.

What the model saw, the log can rebuild: every request the loop sends is
``session.messages()`` at that moment, so the log is the whole truth of a
conversation. Injected reminders are ordinary ``user/message`` events whose
``source`` names the plugin; there is no special event type for them.

The first event may be a ``system/message`` (the system prompt, logged once when the
session starts), so the rebuilt request starts with it. ``assistant/message``
events carry the reply's usage, reasoning, model and signed thinking blocks;
``messages()`` sends the reasoning back as ``reasoning_content`` (DeepSeek's wire
form, which it requires on later requests of a thinking-mode conversation), the
thinking blocks as ``thinking_blocks`` (LiteLLM's name; Anthropic requires them back
unchanged), and marks an error result's tool message ``is_error`` (Anthropic's
``tool_result`` field). Adapters that do not know a key drop it.

``session.subscribe(fn)`` calls ``fn(event)`` for every event as it is appended;
``session.record(path)`` writes the log to a JSONL file as it grows, each event
appended and flushed when it happens, so a crash loses at most the line being
written (and ``load`` reports such a cut-off tail).

``save``/``load`` use JSON Lines, one event a line after a header line. A file whose
last line was cut off mid-write loads every complete event and reports the broken
tail (``damaged_tail`` and a ``SessionTailWarning``); a damaged line anywhere else
raises ``SessionCorruptError`` naming the line.

The package by job: ``events`` (the event values), ``wire`` (their JSON Lines form),
``messages`` (the request a log rebuilds) and ``log`` (``Session`` and ``Recording``).
"""

from guardstack.pipeline.session.events import (
    ApprovalDecision,
    ApprovalRequest,
    AssistantMessage,
    ContextDeferred,
    Event,
    StepEnd,
    StepStart,
    SystemMessage,
    ToolCallEvent,
    ToolResultEvent,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)
from guardstack.pipeline.session.log import Recording, Session

__all__ = [
    "ApprovalDecision",
    "ApprovalRequest",
    "AssistantMessage",
    "ContextDeferred",
    "Event",
    "Recording",
    "Session",
    "StepEnd",
    "StepStart",
    "SystemMessage",
    "ToolCallEvent",
    "ToolResultEvent",
    "TurnEnd",
    "TurnEndReason",
    "TurnStart",
    "UserMessage",
]
