"""The append-only session log, and the model request it rebuilds.

What the model saw, the log can rebuild: every request the loop sends is
``session.messages()`` at that moment, so the log is the whole truth of a
conversation. Injected reminders are ordinary ``user/message`` events whose
``source`` names the plugin; there is no special event type for them.

``save``/``load`` use JSON Lines, one event a line after a header line. A file whose
last line was cut off mid-write loads every complete event and reports the broken
tail (``damaged_tail`` and a ``SessionTailWarning``); a damaged line anywhere else
raises ``SessionCorruptError`` naming the line.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeAlias, overload

import attrs

from guardstack.pipeline.errors import SessionCorruptError, SessionTailWarning
from guardstack.pipeline.model import ToolCallRequest
from guardstack.pipeline.values import MessageSource, ToolResult

__all__ = [
    "AssistantMessage",
    "Event",
    "Session",
    "StepEnd",
    "StepStart",
    "ToolCallEvent",
    "ToolResultEvent",
    "TurnEnd",
    "TurnEndReason",
    "TurnStart",
    "UserMessage",
]

TurnEndReason: TypeAlias = Literal["completed", "max-steps", "aborted", "error", "blocked"]
_FORMAT = 1
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@attrs.frozen
class TurnStart:
    """A person's turn begins (``turn`` counts from 1 over the session)."""

    type: ClassVar[str] = "turn/start"
    turn: int


@attrs.frozen
class TurnEnd:
    """A turn ended, and why; ``error`` names what failed for ``error`` and ``blocked``."""

    type: ClassVar[str] = "turn/end"
    turn: int
    reason: TurnEndReason
    error: str | None = None


@attrs.frozen
class StepStart:
    """One model request (and the tool calls it asks for) begins."""

    type: ClassVar[str] = "step/start"
    turn: int
    step: int


@attrs.frozen
class StepEnd:
    """A step's results and contexts are all logged."""

    type: ClassVar[str] = "step/end"
    turn: int
    step: int


@attrs.frozen
class UserMessage:
    """A user message: a person's prompt, or a context a plugin injected."""

    type: ClassVar[str] = "user/message"
    text: str
    source: MessageSource


@attrs.frozen
class AssistantMessage:
    """What the model answered: its text and the tool calls it asked for, in its order."""

    type: ClassVar[str] = "assistant/message"
    turn: int
    step: int
    text: str
    tool_calls: tuple[ToolCallRequest, ...] = ()


@attrs.frozen
class ToolCallEvent:
    """A call the loop is about to run; ``arguments_json`` is the model's text."""

    type: ClassVar[str] = "tool/call"
    turn: int
    step: int
    call_id: str
    name: str
    arguments: Mapping[str, Any] | str
    arguments_json: str

    @classmethod
    def of(cls, turn: int, step: int, request: ToolCallRequest) -> ToolCallEvent:
        return cls(
            turn, step, request.call_id, request.name, request.arguments, request.arguments_json
        )


@attrs.frozen
class ToolResultEvent:
    """The one result of a logged ``tool/call``, as the model reads it."""

    type: ClassVar[str] = "tool/result"
    turn: int
    step: int
    call_id: str
    result: ToolResult


Event: TypeAlias = (
    TurnStart
    | TurnEnd
    | StepStart
    | StepEnd
    | UserMessage
    | AssistantMessage
    | ToolCallEvent
    | ToolResultEvent
)


def _request_to_wire(request: ToolCallRequest) -> dict[str, Any]:
    return {"name": request.name, "arguments": request.arguments_json, "call_id": request.call_id}


def _event_to_wire(event: Event) -> dict[str, Any]:
    wire: dict[str, Any] = {"type": event.type}
    match event:
        case UserMessage(text=text, source=source):
            wire |= {"text": text, "source": attrs.asdict(source)}
        case AssistantMessage():
            wire |= {
                "turn": event.turn,
                "step": event.step,
                "text": event.text,
                "tool_calls": [_request_to_wire(call) for call in event.tool_calls],
            }
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
        case _:
            wire |= attrs.asdict(event)
    return wire


