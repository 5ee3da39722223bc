"""The proxy's application: the gate, the routes, and one request through the stack."""

from __future__ import annotations

import contextlib
import difflib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from typing import Any

import anyio

from guardstack.integrations._admin import Admin
from guardstack.integrations._extras import require
from guardstack.integrations._gate import Gate, Refused
from guardstack.integrations.model_proxy.conversations import Conversation, Conversations, named
from guardstack.integrations.model_proxy.owners import ResponseOwners, unattributable
from guardstack.integrations.model_proxy.responses import RESPONSES
from guardstack.integrations.model_proxy.upstream import DEFAULT, Target, Upstream
from guardstack.integrations.model_proxy.wires import ANTHROPIC, OPENAI, Malformed, Wire, parse
from guardstack.pipeline import (
    MODEL_FAILED,
    MODEL_RATE_LIMITED,
    MODEL_TIMEOUT,
    Agent,
    Harness,
    ModelError,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolDefinition,
    ToolResult,
    TurnBlocked,
)
from guardstack.pipeline.errors import ConfigError
from guardstack.pipeline.ledger import Ledger
from guardstack.pipeline.validate import in_ms, integer, number
from guardstack.pipeline.values import TOOL_DENIED

__all__ = ["CONVERSATION_HEADER", "STOPPED_HEADER", "ModelProxy"]

logger = logging.getLogger("guardstack")

EXTRA = "proxy"
STOPPED_HEADER = "x-guardstack-stopped"
CONVERSATION_HEADER = "x-guardstack-conversation"


def _stop(wire: Wire, stopped: tuple[str, str], data: Mapping[str, Any], stream: bool) -> Any:
    """The stop a guard asked for, as the assistant's reply (``finish_reason: stop`` /
    ``stop_reason: end_turn``), naming the plugin in ``x-guardstack-stopped``."""
    import json

    from starlette.responses import JSONResponse, StreamingResponse

    plugin, text = stopped
    content = f"Stopped by {plugin}: {text}"
    headers = {STOPPED_HEADER: plugin}
    model = str(data.get("model", "guardstack"))
    if not stream:
        return JSONResponse(wire.stop_body(model, content), headers=headers)

    async def events() -> AsyncIterator[bytes]:
        for event, payload in wire.stop_events(model, content):
            named_event = f"event: {event}\n" if event else ""
            yield f"{named_event}data: {json.dumps(payload)}\n\n".encode()
        if wire.done_line():
            yield wire.done_line()

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


