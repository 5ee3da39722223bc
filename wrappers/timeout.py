"""Timeout: end a call at a budget and tell the model so, in a small structured error.

Where it belongs: a dispatch layer. **Its position is its meaning.** Registered
outside a ``Retry`` it bounds the whole retried operation (one budget, however many
attempts); inside it, it bounds each attempt. Two timeouts with different ``code``
values can be stacked, and the result names the code of the layer that fired::

    harness.plugin(Timeout(ms=10_000, code="TOTAL_TIMEOUT"))  # outer: whole operation
    harness.plugin(Retry(attempts=3))
    harness.plugin(Timeout(ms=2_000))                          # inner: per attempt

With ``ms=None`` the budget is the tool's own declared ``timeout_ms`` (what
``guards.ToolCallTimeoutPolicy`` does); a tool without one passes through untouched,
at the cost of one attribute read.

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

from collections.abc import Awaitable
from typing import ClassVar

import attrs

from guardstack.pipeline.contract import DispatchNext, Scope, timed_dispatch
from guardstack.pipeline.validate import non_empty_text
from guardstack.pipeline.values import TOOL_TIMEOUT, ToolCall, ToolResult, validate_timeout_ms

__all__ = ["Timeout"]

PLUGIN = "timeout"


def _check_ms(_: object, __: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None:
        validate_timeout_ms(PLUGIN, "ms", value)


def _check_code(_: object, __: attrs.Attribute[str], value: object) -> None:
    non_empty_text(PLUGIN, "code", value)


@attrs.frozen
class Timeout:
    """A deadline of ``ms`` (or the tool's declared budget) whose result carries ``code``."""

    name: ClassVar[str] = PLUGIN

    ms: int | None = attrs.field(default=None, validator=_check_ms)
    code: str = attrs.field(default=TOOL_TIMEOUT, validator=_check_code)

    def __call__(self, call: ToolCall, call_next: DispatchNext) -> Awaitable[ToolResult]:
        return timed_dispatch(call, call_next, self.ms, self.code)

    def apply(self, scope: Scope) -> None:
        """Register as a dispatch layer."""
        scope.use(scope.tools.dispatch, self)
