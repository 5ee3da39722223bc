"""The Claude Agent SDK: guardstack's stack in the SDK's hooks, and around its in-process tools.

The SDK drives Claude Code, which runs most tools itself (Bash, Read, Edit, web
search, MCP servers it starts) — outside this process, where nothing here can time
them or retry them. What guardstack can do for those is decide before and look after,
through the SDK's hooks; for tools served *in* this process
(``create_sdk_mcp_server``), it runs the whole stack::

    from claude_agent_sdk import ClaudeAgentOptions, create_sdk_mcp_server
    from guardstack.integrations.claude_agent import guard_tools, guardstack_hooks

    server = create_sdk_mcp_server("app", tools=guard_tools([search, deploy], harness))
    options = ClaudeAgentOptions(
        mcp_servers={"app": server}, hooks=guardstack_hooks(harness)
    )

* ``guardstack_hooks(harness)`` — ``PreToolUse`` runs the harness's pre-execute
  decisions for every tool (caps, loop guards, approval): an allowed call goes on (with
  the arguments a person edited, if one did), a denied one is ``permissionDecision:
  "deny"`` with the reason the model reads, and one that waits for a person is
  ``"ask"``; ``PostToolUse`` runs post-execute on the tool's response and adds the
  reminders as ``additionalContext``, and a block as ``decision: "block"``.
  ``UserPromptSubmit`` starts a new turn (per-turn caps start again). The conversation
  is the SDK's ``session_id``: a sub-agent's tool calls (``agent_id``) count in its
  session's caps, so a budget holds across sub-agents.
* ``guard_tools(tools, harness)`` — copies of ``SdkMcpTool``\\s whose handler runs
  through pre-execute, dispatch and post-execute: timeouts (a budget from a harness
  ``ToolDefinition`` of the same name, else ``timeouts_ms``), retries, breakers,
  limits, caps, the reminder (appended to the result's text) and tracing. The hooks
  leave these tools to their guarded copy (``mcp__<server>__<tool>`` is not decided
  twice).

Extra ``claude-agent`` (``claude-agent-sdk``).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Mapping
from typing import Any, Final

from guardstack.integrations._extras import require
from guardstack.integrations._framework import FrameworkCalls
from guardstack.pipeline import (
    TOOL_DENIED,
    Harness,
    ToolCall,
    ToolOutcome,
    ToolResult,
)

__all__ = ["guard_tools", "guardstack_hooks"]

EXTRA = "claude-agent"
OWNER: Final = "claude-agent"

#: Per harness, the names of its in-process tools guarded by ``guard_tools`` (the hooks
#: leave them alone), and the SDK session its hooks saw last (a guarded tool's handler
#: is told no session: it counts in that one).
_GUARDED: weakref.WeakKeyDictionary[Harness, set[str]] = weakref.WeakKeyDictionary()
_SESSIONS: weakref.WeakKeyDictionary[Harness, list[Any]] = weakref.WeakKeyDictionary()
_IDS = itertools.count(1)
#: Per harness, the turns of its sessions, one key each, shared by its hooks and its
#: guarded tools so that both count in one turn.
_TURNS: weakref.WeakKeyDictionary[Harness, FrameworkCalls] = weakref.WeakKeyDictionary()


def _turns(harness: Harness) -> FrameworkCalls:
    turns = _TURNS.get(harness)
    if turns is None:
        turns = _TURNS[harness] = FrameworkCalls(harness, OWNER, None)
    return turns


def _sdk() -> Any:
    return require("claude_agent_sdk", EXTRA)


def _served_name(tool_name: str) -> str | None:
    """``add`` for ``mcp__calc__add`` (an SDK MCP tool as the CLI names it)."""
    parts = tool_name.split("__", 2)
    return parts[2] if len(parts) == 3 and parts[0] == "mcp" else None


class _Hooks:
    """One harness's hooks (see the module docstring)."""

    def __init__(self, harness: Harness, timeouts_ms: Mapping[str, int] | None) -> None:
        self.calls = FrameworkCalls(harness, OWNER, timeouts_ms)
        self.harness = harness
        self.prompts: dict[str, str] = {}  # session -> its current prompt's id

    def _turn(self, data: Mapping[str, Any]) -> Any:
        session = str(data.get("session_id") or "claude-agent")
        prompt = str(data.get("prompt_id") or self.prompts.get(session) or "")
        _SESSIONS[self.harness] = [session, prompt]
        return _turns(self.harness).named_run(session, prompt)

    def _guarded(self, tool_name: str) -> bool:
        served = _served_name(tool_name)
        return served is not None and served in _GUARDED.get(self.harness, set())

    def _call(self, data: Mapping[str, Any], tool_use_id: str | None) -> ToolCall:
        name = str(data.get("tool_name", ""))
        arguments = data.get("tool_input")
        call_id = str(tool_use_id or data.get("tool_use_id") or f"claude-{next(_IDS)}")
        tool = self.calls.definition(name, _not_run)
        return ToolCall(
            name,
            arguments if isinstance(arguments, Mapping) else {},
            call_id,
            conversation=self._turn(data),
            tool=tool,
        )

    async def prompt(self, data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        """``UserPromptSubmit``: a new person's prompt starts a new turn."""
        session = str(data.get("session_id") or "claude-agent")
        prompt = self.prompts[session] = str(data.get("prompt_id") or f"prompt-{next(_IDS)}")
        _SESSIONS[self.harness] = [session, prompt]
        return {}

    async def pre_tool_use(
        self, data: Any, tool_use_id: str | None, context: Any
    ) -> dict[str, Any]:
        if self._guarded(str(data.get("tool_name", ""))):
            return {}  # its guarded copy runs the whole stack
        call = self._call(data, tool_use_id)
        decided = await self.harness.tools.decide(call, tool=call.tool)
        if isinstance(decided, ToolCall):
            edited = decided.arguments != call.arguments  # a person edited them
            if edited and isinstance(decided.arguments, Mapping):
                return _pre("allow", "edited by the person reviewing it", decided.arguments)
            return {}  # no opinion: the SDK's own permissions decide as usual
        result = decided.result
        if decided.pending is not None:
            return _pre("ask", decided.pending.reason or "guardstack asks a person first")
        reason = result.error.message if result.error is not None else result.content
        output = _pre("deny", reason)
        if decided.ends_turn:
            output["continue_"] = False
            output["stopReason"] = reason
        return output

    async def post_tool_use(
        self, data: Any, tool_use_id: str | None, context: Any
    ) -> dict[str, Any]:
        if self._guarded(str(data.get("tool_name", ""))):
            return {}
        call = self._call(data, tool_use_id)
        result = ToolResult(_response_text(data.get("tool_response")))
        return _post(await self.harness.tools.review(call, result, tool=call.tool))

    async def post_tool_use_failure(
        self, data: Any, tool_use_id: str | None, context: Any
    ) -> dict[str, Any]:
        if self._guarded(str(data.get("tool_name", ""))):
            return {}
        call = self._call(data, tool_use_id)
        failed = ToolResult.failure(str(data.get("error") or "the tool failed"))
        return _post(await self.harness.tools.review(call, failed, tool=call.tool))


def _pre(decision: str, reason: str, updated: Mapping[str, Any] | None = None) -> dict[str, Any]:
    specific: dict[str, Any] = {
        "hookEventName": "PreToolUse",
        "permissionDecision": decision,
        "permissionDecisionReason": reason,
    }
    if updated is not None:
        specific["updatedInput"] = dict(updated)
    return {"hookSpecificOutput": specific}


def _post(outcome: ToolOutcome) -> dict[str, Any]:
    output: dict[str, Any] = {}
    contexts = "\n\n".join(context.text for context in outcome.contexts)
    if contexts:
        output["hookSpecificOutput"] = {
            "hookEventName": "PostToolUse",
            "additionalContext": contexts,
        }
    result = outcome.result
    if result.is_error and result.code != TOOL_DENIED and result.error is not None:
        output["decision"] = "block"
        output["reason"] = result.content
    if outcome.ends_turn:
        output["continue_"] = False
        output["stopReason"] = result.content or "a guardstack cap ended the turn"
    return output


def _response_text(response: Any) -> str:
    """A tool's response as the model-facing text guardstack's guards compare."""
    if isinstance(response, str):
        return response
    if isinstance(response, Mapping):
        content = response.get("content")
        if isinstance(content, list):
            return "".join(
                str(block.get("text", "")) for block in content if isinstance(block, Mapping)
            )
        for key in ("stdout", "output", "result", "text"):
            if isinstance(response.get(key), str):
                return str(response[key])
    import json

    try:
        return json.dumps(response, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(response)


async def _not_run(arguments: Any, call: Any) -> ToolResult:  # pragma: no cover - never run
    raise RuntimeError("a hooked tool runs in Claude Code, not here")


def guardstack_hooks(
    harness: Harness, *, timeouts_ms: Mapping[str, int] | None = None
) -> dict[Any, list[Any]]:
    """The ``{event: [HookMatcher]}`` mapping for ``ClaudeAgentOptions(hooks=…)``."""
    sdk = _sdk()
    hooks = _Hooks(harness, timeouts_ms)

    def matcher(callback: Any) -> Any:
        return sdk.HookMatcher(matcher=None, hooks=[callback])

    return {
        "UserPromptSubmit": [matcher(hooks.prompt)],
        "PreToolUse": [matcher(hooks.pre_tool_use)],
        "PostToolUse": [matcher(hooks.post_tool_use)],
        "PostToolUseFailure": [matcher(hooks.post_tool_use_failure)],
    }


def guard_tools(
    tools: list[Any], harness: Harness, *, timeouts_ms: Mapping[str, int] | None = None
) -> list[Any]:
    """Guarded copies of in-process SDK MCP tools (``@tool`` / ``SdkMcpTool``): each call
    runs through the harness's pre-execute, dispatch and post-execute stages, the
    original handler innermost."""
    sdk = _sdk()
    calls = FrameworkCalls(harness, OWNER, timeouts_ms)
    guarded = _GUARDED.setdefault(harness, set())
    copies = []
    for tool in tools:
        if not isinstance(tool, sdk.SdkMcpTool):
            raise TypeError(f"guard_tools takes SdkMcpTool values (@tool), got {tool!r}")
        guarded.add(tool.name)
        copies.append(
            sdk.SdkMcpTool(
                name=tool.name,
                description=tool.description,
                input_schema=tool.input_schema,
                handler=_guarded_handler(tool, calls, harness),
                annotations=tool.annotations,
            )
        )
    return copies


def _guarded_handler(tool: Any, calls: FrameworkCalls, harness: Harness) -> Any:
    schema = tool.input_schema if isinstance(tool.input_schema, Mapping) else None

    async def run(arguments: Mapping[str, Any], call: ToolCall) -> ToolResult:
        answer = await tool.handler(dict(arguments))
        content = answer.get("content") if isinstance(answer, Mapping) else None
        text = _response_text({"content": content}) if isinstance(content, list) else str(answer)
        if isinstance(answer, Mapping) and answer.get("is_error"):
            return ToolResult.failure(text)
        return ToolResult(text, value=answer)

    async def handler(arguments: dict[str, Any]) -> dict[str, Any]:
        # the turn the hooks saw last: a guarded tool's handler is told no session
        session, prompt = _SESSIONS.get(harness) or ["claude-agent", ""]
        conversation = _turns(harness).named_run(session, prompt)
        outcome = await calls.execute(
            tool.name,
            arguments,
            f"{tool.name}-{next(_IDS)}",
            conversation,
            run,
            description=tool.description,
            parameters=schema,
        )
        result = outcome.result
        text = "\n\n".join([result.content, *(context.text for context in outcome.contexts)])
        answer: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
        if result.is_error:
            answer["is_error"] = True
        return answer

    return handler
