"""The Claude Agent SDK adapter against the real ``claude-agent-sdk``: its hook callbacks
called as the SDK's query loop calls them (``callback(input, tool_use_id, context)``,
inputs shaped as the CLI sends them), and guarded in-process tools served through the
SDK's own in-process MCP bridge over JSON-RPC — no CLI, no network."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("claude_agent_sdk", reason="pip install 'guardstack[claude-agent]'")

from claude_agent_sdk import (
    ClaudeAgentOptions,
    HookMatcher,
    ResultMessage,
    create_sdk_mcp_server,
    query,
    tool,
)
from claude_agent_sdk._internal.sdk_mcp_bridge import SdkMcpBridge

from guardstack.guards import (
    Approval,
    RepeatToolReminder,
    ToolCallLimit,
    ToolCallTimeoutPolicy,
)
from guardstack.integrations.claude_agent import guard_tools, guardstack_hooks
from guardstack.pipeline import Harness, ToolDefinition
from guardstack.wrappers import Retry, no_backoff

IDS = itertools.count(1)


def hook_input(event: str, tool: str, arguments: dict[str, Any], **more: Any) -> dict[str, Any]:
    base = {
        "session_id": "s-1",
        "transcript_path": "/tmp/t.jsonl",
        "cwd": "/tmp",
        "prompt_id": "p-1",
        "hook_event_name": event,
        "tool_name": tool,
        "tool_input": arguments,
        "tool_use_id": f"toolu_{next(IDS)}",
    }
    return {**base, **more}


async def fire(hooks: dict[str, list[HookMatcher]], event: str, data: dict[str, Any]) -> Any:
    """As the SDK's query loop does: every callback of every matcher of the event."""
    answers = []
    for matcher in hooks[event]:
        for callback in matcher.hooks:
            sent: Any = data  # the SDK's TypedDicts, as it builds them from the CLI's JSON
            answers.append(await callback(sent, data.get("tool_use_id"), {"signal": None}))
    [answer] = answers
    return answer


async def test_pre_tool_use_denies_past_a_cap_with_the_reason_the_model_reads() -> None:
    harness = Harness()
    harness.plugin(ToolCallLimit(per_turn=2))
    hooks = guardstack_hooks(harness)
    assert set(hooks) == {"UserPromptSubmit", "PreToolUse", "PostToolUse", "PostToolUseFailure"}
    assert all(isinstance(m, HookMatcher) for matchers in hooks.values() for m in matchers)
    answers = [
        await fire(hooks, "PreToolUse", hook_input("PreToolUse", "Read", {"path": f"f{n}"}))
        for n in range(3)
    ]
    assert answers[:2] == [{}, {}]  # no opinion: the SDK's own permissions decide
    denied = answers[2]["hookSpecificOutput"]
    assert denied["permissionDecision"] == "deny"
    assert "tool call limit reached" in denied["permissionDecisionReason"]
    # a sub-agent's call counts in its session's turn: the budget holds inside it
    inside = hook_input("PreToolUse", "Read", {"path": "x"}, agent_id="a-1")
    assert (await fire(hooks, "PreToolUse", inside))["hookSpecificOutput"][
        "permissionDecision"
    ] == ("deny")
    # a new person's prompt starts a new turn
    await fire(hooks, "UserPromptSubmit", {"session_id": "s-1", "prompt_id": "p-2",
                                           "hook_event_name": "UserPromptSubmit",
                                           "prompt": "next"})  # fmt: skip
    again = hook_input("PreToolUse", "Read", {"path": "y"}, prompt_id="p-2")
    assert await fire(hooks, "PreToolUse", again) == {}


async def test_post_tool_use_adds_the_reminder_as_context() -> None:
    harness = Harness()
    harness.plugin(RepeatToolReminder(thresholds=(2,)))
    hooks = guardstack_hooks(harness)
    answers = []
    for _ in range(2):
        data = hook_input("PostToolUse", "Grep", {"q": "TODO"}, tool_response={"stdout": "none"})
        answers.append(await fire(hooks, "PostToolUse", data))
    assert answers[0] == {}
    context = answers[1]["hookSpecificOutput"]
    assert context["hookEventName"] == "PostToolUse"
    assert "repeating the exact same tool call" in context["additionalContext"]


async def test_a_call_that_needs_a_person_is_asked() -> None:
    harness = Harness()
    harness.plugin(Approval(require=("Bash",)))
    hooks = guardstack_hooks(harness)
    asked = await fire(hooks, "PreToolUse", hook_input("PreToolUse", "Bash", {"command": "rm"}))
    assert asked["hookSpecificOutput"]["permissionDecision"] == "ask"
    other = await fire(hooks, "PreToolUse", hook_input("PreToolUse", "Read", {"path": "a"}))
    assert other == {}


