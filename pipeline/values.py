"""The values that flow through the onion: tools, calls, results and decisions.

All are frozen attrs classes. A layer that wants to change a call passes a changed
copy inward (``call_next(attrs.evolve(call, ...))``) instead of mutating and
restoring shared state, so whatever a layer sees on the way out is, by
construction, what its own caller gave it.
"""

from __future__ import annotations

import inspect
import json
import traceback
import types
import weakref
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import attrs

from guardstack.pipeline.call_context import (
    DEFAULT_TENANT,
    UNKNOWN_KEY,
    CallScope,
    ProgressListener,
)
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.frozen import open_twin, quick_init
from guardstack.pipeline.validate import invalid

if TYPE_CHECKING:
    from guardstack.pipeline.loop import Agent

__all__ = [
    "AGENT_STOPPED",
    "INVALID_ARGUMENTS",
    "MAX_TIMEOUT_MS",
    "TOOL_ABORTED",
    "TOOL_ABORTED_BEFORE_DISPATCH",
    "TOOL_DENIED",
    "TOOL_FAILED",
    "TOOL_OVERLOADED",
    "TOOL_RATE_LIMITED",
    "TOOL_REJECTED",
    "TOOL_TIMEOUT",
    "TOOL_UNAVAILABLE",
    "UNKNOWN_TOOL",
    "ContextMessage",
    "MessageSource",
    "RaisedException",
    "ToolCall",
    "ToolDefinition",
    "ToolError",
    "ToolResult",
    "aborted_result",
    "denied_result",
    "failed_result",
    "failure_from_exception",
    "invalid_arguments_result",
    "message_of",
    "render_value",
    "timeout_result",
    "unknown_tool_result",
]

TOOL_TIMEOUT: Final = "TOOL_TIMEOUT"
TOOL_ABORTED: Final = "ABORTED"
TOOL_ABORTED_BEFORE_DISPATCH: Final = "ABORTED_BEFORE_DISPATCH"
UNKNOWN_TOOL: Final = "UNKNOWN_TOOL"
TOOL_DENIED: Final = "TOOL_DENIED"
INVALID_ARGUMENTS: Final = "INVALID_ARGUMENTS"
TOOL_FAILED: Final = "TOOL_FAILED"
#: A circuit breaker is open: the tool's backend is down; the text says when to try again.
TOOL_UNAVAILABLE: Final = "TOOL_UNAVAILABLE"
#: A concurrency limit (bulkhead) and its queue are full.
TOOL_OVERLOADED: Final = "TOOL_OVERLOADED"
#: A rate limit had no token and was told not to wait.
TOOL_RATE_LIMITED: Final = "TOOL_RATE_LIMITED"
#: A child agent (``AgentTool``) was stopped by a cap, a deadline or a guard.
AGENT_STOPPED: Final = "AGENT_STOPPED"
#: A person (or an approval policy's timeout) rejected the call: it never ran.
TOOL_REJECTED: Final = "TOOL_REJECTED"

#: The largest budget a timer can hold in the original (2**31 - 1 ms, about 24.8 days).
MAX_TIMEOUT_MS: Final = 2_147_483_647

SourceKind: TypeAlias = Literal["user", "plugin", "model", "tool"]
_SOURCE_KINDS: Final = ("user", "plugin", "model", "tool")


def validate_timeout_ms(owner: str, key: str, value: object) -> int:
    """A budget in whole milliseconds, or ``ConfigError`` naming owner, key and value."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TIMEOUT_MS:
        raise invalid(
            owner, key, value, f"a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}"
        )
    return value


def _check_source_kind(_: object, __: attrs.Attribute[str], value: str) -> None:
    if value not in _SOURCE_KINDS:
        raise ConfigError(
            f"MessageSource: `kind` must be one of {_SOURCE_KINDS}, got {value!r}",
            key="kind",
            value=value,
        )


@attrs.frozen
class MessageSource:
    """Who put a message into the context: a person, a plugin, the model or a tool."""

    kind: SourceKind = attrs.field(validator=_check_source_kind)
    plugin: str | None = None


USER_SOURCE: Final = MessageSource("user")
#: The note a cap that wraps up sends with the turn's last request.
WRAP_UP_SOURCE: Final = MessageSource("plugin", "wrap-up")


@quick_init
@attrs.frozen
class ContextMessage:
    """Text a layer adds to the model's context, as a user message after the step."""

    text: str
    source: MessageSource


