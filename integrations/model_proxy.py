"""``guardstack model-proxy``: guards for an agent you cannot change, at its base URL.

An OpenAI-compatible server (``POST /v1/chat/completions``, JSON and SSE streams;
``GET /v1/models``) — and Anthropic's ``POST /v1/messages`` — in front of an upstream
provider. Every request goes through
the assembled stack:

* **the model stage** — ``Retry`` (honouring the upstream's Retry-After), timeouts,
  a breaker, rate and adaptive limits, ``UsageLimit`` and ``ModelCallLimit``: the
  upstream call is the model;
* **the conversation's guards** — the tool calls and results in the request's
  history are fed to the tool stages once each (a history arrives with every
  request), as calls of the conversation's current turn (a new person's message
  starts a new turn): a reminder is appended to the forwarded request as a user
  message; a denial or an end of turn — the calls already ran at the client, so the
  next reply is a stop — is answered as an assistant message naming the guard, with
  ``finish_reason: "stop"`` and an ``x-guardstack-stopped`` header.

The conversation is the ``x-guardstack-conversation`` header, else a digest of the
client's key, the system prompt and the first user message. Passthrough is exact:
with nothing to add, the upstream gets the client's body byte for byte, and the
client the upstream's response — a stream chunk by chunk, as it arrives; an
upstream error keeps its status and body. The upstream key comes from the
environment only (``--upstream-key-env``), is never logged, and a client's own key
is never forwarded. Requests over ``max_body_bytes`` are refused (413).

A stream is relayed inside the model call, so every model-stage layer sees the whole
call: its duration, and the usage the stream reports (OpenAI's ``include_usage``
chunk, Anthropic's message events), which the caps and calendar windows settle. A
``Retry`` retries only before a stream's first byte reaches the client; an upstream
stream that breaks after it breaks the client's too. With
``client_keys`` (key -> tenant), an unknown key is refused (401) and each
conversation's calls count in its key's tenant's ``UsageLimit`` windows. On the
Messages API a reminder is a text block added to the last user message, after its
tool results (the roles must alternate). Other upstreams, by name, are what a
model-stage ``Fallback(to={"upstream": NAME})`` sends a failed request to. The OpenAI
Responses API is out of scope for now.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import logging
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping
from types import SimpleNamespace
from typing import Any, Final

import anyio
import attrs

from guardstack.integrations._extras import require
from guardstack.integrations.anthropic import _usage
from guardstack.pipeline import (
    MODEL_FAILED,
    MODEL_OVERLOADED,
    MODEL_RATE_LIMITED,
    MODEL_UNAVAILABLE,
    Agent,
    Harness,
    ModelError,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolDefinition,
    ToolResult,
    TurnBlocked,
    Usage,
)
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.values import TOOL_DENIED

__all__ = ["ModelProxy"]

logger = logging.getLogger(__name__)

EXTRA = "proxy"
STOPPED_HEADER = "x-guardstack-stopped"
CONVERSATION_HEADER = "x-guardstack-conversation"


DEFAULT = "default"


class _Target:
    """One upstream: its client (a connection pool) and its key."""

    def __init__(self, httpx: Any, name: str, url: str, key: str | None) -> None:
        self.name, self.url, self.key = name, url.rstrip("/"), key
        self.client = httpx.AsyncClient(base_url=self.url, timeout=None)


class _Upstream:
    """The model the stack's model stage calls: one POST of the (forwarded) body.

    A JSON answer is kept for passthrough (``answer``). A stream is relayed to the
    client as it arrives, inside the call — so the model stage's layers see the whole
    call, its duration and the usage the stream reports — through ``send`` (the ASGI
    channel); once its first byte has gone, the call is never made again (a retry or
    fallback then fails ``MODEL_FAILED``)."""

    model = "upstream"

    def __init__(
        self, proxy: ModelProxy, wire: _Wire, body: bytes, stream: bool, headers: Mapping[str, str]
    ) -> None:
        self.proxy, self.wire, self.body, self.stream = proxy, wire, body, stream
        self.client_headers = headers
        #: The last upstream answer that was not relayed: (status, body, content type).
        self.answer: tuple[int, bytes, str | None] | None = None
        self.send: Any = None
        self.started = False  # a byte of a streamed reply has reached the client

    def upstream(self, name: str, *, model: str | None = None) -> _Via:
        """The same request to the upstream ``name`` (``Fallback(to={"upstream": …})``)."""
        return _Via(self, name, model)

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        return await self.post(self.proxy.upstreams[DEFAULT], None)

    async def post(self, target: _Target, model: str | None) -> ModelReply:
        if self.started:
            raise ModelError(
                "the reply had begun reaching the client: the request is not made again",
                MODEL_FAILED,
            )
        body = self.body
        if model is not None:
            data = json.loads(body)
            data["model"] = model
            body = json.dumps(data).encode()
        headers = self.wire.headers(target.key, self.client_headers)
        request = target.client.build_request("POST", self.wire.path, content=body, headers=headers)
        try:
            response = await target.client.send(request, stream=True)
        except self.proxy.httpx.TransportError as error:
            self.answer = None
            raise ModelError(
                f"upstream {target.name!r} unreachable ({type(error).__name__})", MODEL_UNAVAILABLE
            ) from error
        try:
            if response.status_code >= 400 or not self.stream:
                content = await response.aread()
                self.answer = (
                    response.status_code,
                    content,
                    response.headers.get("content-type"),
                )
                if response.status_code >= 400:
                    raise _model_error(response)
                return self.wire.reply_of(content)
            return await self._relay(response)
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()

    async def _relay(self, response: Any) -> ModelReply:
        """The upstream's stream to the client, chunk by chunk as it arrives; the usage it
        reports (OpenAI's ``include_usage`` chunk, Anthropic's message events)."""
        pending = b""
        usage: Usage | None = None
        try:
            async for chunk in response.aiter_raw():
                if not chunk:
                    continue
                if not self.started:
                    self.started = True
                    media = response.headers.get("content-type", "text/event-stream")
                    await self.send(
                        {
                            "type": "http.response.start",
                            "status": response.status_code,
                            "headers": [(b"content-type", media.encode())],
                        }
                    )
                await self.send({"type": "http.response.body", "body": chunk, "more_body": True})
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    usage = self.wire.usage_in(line, usage)
        except self.proxy.httpx.TransportError as error:
            code = MODEL_FAILED if self.started else MODEL_UNAVAILABLE
            raise ModelError(
                f"the upstream's stream broke ({type(error).__name__})", code
            ) from error
        return ModelReply("", usage=usage)


class _Via:
    """The request, sent to another of the proxy's upstreams (a ``Fallback``'s target)."""

    def __init__(self, upstream: _Upstream, name: str, model: str | None) -> None:
        self.upstream, self.name, self.model = upstream, name, model

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        target = self.upstream.proxy.upstreams.get(self.name)
        if target is None:
            raise ModelError(f"no upstream named {self.name!r}", MODEL_FAILED)
        return await self.upstream.post(target, self.model)


def _model_error(response: Any) -> ModelError:
    status = response.status_code
    retry_after = response.headers.get("retry-after")
    wait = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None
    code = (
        MODEL_RATE_LIMITED
        if status == 429
        else MODEL_OVERLOADED
        if status == 529
        else MODEL_UNAVAILABLE
        if status >= 500
        else MODEL_FAILED
    )
    return ModelError(f"upstream answered {status}", code, retry_after_s=wait)


class _Wire:
    """One provider API's shape: where requests go, and how calls, reminders, replies and
    stops are written in it."""

    name = ""
    path = ""

    def headers(self, key: str | None, client: Mapping[str, str]) -> dict[str, str]:
        raise NotImplementedError

    def calls(self, messages: list[Any]) -> Iterator[tuple[str, str, Any, str]]:
        """The history's answered tool calls: ``(id, name, arguments, result text)``."""
        raise NotImplementedError

    def remind(self, messages: list[Any], reminders: list[str]) -> list[Any]:
        raise NotImplementedError

    def reply_of(self, content: bytes) -> ModelReply:
        raise NotImplementedError

    def stop_body(self, model: str, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def stop_events(self, model: str, text: str) -> list[tuple[str | None, dict[str, Any]]]:
        raise NotImplementedError

    def usage_in(self, line: bytes, so_far: Usage | None) -> Usage | None:
        """The usage a stream has reported, after one more of its lines."""
        return so_far

    def prompts(self, messages: list[Any]) -> int:
        """How many of the history's messages a person wrote (a new one: a new turn)."""
        return sum(1 for message in messages if message.get("role") == "user")


class _OpenAI(_Wire):
    name, path = "openai", "/v1/chat/completions"

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
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    arguments = function.get("arguments") or ""
                yield (
                    str(call_id),
                    str(function.get("name", "")),
                    arguments,
                    _text(results[call_id]),
                )

    def remind(self, messages: list[Any], reminders: list[str]) -> list[Any]:
        return [*messages, *({"role": "user", "content": text} for text in reminders)]

    def reply_of(self, content: bytes) -> ModelReply:
        try:
            data = json.loads(content)
            message = data["choices"][0]["message"]
            usage = data.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError):
            return ModelReply("")
        return ModelReply(
            message.get("content") or "",
            usage=Usage(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))),
            model=data.get("model"),
        )

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

    def usage_in(self, line: bytes, so_far: Usage | None) -> Usage | None:
        if not line.startswith(b"data: {") or b'"usage"' not in line:
            return so_far
        try:
            reported = json.loads(line[6:]).get("usage") or {}
            return Usage(
                int(reported.get("prompt_tokens", 0)), int(reported.get("completion_tokens", 0))
            )
        except (ValueError, TypeError, AttributeError):
            return so_far


