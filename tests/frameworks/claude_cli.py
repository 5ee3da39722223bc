"""A stand-in for the Claude Code CLI, speaking its stream-json control protocol on
stdin and stdout as the Agent SDK's subprocess transport expects: it answers
``initialize``, and for the user's message plays a scripted list of tool calls — each
through the SDK's registered hooks (``hook_callback`` control requests, matched by
event and matcher as the CLI matches them) and, for an ``mcp__<server>__<tool>``
allowed by them, through the SDK's in-process MCP server (``mcp_message``). It ends
the turn with a ``result`` whose text is the JSON record of what the SDK answered.

The script of calls is the JSON file named by ``GUARDSTACK_CLI_SCRIPT``::

    [{"name": "Read", "input": {"path": "a"}, "response": "text"}, ...]
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
from typing import Any

SESSION = "session-1"
_IDS = itertools.count(1)
_CONNECTED: set[str] = set()


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def receive() -> dict[str, Any] | None:
    line = sys.stdin.readline()
    return json.loads(line) if line else None


def ask(request: dict[str, Any]) -> dict[str, Any]:
    """A control request to the SDK, and its response (the SDK sends nothing else
    meanwhile: it is waiting for this turn)."""
    request_id = f"cli_{next(_IDS)}"
    send({"type": "control_request", "request_id": request_id, "request": request})
    while True:
        message = receive()
        if message is None:
            raise SystemExit("the SDK closed stdin while a control request was open")
        response = message.get("response", {})
        if message.get("type") == "control_response" and response.get("request_id") == request_id:
            if response.get("subtype") == "error":
                raise SystemExit(f"the SDK answered an error: {response.get('error')}")
            return dict(response.get("response") or {})


class Hooks:
    def __init__(self, config: dict[str, Any] | None) -> None:
        self.config = config or {}

    def fire(self, event: str, tool: str | None, data: dict[str, Any]) -> list[dict[str, Any]]:
        answers = []
        for matcher in self.config.get(event, []):
            pattern = matcher.get("matcher")
            if pattern and tool is not None and not re.fullmatch(pattern, tool):
                continue
            for callback_id in matcher["hookCallbackIds"]:
                request = {"subtype": "hook_callback", "callback_id": callback_id,
                           "input": {"session_id": SESSION, "hook_event_name": event,
                                     "transcript_path": "/dev/null", "cwd": os.getcwd(),
                                     **data},
                           "tool_use_id": data.get("tool_use_id")}  # fmt: skip
                answers.append(ask(request))
        return answers


def mcp(server: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One JSON-RPC request to an SDK MCP server, after the MCP handshake (once)."""

    def message(body: dict[str, Any]) -> dict[str, Any]:
        return ask({"subtype": "mcp_message", "server_name": server,
                    "message": {"jsonrpc": "2.0", **body}})  # fmt: skip

    if server not in _CONNECTED:
        message({"id": next(_IDS), "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "claude-code", "version": "test"}}})  # fmt: skip
        message({"method": "notifications/initialized"})
        _CONNECTED.add(server)
    return message({"id": next(_IDS), "method": method, "params": params})


def play(hooks: Hooks, prompt: str, script: list[dict[str, Any]]) -> list[dict[str, Any]]:
    record: list[dict[str, Any]] = []
    hooks.fire("UserPromptSubmit", None, {"prompt": prompt})
    for step in script:
        use = f"toolu_{next(_IDS)}"
        name, arguments = step["name"], step["input"]
        seen: dict[str, Any] = {"name": name}
        pre = hooks.fire("PreToolUse", name, {"tool_name": name, "tool_input": arguments,
                                              "tool_use_id": use})  # fmt: skip
        decisions = [a.get("hookSpecificOutput", {}) for a in pre]
        denied = [d for d in decisions if d.get("permissionDecision") in ("deny", "ask")]
        stops = [a.get("stopReason") for a in pre if a.get("continue") is False]
        if denied:
            seen["decision"] = denied[0]["permissionDecision"]
            seen["reason"] = denied[0].get("permissionDecisionReason")
            record.append(seen)
            if stops:  # the CLI ends the turn here, as it does for `continue: false`
                seen["stopped"] = stops[0]
                break
            continue
        edited = [d["updatedInput"] for d in decisions if "updatedInput" in d]
        arguments = edited[-1] if edited else arguments
        parts = name.split("__", 2)
        if len(parts) == 3 and parts[0] == "mcp":
            answer = mcp(parts[1], "tools/call", {"name": parts[2], "arguments": arguments})
            result = answer["mcp_response"]["result"]
            seen["output"] = "".join(block.get("text", "") for block in result["content"])
            seen["is_error"] = bool(result.get("isError"))
            response: Any = result
        else:
            response = seen["output"] = step.get("response", "ok")
        fired = {"tool_name": name, "tool_input": arguments, "tool_response": response}
        post = hooks.fire("PostToolUse", name, fired | {"tool_use_id": use})
        for answer in post:
            context = answer.get("hookSpecificOutput", {}).get("additionalContext")
            if context:
                seen["context"] = context
            if answer.get("decision") == "block":
                seen["blocked"] = answer.get("reason")
            if answer.get("continue") is False:
                seen["stopped"] = answer.get("stopReason")
        record.append(seen)
        if "stopped" in seen:
            break
    return record


def main() -> None:
    with open(os.environ["GUARDSTACK_CLI_SCRIPT"], encoding="utf-8") as file:
        script = json.load(file)
    hooks = Hooks(None)
    while (message := receive()) is not None:
        if message.get("type") == "control_request":
            request = message["request"]
            if request.get("subtype") == "initialize":
                hooks = Hooks(request.get("hooks"))
            send({"type": "control_response", "response": {"subtype": "success",
                  "request_id": message["request_id"], "response": {"commands": []}}})  # fmt: skip
            send({"type": "system", "subtype": "init", "session_id": SESSION,
                  "claude_code_version": "9.9.9", "tools": [], "mcp_servers": []})  # fmt: skip
        elif message.get("type") == "user":
            content = message["message"]["content"]
            prompt = content if isinstance(content, str) else json.dumps(content)
            record = play(hooks, prompt, script)
            send({"type": "assistant", "session_id": SESSION,
                  "message": {"role": "assistant", "model": "claude-test",
                              "content": [{"type": "text", "text": "done"}]}})  # fmt: skip
            send({"type": "result", "subtype": "success", "duration_ms": 1,
                  "duration_api_ms": 1, "is_error": False, "num_turns": 1,
                  "session_id": SESSION, "result": json.dumps(record)})  # fmt: skip


if __name__ == "__main__":
    main()