class ModelProxy:
    """The proxy's app (``.app``, a Starlette application) over ``harness``'s stack.

    ``upstream`` is the default upstream's base URL; ``upstreams`` names others
    (name -> URL) for ``Fallback(stage="model", to={"upstream": NAME})``, with their keys
    in ``upstream_keys``. Every ``Fallback`` in the stack must name one of them.
    ``client_keys`` maps each client key to its tenant (``None``: any client, one
    tenant); ``allow_origins`` and ``allow_hosts`` are the browsers' origins and the
    host names it answers beyond loopback and ``listen_host``.
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
        listen_host: str = "127.0.0.1",
        allow_origins: Collection[str] = (),
        allow_hosts: Collection[str] = (),
        drain_ms: int = 10_000,
        conversation_idle_ms: float = 3_600_000.0,
        max_conversations: int = 10_000,
        admin_key: str | None = None,
        conversation_idle_s: float | None = None,
    ) -> None:
        self.httpx = require("httpx", EXTRA)
        require("starlette", EXTRA)
        owner = "model-proxy"
        integer(owner, "max_body_bytes", max_body_bytes)
        integer(owner, "drain_ms", drain_ms, minimum=0)
        integer(owner, "max_conversations", max_conversations)
        idle_ms = in_ms(owner, "conversation_idle", conversation_idle_s, conversation_idle_ms)
        number(owner, "conversation_idle_ms", idle_ms, minimum=1e-6)
        self.harness = harness
        keys = dict(upstream_keys or {})
        self.upstreams: dict[str, Target] = {
            DEFAULT: Target(self.httpx, DEFAULT, upstream, upstream_key),
        }
        for name, url in (upstreams or {}).items():
            if name in self.upstreams:
                raise ConfigError(
                    f"model-proxy: two upstreams are named {name!r}", key="upstream", value=name
                )
            self.upstreams[name] = Target(self.httpx, name, url, keys.get(name))
        _check_fallbacks(harness, self.upstreams)
        self.upstream = self.upstreams[DEFAULT].url
        self.client = self.upstreams[DEFAULT].client
        self.max_body_bytes = max_body_bytes
        #: Client key -> tenant; ``None``: any client, one tenant.
        self.client_keys = dict(client_keys) if client_keys is not None else None
        self.gate = Gate(
            listen_host=listen_host,
            keys=self.client_keys,
            allow_origins=tuple(allow_origins),
            allow_hosts=tuple(allow_hosts),
            max_body_bytes=max_body_bytes,
        )
        self.drain_s = drain_ms / 1000
        self.conversations = Conversations(
            lambda session: self.harness.loop.create(session, model=_Nothing()),
            idle_s=idle_ms / 1000,
            most=max_conversations,
        )
        #: Which tenant each stored response belongs to (``None``: a store with no ledger).
        self.owners = ResponseOwners(harness.store) if isinstance(harness.store, Ledger) else None
        self.app = self._build()
        if admin_key is not None:  # harness.control at /admin/control, behind its key
            self.app = Admin(harness.control, admin_key, self.gate).around(self.app)

    async def aclose(self) -> None:
        for target in self.upstreams.values():
            await target.client.aclose()

    def _build(self) -> Any:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route

        async def http_error(request: Any, error: Exception) -> Any:
            status = getattr(error, "status_code", 500)
            kind = "not_found" if status == 404 else "invalid_request"
            return self._error(_wire_of(request), status, kind, str(getattr(error, "detail", "")))

        async def crashed(request: Any, error: Exception) -> Any:
            logger.error("model-proxy: a request failed inside the proxy", exc_info=error)
            return self._error(_wire_of(request), 500, "server", "the proxy failed this request")

        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._route(OPENAI), methods=["POST"]),
                Route("/v1/messages", self._route(ANTHROPIC), methods=["POST"]),
                Route("/v1/responses", self._route(RESPONSES), methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ],
            exception_handlers={HTTPException: http_error, Exception: crashed},
        )

    def _error(self, wire: Wire, status: int, kind: str, message: str) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(wire.error_body(status, kind, message), status)

    def _refused(self, wire: Wire, error: ModelError) -> Any:
        """A layer's refusal as the status a client's retry logic understands: 429 for a
        rate limit, 503 for an open breaker or a full limit — with ``Retry-After`` when
        the layer said when to come back."""
        from starlette.responses import JSONResponse

        status = 429 if error.code == MODEL_RATE_LIMITED else 503
        kind = "rate_limit" if status == 429 else "overloaded"
        headers = {}
        if error.retry_after_s:
            headers["retry-after"] = str(max(1, math.ceil(error.retry_after_s)))
        return JSONResponse(wire.error_body(status, kind, error.message), status, headers=headers)

    def _route(self, wire: Wire) -> Callable[[Any], Awaitable[Any]]:
        async def route(request: Any) -> Any:
            try:
                return await self._proxy(request, wire)
            except Refused as refused:
                return self._error(wire, refused.status, refused.kind, refused.message)
            except Malformed as malformed:
                return self._error(wire, 400, "invalid_request", str(malformed))

        return route

    async def _models(self, request: Any) -> Any:
        from starlette.responses import Response

        try:
            self.gate.check(request.headers, "GET")
        except Refused as refused:
            return self._error(OPENAI, refused.status, refused.kind, refused.message)
        target = self.upstreams[DEFAULT]
        try:
            answer = await target.client.get("/v1/models", headers=OPENAI.headers(target.key, {}))
        except self.httpx.TransportError:
            return self._error(OPENAI, 502, "upstream", "the upstream is unreachable")
        return Response(
            answer.content, answer.status_code, media_type=answer.headers.get("content-type")
        )

    async def _proxy(self, request: Any, wire: Wire) -> Any:
        from starlette.responses import Response

        tenant = self.gate.check(request.headers, "POST")
        body = await self.gate.read(request.stream())
        data = parse(body)
        wire.check(data)
        if tenant is not None:
            refused = await self._reaches_another(wire, tenant, data)
            if refused is not None:
                return refused
        messages = wire.messages(data)
        stream = bool(data.get("stream"))
        conversation, fresh = self.conversations.get(
            tenant, named(request.headers, CONVERSATION_HEADER, messages)
        )
        agent = conversation.agent
        agent.tenant = tenant
        if fresh:  # met again after it was freed: only its current turn is new here
            before = wire.turn_start(messages)
            conversation.calls.update(call_id for call_id, *_ in wire.calls(messages[:before]))
        await self._start_turn_if_new(conversation, wire, messages)
        stopped, reminders = await self._guard(conversation, wire, messages)
        if stopped is not None:
            return _stop(wire, stopped, data, stream)
        agent.start_step()  # each request forwarded is one step of the conversation's turn
        forwarded, changed = data, False
        if reminders:
            forwarded, changed = wire.remind(forwarded, reminders), True
        asked = wire.ask_for_usage(forwarded) if stream else None
        if asked is not None:
            forwarded, changed = asked, True
        import json

        upstream = Upstream(
            self,
            wire,
            forwarded,
            json.dumps(forwarded).encode() if changed else body,  # exact unless changed
            request.headers,
            messages=wire.messages(forwarded),
        )
        upstream.strip_usage = asked is not None
        upstream.tenant = tenant
        call = ModelRequest(agent, upstream.messages, forwarded.get("tools") or [], model=upstream)
        exchange = _Exchange(self, agent, call, upstream, data)
        if stream:
            return exchange  # an ASGI response: the stream goes out from inside the call
        try:
            reply = await exchange.until_done(request.receive)
        except TurnBlocked as blocked:
            return exchange.stopped(blocked)
        except ModelError as error:
            return exchange.failed(error)
        if reply is None:  # the client went away and the upstream did not answer in time
            return Response(b"", 499)
        status, content, media = upstream.answer or (502, b"", None)
        return Response(content, status, media_type=media)

    async def _reaches_another(
        self, wire: Wire, tenant: str, data: Mapping[str, Any]
    ) -> Any | None:
        """The answer to a request that names provider-side state that is not its
        tenant's (``owners``), or ``None``: a stored response of another tenant is one
        the provider does not know (404); state the proxy cannot attribute, a 400."""
        field = unattributable(data)
        if field is not None:
            return self._error(
                wire,
                400,
                "invalid_request",
                f"{field} names state stored at the provider, which this gateway cannot "
                "tell is yours; send the content itself",
            )
        previous = data.get("previous_response_id")
        if wire is not RESPONSES or not isinstance(previous, str) or not previous:
            return None
        try:
            owned = self.owners is not None and await self.owners.owns(previous, tenant)
        except Exception:
            logger.warning("model-proxy: the store did not say whose response %s is", previous)
            return self._error(
                wire, 503, "overloaded", "the gateway cannot check this response id now"
            )
        if owned:
            return None
        from starlette.responses import JSONResponse

        missing = {
            "error": {
                "message": f"Previous response with id '{previous}' not found.",
                "type": "invalid_request_error",
                "param": "previous_response_id",
                "code": "previous_response_not_found",
            }
        }
        return JSONResponse(missing, 404)

    # -- the conversation ------------------------------------------------------------------

    async def _start_turn_if_new(
        self, conversation: Conversation, wire: Wire, messages: list[Any]
    ) -> None:
        """A new person's message starts a new turn: the last one ends, per-turn guards
        start again."""
        prompts = wire.prompts(messages)
        if prompts == conversation.prompts:
            return
        agent, loop = conversation.agent, self.harness.loop
        if conversation.prompts >= 0:
            await loop.turn_ended(agent)
        conversation.prompts = prompts
        await loop.prompt_submit(agent, wire.last_prompt(messages))
        agent.start_turn()

    async def _guard(
        self, conversation: Conversation, wire: Wire, messages: list[Any]
    ) -> tuple[tuple[str, str] | None, list[str]]:
        """Feed the history's calls the guards have not seen through the tool stages:
        the stop (plugin, text) if one refuses, and the reminders."""
        reminders: list[str] = []
        agent = conversation.agent
        for call_id, name, arguments, content in wire.calls(messages):
            if call_id in conversation.calls:
                continue
            conversation.calls.add(call_id)
            outcome = await self.harness.tools.execute(
                ToolCall(name, arguments, call_id, agent),
                tool=ToolDefinition(name, _answered(content)),
            )
            reminders.extend(context.text for context in outcome.contexts)
            if outcome.result.code == TOOL_DENIED or outcome.ends_turn:
                text = outcome.result.error.message if outcome.result.error else ""
                return (_plugin_of(text), text), reminders
        return None, reminders


class _Nothing:
    """The conversation agent's own model: never called (each request names the upstream)."""

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        raise ModelError("the proxy's agents have no model of their own", MODEL_FAILED)