class _Anthropic(_Wire):
    """Anthropic's Messages API: tool calls are ``tool_use`` blocks, their results
    ``tool_result`` blocks of the next user message; a reminder is a text block added
    to the last user message (the roles must alternate)."""

    name, path = "anthropic", "/v1/messages"

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

    def calls(self, messages: list[Any]) -> Iterator[tuple[str, str, Any, str]]:
        results: dict[str, str] = {}
        for message in messages:
            if message.get("role") == "user" and isinstance(message.get("content"), list):
                for block in message["content"]:
                    if isinstance(block, Mapping) and block.get("type") == "tool_result":
                        results[str(block.get("tool_use_id"))] = _text(block.get("content"))
        for message in messages:
            if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
                continue
            for block in message["content"]:
                if isinstance(block, Mapping) and block.get("type") == "tool_use":
                    call_id = str(block.get("id"))
                    if call_id in results:
                        yield (
                            call_id,
                            str(block.get("name", "")),
                            block.get("input") or {},
                            (results[call_id]),
                        )

    def prompts(self, messages: list[Any]) -> int:
        def from_a_person(message: Any) -> bool:
            content = message.get("content")
            if isinstance(content, str):
                return True
            return any(
                isinstance(block, Mapping) and block.get("type") != "tool_result"
                for block in content or ()
            ) and not any(
                isinstance(block, Mapping) and block.get("type") == "tool_result"
                for block in content or ()
            )

        return sum(1 for m in messages if m.get("role") == "user" and from_a_person(m))

    def remind(self, messages: list[Any], reminders: list[str]) -> list[Any]:
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
            return [*messages[:-1], last]
        return [*messages, {"role": "user", "content": blocks}]

    def reply_of(self, content: bytes) -> ModelReply:
        try:
            data = json.loads(content)
            text = "".join(
                block.get("text", "")
                for block in data.get("content") or ()
                if block.get("type") == "text"
            )
            usage = data.get("usage") or {}
        except (ValueError, TypeError, AttributeError):
            return ModelReply("")
        return ModelReply(text, usage=_anthropic_usage(usage), model=data.get("model"))

    def usage_in(self, line: bytes, so_far: Usage | None) -> Usage | None:
        """``message_start`` carries the input tokens, each ``message_delta`` the output
        so far (and, lately, the input too)."""
        if not line.startswith(b"data: {") or b'"usage"' not in line:
            return so_far
        try:
            event = json.loads(line[6:])
            if event.get("type") == "message_start":
                reported = event["message"].get("usage") or {}
            elif event.get("type") == "message_delta":
                reported = event.get("usage") or {}
            else:
                return so_far
            if so_far is not None and "input_tokens" not in reported:
                return attrs.evolve(so_far, output_tokens=reported.get("output_tokens", 0))
            return _anthropic_usage(reported)
        except (ValueError, TypeError, AttributeError, KeyError):
            return so_far

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


