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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import attrs

from guardstack.pipeline.contract import Scope, StageAdapter, adapter_for, timed
from guardstack.pipeline.validate import StageName, invalid, non_empty_text, stage
from guardstack.pipeline.values import validate_timeout_ms
from guardstack.wrappers._keyed import register

__all__ = ["Timeout"]

PLUGIN = "timeout"


def _check_ms(_: object, __: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None:
        validate_timeout_ms(PLUGIN, "ms", value)


def _check_code(_: object, __: attrs.Attribute[str], value: object) -> None:
    non_empty_text(PLUGIN, "code", value)


def _stage(value: object) -> StageName:
    return stage(PLUGIN, value)


def _default_code(self: Timeout) -> str:
    return adapter_for(self.stage).code_for("TIMEOUT")


@attrs.frozen
class Timeout:
    """A deadline of ``ms`` (or the tool's declared budget) whose result carries ``code``."""

    name: ClassVar[str] = PLUGIN

    # Declared first (keyword-only) so the code's default can depend on it.
    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    ms: int | None = attrs.field(default=None, validator=_check_ms)
    code: str = attrs.field(
        default=attrs.Factory(_default_code, takes_self=True), validator=_check_code
    )

    _stage: StageAdapter[Any, Any] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        adapter = adapter_for(self.stage)
        if adapter.needs_budget and self.ms is None:
            raise invalid(PLUGIN, "ms", None, "set on the model stage (a model declares no budget)")
        object.__setattr__(self, "_stage", adapter)

    def __call__(self, item: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Awaitable[Any]:
        return timed(self._stage, item, call_next, self.ms, self.code, PLUGIN)

    def apply(self, scope: Scope) -> None:
        """Register on the stage it names."""
        register(scope, self.stage, self, PLUGIN)
