"""A real chat-completions server on loopback, scripted per test.

It speaks the wire protocol OpenAI-compatible providers speak — JSON replies and
server-sent-event streams, error bodies, ``Retry-After`` — and can enforce
DeepSeek's thinking-mode rule: an assistant message with tool calls sent back
without its ``reasoning_content`` is refused with HTTP 400. The HTTP side is
pytest-httpserver (werkzeug), threaded so that a hanging answer does not block
the next request. Every request body it received is kept, raw and parsed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import attrs
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

PATH = "/v1/chat/completions"
HANG_LIMIT_S = 20.0  # a hanging answer gives up after this, so a broken test cannot stall CI


@attrs.frozen
class Answer:
    """A chat completion: text, tool calls ``(id, name, arguments)``, usage, reasoning."""

    text: str | None = None
    tool_calls: tuple[tuple[str, str, str], ...] = ()
    usage: tuple[int, int] | None = (10, 5)
    reasoning: str | None = None
    model: str = "test-model"
    finish_reason: str | None = None


@attrs.frozen
class Fail:
    """An HTTP error with an OpenAI-style error body."""

    status: int
    message: str = "failed"
    headers: dict[str, str] = attrs.Factory(dict)


@attrs.frozen
class Hang:
    """Never answer (until the test ends, or ``HANG_LIMIT_S``)."""


@attrs.frozen
class Raw:
    """Answer exactly this body, with this content type."""

    body: str
    content_type: str = "application/json"


@attrs.frozen
class Broken:
    """A stream that sends its first chunks, then drops the connection mid-body."""

    text: str = "partial"


@attrs.frozen
class Paused:
    """Another step's streamed answer with a pause before its chunk number ``at`` (0:
    before the first byte, headers included): a stream that is slow to start, or one
    that stalls half-way. The pause ends early when the test ends."""

    step: Any
    at: int
    pause_s: float


Step = Answer | Fail | Hang | Raw | Broken | Paused


class ScriptedServer:
    """Answers the n-th request to ``path`` with the n-th step of its script.

    The plumbing every provider's loopback server shares: the script, the records,
    hanging answers released at ``reset``. A subclass says how its provider refuses a
    request (``refuse``), writes an error body (``error``) and answers (``answer``).
    """

    def __init__(self, path: str) -> None:
        self.script: list[Any] = []
        self.bodies: list[bytes] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
        self._server.expect_request(path, method="POST").respond_with_handler(self._handle)
        self._server.start()

    def reset(self) -> None:
        """Forget the last test: release hung answers, clear the script and the records."""
        self._released.set()
        with self._lock:
            self.script, self.bodies, self.requests, self.headers = [], [], [], []
            self.forget()
        self._released = threading.Event()

    def forget(self) -> None:
        """Clear a subclass's own per-test settings (called under the lock)."""

    def stop(self) -> None:
        self._released.set()
        self._server.clear()
        if self._server.is_running():
            self._server.stop()

    def url_for(self, path: str) -> str:
        return str(self._server.url_for(path))

    def refuse(self, parsed: dict[str, Any]) -> Response | None:
        """The provider's refusal of a request it would not accept, if any."""
        return None

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
        raise NotImplementedError

    def answer(self, step: Any, parsed: dict[str, Any]) -> Response:
        raise NotImplementedError

    def _handle(self, request: Request) -> Response:
        body = request.get_data()
        parsed = json.loads(body)
        with self._lock:
            index = len(self.requests)
            self.bodies.append(body)
            self.requests.append(parsed)
            self.headers.append({k.lower(): v for k, v in request.headers.items()})
        refused = self.refuse(parsed)
        if refused is not None:
            return refused
        if index >= len(self.script):
            return self.error(500, f"the test script has no step for request {index + 1}")
        step = self.script[index]
        if isinstance(step, Hang):
            released = self._released
            released.wait(HANG_LIMIT_S)
            return self.error(504, "hung")
        if isinstance(step, Fail):
            return self.error(step.status, step.message, step.headers)
        if isinstance(step, Raw):
            return Response(step.body, content_type=step.content_type)
        if isinstance(step, Paused):
            answered = self.answer(step.step, parsed)
            chunks = answered.response
            released = self._released

            def paused() -> Iterator[Any]:
                for index, chunk in enumerate(chunks):
                    if index == step.at:
                        released.wait(step.pause_s)
                    yield chunk

            return Response(paused(), mimetype=answered.mimetype)
        return self.answer(step, parsed)


class ChatServer(ScriptedServer):
    """A chat-completions server (``/v1/chat/completions``)."""

    def __init__(self, *, require_reasoning: bool = False) -> None:
        super().__init__(PATH)
        self.script: list[Step] = []
        self.require_reasoning = require_reasoning

    @property
    def base_url(self) -> str:
        return self.url_for("/v1")

    def forget(self) -> None:
        self.require_reasoning = False

    def refuse(self, parsed: dict[str, Any]) -> Response | None:
        if self.require_reasoning:
            missing = _missing_reasoning(parsed["messages"])
            if missing is not None:
                return self.error(
                    400,
                    f"Missing `reasoning_content` field in the assistant message at "
                    f"message index {missing}",
                )
        return None

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
        return _error(status, message, headers)

    def answer(self, step: Any, parsed: dict[str, Any]) -> Response:
        if isinstance(step, Broken):
            return Response(_broken(step), mimetype="text/event-stream")
        if parsed.get("stream"):
            include_usage = bool((parsed.get("stream_options") or {}).get("include_usage"))
            return Response(_events(step, include_usage), mimetype="text/event-stream")
        return Response(json.dumps(_completion(step)), mimetype="application/json")


def _broken(step: Broken) -> Iterator[str]:
    yield from list(_events(Answer(step.text), include_usage=False))[:3]
    raise ConnectionAbortedError("the stream breaks here (the test asked it to)")


def _missing_reasoning(messages: list[dict[str, Any]]) -> int | None:
    for index, message in enumerate(messages):
        if (
            message.get("role") == "assistant"
            and message.get("tool_calls")
            and "reasoning_content" not in message
        ):
            return index
    return None


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
    return Response(json.dumps(body), status=status, headers=headers, mimetype="application/json")


def _usage(step: Answer) -> dict[str, Any] | None:
    if step.usage is None:
        return None
    prompt, completion = step.usage
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": prompt // 2},
    }


def _finish(step: Answer) -> str:
    return step.finish_reason or ("tool_calls" if step.tool_calls else "stop")


def _completion(step: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.text}
    if step.reasoning is not None:
        message["reasoning_content"] = step.reasoning
    if step.tool_calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, name, args in step.tool_calls
        ]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1,
        "model": step.model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(step)}],
        "usage": _usage(step),
    }


def _pieces(text: str, size: int = 3) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)] or [""]


def _events(step: Answer, include_usage: bool) -> Iterator[str]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        data = {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": step.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(data)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(step.reasoning or "") if step.reasoning else ():
        yield chunk({"reasoning_content": piece})
    for piece in _pieces(step.text or "") if step.text else ():
        yield chunk({"content": piece})
    for index, (call_id, name, arguments) in enumerate(step.tool_calls):
        head = {"index": index, "id": call_id, "type": "function"}
        yield chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
        for piece in _pieces(arguments, 4):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, _finish(step))
    if include_usage:
        data = {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": step.model,
            "choices": [],
            "usage": _usage(step),
        }
        yield f"data: {json.dumps(data)}\n\n"
    yield "data: [DONE]\n\n"