@quick_init
@attrs.frozen
class ToolError:
    """The structured part of an error result: what went wrong, and its class and code."""

    message: str
    name: str | None = None
    code: str | None = None
    #: When the failure said to try again (a rate limit, a provider's Retry-After), in
    #: seconds. Not part of the seed's wire shape: ``to_dict`` leaves it out.
    retry_after_s: float | None = attrs.field(default=None, eq=False, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"message": self.message}
        info = {key: value for key, value in (("name", self.name), ("code", self.code)) if value}
        if info:
            wire["info"] = info
        return wire

    @classmethod
    def from_dict(cls, wire: Mapping[str, Any]) -> ToolError:
        info = wire.get("info", {})
        return cls(str(wire["message"]), info.get("name"), info.get("code"))


def render_value(value: object) -> str:
    """Model-facing content for a tool's value: a ``str`` as is, anything else as JSON.

    Raises ``TypeError`` or ``ValueError`` for values JSON cannot hold (including NaN),
    so a garbage value becomes an error result instead of a corrupt log.
    """
    if isinstance(value, str):
        return value
    return _VALUE_JSON(value)


#: ``json.dumps(…, ensure_ascii=False, allow_nan=False)`` without a new encoder per call.
_VALUE_JSON: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


@quick_init
@attrs.frozen
class ToolResult:
    """What a tool call produced, as the model will read it (``content``)."""

    content: str
    is_error: bool = False
    error: ToolError | None = None
    value: object = attrs.field(default=None, eq=False)

    @property
    def code(self) -> str | None:
        """The error code, or ``None`` for a success or an error without one."""
        return self.error.code if self.error is not None else None

    def problem(self) -> str | None:
        """Why this result cannot be logged or sent as it is, or ``None`` when it can.

        Frozen classes do not check field types, so a tool may build a result whose
        content is not text, or an error that is not a ``ToolError``; the registry
        checks results it did not build itself at the boundary.
        """
        if type(self.content) is not str and not isinstance(self.content, str):
            return f"content is not text: {type(self.content).__name__}"
        if not isinstance(self.is_error, bool):
            return f"is_error is not a bool: {type(self.is_error).__name__}"
        error = self.error
        if error is None:
            return None
        if not isinstance(error, ToolError):
            return f"error is not a ToolError: {type(error).__name__}"
        if not isinstance(error.message, str):
            return f"error message is not text: {type(error.message).__name__}"
        for key in ("name", "code"):
            part = getattr(error, key)
            if part is not None and not isinstance(part, str):
                return f"error {key} is not text: {type(part).__name__}"
        return None

    @classmethod
    def of(cls, value: object) -> ToolResult:
        """A success result carrying ``value`` and its rendered content."""
        return cls(render_value(value), value=value)

    @classmethod
    def failure(
        cls, message: str, *, name: str | None = None, code: str | None = None
    ) -> ToolResult:
        """An error result in the seed's shape: content ``Error: <message>``."""
        return cls(f"Error: {message}", is_error=True, error=ToolError(message, name, code))

    def to_dict(self) -> dict[str, Any]:
        """The wire shape of the seed (``isError``, ``error.info`` only when set)."""
        wire: dict[str, Any] = {"isError": self.is_error}
        if self.error is not None:
            wire["error"] = self.error.to_dict()
        wire["content"] = self.content
        return wire

    @classmethod
    def from_dict(cls, wire: Mapping[str, Any]) -> ToolResult:
        error = wire.get("error")
        return cls(
            str(wire["content"]),
            is_error=bool(wire["isError"]),
            error=ToolError.from_dict(error) if error is not None else None,
        )


