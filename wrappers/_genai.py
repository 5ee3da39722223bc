"""GenAI semantic conventions' message shapes: a chat request and a reply as the
gen_ai.input.messages and gen_ai.output.messages attributes want them."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from guardstack.pipeline.contract import ModelReply


def as_json(value: object) -> str:
    """Content as JSON text for a span attribute; never raises."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _parsed_arguments(text: object) -> object:
    """Tool-call arguments as the object the GenAI conventions expect (raw text if not JSON)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return text


def _text_part(text: object, cut: Callable[[str], str]) -> dict[str, object]:
    return {"type": "text", "content": cut(text if isinstance(text, str) else as_json(text))}


def _parts(message: Mapping[str, Any], cut: Callable[[str], str]) -> list[dict[str, object]]:
    """One chat-completions message as GenAI message parts (texts cut to size)."""
    if message.get("role") == "tool":
        content = message.get("content")
        return [
            {
                "type": "tool_call_response",
                "id": message.get("tool_call_id"),
                "response": cut(content if isinstance(content, str) else as_json(content)),
            }
        ]
    parts: list[dict[str, object]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        parts.append({"type": "reasoning", "content": cut(reasoning)})
    content = message.get("content")
    if content:
        parts.append(_text_part(content, cut))
    for requested in message.get("tool_calls") or ():
        function = requested.get("function") or {} if isinstance(requested, Mapping) else {}
        parts.append(
            {
                "type": "tool_call",
                "id": requested.get("id") if isinstance(requested, Mapping) else None,
                "name": function.get("name", ""),
                "arguments": _parsed_arguments(function.get("arguments")),
            }
        )
    return parts


def genai_input(
    messages: Sequence[Mapping[str, Any]], cut: Callable[[str], str]
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Chat-completions messages as the GenAI conventions' system instructions and input messages.

    The conventions' JSON schema (parts, not OpenAI's ``content``/``tool_calls``),
    which backends validate: Phoenix drops a payload that does not match it. Texts
    are cut one by one, so the JSON stays whole.
    """
    system: list[dict[str, object]] = []
    chat: list[dict[str, object]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role == "system":
            system.append(_text_part(message.get("content") or "", cut))
            continue
        chat.append({"role": str(role), "parts": _parts(message, cut)})
    return system, chat


_FINISH_REASONS: Final = {"tool_calls": "tool_call", "function_call": "tool_call"}


def genai_output(reply: ModelReply, cut: Callable[[str], str]) -> list[dict[str, object]]:
    """A model reply as the GenAI conventions' output messages."""
    parts: list[dict[str, object]] = []
    if reply.reasoning:
        parts.append({"type": "reasoning", "content": cut(reply.reasoning)})
    if reply.text:
        parts.append(_text_part(reply.text, cut))
    parts.extend(
        {
            "type": "tool_call",
            "id": requested.call_id or None,
            "name": requested.name,
            "arguments": _parsed_arguments(requested.arguments_json),
        }
        for requested in reply.tool_calls
    )
    finish = reply.finish_reason or ("tool_call" if reply.tool_calls else "stop")
    return [
        {"role": "assistant", "parts": parts, "finish_reason": _FINISH_REASONS.get(finish, finish)}
    ]