def _wire_of(request: Any) -> Wire:
    path = str(getattr(request, "url", "") and request.url.path)
    return ANTHROPIC if path.startswith(ANTHROPIC.path) else OPENAI


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


class _Exchange:
    """One request through the model stage. For a stream, also its ASGI response: the
    chain runs inside it, the upstream's chunks go out as they arrive, and a stop or an
    error before the first of them is answered whole instead."""

    def __init__(
        self,
        proxy: ModelProxy,
        agent: Agent,
        call: ModelRequest,
        upstream: Upstream,
        data: Mapping[str, Any],
    ) -> None:
        self.proxy, self.agent, self.call = proxy, agent, call
        self.upstream, self.data = upstream, data

    async def run(self) -> ModelReply:
        loop = self.proxy.harness.loop
        reply = await loop.call_model(self.call)  # every layer and hook of the stage
        if isinstance(reply, ModelReply) and reply.usage is not None:
            loop.charge(self.agent, reply.usage, self.call)
        return reply

    async def until_done(self, receive: Any) -> ModelReply | None:
        """``run()``; a client that disconnects stops getting bytes, and the call is let
        finish for ``drain_s`` (so its usage is known), then cancelled."""
        answer: ModelReply | None = None
        upstream = self.upstream

        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    with contextlib.suppress(OSError):
                        while (await receive())["type"] != "http.disconnect":
                            pass
                    upstream.gone = True
                    await anyio.sleep(self.proxy.drain_s)
                    group.cancel_scope.cancel()  # it did not finish in time: charged as is

                group.start_soon(watch)
                try:
                    answer = await self.run()
                finally:
                    group.cancel_scope.cancel()
        except BaseExceptionGroup as failed:  # the call's own error, as itself
            if len(failed.exceptions) == 1:
                raise failed.exceptions[0] from None
            raise
        return answer

    def stopped(self, blocked: TurnBlocked) -> Any:
        text = str(blocked)
        return _stop(self.upstream.wire, (_plugin_of(text), text), self.data, self.upstream.stream)

    def failed(self, error: ModelError) -> Any:
        """The upstream's own error, status and body, or in the API's shape when none
        answered: 504 when a timeout ended the wait, else 502 (unreachable, or its reply
        cut short)."""
        from starlette.responses import Response

        if self.upstream.answer is None:
            if error.refused:  # a layer of the stack answered: an open breaker, a limit
                return self.proxy._refused(self.upstream.wire, error)
            if error.code == MODEL_TIMEOUT:
                return self.proxy._error(self.upstream.wire, 504, "upstream", error.message)
            return self.proxy._error(
                self.upstream.wire, 502, "upstream", "the upstream did not answer in full"
            )
        status, content, media = self.upstream.answer
        return Response(content, status, media_type=media)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.responses import Response

        self.upstream.send = send
        instead: Any = None
        try:
            await self.until_done(receive)
        except TurnBlocked as blocked:
            instead = self.stopped(blocked)
        except ModelError as error:
            instead = self.failed(error)
        if self.upstream.gone:
            return
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


def _check_fallbacks(harness: Harness, upstreams: Mapping[str, Target]) -> None:
    """Every ``Fallback(to={"upstream": NAME})`` in the stack names a known upstream."""
    from guardstack.wrappers import Fallback

    for handle in harness.plugins:
        plugin = handle.plugin
        for target in plugin.targets if isinstance(plugin, Fallback) else ():
            if not isinstance(target, Mapping):
                continue
            name = target["upstream"]
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