async def call_tool(server: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One ``tools/call`` as the CLI sends it through the SDK's bridge."""
    bridge = SdkMcpBridge("app", server["instance"])
    await bridge.handle(
        {"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "claude-code", "version": "test"}}}
    )  # fmt: skip
    await bridge.handle({"jsonrpc": "2.0", "method": "notifications/initialized"})
    answer = await bridge.handle(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": name, "arguments": arguments}}
    )  # fmt: skip
    assert answer is not None
    result: dict[str, Any] = answer["result"]
    return result


async def test_in_process_tools_run_through_the_whole_stack() -> None:
    attempts: list[str] = []

    @tool("fetch", "Fetch a page.", {"url": str})
    async def fetch(args: dict[str, Any]) -> dict[str, Any]:
        attempts.append(args["url"])
        if len(attempts) == 1:
            await anyio.sleep(1)  # the first attempt hangs past its budget
        return {"content": [{"type": "text", "text": f"page {args['url']}"}]}

    harness = Harness()
    # the tool's budget, declared where guardstack's own tools declare theirs
    harness.tools.register(ToolDefinition("fetch", _never, timeout_ms=50))
    harness.plugin(Retry(attempts=2, backoff_ms=1))
    harness.plugin(ToolCallTimeoutPolicy())  # inside the retry: each attempt's budget
    server = create_sdk_mcp_server("app", tools=guard_tools([fetch], harness))
    with no_backoff():
        result = await call_tool(server, "fetch", {"url": "https://example.org"})
    assert result["content"] == [{"type": "text", "text": "page https://example.org"}]
    assert attempts == ["https://example.org"] * 2  # timed out, then retried
    # the hooks leave a guarded in-process tool to its guarded copy
    hooks = guardstack_hooks(harness)
    data = hook_input("PreToolUse", "mcp__app__fetch", {"url": "x"})
    assert await fire(hooks, "PreToolUse", data) == {}


async def test_a_guarded_tool_past_its_cap_answers_an_error_the_model_reads() -> None:
    @tool("note", "Write a note.", {"text": str})
    async def note(args: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": "noted"}]}

    harness = Harness()
    harness.plugin(ToolCallLimit(per_turn=1))
    server = create_sdk_mcp_server("app", tools=guard_tools([note], harness))
    first = await call_tool(server, "note", {"text": "a"})
    second = await call_tool(server, "note", {"text": "b"})
    assert first["content"][0]["text"] == "noted"
    assert second["isError"] is True
    assert "tool call limit reached" in second["content"][0]["text"]


async def _never(arguments: Any, call: Any) -> str:
    raise AssertionError("a framework's tool runs in the framework")


# -- through the SDK's own query loop, against a CLI speaking its control protocol ------


@pytest.fixture
def anyio_backend() -> str:
    """Real time: the peer is a real process (the SDK's control requests time out)."""
    return "asyncio"


def cli(tmp_path: Path, script: list[dict[str, Any]]) -> Path:
    """An executable the SDK starts as the CLI: ``claude_cli.py`` playing ``script``."""
    (tmp_path / "script.json").write_text(json.dumps(script), encoding="utf-8")
    launcher = tmp_path / "claude"
    launcher.write_text(
        f"#!/bin/sh\nGUARDSTACK_CLI_SCRIPT={tmp_path / 'script.json'} "
        f'exec {sys.executable} {Path(__file__).with_name("claude_cli.py")} "$@"\n',
        encoding="utf-8",
    )
    launcher.chmod(0o755)
    return launcher


async def play(harness: Harness, tmp_path: Path, script: list[dict[str, Any]],
               **options: Any) -> list[dict[str, Any]]:  # fmt: skip
    """One ``query()`` with guardstack's hooks; what the CLI saw of each call."""
    settings = ClaudeAgentOptions(
        cli_path=cli(tmp_path, script), hooks=guardstack_hooks(harness), **options
    )
    results = [m async for m in query(prompt="go", options=settings)
               if isinstance(m, ResultMessage)]  # fmt: skip
    [result] = results
    assert result.result is not None
    record: list[dict[str, Any]] = json.loads(result.result)
    return record


async def test_the_sdk_query_loop_asks_the_hooks_and_runs_the_guarded_tools(
    tmp_path: Path,
) -> None:
    @tool("fetch", "Fetch a page.", {"url": str})
    async def fetch(args: dict[str, Any]) -> dict[str, Any]:
        await anyio.sleep(3_600)  # never answers: its budget ends it
        return {"content": [{"type": "text", "text": "late"}]}

    harness = Harness()
    harness.tools.register(ToolDefinition("fetch", _never, timeout_ms=50))
    harness.plugin(ToolCallTimeoutPolicy())
    harness.plugin(RepeatToolReminder(thresholds=(2,)))
    harness.plugin(ToolCallLimit(per_turn=3))
    server = create_sdk_mcp_server("app", tools=guard_tools([fetch], harness))
    grep = {"name": "Grep", "input": {"q": "TODO"}, "response": {"stdout": "none"}}
    script = [grep, grep, {"name": "mcp__app__fetch", "input": {"url": "a"}}, grep]
    record = await play(harness, tmp_path, script, mcp_servers={"app": server})
    first, second, fetched, fourth = record
    assert first == {"name": "Grep", "output": {"stdout": "none"}}
    assert "repeating the exact same tool call" in second["context"]  # PostToolUse
    assert fetched["is_error"] is True  # the guarded copy, cut at its 50 ms
    assert fetched["output"].startswith("Error: tool call timed out after 50ms")
    assert fourth["decision"] == "deny"  # PreToolUse: the turn's fourth call
    assert "tool call limit reached" in fourth["reason"]


async def test_a_cap_that_ends_the_turn_stops_the_cli(tmp_path: Path) -> None:
    harness = Harness()
    harness.plugin(ToolCallLimit(per_turn=1, on_exceeded="end_turn"))
    read = {"name": "Read", "input": {"path": "a"}, "response": "text"}
    record = await play(harness, tmp_path, [read, read, read])
    assert [step.get("decision") for step in record] == [None, "deny"]  # no third call
    assert "tool call limit reached" in record[-1]["stopped"]