def _anthropic_usage(reported: Mapping[str, Any]) -> Usage | None:
    """The Messages API's usage as guardstack counts it (the adapter's own rule: input
    counts cache reads and writes too)."""
    return _usage(SimpleNamespace(**reported))


OPENAI: Final = _OpenAI()
ANTHROPIC: Final = _Anthropic()


def _text(content: Any) -> str:
    """A tool result's text: a string, or the text blocks of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def _stop(wire: _Wire, stopped: tuple[str, str], data: Mapping[str, Any], stream: bool) -> Any:
    """The stop a guard asked for, as the assistant's reply (``finish_reason: stop`` /
    ``stop_reason: end_turn``), naming the plugin in ``x-guardstack-stopped``."""
    from starlette.responses import JSONResponse, StreamingResponse

    plugin, text = stopped
    content = f"Stopped by {plugin}: {text}"
    headers = {STOPPED_HEADER: plugin}
    model = str(data.get("model", "guardstack"))
    if not stream:
        return JSONResponse(wire.stop_body(model, content), headers=headers)

    async def events() -> AsyncIterator[bytes]:
        for event, payload in wire.stop_events(model, content):
            named = f"event: {event}\n" if event else ""
            yield f"{named}data: {json.dumps(payload)}\n\n".encode()
        if wire is OPENAI:
            yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


class ModelProxy:
    """The proxy's app (``.app``, a Starlette application) over ``harness``'s stack.

    ``upstream`` is the default upstream's base URL; ``upstreams`` names others
    (name -> URL) for ``Fallback(stage="model", to={"upstream": NAME})``, with their keys
    in ``upstream_keys``. Every ``Fallback`` in the stack must name one of them.
    """

    def __init__(
        self,
        harness: Harness,
        upstream: str,
        *,
        upstream_key: str | None = None,
        upstreams: Mapping[str, str] | None = None,
        upstream_keys: Mapping[str, str] | None = None,
        client_keys: Mapping[str, str] | None = None,
        max_body_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.httpx = require("httpx", EXTRA)
        require("starlette", EXTRA)
        self.harness = harness
        keys = dict(upstream_keys or {})
        self.upstreams: dict[str, _Target] = {
            DEFAULT: _Target(self.httpx, DEFAULT, upstream, upstream_key),
        }
        for name, url in (upstreams or {}).items():
            if name in self.upstreams:
                raise ConfigError(
                    f"model-proxy: two upstreams are named {name!r}", key="upstream", value=name
                )
            self.upstreams[name] = _Target(self.httpx, name, url, keys.get(name))
        _check_fallbacks(harness, self.upstreams)
        self.upstream = self.upstreams[DEFAULT].url
        self.client = self.upstreams[DEFAULT].client
        self.max_body_bytes = max_body_bytes
        #: Client key -> tenant; ``None``: any client, one tenant.
        self.client_keys = dict(client_keys) if client_keys is not None else None
        self.agents: dict[str, Agent] = {}
        self.seen: weakref.WeakKeyDictionary[Agent, _Seen] = weakref.WeakKeyDictionary()
        self.app = self._build()

    async def aclose(self) -> None:
        for target in self.upstreams.values():
            await target.client.aclose()

    def _build(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    async def _models(self, request: Any) -> Any:
        from starlette.responses import Response

        target = self.upstreams[DEFAULT]
        headers = OPENAI.headers(target.key, {})
        answer = await target.client.get("/v1/models", headers=headers)
        return Response(
            answer.content,
            answer.status_code,
            media_type=answer.headers.get("content-type"),
        )

    async def _chat(self, request: Any) -> Any:
        return await self._proxy(request, OPENAI)

    async def _messages(self, request: Any) -> Any:
        return await self._proxy(request, ANTHROPIC)

    async def _proxy(self, request: Any, wire: _Wire) -> Any:
        from starlette.responses import JSONResponse, Response

        tenant = None
        if self.client_keys is not None:
            offered = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            offered = offered or request.headers.get("x-api-key", "")
            tenant = self.client_keys.get(offered)
            if tenant is None:
                return JSONResponse({"error": {"message": "unknown client key"}}, 401)
        body = await request.body()
        if len(body) > self.max_body_bytes:
            return JSONResponse({"error": {"message": "request too large"}}, 413)
        try:
            data = json.loads(body)
            messages = data["messages"]
            if not isinstance(messages, list):
                raise TypeError("messages")  # noqa: TRY301
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": {"message": "not a chat completions request"}}, 400)
        stream = bool(data.get("stream"))
        agent = self._agent(request, messages)
        agent.tenant = tenant
        await self._start_turn_if_new(agent, wire, messages)
        stopped, reminders = await self._guard(agent, wire, messages)
        if stopped is not None:
            return _stop(wire, stopped, data, stream)
        forwarded = body
        if reminders:  # only then is the body rebuilt
            data["messages"] = wire.remind(messages, reminders)
            forwarded = json.dumps(data).encode()
        upstream = _Upstream(self, wire, forwarded, stream, request.headers)
        call = ModelRequest(agent, messages, data.get("tools") or [], model=upstream)
        exchange = _Exchange(self, agent, call, upstream, data)
        if stream:
            return exchange  # an ASGI response: the stream goes out from inside the call
        try:
            reply = await _unless_gone(request.receive, exchange.run())
        except TurnBlocked as blocked:
            return exchange.stopped(blocked)
        except ModelError:
            return exchange.failed()
        if reply is None:  # the client went away: so did the upstream request
            return Response(b"", 499)
        status, content, media = upstream.answer or (502, b"", None)
        return Response(content, status, media_type=media)

    # -- the conversation ------------------------------------------------------------------

    def _agent(self, request: Any, messages: list[Any]) -> Agent:
        named = request.headers.get(CONVERSATION_HEADER)
        if named is None:
            key = request.headers.get("authorization") or request.headers.get("x-api-key", "")
            system = next((m.get("content") for m in messages if m.get("role") == "system"), "")
            first = next((m.get("content") for m in messages if m.get("role") == "user"), "")
            seed = json.dumps([key, system, first], sort_keys=True, default=str)
            named = hashlib.sha256(seed.encode()).hexdigest()[:16]
        agent = self.agents.get(named)
        if agent is None:
            agent = self.agents[named] = self.harness.loop.create(named, model=_Nothing())
        return agent

    async def _start_turn_if_new(self, agent: Agent, wire: _Wire, messages: list[Any]) -> None:
        """A new person's message (the history's last message is the user's, after an
        answer or at the start) starts a new turn: the per-turn guards reset."""
        seen = self.seen.get(agent)
        prompts = wire.prompts(messages)
        if seen is None:
            seen = self.seen[agent] = _Seen()
        if prompts != seen.prompts:
            seen.prompts = prompts
            await self.harness.loop.prompt_submit(agent, str(messages[-1].get("content", "")))
            agent.turn_usage = Usage()

    async def _guard(
        self, agent: Agent, wire: _Wire, messages: list[Any]
    ) -> tuple[tuple[str, str] | None, list[str]]:
        """Feed the history's calls the guards have not seen through the tool stages:
        the stop (plugin, text) if one refuses, and the reminders."""
        seen = self.seen[agent]
        reminders: list[str] = []
        for call_id, name, arguments, content in wire.calls(messages):
            if call_id in seen.calls:
                continue
            seen.calls.add(call_id)
            outcome = await self.harness.tools.execute(
                ToolCall(name, arguments, call_id, agent),
                tool=ToolDefinition(name, _answered(content)),
            )
            reminders.extend(context.text for context in outcome.contexts)
            if outcome.result.code == TOOL_DENIED or outcome.ends_turn:
                text = outcome.result.error.message if outcome.result.error else ""
                return (_plugin_of(text), text), reminders
        return None, reminders


class _Seen:
    """What the guards have seen of one conversation: its calls, its prompts."""

    def __init__(self) -> None:
        self.calls: set[Any] = set()
        self.prompts = 0


class _Nothing:
    """The conversation agent's own model: never called (each request names the upstream)."""

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        raise ModelError("the proxy's agents have no model of their own", MODEL_FAILED)


