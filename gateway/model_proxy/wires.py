"""The provider APIs the proxy speaks: where a request goes, what a well-formed one
looks like, how its tool calls, reminders, replies, usage, stops and errors are written.

Every wire is strict about what it reads and exact about what it passes on: a request
that is not well formed is the client's error (400, in the API's own error shape)
before anything reaches the upstream; an upstream reply the proxy cannot account for
is passed through byte for byte, and its usage is *unknown* (charged its reservation).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Final

from guardstack.gateway.model_proxy import shapes
from guardstack.gateway.model_proxy.bodies import (
    Malformed,
    conformed,
    need,
    parse,
    positive_int,
    text_of,
)
from guardstack.gateway.model_proxy.estimates import input_chars
from guardstack.integrations._provider import usage_reported
from guardstack.pipeline import ModelReply, Usage

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "Malformed",
    "Wire",
    "conformed",
    "need",
    "parse",
    "positive_int",
    "text_of",
]


class Wire:
    """One provider API (see the module docstring)."""

    name = ""
    path = ""
    #: Where a request's history is (``messages``, or the Responses API's ``input``).
    history = "messages"
    #: The fields that offer the model tools (left out of a wrap-up request).
    tool_fields: tuple[str, ...] = ("tools", "tool_choice", "parallel_tool_calls")
    #: Where a request states its output limit.
    output_field = "max_tokens"
    #: The top-level fields whose content the model reads as input.
    input_fields: tuple[str, ...] = ("messages", "tools", "functions")

    def input_tokens(self, data: Mapping[str, Any]) -> int:
        """The request's input before the provider counts it: a token per four
        characters of every input it carries (``input_fields``: the system prompt or
        instructions, every message, block and part, the tool definitions), plus one."""
        return input_chars([data.get(field) for field in self.input_fields]) // 4 + 1

    def asks_structured(self, data: Mapping[str, Any]) -> bool:
        """Whether the request asks for JSON output (chat's ``response_format``)."""
        shape = data.get("response_format")
        return isinstance(shape, Mapping) and shape.get("type") in ("json_object", "json_schema")

    def choices(self, data: Mapping[str, Any]) -> int:
        """How many answers the request asks for (chat's ``n``, Gemini's
        ``candidateCount``): each may use the whole output limit."""
        return 1

    def wrap_up(self, data: dict[str, Any], note: str, tokens: int) -> dict[str, Any]:
        """The request once more as a budget's last call: no tools, the output bounded,
        a note asking the model to say what it did and what is left."""
        kept = {k: v for k, v in data.items() if k not in self.tool_fields}
        kept.pop("max_completion_tokens", None)
        kept[self.output_field] = tokens
        return self.remind(kept, [note])

    def check(self, data: dict[str, Any]) -> None:
        """Raise ``Malformed`` naming what is wrong with a request body."""
        raise NotImplementedError

    def headers(self, key: str | None, client: Mapping[str, str]) -> dict[str, str]:
        raise NotImplementedError

    def messages(self, data: Mapping[str, Any]) -> list[Any]:
        """The request's history, as a list of its own items."""
        history = data.get(self.history)
        return history if isinstance(history, list) else []

    def model(self, data: Mapping[str, Any]) -> str | None:
        model = data.get("model")
        return model if isinstance(model, str) and model else None

    def max_tokens(self, data: Mapping[str, Any]) -> int | None:
        """The request's output limit (what a spend cap reserves)."""
        return positive_int(data.get("max_completion_tokens")) or positive_int(
            data.get("max_tokens")
        )

    def calls(self, messages: list[Any]) -> Iterator[tuple[str, str, Any, str]]:
        """The history's answered tool calls: ``(id, name, arguments, result text)``."""
        raise NotImplementedError

    def is_prompt(self, message: Mapping[str, Any]) -> bool:
        """Whether a history item is a person's message (not a tool's result)."""
        return message.get("role") == "user"

    def prompts(self, messages: list[Any]) -> int:
        """How many of the history's messages a person wrote (a new one: a new turn)."""
        return sum(1 for message in messages if self.is_prompt(message))

    def turn_start(self, messages: list[Any]) -> int:
        """The index of the last person's message: where the current turn starts."""
        for index in range(len(messages) - 1, -1, -1):
            if self.is_prompt(messages[index]):
                return index
        return 0

    def last_prompt(self, messages: list[Any]) -> str:
        """The text of the last person's message."""
        if not messages or not self.is_prompt(messages[self.turn_start(messages)]):
            return ""
        content = messages[self.turn_start(messages)].get("content")
        if isinstance(content, list):
            return "".join(
                str(part.get("text", "")) for part in content if isinstance(part, Mapping)
            )
        return text_of(content)

    def remind(self, data: dict[str, Any], reminders: list[str]) -> dict[str, Any]:
        """The request with ``reminders`` added as the person's words, after the rest."""
        return {**data, "messages": [*data["messages"], *self.user_messages(reminders)]}

    def user_messages(self, texts: list[str]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": text} for text in texts]

    def ask_for_usage(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """A streamed request changed so the upstream reports its usage, or ``None``
        when it already does."""
        return None

    def is_usage_only(self, event: Any) -> bool:
        """A stream event that only carries usage (stripped when the client did not ask)."""
        return False

    def reply_of(self, content: bytes) -> ModelReply:
        """What a JSON reply says (text and usage); unknown usage when it cannot say."""
        raise NotImplementedError

    def text_in(self, event: Any) -> str:
        """The answer's text (or reasoning) a streamed event carries, ``""`` if none."""
        return ""

    def usage_in(self, event: Mapping[str, Any], so_far: Usage | None) -> Usage | None:
        """The usage a stream has reported, after one more of its events."""
        return so_far

    def response_id(self, content: bytes) -> str | None:
        """The id under which the provider stored a JSON reply (Responses), if any."""
        return None

    def system_text(self, data: Mapping[str, Any], messages: list[Any]) -> str:
        """The system prompt or instructions, as text (a conversation's identity)."""
        return "".join(
            text_of(message.get("content"))
            for message in messages
            if isinstance(message, Mapping) and message.get("role") in ("system", "developer")
        )

    def first_prompt(self, messages: list[Any]) -> str:
        """The text of the first person's message (a conversation's identity)."""
        for message in messages:
            if isinstance(message, Mapping) and self.is_prompt(message):
                return text_of(message.get("content"))
        return ""

    def cut_events(self, message: str, response_id: str | None = None) -> bytes:
        """What ends a stream the upstream broke off after its first byte: the API's own
        error event, so the client reports an error instead of a clean end
        (``response_id``: the stream's own, where its events name it)."""
        error = {"error": {"message": message, "type": "server_error", "code": "stream_cut"}}
        return f"data: {json.dumps(error)}\n\n".encode()

    def response_id_in(self, event: Mapping[str, Any]) -> str | None:
        """The id under which the provider stores a streamed reply, from its event."""
        return None

    def stop_body(self, model: str, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def stop_events(self, model: str, text: str) -> list[tuple[str | None, dict[str, Any]]]:
        raise NotImplementedError

    def done_line(self) -> bytes:
        """What ends a stream of this API (OpenAI's ``[DONE]``), if anything."""
        return b""

    def error_body(self, status: int, kind: str, message: str) -> dict[str, Any]:
        """An error in this API's own shape."""
        types = {
            "authentication": "invalid_api_key",
            "permission": "permission_denied",
            "too_large": "request_too_large",
            "media_type": "unsupported_media_type",
            "not_found": "not_found",
            "upstream": "upstream_error",
        }
        return {
            "error": {
                "message": message,
                "type": "invalid_request_error" if status < 500 else "server_error",
                "param": None,
                "code": types.get(kind, "invalid_request"),
            }
        }


class OpenAIChat(Wire):
    """Chat completions (``/v1/chat/completions``): OpenAI and every compatible server."""

    name, path = "openai", "/v1/chat/completions"

    def choices(self, data: Mapping[str, Any]) -> int:
        return positive_int(data.get("n")) or 1

    def check(self, data: dict[str, Any]) -> None:
        conformed(data, shapes.CHAT)
        need(bool(data["messages"]), "messages", "a non-empty list")

    def headers(self, key: str | None, client: Mapping[str, str]) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        return headers

    def calls(self, messages: list[Any]) -> Iterator[tuple[str, str, Any, str]]:
        results = {
            m.get("tool_call_id"): m.get("content")
            for m in messages
            if m.get("role") == "tool" and m.get("tool_call_id")
        }
        for message in messages:
            if message.get("role") != "assistant":
                continue
            for request in message.get("tool_calls") or ():
                call_id = request.get("id")
                if call_id not in results:
                    continue
                function = request.get("function") or {}
                yield (
                    str(call_id),
                    str(function.get("name", "")),
                    _arguments(function.get("arguments")),
                    text_of(results[call_id]),
                )

    def ask_for_usage(self, data: dict[str, Any]) -> dict[str, Any] | None:
        options = data.get("stream_options") or {}
        if options.get("include_usage"):
            return None
        return {**data, "stream_options": {**options, "include_usage": True}}

    def is_usage_only(self, event: Any) -> bool:
        return isinstance(event, dict) and event.get("choices") == [] and "usage" in event

    def reply_of(self, content: bytes) -> ModelReply:
        try:
            data = json.loads(content)
            message = data["choices"][0]["message"]
            text = message.get("content") or ""
            model = data.get("model")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
            return ModelReply("", usage=_unknown("an unreadable chat completion"))
        return ModelReply(
            text if isinstance(text, str) else "",
            usage=openai_usage(data.get("usage")),
            model=model if isinstance(model, str) else None,
        )

    def text_in(self, event: Any) -> str:
        choices = event.get("choices") if isinstance(event, Mapping) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        if not isinstance(delta, Mapping):
            return ""
        pieces = (delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning"))
        return "".join(piece for piece in pieces if isinstance(piece, str))

    def usage_in(self, event: Mapping[str, Any], so_far: Usage | None) -> Usage | None:
        if "usage" not in event or event.get("usage") is None:
            return so_far
        return openai_usage(event.get("usage"))

    def stop_body(self, model: str, text: str) -> dict[str, Any]:
        return {
            "id": "guardstack-stop",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
        }

    def stop_events(self, model: str, text: str) -> list[tuple[str | None, dict[str, Any]]]:
        delta = {"role": "assistant", "content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": "stop"}
        chunk = {"id": "guardstack-stop", "object": "chat.completion.chunk", "model": model}
        return [(None, {**chunk, "choices": [choice]})]

    def done_line(self) -> bytes:
        return b"data: [DONE]\n\n"


def _arguments(text: Any) -> Any:
    if not isinstance(text, str) or not text.strip():
        return {}
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _unknown(what: str) -> Usage | None:
    """``None`` — unknown usage, charged its reservation — for a reply it cannot read."""
    import logging

    logging.getLogger("guardstack").warning(
        "model-proxy: %s: its usage is unknown (charged its reservation)", what
    )
    return None


def openai_usage(
    reported: Any,
    names: tuple[str, str, str, str] = (
        "prompt_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    ),
) -> Usage | None:
    """An OpenAI usage object read: its input and output tokens and their details'
    cached and reasoning tokens, under ``names`` (chat completions' by default; the
    Responses API says ``input_tokens``…)."""
    if not isinstance(reported, Mapping):
        return usage_reported(None, None, source="the upstream (no usage object)")
    inputs, outputs = reported.get(names[2]), reported.get(names[3])
    return usage_reported(
        reported.get(names[0]),
        reported.get(names[1]),
        cached_input_tokens=inputs.get("cached_tokens") if isinstance(inputs, Mapping) else None,
        reasoning_tokens=(
            outputs.get("reasoning_tokens") if isinstance(outputs, Mapping) else None
        ),
        source="the upstream",
    )


class AnthropicMessages(Wire):
    """Anthropic's Messages API: tool calls are ``tool_use`` blocks, their results
    ``tool_result`` blocks of the next user message; a reminder is a text block added
    to the last user message (the roles must alternate)."""

    name, path = "anthropic", "/v1/messages"
    input_fields = ("system", "messages", "tools")

    def asks_structured(self, data: Mapping[str, Any]) -> bool:
        shape = data.get("output_format")
        return isinstance(shape, Mapping) and shape.get("type") == "json_schema"

    def check(self, data: dict[str, Any]) -> None:
        conformed(data, shapes.MESSAGES)
        need(bool(data["messages"]), "messages", "a non-empty list")

    def headers(self, key: str | None, client: Mapping[str, str]) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "anthropic-version": client.get("anthropic-version", "2023-06-01"),
        }
        if client.get("anthropic-beta"):
            headers["anthropic-beta"] = client["anthropic-beta"]
        if key:
            headers["x-api-key"] = key
        return headers

    def max_tokens(self, data: Mapping[str, Any]) -> int | None:
        return positive_int(data.get("max_tokens"))

    def calls(self, messages: list[Any]) -> Iterator[tuple[str, str, Any, str]]:
        results: dict[str, str] = {}
        for message in messages:
            if message.get("role") == "user" and isinstance(message.get("content"), list):
                for block in message["content"]:
                    if block.get("type") == "tool_result":
                        results[str(block.get("tool_use_id"))] = text_of(block.get("content"))
        for message in messages:
            if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
                continue
            for block in message["content"]:
                if block.get("type") == "tool_use":
                    call_id = str(block.get("id"))
                    if call_id in results:
                        name = str(block.get("name", ""))
                        yield call_id, name, block.get("input") or {}, results[call_id]

    def is_prompt(self, message: Mapping[str, Any]) -> bool:
        return message.get("role") == "user" and _from_a_person(message)

    def remind(self, data: dict[str, Any], reminders: list[str]) -> dict[str, Any]:
        messages = data["messages"]
        blocks = [{"type": "text", "text": text} for text in reminders]
        if messages and messages[-1].get("role") == "user":
            last = dict(messages[-1])
            content = last.get("content")
            earlier = (
                [{"type": "text", "text": content}]
                if isinstance(content, str)
                else list(content or [])
            )
            last["content"] = [*earlier, *blocks]
            return {**data, "messages": [*messages[:-1], last]}
        return {**data, "messages": [*messages, {"role": "user", "content": blocks}]}

    def reply_of(self, content: bytes) -> ModelReply:
        try:
            data = json.loads(content)
            text = "".join(
                block.get("text", "")
                for block in data.get("content") or ()
                if block.get("type") == "text"
            )
            model = data.get("model")
        except (ValueError, TypeError, AttributeError, RecursionError):
            return ModelReply("", usage=_unknown("an unreadable message"))
        return ModelReply(
            text if isinstance(text, str) else "",
            usage=anthropic_usage(data.get("usage")),
            model=model if isinstance(model, str) else None,
        )

    def text_in(self, event: Any) -> str:
        if not isinstance(event, Mapping) or event.get("type") != "content_block_delta":
            return ""
        delta = event.get("delta")
        if not isinstance(delta, Mapping):
            return ""
        piece = delta.get("text") if delta.get("type") == "text_delta" else delta.get("thinking")
        return piece if isinstance(piece, str) else ""

    def usage_in(self, event: Mapping[str, Any], so_far: Usage | None) -> Usage | None:
        """``message_start`` carries the input tokens, each ``message_delta`` the output
        so far (and, lately, the input too)."""
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            return anthropic_usage(message.get("usage") if isinstance(message, Mapping) else None)
        if kind != "message_delta":
            return so_far
        reported = event.get("usage")
        if not isinstance(reported, Mapping):
            return so_far
        if so_far is None:
            return anthropic_usage(reported)
        # the delta's counts are cumulative, and say only what changed (a server tool's
        # results add input and cache use after message_start): over the start's
        start = {
            "input_tokens": so_far.input_tokens
            - so_far.cached_input_tokens
            - so_far.cache_write_tokens,
            "cache_read_input_tokens": so_far.cached_input_tokens,
            "cache_creation_input_tokens": so_far.cache_write_tokens,
        }
        merged = {**start, **{k: v for k, v in reported.items() if v is not None}}
        return anthropic_usage(merged)

    def stop_body(self, model: str, text: str) -> dict[str, Any]:
        return {
            "id": "guardstack-stop",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }

    def stop_events(self, model: str, text: str) -> list[tuple[str | None, dict[str, Any]]]:
        message = {**self.stop_body(model, ""), "content": [], "stop_reason": None}
        return [
            ("message_start", {"type": "message_start", "message": message}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": text}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                               "usage": {"output_tokens": 0}}),
            ("message_stop", {"type": "message_stop"}),
        ]  # fmt: skip

    def error_body(self, status: int, kind: str, message: str) -> dict[str, Any]:
        types = {
            "authentication": "authentication_error",
            "permission": "permission_error",
            "too_large": "request_too_large",
            "not_found": "not_found_error",
            "rate_limit": "rate_limit_error",
        }
        default = "invalid_request_error" if status < 500 else "api_error"
        return {"type": "error", "error": {"type": types.get(kind, default), "message": message}}

    def system_text(self, data: Mapping[str, Any], messages: list[Any]) -> str:
        return text_of(data.get("system")) + super().system_text(data, messages)

    def cut_events(self, message: str, response_id: str | None = None) -> bytes:
        error = {"type": "error", "error": {"type": "api_error", "message": message}}
        return f"event: error\ndata: {json.dumps(error)}\n\n".encode()


def _from_a_person(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    if isinstance(content, str):
        return True
    blocks = content if isinstance(content, list) else []
    return bool(blocks) and not any(block.get("type") == "tool_result" for block in blocks)


def anthropic_usage(reported: Any) -> Usage | None:
    """The Messages API's usage as guardstack counts it: input counts cache reads and
    writes too (as ``AnthropicModel`` counts it)."""
    if not isinstance(reported, Mapping):
        return usage_reported(None, None, source="the upstream (no usage object)")
    plain = reported.get("input_tokens")
    read = reported.get("cache_read_input_tokens")
    written = reported.get("cache_creation_input_tokens")
    counted = usage_reported(
        plain,
        reported.get("output_tokens"),
        cached_input_tokens=read,
        cache_write_tokens=written,
        source="the upstream",
    )
    if counted is None:
        return None
    return Usage(
        counted.input_tokens + counted.cached_input_tokens + counted.cache_write_tokens,
        counted.output_tokens,
        counted.cached_input_tokens,
        0,
        counted.cache_write_tokens,
    )


OPENAI: Final = OpenAIChat()
ANTHROPIC: Final = AnthropicMessages()
