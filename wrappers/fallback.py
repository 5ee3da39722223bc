"""Fallback: when a call fails in a given way, answer with something else.

Where it belongs: a dispatch layer (``stage="dispatch"``) or a model-call layer
(``stage="model"``). **Its position is its meaning.** Outside a ``Retry`` it falls
back once, after every attempt failed (the fallback is one more operation through
the layers inside, so the retry retries it too); inside it, after each failed
attempt (and the retry then sees the fallback's answer, usually a success, and
stops). Outside
a ``CircuitBreaker`` it also answers for an open breaker's ``TOOL_UNAVAILABLE``;
inside one, the breaker sees the fallback's answer instead of the failure.

``to`` is what answers on a result whose code is in ``on``:

* another tool's name: that tool runs with the same arguments, through the
  layers *inside* this one (so a per-attempt timeout inside applies to it, with
  its own declared budget), and its result is the call's result;
* an async function ``(arguments, call) -> value``, like a tool's ``execute``:
  its value is rendered as a tool's, an exception becomes ``TOOL_FAILED``;
* on the model stage, another ``Model``: on a ``ModelError`` whose code is in
  ``on`` (default ``MODEL_UNAVAILABLE``, ``MODEL_RATE_LIMITED``, ``MODEL_TIMEOUT``),
  the request goes to it with the same messages and tools.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import attrs

from guardstack.pipeline.contract import (
    MODEL_RATE_LIMITED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    DispatchNext,
    ModelNext,
    ModelReply,
    ModelRequest,
    Scope,
    model_error_code,
)
from guardstack.pipeline.validate import StageName, codes, cut, invalid, stage
from guardstack.pipeline.values import (
    TOOL_FAILED,
    TOOL_OVERLOADED,
    TOOL_RATE_LIMITED,
    TOOL_TIMEOUT,
    TOOL_UNAVAILABLE,
    ToolCall,
    ToolDefinition,
    ToolResult,
)

__all__ = ["Fallback"]

PLUGIN = "fallback"


def _stage(value: object) -> StageName:
    return stage(PLUGIN, value)


def _default_on(self: Fallback) -> frozenset[str]:
    if self.stage == "model":
        return frozenset({MODEL_UNAVAILABLE, MODEL_RATE_LIMITED, MODEL_TIMEOUT})
    return frozenset(
        {TOOL_TIMEOUT, TOOL_FAILED, TOOL_UNAVAILABLE, TOOL_OVERLOADED, TOOL_RATE_LIMITED}
    )


def _on(value: object) -> frozenset[str]:
    return codes(PLUGIN, "on", value)


@attrs.frozen
class Fallback:
    """On a result (or model error) with a code in ``on``, the answer of ``to`` instead."""

    name: ClassVar[str] = PLUGIN

    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    #: A tool's name, an async ``(arguments, call) -> value`` function, or (model stage) a Model.
    to: Any = attrs.field()
    on: frozenset[str] = attrs.field(
        default=attrs.Factory(_default_on, takes_self=True), converter=_on
    )

    def __attrs_post_init__(self) -> None:
        if self.stage == "model":
            if not callable(getattr(self.to, "complete", None)):
                raise invalid(PLUGIN, "to", self.to, "a model (an object with complete())")
        elif isinstance(self.to, str):
            if not self.to:
                raise invalid(PLUGIN, "to", self.to, "a tool's name or an async function")
        elif not inspect.iscoroutinefunction(self.to):
            raise invalid(PLUGIN, "to", self.to, "a tool's name or an async function")

    def apply(self, scope: Scope) -> None:
        """Register on the stage it names; a tool named by ``to`` is looked up per call."""
        if self.stage == "model":
            scope.use(scope.loop.model_call, self.model_layer, name=PLUGIN)
            return
        if isinstance(self.to, str):
            other: str = self.to

            def tool(call: ToolCall) -> ToolCall:
                return attrs.evolve(call, name=other, tool=scope.tools.get(other))

            scope.use(scope.tools.dispatch, _Fallback(self, tool), name=PLUGIN)
        else:
            function: Callable[..., Any] = self.to

            def function_call(call: ToolCall) -> ToolCall:
                return call.resolved(ToolDefinition(call.name, function))

            scope.use(scope.tools.dispatch, _Fallback(self, function_call), name=PLUGIN)

    async def model_layer(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        try:
            return await call_next(request)
        except Exception as error:
            if model_error_code(error) not in self.on:
                raise
        reply: ModelReply = await self.to.complete(list(request.messages), list(request.tools))
        return reply

    def __repr__(self) -> str:
        where = ", stage='model'" if self.stage == "model" else ""
        target = self.to if isinstance(self.to, str) else getattr(self.to, "__name__", None)
        return f"Fallback(to={cut(target or self.to)}{where}, on={sorted(self.on)})"


class _Fallback:
    """The dispatch layer: the call, then on a listed failure the fallback's call."""

    __slots__ = ("config", "instead")

    def __init__(self, config: Fallback, instead: Callable[[ToolCall], ToolCall]) -> None:
        self.config = config
        self.instead = instead

    async def __call__(self, call: ToolCall, call_next: DispatchNext) -> ToolResult:
        result = await call_next(call)
        if not result.is_error or result.code not in self.config.on:
            return result
        return await call_next(self.instead(call))

    def __repr__(self) -> str:
        return repr(self.config)