def _answered(content: str) -> Any:
    async def already_ran(arguments: Any, call: ToolCall) -> ToolResult:
        return ToolResult(content)  # the client ran it: this is what it answered

    return already_ran


def _plugin_of(text: str) -> str:
    """The plugin a refusal's text names (``tool-call-limit: …``), else ``guardstack``."""
    head = text.split(":", 1)[0].strip()
    if head and " " not in head:
        return head
    if text.startswith("tool call limit"):
        return "tool-call-limit"
    return "guardstack"


async def _unless_gone(receive: Any, work: Any) -> Any:
    """``await work``, or ``None`` as soon as the client disconnects (``work`` is then
    cancelled: the upstream request stops, mid-stream or waiting for its first byte)."""
    answer = None
    try:
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()

            group.start_soon(watch)
            answer = await work
            group.cancel_scope.cancel()
    except BaseExceptionGroup as failed:  # the work's own error, as itself
        if len(failed.exceptions) == 1:
            raise failed.exceptions[0] from None
        raise
    return answer


class _Exchange:
    """One request through the model stage. For a stream, also its ASGI response: the
    chain runs inside it, the upstream's chunks go out as they arrive, and a stop or an
    error before the first of them is answered whole instead."""

    def __init__(
        self,
        proxy: ModelProxy,
        agent: Agent,
        call: ModelRequest,
        upstream: _Upstream,
        data: Mapping[str, Any],
    ) -> None:
        self.proxy, self.agent, self.call, self.upstream, self.data = (
            proxy,
            agent,
            call,
            upstream,
            data,
        )

    async def run(self) -> ModelReply:
        reply: ModelReply = await self.proxy.harness.loop.model_call._chain(self.call)
        if isinstance(reply, ModelReply) and reply.usage is not None:
            self.proxy.harness.loop.charge(self.agent, reply.usage)
        return reply

    def stopped(self, blocked: TurnBlocked) -> Any:
        text = str(blocked)
        return _stop(self.upstream.wire, (_plugin_of(text), text), self.data, self.upstream.stream)

    def failed(self) -> Any:
        """The upstream's own error, status and body, or 502 when none answered."""
        from starlette.responses import JSONResponse, Response

        if self.upstream.answer is None:
            return JSONResponse({"error": {"message": "upstream unreachable"}}, 502)
        status, content, media = self.upstream.answer
        return Response(content, status, media_type=media)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.responses import Response

        self.upstream.send = send
        instead: Any = None
        try:
            await _unless_gone(receive, self.run())
        except TurnBlocked as blocked:
            instead = self.stopped(blocked)
        except ModelError:
            instead = self.failed()
        if not self.upstream.started:
            if instead is None:  # an empty stream: answered empty, as it came
                status, content, media = self.upstream.answer or (200, b"", None)
                instead = Response(content, status, media_type=media or "text/event-stream")
            await instead(scope, receive, send)
        elif instead is None:
            with anyio.CancelScope(shield=True), contextlib.suppress(OSError):  # a client gone
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:  # the upstream's stream broke after its first bytes went out: the client's
            # breaks too (its response is left incomplete; the server drops the connection)
            logger.warning(
                "model-proxy: the upstream's stream broke after it began reaching the client; "
                "the client's stream is cut too"
            )


def _check_fallbacks(harness: Harness, upstreams: Mapping[str, _Target]) -> None:
    """Every ``Fallback(to={"upstream": NAME})`` in the stack names a known upstream."""
    from guardstack.wrappers import Fallback

    for handle in harness.plugins:
        plugin = handle.plugin
        if isinstance(plugin, Fallback) and isinstance(plugin.to, Mapping):
            name = plugin.to["upstream"]
            if name not in upstreams:
                known = [n for n in upstreams if n != DEFAULT]
                near = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ConfigError(
                    f"{handle.id}: `to.upstream` names {name!r}, which is not an upstream "
                    f"(--upstream NAME=URL gives: {', '.join(known) or 'none'}){hint}",
                    plugin=handle.id,
                    key="to.upstream",
                    value=name,
                )
