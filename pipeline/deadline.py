"""The one timeout mechanism: run the rest of the chain under a deadline, and say whose fired.

``wrappers.Timeout`` (a fixed budget or the tool's own) and
``guards.ToolCallTimeoutPolicy`` (always the tool's own) are two configurations of
``timed_dispatch``; nothing else decides what a timeout means.

The rest of the chain runs in a fresh ``anyio.CancelScope(deadline=…)``. Whether
*its* deadline fired is read from that scope (``cancel_called``) — never from the
shape of the result — so whatever the tool did (raised, returned its own "aborted"
value, returned ``None``, or finished late because it ignored the cancel) the
verdict is the same. An outer deadline or the caller's cancel is not this scope's:
it propagates untouched and is never relabelled.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
from opentelemetry import trace  # the API only: a no-op without an SDK

from guardstack.pipeline.model import ModelReply, ModelRequest
from guardstack.pipeline.outcome import DISPATCH, MODEL, StageAdapter
from guardstack.pipeline.runtime import now, scope_after
from guardstack.pipeline.values import TOOL_TIMEOUT, ToolCall, ToolResult

__all__ = [
    "OVERRUN_ATTRIBUTE",
    "budget_of",
    "model_within_budget",
    "timed",
    "timed_dispatch",
    "within",
    "within_budget",
]

logger = logging.getLogger("guardstack")

#: Span attribute (on the current span, if any) naming how long an uncancellable tool ran.
OVERRUN_ATTRIBUTE = "guardstack.timeout.overrun_ms"
_Next = Callable[[ToolCall], Awaitable[ToolResult]]


def budget_of(call: ToolCall) -> int | None:
    """The declared ``timeout_ms`` of the call's resolved tool, if any."""
    tool = call.tool
    return tool.timeout_ms if tool is not None else None


def timed(
    stage: StageAdapter[Any, Any],
    item: Any,
    call_next: Callable[[Any], Awaitable[Any]],
    ms: int | None,
    code: str,
    layer: str = "timeout",
) -> Awaitable[Any]:
    """``call_next(item)`` under ``ms`` (``None``: the called thing's own budget, if any).

    A plain function handing back the awaitable, so a call without a budget makes
    no coroutine of its own: nothing to cancel, nothing to pay.
    """
    if ms is None:
        ms = stage.budget_ms(item)
        if ms is None:
            return call_next(item)
    return within(stage, item, call_next, ms, code, layer)


def timed_dispatch(
    call: ToolCall, call_next: _Next, ms: int | None, code: str
) -> Awaitable[ToolResult]:
    """``timed`` on the dispatch stage (``ms=None``: the tool's declared budget), without
    the stage adapter's indirection: this runs on every tool call."""
    if ms is None:
        ms = budget_of(call)
        if ms is None:
            return call_next(call)
    return within(DISPATCH, call, call_next, ms, code, "timeout")


async def within(
    stage: StageAdapter[Any, Any],
    item: Any,
    call_next: Callable[[Any], Awaitable[Any]],
    ms: int,
    code: str,
    layer: str = "timeout",
) -> Any:
    """Run ``call_next(item)`` with a deadline of ``ms``; if that deadline fired, time out.

    The timeout is the stage's: a ``ToolResult`` with ``code`` on tools, a raised
    ``ModelError(code)`` on models (the failure a ``Retry`` outside may retry). One
    coroutine: the call runs directly in this frame's scope.
    """
    scope, started = scope_after(ms / 1000)
    with scope:
        outcome = await stage.attempt(call_next, item)
    # Nobody else holds this scope, so a cancel on it is our deadline firing.
    if not scope.cancel_called:
        return stage.deliver(outcome)
    # A call that ignored our cancel may also have outlived the caller's: then the
    # caller's cancellation wins and propagates; it is never turned into a result.
    await anyio.lowlevel.checkpoint_if_cancelled()
    _report_overrun(stage.label(item), ms, now() - started)
    return stage.deliver(stage.timed_out(item, ms, code, layer))


async def within_budget(
    call: ToolCall, call_next: _Next, ms: int, code: str = TOOL_TIMEOUT
) -> ToolResult:
    """``within`` on the dispatch stage."""
    result: ToolResult = await within(DISPATCH, call, call_next, ms, code)
    return result


async def model_within_budget(
    request: ModelRequest,
    call_next: Callable[[ModelRequest], Awaitable[ModelReply]],
    ms: int,
    code: str,
) -> ModelReply:
    """``within`` on the model stage: ``ModelError(code)`` when ``ms`` runs out."""
    reply: ModelReply = await within(MODEL, request, call_next, ms, code)
    return reply


def _report_overrun(what: str, ms: int, elapsed_s: float) -> None:
    """Tell the operator (never the model) when a call could not be stopped at its budget."""
    ran_ms = round(elapsed_s * 1000)
    if ran_ms <= ms + max(10, ms // 10):
        return  # stopped at the deadline, give or take scheduling
    logger.warning(
        "%s ignored cancellation: budget %dms, ran %dms before it returned",
        what,
        ms,
        ran_ms,
    )
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(OVERRUN_ATTRIBUTE, ran_ms)
