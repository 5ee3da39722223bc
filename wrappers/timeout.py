"""Timeout: end a call at a budget and tell the model so, in a small structured error.

Where it belongs: a dispatch layer (``stage="dispatch"``, the default) or a model
call layer (``stage="model"``). **Its position is its meaning.** Registered
outside a ``Retry`` it bounds the whole retried operation (one budget, however many
attempts); inside it, it bounds each attempt. Two timeouts with different ``code``
values can be stacked, and the result names the code of the layer that fired::

    harness.plugin(Timeout(ms=10_000, code="TOTAL_TIMEOUT"))  # outer: whole operation
    harness.plugin(Retry(attempts=3))
    harness.plugin(Timeout(ms=2_000))                          # inner: per attempt

With ``ms=None`` the budget is the tool's own declared ``timeout_ms`` (what
``guards.ToolCallTimeoutPolicy`` does); a tool without one passes through untouched,
at about the cost of an ``async def`` pass-through layer.

On the model stage ``ms`` is required, the code defaults to ``MODEL_TIMEOUT``, and a
call that runs out raises ``ModelError(code)`` — the failure a model-stage
``Retry`` outside it sees and may retry, or that ends the turn with ``error``.

How it decides (``pipeline.deadline``, shared with the policy): the rest of the
chain runs in the layer's own ``anyio.CancelScope(deadline=…)``. Whether *its*
timer fired is read from the scope (``cancel_called``), never from the shape of the
result, so whatever the tool did —
raised, returned its own "aborted" value, or finished late because it ignored the
cancel — the result is the timeout error. An outer deadline or the caller's cancel
is not this layer's: it propagates untouched and is never relabelled.

Cancellation is cooperative: the layer never abandons a running call. A tool that
ignores cancellation is waited for, then still reported as ``TOOL_TIMEOUT``.

Streams and long tools (``first_byte_ms``, ``idle_ms``). A budget for the whole call
cannot tell a stream that never starts, one that stalls half-way and one that is
simply long apart. On a streamed model call (a model that ``reports_chunks``: the
OpenAI-compatible, Anthropic and LiteLLM adapters with ``stream=True``, and the model
proxy) ``first_byte_ms`` bounds the wait for the first piece and ``idle_ms`` the gap
between two pieces; ``ms`` (optional then) still bounds the whole. Before the first
byte the call fails ``MODEL_TIMEOUT`` (a ``Retry`` outside may send it again); after
it the stream is cut and its failure carries the text that had arrived
(``ModelError.partial``, logged when it ends the turn). A tool that reports progress
(``call.progress()``; MCP tools' progress notifications) is bounded by ``idle_ms``
between reports: with ``ms=None`` its declared budget holds only until its first
report, so a tool that keeps working is not cut at a fixed budget; a tool that never
reports is bounded as before. Order keeps its meaning: outside a ``Retry`` these
bound the whole operation, inside it each attempt::

    harness.plugin(Retry(stage="model"))
    harness.plugin(Timeout(stage="model", first_byte_ms=5_000, idle_ms=2_000))
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic

import attrs

from guardstack.pipeline.contract import (
    Scope,
    StageAdapter,
    StageAnswerT,
    StageCallT,
    adapter_for,
    stage_of,
    timed,
    watched,
)
from guardstack.pipeline.validate import invalid, non_empty_text
from guardstack.pipeline.values import validate_timeout_ms
from guardstack.wrappers._keyed import register

__all__ = ["Timeout"]

PLUGIN = "timeout"


def _check_ms(_: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None:
        validate_timeout_ms(PLUGIN, attribute.name, value)


def _check_code(_: object, __: attrs.Attribute[str], value: object) -> None:
    non_empty_text(PLUGIN, "code", value)


def _check_stage(_: object, __: object, value: object) -> None:
    stage_of(PLUGIN, value)


def _default_code(self: Timeout[Any, Any]) -> str:
    return adapter_for(self.stage).code_for("TIMEOUT")


@attrs.frozen
class Timeout(Generic[StageCallT, StageAnswerT]):
    """A deadline of ``ms`` (or the tool's declared budget) whose result carries ``code``.

    Built with ``stage=MODEL`` (``guardstack.pipeline.contract``) it is typed for the
    model stage, as ``Retry`` is."""

    name: ClassVar[str] = PLUGIN

    # Declared first (keyword-only) so the code's default can depend on it.
    #: ``"dispatch"`` or ``"model"`` (kept as that name), or the stage itself (``MODEL``).
    stage: StageAdapter[StageCallT, StageAnswerT, Any] | str = attrs.field(
        default="dispatch", validator=_check_stage, kw_only=True
    )
    ms: int | None = attrs.field(default=None, validator=_check_ms)
    code: str = attrs.field(
        default=attrs.Factory(_default_code, takes_self=True), validator=_check_code
    )
    #: The longest wait for a stream's first piece (a tool's first progress report).
    first_byte_ms: int | None = attrs.field(default=None, validator=_check_ms, kw_only=True)
    #: The longest gap between two pieces of a stream (two progress reports of a tool).
    idle_ms: int | None = attrs.field(default=None, validator=_check_ms, kw_only=True)

    _stage: StageAdapter[Any, Any, Any] = attrs.field(init=False, repr=False, eq=False)
    _watches: bool = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        adapter = adapter_for(self.stage)
        object.__setattr__(self, "stage", adapter.name)
        watches = self.first_byte_ms is not None or self.idle_ms is not None
        if not adapter.calls_tools and self.ms is None and not watches:
            raise invalid(
                PLUGIN,
                "ms",
                None,
                "set on the model stage (a model declares no budget), or first_byte_ms or "
                "idle_ms for streams",
            )
        object.__setattr__(self, "_stage", adapter)
        object.__setattr__(self, "_watches", watches)

    def __call__(
        self, item: StageCallT, call_next: Callable[[StageCallT], Awaitable[StageAnswerT]]
    ) -> Awaitable[StageAnswerT]:
        if self._watches:
            return watched(
                self._stage,
                item,
                call_next,
                self.ms,
                self.first_byte_ms,
                self.idle_ms,
                self.code,
                PLUGIN,
            )
        return timed(self._stage, item, call_next, self.ms, self.code, PLUGIN)

    def apply(self, scope: Scope) -> None:
        """Register on the stage it names."""
        register(scope, self.stage, self, PLUGIN)
