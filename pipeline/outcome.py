"""One outcome core: what an attempt produced, seen the same way on every stage.

Every resilience layer (``Timeout``, ``Retry``, ``CircuitBreaker``, the limits,
``Fallback``, ``Hedge``, ``Chaos``, ``Metrics``) is written once, against an
*outcome*: what one pass through the rest of the chain produced. On the dispatch
stage that is a ``ToolResult`` (the registry turns whatever a tool does into one);
on the model stage it is a ``ModelReply`` or the ``Exception`` the call raised. A
``StageAdapter`` says, for its stage, whether an outcome failed and with which
code, and builds the layer's own answers (a refusal, a timeout, a fault) in that
stage's form — a ``ToolResult`` with a code on tools, a raised ``ModelError`` on
models. Layers never branch on their stage: they ask the adapter.

**guardstack's own control flow is told apart in one place** (``is_control``):
cancellation (never an outcome: it propagates), a cap's ``TurnBlocked`` and any
other ``GuardstackError``, a pre-execute denial, and a refusal a guardstack layer
made (an open breaker, a full limiter, a store that fails closed). A breaker never
counts it, a retry never retries it (unless it is a refusal that says when to come
back: a rate limit's ``retry_after_s``), a hedge never hedges after it, and a span
never calls it a provider failure.

An adapter answers without suspending: on the dispatch stage ``attempt`` hands back
the inner chain's own awaitable, so the outcome core adds no coroutine there.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeAlias, TypeVar

import attrs

from guardstack.pipeline.call_context import DEFAULT_TENANT, UNKNOWN_KEY, CallContext
from guardstack.pipeline.errors import GuardstackError
from guardstack.pipeline.model import (
    MODEL_FAILED,
    MODEL_OVERLOADED,
    MODEL_RATE_LIMITED,
    MODEL_REJECTED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    ModelError,
    ModelReply,
    ModelRequest,
    model_error_code,
    noted,
)
from guardstack.pipeline.validate import stage
from guardstack.pipeline.values import (
    TOOL_ABORTED,
    TOOL_ABORTED_BEFORE_DISPATCH,
    TOOL_DENIED,
    TOOL_FAILED,
    TOOL_OVERLOADED,
    TOOL_RATE_LIMITED,
    TOOL_TIMEOUT,
    TOOL_UNAVAILABLE,
    ToolCall,
    ToolError,
    ToolResult,
    failure_from_exception,
)

__all__ = [
    "DEFAULT_TENANT",
    "DISPATCH",
    "MODEL",
    "UNKNOWN_KEY",
    "Failed",
    "FailureKind",
    "ItemT",
    "Lost",
    "ModelStage",
    "Next",
    "Outcome",
    "OutcomeT",
    "Refusal",
    "StageAdapter",
    "ToolStage",
    "ValueT",
    "adapter_for",
    "never_reached",
    "refusal",
    "timed_out",
]

ItemT = TypeVar("ItemT", bound=CallContext)
ValueT = TypeVar("ValueT")

OutcomeT = TypeVar("OutcomeT")

#: What one attempt produced on a stage whose calls answer ``ValueT``: the value, or
#: the exception it raised (a ``ToolResult`` on the dispatch stage, where a tool's
#: failure is a result; ``ModelReply | Exception`` on the model stage).
Outcome: TypeAlias = ValueT | Exception

#: The rest of a stage's chain as a layer body calls it: ``Next[ToolCall, ToolResult]`` on
#: the dispatch stage, ``Next[ModelRequest, ModelReply]`` on the model stage. A layer that
#: serves both is generic in ``ItemT``/``ValueT`` and takes its ``StageAdapter`` of them.
Next: TypeAlias = Callable[[ItemT], Awaitable[ValueT]]

#: The kinds of failure a layer reports in its stage's own code (``TOOL_*`` / ``MODEL_*``).
FailureKind: TypeAlias = Literal["UNAVAILABLE", "OVERLOADED", "RATE_LIMITED", "TIMEOUT", "FAILED"]


_TOOL_CODES: Final = {
    "UNAVAILABLE": TOOL_UNAVAILABLE,
    "OVERLOADED": TOOL_OVERLOADED,
    "RATE_LIMITED": TOOL_RATE_LIMITED,
    "TIMEOUT": TOOL_TIMEOUT,
    "FAILED": TOOL_FAILED,
}
_MODEL_CODES: Final = {
    "UNAVAILABLE": MODEL_UNAVAILABLE,
    "OVERLOADED": MODEL_OVERLOADED,
    "RATE_LIMITED": MODEL_RATE_LIMITED,
    "TIMEOUT": MODEL_TIMEOUT,
    "FAILED": MODEL_FAILED,
}
#: Results the loop and the registry make for guardstack's own reasons, never a tool's failure.
_CONTROL_CODES: Final = frozenset({TOOL_DENIED, TOOL_ABORTED, TOOL_ABORTED_BEFORE_DISPATCH})


@attrs.frozen
class Lost:
    """The ``value`` of an ``ABORTED`` result whose attempt was lost with the process that
    ran it (a Temporal worker that died): a failure on the provider's side, which a
    ``Retry`` may retry for an idempotent tool — unlike guardstack's own aborts."""

    why: str = ""


