"""A fake upstream that plays a runaway model, for the real coding agents' tests.

One loopback server speaks every wire the model proxy fronts — Anthropic's Messages
(``POST /v1/messages``, ``/v1/messages/count_tokens``), OpenAI's Responses
(``POST /v1/responses``) and chat completions (``POST /v1/chat/completions``), and the
Gemini API (``POST /v1beta/models/{model}:generateContent`` and
``:streamGenerateContent?alt=sse``) — JSON and SSE, as each provider's SDK parses it.

Whenever a request offers a shell tool (Claude Code's ``Bash``, Codex's ``shell`` /
``exec_command``, Gemini CLI's ``run_shell_command``, or any tool when ``tool`` is
set), it answers with the same call again (``command``: ``ls``), up to ``bound``
calls per conversation; then, or without such a tool, a short text. Every request's
path, headers and body are logged (``requests``): that log is how a test sees whether
a reminder reached the model. ``fail`` makes it answer every model request with that
status (an overloaded or broken provider).

Run it in a thread (``with Runaway() as upstream``): the clients under test are other
processes, so the server has its own event loop and real time.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import attrs

SHELL_TOOLS = ("Bash", "shell", "exec_command", "local_shell", "run_shell_command", "shell_command")


@attrs.define
class Seen:
    """One request the upstream received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    def text(self) -> str:
        """Everything the request said, as text (to look for a reminder in)."""
        return json.dumps(self.body, ensure_ascii=False)


