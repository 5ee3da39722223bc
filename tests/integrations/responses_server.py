"""A real OpenAI Responses API server on loopback (``POST /v1/responses``), scripted
per test: JSON responses and the server-sent event stream the official ``openai``
client reads (``response.created``, ``response.output_item.added`` / ``.done``,
``response.content_part.added`` / ``.done``, ``response.output_text.delta`` / ``.done``,
``response.function_call_arguments.delta`` / ``.done``, ``response.completed`` with the
usage), and OpenAI's error bodies. It refuses a ``function_call_output`` that names no
``function_call`` of the input (as OpenAI does)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import attrs
from werkzeug import Response

from tests.integrations.chat_server import ScriptedServer, _error

PATH = "/v1/responses"


@attrs.frozen
class Said:
    """A response: text, function calls ``(call_id, name, arguments)``, usage ``(in, out)``."""

    text: str | None = None
    calls: tuple[tuple[str, str, str], ...] = ()
    usage: tuple[int, int] = (12, 6)
    model: str = "test-model"
    #: The id the provider stores the response under.
    response_id: str = "resp_test"


def _usage(step: Said) -> dict[str, Any]:
    given, made = step.usage
    return {
        "input_tokens": given,
        "output_tokens": made,
        "total_tokens": given + made,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def _output(step: Said) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if step.text is not None:
        items.append(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": step.text, "annotations": []}],
            }
        )
    for number, (call_id, name, arguments) in enumerate(step.calls):
        items.append(
            {
                "id": f"fc_{number}",
                "type": "function_call",
                "status": "completed",
                "call_id": call_id,
                "name": name,
                "arguments": arguments,
            }
        )
    return items


def _response(step: Said, status: str = "completed", *, done: bool = True) -> dict[str, Any]:
    return {
        "id": step.response_id,
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": step.model,
        "output": _output(step) if done else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": _usage(step) if done else None,
    }


def _events(step: Said) -> Iterator[str]:
    number = iter(range(10_000))

    def event(kind: str, **payload: Any) -> str:
        data = {"type": kind, "sequence_number": next(number), **payload}
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    yield event("response.created", response=_response(step, "in_progress", done=False))
    for index, item in enumerate(_output(step)):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            ids = {"item_id": item["id"], "output_index": index}
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})  # fmt: skip
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.content_part.added", **ids, content_index=0, part=part)
            for start in range(0, len(text), 4):
                yield event("response.output_text.delta", **ids, content_index=0,
                            delta=text[start : start + 4], logprobs=[])  # fmt: skip
            yield event("response.output_text.done", **ids, content_index=0, text=text,
                        logprobs=[])  # fmt: skip
            yield event("response.content_part.done", **ids, content_index=0,
                        part=item["content"][0])  # fmt: skip
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"})  # fmt: skip
            yield event("response.function_call_arguments.delta", item_id=item["id"],
                        output_index=index, delta=item["arguments"])  # fmt: skip
            done = {"arguments": item["arguments"], "name": item["name"]}
            yield event("response.function_call_arguments.done", item_id=item["id"],
                        output_index=index, **done)  # fmt: skip
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=_response(step))


class ResponsesServer(ScriptedServer):
    """A Responses API server (``/v1/responses``)."""

    def __init__(self) -> None:
        super().__init__(PATH)

    @property
    def base_url(self) -> str:
        return self.url_for("/v1")

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
        return _error(status, message, headers)

    def refuse(self, parsed: dict[str, Any]) -> Response | None:
        items = parsed.get("input")
        if not isinstance(items, list):
            return None
        calls = {i.get("call_id") for i in items if i.get("type") == "function_call"}
        for item in items:
            if item.get("type") == "function_call_output" and item.get("call_id") not in calls:
                return self.error(400, f"No tool call found for {item.get('call_id')}")
        return None

    def answer(self, step: Any, parsed: dict[str, Any]) -> Response:
        if parsed.get("stream"):
            return Response(_events(step), mimetype="text/event-stream")
        return Response(json.dumps(_response(step)), mimetype="application/json")
