"""Tool-call timeout policy: end a call at the tool's *own* declared budget.

The seed's ``@deepseek-ai/dsh-tool-call-timeout-policy``, zero configuration. The
budget is not configured here: it is ``ToolDefinition.timeout_ms``, declared by
whoever owns the tool, read from the registry's resolved definition of each call.
The policy names no tool, so a misspelt tool name in its config cannot happen.

Where it belongs: a dispatch layer. Outside a ``Retry`` the tool's budget covers
the whole retried operation; inside it, each attempt. A tool without a budget
passes through untouched; a call that overruns its budget gets exactly::

    content  Error: tool call timed out after <ms>ms
    error    {message: "tool call timed out after <ms>ms",
              info: {name: "ToolTimeoutError", code: "TOOL_TIMEOUT"}}

which also keeps a slow provider's late result out of the model's context. Whose
timer fired is read from the policy's own cancel scope, so an outer cancel or
deadline passes through and is never relabelled (see ``wrappers.timeout``).

Cancellation is cooperative, not a kill: an ``async`` tool stops at its next await;
a plain-function tool runs in a worker thread and stops only where it calls
``anyio.from_thread.check_cancelled()``. A tool that cannot be cancelled should not
declare a budget: the policy would wait for it to finish and then still report
``TOOL_TIMEOUT``, so the budget bounds nothing but what the model is told.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, ClassVar

import attrs

from pipeline.values import TOOL_TIMEOUT, ToolCall, ToolResult
from wrappers.timeout import within_budget

if TYPE_CHECKING:
    from pipeline.harness import Scope
    from pipeline.registry import DispatchNext

__all__ = ["ToolCallTimeoutPolicy"]


@attrs.frozen
class ToolCallTimeoutPolicy:
    """Applies each tool's declared ``timeout_ms``; no configuration."""

    name: ClassVar[str] = "tool-call-timeout-policy"

    def __call__(self, call: ToolCall, call_next: DispatchNext) -> Awaitable[ToolResult]:
        # Hands back the awaitable, like ``Timeout``: no coroutine frame of its own.
        tool = call.tool
        if tool is None or tool.timeout_ms is None:
            return call_next(call)
        return within_budget(call, call_next, tool.timeout_ms, TOOL_TIMEOUT)

    def apply(self, scope: Scope) -> None:
        scope.use(scope.tools.dispatch, self)
