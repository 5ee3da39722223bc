"""The log's JSON Lines form: each event to its line and back, checked field by field."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import attrs

from guardstack.pipeline.model import ToolCallRequest, Usage
from guardstack.pipeline.session.events import (
    TURN_END_REASONS,
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
    TurnStart,
    UserMessage,
)
from guardstack.pipeline.values import MessageSource, ToolError, ToolResult

FORMAT = 1
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
logger = logging.getLogger("guardstack")


def _request_to_wire(request: ToolCallRequest) -> dict[str, Any]:
    return {"name": request.name, "arguments": request.arguments_json, "call_id": request.call_id}


def event_to_wire(event: Event) -> dict[str, Any]:
    wire: dict[str, Any] = {"type": event.type}
    match event:
        case UserMessage(text=text, source=source):
            wire |= {"text": text, "source": attrs.asdict(source)}
        case ContextDeferred():
            wire |= {
                "turn": event.turn,
                "step": event.step,
                "call_id": event.call_id,
                "text": event.text,
                "source": attrs.asdict(event.source),
            }
        case AssistantMessage():
            wire |= {
                "turn": event.turn,
                "step": event.step,
                "text": event.text,
                "tool_calls": [_request_to_wire(call) for call in event.tool_calls],
            }
            # Optional keys, written only when set: older logs (without them) still load.
            if event.usage is not None:
                wire["usage"] = event.usage.to_dict()
            if event.reasoning is not None:
                wire["reasoning"] = event.reasoning
            if event.model is not None:
                wire["model"] = event.model
            if event.thinking_blocks:
                wire["thinking_blocks"] = [dict(block) for block in event.thinking_blocks]
        case ToolCallEvent():
            wire |= {
                "turn": event.turn,
                "step": event.step,
                "call_id": event.call_id,
                "name": event.name,
                "arguments": event.arguments_json,
            }
        case ToolResultEvent():
            wire |= {
                "turn": event.turn,
                "step": event.step,
                "call_id": event.call_id,
                "result": event.result.to_dict(),
            }
            if event.child_session is not None:
                wire["child_session"] = event.child_session
        case _:
            wire |= attrs.asdict(event)
    return wire


class SchemaError(ValueError):
    """A log line that parses as JSON but is not an event of this format."""


def _field(wire: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in wire:
        raise SchemaError(f"missing field {key!r}")
    value = wire[key]
    if (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
        raise SchemaError(f"field {key!r} is {type(value).__name__}, not the expected type")
    return value


def _count(wire: Mapping[str, Any], key: str) -> int:
    value: int = _field(wire, key, int)
    if value < 1:
        raise SchemaError(f"field {key!r} must be >= 1, got {value}")
    return value


def _optional_text(wire: Mapping[str, Any], key: str) -> str | None:
    value = wire.get(key)
    if value is not None and not isinstance(value, str):
        raise SchemaError(f"field {key!r} is {type(value).__name__}, not text")
    return value


def _result_from_wire(wire: Mapping[str, Any]) -> ToolResult:
    result = _field(wire, "result", dict)
    content: str = _field(result, "content", str)
    is_error: bool = _field(result, "isError", bool)
    error = None
    if result.get("error") is not None:
        wire_error = _field(result, "error", dict)
        info = wire_error.get("info", {})
        if not isinstance(info, dict):
            raise SchemaError(f"field 'info' is {type(info).__name__}, not an object")
        error = ToolError(
            _field(wire_error, "message", str),
            _optional_text(info, "name"),
            _optional_text(info, "code"),
        )
    return ToolResult(content, is_error, error)


def _usage_from_wire(wire: Mapping[str, Any]) -> Usage | None:
    usage = wire.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise SchemaError(f"field 'usage' is {type(usage).__name__}, not an object")
    known = {field.name for field in attrs.fields(Usage)}
    unknown = sorted(set(usage) - known)
    if unknown:
        raise SchemaError(f"unknown usage fields {unknown}")
    try:
        return Usage(**usage)
    except (TypeError, ValueError) as error:
        raise SchemaError(f"field 'usage': {error}") from error


def _thinking_blocks_from_wire(wire: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    blocks = wire.get("thinking_blocks", [])
    if not isinstance(blocks, list) or not all(isinstance(block, dict) for block in blocks):
        raise SchemaError("field 'thinking_blocks' is not a list of objects")
    return tuple(blocks)


def _request_from_wire(wire: object) -> ToolCallRequest:
    if not isinstance(wire, dict):
        raise SchemaError("a tool call is not an object")
    return ToolCallRequest(
        _field(wire, "name", str), _field(wire, "arguments", str), _field(wire, "call_id", str)
    )


def _source_from_wire(wire: Mapping[str, Any]) -> MessageSource:
    source = _field(wire, "source", dict)
    source_kind = _field(source, "kind", str)
    if source_kind not in ("user", "plugin", "model", "tool"):
        raise SchemaError(f"unknown message source {source_kind!r}")
    return MessageSource(source_kind, _optional_text(source, "plugin"))


def _where(wire: Mapping[str, Any]) -> tuple[int, int, str]:
    """A call event's turn, step and call id."""
    return _count(wire, "turn"), _count(wire, "step"), _field(wire, "call_id", str)


