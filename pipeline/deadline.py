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
from typing import TypeVar

import anyio
import anyio.lowlevel
from opentelemetry import trace  # the API only: a no-op without an SDK

from guardstack.pipeline.model import ModelError, ModelReply, ModelRequest
from guardstack.pipeline.values import ToolCall, ToolResult, timeout_result

__all__ = [
    "OVERRUN_ATTRIBUTE",
    "budget_of",
    "model_within_budget",
    "timed_dispatch",
    "within_budget",
]

logger = logging.getLogger("guardstack")

#: Span attribute (on the current span, if any) naming how long an uncancellable tool ran.
OVERRUN_ATTRIBUTE = "guardstack.timeout.overrun_ms"
_Next = Callable[[ToolCall], Awaitable[ToolResult]]
T = TypeVar("T")


def budget_of(call: ToolCall) -> int | None:
    """The declared ``timeout_ms`` of the call's resolved tool, if any."""
    tool = call.tool
    return tool.timeout_ms if tool is not None else None


def timed_dispatch(
    call: ToolCall, call_next: _Next, ms: int | None, code: str
) -> Awaitable[ToolResult]:
    """``call_next(call)`` under ``ms`` (``None``: the tool's own budget, else untouched).

    A plain function handing back the awaitable, so a call without a budget makes
    no coroutine of its own. That is not cheaper than an ``async def`` pass-through:
    measured per layer, the extra calls (the layer object's ``__call__``, this
    function, ``budget_of``) cost about what the saved coroutine would, 100-300 ns
    on a noisy 2-core machine. It is kept for what it means — no frame, nothing to
    cancel — not for speed.
    """
    if ms is None:
        ms = budget_of(call)
        if ms is None:
            return call_next(call)
    return within_budget(call, call_next, ms, code)


class _Fired:
    """This deadline fired; the call really ran ``ran_s`` seconds."""

    __slots__ = ("ran_s",)

    def __init__(self, ran_s: float) -> None:
        self.ran_s = ran_s


async def _under_deadline(awaitable: Awaitable[T], ms: int) -> T | _Fired:
    """``await awaitable`` with a deadline of ``ms``: its result, or ``_Fired`` if *this*
    deadline fired (whatever the call did then: raised, returned, finished late)."""
    started = anyio.current_time()
    with anyio.CancelScope(deadline=started + ms / 1000) as scope:
        result = await awaitable
    # Nobody else holds this scope, so a cancel on it is our deadline firing.
    if not scope.cancel_called:
        return result
    # A call that ignored our cancel may also have outlived the caller's: then the
    # caller's cancellation wins and propagates; it is never turned into a result.
    await anyio.lowlevel.checkpoint_if_cancelled()
    return _Fired(anyio.current_time() - started)


async def within_budget(call: ToolCall, call_next: _Next, ms: int, code: str) -> ToolResult:
    """Run ``call_next(call)`` with a deadline of ``ms``; if that deadline fired, time out."""
    outcome = await _under_deadline(call_next(call), ms)
    if not isinstance(outcome, _Fired):
        return outcome
    _report_overrun(call, ms, outcome.ran_s)
    return timeout_result(ms, code)


async def model_within_budget(
    request: ModelRequest,
    call_next: Callable[[ModelRequest], Awaitable[ModelReply]],
    ms: int,
    code: str,
) -> ModelReply:
    """The model stage's timeout: ``call_next(request)`` under ``ms``, else ``ModelError(code)``.

    The same rule as for tools: whose deadline fired is read from this scope; an
    outer deadline or the caller's cancel propagates; a reply that arrives after our
    deadline (a model that ignored the cancel) is still a timeout.
    """
    outcome = await _under_deadline(call_next(request), ms)
    if not isinstance(outcome, _Fired):
        return outcome
    _report_overrun("model call", ms, outcome.ran_s)
    raise ModelError(f"model call timed out after {ms}ms", code)


def _report_overrun(call: ToolCall | str, ms: int, elapsed_s: float) -> None:
    """Tell the operator (never the model) when a call could not be stopped at its budget."""
    ran_ms = round(elapsed_s * 1000)
    if ran_ms <= ms + max(10, ms // 10):
        return  # stopped at the deadline, give or take scheduling
    what = call if isinstance(call, str) else f"tool {call.name!r}"
    logger.warning(
        "%s ignored cancellation: budget %dms, ran %dms before it returned",
        what,
        ms,
        ran_ms,
    )
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(OVERRUN_ATTRIBUTE, ran_ms)