# -- the seed's error results, built in one place -----------------------------------------


def timeout_result(ms: int, code: str = TOOL_TIMEOUT) -> ToolResult:
    """The seed's structured timeout error, with the code of the layer whose timer fired."""
    return ToolResult.failure(
        f"tool call timed out after {ms}ms", name="ToolTimeoutError", code=code
    )


def aborted_result(before_dispatch: bool) -> ToolResult:
    """What a call gets when its turn is cancelled (the seed's two abort results)."""
    if before_dispatch:
        return ToolResult.failure(
            "tool call aborted before dispatch",
            name="AbortError",
            code=TOOL_ABORTED_BEFORE_DISPATCH,
        )
    return ToolResult.failure("tool call aborted", name="AbortError", code=TOOL_ABORTED)


def denied_result(reason: str, code: str = TOOL_DENIED) -> ToolResult:
    """A call a pre-execute layer denied: the model reads ``Error: <reason>``."""
    return ToolResult.failure(reason, code=code)


def unknown_tool_result(name: str) -> ToolResult:
    """A call to a tool no registry holds."""
    return ToolResult.failure(f'unknown tool "{name}"', name="ToolNotFoundError", code=UNKNOWN_TOOL)


def invalid_arguments_result(problem: str) -> ToolResult:
    """A call whose arguments are not a JSON object: the tool is not run."""
    return ToolResult.failure(problem, name="InvalidArgumentsError", code=INVALID_ARGUMENTS)


def failed_result(message: str, name: str | None = None) -> ToolResult:
    """A tool (or a layer) that failed: ``name`` is the exception's class name."""
    return ToolResult.failure(message, name=name, code=TOOL_FAILED)


def message_of(error: BaseException) -> str:
    """``str(error)``, or a stand-in when that raises or is empty: never raises."""
    try:
        message = str(error)
    except Exception:
        return f"<unprintable {type(error).__name__}>"
    return message or type(error).__name__


@attrs.frozen
class RaisedException:
    """What a tool raised, kept as a failed result's ``value`` for telemetry.

    The type, message and formatted traceback only — not the exception itself, whose
    traceback would keep every frame of the failed call alive in the session log.
    """

    type: str
    message: str
    stacktrace: str


def failure_from_exception(error: BaseException, *, prefix: str = "") -> ToolResult:
    """``TOOL_FAILED`` with the exception's message and class name (and its traceback)."""
    result = failed_result(prefix + message_of(error), type(error).__name__)
    try:
        stacktrace = "".join(traceback.format_exception(error))
    except Exception:  # an exception whose formatting raises: keep what we have
        stacktrace = ""
    raised = RaisedException(type(error).__name__, message_of(error), stacktrace)
    return ToolResult(result.content, True, result.error, raised)


ToolExecute: TypeAlias = Callable[[Mapping[str, Any], "ToolCall"], Awaitable[object] | object]


def _check_tool_name(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"ToolDefinition: `name` must be a non-empty string, got {value!r}",
            key="name",
            value=value,
        )


def _is_async_callable(function: object) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 - callable objects
    return call is not None and inspect.iscoroutinefunction(call)


#: Plain functions whose signature was found to take ``(arguments, call)``: asking
#: ``inspect.signature`` costs more than building the rest of a registry.
_TAKES_TWO: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


def _check_takes_two(name: str, execute: Callable[..., Any]) -> None:
    """``execute`` must accept ``(arguments, call)``: say so now, not to the model later."""
    plain = type(execute) is types.FunctionType
    if plain and execute in _TAKES_TWO:
        return
    try:
        signature = inspect.signature(execute)
    except (TypeError, ValueError):  # a builtin or an object with no signature: trust it
        return
    try:
        signature.bind(None, None)
    except TypeError:
        raise ConfigError(
            f"tool {name!r}: `execute` must take (arguments, call), but its signature is "
            f"{signature}; for a function of named parameters use "
            "ToolDefinition.from_function(fn) or @tool",
            key="execute",
            value=execute,
        ) from None
    if plain:
        _TAKES_TWO.add(execute)


