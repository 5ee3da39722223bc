"""guardstack inside the OpenAI Agents SDK: function tools whose calls go through a harness.

::

    agent = Agent(name="researcher", tools=guard_tools([search, fetch], harness))
    await Runner.run(agent, "…", run_config=RunConfig(group_id=thread_id))

Where it belongs: around each function tool's own invocation (the SDK parses and
runs the tool innermost), so the harness's pre-execute, dispatch and post-execute
stages see every call, and a guardstack timeout or denial is a tool output the
model reads.

* the budget: a harness ``ToolDefinition`` of the same name (never executed), else
  ``timeouts_ms``, else the tool's own ``timeout_seconds`` — which guardstack then
  owns (the returned tool has none), so the model reads the seed's
  ``TOOL_TIMEOUT`` text and a ``Retry`` can retry it;
* reminders: the SDK gives a tool no way to add a message to the conversation, so
  they travel in the tool's output as separate text parts after the result (the
  model reads them right after the result they are about);
* a cap that ends the turn raises ``RunBlocked`` out of ``Runner.run`` (a
  ``TurnBlocked`` and an SDK ``AgentsException``, which the SDK passes through
  unwrapped, as it does its own ``MaxTurnsExceeded``);
* the conversation is ``RunConfig.group_id`` (the SDK's own "chat thread ID")
  when set, else each run is its own; each new run starts a new turn.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from guardstack.integrations._extras import require
from guardstack.integrations._framework import FrameworkCalls, RunKeys, budget_ms
from guardstack.pipeline import ToolCall, ToolOutcome, ToolResult, TurnBlocked
from guardstack.pipeline.harness import Harness

require("agents", "openai-agents")

from agents import FunctionTool, ToolOutputText  # noqa: E402
from agents.exceptions import AgentsException  # noqa: E402
from agents.tool import Tool  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

__all__ = ["RunBlocked", "guard_tools"]

OWNER = "guard_tools"


class RunBlocked(AgentsException, TurnBlocked):
    """A guardstack cap ended the turn; raised out of ``Runner.run``."""


def guard_tools(
    tools: Iterable[Tool],
    harness: Harness,
    *,
    timeouts_ms: Mapping[str, int] | None = None,
) -> list[Tool]:
    """Copies of ``tools`` (function tools) whose every invocation runs through ``harness``."""
    calls = FrameworkCalls(harness, OWNER, timeouts_ms)
    runs = RunKeys("openai-agents-run")
    guarded: list[Tool] = []
    for tool in tools:
        if not isinstance(tool, FunctionTool):
            raise TypeError(
                f"{OWNER}: {tool!r} is not a FunctionTool; guardstack can only guard tools "
                "that run in this process (hosted tools run on the provider's servers)"
            )
        guarded.append(_guarded(tool, calls, runs))
    return guarded


def _guarded(tool: FunctionTool, calls: FrameworkCalls, runs: RunKeys) -> FunctionTool:
    invoke_tool = tool.on_invoke_tool
    declared_ms = budget_ms(tool.timeout_seconds)

    async def on_invoke_tool(context: ToolContext[Any], arguments: str) -> Any:
        group = context.run_config.group_id if context.run_config is not None else None
        conversation = group if group else runs.key(context.usage)
        turn = calls.start_run(conversation, context.usage)

        async def run(parsed: Mapping[str, Any], call: ToolCall) -> ToolResult:
            return _result(await invoke_tool(context, arguments))

        outcome = await calls.execute(
            tool.name,
            _parsed(arguments),
            context.tool_call_id,
            turn,
            run,
            description=tool.description,
            parameters=tool.params_json_schema,
            timeout_ms=declared_ms,
        )
        if outcome.ends_turn:
            error = outcome.result.error
            raise RunBlocked(error.message if error is not None else outcome.result.content)
        return _output(outcome)

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, timeout_seconds=None)


def _parsed(arguments: str) -> Mapping[str, Any] | str:
    """The model's JSON arguments (``""`` is ``{}``); text that is not JSON stays text."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def _text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, ToolOutputText):
        return output.text
    return str(output)  # what the SDK itself sends for other values


def _result(output: Any) -> ToolResult:
    return ToolResult(_text(output), value=output)


def _output(outcome: ToolOutcome) -> Any:
    """The SDK's own output when guardstack left it as it was, then any reminders."""
    result = outcome.result
    output: Any = result.content
    if not result.is_error and _text(result.value) == result.content:
        output = result.value
    if not outcome.contexts:
        return output
    parts = output if isinstance(output, list) else [output]
    parts = [ToolOutputText(text=part) if isinstance(part, str) else part for part in parts]
    return [*parts, *(ToolOutputText(text=context.text) for context in outcome.contexts)]
