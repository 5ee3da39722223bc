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

from collections.abc import Awaitable, Callable
from typing import Any, Final, Generic, Literal, TypeAlias, TypeVar, cast

import attrs

from guardstack.pipeline.call_context import CallContext
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
    timeout_result,
)

__all__ = [
    "DEFAULT_TENANT",
    "DISPATCH",
    "MODEL",
    "UNKNOWN_KEY",
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

#: The one key every call to a tool no registry holds shares: names a model makes up
#: cannot fill a layer's state.
UNKNOWN_KEY: Final = "<unknown>"

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
#: The tenant of a call that names none, and whose agent names none.
DEFAULT_TENANT: Final = "default"
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


class StageAdapter(Generic[ItemT, ValueT, OutcomeT]):
    """What a layer needs to know about its stage, and nothing else."""

    #: ``"dispatch"`` or ``"model"``: the names users read in config and spans.
    name: str
    #: A fixed budget must be given (a model declares none).
    needs_budget: bool
    #: Calls carry a tool name (name patterns such as ``tools=`` apply).
    has_names: bool
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

    def failed(self, outcome: OutcomeT) -> bool:
        raise NotImplementedError

    def code(self, outcome: OutcomeT) -> str | None:
        """The failure's code (``None`` for a success)."""
        raise NotImplementedError

    def is_control(self, outcome: OutcomeT) -> bool:
        """guardstack's own control flow or refusal: never a provider's failure."""
        raise NotImplementedError

    def is_refusal(self, outcome: OutcomeT) -> bool:
        """A guardstack layer's refusal (part of ``is_control``): it carries a code to act on."""
        raise NotImplementedError

    def retry_after_s(self, outcome: OutcomeT) -> float | None:
        """How long the failure said to wait before trying again, if it said."""
        raise NotImplementedError

    def refusal(
        self,
        item: ItemT,
        kind: FailureKind,
        message: str,
        *,
        layer: str,
        name: str,
        retry_after_s: float | None = None,
    ) -> OutcomeT:
        """A layer's own refusal (an open breaker, a full limit), marked as guardstack's."""
        raise NotImplementedError

    def timed_out(
        self,
        item: ItemT,
        ms: int,
        code: str,
        layer: str,
        *,
        why: str | None = None,
        partial: str | None = None,
    ) -> OutcomeT:
        """What a call gets when a timeout layer's own deadline fired: after ``ms`` in
        all, or ``why`` (no first byte, a stalled stream), with the text that arrived."""
        raise NotImplementedError

    def failure(self, item: ItemT, code: str, message: str, name: str) -> OutcomeT:
        """A failure with ``code``, as if the provider had answered with it (chaos)."""
        raise NotImplementedError

    def fault(self, item: ItemT, error: Exception) -> OutcomeT:
        """An exception, reported as the stage reports a provider raising it."""
        raise NotImplementedError

    def explained(self, outcome: OutcomeT, note: str) -> OutcomeT:
        """The same failure, saying why nothing more was tried (``"… (not retried: …)"``)."""
        raise NotImplementedError

    def code_for(self, kind: FailureKind) -> str:
        """The stage's code for a kind of failure (``TOOL_RATE_LIMITED``…)."""
        raise NotImplementedError

    def key(self, item: ItemT) -> str:
        """The state key: the tool's name (``<unknown>`` for none), the model's name."""
        raise NotImplementedError

    def label(self, item: ItemT) -> str:
        """How a message names what was called: ``tool "grep"``, ``model gpt-x``."""
        raise NotImplementedError

    def budget_ms(self, item: ItemT) -> int | None:
        """The budget the called thing declares (a tool's ``timeout_ms``)."""
        raise NotImplementedError

    def may_repeat(self, item: ItemT) -> bool:
        """Whether running it twice is allowed (not declared ``idempotent=False``)."""
        raise NotImplementedError

    def name_of(self, item: ItemT) -> str | None:
        """The tool's name, for name patterns (``None`` on a stage without names)."""
        raise NotImplementedError

    # -- what both stages' calls share (``CallContext``): answered once, here ----------

    def attempt_of(self, item: ItemT) -> int:
        return item.attempt

    def with_attempt(self, item: ItemT, attempt: int) -> ItemT:
        return item if item.attempt == attempt else attrs.evolve(cast(Any, item), attempt=attempt)

    def hedge_of(self, item: ItemT) -> int:
        return item.hedge

    def with_hedge(self, item: ItemT, hedge: int) -> ItemT:
        return item if item.hedge == hedge else attrs.evolve(cast(Any, item), hedge=hedge)

    def priority_of(self, item: ItemT) -> int:
        """Its place in an admission queue: its own priority, else its agent's, else 0."""
        priority = item.priority
        if priority is not None:
            return priority
        agent = item.agent
        return agent.priority if agent is not None else 0

    def tenant_of(self, item: ItemT) -> str:
        """Whose call it is, for fair shares: its own tenant, its agent's, or ``default``."""
        agent = item.agent
        return item.tenant or (agent.tenant if agent is not None else None) or DEFAULT_TENANT

    # -- what differs ------------------------------------------------------------------

    def listener_of(self, item: ItemT) -> Callable[[str], None] | None:
        """What is told of its progress (a tool's reports, a stream's pieces) already."""
        raise NotImplementedError

    def with_listener(self, item: ItemT, listener: Callable[[str], None]) -> ItemT:
        """The item with ``listener`` told of its progress instead (the caller chains)."""
        raise NotImplementedError


def _result_error(message: str, name: str, code: str, retry_after_s: float | None) -> ToolError:
    return ToolError(message, name, code, retry_after_s=retry_after_s)


class ToolStage(StageAdapter[ToolCall, ToolResult, ToolResult]):
    """The dispatch stage: outcomes are ``ToolResult`` values; failures are error results."""

    name = "dispatch"
    needs_budget = False
    has_names = True
    fails_by_raising = False

    def attempt(
        self, call_next: Callable[[ToolCall], Awaitable[ToolResult]], item: ToolCall
    ) -> Awaitable[ToolResult]:
        return call_next(item)  # layers only ever see results here: no wrapping needed

    def deliver(self, outcome: ToolResult) -> ToolResult:
        result: ToolResult = outcome
        return result

    def failed(self, outcome: ToolResult) -> bool:
        return bool(outcome.is_error)

    def code(self, outcome: ToolResult) -> str | None:
        if not outcome.is_error:
            return None
        code: str | None = outcome.code
        return code

    def is_control(self, outcome: ToolResult) -> bool:
        value = outcome.value
        return isinstance(value, Refusal) or (
            outcome.is_error and outcome.code in _CONTROL_CODES and not isinstance(value, Lost)
        )

    def is_refusal(self, outcome: ToolResult) -> bool:
        return isinstance(outcome.value, Refusal)

    def retry_after_s(self, outcome: ToolResult) -> float | None:
        error = outcome.error
        wait: float | None = error.retry_after_s if error is not None else None
        return wait

    def refusal(
        self,
        item: ToolCall,
        kind: FailureKind,
        message: str,
        *,
        layer: str,
        name: str,
        retry_after_s: float | None = None,
    ) -> ToolResult:
        error = _result_error(message, name, _TOOL_CODES[kind], retry_after_s)
        return ToolResult(f"Error: {message}", True, error, Refusal(layer, retry_after_s))

    def timed_out(
        self,
        item: ToolCall,
        ms: int,
        code: str,
        layer: str,
        *,
        why: str | None = None,
        partial: str | None = None,
    ) -> ToolResult:
        if why is None:
            return timeout_result(ms, code)
        return ToolResult.failure(f"tool call timed out: {why}", name="ToolTimeoutError", code=code)

    def failure(self, item: ToolCall, code: str, message: str, name: str) -> ToolResult:
        return ToolResult.failure(message, name=name, code=code)

    def fault(self, item: ToolCall, error: Exception) -> ToolResult:
        return failure_from_exception(error)

    def explained(self, outcome: ToolResult, note: str) -> ToolResult:
        # the note is added to the outcome, which keeps everything else it carries
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

    def key(self, item: ToolCall) -> str:
        return item.name if item.tool is not None else UNKNOWN_KEY

    def label(self, item: ToolCall) -> str:
        return f'tool "{item.name}"'

    def budget_ms(self, item: ToolCall) -> int | None:
        tool = item.tool
        return tool.timeout_ms if tool is not None else None

    def may_repeat(self, item: ToolCall) -> bool:
        tool = item.tool
        return tool is None or tool.idempotent is not False

    def name_of(self, item: ToolCall) -> str | None:
        return item.name

    def listener_of(self, item: ToolCall) -> Callable[[str], None] | None:
        reported = item.on_progress
        if reported is None:
            return None
        return lambda _: reported()

    def with_listener(self, item: ToolCall, listener: Callable[[str], None]) -> ToolCall:
        return attrs.evolve(item, on_progress=lambda: listener(""))


async def _caught(
    call_next: Callable[[ModelRequest], Awaitable[ModelReply]], request: ModelRequest
) -> ModelReply | Exception:
    try:
        return await call_next(request)
    except Exception as error:  # cancellation and other BaseExceptions propagate
        return error


def model_name(request: ModelRequest) -> str:
    """The model a request goes to — the request's own (a child's, the model proxy's
    upstream), else its agent's — by its ``model`` attribute, else ``model``."""
    answering = request.model if request.model is not None else request.agent.model
    name = getattr(answering, "model", None)
    return name if isinstance(name, str) and name else "model"


class ModelStage(StageAdapter[ModelRequest, ModelReply, ModelReply | Exception]):
    """The model stage: outcomes are replies or the exceptions calls raised."""

    name = "model"
    needs_budget = True
    has_names = False
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

    def failed(self, outcome: ModelReply | Exception) -> bool:
        return isinstance(outcome, BaseException)

    def code(self, outcome: ModelReply | Exception) -> str | None:
        return model_error_code(outcome) if isinstance(outcome, BaseException) else None

    def is_control(self, outcome: ModelReply | Exception) -> bool:
        if isinstance(outcome, ModelError):
            return outcome.refused
        return isinstance(outcome, GuardstackError)

    def is_refusal(self, outcome: ModelReply | Exception) -> bool:
        return isinstance(outcome, ModelError) and outcome.refused

    def retry_after_s(self, outcome: ModelReply | Exception) -> float | None:
        return outcome.retry_after_s if isinstance(outcome, ModelError) else None

    def refusal(
        self,
        item: ModelRequest,
        kind: FailureKind,
        message: str,
        *,
        layer: str,
        name: str,
        retry_after_s: float | None = None,
    ) -> ModelReply | Exception:
        return ModelError(message, _MODEL_CODES[kind], retry_after_s, layer=layer, refused=True)

    def timed_out(
        self,
        item: ModelRequest,
        ms: int,
        code: str,
        layer: str,
        *,
        why: str | None = None,
        partial: str | None = None,
    ) -> ModelReply | Exception:
        message = (
            f"model call timed out after {ms}ms" if why is None else f"model call timed out: {why}"
        )
        return ModelError(message, code, layer=layer, partial=partial)

    def failure(
        self, item: ModelRequest, code: str, message: str, name: str
    ) -> ModelReply | Exception:
        return ModelError(message, code)

    def fault(self, item: ModelRequest, error: Exception) -> ModelReply | Exception:
        return error

    def explained(self, outcome: ModelReply | Exception, note: str) -> ModelReply | Exception:
        if isinstance(outcome, ModelReply):
            return outcome  # a reply is no failure to explain
        return noted(outcome, note)

    def code_for(self, kind: FailureKind) -> str:
        return _MODEL_CODES[kind]

    def key(self, item: ModelRequest) -> str:
        return model_name(item)

    def label(self, item: ModelRequest) -> str:
        return f"model {model_name(item)}"

    def budget_ms(self, item: ModelRequest) -> int | None:
        return None

    def may_repeat(self, item: ModelRequest) -> bool:
        return True

    def name_of(self, item: ModelRequest) -> str | None:
        return None

    def listener_of(self, item: ModelRequest) -> Callable[[str], None] | None:
        return item.on_chunk

    def with_listener(self, item: ModelRequest, listener: Callable[[str], None]) -> ModelRequest:
        return attrs.evolve(item, on_chunk=listener)


DISPATCH: Final = ToolStage()
MODEL: Final = ModelStage()


def adapter_for(stage: str) -> StageAdapter[Any, Any, Any]:
    """The adapter of a stage name as users write it (``dispatch`` or ``model``)."""
    return MODEL if stage == "model" else DISPATCH


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
