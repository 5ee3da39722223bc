"""The events of a session log, one frozen value each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeAlias

import attrs

from guardstack.pipeline.frozen import quick_init
from guardstack.pipeline.model import ToolCallRequest, Usage, as_thinking_blocks
from guardstack.pipeline.values import MessageSource, ToolResult

TurnEndReason: TypeAlias = Literal[
    "completed", "max-steps", "aborted", "error", "blocked", "deadline", "approval"
]
TURN_END_REASONS = frozenset(
    ("completed", "max-steps", "aborted", "error", "blocked", "deadline", "approval")
)


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
