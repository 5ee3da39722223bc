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

**Health-aware** (``to=[…]``, a list of such targets): they are tried in order, each
after the one before failed with a code in ``on``, and a target whose circuit breaker
in this stack is open now (or that an operator holds open) is skipped without being
tried. When every target is open, the fallback waits for the earliest to half-open
if that is within ``wait_ms``, else answers at once ``*_UNAVAILABLE`` with the
earliest time to try again (``retry_after_s``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar, Final, Generic, TypeAlias

import anyio
import attrs

from guardstack.pipeline.contract import (
    MODEL_FAILED,
    Control,
    FailureKind,
    ItemT,
    Model,
    ModelError,
    ModelReply,
    ModelRequest,
    Next,
    OutcomeT,
    Scope,
    StageAdapter,
    ValueT,
    adapter_for,
    stage_of,
)
from guardstack.pipeline.model_members import model_name_of
from guardstack.pipeline.outcome import Failed, refusal
from guardstack.pipeline.validate import StageName, codes, cut, invalid, optional_integer
from guardstack.pipeline.values import (
    ToolCall,
    ToolDefinition,
)
from guardstack.wrappers._keyed import (
    codes_of,
    extra_codes,
    register,
    stage_repr,
    with_extra_codes,
)

__all__ = ["Fallback"]

PLUGIN = "fallback"

#: The answer instead: ``(item, call_next) -> awaitable`` of the stage's value.
#: What answers instead of a failed call: given the call and the rest of the chain.
_Instead: TypeAlias = Callable[[ItemT, Next[ItemT, ValueT]], Awaitable[ValueT]]


def _stage(value: object) -> StageName:
    return stage_of(PLUGIN, value)  # its name, or the stage itself (``MODEL``)


_DEFAULT_ON: Final[dict[str, tuple[FailureKind, ...]]] = {
    "dispatch": ("TIMEOUT", "FAILED", "UNAVAILABLE", "OVERLOADED", "RATE_LIMITED"),
    "model": ("UNAVAILABLE", "RATE_LIMITED", "TIMEOUT"),
}


def _default_on(self: Fallback) -> frozenset[str]:
    return codes_of(self.stage, _DEFAULT_ON)


def _on(value: object) -> frozenset[str]:
    return codes(PLUGIN, "on", value)


def _extra_on(value: object) -> frozenset[str]:
    return extra_codes(PLUGIN, value)


#: What a ``Fallback`` answers with: another tool's name, an async ``(arguments, call) ->
#: value`` function, a ``Model`` (on the model stage), or ``{"upstream": NAME}`` (the
#: model proxy's named upstream).
FallbackTarget: TypeAlias = str | Callable[..., Awaitable[object]] | Model | Mapping[str, str]


@attrs.frozen
class Fallback:
    """On a result (or model error) with a code in ``on``, the answer of ``to`` instead."""

    name: ClassVar[str] = PLUGIN

    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    #: A tool's name, an async ``(arguments, call) -> value`` function, or (model stage) a Model.
    to: FallbackTarget | Sequence[FallbackTarget] = attrs.field()
    #: The codes that count (``on=`` replaces the defaults; ``extra_on=`` adds to them).
    on: frozenset[str] = attrs.field(
        default=attrs.Factory(_default_on, takes_self=True), converter=_on
    )
    extra_on: frozenset[str] = attrs.field(
        default=frozenset(), converter=_extra_on, kw_only=True, repr=False
    )
    #: With ``to=[…]``: how long to wait for the earliest open target to half-open
    #: (``None``: not at all — answer at once with when to try again).
    wait_ms: int | None = attrs.field(
        default=None, kw_only=True, validator=optional_integer(PLUGIN, "wait_ms")
    )

    def __attrs_post_init__(self) -> None:
        with_extra_codes(self, PLUGIN)
        targets = self.targets
        if isinstance(self.to, list | tuple) and not targets:
            raise invalid(PLUGIN, "to", self.to, "at least one target")
        for target in targets:
            self._check(target)

    @property
    def targets(self) -> tuple[Any, ...]:
        """What answers instead, in order (one, unless ``to`` is a list)."""
        return tuple(self.to) if isinstance(self.to, list | tuple) else (self.to,)

    def _check(self, target: Any) -> None:
        # Without tools on the stage (model calls), the answer instead can only be a model.
        if not adapter_for(self.stage).calls_tools:
            if isinstance(target, Mapping):
                _check_upstream(target)
            elif not callable(getattr(target, "complete", None)):
                raise invalid(
                    PLUGIN, "to", target, "a model (an object with complete()) or {upstream: NAME}"
                )
        elif isinstance(target, str):
            if not target:
                raise invalid(PLUGIN, "to", target, "a tool's name or an async function")
        elif not inspect.iscoroutinefunction(target):
            raise invalid(PLUGIN, "to", target, "a tool's name or an async function")

    def apply(self, scope: Scope) -> None:
        """Register on the stage it names; a tool named by ``to`` is looked up per call."""
        if isinstance(self.to, list | tuple):
            targets = [(_name_of(t), self._instead(scope, t)) for t in self.targets]
            layer: Any = _Healthy(self, targets, scope.control)
        else:
            layer = _Fallback(self, self._instead(scope, self.to))
        register(scope, self.stage, layer, PLUGIN)

    def _instead(self, scope: Scope, target: Any) -> _Instead[Any, Any]:
        """What answers instead, for what ``target`` is (checked at construction)."""
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
        if not adapter_for(self.stage).calls_tools:

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
        if isinstance(self.to, list | tuple):
            target = [t if isinstance(t, str) else _name_of(t) for t in self.to]
        waits = f", wait_ms={self.wait_ms}" if self.wait_ms is not None else ""
        return f"Fallback(to={cut(target or self.to)}{where}, on={sorted(self.on)}{waits})"


def _check_upstream(target: Mapping[Any, Any]) -> None:
    """``{"upstream": NAME}`` (and optionally ``"model": NAME``), each a non-empty text."""
    unknown = sorted(str(key) for key in target if key not in ("upstream", "model"))
    if unknown:
        raise invalid(PLUGIN, "to", dict(target), "{upstream: NAME} (and optionally model: NAME)")
    for key in ("upstream", "model"):
        value = target.get(key)
        if (key == "upstream" or value is not None) and not (isinstance(value, str) and value):
            raise invalid(PLUGIN, f"to.{key}", value, "an upstream's name (text)")


class _Fallback(Generic[ItemT, ValueT, OutcomeT]):
    """The layer, on either stage: the call, then on a listed failure the fallback's answer."""

    __slots__ = ("config", "instead", "stage")

    def __init__(self, config: Fallback, instead: _Instead[ItemT, ValueT]) -> None:
        self.config = config
        self.instead = instead
        self.stage: StageAdapter[ItemT, ValueT, OutcomeT] = adapter_for(config.stage)

    async def __call__(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        stage = self.stage
        outcome = await stage.attempt(call_next, item)
        if not _falls_back(stage.failure_of(outcome), self.config.on):
            return stage.deliver(outcome)
        return await self.instead(item, call_next)

    def __repr__(self) -> str:
        return repr(self.config)


def _falls_back(failed: Failed | None, on: Collection[str]) -> bool:
    """A failure with a code to fall back on: a provider's, or a layer's refusal (an open
    breaker), never guardstack's other control flow (a cap, a denial)."""
    return failed is not None and failed.code in on and (failed.refused or not failed.control)


def _name_of(target: Any) -> str:
    """The name a target's breaker knows it by: a tool's, a model's, an upstream's."""
    if isinstance(target, str):
        return target
    if isinstance(target, Mapping):
        return str(target.get("model") or target["upstream"])
    name = model_name_of(target) or getattr(target, "__name__", None)
    return name if isinstance(name, str) else repr(target)


def _answered_by(
    instead: _Instead[ItemT, ValueT], call_next: Next[ItemT, ValueT]
) -> Next[ItemT, ValueT]:
    def answer(item: ItemT) -> Awaitable[ValueT]:
        return instead(item, call_next)

    return answer


class _Healthy(Generic[ItemT, ValueT, OutcomeT]):
    """``to=[…]``: the targets in order after a failure, skipping those whose breaker is
    open; all open: the earliest, waited for within ``wait_ms``, else an answer now."""

    __slots__ = ("config", "control", "stage", "targets")

    def __init__(
        self,
        config: Fallback,
        targets: list[tuple[str, _Instead[ItemT, ValueT]]],
        control: Control | None,
    ) -> None:
        self.config = config
        self.targets = targets
        self.control = control
        self.stage: StageAdapter[ItemT, ValueT, OutcomeT] = adapter_for(config.stage)

    def _failed(self, outcome: Any) -> bool:
        return _falls_back(self.stage.failure_of(outcome), self.config.on)

    async def __call__(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        stage = self.stage
        outcome = await stage.attempt(call_next, item)
        if not self._failed(outcome):
            return stage.deliver(outcome)
        waits: list[tuple[float, str, _Instead[ItemT, ValueT]]] = []
        for name, instead in self.targets:
            wait = self.control.open_for(name) if self.control is not None else None
            if wait is not None:
                waits.append((wait, name, instead))
                continue  # its breaker is open: not tried
            outcome = await stage.attempt(_answered_by(instead, call_next), item)
            if not self._failed(outcome):
                return stage.deliver(outcome)
        if len(waits) < len(self.targets):
            return stage.deliver(outcome)  # the last target tried failed too
        wait, name, instead = min(waits, key=lambda known: known[0])
        limit = self.config.wait_ms
        if limit is not None and wait <= limit / 1000:
            await anyio.sleep(wait)  # the earliest half-opens: its probe is this call
            return await instead(item, call_next)
        return stage.deliver(
            refusal(
                stage,
                item,
                "UNAVAILABLE",
                f"{item.label} and every fallback ({', '.join(n for _, n, _ in waits)}) "
                f"are unavailable: their circuit breakers are open. Try again in "
                f"{math.ceil(wait) if math.isfinite(wait) else 'a while'}s, or do without it.",
                layer=PLUGIN,
                name="FallbackUnavailableError",
                retry_after_s=wait if math.isfinite(wait) and wait > 0 else None,
            )
        )

    def __repr__(self) -> str:
        return repr(self.config)
