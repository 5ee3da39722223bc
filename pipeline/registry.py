"""The tool registry and its three onion stages.

``registry.execute(call)`` runs ``pre_execute -> dispatch -> post_execute``:

* ``pre_execute`` layers decide ``Allow()`` or ``Deny(reason)``; a denied call skips
  dispatch and gets a ``TOOL_DENIED`` result, and post-execute still runs.
* ``dispatch`` layers wrap the tool (timeouts, retries, metrics…). The innermost
  step runs the tool and normalises whatever happens there — an unknown name, an
  exception, a value JSON cannot hold — into an error result, so layers only ever
  see results.
* ``post_execute`` layers return ``Accept(...)`` or ``Block(feedback)`` and may add
  contexts for the model.

Bad input never crashes the caller: arguments that are not a JSON object get
``INVALID_ARGUMENTS`` (the tool is not run, post-execute runs), and a layer that
raises — a bug in someone's middleware — gives a final ``TOOL_FAILED`` result that
names the layer (post-execute skipped). The caller's cancellation is never turned
into a result: it propagates.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from typing import Any, Final, Protocol, TypeAlias

import anyio.to_thread
import attrs

from pipeline.errors import DuplicateToolError, GuardstackError
from pipeline.onion import Pipeline, Registration
from pipeline.values import (
    INVALID_ARGUMENTS,
    TOOL_DENIED,
    TOOL_FAILED,
    UNKNOWN_TOOL,
    Accept,
    Allow,
    Block,
    Deny,
    PostDecision,
    PreDecision,
    ToolCall,
    ToolDefinition,
    ToolError,
    ToolOutcome,
    ToolResult,
)

__all__ = ["Execute", "ToolRegistry"]

logger = logging.getLogger("guardstack")

Execute: TypeAlias = Callable[[ToolCall], Awaitable[ToolOutcome]]
PreNext: TypeAlias = Callable[[ToolCall], Awaitable[PreDecision]]
DispatchNext: TypeAlias = Callable[[ToolCall], Awaitable[ToolResult]]
PostNext: TypeAlias = Callable[[ToolCall, ToolResult], Awaitable[PostDecision]]

_MAX_ARGUMENT_DEPTH = 64


class CallGate(Protocol):
    """How an agent loop orders the phases of calls that run in parallel.

    Prepare (pre-execute) and finalize (post-execute) phases run one call at a time
    in model order; dispatch overlaps, bounded by the loop's parallelism.
    """

    def prepare(self) -> AbstractAsyncContextManager[None]: ...
    def dispatch(self) -> AbstractAsyncContextManager[None]: ...
    def finalize(self) -> AbstractAsyncContextManager[None]: ...


#: Set by the agent loop, per call task, when a step's calls overlap.
CALL_GATE: ContextVar[CallGate | None] = ContextVar("guardstack_call_gate", default=None)


def _check_arguments(arguments: object) -> _Early | None:
    """An ``INVALID_ARGUMENTS`` result for arguments that are not a JSON object."""
    if type(arguments) is dict and _json_problem(arguments, 0) is None:
        return None  # the usual case, without the ABC isinstance
    problem = _json_object_problem(arguments)
    if problem is None:
        return None
    failure = ToolResult.failure(problem, name="InvalidArgumentsError", code=INVALID_ARGUMENTS)
    return _Early(failure)


def _json_object_problem(arguments: object) -> str | None:
    """Why ``arguments`` is not a JSON object, or ``None``."""
    if isinstance(arguments, str):
        preview = arguments if len(arguments) <= 80 else arguments[:80] + "…"
        return f"tool call arguments must be a JSON object, got the text {preview!r}"
    if not isinstance(arguments, Mapping):
        return f"tool call arguments must be a JSON object, got {type(arguments).__name__}"
    problem = _json_problem(arguments, 0)
    return None if problem is None else f"tool call arguments must be JSON-serialisable: {problem}"


_SCALARS: Final = frozenset({str, int, bool, type(None)})


def _json_problem(value: object, depth: int) -> str | None:
    kind = type(value)
    if kind in _SCALARS:
        return None
    if kind is float:
        return None if math.isfinite(value) else f"{value!r} is not a JSON number"  # type: ignore[arg-type]
    if depth > _MAX_ARGUMENT_DEPTH:
        return f"nested deeper than {_MAX_ARGUMENT_DEPTH} levels (or circular)"
    items: Iterable[object]
    if kind is dict or isinstance(value, Mapping):
        for key in value:  # type: ignore[attr-defined]
            if type(key) is not str:
                return f"key {key!r} is not a string"
        items = value.values()  # type: ignore[attr-defined]
    elif kind is list or kind is tuple:
        items = value  # type: ignore[assignment]
    else:
        return f"a {kind.__name__} value is not JSON"
    for item in items:
        if type(item) in _SCALARS:
            continue
        problem = _json_problem(item, depth + 1)
        if problem is not None:
            return problem
    return None


def _message_of(error: BaseException) -> str:
    try:
        message = str(error)
    except Exception:
        return f"<unprintable {type(error).__name__}>"
    return message or type(error).__name__


def failure_from_exception(error: BaseException, *, prefix: str = "") -> ToolResult:
    """``TOOL_FAILED`` with the exception's message and class name."""
    return ToolResult.failure(
        prefix + _message_of(error), name=type(error).__name__, code=TOOL_FAILED
    )


