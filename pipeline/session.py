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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
import urllib.parse
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, ClassVar, Literal, TypeAlias, overload

import attrs

from guardstack.pipeline.errors import GuardstackWarning, SessionCorruptError, SessionTailWarning
from guardstack.pipeline.frozen import quick_init
from guardstack.pipeline.model import NO_USAGE, ToolCallRequest, Usage, as_thinking_blocks
from guardstack.pipeline.onion import Registration
from guardstack.pipeline.readonly import ReadOnlyDict, ReadOnlyList, read_only
from guardstack.pipeline.values import MessageSource, ToolError, ToolResult, aborted_result

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

TurnEndReason: TypeAlias = Literal[
    "completed", "max-steps", "aborted", "error", "blocked", "deadline", "approval"
]
_TURN_END_REASONS = frozenset(
    ("completed", "max-steps", "aborted", "error", "blocked", "deadline", "approval")
)
_FORMAT = 1
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
logger = logging.getLogger("guardstack")


@quick_init
@attrs.frozen
class SystemMessage:
    """The system prompt: logged once, as the session's first event."""

    type: ClassVar[str] = "system/message"
    text: str


@quick_init
@attrs.frozen
class TurnStart:
    """A person's turn begins (``turn`` counts from 1 over the session)."""

    type: ClassVar[str] = "turn/start"
    turn: int


@quick_init
@attrs.frozen
class TurnEnd:
    """A turn ended, and why; ``error`` names what failed for ``error`` and ``blocked``."""

    type: ClassVar[str] = "turn/end"
    turn: int
    reason: TurnEndReason
    error: str | None = None


@quick_init
@attrs.frozen
class StepStart:
    """One model request (and the tool calls it asks for) begins."""

    type: ClassVar[str] = "step/start"
    turn: int
    step: int


@quick_init
@attrs.frozen
class StepEnd:
    """A step's results and contexts are all logged."""

    type: ClassVar[str] = "step/end"
    turn: int
    step: int


@quick_init
@attrs.frozen
class UserMessage:
    """A user message: a person's prompt, or a context a plugin injected."""

    type: ClassVar[str] = "user/message"
    text: str
    source: MessageSource


@quick_init
@attrs.frozen
class AssistantMessage:
    """What the model answered: its text and the tool calls it asked for, in its order.

    ``usage``, ``reasoning``, ``model`` and ``thinking_blocks`` are the reply's, when
    the model gave them.
    """

    type: ClassVar[str] = "assistant/message"
    turn: int
    step: int
    text: str
    tool_calls: tuple[ToolCallRequest, ...] = ()
    usage: Usage | None = None
    reasoning: str | None = None
    model: str | None = None
    thinking_blocks: tuple[Mapping[str, Any], ...] = attrs.field(
        default=(), converter=as_thinking_blocks
    )


@quick_init
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


@quick_init
@attrs.frozen
class ToolResultEvent:
    """The one result of a logged ``tool/call``, as the model reads it."""

    type: ClassVar[str] = "tool/result"
    turn: int
    step: int
    call_id: str
    result: ToolResult
    #: The id of the child agent's session this call ran (``AgentTool``), if any: its
    #: log is saved beside this one and loaded into ``session.children``.
    child_session: str | None = None


@quick_init
@attrs.frozen
class ApprovalRequest:
    """A call that waits for a person's decision (a durable pause): what they are shown.

    ``arguments_json`` is the canonical JSON of the arguments the digest covers."""

    type: ClassVar[str] = "approval/request"
    turn: int
    step: int
    call_id: str
    tool: str
    arguments_json: str
    digest: str
    reason: str | None = None
    asked_by: str = "approval"


@quick_init
@attrs.frozen
class ApprovalDecision:
    """A person's (or a policy's) decision on a call: ``approve``, ``reject`` or ``edit``
    (with the arguments it runs with; the model's stay in its ``tool/call``)."""

    type: ClassVar[str] = "approval/decision"
    turn: int
    step: int
    call_id: str
    decision: Literal["approve", "reject", "edit"]
    by: str | None = None
    reason: str | None = None
    arguments_json: str | None = None
    waited_s: float | None = None