@attrs.frozen
class Refusal:
    """The ``value`` of a tool result a guardstack layer made instead of running the call.

    It marks the result as guardstack's own: an outer breaker never counts it as the
    tool failing, and a ``Retry`` retries it only when ``retry_after_s`` says when.
    """

    layer: str
    retry_after_s: float | None = None


@attrs.frozen
class Failed:
    """What a failed outcome says, read once (``StageAdapter.failure_of``): the same on
    both stages, whatever form the failure takes there."""

    #: The failure's code (``TOOL_*`` / ``MODEL_*``; ``None`` for an error without one).
    code: str | None
    #: guardstack's own control flow or refusal: never a provider's failure.
    control: bool = False
    #: A guardstack layer's refusal (part of ``control``): it carries a code to act on.
    refused: bool = False
    #: How long the failure said to wait before trying again, if it said.
    retry_after_s: float | None = None


class StageAdapter(Generic[ItemT, ValueT, OutcomeT]):
    """What really differs between the stages: the form an outcome takes, and how it
    fails. What a call knows of itself, its call context answers (``CallContext``)."""

    #: ``"dispatch"`` or ``"model"``: the names users read in config and spans.
    name: str
    #: Calls are tool calls: they carry a tool's name (name patterns such as ``tools=``
    #: apply) and may declare a budget. A model call declares none, so a model-stage
    #: timeout must name its own.
    calls_tools: bool
    #: A call fails by raising (a model), not by answering an error result (a tool): an
    #: exception out of a layer is then a failure, not a bug in the layer.
    fails_by_raising: bool

    def attempt(
        self, call_next: Callable[[ItemT], Awaitable[ValueT]], item: ItemT
    ) -> Awaitable[OutcomeT]:
        """Run the rest of the chain once; its outcome (cancellation propagates)."""
        raise NotImplementedError

    def deliver(self, outcome: OutcomeT) -> ValueT:
        """Hand an outcome on in the stage's form: return the value, or raise the error."""
        raise NotImplementedError

    def failure_of(self, outcome: OutcomeT) -> Failed | None:
        """What the outcome's failure says (``None``: it succeeded)."""
        raise NotImplementedError

    def failure(
        self,
        item: ItemT,
        code: str,
        message: str,
        name: str | None = None,
        *,
        layer: str | None = None,
        refused: bool = False,
        retry_after_s: float | None = None,
        partial: str | None = None,
    ) -> OutcomeT:
        """A failure with ``code`` in the stage's form: as if the provider had answered
        with it, or — ``refused`` — a guardstack layer's own refusal (an open breaker, a
        full limit), marked as such. ``partial`` is the text a cut stream had sent."""
        raise NotImplementedError

    def fault(self, item: ItemT, error: Exception) -> OutcomeT:
        """An exception, reported as the stage reports a provider raising it."""
        raise NotImplementedError

    def explained(self, outcome: OutcomeT, note: str) -> OutcomeT:
        """The same failure, saying why nothing more was tried (``"… (not retried: …)"``):
        the note is added to the outcome, which keeps everything else it carries."""
        raise NotImplementedError

    def code_for(self, kind: FailureKind) -> str:
        """The stage's code for a kind of failure (``TOOL_RATE_LIMITED``…)."""
        raise NotImplementedError

    if not TYPE_CHECKING:  # 0.1's members, for one minor version; not typed, not listed

        def __getattr__(self, name: str) -> Any:
            old = _REMOVED_IN_0_3.get(name)
            if old is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            instead, answer = old
            warnings.warn(
                f"StageAdapter.{name} is deprecated and goes in 0.3: {instead}",
                DeprecationWarning,
                stacklevel=2,
            )
            return answer(self) if name in _FLAGS else functools.partial(answer, self)


def _failed(stage: StageAdapter[Any, Any, Any], outcome: Any) -> Failed | None:
    return stage.failure_of(outcome)


