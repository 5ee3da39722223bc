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
  the request goes to it with the same messages and tools;
* on the model stage behind ``guardstack model-proxy``, ``{"upstream": NAME}``
  (optionally with ``"model": NAME`` to ask that upstream for another model): the
  request goes to the proxy's upstream of that name (``--upstream NAME=URL``).

guardstack's own control flow is never answered for: a cap's ``TurnBlocked`` or a
denial passes through. A refusal a guardstack layer made (an open breaker, a full
limit) is a failure with a code like any other: listed in ``on``, it falls back.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Final

import attrs

from guardstack.pipeline.contract import (
    MODEL_FAILED,
    FailureKind,
    ModelError,
    ModelReply,
    ModelRequest,
    Scope,
    StageAdapter,
    adapter_for,
)
from guardstack.pipeline.validate import StageName, codes, cut, invalid, stage
from guardstack.pipeline.values import (
    ToolCall,
    ToolDefinition,
)
from guardstack.wrappers._keyed import check_codes, codes_of, register, stage_repr

__all__ = ["Fallback"]

PLUGIN = "fallback"

#: The answer instead: ``(item, call_next) -> awaitable`` of the stage's value.
_Instead = Callable[[Any, Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


def _stage(value: object) -> StageName:
    return stage(PLUGIN, value)


_DEFAULT_ON: Final[dict[str, tuple[FailureKind, ...]]] = {
    "dispatch": ("TIMEOUT", "FAILED", "UNAVAILABLE", "OVERLOADED", "RATE_LIMITED"),
    "model": ("UNAVAILABLE", "RATE_LIMITED", "TIMEOUT"),
}


def _default_on(self: Fallback) -> frozenset[str]:
    return codes_of(self.stage, _DEFAULT_ON)


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
        check_codes(PLUGIN, "on", self.stage, self.on)
        # Without tools on the stage (model calls), the answer instead can only be a model.
        if not adapter_for(self.stage).has_names:
            if isinstance(self.to, Mapping):
                _check_upstream(self.to)
            elif not callable(getattr(self.to, "complete", None)):
                raise invalid(
                    PLUGIN, "to", self.to, "a model (an object with complete()) or {upstream: NAME}"
                )
        elif isinstance(self.to, str):
            if not self.to:
                raise invalid(PLUGIN, "to", self.to, "a tool's name or an async function")
        elif not inspect.iscoroutinefunction(self.to):
            raise invalid(PLUGIN, "to", self.to, "a tool's name or an async function")

    def apply(self, scope: Scope) -> None:
        """Register on the stage it names; a tool named by ``to`` is looked up per call."""
        register(scope, self.stage, _Fallback(self, self._instead(scope)), PLUGIN)

    def _instead(self, scope: Scope) -> _Instead:
        """What answers instead, for what ``to`` is (checked at construction)."""
        target = self.to
        if isinstance(target, Mapping):
            name, model = target["upstream"], target.get("model")

            def other_upstream(request: ModelRequest, _: Any) -> Awaitable[ModelReply]:
                # The proxy's upstream model (``ModelRequest.model``) names its siblings.
                via = getattr(request.model, "upstream", None)
                if not callable(via):
                    raise ModelError(
                        f"{PLUGIN}: to={{upstream: {name!r}}} answers only behind "
                        "guardstack model-proxy",
                        MODEL_FAILED,
                    )
                other = via(name, model=model)
                return other.complete(list(request.messages), list(request.tools))  # type: ignore[no-any-return]

            return other_upstream
        if not adapter_for(self.stage).has_names:

            def other_model(request: ModelRequest, _: Any) -> Awaitable[ModelReply]:
                return target.complete(list(request.messages), list(request.tools))  # type: ignore[no-any-return]

            return other_model
        if isinstance(target, str):

            def other_tool(call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
                return call_next(attrs.evolve(call, name=target, tool=scope.tools.get(target)))

            return other_tool

        def function(call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
            return call_next(call.resolved(ToolDefinition(call.name, target)))

        return function

    def __repr__(self) -> str:
        where = stage_repr(self.stage)
        target = self.to if isinstance(self.to, str) else getattr(self.to, "__name__", None)
        if isinstance(self.to, Mapping):
            target = dict(self.to)
        return f"Fallback(to={cut(target or self.to)}{where}, on={sorted(self.on)})"


def _check_upstream(target: Mapping[Any, Any]) -> None:
    """``{"upstream": NAME}`` (and optionally ``"model": NAME``), each a non-empty text."""
    unknown = sorted(str(key) for key in target if key not in ("upstream", "model"))
    if unknown:
        raise invalid(PLUGIN, "to", dict(target), "{upstream: NAME} (and optionally model: NAME)")
    for key in ("upstream", "model"):
        value = target.get(key)
        if (key == "upstream" or value is not None) and not (isinstance(value, str) and value):
            raise invalid(PLUGIN, f"to.{key}", value, "an upstream's name (text)")


class _Fallback:
    """The layer, on either stage: the call, then on a listed failure the fallback's answer."""

    __slots__ = ("config", "instead", "stage")

    def __init__(self, config: Fallback, instead: _Instead) -> None:
        self.config = config
        self.instead = instead
        self.stage: StageAdapter[Any, Any] = adapter_for(config.stage)

    async def __call__(self, item: Any, call_next: Any) -> Any:
        stage = self.stage
        outcome = await stage.attempt(call_next, item)
        if (
            not stage.failed(outcome)
            or stage.code(outcome) not in self.config.on
            or (stage.is_control(outcome) and not stage.is_refusal(outcome))
        ):
            return stage.deliver(outcome)
        return await self.instead(item, call_next)

    def __repr__(self) -> str:
        return repr(self.config)