@quick_init
@attrs.frozen
class ContextDeferred:
    """A context message held back while a step waits for approval: it is logged as a
    ``user/message`` after the step's last result, when the step ends."""

    type: ClassVar[str] = "context/deferred"
    turn: int
    step: int
    call_id: str
    text: str
    source: MessageSource


Event: TypeAlias = (
    SystemMessage
    | TurnStart
    | TurnEnd
    | StepStart
    | StepEnd
    | UserMessage
    | AssistantMessage
    | ToolCallEvent
    | ToolResultEvent
    | ApprovalRequest
    | ApprovalDecision
    | ContextDeferred
)


def _request_to_wire(request: ToolCallRequest) -> dict[str, Any]:
    return {"name": request.name, "arguments": request.arguments_json, "call_id": request.call_id}


def _event_to_wire(event: Event) -> dict[str, Any]:
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


class _Schema(ValueError):
    """A log line that parses as JSON but is not an event of this format."""


def _field(wire: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in wire:
        raise _Schema(f"missing field {key!r}")
    value = wire[key]
    if (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
        raise _Schema(f"field {key!r} is {type(value).__name__}, not the expected type")
    return value


def _count(wire: Mapping[str, Any], key: str) -> int:
    value: int = _field(wire, key, int)
    if value < 1:
        raise _Schema(f"field {key!r} must be >= 1, got {value}")
    return value


def _optional_text(wire: Mapping[str, Any], key: str) -> str | None:
    value = wire.get(key)
    if value is not None and not isinstance(value, str):
        raise _Schema(f"field {key!r} is {type(value).__name__}, not text")
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
            raise _Schema(f"field 'info' is {type(info).__name__}, not an object")
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
        raise _Schema(f"field 'usage' is {type(usage).__name__}, not an object")
    known = {field.name for field in attrs.fields(Usage)}
    unknown = sorted(set(usage) - known)
    if unknown:
        raise _Schema(f"unknown usage fields {unknown}")
    try:
        return Usage(**usage)
    except (TypeError, ValueError) as error:
        raise _Schema(f"field 'usage': {error}") from error


def _thinking_blocks_from_wire(wire: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    blocks = wire.get("thinking_blocks", [])
    if not isinstance(blocks, list) or not all(isinstance(block, dict) for block in blocks):
        raise _Schema("field 'thinking_blocks' is not a list of objects")
    return tuple(blocks)


def _request_from_wire(wire: object) -> ToolCallRequest:
    if not isinstance(wire, dict):
        raise _Schema("a tool call is not an object")
    return ToolCallRequest(
        _field(wire, "name", str), _field(wire, "arguments", str), _field(wire, "call_id", str)
    )


def _source_from_wire(wire: Mapping[str, Any]) -> MessageSource:
    source = _field(wire, "source", dict)
    source_kind = _field(source, "kind", str)
    if source_kind not in ("user", "plugin", "model", "tool"):
        raise _Schema(f"unknown message source {source_kind!r}")
    return MessageSource(source_kind, _optional_text(source, "plugin"))


def _where(wire: Mapping[str, Any]) -> tuple[int, int, str]:
    """A call event's turn, step and call id."""
    return _count(wire, "turn"), _count(wire, "step"), _field(wire, "call_id", str)


def _event_from_wire(wire: Mapping[str, Any]) -> Event:
    """One event from its wire form; a line that breaks the schema raises ``_Schema``."""
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
        if reason not in _TURN_END_REASONS:
            raise _Schema(f"unknown turn end reason {reason!r}")
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
            raise _Schema(f"unknown approval decision {decision!r}")
        waited = wire.get("waited_s")
        if waited is not None and (isinstance(waited, bool) or not isinstance(waited, int | float)):
            raise _Schema("field 'waited_s' is not a number")
        return ApprovalDecision(
            *_where(wire),
            decision,
            _optional_text(wire, "by"),
            _optional_text(wire, "reason"),
            _optional_text(wire, "arguments_json"),
            waited,
        )
    raise _Schema(f"unknown event type {kind!r}")


def _json_line(wire: Mapping[str, Any]) -> str:
    text = json.dumps(wire, ensure_ascii=False)
    if _LONE_SURROGATE.search(text):
        # A tool may return text with half a surrogate pair; UTF-8 cannot hold it raw,
        # so that line is written with escapes, which load back to the same string.
        text = json.dumps(wire, ensure_ascii=True)
    return text + "\n"


def _message_of(event: Event) -> dict[str, Any] | None:
    """The chat message one event contributes to the request, if any: read-only, so a
    model (or a layer) handed the request cannot change what the log says was sent.
    Built for the event's type directly (one dict lookup, no second walk to freeze it)."""
    kind = type(event)
    return (_BUILDERS.get(kind) or _builder_of(kind))(event)


def _builder_of(kind: type) -> Callable[[Any], dict[str, Any] | None]:
    """The builder for a type first seen: its nearest base's (a subclass of a message's
    event), or none (``_nothing``); remembered."""
    build = _BUILDERS[kind] = next(
        (_BUILDERS[base] for base in kind.__mro__ if base in _BUILDERS), _nothing
    )
    return build


def _nothing(event: Any) -> None:
    return None


def _user(event: Any) -> dict[str, Any]:
    return ReadOnlyDict(role="user", content=event.text)


def _system(event: Any) -> dict[str, Any]:
    return ReadOnlyDict(role="system", content=event.text)


def _tool_result(event: Any) -> dict[str, Any]:
    result = event.result
    content = result.content
    if not isinstance(content, str):  # a result's content is text; anything else, frozen
        content = read_only(content)
    if result.is_error:  # is_error: for Anthropic's tool_result; other adapters drop it
        return ReadOnlyDict(role="tool", tool_call_id=event.call_id, content=content,
                            is_error=True)  # fmt: skip
    return ReadOnlyDict(role="tool", tool_call_id=event.call_id, content=content)


def _assistant(event: Any) -> dict[str, Any] | None:
    if not (event.text or event.tool_calls):
        return None
    # Built read-only as it is built (not built, then walked again to freeze it).
    message: dict[str, Any] = {"role": "assistant", "content": event.text or None}
    if event.reasoning is not None:
        message["reasoning_content"] = event.reasoning
    if event.thinking_blocks:
        message["thinking_blocks"] = read_only([dict(block) for block in event.thinking_blocks])
    if event.tool_calls:
        message["tool_calls"] = ReadOnlyList(
            [
                ReadOnlyDict(
                    id=call.call_id,
                    type="function",
                    function=ReadOnlyDict(name=call.name, arguments=call.arguments_json),
                )
                for call in event.tool_calls
            ]
        )
    return ReadOnlyDict(message)


_BUILDERS: dict[type, Callable[[Any], dict[str, Any] | None]] = {
    UserMessage: _user,
    SystemMessage: _system,
    ToolResultEvent: _tool_result,
    AssistantMessage: _assistant,
}


def _place(messages: list[dict[str, Any]], message: dict[str, Any], order: dict[str, int]) -> None:
    """Append ``message``; a tool result goes among the step's results in the order the
    model asked for the calls (``order``: call id -> index, of the last assistant
    message). They are logged in that order, except when a step paused for approval:
    its decided calls' results come last in the log, but the request has them where the
    model expects them — the one it would have got without the pause."""
    role = message["role"]
    if role == "assistant":
        calls = message.get("tool_calls")
        order.clear()
        if calls:
            for index, call in enumerate(calls):
                order[call["id"]] = index
    elif role == "tool" and messages and messages[-1]["role"] == "tool":
        mine = order.get(message["tool_call_id"], -1)
        if order.get(messages[-1]["tool_call_id"], -1) > mine:
            end = len(messages)
            while messages[end - 1]["role"] == "tool" and (
                order.get(messages[end - 1]["tool_call_id"], -1) > mine
            ):
                end -= 1
            messages.insert(end, message)
            return
    messages.append(message)


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

    def __reversed__(self) -> Iterator[Event]:
        return reversed(self._events)

    def __repr__(self) -> str:
        return f"<{len(self._events)} session events>"


def _path_key(path: str) -> str:
    return os.path.realpath(path)


def _write_atomically(target: str, text: str) -> None:
    directory, name = os.path.split(os.path.abspath(target))
    handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class Recording(Registration):
    """A session written to a JSONL file as it grows (``Session.record``).

    ``unwritten`` counts the events the file is missing since a write failed
    (``error`` says how); ``dispose()`` stops and closes the file, and never raises.
    """

    def __init__(self, session: Session, path: str) -> None:
        self.session = session
        self.path = path
        self.key = _path_key(path)
        self.unwritten = 0
        self.error: OSError | None = None
        session.save(path)  # raises here, at the start, if the path cannot be written
        self._file: IO[str] | None = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._subscription = session.subscribe(self._write)
        self._children: list[Recording] = []
        super().__init__(self._stop)
        for child_id, child in session.children.items():
            self.follow(child, child_id)

    def follow(self, child: Session, child_id: str | None = None) -> None:
        """Record a child session beside this file, for as long as this recording."""
        self._children.append(child.record(child_path(self.path, child_id or child.session_id)))

    def _write(self, event: Event) -> None:
        file = self._file
        if file is None or self.error is not None:
            self.unwritten += 1  # after a failure nothing is appended: no gap mid-file
            return
        try:
            file.write(_json_line(_event_to_wire(event)))
            file.flush()
        except (OSError, ValueError) as error:  # ValueError: a file closed under us
            self.error = error if isinstance(error, OSError) else OSError(str(error))
            self.unwritten += 1
            message = (
                f"session {self.session.session_id!r}: recording to {self.path} failed "
                f"({error}); no later event is written there (save() it again to make it whole)"
            )
            logger.exception("%s", message)
            warnings.warn(message, GuardstackWarning, stacklevel=2)

    def reopen(self) -> None:
        """The file was just saved whole: append to it from now on."""
        self._close()
        try:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        except OSError as error:
            self._file, self.error = None, error
            return
        self.error, self.unwritten = None, 0

    def _close(self) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        try:
            file.close()
        except OSError:
            logger.warning(
                "session recording %s: closing the file failed", self.path, exc_info=True
            )

    def _stop(self) -> None:
        for child in self._children:
            child.dispose()
        self._subscription.dispose()
        self._close()
        if self.session._recordings.get(self.key) is self:
            del self.session._recordings[self.key]


class Session:
    """One agent's append-only log of events."""

    def __init__(self, session_id: str, events: Sequence[Event] = ()) -> None:
        self.session_id = session_id
        self._events: list[Event] = []
        self._view = _EventView(self._events)  # read-only, and always the same list
        self._messages: list[dict[str, Any]] = []
        #: The last assistant message's call ids, in the order it asked for them.
        self._asked: dict[str, int] = {}
        self._subscribers: list[Callable[[Event], object]] = []
        self._recordings: dict[str, Recording] = {}
        self.damaged_tail: str | None = None
        #: The sessions of the child agents this one started (``AgentTool``), by id.
        self.children: dict[str, Session] = {}
        for event in events:
            self.append(event)

    @property
    def events(self) -> Sequence[Event]:
        return self._view

    def append(self, event: Event) -> None:
        """Add ``event`` at the end (the log is never rewritten) and tell the subscribers."""
        self._events.append(event)
        build = _BUILDERS.get(type(event)) or _builder_of(type(event))
        if build is not _nothing:  # most events are no message: no call for them
            message = build(event)
            if message is not None:
                _place(self._messages, message, self._asked)
        if self._subscribers:
            self._notify(event)

    def _notify(self, event: Event) -> None:
        for subscriber in tuple(self._subscribers):
            try:
                subscriber(event)
            except Exception:
                # A display or a writer that fails never breaks the turn or the log.
                logger.exception(
                    "session %r: subscriber %r failed on %s",
                    self.session_id,
                    subscriber,
                    event.type,
                )

    def subscribe(self, subscriber: Callable[[Event], object]) -> Registration:
        """Call ``subscriber(event)`` for every event appended from now on, in order.

        It runs inside ``append``, in the loop's task: keep it quick (a progress
        display, a line written to a file). An exception it raises is logged on the
        ``guardstack`` logger and the turn goes on. ``dispose()`` the returned
        registration to stop.
        """
        self._subscribers.append(subscriber)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.remove(subscriber)

        return Registration(remove)

    def record(self, path: str | os.PathLike[str]) -> Recording:
        """Keep ``path`` an up-to-date JSONL copy of this log as it grows.

        The events so far are saved at once (atomically, as ``save`` does); every
        later event is appended as one line and flushed when it happens, so a crash
        loses at most the line being written. Resume with ``Session.load(path)``.
        ``save(path)`` to the same path flushes the recording and keeps it whole.

        A write that fails (a full disk, a file made read-only) is reported when it
        happens — one ``GuardstackWarning`` naming the path, an error on the
        ``guardstack`` logger — and nothing more is appended, so the file stays a
        loadable prefix of the log, never a log with a gap in it; the recording
        counts the events not written (``unwritten``) until a ``save`` to the path
        makes it whole again. ``dispose()`` the returned recording to stop and close
        the file; stopping never raises.
        """
        recording = Recording(self, os.fspath(path))
        self._recordings[recording.key] = recording
        return recording

    @property
    def system(self) -> str | None:
        """The system prompt this session started with, if any."""
        first = self._events[0] if self._events else None
        return first.text if isinstance(first, SystemMessage) else None

    def usage(self) -> Usage:
        """The tokens every logged model reply used, summed, with the children's (a
        child's usage is rolled up into its parent's, as its turn counted it)."""
        total = NO_USAGE
        for event in self._events:
            if isinstance(event, AssistantMessage) and event.usage is not None:
                total += event.usage
        for child in self.children.values():
            total += child.usage()
        return total

    def add_child(self, child: Session) -> None:
        """Link a child agent's session (``AgentTool`` does): it is saved beside this
        one, recorded beside every recording of this one, and found by ``load``."""
        self.children[child.session_id] = child
        for recording in tuple(self._recordings.values()):
            recording.follow(child)

    def close_open_turn(self) -> bool:
        """End a turn the log left open (a crash or a mid-turn snapshot); say if it did.

        Every call the model asked for in the open step is answered — ``ABORTED`` if it
        was logged as started, ``ABORTED_BEFORE_DISPATCH`` (with its ``tool/call``) if
        not — then the step and the turn end (reason ``aborted``), so the next request
        rebuilt from the log is one a provider accepts. Nothing is removed. A turn
        paused for approval is not open (it ended, reason ``approval``); one whose
        resume was interrupted is.
        """
        turn_start = next(
            (
                i
                for i in range(len(self._events) - 1, -1, -1)
                if isinstance(self._events[i], TurnStart)
            ),
            None,
        )
        if turn_start is None:
            return False
        open_turn = self._events[turn_start:]
        if isinstance(open_turn[-1], TurnEnd):
            return False  # ended (a turn paused for approval ends, and a resume goes on)
        turn = open_turn[0].turn  # type: ignore[union-attr]
        called = {e.call_id for e in open_turn if isinstance(e, ToolCallEvent)}
        answered = {e.call_id for e in open_turn if isinstance(e, ToolResultEvent)}
        step = 0
        for event in open_turn:
            if isinstance(event, StepStart):
                step = event.step
            elif isinstance(event, AssistantMessage):
                for request in event.tool_calls:
                    if request.call_id in answered:
                        continue
                    started = request.call_id in called
                    if not started:
                        self.append(ToolCallEvent.of(turn, event.step, request))
                    result = aborted_result(before_dispatch=not started)
                    self.append(ToolResultEvent(turn, event.step, request.call_id, result))
                    answered.add(request.call_id)
        if step and not isinstance(self._events[-1], StepEnd):
            self.append(StepEnd(turn, step))
        self.append(TurnEnd(turn, "aborted", "the turn was interrupted; closed on resume"))
        return True

    def messages(self) -> list[dict[str, Any]]:
        """The model request this log implies, in OpenAI chat format.

        Built incrementally as events are appended, so a step costs the same at
        step 5,000 as at step 5; the result is a fresh list (append to it freely),
        but its message dicts are the log's own and read-only (changing one raises
        ``TypeError``; ``dict(message)`` is a copy to change).
        """
        return list(self._messages)

    def rebuild_messages(self) -> list[dict[str, Any]]:
        """``messages()`` computed from scratch from the events (the same list, always)."""
        messages: list[dict[str, Any]] = []
        asked: dict[str, int] = {}
        for event in self._events:
            message = _message_of(event)
            if message is not None:
                _place(messages, message, asked)
        return messages

    # -- persistence -------------------------------------------------------------------

    def to_jsonl(self) -> str:
        header = {"type": "session", "format": _FORMAT, "session_id": self.session_id}
        lines = [header, *(_event_to_wire(event) for event in self._events)]
        return "".join(_json_line(line) for line in lines)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the log as JSON Lines, atomically (a crash leaves the old file whole).

        Each save writes its own temporary file in the same directory, so concurrent
        saves to one path never mix: the file is always one whole session.
        """
        target = os.fspath(path)
        for child_id, child in self.children.items():
            child.save(child_path(target, child_id))  # children first: a parent never
            # names a child log that is not there
        _write_atomically(target, self.to_jsonl())
        recording = self._recordings.get(_path_key(target))
        if recording is not None:
            recording.reopen()  # the file now holds every event: append from here

    @classmethod
    def from_jsonl(cls, text: str | bytes, *, origin: str = "<session>") -> Session:
        """Read a log written by ``to_jsonl``; a damaged line raises, a cut-off last line warns."""
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        lines = raw.split(b"\n")
        cut_off = lines[-1] != b""  # a complete file ends with a newline
        if not cut_off:
            lines.pop()
        events: list[Event] = []
        session_id = None
        damaged_tail = None
        for number, line in enumerate(lines, start=1):
            try:
                wire = json.loads(line.decode("utf-8"))
                if not isinstance(wire, dict) or "type" not in wire:
                    raise _Schema("not an event object")
                if number == 1:
                    if wire["type"] != "session":
                        raise _Schema("the first line is not a session header")
                    session_id = _field(wire, "session_id", str)
                else:
                    events.append(_event_from_wire(wire))
            except (ValueError, TypeError, KeyError, RecursionError) as error:
                # UnicodeDecodeError is a ValueError: a line cut inside a character.
                if cut_off and number == len(lines) and number > 1:
                    damaged_tail = line.decode("utf-8", "replace")
                    break
                reason: object = error
                if isinstance(error, RecursionError):
                    reason = "nested too deeply"
                elif isinstance(error, json.JSONDecodeError):
                    reason = f"not JSON ({error.msg} at column {error.colno})"
                    if number == 1:
                        reason = f"{reason}; is this a guardstack session log (JSON Lines)?"
                raise SessionCorruptError(f"{origin}: line {number}: {reason}") from error
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
        """Read a log written by ``save``, with its children's logs beside it (a child
        log that is missing warns and is left out). Guard state is never part of it."""
        source = os.fspath(path)
        with open(source, "rb") as file:
            session = cls.from_jsonl(file.read(), origin=source)
        for child_id in dict.fromkeys(_children_named(session._events)):
            found = child_path(source, child_id)
            if os.path.exists(found):
                session.children[child_id] = cls.load(found)
            else:
                warnings.warn(
                    f"{source}: the log of child session {child_id!r} is not at {found}; "
                    "loaded without it",
                    GuardstackWarning,
                    stacklevel=2,
                )
        return session


def _children_named(events: Sequence[Event]) -> Iterator[str]:
    """The child sessions a log names: in its results, and in its calls waiting on one."""
    for event in events:
        if isinstance(event, ToolResultEvent) and event.child_session is not None:
            yield event.child_session
        elif isinstance(event, ApprovalRequest) and event.asked_by.startswith("agent:"):
            yield event.asked_by.removeprefix("agent:")


def child_path(parent: str, child_id: str) -> str:
    """Where a child session's log lives beside its parent's: ``<parent stem>.<child id,
    percent-quoted>.jsonl``."""
    stem, _ = os.path.splitext(parent)
    return f"{stem}.{urllib.parse.quote(child_id, safe='')}.jsonl"