def event_from_wire(wire: Mapping[str, Any]) -> Event:
    """One event from its wire form; a line that breaks the schema raises ``SchemaError``."""
    kind = wire["type"]
    if kind == UserMessage.type:
        return UserMessage(_field(wire, "text", str), _source_from_wire(wire))
    if kind == ContextDeferred.type:
        return ContextDeferred(
            *_where(wire),
            _field(wire, "text", str),
            _source_from_wire(wire),
        )
    if kind == AssistantMessage.type:
        calls = tuple(_request_from_wire(call) for call in _field(wire, "tool_calls", list))
        return AssistantMessage(
            _count(wire, "turn"),
            _count(wire, "step"),
            _field(wire, "text", str),
            calls,
            _usage_from_wire(wire),
            _optional_text(wire, "reasoning"),
            _optional_text(wire, "model"),
            _thinking_blocks_from_wire(wire),
        )
    if kind == SystemMessage.type:
        return SystemMessage(_field(wire, "text", str))
    if kind == ToolResultEvent.type:
        return ToolResultEvent(
            *_where(wire),
            _result_from_wire(wire),
            _optional_text(wire, "child_session"),
        )
    if kind == ToolCallEvent.type:
        request = _request_from_wire(
            {key: wire.get(key) for key in ("name", "arguments", "call_id")}
        )
        return ToolCallEvent.of(_count(wire, "turn"), _count(wire, "step"), request)
    if kind == TurnEnd.type:
        reason = _field(wire, "reason", str)
        if reason not in TURN_END_REASONS:
            raise SchemaError(f"unknown turn end reason {reason!r}")
        return TurnEnd(_count(wire, "turn"), reason, _optional_text(wire, "error"))
    if kind == TurnStart.type:
        return TurnStart(_count(wire, "turn"))
    if kind in (StepStart.type, StepEnd.type):
        step_class = StepStart if kind == StepStart.type else StepEnd
        return step_class(_count(wire, "turn"), _count(wire, "step"))
    if kind == ApprovalRequest.type:
        return ApprovalRequest(
            *_where(wire),
            _field(wire, "tool", str),
            _field(wire, "arguments_json", str),
            _field(wire, "digest", str),
            _optional_text(wire, "reason"),
            _field(wire, "asked_by", str),
        )
    if kind == ApprovalDecision.type:
        decision = _field(wire, "decision", str)
        if decision not in ("approve", "reject", "edit"):
            raise SchemaError(f"unknown approval decision {decision!r}")
        waited = wire.get("waited_s")
        if waited is not None and (isinstance(waited, bool) or not isinstance(waited, int | float)):
            raise SchemaError("field 'waited_s' is not a number")
        return ApprovalDecision(
            *_where(wire),
            decision,
            _optional_text(wire, "by"),
            _optional_text(wire, "reason"),
            _optional_text(wire, "arguments_json"),
            waited,
        )
    raise SchemaError(f"unknown event type {kind!r}")


def json_line(wire: Mapping[str, Any]) -> str:
    text = json.dumps(wire, ensure_ascii=False)
    if _LONE_SURROGATE.search(text):
        # A tool may return text with half a surrogate pair; UTF-8 cannot hold it raw,
        # so that line is written with escapes, which load back to the same string.
        text = json.dumps(wire, ensure_ascii=True)
    return text + "\n"