#: 0.1's adapter members: what to write instead, and how each is answered now.
_REMOVED_IN_0_3: Final[dict[str, tuple[str, Callable[..., Any]]]] = {
    "needs_budget": ("not calls_tools", lambda s: not s.calls_tools),
    "has_names": ("calls_tools", lambda s: s.calls_tools),
    "failed": ("failure_of(outcome) is not None", lambda s, o: _failed(s, o) is not None),
    "code": ("failure_of(outcome).code", lambda s, o: getattr(_failed(s, o), "code", None)),
    "is_control": (
        "failure_of(outcome).control",
        lambda s, o: getattr(_failed(s, o), "control", False),
    ),
    "is_refusal": (
        "failure_of(outcome).refused",
        lambda s, o: getattr(_failed(s, o), "refused", False),
    ),
    "retry_after_s": (
        "failure_of(outcome).retry_after_s",
        lambda s, o: getattr(_failed(s, o), "retry_after_s", None),
    ),
    "refusal": ("outcome.refusal(stage, item, …)", lambda s, *a, **k: refusal(s, *a, **k)),
    "timed_out": ("outcome.timed_out(stage, item, …)", lambda s, *a, **k: timed_out(s, *a, **k)),
    "key": ("item.key", lambda s, item: item.key),
    "label": ("item.label", lambda s, item: item.label),
    "budget_ms": ("item.budget_ms", lambda s, item: item.budget_ms),
    "may_repeat": ("item.may_repeat", lambda s, item: item.may_repeat),
    "name_of": ("item.tool_name", lambda s, item: item.tool_name),
    "attempt_of": ("item.attempt", lambda s, item: item.attempt),
    "hedge_of": ("item.hedge", lambda s, item: item.hedge),
    "priority_of": ("item.queue_priority", lambda s, item: item.queue_priority),
    "tenant_of": ("item.owner", lambda s, item: item.owner),
    "listener_of": ("item.listener", lambda s, item: item.listener),
    "with_attempt": ("item.with_attempt(n)", lambda s, item, n: item.with_attempt(n)),
    "with_hedge": ("item.with_hedge(n)", lambda s, item, n: item.with_hedge(n)),
    "with_listener": ("item.with_listener(f)", lambda s, item, f: item.with_listener(f)),
}
_FLAGS: Final = frozenset({"needs_budget", "has_names"})


def refusal(
    stage: StageAdapter[ItemT, Any, OutcomeT],
    item: ItemT,
    kind: FailureKind,
    message: str,
    *,
    layer: str,
    name: str,
    retry_after_s: float | None = None,
) -> OutcomeT:
    """A layer's own refusal (an open breaker, a full limit), marked as guardstack's."""
    code = stage.code_for(kind)
    return stage.failure(
        item, code, message, name=name, layer=layer, refused=True, retry_after_s=retry_after_s
    )


def timed_out(
    stage: StageAdapter[ItemT, Any, OutcomeT],
    item: ItemT,
    ms: int,
    code: str,
    layer: str,
    *,
    why: str | None = None,
    partial: str | None = None,
) -> OutcomeT:
    """What a call gets when a timeout layer's own deadline fired: after ``ms`` in all,
    or ``why`` (no first byte, a stalled stream), with the text that had arrived."""
    noun = "tool" if stage.calls_tools else "model"
    message = (
        f"{noun} call timed out after {ms}ms" if why is None else f"{noun} call timed out: {why}"
    )
    return stage.failure(item, code, message, name="ToolTimeoutError", layer=layer, partial=partial)


class ToolStage(StageAdapter[ToolCall, ToolResult, ToolResult]):
    """The dispatch stage: outcomes are ``ToolResult`` values; failures are error results."""

    name = "dispatch"
    calls_tools = True
    fails_by_raising = False

    def attempt(
        self, call_next: Callable[[ToolCall], Awaitable[ToolResult]], item: ToolCall
    ) -> Awaitable[ToolResult]:
        return call_next(item)  # layers only ever see results here: no wrapping needed

    def deliver(self, outcome: ToolResult) -> ToolResult:
        result: ToolResult = outcome
        return result

    def failure_of(self, outcome: ToolResult) -> Failed | None:
        if not outcome.is_error:
            return None
        value, error = outcome.value, outcome.error
        refused = isinstance(value, Refusal)
        code: str | None = outcome.code
        control = refused or (code in _CONTROL_CODES and not isinstance(value, Lost))
        wait: float | None = error.retry_after_s if error is not None else None
        return Failed(code, control, refused, wait)

    def failure(
        self,
        item: ToolCall,
        code: str,
        message: str,
        name: str | None = None,
        *,
        layer: str | None = None,
        refused: bool = False,
        retry_after_s: float | None = None,
        partial: str | None = None,
    ) -> ToolResult:
        error = ToolError(message, name, code, retry_after_s=retry_after_s)
        value = Refusal(layer or "", retry_after_s) if refused else None
        return ToolResult(f"Error: {message}", True, error, value)

    def fault(self, item: ToolCall, error: Exception) -> ToolResult:
        return failure_from_exception(error)

    def explained(self, outcome: ToolResult, note: str) -> ToolResult:
        error = outcome.error
        if error is None:
            error = ToolError(outcome.content, None, outcome.code)
        return attrs.evolve(
            outcome,
            content=f"{outcome.content} ({note})",
            is_error=True,
            error=attrs.evolve(error, message=f"{error.message} ({note})"),
        )

    def code_for(self, kind: FailureKind) -> str:
        return _TOOL_CODES[kind]