class Runaway:
    """The fake upstream (see the module docstring)."""

    def __init__(
        self,
        *,
        bound: int = 50,
        command: str = "ls",
        usage: tuple[int, int] = (1_000, 50),
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.bound = bound
        #: The arguments of every call (default: a shell command, as the tool wants it).
        self.arguments = arguments
        self.command = command
        self.usage = usage
        self.tool = tool
        self.requests: list[Seen] = []
        self.fail: int | None = None
        #: Streams break off after this many events (an upstream that dies mid-answer).
        self.cut_after: int | None = None
        self.calls_made = 0
        self._lock = threading.Lock()
        self.port = 0

    # -- running -------------------------------------------------------------------------

    def __enter__(self) -> Runaway:
        from tests.integrations.thread_server import ThreadServer

        self._served = ThreadServer(self.app, "the fake upstream")
        self.port = self._served.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._served.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    #: What ``serve`` and the fake servers' users read it by.
    base_url = url

    def model_requests(self) -> list[Seen]:
        """The requests that asked the model (not token counts, not probes)."""
        return [
            seen
            for seen in self.requests
            if seen.method == "POST"
            and not seen.path.endswith("/count_tokens")
            and not seen.path.endswith(":countTokens")
        ]

    # -- the app -------------------------------------------------------------------------

    @property
    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        async def handle(request: Request) -> Response:
            raw = await request.body()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            seen = Seen(request.method, path, dict(request.headers), body)
            with self._lock:
                self.requests.append(seen)
            if request.method != "POST":
                return JSONResponse({"data": [], "object": "list"})
            if request.url.path.endswith("/count_tokens"):
                return JSONResponse({"input_tokens": 42})
            if request.url.path.endswith(":countTokens"):
                return JSONResponse({"totalTokens": 42})
            if self.fail is not None:
                failure: Response = self._failure(request.url.path)
                return failure
            if not isinstance(body, dict):
                return JSONResponse({"error": {"message": "not JSON"}}, 400)
            wire = _wire_of(request.url.path)
            tool = self._tool_offered(wire, body)
            stream = bool(body.get("stream")) or request.url.query.find("alt=sse") >= 0
            stream = stream or ":streamGenerateContent" in request.url.path
            with self._lock:
                call = tool is not None and self.calls_made < self.bound
                if call:
                    self.calls_made += 1
                number = self.calls_made
            model = str(body.get("model") or _gemini_model(request.url.path))
            answer = _Answer(wire, model, tool if call else None, self.command, number, self.usage)
            answer.given = self.arguments
            asked = (body.get("generationConfig") or {}) if wire == "gemini" else {}
            if asked.get("responseMimeType") == "application/json":  # a side call's JSON
                schema = asked.get("responseJsonSchema") or asked.get("responseSchema") or {}
                answer.text = json.dumps(_example(schema))
            if stream:
                events = answer.events()
                if self.cut_after is not None:
                    events = _cut(events, self.cut_after)
                return StreamingResponse(events, media_type="text/event-stream")
            return JSONResponse(answer.json())

        return Starlette(routes=[Route("/{path:path}", handle, methods=["GET", "POST", "HEAD"])])

    def _failure(self, path: str) -> Any:
        from starlette.responses import JSONResponse

        status = self.fail or 500
        wire = _wire_of(path)
        if wire == "anthropic":
            kind = "overloaded_error" if status == 529 else "api_error"
            return JSONResponse(
                {"type": "error", "error": {"type": kind, "message": "down"}}, status
            )
        if wire == "gemini":
            return JSONResponse(
                {"error": {"code": status, "message": "down", "status": "UNAVAILABLE"}}, status
            )
        return JSONResponse({"error": {"message": "down", "type": "server_error"}}, status)

    def _tool_offered(self, wire: str, body: dict[str, Any]) -> str | None:
        names: list[str] = []
        for tool in body.get("tools") or ():
            if not isinstance(tool, dict):
                continue
            if wire == "gemini":
                for declaration in tool.get("functionDeclarations") or ():
                    names.append(str(declaration.get("name")))
            elif wire == "openai":
                names.append(str((tool.get("function") or {}).get("name")))
            elif tool.get("type") == "namespace":  # Codex's MCP servers: mcp__NAME
                for inner in tool.get("tools") or ():
                    names.append(f"{tool.get('name')}/{inner.get('name')}")
            else:
                names.append(str(tool.get("name") or tool.get("type")))
        if self.tool is not None:
            return self.tool if self.tool in names else None
        return next((name for name in names if name in SHELL_TOOLS), None)


def _wire_of(path: str) -> str:
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/responses"):
        return "responses"
    if path.startswith(("/v1beta/", "/v1/models/")):
        return "gemini"
    return "openai"


def _gemini_model(path: str) -> str:
    tail = path.rsplit("/models/", 1)[-1]
    return tail.split(":", 1)[0]


def _cut(events: Iterator[str], after: int) -> Iterator[str]:
    """The first ``after`` events, then the connection dropped mid-answer."""
    for number, event in enumerate(events):
        if number == after:
            raise ConnectionAbortedError("the upstream died mid-answer (a test's cut)")
        yield event


def _example(schema: Any) -> Any:
    """A value that fits a (Gemini-style) JSON schema: what a side call asks for."""
    if not isinstance(schema, dict):
        return {}
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        return {name: _example(inner) for name, inner in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 10
    if kind == "boolean":
        return False
    if schema.get("enum"):
        return schema["enum"][0]
    return "simple"


def _sse(event: str | None, data: Any) -> str:
    named = f"event: {event}\n" if event else ""
    return f"{named}data: {json.dumps(data)}\n\n"


@attrs.define
class _Answer:
    """One answer in one wire: a shell call (``tool``) or a short text."""

    wire: str
    model: str
    tool: str | None
    command: str
    number: int
    usage: tuple[int, int]

    @property
    def call_id(self) -> str:
        return f"call_{self.number:04d}"

    def arguments(self) -> dict[str, Any]:
        if self.given is not None:
            return dict(self.given)
        if self.tool in ("shell", "local_shell"):
            return {"command": ["bash", "-lc", self.command]}
        if self.tool in ("exec_command", "shell_command"):
            return (
                {"cmd": self.command} if self.tool == "exec_command" else {"command": self.command}
            )
        if self.tool == "Bash":
            return {"command": self.command, "description": "List files"}
        return {"command": self.command}

    text: str = "Done."
    given: dict[str, Any] | None = None

    def json(self) -> dict[str, Any]:
        given, made = self.usage
        if self.wire == "anthropic":
            content: list[dict[str, Any]] = (
                [
                    {
                        "type": "tool_use",
                        "id": self.call_id,
                        "name": self.tool,
                        "input": self.arguments(),
                    }
                ]
                if self.tool
                else [{"type": "text", "text": self.text}]
            )
            return {
                "id": f"msg_{self.number}",
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": content,
                "stop_reason": "tool_use" if self.tool else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": given, "output_tokens": made},
            }
        if self.wire == "responses":
            return self._response("completed")
        if self.wire == "gemini":
            return self._gemini(done=True)
        message: dict[str, Any] = {"role": "assistant", "content": None if self.tool else self.text}
        if self.tool:
            message["tool_calls"] = [
                {
                    "id": self.call_id,
                    "type": "function",
                    "function": {"name": self.tool, "arguments": json.dumps(self.arguments())},
                }
            ]
        return {
            "id": f"chatcmpl-{self.number}",
            "object": "chat.completion",
            "created": 1,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if self.tool else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": given,
                "completion_tokens": made,
                "total_tokens": given + made,
            },
        }

    def _output(self) -> list[dict[str, Any]]:
        if self.tool:
            namespace, _, name = self.tool.rpartition("/")  # Codex's MCP: mcp__gw/tool
            call = {
                "id": f"fc_{self.number}",
                "type": "function_call",
                "status": "completed",
                "call_id": self.call_id,
                "name": name,
                "arguments": json.dumps(self.arguments()),
            }
            if namespace:
                call["namespace"] = namespace
            return [call]
        return [
            {
                "id": f"msg_{self.number}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": self.text, "annotations": []}],
            }
        ]

    def _response(self, status: str, *, output: bool = True) -> dict[str, Any]:
        given, made = self.usage
        return {
            "id": f"resp_{self.number}",
            "object": "response",
            "created_at": 1,
            "status": status,
            "model": self.model,
            "output": self._output() if output else [],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": given,
                "output_tokens": made,
                "total_tokens": given + made,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }

    def _gemini(self, *, done: bool) -> dict[str, Any]:
        given, made = self.usage
        part: dict[str, Any] = (
            {"functionCall": {"name": self.tool, "args": self.arguments()}}
            if self.tool
            else {"text": self.text}
        )
        return {
            "candidates": [
                {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {
                "promptTokenCount": given,
                "candidatesTokenCount": made,
                "totalTokenCount": given + made,
            },
            "modelVersion": self.model,
        }

    def events(self) -> Iterator[str]:
        given, made = self.usage
        if self.wire == "anthropic":
            start: dict[str, Any] = {
                "id": f"msg_{self.number}",
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": given, "output_tokens": 1},
            }
            yield _sse("message_start", {"type": "message_start", "message": start})
            if self.tool:
                block = {"type": "tool_use", "id": self.call_id, "name": self.tool, "input": {}}
                yield _sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": 0, "content_block": block},
                )
                text = json.dumps(self.arguments())
                for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                    yield _sse(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "input_json_delta", "partial_json": piece},
                        },
                    )
            else:
                yield _sse(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
                yield _sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": self.text},
                    },
                )
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": "tool_use" if self.tool else "end_turn",
                        "stop_sequence": None,
                    },
                    "usage": {"output_tokens": made},
                },
            )
            yield _sse("message_stop", {"type": "message_stop"})
            return
        if self.wire == "responses":
            sequence = iter(range(1000))

            def event(kind: str, **payload: Any) -> str:
                return _sse(kind, {"type": kind, "sequence_number": next(sequence), **payload})

            yield event("response.created", response=self._response("in_progress", output=False))
            yield event(
                "response.in_progress", response=self._response("in_progress", output=False)
            )
            [item] = self._output()
            yield event(
                "response.output_item.added",
                output_index=0,
                item={**item, "status": "in_progress"}
                if self.tool
                else {**item, "status": "in_progress", "content": []},
            )
            if self.tool:
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=0,
                    delta=item["arguments"],
                )
                yield event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=0,
                    arguments=item["arguments"],
                )
            else:
                part = {"type": "output_text", "text": "", "annotations": []}
                ids = {"item_id": item["id"], "output_index": 0, "content_index": 0}
                yield event("response.content_part.added", **ids, part=part)
                yield event("response.output_text.delta", **ids, delta=self.text, logprobs=[])
                yield event("response.output_text.done", **ids, text=self.text, logprobs=[])
                yield event("response.content_part.done", **ids, part={**part, "text": self.text})
            yield event("response.output_item.done", output_index=0, item=item)
            yield event("response.completed", response=self._response("completed"))
            return
        if self.wire == "gemini":
            whole = self._gemini(done=True)
            if not self.tool and len(self.text) > 1:  # text in two chunks, usage on the last
                first = json.loads(json.dumps(whole))
                first["candidates"][0]["content"]["parts"] = [{"text": self.text[:2]}]
                del first["candidates"][0]["finishReason"], first["usageMetadata"]
                yield _sse(None, first)
                whole["candidates"][0]["content"]["parts"] = [{"text": self.text[2:]}]
            yield _sse(None, whole)
            return
        chunk = {
            "id": f"chatcmpl-{self.number}",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": self.model,
        }
        if self.tool:
            call = {
                "index": 0,
                "id": self.call_id,
                "type": "function",
                "function": {"name": self.tool, "arguments": ""},
            }
            yield _sse(
                None,
                {
                    **chunk,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "tool_calls": [call]},
                            "finish_reason": None,
                        }
                    ],
                },
            )
            yield _sse(
                None,
                {
                    **chunk,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "function": {"arguments": json.dumps(self.arguments())},
                                    }
                                ]
                            },
                            "finish_reason": None,
                        }
                    ],
                },
            )
            yield _sse(
                None,
                {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            )
        else:
            yield _sse(
                None,
                {
                    **chunk,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": self.text},
                            "finish_reason": None,
                        }
                    ],
                },
            )
            yield _sse(
                None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            )
        yield _sse(
            None,
            {
                **chunk,
                "choices": [],
                "usage": {
                    "prompt_tokens": given,
                    "completion_tokens": made,
                    "total_tokens": given + made,
                },
            },
        )
        yield "data: [DONE]\n\n"