def _parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    return dict(parameters)


@attrs.frozen(eq=False)
class ToolDefinition:
    """A tool the model may call.

    ``execute(arguments, call)`` is an ``async def`` or a plain function; a plain
    function runs in a worker thread and may call ``anyio.from_thread.check_cancelled()``
    to stop when a timeout fires. It returns a ``str`` (the model-facing content),
    any JSON value (rendered as JSON), or a ``ToolResult`` (used as is).

    ``timeout_ms`` is the tool's own budget, declared by whoever owns the tool and
    applied by ``ToolCallTimeoutPolicy`` / ``Timeout()``. Cancellation is cooperative:
    only a tool that stops when cancelled should declare one, or the timeout waits
    for it and then still reports ``TOOL_TIMEOUT``.
    """

    name: str = attrs.field(validator=_check_tool_name)
    execute: ToolExecute
    description: str = ""
    parameters: Mapping[str, Any] = attrs.field(factory=dict, converter=_parameters)
    timeout_ms: int | None = attrs.field(default=None)
    #: ``False``: running it twice does harm (sends, pays, deletes) — ``Retry`` never
    #: re-runs it; ``True``: safe to repeat; ``None``: not declared.
    idempotent: bool | None = attrs.field(default=None)
    #: ``True``: it changes or destroys something a person may want to approve first.
    destructive: bool | None = attrs.field(default=None, kw_only=True)
    is_async: bool = attrs.field(init=False)

    @timeout_ms.validator
    def _check_timeout(self, _: attrs.Attribute[int | None], value: int | None) -> None:
        if value is not None:
            validate_timeout_ms(f"tool {self.name!r}", "timeout_ms", value)

    @idempotent.validator
    def _check_idempotent(self, _: attrs.Attribute[bool | None], value: object) -> None:
        if value is not None and not isinstance(value, bool):
            raise invalid(f"tool {self.name!r}", "idempotent", value, "True, False or None")

    @destructive.validator
    def _check_destructive(self, _: attrs.Attribute[bool | None], value: object) -> None:
        if value is not None and not isinstance(value, bool):
            raise invalid(f"tool {self.name!r}", "destructive", value, "True, False or None")

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_ms: int | None = None,
        idempotent: bool | None = None,
        destructive: bool | None = None,
    ) -> ToolDefinition:
        """A tool from a plain or ``async`` function: its JSON Schema from the annotations,
        its descriptions from the docstring, arguments checked (and converted) before each
        call (see ``guardstack.pipeline.functions``)."""
        from guardstack.pipeline.functions import from_function

        return from_function(
            fn,
            name=name,
            description=description,
            timeout_ms=timeout_ms,
            idempotent=idempotent,
            destructive=destructive,
        )

    def __attrs_post_init__(self) -> None:
        if not callable(self.execute):
            raise ConfigError(
                f"tool {self.name!r}: `execute` must be callable, got {self.execute!r}",
                key="execute",
                value=self.execute,
            )
        _check_takes_two(self.name, self.execute)
        object.__setattr__(self, "is_async", _is_async_callable(self.execute))

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool schema: only name, description and parameters."""
        parameters = dict(self.parameters) or {"type": "object", "properties": {}}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }


@quick_init
@attrs.frozen(eq=False)
class ToolCall:
    """One request to run a tool.

    ``arguments`` is a mapping, or the raw text a model produced when that text was
    not a JSON object (the registry answers such calls with ``INVALID_ARGUMENTS``).
    ``agent`` is ``None`` for a direct call; ``tool`` is set by the registry before
    the dispatch stage; ``attempt`` is set by a retry for the layers inside it, and
    ``hedge`` by a hedge.
    ``conversation`` (any hashable) says which conversation a call outside the agent
    loop belongs to — a framework's thread or session id — so per-conversation
    guards keep their state apart; the loop sets ``agent`` instead.
    """

    name: str
    arguments: Mapping[str, Any] | str
    call_id: str
    agent: Agent | None = None
    tool: ToolDefinition | None = None
    attempt: int = 1
    conversation: Hashable | None = None
    #: Set by a ``Hedge`` for the layers inside it: 0 is the first attempt, 1… its hedges
    #: (``attempt`` stays Retry's, so inner layers can tell the two apart).
    hedge: int = 0
    #: Its place in the admission layers' queues: higher is served first, first come
    #: first served within a priority (``None``: the agent's priority, 0 without one).
    priority: int | None = None
    #: Whose call it is, for fair shares between tenants (``None``: the agent's tenant,
    #: else ``default``).
    tenant: str | None = None
    #: What ``progress()`` tells: set by a ``Timeout`` with ``idle_ms`` for the layers
    #: and the tool inside it.
    on_progress: Callable[[], None] | None = attrs.field(default=None, repr=False)
    #: What its caller knows beside the call (``CallScope``): its place in a parallel
    #: step, a resumed child's decisions, where its progress goes.
    scope: CallScope | None = attrs.field(default=None, kw_only=True, repr=False)

    def progress(self) -> None:
        """Say the tool is still working: a ``Timeout(idle_ms=…)`` around it then bounds
        the time between two reports, not the whole call. Cheap, and a no-op when
        nothing listens; a tool that never reports is bounded as before."""
        listener = self.on_progress
        if listener is not None:
            listener()

    # -- the call context every layer reads (``CallContext``) ----------------------------

    @property
    def key(self) -> str:
        return self.name if self.tool is not None else UNKNOWN_KEY

    @property
    def label(self) -> str:
        return f'tool "{self.name}"'

    @property
    def budget_ms(self) -> int | None:
        tool = self.tool
        return tool.timeout_ms if tool is not None else None

    @property
    def may_repeat(self) -> bool:
        tool = self.tool
        return tool is None or tool.idempotent is not False

    @property
    def tool_name(self) -> str | None:
        return self.name

    @property
    def queue_priority(self) -> int:
        priority = self.priority
        if priority is not None:
            return priority
        agent = self.agent
        return agent.priority if agent is not None else 0

    @property
    def owner(self) -> str:
        agent = self.agent
        return self.tenant or (agent.tenant if agent is not None else None) or DEFAULT_TENANT

    @property
    def listener(self) -> ProgressListener | None:
        reported = self.on_progress
        if reported is None:
            return None
        return lambda _: reported()

    def with_listener(self, listener: ProgressListener) -> ToolCall:
        return attrs.evolve(self, on_progress=lambda: listener(""))

    def with_attempt(self, attempt: int) -> ToolCall:
        return self if self.attempt == attempt else attrs.evolve(self, attempt=attempt)

    def scoped(self, **changes: Any) -> ToolCall:
        """The call with its ``CallScope`` changed (``order=``, ``decisions=``,
        ``progress=``); itself when nothing changes."""
        scope = self.scope
        if scope is None:
            return attrs.evolve(self, scope=CallScope(**changes))
        if all(getattr(scope, name) is value for name, value in changes.items()):
            return self
        return attrs.evolve(self, scope=attrs.evolve(scope, **changes))

    def with_hedge(self, hedge: int) -> ToolCall:
        return self if self.hedge == hedge else attrs.evolve(self, hedge=hedge)

    def resolved(self, tool: ToolDefinition | None) -> ToolCall:
        """The same call with ``tool`` set: every field copied as it is (nothing to
        convert again), without an ``__init__`` call — once per call on the hot path."""
        call: Any = _new(_OPEN_TOOL_CALL)  # frozen to the type checker; open until sealed
        call.name, call.arguments, call.call_id = self.name, self.arguments, self.call_id
        call.agent, call.tool, call.attempt = self.agent, tool, self.attempt
        call.conversation, call.hedge, call.priority = self.conversation, self.hedge, self.priority
        call.tenant, call.on_progress, call.scope = self.tenant, self.on_progress, self.scope
        call.__class__ = ToolCall
        sealed: ToolCall = call
        return sealed


_OPEN_TOOL_CALL: Final[type[Any]] = open_twin(ToolCall)
_new: Final = object.__new__