_ALLOW: Final = Allow()
_ACCEPT: Final = Accept()


async def _allow(call: ToolCall) -> PreDecision:
    return _ALLOW


async def _accept(call: ToolCall, result: ToolResult) -> PostDecision:
    return _ACCEPT


def _call_in_thread(tool: ToolDefinition, arguments: Mapping[str, Any], call: ToolCall) -> object:
    value = tool.execute(arguments, call)
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()  # an un-awaited coroutine would warn when collected
        raise TypeError(
            f"tool {tool.name!r} is a plain function that returned an awaitable; "
            "declare it `async def`"
        )
    return value


async def _run_tool(call: ToolCall) -> ToolResult:
    """The innermost dispatch step: run the tool, normalise whatever happens into a result."""
    tool = call.tool
    if tool is None:
        return ToolResult.failure(
            f'unknown tool "{call.name}"', name="ToolNotFoundError", code=UNKNOWN_TOOL
        )
    try:
        if tool.is_async:
            value = await tool.execute(call.arguments, call)  # type: ignore[arg-type,misc]
        else:
            value = await anyio.to_thread.run_sync(_call_in_thread, tool, call.arguments, call)  # type: ignore[arg-type]
    except Exception as error:
        logger.debug("tool %r raised", call.name, exc_info=True)
        return failure_from_exception(error)
    if isinstance(value, ToolResult):
        if type(value.content) is not str:
            return ToolResult.failure(
                f"tool {tool.name!r} returned a ToolResult whose content is not text: "
                f"{type(value.content).__name__}",
                name="TypeError",
                code=TOOL_FAILED,
            )
        return value
    if type(value) is str:
        return ToolResult(value, False, None, value)
    try:
        return ToolResult.of(value)
    except (TypeError, ValueError) as error:
        return failure_from_exception(
            error, prefix=f"tool {tool.name!r} returned a value that is not JSON-serialisable: "
        )


@attrs.frozen
class _Early:
    """A result decided before post-execute: ``final`` ones skip post-execute too."""

    result: ToolResult
    ends_turn: bool = False
    final: bool = False


def _checked(result: object) -> ToolResult:
    if type(result) is not ToolResult and not isinstance(result, ToolResult):
        raise TypeError(f"dispatch returned {result!r}; expected a ToolResult")
    return result


