"""A real Anthropic Messages API server on loopback, scripted per test.

It speaks the wire protocol the official ``anthropic`` client reads — JSON messages
and the server-sent event stream (``message_start``, ``content_block_start`` /
``_delta`` / ``_stop`` with ``text_delta``, ``input_json_delta``, ``thinking_delta``
and ``signature_delta``, ``message_delta`` with usage, ``message_stop``, ``ping``,
``error``), error bodies and ``retry-after`` — and refuses what Anthropic refuses:

* a ``system`` (or any other) role inside ``messages``;
* a ``tool_use`` without its ``tool_result`` at the head of the next user message, and
  a ``tool_result`` naming no ``tool_use`` of the message before;
* with ``thinking`` enabled, a thinking block whose signature is not the one this
  server issued for that text, a redacted block it never issued, and a final
  assistant message with tool calls that does not start with its thinking.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterator
from typing import Any

import attrs
from werkzeug import Response

from tests.integrations.chat_server import Broken, Fail, Hang, Paused, Raw, ScriptedServer

PATH = "/v1/messages"
SECRET = b"loopback-thinking-key"


@attrs.frozen
class Reply:
    """A message: text, tool calls ``(id, name, input)``, thinking, usage, stop reason.

    ``usage`` is ``(input, output, cache_read, cache_write)`` as Anthropic counts them
    (``input`` without the cached parts).
    """

    text: str | None = None
    tool_uses: tuple[tuple[str, str, dict[str, Any]], ...] = ()
    thinking: str | None = None
    redacted: bool = False
    usage: tuple[int, int, int, int] = (10, 5, 0, 0)
    model: str = "claude-test"
    stop_reason: str | None = None


@attrs.frozen
class StreamError:
    """A stream that starts, then carries an ``error`` event (HTTP status stays 200)."""

    kind: str = "overloaded_error"
    message: str = "Overloaded"


@attrs.frozen
class Cut:
    """A stream that stops mid-reply: no ``message_delta``, no ``message_stop``."""

    text: str = "partial"


Step = Reply | StreamError | Cut | Broken | Fail | Hang | Raw | Paused


def signature(thinking: str) -> str:
    return base64.b64encode(hmac.new(SECRET, thinking.encode(), hashlib.sha256).digest()).decode()


class MessagesServer(ScriptedServer):
    """Answers ``POST /v1/messages`` with the n-th step of its script."""

    def __init__(self) -> None:
        super().__init__(PATH)
        self.script: list[Step] = []
        self.redacted_issued: set[str] = set()

    @property
    def base_url(self) -> str:
        return self.url_for("").rstrip("/")

    def forget(self) -> None:
        self.redacted_issued = set()

    def error(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        kind: str | None = None,
    ) -> Response:
        kind = kind or _KINDS.get(status, "api_error" if status >= 500 else "invalid_request_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
        return Response(
            json.dumps(body), status=status, headers=headers, mimetype="application/json"
        )

    def refuse(self, parsed: dict[str, Any]) -> Response | None:
        problem = self._problem(parsed)
        return None if problem is None else self.error(400, problem)

    def _problem(self, parsed: dict[str, Any]) -> str | None:
        messages = parsed.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages: at least one message is required"
        for index, message in enumerate(messages):
            if message.get("role") not in ("user", "assistant"):
                return (
                    f"messages.{index}.role: Input should be 'user' or 'assistant' "
                    f"(got {message.get('role')!r}; the system prompt is a top-level parameter)"
                )
        for index in range(len(messages)):
            problem = self._pairing(messages, index) or self._thinking(parsed, messages, index)
            if problem is not None:
                return problem
        return None

    def _pairing(self, messages: list[dict[str, Any]], index: int) -> str | None:
        message = messages[index]
        blocks = _blocks(message)
        if message["role"] == "assistant":
            uses = [block["id"] for block in blocks if block.get("type") == "tool_use"]
            if not uses:
                return None
            after = _blocks(messages[index + 1]) if index + 1 < len(messages) else []
            head = []
            for block in after:
                if block.get("type") != "tool_result":
                    break
                head.append(block.get("tool_use_id"))
            missing = [use for use in uses if use not in head]
            if missing:
                return (
                    f"messages.{index + 1}: `tool_use` ids were found without `tool_result` "
                    f"blocks immediately after: {', '.join(missing)}. Each `tool_use` block "
                    "must have a corresponding `tool_result` block in the next message."
                )
            return None
        previous = _blocks(messages[index - 1]) if index > 0 else []
        offered = {block.get("id") for block in previous if block.get("type") == "tool_use"}
        for position, block in enumerate(blocks):
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in offered:
                return (
                    f"messages.{index}.content.{position}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` "
                    "block must have a corresponding `tool_use` block in the previous message."
                )
        return None

    def _thinking(
        self, parsed: dict[str, Any], messages: list[dict[str, Any]], index: int
    ) -> str | None:
        if (parsed.get("thinking") or {}).get("type") != "enabled":
            return None
        message = messages[index]
        if message["role"] != "assistant":
            return None
        blocks = _blocks(message)
        for position, block in enumerate(blocks):
            where = f"messages.{index}.content.{position}"
            if block.get("type") == "thinking" and not hmac.compare_digest(
                str(block.get("signature", "")), signature(str(block.get("thinking", "")))
            ):
                return f"{where}: Invalid `signature` in `thinking` block"
            if block.get("type") == "redacted_thinking" and block.get("data") not in (
                self.redacted_issued
            ):
                return f"{where}: Invalid `data` in `redacted_thinking` block"
        last_assistant = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        uses_tools = any(block.get("type") == "tool_use" for block in blocks)
        if (
            index == last_assistant
            and uses_tools
            and blocks[0].get("type")
            not in (
                "thinking",
                "redacted_thinking",
            )
        ):
            return (
                f"messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, "
                f"but found `{blocks[0].get('type')}`. When `thinking` is enabled, a final "
                "`assistant` message must start with a thinking block."
            )
        return None

    def answer(self, step: Any, parsed: dict[str, Any]) -> Response:
        if isinstance(step, Reply):
            content = self._content(step)
            if parsed.get("stream"):
                return Response(_events(step, content), mimetype="text/event-stream")
            return Response(json.dumps(_message(step, content)), mimetype="application/json")
        if isinstance(step, StreamError):
            return Response(_failing_events(step), mimetype="text/event-stream")
        if isinstance(step, Cut):
            return Response(_cut_events(step), mimetype="text/event-stream")
        if isinstance(step, Broken):
            return Response(_broken_events(step), mimetype="text/event-stream")
        raise TypeError(f"not a step: {step!r}")

    def _content(self, step: Reply) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        if step.thinking is not None:
            if step.redacted:
                data = base64.b64encode(f"redacted:{step.thinking}".encode()).decode()
                self.redacted_issued.add(data)
                content.append({"type": "redacted_thinking", "data": data})
            else:
                content.append(
                    {
                        "type": "thinking",
                        "thinking": step.thinking,
                        "signature": signature(step.thinking),
                    }
                )
        if step.text is not None:
            content.append({"type": "text", "text": step.text})
        for call_id, name, arguments in step.tool_uses:
            content.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
        return content


_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def _stop(step: Reply) -> str:
    return step.stop_reason or ("tool_use" if step.tool_uses else "end_turn")


def _usage(step: Reply) -> dict[str, Any]:
    plain, output, read, written = step.usage
    return {
        "input_tokens": plain,
        "output_tokens": output,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": written,
    }


def _message(step: Reply, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": step.model,
        "content": content,
        "stop_reason": _stop(step),
        "stop_sequence": None,
        "usage": _usage(step),
    }


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


def _pieces(text: str, size: int) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)]


def _start(step: Reply | None, model: str = "claude-test") -> str:
    usage = _usage(step) if step is not None else _usage(Reply())
    message = _message(step or Reply(), []) | {"model": model, "stop_reason": None}
    return _event("message_start", {"message": message | {"usage": usage | {"output_tokens": 1}}})


def _events(step: Reply, content: list[dict[str, Any]]) -> Iterator[str]:
    yield _start(step, step.model)
    yield _event("ping", {})
    for index, block in enumerate(content):
        kind = block["type"]
        if kind == "thinking":
            yield _event(
                "content_block_start",
                {
                    "index": index,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                },
            )
            for piece in _pieces(block["thinking"], 5):
                delta = {"type": "thinking_delta", "thinking": piece}
                yield _event("content_block_delta", {"index": index, "delta": delta})
            delta = {"type": "signature_delta", "signature": block["signature"]}
            yield _event("content_block_delta", {"index": index, "delta": delta})
        elif kind == "text":
            yield _event(
                "content_block_start",
                {"index": index, "content_block": {"type": "text", "text": ""}},
            )
            for piece in _pieces(block["text"], 3):
                delta = {"type": "text_delta", "text": piece}
                yield _event("content_block_delta", {"index": index, "delta": delta})
        elif kind == "tool_use":
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            yield _event("content_block_start", {"index": index, "content_block": head})
            for piece in _pieces(json.dumps(block["input"]), 4):
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield _event("content_block_delta", {"index": index, "delta": delta})
        else:  # redacted thinking arrives whole
            yield _event("content_block_start", {"index": index, "content_block": block})
        yield _event("content_block_stop", {"index": index})
    plain, output, read, written = step.usage
    usage = {
        "output_tokens": output,
        "input_tokens": plain,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": written,
    }
    yield _event(
        "message_delta",
        {"delta": {"stop_reason": _stop(step), "stop_sequence": None}, "usage": usage},
    )
    yield _event("message_stop", {})


def _failing_events(step: StreamError) -> Iterator[str]:
    yield _start(None)
    yield _event("error", {"error": {"type": step.kind, "message": step.message}})


def _broken_events(step: Broken) -> Iterator[str]:
    """The stream's first events, then the connection dropped mid-body (the client sees
    a chunked body that never ends: httpx's ``RemoteProtocolError``)."""
    yield from _cut_events(Cut(step.text))
    raise ConnectionAbortedError("the stream breaks here (the test asked it to)")


def _cut_events(step: Cut) -> Iterator[str]:
    yield _start(None)
    yield _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
    delta = {"type": "text_delta", "text": step.text}
    yield _event("content_block_delta", {"index": 0, "delta": delta})
