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
import math
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import anyio
import anyio.lowlevel
from opentelemetry import trace  # the API only: a no-op without an SDK

from guardstack.pipeline.call_context import CallContext
from guardstack.pipeline.model import ModelReply, ModelRequest
from guardstack.pipeline.outcome import DISPATCH, MODEL, StageAdapter, timed_out
from guardstack.pipeline.runtime import now, scope_after
from guardstack.pipeline.values import TOOL_TIMEOUT, ToolCall, ToolResult

__all__ = [
    "OVERRUN_ATTRIBUTE",
    "Watch",
    "budget_of",
    "model_within_budget",
    "timed",
    "timed_dispatch",
    "watched",
    "within",
    "within_budget",
]

logger = logging.getLogger("guardstack")

#: Span attribute (on the current span, if any) naming how long an uncancellable tool ran.
OVERRUN_ATTRIBUTE = "guardstack.timeout.overrun_ms"
_Next = Callable[[ToolCall], Awaitable[ToolResult]]
ItemT = TypeVar("ItemT", bound=CallContext)
ValueT = TypeVar("ValueT")


def budget_of(call: ToolCall) -> int | None:
    """The declared ``timeout_ms`` of the call's resolved tool, if any."""
    tool = call.tool
    return tool.timeout_ms if tool is not None else None


def timed(
    stage: StageAdapter[ItemT, ValueT, Any],
    item: ItemT,
    call_next: Callable[[ItemT], Awaitable[ValueT]],
    ms: int | None,
    code: str,
    layer: str = "timeout",
) -> Awaitable[ValueT]:
    """``call_next(item)`` under ``ms`` (``None``: the called thing's own budget, if any).

    A plain function handing back the awaitable, so a call without a budget makes
    no coroutine of its own: nothing to cancel, nothing to pay.
    """
    if ms is None:
        ms = item.budget_ms
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
    stage: StageAdapter[ItemT, ValueT, Any],
    item: ItemT,
    call_next: Callable[[ItemT], Awaitable[ValueT]],
    ms: int,
    code: str,
    layer: str = "timeout",
) -> ValueT:
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
    _report_overrun(item.label, ms, now() - started)
    return stage.deliver(timed_out(stage, item, ms, code, layer))


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


#: How much of a cut stream's text a timeout keeps for the log (characters).
_KEEP_CHARS: Final = 65_536


class Watch:
    """One call's progress as a ``Timeout`` with ``first_byte_ms`` or ``idle_ms`` sees it.

    Each piece of a streamed reply (each progress report of a tool) moves the deadline
    of the layer's scope: before the first, it is ``first_byte`` after the start; from
    each piece on, ``idle`` after that piece; never past the whole call's ``until``.
    ``until_first`` is the whole bound before the first piece when it differs (a
    tool's declared budget holds until the tool first says it is working). A watch
    chains to the listener the call already had (an outer timeout's), so every
    layer sees every piece."""

    __slots__ = ("idle_s", "kept", "outer", "phase", "pieces", "scope", "text", "until")

    def __init__(
        self,
        scope: anyio.CancelScope,
        until: float,
        idle_s: float | None,
        outer: Callable[[str], None] | None,
    ) -> None:
        self.scope = scope
        self.until = until
        self.idle_s = idle_s
        self.outer = outer
        #: Which bound the scope's deadline is now: ``first_byte``, ``idle`` or ``whole``.
        self.phase = "whole"
        self.pieces = 0
        self.text: list[str] = []
        self.kept = 0

    def __call__(self, text: str) -> None:
        self.pieces += 1
        if text and self.kept < _KEEP_CHARS:
            piece = text[: _KEEP_CHARS - self.kept]
            self.text.append(piece)
            self.kept += len(piece)
        idle_s = self.idle_s
        if idle_s is None:
            self.phase = "whole"
            self.scope.deadline = self.until
        else:
            moved = now() + idle_s
            if moved < self.until:
                self.phase = "idle"
                self.scope.deadline = moved
            else:
                self.phase = "whole"
                self.scope.deadline = self.until
        outer = self.outer
        if outer is not None:
            outer(text)

    def why(self, first_byte_ms: int | None, idle_ms: int | None, tool: bool) -> str | None:
        """What ran out, in words (``None``: the whole call's budget)."""
        if self.phase == "first_byte":
            if tool:
                return f"no progress report within {first_byte_ms}ms"
            return f"no first byte within {first_byte_ms}ms"
        if self.phase == "idle":
            if tool:
                return f"no progress report for {idle_ms}ms"
            return f"the stream stalled: no chunk for {idle_ms}ms after {self.pieces} chunks"
        return None


async def watched(
    stage: StageAdapter[ItemT, ValueT, Any],
    item: ItemT,
    call_next: Callable[[ItemT], Awaitable[ValueT]],
    ms: int | None,
    first_byte_ms: int | None,
    idle_ms: int | None,
    code: str,
    layer: str = "timeout",
) -> ValueT:
    """``call_next(item)`` under a whole budget and bounds on its progress (see ``Watch``).

    ``ms=None`` is the called thing's declared budget, which — for a tool that reports
    progress while ``idle_ms`` bounds the gaps — holds only until its first report:
    a long tool that keeps working is not cut at a fixed budget. An explicit ``ms``
    bounds the whole call, always. Whose timer fired is read from the scope, as in
    ``within``; a stream cut after its first piece carries the text that arrived."""
    declared = ms is None
    if declared:
        ms = item.budget_ms
    started = now()
    whole = started + ms / 1000 if ms is not None else math.inf
    after_first = math.inf if declared and idle_ms is not None else whole
    scope = anyio.CancelScope(deadline=whole)
    watch = Watch(scope, after_first, None if idle_ms is None else idle_ms / 1000,
                  item.listener)  # fmt: skip
    if first_byte_ms is not None and started + first_byte_ms / 1000 < whole:
        scope.deadline = started + first_byte_ms / 1000
        watch.phase = "first_byte"
    with scope:
        outcome = await stage.attempt(call_next, item.with_listener(watch))
    if not scope.cancel_called:
        return stage.deliver(outcome)
    await anyio.lowlevel.checkpoint_if_cancelled()  # the caller's cancel wins, as in ``within``
    tool = stage.calls_tools
    why = watch.why(first_byte_ms, idle_ms, tool)
    partial = "".join(watch.text) if watch.pieces and not tool else None
    return stage.deliver(
        timed_out(stage, item, ms or 0, code, layer, why=why, partial=partial or None)
    )