async def _caught(
    call_next: Callable[[ModelRequest], Awaitable[ModelReply]], request: ModelRequest
) -> ModelReply | Exception:
    try:
        return await call_next(request)
    except Exception as error:  # cancellation and other BaseExceptions propagate
        return error


def model_name(request: ModelRequest) -> str:
    """The model a request goes to (``ModelRequest.model_name``)."""
    return request.model_name


class ModelStage(StageAdapter[ModelRequest, ModelReply, ModelReply | Exception]):
    """The model stage: outcomes are replies or the exceptions calls raised."""

    name = "model"
    calls_tools = False
    fails_by_raising = True

    def attempt(
        self, call_next: Callable[[ModelRequest], Awaitable[ModelReply]], item: ModelRequest
    ) -> Awaitable[ModelReply | Exception]:
        return _caught(call_next, item)

    def deliver(self, outcome: ModelReply | Exception) -> ModelReply:
        if isinstance(outcome, BaseException):
            raise outcome
        reply: ModelReply = outcome
        return reply

    def failure_of(self, outcome: ModelReply | Exception) -> Failed | None:
        if not isinstance(outcome, BaseException):
            return None
        if isinstance(outcome, ModelError):
            refused = outcome.refused
            return Failed(model_error_code(outcome), refused, refused, outcome.retry_after_s)
        return Failed(model_error_code(outcome), isinstance(outcome, GuardstackError))

    def failure(
        self,
        item: ModelRequest,
        code: str,
        message: str,
        name: str | None = None,
        *,
        layer: str | None = None,
        refused: bool = False,
        retry_after_s: float | None = None,
        partial: str | None = None,
    ) -> ModelReply | Exception:
        return ModelError(
            message, code, retry_after_s, layer=layer, refused=refused, partial=partial
        )

    def fault(self, item: ModelRequest, error: Exception) -> ModelReply | Exception:
        return error

    def explained(self, outcome: ModelReply | Exception, note: str) -> ModelReply | Exception:
        if isinstance(outcome, ModelReply):
            return outcome  # a reply is no failure to explain
        return noted(outcome, note)

    def code_for(self, kind: FailureKind) -> str:
        return _MODEL_CODES[kind]


DISPATCH: Final = ToolStage()
MODEL: Final = ModelStage()


#: A stage as a layer is built for it: its adapter (``MODEL``: typed), or its name as a
#: configuration file writes it (``"model"``).
StageLike: TypeAlias = "StageAdapter[Any, Any, Any] | str"


def adapter_for(stage: StageLike) -> StageAdapter[Any, Any, Any]:
    """The adapter of a stage: itself, or the one a name names (``dispatch``, ``model``)."""
    if isinstance(stage, StageAdapter):
        return stage
    return MODEL if stage == "model" else DISPATCH


def stage_of(owner: str, value: object) -> Literal["dispatch", "model"]:
    """A layer's ``stage`` argument as the name it keeps: a stage's adapter (``MODEL``)
    or its name; anything else is a ``ConfigError`` naming ``owner``."""
    return stage(owner, value.name if isinstance(value, StageAdapter) else value)


if TYPE_CHECKING:
    from typing_extensions import TypeVar as DefaultedTypeVar

    #: The call and the answer of the stage a layer object is built for (``Retry``,
    #: ``Timeout``, ``Metrics``): the tool stage's unless it is given ``stage=MODEL``,
    #: so that a layer built for one stage is a type error on the other.
    StageCallT = DefaultedTypeVar("StageCallT", bound=CallContext, default=ToolCall)
    StageAnswerT = DefaultedTypeVar("StageAnswerT", default=ToolResult)
else:  # the defaults are for type checkers only (PEP 696; typing has them from 3.13)
    StageCallT = TypeVar("StageCallT", bound=CallContext)
    StageAnswerT = TypeVar("StageAnswerT")


#: A provider's clear refusal before doing any work: nothing to pay for.
_REFUSED_BY_PROVIDER: Final = frozenset({MODEL_RATE_LIMITED, MODEL_OVERLOADED, MODEL_REJECTED})


def never_reached(error: BaseException) -> bool:
    """Whether a model call that raised ``error`` certainly never reached the provider's
    billing: guardstack's own control flow, or a provider's clear refusal (a 429, a 529,
    a 400). Anything else — a timeout, a cancelled caller, a dropped connection — may
    have been billed, and a reservation for it stays charged."""
    if isinstance(error, ModelError):
        return error.refused or error.code in _REFUSED_BY_PROVIDER
    return isinstance(error, GuardstackError)  # the rest of ``MODEL.is_control``
