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
deadline passes through and is never relabelled (see ``pipeline.deadline``).

Cancellation is cooperative, not a kill: an ``async`` tool stops at its next await;
a plain-function tool runs in a worker thread and stops only where it calls
``anyio.from_thread.check_cancelled()``. A tool that cannot be cancelled should not
declare a budget: the policy would wait for it to finish and then still report
``TOOL_TIMEOUT``, so the budget bounds nothing but what the model is told.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import ClassVar

import attrs

from guardstack.pipeline.contract import DispatchNext, Scope, timed_dispatch
from guardstack.pipeline.values import TOOL_TIMEOUT, ToolCall, ToolResult

__all__ = ["ToolCallTimeoutPolicy"]


@attrs.frozen
class ToolCallTimeoutPolicy:
    """Applies each tool's declared ``timeout_ms``; no configuration.

    The budget-reading case of the one timeout mechanism (``pipeline.deadline``), the
    same code as ``wrappers.Timeout()`` with no ``ms``.
    """

    name: ClassVar[str] = "tool-call-timeout-policy"

    def __call__(self, call: ToolCall, call_next: DispatchNext) -> Awaitable[ToolResult]:
        return timed_dispatch(call, call_next, None, TOOL_TIMEOUT)

    def apply(self, scope: Scope) -> None:
        """Register as a dispatch layer."""
        scope.use(scope.tools.dispatch, self)