class ToolRegistry:
    """Tools by name, and the three stages every call goes through."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolDefinition] = {}
        self.pre_execute: Pipeline[PreNext] = Pipeline(_allow, stage="pre_execute")
        self.dispatch: Pipeline[DispatchNext] = Pipeline(_run_tool, stage="dispatch")
        self.post_execute: Pipeline[PostNext] = Pipeline(_accept, stage="post_execute")
        self._operation_hooks: list[Callable[[Execute], Execute]] = []
        self._operation: Execute = self._run

    # -- tools -------------------------------------------------------------------------

    def register(self, definition: ToolDefinition) -> Registration:
        """Add a tool; a duplicate name raises ``DuplicateToolError``."""
        if not isinstance(definition, ToolDefinition):
            raise TypeError(f"register() takes a ToolDefinition, got {definition!r}")
        if definition.name in self._tools:
            raise DuplicateToolError(f"tool {definition.name!r} is already registered")
        self._tools[definition.name] = definition

        def remove() -> None:
            if self._tools.get(definition.name) is definition:
                del self._tools[definition.name]

        return Registration(remove)

    def get(self, name: str) -> ToolDefinition | None:
        """The tool registered under ``name``, or ``None``."""
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def definitions(self) -> list[ToolDefinition]:
        return list(self._tools.values())

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-tool schemas for every registered tool, in registration order."""
        return [definition.schema() for definition in self._tools.values()]

    # -- instrumentation ---------------------------------------------------------------

    def instrument(self, hook: Callable[[Execute], Execute]) -> Registration:
        """Wrap every whole ``execute`` (pre, dispatch and post) with ``hook``."""
        self._operation_hooks.append(hook)
        self._compose_operation()

        def remove() -> None:
            self._operation_hooks.remove(hook)
            self._compose_operation()

        return Registration(remove)

    def _compose_operation(self) -> None:
        operation: Execute = self._run
        for hook in reversed(self._operation_hooks):
            operation = hook(operation)
        self._operation = operation

    def describe(self) -> str:
        """Every stage's layers, outermost first."""
        return "\n".join(
            f"{stage.stage}:\n" + "\n".join(f"  {line}" for line in stage.describe().splitlines())
            for stage in (self.pre_execute, self.dispatch, self.post_execute)
        )

    # -- execution ---------------------------------------------------------------------

    def execute(self, call: ToolCall) -> Awaitable[ToolOutcome]:
        """Run ``call`` through pre-execute, dispatch and post-execute."""
        return self._operation(call)

    async def _run(self, call: ToolCall) -> ToolOutcome:
        tool = self._tools.get(call.name)
        if call.tool is not tool:
            call = ToolCall(call.name, call.arguments, call.call_id, call.agent, tool, call.attempt)
        gate = CALL_GATE.get()
        if gate is not None:
            return await self._run_gated(call, gate)
        # Stages without layers are skipped outright: zero cost when unused.
        early = _check_arguments(call.arguments)
        if early is None and self.pre_execute.layered:
            early = await self._pre_execute(call)
        if early is None:
            try:
                result = _checked(await self.dispatch.chain(call))
            except Exception as error:
                return ToolOutcome(self._final_failure(self.dispatch, error).result)
            if not self.post_execute.layered:
                return ToolOutcome(result)
            return await self._post_execute(call, result, False)
        return await self._finalize(call, early)

    async def _run_gated(self, call: ToolCall, gate: CallGate) -> ToolOutcome:
        # The gate orders this call among its step's calls; tool calls made *from*
        # inside it (a subagent's, say) belong to no step of ours.
        token = CALL_GATE.set(None)
        try:
            async with gate.prepare():
                early = _check_arguments(call.arguments)
                if early is None and self.pre_execute.layered:
                    early = await self._pre_execute(call)
            if early is None:
                async with gate.dispatch():
                    try:
                        early = _Early(_checked(await self.dispatch.chain(call)))
                    except Exception as error:
                        early = self._final_failure(self.dispatch, error)
            async with gate.finalize():
                return await self._finalize(call, early)
        finally:
            CALL_GATE.reset(token)

    async def _pre_execute(self, call: ToolCall) -> _Early | None:
        """``None`` to dispatch; else a denial, or a final failure of a broken layer."""
        try:
            decision = await self.pre_execute.chain(call)
            if isinstance(decision, Deny):
                denied = ToolResult.failure(decision.reason, code=TOOL_DENIED)
                return _Early(denied, ends_turn=decision.end_turn)
            if not isinstance(decision, Allow):
                raise TypeError(  # noqa: TRY301 - reported like any pre-execute bug
                    f"pre-execute returned {decision!r}; expected Allow() or Deny(reason)"
                )
        except Exception as error:
            return self._final_failure(self.pre_execute, error)
        return None

    async def _finalize(self, call: ToolCall, early: _Early) -> ToolOutcome:
        if early.final:
            return ToolOutcome(early.result)
        if not self.post_execute.layered:
            return ToolOutcome(early.result, (), early.ends_turn)
        return await self._post_execute(call, early.result, early.ends_turn)

    async def _post_execute(
        self, call: ToolCall, result: ToolResult, ends_turn: bool
    ) -> ToolOutcome:
        try:
            decision = await self.post_execute.chain(call, result)
            if isinstance(decision, Block):
                message = decision.feedback or "tool result blocked by post-execute policy"
                blocked = ToolResult(decision.feedback, is_error=True, error=ToolError(message))
                return ToolOutcome(
                    blocked, decision.additional_contexts, ends_turn or decision.end_turn
                )
            if not isinstance(decision, Accept):
                raise TypeError(  # noqa: TRY301 - reported like any post-execute bug
                    f"post-execute returned {decision!r}; expected Accept(...) or Block(feedback)"
                )
            if decision.value is not None:
                if result.is_error:
                    raise GuardstackError(  # noqa: TRY301
                        "post-execute cannot replace the value of a failed result"
                    )
                result = ToolResult.of(decision.value)
        except Exception as error:
            return ToolOutcome(self._final_failure(self.post_execute, error).result)
        return ToolOutcome(result, decision.additional_contexts, ends_turn)

    def _final_failure(self, stage: Pipeline[Any], error: Exception) -> _Early:
        layer = stage.blame(error)
        where = f'{stage.stage} layer "{layer}"' if layer else f"{stage.stage} stage"
        logger.error("%s raised; the call gets a final TOOL_FAILED result", where, exc_info=error)
        return _Early(failure_from_exception(error, prefix=f"{where} failed: "), final=True)
