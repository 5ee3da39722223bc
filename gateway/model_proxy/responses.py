"""OpenAI's Responses API (``POST /v1/responses``) through the proxy, JSON and SSE.

The history is the request's ``input`` — a string (one person's message) or a list of
items: messages (``{"role": "user", "content": …}``), the model's ``function_call``
items and the client's ``function_call_output`` items — so agents that speak only
Responses (Codex CLI is one) are guarded as chat-completions agents are. A reminder is
one more user message item; a stop is a ``response`` whose output is one assistant
message. Usage comes in the reply's ``usage`` (``input_tokens``, ``output_tokens``,
cached and reasoning details), on a stream in its ``response.completed`` event — every
stream reports it, so nothing needs asking for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

from guardstack.gateway.model_proxy import shapes
from guardstack.gateway.model_proxy.wires import (
    Wire,
    _arguments,
    _unknown,
    conformed,
    openai_usage,
    positive_int,
    text_of,
)
from guardstack.pipeline import ModelReply, Usage

__all__ = ["RESPONSES", "Responses"]


def _items(data: Mapping[str, Any]) -> list[Any]:
    history = data.get("input")
    if isinstance(history, str):
        return [{"role": "user", "content": history}]
    return history if isinstance(history, list) else []


#: The Responses API's names for its usage object's counts.
_USAGE_NAMES = ("input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details")


class Responses(Wire):
    """The Responses API (see the module docstring)."""

    name, path = "responses", "/v1/responses"
    history = "input"
    output_field = "max_output_tokens"
    input_fields = ("instructions", "input", "tools")

    def asks_structured(self, data: Mapping[str, Any]) -> bool:
        text = data.get("text")
        shape = text.get("format") if isinstance(text, Mapping) else None
        return isinstance(shape, Mapping) and shape.get("type") in ("json_object", "json_schema")

    def check(self, data: dict[str, Any]) -> None:
        conformed(data, shapes.RESPONSES)

    def headers(self, key: str | None, client: Mapping[str, str]) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        return headers

    def messages(self, data: Mapping[str, Any]) -> list[Any]:
        return _items(data)

    def max_tokens(self, data: Mapping[str, Any]) -> int | None:
        return positive_int(data.get("max_output_tokens"))

    def calls(self, messages: list[Any]) -> Iterator[tuple[str, str, Any, str]]:
        results = {
            item.get("call_id"): item.get("output")
            for item in messages
            if item.get("type") == "function_call_output"
        }
        for item in messages:
            if item.get("type") != "function_call" or item.get("call_id") not in results:
                continue
            call_id = item["call_id"]
            arguments = _arguments(item.get("arguments"))
            yield str(call_id), str(item.get("name", "")), arguments, text_of(results[call_id])

    def is_prompt(self, message: Mapping[str, Any]) -> bool:
        return message.get("type", "message") == "message" and message.get("role") == "user"

    def remind(self, data: dict[str, Any], reminders: list[str]) -> dict[str, Any]:
        return {**data, "input": [*_items(data), *self.user_messages(reminders)]}

    def user_messages(self, texts: list[str]) -> list[dict[str, Any]]:
        return [{"type": "message", "role": "user", "content": text} for text in texts]

    def reply_of(self, content: bytes) -> ModelReply:
        try:
            data = json.loads(content)
            text = "".join(
                str(part.get("text", ""))
                for item in data.get("output") or ()
                if item.get("type") == "message"
                for part in item.get("content") or ()
                if part.get("type") == "output_text"
            )
            model = data.get("model")
        except (ValueError, TypeError, AttributeError, RecursionError):
            return ModelReply("", usage=_unknown("an unreadable response"))
        return ModelReply(
            text,
            usage=openai_usage(data.get("usage"), _USAGE_NAMES),
            model=model if isinstance(model, str) else None,
        )

    def response_id(self, content: bytes) -> str | None:
        try:
            found = json.loads(content).get("id")
        except (ValueError, TypeError, AttributeError, RecursionError):
            return None
        return found if isinstance(found, str) and found else None

    def response_id_in(self, event: Mapping[str, Any]) -> str | None:
        if event.get("type") != "response.created":
            return None
        response = event.get("response")
        found = response.get("id") if isinstance(response, Mapping) else None
        return found if isinstance(found, str) and found else None

    def system_text(self, data: Mapping[str, Any], messages: list[Any]) -> str:
        instructions = data.get("instructions")
        return (instructions if isinstance(instructions, str) else "") + super().system_text(
            data, messages
        )

    def cut_events(self, message: str, response_id: str | None = None) -> bytes:
        failed = self._response("", "", "failed")
        if response_id is not None:
            failed["id"] = response_id
        failed["error"] = {"code": "server_error", "message": message}
        event = {"type": "response.failed", "sequence_number": 1_000_000, "response": failed}
        return f"event: response.failed\ndata: {json.dumps(event)}\n\n".encode()

    def text_in(self, event: Any) -> str:
        kinds = ("response.output_text.delta", "response.reasoning_text.delta",
                 "response.reasoning_summary_text.delta")  # fmt: skip
        if not isinstance(event, Mapping) or event.get("type") not in kinds:
            return ""
        delta = event.get("delta")
        return delta if isinstance(delta, str) else ""

    def usage_in(self, event: Mapping[str, Any], so_far: Usage | None) -> Usage | None:
        if event.get("type") not in ("response.completed", "response.incomplete"):
            return so_far
        response = event.get("response")
        usage = response.get("usage") if isinstance(response, Mapping) else None
        return openai_usage(usage, _USAGE_NAMES)

    def _response(self, model: str, text: str, status: str) -> dict[str, Any]:
        message = {
            "id": "msg_guardstack_stop",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        return {
            "id": "resp_guardstack_stop",
            "object": "response",
            "created_at": time.time(),
            "status": status,
            "model": model,
            "output": [message] if text else [],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "total_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }

    def stop_body(self, model: str, text: str) -> dict[str, Any]:
        return self._response(model, text, "completed")

    def stop_events(self, model: str, text: str) -> list[tuple[str | None, dict[str, Any]]]:
        done = self._response(model, text, "completed")
        item = done["output"][0]
        part = item["content"][0]
        ids = {"item_id": item["id"], "output_index": 0}
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": self._response(model, "", "in_progress")}),
            ("response.output_item.added",
             {"output_index": 0, "item": {**item, "status": "in_progress", "content": []}}),
            ("response.content_part.added",
             {**ids, "content_index": 0, "part": {**part, "text": ""}}),
            ("response.output_text.delta",
             {**ids, "content_index": 0, "delta": text, "logprobs": []}),
            ("response.output_text.done",
             {**ids, "content_index": 0, "text": text, "logprobs": []}),
            ("response.content_part.done", {**ids, "content_index": 0, "part": part}),
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": done}),
        ]  # fmt: skip
        return [
            (kind, {"type": kind, "sequence_number": number, **payload})
            for number, (kind, payload) in enumerate(events)
        ]


RESPONSES: Final = Responses()
