"""guardstack inside pydantic-ai: a wrapper toolset whose every call goes through a harness.

::

    agent = Agent(model, toolsets=[GuardstackToolset(FunctionToolset([search]), harness)])

Where it belongs: around the wrapped toolset's own ``call_tool`` (pydantic-ai
validates the arguments and runs the tool innermost), so the harness's
pre-execute, dispatch and post-execute stages see every call.

* the budget: a harness ``ToolDefinition`` of the same name (never executed), else
  ``timeouts_ms``, else the tool's own ``timeout`` — which guardstack then owns (the
  wrapped toolset runs the tool without it), so the model reads the seed's
  ``TOOL_TIMEOUT`` text and a ``Retry`` can retry it. A toolset-wide
  ``FunctionToolset(timeout=…)`` stays pydantic-ai's: it fires inside guardstack's
  layers, as pydantic-ai's own retry prompt;
* a guardstack error result — a timeout, a denial, a tool that raised — reaches
  the model as a failed tool return (``ToolFailed``, outcome ``failed``), which
  pydantic-ai shows the model without spending the tool's retry budget;
  pydantic-ai's own signals (``ModelRetry``, ``ToolFailed``, deferred calls) pass
  through unchanged when guardstack did not replace the result;
* reminders: a ``ToolReturn`` whose ``content`` pydantic-ai sends as a separate
  user message right after the tool returns (for a failed return, which cannot
  carry content, they are appended to its text);
* a cap that ends the turn raises ``TurnBlocked`` out of ``agent.run`` (as
  pydantic-ai's own ``UsageLimits`` raise);
* the conversation is the run's ``conversation_id`` (else its ``run_id``); each
  new run starts a new turn;
* sub-agents: a run a tool starts (the agent it delegates to, ``await
  other.run(…)``) is part of the calling run's tree — its guarded tool calls count
  against the calling run's ``ToolCallLimit`` too (no fresh allowance), and it
  inherits guardstack's deadline for the call as its pydantic-ai run deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
from collections.abc import Mapping
from typing import Any

import anyio

from guardstack.integrations._extras import require
from guardstack.integrations._framework import FrameworkCalls, RunKeys, budget_ms, with_contexts
from guardstack.pipeline import Harness, ToolCall, ToolError, ToolOutcome, ToolResult, TurnBlocked
from guardstack.pipeline.values import TOOL_FAILED

require("pydantic_ai", "pydantic-ai")

import pydantic_core  # noqa: E402
from pydantic_ai import RunContext  # noqa: E402
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry, ToolFailed  # noqa: E402
from pydantic_ai.messages import ToolReturn  # noqa: E402
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset  # noqa: E402

_provide_run_deadline: Any
try:  # pydantic-ai's run deadlines (2.x): the one a run started inside a run inherits
    from pydantic_ai._cancel import provide_run_deadline as _provide_run_deadline
except ImportError:  # pragma: no cover - an older pydantic-ai: no deadline to hand down
    _provide_run_deadline = None

__all__ = ["GuardstackToolset"]

OWNER = "GuardstackToolset"

_RUNS = RunKeys("pydantic-ai-run")

#: pydantic-ai's own ways for a tool to answer: kept, and raised again when unchanged.
_SIGNALS = (ModelRetry, ToolFailed, CallDeferred, ApprovalRequired)


def _signal_text(signal: Exception) -> str:
    message = getattr(signal, "message", None)
    return message if isinstance(message, str) else str(signal)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, ToolReturn):
        return _text(value.return_value)
    return pydantic_core.to_json(value, fallback=str).decode()


@dataclasses.dataclass
class GuardstackToolset(WrapperToolset[Any]):
    """Every call of the wrapped toolset through a guardstack harness."""

    harness: Harness
    timeouts_ms: Mapping[str, int] | None = dataclasses.field(default=None, kw_only=True)
    #: shared by the copies pydantic-ai makes per run (``for_run``), so runs are tracked
    _calls: FrameworkCalls | None = dataclasses.field(default=None, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        if self._calls is None:
            self._calls = FrameworkCalls(self.harness, OWNER, self.timeouts_ms)

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[Any],
        tool: ToolsetTool[Any],
    ) -> Any:
        calls = self._calls
        assert calls is not None  # set in __post_init__
        run_id = ctx.run_id or _RUNS.key(ctx.usage)  # every agent run has an id
        conversation = ctx.conversation_id or run_id
        turn = calls.start_run(conversation, run_id)
        wrapped: AbstractToolset[Any] = self.wrapped
        declared = budget_ms(tool.tool_def.timeout)
        if declared is not None:  # guardstack owns the tool's own timeout from here
            tool = dataclasses.replace(
                tool, tool_def=dataclasses.replace(tool.tool_def, timeout=None)
            )
        inner = tool

        async def run(arguments: Mapping[str, Any], call: ToolCall) -> ToolResult:
            try:
                with _deadline_below(ctx):
                    value = await wrapped.call_tool(name, tool_args, ctx, inner)
            except _SIGNALS as signal:
                text = _signal_text(signal)
                error = ToolError(text, type(signal).__name__, TOOL_FAILED)
                return ToolResult(f"Error: {text}", True, error, signal)
            return ToolResult(_text(value), value=value)

        outcome = await calls.execute(
            name,
            tool_args,
            ctx.tool_call_id or "",
            turn,
            run,
            description=tool.tool_def.description or "",
            parameters=tool.tool_def.parameters_json_schema,
            timeout_ms=declared,
        )
        if outcome.ends_turn:
            error = outcome.result.error
            raise TurnBlocked(error.message if error is not None else outcome.result.content)
        return _answer(outcome)


def _deadline_below(ctx: RunContext[Any]) -> contextlib.AbstractContextManager[None]:
    """Inside a guarded call, a run the tool starts (an agent it delegates to) inherits
    guardstack's deadline for the call — its budget, a ``TurnDeadline`` — as
    pydantic-ai's own run deadline, when sooner than the run's: so the sub-agent sees it
    as ``ctx.deadline`` / ``ctx.remaining_time()``, its ``timeout=`` can only shorten it,
    and pydantic-ai ends it with ``RunTimedOut`` instead of a cancel from outside."""
    deadline = anyio.current_effective_deadline()
    if _provide_run_deadline is None or deadline == math.inf:
        return contextlib.nullcontext()
    left = max(0.0, deadline - anyio.current_time())
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=left)
    if ctx.deadline is not None and ctx.deadline <= at:
        return contextlib.nullcontext()
    provided: contextlib.AbstractContextManager[None] = _provide_run_deadline(at)
    return provided


def _answer(outcome: ToolOutcome) -> Any:
    """pydantic-ai's own answer when guardstack left it as it was; reminders after it."""
    result = outcome.result
    value = result.value
    if isinstance(value, _SIGNALS) and result.content == f"Error: {_signal_text(value)}":
        if isinstance(value, ModelRetry | ToolFailed) and outcome.contexts:
            raise type(value)(with_contexts(_signal_text(value), outcome))
        raise value  # deferred calls keep pydantic-ai's meaning (reminders wait for a result)
    if result.is_error:
        raise ToolFailed(with_contexts(result.content, outcome))
    unchanged = _text(value) == result.content
    if not outcome.contexts:
        return value if unchanged else result.content
    reminders = [context.text for context in outcome.contexts]
    if unchanged and isinstance(value, ToolReturn):
        content = value.content
        earlier = [content] if isinstance(content, str) else list(content or ())
        return dataclasses.replace(value, content=[*earlier, *reminders])
    return ToolReturn(return_value=value if unchanged else result.content, content=reminders)
