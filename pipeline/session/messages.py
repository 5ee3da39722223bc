"""The chat request a log rebuilds: the message each event contributes, in its place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from guardstack.pipeline.readonly import ReadOnlyDict, ReadOnlyList, read_only
from guardstack.pipeline.session.events import (
    AssistantMessage,
    Event,
    SystemMessage,
    ToolResultEvent,
    UserMessage,
)


def provider_message_of(event: Event) -> dict[str, Any] | None:
    """The chat message one event contributes to the request, if any: read-only, so a
    model (or a layer) handed the request cannot change what the log says was sent.
    Built for the event's type directly (one dict lookup, no second walk to freeze it)."""
    kind = type(event)
    return (BUILDERS.get(kind) or builder_of(kind))(event)


def builder_of(kind: type) -> Callable[[Any], dict[str, Any] | None]:
    """The builder for a type first seen: its nearest base's (a subclass of a message's
    event), or none (``_nothing``); remembered."""
    build = BUILDERS[kind] = next(
        (BUILDERS[base] for base in kind.__mro__ if base in BUILDERS), _nothing
    )
    return build


def _nothing(event: Any) -> None:
    return None


def _user(event: Any) -> dict[str, Any]:
    return ReadOnlyDict(role="user", content=event.text)


def _system(event: Any) -> dict[str, Any]:
    return ReadOnlyDict(role="system", content=event.text)


def _tool_result(event: Any) -> dict[str, Any]:
    result = event.result
    content = result.content
    if not isinstance(content, str):  # a result's content is text; anything else, frozen
        content = read_only(content)
    if result.is_error:  # is_error: for Anthropic's tool_result; other adapters drop it
        return ReadOnlyDict(role="tool", tool_call_id=event.call_id, content=content,
                            is_error=True)  # fmt: skip
    return ReadOnlyDict(role="tool", tool_call_id=event.call_id, content=content)


def _assistant(event: Any) -> dict[str, Any] | None:
    if not (event.text or event.tool_calls):
        return None
    # Built read-only as it is built (not built, then walked again to freeze it).
    message: dict[str, Any] = {"role": "assistant", "content": event.text or None}
    if event.reasoning is not None:
        message["reasoning_content"] = event.reasoning
    if event.thinking_blocks:
        message["thinking_blocks"] = read_only([dict(block) for block in event.thinking_blocks])
    if event.tool_calls:
        message["tool_calls"] = ReadOnlyList(
            [
                ReadOnlyDict(
                    id=call.call_id,
                    type="function",
                    function=ReadOnlyDict(name=call.name, arguments=call.arguments_json),
                )
                for call in event.tool_calls
            ]
        )
    return ReadOnlyDict(message)


BUILDERS: dict[type, Callable[[Any], dict[str, Any] | None]] = {
    UserMessage: _user,
    SystemMessage: _system,
    ToolResultEvent: _tool_result,
    AssistantMessage: _assistant,
}


def place(messages: list[dict[str, Any]], message: dict[str, Any], order: dict[str, int]) -> None:
    """Append ``message``; a tool result goes among the step's results in the order the
    model asked for the calls (``order``: call id -> index, of the last assistant
    message). They are logged in that order, except when a step paused for approval:
    its decided calls' results come last in the log, but the request has them where the
    model expects them — the one it would have got without the pause."""
    role = message["role"]
    if role == "assistant":
        calls = message.get("tool_calls")
        order.clear()
        if calls:
            for index, call in enumerate(calls):
                order[call["id"]] = index
    elif role == "tool" and messages and messages[-1]["role"] == "tool":
        mine = order.get(message["tool_call_id"], -1)
        if order.get(messages[-1]["tool_call_id"], -1) > mine:
            end = len(messages)
            while messages[end - 1]["role"] == "tool" and (
                order.get(messages[end - 1]["tool_call_id"], -1) > mine
            ):
                end -= 1
            messages.insert(end, message)
            return
    messages.append(message)