def _event_from_wire(wire: Mapping[str, Any]) -> Event:
    kind = wire["type"]
    fields = {key: value for key, value in wire.items() if key != "type"}
    if kind == UserMessage.type:
        return UserMessage(fields["text"], MessageSource(**fields["source"]))
    if kind == AssistantMessage.type:
        calls = tuple(ToolCallRequest(**call) for call in fields.pop("tool_calls"))
        return AssistantMessage(**fields, tool_calls=calls)
    if kind == ToolResultEvent.type:
        return ToolResultEvent(
            fields["turn"],
            fields["step"],
            fields["call_id"],
            ToolResult.from_dict(fields["result"]),
        )
    if kind == ToolCallEvent.type:
        request = ToolCallRequest(fields["name"], fields["arguments"], fields["call_id"])
        return ToolCallEvent.of(fields["turn"], fields["step"], request)
    for event_class in (TurnStart, TurnEnd, StepStart, StepEnd):
        if kind == event_class.type:
            return event_class(**fields)
    raise ValueError(f"unknown event type {kind!r}")


def _json_line(wire: Mapping[str, Any]) -> str:
    text = json.dumps(wire, ensure_ascii=False)
    if _LONE_SURROGATE.search(text):
        # A tool may return text with half a surrogate pair; UTF-8 cannot hold it raw,
        # so that line is written with escapes, which load back to the same string.
        text = json.dumps(wire, ensure_ascii=True)
    return text + "\n"


class _EventView(Sequence[Event]):
    """A read-only view of the log: the loop appends, nobody rewrites."""

    __slots__ = ("_events",)

    def __init__(self, events: list[Event]) -> None:
        self._events = events

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Event]: ...
    def __getitem__(self, index: int | slice) -> Event | Sequence[Event]:
        return self._events[index]

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __repr__(self) -> str:
        return f"<{len(self._events)} session events>"


class Session:
    """One agent's append-only log of events."""

    def __init__(self, session_id: str, events: Sequence[Event] = ()) -> None:
        self.session_id = session_id
        self._events: list[Event] = list(events)
        self.damaged_tail: str | None = None

    @property
    def events(self) -> Sequence[Event]:
        return _EventView(self._events)

    def append(self, event: Event) -> None:
        self._events.append(event)

    def messages(self) -> list[dict[str, Any]]:
        """The model request this log implies, in OpenAI chat format."""
        messages: list[dict[str, Any]] = []
        for event in self._events:
            if isinstance(event, UserMessage):
                messages.append({"role": "user", "content": event.text})
            elif isinstance(event, ToolResultEvent):
                messages.append(
                    {"role": "tool", "tool_call_id": event.call_id, "content": event.result.content}
                )
            elif isinstance(event, AssistantMessage) and (event.text or event.tool_calls):
                message: dict[str, Any] = {"role": "assistant", "content": event.text or None}
                if event.tool_calls:
                    message["tool_calls"] = [
                        {
                            "id": call.call_id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments_json},
                        }
                        for call in event.tool_calls
                    ]
                messages.append(message)
        return messages

    # -- persistence -------------------------------------------------------------------

    def to_jsonl(self) -> str:
        header = {"type": "session", "format": _FORMAT, "session_id": self.session_id}
        lines = [header, *(_event_to_wire(event) for event in self._events)]
        return "".join(_json_line(line) for line in lines)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the log as JSON Lines, atomically (a crash leaves the old file whole)."""
        temporary = f"{os.fspath(path)}.tmp"
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(self.to_jsonl())
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)

    @classmethod
    def from_jsonl(cls, text: str, *, origin: str = "<session>") -> Session:
        lines = text.split("\n")
        cut_off = lines[-1] != ""  # a complete file ends with a newline
        if not cut_off:
            lines.pop()
        events: list[Event] = []
        session_id = None
        damaged_tail = None
        for number, line in enumerate(lines, start=1):
            try:
                wire = json.loads(line)
                if not isinstance(wire, dict) or "type" not in wire:
                    raise ValueError("not an event object")  # noqa: TRY301
                if number == 1:
                    if wire["type"] != "session":
                        raise ValueError("the first line is not a session header")  # noqa: TRY301
                    session_id = str(wire["session_id"])
                else:
                    events.append(_event_from_wire(wire))
            except (ValueError, TypeError, KeyError) as error:
                if cut_off and number == len(lines) and number > 1:
                    damaged_tail = line
                    break
                raise SessionCorruptError(f"{origin}: line {number}: {error}") from error
        if session_id is None:
            raise SessionCorruptError(f"{origin}: empty file, no session header")
        session = cls(session_id, events)
        if damaged_tail is not None:
            session.damaged_tail = damaged_tail
            warnings.warn(
                f"{origin}: the last line was cut off mid-write and was not loaded "
                f"({len(damaged_tail)} characters); {len(events)} complete events loaded",
                SessionTailWarning,
                stacklevel=3,
            )
        return session

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Session:
        """Read a log written by ``save``. Guard state is never part of it."""
        with open(path, encoding="utf-8") as file:
            return cls.from_jsonl(file.read(), origin=os.fspath(path))
