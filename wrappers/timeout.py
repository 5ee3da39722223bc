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

How it decides: the rest of the chain runs in the layer's own
``anyio.CancelScope(deadline=…)``. Whether *its* timer fired is read from the scope
(``cancel_called``), never from the shape of the result, so whatever the tool did —
raised, returned its own "aborted" value, or finished late because it ignored the
cancel — the result is the timeout error. An outer deadline or the caller's cancel
is not this layer's: it propagates untouched and is never relabelled.

Cancellation is cooperative: the layer never abandons a running call. A tool that
ignores cancellation is waited for, then still reported as ``TOOL_TIMEOUT``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, ClassVar

import anyio
import anyio.lowlevel
import attrs

from pipeline.errors import ConfigError
from pipeline.values import TOOL_TIMEOUT, ToolCall, ToolResult, timeout_result, validate_timeout_ms

if TYPE_CHECKING:
    from pipeline.harness import Scope
    from pipeline.registry import DispatchNext

__all__ = ["Timeout", "within_budget"]


async def within_budget(call: ToolCall, call_next: DispatchNext, ms: int, code: str) -> ToolResult:
    """Run ``call_next(call)`` with a deadline of ``ms``; if that deadline fired, time out.

    The one implementation of timeout attribution, shared by ``Timeout`` and
    ``guards.ToolCallTimeoutPolicy``.
    """
    result = None
    with anyio.CancelScope(deadline=anyio.current_time() + ms / 1000) as scope:
        result = await call_next(call)
    # Nobody else holds this scope, so a cancel on it is our deadline firing.
    if scope.cancel_called or result is None:
        # A tool that ignored our cancel may also have outlived the caller's: then the
        # caller's cancellation wins and propagates; it is never turned into a result.
        await anyio.lowlevel.checkpoint_if_cancelled()
        return timeout_result(ms, code)
    return result


def _check_ms(_: object, __: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None:
        validate_timeout_ms("timeout", "ms", value)


def _check_code(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"timeout: `code` must be a non-empty string, got {value!r}", key="code", value=value
        )


@attrs.frozen
class Timeout:
    """A deadline of ``ms`` (or the tool's declared budget) whose result carries ``code``."""

    name: ClassVar[str] = "timeout"

    ms: int | None = attrs.field(default=None, validator=_check_ms)
    code: str = attrs.field(default=TOOL_TIMEOUT, validator=_check_code)

    def __call__(self, call: ToolCall, call_next: DispatchNext) -> Awaitable[ToolResult]:
        # A plain method handing back the awaitable: no coroutine frame of its own, so a
        # call without a budget passes through at the cost of a few attribute reads.
        ms = self.ms
        if ms is None:
            tool = call.tool
            ms = tool.timeout_ms if tool is not None else None
            if ms is None:
                return call_next(call)
        return within_budget(call, call_next, ms, self.code)

    def apply(self, scope: Scope) -> None:
        scope.use(scope.tools.dispatch, self)
